"""The ``linear``, ``increase_instead_of_decay`` and ``loss_ratio`` batch schedules trained, and
resumed (issue #27, item 3): tests/test_schedules.py checks their decisions as pure
functions; here a real run follows them, epoch by epoch, and a run resumed from its epoch-2
checkpoint ends as the uninterrupted one did, bit for bit.

One worker, in this process (``LocalLauncher(in_process=True)``: a world of one rank without
starting a process); the batch changes inside that world.  Each schedule trains twice: 3
epochs, then the epoch-2 checkpoint (kept as ``checkpoint.prev.pt``, what a run stopped after
epoch 2 leaves) resumed into epoch 3 -- the epoch whose batch the schedule decided from the
state it keeps in the checkpoint (the updates counted so far, the milestones applied and the
LR decays taken, the first epoch's loss)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from helpers import local_launcher

from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint
from tula.engine.train import train

B0 = 64
DIGITS = 1438  # the digits training split
LR = 0.05  # the spec's default SGD learning rate

SCHEDULES = {
    # B0 + ceil(rate x updates so far)
    "linear": {"batch_schedule": {"kind": "linear", "rate": 2.0}},
    # x 1/gamma at epochs 1 and 2; at the cap of 128 the second becomes an LR decay x 0.5
    "increase_instead_of_decay": {
        "batch_schedule": {"kind": "increase_instead_of_decay", "max_batch": 128},
        "lr_milestones": [1, 2],
        "lr_gamma": 0.5,
    },
    # B0 x F(w0) / F(wk), F(w0) the first epoch's training loss
    "loss_ratio": {"batch_schedule": {"kind": "loss_ratio"}},
}


def _spec(tiny_spec_dict, kind):
    return spec_from_dict(dict(tiny_spec_dict, epochs=3, train={"warmup_epochs": 0, **SCHEDULES[kind]}))


def _expected_batches(kind, history):
    """The global batch of each epoch as the schedule defines it (from the run's own losses)."""
    if kind == "linear":
        s1 = DIGITS // B0
        b2 = B0 + math.ceil(2.0 * s1)
        return [B0, b2, B0 + math.ceil(2.0 * (s1 + DIGITS // b2))]
    if kind == "increase_instead_of_decay":
        return [B0, 2 * B0, 2 * B0]
    f0, f1 = history[0].train_loss, history[1].train_loss
    return [B0, B0, math.floor(B0 * f0 / f1)]


@pytest.mark.parametrize("kind", list(SCHEDULES))
def test_a_trained_schedule_moves_the_batch_and_a_resumed_run_ends_as_an_uninterrupted_one(
    tiny_spec_dict, tmp_path, kind
):
    spec = _spec(tiny_spec_dict, kind)
    ref = train(spec, "lbt", 1, B0, tmp_path / "ref", launcher=local_launcher(in_process=True))
    h = ref.history
    assert ref.batch_schedule == kind
    batches = [e.global_batch for e in h]
    assert batches == _expected_batches(kind, h)
    assert len(set(batches)) > 1, batches  # the schedule did move the batch
    assert [e.steps for e in h] == [DIGITS // b for b in batches]
    assert ref.steps_done == sum(DIGITS // b for b in batches)
    lrs = [e.lr for e in h]
    if kind == "increase_instead_of_decay":  # the cap turned the second milestone into an LR decay
        assert lrs == pytest.approx([LR, LR, LR * 0.5])
    else:
        assert lrs == pytest.approx([LR] * 3)  # lr_rule keep

    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copyfile(tmp_path / "ref" / PREVIOUS, cut / CHECKPOINT)
    assert load_checkpoint(cut)["epoch"] == 2
    resumed = train(spec, "lbt", 1, B0, cut, resume=True, launcher=local_launcher(in_process=True))
    assert resumed.resumed_from_epoch == 2
    keys = ("epoch", "global_batch", "steps", "lr", "train_loss", "test_loss", "test_top1")
    assert [{k: getattr(e, k) for k in keys} for e in resumed.history] == [{k: getattr(e, k) for k in keys} for e in h]
    assert resumed.steps_done == ref.steps_done
    a, b = load_checkpoint(tmp_path / "ref")["model"], load_checkpoint(cut)["model"]
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{kind}: the resumed weights differ from the uninterrupted run's in {differ}"
