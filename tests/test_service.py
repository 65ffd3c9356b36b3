"""The Tula service on a real uvicorn (a `tula serve` process on a free loopback port) with a
real SQLite store: submit and follow a job over HTTP, the records it keeps, model reuse, a
kill -9 mid-profile, cancel, bad input and the token.

Most tests share one service (``service``, started once for the module) whose store holds a
finished job of the tiny spec (the session's ``tiny_pipeline``): their jobs plan from its
models and never profile.  Each of them leaves the service as it found it (no job left
running: ``service`` cancels what is unfinished after the test) and none counts on an
empty store.  The tests that need an empty store -- a job that must profile, a kill -9, another
database, another token -- start their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import yaml
from helpers import popen_tula, run_tula
from service_helpers import Service, cancel_unfinished, ok_json, runner_pids, seed_finished_job, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def fresh_service(home):
    """A service of its own on an empty store (``home``)."""
    s = Service(home).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def _shared_service(tmp_path_factory, tiny_pipeline):
    home = tmp_path_factory.mktemp("shared-service") / "home"
    home.mkdir()
    seed_finished_job(home, tiny_pipeline.dir)
    s = Service(home).start()
    yield s
    s.stop()


@pytest.fixture
def service(_shared_service):
    """The module's service (its store: a finished job of the tiny spec, and what earlier tests
    submitted); after the test, every job it left unfinished is cancelled and has ended."""
    yield _shared_service
    cancel_unfinished(_shared_service.client())


def _records(client, job_id):
    return {name: ok_json(client.get(f"/v1/jobs/{job_id}/{name}")) for name in ("profile", "models", "plan", "train")}


def _job_line(proc) -> str:
    """The id in ``tula submit``'s first line, ``submitted job ID (...)`` (what it said instead, if not)."""
    line = proc.stdout.readline()
    if "submitted job " not in line:
        proc.kill()
        out, err = proc.communicate(timeout=60)
        raise AssertionError(f"tula submit said {line + out!r} and on stderr {err!r}")
    return line.split("submitted job ")[1].split()[0]


def _until_following(proc, timeout_s: float = 300) -> None:
    """Wait until ``tula submit --wait`` follows its job: its SIGTERM handler is set (bit 14 of
    /proc/PID/status's SigCgt), which the command sets only while it follows -- a condition,
    not a fixed sleep, so that a command still starting on a slow machine is not taken for one
    that follows.  The deadline is far beyond a start on a loaded machine (a few seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate(timeout=60)
        try:
            with open(f"/proc/{proc.pid}/status") as status:
                caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
        except FileNotFoundError:  # it ended just now: the next poll says how
            continue
        if caught >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.05)
    raise AssertionError(f"tula submit --wait did not follow its job within {timeout_s} s")


def test_a_job_over_http_runs_the_pipeline_and_its_records_are_those_tula_run_writes(
    fresh_service, home, tiny_spec_dict, tiny_pipeline
):
    service = fresh_service
    c = service.client()
    r = c.post("/v1/jobs", json={"spec": tiny_spec_dict})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert r.headers["location"] == f"/v1/jobs/{job_id}"
    seen = set()
    job = wait_for(c, job_id, check=lambda j: seen.add(j["state"]) and False)
    assert job["state"] == "done", job
    assert job["progress"] == 1.0 and job["finished_at"] and job["attempts"] == 1
    assert seen & {"profiling", "training"}, seen  # it was watched while it ran
    recs = _records(c, job_id)
    # the records are the files the pipeline wrote into the job's directory, as the CLI writes them
    job_dir = home / "jobs" / job_id
    for name, path in (
        ("profile", "profile.json"),
        ("models", "models.json"),
        ("plan", "plan.json"),
        ("train", "train/train.json"),
    ):
        assert recs[name] == json.loads((job_dir / path).read_text()), name
    from tula.service.store import Store

    with Store(f"sqlite:///{home / 'tula.db'}", home) as store:  # checkpoints are files the rows point to
        assert store.artifact_path(job_id, "checkpoint.pt") == job_dir / "train" / "checkpoint.pt"
    for name in ("plan.png", "train.png"):
        png = c.get(f"/v1/jobs/{job_id}/plots/{name}")
        assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n", name
    # and they have what `tula run` writes for the same spec (the session's run of it)
    assert tiny_pipeline.spec == tiny_spec_dict
    cli = {
        name: tiny_pipeline.record(path)
        for name, path in (
            ("profile", "profile.json"),
            ("models", "models.json"),
            ("plan", "plan.json"),
            ("train", "train/train.json"),
        )
    }
    for name in cli:
        assert set(recs[name]) == set(cli[name]) | ({"facts"} & set(recs[name])), name
        assert recs[name]["kind"] == cli[name]["kind"] and recs[name]["spec"] == cli[name]["spec"]
    assert recs["profile"]["configs"] == cli["profile"]["configs"]
    assert [h["epoch"] for h in recs["train"]["history"]] == [h["epoch"] for h in cli["train"]["history"]]
    assert not recs["profile"].get("in_progress")

    # a list, one job page, a 404 in one sentence
    page = ok_json(c.get("/v1/jobs", params={"state": "done"}))
    assert page["total"] == 1 and page["jobs"][0]["id"] == job_id
    missing = c.get("/v1/jobs/nosuchjob")
    assert missing.status_code == 404 and missing.json()["detail"] == "there is no job 'nosuchjob'", missing.text

    # re-plan from the stored models: synchronous (its answer is the plan), no profiling (no job
    # made, no trial run: the checks that do not depend on how fast this machine plans)
    p = c.post(f"/v1/jobs/{job_id}/replan", json={"objective": "cost", "cluster_sizes": [1, 2, 4, 8]})
    assert p.status_code == 200, p.text
    assert ok_json(c.get("/v1/jobs"))["total"] == 1 and ok_json(c.get(f"/v1/jobs/{job_id}"))["attempts"] == 1
    assert ok_json(c.get(f"/v1/jobs/{job_id}/profile")) == recs["profile"]
    plan = p.json()
    assert plan["objective"] == "cost" and {c_["n_workers"] for c_ in plan["configurations"]} >= {4, 8}
    assert ok_json(c.get(f"/v1/jobs/{job_id}/plan")) == recs["plan"]  # the job's own plan is unchanged
    # to accuracy, with the profile's noise scale or a what-if's; a noise scale <= 0 is a 422
    acc = c.post(f"/v1/jobs/{job_id}/replan", json={"objective": "time_to_accuracy"})
    assert acc.status_code == 200, acc.text
    assert acc.json()["noise_scale"]["source"] == "profile" and "to accuracy" in acc.json()["reason"], acc.text
    what_if = c.post(f"/v1/jobs/{job_id}/replan", json={"objective": "cost_to_accuracy", "noise_scale": 5.0})
    assert what_if.status_code == 200 and what_if.json()["noise_scale"]["b_noise"] == 5.0, what_if.text
    assert c.post(f"/v1/jobs/{job_id}/replan", json={"noise_scale": 0}).status_code == 422

    # a second job with the same model key is planned from the store: no trial runs
    d2 = dict(tiny_spec_dict, name="tiny-again", epochs=1, objective="time")
    r2 = c.post("/v1/jobs", json={"spec": d2})
    job2 = wait_for(c, ok_json(r2, 202)["id"])
    assert job2["state"] == "done", job2
    assert job2["reused_models_from"] == job_id
    assert c.get(f"/v1/jobs/{job2['id']}/profile").status_code == 404
    assert not (home / "jobs" / job2["id"] / "profile.json").exists()
    from tula.service.store import Store

    with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
        assert store.trials(job2["id"]) == [] and len(store.trials(job_id)) == len(recs["profile"]["trials"])
    plan2 = ok_json(c.get(f"/v1/jobs/{job2['id']}/plan"))
    assert plan2["objective"] == "time" and plan2["spec"]["epochs"] == 1
    # POST /v1/plans answers from the store too, and says what to do when it cannot
    hit = c.post("/v1/plans", json={"spec": d2, "objective": "knee"})
    assert hit.status_code == 200 and hit.json()["reused_models_from"] == job_id, hit.text
    acc = c.post("/v1/plans", json={"spec": d2, "objective": "knee_to_accuracy", "noise_scale": 50})
    assert acc.status_code == 200 and acc.json()["objective"] == "knee_to_accuracy", acc.text
    other = dict(tiny_spec_dict, model={"name": "mlp"})
    miss = c.post("/v1/plans", json={"spec": other})
    assert miss.status_code == 404 and "submit the spec as a job" in miss.json()["detail"], miss.text


def test_kill_9_of_the_service_while_profiling_then_restart_completes_without_rerunning_trials(home, tiny_spec_dict):
    # 4 trials (B 16 and 32 on 1 and 2 workers): the kill comes after the first, the rest run after the restart
    d = dict(tiny_spec_dict, search={**tiny_spec_dict["search"], "cluster_sizes": [1, 2], "max_batch": 32}, epochs=1)
    svc = Service(home, "--max-concurrent-jobs", "1").start()
    c = svc.client()
    job_id = ok_json(c.post("/v1/jobs", json={"spec": d, "search": "full"}), 202)["id"]

    def some_trials(job):
        r = c.get(f"/v1/jobs/{job_id}/profile")
        return r.status_code == 200 and 1 <= len(r.json()["trials"]) < len(r.json()["configs"])

    wait_for(c, job_id, check=some_trials, timeout_s=180)
    before = ok_json(c.get(f"/v1/jobs/{job_id}/profile"))
    svc.kill9()  # the service, its runner and the ranks
    assert before["in_progress"]

    # the restarted service sees that the job's runner on this host is gone (its pid file, no such
    # process) and queues the job again at once: not after stale_after_s, here far beyond the test
    again = Service(home, "--max-concurrent-jobs", "1", env={"TULA_STALE_AFTER_S": "600"})
    again.port, again.url = svc.port, svc.url
    again.start()
    try:
        c = again.client()
        job = wait_for(c, job_id, timeout_s=300)
        assert job["state"] == "done", job
        assert job["attempts"] == 2, job  # with stale_after_s at 600 s, only the pid file can have re-queued it
        prof = ok_json(c.get(f"/v1/jobs/{job_id}/profile"))
        assert not prof.get("in_progress") and len(prof["trials"]) == len(prof["configs"])
        # the trials finished before the kill are the same measurements, not new ones
        by_cfg = {(t["n_workers"], t["global_batch"]): t for t in prof["trials"]}
        for t in before["trials"]:
            assert by_cfg[(t["n_workers"], t["global_batch"])] == t
        from tula.service.store import Store

        with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
            rows = store.trials(job_id)
            assert len(rows) == len({(r["n_workers"], r["global_batch"]) for r in rows}) == len(prof["configs"])
            assert len(store.metrics(job_id)) == 1
    finally:
        again.stop()


def test_a_runner_silent_past_stale_after_is_replaced_never_left_running_beside_the_new_one(home, tiny_spec_dict):
    """Every runner here is silent past stale_after_s once started (it beats as it starts, then
    every 60 s; stale after 2 s), as a runner starved while it runs is: the job is queued again
    and a new runner takes it, and the silent one is ended first -- at most one runner of the
    job at any time (the service once left each one running, 100 of them on busy cores)."""
    svc = Service(home, env={"TULA_STALE_AFTER_S": "2", "TULA_HEARTBEAT_S": "60"}).start()
    try:
        c = svc.client()
        job_id = ok_json(c.post("/v1/jobs", json={"spec": tiny_spec_dict, "train": False}), 202)["id"]
        seen: set[int] = set()
        deadline = time.monotonic() + 300  # it ends once 2 are seen: a runner's start and 2 s, more on a slow machine
        while time.monotonic() < deadline and len(seen) < 2:
            live = runner_pids(job_id)
            assert len(live) <= 1, f"{len(live)} runners of one job at once: {live}"
            seen.update(live)
            time.sleep(0.1)
        assert len(seen) >= 2, "no runner was replaced: the test saw no stale runner"
        c.post(f"/v1/jobs/{job_id}/cancel")
    finally:
        svc.stop()
    assert runner_pids(job_id) == []


def test_a_runner_slower_to_start_than_stale_after_keeps_its_job(home, tiny_spec_dict, tmp_path):
    """A runner whose start (its imports, opening the store) outlasts stale_after_s -- on busy
    cores one took 25-34 s here, against 30 s -- is starting, not stale, until its first beat:
    it keeps its job.  Before, it was replaced, and its replacement started as slowly: three
    jobs' runners were each replaced 6 times on 2 loaded cores and none ran.  Here every runner
    sleeps 25 s as it starts (a sitecustomize on its path), with stale_after_s at 10 s."""
    slow = tmp_path / "slow-start"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\nif 'tula.service.runner' in sys.orig_argv:\n    time.sleep(25)\n"
    )
    path = os.pathsep.join(p for p in (str(slow), os.environ.get("PYTHONPATH")) if p)
    svc = Service(home, env={"TULA_STALE_AFTER_S": "10", "PYTHONPATH": path}).start()
    try:
        c = svc.client()
        job_id = ok_json(c.post("/v1/jobs", json={"spec": tiny_spec_dict, "train": False}), 202)["id"]
        seen: set[int] = set()

        def one_runner(job: dict) -> bool:
            seen.update(runner_pids(job_id))
            assert len(seen) <= 1 and job["attempts"] <= 1, (f"the runner was replaced: {seen}", job)
            return False

        job = wait_for(c, job_id, timeout_s=600, check=one_runner)
        assert job["state"] == "done" and job["attempts"] == 1, (job, svc.read_log())
        assert len(seen) == 1, seen
    finally:
        svc.stop()


def test_the_service_on_a_postgresql_store_runs_a_job_and_reuses_its_model(
    tmp_path, pg_server, tiny_spec_dict, tiny_pipeline
):
    """The same service with its store on a real PostgreSQL server (--db-url): a finished job
    of the tiny spec (the session's run, stored as the runner stores one) is there, and a new
    job runs on the service's runner and plans from its models."""
    home = tmp_path / "home"
    home.mkdir()
    url = pg_server.new_database()
    first = seed_finished_job(home, tiny_pipeline.dir, db_url=url)
    svc = Service(home, db_url=url).start()
    try:
        c = svc.client()
        assert ok_json(c.get("/v1/health"))["store"] == "postgresql"
        assert wait_for(c, first)["state"] == "done"
        second = ok_json(c.post("/v1/jobs", json={"spec": dict(tiny_spec_dict, name="again"), "train": False}), 202)[
            "id"
        ]
        job = wait_for(c, second)
        assert job["state"] == "done" and job["reused_models_from"] == first
        assert ok_json(c.get(f"/v1/jobs/{first}/plan"))["kind"] == "tula.plan"
    finally:
        svc.stop()
    from tula.service.store import Store

    with Store(url, home) as store:
        assert len(store.trials(first)) > 0 and store.trials(second) == []
        assert store.get_record(second, "profile") is None


def test_a_job_is_planned_from_the_models_of_a_job_submitted_before_it_never_after(home, tiny_pipeline):
    """The runner's reuse (``_reusable_models``) on a real store: a job submitted before the
    finished job of the same model key profiles itself; one submitted after it is planned from
    its models.  (Of three jobs of one key submitted together, the first could be planned from
    the models of a later one whose runner got further first -- or that finished while the
    first was queued again -- and then had no profile record: the 404 behind
    test_service_cluster's KeyError 'spec' on a slow machine.)"""
    from tula.core.records import ModelsRecord, as_record
    from tula.core.spec import spec_from_dict
    from tula.engine.launch.clusters import open_launcher
    from tula.service.runner import _reusable_models
    from tula.service.store import Store

    url = f"sqlite:///{home / 'tula.db'}"
    with Store(url, home) as store:
        before = store.create_job(tiny_pipeline.spec_dict())
        assert store.claim_job("runner-of-before").id == before  # running, not queued: the seed claims its own
    finished = seed_finished_job(home, tiny_pipeline.dir)
    spec = spec_from_dict(tiny_pipeline.spec_dict())
    with Store(url, home) as store, open_launcher(spec) as launcher:
        after = store.create_job(tiny_pipeline.spec_dict())
        assert _reusable_models(store, store.get_job(before), spec, launcher) is None
        reused = _reusable_models(store, store.get_job(after), spec, launcher)
        assert reused is not None and reused[1] == finished, reused
        assert as_record(reused[0], ModelsRecord).given("reused_models_from"), reused  # the record says so too


def test_a_queued_job_is_cancelled_at_once_and_a_running_one_at_its_next_step(service, tiny_spec_dict):
    c = service.client()
    long = dict(tiny_spec_dict, epochs=200)
    first = ok_json(c.post("/v1/jobs", json={"spec": long}), 202)["id"]
    second = ok_json(c.post("/v1/jobs", json={"spec": long}), 202)["id"]  # queued behind it (1 job at once)
    assert ok_json(c.post(f"/v1/jobs/{second}/cancel"))["state"] == "cancelled"
    # training and past its first steps (a stop that reaches a rank while it is still starting
    # can be lost, a separate race not tested here; this job plans from the store's models,
    # so "training" comes while the ranks still start)
    wait_for(c, first, states=(), check=lambda j: j["state"] == "training" and j["progress"] > 0, timeout_s=180)
    assert ok_json(c.post(f"/v1/jobs/{first}/cancel"))["cancel_requested"]
    job = wait_for(c, first, timeout_s=180)
    assert job["state"] == "cancelled", job
    assert ok_json(c.get(f"/v1/jobs/{second}"))["attempts"] == 0


@pytest.mark.parametrize(
    "body, status, sentence",
    [
        ({"spec": {"epochs": 0}}, 422, "spec field 'epochs'"),
        ({"spec": {"modle": {}}}, 422, "unknown field 'modle'"),
        (
            {"spec": {"model": {"name": "evil.module:build"}}},
            422,
            "spec field 'model.name' imports 'evil.module', which is not on this service's import allow-list",
        ),
        ({"spec": {"data": {"name": "cifar10", "root": "/etc"}}}, 422, "spec field 'data.root' is '/etc', not under"),
        (
            {"spec": {"data": {"name": "arrays", "path": "/tmp/x.npz"}}},
            422,
            "spec field 'data.path' is '/tmp/x.npz', not",
        ),
        ({"spec": {"model": {"name": "pickle:/tmp/f.pkl"}}}, 422, "spec field 'model.name' is a pickled factory"),
        (
            {"spec": {"train": {"step": "user_steps:CountingStep"}}},
            422,
            "spec field 'train.step' imports 'user_steps', which is not on this service's import allow-list",
        ),
        ({"spec": {"epochs": 100000}}, 422, "spec field 'epochs' is 100000, above this service's limit of 500"),
        ({"spec": {}, "search": "most"}, 422, "field 'search' is 'most'"),
        ({"spec": {}, "colour": "red"}, 422, "unknown field 'colour' in the submission"),
        ([1, 2], 422, "the spec must be a YAML mapping"),
    ],
)
def test_bad_submissions_are_422_with_one_sentence_naming_the_field(service, body, status, sentence):
    jobs_before = ok_json(service.client().get("/v1/jobs"))["total"]
    r = service.client().post("/v1/jobs", json=body)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert sentence in detail and "\n" not in detail, detail
    assert ok_json(service.client().get("/v1/jobs"))["total"] == jobs_before  # no job was made


def test_a_yaml_spec_is_accepted_and_bad_yaml_is_one_sentence(service, tiny_spec_dict):
    c = service.client()
    r = c.post(
        "/v1/jobs?train=false", content=yaml.safe_dump(tiny_spec_dict), headers={"content-type": "application/yaml"}
    )
    assert r.status_code == 202, r.text
    assert ok_json(c.get(r.json()["url"]))["train"] is False
    jobs_before = ok_json(c.get("/v1/jobs"))["total"]
    bad = c.post("/v1/jobs", content="name: [unclosed", headers={"content-type": "application/yaml"})
    assert bad.status_code == 422 and bad.json()["detail"].startswith("the request body is not valid YAML"), bad.text
    big = c.post("/v1/jobs", content="x" * (2 << 20), headers={"content-type": "application/yaml"})
    assert big.status_code == 413
    assert ok_json(c.get("/v1/jobs"))["total"] == jobs_before  # neither made a job


def test_beyond_loopback_without_a_token_the_service_refuses_to_start(home):
    r = run_tula("serve", "--host", "0.0.0.0", "--port", "0", "--home", home, timeout=60)
    assert r.returncode == 2
    assert "refusing to listen on 0.0.0.0, which is not a loopback address, without a token" in r.stderr
    assert "Traceback" not in r.stderr


def test_with_a_token_every_request_needs_it(home):
    svc = Service(home, token="s3cret-token").start()
    try:
        import httpx

        bare = httpx.get(f"{svc.url}/v1/jobs", timeout=10)
        assert bare.status_code == 401 and "Bearer" in bare.json()["detail"], bare.text
        wrong = httpx.get(f"{svc.url}/v1/jobs", headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401
        assert httpx.get(f"{svc.url}/", timeout=10).status_code == 401  # the dashboard too
        assert svc.client().get("/v1/jobs").status_code == 200
    finally:
        code = svc.stop()
    assert code == 130  # Ctrl-C stops the service, and is not success
    assert "interrupted: the service stopped on SIGINT" in svc.read_log()


def test_the_cli_client_submits_lists_and_replans(service, tiny_spec_dict, tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(dict(tiny_spec_dict, epochs=1)))
    env_args = ["--server", service.url]
    # no command's deadline here is a measure of speed: each guards against a hang only (a
    # command takes seconds, a few times more on a slow, loaded machine)
    r = run_tula("submit", spec, *env_args, "--wait")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.split("submitted job ")[1].split()[0]
    assert "choice" in r.stdout, r.stdout
    st = run_tula("status", *env_args)
    assert st.returncode == 0 and job_id in st.stdout and "done" in st.stdout, (st.stdout, st.stderr)
    one = run_tula("status", job_id, *env_args)
    assert one.returncode == 0 and "choice" in one.stdout, (one.stdout, one.stderr)
    rp = run_tula("replan", job_id, "--objective", "cost", *env_args)
    assert rp.returncode == 0 and "choice" in rp.stdout, (rp.stdout, rp.stderr)
    gone = run_tula("status", "nosuchjob", *env_args)
    assert gone.returncode == 2 and "the service answered 404: there is no job 'nosuchjob'" in gone.stderr, gone
    down = run_tula("status", "--server", "http://127.0.0.1:9")
    assert down.returncode == 2 and "cannot reach the Tula service at http://127.0.0.1:9" in down.stderr, down

    # Ctrl-C while following a job stops following it, not the job.  The commands get SIGINT
    # as the suite has it, Python's default (conftest), whatever shell started the suite: from
    # one that had it ignored, the first command once missed the SIGINT that came before it set
    # its handlers, followed the 200-epoch job on, and communicate() timed out after 60 s.
    spec.write_text(yaml.safe_dump(dict(tiny_spec_dict, epochs=200)))
    # at once after the job's line (the command may still be starting what it follows with):
    # exit 130 and one sentence too, never 0 (typer turned a KeyboardInterrupt into a return)
    proc = popen_tula("submit", spec, *env_args, "--wait", stdout=subprocess.PIPE, start_new_session=False)
    early_id = _job_line(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted:" in err and "Traceback" not in err, (proc.returncode, err)
    service.client().post(f"/v1/jobs/{early_id}/cancel")
    # while it follows the job
    proc = popen_tula("submit", spec, *env_args, "--wait", stdout=subprocess.PIPE, start_new_session=False)
    follow_id = _job_line(proc)
    _until_following(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err)
    assert f"stopped following job {follow_id}, which goes on in the service" in " ".join(err.split()), err
    assert f"tula status {follow_id}" in " ".join(err.split()), err
    c = service.client()
    assert ok_json(c.get(f"/v1/jobs/{follow_id}"))["state"] not in ("cancelled", "failed")


def test_a_job_above_the_memory_limit_fails_as_its_own_error_and_the_service_goes_on(home, tiny_spec_dict):
    """#29 item 4: a submission whose processes hold more of the host's memory than
    max_job_memory_bytes (here 2.5 GiB; a 1.6 GB in-memory set, held by the runner and each of
    its 2 ranks) is stopped by the service's guard and fails with that sentence -- not an
    internal error, not the service's out-of-memory -- and the service goes on answering."""
    limit = int(2.5 * 2**30)
    svc = Service(home, env={"TULA_MAX_JOB_MEMORY_BYTES": str(limit)}).start()
    try:
        c = svc.client()
        big = {"name": "synthetic", "sample_shape": [1, 64, 64], "num_samples": 100_000, "num_classes": 10}
        r = c.post("/v1/jobs", json={"spec": {**tiny_spec_dict, "data": big}, "train": False})
        assert r.status_code == 202, r.text
        job = wait_for(c, r.json()["id"], timeout_s=180)
        assert job["state"] == "failed", job
        assert "TULA_MAX_JOB_MEMORY_BYTES" in job["error"] and "internal error" not in job["error"], job["error"]
        assert "more than the service's limit of 2.5 GiB per job" in job["error"], job["error"]
        assert c.get("/v1/health").status_code == 200
        assert runner_pids(job["id"]) == []
    finally:
        svc.stop()
