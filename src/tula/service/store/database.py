"""Opening the store's database: the engine (SQLite's pragmas and write lock, PostgreSQL's
pre-ping), the schema migrated to the newest revision on open, one transaction per read or
write, and the rows every part of the store shares (a job by id, an insert-or-update).

:class:`Database` is the base of each part of the store (:mod:`.jobs`, :mod:`.records`,
:mod:`.artifacts`, :mod:`.model_cache`); :class:`tula.service.store.Store` is all of them.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection, Engine, make_url

from tula.core.errors import TulaError
from tula.service.store.schema import MIGRATIONS, VERSION_TABLE, jobs

#: how long an SQLite writer waits for the lock before giving up
BUSY_TIMEOUT_S = 30.0
#: PostgreSQL advisory lock taken while migrating (any fixed 64-bit number)
_MIGRATE_LOCK = 0x7475_6C61_0001  # "tula" 1


class StoreError(TulaError):
    """The store cannot be opened or used: a bad URL, an unreachable server, a file that is
    not a database, a damaged row."""


class UnknownJob(StoreError):
    """No job with this id is in the store."""


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


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


@dataclass(frozen=True)
class JobRow:
    """A job as the store holds it: one row of ``tula_jobs``, its columns as typed fields (in the
    table's order).  The store's edge: read from a row once (:meth:`from_row`), written out as the
    API's JSON once (:meth:`to_json_dict`)."""

    id: str
    state: str
    spec: dict[str, Any]
    """the checked job spec, as the JSON it was submitted as"""
    search: str
    objective: str | None
    train: bool
    progress: float
    message: str | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    updated_at: datetime
    finished_at: datetime | None
    heartbeat_at: datetime | None
    runner: str | None
    attempts: int
    reused_models_from: str | None
    cancel_requested: bool
    world_workers: int | None
    """the workers its world asks for or holds now (None between worlds)"""
    world_granted_at: datetime | None
    """when its world's workers were granted (None while it waits)"""

    @classmethod
    def from_row(cls, row: Any) -> JobRow:
        """The job of a ``tula_jobs`` row (a back end's 0/1 read as the booleans they are)."""
        job = cls(**row._mapping)
        return dataclasses.replace(job, train=bool(job.train), cancel_requested=bool(job.cancel_requested))

    def to_json_dict(self) -> dict[str, Any]:
        """The job as JSON values: each field by name, datetimes in ISO 8601."""
        return {
            f.name: (v.isoformat() if isinstance(v, datetime) else v)
            for f in dataclasses.fields(self)
            for v in (getattr(self, f.name),)
        }


_D = TypeVar("_D", bound="Database")


class Database:
    """The database at ``url``, its schema migrated, and the data directory beside it.

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

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.safe_url!r})"

    # ----------------------------------------------------------------------- rows every part reads and writes
    def _get_job(self, conn: Connection, job_id: str, lock: bool = False) -> JobRow | None:
        q = sa.select(jobs).where(jobs.c.id == job_id)
        if lock:
            q = q.with_for_update()
        row = conn.execute(q).first()
        return JobRow.from_row(row) if row is not None else None

    def _need_job(self, conn: Connection, job_id: str, lock: bool = False) -> JobRow:
        job = self._get_job(conn, job_id, lock)
        if job is None:
            raise UnknownJob(f"there is no job {job_id!r} in the store")
        return job

    def _upsert(self, conn: Connection, table: sa.Table, key: dict, values: dict) -> None:
        if self.dialect in ("sqlite", "postgresql"):
            if self.dialect == "sqlite":
                from sqlalchemy.dialects import sqlite

                lite = sqlite.insert(table).values(**key, **values)
                conn.execute(lite.on_conflict_do_update(index_elements=list(key), set_=values))
            else:
                from sqlalchemy.dialects import postgresql

                pg = postgresql.insert(table).values(**key, **values)
                conn.execute(pg.on_conflict_do_update(index_elements=list(key), set_=values))
            return
        cond = [table.c[k] == v for k, v in key.items()]
        if conn.execute(sa.update(table).where(*cond).values(**values)).rowcount == 0:
            conn.execute(sa.insert(table).values(**key, **values))
