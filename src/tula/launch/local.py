"""Run a function as an N-rank torch.distributed world of local processes."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from ..errors import TulaError, WorkerError
from .base import WorkerContext, pick_device


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: end this rank when the launching process dies (a killed ``tula train`` must
    leave no orphaned ranks training on).  Elsewhere a no-op."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _worker_main(rank: int, world_size: int, port: int, device_kind: str, threads: int | None,
                 fn: Callable[..., Any], args: tuple, q: Any, pg_timeout_s: float) -> None:
    _die_with_parent()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if threads:
        torch.set_num_threads(threads)
    if device_kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=pg_timeout_s),
                                **({"device_id": device} if backend == "nccl" else {}))
        ctx = WorkerContext(rank, world_size, device, backend, _emit=lambda ev: q.put(("event", rank, ev)))
        result = fn(ctx, *args)
        q.put(("result", rank, result))
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the parent, named
        user = isinstance(err, TulaError)
        q.put(("error", rank, type(err).__name__, str(err), "" if user else traceback.format_exc(), user))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def _error_order(msg: tuple) -> tuple:
    """Report the root cause first: a user error, then an ordinary exception, and only then
    the connection errors that other ranks see when one rank fails."""
    text = f"{msg[2]} {msg[3]}"
    secondary = any(k in text for k in ("Connection reset", "Connection closed", "Broken pipe", "timed out",
                                        "Timeout"))
    return (not msg[5], secondary, msg[1])


class LocalLauncher:
    """One process per rank on this machine (gloo on CPU, NCCL on GPU).

    Parameters
    ----------
    device : ``auto`` | ``cpu`` | ``cuda``
    threads_per_worker : torch threads in each rank (None: torch's default)
    grace_s : how long the other ranks get to finish after one rank failed
    """

    def __init__(self, device: str = "auto", threads_per_worker: int | None = None, grace_s: float = 10.0):
        self.device = pick_device(device)
        self.threads_per_worker = threads_per_worker
        self.grace_s = grace_s

    def run(self, fn: Callable[..., Any], n_workers: int, *args: Any,
            on_event: Callable[[int, dict], None] | None = None, timeout_s: float | None = None) -> list[Any]:
        ctx = mp.get_context("spawn")
        # a SimpleQueue writes each message to the pipe before put() returns, so a rank that
        # dies right after an event (os._exit, SIGKILL) has still delivered it
        q = ctx.SimpleQueue()
        port = free_port()
        pg_timeout = max(30.0, timeout_s or 600.0)
        procs = [ctx.Process(target=_worker_main, daemon=True,
                             args=(r, n_workers, port, self.device, self.threads_per_worker, fn, args, q, pg_timeout))
                 for r in range(n_workers)]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: dict[int, tuple] = {}
        first_error_at: float | None = None
        deadline = time.monotonic() + timeout_s if timeout_s else None

        def take(msg: tuple) -> None:
            nonlocal first_error_at
            kind, rank = msg[0], msg[1]
            if kind == "event":
                if on_event is not None:
                    on_event(rank, msg[2])
            elif kind == "result":
                results[rank] = msg[2]
            else:
                errors[rank] = msg
                first_error_at = first_error_at or time.monotonic()

        def silent_dead() -> list[int]:
            return [r for r, p in enumerate(procs)
                    if not p.is_alive() and r not in results and r not in errors]

        try:
            while len(results) < n_workers:
                if not q.empty():
                    take(q.get())
                    continue
                time.sleep(0.05)
                now = time.monotonic()
                if errors and (now - first_error_at > self.grace_s or all(not p.is_alive() for p in procs)):
                    break
                if silent_dead():
                    time.sleep(0.5)  # the other ranks' last words may still be coming
                    while not q.empty():
                        take(q.get())
                    if silent_dead() and not errors:
                        break
                if deadline is not None and now > deadline:
                    raise WorkerError(f"the {n_workers}-worker run did not finish within {timeout_s:.0f} s")
            dead = silent_dead()
            if dead:
                # a rank that died without a word (killed, out of memory, segfault) is the cause;
                # the others' connection errors are its consequence
                r = dead[0]
                raise WorkerError(f"worker rank {r} of {n_workers} died (exit code {procs[r].exitcode}) "
                                  "before returning a result", rank=r)
            if errors:
                _, rank, etype, message, tb, user = errors[min(errors, key=lambda k: _error_order(errors[k]))]
                if user:
                    raise WorkerError(message, rank=rank)
                raise WorkerError(f"worker rank {rank} of {n_workers} failed: {etype}: {message}", rank=rank,
                                  details=tb)
            return [results[r] for r in range(n_workers)]
        finally:
            for p in procs:
                p.join(timeout=5 if not errors else 0.5)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
            q.close()
