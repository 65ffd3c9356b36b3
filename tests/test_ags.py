"""The AGS optimiser wrapper on its own (one process): the factors Algorithm 1 computes, the
sensitivity gate, δ = 0, torch's optimiser contract (hooks, schedulers, state_dict round trip
mid-training), no host sync inside step(), bounded traces."""

import copy
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tula.engine.optim.ags import AGS, GradientVariability


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


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_variability_is_eq5():
    v = GradientVariability()
    assert v.update(4.0) == math.inf  # no previous step
    assert float(v.update(5.0)) == pytest.approx(0.25)
    assert float(v.update(2.5)) == pytest.approx(0.5)
    assert isinstance(v.update(torch.tensor(2.5)), torch.Tensor)
    v.update(0.0)
    assert not float(v.update(1.0)) < math.inf  # after a zero norm: no threshold is ever met


@pytest.mark.parametrize("base", ["sgd", "nesterov", "adam"])
def test_delta_zero_is_exactly_the_wrapped_optimiser(base):
    make = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
        "nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    }[base]
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
    assert ags.scaled_fraction == 0.0 and ags.steps == 10
    lr0 = 1e-3 if base == "adam" else 0.1
    assert ags.param_groups[0]["lr"] == plain.param_groups[0]["lr"] == pytest.approx(lr0 * 0.5**3)
    assert s1.get_last_lr() == s2.get_last_lr()


def _linear_with_grads(g_weight, g_bias):
    layer = torch.nn.Linear(2, 2)
    layer.weight.grad, layer.bias.grad = torch.tensor(g_weight), torch.tensor(g_bias)
    return layer


G_LARGE = ([[1.0, 2.0], [-4.0, 0.5]], [2.0, -1.0])
G_SMALL = ([[3.0, -0.2], [-4.0, 100.0]], [1.0, 0.5])
# by hand: per element |g_small / g_large| = [[3, 0.1], [1, 200]] and [0.5, 0.5], clamped to [0.2, 8];
# per tensor |g_small| / |g_large| = sqrt(10025.04) / sqrt(21.25) = 21.72 -> 8 and sqrt(1.25) / sqrt(5) = 0.5
EXPECTED = {"element": ([[3.0, 0.2], [1.0, 8.0]], [0.5, 0.5]), "tensor": (8.0, 0.5)}


@pytest.mark.parametrize("granularity", ["tensor", "element"])
def test_factors_are_the_clamped_ratio_and_scale_a_calm_step(granularity):
    layer = _linear_with_grads(*G_LARGE)
    ags = AGS(
        torch.optim.SGD(layer.parameters(), lr=1.0),
        b_large=256,
        b_small=4,
        delta=0.5,
        s_min=0.2,
        granularity=granularity,
    )
    assert ags.s_max == 8.0  # sqrt(256 / 4)
    ags.update_factors([torch.tensor(g) for g in G_SMALL])
    for factor, expected in zip(ags.factors, EXPECTED[granularity]):
        assert factor.shape == (() if granularity == "tensor" else torch.tensor(expected).shape)
        assert torch.allclose(factor, torch.tensor(expected), rtol=1e-6)
    ags.step()  # the first step: Δ = inf, applied as is
    before = _params(layer)
    layer.weight.grad, layer.bias.grad = torch.tensor(G_LARGE[0]), torch.tensor(G_LARGE[1])
    ags.step()  # the same gradient again: Δ = 0 < δ, scaled by the factors (lr = 1)
    for b, p, g, s in zip(before, layer.parameters(), G_LARGE, EXPECTED[granularity]):
        assert torch.allclose(b - p.detach(), torch.tensor(g) * torch.tensor(s), rtol=1e-6)
    assert ags.drain_trace() == {"delta": [None, 0.0], "scaled": [False, True]}


@pytest.mark.parametrize("mode", ["static", "adaptive"])
def test_sensitive_steps_pass_gradients_through_bit_identically(mode):
    """The first step (Δ = inf) and a step whose gradient norm jumps are the wrapped
    optimiser's own steps, bit for bit; a step whose gradient barely changes is scaled."""
    m1, m2 = _model(), _model()
    ags = AGS(torch.optim.SGD(m1.parameters(), lr=0.5, momentum=0.9), 256, 32, delta=0.5, mode=mode, static_scale=2.0)
    plain = torch.optim.SGD(m2.parameters(), lr=0.5, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    grads = [torch.randn(p.shape, generator=g) for p in m1.parameters()]
    if mode == "adaptive":
        for p, gr in zip(m1.parameters(), grads):
            p.grad = gr.clone()
        ags.update_factors([gr * 3 for gr in grads])  # every factor min(3, s_max = 2.83)
    for scale in (1.0, 3.0):  # the first step; then |9 - 1| / 1 = 8 >= 0.5
        for m in (m1, m2):
            for p, gr in zip(m.parameters(), grads):
                p.grad = gr * scale
        ags.step()
        plain.step()
        assert all(torch.equal(p.grad, gr * scale) for p, gr in zip(m1.parameters(), grads))
        assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    for p, gr in zip(m1.parameters(), grads):
        p.grad = gr * 3.1  # |9.61 - 9| / 9 = 0.068 < 0.5: scaled
    ags.step()
    factor = 2.0 if mode == "static" else math.sqrt(256 / 32)
    assert all(torch.allclose(p.grad, gr * 3.1 * factor) for p, gr in zip(m1.parameters(), grads))
    trace = ags.drain_trace()
    assert trace["scaled"] == [False, False, True] and trace["delta"][0] is None
    assert trace["delta"][1:] == pytest.approx([8.0, 0.61 / 9], rel=1e-5)
    assert (ags.steps, ags.scaled_steps) == (3, 1)


def test_state_dict_round_trip_mid_training_continues_identically():
    x, y = _data()
    m1 = _model()
    a1 = AGS(torch.optim.SGD(m1.parameters(), lr=0.05, momentum=0.9), 256, 32, delta=0.5, granularity="element")
    for i in range(6):
        _backward(m1, x, y)
        if i % 3 == 0:
            a1.update_factors(_small_grads(m1, x, y, 32))
        a1.step()
    a1.drain_trace()  # as the runner does before a checkpoint
    model_state, opt_state = copy.deepcopy(m1.state_dict()), copy.deepcopy(a1.state_dict())
    assert set(opt_state["ags"]) == {"factors", "prev_sq_norm", "steps", "scaled_steps", "factor_updates"}
    m2 = _model(seed=5)
    m2.load_state_dict(model_state)
    a2 = AGS(torch.optim.SGD(m2.parameters(), lr=0.05, momentum=0.9), 256, 32, delta=0.5, granularity="element")
    a2.load_state_dict(opt_state)
    assert (a2.steps, a2.scaled_steps, a2.factor_updates) == (a1.steps, a1.scaled_steps, 2)
    assert all(torch.equal(f1, f2) for f1, f2 in zip(a1.factors, a2.factors))
    for i in range(6, 12):
        for m, a in ((m1, a1), (m2, a2)):
            _backward(m, x, y)
            if i % 3 == 0:
                a.update_factors(_small_grads(m, x, y, 32))
            a.step()
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    t1, t2 = a1.drain_trace(), a2.drain_trace()
    assert t1 == t2 and len(t1["scaled"]) == 6 and any(t1["scaled"]) and None not in t1["delta"]
    assert a1.traces() == a2.traces()


def test_hooks_registered_on_ags_run_once_per_step_in_order():
    m = _model()
    inner = torch.optim.SGD(m.parameters(), lr=0.1)
    ags = AGS(inner, 256, 32)
    calls = []
    pre = ags.register_step_pre_hook(lambda opt, args, kwargs: calls.append(("pre", opt)))
    ags.register_step_post_hook(lambda opt, args, kwargs: calls.append(("post", opt)))
    inner.register_step_pre_hook(lambda opt, args, kwargs: calls.append(("inner", opt)))
    ags.register_state_dict_post_hook(lambda opt, sd: calls.append(("state_dict", opt)))
    ags.register_load_state_dict_post_hook(lambda opt: calls.append(("loaded", opt)))
    x, y = _data()
    for _ in range(2):
        _backward(m, x, y)
        ags.step()
    assert calls == [("pre", ags), ("inner", inner), ("post", ags)] * 2
    pre.remove()
    calls.clear()
    ags.load_state_dict(ags.state_dict())
    _backward(m, x, y)
    ags.step()
    assert calls == [("state_dict", ags), ("loaded", ags), ("inner", inner), ("post", ags)]


def test_lr_schedulers_drive_the_wrapped_optimiser():
    """A scheduler on AGS sets the wrapped optimiser's LR as it does on that optimiser alone."""
    m1, m2 = _model(), _model()
    ags = AGS(torch.optim.SGD(m1.parameters(), lr=0.1), 256, 32, delta=0.0)
    plain = torch.optim.SGD(m2.parameters(), lr=0.1)
    s1, s2 = (torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=10) for o in (ags, plain))
    x, y = _data()
    lrs = []
    for _ in range(8):
        for m, o, s in ((m1, ags, s1), (m2, plain, s2)):
            _backward(m, x, y)
            o.step()
            s.step()
        lrs.append(ags.optimizer.param_groups[0]["lr"])
        assert s1.get_last_lr() == s2.get_last_lr() == [lrs[-1]] == [plain.param_groups[0]["lr"]]
    assert max(lrs) == pytest.approx(1.0, rel=0.05) and lrs[-1] < 0.5  # up to max_lr, then down
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


class _RecordOps(TorchDispatchMode):
    """Every aten op run under it; a read of a tensor's value on the host (``.item()``,
    ``float()``, ``bool()``, the way a device sync shows up on any device) is
    ``aten._local_scalar_dense``."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode, granularity", [("adaptive", "tensor"), ("adaptive", "element"), ("static", "tensor")])
def test_step_reads_nothing_back_to_the_host(mode, granularity):
    with _RecordOps() as probe:  # the probe sees a host read when there is one
        float(torch.ones(()) * 2)
    assert "aten._local_scalar_dense.default" in probe.ops
    m = _model()
    ags = AGS(
        torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9), 256, 32, delta=10.0, mode=mode, granularity=granularity
    )
    x, y = _data()
    _backward(m, x, y)
    ags.update_factors(_small_grads(m, x, y, 32))
    for _ in range(3):  # the first step, then scaled steps
        _backward(m, x, y)
        with _RecordOps() as rec:
            ags.step()
        assert rec.ops and "aten._local_scalar_dense.default" not in rec.ops
    assert ags.scaled_steps == 2


def test_per_step_traces_are_bounded_and_drained():
    m = _model()
    ags = AGS(torch.optim.SGD(m.parameters(), lr=0.01), 256, 32, delta=10.0, trace_capacity=5)
    x, y = _data()
    deltas = []
    for _ in range(12):
        _backward(m, x, y)
        ags.step()
        deltas.append(ags.variability.prev_sq_norm.item())
    trace = ags.drain_trace()
    assert len(trace["delta"]) == len(trace["scaled"]) == 5  # the last 5 steps, in order
    expected = [abs((b - a) / a) for a, b in zip(deltas[6:11], deltas[7:12])]
    assert trace["delta"] == pytest.approx(expected) and all(trace["scaled"])
    assert ags.drain_trace() == {"delta": [], "scaled": []}
    assert (ags.steps, ags.scaled_steps) == (12, 11)  # the counters are over every step
    summary = ags.traces()
    assert summary["scaled_fraction"] == pytest.approx(11 / 12)
    assert not any(isinstance(v, list) for v in summary.values())


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


def test_deepcopy_steps_like_the_original():
    x, y = _data()
    m = _model()
    ags = AGS(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), 256, 8, delta=100.0)
    _backward(m, x, y)
    ags.update_factors(_small_grads(m, x, y, 8))
    ags.step()
    m2, a2 = copy.deepcopy((m, ags))
    for mm, a in ((m, ags), (m2, a2)):
        _backward(mm, x, y)
        a.step()
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), m2.parameters()))
    assert a2.param_groups[0]["params"][0] is next(m2.parameters())


def test_s_min_must_be_positive_and_below_s_max():
    m = _model()
    with pytest.raises(ValueError, match="Lemma 1"):
        AGS(torch.optim.SGD(m.parameters(), lr=0.1), 256, 32, s_min=0.0)
    with pytest.raises(ValueError, match="b_small"):
        AGS(torch.optim.SGD(m.parameters(), lr=0.1), 32, 32)
