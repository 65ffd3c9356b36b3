"""A small client of the Tula service (what `tula submit`, `tula status` and `tula replan` use),
and the tables they print.  No torch here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from tula.core.errors import TulaError
from tula.core.records import PlanRecord, TrainRecord, as_record
from tula.core.say import Table, first_line, plain, text
from tula.core.validation import first_error, lowered

DEFAULT_SERVER = "http://127.0.0.1:8787"


class ServiceError(TulaError):
    """The service refused a request or could not be reached (one sentence)."""


@dataclass(frozen=True)
class JobView:
    """A job as the service answers it (``GET /v1/jobs/ID``, a page's job, or what ``POST /v1/jobs``
    answers: its id, url and state), read once where the JSON comes in; fields it does not name are left out."""

    id: str
    state: str
    spec: dict[str, Any] = field(default_factory=dict)
    """the job's spec as the JSON it was submitted as"""
    url: str = ""
    progress: float | None = None
    """0 to 1; None before the job has any"""
    message: str | None = None
    error: str | None = None
    created_at: str = ""
    """ISO 8601"""
    reused_models_from: str | None = None
    """the job whose stored models this one planned from (not profiled again)"""

    @property
    def name(self) -> str:
        """The spec's name (``""`` without one)."""
        return str(self.spec.get("name", ""))

    @property
    def ended(self) -> bool:
        return self.state in ("done", "failed", "cancelled")


@dataclass(frozen=True)
class JobPage:
    """One page of the service's jobs (``GET /v1/jobs``) and how many there are in all."""

    jobs: list[JobView]
    total: int


_Answer = TypeVar("_Answer")


def _parsed(kind: type[_Answer], body: Any, what: str) -> _Answer:
    """``body`` (an answer's JSON) as ``kind``, or a :class:`ServiceError` naming the field that is
    missing or wrong."""
    try:
        return TypeAdapter(kind).validate_python(body)
    except ValidationError as err:
        e = first_error(err)
        where = e.where()
        if not where:
            problem = f"with {type(body).__name__}, not a job"
        elif e.missing:
            problem = f"without the field '{where}'"
        else:
            problem = f"with field '{where}' wrong ({lowered(e.message)})"
        raise ServiceError(f"the service answered {what} {problem}; is --server a Tula service?") from None


class Client:
    def __init__(self, server: str | None = None, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base = (server or os.environ.get("TULA_SERVER") or DEFAULT_SERVER).rstrip("/")
        token = token or os.environ.get("TULA_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            self.http = httpx.Client(base_url=self.base, headers=headers, timeout=timeout_s)
        except (httpx.InvalidURL, ValueError, TypeError) as err:  # a server or token that is no URL / header
            raise ServiceError(
                f"cannot use the Tula service at {self.base!r} with this --server/--token "
                f"({type(err).__name__}: {plain(err)})"
            ) from None

    def _call(self, method: str, path: str, missing_ok: bool = False, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            raise ServiceError(
                f"cannot reach the Tula service at {self.base} ({type(err).__name__}: "
                f"{plain(err)}); start it with `tula serve` or give --server"
            ) from None
        if r.status_code == 404 and missing_ok:
            return None
        try:
            body = r.json()
        except ValueError:  # not JSON (a proxy's page, a cut-off answer)
            body = None
        if r.status_code >= 400:
            detail = (
                body.get("detail")
                if isinstance(body, dict) and "detail" in body
                else first_line(r.text, 200) or r.reason_phrase
            )
            raise ServiceError(f"the service answered {r.status_code}: {plain(detail)}")
        if body is None:
            raise ServiceError(
                f"the service at {self.base} answered {method} {path} with {r.status_code} but no "
                f"JSON ({first_line(r.text, 200) or 'an empty body'}); is --server a Tula service?"
            )
        return body

    def submit(self, spec: dict, **options: Any) -> JobView:
        """Submit ``spec``; the queued job (its id, url and state)."""
        body = self._call(
            "POST", "/v1/jobs", json={"spec": spec, **{k: v for k, v in options.items() if v is not None}}
        )
        return _parsed(JobView, body, "POST /v1/jobs")

    def jobs(self, state: str | None = None, limit: int = 50, offset: int = 0) -> JobPage:
        params = {"limit": limit, "offset": offset, **({"state": state} if state else {})}
        return _parsed(JobPage, self._call("GET", "/v1/jobs", params=params), "GET /v1/jobs")

    def job(self, job_id: str) -> JobView:
        return _parsed(JobView, self._call("GET", f"/v1/jobs/{job_id}"), f"GET /v1/jobs/{job_id}")

    def record(self, job_id: str, name: str, missing_ok: bool = False) -> dict | None:
        return self._call("GET", f"/v1/jobs/{job_id}/{name}", missing_ok=missing_ok)

    def cancel(self, job_id: str) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel")

    def replan(self, job_id: str, body: dict) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/replan", json=body)

    def plan(self, spec: dict, objective: str | None = None) -> dict:
        return self._call("POST", "/v1/plans", json={"spec": spec, "objective": objective})


def jobs_table(page: JobPage) -> Table:
    t = Table(title=f"Tula jobs ({len(page.jobs)} of {page.total})")
    for col in ("id", "name", "state", "progress", "created", "message"):
        t.add_column(col, justify="right" if col == "progress" else "left")
    for j in page.jobs:
        msg = plain(j.error or j.message or "")
        t.add_row(
            plain(j.id),
            plain(j.name),
            plain(j.state),
            f"{(j.progress or 0):.0%}",
            plain(j.created_at)[:19].replace("T", " "),
            msg[:70],
        )
    return t


def job_detail(job: JobView, records: dict[str, dict | None]) -> list:
    from tula.report import plan_table, train_table

    out: list = [
        text(
            "job ",
            (job.id, "bold"),
            f" ({job.name}): {job.state}, {(job.progress or 0):.0%}",
            *((" -- ", job.message) if job.message else ()),
        )
    ]
    if job.reused_models_from:
        out.append(text(f"planned from the models of job {job.reused_models_from} (not profiled again)"))
    if job.error:
        out.append(text(("error", "bold red"), ": ", job.error))
    plan, train = records.get("plan"), records.get("train")
    if plan:
        chosen = as_record(plan, PlanRecord)  # the answer's JSON read as the record
        out += [plan_table(chosen), text(("choice", "bold green"), ": ", chosen.reason)]
    if train:
        out.append(train_table(as_record(train, TrainRecord)))
    return out
