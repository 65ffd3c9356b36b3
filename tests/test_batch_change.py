"""A batch schedule's new batch on the same workers goes on inside the same world (no new
generation), and gives the numbers a new generation at that batch would: a run whose batch
changes in its world ends with the same parameters, bit for bit, as the same run stopped
after the change and resumed (a new world, through the checkpoint file).  An out-of-memory
at the new batch still falls back to a smaller one, and only a new worker count starts a
new world."""

import shutil

import pytest
import torch
from helpers import local_launcher, train_args, tula_in_process, write_spec

from tula.core.events import FellBack, Resized, WorldStarted
from tula.core.job_rules import first_workers
from tula.core.run_costs import EPOCH_TIMES
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint
from tula.engine.train import train


def _spec(tiny_spec_dict, batches, epochs, **over):
    d = dict(tiny_spec_dict, epochs=epochs, **over)
    d["train"] = {
        "warmup_epochs": 0,
        "batch_schedule": {"kind": "piecewise", "batches": batches},
        "ags": {"b_small": 32, "update_every": 4, "delta": 10.0},
        "polo_switch_epoch": 1,
        "polo_averages_per_epoch": 3,
    }
    return spec_from_dict(d)


def _segments(run):
    return [(g.n_workers, g.global_batch, g.from_epoch, g.world, g.new_world) for g in run.generations]


def _numbers(run):
    return [{k: v for k, v in h.model_dump(exclude_unset=True).items() if k not in EPOCH_TIMES} for h in run.history]


@pytest.mark.slow
# AGS: its factors' bound s_max from B, the noise-scale comm hook kept on the same DDP model;
# post-local SGD: its averaging period from B, and a comm hook and process group of its own (a
# new DDP wrapper of the same module, as AdaScale gets)
@pytest.mark.parametrize("method", ["ags", "polo"])
def test_a_batch_change_at_fixed_workers_stays_in_the_world_and_matches_a_resumed_run(tiny_spec_dict, tmp_path, method):
    spec = _spec(tiny_spec_dict, [64, 128, 96], 3)
    events = []
    ref = train(spec, method, 2, 64, tmp_path / "ref", launcher=local_launcher(), on_event=events.append)
    # digits: 1438 training samples -> 22 steps at 64, 11 at 128, 14 at 96
    assert [(h.global_batch, h.n_workers, h.steps) for h in ref.history] == [
        (64, 2, 22),
        (128, 2, 11),
        (96, 2, 14),
    ]
    assert ref.steps_done == 47 == ref.history[-1].steps_done
    assert _segments(ref) == [(2, 64, 1, 1, True), (2, 128, 2, 1, False), (2, 96, 3, 1, False)]
    assert all(g.wall_s > 0 for g in ref.generations)
    assert [(e.at_epoch, e.global_batch, e.new_world) for e in events if isinstance(e, Resized)] == [
        (1, 128, False),
        (2, 96, False),
    ]
    assert [e.steps_per_epoch for e in events if isinstance(e, WorldStarted)] == [22, 11, 14]
    assert (ref.global_batch, ref.local_batch, ref.steps_per_epoch) == (96, 48, 14)
    assert ref.replicas_identical
    if method == "ags":
        assert all(h.b_simple is not None for h in ref.history)  # the noise-scale hook went on

    # the epoch-2 checkpoint (kept as checkpoint.prev.pt) is what a run stopped after the
    # change to 96 leaves; resumed, the change to 96 is a new world, with the same result
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(tmp_path / "ref" / PREVIOUS, cut / CHECKPOINT)
    resumed = train(spec, method, 2, 64, cut, resume=True, launcher=local_launcher())
    assert resumed.resumed_from_epoch == 2 and _segments(resumed) == [(2, 96, 3, 1, True)]
    assert resumed.steps_done == ref.steps_done
    assert _numbers(resumed) == _numbers(ref)  # losses, scores, LR, B_simple, the schedule's decisions
    a, b = load_checkpoint(tmp_path / "ref"), load_checkpoint(cut)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert a["noise_scale"] == b["noise_scale"] and a["schedule_state"] == b["schedule_state"]


@pytest.mark.slow
def test_out_of_memory_at_a_new_batch_inside_the_world_falls_back(tiny_spec_dict, tmp_path):
    """The model runs out of memory above 32 samples per rank: the change to 128 (64 per
    rank) fails its probe inside the world, which ends; the run goes on from the epoch-1
    checkpoint at half the batch in a new world."""
    spec = _spec(tiny_spec_dict, [32, 128], 2, model={"name": "workers:oom_above", "kwargs": {"local_batch": 32}})
    events = []
    run = train(spec, "lbt", 2, 32, tmp_path, launcher=local_launcher(), on_event=events.append)
    assert [(f.from_global_batch, f.to_global_batch, f.at_epoch) for f in run.fallbacks] == [(128, 64, 1)]
    assert "OutOfMemoryError" in run.fallbacks[0].reason
    assert [(h.global_batch, h.steps) for h in run.history] == [(32, 44), (64, 22)]
    assert _segments(run) == [(2, 32, 1, 1, True), (2, 64, 2, 2, True)]
    assert [type(e) for e in events if isinstance(e, (Resized, FellBack))] == [Resized, FellBack]


@pytest.mark.slow
def test_tula_train_takes_the_first_worker_count_from_the_worker_rule(tiny_spec_dict, tmp_path):
    """With train.workers in the spec, `tula train --batch B` needs no --workers: N follows
    from B by the rule (ceil(64 / 48) = 2), and the schedule's next batch on as many
    workers goes on in the same world."""
    import json

    d = dict(tiny_spec_dict, epochs=2)
    d["train"] = {
        "warmup_epochs": 0,
        "batch_schedule": {"kind": "piecewise", "batches": [64, 96]},
        "workers": {"min": 1, "max": 2, "batch_per_worker": 48},
    }
    spec = write_spec(tmp_path, d)
    out = tmp_path / "out"
    r = tula_in_process(*train_args(spec, out, workers=None))
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "train.json").read_text())
    assert [(h["global_batch"], h["n_workers"]) for h in run["history"]] == [(64, 2), (96, 2)]
    assert [(g["world"], g["new_world"]) for g in run["generations"]] == [(1, True), (1, False)]
    assert "moves to global batch 96 on 2 worker(s) (in the same world)" in " ".join(r.stderr.split())


def test_the_first_worker_count_from_the_worker_rule():
    def spec(**workers):
        return spec_from_dict({"train": {"workers": workers}})

    assert first_workers(spec(min=1, max=4, batch_per_worker=48), 64) == 2  # ceil(64 / 48)
    assert first_workers(spec(min=1, max=4, batch_per_worker=48), 1000) == 4  # at most max
    assert first_workers(spec(min=3, max=4, batch_per_worker=48), 64) == 3  # at least min
    assert first_workers(spec(min=2, max=4), 64) == 2  # no batch_per_worker: min
    assert first_workers(spec_from_dict({}), 64) is None
