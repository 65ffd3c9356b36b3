"""The gradient noise scale estimator recovers a known B_simple = tr(Sigma) / |G|^2 from
synthetic per-sample gradients with a known mean and covariance (seeded, so deterministic)."""

import json
import math

import numpy as np
import pytest
import torch

from tula.core.noise_scale import (
    EarlyNoiseScale,
    NoiseScale,
    early_epochs,
    early_noise_scale,
    noise_scale_value,
    smooth_noise_scale,
)

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


# ---------------------------------------------------------------------- the per-epoch values' rules (plots)
def test_a_usable_value_is_a_finite_number_above_zero():
    for bad in (None, math.nan, math.inf, -math.inf, 0, 0.0, -3.0, True, "50", [50]):
        assert noise_scale_value(bad) is None, bad
    assert noise_scale_value(50) == 50.0 and isinstance(noise_scale_value(50), float)
    assert noise_scale_value(2.5e6) == 2.5e6


def test_the_running_median_by_hand():
    # centred windows of 3, shorter at the ends: [1,100] [1,100,2] [100,2,3] [2,3,4] [3,4]
    assert smooth_noise_scale([1, 100, 2, 3, 4], window=3) == [50.5, 2.0, 3.0, 3.0, 3.5]
    # unusable values are left out of each window, and an epoch with none of its own gets None
    assert smooth_noise_scale([None, 10, math.inf, 30, 0, 50], window=3) == [None, 10.0, None, 30.0, None, 50.0]
    assert smooth_noise_scale([20, None, 10, 40], window=3) == [20.0, None, 25.0, 25.0]
    assert smooth_noise_scale([None, math.nan, -1.0]) == [None, None, None]
    assert smooth_noise_scale([]) == []
    # one epoch's spike neither lifts its neighbours nor shows in the line (default window 5)
    assert smooth_noise_scale([50.0] * 5 + [1e6] + [50.0] * 5) == [50.0] * 11
    with pytest.raises(ValueError):
        smooth_noise_scale([1.0], window=0)


def test_the_early_estimate_reads_the_first_three_epochs_or_ten_percent():
    assert [early_epochs(n) for n in (0, 2, 3, 10, 40, 100)] == [0, 2, 3, 3, 4, 10]
    # the late jump (1e6) is not in it; median and p25-p75 interpolate linearly
    assert early_noise_scale([40, 50, 60, 1e6, 1e6]) == EarlyNoiseScale(50.0, 45.0, 55.0, 3)
    assert tuple(early_noise_scale([60.0, 40.0, 50.0, 70.0] + [1e6] * 36)) == (55.0, 47.5, 62.5, 4)
    # unusable values are skipped, never taken from later epochs instead
    assert early_noise_scale([None, 50, math.nan, 1e6]) == (50.0, 50.0, 50.0, 1)
    assert early_noise_scale([None, math.inf, 0.0, 50.0]) is None
    assert early_noise_scale([]) is None
