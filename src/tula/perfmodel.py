"""Performance model (Eq. 2, 4): step time as compute plus synchronisation.

    t_compute(b, N) = (c0 + c1 * b) * (1 + kappa * (N - 1)) + kappa0 * (N - 1)     (Eq. 2b)
    t_sync(N)       = alpha * hops(N) + beta * link_bytes(N)            (Eq. 2c), 0 when N = 1
    t_step(b, N)    = ((t_compute * (1 + rho * [N > 1]))**gamma + t_sync**gamma) ** (1 / gamma)

``hops`` and ``link_bytes`` depend on the collective (``grad_bytes`` = gradient bytes
per step):

    ring all-reduce     hops 2 (N - 1)        link_bytes 2 (N - 1) / N * grad_bytes
    parameter server    hops 2                link_bytes 2 N * grad_bytes   (the server's link)
    tree all-reduce     hops 2 ceil(log2 N)   link_bytes 2 * grad_bytes  (pipelined reduce + broadcast)

``kappa`` is the slowdown of compute when N workers share one host (0 on a cluster of
separate nodes) and ``kappa0`` the fixed seconds per step it adds per extra worker (on a
shared host a small step slows down by far more than a large one); ``rho`` the slowdown of compute by the communication threads running
beside it; ``gamma >= 1`` the compute/communication overlap (1: none, large: full), the
form AdaptDL uses.  Parameters the data cannot identify are frozen (kappa when only one
cluster size was measured, alpha when fewer than two cluster sizes above one, ...).

Fitting minimises the log-space error (RMSLE) of t_compute and t_step over the profiled
trials with scipy under bounds.  The overlapped form is kept only when it fits clearly
better than the additive one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

PARAMS = ("c0", "c1", "kappa", "kappa0", "alpha", "beta", "rho", "gamma")
COLLECTIVES = ("ring", "parameter_server", "tree")


def hops(collective: str, n):
    n = np.asarray(n, dtype=float)
    if collective == "ring":
        return 2.0 * (n - 1)
    if collective == "parameter_server":
        return np.where(n > 1, 2.0, 0.0)
    if collective == "tree":
        return 2.0 * np.ceil(np.log2(np.maximum(n, 1)))
    raise ValueError(f"unknown collective {collective!r}; use one of {COLLECTIVES}")


def link_bytes(collective: str, n, grad_bytes: float):
    n = np.asarray(n, dtype=float)
    if collective == "ring":
        f = 2.0 * (n - 1) / n
    elif collective == "parameter_server":
        f = np.where(n > 1, 2.0 * n, 0.0)
    elif collective == "tree":
        # pipelined reduce up and broadcast down the tree: each link carries the bytes twice,
        # whatever the depth; the depth shows in the latency hops.  (Were the bytes also
        # proportional to the depth, latency and bandwidth could not be told apart.)
        f = np.where(n > 1, 2.0, 0.0)
    else:
        raise ValueError(f"unknown collective {collective!r}; use one of {COLLECTIVES}")
    return f * grad_bytes


def training_time_s(t_step_s, global_batch, dataset_size: int, epochs: int = 1):
    """Eq. 4a, the one place it is written: T = E * D / B * t_step (seconds), for a
    predicted or a measured step time."""
    return epochs * dataset_size / np.asarray(global_batch, float) * np.asarray(t_step_s, float)


@dataclass(frozen=True)
class PerfModel:
    """Fitted parameters (seconds, seconds per sample, seconds per byte) and what they describe."""

    collective: str
    grad_bytes: int
    c0: float
    c1: float
    kappa: float = 0.0
    kappa0: float = 0.0
    alpha: float = 0.0
    beta: float = 0.0
    rho: float = 0.0
    gamma: float = 1.0
    frozen: tuple[str, ...] = ()
    rmsle: float | None = None
    n_trials: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    # ---------------------------------------------------------------- prediction
    def t_compute_s(self, local_batch, n_workers):
        b, n = np.asarray(local_batch, float), np.asarray(n_workers, float)
        return (self.c0 + self.c1 * b) * (1.0 + self.kappa * (n - 1)) + self.kappa0 * (n - 1)

    def t_sync_s(self, n_workers):
        n = np.asarray(n_workers, float)
        t = self.alpha * hops(self.collective, n) + self.beta * link_bytes(self.collective, n, self.grad_bytes)
        return np.where(n > 1, t, 0.0)

    def t_step_s(self, local_batch, n_workers):
        n = np.asarray(n_workers, float)
        return self.combine_s(self.t_compute_s(local_batch, n), self.t_sync_s(n), n)

    def combine_s(self, t_compute_s, t_sync_s, n_workers):
        """The step time from its parts (Eq. 2): compute slowed by ``rho`` when N > 1, then
        combined with the sync time under the overlap ``gamma``."""
        n = np.asarray(n_workers, float)
        tc = np.asarray(t_compute_s, float) * (1.0 + self.rho * (n > 1))
        ts = np.asarray(t_sync_s, float)
        g = self.gamma
        if g == 1.0:
            return tc + ts
        return (tc ** g + ts ** g) ** (1.0 / g)

    def epoch_time_s(self, global_batch, n_workers, dataset_size: int):
        """Eq. 4a for one epoch: D / B steps of the predicted t_step."""
        big_b = np.asarray(global_batch, float)
        return training_time_s(self.t_step_s(big_b / np.asarray(n_workers, float), n_workers), big_b, dataset_size)

    def total_time_s(self, global_batch, n_workers, dataset_size: int, epochs: int):
        """Eq. 4a: T = E * D / B * t_step."""
        return epochs * self.epoch_time_s(global_batch, n_workers, dataset_size)

    # ---------------------------------------------------------------- records
    def to_dict(self) -> dict:
        d = asdict(self)
        d["frozen"], d["notes"] = list(self.frozen), list(self.notes)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PerfModel":
        d = dict(d)
        d["frozen"], d["notes"] = tuple(d.get("frozen", ())), tuple(d.get("notes", ()))
        return cls(**d)


# --------------------------------------------------------------------------- fitting
def _arrays(trials: list[dict]):
    ok = [t for t in trials if t.get("status") == "ok" and t.get("t_step_s")]
    b = np.array([t["local_batch"] for t in ok], float)
    n = np.array([t["n_workers"] for t in ok], float)
    ts = np.array([t["t_step_s"] for t in ok], float)
    tc = np.array([t["t_compute_s"] for t in ok], float)
    return b, n, ts, tc


def _identifiable(b, n) -> set[str]:
    """Parameters the design can identify."""
    free = {"c1"}
    if len(np.unique(b)) >= 2:
        free.add("c0")
    sizes = np.unique(n)
    multi = sizes[sizes > 1]
    if len(sizes) >= 2 and any(len(np.unique(b[n == s])) >= 1 for s in sizes):
        free.add("kappa")
        if len(np.unique(b[n > 1])) >= 2:
            free.add("kappa0")
    if len(multi) >= 1:
        free.add("beta")
        if len(np.unique(b[n > 1])) >= 2:
            free.add("rho")
    if len(multi) >= 2:
        free.add("alpha")
    if "rho" in free:
        free.add("gamma")
    return free


def _initial(b, n, ts, tc, collective, grad_bytes) -> dict[str, float]:
    base = n == n.min()
    if len(np.unique(b[base])) >= 2:
        c1, c0 = np.polyfit(b[base], tc[base], 1)
    else:
        c1, c0 = float(np.median(tc / b)), 0.0
    c1 = max(c1, 1e-9)
    c0 = max(c0, 0.0)
    multi = n > 1
    beta = 0.0
    if multi.any():
        lb = link_bytes(collective, n[multi], grad_bytes)
        beta = float(np.median(np.maximum(ts[multi] - tc[multi], 1e-6) / np.maximum(lb, 1.0)))
    return {"c0": c0, "c1": c1, "kappa": 0.01, "kappa0": max(0.1 * c0, 1e-5), "alpha": 1e-6, "beta": max(beta, 1e-15), "rho": 0.01, "gamma": 1.0}


_BOUNDS = {"c0": (0.0, np.inf), "c1": (1e-12, np.inf), "kappa": (0.0, 20.0), "kappa0": (0.0, np.inf), "alpha": (0.0, np.inf),
           "beta": (0.0, np.inf), "rho": (0.0, 20.0), "gamma": (1.0, 10.0)}


def _fit_once(b, n, ts, tc, collective, grad_bytes, free: list[str], fixed: dict[str, float]) -> tuple[PerfModel, float]:
    init = _initial(b, n, ts, tc, collective, grad_bytes)
    # optimise in scaled units so that every parameter is O(1)
    scale = {k: max(abs(init[k]), 1e-12) if k not in ("kappa", "rho", "gamma") else 1.0 for k in free}
    x0 = np.array([min(max(init[k], _BOUNDS[k][0]), _BOUNDS[k][1]) / scale[k] for k in free])
    lo = np.array([_BOUNDS[k][0] / scale[k] for k in free])
    hi = np.array([_BOUNDS[k][1] / scale[k] for k in free])
    x0 = np.clip(x0, lo + 1e-12, np.where(np.isfinite(hi), hi - 1e-9, np.inf))

    def build(x) -> PerfModel:
        p = {k: float(v) for k, v in fixed.items()}
        p.update({k: float(v * scale[k]) for k, v in zip(free, x)})
        return PerfModel(collective=collective, grad_bytes=int(grad_bytes), **p)

    def resid(x):
        m = build(x)
        rc = np.log(np.maximum(m.t_compute_s(b, n), 1e-12)) - np.log(tc)
        rs = np.log(np.maximum(m.t_step_s(b, n), 1e-12)) - np.log(ts)
        return np.concatenate([rc, rs])

    sol = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=2000)
    m = build(sol.x)
    err = float(np.sqrt(np.mean(resid(sol.x) ** 2)))
    return m, err


def fit_perf_model(trials: list[dict], collective: str = "ring", grad_bytes: int = 0,
                   overlap: str = "auto", min_gain: float = 0.05) -> PerfModel:
    """Fit the model to profiled trials (dicts with n_workers, local_batch, t_step_s,
    t_compute_s, status).  ``overlap``: ``auto`` (keep gamma > 1 only when it lowers the
    RMSLE by more than ``min_gain``), ``never`` or ``always``."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; use one of {COLLECTIVES}")
    b, n, ts, tc = _arrays(trials)
    if len(b) == 0:
        raise ValueError("no successful trial to fit the performance model to")
    free_set = _identifiable(b, n)
    defaults = {"c0": 0.0, "c1": 0.0, "kappa": 0.0, "kappa0": 0.0, "alpha": 0.0, "beta": 0.0, "rho": 0.0, "gamma": 1.0}
    notes = []
    if "c0" not in free_set:
        defaults["c0"] = 0.0
        notes.append("one local batch only: compute assumed proportional to the batch (c0 = 0)")
    if "beta" not in free_set:
        notes.append("no trial with more than one worker: sync time cannot be measured and is taken as 0")
    additive = [k for k in PARAMS if k in free_set and k != "gamma"]
    fixed = {k: v for k, v in defaults.items() if k not in additive}
    best, best_err = _fit_once(b, n, ts, tc, collective, grad_bytes, additive, fixed)
    if overlap != "never" and "gamma" in free_set:
        fixed_o = {k: v for k, v in fixed.items() if k != "gamma"}
        m_o, err_o = _fit_once(b, n, ts, tc, collective, grad_bytes, additive + ["gamma"], fixed_o)
        if overlap == "always" or err_o < best_err * (1.0 - min_gain):
            best, best_err = m_o, err_o
            notes.append(f"overlap form kept: gamma = {m_o.gamma:.2f}")
    frozen = tuple(k for k in PARAMS if k not in free_set or (k == "gamma" and best.gamma == 1.0))
    return replace(best, frozen=frozen, rmsle=best_err, n_trials=int(len(b)), notes=tuple(notes))


def relative_error(predicted, measured) -> np.ndarray:
    """|predicted - measured| / measured, elementwise: the one error metric of every model."""
    m = np.asarray(measured, float)
    return np.abs(np.asarray(predicted, float) - m) / m


def relative_errors(model: PerfModel, trials: list[dict]) -> np.ndarray:
    """Relative step-time error of ``model`` over the successful trials."""
    b, n, ts, _ = _arrays(trials)
    return relative_error(model.t_step_s(b, n), ts)
