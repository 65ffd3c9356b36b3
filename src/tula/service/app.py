"""The Tula service's web application (FastAPI): submit, watch, cancel and re-plan jobs.

Handlers validate and enqueue; runner processes (:mod:`tula.service.runner`) do the work.
One router per resource (:data:`ROUTERS`: login, the service and its cluster, jobs, a job's
records and plots, plans, the dashboard's pages), and what they share on ``app.state``
(:func:`create_app`).
Every error a client can cause is a JSON ``{"detail": "<one sentence>"}`` with its status
(401 no or wrong token, 404 unknown job or record, 409 not yet there, 413 too large, 422 a
bad spec or option).  Bound beyond loopback the service needs a token; requests carry it
as ``Authorization: Bearer <token>`` (or, for a browser, the cookie ``/login?token=`` sets).
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import importlib
import json
import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import orjson
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from tula import __version__
from tula.core.errors import InfeasibleError, RecordError, SpecError, TulaError
from tula.core.records import HostFacts, ModelsRecord
from tula.core.registry import OBJECTIVE_NAMES
from tula.core.say import plain
from tula.service.admission import admit, check_options, parse_json_body, parse_spec_text, too_deep
from tula.service.dashboard import dashboard_router
from tula.service.logs import configure_logging
from tula.service.replan import Problem, Replan, replan_from_models
from tula.service.settings import ServiceSettings
from tula.service.store import ENDED_STATES, JOB_STATES, RECORD_KINDS, JobRow, Store, StoreError

log = logging.getLogger(__name__)

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")
TOKEN_COOKIE = "tula_token"


def _all_finite(content: Any) -> bool:
    """Whether no float anywhere in a JSON-like value is NaN or infinite (iteratively: records
    nest a few levels, plans hold a few thousand numbers; about 0.3 ms for a large plan)."""
    isfinite, stack = math.isfinite, [content]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is dict:
            stack.extend(x.values())
        elif t is list or t is tuple:
            stack.extend(x)
        elif t is float and not isfinite(x):
            return False
    return True


class RecordResponse(JSONResponse):
    """A record with the numbers the CLI writes: a measurement that is not finite (a gradient
    noise scale with no measurable signal: ``Infinity``; a metric not measured: ``NaN``) stays
    what it is instead of becoming null, as in Python's JSON.  Records with finite numbers
    only (every plan the service answers, in practice) are encoded by orjson, about 15x faster
    than the standard library for a plan's ~100 KB: the encoding is most of a re-plan's cost
    after the planner itself (bench/service_load.py)."""

    def render(self, content: Any) -> bytes:
        if _all_finite(content):
            try:
                return orjson.dumps(content)
            except TypeError:  # a type orjson does not know (not in Tula's records): the standard library's
                pass
        return json.dumps(content, allow_nan=True, separators=(",", ":")).encode("utf-8")


def _error(status: int, detail: Any, headers: dict | None = None) -> JSONResponse:
    """Every error body: ``{"detail": <one sentence>}``, the sentence as plain text (whatever a
    library or a stored message put in it, :func:`tula.core.say.plain` never raises and is UTF-8)."""
    return JSONResponse({"detail": plain(detail)}, status_code=status, headers=headers)


# --------------------------------------------------------------------------- request bodies (for OpenAPI)
class Submission(BaseModel):
    """A job: its spec (the same fields as a YAML spec for the CLI) and how to run it."""

    spec: dict[str, Any] = Field(description="the job spec (name, model, data, search, pricing, train, ...)")
    search: Literal["full", "partial"] = "partial"
    objective: Literal[OBJECTIVE_NAMES] | None = Field(default=None, description="default: the spec's")  # type: ignore[valid-type]
    train: bool = Field(default=True, description="train at the chosen configuration after planning")


class PlanRequest(BaseModel):
    spec: dict[str, Any]
    objective: Literal[OBJECTIVE_NAMES] | None = None  # type: ignore[valid-type]
    noise_scale: float | None = Field(
        default=None, gt=0, description="the gradient noise scale to assume (default: the stored models' own)"
    )


def _job_view(job: JobRow, base: str = "") -> dict:
    """A job as the API answers it: its fields, then its ``url``."""
    return {**job.to_json_dict(), "url": f"{base}/v1/jobs/{job.id}"}


def _sentence_of(err: RequestValidationError) -> str:
    errors = err.errors()
    if not errors:
        return "the request is not valid"
    e = errors[0]
    loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
    where = ".".join(loc) or "the request"
    msg = str(e.get("msg", "is not valid")).replace("Value error, ", "")
    return f"field {where!r}: {msg[0].lower() + msg[1:]}" if msg else f"field {where!r} is not valid"


def _only_text(*values: Any) -> None:
    """Refuse a submission holding a string that is no text: JSON's (or YAML's) escape of a
    lone surrogate (``"\\udcff"``) parses, but once stored it could not be sent as UTF-8 in any
    answer or page that shows the job."""
    stack, seen = list(values), set()
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise SpecError(
                    f"the job holds a string that is not text ({x[:80]!r}: an escaped lone "
                    "surrogate, U+D800-U+DFFF); send UTF-8 text"
                ) from None
        elif isinstance(x, (dict, list, tuple)) and id(x) not in seen:
            seen.add(id(x))
            stack.extend([*x.keys(), *x.values()] if isinstance(x, dict) else x)


def _too_large(settings: ServiceSettings) -> str:
    return f"the request body is larger than this service's limit of {settings.max_request_bytes} bytes"


class _Guard:
    """Every request: the bearer token (or the dashboard's cookie) when the service has one,
    and the declared body size within the limit.  A plain ASGI middleware: Starlette's
    ``@app.middleware("http")`` runs each request through extra tasks and streams, which cost
    about as much as a small handler."""

    def __init__(self, app, settings: ServiceSettings) -> None:
        self.app, self.settings = app, settings

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request, settings = Request(scope), self.settings
        refusal = None
        if settings.token is not None and scope["path"] != "/login":
            given = request.headers.get("authorization", "")
            token = given[7:] if given[:7].lower() == "bearer " else request.cookies.get(TOKEN_COOKIE, "")
            if not hmac.compare_digest(token.encode(), settings.token.encode()):
                refusal = _error(
                    401,
                    "this service needs 'Authorization: Bearer <token>'; the request had no token or a wrong one",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        length = request.headers.get("content-length")
        if (
            refusal is None
            and length is not None
            and (not length.isdigit() or int(length) > settings.max_request_bytes)
        ):
            refusal = _error(413, _too_large(settings))
        if refusal is not None:
            return await refusal(scope, receive, send)
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------- shared state (app.state)
def _settings(request: Request) -> ServiceSettings:
    """The service's settings (``app.state.settings``)."""
    return request.app.state.settings


def _store(request: Request) -> Store:
    """The job store (``app.state.store``), open while the service runs (:func:`_lifespan`)."""
    return request.app.state.store


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI):
    """While the service runs: the store open on ``app.state.store``, the planner imported, and
    the job dispatcher running when ``app.state.dispatch`` and the ``run_jobs`` setting say so."""
    from tula.service.runner import Dispatcher

    configure_logging()  # the service process: its tula.* loggers write to stderr (nothing when logging is set up)
    settings: ServiceSettings = app.state.settings
    settings.home.mkdir(parents=True, exist_ok=True)
    store = Store(settings.store_url, settings.home)
    # the planner's imports (numpy, scipy) now, not in the first re-plan request
    await run_in_threadpool(importlib.import_module, "tula.core.plan")
    app.state.store = store
    dispatcher = Dispatcher(settings, store) if app.state.dispatch and settings.run_jobs else None
    if dispatcher:
        dispatcher.start()
    log.info(
        "the service is up: data in %s, jobs %s",
        settings.home,
        f"run on {settings.cluster}" if dispatcher else "not run here",
    )
    try:
        yield
    finally:
        log.info("the service stops: running jobs are queued again and resume when it starts")
        if dispatcher:
            await run_in_threadpool(dispatcher.stop)
        store.close()


def _need_job(store: Store, job_id: str) -> JobRow:
    job = store.get_job(job_id)
    if job is None:
        raise Problem(404, f"there is no job {job_id!r}")
    return job


def _record(store: Store, job_id: str, name: str) -> dict:
    job = _need_job(store, job_id)
    rec = store.get_record(job_id, RECORD_KINDS[name])
    if rec is None:
        raise _no_record(job, name)
    return rec


def _no_record(job: JobRow, name: str) -> Problem:
    """The 404 of a job without its ``name`` record (yet)."""
    return Problem(
        404,
        f"job {job.id!r} has no {name} record (it is {job.state}" + (f": {job.error}" if job.error else "") + ")",
    )


class _FinishedModels:
    """The models records of ended jobs, which never change again, for re-plans (``app.state.finished_models``):
    up to ``size`` of them, the oldest dropped first."""

    def __init__(self, size: int = 256) -> None:
        self.size, self.lock = size, threading.Lock()
        self.models: dict[str, ModelsRecord] = {}  # job id -> its models record

    def get(self, job_id: str) -> ModelsRecord | None:
        return self.models.get(job_id)

    def models_of(self, store: Store, job_id: str) -> ModelsRecord:
        """The job's models record (404 without one), kept when the job has ended."""
        if job_id in self.models:
            return self.models[job_id]
        job = _need_job(store, job_id)
        models = store.read_record(job_id, ModelsRecord)  # the store's JSON read as the record
        if models is None:
            raise _no_record(job, "models")
        if job.state in ENDED_STATES:
            with self.lock:
                if len(self.models) >= self.size:
                    self.models.pop(next(iter(self.models)))
                self.models[job_id] = models
        return models


# --------------------------------------------------------------------------- errors as one sentence
async def _problem(request: Request, exc: Problem):
    return _error(exc.status, exc.detail)


async def _spec_error(request: Request, exc: SpecError):
    return _error(422, exc)


async def _tula_error(request: Request, exc: TulaError):
    if isinstance(exc, StoreError):
        log.warning("%s %s answered 503: %s", request.method, request.url.path, plain(exc))
    return _error(503 if isinstance(exc, StoreError) else 422, exc)


async def _validation(request: Request, exc: RequestValidationError):
    return _error(422, _sentence_of(exc))


async def _http(request: Request, exc: StarletteHTTPException):
    if isinstance(exc.__cause__, RecursionError):  # FastAPI's parse of a body model: nested too deep
        return _error(422, too_deep())
    detail = exc.detail
    if not isinstance(detail, str):
        try:
            detail = json.dumps(detail)
        except (TypeError, ValueError):
            detail = plain(detail)
    return _error(exc.status_code, detail, headers=getattr(exc, "headers", None))


#: each error a client can cause, and its handler
ERROR_HANDLERS: tuple[tuple[type[Exception], Callable], ...] = (
    (Problem, _problem),
    (SpecError, _spec_error),
    (TulaError, _tula_error),
    (RequestValidationError, _validation),
    (StarletteHTTPException, _http),
)


# --------------------------------------------------------------------------- login (the dashboard's cookie)
login_router = APIRouter()


@login_router.get("/login", include_in_schema=False)
async def login(request: Request, token: str = ""):
    settings = _settings(request)
    if settings.token is None or not hmac.compare_digest(token.encode(), settings.token.encode()):
        raise Problem(401, "wrong or missing token")
    resp = RedirectResponse("/", status_code=303)
    resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return resp


# --------------------------------------------------------------------------- the service and its cluster
service_router = APIRouter()


@service_router.get("/v1/health")
async def health(request: Request) -> dict:
    """The service is up; its version, store back end and running jobs."""
    store = _store(request)
    running = await run_in_threadpool(store.count_running)
    return {"status": "ok", "version": __version__, "store": store.dialect, "running_jobs": running}


@service_router.get("/v1/cluster")
async def cluster(request: Request) -> dict:
    """Where this service runs its jobs (the operator's ``cluster`` setting), the workers
    there now, and the jobs running on them.  503 when its scheduler does not answer."""
    from tula.service.cluster import cluster_view

    try:
        return await run_in_threadpool(cluster_view, _settings(request), _store(request))
    except TulaError as err:
        raise Problem(503, plain(err)) from None


# --------------------------------------------------------------------------- jobs
jobs_router = APIRouter()


async def _body(request: Request) -> bytes:
    body, limit = b"", _settings(request).max_request_bytes
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Problem(413, _too_large(_settings(request)))
    return body


async def _submission(request: Request) -> tuple[Any, dict]:
    """(spec data, options) from a JSON submission or a YAML spec with options in the query."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = await _body(request)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError("the request body is not UTF-8 text") from None
    if ctype in YAML_TYPES:
        return parse_spec_text(text), dict(request.query_params)
    if ctype != "application/json":
        raise Problem(415, f"send the job as application/json (a submission) or application/yaml (a spec), not {ctype}")
    data = parse_json_body(text)
    if isinstance(data, dict) and "spec" in data:
        opts = {k: v for k, v in data.items() if k != "spec"}
        unknown = sorted(set(opts) - {"search", "objective", "train"})
        if unknown:
            raise SpecError(f"unknown field {unknown[0]!r} in the submission; it has spec, search, objective and train")
        return data["spec"], opts
    return data, dict(request.query_params)


_SUBMISSION_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": Submission.model_json_schema()},
            "application/yaml": {
                "schema": {
                    "type": "string",
                    "description": "a job spec as YAML (options in the query: search, objective, train)",
                }
            },
        },
    }
}


@jobs_router.post("/v1/jobs", status_code=202, openapi_extra=_SUBMISSION_BODY)
async def submit(request: Request) -> JSONResponse:
    """Submit a job: 202 with its id and URL; it runs when a runner is free."""
    spec_data, opts = await _submission(request)
    _only_text(spec_data, opts)
    train = opts.get("train", True)
    if isinstance(train, str):
        train = {"true": True, "false": False, "1": True, "0": False}.get(train.lower(), train)
    search, objective, train = check_options(opts.get("search", "partial"), opts.get("objective"), train)
    spec = admit(spec_data, _settings(request))
    job_id = await run_in_threadpool(
        _store(request).create_job, spec.to_dict(), search=search, objective=objective, train=train
    )
    url = f"/v1/jobs/{job_id}"
    log.info("job %s: submitted (%s, search %s, train %s)", job_id, plain(spec.name), search, train)
    return JSONResponse({"id": job_id, "url": url, "state": "queued"}, status_code=202, headers={"Location": url})


@jobs_router.get("/v1/jobs")
async def list_jobs(
    request: Request,
    state: Literal[JOB_STATES] | None = None,  # type: ignore[valid-type]
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=2**31 - 1),
) -> dict:
    """Jobs, newest first, optionally in one state."""
    rows, total = await run_in_threadpool(_store(request).list_jobs, state, limit, offset)
    return {"jobs": [_job_view(j) for j in rows], "total": total, "limit": limit, "offset": offset}


@jobs_router.get("/v1/jobs/{job_id}")
async def get_job(request: Request, job_id: str) -> dict:
    """One job: state, progress, timestamps, the error sentence, the model reuse."""
    return _job_view(await run_in_threadpool(_need_job, _store(request), job_id))


@jobs_router.post("/v1/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: str) -> dict:
    """Cancel: a queued job at once, a running one at its next step."""
    store = _store(request)
    _need_job(store, job_id)
    return _job_view(await run_in_threadpool(store.request_cancel, job_id))


# --------------------------------------------------------------------------- a job's records and plots
records_router = APIRouter()


def _record_handler(name: str):
    async def get_record(request: Request, job_id: str) -> RecordResponse:
        return RecordResponse(await run_in_threadpool(_record, _store(request), job_id, name))

    get_record.__doc__ = f"The job's {name} record: the same JSON `tula` writes to {name}.json."
    return get_record


for _name in RECORD_KINDS:
    records_router.get(f"/v1/jobs/{{job_id}}/{_name}", name=f"get_{_name}")(_record_handler(_name))


@records_router.get("/v1/jobs/{job_id}/plots/{name}", response_class=FileResponse)
async def plot(request: Request, job_id: str, name: Literal["plan.png", "train.png"]):
    """The job's plan or training plot (PNG)."""
    store = _store(request)
    job = _need_job(store, job_id)
    path = store.artifact_path(job_id, name)
    if path is None or not Path(path).is_file():
        raise Problem(404, f"job {job_id!r} has no {name} yet (it is {job.state})")
    return FileResponse(path, media_type="image/png")


# --------------------------------------------------------------------------- plans
plans_router = APIRouter()


@plans_router.post("/v1/jobs/{job_id}/replan")
async def replan(request: Request, job_id: str, body: Replan) -> RecordResponse:
    """Plan again from the job's fitted models (no profiling): another objective, pricing,
    cluster sizes, epoch count, deadline or budget, or epochs scaled by what its finished
    training run measured (``use_measured``).  The job's own plan is not changed."""
    store, finished = _store(request), request.app.state.finished_models
    models = finished.get(job_id)
    if models is None:  # read from the store (I/O: in a worker thread)
        models = await run_in_threadpool(finished.models_of, store, job_id)
    run = await run_in_threadpool(store.get_record, job_id, "tula.train") if body.use_measured else None
    # the planner is a few milliseconds of pure Python and numpy under the GIL: run in the
    # event loop it costs the same CPU without handing the GIL between two threads
    return RecordResponse(replan_from_models(models, body, run).to_json_dict())


@plans_router.post("/v1/plans")
async def plans(request: Request, body: PlanRequest) -> RecordResponse:
    """A plan for a spec from a stored model of the same key (no profiling); 404 with what to
    submit when there is none."""
    spec = admit(body.spec, _settings(request))
    return RecordResponse(
        await run_in_threadpool(_plan_from_store, _store(request), spec, body.objective, body.noise_scale)
    )


#: the API's routers, one per resource, and the dashboard's (:mod:`tula.service.dashboard`), in
#: the order the application tries them
ROUTERS = (login_router, service_router, jobs_router, records_router, plans_router, dashboard_router)


def create_app(settings: ServiceSettings, *, dispatch: bool = True) -> FastAPI:
    """The application: the routers of :data:`ROUTERS` (the dashboard's pages among them), what they
    share on ``app.state`` (``settings``, ``dispatch``, the ``store`` while the service runs and
    the ``finished_models`` of ended jobs), the error handlers and the token guard.  With
    ``dispatch`` its lifespan starts the job dispatcher."""
    app = FastAPI(
        title="Tula",
        version=__version__,
        lifespan=_lifespan,
        description="Profile, fit, plan and train distributed large-batch jobs; re-plan from stored "
        "models without profiling again.",
    )
    app.state.settings, app.state.dispatch = settings, dispatch
    app.state.finished_models = _FinishedModels()
    for exc, handler in ERROR_HANDLERS:
        app.add_exception_handler(exc, handler)
    app.add_middleware(_Guard, settings=settings)
    for router in ROUTERS:
        app.include_router(router)
    return app


@functools.cache
def _host_facts() -> HostFacts:
    """This host's facts (its device, CPU, memory), found once: the key of a spec planned here."""
    from tula.engine.launch.base import host_facts

    return host_facts("auto")


def _plan_from_store(store: Store, spec, objective: str | None, noise_scale: float | None = None) -> dict:
    from tula.core.fit import rebase_models
    from tula.core.plan import make_plan
    from tula.service.model_key import key_parts_for_new_job, model_key

    try:
        parts = key_parts_for_new_job(spec.to_dict(), _host_facts())
    except ValueError as err:
        raise Problem(
            404,
            f"no stored model can be matched for this spec ({err}); submit it as a job (POST /v1/jobs) to profile it",
        ) from None
    found = store.find_models(model_key(parts))
    if found is None:
        raise Problem(
            404,
            f"no stored model for {spec.model.name} on {spec.data.name} with this optimiser, "
            f"collective and hardware; submit the spec as a job (POST /v1/jobs) to profile it once",
        )
    models, from_job = found
    if models.spec.data == spec.data:  # the stored spec, typed
        size = models.dataset_size
    else:
        from tula.engine.workloads import check_workload

        try:
            size = check_workload(spec)[1].train_size
        except TulaError as err:
            raise Problem(422, plain(err)) from None
    try:
        plan = make_plan(
            rebase_models(models.to_json_dict(), spec.to_dict(), size, from_job), objective, noise_scale=noise_scale
        )
    except (InfeasibleError, RecordError) as err:
        raise Problem(422, plain(err)) from None
    return {**plan.to_json_dict(), "reused_models_from": from_job}
