"""The store's tables, as its Alembic migrations (:mod:`tula.service.migrations`) build them,
and the column types they use: timezone-aware UTC datetimes and JSON documents that keep
non-finite floats, on every back end.

Every table is prefixed ``tula_`` (and so is Alembic's version table), so a shared database
is fine.  A new column or table is a change here and a new migration; ``test_store`` checks
that the two agree.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

from tula.core.records import _Frozen, _jsonable

#: Alembic's version table (prefixed, like the store's tables, so a shared database is fine)
VERSION_TABLE = "tula_alembic_version"
#: the Alembic script directory that builds these tables
MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


# --------------------------------------------------------------------------- column types
class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every back end (SQLite keeps no zone: stored as UTC
    and given one back on read)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use timezone-aware UTC")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


_FLOAT_TAG = "$tula_float"


def _encode(o: Any) -> Any:
    """JSON-safe on every back end: non-finite floats (which PostgreSQL's json refuses) become
    ``{"$tula_float": "nan"}`` and come back as floats; numpy scalars and arrays become numbers."""
    if isinstance(o, float):
        return o if math.isfinite(o) else {_FLOAT_TAG: repr(o)}
    if isinstance(o, dict):
        return {str(k): _encode(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_encode(v) for v in o]
    if o is None or isinstance(o, (str, int, bool)):
        return o
    return _encode(_jsonable(o))


def _decode(o: Any) -> Any:
    if isinstance(o, dict):
        if len(o) == 1 and _FLOAT_TAG in o:
            return float(o[_FLOAT_TAG])
        return {k: _decode(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_decode(v) for v in o]
    return o


class JSONDoc(TypeDecorator):
    """A JSON column holding any record exactly as given (NaN and infinities included)."""

    impl = sa.JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return None if value is None else _encode(value)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else _decode(value)


def plain_json(record: Any) -> Any:
    """A record as plain JSON values (numpy values converted, tuples as lists); a typed record (the
    store's edge) as its ``to_json_dict()``, what its file holds."""
    if isinstance(record, _Frozen):
        record = record.to_json_dict()
    return json.loads(json.dumps(record, default=_jsonable))


# --------------------------------------------------------------------------- schema (as migrated)
metadata = sa.MetaData()


def _job_fk() -> sa.Column:
    return sa.Column("job_id", sa.String(32), sa.ForeignKey("tula_jobs.id", ondelete="CASCADE"), nullable=False)


jobs = sa.Table(
    "tula_jobs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("spec", JSONDoc(), nullable=False),
    sa.Column("search", sa.String(16), nullable=False),
    sa.Column("objective", sa.String(16), nullable=True),
    sa.Column("train", sa.Boolean(), nullable=False),
    sa.Column("progress", sa.Float(), nullable=False),
    sa.Column("message", sa.Text(), nullable=True),
    sa.Column("error", sa.Text(), nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.Column("heartbeat_at", UTCDateTime(), nullable=True),
    sa.Column("runner", sa.String(200), nullable=True),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("reused_models_from", sa.String(32), nullable=True),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    # its world on the operator's cluster (tula.service.worlds): the workers it asks for or
    # holds now (None between worlds), and when they were granted (None while it waits)
    sa.Column("world_workers", sa.Integer(), nullable=True),
    sa.Column("world_granted_at", UTCDateTime(), nullable=True),
    sa.Index("ix_tula_jobs_state_created", "state", "created_at"),
    sa.Index("ix_tula_jobs_created", "created_at"),
)
records = sa.Table(
    "tula_records",
    metadata,
    _job_fk(),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("body", JSONDoc(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint("job_id", "kind"),
)
trials_t = sa.Table(
    "tula_trials",
    metadata,
    _job_fk(),
    sa.Column("n_workers", sa.Integer(), nullable=False),
    sa.Column("global_batch", sa.Integer(), nullable=False),
    sa.Column("local_batch", sa.Integer(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("t_step_s", sa.Float(), nullable=True),
    sa.Column("t_compute_s", sa.Float(), nullable=True),
    sa.Column("t_sync_s", sa.Float(), nullable=True),
    sa.Column("peak_mem_bytes", sa.BigInteger(), nullable=True),
    sa.Column("body", JSONDoc(), nullable=False),
    sa.PrimaryKeyConstraint("job_id", "n_workers", "global_batch"),
)
metrics_t = sa.Table(
    "tula_metrics",
    metadata,
    _job_fk(),
    sa.Column("epoch", sa.Integer(), nullable=False),
    sa.Column("global_batch", sa.Integer(), nullable=False),
    sa.Column("n_workers", sa.Integer(), nullable=False),
    sa.Column("train_loss", sa.Float(), nullable=True),
    sa.Column("test_loss", sa.Float(), nullable=True),
    sa.Column("test_top1", sa.Float(), nullable=True),
    sa.Column("epoch_time_s", sa.Float(), nullable=True),
    sa.Column("body", JSONDoc(), nullable=False),
    sa.PrimaryKeyConstraint("job_id", "epoch"),
)
models_t = sa.Table(
    "tula_models",
    metadata,
    sa.Column("key", sa.String(64), nullable=False),
    _job_fk(),
    sa.Column("key_parts", JSONDoc(), nullable=False),
    sa.Column("models", JSONDoc(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint("key", "job_id"),
    sa.Index("ix_tula_models_key_created", "key", "created_at"),
)
artifacts_t = sa.Table(
    "tula_artifacts",
    metadata,
    _job_fk(),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("path", sa.Text(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.PrimaryKeyConstraint("job_id", "name"),
)
