"""The dashboard's charts: SVG drawn here, with no script and nothing fetched, from the same
chart data as the PNGs (:func:`tula.report.plan_chart_data`; a training record's history).
Every point carries its values as a hover title.

:func:`svg_chart` draws one chart in named steps (the frame, the axes, the bands and rules,
the lines, the points, the legend); :func:`plan_charts`, :func:`train_charts` and
:func:`noise_chart` say what each of the dashboard's charts shows.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from tula.core.live_plan import GoodputRow, goodput_per_epoch
from tula.core.noise_scale import (
    SMOOTH_EPOCHS,
    early_epochs,
    early_noise_scale,
    noise_scale_value,
    smooth_noise_scale,
)
from tula.core.records import EpochRecord, Generation, TrainRecord, as_epoch, epoch_score
from tula.core.say import plain

if TYPE_CHECKING:
    from tula.report import PlanChart

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def esc(x: Any) -> str:
    """``x`` as text safe in HTML, attribute values included (markup is never taken from data)."""
    return html.escape(plain(x), quote=True)


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _fmt_tick(v: float) -> str:
    """A log axis's tick: ``50``, ``2000``, ``1e4``, ``2e6``, ``0.01``."""
    if 1e-3 <= v < 1e4:
        return f"{v:g}"
    m, e = f"{v:.0e}".split("e")
    return f"{m}e{int(e)}"


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks between 10**lo and 10**hi: the decades, and 2 and 5 times them when fewer than
    three decades fit."""
    decades = range(math.floor(lo), math.ceil(hi) + 1)
    mults = (1,) if sum(lo <= e <= hi for e in decades) >= 3 else (1, 2, 5)
    return [m * 10.0**e for e in decades for m in mults if lo - 1e-9 <= math.log10(m * 10.0**e) <= hi + 1e-9]


# --------------------------------------------------------------------------- what a chart draws
@dataclass(frozen=True)
class Line:
    """A series drawn as a line through its drawable points; always in the legend."""

    x: Sequence[float]
    y: Sequence[float | None]
    color: str
    label: str


@dataclass(frozen=True)
class Points:
    """A series drawn as marks, each with its hover ``title``: a dot of radius ``r``, a star
    (``marker`` ``*``) or a diamond (``d``)."""

    x: Sequence[float]
    y: Sequence[float | None]
    color: str
    label: str
    title: Sequence[str]
    marker: str = "o"
    r: float = 4
    legend: bool = True


@dataclass(frozen=True)
class Rule:
    """A dashed rule across the chart at ``at`` (a y value for a horizontal rule, an x value for
    a vertical one); its hover title is ``title``, else its ``label``."""

    at: float
    color: str
    label: str
    title: str | None = None
    legend: bool = False


@dataclass(frozen=True)
class Band:
    """A shaded horizontal band from ``lo`` to ``hi``; its hover title is ``title``, else its ``label``."""

    lo: float
    hi: float
    color: str
    label: str
    title: str | None = None
    legend: bool = False


# --------------------------------------------------------------------------- one chart, step by step
@dataclass(frozen=True)
class _Frame:
    """Where a chart's values land: the plot area inside the margins of a ``width`` x
    ``height`` picture, and the axes' ranges ``x0..x1`` and ``y0..y1`` in their scales
    (log2 of x with ``log_x``, log10 of y with ``log_y``)."""

    width: int
    height: int
    x0: float
    x1: float
    y0: float
    y1: float
    log_x: bool
    log_y: bool
    left: int = 64
    right: int = 16
    top: int = 28
    bottom: int = 44

    @property
    def pw(self) -> int:
        return self.width - self.left - self.right

    @property
    def ph(self) -> int:
        return self.height - self.top - self.bottom

    def ok(self, y: Any) -> TypeGuard[float]:
        """Whether ``y`` can be drawn: a finite number, above 0 on a log y axis."""
        return _drawable(y, self.log_y)

    def px(self, v: float) -> float:
        tx = math.log2(v) if self.log_x else v
        return self.left + (tx - self.x0) / (self.x1 - self.x0) * self.pw

    def py(self, v: float) -> float:
        ty = math.log10(v) if self.log_y else v
        return self.top + self.ph - (ty - self.y0) / (self.y1 - self.y0) * self.ph


def _drawable(y: Any, log_y: bool) -> TypeGuard[float]:
    return isinstance(y, (int, float)) and math.isfinite(y) and (y > 0 or not log_y)


def _frame(
    lines: Sequence[Line],
    points: Sequence[Points],
    hlines: Sequence[Rule],
    bands: Sequence[Band],
    *,
    width: int,
    height: int,
    log_x: bool,
    log_y: bool,
) -> _Frame:
    """The frame that shows every x above 0 and every drawable y (of the series, the
    horizontal rules and the bands)."""
    series: list[Line | Points] = [*lines, *points]
    xs = [x for s in series for x in s.x if x and x > 0] or [1]
    ys: list[Any] = [y for s in series for y in s.y if _drawable(y, log_y)]
    ys += [h.at for h in hlines if _drawable(h.at, log_y)]
    ys += [v for b in bands for v in (b.lo, b.hi) if _drawable(v, log_y)]
    ys = ys or [1]
    x0, x1 = (math.log2(min(xs)), math.log2(max(xs))) if log_x else (min(xs), max(xs))
    if log_y:
        lo, hi = math.log10(min(ys)), math.log10(max(ys))
        pad = max(0.04 * (hi - lo), (1.0 - (hi - lo)) / 2)  # at least a decade shown
        y0, y1 = lo - pad, hi + pad
    else:
        y0, y1 = min(0.0, min(ys)), max(ys) * 1.08 or 1.0
    x1 = x1 if x1 > x0 else x0 + 1
    return _Frame(width, height, x0, x1, y0, y1, log_x, log_y)


def _axes(f: _Frame, x_label: str, y_label: str) -> list[str]:
    """The y grid and ticks, the x ticks (powers of 2 on a log axis, a few round numbers on a
    linear one), the axis labels and the plot area's border."""
    left, top, pw, ph = f.left, f.top, f.pw, f.ph
    if f.log_y:
        y_ticks = [(v, _fmt_tick(v)) for v in _log_ticks(f.y0, f.y1)]
    else:
        y_ticks = [(v, _fmt(v)) for v in (f.y0 + (f.y1 - f.y0) * k / 4 for k in range(5))]
    out = [
        f"<line x1='{left}' x2='{left + pw}' y1='{f.py(v):.1f}' y2='{f.py(v):.1f}' stroke='#eee'/>"
        f"<text x='{left - 6}' y='{f.py(v) + 4:.1f}' font-size='10' text-anchor='end'>{text}</text>"
        for v, text in y_ticks
    ]
    if f.log_x:
        decades = range(math.floor(f.x0), math.ceil(f.x1) + 1)
        x_ticks = [(2.0**e, int(2.0**e)) for e in decades if f.x0 - 1e-9 <= e <= f.x1 + 1e-9]
    else:
        step = max(1, math.ceil((f.x1 - f.x0) / 6))
        x_ticks = [(v, v) for v in range(math.ceil(f.x0), math.floor(f.x1) + 1, step)]
    out += [
        f"<text x='{f.px(v):.1f}' y='{top + ph + 14}' font-size='10' text-anchor='middle'>{t}</text>"
        for v, t in x_ticks
    ]
    out.append(
        f"<text x='{left + pw / 2}' y='{f.height - 8}' font-size='11' text-anchor='middle'>{esc(x_label)}</text>"
        f"<text x='14' y='{top + ph / 2}' font-size='11' text-anchor='middle' "
        f"transform='rotate(-90 14 {top + ph / 2})'>{esc(y_label)}</text>"
        f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='none' stroke='#999'/>"
    )
    return out


def _bands_and_rules(f: _Frame, bands: Sequence[Band], hlines: Sequence[Rule], vlines: Sequence[Rule]) -> list[str]:
    """Shaded horizontal bands, then dashed horizontal and vertical rules, each with its title."""
    out = []
    for b in bands:
        if f.ok(b.lo) and f.ok(b.hi):
            y_top, y_bot = f.py(max(b.lo, b.hi)), f.py(min(b.lo, b.hi))
            out.append(
                f"<rect class='band' data-label='{esc(b.label)}' x='{f.left}' y='{y_top:.1f}' width='{f.pw}' "
                f"height='{max(y_bot - y_top, 1.0):.1f}' fill='{b.color}' fill-opacity='0.15'>"
                f"<title>{esc(b.label if b.title is None else b.title)}</title></rect>"
            )
    for h in hlines:
        if f.ok(h.at):
            out.append(
                f"<line x1='{f.left}' x2='{f.left + f.pw}' y1='{f.py(h.at):.1f}' y2='{f.py(h.at):.1f}' "
                f"stroke='{h.color}' stroke-dasharray='6 3'><title>{esc(h.label if h.title is None else h.title)}"
                "</title></line>"
            )
    for v in vlines:
        out.append(
            f"<line x1='{f.px(v.at):.1f}' x2='{f.px(v.at):.1f}' y1='{f.top}' y2='{f.top + f.ph}' "
            f"stroke='{v.color}' stroke-dasharray='2 3'><title>{esc(v.label)}</title></line>"
        )
    return out


def _polylines(f: _Frame, lines: Sequence[Line]) -> list[str]:
    """Each line through its drawable points."""
    out = []
    for s in lines:
        pts = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in zip(s.x, s.y) if x > 0 and f.ok(y))
        out.append(
            f"<polyline class='series' data-label='{esc(s.label)}' points='{pts}' fill='none' "
            f"stroke='{s.color}' stroke-width='1.6'><title>{esc(s.label)}</title></polyline>"
        )
    return out


def _marker(s: Points, cx: float, cy: float) -> tuple[str, str]:
    """The opening and the closing tag of a point's shape at (cx, cy): a star (``*``), a
    diamond (``d``) or a dot."""
    if s.marker == "*":
        corners = " ".join(
            f"{cx + r * math.sin(i * math.pi / 5):.1f},{cy - r * math.cos(i * math.pi / 5):.1f}"
            for i, r in enumerate([9, 4] * 5)
        )
        return f"<polygon points='{corners}' fill='gold' stroke='black'", "</polygon>"
    if s.marker == "d":
        return (
            f"<rect x='{cx - 4:.1f}' y='{cy - 4:.1f}' width='8' height='8' fill='none' "
            f"stroke='{s.color}' transform='rotate(45 {cx:.1f} {cy:.1f})'",
            "</rect>",
        )
    return f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='{s.r}' fill='{s.color}'", "</circle>"


def _point_marks(f: _Frame, points: Sequence[Points]) -> list[str]:
    """Every drawable point, its values as its hover title."""
    out = []
    for s in points:
        for x, y, t in zip(s.x, s.y, s.title):
            if x > 0 and f.ok(y):
                shape, end = _marker(s, f.px(x), f.py(y))
                out.append(f"{shape} class='point' data-label='{esc(s.label)}'><title>{esc(t)}</title>{end}")
    return out


def _legend(f: _Frame, keyed: Sequence[Line | Points | Rule | Band], legend_at: str) -> list[str]:
    """A colour key per entry of ``keyed``, at the top ``right`` or ``left``, on a light
    backing so that the labels stay readable over the lines."""
    ly, lx = f.top + 8, (f.left + 8 if legend_at == "left" else f.left + f.pw - 150)
    out = []
    if keyed:
        wide = 22 + 5.6 * max(len(plain(s.label)) for s in keyed)
        out.append(
            f"<rect x='{lx - 3}' y='{ly - 11}' width='{wide:.0f}' height='{13 * len(keyed) + 3}' "
            "fill='#fff' fill-opacity='0.8'/>"
        )
    for s in keyed:
        out.append(
            f"<rect x='{lx}' y='{ly - 8}' width='10' height='10' fill='{s.color}'/>"
            f"<text x='{lx + 15}' y='{ly + 1}' font-size='10'>{esc(s.label)}</text>"
        )
        ly += 13
    return out


def svg_chart(
    title: str,
    x_label: str,
    y_label: str,
    lines: Sequence[Line],
    points: Sequence[Points],
    hlines: Sequence[Rule] = (),
    vlines: Sequence[Rule] = (),
    log_x: bool = True,
    width: int = 560,
    height: int = 360,
    log_y: bool = False,
    bands: Sequence[Band] = (),
    legend_at: str = "right",
) -> str:
    """An SVG line/point chart: ``lines`` (:class:`Line`), ``points`` (:class:`Points`, each
    point's ``title`` shown on hover), horizontal and vertical rules (:class:`Rule`) and
    shaded horizontal ``bands`` (:class:`Band`).  Every line, the points, rules and bands with
    ``legend`` set are in the legend, at the top ``right`` or ``left``.  ``log_y``: a base-10
    y axis on which the values that are not finite and above 0 are left out (``None`` and NaN
    always are)."""
    f = _frame(lines, points, hlines, bands, width=width, height=height, log_x=log_x, log_y=log_y)
    keyed: list[Line | Points | Rule | Band] = [*lines, *[p for p in points if p.legend]]
    marks: list[Rule | Band] = [*hlines, *bands]
    keyed += [m for m in marks if m.legend]
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"data-y-scale='{'log' if log_y else 'linear'}' aria-label='{esc(title)}'>"
        f"<text x='{f.left}' y='18' font-size='13' font-weight='bold'>{esc(title)}</text>",
        *_axes(f, x_label, y_label),
        *_bands_and_rules(f, bands, hlines, vlines),
        *_polylines(f, lines),
        *_point_marks(f, points),
        *_legend(f, keyed, legend_at),
        "</svg>",
    ]
    return "".join(out)


# --------------------------------------------------------------------------- the plan's charts
def _cluster_series(chart: PlanChart, metric: str) -> tuple[list[Line], list[Points], list[Rule]]:
    """Per cluster size: the predicted line, the measured points, and (time only) the knee."""
    unit = chart.unit
    lines, points, vlines = [], [], []
    for k, s in enumerate(chart.series):
        col, n = COLORS[k % len(COLORS)], s.n_workers
        lines.append(Line(s.predicted.global_batch, getattr(s.predicted, metric), col, f"N={n} predicted"))
        m = s.measured
        if m.global_batch:
            titles = [
                f"measured N={n}, B={b}: {t:.4g} s, {c:.4g} {unit}"
                for b, t, c in zip(m.global_batch, m.total_time_s, m.cost)
            ]
            points.append(Points(m.global_batch, getattr(m, metric), col, f"N={n} measured", titles))
        if s.knee_batch and metric == "total_time_s":
            vlines.append(Rule(s.knee_batch, col, f"knee of N={n}: B={s.knee_batch}"))
    return lines, points, vlines


def _frontier_and_choice(chart: PlanChart, metric: str) -> list[Points]:
    """The Pareto frontier's diamonds (when there is one) and the chosen configuration's star."""
    unit, fr, c = chart.unit, chart.frontier, chart.choice
    points = []
    if fr:
        points.append(
            Points(
                x=[f.global_batch for f in fr],
                y=[getattr(f, metric) for f in fr],
                color="#444",
                label="Pareto frontier",
                marker="d",
                title=[
                    f"Pareto: N={f.n_workers}, B={f.global_batch}: {f.total_time_s:.4g} s, {f.cost:.4g} {unit}"
                    for f in fr
                ],
            )
        )
    points.append(
        Points(
            x=[c.global_batch],
            y=[chart.chosen_y(metric)],
            color="gold",
            marker="*",
            label=f"chosen: N={c.n_workers}, B={c.global_batch}",
            title=[f"chosen: N={c.n_workers}, B={c.global_batch}: {c.total_time_s:.4g} s, {c.cost:.4g} {unit}"],
        )
    )
    return points


def _limits(chart: PlanChart, metric: str) -> list[Rule]:
    """The deadline (on the time chart) or the budget (on the cost chart), when the plan has one."""
    if metric == "total_time_s" and chart.deadline_s is not None:
        return [Rule(chart.deadline_s, "red", f"deadline {chart.deadline_s:.4g} s")]
    if metric == "cost" and chart.budget is not None:
        return [Rule(chart.budget, "red", f"budget {chart.budget:.4g} {chart.unit}")]
    return []


def plan_charts(chart: PlanChart) -> str:
    """Time and cost vs global batch (``chart``: :func:`tula.report.plan_chart_data`): predicted lines and
    measured points per cluster size, the knees, the Pareto frontier, the constraints and the choice (a star)."""
    html_parts = []
    for metric, label in (
        ("total_time_s", f"training time for {chart.epochs} epochs (s)"),
        ("cost", f"cost ({chart.pricing} pricing, {chart.unit})"),
    ):
        lines, points, vlines = _cluster_series(chart, metric)
        points += _frontier_and_choice(chart, metric)
        title = label.split(" (")[0].split(" for")[0].capitalize() + " vs global batch"
        html_parts.append(
            svg_chart(title, "global batch B (log2)", label, lines, points, _limits(chart, metric), vlines)
        )
    return f"<div class='charts' id='plan-charts'>{''.join(html_parts)}</div>"


# --------------------------------------------------------------------------- the training run's charts
def _batch_series(h: list[EpochRecord], raw: list[float | None]) -> tuple[list[Line], list[Points]]:
    """The global batch per epoch: its line, and a point per epoch with the epoch's figures."""
    ep, batch = [r.epoch for r in h], [r.global_batch for r in h]
    lines = [Line(ep, batch, COLORS[2], "global batch B")]
    titles = [
        f"epoch {r.epoch}: B={r.global_batch} on N={r.n_workers}, B_simple "
        f"{'n/a' if b is None else _fmt(b)}, updates so far {getattr(r, 'steps_done', None)}"
        for r, b in zip(h, raw)
    ]
    return lines, [Points(ep, batch, COLORS[2], "epochs", titles, legend=False, r=3)]


def _b_simple_series(ep: list[int], raw: list[float | None]) -> tuple[Line, Points]:
    """B_simple's running median (a line) and its measured values (points)."""
    line = Line(ep, smooth_noise_scale(raw), COLORS[3], f"B_simple, running median of {SMOOTH_EPOCHS} epochs")
    points = Points(
        x=[x for x, b in zip(ep, raw) if b is not None],
        y=[b for b in raw if b is not None],
        color=COLORS[3],
        label="B_simple per epoch",
        r=2.5,
        title=[f"epoch {x}: B_simple {_fmt(b)}" for x, b in zip(ep, raw) if b is not None],
    )
    return line, points


def _early_estimate(ep: list[int], raw: list[float | None]) -> tuple[list[Rule], list[Band]]:
    """The early-training estimate: its median as a rule and its p25-p75 as a band (none
    when the first epochs measured too little)."""
    early = early_noise_scale(raw)
    if early is None:
        return [], []
    k = early_epochs(len(raw))
    say = (
        f"early B_simple {_fmt(early.median)}: the median of epochs {ep[0]}-{ep[k - 1]} "
        f"({early.n} measured; p25-p75 {_fmt(early.p25)}-{_fmt(early.p75)}), the start-of-training "
        "scale (the planner's B_noise is the profile's measurement of it)"
    )
    rule = Rule(early.median, COLORS[4], f"early B_simple {_fmt(early.median)}", title=say, legend=True)
    band = Band(
        early.p25, early.p75, COLORS[4], f"early p25-p75 {_fmt(early.p25)}-{_fmt(early.p75)}", title=say, legend=True
    )
    return [rule], [band]


def noise_chart(history: Sequence[EpochRecord | Mapping[str, Any]]) -> str:
    """Per epoch, on a log axis: the global batch, B_simple's raw points and its running
    median, and the early-training estimate (the median and p25-p75 of the first epochs')
    marked as the start-of-training scale (rules: :mod:`tula.core.noise_scale`).  Values
    that are not finite and above 0 are left out; without any, the title says not measured."""
    h = [as_epoch(r) for r in history]
    ep = [r.epoch for r in h]
    raw = [noise_scale_value(r.b_simple) for r in h]
    lines, points = _batch_series(h, raw)
    hlines: list[Rule] = []
    bands: list[Band] = []
    measured = any(b is not None for b in raw)
    if measured:
        line, marks = _b_simple_series(ep, raw)
        lines.append(line)
        points.append(marks)
        hlines, bands = _early_estimate(ep, raw)
    return svg_chart(
        "Global batch and B_simple" if measured else "Global batch (B_simple not measured)",
        "epoch",
        "samples (log scale)",
        lines,
        points,
        hlines,
        log_x=False,
        log_y=True,
        bands=bands,
        legend_at="left",
    )


def _score_chart(h: list[EpochRecord]) -> str:
    """Test top-1 (or R^2, perplexity, test loss) and training loss per epoch, each epoch's figures on hover."""
    ep = [r.epoch for r in h]
    score = [epoch_score(r) for r in h]  # top-1, R^2 (train.loss mse), perplexity (a language model) or loss
    label = score[0][0] if score else "top-1"
    title = (
        "Accuracy and loss" if label == "top-1" else "Test and train loss" if label == "loss" else f"{label} and loss"
    )
    train_loss = [getattr(r, "train_loss", float("nan")) for r in h]  # a hand-made epoch may have none
    values = [value for _, value, _ in score]
    lines = [Line(ep, values, COLORS[0], f"test {label}"), Line(ep, train_loss, COLORS[1], "train loss")]
    titles = [
        f"epoch {r.epoch}: {name} {shown}, loss {loss:.4f}, B={r.global_batch}, N={r.n_workers}"
        for r, (name, _, shown), loss in zip(h, score, train_loss)
    ]
    points = [Points(ep, values, COLORS[0], "epochs", titles, legend=False)]
    return svg_chart(title, "epoch", "value", lines, points, log_x=False)


def _ags_chart(h: list[EpochRecord]) -> str:
    """AGS's share of scaled steps per epoch."""
    ep = [r.epoch for r in h]
    scaled = [r.scaled_fraction if r.given("scaled_fraction") else float("nan") for r in h]
    line = Line(ep, scaled, COLORS[4], "share of steps scaled")
    return svg_chart("AGS: steps scaled", "epoch", "fraction", [line], [], log_x=False)


def _epoch_time_chart(h: list[EpochRecord], generations: list[Generation]) -> str:
    """Each epoch's measured time beside the plan's prediction of it at its (N, B, k), each
    new world (a generation) marked at its first epoch."""
    from tula.core.run_costs import measured_epoch_s

    ep = [r.epoch for r in h]
    measured = [measured_epoch_s(r) for r in h]
    planned = [r.predicted_epoch_s for r in h]
    ratios = [r.measured_to_predicted for r in h]
    lines = [
        Line(ep, measured, COLORS[0], "measured (steps, evaluation, checkpoint)"),
        Line(
            ep,
            [p if r.given("predicted_epoch_s") else float("nan") for r, p in zip(h, planned)],
            COLORS[2],
            "the plan's prediction",
        ),
    ]
    titles = [
        f"epoch {r.epoch} at {_config(r)}: {m:.3f} s measured, {p:.3f} s planned ({x:.2f}x)"
        if p and x
        else f"epoch {r.epoch} at {_config(r)}: {m:.3f} s measured"
        for r, m, p, x in zip(h, measured, planned, ratios)
    ]
    points = [Points(ep, measured, COLORS[0], "epochs", titles, legend=False)]
    starts = [g for g in generations if g.new_world and g.from_epoch > 1]
    vlines = [Rule(g.from_epoch - 0.5, COLORS[7], f"new world: {_config(g)}") for g in starts]
    return svg_chart("Epoch time: measured and planned", "epoch", "seconds", lines, points, vlines=vlines, log_x=False)


def _config(r: EpochRecord | Generation | GoodputRow) -> str:
    """An epoch's, a generation's or a goodput row's (N, B, k) in words (a goodput row: N and B)."""
    n, b = r.n_workers, r.global_batch
    k = 1 if isinstance(r, GoodputRow) else r.accumulation_steps or 1
    return f"N={n}, B={b}" + (f", k={k}" if k > 1 else "")


def _goodput_chart(rows: list[GoodputRow]) -> str:
    """A goodput schedule's useful samples per second per epoch, measured and predicted
    (:func:`tula.core.live_plan.goodput_per_epoch`)."""
    ep = [r.epoch for r in rows]
    measured = [r.measured for r in rows]
    lines = [Line(ep, measured, COLORS[0], "measured")]
    if any(r.predicted is not None for r in rows):
        pred = [r.predicted if r.predicted is not None else float("nan") for r in rows]
        lines.append(Line(ep, pred, COLORS[2], "predicted by the choice"))
    titles = [
        f"epoch {r.epoch} at {_config(r)}: {r.measured:.4g} useful samples/s measured"
        + (f", {r.predicted:.4g} predicted" if r.predicted is not None else "")
        + f" (B_noise {r.b_noise:.4g}, efficiency {r.efficiency:.2f})"
        for r in rows
    ]
    points = [Points(ep, measured, COLORS[0], "epochs", titles, legend=False)]
    return svg_chart("Goodput: useful samples per second", "epoch", "samples/s", lines, points, log_x=False)


def train_charts(run: TrainRecord | Mapping[str, Any]) -> str:
    """Per epoch: test top-1 and training loss; global batch, workers and B_simple; AGS's
    share of scaled steps where it has one; the measured epoch time beside the plan's
    prediction where Tula planned the run (new worlds marked); a goodput schedule's goodput."""
    if isinstance(run, TrainRecord):
        h, generations = list(run.history), list(run.generations or [])
    else:  # as read from JSON, or a record's parts (a run compared with the plan)
        h = [as_epoch(r) for r in run["history"]]
        generations = [Generation.model_validate(g) for g in run.get("generations") or []]
    charts = [_score_chart(h), noise_chart(h)]
    if any(r.given("scaled_fraction") for r in h):
        charts.append(_ags_chart(h))
    if any(r.predicted_epoch_s for r in h):
        charts.append(_epoch_time_chart(h, generations))
    goodput = goodput_per_epoch(run)
    if goodput:
        charts.append(_goodput_chart(goodput))
    return f"<div class='charts' id='train-charts'>{''.join(charts)}</div>"
