"""Worlds across hosts: real network namespaces (tests/emulated_hosts.py), a real Dask
scheduler and real Dask workers inside them, real gloo across the bridge, and `tula`
commands run on the head host as a user runs them on a login node.

Inside every namespace the machine's host name resolves to 127.0.0.1, as on many
Debian-based nodes: a rank that trusted it would tell the others to meet it on loopback.
No interface is set anywhere unless a test says so.

Skipped with a reason where namespaces cannot be made (not root); CI sets
TULA_REQUIRE_NETNS=1, which turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from emulated_hosts import COMMAND_ENV
from helpers import kill_on_line, popen_tula, run_tula, train_args, tula_cmd

from tula.core.run_costs import measured_epoch_s

# serial: shaped links, deadlines of seconds (pg_timeout_s, heartbeat_timeout_s) and the plan rule's
# rankings from measured steps: make test runs these alone on the machine
pytestmark = [pytest.mark.slow, pytest.mark.serial]

HERE = Path(__file__).resolve().parent
#: the tests' folder on the import path of the commands and of the Dask workers (tests/workers.py's models)
TESTS_ON_PATH = {"PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}


def _spec(tmp_path: Path, name: str = "mh", **over) -> Path:
    d = {
        "name": name,
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
        "data": {"name": "digits"},
        "epochs": 2,
        "seed": 0,
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 64},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0},
        "train": {"method": "lbt", "warmup_epochs": 0},
        "cluster": {"pg_timeout_s": 10, "connect_timeout_s": 10, "heartbeat_timeout_s": 6},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.fixture(scope="module")
def hosts(netns_ok):
    """Three emulated hosts with one Dask worker each, and the head that runs the commands."""
    from emulated_hosts import EmulatedHosts

    with EmulatedHosts(n_hosts=3, worker_env=TESTS_ON_PATH) as h:
        yield h


def _tula(h, *args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``tula ARGS`` run on the head host (inside its namespace), as helpers.run_tula runs it here."""
    return h.run([*tula_cmd(), *map(str, args)], timeout=timeout, **kw)


def _profile(h, spec: Path, out: Path) -> subprocess.CompletedProcess:
    """``tula profile SPEC --search full`` on the head host, on the hosts' Dask scheduler."""
    return _tula(h, "profile", spec, "--search", "full", "--out", out, "--cluster", h.scheduler_address)


def _train(h, spec: Path, out: Path, *more, workers: int = 2, batch: int = 32) -> list:
    """The arguments of ``tula train`` (the spec's method) on the hosts' Dask scheduler."""
    return train_args(spec, out, "--cluster", h.scheduler_address, *more, method=None, workers=workers, batch=batch)


def _params(run_dir: Path) -> dict:
    from tula.engine.checkpoint import load_checkpoint

    return load_checkpoint(run_dir)["model"]


def test_profile_and_train_across_two_hosts_with_no_interface_set(hosts, tmp_path):
    spec = _spec(tmp_path)
    r = _profile(hosts, spec, tmp_path / "p" / "profile.json")
    assert r.returncode == 0, r.stderr + hosts.log_tail()
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    addresses = {hosts.address(k) for k in hosts.hosts}
    two = [t for t in prof["trials"] if t["n_workers"] == 2]
    assert two and all(t["status"] == "ok" for t in prof["trials"])
    for t in prof["trials"]:
        assert set(t["hosts"]) <= addresses and len(set(t["hosts"])) == t["n_workers"], t  # one rank per host
        assert t["interfaces"] == ["eth0"] * t["n_workers"], t  # the interface of the worker's address, not lo
        assert t["interface_sources"] == ["worker address"] * t["n_workers"]
        assert t["local_ranks"] == [0] * t["n_workers"] and t["ranks_per_host"] == 1
    assert prof["placement"]["n_hosts"] >= 2 and prof["placement"]["max_ranks_per_host"] == 1

    out = tmp_path / "train"
    r = _tula(hosts, *_train(hosts, spec, out))
    assert r.returncode == 0, r.stderr + hosts.log_tail()
    run = json.loads((out / "train.json").read_text())
    assert run["replicas_identical"] and run["n_workers"] == 2 and run["epochs"] == 2


def test_a_world_whose_ranks_cannot_reach_each_other_fails_in_one_sentence_naming_both(hosts, tmp_path):
    """The spec forces gloo onto loopback (cluster.interface: lo): rank 1 is then told to
    meet rank 0 at 127.0.0.1 -- what torch's default does on such nodes.  One sentence naming
    rank 1's address and interface and rank 0's rendezvous, within pg_timeout_s (+ the
    scheduler's round trips), exit 2."""
    # the world never forms: the command waits out pg_timeout_s, 6 s here (a trial's world of
    # this spec forms in well under a second)
    spec = _spec(tmp_path, cluster={"interface": "lo", "pg_timeout_s": 6})
    t0 = time.monotonic()
    r = _tula(hosts, *_train(hosts, spec, tmp_path / "t"))
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()[-1]  # after the progress bar
    assert "Traceback" not in r.stderr and err.startswith("error: rank "), r.stderr
    assert "(interface lo, from cluster.interface)" in err and "rendezvous at " in err, err
    named = [hosts.address(k) for k in hosts.hosts if hosts.address(k) in err]
    assert len(named) == 2, err  # this rank's host and rank 0's
    # pg_timeout_s, plus starting the command and the world; under the default pg_timeout_s (60 s).
    # 29.2 s once, on a machine whose whole suite ran 1.6x its usual time
    assert took < 6 + 40, took


def test_no_scheduler_at_the_address_is_one_sentence_within_the_connect_timeout(tmp_path):
    spec = _spec(tmp_path, cluster={"connect_timeout_s": 3})
    t0 = time.monotonic()
    args = train_args(spec, tmp_path / "t", "--cluster", "tcp://127.0.0.1:1", method=None, workers=1, batch=32)
    r = run_tula(*args, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no Dask scheduler answers at tcp://127.0.0.1:1 within 3 s" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 3 + 10


def test_a_growing_world_across_hosts_killed_with_sigkill_resumes_like_an_uninterrupted_run(hosts, tmp_path):
    """1 worker for epoch 1, then 2 workers on two hosts; `tula train` (the command on the
    head, holding no rank) is killed with SIGKILL during epoch 2; --resume finishes with
    the same parameters as a run never killed."""
    # small synthetic data (800 training samples: 12 steps at B=64, 6 at B=128) through a model
    # whose training steps on 2 workers take 0.5 s each (a sleep): the 2-host epoch lasts about 3 s,
    # and the log gets a step line every 0.2 s (TULA_LOG_EVERY_S), so the kill lands mid-epoch.
    # The ranks run on in their Dask workers until they see their tasks released (polled every
    # 0.5 s) and agree to stop at a step boundary: with 0.2 s steps, once under CI's full suite,
    # they finished epoch 2 and wrote its checkpoint first
    spec = _spec(
        tmp_path,
        model={"name": "workers:sleepy_mlp", "kwargs": {"sleep_s": 0.5}},
        # this test is about the kill and the resume, not about losing a host: a worker unheard
        # for the 6 s the host-loss tests use, on 2 loaded cores, failed its uninterrupted run
        cluster={"heartbeat_timeout_s": 30},
        data={"name": "synthetic", "sample_shape": [1, 8, 8], "num_samples": 1000},
        train={
            "method": "lbt",
            "warmup_epochs": 0,
            "batch_schedule": {"kind": "piecewise", "batches": [64, 128]},
            "workers": {"min": 1, "max": 2, "batch_per_worker": 64},
        },
    )
    env = {**TESTS_ON_PATH, "TULA_LOG_EVERY_S": "0.2"}
    ref = _tula(hosts, *_train(hosts, spec, tmp_path / "ref", workers=1, batch=64), env=env)
    assert ref.returncode == 0, ref.stderr + hosts.log_tail()

    cut = tmp_path / "cut"
    args = _train(hosts, spec, cut, workers=1, batch=64)
    proc = popen_tula(*args, prefix=("ip", "netns", "exec", hosts.head), env={**os.environ, **COMMAND_ENV, **env})
    seen = kill_on_line(proc, "epoch 2: step")  # the 2-host world is training: kill on its first step line
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    step, steps = map(int, seen[-1].split("step ")[1].split("/"))
    assert 1 <= step < steps == 6, seen[-1]  # mid-epoch
    assert any("moves to global batch 128 on 2 worker(s)" in s for s in seen), "".join(seen)
    again = _tula(hosts, *args, "--resume", cut, env=env)
    assert again.returncode == 0, again.stderr + hosts.log_tail()
    a, b = (json.loads((p / "train.json").read_text()) for p in (tmp_path / "ref", cut))
    assert b["resumed_from_epoch"] == 1, "epoch 2 finished before the ranks stopped: " + "".join(seen[-3:])
    assert b["steps_done"] == a["steps_done"]
    assert [(h["global_batch"], h["n_workers"]) for h in b["history"]] == [(64, 1), (128, 2)]
    assert [h["train_loss"] for h in b["history"]] == [h["train_loss"] for h in a["history"]]
    pa, pb = _params(tmp_path / "ref"), _params(cut)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


def _train_until_checkpoint(h, spec: Path, out: Path) -> subprocess.Popen:
    proc = popen_tula(*_train(h, spec, out), prefix=("ip", "netns", "exec", h.head), env={**os.environ, **COMMAND_ENV})
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.pt").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    time.sleep(0.3)  # into epoch 2
    return proc


def test_a_host_lost_mid_epoch_fails_in_one_sentence_and_resume_finishes_on_the_hosts_left(netns_ok, tmp_path):
    """Three hosts; a 2-worker run loses the host of one rank mid-epoch (its link taken down
    inside its namespace): one sentence naming that worker within pg_timeout_s + 5 s, exit 2,
    the last finished epoch's checkpoint intact; --resume finishes on the two hosts left.  (A
    host's worker killed instead: test_dask's lost worker for the CLI's sentence and resume,
    and the service's host lost below, across these hosts.)"""
    from emulated_hosts import EmulatedHosts

    from tula.engine.checkpoint import checkpoint_meta

    spec = _spec(tmp_path, epochs=4)  # the fault lands in epoch 2 (see _train_until_checkpoint)
    out = tmp_path / "run"
    with EmulatedHosts(n_hosts=3) as h:
        proc = _train_until_checkpoint(h, spec, out)
        victim = 2  # hosts 1 and 2 hold the world's ranks (workers are taken in host order)
        t0 = time.monotonic()
        h.link(victim, up=False)
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
        assert proc.returncode == 2, err
        assert took < 10 + 5, (took, err)  # pg_timeout_s + 5
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: ") and "Traceback" not in err, err
        assert h.address(victim) in last, last  # names the worker that was lost
        meta = checkpoint_meta(out)  # intact: loads, and holds a finished epoch
        assert 1 <= meta["epoch"] < 4
        again = _tula(h, *_train(h, spec, out, "--resume", out))
        assert again.returncode == 0, again.stderr + h.log_tail()
        run = json.loads((out / "train.json").read_text())
        assert run["epochs"] == 4 and run["resumed_from_epoch"] == meta["epoch"] and run["replicas_identical"]


def test_two_hosts_with_two_workers_each_put_a_hosts_ranks_side_by_side(netns_ok, tmp_path):
    from emulated_hosts import EmulatedHosts

    # 4 ranks, 4 Dask workers and the scheduler on 2 shared cores: a worker went unheard for the
    # 6 s the failure tests use once in a full run here; this test is about placement, not loss
    spec = _spec(
        tmp_path,
        search={"cluster_sizes": [4], "min_batch": 32, "max_batch": 64},
        cluster={"heartbeat_timeout_s": 30},
    )
    with EmulatedHosts(n_hosts=2, workers_per_host=2) as h:
        r = _profile(h, spec, tmp_path / "p" / "profile.json")
        assert r.returncode == 0, r.stderr + h.log_tail()
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    for t in prof["trials"]:
        assert t["status"] == "ok" and t["n_workers"] == 4
        assert t["hosts"] == [h.address(1)] * 2 + [h.address(2)] * 2, t["hosts"]  # contiguous
        assert t["local_ranks"] == [0, 1, 0, 1] and t["ranks_per_host"] == 2
        assert t["interfaces"] == ["eth0"] * 4
    assert prof["placement"]["max_ranks_per_host"] == 2 and prof["placement"]["n_hosts"] == 2


def test_a_service_job_whose_host_is_lost_mid_training_resumes_on_the_hosts_left(netns_ok, tmp_path):
    """`tula serve --cluster tcp://...` on the head of three hosts; a job trains on two of them
    and one of its hosts' worker is killed mid-training: the job is queued again (not failed),
    resumes from its last checkpoint on the two hosts left, and ends done, its epochs once each."""
    from emulated_hosts import EmulatedHosts
    from service_helpers import SERVICE_ENV

    from tula.service.store import Store

    spec = _spec(tmp_path, epochs=6, search={"cluster_sizes": [2], "min_batch": 32, "max_batch": 32})
    home = tmp_path / "home"
    url = "http://127.0.0.1:8799"  # the head's own loopback: only commands on the head reach it
    with EmulatedHosts(n_hosts=3) as h:
        env = {**COMMAND_ENV, **SERVICE_ENV}
        serve = [*tula_cmd(), "serve", "--port", "8799", "--home", str(home), "--cluster", h.scheduler_address]
        h.popen(0, serve, log="serve.log", env=env)
        deadline = time.monotonic() + 60
        while _tula(h, "status", "--server", url, timeout=30).returncode != 0:
            assert time.monotonic() < deadline, h.log_tail()
            time.sleep(0.3)
        r = _tula(h, "submit", str(spec), "--server", url)
        assert r.returncode == 0, r.stderr
        with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
            (job,), _ = store.list_jobs()
            ckpt = store.job_dir(job.id) / "train" / "checkpoint.pt"
            deadline = time.monotonic() + 240
            while not ckpt.exists():  # training, its first epoch done
                job = store.get_job(job.id)
                assert job.state not in ("done", "failed") and time.monotonic() < deadline, (job, h.log_tail())
                time.sleep(0.1)
            for p in h.worker_procs[2]:  # hosts 1 and 2 hold the world's ranks (workers in host order)
                os.killpg(p.pid, signal.SIGKILL)
            deadline = time.monotonic() + 300
            while (job := store.get_job(job.id)).state not in ("done", "failed", "cancelled"):
                assert time.monotonic() < deadline, (job, h.log_tail())
                time.sleep(0.3)
            assert job.state == "done" and job.attempts == 2, (job, h.log_tail())
            run = json.loads((store.job_dir(job.id) / "train" / "train.json").read_text())
        assert run["epochs"] == 6 and run["resumed_from_epoch"] >= 1 and run["replicas_identical"], run
        assert [e["epoch"] for e in run["history"]] == list(range(1, 7))


def test_two_service_jobs_share_three_hosts_world_by_world_and_train_like_the_cli(hosts, tmp_path):
    """#29: `tula serve --cluster tcp://...` on the head of three hosts, two jobs submitted at
    once, each profiling on 1 and 2 workers and training on the plan's.  ``GET /v1/cluster``,
    read from the head every 0.2 s, never shows their worlds holding more than the 3 workers;
    both end done, in submission order of start, their 2-worker trials across two hosts; each
    training's record has the fields of a CLI run of the same spec on the same hosts, with
    replicas identical.  On the module's hosts: the service is stopped at the end, and its
    worlds' workers are free again as it ends them."""
    from service_helpers import SERVICE_ENV

    spec = _spec(tmp_path, epochs=2)
    home = tmp_path / "home"
    url = "http://127.0.0.1:8797"
    sampler = (
        "import json, sys, time, httpx\n"
        f"c = httpx.Client(base_url={url!r}, timeout=30)\n"
        "seen, t_end = [], time.monotonic() + 400\n"
        "while time.monotonic() < t_end:\n"
        "    jobs = c.get('/v1/jobs').json()['jobs']\n"
        "    seen.append(c.get('/v1/cluster').json()['running_jobs'])\n"
        "    if len(jobs) == 2 and all(j['state'] in ('done', 'failed', 'cancelled') for j in jobs):\n"
        "        break\n"
        "    time.sleep(0.2)\n"
        "print(json.dumps({'jobs': jobs, 'seen': seen}))\n"
    )
    h = hosts
    env = {**COMMAND_ENV, **SERVICE_ENV}
    serve = [*tula_cmd(), "serve", "--port", "8797", "--home", str(home), "--cluster", h.scheduler_address,
             "--max-concurrent-jobs", "2"]  # fmt: skip
    service = h.popen(0, serve, log="serve-two-jobs.log", env=env)
    try:
        deadline = time.monotonic() + 60
        while _tula(h, "status", "--server", url, timeout=30).returncode != 0:
            assert time.monotonic() < deadline, h.log_tail()
            time.sleep(0.3)
        for _ in "ab":
            r = _tula(h, "submit", str(spec), "--server", url)
            assert r.returncode == 0, r.stderr
        r = h.run([sys.executable, "-c", sampler], timeout=460)
        assert r.returncode == 0, r.stderr + h.log_tail()
        watched = json.loads(r.stdout)
        jobs = sorted(watched["jobs"], key=lambda j: j["created_at"])
        assert [j["state"] for j in jobs] == ["done", "done"], (jobs, h.log_tail())
        assert jobs[0]["started_at"] <= jobs[1]["started_at"]
        held = [sum(j["world_workers"] for j in s if j["world"] == "holds") for s in watched["seen"]]
        assert held and max(held) <= 3 and max(held) > 0, watched["seen"]
        cli = tmp_path / "cli"
        r = _tula(h, "run", spec, "--out", cli, "--cluster", h.scheduler_address)
        assert r.returncode == 0, r.stderr + h.log_tail()
    finally:  # the module's hosts go on: the service and its runners end here
        with contextlib.suppress(ProcessLookupError):
            os.killpg(service.pid, signal.SIGTERM)
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(service.pid, signal.SIGKILL)
            service.wait(timeout=30)
    cli_run = json.loads((cli / "train" / "train.json").read_text())
    for job in jobs:
        run_dir = home / "jobs" / job["id"]
        profile = json.loads((run_dir / "profile.json").read_text())
        pairs = [t["hosts"] for t in profile["trials"] if t["status"] == "ok" and t["n_workers"] == 2]
        assert pairs and all(len(set(p)) == 2 for p in pairs), pairs  # across two hosts, one rank each
        run = json.loads((run_dir / "train" / "train.json").read_text())
        assert run["replicas_identical"] and [e["epoch"] for e in run["history"]] == [1, 2], run
        assert set(run) == set(cli_run), set(run) ^ set(cli_run)


def _profile_then_train_with_its_models(h, spec: Path, tmp_path: Path, workers: int | None) -> dict:
    """``tula profile`` on the hosts, the models fitted, then ``tula train --models`` with the
    spec's schedule (``--workers`` as given; None: left out): the training record."""
    from tula.core.fit import fit_models
    from tula.core.records import save_record

    prof, models = tmp_path / "profile.json", tmp_path / "models.json"
    r = _tula(h, "profile", spec, "--out", prof, "--cluster", h.scheduler_address)
    assert r.returncode == 0, r.stderr + h.log_tail()
    save_record(fit_models(json.loads(prof.read_text())), models)
    out = tmp_path / "train"
    r = _tula(h, *_train(h, spec, out, "--models", models, workers=workers))
    assert r.returncode == 0, r.stderr + h.log_tail()
    return json.loads((out / "train.json").read_text())


def test_over_a_slow_link_the_plan_rule_keeps_one_worker_where_adadamps_rule_would_grow(hosts, tmp_path):
    """#30 on real shaped links: the hosts' links at 100 Mbit/s, a communication-bound MLP
    (1.2 MB of gradients a step: 0.1 s on the link, against ms of compute) profiled there,
    then a geometric schedule 32 -> 64 -> 128
    with ``workers: {rule: plan}`` and the profile's models: every epoch trains on one worker
    -- the models, fitted on those links, rank two workers slower at each batch (AdaDamp's
    rule, one worker per 32 samples, would put two on the link from the second epoch) -- and
    each epoch takes about one worker's predicted time, far below two workers'.  The links are
    unshaped afterwards."""
    for k in hosts.hosts:
        hosts.shape(k, 100)
    try:
        mlp = {"name": "mlp", "kwargs": {"in_features": 64, "hidden": 512, "num_classes": 10}}  # 1.2 MB of gradients
        spec = _spec(
            tmp_path, "slow", model=mlp, epochs=3,
            search={"min_batch": 32, "max_batch": 128},
            train={"batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
                   "workers": {"min": 1, "max": 2, "rule": "plan"}},
        )  # fmt: skip
        run = _profile_then_train_with_its_models(hosts, spec, tmp_path, workers=None)
        assert [(h["global_batch"], h["n_workers"]) for h in run["history"]] == [(32, 1), (64, 1), (128, 1)], run
        for h in run["history"][:-1]:  # each decision: one worker ranked best, two slower
            ranking = h["schedule"]["ranking"]
            assert ranking[0]["n_workers"] == 1, ranking
            two = [o for o in ranking if o["n_workers"] == 2]
            assert two and two[0]["epoch_s"] > 1.5 * ranking[0]["epoch_s"], ranking
        # each epoch, at the batch it trained, ran far below what two workers were predicted to take there
        # (AdaDamp's rule's configuration), and near one worker's prediction: within 2x, not 1.5x --
        # these epochs last 0.1 s, and in one full run here they took 1.47-1.52x their prediction
        for before, h in zip(run["history"], run["history"][1:]):  # the decision for an epoch is in the one before
            two = next(o for o in before["schedule"]["ranking"] if o["n_workers"] == 2)
            assert measured_epoch_s(h) < two["epoch_s"], (h, two)
        ratios = [measured_epoch_s(h) / h["predicted_epoch_s"] for h in run["history"][1:]]
        assert all(r < 2.0 for r in ratios), ratios
    finally:
        for k in hosts.hosts:
            hosts.unshape(k)


def test_over_fast_links_the_plan_rule_puts_a_compute_bound_model_on_two_workers(hosts, tmp_path):
    """#30's other side, on the same hosts with their links unshaped: a compute-bound model
    (SmallCNN on 1x32x32 images: 53 kB of gradients, tens of ms of compute a step on one
    core) profiled there, then the same geometric schedule 32 -> 64 -> 128 with ``workers:
    {rule: plan}``, started with ``--workers 1``: the worker count grows to two, and every
    decision is the one the models' ranking and the 5 % threshold make.  At B = 128 the
    models -- fitted where two ranks each train half the batch on their own core -- rank two
    workers faster than one by far more than the threshold (27-35 % in runs here); at B = 32
    and 64 the margin is a few per cent either side of it on these 2 shared cores (CI's run of
    stop 33 kept one worker for the first epoch, one run here too), so the test holds those
    decisions to the ranking, not to a worker count; the replicas stay identical."""
    cnn = {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}}
    data = {"name": "synthetic", "sample_shape": [1, 32, 32], "num_classes": 10, "num_samples": 768}
    spec = _spec(
        tmp_path, "fast", model=cnn, data=data, epochs=3,
        search={"min_batch": 32, "max_batch": 128},
        train={"batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
               "workers": {"min": 1, "max": 2, "rule": "plan"}},
    )  # fmt: skip
    run = _profile_then_train_with_its_models(hosts, spec, tmp_path, workers=1)
    history = run["history"]
    assert [h["global_batch"] for h in history] == [32, 64, 128] and history[-1]["n_workers"] == 2, run
    # each decision, in the epoch before: the ranking's, with the threshold
    for before, after in zip(history, history[1:]):
        ranking = before["schedule"]["ranking"]
        best, current = ranking[0], next(o for o in ranking if o["n_workers"] == before["n_workers"])
        gain = 1.0 - best["score"] / current["score"]
        assert after["n_workers"] == (best["n_workers"] if gain > 0.05 else before["n_workers"]), (gain, ranking)
    ranking = history[1]["schedule"]["ranking"]  # the decision for B = 128: two workers, clear of the threshold
    one = next(o for o in ranking if o["n_workers"] == 1)
    assert ranking[0]["n_workers"] == 2 and one["epoch_s"] > 1.05 * ranking[0]["epoch_s"], ranking
    assert run["replicas_identical"], run
