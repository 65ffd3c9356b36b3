"""What a rank does, written once for every launcher.

A launcher decides where ranks run and how they meet (an ``init_method`` URL); then each
rank calls :func:`run_rank`, which sets its threads and device, joins the process group
with a timeout, runs the function, and reports a result or a :class:`RankFailure` whose
cause is decided here, where the exception happened -- and always destroys the group.

Stopping: SIGINT/SIGTERM in a rank (forwarded by the launcher, or from the terminal)
only sets a flag.  The rank's function asks :class:`StopFlag` at its boundaries; the
ranks agree through a small all-reduce on a separate gloo group, so they all stop at the
same step and none is left waiting in a collective.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import signal
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from tula.core.errors import TulaError
from tula.core.events import Event
from tula.core.gpus import gpu_for_rank
from tula.engine.launch.base import RankFailure, WorkerContext
from tula.engine.launch.netif import InterfaceChoice, choose_interface, interface_env, unreachable_peers


@dataclass(frozen=True)
class RankSetup:
    """How one rank joins its world."""

    rank: int
    world_size: int
    init_method: str  # tcp://HOST:PORT of rank 0's rendezvous
    device_kind: str  # cpu | cuda
    threads: int | None = None
    pg_timeout_s: float = 600.0
    local_rank: int = 0
    host: str = "127.0.0.1"  # the address the cluster knows this rank's worker by
    backend: str | None = None  # default: nccl on cuda, gloo on cpu
    interface: str | None = None  # the spec's cluster.interface (None: derived from ``host``)
    #: each rank's worker as a listening ``host:port`` (Dask's worker addresses), probed when a
    #: collective fails to name a peer that no longer answers; empty where there is none
    peers: tuple[str, ...] = ()
    #: the ranks of this world on this rank's host (0: unknown, taken as ``local_rank + 1``);
    #: on CUDA each of them needs a GPU of its own (:mod:`tula.core.gpus`)
    local_world_size: int = 0


def rank_device(device_kind: str, local_rank: int, local_world_size: int = 0) -> torch.device:
    """The device of the rank at ``local_rank`` among ``local_world_size`` ranks on its host:
    on CUDA the GPU at index ``local_rank`` of the visible ones (one rank per GPU,
    :func:`tula.core.gpus.gpu_for_rank`: a :class:`~tula.core.errors.PlacementError` when the
    host's ranks outnumber its GPUs), else the CPU."""
    if device_kind != "cuda":
        return torch.device("cpu")
    ranks = max(local_world_size, local_rank + 1)
    return torch.device("cuda", gpu_for_rank(local_rank, ranks, torch.cuda.device_count()))


#: exception types torch raises when a rendezvous or a connection gave up waiting: the store's
#: wait (DistStoreError), a client that could not connect to the store (DistNetworkError)
_TIMEOUT_TYPES: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionError,
    *(getattr(dist, n) for n in ("DistStoreError", "DistNetworkError") if hasattr(dist, n)),
)
#: what a backend's own error (gloo's or NCCL's connect, which have no exception type of their
#: own) says when it gave up waiting
_TIMEOUT_WORDS = ("timed out", "timeout", "connection refused", "connection reset")


def _is_device_error(err: BaseException) -> bool:
    """A CUDA error (torch.AcceleratorError, or a RuntimeError saying so): "launch timed out"
    there is the GPU's watchdog, not the network."""
    accel = getattr(torch, "AcceleratorError", None)
    return (accel is not None and isinstance(err, accel)) or "cuda error" in str(err).lower()


def is_timeout(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a wait that gave up: a timeout
    or a connection that could not be made -- what the network sentence explains.  Types first;
    only a torch.distributed or runtime error is read for the words a backend uses (gloo and
    NCCL raise one type for every failure).  An NCCL "invalid usage", a CUDA error or any
    other failure is not."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, _TIMEOUT_TYPES):
            return True
        if isinstance(e, RuntimeError) and not _is_device_error(e):  # DistError is a RuntimeError
            text = str(e).lower()
            if any(w in text for w in _TIMEOUT_WORDS):
                return True
        e = e.__cause__ or e.__context__
    return False


class StopRequested(Exception):
    """Raised inside a rank's function when the world agreed to stop (SIGINT/SIGTERM)."""


class StopFlag:
    """Whether this world should stop, agreed by every rank.

    ``requested`` is this rank's own view (set by its signal handler).  :meth:`poll` is
    called by every rank at every step boundary: it starts a one-element all-reduce (MAX)
    of the flag on a CPU gloo group and returns the *previous* step's agreed answer, so
    the check costs no wait and no device sync; all ranks see the same answer at the same
    step.  :meth:`agree` is the blocking form for rarer boundaries (a trial, an epoch)."""

    def __init__(self, group: Any = None) -> None:
        self.requested = False
        self.signum: int | None = None
        self.group = group
        self._pending: tuple[Any, torch.Tensor] | None = None
        self.agreed = False

    def _flag(self) -> torch.Tensor:
        return torch.tensor([1.0 if self.requested else 0.0])

    def poll(self) -> bool:
        if self.agreed:
            return True
        if not dist.is_initialized():
            self.agreed = self.requested
            return self.agreed
        self.drain()
        if self.agreed:
            return True
        t = self._flag()
        self._pending = (dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group, async_op=True), t)
        return False

    def agree(self) -> bool:
        """Blocking: True on every rank if any rank was asked to stop."""
        self.drain()
        if self.agreed:
            return True
        if not dist.is_initialized():
            self.agreed = self.requested
            return self.agreed
        t = self._flag()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        self.agreed = t.item() > 0
        return self.agreed

    def drain(self) -> None:
        """Finish a pending poll (before the world ends, or a blocking collective)."""
        if self._pending is not None:
            work, t = self._pending
            work.wait()
            self._pending = None
            if t.item() > 0:
                self.agreed = True


def _die_with_parent(rank: int) -> None:
    """Linux: end this rank when its parent dies -- the local launcher's fork server, which
    ends with the launching process (a killed ``tula train`` must leave no orphaned ranks
    training on) -- and name it ``tula-rank-R`` in ``ps`` and ``top``.  Elsewhere a no-op."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6")
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        libc.prctl(15, f"tula-rank-{rank}".encode()[:15])  # PR_SET_NAME


def classify(err: BaseException) -> str:
    """The cause of an exception raised in a rank (see :data:`tula.core.errors.FAILURE_CAUSES`)."""
    from tula.engine.memory import address_space_capped, failure_cause

    if isinstance(err, (StopRequested, KeyboardInterrupt)):
        return "interrupted"
    if isinstance(err, TulaError):
        return "user_error"
    if failure_cause(err, memory_capped=address_space_capped()) == "oom":
        return "oom"
    return "crash"


def _catch_stop(stop: StopFlag, in_process: bool) -> list[Callable[[], None]]:
    """Route SIGINT/SIGTERM to ``stop``: signal handlers in a rank process of its own, the
    caller's :func:`tula.engine.interrupts.on_stop` in the launching process (whose torch
    threads and random state are then kept too).  Returns what undoes it, in order."""

    def on_signal(signum: int, frame: FrameType | None = None) -> None:  # noqa: ARG001
        stop.requested, stop.signum = True, signum

    restore: list[Callable[[], None]] = []
    if in_process:
        from tula.engine import interrupts

        restore.append(interrupts.on_stop(on_signal))
        threads, rng = torch.get_num_threads(), torch.get_rng_state()

        def restore_threads_and_rng() -> None:
            torch.set_num_threads(threads)
            torch.set_rng_state(rng)

        restore.append(restore_threads_and_rng)
    else:
        for s in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread (e.g. a Dask worker task)
                signal.signal(s, on_signal)
    return restore


@dataclass
class _Joining:
    """How far a rank got in joining its world (what a failure's sentence needs)."""

    choice: InterfaceChoice = field(default_factory=lambda: InterfaceChoice("", ""))
    joined: bool = False


def _join(
    setup: RankSetup, stop: StopFlag, emit: Callable[[Event], None], world: contextlib.ExitStack, joining: _Joining
) -> WorkerContext:
    """Take the rank's device, choose its interface (for as long as ``world`` lasts), join the
    process group and the stop flag's group; the rank's :class:`WorkerContext`."""
    device = rank_device(setup.device_kind, setup.local_rank, setup.local_world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = setup.backend or ("nccl" if device.type == "cuda" else "gloo")
    # the interface that carries this worker's address, for this world only (never the
    # host name's address, which is loopback on many nodes)
    joining.choice = choose_interface(setup.host, backend, setup.interface)
    world.enter_context(interface_env(joining.choice, backend))
    dist.init_process_group(
        backend,
        init_method=setup.init_method,
        rank=setup.rank,
        world_size=setup.world_size,
        timeout=timedelta(seconds=setup.pg_timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    # the stop flag's all-reduces run on their own CPU group: no device sync, and never
    # interleaved with the model's collectives
    stop.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=setup.pg_timeout_s))
    joining.joined = True
    return WorkerContext(
        setup.rank,
        setup.world_size,
        device,
        backend,
        host=setup.host,
        local_rank=setup.local_rank,
        stop=stop,
        _emit=emit,
        interface=joining.choice.interface,
        interface_source=joining.choice.source,
    )


@functools.cache
def process_address_space_limit() -> tuple[int, int]:
    """This process's address-space limit (RLIMIT_AS) as it was before any rank of it capped
    it, taken at its first rank: every rank ends by putting it back.  A rank's own snapshot is
    not enough on a Dask worker, which runs rank after rank.  Now and then every world on one
    of the test session's workers failed after test_dask's capped fallback ("could not create
    a primitive"); my reading, not proven: a rank that began while a cancelled rank still ran
    there under its cap took that cap for the limit and put it back at its end.  A rank also
    starts under this limit, whatever a rank before it left in force."""
    import resource

    return resource.getrlimit(resource.RLIMIT_AS)


def _leave(address_space_limit: tuple[int, int], restore: list[Callable[[], None]]) -> None:
    """Destroy the process group (or reset torch's group counter where none formed), give the
    process its address-space limit back, and undo :func:`_catch_stop`."""
    import resource

    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    else:  # a world that failed to form still advanced torch's group counter, which names the
        # next world's store keys: a worker whose count differs from its peers' would wait for
        # keys nobody writes (destroy_process_group resets it; nothing else does)
        with contextlib.suppress(Exception):
            dist.distributed_c10d._world.group_count = 0
    with contextlib.suppress(ValueError, OSError):  # a worker process runs later ranks too (Dask)
        resource.setrlimit(resource.RLIMIT_AS, address_space_limit)
    for undo in restore:
        undo()


def run_rank(
    setup: RankSetup,
    fn: Callable[..., Any],
    args: tuple,
    emit: Callable[[Event], None],
    die_with_parent: bool = True,
    in_process: bool = False,
    deliver: Callable[[str, Any], None] | None = None,
) -> tuple[str, Any]:
    """Run ``fn(ctx, *args)`` as one rank; return ``("result", value)`` or
    ``("failure", RankFailure)``.  Never raises (``deliver`` aside).

    ``in_process``: the rank runs in the launching process itself (a world of one,
    :class:`~tula.engine.launch.local.LocalLauncher` with ``in_process=True``): it installs no signal
    handlers of its own -- the caller's stop requests reach it through
    :func:`tula.engine.interrupts.on_stop` -- sets no death signal, and leaves the caller's torch
    threads and random state as it found them.

    ``deliver``: called with the same ``(kind, value)`` before the rank leaves its world (the
    process group destroyed, :func:`_leave`), so that the launcher has a finished rank's result
    even if that teardown crashes the process (a local rank: its queue's ``put``).  Once, on
    success and on failure; what it raises (a result that cannot be pickled) is raised here,
    after the rank has left its world."""
    if die_with_parent and not in_process:
        _die_with_parent(setup.rank)
        from tula.engine.memory import steady_heap

        steady_heap()  # a fresh rank process: not a Dask worker's, which lives on, nor the caller's
        from tula.engine.gpu_knobs import flush_denormals

        flush_denormals()  # before torch starts its intra-op threads, which inherit it (set_backend_knobs: this thread)
        import faulthandler

        # a native crash (SIGSEGV; SIGABRT, as glibc's "double free or corruption") prints each thread's Python
        # stack on the rank's stderr: where the rank died, not only that it did
        with contextlib.suppress(ValueError, RuntimeError, AttributeError):  # no usable stderr
            faulthandler.enable()
    import resource

    address_space_limit = process_address_space_limit()  # a memory cap ends with the rank
    if resource.getrlimit(resource.RLIMIT_AS) != address_space_limit:  # and never starts the next one
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, address_space_limit)
    stop = StopFlag()
    restore = _catch_stop(stop, in_process)
    if setup.threads:
        torch.set_num_threads(setup.threads)
    joining = _Joining()
    t_join = time.monotonic()
    with contextlib.ExitStack() as world:
        try:
            outcome: tuple[str, Any]
            try:
                ctx = _join(setup, stop, emit, world, joining)
                value = fn(ctx, *args)
                stop.drain()
                outcome = "result", value
            except BaseException as err:  # noqa: BLE001 - every failure goes back to the launcher, classified
                waited_s = time.monotonic() - t_join
                outcome = "failure", _failure(setup, err, stop, joining.joined, joining.choice, waited_s)
            if dist.is_initialized():
                # the world's models go now, while their process group lives: an FSDP model outlives fn in
                # reference cycles (3 FSDP modules among 1507 objects, measured), which the cyclic collector
                # would free at any later allocation -- in destroy_process_group, pickling the result, or after
                gc.collect()
            if deliver is not None:  # before the group is destroyed: a crash there cannot lose it
                deliver(*outcome)
            return outcome
        finally:
            _leave(address_space_limit, restore)


def failure_of(setup: RankSetup, err: BaseException, stop: StopFlag) -> RankFailure:
    """``err``, raised in a rank of a world that had formed, as a :class:`RankFailure`."""
    return _failure(setup, err, stop, True, InterfaceChoice("", ""))


def _failure(
    setup: RankSetup,
    err: BaseException,
    stop: StopFlag,
    joined: bool,
    choice: InterfaceChoice,
    waited_s: float | None = None,
) -> RankFailure:
    """``err`` as a :class:`RankFailure` whose cause is decided here.  A crash is probed:
    a collective that failed while a peer's worker no longer answers is ``unreachable``, in one
    sentence naming both addresses; so is a world that could not form because its rendezvous
    or connections timed out (:func:`is_timeout`), saying how long it waited (``waited_s``)
    and the timeout in force.  A world that could not form for any other reason (NCCL's
    "invalid usage", a CUDA error) is a ``crash`` reported as that reason."""
    cause = classify(err)
    if cause == "interrupted" or stop.requested and cause == "crash":
        return RankFailure(
            setup.rank,
            "interrupted",
            f"stopped by {signal.Signals(stop.signum or signal.SIGINT).name}",
            type(err).__name__,
            host=setup.host,
        )
    message = str(err) or type(err).__name__
    tb = "" if cause == "user_error" else traceback.format_exc()
    if cause == "crash" and (not joined or setup.peers):
        peers = {r: a for r, a in enumerate(setup.peers) if r != setup.rank}
        silent = unreachable_peers(peers)
        if silent or (not joined and is_timeout(err)):
            return RankFailure(
                setup.rank,
                "unreachable",
                unreachable_sentence(setup, err, joined, choice, silent, waited_s),
                type(err).__name__,
                tb,
                host=setup.host,
                unreachable=silent,
            )
    if cause == "crash" and not joined:  # the reason itself, said as the world's failure to form
        detail = (message.strip().splitlines() or [type(err).__name__])[0][:300]
        message = f"could not join its world of {setup.world_size}: {detail}"
    return RankFailure(setup.rank, cause, message, type(err).__name__, tb, host=setup.host or socket.gethostname())


def _peer_host(setup: RankSetup, rank: int) -> str:
    if rank < len(setup.peers):
        return setup.peers[rank].removeprefix("tcp://").rpartition(":")[0]
    return "?"


def unreachable_sentence(
    setup: RankSetup,
    err: BaseException,
    joined: bool,
    choice: InterfaceChoice,
    silent: list[int],
    waited_s: float | None = None,
) -> str:
    """One sentence: which rank, on which address and interface, could not reach whom (a
    world that timed out: after how long, and the process group's timeout in force)."""
    how = (
        f"interface {choice.interface}, from {choice.source}"
        if choice.interface
        else "no interface chosen: torch's default, the host name's address"
    )
    me = f"rank {setup.rank} of {setup.world_size} on {setup.host} ({how})"
    detail = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    if silent:
        who = ", ".join(f"rank {r} on {_peer_host(setup, r)} (worker {setup.peers[r]})" for r in silent)
        what = "could not form its world" if not joined else "lost its connection"
        return (
            f"{me} {what}: {who} does not answer from there, so its host, its link or its worker is down "
            f"({type(err).__name__}: {detail})"
        )
    rdzv = setup.init_method.removeprefix("tcp://")
    others = [f"rank {r} on {_peer_host(setup, r)}" for r in range(len(setup.peers)) if r != setup.rank]
    named = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
    waited = f"gave up after {waited_s:.0f} s" if waited_s is not None else "gave up"
    return (
        f"{me} could not connect to the other ranks of its world ({named + ', ' if named else ''}"
        f"rendezvous at {rdzv}): it {waited}, its process group's timeout being {setup.pg_timeout_s:.0f} s; "
        "their workers answer, so a firewall between "
        "them or a wrong interface (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, cluster.interface) is the likely "
        f"cause ({type(err).__name__}: {detail})"
    )
