"""Kneedle (Satopaa et al. 2011) for a decreasing convex curve, in numpy alone.

The planner's knee of a time-vs-global-batch curve is the first knee the ``kneed`` package's
``KneeLocator(x, y, curve="convex", direction="decreasing", S=S)`` finds (its defaults
otherwise: ``interp1d``, offline).  This module finds the same point without importing
``kneed``, which imports ``scipy.signal`` and ``matplotlib.pyplot`` on import: about 2 s of
CPU in every process that plans (the service, ``tula run``, ``tula plan``, every re-plan
request's first).  tests/test_kneedle.py checks the two agree, curve for curve.

The steps, as Kneedle has them:

1. x and y normalised to [0, 1]; y flipped (``max - y``) so that the curve rises;
2. the difference curve ``y_n - x_n``, its local maxima and minima (each point against its
   neighbours, ``>=`` and ``<=``, the ends against their one neighbour);
3. each local maximum sets a threshold ``diff[max] - S * mean(|step of x_n|)``; walking
   right, the first point whose next difference falls below the threshold of the last
   maximum passed (a local minimum passed since then stops the walk's detection until the
   next maximum) makes that maximum the knee.
"""

from __future__ import annotations

import numpy as np


def _normalised(a: np.ndarray) -> np.ndarray:
    return (a - a.min()) / (a.max() - a.min())


def _local_extrema(d: np.ndarray, greater: bool) -> np.ndarray:
    """Whether each point of ``d`` is a local maximum (``greater``) or minimum against its
    neighbours, ties included; an end is compared with its one neighbour."""
    before = np.concatenate(([d[0]], d[:-1]))
    after = np.concatenate((d[1:], [d[-1]]))
    if greater:
        return (d >= before) & (d >= after)
    return (d <= before) & (d <= after)


def knee_index(x: np.ndarray, y: np.ndarray, sensitivity: float = 1.0) -> int | None:
    """Index of the first knee of the decreasing convex curve ``y(x)`` (``x`` increasing),
    or None where Kneedle finds none.  ``sensitivity``: Kneedle's S."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) != len(y) or len(x) < 2:
        return None
    x_n = _normalised(x)
    y_n = _normalised(y)
    y_n = y_n.max() - y_n
    diff = y_n - x_n
    is_max = _local_extrema(diff, greater=True)
    is_min = _local_extrema(diff, greater=False)
    maxima = np.nonzero(is_max)[0]
    if not maxima.size:
        return None
    step = sensitivity * abs(float(np.diff(x_n).mean()))
    threshold, threshold_index, detecting = 0.0, -1, True
    for i in range(int(maxima[0]), len(diff) - 1):
        if is_max[i]:
            threshold, threshold_index, detecting = float(diff[i]) - step, i, True
        if is_min[i]:
            threshold, detecting = 0.0, False
        if detecting and diff[i + 1] < threshold:
            return threshold_index
    return None
