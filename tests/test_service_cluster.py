"""The service on the operator's cluster (issue #29): ``tula serve --cluster`` decides where its
jobs run; ``GET /v1/cluster`` shows the workers there.  A real service, a real store, the
session's real Dask scheduler (2 worker processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
from emulated_hosts import WORKER_ENV
from helpers import assert_refused, free_port, one_line, tula_in_process
from service_helpers import Service, wait_for


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
    # the leases of the workers a world holds: 8 s, not Dask's 30 s, as the session's own
    # (conftest: whichever process creates a worker's lock first sets its timeout)
    leases = {"DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_TIMEOUT": "8s"}
    svc = Service(home, "--cluster", address, env=leases).start()
    c = svc.client()
    job_id = c.post("/v1/jobs", json={"spec": spec, "search": "partial"}).json()["id"]
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
        run = c.get(f"/v1/jobs/{job_id}/train").json()
        assert run["resumed_from_epoch"] >= 1 and run["replicas_identical"], run
        assert [e["epoch"] for e in run["history"]] == [1, 2, 3, 4, 5]
        with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
            assert [m["epoch"] for m in store.metrics(job_id)] == [1, 2, 3, 4, 5]  # each epoch once
        shown = c.get("/v1/cluster").json()
        assert shown["running_jobs"] == [] and not any(w["in_a_world"] for w in shown["workers"]), shown
    finally:
        again.stop()


@pytest.mark.slow
def test_a_service_on_a_dask_scheduler_runs_its_jobs_there_and_shows_its_workers(tmp_path, dask_cluster, tiny_pipeline):
    """Three jobs on the scheduler's 2 workers, up to 2 at once: the first's profile uses both
    workers (cluster sizes 1 and 2), so the next two wait for it in the queue, saying so; once
    its plan is stored it keeps only its training's workers (a one-worker plan gives the
    second back, and the next job starts beside its training); the two later jobs run in
    submission order, one worker each."""
    address = dask_cluster.scheduler_address
    home = tmp_path / "home"
    home.mkdir()
    svc = Service(home, "--cluster", address, "--max-concurrent-jobs", "2").start()
    try:
        c = svc.client()
        offered = c.get("/v1/cluster").json()
        assert (offered["cluster"], offered["kind"], offered["running_jobs"]) == (address, "scheduler", [])
        workers = offered["workers"]
        assert len(workers) == 2 and all(w["host"] == "127.0.0.1" and w["threads"] == 1 for w in workers), workers
        assert [w["in_a_world"] for w in workers] == [False, False], workers
        spec = tiny_pipeline.spec_dict(epochs=1)
        job_id = c.post("/v1/jobs", json={"spec": spec, "search": "partial"}).json()["id"]
        one = tiny_pipeline.spec_dict(search={**spec["search"], "cluster_sizes": [1]})
        later = [c.post("/v1/jobs", json={"spec": one, "search": "partial", "train": False}).json()["id"] for _ in "bc"]
        waiting = wait_for(c, later[0], check=lambda j: "free until" in (j["message"] or ""))
        assert waiting["state"] == "queued", waiting
        assert one_line(waiting["message"]) == (
            f"queued: needs 1 of the 2 worker(s) at {address}; 0 free until a running job ends"
        )
        shown = c.get("/v1/cluster").json()
        assert [(j["id"], j["workers_kept"]) for j in shown["running_jobs"]] in ([(job_id, 2)], []), shown
        assert all(isinstance(w["in_a_world"], bool) for w in shown["workers"]), shown
        page = c.get("/cluster")  # the dashboard's view of the same
        assert page.status_code == 200 and f"<code>{address}</code> (scheduler)" in page.text
        assert all(w["address"] in page.text for w in workers), page.text
        training = wait_for(c, job_id, timeout_s=240, check=lambda j: j["state"] in ("training", "done", "failed"))
        plan_n = c.get(f"/v1/jobs/{job_id}/plan").json()["choice"]["n_workers"]
        if training["state"] == "training":  # its plan stored: it keeps its training's workers only
            kept = {j["id"]: j["workers_kept"] for j in c.get("/v1/cluster").json()["running_jobs"]}
            assert kept.get(job_id, plan_n) == plan_n, (kept, plan_n)
        job = wait_for(c, job_id, timeout_s=240)
        assert job["state"] == "done", (job, svc.read_log())
        b, c_ = (wait_for(c, j, timeout_s=240) for j in later)
        assert b["state"] == c_["state"] == "done", (b, c_, svc.read_log())
        first_done = datetime.fromisoformat(job["finished_at"])
        assert _started_at(job) <= _started_at(b) <= _started_at(c_), (job, b, c_)  # in submission order
        if plan_n == 2:  # its training kept both workers: the others waited for its end
            assert first_done <= _started_at(b), (job, b)
        assert _started_at(c_) < datetime.fromisoformat(b["finished_at"]), (b, c_)  # side by side
        profile = c.get(f"/v1/jobs/{job_id}/profile").json()
        # the submission said local; the operator's cluster ran it, and the records say so
        assert spec.get("cluster", {}).get("where", "local") == "local"
        assert profile["spec"]["cluster"]["where"] == address
        assert {t["n_workers"] for t in profile["trials"] if t["status"] == "ok"} == {1, 2}
        run = c.get(f"/v1/jobs/{job_id}/train").json()
        assert run["epochs"] == 1 and run["replicas_identical"]
    finally:
        svc.stop()


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
    assert "service setting 'cluster' (TULA_CLUSTER)" in " ".join(r.stderr.split())


def test_a_job_keeps_its_largest_world_until_its_plan_then_only_its_trainings():
    from tula.service.cluster import wait_sentence, workers_kept

    profile_1_2_4 = {"spec": {"search": {"cluster_sizes": [1, 2, 4]}}}
    assert workers_kept(profile_1_2_4, None) == 4
    assert workers_kept(profile_1_2_4, {"choice": {"n_workers": 1}}) == 1
    growing = {"spec": {"search": {"cluster_sizes": [1, 2]}, "train": {"workers": {"min": 1, "max": 3}}}}
    assert workers_kept(growing, None) == 3
    assert workers_kept(growing, {"choice": {"n_workers": 1}}) == 3  # its rule grows training to 3
    # 4 workers; running jobs keep 1 (planned) and 2: a job needing 1 fits, one needing 2 waits
    assert wait_sentence(1, 4, [1, 2], "tcp://s:8786") is None
    assert wait_sentence(2, 4, [1, 2], "tcp://s:8786") == (
        "queued: needs 2 of the 4 worker(s) at tcp://s:8786; 1 free until a running job ends"
    )
    assert wait_sentence(8, 4, [], "tcp://s:8786") is None  # more than the cluster has: all of it, when free
    assert wait_sentence(8, 4, [1], "tcp://s:8786") is not None


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
        job_id = c.post("/v1/jobs", json={"spec": spec, "search": "partial"}).json()["id"]
        ckpt = home / "jobs" / job_id / "train" / "checkpoint.pt"
        wait_for(c, job_id, check=lambda j: ckpt.exists(), timeout_s=240)  # training, its first epoch done
        dask.kill_scheduler()
        wait_for(c, job_id, check=lambda j: j["state"] == "queued", timeout_s=120)
        time.sleep(3)  # a few of the dispatcher's ticks: held in the queue, not started again or failed
        waiting = c.get(f"/v1/jobs/{job_id}").json()
        assert waiting["state"] == "queued" and waiting["attempts"] == 1, waiting
        assert one_line(waiting["message"]).startswith(
            f"queued: the service's Dask scheduler at {dask.address} does not answer: "
        ) and one_line(waiting["message"]).endswith("; it starts once the scheduler answers"), waiting
        dask.start()
        job = wait_for(c, job_id, timeout_s=240)
        assert job["state"] == "done" and job["attempts"] == 2, (job, svc.read_log())
        run = c.get(f"/v1/jobs/{job_id}/train").json()
        assert run["resumed_from_epoch"] >= 1 and [e["epoch"] for e in run["history"]] == [1, 2, 3, 4, 5], run
        with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
            assert [m["epoch"] for m in store.metrics(job_id)] == [1, 2, 3, 4, 5]  # each epoch once
    finally:
        svc.stop()
        dask.stop()
