"""Report stage: rich tables for the terminal and a matplotlib PNG of the plan.

The tables and plots of records take the typed records of :mod:`tula.core.records`
(:class:`~tula.core.records.ProfileRecord`, :class:`~tula.core.records.ModelsRecord`,
:class:`~tula.core.records.PlanRecord`); a profile, models or plan record given as its JSON is
typed once, where it comes in (:func:`~tula.core.records.as_record`: a whole record checked).  The
training run's table and figure take the :class:`~tula.core.records.TrainRecord` only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from pydantic import TypeAdapter

from tula.core.live_plan import GoodputRow, goodput_per_epoch
from tula.core.noise_scale import (
    SMOOTH_EPOCHS,
    early_epochs,
    early_noise_scale,
    noise_scale_value,
    smooth_noise_scale,
)
from tula.core.records import (
    EpochRecord,
    MethodTraces,
    ModelsRecord,
    NoiseScale,
    PlanCurve,
    PlanRecord,
    PlanRow,
    ProfileRecord,
    TrainRecord,
    Trial,
    as_record,
    epoch_score,
)
from tula.core.registry import OBJECTIVES
from tula.core.say import Table, fmt_bytes
from tula.core.simulate import ConstantRow, MeasuredPoint, ScheduleRow, SimulatedRow, sharded_sync_words
from tula.core.spec import reference_sequence_length

if TYPE_CHECKING:
    from tula.core.perfmodel import PerfModel
    from tula.core.spec import JobSpec

_TRIALS = TypeAdapter(list[Trial])


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.2f}"


def _count(x: int | float | None) -> str:
    return "-" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def _rate(tokens: int | float | None, seconds: float | None) -> str:
    """Tokens per second, 4 significant digits ("-": no tokens or no time)."""
    return "-" if tokens is None or not seconds else f"{tokens / seconds:.4g}"


def epoch_tokens(epoch: EpochRecord, sequence_length: int | None) -> int | None:
    """The tokens an epoch trained: its steps x B x L (``None``: no sequence length)."""
    return None if sequence_length is None else epoch.steps * epoch.global_batch * sequence_length


def _tokens_per_batch(row: Trial | PlanRow) -> int | None:
    """B L, the tokens of a global batch (``None``: no sequence length)."""
    return None if row.sequence_length is None else row.global_batch * row.sequence_length


_Row = TypeVar("_Row")


@dataclass(frozen=True)
class _Column(Generic[_Row]):
    """One column of a table: its header, its cell for a row, and whether the table shows it."""

    header: str
    cell: Callable[[_Row], str]
    shown: bool = True
    justify: str = "right"


def _add_columns(t: Table, columns: Sequence[_Column[_Row]]) -> list[_Column[_Row]]:
    """Add ``columns``' shown ones to ``t`` (their headers, in order); those columns."""
    shown = [c for c in columns if c.shown]
    for c in shown:
        t.add_column(c.header, justify=c.justify)
    return shown


def _cells(columns: Sequence[_Column[_Row]], row: _Row) -> list[str]:
    """``row``'s cells in ``columns``."""
    return [c.cell(row) for c in columns]


def _trials(trials: Sequence[Trial | dict]) -> list[Trial]:
    """A record's trials as :class:`~tula.core.records.Trial` objects (dicts are checked once)."""
    if all(isinstance(t, Trial) for t in trials):
        return [t for t in trials if isinstance(t, Trial)]
    return _TRIALS.validate_python([t if isinstance(t, dict) else asdict(t) for t in trials])


def trials_table(profile: dict | ProfileRecord) -> Table:
    """One row per profiled trial: its (N, B, b), measured times, peak memory and status."""
    rec = as_record(profile, ProfileRecord)
    t = Table(
        title=f"Profile ({rec.search} search, {rec.device}, "
        f"{rec.threads_per_worker} thread(s)/worker, {rec.profiling_s:.0f} s)"
    )
    data = any(r.t_data_s is not None for r in rec.trials)
    lengths = len({r.sequence_length for r in rec.trials}) > 1  # profiled over several sequence lengths: an L column
    tokens = any(r.sequence_length is not None for r in rec.trials)  # trials of a sequence length: tokens too
    checkpointed = any(r.checkpointing for r in rec.trials)  # train.checkpointing auto's checkpointed trials
    sharded = any(r.parallelism == "fsdp" for r in rec.trials)  # train.parallelism auto's sharded trials
    columns = _add_columns(
        t,
        [
            _Column[Trial]("N", lambda r: str(r.n_workers)),
            _Column[Trial]("B", lambda r: str(r.global_batch)),
            _Column[Trial]("b", lambda r: str(r.local_batch)),
            _Column[Trial]("L", lambda r: str(r.sequence_length), shown=lengths),
            _Column[Trial]("tokens/batch", lambda r: _count(_tokens_per_batch(r)), shown=tokens),
            _Column[Trial]("ckpt", lambda r: "on" if r.checkpointing else "off", shown=checkpointed),
            _Column[Trial]("parallelism", lambda r: r.parallelism or "ddp", shown=sharded),
            _Column[Trial]("t_step ms", lambda r: _ms(r.t_step_s)),
            _Column[Trial]("tokens/s", lambda r: _rate(_tokens_per_batch(r), r.t_step_s), shown=tokens),
            _Column[Trial]("t_compute ms", lambda r: _ms(r.t_compute_s)),
            _Column[Trial]("t_sync ms", lambda r: _ms(r.t_sync_s)),
            _Column[Trial]("data ms", lambda r: _ms(r.t_data_s), shown=data),
            _Column[Trial]("spread", lambda r: "-" if r.t_step_spread is None else f"{r.t_step_spread:.0%}"),
            _Column[Trial]("peak mem", lambda r: fmt_bytes(r.peak_mem_bytes)),
            _Column[Trial]("status", lambda r: r.status + (f" ({r.note})" if r.note else ""), justify="left"),
        ],
    )
    for r in rec.trials:
        style = {"ok": None, "oom": "red", "skipped": "yellow", "error": "red", "interrupted": "yellow"}.get(r.status)
        t.add_row(*_cells(columns, r), style=style)
    return t


def _compute_line(perf: PerfModel) -> str:
    """One rank's own compute as fitted: the line in b, under its host-bound floor if any."""
    line = f"({perf.c0 * 1e3:.3f} ms + {perf.c1 * 1e6:.2f} us * b)"
    floor = perf.t_floor_s or 0.0
    return f"max({floor * 1e3:.1f} ms, {line[1:-1]})" if floor > 0 else line


def models_table(models: dict | ModelsRecord) -> Table:
    """The fitted memory and performance models, their in-sample error and the noise scale."""
    rec = as_record(models, ModelsRecord)
    mem, perf, err = rec.memory, rec.perf, rec.fit_error  # the record's parts, typed
    t = Table(title="Fitted models", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row(
        "memory: static",
        f"params {fmt_bytes(mem.param_bytes)}, grads {fmt_bytes(mem.grad_bytes)}, "
        f"optimiser {fmt_bytes(mem.optimizer_state_bytes)}, buffers {fmt_bytes(mem.buffer_bytes)}, "
        f"other {fmt_bytes(mem.other_static_bytes)}",
    )
    t.add_row(
        "memory: per sample",
        f"activations {fmt_bytes(mem.activation_bytes_per_sample)}, data {fmt_bytes(mem.batch_bytes_per_sample)}",
    )
    if mem.sequence_length is not None or perf.sequence_length is not None:  # profiled over several lengths
        ref = mem.sequence_length or perf.sequence_length
        t.add_row(
            "per sample at length L",
            f"from L={ref}: memory {mem.bytes_per_token:+.4g} B * (L-{ref}) {mem.bytes_per_token_squared:+.4g} B * "
            f"(L^2-{ref}^2); compute {perf.c1_per_token * 1e6:+.4g} us * (L-{ref}) "
            f"{perf.c1_per_token_squared * 1e6:+.4g} us * (L^2-{ref}^2)",
        )
    hosts = perf.beta_intra is not None or "beta_intra" in perf.frozen  # fitted across hosts
    m = "m" if hosts else "N"
    t.add_row(
        "compute",
        f"t = {_compute_line(perf)} * "
        f"(1 + {perf.kappa:.3f} ({m}-1)) + {perf.kappa0 * 1e3:.3f} ms * ({m}-1)"
        + (", m the ranks on one host" if hosts else ""),
    )
    t.add_row(
        "sync",
        f"{perf.collective}: alpha {perf.alpha * 1e6:.2f} us/hop, "
        f"bandwidth {1 / perf.beta / 1e9 if perf.beta > 0 else float('inf'):.3g} GB/s"
        + (" between hosts" if hosts else "")
        + f", rho {perf.rho:.3f}, gamma {perf.gamma:.2f}",
    )
    if perf.beta_intra is not None:
        ib = perf.beta_intra
        t.add_row(
            "sync within a host",
            f"alpha {(perf.alpha_intra or 0.0) * 1e6:.2f} us/hop, "
            f"bandwidth {1 / ib / 1e9 if ib > 0 else float('inf'):.3g} GB/s",
        )
    t.add_row("frozen", ", ".join(perf.frozen) or "-")
    t.add_row(
        "in-sample error",
        f"step time median {err['t_step_median_rel']:.1%} (max {err['t_step_max_rel']:.1%}), "
        f"peak memory median {err['peak_mem_median_rel']:.1%} (max {err['peak_mem_max_rel']:.1%})",
    )
    for a in rec.accumulation_check:
        t.add_row(
            "accumulated step",
            f"N={a.n_workers} b={a.local_batch} as {a.accumulation_steps} x {a.micro_batch}: measured "
            f"{a.t_step_s * 1e3:.2f} ms, predicted {a.predicted_t_step_s * 1e3:.2f} ms ({a.rel_error:.1%} off)",
        )
    if rec.noise_scale is not None:
        t.add_row("noise scale", noise_scale_text(rec.noise_scale, reference_sequence_length(rec.spec.data)))
    for note in perf.notes:
        t.add_row("note", note)
    return t


def noise_scale_text(noise: dict | NoiseScale, sequence_length: int | None = None) -> str:
    """The models' gradient noise scale in words: the value, its error, where it was measured;
    with the ``sequence_length`` L it was measured at, also in tokens (B_noise L)."""
    ns = noise if isinstance(noise, NoiseScale) else NoiseScale.model_validate(noise)
    if not ns.b_noise:
        return f"B_noise {ns.note or 'not measured'}"
    err = ""
    if ns.low is not None and ns.high is not None:
        err = f" ({ns.low:.3g}-{ns.high:.3g}, one jackknife error)"
    in_tokens = (
        "" if sequence_length is None else f", {ns.b_noise * sequence_length:.3g} tokens at L={sequence_length},"
    )
    worlds = ", ".join(f"N={w.n_workers} b={w.b_small} vs {w.b_big}" for w in ns.worlds or [])
    return (
        f"B_noise {ns.b_noise:.3g} samples{err}{in_tokens} at the start of training, over {ns.steps} batches ({worlds})"
    )


def plan_table(plan: dict | PlanRecord) -> Table:
    """The plan's candidate configurations and its choice, with what the epochs include."""
    from tula.core.spec import format_duration

    rec = as_record(plan, PlanRecord)
    rows = rec.configurations
    cons = rec.constraints
    constrained = cons is not None and (cons.deadline_s is not None or cons.budget is not None)
    spot = any(r.given("failure_free_time_s") for r in rows)
    acc = any(r.given("epochs_to_accuracy") for r in rows)
    parts = bool(rec.run_costs)  # an epoch = its steps + its end (evaluation, checkpoint, the method's)
    lengths = len({r.sequence_length for r in rows}) > 1  # several sequence lengths planned: an L column
    tokens = any(r.sequence_length is not None for r in rows)  # rows of a sequence length: tokens beside samples
    checkpointed = len({r.checkpointing for r in rows}) > 1  # train.checkpointing auto: a column of the variant
    sharded = any(r.parallelism == "fsdp" for r in rows)  # train.parallelism auto (or fsdp): a column of it
    title = f"Plan (objective: {rec.objective}); candidate batches and the choice"
    noise = rec.noise_scale or NoiseScale()
    if acc:
        length = rec.choice.sequence_length  # the noise scale in tokens at the choice's length too
        in_tokens = (
            "" if length is None or not noise.b_noise else f" = {noise.b_noise * length:.3g} tokens at L={length}"
        )
        title += (
            f"; to accuracy: the spec's {rec.spec.epochs} epochs at B0={noise.reference_batch} "
            f"scaled by B_noise {noise.b_noise:.3g}{in_tokens} ({'what-if' if noise.source == 'what-if' else 'profiled'})"
        )
    if cons is not None and constrained:
        limits = ([f"deadline {format_duration(cons.deadline_s)}"] if cons.deadline_s is not None else []) + (
            [f"budget {cons.budget:.4g} {cons.unit}"] if cons.budget is not None else []
        )
        title += f"; {', '.join(limits)}: {cons.n_meeting} of {cons.n_feasible} feasible configurations meet it"
    # what the epochs include: the method's step and each epoch's end, or that they were not measured
    t = Table(title=title, caption=rec.run_costs_note)
    columns = _add_columns(
        t,
        [
            _Column[PlanRow]("", lambda r: "*" if r.chosen else ""),
            _Column[PlanRow]("N", lambda r: str(r.n_workers)),
            _Column[PlanRow]("B", lambda r: str(r.global_batch)),
            _Column[PlanRow](
                "b",
                lambda r: (
                    str(r.local_batch) if r.accumulation_steps == 1 else f"{r.accumulation_steps}x{r.micro_batch}"
                ),
            ),
            _Column[PlanRow]("L", lambda r: str(r.sequence_length), shown=lengths),
            _Column[PlanRow]("tokens/batch", lambda r: _count(_tokens_per_batch(r)), shown=tokens),
            _Column[PlanRow]("ckpt", lambda r: "on" if r.checkpointing else "off", shown=checkpointed),
            _Column[PlanRow]("parallelism", lambda r: r.parallelism, shown=sharded),
            _Column[PlanRow]("t_step ms", lambda r: _ms(r.t_step_s)),
            _Column[PlanRow]("tokens/s", lambda r: _rate(_tokens_per_batch(r), r.t_step_s), shown=tokens),
            _Column[PlanRow]("epoch s", lambda r: f"{r.epoch_time_s:.3f}"),
            _Column[PlanRow](
                "of which end s", lambda r: f"{r.epoch_fixed_s if r.given('epoch_fixed_s') else 0.0:.3f}", shown=parts
            ),
            _Column[PlanRow]("total s" + (" (expected)" if spot else ""), lambda r: f"{r.total_time_s:.2f}"),
            _Column[PlanRow]("preempt.", lambda r: f"{r.expected_preemptions:.2g}", shown=spot),
            _Column[PlanRow]("cost", lambda r: f"{r.cost:.4g}"),
            _Column[PlanRow]("epochs to acc.", lambda r: f"{r.epochs_to_accuracy:.3g}", shown=acc),
            _Column[PlanRow](  # the tokens those epochs train: epochs x D x L
                "tokens to acc.",
                lambda r: _count(
                    None
                    if r.sequence_length is None or r.epochs_to_accuracy is None
                    else r.epochs_to_accuracy * rec.dataset_size * r.sequence_length
                ),
                shown=acc and tokens,
            ),
            _Column[PlanRow]("to acc. s", lambda r: f"{r.time_to_accuracy_s:.2f}", shown=acc),
            _Column[PlanRow]("to acc. cost", lambda r: f"{r.cost_to_accuracy:.4g}", shown=acc),
            _Column[PlanRow]("peak mem", lambda r: fmt_bytes(r.peak_mem_bytes)),
            _Column[PlanRow]("feasible", lambda r: "yes" if r.feasible else "no"),
            _Column[PlanRow]("meets", lambda r: "yes" if r.meets_constraints else "no", shown=constrained),
        ],
    )
    for r in rows:
        if not (r.candidate or r.chosen):
            continue
        style = "bold green" if r.chosen else (None if r.feasible and r.meets_constraints else "dim")
        t.add_row(*_cells(columns, r), style=style)
    return t


@dataclass(frozen=True)
class ChartLine:
    """Per global batch (``global_batch``): the total time of the epochs (s) and their cost, and (a plan's
    predictions with a noise scale) the time and cost to the accuracy the spec's epochs reach at B0."""

    global_batch: list[int]
    total_time_s: list[float]
    cost: list[float]
    time_to_accuracy_s: list[float] | None = None
    cost_to_accuracy: list[float] | None = None


@dataclass(frozen=True)
class ChartSeries:
    """One cluster size of a plan chart: predicted lines, measured points and the knee."""

    n_workers: int
    predicted: ChartLine
    measured: ChartLine
    #: the knee of the time-vs-batch curve (None: none found)
    knee_batch: int | None


@dataclass(frozen=True)
class FrontierPoint:
    """A configuration on the Pareto frontier of time and cost."""

    n_workers: int
    global_batch: int
    total_time_s: float
    cost: float


@dataclass(frozen=True)
class PlanChart:
    """What a plan chart shows (:func:`plan_chart_data`), for the PNG and the dashboard alike."""

    name: str
    objective: str
    epochs: int
    pricing: str
    unit: str
    series: list[ChartSeries]
    frontier: list[FrontierPoint]
    deadline_s: float | None
    budget: float | None
    choice: PlanRow
    reason: str

    def chosen_y(self, metric: str) -> float:
        """The choice's value of ``metric`` (total_time_s, cost, time_to_accuracy_s, cost_to_accuracy)."""
        value = getattr(self.choice, metric)
        return float("nan") if value is None else float(value)


def _line(curve: PlanCurve) -> ChartLine:
    def _acc(values: list[float | None] | None) -> list[float] | None:  # a missing point: not drawn
        return None if values is None else [float("nan") if v is None else v for v in values]

    return ChartLine(
        list(curve.global_batch), list(curve.total_time_s), list(curve.cost),
        time_to_accuracy_s=_acc(curve.time_to_accuracy_s), cost_to_accuracy=_acc(curve.cost_to_accuracy),
    )  # fmt: skip


def plan_chart_data(plan: dict | PlanRecord, trials: Sequence[Trial | dict]) -> PlanChart:
    """What a plan chart shows, for the PNG and the dashboard alike: per cluster size the
    predicted time and cost vs global batch, the measured points (time: E epochs of S(B)
    measured steps and the epoch's end, with preemptions on spot), the knee; the Pareto frontier, the
    constraints and the choice."""
    from tula.core.pricing import make_pricing
    from tula.core.run_costs import epoch_time_s

    rec = as_record(plan, PlanRecord)
    ok_trials = [t for t in _trials(trials) if t.status == "ok"]
    spec = rec.spec
    pricing = make_pricing(spec.pricing)
    d, e = rec.dataset_size, spec.epochs
    series = []
    for n, curve in sorted(rec.curves.items(), key=lambda kv: int(kv[0])):
        meas = [
            (t.global_batch, t.t_step_s, t.peak_mem_bytes)
            for t in ok_trials
            if t.n_workers == int(n) and t.t_step_s is not None and t.peak_mem_bytes is not None
        ]  # an ok trial has both (ProfileRecord checks it)
        measured = ChartLine([], [], [])
        if meas:
            gb = [g for g, _, _ in meas]
            costs = rec.run_costs
            ep = epoch_time_s([s for _, s, _ in meas], gb, int(n), d, costs, whole_steps=False)
            tt = pricing.expected_time_s(e * ep, int(n), ep)
            cc = pricing.cost(tt, int(n), [m for _, _, m in meas])
            measured = ChartLine(list(gb), [float(x) for x in tt], [float(x) for x in cc])
        kn = rec.knees.get(n)
        series.append(ChartSeries(int(n), _line(curve), measured, kn.global_batch if kn else None))
    cons = rec.constraints
    return PlanChart(
        name=spec.name,
        objective=rec.objective,
        epochs=e,
        pricing=spec.pricing.kind,
        unit=pricing.unit,
        series=series,
        frontier=[FrontierPoint(f.n_workers, f.global_batch, f.total_time_s, f.cost) for f in rec.frontier],
        deadline_s=None if cons is None else cons.deadline_s,
        budget=None if cons is None else cons.budget,
        choice=rec.choice,
        reason=rec.reason,
    )


def plot_plan(plan: dict | PlanRecord, trials: Sequence[Trial | dict], path: str | Path) -> Path:
    """Write :func:`plan_figure` as a PNG at ``path``."""
    return _save_figure(plan_figure(plan, trials), path)


def plan_figure(plan: dict | PlanRecord, trials: Sequence[Trial | dict]):
    """Time and cost vs global batch per cluster size: predicted lines, measured points
    (time: E epochs of S(B) measured steps and the epoch's end), the chosen configuration starred;
    where the rows have a sequence length, against the tokens of a batch (:func:`_tokens_plan_figure`).
    An open matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = as_record(plan, PlanRecord)
    if any(r.sequence_length is not None for r in rec.configurations):
        return _tokens_plan_figure(rec, trials)
    data = plan_chart_data(plan, trials)
    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, s in enumerate(data.series):
        col, n, pred, meas = colors[k % len(colors)], s.n_workers, s.predicted, s.measured
        ax_t.plot(pred.global_batch, pred.total_time_s, "-", color=col, label=f"N={n} predicted")
        ax_c.plot(pred.global_batch, pred.cost, "-", color=col, label=f"N={n} predicted")
        if pred.time_to_accuracy_s is not None:  # the epochs scaled by the noise scale: dashed
            ax_t.plot(pred.global_batch, pred.time_to_accuracy_s, "--", color=col, label=f"N={n} to accuracy")
            ax_c.plot(pred.global_batch, pred.cost_to_accuracy, "--", color=col)
        if meas.global_batch:
            ax_t.plot(meas.global_batch, meas.total_time_s, "o", color=col, label=f"N={n} measured")
            ax_c.plot(meas.global_batch, meas.cost, "o", color=col)
        if s.knee_batch:
            ax_t.axvline(s.knee_batch, color=col, ls=":", lw=1)
    if data.deadline_s is not None:
        ax_t.axhline(data.deadline_s, color="red", ls="--", lw=1, label="deadline")
    if data.budget is not None:
        ax_c.axhline(data.budget, color="red", ls="--", lw=1, label="budget")
    c = data.choice
    to_acc = OBJECTIVES[data.objective].to_accuracy if data.objective in OBJECTIVES else False
    tk, ck = ("time_to_accuracy_s", "cost_to_accuracy") if to_acc else ("total_time_s", "cost")
    for ax, y in ((ax_t, data.chosen_y(tk)), (ax_c, data.chosen_y(ck))):
        ax.plot(
            [c.global_batch],
            [y],
            marker="*",
            ms=18,
            color="gold",
            mec="black",
            ls="none",
            label=f"chosen: N={c.n_workers}, B={c.global_batch}",
        )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch B")
        ax.grid(alpha=0.3)
    ax_t.set_ylabel(
        f"training time for {data.epochs} epochs (s)"
        + (
            "; dashed: to their accuracy at B0"
            if any(s.predicted.time_to_accuracy_s is not None for s in data.series)
            else ""
        )
    )
    ax_c.set_ylabel(f"cost ({data.pricing} pricing, {data.unit})")
    ax_t.legend(fontsize=8)
    ax_c.legend(fontsize=8)
    fig.suptitle(f"{data.name}: objective {data.objective} (dotted: knee per cluster size)")
    return fig


#: a plan row's step: (L, parallelism, checkpointing)
_Step = tuple[int | None, str, bool]


def _step_words(step: _Step) -> str:
    """``L=64, fsdp, checkpointed``: a plan row's step in words (a legend's label)."""
    length, parallelism, checkpointing = step
    return f"L={length}, {parallelism}" + (", checkpointed" if checkpointing else "")


def _trial_step(trial: Trial, spec: JobSpec) -> _Step:
    """The step a profiled trial ran: its length, and its variant (a variant trial's, else the spec's own)."""
    own = "ddp" if spec.train.parallelism == "auto" else spec.train.parallelism
    return (
        trial.sequence_length,
        trial.parallelism or own,
        bool(trial.checkpointing or spec.train.checkpointing == "on"),
    )


#: one line style per cluster size where the colours are the steps (L, variant)
_SIZE_STYLES: tuple[str | tuple, ...] = ("-", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def _tokens_plan_figure(rec: PlanRecord, trials: Sequence[Trial | dict]):
    """A plan of a model of sequences: time and cost (to accuracy, where the objective is) against
    the tokens of a global batch, B x L.  One step (L, variant) planned: a line per cluster size, as a
    CNN's plan; several: one colour and one legend entry per step, one line style per cluster size.
    The profiled trials of each step as points, the choice starred with its L, parallelism and
    checkpointing.  An open matplotlib figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    plot = _TokensPlot(rec, plt.rcParams["axes.prop_cycle"].by_key()["color"])
    plot.lines(axes)
    if not plot.to_accuracy:  # the profiled trials, as E epochs of their measured steps
        plot.measured(axes, _trials(trials))
    knees = plot.marks(axes)
    how = "colour: L and variant, line style: cluster size" if plot.several else ""
    how = how or ("dotted: knee per cluster size" if knees else "")
    fig.suptitle(f"{rec.spec.name}: objective {rec.objective}" + (f" ({how})" if how else ""))
    return fig


class _TokensPlot:
    """What :func:`_tokens_plan_figure` draws: the plan's feasible rows of a length, their steps (L,
    variant) and cluster sizes, and the metric the objective ranks by (to accuracy, or the epochs')."""

    def __init__(self, rec: PlanRecord, colors: list[str]):
        self.rec, self.colors = rec, colors
        self.to_accuracy = OBJECTIVES[rec.objective].to_accuracy if rec.objective in OBJECTIVES else False
        self.keys = ("time_to_accuracy_s", "cost_to_accuracy") if self.to_accuracy else ("total_time_s", "cost")
        self.rows = [
            r
            for r in rec.configurations
            if r.feasible and r.sequence_length is not None and getattr(r, self.keys[0]) is not None
        ]
        self.steps: list[_Step] = sorted(
            {(r.sequence_length, r.parallelism, r.checkpointing) for r in self.rows},
            key=lambda s: (s[0] or 0, s[1], s[2]),
        )
        self.sizes = sorted({r.n_workers for r in self.rows})
        self.several = len(self.steps) > 1

    def look(self, step: _Step, n_workers: int) -> tuple[str, str | tuple]:
        """The colour and line style of a step's line at a cluster size."""
        i, j = self.steps.index(step), self.sizes.index(n_workers)
        if self.several:
            return self.colors[i % len(self.colors)], _SIZE_STYLES[j % len(_SIZE_STYLES)]
        return self.colors[j % len(self.colors)], "-"

    def line(self, step: _Step, n_workers: int) -> list[PlanRow]:
        """A step's rows at a cluster size by global batch, the fastest of each B."""
        best: dict[int, PlanRow] = {}
        for r in self.rows:
            if (r.sequence_length, r.parallelism, r.checkpointing) == step and r.n_workers == n_workers:
                if r.global_batch not in best or getattr(r, self.keys[0]) < getattr(best[r.global_batch], self.keys[0]):
                    best[r.global_batch] = r
        return [best[b] for b in sorted(best)]

    def lines(self, axes) -> None:
        """The predicted lines: per step and cluster size, the legend naming each step (each size with one)."""
        for step in self.steps:
            labelled = False
            for n in self.sizes:
                line = self.line(step, n)
                if not line:
                    continue
                col, style = self.look(step, n)
                label = f"N={n} predicted" if not self.several else None if labelled else _step_words(step)
                labelled = True
                tokens = [r.global_batch * (step[0] or 1) for r in line]
                for ax, key in zip(axes, self.keys):
                    ax.plot(tokens, [getattr(r, key) for r in line], color=col, ls=style, label=label)
        if self.several and len(self.sizes) > 1:  # which line style is which cluster size
            for j, n in enumerate(self.sizes):
                for ax in axes:
                    ax.plot([], [], color="grey", ls=_SIZE_STYLES[j % len(_SIZE_STYLES)], label=f"N={n}")

    def measured(self, axes, trials: list[Trial]) -> None:
        """The profiled trials of a step planned, as points: E epochs of their measured steps, and their cost."""
        from tula.core.pricing import make_pricing
        from tula.core.run_costs import epoch_time_s

        spec, pricing = self.rec.spec, make_pricing(self.rec.spec.pricing)
        for t in trials:
            step = _trial_step(t, spec)
            if t.status != "ok" or step not in self.steps or t.n_workers not in self.sizes:
                continue
            if t.t_step_s is None or t.peak_mem_bytes is None:  # an ok trial has both (ProfileRecord checks it)
                continue
            ep = epoch_time_s(t.t_step_s, t.global_batch, t.n_workers, self.rec.dataset_size, self.rec.run_costs)
            time_s = pricing.expected_time_s(spec.epochs * ep, t.n_workers, ep)
            cost = pricing.cost(time_s, t.n_workers, t.peak_mem_bytes)
            col, _ = self.look(step, t.n_workers)
            for ax, y in zip(axes, (time_s, cost)):
                ax.plot([t.global_batch * (step[0] or 1)], [float(y)], "o", color=col, ms=4)

    def marks(self, axes) -> bool:
        """The knees (one step planned), the deadline and budget, the choice starred, the axes; whether
        knees were drawn."""
        from tula.core.pricing import make_pricing

        rec, (ax_t, ax_c) = self.rec, axes
        knees = not self.several and bool(rec.knees)  # of each cluster size's curve: one step's rows
        for n in self.sizes if knees else []:
            knee = rec.knees.get(str(n))
            if knee is not None:
                ax_t.axvline(knee.global_batch * (self.steps[0][0] or 1), color=self.look(self.steps[0], n)[0],
                             ls=":", lw=1)  # fmt: skip
        cons = rec.constraints
        if cons is not None and cons.deadline_s is not None:
            ax_t.axhline(cons.deadline_s, color="red", ls="--", lw=1, label="deadline")
        if cons is not None and cons.budget is not None:
            ax_c.axhline(cons.budget, color="red", ls="--", lw=1, label="budget")
        c = rec.choice
        chosen = c.global_batch * (c.sequence_length or 1)
        label = (
            f"chosen: N={c.n_workers}, B={c.global_batch} ({chosen} tokens), "
            f"{_step_words((c.sequence_length, c.parallelism, c.checkpointing))}"
        )
        for ax, key in zip(axes, self.keys):
            value = getattr(c, key)
            ax.plot([chosen], [float("nan") if value is None else value], marker="*", ms=18, color="gold",
                    mec="black", ls="none", label=label)  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tokens per global batch, B x L")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        spec = rec.spec
        unit = make_pricing(spec.pricing).unit
        acc = self.to_accuracy
        ax_t.set_ylabel("time to their accuracy at B0 (s)" if acc else f"training time for {spec.epochs} epochs (s)")
        ax_c.set_ylabel(f"cost{' to that accuracy' if acc else ''} ({spec.pricing.kind} pricing, {unit})")
        return knees


def fmt_bandwidth(bytes_per_s: float) -> str:
    """``"100 Gbit/s (12.5 GB/s)"``; ``inf``: free."""
    if bytes_per_s == float("inf"):
        return "unlimited"
    return f"{bytes_per_s * 8 / 1e9:.3g} Gbit/s ({bytes_per_s / 1e9:.3g} GB/s)"


def _simulated_network(sim) -> str:
    """The line a simulation's tables and plot say its network in: the links the sync runs on, or, for
    FSDP's step from its fitted effect, that sync as the profile measured it (no link of it is known);
    the compute speed and the ranks per node."""
    if sim.sharding is not None:
        sync = sharded_sync_words(sim.sharding, sim.perf.collective)
        return f"{sync}; compute x{sim.compute_speed:g}, {sim.ranks_per_node} rank(s) per node"
    link = f"bandwidth {fmt_bandwidth(sim.bandwidth_bytes_per_s)}, latency {sim.latency_s * 1e6:.3g} us"
    ibw = sim.bandwidth_bytes_per_s if sim.intra_bandwidth_bytes_per_s is None else sim.intra_bandwidth_bytes_per_s
    ilat = sim.latency_s if sim.intra_latency_s is None else sim.intra_latency_s
    if sim.ranks_per_node > 1 and (ibw, ilat) != (sim.bandwidth_bytes_per_s, sim.latency_s):
        link += f" between nodes, {fmt_bandwidth(ibw)} and {ilat * 1e6:.3g} us within"
    return f"{link}, compute x{sim.compute_speed:g}, {sim.ranks_per_node} rank(s) per node"


def _dur(x: float | None) -> str:
    from tula.core.spec import format_duration

    return "-" if x is None else format_duration(x)


def simulation_tables(sim, rows: Sequence[SimulatedRow], unit: str = "$") -> list[Table]:
    """One table per collective of a constant-batch simulation (rows: N) or a schedule
    simulation (rows: schedules): step time, epoch time, total time, cost, updates."""
    out = []
    for c in dict.fromkeys(r.collective for r in rows):
        mine = [r for r in rows if r.collective == c]
        scheduled = [r for r in mine if isinstance(r, ScheduleRow)]
        constant = [r for r in mine if isinstance(r, ConstantRow)]
        out.append(_schedule_table(sim, c, scheduled, unit) if scheduled else _constant_table(sim, c, constant, unit))
    return out


def _schedule_table(sim, collective: str, rows: list[ScheduleRow], unit: str) -> Table:
    """A schedule simulation's table on one collective: a row per schedule."""
    t = Table(title=f"Simulated {collective}, {sim.epochs} epochs: {_simulated_network(sim)}")
    acc = any(r.max_accumulation_steps > 1 for r in rows)
    for col in (
        "schedule",
        "updates",
        "max B",
        "max N",
        *(("max k",) if acc else ()),
        "resizes",
        "step ms (mean)",
        "epoch (mean)",
        "total",
        f"cost {unit}",
    ):
        t.add_column(col, justify="right" if col != "schedule" else "left")
    for r in rows:
        t.add_row(
            r.schedule,
            str(r.updates),
            str(r.max_batch),
            str(r.max_workers),
            *((str(r.max_accumulation_steps),) if acc else ()),
            str(r.resizes),
            _ms(r.t_step_s),
            _dur(r.epoch_time_s),
            _dur(r.total_time_s),
            f"{r.cost:.4g}",
        )
    return t


def _constant_table(sim, collective: str, rows: list[ConstantRow], unit: str) -> Table:
    """A constant-batch simulation's table on one collective: a row per cluster size N."""
    t = Table(
        title=f"Simulated {collective}, B={rows[0].global_batch} constant, {sim.epochs} epochs: "
        f"{_simulated_network(sim)}"
    )
    acc = any(r.time_to_accuracy_s is not None for r in rows)
    # the step of each row, where the models record says it (a plan's L, parallelism and ckpt columns)
    given = {
        f: any(getattr(r, f) is not None for r in rows) for f in ("sequence_length", "parallelism", "checkpointing")
    }
    step = [
        c
        for c in (
            _Column[ConstantRow]("L", lambda r: str(r.sequence_length), shown=given["sequence_length"]),
            _Column[ConstantRow]("parallelism", lambda r: str(r.parallelism), shown=given["parallelism"]),
            _Column[ConstantRow]("ckpt", lambda r: "on" if r.checkpointing else "off", shown=given["checkpointing"]),
        )
        if c.shown
    ]
    tokens = any(r.tokens_per_s is not None for r in rows)  # where L is known: B * L / t_step
    for col in (
        "N",
        "b",
        *(c.header for c in step),
        "step ms",
        *(("tokens/s",) if tokens else ()),
        "sync ms",
        "epoch",
        "total",
        f"cost {unit}",
        *(("to accuracy",) if acc else ()),
        "updates",
        "speed-up",
        "note",
    ):
        t.add_column(col, justify="right" if col != "note" else "left")
    # the speed-up over each step's first row with times (one step per sequence length asked)
    bases: dict[int | None, float] = {}
    for r in rows:
        if r.total_time_s is not None:
            bases.setdefault(r.sequence_length, r.total_time_s)
    for r in rows:
        base = bases.get(r.sequence_length)
        speed = "-" if r.total_time_s is None or base is None else f"{base / r.total_time_s:.2f}x"
        t.add_row(
            str(r.n_workers),
            f"{r.local_batch:.4g}",
            *_cells(step, r),
            _ms(r.t_step_s),
            *((("-" if r.tokens_per_s is None else f"{r.tokens_per_s:.4g}"),) if tokens else ()),
            _ms(r.t_sync_s),
            _dur(r.epoch_time_s),
            _dur(r.total_time_s),
            "-" if r.cost is None else f"{r.cost:.4g}",
            *((_dur(r.time_to_accuracy_s),) if acc else ()),
            str(r.updates),
            speed,
            r.note,
            style="dim" if r.note else None,
        )
    return t


def _row_label(r: SimulatedRow, lengths: bool = False) -> str | int:
    """What a simulated row is about: its schedule, or its cluster size N (``lengths``: with its
    sequence length, where the rows are of several)."""
    if isinstance(r, ScheduleRow):
        return r.schedule
    return f"{r.n_workers} (L={r.sequence_length})" if lengths else r.n_workers


def _several_lengths(rows: Sequence[SimulatedRow]) -> bool:
    """Whether constant-batch rows are of more than one sequence length (``tula simulate --sequence-length``)."""
    return len({r.sequence_length for r in rows if isinstance(r, ConstantRow)}) > 1


def simulation_summary(rows: Sequence[SimulatedRow]) -> Table:
    """AdaDamp's Table 2 layout: total training time, rows N (or schedules), a column per collective."""
    scheduled = isinstance(rows[0], ScheduleRow)
    colls = list(dict.fromkeys(r.collective for r in rows))
    t = Table(title="Simulated training time" + (" per schedule" if scheduled else " per cluster size"))
    t.add_column("schedule" if scheduled else "N", justify="left" if scheduled else "right")
    for c in colls:
        t.add_column(c, justify="right")
    lengths = _several_lengths(rows)
    for k in dict.fromkeys(_row_label(r, lengths) for r in rows):
        by = {r.collective: r for r in rows if _row_label(r, lengths) == k}
        t.add_row(str(k), *[_dur(by[c].total_time_s) if c in by else "-" for c in colls])
    return t


def plot_simulation(
    sim,
    rows: Sequence[SimulatedRow],
    path: str | Path,
    title: str = "",
    measured: Sequence[MeasuredPoint] | None = None,
) -> Path:
    """Constant batch: total time and cost vs N (log-log), a line per collective, the
    profiled measurements (E * updates * measured t_step) as points.  Schedules: total time
    and cost per schedule, a bar per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(12, 4.6))
    colls = list(dict.fromkeys(r.collective for r in rows))
    scheduled = [r for r in rows if isinstance(r, ScheduleRow)]
    if scheduled:
        names = list(dict.fromkeys(r.schedule for r in scheduled))
        x = np.arange(len(names))
        w = 0.8 / len(colls)
        for j, c in enumerate(colls):
            by = {r.schedule: r for r in scheduled if r.collective == c}
            ax_t.bar(x + j * w, [by[s].total_time_s for s in names], w, label=c)
            ax_c.bar(x + j * w, [by[s].cost for s in names], w, label=c)
        for ax in (ax_t, ax_c):
            ax.set_xticks(x + w * (len(colls) - 1) / 2, names, rotation=20, fontsize=8)
            ax.set_yscale("log")
    else:
        several = _several_lengths(rows)  # a line per collective and sequence length
        lengths = list(dict.fromkeys(r.sequence_length for r in rows if isinstance(r, ConstantRow)))
        for c in colls:
            for length in lengths:
                mine = [
                    r
                    for r in rows
                    if isinstance(r, ConstantRow)
                    and r.collective == c
                    and r.sequence_length == length
                    and r.total_time_s is not None
                ]
                n = [r.n_workers for r in mine]
                label = f"{c} L={length}" if several else c
                ax_t.plot(n, [r.total_time_s for r in mine], "o-", ms=3, label=label)
                ax_c.plot(n, [r.cost for r in mine], "o-", ms=3, label=label)
        if measured:
            ax_t.plot(
                [m.n_workers for m in measured],
                [m.total_time_s for m in measured],
                "k*",
                ms=10,
                label="profiled (measured step time)",
            )
        for ax in (ax_t, ax_c):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("workers N")
    ax_t.set_ylabel(f"training time for {sim.epochs} epochs (s)")
    ax_c.set_ylabel(f"cost ({sim.pricing.unit})")
    for ax in (ax_t, ax_c):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle((title + "\n" if title else "") + _simulated_network(sim), fontsize=10, wrap=True)
    return _save_figure(fig, path)


def _save_figure(fig, path: str | Path) -> Path:
    """Lay out, write as PNG (creating the folder) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def train_table(rec: TrainRecord) -> Table:
    """One row per epoch: loss, accuracy (or R^2, perplexity), time, LR and (AGS) the share of scaled steps."""
    history = list(rec.history)
    top5 = any(h.given("test_top5") for h in history)
    score = epoch_score(history[0])[0] if history else "top-1"
    perplexity = score != "perplexity" and any(h.test_perplexity is not None for h in history)
    scaled = any(h.given("scaled_fraction") for h in history)
    predicted = any(h.predicted_epoch_s for h in history)
    from tula.core.run_costs import measured_epoch_s

    grows = len({(h.global_batch, h.n_workers) for h in history}) > 1
    length = reference_sequence_length(rec.spec.data)  # the sequence length trained at: tokens/s too
    t = Table(
        title=f"Training: {rec.method} on N={rec.n_workers}, B={rec.global_batch} "
        f"(b={rec.local_batch}"
        + (f" in {rec.accumulation_steps} micro-batches of {rec.micro_batch}" if rec.accumulation_steps > 1 else "")
        + f", {rec.steps_per_epoch} steps/epoch)"
    )
    # the epoch as the plan predicted it (steps, evaluation, checkpoint) when predicted
    columns = _add_columns(
        t,
        [
            _Column[EpochRecord]("epoch", lambda h: str(h.epoch)),
            _Column[EpochRecord]("B", lambda h: str(h.global_batch), shown=grows),
            _Column[EpochRecord]("N", lambda h: str(h.n_workers), shown=grows),
            _Column[EpochRecord]("updates", lambda h: str(h.steps_done), shown=grows),
            _Column[EpochRecord]("train loss", lambda h: f"{h.train_loss:.4f}"),
            _Column[EpochRecord]("test loss", lambda h: f"{h.test_loss:.4f}"),
            # a user's loss without labels: the test loss is the score
            _Column[EpochRecord](score, lambda h: epoch_score(h)[2], shown=score != "loss"),
            _Column[EpochRecord]("top-5", lambda h: f"{h.test_top5:.2%}", shown=top5),
            _Column[EpochRecord](  # a sequence model's, beside its top-1
                "perplexity",
                lambda h: f"{h.test_perplexity:.2f}" if h.test_perplexity is not None else "-",
                shown=perplexity,
            ),
            _Column[EpochRecord]("epoch s", lambda h: f"{h.epoch_time_s:.2f}"),
            _Column[EpochRecord](
                "tokens/s", lambda h: _rate(epoch_tokens(h, length), h.epoch_time_s), shown=length is not None
            ),
            _Column[EpochRecord]("wall s", lambda h: f"{measured_epoch_s(h):.3f}", shown=predicted),
            _Column[EpochRecord](
                "planned s", lambda h: f"{h.predicted_epoch_s:.3f}" if h.predicted_epoch_s else "-", shown=predicted
            ),
            _Column[EpochRecord](
                "x plan",
                lambda h: f"{h.measured_to_predicted:.2f}x" if h.measured_to_predicted else "-",
                shown=predicted,
            ),
            _Column[EpochRecord]("lr", lambda h: f"{h.lr:.4g}"),
            _Column[EpochRecord]("scaled steps", lambda h: f"{h.scaled_fraction or 0:.0%}", shown=scaled),
        ],
    )
    for h in history:
        t.add_row(*_cells(columns, h))
    return t


def plot_training(run: TrainRecord, path: str | Path) -> Path:
    """Write :func:`training_figure` as a PNG at ``path``."""
    return _save_figure(training_figure(run), path)


def training_figure(run: TrainRecord):
    """Test accuracy and training loss per epoch; for AGS and static scaling also the
    gradient variability Δ(G) per step with scaled and unscaled steps marked; where the batch
    changes or B_simple was measured, the global batch, workers and B_simple per epoch on a
    log axis (B_simple's raw points, its running median and the early estimate -- the
    training-time counterpart of the profile's B_noise that the planner uses --, by :mod:`tula.core.noise_scale`'s rules).  An open matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec, history = run, list(run.history)
    tr = rec.traces
    has_delta = bool(tr.delta)
    grows = len({(h.global_batch, h.n_workers) for h in history}) > 1
    noise = [noise_scale_value(h.b_simple) for h in history]  # None: not on a log axis
    measured = any(b is not None for b in noise)
    grows = grows or measured  # the batch panel also shows B_simple
    predicted = any(h.predicted_epoch_s for h in history)
    goodput = goodput_per_epoch(run)
    cols = 1 + has_delta + grows + predicted + bool(goodput)
    fig, axes = plt.subplots(1, cols, figsize=(6 * cols, 4.4), squeeze=False)
    if grows:
        _batch_panel(axes[0, 1 + has_delta], rec, history, noise, measured)
    _accuracy_panel(axes[0, 0], rec, history)
    if has_delta:
        _delta_panel(axes[0, 1], tr)
    if predicted:
        _epoch_time_panel(axes[0, 1 + has_delta + grows], rec, history)
    if goodput:
        _goodput_panel(axes[0, cols - 1], goodput)
    length = reference_sequence_length(rec.spec.data)
    if length is not None:  # a model of sequences: the step trained, its batch in tokens
        t = rec.spec.train
        fig.suptitle(
            f"{rec.spec.name}: {rec.method} at L={length}, B={rec.global_batch} ({rec.global_batch * length} tokens a "
            f"batch), {t.parallelism}, checkpointing {t.checkpointing}",
            fontsize=10,
        )
    return fig


def _goodput_panel(ax, rows: list[GoodputRow]) -> None:
    """A goodput schedule's useful samples per second per epoch, measured and as its choice
    predicted (:func:`tula.core.live_plan.goodput_per_epoch`), each epoch's (N, B) marked."""
    ep = [r.epoch for r in rows]
    ax.plot(ep, [r.measured for r in rows], "o-", label="measured")
    pred = [(r.epoch, r.predicted) for r in rows if r.predicted is not None]
    if pred:
        ax.plot(*zip(*pred), "s--", color="tab:purple", label="predicted")
    for r in rows:
        ax.annotate(f"N={r.n_workers} B={r.global_batch}", (r.epoch, r.measured), fontsize=6,
                    xytext=(2, 4), textcoords="offset points")  # fmt: skip
    ax.set_title("goodput: samples/s x (B_noise + B0) / (B_noise + B)", fontsize=10)
    ax.set_xlabel("epoch")
    ax.set_ylabel("useful samples per second")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _epoch_time_panel(ax, run: TrainRecord, history: list[EpochRecord]) -> None:
    """Each epoch's measured time beside the plan's prediction at its (B, N, k), a new world
    (a generation) marked where one started: how far the models that chose were right."""
    from tula.core.run_costs import measured_epoch_s

    hist = [h for h in history if h.predicted_epoch_s]
    ep = [h.epoch for h in hist]
    ax.plot(ep, [measured_epoch_s(h) for h in hist], "o-", label="measured")
    ax.plot(ep, [h.predicted_epoch_s for h in hist], "s--", color="tab:purple", label="predicted")
    for g in run.generations or []:
        if g.new_world and g.from_epoch > 1:
            ax.axvline(g.from_epoch - 0.5, color="grey", ls=":", lw=1)
    for h in hist:
        k = h.accumulation_steps or 1
        ax.annotate(f"N={h.n_workers} B={h.global_batch}" + (f" k={k}" if k > 1 else ""),
                    (h.epoch, measured_epoch_s(h)), fontsize=6, xytext=(2, 4), textcoords="offset points")  # fmt: skip
    ratio = run.prediction.median_ratio if run.prediction is not None else None
    ax.set_title("epoch time" + (f": measured / predicted {ratio:.2f} (median)" if ratio else ""), fontsize=10)
    ax.set_xlabel("epoch")
    ax.set_ylabel("seconds per epoch")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _batch_panel(axg, run: TrainRecord, history: list[EpochRecord], noise: list[float | None], measured: bool) -> None:
    """The batch schedule: global batch and workers per epoch (and B_simple where measured)."""
    ep = [h.epoch for h in history]
    axg.step(ep, [h.global_batch for h in history], where="mid", label="global batch B")
    if measured:
        _noise_scale_lines(axg, ep, noise)
    axg.set_yscale("log", base=10 if measured else 2)
    axg.set_xlabel("epoch")
    axg.set_ylabel("samples (global batch B, B_simple)" if measured else "global batch B")
    axg.grid(alpha=0.3, which="major")
    axw = axg.twinx()
    axw.step(ep, [h.n_workers for h in history], where="mid", color="tab:orange", ls="--", label="workers N")
    axw.set_ylabel("workers N")
    axg.set_title(
        f"batch {run.batch_schedule or 'constant'}: {run.steps_done} model updates"
        + ("" if measured else "; B_simple not measured"),
        fontsize=10,
    )
    axg.legend(loc="upper left", fontsize=7)
    axw.legend(loc="lower right", fontsize=7)


def _accuracy_panel(ax, run: TrainRecord, history: list[EpochRecord]) -> None:
    """Test score and training loss per epoch, the out-of-memory fallbacks marked."""
    ep = [h.epoch for h in history]
    score = epoch_score(history[0])[0] if history else "top-1"
    ax.plot(ep, [epoch_score(h)[1] for h in history], "o-", label=f"test {score}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("test top-1 accuracy" if score == "top-1" else f"test {score}")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(ep, [h.train_loss for h in history], "s--", color="tab:red", alpha=0.7, label="train loss")
    ax2.set_ylabel("train loss")
    for f in run.fallbacks:
        ax.axvline(f.at_epoch + 0.5, color="grey", ls=":", lw=1)
    ax.legend(loc="lower right", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{run.method}: N={run.n_workers}, B={run.global_batch}")


def _delta_panel(axd, tr: MethodTraces) -> None:
    """AGS's gradient variability per step, its scaled and unscaled steps and the threshold."""
    import numpy as np

    d = np.array([np.nan if v is None else v for v in tr.delta or []], float)
    steps = np.arange(len(d))
    scaled = np.array(tr.scaled, bool)
    axd.semilogy(steps[scaled], d[scaled], ".", ms=3, color="tab:green", label="scaled step")
    axd.semilogy(steps[~scaled], d[~scaled], ".", ms=3, color="tab:red", label="sensitive step (unscaled)")
    axd.axhline(tr.delta_threshold, color="black", ls="--", lw=1, label=f"δ = {tr.delta_threshold}")
    axd.set_xlabel("step")
    axd.set_ylabel("gradient variability Δ(G)")
    f = tr.factors
    extra = f", factors mean {f.mean:.2f} [{f.min:.2f}, {f.max:.2f}]" if f else ""
    axd.set_title(f"{tr.scaled_fraction:.0%} of steps scaled{extra}", fontsize=10)
    axd.legend(fontsize=8)
    axd.grid(alpha=0.3)


def _noise_scale_lines(ax, epochs: list, noise: list[float | None]) -> None:
    """B_simple per epoch on ``ax`` (a log axis): the raw points, their running median, and
    the early estimate (median, p25-p75 band) marked.
    ``noise``: one usable value or ``None`` per epoch."""
    ax.plot(
        [e for e, b in zip(epochs, noise) if b is not None],
        [b for b in noise if b is not None],
        "o",
        color="tab:green",
        ms=3.5,
        alpha=0.6,
        label="B_simple per epoch",
    )
    smooth = [(e, v) for e, v in zip(epochs, smooth_noise_scale(noise)) if v is not None]
    ax.plot(
        [e for e, _ in smooth],
        [v for _, v in smooth],
        "-",
        color="tab:green",
        lw=1.8,
        label=f"B_simple, running median of {SMOOTH_EPOCHS} epochs",
    )
    early = early_noise_scale(noise)
    if early is None:
        return
    k = early_epochs(len(noise))
    ax.axhspan(early.p25, early.p75, color="tab:purple", alpha=0.15, lw=0, label="early B_simple p25-p75")
    ax.axhline(
        early.median,
        color="tab:purple",
        ls="--",
        lw=1.2,
        label=f"early B_simple {early.median:.3g} (median of epochs {epochs[0]}-{epochs[k - 1]})",
    )
    ax.annotate(
        f"early B_simple {early.median:.3g}",
        (epochs[k - 1], early.median),
        xytext=(4, -11),
        textcoords="offset points",
        fontsize=7,
        color="tab:purple",
    )
