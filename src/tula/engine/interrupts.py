"""SIGINT and SIGTERM in the launching process: a request to stop, not an exception.

Inside :func:`graceful_signals` the first SIGINT or SIGTERM is recorded and handed to the
registered callbacks (a launcher forwards it to its ranks, which stop at the next step
boundary, save what they finished and return); the command then ends with
:class:`~tula.core.errors.Interrupted` (exit 130 or 143).  A second signal stops at once
(``KeyboardInterrupt``); the launcher's cleanup still ends every rank.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass
class _StopState:
    """This process's stop request: the signal that came (``None``: none yet), the callbacks
    to hand it to, and how deep :func:`graceful_signals` blocks are nested."""

    signum: int | None = None
    callbacks: list[Callable[[int], None]] = field(default_factory=list)
    depth: int = 0


_state = _StopState()


def requested() -> int | None:
    """The signal that asked this process to stop, or None."""
    return _state.signum


def on_stop(callback: Callable[[int], None]) -> Callable[[], None]:
    """Call ``callback(signum)`` on the first stop signal (at once if one already came);
    returns a function that unregisters it."""
    _state.callbacks.append(callback)
    if _state.signum is not None:
        callback(_state.signum)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            _state.callbacks.remove(callback)

    return remove


def _handler(signum: int, frame: FrameType | None) -> None:  # noqa: ARG001
    if _state.signum is not None:
        raise KeyboardInterrupt  # second signal: stop now
    _state.signum = signum
    for cb in list(_state.callbacks):
        with contextlib.suppress(Exception):
            cb(signum)


@contextlib.contextmanager
def graceful_signals() -> Iterator[None]:
    """Handle SIGINT/SIGTERM as stop requests inside the block (main thread only; nested
    uses share one state)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _state.depth == 0
    previous = {s: signal.getsignal(s) for s in _SIGNALS} if outer else {}
    if outer:
        _state.signum = None
        for s in _SIGNALS:
            signal.signal(s, _handler)
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if outer:
            for s, h in previous.items():
                signal.signal(s, h)


@contextlib.contextmanager
def held(ignore: bool = False) -> Iterator[None]:
    """SIGINT and SIGTERM held inside: blocked in this thread, so that one that comes is
    delivered when the block ends -- at a point where Python can raise -- not in its middle,
    never lost.  ``ignore``: also ignored inside, so that a process started inside is born
    ignoring them (an interpreter born so never installs its KeyboardInterrupt handler).
    Blocked in this thread only: another thread of this process could take one meanwhile
    (with ``ignore``, and it would be dropped); keep the block short.  Outside the main
    thread, where handlers cannot be set, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(_SIGNALS))
    try:
        handlers = {s: signal.signal(s, signal.SIG_IGN) for s in _SIGNALS} if ignore else {}
        try:
            yield
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def import_torch() -> None:
    """Import torch in this process with SIGINT and SIGTERM :func:`held`: torch's import runs
    Python code from inside C++ (its operator registrations), where a KeyboardInterrupt
    aborts the process (SIGABRT, "terminate called after throwing ... KeyboardInterrupt",
    measured once in 30 Ctrl-Cs at random moments); held, the signal arrives once the import
    is done and is a sentence and exit 130 like any other."""
    with held():
        import torch  # noqa: F401
