"""Growing the batch, and the worker count with it, on real gloo worlds: each change of
(N, B) ends the world at an epoch boundary and starts the next generation from the
checkpoint; steps are counted exactly, and a resume after a resize ends with the same
model as an uninterrupted run."""

import json
import shutil

import pytest
import torch
from helpers import env_with_tests, kill_on_line, local_launcher, popen_tula, train_args, tula_in_process

from tula.core.errors import SpecError
from tula.core.events import Resized
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint
from tula.engine.train import METRICS, train


def _spec(tiny_spec_dict, epochs=3, **train_over):
    d = dict(tiny_spec_dict, epochs=epochs)
    d["train"] = {
        "warmup_epochs": 0,
        "batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
        "workers": {"min": 1, "max": 2, "batch_per_worker": 64},
        **train_over,
    }
    return spec_from_dict(d)


@pytest.mark.slow
def test_geometric_batch_grows_the_world_from_one_to_two_workers_with_exact_step_counts(tiny_spec_dict, tmp_path):
    ref = tmp_path / "ref"
    run = train(_spec(tiny_spec_dict), "ags", 1, 64, ref, launcher=local_launcher())
    # digits: 1438 training samples; B = 64 * 2^epoch, N = ceil(B / 64) clipped to 2
    assert [(h.global_batch, h.n_workers, h.steps) for h in run.history] == [
        (64, 1, 22),
        (128, 2, 11),
        (256, 2, 5),
    ]
    assert run.steps_done == 22 + 11 + 5 == run.history[-1].steps_done
    assert [(g.n_workers, g.global_batch, g.from_epoch) for g in run.generations] == [
        (1, 64, 1),
        (2, 128, 2),
        (2, 256, 3),
    ]
    assert run.replicas_identical and run.batch_schedule == "geometric"
    lines = [json.loads(s) for s in (ref / METRICS).read_text().splitlines()]
    assert [line["epoch"] for line in lines] == [1, 2, 3]
    assert lines[0]["schedule"]["global_batch"] == 128 and lines[0]["schedule"]["resize"]

    # the epoch-2 checkpoint (kept as checkpoint.prev.pt) is what a run stopped after the
    # resize to N=2 leaves; resumed, it ends with the same model as the uninterrupted run
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(ref / PREVIOUS, cut / CHECKPOINT)
    resumed = train(_spec(tiny_spec_dict), "ags", 1, 64, cut, resume=True, launcher=local_launcher())
    assert resumed.resumed_from_epoch == 2 and resumed.steps_done == run.steps_done
    assert resumed.history[-1].train_loss == run.history[-1].train_loss
    a, b = load_checkpoint(ref)["model"], load_checkpoint(cut)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "method, over, sentence",
    [
        ("polo", {}, "keeps state per rank that cannot move to another worker count"),
        ("lrs", {"batch_schedule": {"kind": "geometric", "lr_rule": "linear"}}, "so that the LR is not scaled twice"),
        ("adascale", {}, "needs at least 2 workers, but train.workers.min is 1"),
    ],
)
def test_a_combination_that_cannot_follow_the_schedule_is_refused_before_training(
    tiny_spec_dict, tmp_path, method, over, sentence
):
    with pytest.raises(SpecError, match=sentence):
        train(_spec(tiny_spec_dict, **over), method, 2, 64, tmp_path / "out", launcher=local_launcher())
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_gradient_noise_scale_is_measured_and_the_adaptive_schedule_follows_it(tiny_spec_dict, tmp_path):
    """B_simple per epoch from the ranks' local and synchronised gradient norms; the adaptive
    schedule moves the batch toward it, within the caps (here 2 workers x the data set).  It
    starts at 16, its smallest batch: this job's B_simple at the start is about 25-35 samples
    (measured), which a start at 32 would not leave by more than the band."""
    spec = _spec(
        tiny_spec_dict,
        epochs=3,
        batch_schedule={"kind": "adaptive", "band": 0.1, "max_growth": 4.0},
        workers={"min": 2, "max": 2},
    )
    run = train(spec, "lbt", 2, 16, tmp_path, launcher=local_launcher())
    b_simple = [h.b_simple for h in run.history]
    assert all(b is not None and 1 < b < 1438 for b in b_simple), b_simple
    # measured about 25-35 after the first epoch: more than the band above the start of 16, so the batch grows
    assert run.history[0].global_batch == 16 and b_simple[0] > 16 * 1.1, b_simple
    assert run.history[1].global_batch > 16, run.history
    for h, nxt in zip(run.history, run.history[1:]):
        cur, target = h.global_batch, max(h.b_simple, 16)  # clipped at the smallest batch, 16
        if abs(target - cur) <= 0.1 * cur:  # within the band: the batch stays
            assert nxt.global_batch == cur, (h, nxt)
            continue
        # otherwise the next epoch's batch moved from this one toward B_simple, by at most 4x
        want = min(max(target, cur / 4), cur * 4)
        assert abs(nxt.global_batch - want) <= max(2, 0.1 * want), (h, nxt)
        assert (nxt.global_batch - cur) * (target - cur) > 0, (h, nxt)  # moved, and toward B_simple
    assert len({h.global_batch for h in run.history}) > 1


def _piecewise(tiny_spec_dict, batches, epochs, **data):
    d = dict(tiny_spec_dict, epochs=epochs)
    if data:
        d["data"] = data
    d["train"] = {
        "warmup_epochs": 0,
        "batch_schedule": {"kind": "piecewise", "batches": batches},
        "workers": {"min": 1, "max": 2, "batch_per_worker": 64},
    }
    return d


@pytest.mark.slow
def test_the_world_grows_from_one_to_two_workers_and_shrinks_back_with_exact_step_counts(tiny_spec_dict, tmp_path):
    events = []
    run = train(
        spec_from_dict(_piecewise(tiny_spec_dict, [64, 128, 64], 3)),
        "ags",
        1,
        64,
        tmp_path,
        launcher=local_launcher(),
        on_event=events.append,
    )
    # digits: 1438 training samples -> 22 steps at B=64, 11 at B=128
    assert [(h.global_batch, h.n_workers, h.steps) for h in run.history] == [
        (64, 1, 22),
        (128, 2, 11),
        (64, 1, 22),
    ]
    assert run.steps_done == 55 == run.history[-1].steps_done
    assert [(g.n_workers, g.global_batch, g.from_epoch) for g in run.generations] == [
        (1, 64, 1),
        (2, 128, 2),
        (1, 64, 3),
    ]
    assert [(e.at_epoch, e.n_workers) for e in events if isinstance(e, Resized)] == [(1, 2), (2, 1)]
    assert run.replicas_identical and run.batch_schedule == "piecewise"


@pytest.mark.slow
def test_kill_9_during_the_epoch_after_a_resize_then_resume_ends_like_an_uninterrupted_run(tiny_spec_dict, tmp_path):
    """A real `tula train` is killed with SIGKILL (process group: the ranks too) while the
    2-worker world that followed a 1-worker epoch is mid-epoch; the same command with
    --resume finishes with the same parameters, step count and losses as a run never killed."""
    import os
    import signal

    import yaml

    from tula.engine.checkpoint import checkpoint_meta

    # small synthetic data (800 training samples: 12 steps at B=64, 6 at B=128) through a model
    # whose training steps on 2 workers take 0.2 s each (a sleep): the 2-worker epoch lasts about 1.2 s,
    # and the log gets a step line every 0.2 s (TULA_LOG_EVERY_S), so the kill lands mid-epoch
    d = _piecewise(tiny_spec_dict, [64, 128], 2, name="synthetic", sample_shape=[1, 8, 8], num_samples=1000)
    d["model"] = {"name": "workers:sleepy_mlp", "kwargs": {"sleep_s": 0.2}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(d))
    log_every = {"TULA_LOG_EVERY_S": "0.2"}
    env = {**env_with_tests(), **log_every}
    args = train_args(spec, tmp_path / "ref", workers=1)
    ref = tula_in_process(*args, env=log_every)
    assert ref.returncode == 0, ref.stderr

    cut = tmp_path / "cut"
    args = train_args(spec, cut, workers=1)
    proc = popen_tula(*args, env=env)
    # the new world is training: kill on its first step line
    seen = kill_on_line(proc, "epoch 2: step", os.killpg)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    step, steps = map(int, seen[-1].split("step ")[1].split("/"))
    assert 1 <= step < steps == 6, seen[-1]  # mid-epoch
    assert any("moves to global batch 128 on 2 worker(s)" in s for s in seen), "".join(seen)
    meta = checkpoint_meta(cut)
    assert (meta["epoch"], meta["n_workers"], meta["global_batch"]) == (1, 1, 64)  # killed before epoch 2's

    again = tula_in_process(*args, "--resume", cut, env=log_every)
    assert again.returncode == 0, again.stderr
    a, b = (json.loads((p / "train.json").read_text()) for p in (tmp_path / "ref", cut))
    assert b["resumed_from_epoch"] == 1 and b["steps_done"] == a["steps_done"] == 800 // 64 + 800 // 128
    assert [h["train_loss"] for h in b["history"]] == [h["train_loss"] for h in a["history"]]
    ma, mb = load_checkpoint(tmp_path / "ref")["model"], load_checkpoint(cut)["model"]
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
