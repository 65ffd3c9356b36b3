"""Command line: ``tula run``, ``check``, ``examples``, ``profile``, ``fit``, ``plan``, ``train``,
``simulate``, ``serve``, ``submit``, ``status``, ``replan`` and ``spec``.

One name per idea across verbs (:mod:`tula.cli_options` holds the names, the help panels and
the old spellings, which are refused before parsing with a sentence naming the new one).  This
module holds the verbs: their options and the calls; what a terminal shows is :mod:`tula.cli_console`,
the service's bootstrap and its signals :mod:`tula.cli_serve`.

Errors a user can cause print one sentence and exit with code 2; SIGINT/SIGTERM stop the
ranks at the next step boundary, keep what finished, print what was kept and the command
that continues, and exit 130/143.  Records already measured are written before the next
stage starts, so a later failure loses nothing.  Output directories are locked while a
command writes into them, and no command overwrites a record it did not create unless
given ``--force``.
"""

from __future__ import annotations

import logging
import shlex
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from tula import __version__
from tula import cli_options as names
from tula.cli_console import ConsoleObserver, console, err_console, show_simulation, stale_note
from tula.cli_options import CLUSTER, CONFIG, IO, NETWORK, OBJECTIVE, SCHEDULE, SERVICE, epilog
from tula.cli_serve import ready_to_serve, serve_until_stopped
from tula.core.errors import Interrupted, OptionError, RunDirError, TulaError
from tula.core.job_rules import spec_with
from tula.core.records import (
    PLAN_KIND,
    ModelsRecord,
    PlanRecord,
    ProfileRecord,
    as_record,
    load_models,
    load_profile,
    load_record,
    load_train,
    read_record_of,
)
from tula.core.registry import METHOD_NAMES, OBJECTIVE_NAMES, OBJECTIVES, cluster_kind, clusters_in_words
from tula.core.registry import METHODS as METHOD_TABLE
from tula.core.say import plain, say
from tula.core.schedules import SCHEDULES
from tula.core.spec import BatchScheduleSpec, JobSpec, load_spec, parse_duration, spec_from_dict
from tula.pipeline import (
    Observer,
    RunSettings,
    checkpoint_config,
    continue_run,
    fit_stage,
    is_partial,
    plan_stage,
    profile_stage,
    refuse_existing_run,
    run_pipeline,
    same_job,
    start_run,
    train_stage,
    training_method,
    with_spec,
)
from tula.service.logs import configure_logging

if TYPE_CHECKING:
    from tula.engine.check import CheckResult
    from tula.service.client import Client

SCHEDULE_KINDS = ", ".join(SCHEDULES)  # for --help


class _Verbs(typer.core.TyperGroup):
    """The verbs in the order a user meets them (:data:`tula.cli_options.VERBS`), not as defined."""

    def list_commands(self, ctx) -> list[str]:
        known = [v for v in names.VERBS if v in self.commands]
        return known + [v for v in self.commands if v not in known]


app = typer.Typer(
    cls=_Verbs,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Tula: profile short DDP runs of your model, fit memory and performance models, "
    "plan the global batch and cluster size that minimise time, cost, or sit at the knee, "
    "and train there with adaptive gradient scaling.  Start with `tula run --example digits`.",
)

RUNS = Path("runs")


class Search(str, Enum):
    full = "full"
    partial = "partial"


Objective = Enum("Objective", {o: o for o in OBJECTIVE_NAMES}, type=str)  # type: ignore[misc]
_OBJECTIVE_HELP = "; ".join(f"{o.name}: {o.what}" for o in OBJECTIVES.values())


TrainMethod = Enum("TrainMethod", {m: m for m in METHOD_NAMES}, type=str)  # type: ignore[misc]
_METHOD_HELP = "; ".join(f"{m.name}: {m.summary}" for m in METHOD_TABLE.values())
_SCHEDULE_HELP = "; ".join(f"{s.name}: {s.summary}" for s in SCHEDULES.values())


def _version(value: bool) -> None:
    if value:
        console.print(f"tula {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print Tula's version and exit"
    ),
) -> None:
    """Tula: plan and run distributed large-batch training."""


_CLUSTER_HELP = f"where the ranks run: {clusters_in_words()}; default: the spec's cluster.where"

# options several commands share, declared once
ClusterOption = Annotated[str | None, typer.Option(help=_CLUSTER_HELP, rich_help_panel=CLUSTER)]
SpecObjectiveOption = Annotated[
    Objective | None,
    typer.Option(help=_OBJECTIVE_HELP + " (default: the spec's objective)", rich_help_panel=OBJECTIVE),
]
ExampleOption = Annotated[
    str | None,
    typer.Option(
        "--example",
        help="one of the shipped example specs instead of SPEC (`tula examples` lists them), e.g. digits",
        rich_help_panel=IO,
        show_default=False,
    ),
]
SpecArgument = Annotated[
    Path | None, typer.Argument(metavar="SPEC", help="job spec (YAML); or --example NAME", show_default=False)
]
ForceOption = Annotated[bool, typer.Option(help="overwrite existing records", rich_help_panel=IO)]
EpochsOption = Annotated[int | None, typer.Option(help="override the spec's epochs", rich_help_panel=CONFIG)]
SearchOption = Annotated[
    Search,
    typer.Option(
        help="full: every candidate (N, B); partial: only the extreme cluster sizes and batches (paper §III-A2)",
        rich_help_panel=CONFIG,
    ),
]
DeadlineOption = Annotated[
    str | None,
    typer.Option(
        help="choose among configurations expected to finish within this duration, e.g. 8h, 90min, 1h30m "
        "(default: the spec's constraints.deadline)",
        rich_help_panel=OBJECTIVE,
    ),
]
BudgetOption = Annotated[
    float | None,
    typer.Option(
        help="choose among configurations expected to cost at most this, in the pricing's unit "
        "(default: the spec's constraints.budget)",
        rich_help_panel=OBJECTIVE,
    ),
]


class Counts(tuple):
    """The type of ``--workers``: worker counts, comma-separated (:func:`tula.cli_options.parse_counts`)."""


def _counts_option(help: str, panel: str = CLUSTER):
    return typer.Option("--workers", parser=names.parse_counts, metavar="N[,N...]", help=help, rich_help_panel=panel)


_WORKERS_HELP = (
    "the worker counts N to profile and plan over, comma-separated, e.g. 1,2,4 (overrides search.cluster_sizes"
)
WorkersOption = Annotated[Counts | None, _counts_option(_WORKERS_HELP + ")")]


def _with_workers(spec: dict, workers: tuple[int, ...] | None) -> dict:
    """The spec (a dict) with ``--workers`` as its ``search.cluster_sizes``: the worker counts
    profiled and planned over (run, profile, plan, submit)."""
    if workers is None:
        return spec
    return {**spec, "search": {**spec.get("search", {}), "cluster_sizes": list(workers)}}


def _job_with_workers(job: JobSpec, workers: tuple[int, ...] | None) -> JobSpec:
    """The job with ``--workers`` as its ``search.cluster_sizes`` (:func:`_with_workers`)."""
    return job if workers is None else spec_from_dict(_with_workers(job.to_dict(), workers))


def _with_cluster(job: JobSpec, cluster: str | None) -> JobSpec:
    """The spec with ``--cluster`` in its ``cluster.where`` (records say where they ran).
    Under ``env`` every rank of the launched world joins it here; a rank other than 0 then
    serves rank 0's worlds and exits with its exit code (it does not return)."""
    if cluster is not None:
        job = spec_with(job, cluster=job.cluster.model_copy(update={"where": cluster}))
    if job.cluster.where == "local":  # the ranks' fork server imports torch beside this process
        from tula.engine.forkserver import start_fork_server

        start_fork_server()
    from tula.engine.interrupts import import_torch

    import_torch()  # which every command here needs: with Ctrl-C held until it is done
    if job.cluster.where == "env":
        from tula.engine.launch.clusters import serve_if_env_worker

        serve_if_env_worker(job)
    return job


def _q(p: Path | str) -> str:
    return shlex.quote(str(p))


_PRICING_HELP = (
    "replace a field of the spec's pricing, KEY=VALUE, repeatable: kind (fixed, memory, spot), "
    "price_per_node_hour (on-demand), price_per_gb_hour, spot_price_per_node_hour, "
    "preemption_rate_per_node_hour, checkpoint_interval_s (e.g. 10min; default every epoch), restart_s"
)
PricingOption = Annotated[
    list[str] | None, typer.Option("--pricing", metavar="KEY=VALUE", help=_PRICING_HELP, rich_help_panel=OBJECTIVE)
]


def _pricing_overrides(items: list[str] | None) -> dict:
    """``["kind=spot", "spot_price_per_node_hour=0.9"]`` into pricing fields (checked by the spec)."""
    out = {}
    for item in items or []:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise TulaError(f"--pricing {item!r} is not KEY=VALUE (e.g. --pricing kind=spot)")
        out[key.strip()] = value.strip()
    if out:  # one sentence for a bad field or value, before any work
        try:
            spec_from_dict({"pricing": {**JobSpec().pricing.model_dump(mode="json"), **out}})
        except TulaError as err:
            raise TulaError(f"--pricing: {str(err).removeprefix('spec field ')}") from None
    return out


def _deadline_s(deadline: str) -> float:
    """``--deadline`` in seconds (a positive duration, e.g. 8h, 90min), or one sentence."""
    try:
        d_s = parse_duration(deadline)  # None only for None, and deadline is a str
    except ValueError as err:
        raise TulaError(f"--deadline: {err}") from None
    if d_s is None or d_s <= 0:
        raise TulaError(f"--deadline must be a positive duration, not {deadline!r}")
    return d_s


def _check_budget(budget: float | None) -> None:
    if budget is not None and not (budget >= 0 and budget != float("inf")):
        raise TulaError(f"--budget must be a non-negative amount, not {budget!r}")


def _plan_constraints(models: dict | ModelsRecord, deadline: str | None, budget: float | None):
    """The spec's constraints with --deadline and --budget in place of its own."""
    from tula.core.plan import Constraints

    base = Constraints.of(as_record(models, ModelsRecord).spec.constraints)
    d_s = base.deadline_s if deadline is None else _deadline_s(deadline)
    _check_budget(budget)
    return Constraints(d_s, base.budget if budget is None else budget)


def _resume_dir(resume: Path, holds: str, what: str, *others: str) -> Path:
    """``--resume DIR``: a directory holding ``holds`` (or one of ``others``), else one sentence
    naming the path and what it should hold (``what``)."""
    if resume.is_file():
        raise RunDirError(f"--resume {str(resume)!r} is a file; give the directory {what}")
    if not resume.is_dir():
        raise RunDirError(f"--resume {str(resume)!r} is not a directory; give the directory {what}")
    if not any((resume / name).exists() for name in (holds, *others)):
        raise RunDirError(f"--resume {str(resume)!r} holds no {holds}; give the directory {what}")
    return resume


def _one_out(resume: Path, out: Path | None, continued: Path) -> None:
    """``--out`` beside ``--resume`` may only name what ``--resume`` continues (``continued``)."""
    if out is not None and Path(out) != continued:
        raise TulaError(f"give the directory once: --resume {resume} continues {continued} (drop --out {out})")


# --------------------------------------------------------------------------- commands
@app.command(
    epilog=epilog(
        "tula profile --example digits --search full",
        "tula profile my_model.yaml --resume runs/my_model   # continue a stopped profile",
    )
)
def profile(
    spec: SpecArgument = None,
    example: ExampleOption = None,
    search: SearchOption = Search.partial,
    out: Annotated[
        Path | None,
        typer.Option(
            help="where to write the profile record (JSON); default runs/<spec name>/profile.json", rich_help_panel=IO
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="continue the partial profile (an interrupted or failed one) in this directory, the one "
            "holding profile.json: its finished trials are kept, only the rest run",
            rich_help_panel=IO,
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="overwrite an existing record at --out", rich_help_panel=IO)] = False,
    cluster: ClusterOption = None,
    workers: WorkersOption = None,
) -> None:
    """Run short real DDP trials and record step, compute and sync time and peak memory."""
    from tula.engine.rundir import check_out_file, locked

    source = names.spec_source(spec, example, "profile")
    if resume is not None:
        _one_out(resume, out, resume / "profile.json")
    job = _with_cluster(_job_with_workers(load_spec(source), workers), cluster)  # under env, rank > 0 serves here
    if resume is not None:  # before any work: the path's kind
        _resume_dir(resume, "profile.json", "holding the profile to continue (profile.json)")
        out = resume / "profile.json"
    out = out or RUNS / job.name / "profile.json"
    previous = None
    if resume is not None:
        previous = load_profile(out)
        if not same_job(previous.spec, job):
            raise RunDirError(
                f"{out} was profiled from another spec than {source}; give that spec, or profile into another --out"
            )
    else:
        check_out_file(out, force)
    with locked(out.parent, on_stale=stale_note):
        try:
            profile_stage(job, search.value, out, previous=previous, observer=ConsoleObserver())
        except Interrupted as err:
            moved = out.parent / "profile.json"  # --resume continues a directory's profile.json
            err.hint = (
                ("" if out == moved else f"mv {_q(out)} {_q(moved)} && ")
                + f"tula profile {names.spec_words(spec, example)} --search {search.value} --resume {_q(out.parent)}"
                + (f" --cluster {_q(cluster)}" if cluster else "")
                + (f" --workers {','.join(map(str, workers))}" if workers else "")
            )
            raise
    say(console, "profile written to ", (out, "bold"))


def _continue_profile(profile_json: Path) -> str:
    """The command that continues the partial profile ``profile_json``."""
    if profile_json.name == "profile.json":
        return f"`tula profile SPEC --resume {_q(profile_json.parent)}`"
    return f"`mv {_q(profile_json)} DIR/profile.json && tula profile SPEC --resume DIR`"


@app.command(
    epilog=epilog(
        "tula fit runs/digits-small-cnn/profile.json", "tula plan runs/digits-small-cnn/models.json --objective cost"
    )
)
def fit(
    profile_json: Path = typer.Argument(..., help="a profile record from `tula profile`"),
    out: Annotated[
        Path | None,
        typer.Option(
            help="where to write the fitted models (JSON); default models.json next to the profile", rich_help_panel=IO
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="overwrite an existing record at --out", rich_help_panel=IO)] = False,
) -> None:
    """Fit the memory and performance models of a profile; the result re-plans without profiling."""
    from tula.engine.rundir import check_out_file

    out = out or profile_json.parent / "models.json"
    check_out_file(out, force)
    rec = load_profile(profile_json)
    if is_partial(rec):
        raise TulaError(
            f"{profile_json} is a partial profile (its trials did not all finish); continue it with "
            f"{_continue_profile(profile_json)} first"
        )
    fit_stage(rec, out, ConsoleObserver())
    say(console, "models written to ", (out, "bold"))


@app.command(
    epilog=epilog(
        "tula plan runs/digits-small-cnn/models.json --objective cost --deadline 2h",
        "tula plan --example digits --pricing kind=spot --pricing spot_price_per_node_hour=0.9 \\",
        "    --pricing preemption_rate_per_node_hour=0.05 --compare-spot",
    )
)
def plan(
    source: Annotated[
        Path | None,
        typer.Argument(
            metavar="SOURCE",
            help="a job spec (profiled first), a profile JSON, or a models JSON; or --example NAME",
            show_default=False,
        ),
    ] = None,
    example: ExampleOption = None,
    objective: SpecObjectiveOption = None,
    search: Annotated[
        Search, typer.Option(help="search used when SOURCE is a spec", rich_help_panel=CONFIG)
    ] = Search.partial,
    out: Annotated[
        Path | None,
        typer.Option(
            help="where to write the plan (JSON); default plan.json next to SOURCE (runs/<spec name>/ for a "
            "spec); a spec's profile.json and models.json go beside it",
            rich_help_panel=IO,
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="also write the time/cost-vs-batch plot to this PNG", rich_help_panel=IO)
    ] = None,
    force: ForceOption = False,
    cluster: Annotated[
        str | None, typer.Option(help=_CLUSTER_HELP + " (when SOURCE is a spec)", rich_help_panel=CLUSTER)
    ] = None,
    workers: Annotated[
        Counts | None,
        _counts_option(
            _WORKERS_HELP + "; from a profile or models record, the models predict the counts it did not measure)"
        ),
    ] = None,
    deadline: DeadlineOption = None,
    budget: BudgetOption = None,
    pricing: PricingOption = None,
    compare_spot: Annotated[
        bool,
        typer.Option(
            "--compare-spot",
            help="also plan on the other of spot and on-demand pricing and say which is cheaper, and up to which "
            "preemption rate spot stays cheaper (needs pricing.spot_price_per_node_hour and "
            "preemption_rate_per_node_hour, e.g. via --pricing)",
            rich_help_panel=OBJECTIVE,
        ),
    ] = False,
    noise_scale: Annotated[
        float | None,
        typer.Option(
            "--noise-scale",
            help="the gradient noise scale B_noise to assume, in samples (a what-if; default: the one the profile "
            "measured); the *_to_accuracy objectives scale the epochs by (B_noise + B) / (B_noise + B0)",
            rich_help_panel=CONFIG,
        ),
    ] = None,
    method: Annotated[
        TrainMethod | None,
        typer.Option(
            help="the training method whose epochs are predicted (default: the spec's train.method); the "
            "profile's run trial measured the spec's method, so another one's step is predicted as a plain step, "
            "and the plan says so",
            rich_help_panel=CONFIG,
        ),
    ] = None,
) -> None:
    """Predict time and cost of every configuration and choose one.

    With --deadline/--budget (or the spec's constraints) the choice is the best by the
    objective among the configurations that meet both; if none does, one sentence says
    which constraint and by how much.  With spot pricing (--pricing kind=spot ...) times
    and costs are expected values with preemptions (lost work since the last checkpoint and
    a restart per preemption); --compare-spot sets spot against on-demand."""
    from tula.engine.rundir import locked

    path = names.spec_source(source, example, "plan")
    price_over = _pricing_overrides(pricing)
    job, rec, out = _plan_source(path, cluster, workers, out, plot, force)
    with locked(out.parent, on_stale=stale_note):
        shown = ConsoleObserver()
        models = _models_to_plan(path, job, rec, search, out.parent, shown)
        models = with_spec(models, _job_with_workers(as_record(models, ModelsRecord).spec, workers))  # over --workers
        p = plan_stage(
            models,
            objective.value if objective else None,
            out,
            plot,
            shown,
            constraints=_plan_constraints(models, deadline, budget),
            pricing=price_over or None,
            compare_spot=compare_spot,
            noise_scale=noise_scale,
            method=method.value if method else None,
        )
    spot = as_record(p, PlanRecord).spot_comparison
    if spot:
        say(console, ("spot vs on-demand", "bold"), ": ", spot.sentence)
    if plot is not None:
        say(console, "plot written to ", (plot, "bold"))
    say(console, "plan written to ", (out, "bold"))


def _plan_source(
    source: Path, cluster: str | None, workers: tuple[int, ...] | None, out: Path | None, plot: Path | None, force: bool
) -> tuple[JobSpec | None, ProfileRecord | ModelsRecord | None, Path]:
    """What ``tula plan`` plans from -- a spec (``--cluster`` and ``--workers`` applied) or a
    profile or models record (``--workers`` checked against its spec) -- and where the plan
    goes; every record the command will write is checked before any work."""
    from tula.engine.rundir import check_out_file

    is_spec = source.suffix.lower() in (".yaml", ".yml")
    job = _with_cluster(_job_with_workers(load_spec(source), workers), cluster) if is_spec else None
    rec = None if is_spec else read_record_of(source, (ProfileRecord, ModelsRecord))
    assert rec is None or isinstance(rec, (ProfileRecord, ModelsRecord))
    if rec is not None and workers is not None:  # one sentence for counts the record's spec refuses, before any work
        _job_with_workers(rec.spec, workers)
    out = out or (RUNS / job.name / "plan.json" if job else source.parent / "plan.json")
    check_out_file(out, force)
    if is_spec:  # every record this command will write, checked before any work
        for name in ("profile.json", "models.json"):
            check_out_file(out.parent / name, force, what="the record")
    elif isinstance(rec, ProfileRecord):  # not a spec: a record
        check_out_file(out.parent / "models.json", force, what="the record")
    if plot is not None:
        check_out_file(plot, force, what="--plot")
    return job, rec, out


def _models_to_plan(
    source: Path,
    job: JobSpec | None,
    rec: ProfileRecord | ModelsRecord | None,
    search: Search,
    into: Path,
    shown: Observer,
) -> dict | ModelsRecord:
    """The models ``tula plan`` plans with: ``job`` profiled and fitted, the profile ``rec``
    fitted, or the models ``rec`` itself; records written in ``into``."""

    if job is not None:
        prof = profile_stage(job, search.value, into / "profile.json", observer=shown)
        return fit_stage(prof, into / "models.json", shown)
    assert rec is not None, "_plan_source gives a spec or a record"
    if isinstance(rec, ProfileRecord):
        if is_partial(rec):
            raise TulaError(
                f"{source} is a partial profile (its trials did not all finish); continue it with "
                f"{_continue_profile(source)} first"
            )
        return fit_stage(rec, into / "models.json", shown)
    return rec


@app.command(
    epilog=epilog(
        "tula train --example digits --plan runs/digits-small-cnn/plan.json --epochs 5",
        "tula train my_model.yaml --method lars --workers 2 --batch 256 --resume runs/my_model/train",
    )
)
def train(
    spec: SpecArgument = None,
    example: ExampleOption = None,
    method: Annotated[
        TrainMethod | None,
        typer.Option(
            help=f"{_METHOD_HELP}; default: the spec's train.method (lbt where AGS has nothing to scale: B not above "
            "train.ags.b_small)",
            rich_help_panel=CONFIG,
        ),
    ] = None,
    workers: Annotated[
        Counts | None,
        _counts_option(
            "the number of workers N, one count (default: the --plan's choice, else train.n_workers, else "
            "train.workers' rule for the first batch)"
        ),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(
            help="global batch B (default: the --plan's choice, else train.global_batch)", rich_help_panel=CONFIG
        ),
    ] = None,
    accumulation: Annotated[
        int | None,
        typer.Option(
            help="gradient accumulation steps k: each worker's B / N samples a step run as k micro-batches of "
            "B / (N k), synchronised once (default: the --plan's choice when it gives N and B, else "
            "train.accumulation_steps, else 1)",
            rich_help_panel=CONFIG,
        ),
    ] = None,
    plan: Annotated[
        Path | None,
        typer.Option(
            help="a plan.json whose choice gives N, B and k: over the spec's train fields, under --workers, --batch "
            "and --accumulation",
            rich_help_panel=IO,
        ),
    ] = None,
    models: Annotated[
        Path | None,
        typer.Option(
            help="a models.json (tula run, tula fit): each epoch's record gets the plan's prediction beside what it "
            "measured, and train.workers.rule 'plan' and the 'goodput' schedule rank worker counts and batches by it",
            rich_help_panel=IO,
        ),
    ] = None,
    epochs: EpochsOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="directory for checkpoint.pt, metrics.jsonl, train.json, train.png; default runs/<spec name>/train",
            rich_help_panel=IO,
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="continue the training run in this directory (the one holding checkpoint.pt; it is the --out)",
            rich_help_panel=IO,
        ),
    ] = None,
    cluster: ClusterOption = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            help=f"grow the batch during training: {_SCHEDULE_HELP}; its parameters and train.workers (min, max, "
            "rule, batch_per_worker, threshold) come from the spec's train section",
            rich_help_panel=SCHEDULE,
        ),
    ] = None,
) -> None:
    """Train with DDP on N local workers at global batch B, with AGS or a baseline.

    Checkpoints after every epoch (the last two are kept, with checksums); on out-of-memory
    the run resumes from the last checkpoint at the next smaller batch.  Ctrl-C stops at
    the next step and keeps the last finished epoch; --resume DIR continues from it."""
    from tula.engine.rundir import check_out_dir

    source = names.spec_source(spec, example, "train")
    n_workers = names.one_count(workers, "train")
    if resume is not None:
        _one_out(resume, out, resume)
    job = _train_job(load_spec(source), cluster, epochs, schedule, accumulation)  # env: rank > 0 serves in it
    if resume is not None:  # before any work: the path's kind
        _resume_dir(
            resume,
            "checkpoint.pt",
            "of the training run to continue (the one holding checkpoint.pt)",
            "checkpoint.prev.pt",  # tula.engine.checkpoint.PREVIOUS: the last but one epoch's, kept
        )
        out = resume
    out = check_out_dir(out or RUNS / job.name / "train")
    job, n, b = _train_config(job, n_workers, batch, accumulation, plan, resume is not None, out)
    obs = ConsoleObserver()
    obs.hold_notes()  # the fallback's note once training starts, not before a refusal
    name = training_method(job, b, obs, method.value if method else None)  # the spec's may fall back to lbt
    fitted = load_models(models) if models is not None else None
    try:
        train_stage(job, name, n, b, out, resume=resume is not None, observer=obs, models=fitted)
    except Interrupted as err:
        err.hint = (
            f"tula train {names.spec_words(spec, example)} --method {name} --workers {n} --batch {b}"
            + (f" --accumulation {accumulation}" if accumulation is not None else "")
            + (f" --epochs {epochs}" if epochs is not None else "")
            + (f" --models {_q(models)}" if models is not None else "")
            + f" --resume {_q(out)}"
            + (f" --cluster {_q(cluster)}" if cluster else "")
            + (f" --schedule {schedule}" if schedule else "")
        )
        raise
    say(console, "records and plot in ", (out, "bold"), ": train.json, metrics.jsonl, checkpoint.pt, train.png")


def _train_job(
    job: JobSpec, cluster: str | None, epochs: int | None, schedule: str | None, accumulation: int | None
) -> JobSpec:
    """The spec with ``tula train``'s --cluster, --epochs, --schedule and --accumulation in it."""
    job = _with_cluster(job, cluster)
    if epochs is not None:
        job = spec_with(job, epochs=epochs)
    if schedule is not None:
        was = job.train.batch_schedule  # its other fields kept; the whole spec checks they belong to the kind
        now = (
            BatchScheduleSpec.model_construct(kind=schedule)
            if was is None
            else was.model_copy(update={"kind": schedule})
        )
        job = spec_with(job, train=job.train.model_copy(update={"batch_schedule": now}))
    if accumulation is not None:
        job = spec_with(job, train=job.train.model_copy(update={"accumulation_steps": accumulation}))
    return job


def _train_config(
    job: JobSpec,
    workers: int | None,
    batch: int | None,
    accumulation: int | None,
    plan: Path | None,
    resume: bool,
    out: Path,
) -> tuple[JobSpec, int, int]:
    """The (job, N, B) ``tula train`` trains at, by the one rule of every front
    (:func:`tula.core.job_rules.train_config`): --workers, --batch and --accumulation, else
    the plan's choice (as it planned it, with its accumulation, when it gives both), else the
    spec's, else the launched world's size, the workers rule's N for the first batch, or the
    checkpoint's (``resume``); one sentence when none gives both.  The job has the
    configuration's accumulation steps and the plan's sequence length
    (:func:`tula.core.job_rules.training_spec`)."""
    from tula.core.job_rules import NoConfigError, train_config, training_spec

    def world_size() -> int | None:
        from tula.engine.launch.env import joined_world_size

        return joined_world_size()

    planned = load_record(plan, expect=(PLAN_KIND,)) if plan is not None else None
    try:
        config = train_config(
            job,
            planned,
            n_workers=workers,
            global_batch=batch,
            accumulation_steps=accumulation,
            world_size=world_size if cluster_kind(job.cluster.where).fixed_world else None,
            checkpoint=(lambda: checkpoint_config(out)) if resume else None,
        )
    except NoConfigError:
        raise TulaError(
            "no configuration to train at: give --workers and --batch, set train.n_workers and "
            "train.global_batch in the spec, or pass --plan plan.json"
        ) from None
    return training_spec(job, config, planned), config.n_workers, config.global_batch


def _opt(help: str, panel: str, *decls: str, **kw):
    """An option of ``help`` in the help panel ``panel``."""
    return typer.Option(*decls, help=help, rich_help_panel=panel, **kw)


@app.command(
    epilog=epilog(
        "tula simulate runs/digits-small-cnn/models.json --workers 1,8,64,512 --bandwidth 100Gbit/s",
        "tula simulate runs/digits-small-cnn/models.json --schedule geometric:factor=2 --max-workers 64",
        "tula simulate runs/gpt/models.json --sequence-length 64,128 --parallelism fsdp --checkpointing on",
    )
)
def simulate(
    models_json: Path = typer.Argument(..., help="a models record from `tula fit` (a run's models.json)"),
    workers: Annotated[
        Counts | None,
        _counts_option(
            "worker counts N, comma-separated (default 1,2,4,...,1024); with --schedule, the largest is the "
            "workers' maximum"
        ),
    ] = None,
    batch: Annotated[
        int | None,
        _opt(
            "the constant global batch B (default: the spec's train.global_batch, else the largest profiled); "
            "with --schedule, the first batch B0 (default: train.global_batch, else search.min_batch)",
            CONFIG,
        ),
    ] = None,
    epochs: EpochsOption = None,
    noise_scale: Annotated[
        float | None,
        _opt(
            "the gradient noise scale B_noise, in samples (default: the one the profile measured): a constant "
            "batch's rows also show the time to the accuracy the spec's epochs reach at train.base_batch",
            CONFIG,
            "--noise-scale",
        ),
    ] = None,
    pricing: PricingOption = None,
    sequence_length: Annotated[
        str | None,
        _opt(
            "sequence lengths L to predict at, comma-separated, e.g. 64,128 (default: the data's own), with the "
            "per-token terms fitted from search.sequence_lengths; the rows show tokens/s",
            CONFIG,
            "--sequence-length",
            metavar="L[,L...]",
        ),
    ] = None,
    parallelism: Annotated[
        str | None,
        _opt(
            "the run variant's parallelism, ddp or fsdp (default: the models record's own; the other needs "
            "its fitted effect: a profile with train.parallelism auto)",
            CONFIG,
        ),
    ] = None,
    checkpointing: Annotated[
        str | None,
        _opt(
            "the run variant's activation checkpointing, on or off (default: the models record's own; the "
            "other needs its fitted effect: a profile with train.checkpointing auto)",
            CONFIG,
        ),
    ] = None,
    collective: Annotated[
        str | None, _opt("ring, parameter_server, tree, comma-separated (default: all three)", NETWORK)
    ] = None,
    bandwidth: Annotated[
        str | None,
        _opt("the inter-node link's bandwidth, e.g. 100Gbit/s, 25Gb/s, 10GB/s (default: the fitted 1/beta)", NETWORK),
    ] = None,
    latency: Annotated[
        str | None, _opt("the inter-node link's latency per message hop, e.g. 5us (default: the fitted alpha)", NETWORK)
    ] = None,
    intra_bandwidth: Annotated[
        str | None,
        _opt(
            "the intra-node link's bandwidth, between ranks on one node, e.g. 600GB/s (default: the fitted "
            "1/beta_intra, else the inter-node bandwidth)",
            NETWORK,
        ),
    ] = None,
    intra_latency: Annotated[
        str | None,
        _opt(
            "the intra-node link's latency per message hop, e.g. 1us (default: the fitted alpha_intra, else the "
            "inter-node latency)",
            NETWORK,
        ),
    ] = None,
    compute_speed: Annotated[
        float, _opt("per-worker compute speed relative to the profiled worker (2: twice as fast)", NETWORK)
    ] = 1.0,
    ranks_per_node: Annotated[
        int | None,
        _opt(
            "workers that share one node: the fitted co-location slowdown applies to at most that many, and the "
            "sync crosses nodes (the inter-node link) beyond them (default: the most ranks one host held when the "
            "profile spanned several hosts, else the largest N profiled, which reproduces the fit there; 1: a "
            "node per worker)",
            NETWORK,
        ),
    ] = None,
    schedule: Annotated[
        list[str] | None,
        _opt(
            "simulate batch schedules instead of a constant batch, KIND[:KEY=VALUE,...] (e.g. "
            f"geometric:factor=2,delay=5), repeatable; kinds: {SCHEDULE_KINDS}; workers follow N = "
            "clip(ceil(B / batch_per_worker), min, max)",
            SCHEDULE,
        ),
    ] = None,
    min_workers: Annotated[
        int | None, _opt("--schedule: fewest workers (default: train.workers.min, else 1)", SCHEDULE)
    ] = None,
    max_workers: Annotated[
        int | None,
        _opt("--schedule: most workers (default: train.workers.max, else the largest of --workers)", SCHEDULE),
    ] = None,
    batch_per_worker: Annotated[
        int | None,
        _opt(
            "--schedule: samples per worker in the workers rule (default: train.workers.batch_per_worker, else B0)",
            SCHEDULE,
        ),
    ] = None,
    workers_rule: Annotated[
        str | None,
        _opt(
            "--schedule: how N follows the batch: batch_per_worker (AdaDamp, N = ceil(B / batch_per_worker)) or "
            "plan (the models' best N for each batch on the simulated network); default: train.workers.rule",
            SCHEDULE,
        ),
    ] = None,
    threshold: Annotated[
        float | None,
        _opt(
            "--workers-rule plan: the predicted gain below which N stays (default: train.workers', else 0.05)",
            SCHEDULE,
        ),
    ] = None,
    accumulation: Annotated[
        int | None,
        _opt(
            "--schedule: the most accumulation steps a schedule may grow the batch through once the workers are "
            "at their most and the memory model caps the local batch (default: search.max_accumulation_steps)",
            SCHEDULE,
        ),
    ] = None,
    history: Annotated[
        Path | None,
        _opt(
            "--schedule loss_ratio/adaptive: a training run record (train.json) whose per-epoch training loss "
            "and B_simple they follow",
            SCHEDULE,
        ),
    ] = None,
    out: Annotated[Path | None, _opt("the PNG to write (default: simulate.png next to MODELS_JSON)", IO)] = None,
    force: Annotated[bool, _opt("overwrite an existing PNG at --out", IO)] = False,
) -> None:
    """Predict time and cost for clusters larger than the profiled one, without profiling.

    From a fitted models record: step, epoch and total time and cost for worker counts far
    beyond the profiled ones, per collective (ring all-reduce, parameter server, tree), for a
    constant batch or batch schedules, on the fitted network or a given one: --bandwidth and
    --latency between nodes, --intra-bandwidth and --intra-latency within a node of
    --ranks-per-node workers; at other --sequence-length and run variants (--parallelism,
    --checkpointing) where the profile fitted them.  No profiling, no torch."""
    from dataclasses import replace

    from tula.core.simulate import (
        parse_collectives,
        parse_schedule,
        parse_sequence_lengths,
        parse_workers,
        simulated_collectives,
        simulator_from_models,
        what_if,
    )
    from tula.engine.rundir import check_out_file

    colls = parse_collectives(collective)
    ns = parse_workers(workers)
    lengths = parse_sequence_lengths(sequence_length)
    scheds = [(text, *parse_schedule(text)) for text in schedule or []]
    price_over = _pricing_overrides(pricing)
    out = out or models_json.parent / "simulate.png"
    check_out_file(out, force, what="--out")
    models = load_models(models_json)
    sims = [
        simulator_from_models(
            models,
            bandwidth,
            latency,
            compute_speed,
            ranks_per_node,
            epochs,
            price_over,
            intra_bandwidth=intra_bandwidth,
            intra_latency=intra_latency,
            sequence_length=length,
            parallelism=parallelism,
            checkpointing=checkpointing,
        )
        for length in lengths or (None,)
    ]
    sim = replace(sims[0], notes=tuple(dict.fromkeys(n for one in sims for n in one.notes)))  # each length's notes
    colls = simulated_collectives(sim, None if collective is None else colls)  # FSDP's fitted sync: the fitted one
    # the run's epochs, as the what-if reads them (dicts of JSON's values)
    past = [h.model_dump(mode="json") for h in load_train(history).history] if history is not None else None
    w = what_if(
        models,
        sims,
        ns,
        colls,
        batch,
        scheds,
        past,
        min_workers,
        max_workers,
        batch_per_worker,
        noise_scale,
        accumulation,
        workers_rule,
        threshold,
    )
    show_simulation(sim, w, out)


@app.command(
    epilog=epilog(
        "tula run --example digits --epochs 1",
        "tula run --resume runs/digits-small-cnn   # continue a stopped run where it stopped",
    )
)
def run(
    spec: Annotated[
        Path | None,
        typer.Argument(
            metavar="SPEC", help="job spec (YAML); or --example NAME; not needed with --resume", show_default=False
        ),
    ] = None,
    example: ExampleOption = None,
    search: Annotated[
        Search | None,
        typer.Option(help="full or partial search (default: partial)", show_default=False, rich_help_panel=CONFIG),
    ] = None,
    objective: SpecObjectiveOption = None,
    epochs: EpochsOption = None,
    train_after: Annotated[
        bool | None,
        typer.Option(
            "--train/--no-train",
            help="after planning, train at the chosen configuration with the spec's train.method (default ags); "
            "default: --train",
            show_default=False,
            rich_help_panel=CONFIG,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="directory for profile.json, models.json, plan.json, plan.png and the training records; default "
            "runs/<spec name>",
            rich_help_panel=IO,
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="continue the run in this directory from the stage it stopped in, as it was started (finished "
            "trials are not run again; training resumes from its checkpoint)",
            rich_help_panel=IO,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(help="start over in an --out that holds an earlier run, deleting its records", rich_help_panel=IO),
    ] = False,
    cluster: ClusterOption = None,
    workers: WorkersOption = None,
) -> None:
    """The main job: profile, fit, plan, train at the choice with AGS, and report.

    Ctrl-C keeps every finished trial and epoch; `tula run --resume DIR` continues from
    the stage the run stopped in."""
    from tula.engine.rundir import check_out_dir, locked

    spec = names.spec_source(spec, example, "run", optional=True)
    asked = RunSettings(
        search.value if search else None, objective.value if objective else None, train_after
    )  # what this command line gives; None: not given
    if resume is not None:
        if out is not None and out != resume:
            raise TulaError("give the run directory once: --resume DIR continues DIR (drop --out)")
        if epochs is not None:
            raise TulaError(
                f"--resume continues the run in {resume} as it was started, with its epochs (drop --epochs)"
            )
        out = check_out_dir(resume, what="--resume")
        started, settings = continue_run(out, spec if workers is None else None, asked)
        if workers is not None:
            _same_workers(out, spec, started, workers)
        job = _with_cluster(started, cluster)
    else:
        if spec is None:
            raise TulaError(
                "give a job spec (tula run SPEC) or a shipped example (tula run --example digits), or --resume DIR "
                "to continue a run"
            )
        job = _job_with_workers(load_spec(spec), workers)
        if epochs is not None:
            job = spec_from_dict({**job.to_dict(), "epochs": epochs})
        job = _with_cluster(job, cluster)  # fail fast, before any output directory appears
        out = check_out_dir(out or RUNS / job.name)
        settings = RunSettings(asked.search or Search.partial.value, asked.objective, asked.train is not False)
        if not force:
            refuse_existing_run(out)
    with locked(out, on_stale=stale_note):
        if resume is None:
            start_run(out, job, settings, clear=force)
        from tula.engine.launch.clusters import open_launcher

        try:
            with open_launcher(job) as launcher:  # one cluster for every stage
                _run_stages(job, out, settings, resume is not None, launcher)
        except Interrupted as err:
            err.hint = f"tula run --resume {_q(out)}" + (f" --cluster {_q(cluster)}" if cluster else "")
            raise


def _same_workers(out: Path, spec: Path | None, started: JobSpec, workers: tuple[int, ...]) -> None:
    """``tula run --resume DIR --workers N,...``: the counts the run in ``out`` was started with
    (and ``spec``, when given again, with them the same job), else one sentence."""
    was = ",".join(map(str, started.search.cluster_sizes))  # the manifest's spec, checked
    given = ",".join(map(str, workers))
    if given != was:
        raise RunDirError(
            f"the run in {out} was started with --workers {was}; --resume continues it as it was started, so drop "
            f"--workers {given} (or start a new run with another --out)"
        )
    if spec is not None and not same_job(_job_with_workers(load_spec(spec), workers), started):
        raise RunDirError(
            f"{spec} differs from the spec the run in {out} was started with; resume without SPEC, or start a new "
            "run with another --out"
        )


def _run_stages(job: JobSpec, out: Path, settings: RunSettings, resuming: bool, launcher) -> None:
    search, objective, train_after = settings.search, settings.objective, settings.train
    assert search is not None and train_after is not None, "a run's settings: run.json's (checked) or tula run's"

    run_pipeline(
        job,
        out,
        search=search,
        objective=objective,
        train_after=train_after,
        resuming=resuming,
        launcher=launcher,
        observer=ConsoleObserver(),
    )
    files = ["profile.json", "models.json", "plan.json", "plan.png"]
    if train_after:
        files += ["train/train.json", "train/train.png", "train/metrics.jsonl"]
    say(console, "records and plots in ", (out, "bold"), f": {', '.join(files)}")


# --------------------------------------------------------------------------- a spec before any run
@app.command(epilog=epilog("tula check my_model.yaml", "tula check --example digits"))
def check(spec: SpecArgument = None, example: ExampleOption = None) -> None:
    """Check a job spec without profiling: its fields, factories and a forward pass on two samples.

    Loads and validates the spec, imports the model, data and loss factories it names, builds
    the model and the data sets and runs the model and the loss on two training samples, in
    this process (no workers are started).  A problem is one sentence and exit code 2."""
    from rich.table import Table

    from tula.engine.check import check_job
    from tula.engine.interrupts import import_torch

    job = load_spec(names.spec_source(spec, example, "check"))
    import_torch()
    found = check_job(job)
    t = Table(title=f"tula check: {plain(job.name)}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("found")
    rows = {
        "model": found.model,
        "parameters": f"{found.parameters:,}",
        "data set": found.data,
        "samples": f"{found.train_size:,} to train, {found.test_size:,} to test",
        "sample shape": " x ".join(map(str, found.sample_shape)) or "a scalar",
        "classes": str(found.classes) if found.classes else "not given (e.g. a regression)",
        "loss": found.loss,
        **_check_variant_rows(found),
    }
    for what, value in rows.items():
        t.add_row(what, plain(value))
    console.print(t)
    say(console, ("ok", "bold green"), ": the spec's model takes its data and the loss scores it")


def _check_variant_rows(found: CheckResult) -> dict[str, str]:
    """``tula check``'s rows for the sequence lengths checked (none for data without a length),
    the blocks checkpointing wraps and the parallelism."""
    rows = {}
    if found.sequence_lengths:
        limit = "" if found.positional_limit is None else f" (the model takes up to {found.positional_limit:,})"
        rows["sequence lengths"] = ", ".join(map(str, found.sequence_lengths)) + limit
    ckpt = found.checkpointing
    if ckpt != "off":
        blocks = f"{found.checkpoint_blocks} block(s) of {', '.join(found.block_classes)}"
        ckpt = f"{ckpt}: {blocks}" + (" (the plan chooses whether to checkpoint them)" if ckpt == "auto" else "")
    rows["checkpointing"] = ckpt
    how = found.parallelism
    if how == "auto":
        how = "auto: ddp only, " + found.fsdp_obstacle if found.fsdp_obstacle else "auto: the plan chooses ddp or fsdp"
    rows["parallelism"] = how
    return rows


examples_app = typer.Typer(
    help="The shipped example specs: a table of them; `tula examples copy NAME` writes one to edit.",
    invoke_without_command=True,
    no_args_is_help=False,
    epilog=epilog("tula examples", "tula examples copy digits my_model.yaml"),
)
app.add_typer(examples_app, name="examples")


@examples_app.callback()
def _examples(ctx: typer.Context) -> None:
    """The shipped example specs: a table of them; `tula examples copy NAME` writes one to edit."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    import tula.examples as examples

    t = Table(title="Tula's example specs (tula run --example NAME)")
    t.add_column("name", style="bold")
    t.add_column("what it trains")
    for name in examples.names():
        t.add_row(plain(name), plain(examples.summary(name)))
    console.print(t)


@examples_app.command(
    "copy", epilog=epilog("tula examples copy digits", "tula examples copy mnist1d specs/my_model.yaml --force")
)
def examples_copy(
    name: str = typer.Argument(..., help="an example's name (`tula examples` lists them)"),
    dest: Path = typer.Argument(None, help="where to write it (default: NAME.yaml here)", show_default=False),
    force: Annotated[bool, typer.Option(help="overwrite an existing file at DEST", rich_help_panel=IO)] = False,
) -> None:
    """Write an example spec to a file to edit, then run it with `tula run FILE`."""
    import tula.examples as examples

    written = examples.copy(name, dest, force=force)
    say(console, "wrote ", (written, "bold"), f"; edit it, check it with `tula check {_q(written)}`, then run it")


spec_app = typer.Typer(
    help="The job spec's format: `tula spec schema` prints its JSON Schema.",
    no_args_is_help=True,
    epilog=epilog("tula spec schema --out tula-spec.schema.json"),
)
app.add_typer(spec_app, name="spec")


@spec_app.command(
    "schema",
    epilog=epilog("tula spec schema > tula-spec.schema.json", "tula spec schema --out tula-spec.schema.json"),
)
def spec_schema(
    out: Annotated[
        Path | None, typer.Option(help="write it to this file instead of the output", rich_help_panel=IO)
    ] = None,
    force: Annotated[bool, typer.Option(help="overwrite an existing file at --out", rich_help_panel=IO)] = False,
) -> None:
    """Print the JSON Schema of a job spec (for an editor's completion and checks)."""
    import json

    text = json.dumps(JobSpec.model_json_schema(), indent=2) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    from tula.engine.rundir import check_out_file

    check_out_file(out, force)
    out.write_text(text)
    say(console, "schema written to ", (out, "bold"))


# --------------------------------------------------------------------------- the service and its clients
_SERVER_HELP = "the Tula service's URL (default: $TULA_SERVER, else http://127.0.0.1:8787)"
_TOKEN_HELP = "the service's bearer token (default: $TULA_TOKEN)"
ServerOption = Annotated[str | None, typer.Option(help=_SERVER_HELP, rich_help_panel=SERVICE)]
TokenOption = Annotated[str | None, typer.Option(help=_TOKEN_HELP, rich_help_panel=SERVICE)]


@app.command(
    epilog=epilog(
        "tula serve --home /srv/tula --max-concurrent-jobs 2",
        "TULA_TOKEN=secret tula serve --host 0.0.0.0 --cluster tcp://scheduler:8786",
    )
)
def serve(
    host: Annotated[
        str | None,
        _opt("address to listen on (default 127.0.0.1; beyond loopback a token is required)", SERVICE),
    ] = None,
    port: Annotated[int | None, _opt("port (default 8787)", SERVICE)] = None,
    token: Annotated[str | None, _opt("bearer token every request must carry (default: $TULA_TOKEN)", SERVICE)] = None,
    home: Annotated[
        Path | None,
        _opt(
            "data directory: job records, checkpoints, plots and the SQLite store (default: $TULA_HOME, else ~/.tula)",
            IO,
        ),
    ] = None,
    db_url: Annotated[
        str | None,
        _opt(
            "SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/db (default: $TULA_DB_URL, else "
            "sqlite:///HOME/tula.db)",
            IO,
        ),
    ] = None,
    max_concurrent_jobs: Annotated[
        int | None, _opt("jobs running at once (default 1); the rest queue", CLUSTER)
    ] = None,
    cluster: Annotated[
        str | None,
        _opt(
            "where jobs run (default: $TULA_CLUSTER, else local): local, dask (a LocalCluster per job), "
            "tcp://HOST:PORT (your Dask scheduler) or a dask-jobqueue YAML file; a submission cannot name one",
            CLUSTER,
        ),
    ] = None,
) -> None:
    """Run the Tula service: a REST API (OpenAPI at /docs) and a dashboard at /.

    Jobs submitted with `tula submit` or POST /v1/jobs run in runner processes, one per job;
    every record goes into the store, and a job whose model was measured before is planned
    from the store without profiling.  Settings also come from TULA_* environment variables
    (TULA_MAX_EPOCHS, TULA_MAX_CONFIGS, TULA_MAX_REQUEST_BYTES, TULA_IMPORT_ALLOWLIST,
    TULA_DATA_ROOTS, TULA_STALE_AFTER_S, ...).  Ctrl-C stops the service; running jobs stop at
    their next step and resume when it starts again."""
    from tula.service.settings import settings_from

    settings = settings_from(
        host=host,
        port=port,
        token=token,
        home=home,
        db_url=db_url,
        max_concurrent_jobs=max_concurrent_jobs,
        cluster=cluster,
    )
    ready_to_serve(settings)
    serve_until_stopped(settings)


def _client(server: str | None, token: str | None) -> Client:
    from tula.service.client import Client

    return Client(server, token)


@app.command(
    epilog=epilog(
        "tula submit --example digits --wait",
        "tula submit my_model.yaml --objective cost --no-train --server http://tula.example:8787",
    )
)
def submit(
    spec: SpecArgument = None,
    example: ExampleOption = None,
    server: ServerOption = None,
    token: TokenOption = None,
    search: SearchOption = Search.partial,
    objective: SpecObjectiveOption = None,
    train_after: Annotated[bool, _opt("train at the chosen configuration", CONFIG, "--train/--no-train")] = True,
    wait: Annotated[bool, _opt("follow the job until it ends, with a progress bar", SERVICE)] = False,
    workers: WorkersOption = None,
) -> None:
    """Submit a job spec to a Tula service; prints the job's id (and follows it with --wait)."""
    # the local commands' checks, before anything is sent
    job = _job_with_workers(load_spec(names.spec_source(spec, example, "submit")), workers)
    c = _client(server, token)
    rec = c.submit(
        job.to_dict(), search=search.value, objective=objective.value if objective else None, train=train_after
    )
    say(console, "submitted job ", (rec.id, "bold"), f" ({job.name}): {c.base}{rec.url}")
    if wait:
        try:
            _follow(c, rec.id)
        except Interrupted as err:
            err.hint = f"tula status {rec.id}" + (f" --server {_q(server)}" if server else "")
            raise


def _follow(c: Client, job_id: str) -> None:
    """Follow a service job with a progress bar until it ends.  SIGINT/SIGTERM stop the
    following, never the job: the first one is a request the loop sees at its next poll (no
    exception thrown into rich's or httpx's middle, which could leave a lock held), a second
    one stops at once."""
    import threading

    from tula.engine import interrupts
    from tula.report import plan_table

    stop = threading.Event()
    try:
        with interrupts.graceful_signals():
            forget = interrupts.on_stop(lambda _signum: stop.set())
            try:
                with Progress(
                    TextColumn("{task.description}", style="bold", markup=False),
                    BarColumn(),
                    TextColumn("{task.percentage:>3.0f}%"),
                    TimeElapsedColumn(),
                    console=err_console,
                ) as bar:
                    task = bar.add_task("queued", total=1.0)
                    while not stop.is_set():
                        j = c.job(job_id)
                        bar.update(
                            task,
                            completed=j.progress or 0.0,
                            description=plain(f"{j.state}: {j.message or ''}")[:80],
                        )
                        if j.ended:
                            break
                        stop.wait(1.0)
            finally:
                forget()
            signum = interrupts.requested()
    except KeyboardInterrupt:  # the second signal
        import signal

        signum = signal.SIGINT
    if signum:
        raise Interrupted(f"stopped following job {job_id}, which goes on in the service", signum)
    if j.state == "done":
        plan = as_record(c.record(job_id, "plan"), PlanRecord)
        console.print(plan_table(plan))
        say(console, ("choice", "bold green"), ": ", plan.reason)
    elif j.state == "failed":
        raise TulaError(f"job {job_id} failed: {j.error}")
    else:
        raise TulaError(f"job {job_id} was cancelled")


@app.command(epilog=epilog("tula status", "tula status JOB_ID --server http://tula.example:8787"))
def status(
    job_id: str = typer.Argument(None, help="a job id; without it, the jobs table"),
    server: ServerOption = None,
    token: TokenOption = None,
    state: Annotated[
        str | None, _opt("only jobs in this state (queued, profiling, ..., done, failed)", SERVICE)
    ] = None,
    limit: Annotated[int, _opt("at most this many jobs", SERVICE)] = 20,
) -> None:
    """The jobs of a Tula service, or one job with its plan and training summary."""
    from tula.service.client import job_detail, jobs_table

    c = _client(server, token)
    if job_id is None:
        page = c.jobs(state=state, limit=limit)
        console.print(jobs_table(page))
        return
    job = c.job(job_id)
    records = {name: c.record(job_id, name, missing_ok=True) for name in ("plan", "train")}
    for renderable in job_detail(job, records):
        say(console, renderable) if isinstance(renderable, Text) else console.print(renderable)


@app.command(
    epilog=epilog(
        "tula replan JOB_ID --objective cost --pricing price_per_node_hour=3.2",
        "tula replan JOB_ID --workers 1,2,4,8,16 --deadline 8h --budget 500",
    )
)
def replan(
    job_id: str = typer.Argument(..., help="a job of the service whose models are fitted"),
    objective: Annotated[Objective | None, _opt(_OBJECTIVE_HELP + " (default: the job's objective)", OBJECTIVE)] = None,
    deadline: DeadlineOption = None,
    budget: BudgetOption = None,
    pricing: PricingOption = None,
    workers: Annotated[
        Counts | None,
        _counts_option("worker counts N to plan over, comma-separated, e.g. 1,2,4,8,16 (default: the job's)"),
    ] = None,
    epochs: EpochsOption = None,
    noise_scale: Annotated[
        float | None,
        _opt("the gradient noise scale to assume (default: the profiled one)", CONFIG, "--noise-scale"),
    ] = None,
    use_measured: Annotated[
        bool,
        _opt(
            "scale the predicted epochs by what the job's finished training run measured against its prediction",
            CONFIG,
            "--use-measured",
        ),
    ] = False,
    server: ServerOption = None,
    token: TokenOption = None,
) -> None:
    """Plan a service job again from its stored models (no profiling), e.g. --objective cost."""
    from tula.report import plan_table

    price_over = _pricing_overrides(pricing)
    if deadline is not None:
        _deadline_s(deadline)  # the service takes the duration as written
    _check_budget(budget)
    body: dict = {
        "objective": objective.value if objective else None,
        "epochs": epochs,
        "noise_scale": noise_scale,
        "deadline": deadline,
        "budget": budget,
        "cluster_sizes": list(workers) if workers is not None else None,
    }
    if use_measured:
        body["use_measured"] = True
    c = _client(server, token)
    if price_over:  # the job's pricing with the fields given replaced (the service takes a whole pricing)
        body["pricing"] = {**spec_from_dict(c.job(job_id).spec).pricing.model_dump(mode="json"), **price_over}
    p = as_record(c.replan(job_id, {k: v for k, v in body.items() if v is not None}), PlanRecord)
    console.print(plan_table(p))
    say(console, ("choice", "bold green"), ": ", p.reason)


def main() -> None:
    # the library's loggers (tula.*) on stderr: WARNING and above, or the level $TULA_LOG_LEVEL names
    configure_logging(default=logging.WARNING)
    try:
        code = _run_command()
    except SystemExit as ex:  # a command that ended itself
        code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    except KeyboardInterrupt:  # a second Ctrl-C while the first one's sentence was printed
        code = 130
    env = sys.modules.get("tula.engine.launch.env")  # a launched world (--cluster env) was joined
    if env is not None:
        env.finish(code)  # its other ranks end with this command's exit code
    sys.exit(code)


def _run_command() -> int:
    """The command line's command; its exit code (2: the user's input, 130/143: a signal)."""
    if len(sys.argv) == 1:  # bare `tula`: the help, not an error
        sys.argv.append("--help")
    try:
        names.refuse_old_spellings(sys.argv[1:])  # one sentence naming the new one, before parsing
        code = app(standalone_mode=False)
    except TulaError as err:
        message = err.spelled(names.spell) if isinstance(err, OptionError) else err  # the core's options as flags
        say(err_console, ("error:", "bold red"), " ", message, soft_wrap=True)
        return 2
    except Interrupted as err:
        hint = getattr(err, "hint", None)
        env = sys.modules.get("tula.engine.launch.env")
        if hint and env is not None and env.started_by():  # the same command, on every rank of a new world
            hint += f" (on every rank, started by {env.started_by()} as before)"
        say(
            err_console,
            ("interrupted:", "bold yellow"),
            " ",
            err,
            *(("; continue with: ", hint) if hint else ()),
            soft_wrap=True,
        )
        return err.exit_code
    except KeyboardInterrupt:
        return _stopped_at_once()
    except typer.Abort:
        return 130
    except typer.Exit as ex:
        return ex.exit_code or 0
    except typer.TyperException as err:  # usage errors (bad option values) in non-standalone mode
        if not hasattr(err, "format_message"):
            raise
        message = plain(err.format_message()).replace("Value error, ", "")
        say(err_console, ("error:", "bold red"), " ", message, " (see --help)", soft_wrap=True)
        return getattr(err, "exit_code", 2)
    # Outside standalone mode typer turns a KeyboardInterrupt in a command into the return
    # value 130 (and an explicit typer.Exit into its code): Ctrl-C is never success.
    if code == 130:
        return _stopped_at_once()
    return code if isinstance(code, int) else 0


def _stopped_at_once() -> int:
    """Ctrl-C where no stop was asked for yet, or a second one while a run stops."""
    say(
        err_console,
        ("interrupted:", "bold yellow"),
        " stopped at once by SIGINT; what finished before it (a trial's result, an epoch's "
        "checkpoint, a record) is kept",
    )
    return 130


if __name__ == "__main__":
    main()
