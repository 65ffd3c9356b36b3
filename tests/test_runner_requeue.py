"""What a runner does with a job whose world failed (#29 item 3), on a real SQLite store: a
worker, host, link or the scheduler lost on the operator's cluster queues the job again, with
the sentence, at most MAX_ATTEMPTS runs in all; anything else, or on this host, fails it."""

import pytest
from helpers import tiny_spec

from tula.core.errors import WorkerError
from tula.service.runner import LOST_CAUSES, MAX_ATTEMPTS, _after_a_failed_world
from tula.service.settings import ServiceSettings
from tula.service.store import JobRow, Store

CLUSTER = "tcp://127.0.0.1:8786"


@pytest.fixture
def store(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'tula.db'}", tmp_path) as s:
        yield s


def _claimed(store: Store, attempts: int = 1) -> JobRow:
    job_id = store.create_job(tiny_spec())
    for _ in range(attempts):
        job = store.claim_job("runner-a", job_id=job_id)
        if job.attempts < attempts:
            store.update_job(job_id, state="queued")
    return job


@pytest.mark.parametrize("cause", LOST_CAUSES)
def test_a_world_lost_on_the_cluster_queues_the_job_again_with_its_sentence(tmp_path, store, cause):
    assert "scheduler_lost" in LOST_CAUSES
    job = _claimed(store)
    err = WorkerError(f"the Dask scheduler at {CLUSTER} stopped answering ({cause})", cause=cause)
    assert _after_a_failed_world(store, job, err, ServiceSettings(home=tmp_path, cluster=CLUSTER)) == 3
    row = store.get_job(job.id)
    assert row.state == "queued" and f"(attempt 1 of {MAX_ATTEMPTS})" in row.message, row
    assert f"stopped answering ({cause})" in row.message and not row.error, row


def test_the_last_attempt_a_crash_or_this_hosts_processes_fail_the_job(tmp_path, store):
    on_cluster = ServiceSettings(home=tmp_path, cluster=CLUSTER)
    lost = WorkerError("the Dask scheduler stopped answering", cause="scheduler_lost")
    last = _claimed(store, attempts=MAX_ATTEMPTS)
    assert _after_a_failed_world(store, last, lost, on_cluster) == 2
    assert store.get_job(last.id).state == "failed"
    crash = _claimed(store)
    assert _after_a_failed_world(store, crash, WorkerError("rank 0 crashed", cause="crash"), on_cluster) == 2
    assert store.get_job(crash.id).error == "rank 0 crashed"
    here = _claimed(store)
    assert _after_a_failed_world(store, here, lost, ServiceSettings(home=tmp_path)) == 2
    assert store.get_job(here.id).state == "failed"


def test_runners_of_an_earlier_service_are_told_from_their_pid_files_damaged_ones_included(tmp_path, store):
    """At a restart the dispatcher reads each pid file its host's runners left (``runners/<job
    id>``: ``<runner> <pid>``): a live runner is kept, a runner of this host whose process is
    gone (or whose pid now belongs to another program) is reported gone, and a damaged file, a
    folder in its place or another host's runner says nothing -- never an error.  Real
    processes: one that looks like a runner, one that has exited."""
    import os
    import subprocess
    import sys

    from tula.service.runner import Dispatcher

    node = os.uname().nodename
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "tula.service.runner", "job-alive"])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    try:
        files = tmp_path / "runners"
        files.mkdir()
        (files / "job-alive").write_text(f"{node}:1/1 {alive.pid}\n")
        (files / "job-ended").write_text(f"{node}:1/2 {ended.pid}\n")
        (files / "job-reused").write_text(f"{node}:1/3 {os.getpid()}\n")  # a pid now this test's
        (files / "job-garbage").write_text("\x00\xff not a runner line")
        (files / "job-empty").write_text("")
        (files / "job-elsewhere").write_text(f"another-host:1/4 {ended.pid}\n")
        (files / "job-folder").mkdir()
        gone = Dispatcher(ServiceSettings(home=tmp_path), store).runners_gone()
        assert sorted(gone) == [f"{node}:1/2", f"{node}:1/3"]
        assert sorted(p.name for p in files.iterdir()) == ["job-alive", "job-folder"]  # the rest are read
    finally:
        alive.kill()
        alive.wait()
