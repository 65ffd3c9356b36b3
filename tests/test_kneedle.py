"""tula.core.kneedle against the ``kneed`` package it replaces in the planner: the same knee,
or none, on the curves the planner meets (decreasing time-vs-batch curves that flatten) and
on curves of every other shape -- with plateaus, ties, noise, and rises at the end."""

from __future__ import annotations

import numpy as np
import pytest
from kneed import KneeLocator

from tula.core.kneedle import knee_index


def _kneed_index(x: np.ndarray, y: np.ndarray, s: float) -> int | None:
    """The index of kneed's knee, as the planner used it (the x nearest the knee)."""
    knee = KneeLocator(x, y, curve="convex", direction="decreasing", S=s).knee
    return None if knee is None else int(np.argmin(np.abs(x - knee)))


def _curves(seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 40))
    x = np.sort(rng.choice(np.arange(1, 4097), size=n, replace=False)).astype(float)
    shapes = [
        1.0 / x + rng.uniform(0, 0.01),  # the planner's: work over batch, then a floor
        np.maximum(rng.uniform(0.5, 2.0) / x, rng.uniform(0.0, 0.001)),  # flat after a point
        np.exp(-x / rng.uniform(10, 2000)) + rng.normal(0, 0.01, n),  # noisy
        rng.uniform(0, 1, n),  # no shape at all
        np.round(1.0 / np.sqrt(x), 2),  # ties
        1.0 / x + np.where(x > np.median(x), x * 1e-4, 0.0),  # rises at the end (memory, communication)
    ]
    return [(x, y.astype(float)) for y in shapes]


@pytest.mark.parametrize("seed", range(60))
def test_the_knee_is_kneeds_on_every_kind_of_curve(seed):
    for x, y in _curves(seed):
        if np.ptp(y) == 0:
            continue  # the planner never asks (find_knee's fallback)
        for s in (1.0, 0.5, 3.0):
            assert knee_index(x, y, s) == _kneed_index(x, y, s), (seed, s, x.tolist(), y.tolist())


def test_a_curve_with_a_knee_and_one_without():
    x = np.array([16.0, 32, 64, 128, 256, 512])
    assert knee_index(x, 1.0 / x + 0.01) == _kneed_index(x, 1.0 / x + 0.01, 1.0) is not None
    assert knee_index(x, -x) is None and _kneed_index(x, -x, 1.0) is None  # a straight line has no knee
