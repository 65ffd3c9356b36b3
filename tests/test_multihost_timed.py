"""Across emulated hosts (tests/emulated_hosts.py), the tests that time real work against
a deadline or a prediction: a world that cannot form, a scheduler that does not answer, a
host lost mid-training (from the CLI and through the service), and the plan rule's worker
counts from steps measured over shaped links.  Marked serial: make test runs them alone on
the machine, after the others (test_multihost.py has the rest of the tests across hosts).

Skipped with a reason where namespaces cannot be made (not root); CI sets
TULA_REQUIRE_NETNS=1, which turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from emulated_hosts import COMMAND_ENV
from helpers import popen_tula, run_tula, train_args, tula_cmd
from multihost_helpers import spec_file, train_args_on, tula_on

from tula.core.run_costs import measured_epoch_s

# serial: shaped links, deadlines of seconds (pg_timeout_s, heartbeat_timeout_s) and the plan rule's
# rankings from measured steps: make test runs these alone on the machine
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def test_a_world_whose_ranks_cannot_reach_each_other_fails_in_one_sentence_naming_both(hosts, tmp_path):
    """The spec forces gloo onto loopback (cluster.interface: lo): rank 1 is then told to
    meet rank 0 at 127.0.0.1 -- what torch's default does on such nodes.  One sentence naming
    rank 1's address and interface and rank 0's rendezvous, within pg_timeout_s (+ the
    scheduler's round trips), exit 2."""
    # the world never forms: the command waits out pg_timeout_s, 6 s here (a trial's world of
    # this spec forms in well under a second)
    spec = spec_file(tmp_path, cluster={"interface": "lo", "pg_timeout_s": 6})
    t0 = time.monotonic()
    r = tula_on(hosts, *train_args_on(hosts, spec, tmp_path / "t"))
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
    spec = spec_file(tmp_path, cluster={"connect_timeout_s": 3})
    t0 = time.monotonic()
    args = train_args(spec, tmp_path / "t", "--cluster", "tcp://127.0.0.1:1", method=None, workers=1, batch=32)
    r = run_tula(*args, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no Dask scheduler answers at tcp://127.0.0.1:1 within 3 s" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 3 + 10


def _train_until_checkpoint(h, spec: Path, out: Path) -> subprocess.Popen:
    proc = popen_tula(
        *train_args_on(h, spec, out), prefix=("ip", "netns", "exec", h.head), env={**os.environ, **COMMAND_ENV}
    )
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

    spec = spec_file(tmp_path, epochs=4)  # the fault lands in epoch 2 (see _train_until_checkpoint)
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
        again = tula_on(h, *train_args_on(h, spec, out, "--resume"))
        assert again.returncode == 0, again.stderr + h.log_tail()
        run = json.loads((out / "train.json").read_text())
        assert run["epochs"] == 4 and run["resumed_from_epoch"] == meta["epoch"] and run["replicas_identical"]


def test_a_service_job_whose_host_is_lost_mid_training_resumes_on_the_hosts_left(netns_ok, tmp_path):
    """`tula serve --cluster tcp://...` on the head of three hosts; a job trains on two of them
    and one of its hosts' worker is killed mid-training: the job is queued again (not failed),
    resumes from its last checkpoint on the two hosts left, and ends done, its epochs once each."""
    from emulated_hosts import EmulatedHosts
    from service_helpers import SERVICE_ENV

    from tula.service.store import Store

    spec = spec_file(tmp_path, epochs=6, search={"cluster_sizes": [2], "min_batch": 32, "max_batch": 32})
    home = tmp_path / "home"
    url = "http://127.0.0.1:8799"  # the head's own loopback: only commands on the head reach it
    with EmulatedHosts(n_hosts=3) as h:
        env = {**COMMAND_ENV, **SERVICE_ENV}
        serve = [*tula_cmd(), "serve", "--port", "8799", "--home", str(home), "--cluster", h.scheduler_address]
        h.popen(0, serve, log="serve.log", env=env)
        deadline = time.monotonic() + 60
        while tula_on(h, "status", "--server", url, timeout=30).returncode != 0:
            assert time.monotonic() < deadline, h.log_tail()
            time.sleep(0.3)
        r = tula_on(h, "submit", str(spec), "--server", url)
        assert r.returncode == 0, r.stderr
        with Store(f"sqlite:///{home / 'tula.db'}", home) as store:
            (job,), _ = store.list_jobs()
            ckpt = store.job_dir(job["id"]) / "train" / "checkpoint.pt"
            deadline = time.monotonic() + 240
            while not ckpt.exists():  # training, its first epoch done
                job = store.get_job(job["id"])
                assert job["state"] not in ("done", "failed") and time.monotonic() < deadline, (job, h.log_tail())
                time.sleep(0.1)
            for p in h.worker_procs[2]:  # hosts 1 and 2 hold the world's ranks (workers in host order)
                os.killpg(p.pid, signal.SIGKILL)
            deadline = time.monotonic() + 300
            while (job := store.get_job(job["id"]))["state"] not in ("done", "failed", "cancelled"):
                assert time.monotonic() < deadline, (job, h.log_tail())
                time.sleep(0.3)
            assert job["state"] == "done" and job["attempts"] == 2, (job, h.log_tail())
            run = json.loads((store.job_dir(job["id"]) / "train" / "train.json").read_text())
        assert run["epochs"] == 6 and run["resumed_from_epoch"] >= 1 and run["replicas_identical"], run
        assert [e["epoch"] for e in run["history"]] == list(range(1, 7))


def _profile_then_train_with_its_models(h, spec: Path, tmp_path: Path, workers: int | None) -> dict:
    """``tula profile`` on the hosts, the models fitted, then ``tula train --models`` with the
    spec's schedule (``--workers`` as given; None: left out): the training record."""
    from tula.core.fit import fit_models
    from tula.core.records import save_record

    prof, models = tmp_path / "profile.json", tmp_path / "models.json"
    r = tula_on(h, "profile", spec, "--out", prof, "--cluster", h.scheduler_address)
    assert r.returncode == 0, r.stderr + h.log_tail()
    save_record(fit_models(json.loads(prof.read_text())), models)
    out = tmp_path / "train"
    r = tula_on(h, *train_args_on(h, spec, out, "--models", models, workers=workers))
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
        spec = spec_file(
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
    spec = spec_file(
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
