"""The dashboard: server-rendered HTML at ``/`` (the jobs) and ``/jobs/{id}`` (one job).

No build step and nothing fetched from the network: the charts are SVG drawn here from the
same chart data as the PNGs (:func:`tula.report.plan_chart_data`), every point carries its
values as a hover title, and a few lines of plain JavaScript refresh the jobs table and a
running job's page.  The re-plan form posts to ``/jobs/{id}/replan`` and shows the new plan
on the page (the job's stored plan is not changed).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from tula.core.noise_scale import (
    SMOOTH_EPOCHS,
    early_epochs,
    early_noise_scale,
    noise_scale_value,
    smooth_noise_scale,
)
from tula.core.records import epoch_score
from tula.core.registry import OBJECTIVE_NAMES
from tula.core.say import first_line, plain

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
RUNNING = ("profiling", "fitting", "planning", "training")

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5rem 2rem;color:#222;max-width:1200px}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.6rem}a{color:#1f5fa8}
table{border-collapse:collapse;font-size:.9rem}td,th{padding:.3rem .6rem;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f4}.num{text-align:right}.state-done{color:#217a21}.state-failed{color:#b00}
.state-cancelled{color:#777}.bar{background:#eee;width:120px;height:10px;display:inline-block}
.bar>span{background:#4a90d9;height:10px;display:block}.err{color:#b00}.note{color:#555}
.charts{display:flex;flex-wrap:wrap;gap:1rem}svg{background:#fff;border:1px solid #ddd}
form label{margin-right:1rem}input,select{margin-left:.3rem}
"""


def _e(x: Any) -> str:
    return html.escape(plain(x), quote=True)


def _page(title: str, body: str, script: str = "") -> str:
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
        f"<style>{CSS}</style></head><body>{body}<script>{script}</script></body></html>"
    )


def _progress(p: float | None) -> str:
    p = max(0.0, min(1.0, p or 0.0))
    return f"<span class='bar'><span style='width:{p * 100:.0f}%'></span></span> {p:.0%}"


def _job_row(j: dict) -> str:
    msg = j.get("error") or j.get("message") or ""
    return (
        f"<tr data-id='{_e(j['id'])}'><td><a href='/jobs/{_e(j['id'])}'>{_e(j['id'])}</a></td>"
        f"<td>{_e(j['spec'].get('name', ''))}</td><td class='state-{_e(j['state'])}'>{_e(j['state'])}</td>"
        f"<td>{_progress(j.get('progress'))}</td><td>{_e(str(j.get('created_at', ''))[:19].replace('T', ' '))}</td>"
        f"<td>{_e(msg[:100])}</td></tr>"
    )


# --------------------------------------------------------------------------- SVG charts
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


def svg_chart(
    title: str,
    x_label: str,
    y_label: str,
    lines: list[dict],
    points: list[dict],
    hlines: list[dict] = (),
    vlines: list[dict] = (),
    log_x: bool = True,
    width: int = 560,
    height: int = 360,
    log_y: bool = False,
    bands: list[dict] = (),
    legend_at: str = "right",
) -> str:
    """An SVG line/point chart.  ``lines``: ``{"x", "y", "color", "label"}``; ``points``:
    ``{"x", "y", "color", "label", "title", "marker"}`` (marker ``o``, ``*`` or ``d``) whose
    ``title`` shows on hover; ``hlines``/``vlines``: ``{"at", "color", "label"}``; ``bands``:
    ``{"lo", "hi", "color", "label"}``, a shaded horizontal band across the chart.  A line,
    point or band with ``"legend": True`` (hlines, bands) or not ``False`` (lines, points) is
    in the legend, at the top ``right`` or ``left``.  ``log_y``: a base-10 y axis on which
    the values that are not finite and above 0 are left out (``None`` and NaN always are)."""

    def ok(y: Any) -> bool:
        return isinstance(y, (int, float)) and math.isfinite(y) and (y > 0 or not log_y)

    xs = [x for s in [*lines, *points] for x in s["x"] if x and x > 0] or [1]
    ys = [y for s in [*lines, *points] for y in s["y"] if ok(y)]
    ys += [h["at"] for h in hlines if ok(h["at"])] + [v for b in bands for v in (b["lo"], b["hi"]) if ok(v)]
    ys = ys or [1]
    tx = (lambda v: math.log2(v)) if log_x else (lambda v: v)
    ty = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    x0, x1 = tx(min(xs)), tx(max(xs))
    if log_y:
        lo, hi = math.log10(min(ys)), math.log10(max(ys))
        pad = max(0.04 * (hi - lo), (1.0 - (hi - lo)) / 2)  # at least a decade shown
        y0, y1 = lo - pad, hi + pad
    else:
        y0, y1 = min(0.0, min(ys)), max(ys) * 1.08 or 1.0
    x1 = x1 if x1 > x0 else x0 + 1
    left, right, top, bottom = 64, 16, 28, 44
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (tx(v) - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + ph - (ty(v) - y0) / (y1 - y0) * ph

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
        f"data-y-scale='{'log' if log_y else 'linear'}' aria-label='{_e(title)}'>"
        f"<text x='{left}' y='18' font-size='13' font-weight='bold'>{_e(title)}</text>"
    ]
    y_ticks = [(v, _fmt_tick(v)) for v in _log_ticks(y0, y1)] if log_y else []
    if not log_y:
        y_ticks = [(v, _fmt(v)) for v in (y0 + (y1 - y0) * k / 4 for k in range(5))]
    for v, text in y_ticks:  # y grid and ticks
        out.append(
            f"<line x1='{left}' x2='{left + pw}' y1='{py(v):.1f}' y2='{py(v):.1f}' stroke='#eee'/>"
            f"<text x='{left - 6}' y='{py(v) + 4:.1f}' font-size='10' text-anchor='end'>{text}</text>"
        )
    if not log_x:  # a few round ticks
        step = max(1, math.ceil((x1 - x0) / 6))
        for v in range(math.ceil(x0), math.floor(x1) + 1, step):
            out.append(f"<text x='{px(v):.1f}' y='{top + ph + 14}' font-size='10' text-anchor='middle'>{v}</text>")
    if log_x:
        for e in range(math.floor(x0), math.ceil(x1) + 1):
            v = 2.0**e
            if x0 - 1e-9 <= e <= x1 + 1e-9:
                out.append(
                    f"<text x='{px(v):.1f}' y='{top + ph + 14}' font-size='10' text-anchor='middle'>{int(v)}</text>"
                )
    out.append(
        f"<text x='{left + pw / 2}' y='{height - 8}' font-size='11' text-anchor='middle'>{_e(x_label)}</text>"
        f"<text x='14' y='{top + ph / 2}' font-size='11' text-anchor='middle' "
        f"transform='rotate(-90 14 {top + ph / 2})'>{_e(y_label)}</text>"
        f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='none' stroke='#999'/>"
    )
    for b in bands:
        if ok(b["lo"]) and ok(b["hi"]):
            y_top, y_bot = py(max(b["lo"], b["hi"])), py(min(b["lo"], b["hi"]))
            out.append(
                f"<rect class='band' data-label='{_e(b['label'])}' x='{left}' y='{y_top:.1f}' width='{pw}' "
                f"height='{max(y_bot - y_top, 1.0):.1f}' fill='{b['color']}' fill-opacity='0.15'>"
                f"<title>{_e(b.get('title', b['label']))}</title></rect>"
            )
    for h in hlines:
        if ok(h["at"]):
            out.append(
                f"<line x1='{left}' x2='{left + pw}' y1='{py(h['at']):.1f}' y2='{py(h['at']):.1f}' "
                f"stroke='{h['color']}' stroke-dasharray='6 3'><title>{_e(h.get('title', h['label']))}</title></line>"
            )
    for v in vlines:
        out.append(
            f"<line x1='{px(v['at']):.1f}' x2='{px(v['at']):.1f}' y1='{top}' y2='{top + ph}' "
            f"stroke='{v['color']}' stroke-dasharray='2 3'><title>{_e(v['label'])}</title></line>"
        )
    for s in lines:
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(s["x"], s["y"]) if x > 0 and ok(y))
        out.append(
            f"<polyline class='series' data-label='{_e(s['label'])}' points='{pts}' fill='none' "
            f"stroke='{s['color']}' stroke-width='1.6'><title>{_e(s['label'])}</title></polyline>"
        )
    for s in points:
        for x, y, t in zip(s["x"], s["y"], s["title"]):
            if not (x > 0 and ok(y)):
                continue
            cx, cy = px(x), py(y)
            if s.get("marker") == "*":
                corners = " ".join(
                    f"{cx + r * math.sin(i * math.pi / 5):.1f},{cy - r * math.cos(i * math.pi / 5):.1f}"
                    for i, r in enumerate([9, 4] * 5)
                )
                shape = f"<polygon points='{corners}' fill='gold' stroke='black'"
            elif s.get("marker") == "d":
                shape = (
                    f"<rect x='{cx - 4:.1f}' y='{cy - 4:.1f}' width='8' height='8' fill='none' "
                    f"stroke='{s['color']}' transform='rotate(45 {cx:.1f} {cy:.1f})'"
                )
            else:
                shape = f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='{s.get('r', 4)}' fill='{s['color']}'"
            out.append(
                f"{shape} class='point' data-label='{_e(s['label'])}'><title>{_e(t)}</title>"
                f"{'</polygon>' if s.get('marker') == '*' else '</rect>' if s.get('marker') == 'd' else '</circle>'}"
            )
    # legend
    ly, lx = top + 8, (left + 8 if legend_at == "left" else left + pw - 150)
    keyed = [*lines, *[p for p in points if p.get("legend", True)]]
    keyed += [h for h in [*hlines, *bands] if h.get("legend", False)]
    if keyed:  # a light backing, so that the labels stay readable over the lines
        wide = 22 + 5.6 * max(len(plain(s["label"])) for s in keyed)
        out.append(
            f"<rect x='{lx - 3}' y='{ly - 11}' width='{wide:.0f}' height='{13 * len(keyed) + 3}' "
            "fill='#fff' fill-opacity='0.8'/>"
        )
    for s in keyed:
        out.append(
            f"<rect x='{lx}' y='{ly - 8}' width='10' height='10' fill='{s['color']}'/>"
            f"<text x='{lx + 15}' y='{ly + 1}' font-size='10'>{_e(s['label'])}</text>"
        )
        ly += 13
    out.append("</svg>")
    return "".join(out)


def plan_charts(chart: dict) -> str:
    """Time and cost vs global batch: predicted lines and measured points per cluster size,
    the knees, the Pareto frontier, the constraints and the choice (a star)."""
    unit = chart["unit"]
    html_parts = []
    for metric, label in (
        ("total_time_s", f"training time for {chart['epochs']} epochs (s)"),
        ("cost", f"cost ({chart['pricing']} pricing, {unit})"),
    ):
        lines, points, vlines = [], [], []
        for k, s in enumerate(chart["series"]):
            col, n = COLORS[k % len(COLORS)], s["n_workers"]
            lines.append(
                {
                    "x": s["predicted"]["global_batch"],
                    "y": s["predicted"][metric],
                    "color": col,
                    "label": f"N={n} predicted",
                }
            )
            m = s["measured"]
            if m["global_batch"]:
                points.append(
                    {
                        "x": m["global_batch"],
                        "y": m[metric],
                        "color": col,
                        "label": f"N={n} measured",
                        "title": [
                            f"measured N={n}, B={b}: {t:.4g} s, {c:.4g} {unit}"
                            for b, t, c in zip(m["global_batch"], m["total_time_s"], m["cost"])
                        ],
                    }
                )
            if s["knee_batch"] and metric == "total_time_s":
                vlines.append({"at": s["knee_batch"], "color": col, "label": f"knee of N={n}: B={s['knee_batch']}"})
        fr = chart["frontier"]
        if fr:
            points.append(
                {
                    "x": [f["global_batch"] for f in fr],
                    "y": [f[metric] for f in fr],
                    "color": "#444",
                    "label": "Pareto frontier",
                    "marker": "d",
                    "title": [
                        f"Pareto: N={f['n_workers']}, B={f['global_batch']}: {f['total_time_s']:.4g} s, "
                        f"{f['cost']:.4g} {unit}"
                        for f in fr
                    ],
                }
            )
        c = chart["choice"]
        points.append(
            {
                "x": [c["global_batch"]],
                "y": [c[metric]],
                "color": "gold",
                "marker": "*",
                "label": f"chosen: N={c['n_workers']}, B={c['global_batch']}",
                "title": [
                    f"chosen: N={c['n_workers']}, B={c['global_batch']}: {c['total_time_s']:.4g} s, "
                    f"{c['cost']:.4g} {unit}"
                ],
            }
        )
        hl = []
        if metric == "total_time_s" and chart.get("deadline_s") is not None:
            hl.append({"at": chart["deadline_s"], "color": "red", "label": f"deadline {chart['deadline_s']:.4g} s"})
        if metric == "cost" and chart.get("budget") is not None:
            hl.append({"at": chart["budget"], "color": "red", "label": f"budget {chart['budget']:.4g} {unit}"})
        html_parts.append(
            svg_chart(
                label.split(" (")[0].split(" for")[0].capitalize() + " vs global batch",
                "global batch B (log2)",
                label,
                lines,
                points,
                hl,
                vlines,
            )
        )
    return f"<div class='charts' id='plan-charts'>{''.join(html_parts)}</div>"


def noise_chart(h: list[dict]) -> str:
    """Per epoch, on a log axis: the global batch, B_simple's raw points and its running
    median, and the early-training estimate (the median and p25-p75 of the first epochs')
    marked as the start-of-training scale (rules: :mod:`tula.core.noise_scale`).  Values
    that are not finite and above 0 are left out; without any, the title says not measured."""
    ep = [r["epoch"] for r in h]
    raw = [noise_scale_value(r.get("b_simple")) for r in h]
    batch = [r["global_batch"] for r in h]
    lines = [{"x": ep, "y": batch, "color": COLORS[2], "label": "global batch B"}]
    points = [
        {
            "x": ep,
            "y": batch,
            "color": COLORS[2],
            "label": "epochs",
            "legend": False,
            "r": 3,
            "title": [
                f"epoch {r['epoch']}: B={r['global_batch']} on N={r['n_workers']}, B_simple "
                f"{'n/a' if b is None else _fmt(b)}, updates so far {r.get('steps_done')}"
                for r, b in zip(h, raw)
            ],
        }
    ]
    hlines, bands = [], []
    measured = any(b is not None for b in raw)
    if measured:
        lines.append(
            {
                "x": ep,
                "y": smooth_noise_scale(raw),
                "color": COLORS[3],
                "label": f"B_simple, running median of {SMOOTH_EPOCHS} epochs",
            }
        )
        points.append(
            {
                "x": [x for x, b in zip(ep, raw) if b is not None],
                "y": [b for b in raw if b is not None],
                "color": COLORS[3],
                "label": "B_simple per epoch",
                "r": 2.5,
                "title": [f"epoch {x}: B_simple {_fmt(b)}" for x, b in zip(ep, raw) if b is not None],
            }
        )
        early = early_noise_scale(raw)
        if early is not None:
            k = early_epochs(len(raw))
            say = (
                f"early B_simple {_fmt(early.median)}: the median of epochs {ep[0]}-{ep[k - 1]} "
                f"({early.n} measured; p25-p75 {_fmt(early.p25)}-{_fmt(early.p75)}), the start-of-training "
                "scale (the planner's B_noise is the profile's measurement of it)"
            )
            hlines.append(
                {
                    "at": early.median,
                    "color": COLORS[4],
                    "label": f"early B_simple {_fmt(early.median)}",
                    "title": say,
                    "legend": True,
                }
            )
            bands.append(
                {
                    "lo": early.p25,
                    "hi": early.p75,
                    "color": COLORS[4],
                    "label": f"early p25-p75 {_fmt(early.p25)}-{_fmt(early.p75)}",
                    "title": say,
                    "legend": True,
                }
            )
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


def train_charts(run: dict) -> str:
    """Per epoch: test top-1 and training loss; global batch, workers and B_simple; AGS's
    share of scaled steps where it has one."""
    h = run["history"]
    ep = [r["epoch"] for r in h]
    score = [epoch_score(r) for r in h]  # top-1, or R^2 for a regression run (train.loss mse)
    label = score[0][0] if score else "top-1"
    charts = [
        svg_chart(
            "Accuracy and loss"
            if label == "top-1"
            else "Test and train loss"
            if label == "loss"
            else f"{label} and loss",
            "epoch",
            "value",
            [
                {"x": ep, "y": [s[1] for s in score], "color": COLORS[0], "label": f"test {label}"},
                {
                    "x": ep,
                    "y": [r.get("train_loss", float("nan")) for r in h],
                    "color": COLORS[1],
                    "label": "train loss",
                },
            ],
            [
                {
                    "x": ep,
                    "y": [s[1] for s in score],
                    "color": COLORS[0],
                    "label": "epochs",
                    "legend": False,
                    "title": [
                        f"epoch {r['epoch']}: {s[0]} {s[2]}, loss "
                        f"{r.get('train_loss', float('nan')):.4f}, B={r['global_batch']}, "
                        f"N={r['n_workers']}"
                        for r, s in zip(h, score)
                    ],
                }
            ],
            log_x=False,
        )
    ]
    charts.append(noise_chart(h))
    if any("scaled_fraction" in r for r in h):
        charts.append(
            svg_chart(
                "AGS: steps scaled",
                "epoch",
                "fraction",
                [
                    {
                        "x": ep,
                        "y": [r.get("scaled_fraction", float("nan")) for r in h],
                        "color": COLORS[4],
                        "label": "share of steps scaled",
                    }
                ],
                [],
                log_x=False,
            )
        )
    if any(r.get("predicted_epoch_s") for r in h):  # planned by Tula: each epoch beside its prediction
        from tula.core.run_costs import measured_epoch_s

        measured = [measured_epoch_s(r) for r in h]
        charts.append(
            svg_chart(
                "Epoch time: measured and planned",
                "epoch",
                "seconds",
                [
                    {"x": ep, "y": measured, "color": COLORS[0], "label": "measured (steps, evaluation, checkpoint)"},
                    {
                        "x": ep,
                        "y": [r.get("predicted_epoch_s", float("nan")) for r in h],
                        "color": COLORS[2],
                        "label": "the plan's prediction",
                    },
                ],
                [
                    {
                        "x": ep,
                        "y": measured,
                        "color": COLORS[0],
                        "label": "epochs",
                        "legend": False,
                        "title": [
                            f"epoch {r['epoch']}: {m:.3f} s measured, {r['predicted_epoch_s']:.3f} s planned "
                            f"({r['measured_to_predicted']:.2f}x)"
                            if r.get("predicted_epoch_s") and r.get("measured_to_predicted")
                            else f"epoch {r['epoch']}: {m:.3f} s measured"
                            for r, m in zip(h, measured)
                        ],
                    }
                ],
                log_x=False,
            )
        )
    return f"<div class='charts' id='train-charts'>{''.join(charts)}</div>"


def _plan_table(plan: dict) -> str:
    rows = sorted(plan["configurations"], key=lambda c: (not c.get("chosen"), c["total_time_s"]))[:12]
    out = [
        "<table id='plan-table'><tr><th>N</th><th>B</th><th>b</th><th class='num'>step (s)</th>"
        "<th class='num'>total (s)</th><th class='num'>cost</th><th>feasible</th></tr>"
    ]
    for c in rows:
        bold = " class='chosen' style='font-weight:bold'" if c.get("chosen") else ""
        out.append(
            f"<tr{bold}><td>{c['n_workers']}</td>"
            f"<td>{c['global_batch']}</td><td>{c['local_batch']}</td><td class='num'>{c['t_step_s']:.4g}</td>"
            f"<td class='num'>{c['total_time_s']:.4g}</td><td class='num'>{c['cost']:.4g}</td>"
            f"<td>{'yes' if c['feasible'] else _e(c.get('reason') or 'no')}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)


REFRESH_JOBS_JS = """
async function refresh(){
  try{
    const r = await fetch('/v1/jobs?limit=100', {credentials:'same-origin'});
    if(!r.ok) return;
    const page = await r.json();
    const esc = s => String(s ?? '').replace(/[&<>'"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;',"'":'&#39;','"':'&quot;'}[c]));
    document.getElementById('jobs-body').innerHTML = page.jobs.map(j => {
      const p = Math.round(100 * (j.progress || 0)), msg = (j.error || j.message || '').slice(0, 100);
      return `<tr data-id='${esc(j.id)}'><td><a href='/jobs/${esc(j.id)}'>${esc(j.id)}</a></td><td>${esc(j.spec.name)}</td>`
        + `<td class='state-${esc(j.state)}'>${esc(j.state)}</td><td><span class='bar'><span style='width:${p}%'></span></span> ${p}%</td>`
        + `<td>${esc((j.created_at || '').slice(0, 19).replace('T', ' '))}</td><td>${esc(msg)}</td></tr>`;
    }).join('');
    document.getElementById('jobs-total').textContent = page.total;
  }catch(e){}
}
setInterval(refresh, 2000);
"""


def mount_dashboard(app: FastAPI, store: Callable[[], Any]) -> None:
    from tula.report import plan_chart_data

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def jobs_page() -> str:
        rows, total = await run_in_threadpool(store().list_jobs, None, 100, 0)
        body = (
            f"<h1>Tula jobs</h1><p class='note'><span id='jobs-total'>{total}</span> job(s); this table "
            "updates every 2 s. Submit with <code>tula submit SPEC</code> or <code>POST /v1/jobs</code>; "
            "the API is at <a href='/docs'>/docs</a>.</p>"
            "<table id='jobs'><thead><tr><th>id</th><th>name</th><th>state</th><th>progress</th><th>created</th>"
            f"<th>message</th></tr></thead><tbody id='jobs-body'>{''.join(_job_row(j) for j in rows)}</tbody></table>"
        )
        return _page("Tula jobs", body, REFRESH_JOBS_JS)

    def _job_page(
        job_id: str, replanned: dict | None = None, replan_error: str | None = None, form: dict | None = None
    ) -> tuple[str, int]:
        s = store()
        job = s.get_job(job_id)
        if job is None:
            return _page("Tula: no such job", f"<h1>No job {_e(job_id)}</h1><p><a href='/'>all jobs</a></p>"), 404
        plan, models, run = (s.get_record(job_id, k) for k in ("tula.plan", "tula.models", "tula.train"))
        parts = [
            f"<p><a href='/'>&larr; all jobs</a></p><h1>Job {_e(job_id)}: {_e(job['spec'].get('name', ''))}</h1>",
            f"<p id='job-state'>state <b class='state-{_e(job['state'])}'>{_e(job['state'])}</b> "
            f"{_progress(job.get('progress'))} <span class='note'>{_e(job.get('message') or '')}</span></p>",
        ]
        if job.get("error"):
            parts.append(f"<p class='err' id='job-error'>{_e(job['error'])}</p>")
        if job.get("reused_models_from"):
            rf = job["reused_models_from"]
            parts.append(
                f"<p class='note'>planned from the models of job <a href='/jobs/{_e(rf)}'>{_e(rf)}</a> "
                "(not profiled again)</p>"
            )
        shown = replanned or plan
        if shown is not None and models is not None:
            chart = plan_chart_data(shown, models["trials"])
            head = "Re-planned (not saved)" if replanned else "Plan"
            parts += [
                f"<h2>{head}: objective {_e(shown['objective'])}</h2>",
                f"<p id='choice'><b>choice</b>: {_e(shown['reason'])}</p>",
                plan_charts(chart),
                _plan_table(shown),
            ]
        elif plan is None:
            parts.append("<h2>Plan</h2><p class='note'>not planned yet</p>")
        if replan_error:
            parts.append(f"<p class='err' id='replan-error'>{_e(replan_error)}</p>")
        if models is not None:
            f = form or {}
            sel = f.get("objective") or (shown or {}).get("objective", "knee")
            opts = "".join(f"<option{' selected' if o == sel else ''}>{o}</option>" for o in OBJECTIVE_NAMES)
            parts.append(
                f"<h2>Re-plan from the stored models</h2><form method='post' action='/jobs/{_e(job_id)}/replan' "
                f"id='replan'><label>objective<select name='objective'>{opts}</select></label>"
                f"<label>price per node-hour<input name='price' size='6' value='{_e(f.get('price', ''))}'></label>"
                f"<label>cluster sizes<input name='cluster_sizes' size='12' placeholder='1,2,4,8' "
                f"value='{_e(f.get('cluster_sizes', ''))}'></label>"
                f"<label>deadline<input name='deadline' size='6' placeholder='8h' value='{_e(f.get('deadline', ''))}'>"
                f"</label><label>budget<input name='budget' size='6' value='{_e(f.get('budget', ''))}'></label>"
                "<button type='submit'>re-plan</button></form>"
            )
        if run is not None:
            fin = run.get("final", {})
            parts += [
                f"<h2>Training: {_e(run['method'])}</h2><p id='train-summary'>final test {{}} {{}}".format(
                    *epoch_score(fin)[::2]
                )
                + f" after {run['epochs']} epochs, {run['steps_done']} "
                f"model updates, {run['train_s']:.0f} s</p>",
                train_charts(run),
            ]
        links = " ".join(
            f"<a href='/v1/jobs/{_e(job_id)}/{k}'>{k}.json</a>" for k in ("profile", "models", "plan", "train")
        )
        parts.append(f"<h2>Records</h2><p>{links}</p>")
        script = "setTimeout(() => location.reload(), 3000);" if job["state"] in RUNNING + ("queued",) else ""
        return _page(f"Tula job {job_id}", "".join(parts), script), 200

    @app.get("/jobs/{job_id}", response_class=HTMLResponse, include_in_schema=False)
    async def job_page(job_id: str):
        text, status = await run_in_threadpool(_job_page, job_id)
        return HTMLResponse(text, status_code=status)

    @app.post("/jobs/{job_id}/replan", response_class=HTMLResponse, include_in_schema=False)
    async def job_replan(
        job_id: str,
        request: Request,
        objective: str = Form("knee"),
        price: str = Form(""),
        cluster_sizes: str = Form(""),
        deadline: str = Form(""),
        budget: str = Form(""),
    ):
        from tula.core.errors import TulaError
        from tula.service.replan import Problem, Replan, replan_from_models

        form = {
            "objective": objective,
            "price": price,
            "cluster_sizes": cluster_sizes,
            "deadline": deadline,
            "budget": budget,
        }
        models = store().get_record(job_id, "tula.models")
        if models is None:
            text, status = await run_in_threadpool(_job_page, job_id, None, "this job has no fitted models yet", form)
            return HTMLResponse(text, status_code=409 if status == 200 else status)
        try:
            body = Replan(
                objective=objective or None,
                pricing={**models["spec"]["pricing"], "price_per_node_hour": float(price)} if price else None,
                cluster_sizes=[int(x) for x in cluster_sizes.split(",") if x.strip()] or None,
                deadline=deadline or None,
                budget=float(budget) if budget else None,
            )
            plan = await run_in_threadpool(replan_from_models, models, body)
            text, status = await run_in_threadpool(_job_page, job_id, plan, None, form)
        except (ValueError, TulaError, Problem) as err:
            msg = getattr(err, "detail", None) or first_line(err) or type(err).__name__
            text, status = await run_in_threadpool(_job_page, job_id, None, f"cannot re-plan: {msg}", form)
            status = 422 if status == 200 else status
        return HTMLResponse(text, status_code=status)
