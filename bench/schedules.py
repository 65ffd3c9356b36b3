"""Growing batch schedules vs constant batches (issue #9; the AdaDamp paper's question).

For each data set and seed, the same epoch budget with plain SGD (``lbt``): a constant small
batch (the reference), a constant large batch, and the growing schedules -- geometric,
increase_instead_of_decay, loss_ratio, adaptive -- with workers growing from 1 to 2 here
(``batch_per_worker``).  Prints final test accuracy (mean ± std over seeds), model updates,
measured wall time, and the wall time the fitted performance model (a partial profile of
the same model, ring all-reduce) predicts for the same sequence of batches with workers
growing up to 64.  Then the seconds a resize costs (a world's start: the checkpoint is
already written) on the local launcher and on a Dask LocalCluster.

Target (issue #9): at least one growing schedule within 0.5 points of the small-batch
reference's accuracy with at least 2x fewer model updates.

    python bench/schedules.py [--datasets digits mnist1d] [--seeds 3] [--epochs 20]
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import tempfile
import time
from pathlib import Path

from tula.core.fit import fit_models
from tula.core.records import EpochRecord
from tula.core.spec import spec_from_dict
from tula.engine.launch import Launcher, LocalLauncher
from tula.engine.profile import profile
from tula.engine.train import train

B_SMALL, B_LARGE, PER_WORKER, MAX_SIM_WORKERS = 32, 512, 128, 64

DATA = {
    "digits": {
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 16}},
        "data": {"name": "digits"},
    },
    "mnist1d": {
        "model": {"name": "small_cnn1d", "kwargs": {"width": 16}},
        "data": {"name": "mnist1d", "num_samples": 4000},
    },
}


def schedules(epochs: int) -> dict[str, dict]:
    """name -> (first batch, train section) of each contender."""
    grow = {"workers": {"min": 1, "max": 2, "batch_per_worker": PER_WORKER}}
    third = max(1, epochs // 3)
    return {
        "constant small (reference)": {"batch": B_SMALL, "train": {}},
        "constant large": {"batch": B_LARGE, "train": {"workers": {"min": 2, "max": 2}}},
        "geometric": {
            "batch": B_SMALL,
            "train": {"batch_schedule": {"kind": "geometric", "factor": 2, "delay": max(1, epochs // 5)}, **grow},
        },
        "increase_instead_of_decay": {
            "batch": B_SMALL,
            "train": {
                "batch_schedule": {"kind": "increase_instead_of_decay"},
                "lr_milestones": [third, 2 * third],
                "lr_gamma": 0.25,
                **grow,
            },
        },
        "loss_ratio": {
            "batch": B_SMALL,
            "train": {"batch_schedule": {"kind": "loss_ratio", "max_batch": 1024}, **grow},
        },
        "adaptive": {
            "batch": B_SMALL,
            "train": {
                "batch_schedule": {"kind": "adaptive", "max_growth": 2.0, "max_batch": 1024},
                "workers": {"min": 2, "max": 2},
            },
        },
    }


def predicted_s(perf, history: list[EpochRecord], dataset_size: int) -> float:
    """Wall time the performance model predicts for the run's batch sequence with workers
    growing as ceil(B / batch_per_worker), up to 64 (steps and t_step from the model)."""
    total = 0.0
    for h in history:
        big_b = h.global_batch
        n = min(MAX_SIM_WORKERS, max(1, math.ceil(big_b / PER_WORKER)))
        total += (dataset_size // big_b) * float(perf.t_step_s(big_b / n, n))
    return total


def stamp(ctx) -> float:
    return time.time()


def resize_cost_s(launcher: Launcher, n: int = 2, repeats: int = 3) -> float:
    """A new world's start: what a resize costs beyond writing the checkpoint."""
    # a local rank (forked from the fork server) finds the function by its module's name, not in
    # __main__; Dask's workers take __main__'s function by value (cloudpickle), as they always did
    fn = importlib.import_module("schedules").stamp if isinstance(launcher, LocalLauncher) else stamp
    costs = []
    for _ in range(repeats):
        t0 = time.time()
        costs.append(max(launcher.run(fn, n)) - t0)
    return statistics.median(costs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", nargs="+", default=["digits", "mnist1d"], choices=sorted(DATA))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args()
    launcher = LocalLauncher(device="cpu", threads_per_worker=1)
    for name in args.datasets:
        base = {
            "name": f"sched-{name}",
            **DATA[name],
            "epochs": args.epochs,
            "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
            "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 1024},
            "profile": {"warmup_steps": 2, "timed_steps": 6, "threads_per_worker": 1},
        }
        models = fit_models(profile(spec_from_dict(base), "partial", launcher=launcher))
        perf, size = models.perf, models.dataset_size
        rows: dict[str, list[dict]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for seed in range(args.seeds):
                for label, c in schedules(args.epochs).items():
                    t = {"warmup_epochs": 0, **c["train"]}
                    spec = spec_from_dict({**base, "seed": seed, "train": t})
                    n0 = t.get("workers", {}).get("min", 1)
                    run = train(
                        spec, "lbt", n0, c["batch"], Path(tmp) / f"{label}-{seed}".replace(" ", "_"), launcher=launcher
                    )
                    top1 = run.history[-1].test_top1
                    if top1 is None:
                        raise SystemExit(f"{label}: the run's last epoch has no top-1 accuracy")
                    rows.setdefault(label, []).append(
                        {
                            "top1": 100 * top1,
                            "updates": run.steps_done,
                            "wall_s": run.train_s,
                            "pred_s": predicted_s(perf, run.history, size),
                            "batches": [h.global_batch for h in run.history],
                            "workers": [h.n_workers for h in run.history],
                        }
                    )
                    print(
                        f"{name} seed {seed} {label:28s} top-1 {rows[label][-1]['top1']:.2f} updates "
                        f"{run.steps_done} batches {rows[label][-1]['batches']}",
                        flush=True,
                    )
        ref = rows["constant small (reference)"]
        ref_top1, ref_updates = statistics.mean(r["top1"] for r in ref), statistics.mean(r["updates"] for r in ref)
        print(f"\n{name}: {args.epochs} epochs, {args.seeds} seed(s), lbt (SGD lr 0.05, momentum 0.9)")
        print(
            f"{'schedule':28s} {'top-1 %':>14s} {'updates':>8s} {'fewer':>6s} {'wall s':>7s} "
            f"{'pred. s (N<=64)':>15s}  verdict"
        )
        for label, rs in rows.items():
            top = [r["top1"] for r in rs]
            mean, std = statistics.mean(top), statistics.stdev(top) if len(top) > 1 else 0.0
            upd = statistics.mean(r["updates"] for r in rs)
            ok = label != "constant small (reference)" and mean >= ref_top1 - 0.5 and ref_updates / upd >= 2
            print(
                f"{label:28s} {mean:8.2f} ± {std:4.2f} {upd:8.0f} {ref_updates / upd:5.1f}x "
                f"{statistics.mean(r['wall_s'] for r in rs):7.1f} {statistics.mean(r['pred_s'] for r in rs):15.2f}"
                f"  {'MEETS the target' if ok else ''}"
            )
    print(f"\nresize cost (a new 2-rank world): local {resize_cost_s(launcher):.2f} s", flush=True)
    try:
        import logging

        import dask
        from distributed import Client, LocalCluster

        from tula.engine.launch.clusters import WORKER_CONFIG
        from tula.engine.launch.dask import DaskLauncher

        dask.config.set(WORKER_CONFIG)
        with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=logging.ERROR
            ) as cluster,
            Client(cluster) as client,
        ):
            print(f"resize cost (a new 2-rank world): Dask {resize_cost_s(DaskLauncher(client, device='cpu')):.2f} s")
    except ImportError as err:  # pragma: no cover
        print(f"no Dask: {err}")


if __name__ == "__main__":
    main()
