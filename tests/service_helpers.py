"""A real `tula serve` on a free loopback port, for the service tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

TERMINAL = ("done", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """`tula serve` in its own process group (so a kill -9 takes its runners and ranks too)."""

    def __init__(
        self, home: Path, *args: str, db_url: str | None = None, token: str | None = None, env: dict | None = None
    ) -> None:
        self.home, self.args, self.db_url, self.token = home, args, db_url, token
        self.env = {
            **os.environ,
            "TULA_STALE_AFTER_S": "4",
            "TULA_HEARTBEAT_S": "0.5",
            "TULA_POLL_S": "0.2",
            **(env or {}),
        }
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> Service:
        exe = Path(sys.executable).parent / "tula"
        cmd = [str(exe), "serve", "--port", str(self.port), "--home", str(self.home), *self.args]
        if self.db_url:
            cmd += ["--db-url", self.db_url]
        if self.token:
            cmd += ["--token", self.token]
        self.log = open(self.home.parent / f"serve-{self.port}.log", "ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self.log, stderr=self.log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tula serve exited with {self.proc.returncode}: {self.read_log()}")
            try:
                if self.client().get("/v1/health").status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"tula serve did not answer within {timeout_s} s: {self.read_log()}")

    def read_log(self) -> str:
        return (self.home.parent / f"serve-{self.port}.log").read_text(errors="replace")[-4000:]

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def kill9(self) -> None:
        """SIGKILL to the whole process group: the service, its runners and their ranks."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        with_group_gone(self.proc.pid)
        return self.proc.returncode


def with_group_gone(pgid: int, timeout_s: float = 30) -> None:
    """Wait until no process of the group is left (runners and ranks end after the service)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)


def wait_for(client: httpx.Client, job_id: str, states=TERMINAL, timeout_s: float = 300, check=None) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states or (check is not None and check(job)):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach {states} within {timeout_s} s: {job}")
