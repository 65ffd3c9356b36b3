"""Where generated data sets are cached between worlds and runs (MNIST-1D's arrays, the
text corpus): one place, imported by the modules that make them."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def data_cache_dir() -> Path:
    """Where generated data sets are kept between worlds and runs: ``$TULA_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/tula``, else ``~/.cache/tula``."""
    if os.environ.get("TULA_CACHE_DIR"):
        return Path(os.environ["TULA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tula"


def write_cache_file(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write(file)`` into ``path`` whole or not at all: a temporary file renamed, since the ranks
    of one world may write the same file at once.  A cache that cannot be written is skipped, and
    nothing half-written is left, also after Ctrl-C."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
