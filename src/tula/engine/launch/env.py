"""Run in a world that someone else launched: ``torchrun``, ``srun``, ``mpirun`` (``--cluster env``).

Every process of such a world runs the same ``tula`` command.  Rank 0 is the *driver*: it runs
the command as on any other launcher -- reads the spec, writes every record, prints -- and
each time the command needs an N-rank world (a profile's trials, a training generation) it
hands the function to all ranks over the world's own process group and takes their results
back.  Every other rank is a *worker*: it reads nothing and writes nothing itself; it waits
for the driver's next function (:func:`serve`), runs it as its rank, and ends with the exit
code the driver ends with.  So records, checkpoints and the run directory's lock are written
once, by rank 0, and the run directory must be shared by the ranks (as on Dask).

The world is read from the environment, in this order:

* ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (``LOCAL_RANK``): torchrun, or any
  launcher that sets torch's variables;
* ``SLURM_PROCID``, ``SLURM_NTASKS`` (``SLURM_LOCALID``) with ``MASTER_ADDR`` (and
  ``MASTER_PORT``, default 29500) exported by the job script: ``srun``;
* ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE`` (``OMPI_COMM_WORLD_LOCAL_RANK``) with
  ``MASTER_ADDR``: Open MPI's ``mpirun``.

The process group is formed once, when the launcher opens, and kept for every world of the
command: such a world has exactly ``WORLD_SIZE`` ranks, so a profile runs the trials whose N
is the world's size (the others are recorded as skipped, saying why) and training runs on
all of them.  Each rank uses the network interface that carries its route to
``MASTER_ADDR`` (:mod:`.netif`'s rule: ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` win).

SIGINT/SIGTERM reach every rank (torchrun and srun forward them): the ranks agree at the next
step boundary as on the other launchers, and every rank exits with 130 or 143.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tula.core.errors import TulaError, WorkerError
from tula.core.events import Event
from tula.core.gpus import check_ranks_fit
from tula.core.records import HostFacts
from tula.engine import interrupts
from tula.engine.launch.base import RankFailure, WorkerContext, host_facts, pick_device
from tula.engine.launch.local import failure_sentence, root_failure
from tula.engine.launch.netif import InterfaceChoice, choose_interface, interface_env, local_address_towards
from tula.engine.launch.runtime import RankSetup, StopFlag, failure_of, rank_device
from tula.engine.memory import steady_heap

#: how long a worker waits for the driver's next world (the driver may fit, plan and write
#: records between worlds); a driver that died ends the workers through the launcher
#: (torchrun, srun), not through this timeout
CONTROL_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class EnvWorld:
    """This process's place in a world launched by someone else."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # which launcher's variables said so: torchrun | srun | mpirun
    local_world_size: int = 1  # ranks on this host


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise TulaError(f"--cluster env: {name} is {value!r}, not a whole number") from None


def env_world(environ: dict[str, str] | None = None) -> EnvWorld:
    """The world this process belongs to, from its launcher's environment variables (see the
    module's docstring); one sentence when there is none."""
    e = dict(os.environ if environ is None else environ)
    for source, rank, size, local, local_size in (
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
        (
            "mpirun",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
    ):
        if rank in e and size in e:
            if not e.get("MASTER_ADDR"):
                raise TulaError(
                    f"--cluster env: {source}'s {rank} and {size} are set but MASTER_ADDR is not; export "
                    "MASTER_ADDR (rank 0's host) and MASTER_PORT in the job script"
                )
            w = EnvWorld(
                _int(rank, e[rank]),
                _int(size, e[size]),
                _int(local, e.get(local, "0")),
                e["MASTER_ADDR"],
                _int("MASTER_PORT", e.get("MASTER_PORT", "29500")),
                source,
                # SLURM_NTASKS_PER_NODE may read "2(x3)": the count before any repeat
                _int(local_size, e.get(local_size, "1").split("(")[0] or "1"),
            )
            if not 0 <= w.rank < w.world_size:
                raise TulaError(f"--cluster env: {rank} {w.rank} is not a rank of a world of {w.world_size}")
            return w
    raise TulaError(
        "--cluster env runs inside a world started by torchrun, srun or mpirun, but none of RANK/WORLD_SIZE, "
        "SLURM_PROCID/SLURM_NTASKS or OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE is set; start the command "
        "with one of them (e.g. torchrun --nproc-per-node 2 -m tula train ...), or use another --cluster"
    )


class EnvLauncher:
    """The launcher of ``--cluster env`` (see the module's docstring).  Opened on every rank:
    rank 0 uses it as any launcher; the other ranks call :meth:`serve`."""

    name = "env"

    def __init__(
        self,
        device: str = "auto",
        threads_per_worker: int | None = None,
        pg_timeout_s: float = 600.0,
        backend: str | None = None,
        interface: str | None = None,
        world: EnvWorld | None = None,
    ) -> None:
        self.world = world or env_world()
        self.device = pick_device(device)
        # the spec's, else this host's cores shared by its ranks (as the local launcher does)
        self.threads_per_worker = threads_per_worker or max(1, (os.cpu_count() or 1) // self.world.local_world_size)
        self.pg_timeout_s = pg_timeout_s
        self.backend = backend
        self.interface = interface
        self._control: Any = None
        self._stop_group: Any = None
        self._choice = InterfaceChoice("", "")
        self._env: contextlib.ExitStack | None = None
        self._torch_device: torch.device | None = None
        self._here = ""  # this rank's address on its route to MASTER_ADDR

    @property
    def world_size(self) -> int:
        """The one world size this launcher forms."""
        return self.world.world_size

    # ------------------------------------------------------------------ the process group
    def open(self) -> EnvLauncher:
        w = self.world
        if dist.is_initialized():
            raise TulaError("--cluster env: this process already holds a torch.distributed group")
        if self.device == "cuda":  # one GPU per rank, refused before this rank joins the world
            ranks_here = max(w.local_world_size, w.local_rank + 1)
            check_ranks_fit(ranks_here, torch.cuda.device_count(), f"rank {w.rank}'s host ({w.source} started it)")
        self._torch_device = rank_device(self.device, w.local_rank, w.local_world_size)
        if self._torch_device.type == "cuda":
            torch.cuda.set_device(self._torch_device)
        backend = self.backend or ("nccl" if self._torch_device.type == "cuda" else "gloo")
        self.backend = backend
        self._here = local_address_towards(w.master_addr, w.master_port)
        self._choice = choose_interface(self._here, backend, self.interface)
        self._env = contextlib.ExitStack()
        self._env.enter_context(interface_env(self._choice, backend))
        try:
            dist.init_process_group(
                backend,
                init_method=f"tcp://{w.master_addr}:{w.master_port}" if w.source != "torchrun" else "env://",
                rank=w.rank,
                world_size=w.world_size,
                timeout=timedelta(seconds=self.pg_timeout_s),
                device_id=self._torch_device if backend == "nccl" else None,
            )
            # the driver's commands and the ranks' results: a CPU group that waits as long as the
            # driver needs between worlds; the stop flag's agreement: a CPU group of its own
            self._control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
            self._stop_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.pg_timeout_s))
        except Exception as err:  # noqa: BLE001 - one sentence, the library's text as plain text
            self._env.close()
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise TulaError(
                f"--cluster env: rank {w.rank} of {w.world_size} could not join the world at "
                f"{w.master_addr}:{w.master_port} (interface {self._choice.interface or 'torch default'}): {why}"
            ) from None
        return self

    def close(self, exit_code: int = 0) -> None:
        """Driver: tell the workers to end with ``exit_code``; every rank: leave the world."""
        if dist.is_initialized():
            if self.world.rank == 0:
                with contextlib.suppress(Exception):
                    self._broadcast(("exit", exit_code))
            # what the worlds left in reference cycles (DDP's reducer holds the group) goes while
            # the group is alive: freed after it, at exit, gloo's threads can abort the process
            gc.collect()
            with contextlib.suppress(Exception):
                # no rank tears its side down while another still talks (bounded: a peer may be gone)
                dist.monitored_barrier(group=self._control, timeout=timedelta(seconds=60))
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        if self._env is not None:
            self._env.close()
            self._env = None

    def _broadcast(self, message: Any) -> Any:
        box = [message if self.world.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self._control)
        return box[0]

    # ------------------------------------------------------------------ the launcher interface
    def facts(self) -> HostFacts:
        """The hardware of rank 0's host (the driver runs on a rank)."""
        return host_facts(self.device)

    def provide(self, n_workers: int) -> int:
        """The world has the size it was launched with."""
        return self.world_size

    def run(
        self,
        fn: Callable[..., Any],
        n_workers: int,
        *args: Any,
        on_event: Callable[[int, Event], None] | None = None,
        timeout_s: float | None = None,  # noqa: ARG002 - the world's launcher owns the ranks' lifetime
    ) -> list[Any]:
        """Driver: run ``fn(ctx, *args)`` on every rank of the world; results in rank order."""
        if self.world.rank != 0:
            raise RuntimeError("EnvLauncher.run is the driver's (rank 0); the other ranks serve()")
        if n_workers != self.world_size:
            raise TulaError(
                f"this world (started by {self.world.source}) has {self.world_size} ranks, not {n_workers}; "
                f"under --cluster env a world uses all of its ranks"
            )
        self._broadcast(("run", fn, args))
        kind, value = self._run_as_rank(fn, args, lambda ev: on_event(0, ev) if on_event else None)
        gathered: list[Any] = [None] * self.world_size
        dist.gather_object((kind, value), gathered, dst=0, group=self._control)
        failures = [v for k, v in gathered if k == "failure"]
        if failures:
            root = root_failure(failures)
            raise WorkerError(
                failure_sentence(root, self.world_size), rank=root.rank, details=root.traceback, cause=root.cause
            )
        return [v for _, v in gathered]

    def serve(self) -> int:
        """Worker (rank > 0): run the driver's worlds until it ends; return its exit code."""
        while True:
            message = self._broadcast(None)
            if message[0] == "exit":
                return int(message[1])
            _, fn, args = message
            result = self._run_as_rank(fn, args, lambda ev: None)
            try:
                dist.gather_object(result, None, dst=0, group=self._control)
            except pickle.PicklingError as err:  # a result that cannot travel: say so as a failure
                failure = RankFailure(self.world.rank, "crash", f"its result cannot be sent to rank 0: {err}")
                dist.gather_object(("failure", failure), None, dst=0, group=self._control)

    def _run_as_rank(self, fn: Callable[..., Any], args: tuple, emit: Callable[[Event], None]) -> tuple[str, Any]:
        """``fn(ctx, *args)`` as this rank in the world that is already formed: ``("result",
        value)`` or ``("failure", RankFailure)``, never raises (as :func:`~.runtime.run_rank`)."""
        w = self.world
        assert self._torch_device is not None and self.backend is not None
        stop = StopFlag(self._stop_group)

        def on_signal(signum: int) -> None:
            stop.requested, stop.signum = True, signum

        unregister = interrupts.on_stop(on_signal)
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        steady_heap()  # this process is the rank, for the command's whole life
        if self.threads_per_worker:
            torch.set_num_threads(self.threads_per_worker)
        setup = RankSetup(
            w.rank, w.world_size, f"tcp://{w.master_addr}:{w.master_port}", self._torch_device.type,
            local_rank=w.local_rank, host=self._here, backend=self.backend, local_world_size=w.local_world_size,
        )  # fmt: skip
        ctx = WorkerContext(
            w.rank,
            w.world_size,
            self._torch_device,
            self.backend,
            host=setup.host,
            local_rank=w.local_rank,
            stop=stop,
            _emit=emit,
            interface=self._choice.interface,
            interface_source=self._choice.source,
        )
        try:
            value = fn(ctx, *args)
            stop.drain()
            gc.collect()  # the world's DDP models go now, not after the group is destroyed
            return "result", value
        except BaseException as err:  # noqa: BLE001 - every failure goes back to the driver, classified
            with contextlib.suppress(Exception):
                stop.drain()
            return "failure", failure_of(setup, err, stop)
        finally:
            unregister()
            torch.set_num_threads(threads)
            torch.set_rng_state(rng)


#: the world this process joined (one per process: a launched world is formed once)
_JOINED: list[EnvLauncher] = []


def join(**settings: Any) -> EnvLauncher:
    """Join the launched world (once per process; later calls return the same launcher)."""
    if not _JOINED:
        _JOINED.append(EnvLauncher(**settings).open())
    return _JOINED[0]


def started_by() -> str | None:
    """Which launcher started the world this process joined (torchrun, srun, mpirun), if any."""
    return _JOINED[0].world.source if _JOINED else None


def joined_world_size() -> int | None:
    """The size of the world this process joined, if any."""
    return _JOINED[0].world_size if _JOINED else None


def finish(exit_code: int) -> None:
    """At the end of the driver's command: the workers end with ``exit_code``; every rank
    leaves the world.  Nothing when this process joined none."""
    if _JOINED:
        _JOINED.pop().close(exit_code)


def serve_and_exit(launcher: EnvLauncher) -> None:
    """A worker rank's whole command: run the driver's worlds, then exit with the driver's exit
    code.  When the driver stops answering (it died, the world broke): one sentence, exit 1
    (130/143 after a signal)."""
    from tula.core.say import plain

    code = 1
    with interrupts.graceful_signals():
        try:
            code = launcher.serve()
        except KeyboardInterrupt:
            code = 130
        except Exception as err:  # noqa: BLE001 - the driver is gone or the world broke: one sentence
            why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            print(
                f"error: rank {launcher.world.rank} lost rank 0 (the driver) of its world: {plain(why)}",
                file=sys.stderr,
            )
            signum = interrupts.requested()
            code = 128 + signum if signum else 1
        finally:
            _JOINED.clear()
            launcher.close()
    sys.stdout.flush()
    sys.exit(code)
