"""What the operator's cluster offers (``GET /v1/cluster``): where the service runs its jobs
(``cluster`` setting, :data:`tula.core.registry.CLUSTERS`) and the workers there now.  No torch
here: a scheduler is asked through ``distributed``'s client, this host through ``os``."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from tula.core.errors import TulaError
from tula.core.registry import WORKER_LOCK_PREFIX, cluster_kind
from tula.core.say import plain
from tula.service.settings import ServiceSettings, host_memory_bytes

#: how long the service waits for the operator's scheduler to answer (seconds)
SCHEDULER_TIMEOUT_S = 10.0

_clients: dict[str, Any] = {}  # the service's one open client per scheduler (scheduler_client)
_clients_lock = threading.Lock()


def scheduler_client(address: str) -> Any:
    """The service's ``distributed`` client of the scheduler at ``address``: one, kept open
    and shared by the dispatcher and ``GET /v1/cluster`` (one per request cost each request a
    connection: the first request that made one took 1.27 s on a busy 2-core host).  A client
    that has lost its scheduler is dropped and this call raises ``ConnectionError`` at once,
    saying so; the next call connects anew.  A scheduler that does not answer raises what ``Client`` raises; no other caller
    waits for that connection."""
    from distributed import Client

    with _clients_lock:
        client = _clients.get(address)
        if client is not None and client.status == "running":
            return client
        if client is not None:
            del _clients[address]
    if client is not None:
        status = client.status
        _close_quietly(client)
        raise ConnectionError(f"the connection to it was lost (the client is {status})")
    fresh = Client(address, timeout=SCHEDULER_TIMEOUT_S, set_as_default=False)
    with _clients_lock:
        current = _clients.setdefault(address, fresh)
    if current is not fresh:  # another thread connected meanwhile
        _close_quietly(fresh)
    return current


def scheduler_identity(client: Any) -> dict[str, Any]:
    """The scheduler's identity with every worker, asked of it now.  Not
    ``client.scheduler_info()``, which returns the client's cached copy: the client's own
    refresh (every 2 s, asking for no workers) can overwrite it between the answer and the
    read, and a scheduler with 2 workers then shows none."""
    return dict(client.sync(client.scheduler.identity, n_workers=-1))


def forget_client(address: str) -> None:
    """Close the shared client of ``address`` (the scheduler stopped answering, or the service stops)."""
    with _clients_lock:
        client = _clients.pop(address, None)
    if client is not None:
        _close_quietly(client)


def _close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):
        client.close(timeout=2)


def cluster_workers(settings: ServiceSettings) -> dict[str, Any]:
    """``{"cluster", "kind", "workers": [{"address", "host", "threads", "memory_bytes"}], "note"}``;
    a scheduler that does not answer is a :class:`TulaError` (one sentence)."""
    kind = cluster_kind(settings.cluster)
    workers: list[dict[str, Any]] = []
    if kind.on_this_host:
        workers = [
            {
                "address": "local",
                "host": socket.gethostname(),
                "threads": os.cpu_count() or 1,
                "memory_bytes": host_memory_bytes(),
            }
        ]
        note = "jobs run as processes on the service's host" + (
            " (a Dask LocalCluster per job)" if kind.name == "dask" else ""
        )
    elif kind.name == "scheduler":
        workers, note = _scheduler_workers(settings.cluster), ""
    else:  # a jobqueue cluster is submitted per job: no workers until one runs
        note = "a dask-jobqueue cluster is started for each job; it has no workers between jobs"
    return {"cluster": settings.cluster, "kind": kind.name, "workers": workers, "note": note}


def _scheduler_workers(address: str) -> list[dict[str, Any]]:
    try:
        client = scheduler_client(address)
        info = scheduler_identity(client)
        try:
            held = set(client.run_on_scheduler(_held_workers))
        except Exception:  # noqa: BLE001 - the workers are still worth showing
            held = None
    except (OSError, TimeoutError) as err:
        forget_client(address)
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise TulaError(f"the service's Dask scheduler at {address} does not answer: {why}") from None
    return [
        {
            "address": addr,
            "host": w.get("host"),
            "threads": w.get("nthreads"),
            "memory_bytes": w.get("memory_limit"),
            "in_a_world": None if held is None else addr in held,
        }
        for addr, w in sorted(info.get("workers", {}).items())
    ]


def _held_workers(dask_scheduler: Any = None) -> list[str]:
    """On the scheduler: the workers a Tula world holds now (their lock's lease is taken; the
    locks are named :data:`~tula.core.registry.WORKER_LOCK_PREFIX` + the worker's address)."""
    leases = getattr((dask_scheduler.extensions or {}).get("semaphores"), "leases", {}) if dask_scheduler else {}
    prefix = WORKER_LOCK_PREFIX
    return sorted(name[len(prefix) :] for name, held in leases.items() if held and name.startswith(prefix))


def cluster_view(settings: ServiceSettings, store: Any) -> dict[str, Any]:
    """``GET /v1/cluster``'s body, which the dashboard's cluster page shows: where the service
    runs its jobs and the workers there (:func:`cluster_workers`), and each running job with
    its world now (:func:`job_world`).  A scheduler that does not answer is a
    :class:`TulaError`."""
    from tula.service.store import RUNNING_STATES

    offered = cluster_workers(settings)
    running, _ = store.list_jobs(RUNNING_STATES, 1000)
    jobs = [
        {"id": j.id, "name": j.spec.get("name"), "state": j.state, **asdict(job_world(j))}
        for j in sorted(running, key=lambda j: (j.created_at, j.id))
    ]
    return {**offered, "running_jobs": jobs}


class _HasWorld(Protocol):
    """A job's columns that say its world (a :class:`~tula.service.store.JobRow` has them)."""

    @property
    def world_workers(self) -> int | None: ...

    @property
    def world_granted_at(self) -> datetime | None: ...


@dataclass(frozen=True)
class JobWorld:
    """A running job's world on the operator's workers (:mod:`tula.service.worlds`)."""

    world_workers: int | None
    """the workers it asks for or holds (None between worlds)"""
    world: Literal["holds", "waits"] | None
    """whether it holds them or waits for them; None between worlds"""


def job_world(job: _HasWorld) -> JobWorld:
    """The world ``job`` (a :class:`~tula.service.store.JobRow`) holds or waits for now."""
    n = job.world_workers
    return JobWorld(n, None if n is None else ("holds" if job.world_granted_at else "waits"))


def wait_sentence(total: int, running: Sequence[_HasWorld], address: str) -> str | None:
    """None when the oldest queued job may start beside the ``running`` jobs on a scheduler
    of ``total`` workers, else the sentence its row shows while it waits.  It starts when no
    running job's world waits for its turn (an earlier job's world goes first) and some
    worker is free of the worlds running; its own worlds then take their turns."""
    worlds = [job_world(j) for j in running]
    waiting = sum(1 for w in worlds if w.world == "waits")
    if waiting:
        return f"queued: {waiting} running job(s) wait for workers at {address} first"
    held = sum(min(w.world_workers or 0, total) for w in worlds if w.world == "holds")
    if held >= total:
        return f"queued: all {total} worker(s) at {address} are in running jobs' worlds; it starts when one is free"
    return None


class WorkerRoom:
    """Whether the oldest queued job may start now on the operator's Dask scheduler.

    A job holds the workers of the world it runs, and only while it runs it; its worlds take
    their turns in submission order (:mod:`tula.service.worlds`).  The next queued job starts
    when no running job's world waits for workers and some worker is free
    (:func:`wait_sentence`); a later job never passes it, so none starves.  Clusters on this
    host (``local``, ``dask``) and jobqueue clusters (started per job) have no shared workers
    to count: there only ``max_concurrent_jobs`` holds jobs back.  One ``distributed``
    client is kept open; a scheduler that does not answer holds every job in the queue with a
    message saying so."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.counts = cluster_kind(settings.cluster).name == "scheduler"

    def total_workers(self) -> int:
        """The workers the scheduler has now (a :class:`TulaError` when it does not answer)."""
        address = self.settings.cluster
        try:
            return len(scheduler_identity(scheduler_client(address)).get("workers", {}))
        except Exception as err:  # noqa: BLE001 - any failure to ask is "does not answer"
            self.close()
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise TulaError(f"the service's Dask scheduler at {address} does not answer: {why}") from None

    def why_wait(self, running: Sequence[_HasWorld]) -> str | None:
        """None when the oldest queued job may start beside the ``running`` jobs, else the
        sentence its row shows (:func:`wait_sentence`)."""
        if not self.counts:
            return None
        try:
            total = self.total_workers()
        except TulaError as err:
            return f"queued: {plain(err)}; it starts once the scheduler answers"
        if total == 0:
            return f"queued: the Dask scheduler at {self.settings.cluster} has no workers yet"
        return wait_sentence(total, running, self.settings.cluster)

    def close(self) -> None:
        if self.counts:
            forget_client(self.settings.cluster)
