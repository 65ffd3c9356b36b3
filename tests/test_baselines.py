"""The large-batch baselines (lars, lamb, polo, adascale) and lbt/lrs, trained for real in a
2-rank gloo world on digits, plus their single-process contracts."""

import copy

import pytest
import torch
import torch.nn.functional as F

from tula.errors import SpecError
from tula.launch import LocalLauncher
from tula.optim.methods import build_method
from tula.spec import spec_from_dict
from tula.workloads import SmallCNN, load_dataset

import workers

GLOBAL_BATCH = 128  # 64 per rank, twice train.base_batch
STEPS_PER_EPOCH = 8
N_STEPS = 30  # polo: synchronous for steps 0-7, then averages after steps 8, 12, ..., 28; step 29 is local

BASE = {
    "model": {"name": "small_cnn", "kwargs": {"width": 8}},
    "data": {"name": "digits"},
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
    "train": {"base_batch": 64, "warmup_epochs": 1, "polo_switch_epoch": 1, "polo_averages_per_epoch": 2},
}


def spec_dict(method, optimizer=None, train=None):
    d = copy.deepcopy(BASE)
    d["optimizer"].update(optimizer or {})
    d["train"].update({"method": method, **(train or {})})
    return d


ADASCALE_LR = 0.2  # plain SGD needs a larger LR than momentum SGD to get anywhere in 30 steps
RUNS = [
    ("lbt", spec_dict("lbt")),
    ("lrs", spec_dict("lrs")),
    # LARS steps are ~lr * 0.001 * |w|/|g|: a LARS-scale LR, not SGD's
    ("lars", spec_dict("lars", optimizer={"lr": 2.0})),
    ("lamb", spec_dict("lamb")),
    ("polo", spec_dict("polo")),
    # plain SGD, so the LR an update applied can be read back from it; a milestone halves the LR at step 16
    ("adascale", spec_dict("adascale", optimizer={"lr": ADASCALE_LR, "momentum": 0.0, "weight_decay": 0.0},
                           train={"lr_milestones": [2], "lr_gamma": 0.5})),
]


@pytest.fixture(scope="module")
def trained():
    """Every method trained in one 2-rank world: ``{name: [rank 0 result, rank 1 result]}``."""
    ranks = LocalLauncher(device="cpu", threads_per_worker=1).run(
        workers.train_methods, 2, RUNS, GLOBAL_BATCH, STEPS_PER_EPOCH, N_STEPS, timeout_s=300)
    return {name: [r[name] for r in ranks] for name, _ in RUNS}


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name, _ in RUNS])
def test_method_lowers_the_test_loss_on_both_ranks(trained, name):
    for r in trained[name]:
        assert r["loss_after"] < 0.9 * r["loss_before"], (name, r["loss_before"], r["loss_after"])


@pytest.mark.slow
def test_polo_replicas_drift_in_local_sgd_and_agree_after_before_eval(trained):
    for r in trained["polo"]:
        assert r["spread_trained"] > 1e-4
        assert r["spread_after_eval_sync"] == 0.0
        assert r["extra_state"] == {"averager_step": N_STEPS, "hook_iter": STEPS_PER_EPOCH}
    assert trained["polo"][0]["loss_after"] == trained["polo"][1]["loss_after"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lbt", "lrs", "lars", "lamb", "adascale"])
def test_synchronous_methods_keep_the_replicas_identical(trained, name):
    assert all(r["spread_trained"] == 0.0 for r in trained[name])


@pytest.mark.slow
def test_adascale_gain_is_bounded_and_is_the_lr_each_update_applies(trained):
    ranks = trained["adascale"]
    gains = ranks[0]["traces"]["gain"]
    assert len(gains) == N_STEPS and gains == ranks[1]["traces"]["gain"]
    assert all(1.0 <= g <= GLOBAL_BATCH / 64 for g in gains)
    assert max(gains) > 1.0
    for step, gain in enumerate(gains):
        intended = ADASCALE_LR * (0.5 if step >= 2 * STEPS_PER_EPOCH else 1.0) * gain
        assert ranks[0]["lr_set"][step] == pytest.approx(intended, rel=1e-9)
        assert ranks[0]["lr_applied"][step] == pytest.approx(intended, rel=1e-3)


@pytest.mark.slow
def test_adascale_state_round_trips_through_a_checkpoint(trained):
    assert all(r["restored_matches"] for r in trained["adascale"])


def test_lars_gives_one_dimensional_params_no_decay_and_no_adaptation():
    spec = spec_from_dict(spec_dict("lars", optimizer={"momentum": 0.0}))
    model = SmallCNN(width=8)
    method = build_method("lars", model, spec, GLOBAL_BATCH, 2, STEPS_PER_EPOCH)
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


def test_adascale_on_one_worker_is_a_spec_error():
    spec = spec_from_dict(spec_dict("adascale"))
    with pytest.raises(SpecError, match="adascale needs at least 2 workers"):
        build_method("adascale", SmallCNN(width=8), spec, 64, 1, STEPS_PER_EPOCH)


def test_polo_on_one_worker_is_the_plain_optimiser():
    spec = spec_from_dict(spec_dict("polo"))
    torch.manual_seed(0)
    model = SmallCNN(width=8)
    method = build_method("polo", model, spec, 64, 1, STEPS_PER_EPOCH)
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
    assert method.extra_state() == {}
