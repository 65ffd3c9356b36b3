"""Accuracy statistics for the prediction benchmarks, stated as the field states them.

Published step-time predictors report a *mean* error and whether configurations are ranked in
the right order; Tula's prediction benchmarks print, for every claim, the mean, the median, the
95th percentile and the worst absolute relative error ``|predicted / measured - 1|``, Kendall's
tau between the predicted and the measured ranking where a plan ranks configurations, and, on
a CPU, the noise floor measured in the same run: the same configuration measured twice.  A CPU
target reads "within 1.5x the noise floor": the median error at most 1.5 times the median noise.

The 95th percentile is numpy's default (linear interpolation between the closest ranks), so on a
handful of configurations it lies between the two largest errors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: a CPU prediction claim is met when its median error is at most this many times the median noise floor
NOISE_FACTOR = 1.5


def _pair(first: Sequence[float], second: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"two equally long lists of numbers are needed, got {a.shape} and {b.shape}")
    if a.size == 0:
        raise ValueError("no configurations to compare")
    if not (np.isfinite(a).all() and np.isfinite(b).all()) or (b <= 0).any():
        raise ValueError("every value must be finite and every measured value positive")
    return a, b


def abs_rel_errors(predicted: Sequence[float], measured: Sequence[float]) -> np.ndarray:
    """The absolute relative error of each configuration.

    Parameters
    ----------
    predicted : sequence of float
        The predicted values, one per configuration.
    measured : sequence of float
        The measured values of the same configurations, in the same order (all positive).

    Returns
    -------
    numpy.ndarray
        ``|predicted / measured - 1|`` per configuration.
    """
    p, m = _pair(predicted, measured)
    return np.abs(p / m - 1.0)


def summarise(errors: Sequence[float] | np.ndarray) -> dict:
    """The mean, median, 95th percentile and worst of absolute relative errors.

    Parameters
    ----------
    errors : sequence of float
        Absolute relative errors (fractions, not percentages), one per configuration.

    Returns
    -------
    dict
        ``n``, ``mean``, ``median``, ``p95`` and ``max``, as fractions.
    """
    e = np.abs(np.asarray(errors, dtype=float))
    if e.ndim != 1 or e.size == 0 or not np.isfinite(e).all():
        raise ValueError("a non-empty list of finite errors is needed")
    return {
        "n": int(e.size),
        "mean": float(e.mean()),
        "median": float(np.median(e)),
        "p95": float(np.percentile(e, 95)),
        "max": float(e.max()),
    }


def error_stats(predicted: Sequence[float], measured: Sequence[float]) -> dict:
    """:func:`summarise` of :func:`abs_rel_errors`.

    Parameters
    ----------
    predicted : sequence of float
        The predicted values, one per configuration.
    measured : sequence of float
        The measured values of the same configurations.

    Returns
    -------
    dict
        ``n``, ``mean``, ``median``, ``p95`` and ``max`` of ``|predicted / measured - 1|``.
    """
    return summarise(abs_rel_errors(predicted, measured))


def noise_floor(first: Sequence[float], second: Sequence[float]) -> dict:
    """How far two measurements of the same configurations are apart.

    Parameters
    ----------
    first : sequence of float
        One measurement per configuration.
    second : sequence of float
        A second measurement of each configuration, in the same run, in the same order.

    Returns
    -------
    dict
        The :func:`summarise` statistics of ``|first / second - 1|``.
    """
    return error_stats(first, second)


def kendall_tau(predicted: Sequence[float], measured: Sequence[float]) -> tuple[float, float]:
    """Kendall's tau between the predicted and the measured ranking of configurations.

    Parameters
    ----------
    predicted : sequence of float
        The predicted value (for example the time of an epoch) of each configuration.
    measured : sequence of float
        The measured value of the same configurations.

    Returns
    -------
    tuple of float
        ``(tau, p_value)`` from :func:`scipy.stats.kendalltau` (tau-b, which allows ties);
        both NaN for fewer than two configurations or where one side is constant.
    """
    from scipy.stats import kendalltau

    p, m = _pair(predicted, measured)
    if p.size < 2 or np.ptp(p) == 0 or np.ptp(m) == 0:
        return math.nan, math.nan
    res = kendalltau(p, m)
    return float(res.statistic), float(res.pvalue)


def within_noise(stats: dict, noise: dict | None, factor: float = NOISE_FACTOR) -> str:
    """The CPU verdict: is the median error within ``factor`` times the median noise floor?

    Parameters
    ----------
    stats : dict
        The prediction's :func:`summarise` statistics.
    noise : dict or None
        The noise floor's statistics from the same run; None where it was not measured.
    factor : float
        How many times the noise floor the median error may be.

    Returns
    -------
    str
        One phrase: met or missed with the ratio, or that the noise floor was not measured.
    """
    if noise is None:
        return "noise floor not measured in that run"
    if noise["median"] <= 0:
        return "noise floor measured as 0: no ratio"
    ratio = stats["median"] / noise["median"]
    verdict = "met" if ratio <= factor else "missed"
    return f"median error {ratio:.2f}x the median noise floor (target <= {factor:g}x: {verdict})"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def describe(label: str, stats: dict, noise: dict | None = None, tau: tuple[float, float] | None = None) -> str:
    """One line for a benchmark's output: the statistics, the noise floor and the ranking.

    Parameters
    ----------
    label : str
        What was predicted, e.g. ``"step time, partial search"``.
    stats : dict
        :func:`summarise` statistics of the prediction's errors.
    noise : dict or None
        The noise floor from the same run, or None where the run measured none.
    tau : tuple of float or None
        ``(tau, p_value)`` from :func:`kendall_tau`, where a ranking is judged.

    Returns
    -------
    str
        E.g. ``"step time: n 12, |error| mean 6.1 %, median 5.0 %, p95 14.0 %, max 17.5 %; ..."``.
    """
    line = (
        f"{label}: n {stats['n']}, |error| mean {_pct(stats['mean'])}, median {_pct(stats['median'])}, "
        f"p95 {_pct(stats['p95'])}, max {_pct(stats['max'])}"
    )
    if noise is not None:
        line += (
            f"; noise floor (same configuration twice, n {noise['n']}) mean {_pct(noise['mean'])}, "
            f"median {_pct(noise['median'])}, max {_pct(noise['max'])}"
        )
    line += f"; {within_noise(stats, noise)}"
    if tau is not None:
        t, p = tau
        line += "; Kendall's tau -" if math.isnan(t) else f"; Kendall's tau {t:.2f} (p {p:.2g})"
    return line
