"""A real `tula serve` on a free loopback port, for the service tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from helpers import free_port, pids_with, process_tree, tula_cmd

TERMINAL = ("done", "failed", "cancelled")


#: the service's timing in the tests: quick polls and beats.  A runner's start is not judged by
#: stale_after_s (the dispatcher holds it until its first beat); once started, a runner whose
#: beats lapse is taken for dead after 120 s, not the service's 30 s: on 2 cores squeezed to half
#: of one, runners' beats lapsed past 30 s and their jobs were queued again over and over
#: (2026-11-29).  The tests that are about stale runners set their own.
SERVICE_ENV = {"TULA_STALE_AFTER_S": "120", "TULA_HEARTBEAT_S": "0.5", "TULA_POLL_S": "0.2"}


class Service:
    """`tula serve` in its own process group (so a kill -9 takes its runners and ranks too)."""

    def __init__(
        self, home: Path, *args: str, db_url: str | None = None, token: str | None = None, env: dict | None = None
    ) -> None:
        self.home, self.args, self.db_url, self.token = home, args, db_url, token
        self.env = {**os.environ, **SERVICE_ENV, **(env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> Service:
        cmd = [*tula_cmd(), "serve", "--port", str(self.port), "--home", str(self.home), *self.args]
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
        self.kill9()  # never left running behind a failed start
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


def ok_json(r: httpx.Response, status: int = 200) -> Any:
    """The JSON body of ``r``, which must have answered ``status``: else an AssertionError that
    says what came back (the status and the body), not a KeyError where the body is read."""
    assert r.status_code == status, f"{r.request.method} {r.request.url.path} answered {r.status_code}: {r.text[:2000]}"
    return r.json()


def wait_for(client: httpx.Client, job_id: str, states=TERMINAL, timeout_s: float = 300, check=None) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = ok_json(client.get(f"/v1/jobs/{job_id}"))
        if job["state"] in states or (check is not None and check(job)):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not reach {states} within {timeout_s} s: {job}")


def cancel_unfinished(client: httpx.Client, timeout_s: float = 120) -> None:
    """Cancel every job of the service that has not ended and wait until each has: what a
    shared service's tests leave behind, so that the next test finds the runner idle."""
    jobs = ok_json(client.get("/v1/jobs", params={"limit": 500}))["jobs"]
    for job in jobs:
        if job["state"] not in TERMINAL:
            client.post(f"/v1/jobs/{job['id']}/cancel")
    for job in jobs:
        if job["state"] not in TERMINAL:
            wait_for(client, job["id"], timeout_s=timeout_s)


def seed_finished_job(home: Path, run_dir: Path, db_url: str | None = None) -> str:
    """Put a finished ``tula run`` (``run_dir``: profile, models, plan, train with its
    checkpoint and plots) into the store of a service on ``home`` as a done job, as the
    service's runner stores a job it ran (the same observer writes the rows), so that a
    job with the same model key plans from its models instead of profiling.  Returns the
    job's id.  The store (SQLite under ``home`` unless ``db_url``) is made if there is none."""
    from tula.core.records import MODELS_KIND, PLAN_KIND, PROFILE_KIND, TRAIN_KIND
    from tula.service.runner import StoreObserver
    from tula.service.store import Store

    with Store(db_url or f"sqlite:///{home / 'tula.db'}", home) as store:
        profile = json.loads((run_dir / "profile.json").read_text())
        job_id = store.create_job(profile["spec"], search=profile["search"])
        assert store.claim_job("seed").id == job_id, "the seeded store had another queued job"
        out = store.job_dir(job_id)
        shutil.copytree(run_dir, out, dirs_exist_ok=True, copy_function=shutil.copyfile)
        observer = StoreObserver(store, job_id, home)
        for kind, rel in (
            (PROFILE_KIND, "profile.json"),
            (MODELS_KIND, "models.json"),
            (PLAN_KIND, "plan.json"),
            (TRAIN_KIND, "train/train.json"),
        ):
            observer.saved(kind, json.loads((out / rel).read_text()), out / rel)
        for png in sorted(out.rglob("*.png")):
            observer.saved("plot", None, png)
        store.update_job(job_id, state="done", progress=1.0, message="done")
    return job_id


def runner_pids(job_id: str) -> list[int]:
    """The live runner processes (``python -m tula.service.runner``) of ``job_id``: not the
    processes a runner forks, which show its command line until they exec (its fork server
    starting, a subprocess) -- a runner that got as far as starting its ranks was once counted
    twice."""
    pids, tree = pids_with("tula.service.runner", job_id), process_tree()
    forked = {child for pid in pids for child in tree.get(pid, [])}
    return [pid for pid in pids if pid not in forked]
