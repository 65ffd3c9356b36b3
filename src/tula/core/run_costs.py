"""What a training run spends beyond the profiled step (#26): the method's own step and the
loop's work at every epoch's end, as a small parameter record, and the one formula for an
epoch's time that the planner, the simulator and the report read.

    epoch(B, N) = S(B) * (t_step(b, N) + x_step(N))  +  t_epoch_fixed(N, S(B))
    S(B)        = steps_per_epoch(D, B)      full global batches: the steps the runner trains
                  (the planner ranks by Eq. 4a's D / B: every sample once)
    t_epoch_fixed(N, S) = eval_fixed_s + eval_sharded_s / N     evaluation, sharded over the ranks
                          + epoch_end_s                          reductions, noise scale, checkpoint, metrics
                          + periodic(N) * ceil(S / every)        the method's periodic work (AGS's factors)

``x_step`` is the method's extra per step: its step measured by the trainer minus the
profile's plain step at the same (N, B), per profiled cluster size (the nearest one
elsewhere); ``periodic(N)`` likewise per cluster size (AGS's factor measurement all-reduces a
gradient at N > 1, over whatever link the world has, and not at N = 1).  Without run costs
(an older profile) ``x_step`` and ``t_epoch_fixed`` are 0 and only ``S(B)`` counts whole
steps.  Numpy only: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike

from tula.core.schedules import steps_per_epoch

#: the measured seconds in an epoch's record (tula.engine.train): they differ between two runs
#: that are otherwise equal bit for bit
EPOCH_TIMES = ("epoch_time_s", "eval_s", "epoch_end_s", "checkpoint_s", "epoch_wall_s")


def epoch_steps(dataset_size: int, global_batch: ArrayLike) -> int | np.ndarray:
    """``S(B)``: :func:`tula.core.schedules.steps_per_epoch` for a scalar or an array of B."""
    big_b = np.asarray(global_batch)
    if big_b.ndim == 0:
        return steps_per_epoch(dataset_size, int(big_b))
    return np.maximum(1, dataset_size // big_b.astype(np.int64))


@dataclass(frozen=True)
class RunCosts:
    """Fitted from the profile's run trials (:func:`fit_run_costs`).  All times in seconds."""

    method: str  # the train.method whose step was measured
    n_workers: tuple[int, ...] = ()  # the cluster sizes of the run trials ...
    step_extra_s: tuple[float, ...] = ()  # ... and the method's extra per step at each
    periodic_s: float = 0.0  # the method's periodic work, per occurrence (the median over the cluster sizes) ...
    periodic_every: int | None = None  # steps between occurrences; None: once per epoch (or none)
    periodic_n_workers: tuple[int, ...] = ()  # ... and per cluster size where measured (older records: none)
    periodic_by_n_s: tuple[float, ...] = ()
    eval_fixed_s: float = 0.0
    eval_sharded_s: float = 0.0  # evaluation at N ranks: eval_fixed_s + eval_sharded_s / N
    epoch_end_s: float = 0.0  # the rest of an epoch's end: reductions, noise scale, checkpoint, metrics
    notes: tuple[str, ...] = field(default=())

    def step_extra_at(self, n_workers: ArrayLike) -> float | np.ndarray:
        """The method's extra per step at ``n_workers`` (scalar or array): the value of the
        nearest measured cluster size (the smaller on a tie); 0 when none was measured."""
        return _nearest(n_workers, self.n_workers, self.step_extra_s, 0.0)

    def periodic_at(self, n_workers: ArrayLike) -> float | np.ndarray:
        """The method's periodic work per occurrence at ``n_workers`` (scalar or array): the
        nearest measured cluster size's, as :meth:`step_extra_at`; ``periodic_s`` where it was
        not measured per cluster size."""
        return _nearest(n_workers, self.periodic_n_workers, self.periodic_by_n_s, self.periodic_s)

    def step_s(self, t_step_s: ArrayLike, n_workers: ArrayLike) -> float | np.ndarray:
        """A step of the method: the plain step ``t_step_s`` plus its extra at ``n_workers``,
        never under 5 % of the plain step (an extra measured negative in noise)."""
        t = np.asarray(t_step_s, float)
        out = np.maximum(t + self.step_extra_at(n_workers), 0.05 * t)
        return float(out) if np.ndim(out) == 0 else out

    def periodic_per_epoch_s(self, n_workers: ArrayLike, steps: ArrayLike) -> float | np.ndarray:
        """The method's periodic work in an epoch of ``steps`` steps at ``n_workers``: its cost
        at that size times its occurrences (once, or every ``periodic_every`` steps)."""
        n = np.asarray(n_workers, float)
        s = np.asarray(steps, float)
        occurrences = np.ones_like(s) if not self.periodic_every else np.ceil(s / self.periodic_every)
        out = self.periodic_at(n) * occurrences
        return float(out) if np.ndim(out) == 0 else out

    def epoch_fixed_s(self, n_workers: ArrayLike, steps: ArrayLike) -> float | np.ndarray:
        """``t_epoch_fixed(N, S)``: an epoch's end and the method's periodic work."""
        n = np.asarray(n_workers, float)
        out = self.eval_fixed_s + self.eval_sharded_s / n + self.epoch_end_s + self.periodic_per_epoch_s(n, steps)
        return float(out) if np.ndim(out) == 0 else out

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> RunCosts:
        d = dict(d)
        for key in ("n_workers", "step_extra_s", "notes", "periodic_n_workers", "periodic_by_n_s"):
            d[key] = tuple(d.get(key) or ())
        return cls(**d)


def _nearest(
    n_workers: ArrayLike, known_n: tuple[int, ...], values: tuple[float, ...], default: float
) -> float | np.ndarray:
    """``values`` at the cluster size in ``known_n`` nearest each of ``n_workers`` (the smaller
    on a tie); ``default`` where ``known_n`` is empty.  Scalar in, scalar out."""
    n = np.asarray(n_workers, float)
    if not known_n:
        out = np.full_like(n, default)
    else:
        nearest = np.abs(n[..., None] - np.asarray(known_n, float)).argmin(axis=-1)
        out = np.asarray(values, float)[nearest]
    return float(out) if out.ndim == 0 else out


def epoch_time_s(
    t_step_s: ArrayLike,
    global_batch: ArrayLike,
    n_workers: ArrayLike,
    dataset_size: int,
    costs: RunCosts | None = None,
    whole_steps: bool = True,
) -> float | np.ndarray:
    """One epoch as the runner trains it: ``S(B)`` steps of ``t_step_s`` plus the method's
    extra per step, plus the epoch's fixed part (module docstring).  Scalars or arrays; a
    step never takes less than 5 % of ``t_step_s`` (a negative extra measured in noise).

    ``whole_steps=False``: Eq. 4a's ``D / B`` steps instead, every sample once -- what the
    planner ranks configurations by, so that a batch just above ``D / k`` (whose epoch drops
    almost a batch of samples) does not look faster than it trains."""
    steps = epoch_steps(dataset_size, global_batch) if whole_steps else dataset_size / np.asarray(global_batch, float)
    t = np.asarray(t_step_s, float)
    if costs is None:
        out = steps * t
    else:
        out = steps * costs.step_s(t, n_workers) + costs.epoch_fixed_s(n_workers, steps)
    return float(out) if np.ndim(out) == 0 else out


def fit_run_costs(run_trials: list[dict], method: str) -> RunCosts | None:
    """The run costs of ``method`` from the profile's run trials of that method that ran
    (``status: ok``); ``None`` when there is none.

    Per cluster size the method's extra per step is its regular steps' median minus the plain
    trial's ``t_step_s`` at the same (N, B), and its periodic work the due steps' median minus
    the regular steps' (also kept as one median over the sizes); evaluation is fitted as
    ``a + c / N`` over the cluster sizes (``c / N`` alone from one size); the rest of the
    epoch's end is the median over the trials.  An extra measured below 0 (the method's step
    cannot do less than the plain step's work) is taken as 0, and a note says where."""
    ok = [t for t in run_trials if t.get("status") == "ok" and t.get("method") == method]
    if not ok:
        return None
    notes: list[str] = []
    by_n: dict[int, list[float]] = {}
    periodic_by_n: dict[int, list[float]] = {}
    for t in ok:
        if t.get("t_step_plain_s") is not None:
            by_n.setdefault(int(t["n_workers"]), []).append(t["t_run_step_s"] - t["t_step_plain_s"])
        if t.get("t_due_step_s") is not None:
            periodic_by_n.setdefault(int(t["n_workers"]), []).append(max(t["t_due_step_s"] - t["t_run_step_s"], 0.0))
    periodic = [x for xs in periodic_by_n.values() for x in xs]
    periodic_ns = sorted(periodic_by_n)
    ns = sorted(by_n)
    extras = [float(statistics.median(by_n[n])) for n in ns]
    below = [n for n, x in zip(ns, extras) if x < 0]
    if below:  # the method's step does the plain step's work and more: a lower median is the machine's noise
        notes.append(
            f"the method's step measured below the plain step at N = {', '.join(map(str, below))} "
            "(the machine's noise): its extra is taken as 0 there"
        )
    every = ok[0].get("update_every")
    steps = ok[0].get("steps_per_epoch")
    # the method's cadence, as a count of steps, unless it is once per epoch at the measured batch
    periodic_every = int(every) if every and periodic and every != steps else None
    n_arr = np.array([t["n_workers"] for t in ok], float)
    e_arr = np.array([t["eval_s"] for t in ok], float)
    if len(set(n_arr.tolist())) >= 2:
        design = np.stack([np.ones_like(n_arr), 1.0 / n_arr], axis=1)
        (a, c), *_ = np.linalg.lstsq(design, e_arr, rcond=None)
        if a < 0 or c < 0:  # noise: one of the terms alone
            a, c = (0.0, float(np.median(e_arr * n_arr))) if c >= 0 else (float(np.median(e_arr)), 0.0)
    else:
        a, c = 0.0, float(np.median(e_arr * n_arr))
    end = [max(t["epoch_end_s"] - t["eval_s"], 0.0) + t["checkpoint_s"] for t in ok]
    if method == "polo":
        notes.append(
            "post-local SGD's step was measured in its synchronous phase; after polo_switch_epoch its steps "
            "skip the all-reduce and are predicted slower than they run"
        )
    return RunCosts(
        method=method,
        n_workers=tuple(ns),
        step_extra_s=tuple(max(x, 0.0) for x in extras),
        periodic_s=float(statistics.median(periodic)) if periodic else 0.0,
        periodic_every=periodic_every,
        periodic_n_workers=tuple(periodic_ns),
        periodic_by_n_s=tuple(float(statistics.median(periodic_by_n[n])) for n in periodic_ns),
        eval_fixed_s=float(a),
        eval_sharded_s=float(c),
        epoch_end_s=float(statistics.median(end)),
        notes=tuple(notes),
    )


def describe(costs: RunCosts | None, method: str) -> str:
    """One sentence on what the plan's epoch times include for ``method``."""
    if costs is None:
        return (
            f"the profile has no run trial of method {method!r}: its epochs are predicted as plain DDP steps, "
            "without the method's own work or the epoch's evaluation and checkpoint"
        )
    extra = ", ".join(f"{1e3 * x:+.1f} ms at N = {n}" for n, x in zip(costs.n_workers, costs.step_extra_s))
    return (
        f"epochs include method {costs.method!r}'s step ({extra or 'not compared'} per step against the plain step)"
        f" and each epoch's end: evaluation {costs.eval_fixed_s + costs.eval_sharded_s:.3f} s at N = 1, "
        f"checkpoint and records {costs.epoch_end_s:.3f} s"
        + (
            f", the method's periodic work {_periodic_text(costs)}"
            if costs.periodic_s or any(costs.periodic_by_n_s)
            else ""
        )
    )


def _periodic_text(costs: RunCosts) -> str:
    """The method's periodic work per occurrence, per measured cluster size where it was."""
    if not costs.periodic_n_workers:
        return f"{costs.periodic_s:.3f} s"
    return ", ".join(f"{x:.3f} s at N = {n}" for n, x in zip(costs.periodic_n_workers, costs.periodic_by_n_s))


def run_costs_for(models: dict, method: str) -> tuple[RunCosts | None, str]:
    """The run costs a plan for ``method`` uses, from a models record, and the sentence that
    says what they include.  For a method the profile did not run, the epoch's end (the same
    for every method) is kept and the step is the plain one: the sentence says so."""
    rc = models.get("run_costs")
    if not rc:
        return None, describe(None, method)
    costs = RunCosts.from_dict(rc)
    if costs.method == method:
        return costs, describe(costs, method)
    loop = replace(costs, method=method, n_workers=(), step_extra_s=(), periodic_s=0.0, periodic_every=None,
                   periodic_n_workers=(), periodic_by_n_s=(), notes=())  # fmt: skip
    return loop, (
        f"method {method!r}'s step was not measured (the profile ran {costs.method!r}): its steps are predicted "
        f"as plain DDP steps; each epoch's evaluation and checkpoint are included"
    )


def fitted_step_s(models: dict, global_batch: int, n_workers: int, accumulation_steps: int = 1) -> float:
    """The fitted plain step at (B, N, k), where the profile's ranks ran (their ranks per host)."""
    from tula.core.perfmodel import PerfModel, ranks_per_node_of

    perf = PerfModel.from_dict(models["perf"])
    k = max(1, int(accumulation_steps))
    b = global_batch / n_workers / k
    return float(perf.t_step_s(b, n_workers, ranks_per_node_of(models.get("trials") or []), None, k))


def predicted_step_s(
    models: dict, method: str, global_batch: int, n_workers: int, accumulation_steps: int = 1
) -> float:
    """The plan's prediction of one step of ``method`` at (B, N, k): the fitted step and the
    method's extra (:meth:`RunCosts.step_s`), as :func:`predicted_epoch_s` counts it."""
    t = fitted_step_s(models, global_batch, n_workers, accumulation_steps)
    costs = run_costs_for(models, method)[0]
    return t if costs is None else float(costs.step_s(t, n_workers))


def predicted_epoch_s(
    models: dict, method: str, global_batch: int, n_workers: int, accumulation_steps: int = 1
) -> float:
    """The plan's prediction of one epoch at (B, N, k) for ``method``: the fitted step where
    the ranks were profiled, and the run costs (:func:`run_costs_for`)."""
    t = fitted_step_s(models, global_batch, n_workers, accumulation_steps)
    return float(epoch_time_s(t, global_batch, n_workers, models["dataset_size"], run_costs_for(models, method)[0]))


def measured_epoch_s(epoch: dict) -> float:
    """An epoch of a training record as the plan predicts it: its steps, its end (evaluation),
    its checkpoint (``epoch_wall_s``; older records: the steps' time alone)."""
    if epoch.get("epoch_wall_s") is not None:
        return float(epoch["epoch_wall_s"])
    return float(epoch["epoch_time_s"]) + float(epoch.get("epoch_end_s") or 0.0)


def compare_with_plan(run: dict, models: dict) -> dict:
    """``run`` (a training record) with each epoch's predicted time at its (B, N, k) and the
    ratio measured / predicted, and ``prediction``: the median ratio over the epochs after
    the first (the first starts the world and warms the kernels), or over all with one."""
    method = run["method"]
    history = []
    for h in run["history"]:
        p = predicted_epoch_s(models, method, h["global_batch"], h["n_workers"], h.get("accumulation_steps") or 1)
        m = measured_epoch_s(h)
        history.append({**h, "predicted_epoch_s": p, "measured_to_predicted": m / p if p > 0 else None})
    ratios = [h["measured_to_predicted"] for h in history[1:] or history if h["measured_to_predicted"] is not None]
    _, note = run_costs_for(models, method)
    prediction = {
        "median_ratio": float(statistics.median(ratios)) if ratios else None,
        "epochs_compared": len(ratios),
        "note": note,
    }
    return {**run, "history": history, "prediction": prediction}


def measured_ratio(run: dict, models: dict) -> dict | None:
    """What a finished training ``run`` of the job says of the plan's epochs: the median
    ratio measured / predicted over its epochs after the first (:func:`compare_with_plan`),
    the method it trained and the (N, B) it trained at last; ``None`` when it has no epoch
    to compare.  A re-plan may scale its predicted epochs by it (``make_plan(measured=...)``)."""
    history = run.get("history") or []
    if not history:
        return None
    prediction = compare_with_plan(run, models)["prediction"]
    if prediction["median_ratio"] is None:
        return None
    last = history[-1]
    return {
        "ratio": prediction["median_ratio"],
        "epochs_compared": prediction["epochs_compared"],
        "method": run["method"],
        "n_workers": last["n_workers"],
        "global_batch": last["global_batch"],
    }
