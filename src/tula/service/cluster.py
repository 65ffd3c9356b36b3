"""What the operator's cluster offers (``GET /v1/cluster``): where the service runs its jobs
(``cluster`` setting, :data:`tula.core.registry.CLUSTERS`) and the workers there now.  No torch
here: a scheduler is asked through ``distributed``'s client, this host through ``os``."""

from __future__ import annotations

import os
import socket
from typing import Any

from tula.core.errors import TulaError
from tula.core.registry import cluster_kind
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
            info = client.scheduler_info()
    except (OSError, TimeoutError) as err:
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise TulaError(f"the service's Dask scheduler at {address} does not answer: {why}") from None
    return [
        {
            "address": addr,
            "host": w.get("host"),
            "threads": w.get("nthreads"),
            "memory_bytes": w.get("memory_limit"),
        }
        for addr, w in sorted(info.get("workers", {}).items())
    ]
