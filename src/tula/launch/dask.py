"""Run a function as an N-rank torch.distributed world on N Dask workers.

Rendezvous only; what a rank does is :func:`~.runtime.run_rank`, as on the local launcher.

* the world takes N distinct workers, ordered by host so that ranks on one host are
  contiguous (``local_rank`` = position on its host), under a :class:`distributed.MultiLock`
  over those workers: two worlds never share a worker at once;
* rank 0's host is the rendezvous address, on a port found free *on that worker* for every
  world (a reused port can hang the next world's start);
* each rank is one task, ``pure=False``, no retries, pinned to its worker, and checks when
  it starts that it runs where it was sent (a task moved to another worker fails at once
  instead of joining the wrong world);
* events (progress, finished trials) come back through a :class:`distributed.Queue`;
* a worker that leaves the cluster fails the world with one sentence naming it; the other
  ranks' tasks are cancelled and, if still running (stuck in a collective), their workers
  restarted, so no world hangs and no worker keeps a stale rank;
* SIGINT/SIGTERM in the caller set a :class:`distributed.Event` that every rank polls.
"""

from __future__ import annotations

import contextlib
import queue as queue_module
import socket
import threading
import time
import uuid
from typing import Any, Callable

from .. import interrupts
from ..errors import TulaError, WorkerError
from .base import RankFailure, host_facts
from .local import failure_sentence, root_failure
from .runtime import RankSetup, run_rank


def _free_port_here() -> int:
    """A TCP port free on this worker's host (run on rank 0's worker)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _dask_rank(setup: RankSetup, fn: Callable[..., Any], args: tuple, queue_name: str, stop_name: str,
               expected_worker: str) -> tuple[str, Any]:
    """One rank as a Dask task."""
    from distributed import Event, Queue, get_worker

    here = get_worker().address
    if here != expected_worker:
        return "failure", RankFailure(setup.rank, "crash", f"its task was moved to worker {here} instead of "
                                      f"{expected_worker}; the world is abandoned", "WrongWorker", host=setup.host)
    q = Queue(queue_name)
    stop_event = Event(stop_name)
    done = threading.Event()
    holder: dict = {}
    outbox: queue_module.SimpleQueue = queue_module.SimpleQueue()

    def send() -> None:  # events go to the caller off the training thread: a put is a round trip
        while (item := outbox.get()) is not None:
            with contextlib.suppress(Exception):
                q.put(item)

    def watch_stop() -> None:  # the caller's SIGINT/SIGTERM, seen through the scheduler
        while not done.wait(0.5):
            with contextlib.suppress(Exception):
                if stop_event.is_set() and holder.get("stop") is not None:
                    holder["stop"].requested = True
                    holder["stop"].signum = holder["stop"].signum or 2

    def emit(ev: dict) -> None:
        outbox.put(("event", setup.rank, ev))

    def fn_with_stop(ctx, *a):
        holder["stop"] = ctx.stop
        return fn(ctx, *a)

    threads = [threading.Thread(target=send, daemon=True), threading.Thread(target=watch_stop, daemon=True)]
    for t in threads:
        t.start()
    try:
        return run_rank(setup, fn_with_stop, args, emit=emit, die_with_parent=False)
    finally:
        done.set()
        outbox.put(None)
        threads[0].join(timeout=60)  # every event is delivered before the result


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
    """

    name = "dask"

    def __init__(self, client: Any, device: str = "auto", threads_per_worker: int | None = None,
                 pg_timeout_s: float = 60.0, lock_timeout_s: float = 3600.0, worker_wait_s: float = 60.0,
                 backend: str | None = None):
        self.client = client
        self.device = device
        self.threads_per_worker = threads_per_worker
        self.pg_timeout_s = pg_timeout_s
        self.lock_timeout_s = lock_timeout_s
        self.worker_wait_s = worker_wait_s
        self.backend = backend

    # ---------------------------------------------------------------- the cluster
    def workers(self) -> dict[str, dict]:
        """Address -> scheduler info of every worker now in the cluster."""
        info = self.client.scheduler_info(n_workers=-1)
        return dict(info["workers"])

    def worker_facts(self) -> dict[str, dict]:
        """Each worker's hardware, read on the worker."""
        return self.client.run(host_facts, self.device)

    def facts(self) -> dict:
        """The hardware of the worker rank 0 would run on (read there)."""
        (_, addr), = self._choose(1)
        return self.client.run(host_facts, self.device, workers=[addr])[addr]

    def default_threads(self, n_ranks: int) -> int:
        """Torch threads per rank: a host's cores shared by the Dask workers on it (the
        workers' own count, as the local launcher does with this machine's)."""
        workers = self.workers()
        facts = self.worker_facts()
        per_host: dict[str, int] = {}
        for w in workers.values():
            per_host[w["host"]] = per_host.get(w["host"], 0) + 1
        cores = [max(1, (facts[a].get("cores") or 1) // per_host[w["host"]]) for a, w in workers.items() if a in facts]
        return min(cores) if cores else 1

    def provide(self, n_workers: int) -> int:
        """Ask for ``n_workers`` workers (scaling the cluster where Tula can) and wait up to
        ``worker_wait_s`` for them; returns how many there are (the caller goes on with that
        many when it is fewer, and says so)."""
        have = len(self.workers())
        if have >= n_workers:
            return n_workers
        cluster = getattr(self.client, "cluster", None)
        if cluster is not None and hasattr(cluster, "scale"):
            with contextlib.suppress(Exception):
                cluster.scale(n_workers)
        with contextlib.suppress(Exception):
            self.client.wait_for_workers(n_workers, timeout=self.worker_wait_s)
        return min(n_workers, len(self.workers()))

    def _choose(self, n_workers: int) -> list[tuple[str, str]]:
        workers = self.workers()
        if len(workers) < n_workers:  # e.g. a lost worker's nanny is still restarting it
            with contextlib.suppress(Exception):
                self.client.wait_for_workers(n_workers, timeout=self.worker_wait_s)
            workers = self.workers()
        if len(workers) < n_workers:
            raise TulaError(f"the Dask cluster has {len(workers)} worker(s), but a world of {n_workers} rank(s) "
                            "needs one worker per rank; add workers or plan for fewer")
        by_host = sorted((w["host"], addr) for addr, w in workers.items())
        return by_host[:n_workers]

    # ---------------------------------------------------------------- a world
    def run(self, fn: Callable[..., Any], n_workers: int, *args: Any,
            on_event: Callable[[int, dict], None] | None = None, timeout_s: float | None = None) -> list[Any]:
        from distributed import Event, MultiLock, Queue, wait

        chosen = self._choose(n_workers)
        addrs = [addr for _, addr in chosen]
        lock = MultiLock(names=[f"tula-worker-{a}" for a in addrs], client=self.client)
        if not lock.acquire(timeout=self.lock_timeout_s):
            raise WorkerError(f"the Dask workers {', '.join(addrs)} stayed busy with another world for "
                              f"{self.lock_timeout_s:.0f} s", cause="timeout")
        world_id = uuid.uuid4().hex[:12]
        queue = Queue(f"tula-events-{world_id}", client=self.client)
        stop_event = Event(f"tula-stop-{world_id}", client=self.client)
        futures: list[Any] = []
        unregister = interrupts.on_stop(lambda signum: stop_event.set())
        try:
            device = self.client.run(host_facts, self.device, workers=[addrs[0]])[addrs[0]]["device"]
            rank0_host = chosen[0][0]
            port = self.client.run(_free_port_here, workers=[addrs[0]])[addrs[0]]
            hosts = [h for h, _ in chosen]
            setups = [RankSetup(r, n_workers, f"tcp://{rank0_host}:{port}", device, self.threads_per_worker,
                                self.pg_timeout_s, local_rank=hosts[:r].count(hosts[r]), host=hosts[r],
                                backend=self.backend) for r in range(n_workers)]
            futures = [self.client.submit(_dask_rank, s, fn, args, queue.name, stop_event.name, addrs[s.rank],
                                          key=f"tula-rank-{world_id}-{s.rank}", workers=[addrs[s.rank]],
                                          allow_other_workers=False, pure=False, retries=0)
                       for s in setups]
            return self._gather(futures, addrs, queue, on_event, timeout_s, wait)
        finally:
            unregister()
            self._clean_up(futures, addrs)
            with contextlib.suppress(Exception):
                queue.close()
            with contextlib.suppress(Exception):
                lock.release()

    def _gather(self, futures, addrs, queue, on_event, timeout_s, wait) -> list[Any]:
        n = len(futures)
        results: dict[int, Any] = {}
        failures: dict[int, RankFailure] = {}
        deadline = time.monotonic() + timeout_s if timeout_s else None
        first_failure_at: float | None = None
        lost_since: dict[str, float] = {}

        def drain() -> None:
            with contextlib.suppress(Exception):
                for kind, rank, ev in queue.get(batch=True):
                    if kind == "event" and on_event is not None:
                        on_event(rank, ev)

        while len(results) + len(failures) < n:
            pending = [f for f in futures if not f.done()]
            if pending:
                with contextlib.suppress(TimeoutError):
                    wait(pending, timeout=0.2, return_when="FIRST_COMPLETED")
            drain()
            for r, f in enumerate(futures):
                if r in results or r in failures or not f.done():
                    continue
                if f.status == "finished":
                    kind, value = f.result()
                    if kind == "result":
                        results[r] = value
                    else:
                        failures[r] = value
                else:  # cancelled, or an error outside run_rank (the worker process died)
                    exc = f.exception() if f.status == "error" else None
                    why = type(exc).__name__ if exc is not None else f.status
                    failures[r] = RankFailure(r, "lost_worker", f"was lost ({why})", host=addrs[r])
                first_failure_at = first_failure_at or time.monotonic()
            now = time.monotonic()
            present = set(self.workers()) if len(results) + len(failures) < n else set(addrs)
            for r, addr in enumerate(addrs):
                if r not in results and r not in failures and addr not in present:
                    lost_since.setdefault(addr, now)
                    if now - lost_since[addr] > 1.0:  # not a blip in the scheduler's view
                        failures[r] = RankFailure(r, "lost_worker", "left the Dask cluster", host=addr)
                        first_failure_at = first_failure_at or now
            if failures and now - first_failure_at > self.pg_timeout_s + 5:
                break
            if deadline is not None and now > deadline:
                raise WorkerError(f"the {n}-worker run did not finish within {timeout_s:.0f} s", cause="timeout")
        drain()
        if failures:
            root = root_failure(list(failures.values()))
            message = failure_sentence(root, n)
            raise WorkerError(message, rank=root.rank, details=root.traceback, cause=root.cause)
        return [results[r] for r in range(n)]

    def _clean_up(self, futures, addrs) -> None:
        """Cancel what is left of the world; restart any worker still running one of its ranks."""
        running = [addrs[r] for r, f in enumerate(futures) if not f.done()]
        if futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures, force=True)
        if running:
            present = set(self.workers())
            stuck = [a for a in running if a in present]
            if stuck:
                with contextlib.suppress(Exception):
                    self.client.restart_workers(stuck, timeout=120)
