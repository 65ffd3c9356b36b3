"""The dashboard: server-rendered HTML at ``/`` (the jobs) and ``/jobs/{id}`` (one job), the
routes of :data:`dashboard_router`, which reads the store the service shares on
``app.state.store`` (:mod:`tula.service.app`).

No build step and nothing fetched from the network: the charts are SVG drawn from the same
chart data as the PNGs (:mod:`tula.service.dashboard_charts`), every point carries its values
as a hover title, and a few lines of plain JavaScript refresh the jobs table and a running
job's page.  The re-plan form posts to ``/jobs/{id}/replan`` and shows the new plan on the
page (the job's stored plan is not changed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from tula.core.errors import TulaError
from tula.core.records import ModelsRecord, PlanRecord, epoch_score
from tula.core.registry import OBJECTIVE_NAMES
from tula.core.say import first_line, fmt_bytes, plain
from tula.service.dashboard_charts import (  # noqa: F401 - the charts' names, as this module gave them before
    COLORS,
    esc,
    noise_chart,
    plan_charts,
    svg_chart,
    train_charts,
)
from tula.service.replan import Problem, Replan, replan_from_models
from tula.service.store import RUNNING_STATES, JobRow

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


def _page(title: str, body: str, script: str = "") -> str:
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
        f"<style>{CSS}</style></head><body>{body}<script>{script}</script></body></html>"
    )


def _progress(p: float | None) -> str:
    p = max(0.0, min(1.0, p or 0.0))
    return f"<span class='bar'><span style='width:{p * 100:.0f}%'></span></span> {p:.0%}"


def _job_row(j: JobRow) -> str:
    msg = j.error or j.message or ""
    return (
        f"<tr data-id='{esc(j.id)}'><td><a href='/jobs/{esc(j.id)}'>{esc(j.id)}</a></td>"
        f"<td>{esc(j.spec.get('name', ''))}</td><td class='state-{esc(j.state)}'>{esc(j.state)}</td>"
        f"<td>{_progress(j.progress)}</td><td>{esc(str(j.created_at)[:19].replace('T', ' '))}</td>"
        f"<td>{esc(msg[:100])}</td></tr>"
    )


def _plan_table(plan: PlanRecord) -> str:
    rows = sorted(plan.configurations, key=lambda c: (not c.chosen, c.total_time_s))[:12]
    out = [
        "<table id='plan-table'><tr><th>N</th><th>B</th><th>b</th><th class='num'>step (s)</th>"
        "<th class='num'>total (s)</th><th class='num'>cost</th><th>feasible</th></tr>"
    ]
    for c in rows:
        bold = " class='chosen' style='font-weight:bold'" if c.chosen else ""
        out.append(
            f"<tr{bold}><td>{c.n_workers}</td>"
            f"<td>{c.global_batch}</td><td>{c.local_batch}</td><td class='num'>{c.t_step_s:.4g}</td>"
            f"<td class='num'>{c.total_time_s:.4g}</td><td class='num'>{c.cost:.4g}</td>"
            f"<td>{'yes' if c.feasible else esc(c.reason or 'no')}</td></tr>"
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


# --------------------------------------------------------------------------- a job's page, part by part
def _job_header(job: JobRow) -> list[str]:
    """The link back, the job's name, its state and progress, its error, where its models came from."""
    parts = [
        f"<p><a href='/'>&larr; all jobs</a></p><h1>Job {esc(job.id)}: {esc(job.spec.get('name', ''))}</h1>",
        f"<p id='job-state'>state <b class='state-{esc(job.state)}'>{esc(job.state)}</b> "
        f"{_progress(job.progress)} <span class='note'>{esc(job.message or '')}</span></p>",
    ]
    if job.error:
        parts.append(f"<p class='err' id='job-error'>{esc(job.error)}</p>")
    if job.reused_models_from:
        rf = job.reused_models_from
        parts.append(
            f"<p class='note'>planned from the models of job <a href='/jobs/{esc(rf)}'>{esc(rf)}</a> "
            "(not profiled again)</p>"
        )
    return parts


def _plan_section(shown: PlanRecord | None, models: ModelsRecord | None, replanned: bool, planned: bool) -> list[str]:
    """The plan shown (the stored one, or a re-plan not saved): its choice, charts and table."""
    from tula.report import plan_chart_data

    if shown is not None and models is not None:
        chart = plan_chart_data(shown, models.trials)
        head = "Re-planned (not saved)" if replanned else "Plan"
        return [
            f"<h2>{head}: objective {esc(shown.objective)}</h2>",
            f"<p id='choice'><b>choice</b>: {esc(shown.reason)}</p>",
            plan_charts(chart),
            _plan_table(shown),
        ]
    if not planned:
        return ["<h2>Plan</h2><p class='note'>not planned yet</p>"]
    return []


@dataclass(frozen=True)
class ReplanForm:
    """The re-plan form's fields as posted (text; empty: not given)."""

    objective: str = ""
    price: str = ""
    cluster_sizes: str = ""
    deadline: str = ""
    budget: str = ""


def _replan_form(job_id: str, form: ReplanForm | None, shown: PlanRecord | None) -> str:
    """The re-plan form, holding the values last posted."""
    f = form or ReplanForm()
    sel = f.objective or (shown.objective if shown is not None else "knee")
    opts = "".join(f"<option{' selected' if o == sel else ''}>{o}</option>" for o in OBJECTIVE_NAMES)
    return (
        f"<h2>Re-plan from the stored models</h2><form method='post' action='/jobs/{esc(job_id)}/replan' "
        f"id='replan'><label>objective<select name='objective'>{opts}</select></label>"
        f"<label>price per node-hour<input name='price' size='6' value='{esc(f.price)}'></label>"
        f"<label>cluster sizes<input name='cluster_sizes' size='12' placeholder='1,2,4,8' "
        f"value='{esc(f.cluster_sizes)}'></label>"
        f"<label>deadline<input name='deadline' size='6' placeholder='8h' value='{esc(f.deadline)}'>"
        f"</label><label>budget<input name='budget' size='6' value='{esc(f.budget)}'></label>"
        "<button type='submit'>re-plan</button></form>"
    )


def _train_section(run: dict) -> list[str]:
    """The training run's summary and charts."""
    fin = run.get("final", {})
    return [
        f"<h2>Training: {esc(run['method'])}</h2><p id='train-summary'>final test {{}} {{}}".format(
            *epoch_score(fin)[::2]
        )
        + f" after {run['epochs']} epochs, {run['steps_done']} "
        f"model updates, {run['train_s']:.0f} s</p>",
        train_charts(run),
    ]


def job_page(
    store: Any,
    job_id: str,
    replanned: PlanRecord | None = None,
    replan_error: str | None = None,
    form: ReplanForm | None = None,
) -> tuple[str, int]:
    """The page of ``job_id`` in ``store`` and its status (404 when there is no such job):
    the job, its plan (or ``replanned``, not saved), ``replan_error``, the re-plan form with
    ``form``'s values, its training and its records' links."""
    job = store.get_job(job_id)
    if job is None:
        return _page("Tula: no such job", f"<h1>No job {esc(job_id)}</h1><p><a href='/'>all jobs</a></p>"), 404
    plan, models = store.read_record(job_id, PlanRecord), store.read_record(job_id, ModelsRecord)
    run = store.get_record(job_id, "tula.train")  # the training side reads a run as a dict
    shown = replanned or plan
    parts = [*_job_header(job), *_plan_section(shown, models, bool(replanned), plan is not None)]
    if replan_error:
        parts.append(f"<p class='err' id='replan-error'>{esc(replan_error)}</p>")
    if models is not None:
        parts.append(_replan_form(job_id, form, shown))
    if run is not None:
        parts += _train_section(run)
    links = " ".join(
        f"<a href='/v1/jobs/{esc(job_id)}/{k}'>{k}.json</a>" for k in ("profile", "models", "plan", "train")
    )
    parts.append(f"<h2>Records</h2><p>{links}</p>")
    script = "setTimeout(() => location.reload(), 3000);" if job.state in (*RUNNING_STATES, "queued") else ""
    return _page(f"Tula job {job_id}", "".join(parts), script), 200


def _replan_request(models: ModelsRecord, form: ReplanForm) -> Replan:
    """The re-plan the form asks for (a ValueError or Problem when a field does not parse)."""
    return Replan(
        objective=form.objective or None,
        pricing={**models.spec.pricing.model_dump(mode="json"), "price_per_node_hour": float(form.price)}
        if form.price
        else None,
        cluster_sizes=[int(x) for x in form.cluster_sizes.split(",") if x.strip()] or None,
        deadline=form.deadline or None,
        budget=float(form.budget) if form.budget else None,
    )


# --------------------------------------------------------------------------- the routes
dashboard_router = APIRouter(include_in_schema=False)


def _store(request: Request) -> Any:
    """The job store the service shares (``app.state.store``)."""
    return request.app.state.store


@dashboard_router.get("/", response_class=HTMLResponse)
async def jobs_page(request: Request) -> str:
    rows, total = await run_in_threadpool(_store(request).list_jobs, None, 100, 0)
    body = (
        f"<h1>Tula jobs</h1><p class='note'><span id='jobs-total'>{total}</span> job(s); this table "
        "updates every 2 s. Submit with <code>tula submit SPEC</code> or <code>POST /v1/jobs</code>; "
        "the API is at <a href='/docs'>/docs</a>; where they run: <a href='/cluster'>/cluster</a>.</p>"
        "<table id='jobs'><thead><tr><th>id</th><th>name</th><th>state</th><th>progress</th><th>created</th>"
        f"<th>message</th></tr></thead><tbody id='jobs-body'>{''.join(_job_row(j) for j in rows)}</tbody></table>"
    )
    return _page("Tula jobs", body, REFRESH_JOBS_JS)


def _world_cell(job: dict) -> str:
    n = job.get("world_workers")
    if n is None:
        return "- (between worlds)"
    return f"{'holds' if job.get('world') == 'holds' else 'waits for'} {int(n)} worker(s)"


def cluster_page(view: dict | None, problem: str | None = None) -> str:
    """Where the service runs its jobs: the ``cluster`` setting, its workers (and whether a
    Tula world holds each now), and the running jobs with the world each holds or waits for --
    :func:`tula.service.cluster.cluster_view`'s record, or the sentence that says why there is
    none (a scheduler that does not answer)."""
    head = "<h1>Where jobs run</h1><p><a href='/'>all jobs</a></p>"
    if view is None:
        return _page("Tula cluster", f"{head}<p class='err'>{esc(problem or '')}</p>")
    workers = "".join(
        f"<tr><td>{esc(str(w.get('address')))}</td><td>{esc(str(w.get('host')))}</td>"
        f"<td class='num'>{esc(str(w.get('threads')))}</td><td class='num'>{esc(fmt_bytes(w.get('memory_bytes')))}</td>"
        f"<td>{'-' if w.get('in_a_world') is None else ('yes' if w['in_a_world'] else 'no')}</td></tr>"
        for w in view["workers"]
    )
    jobs = "".join(
        f"<tr><td><a href='/jobs/{esc(j['id'])}'>{esc(j['id'])}</a></td><td>{esc(str(j.get('name') or ''))}</td>"
        f"<td>{esc(j['state'])}</td><td>{_world_cell(j)}</td></tr>"
        for j in view["running_jobs"]
    )
    body = (
        f"{head}<p>cluster <code>{esc(view['cluster'])}</code> ({esc(view['kind'])})"
        f"{': ' + esc(view['note']) if view.get('note') else ''}</p>"
        f"<h2>Workers ({len(view['workers'])})</h2><table id='workers'><thead><tr><th>address</th><th>host</th>"
        f"<th>threads</th><th>memory</th><th>in a world now</th></tr></thead><tbody>{workers}</tbody></table>"
        f"<h2>Running jobs ({len(view['running_jobs'])})</h2><p class='note'>A job holds the workers of "
        "the world it runs now (a profile's, its training's) and none between worlds; its worlds take their "
        "turns in submission order.</p><table id='running'><thead><tr><th>id</th>"
        f"<th>name</th><th>state</th><th>world</th></tr></thead><tbody>{jobs}</tbody></table>"
    )
    return _page("Tula cluster", body)


@dashboard_router.get("/cluster", response_class=HTMLResponse)
async def cluster_page_route(request: Request):
    from tula.service.cluster import cluster_view

    try:
        view = await run_in_threadpool(cluster_view, request.app.state.settings, _store(request))
    except TulaError as err:
        return HTMLResponse(cluster_page(None, plain(err)), status_code=503)
    return HTMLResponse(cluster_page(view))


@dashboard_router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page_route(request: Request, job_id: str):
    text, status = await run_in_threadpool(job_page, _store(request), job_id)
    return HTMLResponse(text, status_code=status)


@dashboard_router.post("/jobs/{job_id}/replan", response_class=HTMLResponse)
async def job_replan(
    job_id: str,
    request: Request,
    objective: str = Form("knee"),
    price: str = Form(""),
    cluster_sizes: str = Form(""),
    deadline: str = Form(""),
    budget: str = Form(""),
):
    """The job's page with a re-plan from its stored models (not saved), or with why it cannot be made."""
    store = _store(request)
    form = ReplanForm(objective=objective, price=price, cluster_sizes=cluster_sizes, deadline=deadline, budget=budget)
    models = store.read_record(job_id, ModelsRecord)
    if models is None:
        text, status = await run_in_threadpool(job_page, store, job_id, None, "this job has no fitted models yet", form)
        return HTMLResponse(text, status_code=409 if status == 200 else status)
    try:
        plan = await run_in_threadpool(replan_from_models, models, _replan_request(models, form))
        text, status = await run_in_threadpool(job_page, store, job_id, plan, None, form)
    except (ValueError, TulaError, Problem) as err:
        msg = getattr(err, "detail", None) or first_line(err) or type(err).__name__
        text, status = await run_in_threadpool(job_page, store, job_id, None, f"cannot re-plan: {msg}", form)
        status = 422 if status == 200 else status
    return HTMLResponse(text, status_code=status)
