"""The gradient noise scale estimator recovers a known B_simple = tr(Sigma) / |G|^2 from
synthetic per-sample gradients with a known mean and covariance (seeded, so deterministic)."""

import json
import math

import numpy as np
import pytest
import torch

from tula.core.noise_scale import NoiseScale

D, SIGMA = 50, 1.0  # isotropic: tr Sigma = D * SIGMA^2 = 50


def mean_vector(g2: float) -> np.ndarray:
    g = np.ones(D)
    return g * math.sqrt(g2 / D)  # |G|^2 = g2


def feed(est, rng, g, n_workers, local_batch, steps, sub_batch=None):
    """DDP's view: each rank's local mean (b = local_batch, or its first ``sub_batch``
    samples on one worker as AGS measures), the squared norms averaged over the ranks, and
    the global mean over every rank's samples (the small batches are part of it)."""
    for _ in range(steps):
        samples = g + SIGMA * rng.standard_normal((n_workers, local_batch, D))
        small = samples[:, :sub_batch] if sub_batch else samples
        local_sq = float(np.mean(np.sum(small.mean(axis=1) ** 2, axis=1)))
        global_sq = float(np.sum(samples.reshape(-1, D).mean(axis=0) ** 2))
        est.update(local_sq, global_sq, small.shape[1], n_workers * local_batch)


def test_one_step_by_hand():
    est = NoiseScale(decay=0.9)
    est.update(5.0, 2.0, 1, 4)
    # |G|^2 = (4 * 2 - 1 * 5) / 3 = 1; tr Sigma = (5 - 2) / (1 - 1/4) = 4; bias correction: exact after one step
    assert est.g2() == pytest.approx(1.0) and est.trace_sigma() == pytest.approx(4.0)
    assert est.b_simple() == pytest.approx(4.0)
    est.update(3.0, 3.0, 1, 4)  # |G|^2 = 3, tr Sigma = 0
    # averages (0.1 * 1 * 0.9 + 0.1 * 3) / 0.19 and (0.1 * 4 * 0.9) / 0.19
    assert est.g2() == pytest.approx(0.39 / 0.19) and est.trace_sigma() == pytest.approx(0.36 / 0.19)
    assert est.b_simple() == pytest.approx(0.36 / 0.39)


def test_recovers_b_simple_with_eight_workers():
    rng = np.random.default_rng(0)
    est = NoiseScale(decay=0.999)
    feed(est, rng, mean_vector(0.5), n_workers=8, local_batch=8, steps=3000)
    assert est.trace_sigma() == pytest.approx(50.0, rel=0.05)
    assert est.g2() == pytest.approx(0.5, rel=0.08)
    assert est.b_simple() == pytest.approx(100.0, rel=0.1)


def test_recovers_b_simple_on_one_worker_from_a_sub_batch():
    rng = np.random.default_rng(1)
    est = NoiseScale(decay=0.999)
    feed(est, rng, mean_vector(2.0), n_workers=1, local_batch=128, steps=3000, sub_batch=16)
    assert est.b_simple() == pytest.approx(25.0, rel=0.1)


def test_a_short_ema_is_noisier_but_centred():
    """The default decay (0.95) at the end of many independent runs: the median is near the truth."""
    rng = np.random.default_rng(2)
    finals = []
    for _ in range(40):
        est = NoiseScale()
        feed(est, rng, mean_vector(1.0), n_workers=4, local_batch=16, steps=60)
        finals.append(est.b_simple())
    assert np.median(finals) == pytest.approx(50.0, rel=0.2)


def test_torch_tensors_stay_on_their_device_and_match_floats():
    rng = np.random.default_rng(3)
    pairs = [(float(a), float(b)) for a, b in rng.uniform(0.5, 3.0, size=(20, 2))]
    floats, tensors = NoiseScale(0.9), NoiseScale(0.9)
    for a, b in pairs:
        floats.update(a, b, 8, 32)
        tensors.update(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), 8, 32)
    assert isinstance(tensors._g2, torch.Tensor) and tensors._g2.dtype == torch.float64
    assert tensors.b_simple() == floats.b_simple() and tensors.g2() == floats.g2()
    f32 = NoiseScale(0.9)
    f32.update(torch.tensor([2.0]), torch.tensor(1.0), 8, 32)  # float32, any shape of one element
    assert f32.b_simple() == pytest.approx((1 / (1 / 8 - 1 / 32)) / ((32 - 16) / 24))


def test_state_round_trip_continues_exactly():
    rng = np.random.default_rng(4)
    seq = [
        (torch.tensor(float(a), dtype=torch.float64), torch.tensor(float(b), dtype=torch.float64))
        for a, b in rng.uniform(0.5, 3.0, size=(30, 2))
    ]
    whole = NoiseScale(0.95)
    for a, b in seq:
        whole.update(a, b, 4, 16)
    first = NoiseScale(0.95)
    for a, b in seq[:12]:
        first.update(a, b, 4, 16)
    resumed = NoiseScale()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    for a, b in seq[12:]:
        resumed.update(a, b, 4, 16)
    assert resumed.state_dict() == whole.state_dict()
    assert resumed.b_simple() == whole.b_simple()


def test_undefined_cases():
    est = NoiseScale()
    assert est.b_simple() is None and est.g2() is None and est.summary()["b_simple"] is None
    est.update(10.0, 10.0 / 3, 1, 2)  # |G|^2 = (2 * 10/3 - 10) / 1 < 0, tr Sigma > 0: no signal above the noise
    assert est.b_simple() == math.inf and est.summary()["b_simple"] is None
    est = NoiseScale()
    est.update(1.0, 2.0, 1, 2)  # tr Sigma < 0 < |G|^2: no measurable noise
    assert est.b_simple() == 0.0
    with pytest.raises(ValueError, match="smaller than the large batch"):
        est.update(1.0, 1.0, 8, 8)
    with pytest.raises(ValueError, match="decay"):
        NoiseScale(1.0)
