"""Output directories and files: one run writes into a directory at a time, and no command
overwrites a record it did not create without being told to (``--force``).

The lock is an ``flock`` on ``DIR/.tula.lock``, which also holds who holds it (pid, host,
command, start time) so that a second run can name the first.  The kernel releases the
lock when its holder dies, so a lock left by a killed run is taken over by the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tula.core.errors import RunDirError

LOCK = ".tula.lock"
_held: dict[str, list] = {}  # resolved path -> [fd, depth]: re-entrant within one process


def command_line() -> str:
    return " ".join(["tula", *sys.argv[1:]]) if Path(sys.argv[0]).name == "tula" else " ".join(sys.argv)


def check_out_dir(path: Path, what: str = "--out") -> Path:
    """``path`` may be used as an output directory (it may not exist yet)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise RunDirError(f"{what} {str(p)!r} is a file, not a directory; give a directory for the run's records")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise RunDirError(f"{what} {str(p)!r} cannot be created: {str(parent)!r} is a file")
            if not os.access(parent, os.W_OK):
                raise RunDirError(f"{what} {str(p)!r} cannot be created: {str(parent)!r} is not writable")
            break
    return p


def check_out_file(path: Path, force: bool, what: str = "--out") -> Path:
    """``path`` may be written as a record: not a directory, its folder can exist, and it is
    not an existing file unless ``force``."""
    p = Path(path)
    if p.is_dir():
        raise RunDirError(f"{what} {str(p)!r} is a directory; give the path of the JSON file to write")
    check_out_dir(p.parent, what=f"{what}'s folder")
    if p.exists() and not force:
        raise RunDirError(
            f"{str(p)!r} already exists and was not written by this command; pass --force to "
            "overwrite it, or choose another --out"
        )
    return p


@contextlib.contextmanager
def locked(directory: Path, on_stale: Callable[[dict], None] | None = None) -> Iterator[Path]:
    """Hold ``directory``'s lock for the block (creating the directory).  A directory
    locked by another live process is one sentence naming that run; a lock left by a
    dead process is taken over (``on_stale(info)`` is told)."""
    d = check_out_dir(Path(directory))
    created = [q for q in (d, *d.parents) if not q.exists()]  # what this lock creates, innermost first
    d.mkdir(parents=True, exist_ok=True)
    key = str(d.resolve())
    if key in _held:
        _held[key][1] += 1
        try:
            yield d
        finally:
            _held[key][1] -= 1
        return
    path = d / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        info = _read_info(fd)
        os.close(fd)
        who = (
            f"pid {info.get('pid')} on {info.get('host')}, `{info.get('command')}`, since {info.get('started')}"
            if info
            else "another process"
        )
        raise RunDirError(
            f"{str(d)!r} is in use by another Tula run ({who}); wait for it to finish or choose another --out"
        ) from None
    stale = _read_info(fd)
    if stale and on_stale is not None:
        on_stale(stale)
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command_line(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    _held[key] = [fd, 1]
    try:
        yield d
    finally:
        _held.pop(key, None)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        if created and [q.name for q in d.iterdir()] == [LOCK]:
            # a command that failed before writing anything leaves no directory behind
            with contextlib.suppress(OSError):
                path.unlink()
                for q in created:
                    q.rmdir()
        with contextlib.suppress(OSError):
            os.close(fd)  # releases the flock


def _read_info(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0)
        return json.loads(raw) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
