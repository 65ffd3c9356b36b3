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
steps.

The parameter record (:class:`RunCosts`) and the formula (:func:`epoch_time_s`) are defined in
:mod:`tula.core.fitted`, beside the one prediction that combines them with the fitted models
(:meth:`tula.core.fitted.FittedModels.predict`); this module fits them, and its predictions of a
configuration (:func:`predicted_epoch_s`, :func:`predicted_step_s`, :func:`fitted_step_s`) are
thin calls of that prediction.  Numpy only: no torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# the parameter record and the epoch formula live with the one prediction that combines them
# (tula.core.fitted, which this module calls); they are this module's names as before
from tula.core.errors import RecordError
from tula.core.fitted import (
    FittedModels,
    Predictions,
    RunCosts,
    describe,
    epoch_steps,
    epoch_time_s,
    run_costs_for,
)
from tula.core.records import (
    EpochRecord,
    MeasuredRatio,
    ModelsRecord,
    RunPrediction,
    RunTrial,
    TrainRecord,
    as_epoch,
)
from tula.core.spec import reference_sequence_length

__all__ = [
    "EPOCH_TIMES",
    "RunCosts",
    "compare_with_plan",
    "describe",
    "epoch_steps",
    "epoch_time_s",
    "fit_run_costs",
    "fitted_step_s",
    "measured_epoch_s",
    "measured_ratio",
    "predicted_epoch_s",
    "predicted_step_s",
    "run_costs_for",
    "trained_sequence_length",
]

#: a models record: typed, or as read from JSON
Models = ModelsRecord | Mapping[str, Any]

#: the measured seconds in an epoch's record (tula.engine.train): they differ between two runs
#: that are otherwise equal bit for bit
EPOCH_TIMES = ("epoch_time_s", "eval_s", "epoch_end_s", "checkpoint_s", "epoch_wall_s")


def fit_run_costs(run_trials: Sequence[RunTrial | Mapping[str, Any]], method: str) -> RunCosts | None:
    """The run costs of ``method`` from the profile's run trials of that method that ran
    (``status: ok``); ``None`` when there is none.  A trial as read from JSON is typed here
    (:class:`~tula.core.records.RunTrial`).

    Per cluster size the method's extra per step is its regular steps' median minus the plain
    trial's ``t_step_s`` at the same (N, B), and its periodic work the due steps' median minus
    the regular steps' (also kept as one median over the sizes); evaluation is fitted as
    ``a + c / N`` over the cluster sizes (``c / N`` alone from one size); the rest of the
    epoch's end is the median over the trials.  An extra measured below 0 (the method's step
    cannot do less than the plain step's work) is taken as 0, and a note says where."""
    trials = [t if isinstance(t, RunTrial) else RunTrial.model_validate(t) for t in run_trials]
    ok = [t for t in trials if t.status == "ok" and t.method == method]
    if not ok:
        return None
    notes: list[str] = []
    by_n: dict[int, list[float]] = {}
    periodic_by_n: dict[int, list[float]] = {}
    for t in ok:
        run_step_s = _measured(t.t_run_step_s, "t_run_step_s")
        if t.t_step_plain_s is not None:
            by_n.setdefault(t.n_workers, []).append(run_step_s - t.t_step_plain_s)
        if t.t_due_step_s is not None:
            periodic_by_n.setdefault(t.n_workers, []).append(max(t.t_due_step_s - run_step_s, 0.0))
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
    every, steps = ok[0].update_every, ok[0].steps_per_epoch
    # the method's cadence, as a count of steps, unless it is once per epoch at the measured batch
    periodic_every = int(every) if every and periodic and every != steps else None
    n_arr = np.array([t.n_workers for t in ok], float)
    e_arr = np.array([_measured(t.eval_s, "eval_s") for t in ok], float)
    if len(set(n_arr.tolist())) >= 2:
        design = np.stack([np.ones_like(n_arr), 1.0 / n_arr], axis=1)
        (a, c), *_ = np.linalg.lstsq(design, e_arr, rcond=None)
        if a < 0 or c < 0:  # noise: one of the terms alone
            a, c = (0.0, float(np.median(e_arr * n_arr))) if c >= 0 else (float(np.median(e_arr)), 0.0)
    else:
        a, c = 0.0, float(np.median(e_arr * n_arr))
    end = [
        max(_measured(t.epoch_end_s, "epoch_end_s") - _measured(t.eval_s, "eval_s"), 0.0)
        + _measured(t.checkpoint_s, "checkpoint_s")
        for t in ok
    ]
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


def _measured(value: float | None, name: str) -> float:
    """A figure an ``ok`` run trial carries; a trial without it is a damaged record."""
    if value is None:
        raise RecordError(f"the profile's run trial marked ok lacks its {name}")
    return float(value)


def _predicted(
    models: Models,
    method: str | None,
    global_batch: int,
    n_workers: int,
    accumulation_steps: int = 1,
    sequence_length: int | None = None,
) -> Predictions:
    """Configuration (B, N, k) at sequence length L as :meth:`tula.core.fitted.FittedModels.predict`
    predicts it from ``models`` for ``method`` (default: the spec's), on the network the ranks
    were profiled on: the predictions of that one configuration (each figure an array of one).
    ``sequence_length`` ``None``: the length the models were fitted at."""
    fitted = FittedModels.from_record(models, method=method)
    k = max(1, int(accumulation_steps))
    return fitted.predict(
        n_workers=n_workers, global_batch=global_batch, accumulation_steps=k, sequence_length=sequence_length
    )


def fitted_step_s(models: Models, global_batch: int, n_workers: int, accumulation_steps: int = 1) -> float:
    """The fitted plain step at (B, N, k), where the profile's ranks ran (their ranks per host).

    A compatibility wrapper: ``t_step_s`` of :meth:`tula.core.fitted.FittedModels.predict`."""
    return float(_predicted(models, None, global_batch, n_workers, accumulation_steps).t_step_s[0])


def predicted_step_s(
    models: Models, method: str, global_batch: int, n_workers: int, accumulation_steps: int = 1
) -> float:
    """The plan's prediction of one step of ``method`` at (B, N, k): the fitted step and the
    method's extra (:meth:`RunCosts.step_s`), as :func:`predicted_epoch_s` counts it.

    A compatibility wrapper: ``method_step_s`` of :meth:`tula.core.fitted.FittedModels.predict`."""
    return float(_predicted(models, method, global_batch, n_workers, accumulation_steps).method_step_s[0])


def predicted_epoch_s(
    models: Models,
    method: str,
    global_batch: int,
    n_workers: int,
    accumulation_steps: int = 1,
    sequence_length: int | None = None,
) -> float:
    """The plan's prediction of one epoch at (B, N, k) for ``method``: the fitted step where
    the ranks were profiled, at ``sequence_length`` (default: the length the models were fitted
    at), and the run costs (:func:`run_costs_for`), ``floor(D / B)`` steps.

    A compatibility wrapper: ``epoch_time_s`` of :meth:`tula.core.fitted.FittedModels.predict`."""
    predicted = _predicted(models, method, global_batch, n_workers, accumulation_steps, sequence_length)
    return float(predicted.epoch_time_s[0])


def measured_epoch_s(epoch: EpochRecord | Mapping[str, Any]) -> float:
    """An epoch of a training record (an :class:`~tula.core.records.EpochRecord`, or its whole
    metrics line: :func:`~tula.core.records.as_epoch`) as the plan predicts it: its steps, its end
    (evaluation), its checkpoint (``epoch_wall_s``; older records: the steps' time alone)."""
    e = as_epoch(epoch)
    wall = e.epoch_wall_s
    if wall is not None:
        return float(wall)
    return float(e.epoch_time_s) + float(e.epoch_end_s or 0.0)


def trained_sequence_length(run: TrainRecord) -> int | None:
    """The sequence length L a training record trained at: its spec's data's own length
    (:func:`tula.core.spec.reference_sequence_length`: ``text``'s ``sequence_length``, a
    factory's), which :func:`tula.core.job_rules.training_spec` sets to the plan's choice when
    the plan chose among ``search.sequence_lengths``.  ``None`` for data without a length: its
    epochs are then predicted at the length the models were fitted at."""
    return reference_sequence_length(run.spec.data)


def _compared(run: TrainRecord, models: Models) -> tuple[list[EpochRecord], list[float], str]:
    """A training ``run``'s epochs beside the plan's: each epoch (as its line had it) with its
    predicted time and the ratio measured / predicted added, the ratios that count (the epochs
    after the first, or the one), and what the predicted epochs include (the run costs' note)."""
    length = trained_sequence_length(run)  # the plan may have chosen another L than the models' own
    history: list[EpochRecord] = []
    ratios: list[float] = []
    for h in run.history:
        p = predicted_epoch_s(models, run.method, h.global_batch, h.n_workers, h.accumulation_steps or 1, length)
        ratio = measured_epoch_s(h) / p if p > 0 else None
        history.append(h.model_copy(update={"predicted_epoch_s": p, "measured_to_predicted": ratio}))
        if ratio is not None and (len(history) > 1 or len(run.history) == 1):
            ratios.append(ratio)
    _, note = run_costs_for(models, run.method)
    return history, ratios, note


def compare_with_plan(run: TrainRecord, models: Models) -> TrainRecord:
    """``run`` (a training record; :func:`~tula.core.records.load_train` reads one from its file)
    with each epoch's predicted time at its (B, N, k) and the sequence length trained at
    (:func:`trained_sequence_length`), and the ratio measured / predicted, and ``prediction``:
    the median ratio over the epochs after the first (the first starts the world and warms the
    kernels), or over all with one."""
    history, ratios, note = _compared(run, models)
    prediction = RunPrediction(
        median_ratio=float(statistics.median(ratios)) if ratios else None, epochs_compared=len(ratios), note=note
    )
    return run.model_copy(update={"history": history, "prediction": prediction})


def measured_ratio(run: TrainRecord, models: Models) -> MeasuredRatio | None:
    """What a finished training ``run`` of the job says of the plan's epochs: the median
    ratio measured / predicted over its epochs after the first (:func:`compare_with_plan`),
    the method it trained and the (N, B) it trained at last; ``None`` when it has no epoch
    to compare.  A re-plan may scale its predicted epochs by it (``make_plan(measured=...)``)."""
    if not run.history:
        return None
    _, ratios, _ = _compared(run, models)
    if not ratios:
        return None
    last = run.history[-1]
    return MeasuredRatio(
        ratio=float(statistics.median(ratios)),
        epochs_compared=len(ratios),
        method=run.method,
        n_workers=last.n_workers,
        global_batch=last.global_batch,
    )
