import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def tiny_spec_dict():
    """A job small enough for 2-rank trials in a few seconds."""
    return {
        "name": "tiny",
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
        "data": {"name": "digits"},
        "epochs": 2,
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 256},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1},
    }


@pytest.fixture
def tula_cmd():
    exe = Path(sys.executable).parent / "tula"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tula.cli"]
