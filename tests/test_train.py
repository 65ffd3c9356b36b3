"""The training runner with real 2-rank gloo DDP: AGS replicas, kill and resume, the
out-of-memory fallback under a real memory cap, and the CLI's bad-input sentences."""

import json
import os
import signal
import time

import pytest
from helpers import assert_refused, local_launcher, popen_tula, run_tula, train_args, tula_in_process, write_spec

from tula.core.errors import SpecError, TulaError
from tula.core.events import EpochFinished
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, checkpoint_meta
from tula.engine.train import METRICS, steps_per_epoch, train

DIGITS_TRAIN = 1438  # scikit-learn's 1797 digits less the 359 (20 %) held out for testing


def _spec(tiny_spec_dict, **train):
    d = dict(tiny_spec_dict, epochs=train.pop("epochs", 2))
    d["train"] = {"warmup_epochs": 0, **train}
    return spec_from_dict(d)


@pytest.mark.slow
@pytest.mark.parametrize("granularity", ["tensor", "element"])
def test_ags_on_two_ranks_keeps_replicas_identical_and_learns(tiny_spec_dict, tmp_path, granularity):
    # factors every 3 steps; delta 10 so that most steps are scaled and the test exercises scaling
    spec = _spec(tiny_spec_dict, ags={"granularity": granularity, "update_every": 3, "delta": 10.0, "b_small": 32})
    events = []
    run = train(spec, "ags", 2, 256, tmp_path, launcher=local_launcher(), on_event=events.append)
    spe = steps_per_epoch(DIGITS_TRAIN, 256)
    assert run.replicas_identical
    assert [h.epoch for h in run.history] == [1, 2]
    assert run.steps_done == 2 * spe == sum(h.steps for h in run.history)
    assert run.fallbacks == [] and run.global_batch == 256 and run.local_batch == 128
    tr = run.traces
    assert tr.delta is not None and tr.scaled is not None
    assert len(tr.delta) == len(tr.scaled) == 2 * spe
    assert 0 < sum(tr.scaled) < 2 * spe  # the first step (delta = inf) is never scaled
    assert tr.scaled[0] is False
    assert run.history[-1].train_loss < run.history[0].train_loss
    assert run.final["test_top1"] > 0.3  # far above chance (0.1) after 2 epochs of 5 steps
    lines = [json.loads(s) for s in (tmp_path / METRICS).read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2]
    assert [e.record.epoch for e in events if isinstance(e, EpochFinished)] == [1, 2]


@pytest.mark.slow
def test_oom_during_training_falls_back_to_a_smaller_micro_batch_under_a_real_cap(tiny_spec_dict, tmp_path):
    """Each rank's address space is capped at its size + 8 MiB (and the 16 MiB of heap kept
    free for the worker's other threads, tula.engine.memory.reserve_heap): a local batch of
    512 digits through a width-32 CNN needs more, so the ranks agree on OOM and the run
    restarts at half the micro-batch until it fits -- the global batch kept, in twice the
    gradient accumulation steps (tula.engine.train.next_fallback); every epoch then runs
    exactly once.  (At 28 MiB the micro-batch of 512 fitted in about one run of four here and
    in CI: its step's peak varies run to run by more than that margin.  At 8 MiB it never
    fitted in 16 runs and the run settled at 128 or 32.)"""
    d = dict(tiny_spec_dict, epochs=2, model={"name": "small_cnn", "kwargs": {"width": 32}})
    d["search"] = {**d["search"], "memory_budget_bytes": 8 * 2**20, "enforce_memory_cap": True}
    d["train"] = {"warmup_epochs": 0}
    spec = spec_from_dict(d)
    run = train(spec, "lbt", 2, 1024, tmp_path, launcher=local_launcher())
    assert run.fallbacks, "the capped run never ran out of memory"
    assert run.requested_global_batch == 1024
    assert run.fallbacks[0].from_global_batch == 1024
    assert all(f.to_global_batch == 1024 for f in run.fallbacks)
    chain = [1] + [f.to_accumulation_steps for f in run.fallbacks]
    assert chain == [2**i for i in range(len(chain))]
    assert run.global_batch == 1024 and run.accumulation_steps == chain[-1] > 1
    assert run.micro_batch == 512 // chain[-1] and run.local_batch == 512
    assert [h.epoch for h in run.history] == [1, 2]
    assert all(h.global_batch == run.global_batch for h in run.history)
    assert run.steps_done == 2 * steps_per_epoch(DIGITS_TRAIN, run.global_batch)
    assert run.replicas_identical


@pytest.mark.slow
def test_oom_with_no_smaller_batch_left_ends_in_one_sentence_and_keeps_the_checkpoint(tiny_spec_dict, tmp_path):
    """A run that goes on (--resume) under a memory cap so small that nothing fits (each rank's
    address space capped at its size + 1 byte) falls back down the whole chain -- k doubles at
    global batch 64 until the micro-batch is 1 sample -- and then, with no smaller batch left,
    ends as the user's error: exit 2, one sentence naming the batch, the cap and the epoch kept,
    no traceback, no fallback to a global batch of 0; the checkpoint of epoch 1 is untouched."""
    d = dict(tiny_spec_dict, epochs=1)
    d["train"] = {"warmup_epochs": 0}
    out = tmp_path / "run"
    first = train(spec_from_dict(d), "lbt", 2, 64, out, launcher=local_launcher())
    assert [h.epoch for h in first.history] == [1]
    kept = (out / CHECKPOINT).read_bytes()
    d = dict(d, epochs=2)
    d["search"] = {**d["search"], "memory_budget_bytes": 1, "enforce_memory_cap": True}
    r = tula_in_process(*train_args(write_spec(tmp_path, d), out, batch=64), "--resume", out)
    err = r.stderr.strip().splitlines()[-1]  # the fallbacks' lines and the bar come before it
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr and "ValidationError" not in r.stdout + r.stderr, r.stderr
    assert r.stderr.count("error:") == 1 and err.startswith("error: "), r.stderr
    assert (
        "error: the model does not fit under the memory cap of 1 B per worker (search.memory_budget_bytes): "
        "global batch 64 on 2 worker(s) ran out of memory at a micro-batch of 1 sample(s) per worker "
        "(32 accumulation steps) and no smaller batch is left to fall back to; "
        f"epoch 1 of 2 is kept in {out / CHECKPOINT}"
    ) in err
    assert "global batch 0" not in r.stdout + r.stderr  # no fallback to nothing was announced
    assert (out / CHECKPOINT).read_bytes() == kept
    assert checkpoint_meta(out)["epoch"] == 1


@pytest.mark.slow
def test_killed_training_resumes_with_exact_epoch_and_step_counts(tiny_spec_dict, tmp_path):
    """SIGKILL the whole `tula train` process group once the first checkpoint is written,
    then `--resume`: epochs 1..E exactly once, E * steps_per_epoch steps, and the same model
    as a run that was never interrupted (deterministic batches and restored AGS state)."""
    d = dict(tiny_spec_dict, epochs=6)
    d["train"] = {"warmup_epochs": 0, "ags": {"update_every": 4, "delta": 10.0}}
    spec_path = write_spec(tmp_path, d)
    out = tmp_path / "killed"
    args = train_args(spec_path, out, method="ags")
    proc = popen_tula(*args)
    ckpt = out / CHECKPOINT
    deadline = time.monotonic() + 300
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"training ended before it could be killed: {proc.stderr.read()}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = checkpoint_meta(out)["epoch"]
    assert 1 <= killed_at < 6
    digest_at_kill = ckpt.read_bytes()
    time.sleep(1.0)  # no orphaned rank may still be training and writing
    assert ckpt.read_bytes() == digest_at_kill

    r = tula_in_process(*args, "--resume", out)
    assert r.returncode == 0, r.stderr
    rec = json.loads((out / "train.json").read_text())
    spe = steps_per_epoch(DIGITS_TRAIN, 64)
    assert rec["resumed_from_epoch"] == killed_at
    assert [h["epoch"] for h in rec["history"]] == [1, 2, 3, 4, 5, 6]
    assert rec["steps_done"] == 6 * spe
    lines = [json.loads(s)["epoch"] for s in (out / METRICS).read_text().splitlines()]
    assert lines == [1, 2, 3, 4, 5, 6]

    # the same run, uninterrupted
    ref = train(spec_from_dict(d), "ags", 2, 64, tmp_path / "ref", launcher=local_launcher())
    assert ref.final["test_loss"] == pytest.approx(rec["final"]["test_loss"], rel=1e-6)
    assert ref.history[-1].train_loss == pytest.approx(rec["history"][-1]["train_loss"], rel=1e-6)


@pytest.mark.slow
def test_finished_run_in_out_dir_is_not_overwritten(tiny_spec_dict, tmp_path):
    spec = _spec(tiny_spec_dict, epochs=1)
    train(spec, "lbt", 2, 256, tmp_path, launcher=local_launcher())
    before = (tmp_path / CHECKPOINT).read_bytes()
    with pytest.raises(TulaError, match="already holds a training run; pass --resume"):
        train(spec, "lbt", 2, 256, tmp_path, launcher=local_launcher())
    with pytest.raises(SpecError, match="trained with method 'lbt' on 2 worker"):
        train(spec, "ags", 2, 256, tmp_path, resume=True, launcher=local_launcher())
    assert (tmp_path / CHECKPOINT).read_bytes() == before


@pytest.mark.parametrize(
    "args, sentence",
    [
        (
            ["--method", "ags", "--workers", "2", "--batch", "32"],
            "train.ags.b_small (32) must be smaller than the global batch (32)",
        ),
        (
            ["--method", "lbt", "--workers", "2", "--batch", "33"],
            "global batch 33 does not split evenly over 2 workers",
        ),
        (["--method", "lbt", "--workers", "2", "--batch", "4096"], "larger than the training set (1438 samples)"),
        (["--method", "adascale", "--workers", "1", "--batch", "64"], "needs at least 2"),
        (["--method", "sgd", "--workers", "2", "--batch", "64"], "'sgd' is not one of"),
        (["--workers", "2"], "no configuration to train at"),
    ],
)
def test_cli_train_bad_input_is_one_sentence_and_exit_2(tiny_spec_dict, tmp_path, args, sentence):
    """Checked in this process, through the command's own entry point (tula.cli.main)."""
    spec_path = write_spec(tmp_path, tiny_spec_dict)
    out = tmp_path / "out"
    r = tula_in_process("train", spec_path, *args, "--out", out)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert sentence in " ".join(r.stderr.split()), r.stderr
    assert "Traceback" not in r.stderr
    assert_refused(r, sentence)
    assert not (out / CHECKPOINT).exists()


def test_cli_train_bad_input_as_a_command_prints_only_its_sentence_with_exit_2(tiny_spec_dict, tmp_path):
    """The same refusal from the real command: exit code 2, the one sentence on stderr, nothing else."""
    spec_path = write_spec(tmp_path, tiny_spec_dict)
    out = tmp_path / "out"
    r = run_tula("train", spec_path, "--method", "lbt", "--workers", "2", "--batch", "33", "--out", out, timeout=120)
    assert_refused(r, "global batch 33 does not split evenly over 2 workers")
    assert not (out / CHECKPOINT).exists()
