"""The service's memory guard on real processes (#29 item 4): a process tree above the limit
is killed, descendants included; one below it is left alone."""

import subprocess
import sys
import time

import psutil

from tula.service.memory_guard import MemoryGuard, private_bytes, tree

HOLD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray({child_mb} << 20); time.sleep(60)"])
x = bytearray({parent_mb} << 20)
print(child.pid, flush=True)
time.sleep(60)
"""


def _start(parent_mb: int, child_mb: int) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(parent_mb=parent_mb, child_mb=child_mb)], stdout=subprocess.PIPE, text=True
    )
    child = int(p.stdout.readline())
    deadline = time.monotonic() + 20  # until both hold their bytes
    while private_bytes(tree(p.pid)) < (parent_mb + child_mb) << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    return p, child


def test_the_guard_kills_a_tree_above_the_limit_and_leaves_one_below_it():
    big, big_child = _start(100, 150)  # 250 MiB together, the child holding most
    small, small_child = _start(10, 10)
    try:
        assert private_bytes(tree(big.pid)) >= 250 << 20
        guard = MemoryGuard(limit_bytes=200 << 20)
        guard.watch("big", big.pid)
        guard.watch("small", small.pid)
        guard.check()
        assert big.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while psutil.pid_exists(big_child) and psutil.Process(big_child).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child of the stopped job still runs"
            time.sleep(0.05)
        why = guard.forget("big")
        assert why is not None and "more than the service's limit of 200.0 MiB per job" in why, why
        assert small.poll() is None and psutil.pid_exists(small_child)  # below the limit: left alone
        assert guard.forget("small") is None
    finally:
        for p, c in ((big, big_child), (small, small_child)):
            for pid in (c, p.pid):
                try:
                    psutil.Process(pid).kill()
                except psutil.Error:
                    pass
            p.wait(timeout=10)
