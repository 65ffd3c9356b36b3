"""What running on Dask costs: the same profile and the same 2-rank training through the local
launcher and through a Dask LocalCluster, interleaved in one run.

Prints, per launcher: world start-up seconds (call to the first line of the rank function),
the profiled step time of each trial, and the trained step time (median epoch time after the
first epoch / steps per epoch); the ratios Dask/local; and the seconds from a lost Dask
worker (its process killed mid-training) to the error, against the configured
process-group timeout.  Targets (issue #8): step-time ratio Dask/local >= 0.97 (Dask adds
nothing per step; a ratio above 1 means Dask was faster), lost worker -> error within the
timeout + 5 s.

    python bench/cluster_overhead.py [--rounds 3] [--epochs 4]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import dask
from distributed import Client, LocalCluster

from tula.core.errors import WorkerError
from tula.core.records import TrainRecord
from tula.core.spec import spec_from_dict
from tula.engine.launch import Launcher, LocalLauncher
from tula.engine.launch.clusters import WORKER_CONFIG
from tula.engine.launch.dask import DaskLauncher
from tula.engine.profile import profile
from tula.engine.train import train

SPEC = {
    "name": "overhead",
    "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 16}},
    "data": {"name": "digits"},
    "search": {"cluster_sizes": [1, 2], "min_batch": 32, "max_batch": 512},
    "profile": {"warmup_steps": 3, "timed_steps": 10, "threads_per_worker": 1},
    "train": {"warmup_epochs": 0},
}


def stamp(ctx) -> float:
    """The wall clock when a rank's function starts (the world is up)."""
    return time.time()


def startup_s(launcher: Launcher) -> float:
    t0 = time.time()
    # a local rank (forked from the fork server) finds the function by its module's name, not in
    # __main__; Dask's workers take __main__'s function by value (cloudpickle), as they always did
    fn = stamp if isinstance(launcher, DaskLauncher) else importlib.import_module("cluster_overhead").stamp
    started = launcher.run(fn, 2)
    return max(started) - t0


def trained_step_s(run: TrainRecord) -> float:
    epochs = run.history[1:] or run.history
    return statistics.median(h.epoch_time_s for h in epochs) / run.steps_per_epoch


def lost_worker_s(client: Client, spec, out: Path, pg_timeout_s: float) -> tuple[float, str]:
    """Train on Dask, kill one worker process after the first epoch; seconds to the error."""
    launcher = DaskLauncher(client, device="cpu", threads_per_worker=1, pg_timeout_s=pg_timeout_s)
    result: dict = {}

    def run() -> None:
        try:
            train(spec, "lbt", 2, 64, out, launcher=launcher)
            result["error"] = None
        except WorkerError as err:
            result["error"], result["at"] = err, time.monotonic()

    th = threading.Thread(target=run)
    th.start()
    while not (out / "checkpoint.pt").exists():
        time.sleep(0.05)
    victim = sorted(launcher.workers())[-1]
    pid = client.run(os.getpid, workers=[victim])[victim]
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    th.join(timeout=600)
    if result.get("error") is None:
        return float("nan"), "the run finished before the worker was lost"
    return result["at"] - killed_at, str(result["error"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--pg-timeout", type=float, default=20.0)
    args = ap.parse_args()
    spec = spec_from_dict({**SPEC, "epochs": args.epochs})
    dask.config.set(WORKER_CONFIG)
    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    )
    client = Client(cluster)
    launchers: dict[str, Launcher] = {
        "local": LocalLauncher(device="cpu", threads_per_worker=1),
        "dask": DaskLauncher(client, device="cpu", threads_per_worker=1, pg_timeout_s=args.pg_timeout),
    }
    startup: dict[str, list[float]] = {k: [] for k in launchers}
    trained: dict[str, list[float]] = {k: [] for k in launchers}
    profiled: dict[str, dict[tuple, list[float]]] = {k: {} for k in launchers}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(launchers) if r % 2 == 0 else list(reversed(launchers))  # interleaved
            for name in order:
                launcher = launchers[name]
                startup[name].append(startup_s(launcher))
                prof = profile(spec, "partial", launcher=launcher)
                for t in prof.trials:
                    if t.status == "ok" and t.t_step_s is not None:
                        profiled[name].setdefault((t.n_workers, t.global_batch), []).append(t.t_step_s)
                run = train(spec, "lbt", 2, 128, Path(tmp) / f"{name}{r}", launcher=launcher)
                trained[name].append(trained_step_s(run))
                print(
                    f"round {r + 1} {name:5s}: start-up {startup[name][-1]:.2f} s, trained step "
                    f"{1e3 * trained[name][-1]:.2f} ms",
                    flush=True,
                )
        lost_s, sentence = lost_worker_s(
            client, spec_from_dict({**SPEC, "epochs": 200}), Path(tmp) / "lost", args.pg_timeout
        )
    client.close()
    cluster.close()

    med = statistics.median
    print(f"\nmachine: {os.cpu_count()} cores; {args.rounds} interleaved rounds; medians")
    print(f"{'':28s} {'local':>10s} {'dask':>10s} {'dask/local':>11s}")
    print(
        f"{'world start-up (s)':28s} {med(startup['local']):10.2f} {med(startup['dask']):10.2f} "
        f"{med(startup['dask']) / med(startup['local']):11.2f}"
    )
    for key in sorted(profiled["local"]):
        loc, dk = med(profiled["local"][key]), med(profiled["dask"].get(key, [float("nan")]))
        print(
            f"{f'profiled t_step N={key[0]} B={key[1]} (ms)':28s} {1e3 * loc:10.2f} {1e3 * dk:10.2f} "
            f"{loc / dk:11.3f}  (step-time ratio as speed: local/dask)"
        )
    loc, dk = med(trained["local"]), med(trained["dask"])
    print(
        f"{'trained step N=2 B=128 (ms)':28s} {1e3 * loc:10.2f} {1e3 * dk:10.2f} {loc / dk:11.3f}  "
        f"(target >= 0.97: {'met' if loc / dk >= 0.97 else 'MISSED'})"
    )
    ok = lost_s <= args.pg_timeout + 5
    print(
        f"lost worker -> error: {lost_s:.1f} s (timeout {args.pg_timeout:.0f} s; target <= "
        f"{args.pg_timeout + 5:.0f} s: {'met' if ok else 'MISSED'})\n  {sentence}"
    )


if __name__ == "__main__":
    main()
