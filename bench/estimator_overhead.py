"""What the scikit-learn front costs: the same training through ``TulaClassifier.fit`` and
through ``tula train``, interleaved, as a user runs them (a fresh Python process each, so
both pay the interpreter start and the imports).

Same model (Tula's ``small_cnn``, width 32), same data sizes (scikit-learn's digits as 1x8x8
images, normalised as Tula's ``digits`` set: 1438 samples trained on, 359 scored after every
epoch -- the CLI's 20 % test split, the estimator's ``validation_fraction=0.2``), same method
(``lbt``, SGD at LR 0.05), epochs, N, B and torch threads per rank (1: on a machine shared
with other work, a rank's second thread waits on descheduled peers and the times scatter).  Per configuration and repeat it prints the
wall seconds of each command and, inside them, the seconds of ``fit`` and the runner's
``train_s``; then the median ratio estimator / CLI.  Target (issue #11): <= 1.05.

With N = 1 the estimator runs its world in its own process (``LocalLauncher(in_process=True)``)
while ``tula train`` starts a rank process; with N = 2 both start two.

    python bench/estimator_overhead.py [--repeats 3] [--epochs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

ESTIMATOR = r"""
import sys, time
import numpy as np
from sklearn.datasets import load_digits
from tula.sklearn import TulaClassifier
epochs, n, b = map(int, sys.argv[1:4])
X, y = load_digits(return_X_y=True)
X = X.astype(np.float32) / 16.0
X = ((X - X.mean()) / X.std()).reshape(-1, 1, 8, 8)  # as Tula's digits set
est = TulaClassifier(module="small_cnn", module__width=32, method="lbt", optimizer="sgd", lr=0.05, max_epochs=epochs,
                     batch_size=b, n_workers=n, device="cpu", validation_fraction=0.2, random_state=0,
                     threads_per_worker=1)
t0 = time.perf_counter()
est.fit(X, y)
fit_s = time.perf_counter() - t0
rec = est.train_record_
assert rec["steps_per_epoch"] == 1438 // b, rec["steps_per_epoch"]
print("RESULT", fit_s, rec["train_s"], est.history_[-1]["test_top1"])
"""


def spec_for(epochs: int, n: int) -> dict:
    return {
        "name": "estimator-overhead",
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "width": 32, "num_classes": 10}},
        "data": {"name": "digits"},
        "epochs": epochs,
        "seed": 0,
        "optimizer": {"name": "sgd", "lr": 0.05},
        "train": {"method": "lbt"},
        "search": {"cluster_sizes": [n]},
        "profile": {"device": "cpu", "threads_per_worker": 1},
    }


def run_estimator(epochs: int, n: int, b: int, env: dict) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", ESTIMATOR, str(epochs), str(n), str(b)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    wall = time.perf_counter() - t0
    line = next(s for s in out.stdout.splitlines() if s.startswith("RESULT"))
    fit_s, train_s, top1 = map(float, line.split()[1:])
    return {"wall_s": wall, "inner_s": fit_s, "train_s": train_s, "top1": top1}


def run_cli(epochs: int, n: int, b: int, env: dict, work: Path) -> dict:
    spec = work / f"spec-{n}.yaml"
    spec.write_text(yaml.safe_dump(spec_for(epochs, n)))
    out_dir = Path(tempfile.mkdtemp(dir=work))
    tula = Path(sys.executable).parent / "tula"
    cmd = [str(tula)] if tula.exists() else [sys.executable, "-m", "tula.cli"]
    t0 = time.perf_counter()
    subprocess.run(
        [
            *cmd,
            "train",
            str(spec),
            "--workers",
            str(n),
            "--batch",
            str(b),
            "--method",
            "lbt",
            "--out",
            str(out_dir / "run"),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    wall = time.perf_counter() - t0
    rec = json.loads((out_dir / "run" / "train.json").read_text())
    return {"wall_s": wall, "inner_s": rec["train_s"], "train_s": rec["train_s"], "top1": rec["final"]["test_top1"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--configs", default="1x64,2x128", help="N x B pairs")
    args = ap.parse_args()
    configs = [(int(n), int(b)) for n, b in (c.split("x") for c in args.configs.split(","))]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}  {os.cpu_count()} cores  Python "
        f"{platform.python_version()}  epochs {args.epochs}, repeats {args.repeats}"
    )
    rows: dict[tuple[int, int], dict[str, list[dict]]] = {c: {"estimator": [], "cli": []} for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for n, b in configs:
                order = ("estimator", "cli") if r % 2 == 0 else ("cli", "estimator")  # interleaved, alternating
                for who in order:
                    res = (
                        run_estimator(args.epochs, n, b, env)
                        if who == "estimator"
                        else run_cli(args.epochs, n, b, env, Path(tmp))
                    )
                    rows[(n, b)][who].append(res)
                    print(
                        f"  repeat {r + 1}  N={n} B={b:<4} {who:<9}  wall {res['wall_s']:6.2f} s  inside "
                        f"{res['inner_s']:6.2f} s  runner train_s {res['train_s']:6.2f} s  top-1 {res['top1']:.3f}",
                        flush=True,
                    )
    print()
    print("medians (and minima) over the repeats, seconds")
    print(
        f"{'N':>2} {'B':>4}  {'estimator wall':>15}  {'tula train wall':>15}  {'ratio':>13}  "
        f"{'runner train_s ratio':>20}"
    )
    for (n, b), d in rows.items():
        we, wc = ([x["wall_s"] for x in d[who]] for who in ("estimator", "cli"))
        te, tc = ([x["train_s"] for x in d[who]] for who in ("estimator", "cli"))
        med, lo = statistics.median, min
        print(
            f"{n:>2} {b:>4}  {med(we):6.2f} ({lo(we):5.2f})  {med(wc):6.2f} ({lo(wc):5.2f})  "
            f"{med(we) / med(wc):5.3f} ({lo(we) / lo(wc):5.3f})  {med(te) / med(tc):11.3f} ({lo(te) / lo(tc):5.3f})"
        )
    print("target: wall-time ratio estimator / tula train <= 1.05")


if __name__ == "__main__":
    main()
