"""The fork server the local launcher's ranks are forked from (torch-free to import).

A rank forked from a server that has already imported torch and Tula's engine starts in a
fraction of a second; a spawned one imports them again, about
5 s of CPU per rank on a small machine.  The server starts once per process and serves
every later world; it ends with the process.  :func:`start_fork_server` starts it early, so
that its imports run beside the launching process's own (the CLI calls it as soon as it
knows the ranks will be local).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import threading
from collections.abc import Iterator
from typing import Any

#: what the server imports before it forks a rank: first the module that makes it ignore
#: SIGTERM (:mod:`tula.engine.launch.forkserver_signals` says why), then torch, torch._dynamo
#: (DDP's constructor and the optimizers' steps import it on first use: 1-2 s of CPU in every
#: rank of every world otherwise), and the engine (the digits set is read without
#: scikit-learn's data sets module: :func:`tula.engine.workloads.digits_arrays`)
PRELOAD = [
    "tula.engine.launch.forkserver_signals",
    "torch",
    "torch._dynamo",
    "torch.distributed",
    "tula.engine.launch.runtime",
    "tula.engine.profile",
    "tula.engine.train",
]


def rank_context() -> Any:
    """The multiprocessing context ranks are started with: forked from the fork server."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_fork_server() -> None:
    """Start the fork server now (it imports while this process goes on); a no-op when it
    runs already.  Never raises: a server that cannot start here is started, or fails with
    its reason, by the first world.

    The server is started ignoring SIGINT and SIGTERM from its first instruction
    (:func:`_stop_signals_held`): Ctrl-C in a terminal reaches the whole process group, and a
    server still importing torch died of it with a traceback of a hundred lines."""
    rank_context()
    try:
        from multiprocessing import forkserver

        with _stop_signals_held():
            forkserver.ensure_running()
    except Exception:  # noqa: BLE001 - the first world says why, in one sentence
        pass


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Inside, SIGINT and SIGTERM are blocked and ignored here, so that a process started
    inside is born ignoring them (an interpreter born so never installs its KeyboardInterrupt
    handler); afterwards the handlers are back and a signal that came meanwhile is delivered
    then, not lost (a blocked signal stays pending even while ignored).  Outside the main
    thread, where handlers cannot be set, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        handlers = {s: signal.signal(s, signal.SIG_IGN) for s in held}
        try:
            yield
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
