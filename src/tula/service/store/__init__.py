"""The service's persistent store: jobs, their records, trials, per-epoch metrics, fitted
models and artefacts, in any SQLAlchemy database (an SQLite file by default; PostgreSQL tested).

One :class:`Store` per process; it is safe to share between threads.  Everything crossing its
boundary is a frozen object (a job as a :class:`JobRow`, a world's turn as a :class:`WorldTurn`,
a record as its typed record or its JSON) or a ``Path``: no ORM object, no open transaction.  Every write
is one transaction; on SQLite writes take the write lock up front (``BEGIN IMMEDIATE``) and
wait up to the busy timeout for it, so concurrent writers queue instead of failing.

The store is one part for each job, each a module of this package:

- :mod:`.schema`: the tables and their column types, as the Alembic migrations
  (:mod:`tula.service.migrations`) build them;
- :mod:`.database`: opening the database, migrating its schema on open (under a lock, so two
  processes opening a fresh database at once both succeed), one transaction per read or write;
- :mod:`.jobs`: the job queue (create, claim, heartbeat, requeue, cancel);
- :mod:`.records`: the records the CLI writes (:mod:`tula.core.records`), checked when put and
  when read, with a profile's trials and a training record's epochs as rows of their own;
- :mod:`.artifacts`: files (checkpoints, PNGs) under the store's data directory;
- :mod:`.model_cache`: fitted models records kept under their model key for reuse.
"""

from __future__ import annotations

from tula.service.store.artifacts import Artifacts
from tula.service.store.database import BUSY_TIMEOUT_S, Database, JobRow, StoreError, UnknownJob, mask_url, now_utc
from tula.service.store.jobs import ENDED_STATES, JOB_STATES, RUNNING_STATES, JobQueue, WorldTurn, new_id
from tula.service.store.model_cache import ModelCache
from tula.service.store.records import RECORD_KINDS, Records
from tula.service.store.schema import MIGRATIONS, VERSION_TABLE, metadata

__all__ = [
    "BUSY_TIMEOUT_S",
    "ENDED_STATES",
    "JOB_STATES",
    "MIGRATIONS",
    "RECORD_KINDS",
    "RUNNING_STATES",
    "VERSION_TABLE",
    "Artifacts",
    "Database",
    "JobQueue",
    "JobRow",
    "ModelCache",
    "Records",
    "Store",
    "StoreError",
    "UnknownJob",
    "WorldTurn",
    "mask_url",
    "metadata",
    "new_id",
    "now_utc",
]


class Store(JobQueue, Records, Artifacts, ModelCache):
    """Jobs, records, artefacts and fitted models in the database at ``url``: every part of the
    store on one database (see :class:`~tula.service.store.database.Database` for the
    parameters and the errors)."""
