"""Run a function as an N-rank torch.distributed world of local processes.

Rendezvous only: one process per rank on this machine, meeting at 127.0.0.1 on a free
port (a fresh one for every world).  What a rank does is :func:`~.runtime.run_rank`.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from tula.core.errors import WorkerError
from tula.core.events import Event
from tula.core.gpus import check_ranks_fit
from tula.core.records import HostFacts
from tula.engine import interrupts
from tula.engine.forkserver import rank_context, start_fork_server
from tula.engine.launch.base import RankFailure, host_facts, pick_device
from tula.engine.launch.main_module import without_main_module
from tula.engine.launch.runtime import RankSetup, run_rank

#: a stop signal is sent again to the ranks still running every this many seconds: a rank
#: ignores it until its own handler is set (tula.engine.launch.forkserver_signals)
RESEND_STOP_S = 1.0

# the root cause first: a rank that died without a word, a peer that stopped answering, then a
# user error, an out-of-memory, a crash (the earliest), and only then what other ranks saw because of it
_CAUSE_ORDER = {
    "lost_worker": 0,
    "unreachable": 1,
    "user_error": 2,
    "oom": 3,
    "crash": 4,
    "timeout": 5,
    "interrupted": 6,
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def root_failure(failures: list[RankFailure]) -> RankFailure:
    """The failure that explains the others."""
    return min(failures, key=lambda f: (_CAUSE_ORDER.get(f.cause, 9), f.at, f.rank))


def failure_sentence(f: RankFailure, n_workers: int) -> str:
    """One sentence for a rank's failure."""
    where = f"rank {f.rank} of {n_workers}" + (f" on {f.host}" if f.host and f.host != "127.0.0.1" else "")
    if f.cause in ("user_error", "unreachable"):  # sentences written where they happened
        return f.message
    if f.cause == "oom":
        return f"{where} ran out of memory ({f.message.splitlines()[0][:200]})"
    if f.cause == "lost_worker":
        return f"worker {where} {f.message}"
    if f.cause == "interrupted":
        return f"{where} was {f.message}"
    return f"worker {where} failed: {f.exc_type}: {f.message.splitlines()[0][:300] if f.message else ''}"


def _rank_main(setup: RankSetup, fn: Callable[..., Any], args: tuple, q: Any, environ: dict[str, str]) -> None:
    # the launching process's environment now, as a spawned rank would inherit it (a forked one
    # inherits the fork server's, from when it started); multiprocessing already set the working
    # directory and sys.path
    os.environ.clear()
    os.environ.update(environ)
    # the result (or failure) is put on the queue before the rank destroys its process group: a crash in that
    # teardown (gloo, FSDP's and DCP's state freed) then costs no finished run its result
    run_rank(
        setup,
        fn,
        args,
        emit=lambda ev: q.put(("event", setup.rank, ev)),
        deliver=lambda kind, value: q.put((kind, setup.rank, value)),
    )


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def rank_setups(
    n_workers: int, port: int, device: str, threads_per_worker: int | None, pg_timeout_s: float
) -> list[RankSetup]:
    """Each rank's setup in a world of ``n_workers`` local processes meeting at 127.0.0.1:``port``."""
    return [
        RankSetup(
            r,
            n_workers,
            f"tcp://127.0.0.1:{port}",
            device,
            threads_per_worker,
            pg_timeout_s,
            local_rank=r,  # rank r: GPU r of the visible ones
            local_world_size=n_workers,
        )
        for r in range(n_workers)
    ]


def lost_failures(
    silent: list[int],
    exitcodes: list[int | None],
    unfinished: list[int],
    stopped: bool,
    stop_grace_s: float,
) -> list[RankFailure]:
    """The failures of ranks that said nothing: those that died silently (``silent``, by their
    exit codes), or else, after a stop signal, those still running (``unfinished``) that are
    about to be killed.  Empty when no rank is lost."""
    lost = [
        RankFailure(r, "lost_worker", f"died ({_exit_text(exitcodes[r])}) before returning a result") for r in silent
    ]
    if stopped and unfinished and not lost:
        lost = [
            RankFailure(r, "interrupted", f"killed: it did not stop within {stop_grace_s:.0f} s of the signal")
            for r in unfinished
        ]
    return lost


class _LocalWorld:
    """The processes of one local world, the queue they report on, and what they reported."""

    def __init__(
        self,
        setups: list[RankSetup],
        fn: Callable[..., Any],
        args: tuple,
        on_event: Callable[[int, Event], None] | None,
    ):
        self.n_workers = len(setups)
        self.on_event = on_event
        ctx = rank_context()  # ranks fork from a server that has imported torch (tula.engine.forkserver)
        # a SimpleQueue writes each message to the pipe before put() returns, so a rank that
        # dies right after an event (os._exit, SIGKILL) has still delivered it
        self.q = ctx.SimpleQueue()
        # not daemonic: a rank may start DataLoader worker processes; ranks end with this
        # process anyway (PR_SET_PDEATHSIG) and are joined or killed by close()
        self.procs = [
            ctx.Process(
                target=_rank_main,
                args=(s, fn, args, self.q, dict(os.environ)),
                daemon=False,
                name=f"tula-rank-{s.rank}",
            )
            for s in setups
        ]
        self.results: dict[int, Any] = {}
        self.failures: dict[int, RankFailure] = {}
        self.killed: set[int] = set()
        self.first_failure_at: float | None = None
        self.stop_at: list[float] = []
        self.stop_signum: int = signal.SIGINT
        self.stop_sent_at = 0.0

    def start(self) -> None:
        start_fork_server()  # a no-op when it runs: started with the stop signals ignored
        with without_main_module():  # a script without the main guard is not run again in each rank
            for p in self.procs:
                p.start()

    def forward(self, signum: int) -> None:
        """Pass a stop signal on to the ranks still running (again each second while they
        run, from :meth:`wait`: a rank ignores it until its handler is set)."""
        self.stop_at.append(time.monotonic())
        self.stop_signum = signum
        self._send_stop()

    def _send_stop(self) -> None:
        signum = self.stop_signum
        self.stop_sent_at = time.monotonic()
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def take(self, msg: tuple) -> None:
        """One message from a rank: an event, its result or its failure."""
        kind, rank = msg[0], msg[1]
        if kind == "event":
            if self.on_event is not None:
                self.on_event(rank, msg[2])
        elif kind == "result":
            self.results[rank] = msg[2]
        else:
            self.failures[rank] = msg[2]
            self.first_failure_at = self.first_failure_at or time.monotonic()

    def drain(self) -> None:
        while not self.q.empty():
            self.take(self.q.get())

    def unfinished(self) -> list[int]:
        return [r for r in range(self.n_workers) if r not in self.results and r not in self.failures]

    def silent_dead(self) -> list[int]:
        """The ranks that exited without a result or a failure (and were not killed here)."""
        return [
            r
            for r, p in enumerate(self.procs)
            if p.exitcode is not None and r not in self.results and r not in self.failures and r not in self.killed
        ]

    def _lost_for_good(self) -> bool:
        """Whether a rank died silently, after its last words had time to arrive."""
        if not self.silent_dead():
            return False
        self.drain()  # most often its result was already in the queue
        if not self.silent_dead():
            return False
        time.sleep(0.5)  # the other ranks' last words may still be coming
        self.drain()
        return bool(self.silent_dead())

    def wait(self, grace_s: float, stop_grace_s: float, deadline: float | None) -> bool:
        """Take messages until every rank has answered, one failed ``grace_s`` ago, one died
        silently, a stop signal is ``stop_grace_s`` old; True (the unanswered ranks killed)
        when ``deadline`` passed first."""
        while len(self.results) + len(self.failures) < self.n_workers:
            if not self.q.empty():
                self.take(self.q.get())
                continue
            time.sleep(0.02)
            now = time.monotonic()
            # take() records the first failure's time with the failure
            if self.first_failure_at is not None and now - self.first_failure_at > grace_s:
                break
            if self._lost_for_good():
                break
            if self.stop_at and now - self.stop_at[0] > stop_grace_s:
                break
            if self.stop_at and now - self.stop_sent_at >= RESEND_STOP_S:
                self._send_stop()
            if deadline is not None and now > deadline:
                for r in self.unfinished():
                    self.killed.add(r)
                    self.procs[r].kill()
                return True
        return False

    def lost(self, stop_grace_s: float) -> list[RankFailure]:
        """The ranks lost without a word (:func:`lost_failures`)."""
        return lost_failures(
            self.silent_dead(),
            [p.exitcode for p in self.procs],
            self.unfinished(),
            bool(self.stop_at),
            stop_grace_s,
        )

    def close(self) -> None:
        """Join the ranks (kill those that linger) and close the queue."""
        for p in self.procs:
            p.join(timeout=5 if not self.failures else 0.5)
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self.q.close()


class LocalLauncher:
    """One process per rank on this machine (gloo on CPU, NCCL on GPU).

    Parameters
    ----------
    device : ``auto`` | ``cpu`` | ``cuda``
    threads_per_worker : torch threads in each rank (None: torch's default)
    grace_s : how long the other ranks get to finish after one rank failed
    stop_grace_s : how long the ranks get to stop cleanly after SIGINT/SIGTERM before
        they are killed
    pg_timeout_s : the process group's timeout (a collective waiting longer fails)
    in_process : run a world of one rank in this process (the same :func:`~.runtime.run_rank`,
        without starting a process and importing torch again: what makes a one-worker fit of
        :mod:`tula.sklearn` cheap).  Worlds of more ranks, worlds with a ``timeout_s`` (an
        in-process rank cannot be killed) and calls from a process that already holds a
        torch.distributed group still start one process per rank.
    """

    name = "local"
    world_size = None  # worlds of any size (tula.engine.launch.base.Launcher)

    def __init__(
        self,
        device: str = "auto",
        threads_per_worker: int | None = None,
        grace_s: float = 10.0,
        stop_grace_s: float = 60.0,
        pg_timeout_s: float | None = None,
        in_process: bool = False,
    ):
        self.device = pick_device(device)
        self.threads_per_worker = threads_per_worker
        self.grace_s = grace_s
        self.stop_grace_s = stop_grace_s
        self.pg_timeout_s = pg_timeout_s
        self.in_process = in_process

    def facts(self) -> HostFacts:
        """This machine's hardware: the ranks run here."""
        return host_facts(self.device)

    @property
    def gpus_per_host(self) -> int | None:
        """The GPUs its ranks can use (``CUDA_VISIBLE_DEVICES`` respected): every rank runs on
        this host and needs one of its own (:mod:`tula.core.gpus`).  None on CPU: no limit."""
        if self.device != "cuda":
            return None
        import torch

        return torch.cuda.device_count()

    def provide(self, n_workers: int) -> int:
        """Local processes are started per world: any count is available."""
        return n_workers

    def run(
        self,
        fn: Callable[..., Any],
        n_workers: int,
        *args: Any,
        on_event: Callable[[int, Event], None] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        # one GPU per rank: a world this host cannot place is refused before any rank starts
        check_ranks_fit(n_workers, self.gpus_per_host, "this machine (the local launcher runs every rank here)")
        if self.in_process and n_workers == 1 and timeout_s is None and not dist.is_initialized():
            return self._run_here(fn, args, on_event)
        pg_timeout = self.pg_timeout_s or max(30.0, timeout_s or 600.0)
        setups = rank_setups(n_workers, free_port(), self.device, self.threads_per_worker, pg_timeout)
        world = _LocalWorld(setups, fn, args, on_event)
        deadline = time.monotonic() + timeout_s if timeout_s else None
        world.start()
        unregister = interrupts.on_stop(world.forward)
        try:
            if world.wait(self.grace_s, self.stop_grace_s, deadline):
                raise WorkerError(
                    f"the {n_workers}-worker run did not finish within {timeout_s:.0f} s", cause="timeout"
                )
            world.drain()
            all_failures = list(world.failures.values()) + world.lost(self.stop_grace_s)
            if all_failures:
                root = root_failure(all_failures)
                raise WorkerError(
                    failure_sentence(root, n_workers), rank=root.rank, details=root.traceback, cause=root.cause
                )
            return [world.results[r] for r in range(n_workers)]
        finally:
            unregister()
            world.close()

    def _run_here(
        self, fn: Callable[..., Any], args: tuple, on_event: Callable[[int, Event], None] | None
    ) -> list[Any]:
        """A world of one rank in this process."""
        setup = RankSetup(
            0, 1, f"tcp://127.0.0.1:{free_port()}", self.device, self.threads_per_worker, self.pg_timeout_s or 600.0
        )
        kind, value = run_rank(setup, fn, args, emit=lambda ev: on_event(0, ev) if on_event else None, in_process=True)
        if kind == "failure":
            raise WorkerError(failure_sentence(value, 1), rank=0, details=value.traceback, cause=value.cause)
        return [value]
