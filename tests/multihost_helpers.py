"""What the tests across emulated hosts share (test_multihost.py, test_multihost_timed.py):
their job's spec, and ``tula`` commands run on the head host against the hosts' Dask
scheduler.  The hosts themselves are conftest's ``hosts`` fixture, one set per module."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from helpers import train_args, tula_cmd

HERE = Path(__file__).resolve().parent
#: the tests' folder on the import path of the commands and of the Dask workers (tests/workers.py's models)
TESTS_ON_PATH = {"PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}


def spec_file(tmp_path: Path, name: str = "mh", **over) -> Path:
    """The tests' job across hosts written to ``tmp_path / NAME.yaml``: SmallCNN on digits,
    trials on 1 and 2 workers, and the cluster's deadlines short (pg_timeout_s 10 s,
    heartbeat_timeout_s 6 s) for the tests that wait them out.  ``over``: sections replaced,
    or merged where both are mappings."""
    d = {
        "name": name,
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
        "data": {"name": "digits"},
        "epochs": 2,
        "seed": 0,
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 64},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0},
        "train": {"method": "lbt", "warmup_epochs": 0},
        "cluster": {"pg_timeout_s": 10, "connect_timeout_s": 10, "heartbeat_timeout_s": 6},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def tula_on(h, *args, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """``tula ARGS`` run on the head host (inside its namespace), as helpers.run_tula runs it here."""
    return h.run([*tula_cmd(), *map(str, args)], timeout=timeout, **kw)


def profile_on(h, spec: Path, out: Path) -> subprocess.CompletedProcess:
    """``tula profile SPEC --search full`` on the head host, on the hosts' Dask scheduler."""
    return tula_on(h, "profile", spec, "--search", "full", "--out", out, "--cluster", h.scheduler_address)


def train_args_on(h, spec: Path, out: Path, *more, workers: int = 2, batch: int = 32) -> list:
    """The arguments of ``tula train`` (the spec's method) on the hosts' Dask scheduler."""
    return train_args(spec, out, "--cluster", h.scheduler_address, *more, method=None, workers=workers, batch=batch)


def params_of(run_dir: Path) -> dict:
    from tula.engine.checkpoint import load_checkpoint

    return load_checkpoint(run_dir)["model"]
