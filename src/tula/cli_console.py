"""What ``tula`` shows on a terminal (or a log): the consoles, the pipeline's observer with its
progress bars (:class:`ConsoleObserver`), and the summaries and tables the verbs print.

:mod:`tula.cli` holds the verbs and calls these; nothing here parses options or decides what to run.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from tula.core.errors import SpecError
from tula.core.events import (
    Checked,
    EpochFinished,
    Event,
    FellBack,
    Note,
    Resized,
    StepDone,
    TrialFinished,
    TrialsPlanned,
    WorldStarted,
)
from tula.core.records import (
    MODELS_KIND,
    PLAN_KIND,
    PROFILE_KIND,
    TRAIN_KIND,
    EpochRecord,
    ModelsRecord,
    PlanRecord,
    ProfileRecord,
    TrainRecord,
    as_record,
    epoch_score,
)
from tula.core.say import plain, say
from tula.pipeline import AnyRecord, Observer, is_partial

# rich falls back to 80 columns when the output is not a terminal (make demo | tee, CI logs),
# which wraps the plan table; give such output room unless COLUMNS says otherwise
_WIDTH = None if Console().is_terminal or "COLUMNS" in os.environ else 120
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)

LOG_STEP_EVERY_S = 2.0  # output that is not a terminal gets a step line at most this often within an epoch
LOG_EVERY_ENV = "TULA_LOG_EVERY_S"  # sets that interval (seconds > 0), e.g. 30 for a scheduler's file


def log_step_every_s() -> float:
    """How often, at most, output that is not a terminal gets a step line within an epoch:
    ``TULA_LOG_EVERY_S`` seconds, else :data:`LOG_STEP_EVERY_S`; a value that is not a
    positive number of seconds is one sentence (:class:`~tula.core.errors.SpecError`)."""
    raw = os.environ.get(LOG_EVERY_ENV)
    if raw is None or not raw.strip():
        return LOG_STEP_EVERY_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise SpecError(
            f"{LOG_EVERY_ENV}={raw!r} is not a positive number of seconds (how often a log gets a step line)"
        )
    return seconds


def stale_note(info: dict) -> None:
    """The note said when a command takes over the lock of a run that is no longer alive."""
    say(
        err_console,
        f"note: taking over the lock left by a run that is no longer alive (pid {info.get('pid')}, "
        f"`{info.get('command')}`)",
    )


def _titled(title: str) -> tuple[TextColumn, TextColumn]:
    """A progress bar's bold title, then its task's description printed as it is (never markup)."""
    return TextColumn(f"[bold]{title}[/]"), TextColumn("{task.description}", markup=False)


def _stage_bar(title: str) -> Progress:
    """A stage's progress bar on stderr: its title, the bar, done of total and the time elapsed."""
    return Progress(
        *_titled(title),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )


class ConsoleObserver(Observer):
    """The pipeline's observer on a terminal (or a log): a progress bar per stage, a line
    per trial / epoch / few seconds of a long epoch when the output is not a terminal, and
    the tables of the records as they are written."""

    def __init__(self) -> None:
        self.method: str | None = None
        self.bar: Progress | None = None
        self.task: TaskID | None = None  # the bar's one task, while a bar is shown
        self.last_line = time.monotonic()  # when a log (not a terminal) last got a line
        self.log_every_s = log_step_every_s()
        self.held: list[str] | None = None  # notes kept until training starts (hold_notes)
        self.sequence_length: int | None = None  # L of the data trained on (None: none): an epoch's tokens/s

    def hold_notes(self) -> None:
        """Keep the notes said from now on until training's first event (its checks have passed
        and its workers report): a command refused by the checks prints its one sentence and
        nothing else."""
        self.held = []

    def _say_held(self) -> None:
        held, self.held = self.held or [], None
        for message in held:
            self.note(message)

    # the Observer protocol
    def stage(self, name: str, **info) -> None:
        self.method = info.get("method", self.method)
        if name == "profiling":
            self.bar = _stage_bar("profiling")
            # the bar appears once the workload passed its checks: a failing one prints only its sentence
            self.task = self.bar.add_task("memory probe", total=None)
        elif name == "training":  # the bar appears once the configuration is validated and the workers start
            self.sequence_length = info.get("sequence_length")
            self.bar = _stage_bar("training")
            self.task = self.bar.add_task(plain(self.method or ""), total=None)

    def done(self, name: str) -> None:
        self.held = None  # training ended before its first event (refused, failed, stopped): nothing to note
        if self.bar is not None:
            if name == "profiling" and self.task is not None:
                self.bar.update(self.task, description="done")
            self.bar.stop()
            self.bar = None

    def event(self, stage: str, ev: Event) -> None:
        if stage == "training" and self.held is not None:
            self._say_held()
        (self._profiling if stage == "profiling" else self._training)(ev)

    def saved(self, kind: str, record: dict | AnyRecord | None, path: Path) -> None:
        from tula.report import models_table, plan_table, train_table, trials_table

        if record is None:  # a plot: its path only, no table
            return
        if kind == PROFILE_KIND and not is_partial(profile := as_record(record, ProfileRecord)):
            console.print(trials_table(profile))
        elif kind == MODELS_KIND:
            console.print(models_table(as_record(record, ModelsRecord)))
        elif kind == PLAN_KIND:
            plan = as_record(record, PlanRecord)
            console.print(plan_table(plan))
            say(console, ("choice", "bold green"), ": ", plan.reason)
            if plan.run_costs_note:
                say(console, ("epochs", "bold"), ": ", plan.run_costs_note)
        elif kind == TRAIN_KIND:
            run = as_record(record, TrainRecord)
            console.print(train_table(run))
            say(console, ("trained", "bold green"), ": ", train_summary(run))

    def note(self, message: str) -> None:
        if self.held is not None:
            self.held.append(message)
            return
        say(console, message)

    # progress
    def _profiling(self, ev: Event) -> None:
        bar, task = self.bar, self.task
        if isinstance(ev, Note):
            say(bar.console if bar is not None else err_console, ("note", "yellow"), ": ", ev.message)
            return
        if bar is None or task is None:  # progress outside the profiling stage: no bar to move
            return
        if isinstance(ev, Checked):
            bar.start()
        elif isinstance(ev, TrialsPlanned):
            bar.update(task, total=ev.total, completed=ev.done, description=f"{ev.total} trials")
        elif isinstance(ev, TrialFinished):
            line = plain(f"N={ev.n_workers} B={ev.global_batch}: {ev.status}")
            bar.update(task, advance=1, description=line)
            if not err_console.is_terminal:  # a log (CI, a scheduler's file) gets a line per trial
                say(err_console, "trial ", line)

    def _training(self, ev: Event) -> None:
        bar, task, method = self.bar, self.task, self.method
        out = bar.console if bar is not None else err_console  # where a line about the run goes
        if isinstance(ev, Note):
            say(out, ("note", "yellow"), ": ", ev.message)
        elif isinstance(ev, Resized):
            say(
                out,
                f"after epoch {ev.at_epoch}: the batch schedule moves to global batch "
                f"{ev.global_batch} on {ev.n_workers} worker(s) "
                + ("(a new world)" if ev.new_world else "(in the same world)"),
            )
        elif isinstance(ev, FellBack):
            fb = ev.fallback
            k0, k1 = fb.from_accumulation_steps, fb.to_accumulation_steps
            say(
                out,
                (f"out of memory at global batch {fb.from_global_batch}", "yellow"),
                (f" in {k0} accumulation steps" if k0 > 1 else ""),
                f": resuming from epoch {fb.at_epoch} at global batch {fb.to_global_batch}",
                (f" in {k1} accumulation steps" if k1 != k0 or k1 > 1 else ""),
            )
        elif bar is None or task is None:  # progress outside the training stage: no bar to move
            return
        elif isinstance(ev, WorldStarted):
            bar.start()
            bar.update(
                task,
                total=ev.epochs * ev.steps_per_epoch,
                completed=0,
                description=plain(f"{method} N={ev.n_workers} B={ev.global_batch}"),
            )
        elif isinstance(ev, StepDone):
            bar.update(task, completed=ev.epoch * ev.steps_per_epoch + ev.step)
            if not err_console.is_terminal and time.monotonic() - self.last_line >= self.log_every_s:
                self.last_line = time.monotonic()  # a log of a long epoch gets a line every few seconds
                say(err_console, f"epoch {ev.epoch + 1}: step {ev.step}/{ev.steps_per_epoch}")
        elif isinstance(ev, EpochFinished):
            rec = ev.record
            bar.update(
                task,
                completed=rec.epoch * rec.steps,
                description=plain(
                    f"{method} N={rec.n_workers} B={rec.global_batch} epoch {rec.epoch}, {{}} {{}}".format(
                        *epoch_score(rec)[::2]
                    )
                ),
            )
            if not err_console.is_terminal:  # a log gets a line per epoch
                self.last_line = time.monotonic()
                say(
                    err_console,
                    f"epoch {rec.epoch}: train loss {rec.train_loss:.4f}, test {{}} {{}}".format(*epoch_score(rec)[::2])
                    + f", {rec.epoch_time_s:.2f} s"
                    + epoch_tokens_per_s(rec, self.sequence_length),
                )


def epoch_tokens_per_s(rec: EpochRecord, sequence_length: int | None) -> str:
    """An epoch line's throughput in tokens (``", 1.234e+04 tokens/s"``: its steps x B x L over its
    time) where the data has a sequence length L; empty without one."""
    if sequence_length is None or rec.epoch_time_s <= 0:
        return ""
    return f", {rec.steps * rec.global_batch * sequence_length / rec.epoch_time_s:.4g} tokens/s"


def train_summary(rec: TrainRecord) -> str:
    """A training record in one line: where it trained, its final score, its steps and time."""
    scaled = rec.traces.scaled_fraction
    extra = f", {scaled:.0%} of steps scaled" if scaled is not None else ""
    return (
        f"{rec.method} at N={rec.n_workers}, B={rec.global_batch}: final test {{}} {{}}".format(
            *epoch_score(rec.final or {})[::2]
        )
        + f" after {rec.epochs} epochs "
        f"({rec.steps_done} steps, {rec.train_s:.0f} s{extra})"
        + (
            f"; epochs took {pred.median_ratio:.2f}x the plan's prediction (median of {pred.epochs_compared})"
            if (pred := rec.prediction) is not None and pred.median_ratio
            else ""
        )
    )


def show_simulation(sim, w, out: Path) -> None:
    """Print a what-if's tables, summary, title and the simulator's notes; plot it to ``out``."""
    from tula.report import plot_simulation, simulation_summary, simulation_tables

    for t in simulation_tables(sim, w.rows, sim.pricing.unit):
        console.print(t)
    console.print(simulation_summary(w.rows))
    say(console, w.title)
    for note in sim.notes:
        say(console, ("note", "yellow"), ": ", note)
    plot_simulation(sim, w.rows, out, w.title, w.measured)
    say(console, "plot written to ", (out, "bold"))
