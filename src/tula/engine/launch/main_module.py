"""The processes Tula starts never run the launching program's main module again.

multiprocessing's spawn and forkserver start methods prepare each child by running the
parent's ``__main__`` again (as ``__mp_main__``: the script by its path, or the module of
``python -m``).  For a user's script without an ``if __name__ == "__main__":`` guard that
re-runs its top-level ``job.profile()`` in every rank, which multiprocessing refuses ("An
attempt has been made to start a new process before the current process has finished its
bootstrapping phase"); for ``python - < script.py`` there is no file to run (``<stdin>``).

Tula's processes need nothing from the main module: a rank's function and arguments are
Tula's own, found by import path, and the user's objects reach the ranks as cloudpickle
files, by value when they were defined in ``__main__``
(:func:`tula.engine.workloads.send_to_ranks`); a Dask worker gets its tasks from cloudpickle
too.  So every process started -- from any thread -- inside :func:`without_main_module`
is prepared without it.  Outside the block multiprocessing is left as it is, so the user's
own processes are prepared as they always were.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from multiprocessing import spawn
from typing import Any

#: the keys of multiprocessing's preparation data that make a child run the main module
MAIN_KEYS = ("init_main_from_name", "init_main_from_path")

_lock = threading.Lock()
_open = 0  # blocks open now, in any thread
_stdlib = spawn.get_preparation_data


def _preparation_data(name: str) -> dict[str, Any]:
    """multiprocessing's preparation data for a child, without the main module."""
    data = _stdlib(name)
    for key in MAIN_KEYS:
        data.pop(key, None)
    return data


@contextlib.contextmanager
def without_main_module() -> Iterator[None]:
    """Processes started inside the block (by multiprocessing's spawn or forkserver, from
    any thread) do not run the main module; blocks may nest and overlap."""
    global _open
    with _lock:
        _open += 1
        spawn.get_preparation_data = _preparation_data
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0:
                spawn.get_preparation_data = _stdlib
