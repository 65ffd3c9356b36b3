"""Where generated data sets are cached between worlds and runs (MNIST-1D's arrays, the
text corpus): one place, imported by the modules that make them."""

from __future__ import annotations

import os
from pathlib import Path


def data_cache_dir() -> Path:
    """Where generated data sets are kept between worlds and runs: ``$TULA_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/tula``, else ``~/.cache/tula``."""
    if os.environ.get("TULA_CACHE_DIR"):
        return Path(os.environ["TULA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tula"
