"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, App. A).

The mean of b per-sample gradients, G_b, has E|G_b|^2 = |G|^2 + tr(Sigma) / b.  Two batch
sizes b < B give unbiased estimates of both terms from one step's norms::

    |G|^2     = (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr Sigma  = (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

Both hold whatever the correlation of G_b and G_B (expectations are linear), so the small
batch may be a part of the large one, as it is in data-parallel training: ``G_b`` is a
rank's local gradient before synchronisation (b = B / N, its squared norm averaged over the
ranks by the caller: one small all-reduce) and ``G_B`` the synchronised gradient; with one
worker, a sub-batch gradient of b_small samples (AGS's) is the small batch.

One step's estimates are very noisy (|G|^2 even negative), so each is smoothed by its own
exponential moving average, and B_simple is the ratio of the averages, not an average of
ratios.  :class:`NoiseScale` communicates nothing itself and never imports torch; given
torch tensors it keeps its averages as float64 tensors on their device, so :meth:`update`
never waits for the device (:meth:`b_simple` and :meth:`state_dict` do).

Reading the per-epoch values (one rule for train.png and the dashboard): B_simple grows by
orders of magnitude late in training, as the mean gradient vanishes, so it is drawn on a log
axis, only where it is a finite positive number (:func:`noise_scale_value`), with a running
median over epochs (:func:`smooth_noise_scale`) beside the raw points, and the early-training
estimate (:func:`early_noise_scale`: the median, with its p25-p75, of the first
``max(3, 10 %)`` epochs) marked: the start-of-training scale, the one the planner assumes
(the profile measures it at the start of training; late values are not the planner's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

STATE_VERSION = 1


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "detach") and hasattr(x, "double")


def _f64(x: Any) -> Any:
    """A float64 0-d tensor for a tensor (no host sync), a Python float otherwise."""
    return x.detach().double().reshape(()) if _is_tensor(x) else float(x)


def _host(x: Any) -> float:
    return float(x.item() if _is_tensor(x) else x)


class NoiseScale:
    """Exponential moving averages of |G|^2 and tr(Sigma), and their ratio B_simple.

    Parameters
    ----------
    decay : weight of the past in each average (per :meth:`update`): avg <- decay * avg +
        (1 - decay) * estimate.  The averages start at 0 and are divided by
        1 - decay^t (bias correction, as Adam does), so after the first update they equal
        that update's estimates and they are never biased towards 0.

    Attributes
    ----------
    steps_ : updates so far
    """

    def __init__(self, decay: float = 0.95):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), not {decay!r}")
        self.decay = float(decay)
        self.steps_ = 0
        self._g2: Any = 0.0  # EMA of |G|^2 estimates, not bias-corrected
        self._tr: Any = 0.0  # EMA of tr(Sigma) estimates, not bias-corrected
        self._weight = 0.0  # 1 - decay^steps: the bias correction

    # ------------------------------------------------------------------ updates
    @staticmethod
    def estimates(local_sq_norm: Any, global_sq_norm: Any, b_small: int, b_big: int) -> tuple[Any, Any]:
        """One step's unbiased (|G|^2, tr Sigma) from |G_b|^2 and |G_B|^2 (float64)."""
        b, big = int(b_small), int(b_big)
        if not 1 <= b < big:
            raise ValueError(f"the small batch ({b}) must be at least 1 and smaller than the large batch ({big})")
        gb, g_big = _f64(local_sq_norm), _f64(global_sq_norm)
        g2 = (big * g_big - b * gb) / (big - b)
        tr = (gb - g_big) / (1.0 / b - 1.0 / big)
        return g2, tr

    def update(self, local_sq_norm: Any, global_sq_norm: Any, b_small: int, b_big: int) -> None:
        """Add one step: ``local_sq_norm`` = |G_b|^2 of the small batch (``b_small``
        samples; in DDP each rank's local squared norm averaged over the ranks),
        ``global_sq_norm`` = |G_B|^2 of the large batch (``b_big`` samples, the
        synchronised gradient).  Floats or torch tensors (kept on their device)."""
        g2, tr = self.estimates(local_sq_norm, global_sq_norm, b_small, b_big)
        d = self.decay
        self._g2 = self._g2 * d + g2 * (1.0 - d)
        self._tr = self._tr * d + tr * (1.0 - d)
        self._weight = self._weight * d + (1.0 - d)
        self.steps_ += 1

    # ------------------------------------------------------------------ readings (may sync)
    def g2(self) -> float | None:
        """The averaged |G|^2 (bias-corrected); ``None`` before the first update."""
        return None if not self.steps_ else _host(self._g2) / self._weight

    def trace_sigma(self) -> float | None:
        """The averaged tr(Sigma) (bias-corrected); ``None`` before the first update."""
        return None if not self.steps_ else _host(self._tr) / self._weight

    def b_simple(self) -> float | None:
        """tr(Sigma) / |G|^2 of the averages (the bias correction cancels).

        ``None`` before the first update or when neither average is positive (nothing
        measured); ``math.inf`` when the averaged |G|^2 is at or below 0 while tr(Sigma)
        is positive (no gradient signal measurable above the noise: any batch is useful);
        ``0.0`` when tr(Sigma) is at or below 0 while |G|^2 is positive (no measurable
        noise).  JSON has no infinity: write ``None`` or a string for it."""
        if not self.steps_:
            return None
        g2, tr = _host(self._g2), _host(self._tr)
        if not (math.isfinite(g2) and math.isfinite(tr)):
            return None
        if g2 <= 0:
            return math.inf if tr > 0 else None
        return max(tr, 0.0) / g2

    def summary(self) -> dict[str, Any]:
        """``{"b_simple", "g2", "trace_sigma", "steps"}`` for an epoch's record (infinity as ``None``)."""
        b = self.b_simple()
        return {
            "b_simple": None if b is None or math.isinf(b) else b,
            "g2": self.g2(),
            "trace_sigma": self.trace_sigma(),
            "steps": self.steps_,
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Plain floats (JSON-serialisable); float64 tensors become floats exactly, so a
        resumed estimator continues with the same numbers."""
        return {
            "version": STATE_VERSION,
            "decay": self.decay,
            "steps": self.steps_,
            "weight": self._weight,
            "g2_ema": _host(self._g2),
            "trace_ema": _host(self._tr),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"noise-scale state version {state.get('version')!r} is not {STATE_VERSION}")
        self.decay = float(state["decay"])
        self.steps_ = int(state["steps"])
        self._weight = float(state["weight"])
        self._g2 = float(state["g2_ema"])
        self._tr = float(state["trace_ema"])

    def __repr__(self) -> str:
        return f"NoiseScale(decay={self.decay}, steps_={self.steps_})"


# ---------------------------------------------------------------------- reading the per-epoch values
SMOOTH_EPOCHS = 5  # the running median's window (centred; shorter at the ends)
EARLY_EPOCHS = 3  # the early estimate reads the first max(EARLY_EPOCHS, EARLY_SHARE of the epochs)
EARLY_SHARE = 0.10


def noise_scale_value(x: Any) -> float | None:
    """``x`` as a float when it is a finite number above 0, else ``None`` (``None``, NaN,
    infinity, 0 or below, a bool, a string: nothing a log axis or a median can use)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x)
    return v if math.isfinite(v) and v > 0 else None


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def smooth_noise_scale(values: Iterable[Any], window: int = SMOOTH_EPOCHS) -> list[float | None]:
    """The running median of the per-epoch B_simple over ``window`` epochs centred on each
    (fewer at the ends), of the usable values only (:func:`noise_scale_value`), one entry
    per epoch: ``None`` at an epoch whose own value is not usable (the line is not drawn
    where nothing was measured).  A median, not a mean, so that one epoch's spike neither
    lifts its neighbours nor shows in the line."""
    if window < 1:
        raise ValueError(f"the window must be at least 1 epoch, not {window!r}")
    vals = [noise_scale_value(v) for v in values]
    half = window // 2
    out: list[float | None] = []
    for i, own in enumerate(vals):
        near = sorted(v for v in vals[max(0, i - half) : i + window - half] if v is not None)
        out.append(_quantile(near, 0.5) if own is not None else None)
    return out


def early_epochs(n_epochs: int) -> int:
    """How many of ``n_epochs`` epochs the early estimate reads: ``max(3, ceil(10 %))``,
    no more than there are."""
    return min(n_epochs, max(EARLY_EPOCHS, math.ceil(EARLY_SHARE * n_epochs)))


class EarlyNoiseScale(NamedTuple):
    """The early-training B_simple: ``median`` with ``p25`` and ``p75`` of the ``n`` usable
    values among the first :func:`early_epochs` epochs."""

    median: float
    p25: float
    p75: float
    n: int


def early_noise_scale(values: Sequence[Any]) -> EarlyNoiseScale | None:
    """The early-training estimate of B_simple from its per-epoch values (epoch order): the
    median and p25-p75 of the usable ones (:func:`noise_scale_value`) among the first
    :func:`early_epochs` epochs.  ``None`` when none of those is usable: an estimate read
    from later epochs would not be an early one."""
    first = sorted(v for v in map(noise_scale_value, values[: early_epochs(len(values))]) if v is not None)
    if not first:
        return None
    return EarlyNoiseScale(_quantile(first, 0.5), _quantile(first, 0.25), _quantile(first, 0.75), len(first))
