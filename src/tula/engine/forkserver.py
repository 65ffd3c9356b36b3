"""The fork server the local launcher's ranks are forked from (torch-free to import).

A rank forked from a server that has already imported torch and Tula's engine starts in a
fraction of a second; a spawned one imports them again, about
5 s of CPU per rank on a small machine.  The server starts once per process and serves
every later world; it ends with the process.  :func:`start_fork_server` starts it early, so
that its imports run beside the launching process's own (the CLI calls it as soon as it
knows the ranks will be local).
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

from tula.engine import interrupts

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


#: the process that started the server (a process forked from it is another one); a server
#: that died later is started again by multiprocessing at the next world
_started_by: int | None = None


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
    (:func:`tula.engine.interrupts.held`): Ctrl-C in a terminal reaches the whole process
    group, and a server still importing torch died of it with a traceback of about 50 lines.
    Once per process: each world's start calls it too (a process that did not start it early),
    and holds no signal once it has."""
    global _started_by
    if _started_by == os.getpid():
        return
    rank_context()
    try:
        from multiprocessing import forkserver

        with interrupts.held(ignore=True):
            forkserver.ensure_running()
        _started_by = os.getpid()
    except Exception:  # noqa: BLE001 - the first world says why, in one sentence
        pass
