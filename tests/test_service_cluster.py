"""The service on the operator's cluster (issue #29): ``tula serve --cluster`` decides where its
jobs run; ``GET /v1/cluster`` shows the workers there.  A real service, a real store, the
module's real Dask scheduler (2 worker processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from emulated_hosts import WORKER_ENV
from helpers import assert_refused, free_port, one_line, tula_in_process
from service_helpers import Service, ok_json, wait_for


def _started_at(job: dict) -> datetime:
    return datetime.fromisoformat(job["started_at"])


@pytest.mark.slow
def test_a_service_killed_9_while_its_job_trains_on_the_cluster_resumes_it_once_and_frees_the_workers(
    tmp_path, dask_cluster, tiny_pipeline
):
    """#29 item 3: the service (and its runner) killed with SIGKILL while its job trains on the
    scheduler's workers. The ranks left on the workers see their caller gone and stop; after the
    restart the job is queued again at once (its runner's pid file), waits for the workers the
    dead world held (their leases time out), resumes from its checkpoint and trains each epoch
    once; then no world holds a worker."""
    from tula.service.store import Store

    address = dask_cluster.scheduler_address
    home = tmp_path / "home"
    home.mkdir()
    spec = tiny_pipeline.spec_dict(epochs=5, search={"cluster_sizes": [2], "min_batch": 32, "max_batch": 32})
    # the leases of the workers a world holds: 8 s, not Dask's 30 s, as the module's own
    # (conftest: whichever process creates a worker's lock first sets its timeout)
    leases = {"DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_TIMEOUT": "8s"}
    svc = Service(home, "--cluster", address, env=leases).start()
    c = svc.client()
    job_id = ok_json(c.post("/v1/jobs", json={"spec": spec, "search": "partial"}), 202)["id"]
    ckpt = home / "jobs" / job_id / "train" / "checkpoint.pt"
    wait_for(c, job_id, check=lambda j: ckpt.exists(), timeout_s=240)  # training, its first epoch done
    svc.kill9()
    again = Service(home, "--cluster", address, env={"TULA_STALE_AFTER_S": "600", **leases})
    again.port, again.url = svc.port, svc.url
    again.start()
    try:
        c = again.client()
        job = wait_for(c, job_id, timeout_s=300)
        assert job["state"] == "done" and job["attempts"] == 2, (job, again.read_log())
        run = ok_json(c.get(f"/v1/jobs/{job_id}/train"))
        assert run["resumed_from_epoch"] >= 1 and run["replicas_identical"], run
        assert [e["epoch"] for e in run["history"]] == [1, 2, 3, 4, 5]
        with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
            assert [m["epoch"] for m in store.metrics(job_id)] == [1, 2, 3, 4, 5]  # each epoch once
        shown = ok_json(c.get("/v1/cluster"))
        assert shown["running_jobs"] == [] and not any(w["in_a_world"] for w in shown["workers"]), shown
    finally:
        again.stop()


@pytest.mark.slow
def test_a_service_on_a_dask_scheduler_runs_its_jobs_there_and_shows_its_workers(tmp_path, dask_cluster, tiny_pipeline):
    """Three jobs on the scheduler's 2 workers, up to 3 at once: the first profiles on 1 and 2
    workers and trains, the two later ones profile on 1.  Each job holds the workers of the
    world it runs now and none between worlds: ``GET /v1/cluster``, read every 0.2 s while
    they run, never shows the jobs' worlds holding more than the 2 workers, nor a world held
    by a job that is fitting or planning; the jobs start in submission order and run side by
    side (the later ones start before the first ends: none waits for the first's plan), and
    no world holds a worker once they are done."""
    address = dask_cluster.scheduler_address
    home = tmp_path / "home"
    home.mkdir()
    svc = Service(home, "--cluster", address, "--max-concurrent-jobs", "3").start()
    samples: list[list[dict]] = []
    done = threading.Event()

    def sample() -> None:
        with svc.client() as watcher:
            while not done.wait(0.2):
                with contextlib.suppress(Exception):
                    samples.append(watcher.get("/v1/cluster").json()["running_jobs"])

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        c = svc.client()
        offered = ok_json(c.get("/v1/cluster"))
        assert (offered["cluster"], offered["kind"], offered["running_jobs"]) == (address, "scheduler", [])
        workers = offered["workers"]
        assert len(workers) == 2 and all(w["host"] == "127.0.0.1" and w["threads"] == 1 for w in workers), workers
        assert [w["in_a_world"] for w in workers] == [False, False], workers
        page = c.get("/cluster")  # the dashboard's view of the same
        assert page.status_code == 200 and f"<code>{address}</code> (scheduler)" in page.text
        assert all(w["address"] in page.text for w in workers), page.text
        sampler.start()
        spec = tiny_pipeline.spec_dict(epochs=1)
        job_id = ok_json(c.post("/v1/jobs", json={"spec": spec, "search": "partial"}), 202)["id"]
        one = tiny_pipeline.spec_dict(search={**spec["search"], "cluster_sizes": [1]})
        later = [
            ok_json(c.post("/v1/jobs", json={"spec": one, "search": "partial", "train": False}), 202)["id"]
            for _ in "bc"
        ]
        job = wait_for(c, job_id, timeout_s=600)  # about 40 s here (2 cores, loaded, 2026-11-29)
        assert job["state"] == "done", (job, svc.read_log())
        # it profiled: never planned from the models of b or c, submitted after it (tula.service.runner)
        assert job["reused_models_from"] is None, job
        b, c_ = (wait_for(c, j, timeout_s=600) for j in later)
        assert b["state"] == c_["state"] == "done", (b, c_, svc.read_log())
        done.set()
        sampler.join(timeout=10)
        assert _started_at(job) <= _started_at(b) <= _started_at(c_), (job, b, c_)  # in submission order
        assert _started_at(c_) < datetime.fromisoformat(job["finished_at"]), (job, c_)  # side by side
        held = [sum(j["world_workers"] for j in s if j["world"] == "holds") for s in samples]
        assert samples and max(held) <= 2, samples
        assert any(h > 0 for h in held), samples  # the view shows the worlds it saw
        assert not [j for s in samples for j in s if j["state"] in ("fitting", "planning") and j["world"]], samples
        profile = ok_json(c.get(f"/v1/jobs/{job_id}/profile"))
        # the submission said local; the operator's cluster ran it, and the records say so
        assert spec.get("cluster", {}).get("where", "local") == "local"
        assert profile["spec"]["cluster"]["where"] == address
        assert {t["n_workers"] for t in profile["trials"] if t["status"] == "ok"} == {1, 2}
        run = ok_json(c.get(f"/v1/jobs/{job_id}/train"))
        assert run["epochs"] == 1 and run["replicas_identical"]
        shown = ok_json(c.get("/v1/cluster"))
        assert shown["running_jobs"] == [] and not any(w["in_a_world"] for w in shown["workers"]), shown
        assert all(ok_json(c.get(f"/v1/jobs/{j}"))["world_workers"] is None for j in (job_id, *later))
    finally:
        done.set()
        svc.stop()


def test_a_world_waiting_for_its_turn_says_why_and_a_stop_signal_ends_the_wait(tmp_path):
    """The runner's side of the turns (``StoreWorldGate``) in a process of its own, on a real
    store: while an earlier job holds the only worker, the later job's world waits and its row
    says why; SIGTERM (a cancel, the service stopping) ends the wait at once as an interrupted
    run (exit 143), its ask given back."""
    from tula.service.store import Store

    url = f"sqlite:///{tmp_path / 'tula.db'}"
    store = Store(url)
    first = store.create_job({"name": "first"})
    time.sleep(0.002)
    second = store.create_job({"name": "second"})
    assert [store.claim_job("r").id for _ in "ab"] == [first, second]
    store.update_job(second, message="profiling")
    assert store.take_world(first, 1, 1).granted
    code = textwrap.dedent(f"""
        import sys
        from tula.core.errors import Interrupted
        from tula.engine import interrupts
        from tula.service.store import Store
        from tula.service.worlds import StoreWorldGate
        gate = StoreWorldGate(Store({url!r}), {second!r}, "tcp://10.9.9.9:8786")
        try:
            with interrupts.graceful_signals():
                gate.enter(1, lambda: 1)
        except Interrupted as err:
            print(err)
            sys.exit(err.exit_code)
        sys.exit(0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # the process starts and asks: seconds, more on a slow machine
        while (store.get_job(second).message or "").startswith("profiling") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        row = store.get_job(second)
        assert row.message == (
            "waiting for 1 worker(s) at tcp://10.9.9.9:8786 for its next world: 0 of the 1 free until a running "
            "world ends"
        ), row
        assert (row.world_workers, row.world_granted_at) == (1, None)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)  # it ends within a poll of the gate; this only guards a hang
        assert proc.returncode == 143, (out, err)
        assert out.strip() == "stopped while waiting for 1 worker(s) for its next world; what it finished is kept"
        assert store.get_job(second).world_workers is None  # the ask was given back
        store.leave_world(first)
        assert store.take_world(second, 1, 1).granted
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        store.close()


@pytest.mark.parametrize(
    "cluster, sentence",
    [
        ("env", "'env' is a world that one command joins, not a cluster a service places jobs on"),
        ("slurm", "'slurm' is not a cluster: use local"),
    ],
)
def test_a_cluster_the_service_cannot_place_jobs_on_is_one_sentence(tmp_path, cluster, sentence):
    r = tula_in_process("serve", "--cluster", cluster, "--home", tmp_path / "home", "--port", "0")
    assert_refused(r, sentence)
    said = " ".join(r.stderr.split())
    assert f"service setting 'cluster' (TULA_CLUSTER): {sentence}" in said  # pydantic's "value error, " left out
    assert "value error" not in said.lower()


def test_the_next_queued_job_starts_when_no_running_world_waits_and_a_worker_is_free():
    from tula.service.cluster import job_world, wait_sentence

    granted_at = datetime.now(timezone.utc)
    holds_2 = SimpleNamespace(world_workers=2, world_granted_at=granted_at)  # a job row's world columns
    waits_4 = SimpleNamespace(world_workers=4, world_granted_at=None)
    between = SimpleNamespace(world_workers=None, world_granted_at=None)
    assert [job_world(j).world for j in (holds_2, waits_4, between)] == ["holds", "waits", None]
    assert wait_sentence(4, [holds_2, between], "tcp://s:8786") is None  # 2 of 4 free
    assert wait_sentence(4, [holds_2, waits_4], "tcp://s:8786") == (
        "queued: 1 running job(s) wait for workers at tcp://s:8786 first"
    )
    assert wait_sentence(4, [holds_2, holds_2], "tcp://s:8786") == (
        "queued: all 4 worker(s) at tcp://s:8786 are in running jobs' worlds; it starts when one is free"
    )
    assert wait_sentence(1, [SimpleNamespace(world_workers=8, world_granted_at=granted_at)], "tcp://s:8786") is not None


def test_the_dashboards_cluster_page_says_why_it_has_no_workers_to_show():
    from tula.service.dashboard import cluster_page

    page = cluster_page(None, "the service's Dask scheduler at tcp://10.0.0.9:8786 does not answer: <timeout>")
    assert (
        "<p class='err'>the service&#x27;s Dask scheduler at tcp://10.0.0.9:8786 does not answer: &lt;timeout&gt;</p>"
        in page
    )


class _Scheduler:
    """A Dask scheduler and one worker on this host's loopback, each a process of its own
    session (``dask scheduler`` and ``dask worker`` as an operator starts them), on a fixed
    port so that a restart comes back at the same address."""

    def __init__(self, tmp_path, port: int) -> None:
        self.address, self.port, self.logs = f"tcp://127.0.0.1:{port}", port, tmp_path
        self.procs: list[subprocess.Popen] = []

    def start(self) -> _Scheduler:
        n = len(self.procs)
        env = {**os.environ, **WORKER_ENV, "DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_VALIDATION_INTERVAL": "2s"}
        for cmd in (
            ["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard"],
            ["distributed.cli.dask_worker", self.address, "--host", "127.0.0.1", "--nthreads", "1", "--no-dashboard"],
        ):
            with open(self.logs / f"dask-{n}-{len(self.procs)}.log", "w") as log:
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", *cmd], env=env, stdout=log, stderr=log, start_new_session=True
                    )
                )
        return self

    def kill_scheduler(self) -> None:
        os.killpg(self.procs[-2].pid, signal.SIGKILL)

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


@pytest.mark.slow
def test_a_job_whose_scheduler_is_lost_waits_in_the_queue_and_resumes_once_it_answers_again(tmp_path, tiny_pipeline):
    """#29 item 3, the scheduler gone: the service's Dask scheduler is killed while a job
    trains on its worker.  The job is queued again and waits there with a sentence naming the
    scheduler (no attempt is spent while it does not answer); once the operator starts a
    scheduler at the same address and a worker, the job resumes from its last checkpoint and
    trains each epoch once."""
    from tula.service.store import Store

    dask = _Scheduler(tmp_path, free_port())
    home = tmp_path / "home"
    home.mkdir()
    leases = {"DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_TIMEOUT": "8s"}
    svc = Service(home, "--cluster", dask.address, env=leases)
    try:  # every process it starts ends with it, also when it fails
        dask.start()
        svc.start()
        c = svc.client()
        spec = tiny_pipeline.spec_dict(epochs=5, search={"cluster_sizes": [1], "min_batch": 32, "max_batch": 32})
        job_id = ok_json(c.post("/v1/jobs", json={"spec": spec, "search": "partial"}), 202)["id"]
        ckpt = home / "jobs" / job_id / "train" / "checkpoint.pt"
        wait_for(c, job_id, check=lambda j: ckpt.exists(), timeout_s=240)  # training, its first epoch done
        dask.kill_scheduler()
        wait_for(c, job_id, check=lambda j: j["state"] == "queued", timeout_s=120)
        time.sleep(3)  # a few of the dispatcher's ticks: held in the queue, not started again or failed
        waiting = ok_json(c.get(f"/v1/jobs/{job_id}"))
        assert waiting["state"] == "queued" and waiting["attempts"] == 1, waiting
        assert one_line(waiting["message"]).startswith(
            f"queued: the service's Dask scheduler at {dask.address} does not answer: "
        ) and one_line(waiting["message"]).endswith("; it starts once the scheduler answers"), waiting
        dask.start()
        job = wait_for(c, job_id, timeout_s=240)
        assert job["state"] == "done" and job["attempts"] == 2, (job, svc.read_log())
        run = ok_json(c.get(f"/v1/jobs/{job_id}/train"))
        assert run["resumed_from_epoch"] >= 1 and [e["epoch"] for e in run["history"]] == [1, 2, 3, 4, 5], run
        with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
            assert [m["epoch"] for m in store.metrics(job_id)] == [1, 2, 3, 4, 5]  # each epoch once
    finally:
        svc.stop()
        dask.stop()
