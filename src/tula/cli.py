"""Command line: ``tula profile``, ``tula fit``, ``tula plan``, ``tula train``, ``tula run``.

Errors a user can cause print one sentence and exit with code 2; records already
measured are written before the next stage starts, so a later failure loses nothing.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .errors import TulaError
from .spec import METHODS, JobSpec, load_spec, spec_from_dict

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Tula: profile short DDP runs of your model, fit memory and performance models, "
                       "and plan the global batch and cluster size that minimise time, cost, or sit at the knee.")
# rich falls back to 80 columns when the output is not a terminal (make demo | tee, CI logs),
# which wraps the plan table; give such output room unless COLUMNS says otherwise
_WIDTH = None if Console().is_terminal or "COLUMNS" in os.environ else 120
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)


class Search(str, Enum):
    full = "full"
    partial = "partial"


class Objective(str, Enum):
    time = "time"
    cost = "cost"
    knee = "knee"


TrainMethod = Enum("TrainMethod", {m: m for m in METHODS}, type=str)  # type: ignore[misc]


def _profile_with_progress(spec: JobSpec, search: str, save_to: Path) -> dict:
    """Profile with a progress bar and write the record to ``save_to``; if a worker fails
    mid-way, the trials finished before it are written there before the error is raised."""
    from .fit import save_record
    from .profile import ProfileFailed, profile

    with Progress(TextColumn("[bold]profiling[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=False) as bar:
        task = bar.add_task("memory probe", total=None)

        def on_event(ev: dict) -> None:
            if ev.get("type") == "plan":
                bar.update(task, total=ev["total"], description=f"{ev['total']} trials")
            elif ev.get("type") == "trial":
                bar.update(task, advance=1, description=f"N={ev['n_workers']} B={ev['global_batch']}: {ev['status']}")

        try:
            rec = profile(spec, search, on_event=on_event)
        except ProfileFailed as err:
            if err.record is None:
                raise
            save_record(err.record, save_to)
            n_ok = sum(t["status"] == "ok" for t in err.record["trials"])
            raise TulaError(f"{err}; the {n_ok} trial(s) finished before it are saved in {save_to}") from None
        bar.update(task, description="done")
    save_record(rec, save_to)
    return rec


def _models_from_input(path: Path, search: str, out_dir: Path) -> dict:
    """A spec (YAML) is profiled and fitted; a profile JSON is fitted; a models JSON is used as is."""
    from .fit import MODELS_KIND, PROFILE_KIND, fit_models, load_record, save_record
    from .report import models_table, trials_table

    if path.suffix.lower() in (".yaml", ".yml"):
        spec = load_spec(path)
        prof = _profile_with_progress(spec, search, out_dir / "profile.json")
        console.print(trials_table(prof))
    else:
        rec = load_record(path)
        if rec["kind"] == MODELS_KIND:
            return rec
        if rec["kind"] != PROFILE_KIND:
            raise TulaError(f"{str(path)!r} is a plan; give a spec, a profile or a models record")
        prof = rec
    models = fit_models(prof)
    save_record(models, out_dir / "models.json")
    console.print(models_table(models))
    return models


@app.command()
def profile(spec: Path = typer.Argument(..., help="job spec (YAML)"),
            search: Search = typer.Option(Search.partial, help="full: every candidate (N, B); partial: only the "
                                          "extreme cluster sizes and batches (paper §III-A2)"),
            out: Path = typer.Option(Path("profile.json"), help="where to write the profile record (JSON)")) -> None:
    """Run short real DDP trials and record step, compute and sync time and peak memory."""
    from .report import trials_table

    rec = _profile_with_progress(load_spec(spec), search.value, out)
    console.print(trials_table(rec))
    console.print(f"profile written to [bold]{out}[/]")


@app.command()
def fit(profile_json: Path = typer.Argument(..., help="a profile record from `tula profile`"),
        out: Path = typer.Option(Path("models.json"), help="where to write the fitted models (JSON)")) -> None:
    """Fit the memory and performance models of a profile; the result re-plans without profiling."""
    from .fit import PROFILE_KIND, fit_models, load_record, save_record
    from .report import models_table

    rec = load_record(profile_json)
    if rec["kind"] != PROFILE_KIND:
        raise TulaError(f"{str(profile_json)!r} is not a profile record (it is a {rec['kind']})")
    models = fit_models(rec)
    save_record(models, out)
    console.print(models_table(models))
    console.print(f"models written to [bold]{out}[/]")


@app.command()
def plan(source: Path = typer.Argument(..., help="a job spec (profiled first), a profile JSON, or a models JSON"),
         objective: Objective = typer.Option(None, help="time, cost or knee (default: the spec's objective)"),
         search: Search = typer.Option(Search.partial, help="search used when SOURCE is a spec"),
         out: Path = typer.Option(Path("plan.json"), help="where to write the plan (JSON)"),
         plot: Path = typer.Option(None, help="also write the time/cost-vs-batch plot to this PNG")) -> None:
    """Predict time and cost of every configuration and choose one."""
    from .fit import save_record
    from .plan import make_plan
    from .report import plan_table, plot_plan

    models = _models_from_input(source, search.value, out.parent)
    p = make_plan(models, objective.value if objective else None)
    save_record(p, out)
    console.print(plan_table(p))
    console.print(f"[bold green]choice[/]: {p['reason']}")
    if plot is not None:
        plot_plan(p, models["trials"], plot)
        console.print(f"plot written to [bold]{plot}[/]")
    console.print(f"plan written to [bold]{out}[/]")


def _train_with_progress(spec: JobSpec, method: str, n_workers: int, global_batch: int, out: Path,
                         resume: bool) -> dict:
    """Train with a progress bar; write train.json and train.png into ``out``."""
    from .fit import save_record
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
                                   f"top-1 {ev['test_top1']:.1%}")
        elif kind == "fallback":
            bar.console.print(f"[yellow]out of memory at global batch {ev['from_global_batch']}[/]: resuming "
                              f"from epoch {ev['at_epoch']} at global batch {ev['to_global_batch']}")

    try:
        run = train(spec, method, n_workers, global_batch, out, resume=resume, on_event=on_event)
    finally:
        bar.stop()
    save_record(run, out / "train.json")
    console.print(train_table(run))
    plot_training(run, out / "train.png")
    return run


def _train_summary(run: dict) -> str:
    tr = run.get("traces") or {}
    extra = f", {tr['scaled_fraction']:.0%} of steps scaled" if "scaled_fraction" in tr else ""
    return (f"{run['method']} at N={run['n_workers']}, B={run['global_batch']}: final test top-1 "
            f"{run['final'].get('test_top1', float('nan')):.2%} after {run['epochs']} epochs "
            f"({run['steps_done']} steps, {run['train_s']:.0f} s{extra})")


@app.command()
def train(spec: Path = typer.Argument(..., help="job spec (YAML)"),
          method: TrainMethod = typer.Option(None, help="ags (Tula's adaptive gradient scaling), static, lbt "
                                             "(vanilla), lrs (LR scaling + warm-up), lars, lamb, polo (post-local "
                                             "SGD), adascale; default: the spec's train.method"),
          workers: int = typer.Option(None, help="number of workers N (default: train.n_workers, else the plan's)"),
          batch: int = typer.Option(None, help="global batch B (default: train.global_batch, else the plan's)"),
          plan: Path = typer.Option(None, help="a plan.json whose choice gives N and B"),
          epochs: int = typer.Option(None, help="override the spec's epochs"),
          out: Path = typer.Option(Path("runs/train"), help="directory for checkpoint.pt, metrics.jsonl, "
                                   "train.json, train.png"),
          resume: bool = typer.Option(False, help="continue the checkpoint in --out")) -> None:
    """Train with DDP on N local workers at global batch B, with AGS or a baseline.

    Checkpoints after every epoch; on out-of-memory the run resumes from the last
    checkpoint at the next smaller batch."""
    from .fit import PLAN_KIND, load_record

    job = load_spec(spec)
    if epochs is not None:
        job = spec_from_dict({**job.to_dict(), "epochs": epochs})
    n, b = workers or job.train.n_workers, batch or job.train.global_batch
    if plan is not None:
        rec = load_record(plan)
        if rec["kind"] != PLAN_KIND:
            raise TulaError(f"{str(plan)!r} is not a plan record (it is a {rec['kind']})")
        n, b = n or rec["choice"]["n_workers"], b or rec["choice"]["global_batch"]
    if n is None or b is None:
        raise TulaError("no configuration to train at: give --workers and --batch, set train.n_workers and "
                        "train.global_batch in the spec, or pass --plan plan.json")
    run = _train_with_progress(job, (method.value if method else job.train.method), n, b, out, resume)
    console.print(f"[bold green]trained[/]: {_train_summary(run)}")
    console.print(f"records and plot in [bold]{out}[/]: train.json, metrics.jsonl, checkpoint.pt, train.png")


@app.command()
def run(spec: Path = typer.Argument(..., help="job spec (YAML)"),
        search: Search = typer.Option(Search.partial, help="full or partial search"),
        objective: Objective = typer.Option(None, help="time, cost or knee (default: the spec's objective)"),
        train_after: bool = typer.Option(True, "--train/--no-train", help="after planning, train at the chosen "
                                         "configuration with the spec's train.method (default ags)"),
        out: Path = typer.Option(Path("runs/job"), help="directory for profile.json, models.json, plan.json, "
                                 "plan.png and the training records")) -> None:
    """The main job: profile, fit, plan, train at the choice with AGS, and report."""
    from .fit import save_record
    from .plan import make_plan
    from .report import plan_table, plot_plan

    from .train import CHECKPOINT

    job = load_spec(spec)  # fail fast, before any output directory appears
    ckpt = out / "train" / CHECKPOINT
    if train_after and ckpt.exists():
        import torch

        done = torch.load(ckpt, map_location="cpu", weights_only=False)
        raise TulaError(f"{ckpt} already holds a training run; choose another --out, or continue it with: "
                        f"tula train {spec} --method {done['method']} --workers {done['n_workers']} "
                        f"--batch {done['global_batch']} --out {out / 'train'} --resume")
    out.mkdir(parents=True, exist_ok=True)
    models = _models_from_input(spec, search.value, out)
    p = make_plan(models, objective.value if objective else None)
    save_record(p, out / "plan.json")
    console.print(plan_table(p))
    png = plot_plan(p, models["trials"], out / "plan.png")
    console.print(f"[bold green]choice[/]: {p['reason']}")
    files = ["profile.json", "models.json", "plan.json", png.name]
    if train_after:
        c = p["choice"]
        method = job.train.method
        if method in ("ags", "static") and c["global_batch"] <= job.train.ags.b_small:
            console.print(f"the chosen batch {c['global_batch']} is not above train.ags.b_small "
                          f"({job.train.ags.b_small}): nothing to scale, training with lbt")
            method = "lbt"
        r = _train_with_progress(job, method, c["n_workers"], c["global_batch"], out / "train", resume=False)
        console.print(f"[bold green]trained[/]: {_train_summary(r)}")
        files += ["train/train.json", "train/train.png", "train/metrics.jsonl"]
    console.print(f"records and plots in [bold]{out}[/]: {', '.join(files)}")


def main() -> None:
    try:
        app(standalone_mode=False)
    except TulaError as err:
        err_console.print(f"[bold red]error:[/] {err}", soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.TyperException as err:  # usage errors (bad option values) in non-standalone mode
        if not hasattr(err, "format_message"):
            raise
        message = err.format_message().replace("Value error, ", "")
        err_console.print(f"[bold red]error:[/] {message} (see --help)", soft_wrap=True)
        sys.exit(getattr(err, "exit_code", 2))


if __name__ == "__main__":
    main()
