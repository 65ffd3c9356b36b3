"""Command line: ``tula profile``, ``tula fit``, ``tula plan``, ``tula train``, ``tula run``.

Errors a user can cause print one sentence and exit with code 2; SIGINT/SIGTERM stop the
ranks at the next step boundary, keep what finished, print what was kept and the command
that continues, and exit 130/143.  Records already measured are written before the next
stage starts, so a later failure loses nothing.  Output directories are locked while a
command writes into them, and no command overwrites a record it did not create unless
given ``--force``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__
from .errors import Interrupted, RunDirError, TulaError
from .records import epoch_score
from .registry import METHOD_NAMES
from .registry import METHODS as METHOD_TABLE
from .schedules import SCHEDULES
from .spec import JobSpec, load_spec, spec_from_dict

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Tula: profile short DDP runs of your model, fit memory and performance models, "
                       "plan the global batch and cluster size that minimise time, cost, or sit at the knee, "
                       "and train there with adaptive gradient scaling.  Start with `tula run SPEC`.")
# rich falls back to 80 columns when the output is not a terminal (make demo | tee, CI logs),
# which wraps the plan table; give such output room unless COLUMNS says otherwise
_WIDTH = None if Console().is_terminal or "COLUMNS" in os.environ else 120
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)

RUNS = Path("runs")
RUN_FILES = ("run.json", "profile.json", "models.json", "plan.json", "plan.png")


class Search(str, Enum):
    full = "full"
    partial = "partial"


class Objective(str, Enum):
    time = "time"
    cost = "cost"
    knee = "knee"


TrainMethod = Enum("TrainMethod", {m: m for m in METHOD_NAMES}, type=str)  # type: ignore[misc]
_METHOD_HELP = "; ".join(f"{m.name}: {m.summary}" for m in METHOD_TABLE.values())
_SCHEDULE_HELP = "; ".join(f"{s.name}: {s.summary}" for s in SCHEDULES.values())


def _version(value: bool) -> None:
    if value:
        console.print(f"tula {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print Tula's version and exit")) -> None:
    """Tula: plan and run distributed large-batch training."""


_CLUSTER_HELP = ("where the ranks run: local (processes on this machine), dask (a Dask LocalCluster started for "
                 "the run), tcp://HOST:PORT (an existing Dask scheduler) or a dask-jobqueue YAML file (SLURM/PBS); "
                 "default: the spec's cluster.where")


def _with_cluster(job: JobSpec, cluster: str | None) -> JobSpec:
    """The spec with ``--cluster`` in its ``cluster.where`` (records say where they ran)."""
    if cluster is None:
        return job
    d = job.to_dict()
    d["cluster"] = {**d["cluster"], "where": cluster}
    return spec_from_dict(d)


def _same_job(a: dict, b: dict) -> bool:
    """Two specs describe the same job wherever it runs (the cluster may change on resume)."""
    return {k: v for k, v in a.items() if k != "cluster"} == {k: v for k, v in b.items() if k != "cluster"}


def _q(p: Path | str) -> str:
    return shlex.quote(str(p))


def _stale_note(info: dict) -> None:
    err_console.print(f"note: taking over the lock left by a run that is no longer alive (pid {info.get('pid')}, "
                      f"`{info.get('command')}`)")


# --------------------------------------------------------------------------- stages with progress
def _profile_with_progress(spec: JobSpec, search: str, save_to: Path, previous: dict | None = None,
                           launcher=None) -> dict:
    """Profile with a progress bar and write the record to ``save_to``; if a worker fails or
    the run is interrupted mid-way, the trials finished before it are written there first."""
    from .profile import ProfileFailed, ProfileInterrupted, profile
    from .records import save_record

    with Progress(TextColumn("[bold]profiling[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=False) as bar:
        task = bar.add_task("memory probe", total=None)

        def on_event(ev: dict) -> None:
            if ev.get("type") == "plan":
                bar.update(task, total=ev["total"], completed=ev.get("done", 0), description=f"{ev['total']} trials")
            elif ev.get("type") == "trial":
                bar.update(task, advance=1, description=f"N={ev['n_workers']} B={ev['global_batch']}: {ev['status']}")
                if not err_console.is_terminal:  # a log (CI, a scheduler's file) gets a line per trial
                    err_console.print(f"trial N={ev['n_workers']} B={ev['global_batch']}: {ev['status']}")

        try:
            rec = profile(spec, search, launcher=launcher, on_event=on_event, previous=previous)
        except (ProfileFailed, ProfileInterrupted) as err:
            if err.record is None:
                raise
            save_record(err.record, save_to)
            n_ok = sum(t["status"] in ("ok", "oom", "skipped") for t in err.record["trials"])
            kept = f"the {n_ok} trial(s) finished before it are saved in {save_to}"
            if isinstance(err, ProfileInterrupted):
                raise Interrupted(f"{err}; {kept}", err.signum) from None
            raise TulaError(f"{err}; {kept}") from None
        bar.update(task, description="done")
    save_record(rec, save_to)
    return rec


def _fit_and_save(prof: dict, save_to: Path) -> dict:
    from .fit import fit_models
    from .records import save_record
    from .report import models_table

    models = fit_models(prof)
    save_record(models, save_to)
    console.print(models_table(models))
    return models


def _train_with_progress(spec: JobSpec, method: str, n_workers: int, global_batch: int, out: Path,
                         resume: bool, launcher=None) -> dict:
    """Train with a progress bar; write train.json and train.png into ``out``."""
    from .records import save_record
    from .report import plot_training, train_table
    from .train import train

    # the bar appears once the configuration is validated and the workers start
    bar = Progress(TextColumn("[bold]training[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=err_console, transient=False)
    task = bar.add_task(f"{method} N={n_workers} B={global_batch}", total=None)

    def on_event(ev: dict) -> None:
        kind = ev.get("type")
        if kind == "start":
            bar.start()
            bar.update(task, total=ev["epochs"] * ev["steps_per_epoch"], completed=0,
                       description=f"{method} N={ev['n_workers']} B={ev['global_batch']}")
        elif kind == "step":
            bar.update(task, completed=ev["epoch"] * ev["steps_per_epoch"] + ev["step"])
        elif kind == "epoch":
            bar.update(task, completed=ev["epoch"] * ev["steps"],
                       description=f"{method} N={ev['n_workers']} B={ev['global_batch']} epoch {ev['epoch']}, "
                                   "{} {}".format(*epoch_score(ev)[::2]))
            if not err_console.is_terminal:  # a log gets a line per epoch
                err_console.print(f"epoch {ev['epoch']}: train loss {ev['train_loss']:.4f}, test "
                                  "{} {}".format(*epoch_score(ev)[::2]) + f", {ev['epoch_time_s']:.2f} s")
        elif kind == "note":
            bar.console.print(f"[yellow]note[/]: {ev['message']}")
        elif kind == "resize":
            bar.console.print(f"after epoch {ev['at_epoch']}: the batch schedule moves to global batch "
                              f"{ev['global_batch']} on {ev['n_workers']} worker(s) (a new world)")
        elif kind == "fallback":
            bar.console.print(f"[yellow]out of memory at global batch {ev['from_global_batch']}[/]: resuming "
                              f"from epoch {ev['at_epoch']} at global batch {ev['to_global_batch']}")

    try:
        run = train(spec, method, n_workers, global_batch, out, resume=resume, launcher=launcher, on_event=on_event)
    finally:
        bar.stop()
    save_record(run, out / "train.json")
    console.print(train_table(run))
    plot_training(run, out / "train.png")
    return run


def _train_summary(run: dict) -> str:
    tr = run.get("traces") or {}
    extra = f", {tr['scaled_fraction']:.0%} of steps scaled" if "scaled_fraction" in tr else ""
    return (f"{run['method']} at N={run['n_workers']}, B={run['global_batch']}: final test "
            "{} {}".format(*epoch_score(run['final'])[::2]) + f" after {run['epochs']} epochs "
            f"({run['steps_done']} steps, {run['train_s']:.0f} s{extra})")


# --------------------------------------------------------------------------- commands
@app.command()
def profile(spec: Path = typer.Argument(..., help="job spec (YAML)"),
            search: Search = typer.Option(Search.partial, help="full: every candidate (N, B); partial: only the "
                                          "extreme cluster sizes and batches (paper §III-A2)"),
            out: Path = typer.Option(None, help="where to write the profile record (JSON); default "
                                     "runs/<spec name>/profile.json"),
            resume: bool = typer.Option(False, help="continue the partial profile in --out (an interrupted or failed "
                                        "one): its finished trials are kept, only the rest run"),
            force: bool = typer.Option(False, help="overwrite an existing record at --out"),
            cluster: str = typer.Option(None, help=_CLUSTER_HELP)) -> None:
    """Run short real DDP trials and record step, compute and sync time and peak memory."""
    from .records import PROFILE_KIND, load_record
    from .report import trials_table
    from .rundir import check_out_file, locked

    job = _with_cluster(load_spec(spec), cluster)
    out = out or RUNS / job.name / "profile.json"
    previous = None
    if resume:
        previous = load_record(out, expect=(PROFILE_KIND,))
        if not _same_job(previous["spec"], job.to_dict()):
            raise RunDirError(f"{out} was profiled from another spec than {spec}; give that spec, or profile into "
                              "another --out")
    else:
        check_out_file(out, force)
    with locked(out.parent, on_stale=_stale_note):
        try:
            rec = _profile_with_progress(job, search.value, out, previous)
        except Interrupted as err:
            err.hint = f"tula profile {_q(spec)} --search {search.value} --out {_q(out)} --resume" + \
                (f" --cluster {_q(cluster)}" if cluster else "")
            raise
    console.print(trials_table(rec))
    console.print(f"profile written to [bold]{out}[/]")


@app.command()
def fit(profile_json: Path = typer.Argument(..., help="a profile record from `tula profile`"),
        out: Path = typer.Option(None, help="where to write the fitted models (JSON); default models.json next "
                                 "to the profile"),
        force: bool = typer.Option(False, help="overwrite an existing record at --out")) -> None:
    """Fit the memory and performance models of a profile; the result re-plans without profiling."""
    from .records import PROFILE_KIND, load_record
    from .rundir import check_out_file

    out = out or profile_json.parent / "models.json"
    check_out_file(out, force)
    rec = load_record(profile_json, expect=(PROFILE_KIND,))
    _fit_and_save(rec, out)
    console.print(f"models written to [bold]{out}[/]")


@app.command()
def plan(source: Path = typer.Argument(..., help="a job spec (profiled first), a profile JSON, or a models JSON"),
         objective: Objective = typer.Option(None, help="time, cost or knee (default: the spec's objective)"),
         search: Search = typer.Option(Search.partial, help="search used when SOURCE is a spec"),
         out: Path = typer.Option(None, help="where to write the plan (JSON); default plan.json next to SOURCE "
                                  "(runs/<spec name>/ for a spec); a spec's profile.json and models.json go "
                                  "beside it"),
         plot: Path = typer.Option(None, help="also write the time/cost-vs-batch plot to this PNG"),
         force: bool = typer.Option(False, help="overwrite existing records"),
         cluster: str = typer.Option(None, help=_CLUSTER_HELP + " (when SOURCE is a spec)")) -> None:
    """Predict time and cost of every configuration and choose one."""
    from .plan import make_plan
    from .records import MODELS_KIND, PROFILE_KIND, load_record, save_record
    from .report import plan_table, plot_plan, trials_table
    from .rundir import check_out_file, locked

    is_spec = source.suffix.lower() in (".yaml", ".yml")
    job = _with_cluster(load_spec(source), cluster) if is_spec else None
    rec = None if is_spec else load_record(source, expect=(PROFILE_KIND, MODELS_KIND))
    out = out or (RUNS / job.name / "plan.json" if job else source.parent / "plan.json")
    check_out_file(out, force)
    if is_spec:  # every record this command will write, checked before any work
        for name in ("profile.json", "models.json"):
            check_out_file(out.parent / name, force, what="the record")
    elif rec["kind"] == PROFILE_KIND:
        check_out_file(out.parent / "models.json", force, what="the record")
    if plot is not None:
        check_out_file(plot, force, what="--plot")
    with locked(out.parent, on_stale=_stale_note):
        if is_spec:
            prof = _profile_with_progress(job, search.value, out.parent / "profile.json")
            console.print(trials_table(prof))
            models = _fit_and_save(prof, out.parent / "models.json")
        elif rec["kind"] == PROFILE_KIND:
            models = _fit_and_save(rec, out.parent / "models.json")
        else:
            models = rec
        p = make_plan(models, objective.value if objective else None)
        save_record(p, out)
    console.print(plan_table(p))
    console.print(f"[bold green]choice[/]: {p['reason']}")
    if plot is not None:
        plot_plan(p, models["trials"], plot)
        console.print(f"plot written to [bold]{plot}[/]")
    console.print(f"plan written to [bold]{out}[/]")


@app.command()
def train(spec: Path = typer.Argument(..., help="job spec (YAML)"),
          method: TrainMethod = typer.Option(None, help=f"{_METHOD_HELP}; default: the spec's train.method"),
          workers: int = typer.Option(None, help="number of workers N (default: train.n_workers, else the plan's)"),
          batch: int = typer.Option(None, help="global batch B (default: train.global_batch, else the plan's)"),
          plan: Path = typer.Option(None, help="a plan.json whose choice gives N and B"),
          epochs: int = typer.Option(None, help="override the spec's epochs"),
          out: Path = typer.Option(None, help="directory for checkpoint.pt, metrics.jsonl, train.json, train.png; "
                                   "default runs/<spec name>/train"),
          resume: bool = typer.Option(False, help="continue the checkpoint in --out"),
          cluster: str = typer.Option(None, help=_CLUSTER_HELP),
          schedule: str = typer.Option(None, help=f"grow the batch during training: {_SCHEDULE_HELP}; its "
                                       "parameters and train.workers (min, max, batch_per_worker) come from the "
                                       "spec's train section")) -> None:
    """Train with DDP on N local workers at global batch B, with AGS or a baseline.

    Checkpoints after every epoch (the last two are kept, with checksums); on out-of-memory
    the run resumes from the last checkpoint at the next smaller batch.  Ctrl-C stops at
    the next step and keeps the last finished epoch; --resume continues from it."""
    from .records import PLAN_KIND, load_record
    from .rundir import check_out_dir

    job = _with_cluster(load_spec(spec), cluster)
    if epochs is not None:
        job = spec_from_dict({**job.to_dict(), "epochs": epochs})
    if schedule is not None:
        d = job.to_dict()
        d["train"]["batch_schedule"] = {**(d["train"].get("batch_schedule") or {}), "kind": schedule}
        job = spec_from_dict(d)
    out = check_out_dir(out or RUNS / job.name / "train")
    n = workers if workers is not None else job.train.n_workers
    b = batch if batch is not None else job.train.global_batch
    if plan is not None:
        rec = load_record(plan, expect=(PLAN_KIND,))
        n = rec["choice"]["n_workers"] if n is None else n
        b = rec["choice"]["global_batch"] if b is None else b
    if (n is None or b is None) and resume:
        from .checkpoint import checkpoint_meta

        meta = checkpoint_meta(out)
        n, b = (meta["n_workers"] if n is None else n), (meta["global_batch"] if b is None else b)
    if n is None or b is None:
        raise TulaError("no configuration to train at: give --workers and --batch, set train.n_workers and "
                        "train.global_batch in the spec, or pass --plan plan.json")
    name = method.value if method else job.train.method
    try:
        run = _train_with_progress(job, name, n, b, out, resume)
    except Interrupted as err:
        err.hint = (f"tula train {_q(spec)} --method {name} --workers {n} --batch {b}"
                    + (f" --epochs {epochs}" if epochs is not None else "") + f" --out {_q(out)} --resume"
                    + (f" --cluster {_q(cluster)}" if cluster else "") + (f" --schedule {schedule}" if schedule else ""))
        raise
    console.print(f"[bold green]trained[/]: {_train_summary(run)}")
    console.print(f"records and plot in [bold]{out}[/]: train.json, metrics.jsonl, checkpoint.pt, train.png")


def _existing_run_files(out: Path) -> list[str]:
    return [n for n in (*RUN_FILES, "train") if (out / n).exists()]


@app.command()
def run(spec: Path = typer.Argument(None, help="job spec (YAML); not needed with --resume"),
        search: Search = typer.Option(Search.partial, help="full or partial search"),
        objective: Objective = typer.Option(None, help="time, cost or knee (default: the spec's objective)"),
        train_after: bool = typer.Option(True, "--train/--no-train", help="after planning, train at the chosen "
                                         "configuration with the spec's train.method (default ags)"),
        out: Path = typer.Option(None, help="directory for profile.json, models.json, plan.json, plan.png and "
                                 "the training records; default runs/<spec name>"),
        resume: Path = typer.Option(None, help="continue the run in this directory from the stage it stopped in "
                                    "(finished trials are not run again; training resumes from its checkpoint)"),
        force: bool = typer.Option(False, help="start over in an --out that holds an earlier run, deleting its "
                                   "records"),
        cluster: str = typer.Option(None, help=_CLUSTER_HELP)) -> None:
    """The main job: profile, fit, plan, train at the choice with AGS, and report.

    Ctrl-C keeps every finished trial and epoch; `tula run --resume DIR` continues from
    the stage the run stopped in."""
    from .records import RUN_KIND, load_record, save_record
    from .rundir import check_out_dir, locked

    if resume is not None:
        if out is not None and out != resume:
            raise TulaError("give the run directory once: --resume DIR continues DIR (drop --out)")
        out = check_out_dir(resume, what="--resume")
        if not (out / "run.json").is_file():
            raise RunDirError(f"{str(out)!r} holds no Tula run to continue (no run.json); start one with "
                              "`tula run SPEC --out DIR`")
        manifest = load_record(out / "run.json", expect=(RUN_KIND,))
        job = _with_cluster(spec_from_dict(manifest["spec"]), cluster)
        if spec is not None and not _same_job(load_spec(spec).to_dict(), manifest["spec"]):
            raise RunDirError(f"{spec} differs from the spec the run in {out} was started with; resume without "
                              "SPEC, or start a new run with another --out")
        search_v, objective_v, train_v = manifest["search"], manifest["objective"], manifest["train"]
    else:
        if spec is None:
            raise TulaError("give a job spec (tula run SPEC), or --resume DIR to continue a run")
        job = _with_cluster(load_spec(spec), cluster)  # fail fast, before any output directory appears
        out = check_out_dir(out or RUNS / job.name)
        search_v, objective_v, train_v = search.value, objective.value if objective else None, train_after
        existing = _existing_run_files(out)
        if existing and not force:
            hint = f"continue it with `tula run --resume {_q(out)}`" if (out / "run.json").exists() else \
                "choose another --out"
            raise RunDirError(f"{str(out)!r} already holds a run ({', '.join(existing)}); {hint}, or pass --force "
                              "to start over")
    with locked(out, on_stale=_stale_note):
        if resume is None:
            if force:
                for name in _existing_run_files(out):
                    target = out / name
                    shutil.rmtree(target) if target.is_dir() else target.unlink()
            save_record({"kind": RUN_KIND, "version": 1, "spec": job.to_dict(), "search": search_v,
                         "objective": objective_v, "train": train_v}, out / "run.json")
        from .launch.clusters import open_launcher

        try:
            with open_launcher(job) as launcher:  # one cluster for every stage
                _run_stages(job, out, search_v, objective_v, train_v, resume is not None, launcher)
        except Interrupted as err:
            err.hint = f"tula run --resume {_q(out)}" + (f" --cluster {_q(cluster)}" if cluster else "")
            raise


def _run_stages(job: JobSpec, out: Path, search: str, objective: str | None, train_after: bool,
                resuming: bool, launcher) -> None:
    from .checkpoint import has_checkpoint
    from .plan import make_plan
    from .records import MODELS_KIND, PLAN_KIND, PROFILE_KIND, TRAIN_KIND, load_record, save_record
    from .report import plan_table, plot_plan, trials_table

    files = ["profile.json", "models.json", "plan.json", "plan.png"]
    prof_path, models_path, plan_path = out / "profile.json", out / "models.json", out / "plan.json"
    prof = load_record(prof_path, expect=(PROFILE_KIND,)) if resuming and prof_path.exists() else None
    if prof is None or prof.get("interrupted") or prof.get("failed"):
        if prof is not None:
            console.print(f"continuing the profile in {prof_path}: "
                          f"{sum(t['status'] in ('ok', 'oom', 'skipped') for t in prof['trials'])} of "
                          f"{len(prof['configs'])} trial(s) already finished")
        prof = _profile_with_progress(job, search, prof_path, previous=prof, launcher=launcher)
        models = None
    else:
        console.print(f"profile: {prof_path} is complete")
        models = load_record(models_path, expect=(MODELS_KIND,)) if models_path.exists() else None
    console.print(trials_table(prof))
    if models is None:
        models = _fit_and_save(prof, models_path)
        p = None
    else:
        p = load_record(plan_path, expect=(PLAN_KIND,)) if plan_path.exists() else None
    if p is None:
        p = make_plan(models, objective)
        save_record(p, plan_path)
    console.print(plan_table(p))
    plot_plan(p, models["trials"], out / "plan.png")
    console.print(f"[bold green]choice[/]: {p['reason']}")
    if train_after:
        c = p["choice"]
        method = job.train.method
        if METHOD_TABLE[method].needs_b_small_below_batch and c["global_batch"] <= job.train.ags.b_small:
            console.print(f"the chosen batch {c['global_batch']} is not above train.ags.b_small "
                          f"({job.train.ags.b_small}): nothing to scale, training with lbt")
            method = "lbt"
        train_dir = out / "train"
        if resuming and (train_dir / "train.json").exists():  # written only when training finished
            r = load_record(train_dir / "train.json", expect=(TRAIN_KIND,))
            console.print(f"training: {train_dir / 'train.json'} is complete")
        else:
            r = _train_with_progress(job, method, c["n_workers"], c["global_batch"], train_dir,
                                     resume=resuming and has_checkpoint(train_dir), launcher=launcher)
        console.print(f"[bold green]trained[/]: {_train_summary(r)}")
        files += ["train/train.json", "train/train.png", "train/metrics.jsonl"]
    console.print(f"records and plots in [bold]{out}[/]: {', '.join(files)}")


def main() -> None:
    if len(sys.argv) == 1:  # bare `tula`: the help, not an error
        sys.argv.append("--help")
    try:
        app(standalone_mode=False)
    except TulaError as err:
        err_console.print(f"[bold red]error:[/] {err}", soft_wrap=True)
        sys.exit(2)
    except Interrupted as err:
        hint = getattr(err, "hint", None)
        err_console.print(f"[bold yellow]interrupted:[/] {err}" + (f"; continue with: {hint}" if hint else ""),
                          soft_wrap=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        err_console.print("[bold yellow]interrupted:[/] stopped at once by a second signal; the last finished "
                          "epoch's checkpoint and the trials saved before it are kept")
        sys.exit(130)
    except typer.Abort:
        sys.exit(130)
    except typer.Exit as ex:
        sys.exit(ex.exit_code)
    except typer.TyperException as err:  # usage errors (bad option values) in non-standalone mode
        if not hasattr(err, "format_message"):
            raise
        message = err.format_message().replace("Value error, ", "")
        err_console.print(f"[bold red]error:[/] {message} (see --help)", soft_wrap=True)
        sys.exit(getattr(err, "exit_code", 2))


if __name__ == "__main__":
    main()
