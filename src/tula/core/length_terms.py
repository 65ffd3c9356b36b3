"""The sequence length's terms of a per-sample figure, fitted once for both models.

The memory model's bytes per sample and the performance model's compute per sample grow with the
sequence length L the same way (:mod:`tula.core.memory_model`, :mod:`tula.core.perfmodel`)::

    per_sample(L) = per_sample(L_ref) + per_token * (L - L_ref) + per_token_squared * (L^2 - L_ref^2)

:func:`fit_length_terms` is the one fit of ``per_token`` and ``per_token_squared`` from what the
trials at the other lengths measured beyond the reference length's per-sample figure.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def fit_length_terms(
    lengths: ArrayLike, reference_length: float, excess_per_sample: ArrayLike, weights: ArrayLike
) -> tuple[float, float]:
    """``(per_token, per_token_squared)`` by weighted least squares.

    Parameters
    ----------
    lengths : array
        Each trial's L (none equal to ``reference_length``).
    reference_length : float
        L_ref, the length the per-sample figure was fitted at.
    excess_per_sample : array
        Each trial's per-sample figure beyond the reference's.
    weights : array
        Each trial's weight (the inverse of its measured figure, so the fit weighs relative errors).

    The squared term is fitted only where the trials hold two lengths or more (with the reference:
    more than two), and is never negative (attention without a fused kernel adds activations and
    work in L^2; a fused one none); otherwise it is 0 and the linear term takes the rest.
    """
    ls = np.asarray(lengths, float)
    y = np.asarray(excess_per_sample, float)
    w = np.asarray(weights, float)
    d1, d2 = ls - reference_length, ls**2 - reference_length**2
    if len(np.unique(ls)) >= 2:
        a = np.stack([d1, d2], axis=1) * w[:, None]
        (per_token, per_token_sq), *_ = np.linalg.lstsq(a, y * w, rcond=None)
        if per_token_sq >= 0:
            return float(per_token), float(per_token_sq)
    return float(np.sum(w * w * d1 * y) / np.sum(w * w * d1 * d1)), 0.0
