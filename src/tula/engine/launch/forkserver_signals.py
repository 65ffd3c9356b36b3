"""Imported by the local launcher's fork server, and only there (its preload list, first): its
signals, and how it reports a rank that could not start.

The fork server is the parent of every local rank, and a rank ends when its parent does
(``PR_SET_PDEATHSIG``).  A SIGTERM to the whole process group (``kill -TERM -PGID``,
``scancel``) must let the ranks stop cleanly at their next step, as the launching process
tells them to, so the fork server ignores SIGTERM.  It ignores SIGINT too, from the start:
Ctrl-C in a terminal reaches the whole group, and multiprocessing ignores it only once the
server has imported its preload (torch: seconds), which a Ctrl-C before then interrupted with
a traceback.  (:func:`tula.engine.forkserver.start_fork_server` starts the server with both
ignored and blocked; they are unblocked here, now that they are ignored.)  The ranks forked
from it start ignoring both, until their own handlers are set
(:mod:`tula.engine.launch.runtime`); the launching process repeats a stop to a rank until
it ends, so one that came before its handlers is not lost.  The server still ends when the
launching process does, however that ends: it reads end-of-file on the pipe it shares with
it, and the ranks' death signal then takes any rank left.

A rank the server forked that fails before its own code runs (multiprocessing reading what
to run: e.g. a semaphore its launching process removed while stopping on a second Ctrl-C)
is reported by multiprocessing through ``sys.excepthook``; here that is one line of plain
text, not a traceback.
"""

from __future__ import annotations

import signal
import sys
from types import TracebackType

signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def _one_line(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:  # noqa: ARG001
    text = " ".join(str(value).split())[:300]
    print(f"a local rank could not start: {kind.__name__}{': ' + text if text else ''}", file=sys.stderr, flush=True)


sys.excepthook = _one_line
