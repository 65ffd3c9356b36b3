"""The service's limit on one job's memory (``max_job_memory_bytes``, issue #29 item 4).

A job runs in a runner process that the service starts, and the runner starts the job's
processes on this host: the ranks of the local launcher, their loaders, a Dask LocalCluster's
workers.  :class:`MemoryGuard` is a thread of the service that reads, every ``interval_s``, the
private resident memory (resident minus shared pages: the libraries every torch process maps
count once, not per process) of each runner and all its descendants, and stops a job whose
processes hold more than the limit: SIGKILL to all of them, so the host keeps the memory the
service and the other jobs need.  The dispatcher then fails the job with the guard's sentence
(a user's error: the job asked for more than the service grants), and whatever the job had
written -- profile trials, checkpoints, records -- stays.

Why a watchdog and not a kernel limit: an address-space limit (RLIMIT_AS) counts the address
space CUDA reserves, so it breaks CUDA jobs, and it bounds each process, not a job's processes
together; cgroups are not available to every service.  The price: a job that allocates faster
than the guard looks can pass the limit by what it allocates in one interval (0.25 s).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

import psutil

from tula.core.say import fmt_bytes, plain

log = logging.getLogger(__name__)

INTERVAL_S = 0.25


def tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants (those that still run)."""
    return trees([pid])[pid]


def trees(pids: list[int]) -> dict[int, list[psutil.Process]]:
    """Each of ``pids`` with all its descendants (those that still run), from one look at the
    host's process table: a look per job (psutil's ``children`` reads every process's parent)
    took the service's web process a scan of /proc per running job four times a second, and
    slowed its answers while many jobs ran."""
    children: dict[int, list[psutil.Process]] = {}
    by_pid: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["ppid"]):
        by_pid[p.pid] = p
        ppid = p.info.get("ppid")
        if ppid is not None:
            children.setdefault(ppid, []).append(p)
    out: dict[int, list[psutil.Process]] = {}
    for pid in pids:
        if pid not in by_pid:
            out[pid] = []
            continue
        found, todo, seen = [by_pid[pid]], [pid], {pid}
        while todo:
            for child in children.get(todo.pop(), []):
                if child.pid not in seen:
                    seen.add(child.pid)
                    found.append(child)
                    todo.append(child.pid)
        out[pid] = found
    return out


def private_bytes(procs: list[psutil.Process]) -> int:
    """The private resident bytes of ``procs`` together (resident minus shared pages)."""
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            m = p.memory_info()
            total += max(0, m.rss - getattr(m, "shared", 0))
    return total


def limit_sentence(used_bytes: int, limit_bytes: int) -> str:
    return (
        f"the job's processes held {fmt_bytes(used_bytes)} of this host's memory, more than the "
        f"service's limit of {fmt_bytes(limit_bytes)} per job (TULA_MAX_JOB_MEMORY_BYTES), and were "
        "stopped; use a smaller data set, model or batch (what the job had recorded is kept)"
    )


class MemoryGuard:
    """Stops a runner's process tree whose private memory passes ``limit_bytes``."""

    def __init__(self, limit_bytes: int, interval_s: float = INTERVAL_S) -> None:
        self.limit_bytes, self.interval_s = limit_bytes, interval_s
        self._watched: dict[str, int] = {}  # job id -> its runner's pid
        self._stopped: dict[str, str] = {}  # job id -> why it was stopped
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tula-memory-guard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def watch(self, job_id: str, pid: int) -> None:
        with self._lock:
            self._watched[job_id] = pid
            self._stopped.pop(job_id, None)

    def forget(self, job_id: str) -> str | None:
        """Stop watching ``job_id``; the sentence it was stopped with, if the guard stopped it."""
        with self._lock:
            self._watched.pop(job_id, None)
            return self._stopped.pop(job_id, None)

    def check(self) -> None:
        """One look at every watched job (the thread's step)."""
        with self._lock:
            watched = [(j, pid) for j, pid in self._watched.items() if j not in self._stopped]
        found = trees([pid for _, pid in watched]) if watched else {}
        for job_id, pid in watched:
            procs = found[pid]
            used = private_bytes(procs)
            if used <= self.limit_bytes:
                continue
            with self._lock:
                if job_id not in self._watched:  # forgotten meanwhile: its runner ended
                    continue
                self._stopped[job_id] = why = limit_sentence(used, self.limit_bytes)
            log.warning("job %s: %s", job_id, why)
            for p in reversed(procs):  # the descendants first, then the runner
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGKILL)

    def _loop(self) -> None:
        while not self._done.wait(self.interval_s):
            try:
                self.check()
            except Exception as err:  # never let the guard's thread die silently
                log.error(
                    "the memory guard's look at the jobs failed (it looks again in %s s): %s: %s",
                    self.interval_s,
                    type(err).__name__,
                    plain(err),
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
