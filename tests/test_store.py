"""The service's store on real databases: SQLite files and a real PostgreSQL server
(tests/pg.py; skipped when PostgreSQL is not installed, failed when TULA_REQUIRE_POSTGRES=1),
and the model key on a real profile."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import assert_imports_no_torch, profile_record

from tula.core.errors import RecordError
from tula.core.fit import fit_models
from tula.core.plan import make_plan
from tula.core.records import ModelsRecord, PlanRecord, ProfileRecord, _jsonable, parse_record, validate_record
from tula.pipeline import record_dict
from tula.service.model_key import key_parts_for_new_job, model_key, model_key_parts, sample_shape
from tula.service.store import Artifacts, JobQueue, ModelCache, Records, Store
from tula.service.store.database import StoreError, UnknownJob
from tula.service.store.schema import MIGRATIONS, VERSION_TABLE, metadata

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """A fresh, empty database of each back end."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'tula.db'}"
    return request.getfixturevalue("pg_server").new_database()


@pytest.fixture
def store(store_url, tmp_path):
    s = Store(store_url, data_dir=tmp_path / "data")
    yield s
    s.close()


# --------------------------------------------------------------------------- records to store
def _profile_record(spec: dict, n_trials: int | None = None) -> dict:
    """A profile record of known step times (helpers.profile_record), each trial's ranks on
    host "h", with the machine's facts; the first ``n_trials`` trials only (a partial,
    interrupted profile) when given."""
    rec = profile_record(
        spec,
        created="2026-11-23T10:00:00+0000",
        facts={"device": "cpu", "cpu": "Test CPU", "cores": 2, "torch": "2.14.1"},
    )
    for t in rec["trials"]:
        t.update(hosts=["h"] * t["n_workers"], devices=["cpu"] * t["n_workers"])
    if n_trials is not None:
        rec["trials"] = rec["trials"][:n_trials]
        rec["interrupted"] = "SIGTERM"
    return validate_record(rec, "test")


def _train_record(spec: dict, epochs: int) -> dict:
    history = [
        {
            "epoch": e,
            "steps": 10,
            "steps_done": 10 * e,
            "global_batch": 64,
            "n_workers": 2,
            "lr": 0.05,
            "train_loss": 2.0 / e,
            "epoch_time_s": 0.5,
            "test_loss": 2.1 / e,
            "test_top1": 0.5 + 0.1 * e,
        }
        for e in range(1, epochs + 1)
    ]
    return validate_record(
        {
            "kind": "tula.train",
            "version": 1,
            "spec": spec,
            "method": "ags",
            "n_workers": 2,
            "global_batch": 64,
            "steps_per_epoch": 10,
            "epochs": 3,
            "steps_done": 10 * epochs,
            "history": history,
            "traces": {"scale": [1.0, 1.5, float("inf")]},
        },
        "test",
    )


@pytest.fixture
def records(tiny_spec_dict):
    profile = _profile_record(tiny_spec_dict)
    models = fit_models(profile)
    plan = make_plan(models, "time")
    # the store's JSON of each record: the fitter and the planner return typed records (a dict before them)
    plain = lambda rec: json.loads(json.dumps(record_dict(rec), default=_jsonable))  # noqa: E731
    return {"profile": profile, "models": plain(models), "plan": plain(plan), "train": _train_record(tiny_spec_dict, 3)}


def _run_together(code: str, args_per_proc: list[list[str]], tmp_path: Path) -> list[str]:
    """Run ``code`` in one Python process per argument list, all released at the same moment
    (each waits until every one has imported and is ready); returns their stdouts."""
    go = tmp_path / f"go-{time.monotonic_ns()}"
    go.mkdir()
    prelude = textwrap.dedent(f"""
        import os, sys, time
        _go, _n = {str(go)!r}, {len(args_per_proc)}
        def ready():
            open(os.path.join(_go, str(os.getpid())), "w").close()
            t0 = time.monotonic()
            while len(os.listdir(_go)) < _n and time.monotonic() - t0 < 60:
                time.sleep(0.001)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", prelude + textwrap.dedent(code), *a],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for a in args_per_proc
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


# --------------------------------------------------------------------------- jobs
def test_job_lifecycle(store, tiny_spec_dict):
    job_id = store.create_job(tiny_spec_dict, search="full", objective="cost", train=False)
    assert len(job_id) == 12 and job_id.isalnum()
    job = store.get_job(job_id)
    assert job.state == "queued" and job.spec == tiny_spec_dict
    assert (job.search, job.objective, job.train) == ("full", "cost", False)
    assert job.progress == 0.0 and job.attempts == 0 and job.cancel_requested is False
    assert job.runner is None and job.started_at is None and job.finished_at is None
    assert job.created_at.tzinfo == timezone.utc
    assert store.get_job("nosuchjob") is None

    claimed = store.claim_job("runner-1")
    assert claimed.id == job_id and claimed.state == "profiling" and claimed.runner == "runner-1"
    assert claimed.attempts == 1 and claimed.heartbeat_at >= claimed.created_at
    assert claimed.started_at.tzinfo == timezone.utc
    assert store.claim_job("runner-2") is None  # nothing else queued
    assert store.count_running() == 1

    for state, progress in (("fitting", 0.5), ("planning", 0.6), ("training", 0.7)):
        store.update_job(job_id, state=state, progress=progress, message=f"now {state}")
        job = store.get_job(job_id)
        assert (job.state, job.progress, job.message) == (state, progress, f"now {state}")
    store.update_job(job_id, reused_models_from="abcdef123456")
    store.update_job(job_id, state="done", progress=1.0)
    job = store.get_job(job_id)
    assert job.state == "done" and job.reused_models_from == "abcdef123456"
    assert job.finished_at >= job.started_at >= job.created_at
    assert job.message == "now training"  # None leaves a field as it was
    assert store.count_running() == 0
    with pytest.raises(ValueError, match="unknown job state"):
        store.update_job(job_id, state="sleeping")
    with pytest.raises(ValueError, match="progress"):
        store.update_job(job_id, progress=1.5)
    with pytest.raises(UnknownJob, match="no job 'nosuchjob'"):
        store.update_job("nosuchjob", state="failed")


def test_list_jobs_newest_first_with_state_filter_and_pages(store, tiny_spec_dict):
    ids = [store.create_job(tiny_spec_dict) for _ in range(5)]
    assert store.claim_job("r").id == ids[0]  # the oldest queued
    page, total = store.list_jobs(limit=2)
    assert total == 5 and [j.id for j in page] == ids[::-1][:2]
    page, total = store.list_jobs(limit=2, offset=4)
    assert total == 5 and [j.id for j in page] == [ids[0]]
    queued, total = store.list_jobs(state="queued")
    assert total == 4 and [j.id for j in queued] == ids[:0:-1]
    running, total = store.list_jobs(state=["profiling", "training"])
    assert total == 1 and running[0].id == ids[0]
    with pytest.raises(ValueError, match="unknown job state"):
        store.list_jobs(state="running")


def test_two_processes_claiming_at_once_never_get_the_same_job(store, store_url, tiny_spec_dict, tmp_path):
    ids = {store.create_job(tiny_spec_dict) for _ in range(60)}
    code = """
        import json
        from tula.service.store import Store
        s = Store(sys.argv[1])
        ready()
        got = []
        while (job := s.claim_job(sys.argv[2])) is not None:
            got.append(job.id)
            time.sleep(0.002)  # a runner does work between claims: the two overlap for sure
        print(json.dumps(got))
    """
    outs = _run_together(code, [[store_url, "a"], [store_url, "b"]], tmp_path)
    got_a, got_b = (json.loads(o) for o in outs)
    assert got_a and got_b, "both claimers must have taken jobs, or the test proved nothing"
    assert not set(got_a) & set(got_b)
    assert len(got_a) + len(got_b) == len(ids) and set(got_a) | set(got_b) == ids
    jobs, _ = store.list_jobs(limit=100)
    assert all(j.attempts == 1 and j.state == "profiling" for j in jobs)
    assert {j.id for j in jobs if j.runner == "a"} == set(got_a)


def _running_jobs(store, spec: dict, n: int) -> list[str]:
    """``n`` jobs created one after another (submission order), each claimed (running)."""
    ids = []
    for _ in range(n):
        ids.append(store.create_job(spec))
        time.sleep(0.002)
    assert [store.claim_job("r").id for _ in ids] == ids
    return ids


def test_worlds_take_their_turns_in_submission_order_and_a_later_ask_never_passes_a_waiting_one(store, tiny_spec_dict):
    """#29: a job holds the workers of the world it runs, none between worlds; asks are served
    in submission order once enough workers are free (4 here)."""
    a, b, c = _running_jobs(store, tiny_spec_dict, 3)
    assert store.take_world(b, 2, 4).granted
    asked = store.take_world(a, 4, 4)  # the oldest job's world needs all 4: b holds 2
    assert (asked.granted, asked.free, asked.ahead) == (False, 2, 0)
    later = store.take_world(c, 1, 4)  # 2 are free, but a's ask came from an earlier job
    assert (later.granted, later.free, later.ahead) == (False, 2, 1)
    view = {j.id: (j.world_workers, j.world_granted_at is not None) for j in store.list_jobs()[0]}
    assert view == {a: (4, False), b: (2, True), c: (1, False)}
    store.leave_world(b)  # b's world ended: b holds nothing, between worlds
    assert store.get_job(b).world_workers is None
    assert not store.take_world(c, 1, 4).granted  # still a's turn first
    assert store.take_world(a, 4, 4).granted
    assert store.take_world(a, 4, 4).granted  # asking again keeps the grant
    assert not store.take_world(b, 1, 4).granted  # a holds all 4
    store.leave_world(a)
    assert store.take_world(b, 1, 4).granted and store.take_world(c, 1, 4).granted
    store.leave_world(b)
    store.leave_world(c)
    bigger = store.take_world(a, 8, 4)  # larger than the cluster: all of it, on its turn
    assert bigger.granted and bigger.need == 4
    assert not store.take_world(b, 1, 0).granted  # a cluster without workers grants nothing
    store.update_job(a, state="queued")  # a job that stops running holds nothing
    assert (store.get_job(a).world_workers, store.get_job(a).world_granted_at) == (None, None)
    assert store.take_world(b, 4, 4).granted
    assert not store.take_world(a, 1, 4).granted  # a job not running is never granted


def test_a_runner_gone_frees_its_world_when_its_job_is_queued_again(store, tiny_spec_dict):
    a, b = _running_jobs(store, tiny_spec_dict, 2)
    assert store.take_world(a, 2, 2).granted
    assert not store.take_world(b, 1, 2).granted
    time.sleep(0.3)
    assert store.heartbeat(b, "r")
    assert store.requeue_stale(0.2) == [a]  # a's runner stopped heartbeating (killed)
    assert store.take_world(b, 1, 2).granted
    again = store.claim_job("r2")
    assert again.id == a and again.world_workers is None  # it asks afresh, in turn


def test_two_processes_asking_for_the_last_worker_at_once_never_both_get_it(store, store_url, tiny_spec_dict, tmp_path):
    """The rule is decided in one transaction: on PostgreSQL, two asks at once would each see
    the worker free without the advisory lock."""
    jobs = _running_jobs(store, tiny_spec_dict, 2)
    code = """
        from tula.service.store import Store
        s = Store(sys.argv[1])
        me, other = sys.argv[2], sys.argv[3]
        ready()
        got = both = 0
        for _ in range(40):
            if s.take_world(me, 1, 1).granted:
                got += 1
                both += s.get_job(other).world_granted_at is not None
                s.leave_world(me)
            time.sleep(0.001)
        s.leave_world(me)
        print(got, both)
    """
    outs = _run_together(code, [[store_url, jobs[0], jobs[1]], [store_url, jobs[1], jobs[0]]], tmp_path)
    counts = [tuple(map(int, o.split())) for o in outs]
    assert all(got > 0 for got, _ in counts), counts  # both took turns, or the test proved nothing
    assert all(both == 0 for _, both in counts), counts


def test_requeue_stale_jobs(store, tiny_spec_dict):
    a, b, c, d = (store.create_job(tiny_spec_dict) for _ in range(4))
    assert [store.claim_job(r).id for r in ("ra", "rb", "rc", "rd")] == [a, b, c, d]
    store.request_cancel(c)  # c's runner dies while cancelling
    store.update_job(d, state="done")  # an ended job is never re-queued
    time.sleep(1.0)
    assert store.heartbeat(b, "rb") is True  # b's runner is alive
    assert store.requeue_stale(0.8) == [a]
    job = store.get_job(a)
    assert job.state == "queued" and job.runner is None and job.heartbeat_at is None
    assert store.get_job(b).state == "profiling"
    assert store.get_job(c).state == "cancelled" and store.get_job(c).finished_at is not None
    assert store.get_job(d).state == "done"
    assert store.heartbeat(a, "ra") is False  # the old runner learns the job is no longer its own
    again = store.claim_job("ra2")
    assert again.id == a and again.attempts == 2 and again.started_at == job.started_at
    assert store.requeue_stale(3600) == []
    # a job whose runners keep dying ends failed after max_attempts
    time.sleep(0.3)
    assert store.requeue_stale(0.1, max_attempts=2) == [b]
    job = store.get_job(a)
    assert job.state == "failed" and "2 time(s)" in job.error


def test_cancel(store, tiny_spec_dict):
    queued, running, ended = (store.create_job(tiny_spec_dict) for _ in range(3))
    assert store.claim_job("r").id == queued
    store.update_job(queued, state="queued")  # handed back: queued again, no runner
    assert store.get_job(queued).runner is None
    assert store.claim_job("r").id == queued
    assert store.claim_job("r").id == running
    store.update_job(ended, state="failed", error="it failed.")  # ended without running
    store.update_job(queued, state="queued")

    job = store.request_cancel(queued)
    assert job.state == "cancelled" and job.finished_at is not None
    assert store.claim_job("r2") is None  # a cancelled job is never claimed

    assert store.heartbeat(running, "r") is True
    job = store.request_cancel(running)
    assert job.state == "profiling" and job.cancel_requested is True
    assert store.heartbeat(running, "r") is False  # the runner's cue to stop
    store.update_job(running, state="cancelled")
    assert store.get_job(running).state == "cancelled"

    before = store.get_job(ended)
    assert store.request_cancel(ended) == before  # an ended job is unchanged
    with pytest.raises(UnknownJob):
        store.request_cancel("nosuchjob")


# --------------------------------------------------------------------------- records
def test_records_round_trip_equal_to_input(store, records, tiny_spec_dict):
    job_id = store.create_job(tiny_spec_dict)
    for kind in ("profile", "models", "plan", "train"):
        assert store.get_record(job_id, kind) is None
    records["plan"]["note_inf"] = float("-inf")  # kept as an extra field; PostgreSQL's json has no infinities
    records["profile"]["trials"][0]["t_step_spread"] = float("nan")
    for rec in records.values():
        store.put_record(job_id, rec)
    for kind, rec in records.items():
        got = store.get_record(job_id, kind)
        if kind == "profile":
            assert math.isnan(got["trials"][0]["t_step_spread"])
            got["trials"][0]["t_step_spread"] = rec["trials"][0]["t_step_spread"]
        assert got == rec, kind
        assert store.get_record(job_id, rec["kind"]) is not None  # 'tula.profile' works as well as 'profile'
    assert store.trials(job_id)[1:] == records["profile"]["trials"][1:]
    assert store.metrics(job_id) == records["train"]["history"]
    with pytest.raises(RecordError, match="damaged plan record"):
        store.put_record(job_id, {**records["plan"], "choice": {"n_workers": 0}})
    with pytest.raises(RecordError, match="not a profile, models, plan or training record"):
        store.put_record(job_id, {"kind": "tula.run"})
    with pytest.raises(UnknownJob):
        store.put_record("nosuchjob", records["plan"])
    with pytest.raises(ValueError, match="record kind"):
        store.get_record(job_id, "checkpoint")


def test_a_typed_record_is_stored_as_its_json_and_reads_back_typed(store, records, tiny_spec_dict):
    """The store's edge: a typed record is put as the JSON its file holds, and read back as the
    typed record again (equal to the one put, and to the dict get_record answers)."""
    job_id = store.create_job(tiny_spec_dict)
    assert store.read_record(job_id, PlanRecord) is None
    for cls, kind in ((ProfileRecord, "profile"), (ModelsRecord, "models"), (PlanRecord, "plan")):
        typed = parse_record(records[kind], cls)
        store.put_record(job_id, typed)
        assert store.get_record(job_id, kind) == records[kind], kind
        back = store.read_record(job_id, cls)
        assert isinstance(back, cls) and back == typed, kind
    models = parse_record(records["models"], ModelsRecord)
    parts = model_key_parts(models.spec, parse_record(records["profile"], ProfileRecord))
    store.put_models(job_id, model_key(parts), parts, models)
    assert store.find_models(model_key(parts)) == (models, job_id)  # read as the typed record


def _count(store: Store, table: str, job_id: str) -> int:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT count(*) FROM {table} WHERE job_id = :j"), {"j": job_id}).scalar_one()


def test_a_growing_partial_profile_put_again_never_duplicates_trials(store, tiny_spec_dict):
    job_id = store.create_job(tiny_spec_dict)
    other = store.create_job(tiny_spec_dict)
    store.put_record(other, _profile_record(tiny_spec_dict))
    for n in (2, 2, 5, 8):  # interrupted after 2, put twice, resumed to 5, finished
        rec = _profile_record(tiny_spec_dict, n) if n < 8 else _profile_record(tiny_spec_dict)
        store.put_record(job_id, rec)
        assert store.trials(job_id) == rec["trials"]
        assert _count(store, "tula_trials", job_id) == n
        assert store.get_record(job_id, "profile") == rec
    # a trial that changes (an interrupted one measured on resume) is updated in place
    rec = _profile_record(tiny_spec_dict)
    rec["trials"][3]["t_step_s"] *= 2
    store.put_record(job_id, rec)
    assert store.trials(job_id)[3]["t_step_s"] == rec["trials"][3]["t_step_s"]
    assert _count(store, "tula_trials", job_id) == 8 and _count(store, "tula_trials", other) == 8
    # a training record's epochs likewise
    for epochs in (1, 1, 3):
        store.put_record(job_id, _train_record(tiny_spec_dict, epochs))
        assert [m["epoch"] for m in store.metrics(job_id)] == list(range(1, epochs + 1))
        assert _count(store, "tula_metrics", job_id) == epochs
    assert _count(store, "tula_records", job_id) == 2  # one per kind


def test_a_damaged_record_in_the_database_is_one_sentence_naming_job_and_kind(store, records, tiny_spec_dict):
    job_id = store.create_job(tiny_spec_dict)
    store.put_record(job_id, records["plan"])
    damaged = {k: v for k, v in records["plan"].items() if k != "choice"}
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE tula_records SET body = :b WHERE job_id = :j"), {"b": json.dumps(damaged), "j": job_id}
        )
    with pytest.raises(StoreError) as err:
        store.get_record(job_id, "plan")
    msg = str(err.value)
    assert f"plan record of job {job_id!r}" in msg and "field 'choice' is missing" in msg and "\n" not in msg
    with pytest.raises(StoreError) as typed_err:  # read as the typed record: the same sentence
        store.read_record(job_id, PlanRecord)
    assert str(typed_err.value) == msg
    if store.dialect == "sqlite":  # SQLite keeps any text in a JSON column
        with store.engine.begin() as conn:
            conn.execute(
                sa.text('UPDATE tula_records SET body = \'{"kind": "tula.pl\' WHERE job_id = :j'), {"j": job_id}
            )
        with pytest.raises(
            StoreError, match=f"plan record of job '{job_id}' in the store is damaged: it is not valid JSON"
        ):
            store.get_record(job_id, "plan")


def test_artifacts_are_files_under_the_data_dir(store, tiny_spec_dict, tmp_path):
    job_id = store.create_job(tiny_spec_dict)
    png = store.job_dir(job_id) / "plan.png"
    png.write_bytes(b"\x89PNG")
    store.add_artifact(job_id, "plan.png", png)
    store.add_artifact(job_id, "plan.png", png)  # upsert
    assert store.artifact_path(job_id, "plan.png") == png
    with store.engine.connect() as conn:
        rel = conn.execute(sa.text("SELECT path FROM tula_artifacts WHERE job_id = :j"), {"j": job_id}).scalar_one()
    assert rel == f"jobs/{job_id}/plan.png"  # relative to the data directory: it may move
    assert store.artifacts(job_id) == {"plan.png": png}
    assert store.artifact_path(job_id, "train.png") is None
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(b"x")
    with pytest.raises(StoreError, match="outside the store's data directory"):
        store.add_artifact(job_id, "x.png", outside)
    png.unlink()
    assert store.artifact_path(job_id, "plan.png") is None


# --------------------------------------------------------------------------- model reuse
def test_models_are_found_by_key_newest_first(store, records, tiny_spec_dict):
    parts = model_key_parts(tiny_spec_dict, records["profile"])
    key = model_key(parts)
    first, second, other = (store.create_job(tiny_spec_dict) for _ in range(3))
    assert store.find_models(key) is None
    store.put_models(first, key, parts, records["models"])
    assert store.find_models(key) == (parse_record(records["models"], ModelsRecord), first)
    time.sleep(0.01)
    newer = json.loads(json.dumps(records["models"]))
    newer["profiling_s"] = 2.0
    store.put_models(second, key, parts, newer)
    assert store.find_models(key) == (parse_record(newer, ModelsRecord), second)
    other_parts = {**parts, "collective": "tree"}
    store.put_models(other, model_key(other_parts), other_parts, records["models"])
    assert store.find_models(key) == (parse_record(newer, ModelsRecord), second)
    with pytest.raises(ValueError, match="model_key"):
        store.put_models(other, key, other_parts, records["models"])
    with pytest.raises(RecordError, match="models record"):
        store.put_models(other, key, parts, records["plan"])


# --------------------------------------------------------------------------- the parts of the store
def test_each_part_of_the_store_works_alone_on_the_same_database(store_url, records, tiny_spec_dict, tmp_path):
    """The job queue, the records, the artefacts and the model cache are each a class of one
    job, usable alone; the Store is all of them on one database."""
    parts = {cls: cls(store_url, data_dir=tmp_path / "data") for cls in (JobQueue, Records, Artifacts, ModelCache)}
    try:
        queue, recs, arts, cache = parts.values()
        assert not hasattr(queue, "put_record") and not hasattr(recs, "claim_job")
        assert not hasattr(arts, "find_models") and not hasattr(cache, "add_artifact")
        job_id = queue.create_job(tiny_spec_dict)
        assert queue.claim_job("runner-1").id == job_id
        recs.put_record(job_id, records["profile"])
        png = arts.job_dir(job_id) / "plan.png"
        png.write_bytes(b"\x89PNG")
        arts.add_artifact(job_id, "plan.png", png)
        key_parts = model_key_parts(tiny_spec_dict, records["profile"])
        cache.put_models(job_id, model_key(key_parts), key_parts, records["models"])
        with pytest.raises(UnknownJob, match="no job 'nosuchjob'"):
            recs.put_record("nosuchjob", records["plan"])  # every part knows a job only from the queue's table
    finally:
        for p in parts.values():
            p.close()
    with Store(store_url, data_dir=tmp_path / "data") as store:
        assert store.get_job(job_id).state == "profiling"
        assert store.get_record(job_id, "profile") == records["profile"]
        assert store.artifacts(job_id) == {"plan.png": png}
        assert store.find_models(model_key(key_parts)) == (parse_record(records["models"], ModelsRecord), job_id)


# --------------------------------------------------------------------------- opening and migrating
def test_migrations_build_the_schema_from_empty_and_reopening_is_idempotent(store_url, tiny_spec_dict, tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    s = Store(store_url, data_dir=tmp_path / "data")
    job_id = s.create_job(tiny_spec_dict)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    with s.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "compare_type": True})
        assert ctx.get_current_heads() == (head,)
        assert compare_metadata(ctx, metadata) == []  # the migrations build exactly the tables the store uses
    s.close()
    for _ in range(2):
        s = Store(store_url, data_dir=tmp_path / "data")
        assert s.get_job(job_id).id == job_id
        with s.engine.connect() as conn:
            assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [head]
        s.close()


def test_two_processes_opening_a_fresh_database_at_once(store_url, tmp_path):
    code = """
        from tula.service.store import Store
        ready()
        s = Store(sys.argv[1])
        print(s.create_job({"name": "x"}))
    """
    outs = _run_together(code, [[store_url]] * 2, tmp_path)
    s = Store(store_url)
    jobs, total = s.list_jobs()
    assert total == 2 and {j.id for j in jobs} == {o.strip() for o in outs}
    s.close()


def test_sqlite_store_is_in_wal_mode(tmp_path):
    db = tmp_path / "x" / "tula.db"
    Store(f"sqlite:///{db}").close()
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert Store(f"sqlite:///{db}").data_dir == db.parent / "data"


def test_a_newer_schema_is_refused(store_url):
    s = Store(store_url)
    with s.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    s.close()
    with pytest.raises(StoreError, match=r"schema \(revision 9999\) is newer than this Tula's; upgrade Tula"):
        Store(store_url)


def _one_sentence(err: pytest.ExceptionInfo, *parts: str) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("cannot open the store at "), msg
    for p in parts:
        assert p in msg, msg
    return msg


def test_bad_urls_are_one_sentence_naming_the_url(tmp_path):
    with pytest.raises(StoreError) as err:
        Store("nonsense")
    _one_sentence(err, "'nonsense'", "not a database URL")
    with pytest.raises(StoreError) as err:
        Store("foo://user:secret@host/db")
    assert "secret" not in _one_sentence(err, "foo://user:***@host/db", "not a database SQLAlchemy knows")
    notdb = tmp_path / "notes.txt"
    notdb.write_text("these are not the tables you are looking for\n" * 100)
    with pytest.raises(StoreError) as err:
        Store(f"sqlite:///{notdb}")
    _one_sentence(err, str(notdb), "file is not a database")
    with pytest.raises(StoreError) as err:
        Store(f"sqlite:///{tmp_path}")
    _one_sentence(err, "is a directory")


def test_bad_postgresql_urls_are_one_sentence_naming_the_url(tmp_path, pg_server):
    url = f"postgresql+psycopg://tula:secret@/nodb?host={tmp_path}&port=1"  # nothing listens there
    with pytest.raises(StoreError) as err:
        Store(url)
    assert "secret" not in _one_sentence(err, "tula:***@", "No such file or directory")
    with pytest.raises(StoreError) as err:  # a server that answers, a database that does not exist
        Store(pg_server.url("nosuchdb"))
    _one_sentence(err, pg_server.url("nosuchdb"), 'database "nosuchdb" does not exist')


def test_store_and_model_key_import_no_torch():
    assert_imports_no_torch("tula.service.store", "tula.service.model_key")


# --------------------------------------------------------------------------- model key
@pytest.fixture(scope="module")
def real_profile():
    """A real (tiny) profile: one rank, two trials, threads left to the local launcher's default."""
    from tula.core.spec import spec_from_dict
    from tula.engine.launch.clusters import open_launcher
    from tula.engine.profile import profile

    spec = spec_from_dict(
        {
            "name": "key",
            "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "width": 4}},
            "data": {"name": "digits"},
            "search": {"cluster_sizes": [1], "min_batch": 16, "max_batch": 32},
            "profile": {"warmup_steps": 1, "timed_steps": 2, "memory_probe_batches": [4, 8], "min_timed_s": 0},
        }
    )
    with open_launcher(spec) as launcher:
        rec = profile(spec, "partial", launcher=launcher).to_json_dict()  # the store's edge: as profile.json holds it
        facts, threads = launcher.facts(), launcher.threads_per_worker
    return spec.to_dict(), rec, facts, threads


@pytest.mark.slow  # a real profile: a world of a spawned rank
def test_a_new_job_gets_the_key_its_profile_gives(real_profile):
    spec, rec, facts, threads = real_profile
    assert [t["status"] for t in rec["trials"]] == ["ok", "ok"]
    validate_record(json.loads(json.dumps(rec)), "the profile")
    parts = model_key_parts(spec, rec)
    assert parts == key_parts_for_new_job(spec, facts, threads)
    assert parts == key_parts_for_new_job(spec, facts)  # threads derived as the local launcher does
    assert model_key(parts) == model_key(key_parts_for_new_job(spec, facts))
    assert len(model_key(parts)) == 64
    assert parts["hardware"] == {"cpu": facts.cpu, "cores": os.cpu_count()} and parts["device"] == "cpu"
    assert parts["torch"] == facts.torch and parts["data"]["sample_shape"] == rec["sample_shape"] == [1, 8, 8]
    assert rec["facts"] == facts.to_json_dict()  # the launcher's facts, as the record writes them
    assert parts["threads_per_worker"] == rec["threads_per_worker"]
    # what does not decide the fitted parameters leaves the key alone
    key = model_key(parts)
    same = json.loads(json.dumps(spec))
    same.update(epochs=99, objective="cost", pricing={"kind": "memory"}, name="other")
    same["optimizer"].update(lr=0.3, weight_decay=0.0)
    same["search"].update(min_batch=64, max_batch=1024, cluster_sizes=[1])
    same["profile"].update(warmup_steps=5, timed_steps=20, trial_timeout_s=10)
    same["train"].update(method="lbt")
    assert model_key(key_parts_for_new_job(same, facts)) == key
    # what does, changes it
    for path, value in (
        (("model", "kwargs", "width"), 8),
        (("optimizer", "name"), "adam"),
        (("optimizer", "momentum"), 0.0),
        (("collective",), "tree"),
        (("data", "name"), "mnist1d"),
        (("profile", "threads_per_worker"), threads + 1),
        (("cluster", "where"), "tcp://h:8786"),
    ):
        other = json.loads(json.dumps(spec))
        d = other
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value
        assert model_key(key_parts_for_new_job(other, facts, None if path[0] != "cluster" else threads)) != key, path
    for fact, value in (("cpu", "Other CPU"), ("cores", 64), ("torch", "9.9"), ("device", "cuda")):
        assert model_key(key_parts_for_new_job(spec, facts.model_copy(update={fact: value}), threads)) != key, fact
        assert model_key(key_parts_for_new_job(spec, {**facts.to_json_dict(), fact: value}, threads)) != key, fact


def test_a_profile_without_facts_cannot_be_keyed(tiny_spec_dict):
    rec = _profile_record(tiny_spec_dict)
    del rec["facts"]
    with pytest.raises(RecordError, match="does not say which hardware it was measured on"):
        model_key_parts(tiny_spec_dict, rec)


def test_sample_shapes_known_without_loading_agree_with_the_loaders(tmp_path):
    from PIL import Image

    from tula.core.spec import DataSpec
    from tula.engine.workloads import load_dataset

    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.new("L", (20, 12), color=40 * i).save(tmp_path / cls / f"{i}.png")
    for data in (
        {"name": "digits"},
        {"name": "mnist1d", "num_samples": 200},
        {"name": "text", "sequence_length": 24, "num_samples": 50},
        {"name": "synthetic", "sample_shape": [2, 5], "num_samples": 16},
        {"name": "imagefolder", "root": str(tmp_path), "image_size": 16, "loader_workers": 0},
        {"name": "imagefolder", "root": str(tmp_path), "loader_workers": 0},
    ):
        d = DataSpec.model_validate(data)
        assert sample_shape(d.model_dump(mode="json")) == list(load_dataset(d).sample_shape), data
