"""The launcher interface, the context a rank's function receives, and a rank's failure as data."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from tula.core.events import Event
from tula.core.records import HostFacts


@dataclass
class RankFailure:
    """Why one rank did not return a result.  ``cause`` is one of
    :data:`tula.core.errors.FAILURE_CAUSES`; it is decided where the failure happened (in the rank,
    or by the launcher for a rank that died without a word), so no caller parses ``message``."""

    rank: int
    cause: str
    message: str
    exc_type: str = ""
    traceback: str = ""
    host: str = ""
    at: float = field(default_factory=time.time)  # wall clock: the earliest failure is the root cause
    unreachable: list[int] = field(default_factory=list)  # peer ranks whose workers did not answer this rank

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class WorkerContext:
    """What a rank knows about its world.

    ``emit`` sends a small event (a :class:`~tula.core.events.Event`) to the launching process, e.g. for a progress bar;
    it never blocks training.  ``stop`` says whether the launching process asked the world
    to stop (SIGINT/SIGTERM): see :class:`tula.engine.launch.runtime.StopFlag`."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    host: str = "127.0.0.1"
    local_rank: int = 0
    interface: str = ""  # the network interface of its collectives ("": torch's default)
    interface_source: str = ""  # why that one: see tula.engine.launch.netif.choose_interface
    stop: Any = None  # StopFlag; None outside a launched world
    _emit: Callable[[Event], None] | None = field(default=None, repr=False)

    def emit(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)


class Launcher(Protocol):
    name: str

    @property
    def threads_per_worker(self) -> int | None:
        """Torch threads in each rank (``None``: torch's default)."""
        ...

    @property
    def world_size(self) -> int | None:
        """The one world size a launched world has (``--cluster env``: torchrun's or srun's),
        or ``None`` where the launcher forms worlds of any size."""
        ...

    def facts(self) -> HostFacts:
        """The workers' hardware (:func:`host_facts`), read where the ranks run."""
        ...

    def provide(self, n_workers: int) -> int:
        """Make ``n_workers`` workers available if it can (scaling a cluster, waiting for it);
        returns how many there are, at most ``n_workers``."""
        ...

    def run(
        self,
        fn: Callable[..., Any],
        n_workers: int,
        *args: Any,
        on_event: Callable[[int, Event], None] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Run ``fn(ctx, *args)`` on ``n_workers`` ranks; return results in rank order.

        Raises :class:`~tula.core.errors.WorkerError` with the root cause's ``cause`` and rank."""
        ...


class WorldGate(Protocol):
    """Who may open a world now, where several callers share one cluster's workers (the
    service's jobs on the operator's scheduler: :class:`tula.service.worlds.StoreWorldGate`).
    A launcher that has one asks :meth:`enter` before it takes a world's workers and calls
    :meth:`leave` when the world ends, however it ends."""

    def enter(self, n_workers: int, total_workers: Callable[[], int]) -> None:
        """Wait until a world of ``n_workers`` may start (``total_workers()``: the workers the
        cluster has now); a stop signal while waiting raises
        :class:`~tula.core.errors.Interrupted`."""
        ...

    def leave(self) -> None:
        """The world ended: its workers are free for the next."""
        ...


def host_facts(device: str = "auto") -> HostFacts:
    """This machine's hardware as a worker sees it: the device kind ranks will use (``auto``
    -> ``cuda`` where a GPU is visible), CPU model, cores, memory, GPU name and memory, torch
    version.  Each fact is given only where it was read (a CPU host has no ``gpu``)."""
    import os

    cuda_available = torch.cuda.is_available()
    gpu: dict[str, Any] = {}
    if cuda_available:
        props = torch.cuda.get_device_properties(0)
        gpu = dict(gpu=props.name, gpu_memory_bytes=int(props.total_memory), gpus=torch.cuda.device_count())
    memory: dict[str, Any] = {}
    try:
        with open("/proc/meminfo") as fh:
            memory["memory_bytes"] = int(fh.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return HostFacts(
        device=pick_device(device),
        cpu=cpu_model(),
        cores=os.cpu_count(),
        torch=torch.__version__,
        cuda_available=cuda_available,
        **gpu,
        **memory,
    )


def host_facts_json(device: str = "auto") -> dict[str, Any]:
    """:func:`host_facts` as plain values: what a Dask worker sends back (through the scheduler,
    which need not import Tula's classes); the caller types it again
    (``HostFacts.model_validate``)."""
    return host_facts(device).to_json_dict()


def cpu_model() -> str:
    """This machine's CPU model as the OS names it (``/proc/cpuinfo``'s model name on Linux),
    else the processor or machine type ``platform`` reports."""
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip().lower() in ("model name", "hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def pick_device(kind: str) -> str:
    """``auto`` -> ``cuda`` where a GPU is visible, else ``cpu``."""
    if kind == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return kind
