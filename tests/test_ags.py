"""The AGS optimiser wrapper on its own (one process): bounds, sensitivity gate, δ = 0,
torch's optimiser contract (schedulers, state_dict round trip mid-training)."""

import copy
import math

import pytest
import torch

from tula.optim.ags import AGS, GradientVariability


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _data(seed=1, n=256):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 10, generator=g), torch.randint(0, 4, (n,), generator=g)


def _backward(model, x, y):
    model.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _small_grads(model, x, y, b_small):
    loss = torch.nn.functional.cross_entropy(model(x[:b_small]), y[:b_small])
    return list(torch.autograd.grad(loss, list(model.parameters())))


def test_variability_is_eq5():
    v = GradientVariability()
    assert v.update(4.0) == math.inf  # no previous step
    assert v.update(5.0) == pytest.approx(0.25)
    assert v.update(2.5) == pytest.approx(0.5)


@pytest.mark.parametrize("base", ["sgd", "nesterov", "adam"])
def test_delta_zero_is_exactly_the_wrapped_optimiser(base):
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
            "nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
            "adam": lambda p: torch.optim.Adam(p, lr=1e-3)}[base]
    m1, m2 = _model(), _model()
    ags = AGS(make(m1.parameters()), b_large=256, b_small=32, delta=0.0)
    plain = make(m2.parameters())
    s1 = torch.optim.lr_scheduler.StepLR(ags, 3, 0.5)
    s2 = torch.optim.lr_scheduler.StepLR(plain, 3, 0.5)
    x, y = _data()
    for _ in range(10):
        _backward(m1, x, y)
        ags.update_factors(_small_grads(m1, x, y, 32))
        ags.step()
        s1.step()
        _backward(m2, x, y)
        plain.step()
        s2.step()
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert ags.scaled_fraction == 0.0
    lr0 = 1e-3 if base == "adam" else 0.1
    assert ags.param_groups[0]["lr"] == plain.param_groups[0]["lr"] == pytest.approx(lr0 * 0.5 ** 3)


@pytest.mark.parametrize("granularity", ["tensor", "element"])
def test_factors_stay_within_bounds(granularity):
    m = _model()
    ags = AGS(torch.optim.SGD(m.parameters(), lr=0.1), b_large=256, b_small=4, delta=10.0, s_min=0.2,
              granularity=granularity)
    assert ags.s_max == pytest.approx(8.0)  # sqrt(256 / 4)
    x, y = _data()
    _backward(m, x, y)
    # an adversarial small-batch gradient: huge, tiny and zero entries
    small = [torch.randn_like(p) * 1e6 for p in m.parameters()]
    small[1].zero_()
    ags.update_factors(small)
    flat = torch.cat([f.reshape(-1) for f in ags.factors])
    assert flat.min() >= 0.2 and flat.max() <= 8.0
    assert flat.max() == pytest.approx(8.0) and flat.min() == pytest.approx(0.2)
    if granularity == "tensor":
        assert all(f.ndim == 0 for f in ags.factors)
    else:
        assert all(f.shape == p.shape for f, p in zip(ags.factors, m.parameters()))


def test_s_min_must_be_positive_and_below_s_max():
    m = _model()
    with pytest.raises(ValueError, match="Lemma 1"):
        AGS(torch.optim.SGD(m.parameters(), lr=0.1), 256, 32, s_min=0.0)
    with pytest.raises(ValueError, match="b_small"):
        AGS(torch.optim.SGD(m.parameters(), lr=0.1), 32, 32)


def test_sensitive_steps_pass_through_unscaled_and_calm_steps_are_scaled():
    """With static factor 2: the first step (Δ = inf) and any step whose gradient norm jumps
    are applied as is; a step whose gradient barely changes is doubled."""
    m = _model()
    ags = AGS(torch.optim.SGD(m.parameters(), lr=1.0), b_large=256, b_small=32, delta=0.5, mode="static",
              static_scale=2.0)
    grads = [torch.full_like(p, 0.01) for p in m.parameters()]

    def step_with(scale):
        before = [p.detach().clone() for p in m.parameters()]
        for p, g in zip(m.parameters(), grads):
            p.grad = g * scale
        ags.step()
        return [(b - p.detach()) for b, p in zip(before, m.parameters())]  # the applied update (lr = 1)

    upd = step_with(1.0)  # first step: sensitive
    assert torch.allclose(upd[0], grads[0])
    upd = step_with(1.1)  # |1.21 - 1| / 1 = 0.21 < 0.5: scaled by 2
    assert torch.allclose(upd[0], 2 * 1.1 * grads[0])
    upd = step_with(3.0)  # |9 - 1.21| / 1.21 = 6.4 >= 0.5: sensitive, unscaled
    assert torch.allclose(upd[0], 3.0 * grads[0])
    assert ags.scaled_history == [False, True, False]
    assert ags.delta_history[1] == pytest.approx(0.21)


def test_state_dict_round_trip_mid_training_continues_identically():
    x, y = _data()
    m1 = _model()
    a1 = AGS(torch.optim.SGD(m1.parameters(), lr=0.05, momentum=0.9), 256, 32, delta=0.5, granularity="element")
    for i in range(6):
        _backward(m1, x, y)
        if i % 3 == 0:
            a1.update_factors(_small_grads(m1, x, y, 32))
        a1.step()
    # save mid-training, restore into a fresh model and wrapper
    model_state, opt_state = copy.deepcopy(m1.state_dict()), copy.deepcopy(a1.state_dict())
    m2 = _model(seed=5)
    m2.load_state_dict(model_state)
    a2 = AGS(torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9), 256, 32, delta=0.5, granularity="element")
    a2.load_state_dict(opt_state)
    assert a2.delta_history == a1.delta_history and a2.factor_updates == 2
    assert all(torch.equal(f1, f2) for f1, f2 in zip(a1.factors, a2.factors))
    for i in range(6, 12):
        for m, a in ((m1, a1), (m2, a2)):
            _backward(m, x, y)
            if i % 3 == 0:
                a.update_factors(_small_grads(m, x, y, 32))
            a.step()
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    assert a1.scaled_history == a2.scaled_history and any(a1.scaled_history)


def test_adaptive_scaling_changes_the_update():
    x, y = _data()
    m1, m2 = _model(), _model()
    ags = AGS(torch.optim.SGD(m1.parameters(), lr=0.1), 256, 8, delta=100.0)
    plain = torch.optim.SGD(m2.parameters(), lr=0.1)
    for _ in range(3):
        _backward(m1, x, y)
        ags.update_factors(_small_grads(m1, x, y, 8))
        ags.step()
        _backward(m2, x, y)
        plain.step()
    assert ags.scaled_fraction == pytest.approx(2 / 3)  # every step but the first
    assert not all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    summary = ags.factor_summary()
    assert 0.1 <= summary["min"] <= summary["mean"] <= summary["max"] <= math.sqrt(256 / 8)
