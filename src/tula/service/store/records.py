"""Jobs' records in the store: the profile, models, plan and training records (checked when
put and again when read), a profile's trials and a training record's epochs also as rows
of their own, keyed by (job, N, B) and (job, epoch).
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tula.core.errors import RecordError
from tula.core.records import (
    MODELS_KIND,
    NAMES,
    PLAN_KIND,
    PROFILE_KIND,
    SCHEMAS,
    TRAIN_KIND,
    EpochRecord,
    ProfileRecord,
    RecordT,
    TrainRecord,
    Trial,
    _Record,
    parse_record,
    validate_record,
)
from tula.service.store.database import Database, StoreError, now_utc
from tula.service.store.schema import metrics_t, plain_json, records, trials_t

#: the record kinds a job has (short name -> record kind)
RECORD_KINDS = {"profile": PROFILE_KIND, "models": MODELS_KIND, "plan": PLAN_KIND, "train": TRAIN_KIND}
_SHORT = {v: k for k, v in RECORD_KINDS.items()}


def _stored(job_id: str, short: str) -> str:
    """How a stored record is named in a sentence."""
    return f"the {NAMES[RECORD_KINDS[short]]} record of job {job_id!r} in the store"


def _short_kind(kind: str) -> str:
    if kind in RECORD_KINDS:
        return kind
    if kind in _SHORT:
        return _SHORT[kind]
    raise ValueError(f"record kind must be one of {', '.join(RECORD_KINDS)}, not {kind!r}")


class Records(Database):
    """A job's records, and its trials and epochs as rows."""

    def put_record(self, job_id: str, record: dict | _Record) -> None:
        """Store ``record`` (a profile, models, plan or training record, typed or as a dict, checked first) as
        ``job_id``'s record of its kind, replacing the one before.  A profile's trials and a
        training record's epochs become rows keyed by (job, N, B) and (job, epoch): the rows
        are made to match the record, so a partial record put again as it grows never
        duplicates one."""
        if isinstance(record, _Record):  # the store's edge: the record as its file holds it
            record = record.to_json_dict()
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind not in _SHORT:
            raise RecordError(
                f"the record given for job {job_id!r} is not a profile, models, plan or training record (kind {kind!r})"
            )
        short = _short_kind(kind)
        body = plain_json(record)  # what the row holds: the record as its file holds it
        typed = parse_record(body, SCHEMAS[kind], f"the {NAMES[kind]} record given for job {job_id!r}")
        now = now_utc()
        with self._write() as conn:
            self._need_job(conn, job_id)
            self._upsert(conn, records, {"job_id": job_id, "kind": short}, {"body": body, "updated_at": now})
            if isinstance(typed, ProfileRecord):  # a trial's row keeps its JSON as the record has it
                trials = zip(typed.trials, body["trials"])
                self._sync_rows(
                    conn,
                    trials_t,
                    job_id,
                    ("n_workers", "global_batch"),
                    {(t.n_workers, t.global_batch): (_trial_columns(t), j) for t, j in trials},
                )
            elif isinstance(typed, TrainRecord):
                epochs = zip(typed.history, body["history"])
                self._sync_rows(
                    conn, metrics_t, job_id, ("epoch",), {(e.epoch,): (_metric_columns(e), j) for e, j in epochs}
                )

    def get_record(self, job_id: str, kind: str) -> dict | None:
        """``job_id``'s record of ``kind`` (``profile``, ``models``, ``plan``, ``train``, or the
        record kind ``tula.profile`` ...), checked; None when there is none.  A damaged row is
        a :class:`StoreError` naming the job and kind."""
        short = _short_kind(kind)
        body = self._body(job_id, short)
        if body is None:
            return None
        try:
            validate_record(body, _stored(job_id, short), (RECORD_KINDS[short],))
        except RecordError as err:
            raise StoreError(str(err)) from None
        return body

    def read_record(self, job_id: str, cls: type[RecordT]) -> RecordT | None:
        """``job_id``'s record of the kind ``cls`` is (:class:`~tula.core.records.PlanRecord`, ...) as
        that typed, frozen object -- the store holds JSON, and this is where it is read as a record --;
        None when there is none.  A damaged row is a :class:`StoreError` naming the job and kind."""
        short = next(s for s, k in RECORD_KINDS.items() if SCHEMAS[k] is cls)
        body = self._body(job_id, short)
        if body is None:
            return None
        try:
            return parse_record(body, cls, _stored(job_id, short))
        except RecordError as err:
            raise StoreError(str(err)) from None

    def _body(self, job_id: str, short: str) -> Any:
        """The stored JSON of ``job_id``'s record ``short``, unchecked; None when there is none."""
        try:
            with self._read() as conn:
                return conn.execute(
                    sa.select(records.c.body).where(records.c.job_id == job_id, records.c.kind == short)
                ).scalar_one_or_none()
        except (ValueError, TypeError) as err:  # JSON that does not parse
            raise StoreError(
                f"{_stored(job_id, short)} is damaged: it is not valid JSON ({str(err).splitlines()[0][:120]})"
            ) from None

    def trials(self, job_id: str) -> list[dict]:
        """The trials of ``job_id``'s profile, as in its record, ordered by (N, B)."""
        with self._read() as conn:
            rows = (
                conn.execute(
                    sa.select(trials_t.c.body)
                    .where(trials_t.c.job_id == job_id)
                    .order_by(trials_t.c.n_workers, trials_t.c.global_batch)
                )
                .scalars()
                .all()
            )
        return list(rows)

    def metrics(self, job_id: str) -> list[dict]:
        """The epochs of ``job_id``'s training record (its history lines), ordered by epoch."""
        with self._read() as conn:
            rows = (
                conn.execute(
                    sa.select(metrics_t.c.body).where(metrics_t.c.job_id == job_id).order_by(metrics_t.c.epoch)
                )
                .scalars()
                .all()
            )
        return list(rows)

    def _sync_rows(
        self,
        conn: Connection,
        table: sa.Table,
        job_id: str,
        key_cols: tuple[str, ...],
        want: dict[tuple, tuple[dict[str, Any], Any]],
    ) -> None:
        """Make ``job_id``'s rows of ``table`` exactly ``want`` (key tuple -> the row's columns
        and its JSON body): changed rows updated, new ones inserted, ones no longer there deleted."""
        cols = [table.c[c] for c in key_cols]
        have = {
            tuple(r[:-1]): r[-1]
            for r in conn.execute(sa.select(*cols, table.c.body).where(table.c.job_id == job_id)).all()
        }
        for k in have.keys() - want.keys():
            conn.execute(sa.delete(table).where(table.c.job_id == job_id, *[c == v for c, v in zip(cols, k)]))
        for k, (columns, body) in want.items():
            if k not in have:
                conn.execute(sa.insert(table).values(job_id=job_id, **columns, body=body))
            elif have[k] != body:
                conn.execute(
                    sa.update(table)
                    .where(table.c.job_id == job_id, *[c == v for c, v in zip(cols, k)])
                    .values(**{c: v for c, v in columns.items() if c not in key_cols}, body=body)
                )


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _trial_columns(t: Trial) -> dict[str, Any]:
    """A trial's row of ``tula_trials`` (its columns but the body)."""
    return dict(
        n_workers=t.n_workers,
        global_batch=t.global_batch,
        local_batch=t.local_batch,
        status=t.status,
        t_step_s=_finite(t.t_step_s),
        t_compute_s=_finite(t.t_compute_s),
        t_sync_s=_finite(t.t_sync_s),
        peak_mem_bytes=t.peak_mem_bytes,
    )


def _metric_columns(e: EpochRecord) -> dict[str, Any]:
    """An epoch's row of ``tula_metrics`` (its columns but the body)."""
    return dict(
        epoch=e.epoch,
        global_batch=e.global_batch,
        n_workers=e.n_workers,
        train_loss=_finite(e.train_loss),
        test_loss=_finite(e.test_loss),
        test_top1=_finite(e.test_top1),
        epoch_time_s=_finite(e.epoch_time_s),
    )
