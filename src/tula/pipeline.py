"""The pipeline every front end runs: profile -> fit -> plan -> train, into a run directory.

``tula run`` and the service's job runner both call :func:`run_pipeline`; the single-stage
commands call the stage functions.  Nothing here prints or knows who is watching: an
:class:`Observer` hears each stage begin and end, the workers' progress events, every
record as it is written and one-line notes (the CLI draws progress bars and tables from
them, the service writes its store).

The run directory's layout is the one the CLI documents: ``profile.json``,
``models.json``, ``plan.json``, ``plan.png`` and ``train/`` (``train.json``, ``train.png``,
``metrics.jsonl``, checkpoints).  Every record is written atomically as soon as it exists;
``profile.json`` is rewritten (``in_progress``) each time a trial has finished on every
rank, so a process killed mid-profile loses no finished trial.  A resumed pipeline
continues from the stage it stopped in: finished trials are not run again and training
resumes from its checkpoint.
"""

from __future__ import annotations

import logging
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tula.core.config import Config
from tula.core.errors import Interrupted, RunDirError, TulaError
from tula.core.events import Event
from tula.core.job_rules import (
    check_parallelism,
    method_fallback,
    spec_with,
    train_config,
    train_method,
    training_spec,
)
from tula.core.records import (
    MODELS_KIND,
    PLAN_KIND,
    PROFILE_KIND,
    RUN_KIND,
    TRAIN_KIND,
    VERSIONS,
    ModelsRecord,
    PlanRecord,
    PlanRow,
    ProfileRecord,
    TrainRecord,
    as_record,
    load_models,
    load_plan,
    load_profile,
    load_run_manifest,
    load_train,
    save_record,
)
from tula.core.sinks import check_sinks
from tula.core.spec import JobSpec, load_spec, reference_sequence_length, spec_from_dict

STAGES = ("profiling", "fitting", "planning", "training")
PROFILE, MODELS, PLAN, PLAN_PNG = "profile.json", "models.json", "plan.json", "plan.png"
TRAIN_DIR, TRAIN, TRAIN_PNG = "train", "train.json", "train.png"

log = logging.getLogger(__name__)

#: a record as the stages hand it on, typed
AnyRecord = ProfileRecord | ModelsRecord | PlanRecord | TrainRecord


class Observer:
    """What a front end hears from the pipeline; every method is a no-op here."""

    def stage(self, name: str, **info: Any) -> None:
        """Stage ``name`` (one of :data:`STAGES`) begins; training says its ``method``,
        ``n_workers`` and ``global_batch``."""

    def done(self, name: str) -> None:
        """Stage ``name`` ended (finished, failed or interrupted)."""

    def event(self, stage: str, ev: Event) -> None:
        """A progress event of the stage's workers (:mod:`tula.core.events`: ``Checked``,
        ``TrialsPlanned``, ``TrialFinished`` while profiling; ``WorldStarted``, ``StepDone``,
        ``EpochFinished``, ``Resized``, ``FellBack`` while training; ``Note`` in both)."""

    def saved(self, kind: str, record: dict | AnyRecord | None, path: Path) -> None:
        """``path`` was written: a record (``kind`` is its kind, ``record`` its content: the typed
        object -- :func:`as_record` reads a dict too; a profile with ``in_progress`` is a snapshot)
        or a plot (``kind`` ``"plot"``, ``record`` ``None``)."""

    def note(self, message: str) -> None:
        """A line for the user."""


def profiled_trials(prof: dict | ProfileRecord) -> int:
    """How many of a (partial) profile's trials are finished."""
    return sum(t.status in ("ok", "oom", "skipped") for t in as_record(prof, ProfileRecord).trials)


def is_partial(prof: dict | ProfileRecord) -> bool:
    """A profile that stopped (or was still running) before all its trials finished."""
    rec = as_record(prof, ProfileRecord)
    return bool(rec.interrupted or rec.failed or rec.in_progress)


def record_dict(rec: dict | AnyRecord) -> dict:
    """``rec`` as the dict a function that still reads records as dicts takes: a dict as it is, a
    typed record as its :meth:`~tula.core.records.ProfileRecord.to_json_dict` (what its file holds)."""
    return rec if isinstance(rec, dict) else rec.to_json_dict()


def with_spec(models: dict | ModelsRecord, spec: JobSpec) -> dict | ModelsRecord:
    """``models`` planned over another ``spec`` (a record's spec with --workers or the launched world's
    size in it), of the type it was given: a record as a dict while the fitter still makes dicts, else
    the frozen object with its spec replaced."""
    if isinstance(models, dict):
        return {**models, "spec": spec.to_dict()}
    return models.model_copy(update={"spec": spec})  # a checked JobSpec: model_copy does not validate


# --------------------------------------------------------------------------- the stages
def profile_stage(
    job: JobSpec,
    search: str,
    save_to: Path,
    *,
    previous: dict | ProfileRecord | None = None,
    launcher=None,
    observer: Observer | None = None,
) -> ProfileRecord:
    """Profile ``job`` and write the record to ``save_to``; snapshots are written there as
    trials finish, and if a worker fails or the run is interrupted the trials finished
    before it are written there too, then the error is raised with a sentence saying so."""
    from tula.engine.profile import ProfileFailed, ProfileInterrupted, profile

    obs = observer or Observer()

    def snapshot(rec: ProfileRecord) -> None:
        save_record(rec, save_to)
        obs.saved(PROFILE_KIND, rec, save_to)

    obs.stage("profiling")
    log.info("profiling %s (search %s) into %s", job.name, search, save_to)
    try:
        rec = profile(
            job,
            search,
            launcher=launcher,
            on_event=lambda ev: obs.event("profiling", ev),
            previous=previous,
            on_snapshot=snapshot,
        )
    except (ProfileFailed, ProfileInterrupted) as err:
        if err.record is None:
            raise
        snapshot(err.record)
        kept = f"the {profiled_trials(err.record)} trial(s) finished before it are saved in {save_to}"
        if isinstance(err, ProfileInterrupted):
            raise Interrupted(f"{err}; {kept}", err.signum) from None
        raise TulaError(f"{err}; {kept}") from None
    finally:
        obs.done("profiling")
    snapshot(rec)
    log.info("profiled %d trial(s): %s", profiled_trials(rec), save_to)
    return rec


def fit_stage(prof: dict | ProfileRecord, save_to: Path, observer: Observer | None = None) -> ModelsRecord:
    """Fit the memory and performance models of a profile; write them to ``save_to``."""
    from tula.core.fit import fit_models

    obs = observer or Observer()
    obs.stage("fitting")
    try:
        models = fit_models(prof)
        save_record(models, save_to)
    finally:
        obs.done("fitting")
    log.info("fitted the memory and performance models: %s", save_to)
    obs.saved(MODELS_KIND, models, save_to)
    return models


def plan_stage(
    models: dict | ModelsRecord,
    objective: str | None,
    save_to: Path,
    plot_to: Path | None = None,
    observer: Observer | None = None,
    **plan_options: Any,
) -> PlanRecord:
    """Choose a configuration from fitted models; write the plan (and its plot) there.
    ``plan_options`` go to :func:`tula.core.plan.make_plan`."""
    from tula.core.plan import make_plan
    from tula.report import plot_plan

    obs = observer or Observer()
    obs.stage("planning")
    try:
        p = make_plan(models, objective, **plan_options)
        save_record(p, save_to)
        if plot_to is not None:
            plot_plan(p, as_record(models, ModelsRecord).trials, plot_to)
    finally:
        obs.done("planning")
    log.info("planned (objective %s): %s", p.objective, save_to)
    obs.saved(PLAN_KIND, p, save_to)
    if plot_to is not None:
        obs.saved("plot", None, plot_to)
    return p


def train_stage(
    job: JobSpec,
    method: str,
    n_workers: int,
    global_batch: int,
    out: Path,
    *,
    resume: bool = False,
    launcher=None,
    observer: Observer | None = None,
    models: dict | ModelsRecord | None = None,
) -> TrainRecord:
    """Train in ``out`` (checkpoints, metrics.jsonl); write train.json and train.png there.
    ``models``: the fitted models the run was planned with; each epoch's record then carries
    the plan's prediction for it and the ratio measured / predicted
    (:func:`tula.core.run_costs.compare_with_plan`), and ``train.workers: {rule: plan}``
    ranks the worker counts by them."""
    from tula.engine.train import train
    from tula.report import plot_training

    obs = observer or Observer()
    length = reference_sequence_length(job.data)  # the length trained at, where the data has one
    info = {} if length is None else {"sequence_length": length}
    obs.stage("training", method=method, n_workers=n_workers, global_batch=global_batch, **info)
    log.info(
        "training %s on %d worker(s) at B=%d into %s%s",
        method,
        n_workers,
        global_batch,
        out,
        ", resuming" if resume else "",
    )
    fitted = None if models is None else record_dict(models)  # the trainer and compare_with_plan read a dict
    try:
        run = train(
            job,
            method,
            n_workers,
            global_batch,
            out,
            resume=resume,
            launcher=launcher,
            on_event=lambda ev: obs.event("training", ev),
            models=fitted,
        )
        if fitted is not None:
            from tula.core.run_costs import compare_with_plan

            run = compare_with_plan(run, fitted)
        save_record(run, out / TRAIN)
        plot_training(run, out / TRAIN_PNG)
    finally:
        obs.done("training")
    log.info("trained %d epoch(s): %s", len(run.history), out / TRAIN)
    obs.saved(TRAIN_KIND, run, out / TRAIN)
    obs.saved("plot", None, out / TRAIN_PNG)
    return run


def at_choice(job: JobSpec, choice: PlanRow | dict) -> JobSpec:
    """``job`` as it trains at a plan's ``choice`` with nothing else given: with the choice's
    gradient accumulation (``accumulation_steps``), unless a batch schedule or
    ``train.workers`` chooses its own, and at its sequence length
    (:func:`tula.core.job_rules.train_config`, :func:`tula.core.job_rules.training_spec`)."""
    plan = {"choice": choice.to_json_dict() if isinstance(choice, PlanRow) else choice}
    return training_spec(job, train_config(job, plan), plan)


def checkpoint_config(train_dir: Path) -> Config | None:
    """The configuration the checkpoint in ``train_dir`` was trained at (its last epoch's:
    an out-of-memory fallback may have changed the batch or the accumulation since); ``None``
    without a checkpoint."""
    from tula.engine.checkpoint import checkpoint_header, has_checkpoint

    if not has_checkpoint(train_dir):
        return None
    meta = checkpoint_header(train_dir)
    return Config(meta.n_workers, meta.global_batch, meta.accumulation_steps)


def training_method(
    job: JobSpec, global_batch: int, observer: Observer | None = None, method: str | None = None
) -> str:
    """The method to train with (:func:`tula.core.job_rules.train_method`): ``method`` when
    given, else the spec's, or ``lbt`` where AGS has nothing to scale (the batch is not above
    ``train.ags.b_small``; ``observer`` hears a note saying so)."""
    if method is None and observer is not None:
        why = method_fallback(job, global_batch)
        if why:
            observer.note(why)
    return train_method(job, global_batch, method)


# --------------------------------------------------------------------------- the whole job
@dataclass(frozen=True)
class StagesDone:
    """The records :func:`run_pipeline`'s stages made or found in the run directory."""

    models: dict | ModelsRecord
    plan: dict | PlanRecord
    profile: dict | ProfileRecord | None = None
    """``None`` when the models were given (planned from another job's models)"""
    train: TrainRecord | None = None
    """``None`` without training (``train_after`` false)"""


def _in_world(models: dict | ModelsRecord, launcher: Any, obs: Observer) -> dict | ModelsRecord:
    """The models as planned for ``launcher``: a launched world (``--cluster env``) trains on
    all of its ranks, so its plan chooses among configurations of that one worker count."""
    size = launcher.world_size
    if size is None:
        return models
    planned = as_record(models, ModelsRecord).spec
    if list(planned.search.cluster_sizes) == [size]:
        return models
    obs.note(f"planning for N = {size} only: the world this run is in has {size} ranks and trains on all of them")
    spec = spec_with(planned, search=planned.search.model_copy(update={"cluster_sizes": [size]}))
    return with_spec(models, spec)


def _models_and_plan(
    job: JobSpec,
    out: Path,
    search: str,
    resuming: bool,
    launcher: Any,
    obs: Observer,
    models: dict | ModelsRecord | None,
) -> tuple[dict | ModelsRecord, dict | PlanRecord | None, dict | ProfileRecord | None]:
    """The run's fitted models, and its plan where one was already written: given or found
    complete in ``out`` (``resuming``), or else profiled (a partial profile continued) and
    fitted; and the profile, where there is one."""
    prof_path, models_path, plan_path = out / PROFILE, out / MODELS, out / PLAN

    def have(p: Path) -> bool:
        return resuming and p.exists()

    if models is None and have(models_path):
        models = load_models(models_path)
    prof: dict | ProfileRecord | None = load_profile(prof_path) if have(prof_path) else None
    if models is not None and (prof is None or not is_partial(prof)):
        if not have(models_path):
            save_record(models, models_path)
            obs.saved(MODELS_KIND, models, models_path)
        else:
            obs.note(f"models: {models_path} is complete")
        return models, load_plan(plan_path) if have(plan_path) else None, prof
    if prof is None or is_partial(prof):
        if prof is not None:
            obs.note(
                f"continuing the profile in {prof_path}: {profiled_trials(prof)} of "
                f"{len(as_record(prof, ProfileRecord).configs)} trial(s) already finished"
            )
        prof = profile_stage(job, search, prof_path, previous=prof, launcher=launcher, observer=obs)
    else:
        obs.note(f"profile: {prof_path} is complete")
        obs.saved(PROFILE_KIND, prof, prof_path)
    return fit_stage(prof, models_path, obs), None, prof


def _plan_of_run(
    models: dict | ModelsRecord,
    plan: dict | PlanRecord | None,
    objective: str | None,
    out: Path,
    launcher: Any,
    obs: Observer,
) -> dict | PlanRecord:
    """The run's plan: ``plan`` when one was found complete (its plot drawn if missing), else
    made now."""
    plan_path = out / PLAN
    if plan is None:
        return plan_stage(_in_world(models, launcher, obs), objective, plan_path, out / PLAN_PNG, obs)
    obs.note(f"plan: {plan_path} is complete")
    if not (out / PLAN_PNG).exists():
        from tula.report import plot_plan

        plot_plan(plan, as_record(models, ModelsRecord).trials, out / PLAN_PNG)
    obs.saved(PLAN_KIND, plan, plan_path)
    return plan


def _train_at_choice(
    job: JobSpec,
    plan: dict | PlanRecord,
    models: dict | ModelsRecord,
    out: Path,
    resuming: bool,
    launcher: Any,
    obs: Observer,
) -> TrainRecord:
    """Train at the plan's choice in ``out``'s train directory, or, resuming a run whose
    training finished, read its record."""
    from tula.engine.checkpoint import has_checkpoint

    config = train_config(job, plan)  # the plan's choice: tula run and the service give nothing else
    job = training_spec(job, config, plan)  # its k and its sequence length
    method = training_method(job, config.global_batch, obs)
    train_dir = out / TRAIN_DIR
    if resuming and (train_dir / TRAIN).exists():  # written only when training finished
        run = load_train(train_dir / TRAIN)
        obs.note(f"training: {train_dir / TRAIN} is complete")
        obs.saved(TRAIN_KIND, run, train_dir / TRAIN)
        return run
    return train_stage(
        job,
        method,
        config.n_workers,
        config.global_batch,
        train_dir,
        resume=resuming and has_checkpoint(train_dir),
        launcher=launcher,
        observer=obs,
        models=models,
    )


def run_pipeline(
    job: JobSpec,
    out: Path,
    *,
    search: str = "partial",
    objective: str | None = None,
    train_after: bool = True,
    resuming: bool = False,
    launcher=None,
    observer: Observer | None = None,
    models: dict | ModelsRecord | None = None,
) -> StagesDone:
    """Profile, fit, plan and (with ``train_after``) train ``job`` in run directory ``out``.

    ``resuming``: continue from the records already in ``out`` (a partial profile goes on
    from its finished trials; a finished stage is not run again; training resumes from its
    checkpoint).  ``models``: a fitted models record to plan from instead of profiling
    (the service's reuse of a model measured by another job).  Returns the records the stages
    made or found (:class:`StagesDone`)."""
    if train_after:  # a metrics sink whose package is missing: one sentence, before any worker profiles
        check_sinks(job.train.loggers)
        check_parallelism(job)  # train.parallelism fsdp with what it cannot train: likewise
    obs = observer or Observer()
    out.mkdir(parents=True, exist_ok=True)
    models, plan, profile = _models_and_plan(job, out, search, resuming, launcher, obs, models)
    chosen = _plan_of_run(models, plan, objective, out, launcher, obs)
    trained = _train_at_choice(job, chosen, models, out, resuming, launcher, obs) if train_after else None
    return StagesDone(models=models, plan=chosen, profile=profile, train=trained)


# --------------------------------------------------------------------------- a run directory
RUN_FILES = ("run.json", "profile.json", "models.json", "plan.json", "plan.png")


@dataclass(frozen=True)
class RunSettings:
    """How a run was started (its ``run.json``), or what a command line asks again (``None``:
    not given): the search, the objective (``None``: the spec's), training after planning."""

    search: str | None
    objective: str | None
    train: bool | None


def same_job(a: dict | JobSpec, b: dict | JobSpec) -> bool:
    """Two specs describe the same job wherever it runs (the cluster may change on resume).

    Both are read through the spec model first, so a spec stored before a field was added
    (its default then filled in) is the same job as that spec read today."""

    def normal(given: dict | JobSpec) -> dict:
        if isinstance(given, JobSpec):
            return {k: v for k, v in given.to_dict().items() if k != "cluster"}
        d = given
        try:
            d = spec_from_dict(d).to_dict()
        except TulaError:
            pass  # compared as stored: a spec that no longer validates differs from one that does
        return {k: v for k, v in d.items() if k != "cluster"}

    return normal(a) == normal(b)


def _as_flag(setting: str, value: Any) -> str:
    """How a run setting with this value reads on ``tula run``'s command line."""
    if setting == "train":
        return "--train" if value else "--no-train"
    return f"--{setting} {value}" if value is not None else f"the spec's {setting}"


def continue_run(out: Path, spec_path: Path | None, asked: RunSettings) -> tuple[JobSpec, RunSettings]:
    """The run in ``out`` to continue: its spec and settings, from its ``run.json``.  The spec
    at ``spec_path``, when given again, must be the same job, and what ``asked`` gives must
    be what the run was started with: a run continues as it was started."""

    if not (out / "run.json").is_file():
        raise RunDirError(
            f"{str(out)!r} holds no Tula run to continue (no run.json); start one with `tula run SPEC --out DIR`"
        )
    manifest = load_run_manifest(out / "run.json")
    if spec_path is not None and not same_job(load_spec(spec_path), manifest.spec):
        raise RunDirError(
            f"{spec_path} differs from the spec the run in {out} was started with; resume without "
            "SPEC, or start a new run with another --out"
        )
    started = RunSettings(manifest.search, manifest.objective, manifest.train)
    for setting in ("search", "objective", "train"):
        given, was = getattr(asked, setting), getattr(started, setting)
        if given is not None and given != was:
            raise RunDirError(
                f"the run in {out} was started with {_as_flag(setting, was)}; --resume continues "
                f"it as it was started, so drop {_as_flag(setting, given)} (or start a new run with "
                "another --out)"
            )
    return manifest.spec, started


def existing_run_files(out: Path) -> list[str]:
    return [n for n in (*RUN_FILES, "train") if (out / n).exists()]


def refuse_existing_run(out: Path) -> None:
    """A new run never writes over another one: one sentence naming what is there."""
    existing = existing_run_files(out)
    if existing:
        hint = (
            f"continue it with `tula run --resume {shlex.quote(str(out))}`"
            if (out / "run.json").exists()
            else "choose another --out"
        )
        raise RunDirError(
            f"{str(out)!r} already holds a run ({', '.join(existing)}); {hint}, or pass --force to start over"
        )


def start_run(out: Path, job: JobSpec, settings: RunSettings, clear: bool = False) -> None:
    """Write a new run's ``run.json`` (``clear``: remove an earlier run's files first)."""

    if clear:
        for name in existing_run_files(out):
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    save_record(
        {
            "kind": RUN_KIND,
            "version": VERSIONS[RUN_KIND],
            "spec": job.to_dict(),
            "search": settings.search,
            "objective": settings.objective,
            "train": settings.train,
        },
        out / "run.json",
    )
