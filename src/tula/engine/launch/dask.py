"""Run a function as an N-rank torch.distributed world on N Dask workers.

Rendezvous only; what a rank does is :func:`~.runtime.run_rank`, as on the local launcher.

* the world takes N distinct workers, ordered by host so that ranks on one host are
  contiguous (``local_rank`` = position on its host), under a lock per worker (a lease: a
  caller killed with kill -9 frees its workers after its lease timeout): two
  worlds never share a worker at once;
* rank 0's host is the rendezvous address, on a port found free *on that worker* for every
  world (a reused port can hang the next world's start);
* each rank is one task, ``pure=False``, no retries, pinned to its worker, and checks when
  it starts that it runs where it was sent (a task moved to another worker fails at once
  instead of joining the wrong world);
* events (progress, finished trials) come back through a :class:`distributed.Queue`;
* each rank's collectives use the network interface that carries its worker's address
  (:mod:`.netif`), and the rendezvous is rank 0's worker address, never a host name (which
  resolves to loopback on many nodes);
* a worker that leaves the cluster, or that the scheduler has not heard from for
  ``silent_after_s`` (its host or link is down), fails the world with one sentence naming it,
  as does a rank whose peer's worker stops answering it; the other ranks' tasks are cancelled
  and, if still running (stuck in a collective), their workers restarted -- all but the silent
  ones, which cannot be reached -- so no world hangs and no worker keeps a stale rank; a new
  world leaves silent workers out;
* SIGINT/SIGTERM in the caller set a :class:`distributed.Event` that every rank polls;
* where several callers share the workers under a rule of turns (the service's jobs on the
  operator's scheduler), the launcher's ``world_gate`` (:class:`~.base.WorldGate`) says when
  a world may take them.
"""

from __future__ import annotations

import contextlib
import contextvars
import pickle
import queue as queue_module
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from tula.core.errors import PlacementError, TulaError, WorkerError
from tula.core.events import Event as ProgressEvent
from tula.core.gpus import crowded_hosts
from tula.core.records import HostFacts
from tula.core.registry import WORKER_LOCK_PREFIX
from tula.engine import interrupts
from tula.engine.launch.base import RankFailure, WorkerContext, WorldGate, host_facts_json
from tula.engine.launch.local import failure_sentence, root_failure
from tula.engine.launch.netif import is_loopback, resolve
from tula.engine.launch.runtime import RankSetup, run_rank

#: how long the caller's questions to the scheduler while a world runs (its events, its
#: workers) may wait.  A question asked just as the scheduler died waits for the client's
#: reconnect, 30 s: on 2 loaded cores the world then ended after 30 s naming a worker "lost
#: (cancelled)" instead of the scheduler (3 runs in 4 beside two busy loops, 2026-11-26)
RPC_TIMEOUT_S = 5.0


def _free_port_here() -> int:
    """A TCP port free on this worker's host (run on rank 0's worker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _url_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def _run_rank_on_own_thread(
    setup: RankSetup, fn: Callable[..., Any], args: tuple, emit: Callable[[ProgressEvent], None]
) -> tuple[str, Any]:
    """:func:`run_rank` on a thread of its own, new for each world, with the Dask task's context
    (``distributed.get_worker()``) and thread state.

    Once oneDNN fails to create a primitive under an address-space cap, it fails so on that
    thread for good, even with memory to spare, and a Dask worker runs its tasks on the same
    thread world after world.  On the task's own thread, tests/test_dask.py's capped fallback
    then ran out of memory in every later world, down to a micro-batch of 1, in about 1 run of
    3 (2026-11-29); on a thread per world, in 0 of 16."""
    from distributed.worker import set_thread_state, thread_state

    out: list[tuple[str, Any]] = []
    task_context = contextvars.copy_context()
    task_state = {
        k: getattr(thread_state, k) for k in ("start_time", "execution_state", "key") if hasattr(thread_state, k)
    }

    def run() -> None:
        with set_thread_state(**task_state):
            out.append(task_context.run(run_rank, setup, fn, args, emit=emit, die_with_parent=False))

    rank_thread = threading.Thread(target=run, name=f"tula-rank-{setup.rank}")
    rank_thread.start()
    rank_thread.join()
    if not out:  # run_rank returns every failure; only an exit of the thread itself leaves nothing
        raise WorkerError(f"rank {setup.rank}'s thread on a Dask worker ended without a result")
    return out[0]


def _dask_rank(
    setup: RankSetup, fn: Callable[..., Any], args: tuple, queue_name: str, stop_name: str, expected_worker: str
) -> tuple[str, Any]:
    """One rank as a Dask task."""
    from distributed import Event, Queue, get_worker
    from distributed.core import Status

    worker = get_worker()
    here = worker.address
    key = worker.get_current_task()
    if here != expected_worker:
        return "failure", RankFailure(
            setup.rank,
            "crash",
            f"its task was moved to worker {here} instead of {expected_worker}; the world is abandoned",
            "WrongWorker",
            host=setup.host,
        )
    q = Queue(queue_name)
    stop_event = Event(stop_name)
    done = threading.Event()
    holder: dict = {}
    outbox: queue_module.SimpleQueue = queue_module.SimpleQueue()

    def send() -> None:  # events go to the caller off the training thread: a put is a round trip
        while (item := outbox.get()) is not None:
            with contextlib.suppress(Exception):
                q.put(item)

    def abandoned() -> bool:
        """The caller no longer wants this rank: its task was cancelled, e.g. because the
        launching process died (kill -9) and the scheduler released its futures; or its worker
        lost the scheduler (it is closing), so nothing it does reaches the caller any more."""
        if worker.status not in (Status.running, Status.paused):
            return True
        ts = worker.state.tasks.get(key)
        return ts is None or ts.state in ("cancelled", "released", "forgotten")

    def watch_stop() -> None:  # the caller's SIGINT/SIGTERM (seen through the scheduler), or the caller gone
        while not done.wait(0.5):
            with contextlib.suppress(Exception):
                stop = holder.get("stop")
                if stop is not None and not stop.requested:
                    if stop_event.is_set():
                        stop.requested, stop.signum = True, stop.signum or signal.SIGINT
                    elif abandoned():
                        stop.requested, stop.signum = True, signal.SIGTERM

    def emit(ev: ProgressEvent) -> None:
        # pickled here, unpickled by the caller: the scheduler holds bytes (it need not import tula)
        outbox.put(("event", setup.rank, pickle.dumps(ev)))

    def fn_with_stop(ctx: WorkerContext, *a: Any) -> Any:
        holder["stop"] = ctx.stop
        return fn(ctx, *a)

    threads = [threading.Thread(target=send, daemon=True), threading.Thread(target=watch_stop, daemon=True)]
    for t in threads:
        t.start()
    try:
        return _run_rank_on_own_thread(setup, fn_with_stop, args, emit)
    finally:
        done.set()
        outbox.put(None)
        threads[0].join(timeout=60)  # every event is delivered before the result


class _Gathering:
    """What a Dask world's ranks have answered so far: the results and failures by rank, the
    ranks another rank reported unreachable (nothing will come from them), and since when a
    rank's worker has been missing from the scheduler's view."""

    def __init__(self, addrs: list[str], queue: Any, on_event: Callable[[int, ProgressEvent], None] | None) -> None:
        self.addrs, self.queue, self.on_event = addrs, queue, on_event
        self.results: dict[int, Any] = {}
        self.failures: dict[int, RankFailure] = {}
        self.cut_off: set[int] = set()
        self.lost_since: dict[str, float] = {}
        self.first_failure_at: float | None = None

    def answered(self) -> int:
        return len(self.results) + len(self.failures)

    def complete(self) -> bool:
        """Every rank has answered or will not (cut off)."""
        return len(set(self.results) | set(self.failures) | self.cut_off) >= len(self.addrs)

    def drain(self) -> None:
        """Pass the ranks' queued events on."""
        with contextlib.suppress(Exception):
            for kind, rank, ev in self.queue.get(batch=True, callback_timeout=RPC_TIMEOUT_S):
                if kind == "event" and self.on_event is not None:
                    self.on_event(rank, pickle.loads(ev))  # noqa: S301 - the world's own ranks pickled it

    def fail(self, rank: int, failure: RankFailure, now: float) -> None:
        self.failures[rank] = failure
        self.first_failure_at = self.first_failure_at or now

    def take_finished(self, futures: list) -> None:
        """The answers of the ranks whose futures are done: a result, a rank's failure, or a
        worker lost under it (cancelled, or an error outside run_rank: the process died)."""
        for r, f in enumerate(futures):
            if r in self.results or r in self.failures or not f.done():
                continue
            if f.status == "finished":
                kind, value = f.result()
                if kind == "result":
                    self.results[r] = value
                else:
                    self.failures[r] = value
                    self.cut_off.update(value.unreachable)
            else:
                exc = f.exception() if f.status == "error" else None
                why = type(exc).__name__ if exc is not None else f.status
                self.failures[r] = RankFailure(r, "lost_worker", f"was lost ({why})", host=self.addrs[r])
            self.first_failure_at = self.first_failure_at or time.monotonic()

    def check_workers(self, workers: dict, silent: dict[str, float], now: float) -> None:
        """A rank whose worker left the cluster (for more than a second: not a blip in the
        scheduler's view) or has been silent fails."""
        for r, addr in enumerate(self.addrs):
            if r in self.results or r in self.failures:
                continue
            if addr not in workers:
                self.lost_since.setdefault(addr, now)
                if now - self.lost_since[addr] > 1.0:
                    self.fail(r, RankFailure(r, "lost_worker", "left the Dask cluster", host=addr), now)
            elif addr in silent:
                self.fail(
                    r,
                    RankFailure(
                        r,
                        "lost_worker",
                        f"has not been heard from by the scheduler for "
                        f"{silent[addr]:.0f} s: its host, its link or its process is down",
                        host=addr,
                    ),
                    now,
                )

    def outcome(self) -> list[Any]:
        """The results in rank order, or the root failure as one :class:`WorkerError`."""
        if self.failures:
            root = root_failure(list(self.failures.values()))
            raise WorkerError(failure_sentence(root, len(self.addrs)), rank=root.rank, details=root.traceback,
                              cause=root.cause)  # fmt: skip
        return [self.results[r] for r in range(len(self.addrs))]


class DaskLauncher:
    """One rank per Dask worker (gloo on CPU, NCCL on GPU, chosen from the workers' hardware).

    Parameters
    ----------
    client : a ``distributed.Client``
    device : ``auto`` (the workers' kind) | ``cpu`` | ``cuda``
    threads_per_worker : torch threads in each rank (None: torch's default)
    pg_timeout_s : the process group's timeout; also bounds how long a world waits for a
        lost worker's peers
    lock_timeout_s : how long a world waits for its workers to be free
    worker_wait_s : how long a world waits for the cluster to have enough workers
    backend : override the collective backend (``gloo`` | ``nccl``)
    interface : the network interface of the ranks' collectives (None: the one that carries
        each worker's address; ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` set on a worker win)
    silent_after_s : a worker the scheduler has not heard from for this long is taken as lost
    world_gate : asked before each world takes its workers, told when it ends (None: a world
        takes free workers as it finds them; :class:`~.base.WorldGate`)
    """

    name = "dask"
    world_size = None  # worlds of any size (tula.engine.launch.base.Launcher)

    def __init__(
        self,
        client: Any,
        device: str = "auto",
        threads_per_worker: int | None = None,
        pg_timeout_s: float = 60.0,
        lock_timeout_s: float = 3600.0,
        worker_wait_s: float = 60.0,
        backend: str | None = None,
        interface: str | None = None,
        silent_after_s: float = 20.0,
        world_gate: WorldGate | None = None,
    ):
        self.client = client
        self.device = device
        self.threads_per_worker = threads_per_worker
        self.pg_timeout_s = pg_timeout_s
        self.lock_timeout_s = lock_timeout_s
        self.worker_wait_s = worker_wait_s
        self.backend = backend
        self.interface = interface
        self.silent_after_s = silent_after_s
        self.world_gate = world_gate
        self._clock_offset_s: float | None = None  # the scheduler's clock minus this one

    # ---------------------------------------------------------------- the cluster
    def workers(self) -> dict[str, dict]:
        """Address -> scheduler info of every worker now in the cluster, asked of the scheduler.

        Not ``Client.scheduler_info()``: it returns the client's cached copy, which the client's
        own refresh (every 2 s, asking for no workers) can overwrite between the answer and the
        read: 0 workers of a 2-worker LocalCluster in 2 reads of 5,000 beside two busy loops, 52
        of 2,000 with the refresh every 5 ms (2026-11-29, 2 cores); and a 0 there had
        :meth:`provide` scale a LocalCluster down to the world's size."""
        info = self.client.sync(self.client.scheduler.identity, n_workers=-1)
        return dict(info["workers"])

    def _workers_within(self, timeout_s: float) -> dict[str, dict] | None:
        """:meth:`workers`, or None when the scheduler does not answer within ``timeout_s``."""
        try:
            info = self.client.sync(self.client.scheduler.identity, n_workers=-1, callback_timeout=timeout_s)
        except Exception:  # noqa: BLE001 - a timeout, or the comm closed under it
            return None
        return dict(info.get("workers", {}))

    def silent(self, workers: dict[str, dict]) -> dict[str, float]:
        """The workers among ``workers`` that the scheduler has not heard from for more than
        ``silent_after_s`` (address -> seconds since), judged on the scheduler's clock."""
        if self._clock_offset_s is None:
            try:
                self._clock_offset_s = self.client.run_on_scheduler(time.time) - time.time()
            except Exception:  # noqa: BLE001 - no clock, no judgement
                return {}
        now = time.time() + self._clock_offset_s
        ages = {a: now - w["last_seen"] for a, w in workers.items() if w.get("last_seen")}
        return {a: age for a, age in ages.items() if age > self.silent_after_s}

    def live_workers(self) -> dict[str, dict]:
        """The workers now in the cluster that the scheduler hears from."""
        workers = self.workers()
        silent = self.silent(workers)
        return {a: w for a, w in workers.items() if a not in silent}

    def worker_facts(self, workers: list[str] | None = None) -> dict[str, HostFacts]:
        """The hardware of each worker (address -> its facts; ``workers``: those only), read on the
        worker.  A worker sends plain values (the scheduler passes them on without Tula's classes);
        they are typed here, on arrival."""
        sent: dict[str, dict[str, Any]] = self.client.run(host_facts_json, self.device, workers=workers)
        return {addr: HostFacts.model_validate(facts) for addr, facts in sent.items()}

    def facts(self) -> HostFacts:
        """The hardware of the worker rank 0 would run on (read there)."""
        ((_, addr),) = self._choose(1)
        return self.worker_facts([addr])[addr]

    def default_threads(self, n_ranks: int) -> int:
        """Torch threads per rank: a host's cores shared by the Dask workers on it (the
        workers' own count, as the local launcher does with this machine's)."""
        workers = self.workers()
        facts = self.worker_facts()
        per_host: dict[str, int] = {}
        for w in workers.values():
            per_host[w["host"]] = per_host.get(w["host"], 0) + 1
        cores = [max(1, (facts[a].cores or 1) // per_host[w["host"]]) for a, w in workers.items() if a in facts]
        return min(cores) if cores else 1

    def provide(self, n_workers: int) -> int:
        """Ask for ``n_workers`` workers (scaling the cluster where Tula can) and wait up to
        ``worker_wait_s`` for them; returns how many there are (the caller goes on with that
        many when it is fewer, and says so).  A scheduler that does not answer, or no worker at
        all, returns ``n_workers``: the world then fails with the sentence that says why."""
        try:
            have = len(self.workers())
        except Exception:  # noqa: BLE001 - the scheduler does not answer: the world says so
            return n_workers
        if have >= n_workers:
            return n_workers
        cluster = getattr(self.client, "cluster", None)
        # grown only: a cluster planned larger (a worker of it restarting) is never scaled down
        if cluster is not None and hasattr(cluster, "scale") and n_workers > len(getattr(cluster, "plan", ())):
            with contextlib.suppress(Exception):
                cluster.scale(n_workers)
        with contextlib.suppress(Exception):
            self.client.wait_for_workers(n_workers, timeout=self.worker_wait_s)
        try:
            return min(n_workers, len(self.workers())) or n_workers
        except Exception:  # noqa: BLE001 - as above
            return n_workers

    def _choose(self, n_workers: int) -> list[tuple[str, str]]:
        """The first ``n_workers`` live workers by host, ``[(host, address)]``."""
        return self._live_by_host(n_workers)[:n_workers]

    def _live_by_host(self, n_workers: int) -> list[tuple[str, str]]:
        """Every live worker, ``[(host, address)]`` by host, once there are at least
        ``n_workers`` (waiting up to ``worker_wait_s``; fewer is one sentence)."""
        workers = self.live_workers()
        if len(workers) < n_workers:  # e.g. a lost worker's nanny is still restarting it
            with contextlib.suppress(Exception):
                self.client.wait_for_workers(n_workers, timeout=self.worker_wait_s)
            workers = self.live_workers()
        if len(workers) < n_workers:
            silent = self.silent(self.workers())
            raise TulaError(
                f"the Dask cluster has {len(workers)} worker(s) that answer, but a world of {n_workers} "
                "rank(s) needs one worker per rank; add workers or plan for fewer"
                + (f" (not heard from: {', '.join(sorted(silent))})" if silent else "")
            )
        return sorted((w["host"], addr) for addr, w in workers.items())

    # ---------------------------------------------------------------- a world
    def run(
        self,
        fn: Callable[..., Any],
        n_workers: int,
        *args: Any,
        on_event: Callable[[int, ProgressEvent], None] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        gate = self.world_gate
        if gate is None:
            return self._run_world(fn, n_workers, *args, on_event=on_event, timeout_s=timeout_s)
        try:
            gate.enter(n_workers, lambda: self._live_count(n_workers))
            return self._run_world(fn, n_workers, *args, on_event=on_event, timeout_s=timeout_s)
        finally:
            gate.leave()

    def _live_count(self, n_workers: int) -> int:
        """How many live workers the cluster has now, for the world gate; a lost scheduler is
        the world's failure, in the sentence a world running then gets."""
        live = self._workers_within(RPC_TIMEOUT_S)
        if live is None or self.scheduler_lost():
            raise WorkerError(self._scheduler_lost_sentence(n_workers), cause="scheduler_lost")
        silent = self.silent(live)
        return sum(1 for addr in live if addr not in silent)

    def _run_world(
        self,
        fn: Callable[..., Any],
        n_workers: int,
        *args: Any,
        on_event: Callable[[int, ProgressEvent], None] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        from distributed import Event, Queue, wait

        chosen, locks = self._take_workers(n_workers)
        addrs = [addr for _, addr in chosen]
        world_id = uuid.uuid4().hex[:12]
        queue = Queue(f"tula-events-{world_id}", client=self.client)
        stop_event = Event(f"tula-stop-{world_id}", client=self.client)
        futures: list[Any] = []
        unregister = interrupts.on_stop(lambda signum: stop_event.set())
        try:
            device = self.worker_facts([addrs[0]])[addrs[0]].device
            hosts = [h for h, _ in chosen]
            if device == "cuda":  # one GPU per rank: a host with more ranks than GPUs, before any starts
                seen = self.worker_facts(addrs)
                gpus: dict[str, int | None] = {}
                for h, a in chosen:  # a rank's local rank indexes its own worker's visible GPUs
                    g = int(seen[a].gpus or 0) if a in seen else 0
                    gpus[h] = g if h not in gpus else min(g, gpus[h] or 0)
                crowded = crowded_hosts({h: hosts.count(h) for h in hosts}, gpus)
                if crowded:
                    raise PlacementError(crowded[0])
            rank0_host = self._rendezvous_host(chosen)
            port = self.client.run(_free_port_here, workers=[addrs[0]])[addrs[0]]
            setups = [
                RankSetup(
                    r,
                    n_workers,
                    f"tcp://{_url_host(rank0_host)}:{port}",
                    device,
                    self.threads_per_worker,
                    self.pg_timeout_s,
                    local_rank=hosts[:r].count(hosts[r]),
                    local_world_size=hosts.count(hosts[r]),
                    host=hosts[r],
                    backend=self.backend,
                    interface=self.interface,
                    peers=tuple(addrs),
                )
                for r in range(n_workers)
            ]
            futures = [
                self.client.submit(
                    _dask_rank,
                    s,
                    fn,
                    args,
                    queue.name,
                    stop_event.name,
                    addrs[s.rank],
                    key=f"tula-rank-{world_id}-{s.rank}",
                    workers=[addrs[s.rank]],
                    allow_other_workers=False,
                    pure=False,
                    retries=0,
                )
                for s in setups
            ]
            return self._gather(futures, addrs, queue, on_event, timeout_s, wait)
        except TulaError:
            raise
        except Exception:  # noqa: BLE001 - the scheduler gone, or a bug: told apart here
            if not self.scheduler_lost():
                raise
            raise WorkerError(self._scheduler_lost_sentence(n_workers), cause="scheduler_lost") from None
        finally:
            unregister()
            if not self.scheduler_lost():  # nothing can be cancelled, restarted or released through it
                self._clean_up(futures, addrs)
                with contextlib.suppress(Exception):
                    queue.close()
                for lock in locks:
                    with contextlib.suppress(Exception):
                        lock.release()

    def scheduler_lost(self) -> bool:
        """Whether this launcher's client has lost its scheduler (it is reconnecting, or gave up)."""
        return self.client.status not in ("running", "newly-created")

    def _scheduler_lost_sentence(self, n_workers: int) -> str:
        return (
            f"the Dask scheduler at {self.client.scheduler.address} stopped answering during a "
            f"{n_workers}-worker world; its ranks stop at their next step, what they had finished is "
            "kept, and a resumed run goes on from there once the scheduler and its workers are back"
        )

    def _lock(self, addr: str) -> Any:
        from distributed import Lock

        return Lock(f"{WORKER_LOCK_PREFIX}{addr}", scheduler_rpc=self.client.scheduler, loop=self.client.loop)

    def _take_workers(self, n_workers: int) -> tuple[list[tuple[str, str]], list[Any]]:
        """The world's workers, ``[(host, address)]`` by host, and their locks.  Workers no other
        world holds come first: each live worker, by host, is tried without waiting, so a world
        beside another (a second job of the service, a second command on one scheduler) takes
        free workers instead of queueing behind busy ones.  Where fewer than ``n_workers`` are
        free, the first ``n_workers`` by host are waited for, as :meth:`_lock_workers` says."""
        live = self._live_by_host(n_workers)
        taken: list[tuple[tuple[str, str], Any]] = []
        for host, addr in live:
            if len(taken) == n_workers:
                break
            lock = self._lock(addr)
            try:
                if lock.acquire(blocking=False):
                    taken.append(((host, addr), lock))
            except Exception:  # noqa: BLE001 - a lock that cannot be asked for is not free
                continue
        if len(taken) == n_workers:
            return sorted(c for c, _ in taken), [lock for _, lock in taken]
        for _, lock in taken:
            with contextlib.suppress(Exception):
                lock.release()
        first = live[:n_workers]
        return first, self._lock_workers([addr for _, addr in first])

    def _lock_workers(self, addrs: list[str]) -> list[Any]:
        """One lock per worker, taken in address order (two worlds never wait on each other in
        a circle); a lock is a lease the holding process keeps alive, so the workers of a
        process that died (kill -9) are free again after that process's lease timeout
        (``distributed.scheduler.locks.lease-timeout``, 30 s by default, of the first process
        that created the worker's lock on that scheduler: the scheduler keeps the timeout a
        lock's name was first registered with; its own setting does not change it)."""
        deadline = time.monotonic() + self.lock_timeout_s
        held: list[Any] = []
        for addr in sorted(addrs):
            lock = self._lock(addr)
            if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                for h in held:
                    with contextlib.suppress(Exception):
                        h.release()
                raise WorkerError(
                    f"the Dask worker {addr} stayed busy with another world for {self.lock_timeout_s:.0f} s",
                    cause="timeout",
                )
            held.append(lock)
        return held

    def _rendezvous_host(self, chosen: list[tuple[str, str]]) -> str:
        """Rank 0's worker address as an IP: a name is resolved on rank 0's worker, and a world
        across hosts never meets on loopback."""
        host, addr = chosen[0]
        try:
            ip = self.client.run(resolve, host, workers=[addr])[addr]
        except Exception:  # noqa: BLE001 - keep the scheduler's word for it
            ip = host
        if is_loopback(ip) and not all(is_loopback(h) for h, _ in chosen):  # ranks elsewhere cannot reach it
            raise TulaError(
                f"rank 0's worker {addr} is known by a loopback address ({host} -> {ip}), which ranks on "
                "other hosts cannot reach; start the workers with --host or --interface set to an "
                "address the other hosts reach"
            )
        return ip

    def _gather(
        self,
        futures: list[Any],
        addrs: list[str],
        queue: Any,
        on_event: Callable[[int, ProgressEvent], None] | None,
        timeout_s: float | None,
        wait: Callable[..., Any],
    ) -> list[Any]:
        """The ranks' results in rank order, their events passed on as they come; a failed
        rank, a worker that left the cluster or went silent, or the ``timeout_s`` raises
        :class:`WorkerError` in one sentence (:class:`_Gathering` keeps the count)."""
        n = len(futures)
        g = _Gathering(addrs, queue, on_event)
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while not g.complete():
            if self.scheduler_lost():  # before anything asks it: a call would wait for the reconnect
                raise WorkerError(self._scheduler_lost_sentence(n), cause="scheduler_lost")
            pending = [f for f in futures if not f.done()]
            if pending:
                with contextlib.suppress(TimeoutError):
                    wait(pending, timeout=0.2, return_when="FIRST_COMPLETED")
            g.drain()
            g.take_finished(futures)
            now = time.monotonic()
            workers = self._workers_within(RPC_TIMEOUT_S) if g.answered() < n else {a: {} for a in addrs}
            if workers is None:  # no answer in time: is it the scheduler? (the loop's first question)
                continue
            g.check_workers(workers, self.silent({a: w for a, w in workers.items() if a in addrs}), now)
            if g.failures and now - (g.first_failure_at or now) > self.pg_timeout_s + 5:
                break
            if deadline is not None and now > deadline:
                raise WorkerError(f"the {n}-worker run did not finish within {timeout_s:.0f} s", cause="timeout")
        if g.failures and self.scheduler_lost():  # it cancelled the ranks' futures: they were not lost, it was
            raise WorkerError(self._scheduler_lost_sentence(n), cause="scheduler_lost")
        g.drain()
        return g.outcome()

    def _clean_up(self, futures: list[Any], addrs: list[str]) -> None:
        """Cancel what is left of the world; restart any worker still running one of its ranks."""
        running = [addrs[r] for r, f in enumerate(futures) if not f.done()]
        if futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures, force=True)
        if running:
            try:
                present = self.live_workers()  # a silent worker cannot be restarted: it would hang the restart
            except Exception:  # noqa: BLE001 - a scheduler that does not answer restarts nothing
                present = {}
            stuck = [a for a in running if a in present]
            if stuck:
                with contextlib.suppress(Exception):
                    self.client.restart_workers(stuck, timeout=120)
