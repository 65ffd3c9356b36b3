"""Exact resume for every training method: a run resumed from its epoch-2 checkpoint ends
epoch 3 with the same parameters, bit for bit, as the run that was never interrupted.

One launch costs seconds (two ranks import torch), so each method runs twice, not three
times: the uninterrupted 3-epoch run keeps its last two checkpoints (epochs 3 and 2); the
epoch-2 one, copied into a fresh directory as its ``checkpoint.pt``, is exactly what a run
stopped after epoch 2 leaves (the runner writes it inside the epoch loop, before it knows
whether another epoch follows), and ``train(..., resume=True)`` continues it to epoch 3.

The configuration is one every method accepts (2 workers for AdaScale, ``b_small`` below
the global batch for AGS and static scaling) and makes each method's state cross the
checkpoint: LR warm-up over all 3 epochs and a milestone after epoch 2 (the LR changes at
every step, so a schedule not put back at the resumed step shows), AGS factors every 4 of
the 11 steps of an epoch (not aligned with the epoch boundary) with a gate high enough that
steps are scaled, post-local SGD in its local phase since epoch 1 and averaging every 3
steps, AdaScale's moving averages, momentum and LARS's and LAMB's moments.
"""

import shutil

import pytest
import torch
from helpers import local_launcher

from tula.core.registry import METHOD_NAMES
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint
from tula.engine.train import train

N_WORKERS, BATCH = 2, 128  # 1438 digits -> 11 steps per epoch
LOSS_KEYS = ("train_loss", "test_loss", "test_top1", "lr")


def _spec(tiny_spec_dict, epochs):
    d = dict(tiny_spec_dict, epochs=epochs)
    d["train"] = {
        "warmup_epochs": 3,
        "lr_milestones": [2],
        "polo_switch_epoch": 1,
        "polo_averages_per_epoch": 3,
        "ags": {"b_small": 32, "update_every": 4, "delta": 10.0},
    }
    return spec_from_dict(d)


def _losses(run):
    return [{k: getattr(h, k) for k in LOSS_KEYS if h.given(k)} for h in run.history]


@pytest.mark.slow
@pytest.mark.parametrize("method", METHOD_NAMES)
def test_resumed_run_ends_with_the_same_model_as_an_uninterrupted_one(tiny_spec_dict, tmp_path, method):
    spec = _spec(tiny_spec_dict, 3)
    ref = train(spec, method, N_WORKERS, BATCH, tmp_path / "a", launcher=local_launcher())
    (tmp_path / "b").mkdir()
    shutil.copyfile(tmp_path / "a" / PREVIOUS, tmp_path / "b" / CHECKPOINT)
    assert load_checkpoint(tmp_path / "b")["epoch"] == 2
    resumed = train(spec, method, N_WORKERS, BATCH, tmp_path / "b", resume=True, launcher=local_launcher())

    assert resumed.resumed_from_epoch == 2
    assert [h.epoch for h in resumed.history] == [1, 2, 3]
    assert resumed.steps_done == ref.steps_done == 3 * ref.steps_per_epoch
    assert ref.replicas_identical and resumed.replicas_identical
    # same ops in the same order: equal, not approximately equal
    assert _losses(resumed) == _losses(ref)
    assert {k: resumed.final[k] for k in LOSS_KEYS} == {k: ref.final[k] for k in LOSS_KEYS}
    model_a, model_b = load_checkpoint(tmp_path / "a")["model"], load_checkpoint(tmp_path / "b")["model"]
    assert model_a.keys() == model_b.keys()
    differ = [k for k in model_a if not torch.equal(model_a[k], model_b[k])]
    assert not differ, f"{method}: resumed weights differ from the uninterrupted run's in {differ}"
