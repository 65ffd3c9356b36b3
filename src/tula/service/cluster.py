"""What the operator's cluster offers (``GET /v1/cluster``): where the service runs its jobs
(``cluster`` setting, :data:`tula.core.registry.CLUSTERS`) and the workers there now.  No torch
here: a scheduler is asked through ``distributed``'s client, this host through ``os``."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any

from tula.core.errors import TulaError
from tula.core.registry import WORKER_LOCK_PREFIX, cluster_kind
from tula.core.say import plain
from tula.core.spec import largest_world, spec_from_dict, training_world
from tula.service.settings import ServiceSettings, host_memory_bytes

#: how long the service waits for the operator's scheduler to answer (seconds)
SCHEDULER_TIMEOUT_S = 10.0


def cluster_workers(settings: ServiceSettings) -> dict[str, Any]:
    """``{"cluster", "kind", "workers": [{"address", "host", "threads", "memory_bytes"}], "note"}``;
    a scheduler that does not answer is a :class:`TulaError` (one sentence)."""
    kind = cluster_kind(settings.cluster)
    out: dict[str, Any] = {"cluster": settings.cluster, "kind": kind.name, "workers": [], "note": ""}
    if kind.on_this_host:
        out["workers"] = [
            {
                "address": "local",
                "host": socket.gethostname(),
                "threads": os.cpu_count() or 1,
                "memory_bytes": host_memory_bytes(),
            }
        ]
        out["note"] = "jobs run as processes on the service's host" + (
            " (a Dask LocalCluster per job)" if kind.name == "dask" else ""
        )
    elif kind.name == "scheduler":
        out["workers"] = _scheduler_workers(settings.cluster)
    else:  # a jobqueue cluster is submitted per job: no workers until one runs
        out["note"] = "a dask-jobqueue cluster is started for each job; it has no workers between jobs"
    return out


def _scheduler_workers(address: str) -> list[dict[str, Any]]:
    from distributed import Client

    try:
        with Client(address, timeout=SCHEDULER_TIMEOUT_S) as client:
            info = client.scheduler_info(n_workers=-1)
            try:
                held = set(client.run_on_scheduler(_held_workers))
            except Exception:  # noqa: BLE001 - the workers are still worth showing
                held = None
    except (OSError, TimeoutError) as err:
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


def stored_plan(store: Any, job_id: str) -> dict | None:
    """A job's plan from the service's store, or None -- also one that cannot be read: its
    job then counts its largest world (:func:`workers_kept`), the safe side, and its runner
    reports the damage."""
    from tula.core.records import PLAN_KIND

    try:
        return store.get_record(job_id, PLAN_KIND)
    except TulaError:
        return None


def cluster_view(settings: ServiceSettings, store: Any) -> dict[str, Any]:
    """``GET /v1/cluster``'s body, which the dashboard's cluster page shows: where the service
    runs its jobs and the workers there (:func:`cluster_workers`), and each running job with
    the workers it keeps (:func:`workers_kept`).  A scheduler that does not answer is a
    :class:`TulaError`."""
    from tula.service.store import RUNNING_STATES

    offered = cluster_workers(settings)
    running, _ = store.list_jobs(RUNNING_STATES, 1000)
    jobs = [
        {
            "id": j["id"],
            "name": j["spec"].get("name"),
            "state": j["state"],
            "workers_kept": workers_kept(j, stored_plan(store, j["id"])),
        }
        for j in running
    ]
    return {**offered, "running_jobs": jobs}


def workers_kept(job: dict, plan: dict | None) -> int:
    """The workers ``job`` keeps while it runs, or needs to start: its spec's largest world
    (the profile's worlds and training's) until it has a ``plan``; from then on only its
    training's (:func:`tula.core.spec.training_world` at the plan's worker count), the rest
    of its run, which a job queued again also resumes at.  The profile's larger worlds are
    given back as soon as the plan is stored."""
    spec = spec_from_dict(job["spec"])
    if plan is None:
        return largest_world(spec)
    return training_world(spec, plan["choice"]["n_workers"])


def wait_sentence(need: int, total: int, kept: list[int], address: str) -> str | None:
    """None when a job that needs ``need`` workers fits beside running jobs keeping ``kept``
    on a scheduler of ``total`` workers (each count capped at ``total``: a job that asks for
    more gets all there are), else the sentence its row shows while it waits."""
    need = min(need, total)
    free = total - sum(min(k, total) for k in kept)
    if need <= free:
        return None
    return f"queued: needs {need} of the {total} worker(s) at {address}; {max(free, 0)} free until a running job ends"


class WorkerRoom:
    """Whether the oldest queued job may start now on the operator's Dask scheduler.

    Each running job keeps the workers of its largest world until its plan is stored, then
    those of its training (growing included) to its end (:func:`workers_kept`), so its worlds
    never wait for another job's.  The next job in submission order starts when that many
    workers are free;
    a later, smaller job does not pass it, so none starves.  A job that asks for more
    workers than the cluster has gets all of them when its turn comes (its plan goes on with
    the workers there are).  Clusters on this host (``local``, ``dask``) and jobqueue clusters
    (started per job) have no shared workers to count: there only ``max_concurrent_jobs``
    holds jobs back.  One ``distributed`` client is kept open; a scheduler that does not
    answer holds every job in the queue with a message saying so."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.counts = cluster_kind(settings.cluster).name == "scheduler"
        self._client: Any = None

    def total_workers(self) -> int:
        """The workers the scheduler has now (a :class:`TulaError` when it does not answer)."""
        from distributed import Client

        address = self.settings.cluster
        try:
            if self._client is None:
                self._client = Client(address, timeout=SCHEDULER_TIMEOUT_S)
            if self._client.status != "running":  # it lost the scheduler: its cached view has no workers
                raise ConnectionError(f"the connection to it was lost (the client is {self._client.status})")
            return len(self._client.scheduler_info(n_workers=-1).get("workers", {}))
        except Exception as err:  # noqa: BLE001 - any failure to ask is "does not answer"
            self.close()
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise TulaError(f"the service's Dask scheduler at {address} does not answer: {why}") from None

    def why_wait(self, job: dict, running: list[dict], plan_of: Callable[[str], dict | None]) -> str | None:
        """None when ``job`` may start beside the ``running`` jobs, else the sentence its row
        shows; ``plan_of(job_id)``: a job's stored plan, or None (:func:`workers_kept`)."""
        if not self.counts:
            return None
        try:
            total = self.total_workers()
        except TulaError as err:
            return f"queued: {plain(err)}; it starts once the scheduler answers"
        if total == 0:
            return f"queued: the Dask scheduler at {self.settings.cluster} has no workers yet"
        kept = [workers_kept(j, plan_of(j["id"])) for j in running]
        return wait_sentence(workers_kept(job, plan_of(job["id"])), total, kept, self.settings.cluster)

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                client.close()
