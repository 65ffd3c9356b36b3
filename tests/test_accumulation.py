"""Gradient accumulation in the trainer (issue #17, part 3): a step's share of a rank (B / N
samples) as k micro-batches, DDP ``no_sync`` for the first k - 1.  With real 2-rank gloo DDP
on digits and an MLP (no BatchNorm, whose statistics would see b samples instead of B / N):
k = 2 ends with k = 1's parameters (lbt and ags), a stopped and resumed accumulated run ends
as the uninterrupted one did, out of memory doubles k before it halves B (a model that
really raises ``torch.OutOfMemoryError`` above 32 samples), and bad input is one sentence
with exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import local_launcher, train_args, tula_in_process

import tula
from tula.core.config import Config
from tula.core.errors import SpecError
from tula.core.events import Event, Note
from tula.core.job_rules import check_train_config, schedule_problem
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, checkpoint_meta, load_checkpoint
from tula.engine.train import _available, next_fallback, steps_per_epoch, train

DIGITS_TRAIN = 1438


def _dict(epochs: int = 2, k: int = 1, **train_kw) -> dict:
    return {
        "name": "acc",
        "model": {"name": "mlp", "kwargs": {"hidden": 64}},
        "data": {"name": "digits"},
        "epochs": epochs,
        "train": {"warmup_epochs": 0, "accumulation_steps": k, **train_kw},
    }


def _params(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(out)["model"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lbt", "ags"])
def test_two_accumulation_steps_end_with_the_parameters_of_one(tmp_path, method):
    """The same samples in the same order, the gradient of each step the mean over each
    rank's share of 64 either way; k = 2 sums two halves of 32 (each loss / 2) before the
    all-reduce, so the parameters agree to float rounding, not bit for bit (another
    summation order).  For ags the small batch (b_small 32 of the global 128: the first 16
    of each share) is measured on the whole share as at k = 1."""
    kw = {"ags": {"b_small": 32, "update_every": 2, "delta": 10.0}} if method == "ags" else {}
    one = train(spec_from_dict(_dict(2, 1, **kw)), method, 2, 128, tmp_path / "k1", launcher=local_launcher())
    two = train(spec_from_dict(_dict(2, 2, **kw)), method, 2, 128, tmp_path / "k2", launcher=local_launcher())
    assert (two.accumulation_steps, two.micro_batch, two.local_batch) == (2, 32, 64)
    assert (one.accumulation_steps, one.micro_batch, one.local_batch) == (1, 64, 64)
    assert [(h.accumulation_steps, h.micro_batch) for h in two.history] == [(2, 32)] * 2
    assert two.steps_done == one.steps_done == 2 * steps_per_epoch(DIGITS_TRAIN, 128)
    assert two.replicas_identical
    a, b = _params(tmp_path / "k1"), _params(tmp_path / "k2")
    assert all(torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-6) for n in a)
    assert two.history[-1].train_loss == pytest.approx(one.history[-1].train_loss, rel=1e-5)
    # the noise scale's local batch is the share: the comm hook sees the accumulated gradient once a step
    # (without no_sync it would see each micro-batch's, and B_simple would come out near half)
    assert two.history[-1].b_simple == pytest.approx(one.history[-1].b_simple, rel=1e-3)
    if method == "ags":
        assert two.traces.scaled == one.traces.scaled and one.traces.scaled


@pytest.mark.slow
def test_a_stopped_accumulated_run_resumes_to_the_uninterrupted_runs_parameters(tmp_path):
    """The checkpoint records k; resuming from the epoch-1 checkpoint (checkpoint.prev.pt of
    a finished 2-epoch run) ends bit for bit where the uninterrupted run did -- also when the
    spec asks for another k: the resume goes on at the checkpoint's k (a note says so), as it
    goes on at the checkpoint's global batch."""
    d = _dict(2, 4, ags={"b_small": 32, "update_every": 2, "delta": 10.0})
    ref = train(spec_from_dict(d), "ags", 2, 128, tmp_path / "a", launcher=local_launcher())
    assert load_checkpoint(tmp_path / "a")["accumulation_steps"] == 4
    for name, spec_k in (("b", 4), ("c", 1)):
        (tmp_path / name).mkdir()
        shutil.copyfile(tmp_path / "a" / PREVIOUS, tmp_path / name / CHECKPOINT)
        assert checkpoint_meta(tmp_path / name)["epoch"] == 1
        events: list[dict] = []
        spec = spec_from_dict({**d, "train": {**d["train"], "accumulation_steps": spec_k}})
        resumed = train(
            spec, "ags", 2, 128, tmp_path / name, resume=True, launcher=local_launcher(), on_event=events.append
        )
        notes = [e.message for e in events if isinstance(e, Note)]
        assert bool(notes) == (spec_k != 4) and all("4 accumulation step(s)" in n for n in notes), notes
        assert resumed.resumed_from_epoch == 1 and resumed.accumulation_steps == 4
        assert [h.train_loss for h in resumed.history] == [h.train_loss for h in ref.history]
        a, b = _params(tmp_path / "a"), _params(tmp_path / name)
        assert all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.slow
def test_out_of_memory_doubles_the_accumulation_steps_before_it_halves_the_batch(tmp_path):
    """tests/workers.py's model raises torch.OutOfMemoryError for more than 32 samples in a
    forward: a share of 128 (B 256 on 2) fails the probe at b 128 and at b 64, and trains at
    b 32 with k 4 -- the global batch kept, so the steps per epoch too."""
    d = _dict(1)
    d["model"] = {"name": "workers:oom_above", "kwargs": {"local_batch": 32}}
    run = train(spec_from_dict(d), "lbt", 2, 256, tmp_path, launcher=local_launcher())
    got = [
        (f.from_global_batch, f.to_global_batch, f.from_accumulation_steps, f.to_accumulation_steps)
        for f in run.fallbacks
    ]
    assert got == [(256, 256, 1, 2), (256, 256, 2, 4)]
    assert "OutOfMemoryError" in run.fallbacks[0].reason
    assert (run.global_batch, run.accumulation_steps, run.micro_batch) == (256, 4, 32)
    assert run.history[0].accumulation_steps == 4
    assert run.steps_done == steps_per_epoch(DIGITS_TRAIN, 256)
    assert checkpoint_meta(tmp_path)["accumulation_steps"] == 4


@pytest.mark.slow
def test_a_schedule_grows_through_accumulation_once_memory_caps_the_micro_batch(tmp_path):
    """A geometric schedule (32, 64, 128) on one worker with search.max_accumulation_steps 4
    and tests/workers.py's model that runs out of memory above 32 samples: epoch 2's 64
    fails the probe and goes on as 2 x 32 (the fallback raises k within the schedule's cap);
    from then the schedule knows the micro-batch that failed and reaches 128 as 4 x 32 in
    the same world.  The metrics say k per epoch; a resume from epoch 2's checkpoint goes on
    at the k the schedule chose and ends bit for bit as the uninterrupted run."""
    d = _dict(3)
    d["model"] = {"name": "workers:oom_above", "kwargs": {"local_batch": 32}}
    d["search"] = {"max_accumulation_steps": 4}
    d["train"]["batch_schedule"] = {"kind": "geometric", "factor": 2, "delay": 1}
    run = train(spec_from_dict(d), "lbt", 1, 32, tmp_path / "a", launcher=local_launcher())
    got = [(h.global_batch, h.accumulation_steps, h.micro_batch) for h in run.history]
    assert got == [(32, 1, 32), (64, 2, 32), (128, 4, 32)]
    assert [(f.from_global_batch, f.to_global_batch, f.to_accumulation_steps) for f in run.fallbacks] == [(64, 64, 2)]
    assert (run.global_batch, run.accumulation_steps) == (128, 4)
    assert [(g.global_batch, g.accumulation_steps, g.new_world) for g in run.generations] == [
        (32, 1, True),
        (64, 2, True),
        (128, 4, False),
    ]
    assert "as 4 accumulated micro-batches of 32" in run.history[1].schedule.reason
    # a resume after epoch 2 goes on at (128, 4)
    (tmp_path / "b").mkdir()
    shutil.copyfile(tmp_path / "a" / PREVIOUS, tmp_path / "b" / CHECKPOINT)
    meta = checkpoint_meta(tmp_path / "b")
    assert (meta["epoch"], meta["next_global_batch"], meta["next_accumulation_steps"]) == (2, 128, 4)
    resumed = train(spec_from_dict(d), "lbt", 1, 32, tmp_path / "b", resume=True, launcher=local_launcher())
    assert (resumed.global_batch, resumed.accumulation_steps) == (128, 4)
    a, b = _params(tmp_path / "a"), _params(tmp_path / "b")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_the_fallback_halves_the_micro_batch():
    """Pure: (B, k) on N after an out-of-memory.  An even micro-batch doubles k at the same
    B; an odd one halves (rounded down) at the same k, a smaller B; k = 1 with an odd share
    halves B to a multiple of N; a micro-batch of 1 leaves nothing (B 0)."""
    assert next_fallback(256, 2, 1) == (256, 2)
    assert next_fallback(256, 2, 2) == (256, 4)
    assert next_fallback(96, 2, 16) == (32, 16)  # b 3 -> 1
    assert next_fallback(6, 2, 1) == (2, 1)  # b 3 -> 1
    assert next_fallback(32, 2, 16) == (0, 16)  # b 1: nothing smaller
    for b, n, k in [(2 * 7 * 5, 2, 5), (3 * 9, 3, 9), (4 * 2 * 3, 4, 3)]:
        smaller, k2 = next_fallback(b, n, k)
        assert smaller // n % k2 == 0 and smaller // n // k2 <= (b // n // k) // 2


class _Gives:
    """A cluster that provides ``n`` workers, whatever was asked (what _available reads of a
    launcher; the real Dask path is tests/test_dask.py's short-cluster test)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def provide(self, asked: int) -> int:
        return min(asked, self.n)


def test_fewer_workers_than_asked_keep_the_batch_splittable_into_k_micro_batches():
    """Pure: the nearest B to the asked one that is a multiple of N x k (k = 3: 3 x 2 = 6
    divides 252, not the 256 N alone would round to), never above the data set."""
    notes: list[Event] = []

    def available(have: int, global_batch: int, n_workers: int, dataset_size: int, k: int) -> tuple[int, int]:
        wanted = Config(n_workers=n_workers, global_batch=global_batch, accumulation_steps=k)
        there = _available(_Gives(have), wanted, schedule=None, emit=notes.append, dataset_size=dataset_size)
        assert there.accumulation_steps == k
        return there.global_batch, there.n_workers

    assert available(2, 256, 3, 10_000, 3) == (258, 2)
    assert available(2, 256, 3, 10_000, 1) == (256, 2)
    assert available(3, 256, 4, 10_000, 2) == (258, 3)
    assert available(2, 1000, 4, 999, 4) == (992, 2)
    assert available(4, 256, 4, 10_000, 3) == (256, 4)  # all there: unchanged
    assert isinstance(notes[0], Note) and notes[0].message.endswith("going on with 2 worker(s) at global batch 258")


def test_bad_accumulation_is_one_sentence(tmp_path):
    """In process: a share that does not divide by k, and k with a batch schedule."""
    spec = spec_from_dict(_dict(1, 3))
    with pytest.raises(SpecError, match=r"^global batch 64 on 2 worker\(s\) gives each worker 32 samples a step, "):
        check_train_config(spec, "lbt", 2, 64, DIGITS_TRAIN)
    with pytest.raises(SpecError) as refused:  # the core names the spec's field; the command line adds its flag
        check_train_config(spec, "lbt", 2, 64, DIGITS_TRAIN)
    assert "3 equal micro-batches ('train.accumulation_steps'); choose" in str(refused.value)
    check_train_config(spec, "lbt", 2, 96, DIGITS_TRAIN)  # 48 = 3 x 16
    with pytest.raises(SpecError, match="micro-batches"):
        train(spec, "lbt", 2, 64, tmp_path / "x", launcher=local_launcher())
    assert not (tmp_path / "x" / CHECKPOINT).exists()
    with pytest.raises(SpecError, match="micro-batches"):  # tula.Job's override reaches the same rule
        tula.Job(_dict(1), out=tmp_path / "job").train("lbt", 2, 64, accumulation_steps=3)
    sched = spec_from_dict(_dict(1, 2, batch_schedule={"kind": "piecewise", "batches": [64, 128]}))
    assert "cannot be combined with a batch schedule" in schedule_problem("lbt", sched)


@pytest.mark.slow
def test_the_cli_says_one_sentence_for_bad_accumulation(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_dict(1)))
    cases = {
        "3": "error: global batch 64 on 2 worker(s) gives each worker 32 samples a step, which do not split into "
        "3 equal micro-batches (train.accumulation_steps, --accumulation); choose accumulation steps",
        "0": "error: spec field 'train.accumulation_steps': input should be greater than or equal to 1",
    }
    for k, sentence in cases.items():  # in this process: `tula train`'s own subprocess refusals are elsewhere
        r = tula_in_process(*train_args(spec, tmp_path / f"out{k}", "--accumulation", k, method=None))
        assert r.returncode == 2, r.stderr
        lines = [s for s in r.stderr.splitlines() if s.strip()]
        assert len(lines) == 1 and lines[0].startswith(sentence), r.stderr
        assert not (tmp_path / f"out{k}" / CHECKPOINT).exists()
