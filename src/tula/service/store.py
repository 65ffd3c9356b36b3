"""The service's persistent store: jobs, their records, trials, per-epoch metrics, fitted
models and artefacts, in any SQLAlchemy database (an SQLite file by default; PostgreSQL tested).

One :class:`Store` per process; it is safe to share between threads.  Everything crossing its
boundary is a plain dict (or a ``Path``): no ORM object, no open transaction.  Every write
is one transaction; on SQLite writes take the write lock up front (``BEGIN IMMEDIATE``) and
wait up to the busy timeout for it, so concurrent writers queue instead of failing.

The schema is created and migrated by Alembic (:mod:`tula.service.migrations`), run on open
under a lock, so two processes opening a fresh database at once both succeed.

Records are the same JSON records the CLI writes (:mod:`tula.core.records`), checked when they are
put and again when they are read (a damaged row is one sentence naming the job and kind).  A
profile record's trials and a training record's epochs are also rows of their own, keyed by
(job, N, B) and (job, epoch), so a partial record put again as it grows never duplicates one.

Large artefacts (checkpoints, PNGs) are files under the store's data directory; rows hold
their paths relative to it.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.types import TypeDecorator

from tula.core.errors import RecordError, TulaError
from tula.core.records import MODELS_KIND, NAMES, PLAN_KIND, PROFILE_KIND, TRAIN_KIND, _jsonable, validate_record
from tula.core.registry import OBJECTIVE_NAMES
from tula.core.say import plain
from tula.service.model_key import model_key

#: a job's states, in pipeline order, then its ends
JOB_STATES = ("queued", "profiling", "fitting", "planning", "training", "done", "failed", "cancelled")
RUNNING_STATES = ("profiling", "fitting", "planning", "training")
ENDED_STATES = ("done", "failed", "cancelled")
#: the record kinds a job has (short name -> record kind)
RECORD_KINDS = {"profile": PROFILE_KIND, "models": MODELS_KIND, "plan": PLAN_KIND, "train": TRAIN_KIND}
_SHORT = {v: k for k, v in RECORD_KINDS.items()}

#: Alembic's version table (prefixed, like the store's tables, so a shared database is fine)
VERSION_TABLE = "tula_alembic_version"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: how long an SQLite writer waits for the lock before giving up
BUSY_TIMEOUT_S = 30.0
#: PostgreSQL advisory lock taken while migrating (any fixed 64-bit number)
_MIGRATE_LOCK = 0x7475_6C61_0001  # "tula" 1


class StoreError(TulaError):
    """The store cannot be opened or used: a bad URL, an unreachable server, a file that is
    not a database, a damaged row."""


class UnknownJob(StoreError):
    """No job with this id is in the store."""


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


# --------------------------------------------------------------------------- helpers
def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def new_id() -> str:
    """A short url-safe id: 12 hex digits of a random UUID."""
    return uuid.uuid4().hex[:12]


def mask_url(url: str) -> str:
    """``url`` as given, with its password replaced by ``***``."""
    return re.sub(r"^([^:/?#]+://[^/@:?#]*:)[^@/]*@", r"\1***@", str(url))


def _cause(err: BaseException) -> str:
    """The first line of a driver's message, without SQLAlchemy's wrapping."""
    orig = getattr(err, "orig", None) or err
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    text = re.sub(r"\s*\(Background on this error at:.*\)$", "", text)
    return text.rstrip(".")


def _wal_mode(cur: Any, wait_s: float) -> None:
    """Put an SQLite database in WAL mode (it stays so: later connections only check).  Two
    processes converting a new database at once can deadlock on its locks, and SQLite then
    answers "database is locked" to one of them without waiting: that one tries again."""
    import sqlite3

    deadline = time.monotonic() + wait_s
    delay = 0.005
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return
            cur.execute("PRAGMA journal_mode = WAL").fetchone()  # an in-memory database stays 'memory'
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _short_kind(kind: str) -> str:
    if kind in RECORD_KINDS:
        return kind
    if kind in _SHORT:
        return _SHORT[kind]
    raise ValueError(f"record kind must be one of {', '.join(RECORD_KINDS)}, not {kind!r}")


def _plain(record: Any) -> Any:
    """A record as plain JSON values (numpy values converted, tuples as lists)."""
    return json.loads(json.dumps(record, default=_jsonable))


class Store:
    """Jobs, records and fitted models in the database at ``url``.

    Parameters
    ----------
    url : an SQLAlchemy URL: ``sqlite:////abs/path/tula.db`` (the embedded default; the file
        and its directory are created), ``postgresql+psycopg://user:pw@host/db``, ...
    data_dir : where artefact files live (rows hold paths relative to it); default: ``data``
        beside an SQLite file, else ``~/.tula/data``.
    busy_timeout_s : how long an SQLite writer waits for the write lock.

    Raises :class:`StoreError` (one sentence naming the URL, password masked, and the cause)
    when the database cannot be opened or its schema is newer than this Tula's."""

    def __init__(self, url: str, data_dir: str | Path | None = None, *, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.url = str(url)
        self.safe_url = mask_url(self.url)
        self.engine = self._open(busy_timeout_s)
        try:
            self._migrate()
        except StoreError:
            self.engine.dispose()
            raise
        except (sa_exc.SQLAlchemyError, OSError) as err:
            self.engine.dispose()
            raise StoreError(f"cannot open the store at {self.safe_url}: {_cause(err)}") from None
        if data_dir is None:
            db = self.engine.url.database if self.dialect == "sqlite" else None
            data_dir = Path(db).parent / "data" if db and db != ":memory:" else Path.home() / ".tula" / "data"
        self.data_dir = Path(data_dir).expanduser().resolve()

    # ----------------------------------------------------------------------- opening
    def _open(self, busy_timeout_s: float) -> Engine:
        try:
            u = make_url(self.url)
        except (sa_exc.ArgumentError, ValueError):
            raise StoreError(
                f"cannot open the store at {self.safe_url!r}: it is not a database URL "
                "(e.g. sqlite:////abs/path/tula.db or postgresql+psycopg://user@host/db)"
            ) from None
        kwargs: dict[str, Any] = {}
        backend = u.get_backend_name()
        if backend == "sqlite":
            db = u.database
            if db and db != ":memory:" and not db.startswith("file:"):
                path = Path(db).expanduser()
                if path.is_dir():
                    raise StoreError(
                        f"cannot open the store at {self.safe_url}: {str(path)!r} is a directory, not a database file"
                    )
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as err:
                    raise StoreError(
                        f"cannot open the store at {self.safe_url}: its directory cannot be created ({err.strerror})"
                    ) from None
            else:
                kwargs["poolclass"] = sa.StaticPool  # one in-memory database, shared by the threads
            kwargs["connect_args"] = {"timeout": busy_timeout_s, "check_same_thread": False}
        elif backend == "postgresql":
            kwargs["pool_pre_ping"] = True
            if u.get_driver_name() in ("psycopg", "psycopg2") and "connect_timeout" not in u.query:
                kwargs["connect_args"] = {"connect_timeout": 10}
        try:
            engine = sa.create_engine(u, **kwargs)
        except sa_exc.NoSuchModuleError:
            raise StoreError(
                f"cannot open the store at {self.safe_url}: {u.drivername!r} is not a database "
                "SQLAlchemy knows (use sqlite:/// or postgresql+psycopg://)"
            ) from None
        except ImportError as err:
            raise StoreError(
                f"cannot open the store at {self.safe_url}: the driver {u.drivername!r} needs is not installed ({err})"
            ) from None
        except (sa_exc.ArgumentError, TypeError, ValueError) as err:
            raise StoreError(f"cannot open the store at {self.safe_url}: {_cause(err)}") from None
        if engine.dialect.name == "sqlite":
            ms = int(busy_timeout_s * 1000)

            @event.listens_for(engine, "connect")
            def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.isolation_level = None  # transactions are begun below, not by the driver
                cur = dbapi_conn.cursor()
                try:
                    cur.execute(f"PRAGMA busy_timeout = {ms}")
                    _wal_mode(cur, busy_timeout_s)
                    cur.execute("PRAGMA synchronous = NORMAL")
                    cur.execute("PRAGMA foreign_keys = ON")
                finally:
                    cur.close()

            @event.listens_for(engine, "begin")
            def _sqlite_begin(conn: Connection) -> None:
                # writers take the lock first, so a read-then-write never dead-ends in SQLITE_BUSY
                conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("tula_write") else "BEGIN")

        return engine

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def _migrate(self) -> None:
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory
        from alembic.util.exc import CommandError

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        script = ScriptDirectory.from_config(cfg)
        heads = set(script.get_heads())
        with self.engine.connect() as conn:  # most opens find the schema current: no write lock
            current = set(MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_heads())
        if current == heads:
            return
        unknown = [r for r in current if r not in {s.revision for s in script.walk_revisions()}]
        if unknown:
            raise StoreError(
                f"cannot open the store at {self.safe_url}: its schema (revision {unknown[0]}) is newer "
                "than this Tula's; upgrade Tula"
            )
        with self._write() as conn:
            if self.dialect == "postgresql":  # SQLite: BEGIN IMMEDIATE already serialises the upgrade
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATE_LOCK})
            cfg.attributes["connection"] = conn
            try:
                command.upgrade(cfg, "head")
            except CommandError as err:
                raise StoreError(
                    f"cannot open the store at {self.safe_url}: its schema cannot be migrated ({_cause(err)})"
                ) from None

    @contextmanager
    def _unavailable_as_store_error(self) -> Iterator[None]:
        try:
            yield
        except sa_exc.OperationalError as err:  # server gone, lock not had within the busy timeout, disk full
            raise StoreError(f"the store at {self.safe_url} cannot be used: {_cause(err)}") from None

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """One write transaction (SQLite: holding the write lock from its start)."""
        with self._unavailable_as_store_error(), self.engine.connect() as conn:
            conn.execution_options(tula_write=True)
            with conn.begin():
                yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._unavailable_as_store_error(), self.engine.connect() as conn:
            yield conn

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.safe_url!r})"

    # ----------------------------------------------------------------------- jobs
    @staticmethod
    def _job(row: Any) -> dict:
        d = dict(row._mapping)
        d["train"] = bool(d["train"])
        d["cancel_requested"] = bool(d["cancel_requested"])
        return d

    def _get_job(self, conn: Connection, job_id: str, lock: bool = False) -> dict | None:
        q = sa.select(jobs).where(jobs.c.id == job_id)
        if lock:
            q = q.with_for_update()
        row = conn.execute(q).first()
        return self._job(row) if row is not None else None

    def _need_job(self, conn: Connection, job_id: str, lock: bool = False) -> dict:
        job = self._get_job(conn, job_id, lock)
        if job is None:
            raise UnknownJob(f"there is no job {job_id!r} in the store")
        return job

    def create_job(
        self, spec: dict, *, search: str = "partial", objective: str | None = None, train: bool = True
    ) -> str:
        """A new queued job; returns its id.  ``spec`` is a checked job spec as a dict."""
        if search not in ("full", "partial"):
            raise ValueError(f"search must be 'full' or 'partial', not {search!r}")
        if objective is not None and objective not in OBJECTIVE_NAMES:
            raise ValueError(f"objective must be time, cost, knee or None, not {objective!r}")
        if not isinstance(spec, dict):
            raise ValueError("spec must be a dict")
        now = now_utc()
        job_id = new_id()
        with self._write() as conn:
            conn.execute(
                sa.insert(jobs).values(
                    id=job_id,
                    state="queued",
                    spec=_plain(spec),
                    search=search,
                    objective=objective,
                    train=bool(train),
                    progress=0.0,
                    message=None,
                    error=None,
                    created_at=now,
                    started_at=None,
                    updated_at=now,
                    finished_at=None,
                    heartbeat_at=None,
                    runner=None,
                    attempts=0,
                    reused_models_from=None,
                    cancel_requested=False,
                )
            )
        return job_id

    def get_job(self, job_id: str) -> dict | None:
        with self._read() as conn:
            return self._get_job(conn, job_id)

    def list_jobs(
        self, state: str | Iterable[str] | None = None, limit: int = 50, offset: int = 0
    ) -> tuple[list[dict], int]:
        """Jobs newest first (optionally in ``state``, a state or several), and how many match."""
        where = []
        if state is not None:
            states = [state] if isinstance(state, str) else list(state)
            bad = [s for s in states if s not in JOB_STATES]
            if bad:
                raise ValueError(f"unknown job state {bad[0]!r}; the states are {', '.join(JOB_STATES)}")
            where.append(jobs.c.state.in_(states))
        with self._read() as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(jobs).where(*where)).scalar_one()
            rows = conn.execute(
                sa.select(jobs)
                .where(*where)
                .order_by(jobs.c.created_at.desc(), jobs.c.id.desc())
                .limit(max(0, int(limit)))
                .offset(max(0, int(offset)))
            ).all()
        return [self._job(r) for r in rows], int(total)

    def oldest_queued(self) -> dict | None:
        """The job :meth:`claim_job` would take next (the oldest queued), or None."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(jobs).where(jobs.c.state == "queued").order_by(jobs.c.created_at, jobs.c.id).limit(1)
            ).first()
        return self._job(row) if row is not None else None

    def claim_job(self, runner: str, job_id: str | None = None) -> dict | None:
        """Take the oldest queued job (or the job ``job_id``, while it is queued) for ``runner``
        (state ``profiling``, attempts + 1, heartbeat now), or None when none is queued.  Two
        claimers never get the same job: PostgreSQL skips rows another claimer holds (FOR
        UPDATE SKIP LOCKED); SQLite serialises writers; and the update only takes a job that
        is still queued."""
        only = [jobs.c.id == job_id] if job_id is not None else []
        for _ in range(20):
            now = now_utc()
            with self._write() as conn:
                row = conn.execute(
                    sa.select(jobs.c.id)
                    .where(jobs.c.state == "queued", *only)
                    .order_by(jobs.c.created_at, jobs.c.id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                ).first()
                if row is None:
                    return None
                res = conn.execute(
                    sa.update(jobs)
                    .where(jobs.c.id == row.id, jobs.c.state == "queued")
                    .values(
                        state="profiling",
                        runner=runner,
                        heartbeat_at=now,
                        updated_at=now,
                        started_at=sa.func.coalesce(jobs.c.started_at, now),
                        attempts=jobs.c.attempts + 1,
                    )
                )
                if res.rowcount == 1:
                    return self._get_job(conn, row.id)
        return None  # pragma: no cover - only under a storm of competing claimers

    def update_job(
        self,
        job_id: str,
        *,
        state: str | None = None,
        progress: float | None = None,
        message: str | None = None,
        error: str | None = None,
        reused_models_from: str | None = None,
    ) -> None:
        """Set the fields given (None: unchanged).  Entering an end state sets ``finished_at``;
        going back to ``queued`` clears the runner."""
        now = now_utc()
        values: dict[str, Any] = {"updated_at": now}
        if state is not None:
            if state not in JOB_STATES:
                raise ValueError(f"unknown job state {state!r}; the states are {', '.join(JOB_STATES)}")
            values["state"] = state
            if state in ENDED_STATES:
                values["finished_at"] = now
            elif state == "queued":
                values.update(runner=None, heartbeat_at=None, finished_at=None)
        if progress is not None:
            if not (0.0 <= float(progress) <= 1.0):
                raise ValueError(f"progress must be in [0, 1], not {progress!r}")
            values["progress"] = float(progress)
        if message is not None:
            values["message"] = plain(message)
        if error is not None:
            values["error"] = plain(error)
        if reused_models_from is not None:
            values["reused_models_from"] = reused_models_from
        with self._write() as conn:
            if conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values)).rowcount != 1:
                raise UnknownJob(f"there is no job {job_id!r} in the store")

    def note_queued(self, job_id: str, message: str) -> None:
        """Set a queued job's message (what it waits for); a job no longer queued is left as it is."""
        with self._write() as conn:
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == "queued")
                .values(message=plain(message), updated_at=now_utc())
            )

    def heartbeat(self, job_id: str, runner: str) -> bool:
        """Record that ``runner`` is alive and working on ``job_id``.  False when the job is no
        longer this runner's to run (re-queued, taken by another runner, ended) or its
        cancellation was requested: the runner should stop."""
        now = now_utc()
        with self._write() as conn:
            res = conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.runner == runner, jobs.c.state.in_(RUNNING_STATES))
                .values(heartbeat_at=now)
            )
            if res.rowcount != 1:
                return False
            return not conn.execute(sa.select(jobs.c.cancel_requested).where(jobs.c.id == job_id)).scalar_one()

    def requeue_stale(self, stale_after_s: float, max_attempts: int | None = None) -> list[str]:
        """Jobs in a running state whose heartbeat is older than ``stale_after_s`` (their
        runner was killed) go back to ``queued``, runner cleared; returns their ids.  Such a
        job whose cancellation was requested ends ``cancelled`` instead, and one that has
        already been claimed ``max_attempts`` times ends ``failed`` (neither is returned)."""
        now = now_utc()
        cutoff = now - timedelta(seconds=float(stale_after_s))
        beat = sa.func.coalesce(jobs.c.heartbeat_at, jobs.c.started_at, jobs.c.updated_at)
        stale = sa.and_(jobs.c.state.in_(RUNNING_STATES), beat < cutoff)
        requeued: list[str] = []
        with self._write() as conn:
            rows = conn.execute(
                sa.select(jobs.c.id, jobs.c.cancel_requested, jobs.c.attempts)
                .where(stale)
                .order_by(jobs.c.created_at)
                .with_for_update(skip_locked=True)
            ).all()
            for r in rows:
                cond = sa.and_(jobs.c.id == r.id, stale)
                if r.cancel_requested:
                    conn.execute(
                        sa.update(jobs)
                        .where(cond)
                        .values(
                            state="cancelled",
                            runner=None,
                            finished_at=now,
                            updated_at=now,
                            message="cancelled (its runner stopped before it could finish cancelling)",
                        )
                    )
                elif max_attempts is not None and r.attempts >= max_attempts:
                    conn.execute(
                        sa.update(jobs)
                        .where(cond)
                        .values(
                            state="failed",
                            runner=None,
                            finished_at=now,
                            updated_at=now,
                            error=f"the job's runner stopped without a word {r.attempts} time(s); it is not retried again",
                        )
                    )
                elif (
                    conn.execute(
                        sa.update(jobs)
                        .where(cond)
                        .values(
                            state="queued",
                            runner=None,
                            heartbeat_at=None,
                            updated_at=now,
                            message="re-queued: its runner stopped heartbeating",
                        )
                    ).rowcount
                    == 1
                ):
                    requeued.append(r.id)
        return requeued

    def request_cancel(self, job_id: str) -> dict:
        """Cancel ``job_id``: a queued job ends ``cancelled`` at once; a running one gets
        ``cancel_requested`` (its runner sees it in :meth:`heartbeat` and stops); an ended one
        is left as it is.  Returns the job as it is now."""
        now = now_utc()
        with self._write() as conn:
            job = self._need_job(conn, job_id, lock=True)
            if job["state"] == "queued":
                conn.execute(
                    sa.update(jobs)
                    .where(jobs.c.id == job_id, jobs.c.state == "queued")
                    .values(state="cancelled", cancel_requested=True, finished_at=now, updated_at=now)
                )
            elif job["state"] in RUNNING_STATES and not job["cancel_requested"]:
                conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(cancel_requested=True, updated_at=now))
            return self._need_job(conn, job_id)

    def count_running(self) -> int:
        with self._read() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).select_from(jobs).where(jobs.c.state.in_(RUNNING_STATES))
                ).scalar_one()
            )

    # ----------------------------------------------------------------------- records
    def put_record(self, job_id: str, record: dict) -> None:
        """Store ``record`` (a profile, models, plan or training record, checked first) as
        ``job_id``'s record of its kind, replacing the one before.  A profile's trials and a
        training record's epochs become rows keyed by (job, N, B) and (job, epoch): the rows
        are made to match the record, so a partial record put again as it grows never
        duplicates one."""
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind not in _SHORT:
            raise RecordError(
                f"the record given for job {job_id!r} is not a profile, models, plan or training record (kind {kind!r})"
            )
        short = _short_kind(kind)
        body = _plain(record)
        validate_record(body, f"the {NAMES[kind]} record given for job {job_id!r}")
        now = now_utc()
        with self._write() as conn:
            self._need_job(conn, job_id)
            self._upsert(conn, records, {"job_id": job_id, "kind": short}, {"body": body, "updated_at": now})
            if short == "profile":
                self._sync_rows(
                    conn,
                    trials_t,
                    job_id,
                    ("n_workers", "global_batch"),
                    {(t["n_workers"], t["global_batch"]): _trial_row(t) for t in body["trials"]},
                )
            elif short == "train":
                self._sync_rows(
                    conn, metrics_t, job_id, ("epoch",), {(e["epoch"],): _metric_row(e) for e in body["history"]}
                )

    def get_record(self, job_id: str, kind: str) -> dict | None:
        """``job_id``'s record of ``kind`` (``profile``, ``models``, ``plan``, ``train``, or the
        record kind ``tula.profile`` ...), checked; None when there is none.  A damaged row is
        a :class:`StoreError` naming the job and kind."""
        short = _short_kind(kind)
        name = NAMES[RECORD_KINDS[short]]
        try:
            with self._read() as conn:
                body = conn.execute(
                    sa.select(records.c.body).where(records.c.job_id == job_id, records.c.kind == short)
                ).scalar_one_or_none()
        except (ValueError, TypeError) as err:  # JSON that does not parse
            raise StoreError(
                f"the {name} record of job {job_id!r} in the store is damaged: it is not valid JSON "
                f"({str(err).splitlines()[0][:120]})"
            ) from None
        if body is None:
            return None
        try:
            validate_record(body, f"the {name} record of job {job_id!r} in the store", (RECORD_KINDS[short],))
        except RecordError as err:
            raise StoreError(str(err)) from None
        return body

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

    # ----------------------------------------------------------------------- artefacts
    def job_dir(self, job_id: str) -> Path:
        """The directory under the data directory where ``job_id``'s files go (created)."""
        if not re.fullmatch(r"[A-Za-z0-9_-]+", job_id):
            raise ValueError(f"{job_id!r} is not a job id")
        d = self.data_dir / "jobs" / job_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    def add_artifact(self, job_id: str, name: str, path: str | Path) -> None:
        """Record that ``job_id``'s artefact ``name`` (e.g. ``plan.png``) is the file ``path``,
        which must lie under the data directory (absolute, or relative to it)."""
        if not name or len(name) > 200:
            raise ValueError("an artefact's name must have 1 to 200 characters")
        p = Path(path)
        p = (p if p.is_absolute() else self.data_dir / p).resolve()
        try:
            rel = p.relative_to(self.data_dir)
        except ValueError:
            raise StoreError(
                f"artefact {name!r} of job {job_id!r} is {str(p)!r}, outside the store's data directory "
                f"{str(self.data_dir)!r}"
            ) from None
        if not p.is_file():
            raise StoreError(f"artefact {name!r} of job {job_id!r} is {str(p)!r}, which is not a file")
        with self._write() as conn:
            self._need_job(conn, job_id)
            self._upsert(
                conn, artifacts_t, {"job_id": job_id, "name": name}, {"path": rel.as_posix(), "updated_at": now_utc()}
            )

    def artifact_path(self, job_id: str, name: str) -> Path | None:
        """The file of ``job_id``'s artefact ``name``; None when there is none (or it is gone)."""
        with self._read() as conn:
            rel = conn.execute(
                sa.select(artifacts_t.c.path).where(artifacts_t.c.job_id == job_id, artifacts_t.c.name == name)
            ).scalar_one_or_none()
        if rel is None:
            return None
        p = self.data_dir / rel
        return p if p.is_file() else None

    def artifacts(self, job_id: str) -> dict[str, Path]:
        """Every artefact of ``job_id`` whose file is there: name -> path."""
        with self._read() as conn:
            rows = conn.execute(
                sa.select(artifacts_t.c.name, artifacts_t.c.path)
                .where(artifacts_t.c.job_id == job_id)
                .order_by(artifacts_t.c.name)
            ).all()
        return {r.name: self.data_dir / r.path for r in rows if (self.data_dir / r.path).is_file()}

    # ----------------------------------------------------------------------- model reuse
    def put_models(self, job_id: str, key: str, key_parts: dict, models: dict) -> None:
        """Store the models record ``job_id`` fitted under ``key`` (= ``model_key(key_parts)``)."""
        if model_key(key_parts) != key:
            raise ValueError("key is not model_key(key_parts)")
        body = _plain(models)
        validate_record(body, f"the models record given for job {job_id!r}", (MODELS_KIND,))
        with self._write() as conn:
            self._need_job(conn, job_id)
            self._upsert(
                conn,
                models_t,
                {"key": key, "job_id": job_id},
                {"key_parts": _plain(key_parts), "models": body, "created_at": now_utc()},
            )

    def find_models(self, key: str) -> tuple[dict, str] | None:
        """The newest models record stored under ``key`` and the job that fitted it, or None."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(models_t.c.models, models_t.c.job_id)
                .where(models_t.c.key == key)
                .order_by(models_t.c.created_at.desc(), models_t.c.job_id)
                .limit(1)
            ).first()
        if row is None:
            return None
        try:
            validate_record(row.models, f"the models record of job {row.job_id!r} stored for reuse", (MODELS_KIND,))
        except RecordError as err:
            raise StoreError(str(err)) from None
        return row.models, row.job_id

    # ----------------------------------------------------------------------- writing rows
    def _upsert(self, conn: Connection, table: sa.Table, key: dict, values: dict) -> None:
        if self.dialect in ("sqlite", "postgresql"):
            if self.dialect == "sqlite":
                from sqlalchemy.dialects.sqlite import insert
            else:
                from sqlalchemy.dialects.postgresql import insert
            stmt = insert(table).values(**key, **values)
            conn.execute(stmt.on_conflict_do_update(index_elements=list(key), set_=values))
            return
        cond = [table.c[k] == v for k, v in key.items()]
        if conn.execute(sa.update(table).where(*cond).values(**values)).rowcount == 0:
            conn.execute(sa.insert(table).values(**key, **values))

    def _sync_rows(
        self, conn: Connection, table: sa.Table, job_id: str, key_cols: tuple[str, ...], want: dict[tuple, dict]
    ) -> None:
        """Make ``job_id``'s rows of ``table`` exactly ``want`` (key tuple -> row values):
        changed rows updated, new ones inserted, ones no longer there deleted."""
        cols = [table.c[c] for c in key_cols]
        have = {
            tuple(r[:-1]): r[-1]
            for r in conn.execute(sa.select(*cols, table.c.body).where(table.c.job_id == job_id)).all()
        }
        for k in have.keys() - want.keys():
            conn.execute(sa.delete(table).where(table.c.job_id == job_id, *[c == v for c, v in zip(cols, k)]))
        for k, row in want.items():
            if k not in have:
                conn.execute(sa.insert(table).values(job_id=job_id, **row))
            elif have[k] != row["body"]:
                conn.execute(
                    sa.update(table)
                    .where(table.c.job_id == job_id, *[c == v for c, v in zip(cols, k)])
                    .values(**{c: v for c, v in row.items() if c not in key_cols})
                )


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _trial_row(t: dict) -> dict:
    return {
        "n_workers": t["n_workers"],
        "global_batch": t["global_batch"],
        "local_batch": t["local_batch"],
        "status": t["status"],
        "t_step_s": _finite(t.get("t_step_s")),
        "t_compute_s": _finite(t.get("t_compute_s")),
        "t_sync_s": _finite(t.get("t_sync_s")),
        "peak_mem_bytes": t.get("peak_mem_bytes"),
        "body": t,
    }


def _metric_row(e: dict) -> dict:
    return {
        "epoch": e["epoch"],
        "global_batch": e["global_batch"],
        "n_workers": e["n_workers"],
        "train_loss": _finite(e.get("train_loss")),
        "test_loss": _finite(e.get("test_loss")),
        "test_top1": _finite(e.get("test_top1")),
        "epoch_time_s": _finite(e.get("epoch_time_s")),
        "body": e,
    }
