"""The large-batch baselines (lars, lamb, polo, adascale) and lrs trained by the real
runner (:func:`tula.engine.train.train`, 2-rank gloo DDP on digits), checked from the run record
and the checkpoint; every method's LR schedule after a resume; single-process contracts."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
import workers
from helpers import local_launcher

from tula.core.errors import SpecError
from tula.core.registry import METHOD_NAMES
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import load_checkpoint
from tula.engine.optim.methods import build_method
from tula.engine.train import steps_per_epoch, train
from tula.engine.workloads import SmallCNN, load_dataset

DIGITS_TRAIN = 1438
GLOBAL_BATCH = 128  # 64 per rank, twice train.base_batch
STEPS = steps_per_epoch(DIGITS_TRAIN, GLOBAL_BATCH)  # 11 per epoch
EPOCHS = 2

BASE = {
    "name": "baselines",
    "model": {"name": "small_cnn", "kwargs": {"width": 8}},
    "data": {"name": "digits"},
    "epochs": EPOCHS,
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
    "train": {"base_batch": 64, "warmup_epochs": 1, "polo_switch_epoch": 1, "polo_averages_per_epoch": 2},
    "profile": {"threads_per_worker": 1, "device": "cpu"},
}


def spec_dict(method, optimizer=None, train=None):
    d = copy.deepcopy(BASE)
    d["optimizer"].update(optimizer or {})
    d["train"].update({"method": method, **(train or {})})
    return d


ADASCALE_LR = 0.2  # plain SGD needs a larger LR than momentum SGD to get anywhere in 22 steps
RUNS = {  # lbt: trained by the runner in test_train.py
    "lrs": spec_dict("lrs"),
    # LARS steps are ~lr * 0.001 * |w|/|g|: a LARS-scale LR, not SGD's
    "lars": spec_dict("lars", optimizer={"lr": 2.0}),
    "lamb": spec_dict("lamb"),
    "polo": spec_dict("polo"),
    # plain SGD; a milestone halves the LR from epoch 1 on
    "adascale": spec_dict(
        "adascale",
        optimizer={"lr": ADASCALE_LR, "momentum": 0.0, "weight_decay": 0.0},
        train={"lr_milestones": [1], "lr_gamma": 0.5},
    ),
}
# the LR each method's rule gives after warm-up (1 epoch) at B = 2 * base_batch; for
# adascale the LR without its gain (the gain is checked per epoch)
LR_AFTER_WARMUP = {
    "lrs": 0.05 * 2,
    "lars": 2.0 * 2,
    "lamb": 0.01 * math.sqrt(2),
    "polo": 0.05,
    "adascale": ADASCALE_LR * 0.5,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every method trained by the runner: ``{name: (run record, out dir)}``."""
    out = {}
    for name, d in RUNS.items():
        out_dir = tmp_path_factory.mktemp(name) / "run"
        run = train(
            spec_from_dict(d),
            name,
            2,
            GLOBAL_BATCH,
            out_dir,
            launcher=local_launcher(),
        )
        out[name] = (run, out_dir)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_method_learns_and_keeps_the_replicas_identical(runs, name):
    run, _ = runs[name]
    hist = run.history
    assert [h.epoch for h in hist] == [1, 2] and run.steps_done == EPOCHS * STEPS
    assert hist[1].train_loss < 0.95 * hist[0].train_loss, hist
    assert run.final["test_top1"] > 0.3, hist  # chance is 0.1
    assert run.replicas_identical  # polo: its replicas are averaged before every evaluation


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lrs", "lars", "lamb", "polo"])
def test_lr_follows_the_methods_rule(runs, name):
    run, _ = runs[name]
    assert [h.lr for h in run.history] == pytest.approx([LR_AFTER_WARMUP[name]] * EPOCHS, rel=1e-12)


@pytest.mark.slow
def test_adascale_gain_is_bounded_and_sets_the_lr(runs):
    run, _ = runs["adascale"]
    gains = run.traces.gain  # per step, from the epochs' metrics (a method's own trace: kept as written)
    assert len(gains) == EPOCHS * STEPS
    assert all(1.0 <= g <= GLOBAL_BATCH / 64 for g in gains) and max(gains) > 1.0
    tr = run.traces
    assert (tr.gain_min, tr.gain_max, tr.gain_last) == (min(gains), max(gains), gains[-1])
    assert tr.gain_steps == len(gains) and tr.gain_mean == pytest.approx(sum(gains) / len(gains))
    for epoch, h in enumerate(run.history, start=1):  # the LR of the next step: the last gain
        assert h.lr == pytest.approx(LR_AFTER_WARMUP["adascale"] * gains[epoch * STEPS - 1], rel=1e-12)


@pytest.mark.slow
def test_polo_switches_to_local_sgd_after_its_switch_epoch(runs):
    run, out_dir = runs["polo"]
    assert run.traces.to_json_dict() == {"switch_step": STEPS, "averaging_period_steps": STEPS // 2}
    extra = load_checkpoint(out_dir)["method_state"]["extra"]
    # the DDP hook counted synchronous steps until the switch only; the averager every step
    assert (extra["averager_step"], extra["hook_iter"]) == (EPOCHS * STEPS, STEPS)
    # every rank's own momentum is kept (local after the switch: the two ranks' differ)
    momenta = extra["rank_optimizer_state"]
    assert len(momenta) == 2 and not torch.equal(momenta[0], momenta[1])


@pytest.mark.slow
def test_every_method_reports_the_lr_of_its_next_step_after_a_resume():
    """``get_last_lr()`` after ``load_state_dict(state, step)`` is the LR the next step
    applies, the same as without the interruption (mid warm-up, and with AdaScale's gain)."""
    runs = [(name, spec_dict(name, train={"ags": {"b_small": 32}})) for name in METHOD_NAMES]
    res = local_launcher().run(workers.lr_after_resume, 2, runs, GLOBAL_BATCH, 4, 3, timeout_s=300)[0]
    for name in METHOD_NAMES:
        r = res[name]
        assert r["restored_reported"] == r["restored_groups"] == r["reported"], name
        assert r["restored_next_reported"] == r["restored_next_applied"], name
        # exactly: AdaScale sums its squared norms per parameter, not per DDP bucket (a fresh
        # DDP's buckets are not yet rebuilt in gradient order)
        assert r["restored_next_applied"] == r["next_applied"], name
    # lrs mid warm-up: from 0.05 to 0.1 over the 4 steps of epoch 1, 3/4 of the way at step 3
    assert res["lrs"]["restored_reported"] == pytest.approx([0.05 + 0.05 * 3 / 4], rel=1e-12)


def test_adascale_on_one_worker_is_a_spec_error_before_anything_starts(tmp_path):
    with pytest.raises(
        SpecError, match="'adascale' estimates the gradient variance across workers and needs at least 2 workers"
    ):
        train(spec_from_dict(RUNS["adascale"]), "adascale", 1, 64, tmp_path / "out")
    with pytest.raises(SpecError, match="needs at least 2 workers"):
        build_method("adascale", SmallCNN(width=8), spec_from_dict(RUNS["adascale"]), 64, 1, STEPS)


def test_lars_gives_one_dimensional_params_no_decay_and_no_adaptation():
    spec = spec_from_dict(spec_dict("lars", optimizer={"momentum": 0.0}))
    model = SmallCNN(width=8)
    method = build_method("lars", model, spec, GLOBAL_BATCH, 2, STEPS)
    groups = method.optimizer.param_groups
    by_id = {id(p): g for g in groups for p in g["params"]}
    assert len(by_id) == len(list(model.parameters()))
    for p in model.parameters():
        g = by_id[id(p)]
        assert (g["weight_decay"], g["always_adapt"]) == ((0.0, False) if p.ndim <= 1 else (5e-4, True))
    x = torch.randn(16, 1, 8, 8)
    F.cross_entropy(model(x), torch.arange(16) % 10).backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lr = method.lr
    method.optimizer.step()
    for n, p in model.named_parameters():
        plain_sgd = before[n] - lr * p.grad
        assert torch.allclose(p, plain_sgd) == (p.ndim <= 1), n


def test_polo_on_one_worker_is_the_plain_optimiser():
    spec = spec_from_dict(spec_dict("polo"))
    torch.manual_seed(0)
    model = SmallCNN(width=8)
    method = build_method("polo", model, spec, 64, 1, STEPS)
    assert isinstance(method.optimizer, torch.optim.SGD)
    data = load_dataset(spec.data)
    x, y = data.batch(64, torch.Generator().manual_seed(0))
    losses = []
    for step in range(20):
        method.optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        method.after_backward(step, x, y, F.cross_entropy)
        method.optimizer.step()
        method.scheduler.step()
        losses.append(loss.item())
    method.before_eval()
    assert losses[-1] < 0.7 * losses[0]
    assert method.extra_state() == {} and method.drain_step_traces() == {}
