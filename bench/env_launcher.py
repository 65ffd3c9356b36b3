"""The overhead of ``--cluster env`` against the local launcher (issue #18; target: at least
0.97 of the local launcher's speed).

The same training job -- ``small_cnn`` width 16 on digits, 2 ranks, global batch 64, 1 torch
thread per rank -- trained by ``tula train`` on the local launcher and by ``torchrun
--nproc-per-node 2 -m tula train ... --cluster env``, interleaved (local, env, local, env, ...)
so that drifts of this shared machine hit both alike.  Speed is compared on the median
epoch time (the slowest rank's, from ``train.json``), epochs after the first (which holds
DDP's bucket rebuild and the first-touch of the data); the command's whole wall time (start-up
included: torchrun starts two interpreters, the local launcher spawns two) is shown beside it.

Run:  .venv/bin/python bench/env_launcher.py [--repeats 3] [--epochs 6]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BIN = Path(sys.executable).parent
SPEC = {
    "name": "env-bench",
    "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 16}},
    "data": {"name": "digits"},
    "profile": {"threads_per_worker": 1},
    "train": {"method": "lbt", "warmup_epochs": 0},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(kind: str, spec: Path, out: Path) -> tuple[float, float]:
    """(median epoch time after the first, wall seconds) of one training run."""
    args = ["train", str(spec), "--batch", "64", "--out", str(out)]
    if kind == "local":
        cmd = [str(BIN / "tula"), *args, "--workers", "2"]
    else:
        cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(_port()), "-m", "tula", *args]
        cmd += ["--cluster", "env"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{kind} run failed ({r.returncode}): {r.stderr[-2000:]}")
    history = json.loads((out / "train.json").read_text())["history"]
    return statistics.median(h["epoch_time_s"] for h in history[1:]), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    args = ap.parse_args()
    print(
        f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.machine()}, {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.1f}; {args.repeats} interleaved runs each, {args.epochs} epochs"
    )
    results: dict[str, list[tuple[float, float]]] = {"local": [], "env": []}
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(yaml.safe_dump({**SPEC, "epochs": args.epochs}))
        for i in range(args.repeats):
            for kind in ("local", "env") if i % 2 == 0 else ("env", "local"):
                epoch_s, wall = run_once(kind, spec, Path(tmp) / f"{kind}-{i}")
                results[kind].append((epoch_s, wall))
                print(f"  run {i + 1} {kind:5s}: median epoch {1e3 * epoch_s:7.1f} ms, wall {wall:5.1f} s", flush=True)
    local_epoch = statistics.median(e for e, _ in results["local"])
    env_epoch = statistics.median(e for e, _ in results["env"])
    local_wall = statistics.median(w for _, w in results["local"])
    env_wall = statistics.median(w for _, w in results["env"])
    speed = local_epoch / env_epoch
    print("| launcher | median epoch (ms) | median wall (s) |")
    print("|---|---:|---:|")
    print(f"| local | {1e3 * local_epoch:.1f} | {local_wall:.1f} |")
    print(f"| env (torchrun) | {1e3 * env_epoch:.1f} | {env_wall:.1f} |")
    verdict = "met" if speed >= 0.97 else "missed"
    print(f"env's speed / local's (epoch time): {speed:.3f} -- target >= 0.97 {verdict}")


if __name__ == "__main__":
    main()
