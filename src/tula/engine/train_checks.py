"""The checks the training runner's caller makes before any world starts
(:func:`tula.engine.train.train`): one sentence each for a configuration that cannot train, a
batch schedule the method cannot follow, the plan's worker rule without the models, a worker
count a launched world cannot have, a missing metrics sink, fp16 on a CPU, and a checkpoint
trained in another precision or at another sequence length (which the ranks check again on loading it)."""

from __future__ import annotations

from pathlib import Path

from tula.core.errors import SpecError
from tula.core.job_rules import schedule_problem, uses_models, worker_plan
from tula.core.sinks import check_sinks
from tula.core.spec import JobSpec, reference_sequence_length
from tula.engine.launch import Launcher
from tula.engine.precision import check_precision


def check_resumed_precision(precision: dict | None, spec: JobSpec, out_dir: str | Path) -> None:
    """One sentence when the checkpoint whose precision state is ``precision`` (``None``: a
    checkpoint from before it was kept, fp32) was trained in another precision than the spec's."""
    trained_in = (precision or {}).get("name", "fp32")
    if trained_in != spec.train.precision:
        raise SpecError(
            f"the checkpoint in {out_dir} was trained in {trained_in}, not train.precision "
            f"{spec.train.precision}; resume it in {trained_in}, or train into another --out"
        )


def check_resumed_sequence_length(trained_at: int | None, spec: JobSpec, out_dir: str | Path) -> None:
    """One sentence when the checkpoint was trained at sequence length ``trained_at`` and the spec's
    data (as the configuration rule set it: :func:`tula.core.job_rules.training_spec`) has another.
    Nothing to compare for a checkpoint from before the length was kept, or data without one."""
    now = reference_sequence_length(spec.data)
    if trained_at is not None and now is not None and now != trained_at:
        raise SpecError(
            f"the checkpoint in {out_dir} was trained at sequence length {trained_at}, not {now}; resume it at "
            f"sequence length {trained_at}, or train into another --out"
        )


def _check_fixed_world(launcher: Launcher, n_workers: int, spec: JobSpec) -> None:
    """A launched world (``--cluster env``) has one size: training uses all of its ranks, and
    a worker count cannot grow or shrink in it."""
    size = launcher.world_size
    if size is None:
        return
    started_by = getattr(getattr(launcher, "world", None), "source", "its launcher")
    if n_workers != size:
        raise SpecError(
            f"this world (started by {started_by}) has {size} ranks; train on {size} workers "
            f"(--workers {size}, or leave --workers out), not {n_workers}"
        )
    w = spec.train.workers
    if w is not None and (w.min != size or w.max != size):
        raise SpecError(
            f"train.workers grows or shrinks the worker count ({w.min} to {w.max}), but a world started by "
            f"{started_by} keeps its {size} ranks; set train.workers.min and max to {size}, or use another --cluster"
        )


def _check_before_any_world(
    spec: JobSpec, method: str, n_workers: int, launcher: Launcher, models: dict | None = None
) -> None:
    """The sentences a run is refused with before its directory is locked: a batch schedule
    the method cannot follow, the plan's worker rule without the models, a worker count a
    launched world cannot have, fp16 on a CPU."""
    if spec.train.batch_schedule is not None or spec.train.workers is not None:
        problem = schedule_problem(method, spec)
        if problem:
            raise SpecError(problem)
    if uses_models(spec):
        worker_plan(spec, models, method)  # the models are there and rank this job's method
    _check_fixed_world(launcher, n_workers, spec)
    check_sinks(spec.train.loggers)  # a metrics sink whose package is missing: one sentence naming it
    if spec.train.precision == "fp16":  # fp16 on a CPU: one sentence before any world
        device = getattr(launcher, "device", "auto")
        check_precision("fp16", launcher.facts().device if device == "auto" else device)
