"""The data path on an ImageFolder of JPEGs: the old per-sample path vs the DataLoader path.

Generates an ImageFolder of ``--classes`` x ``--per-class`` JPEGs of ``--size`` pixels
under a temporary directory (smooth random colour fields with noise, quality 90), then
trains on it with Tula's real runner (:func:`tula.engine.train.train`, gloo DDP, augmentation
on: random crop with padding 4 and horizontal flip, normalisation), side by side:

* ``per-sample``: ``data.loader_workers = 0``, every sample decoded in the rank's own
  process between steps (the path Tula had before: ``ds[i]`` per index on the main thread);
* ``loader``: ``data.loader_workers = --workers`` DataLoader processes per rank, prefetching
  while the step computes.

Each (cluster size, path) is trained ``--repeats`` times, interleaved (the order of the
paths alternates between repeats); a run's steps per second is the median over its
epochs after the first (the first includes starting the loader), and the figure is the
median over runs.  Then :func:`tula.engine.profile.profile` at the same N and B on the same data
(``--profile-repeats`` times per path, interleaved) gives the profiled ``t_step`` and the
loader's wait ``t_data``, compared with the trained step time (1 / steps per second).

First (``decode`` part), the data path alone in this process, no model: batches of 32
per second through the per-sample path and through a DataLoader with 1 and ``--workers``
workers (the ceiling the loader can reach on this machine's cores).

Models (``--models``): tula's ``small_cnn`` (width 4, 3x64x64 inputs; decoding its
local batch of 32 is about a fifth of a step on one CPU thread) and ``mlp`` (hidden 128:
almost no compute, so decoding is most of the step -- the case where the data path
matters most).  Every rank runs 1 torch thread (the default for N = 2 on 2 cores, set for
N = 1 too so both sizes compute alike).

    .venv/bin/python bench/data_path.py             # ~12 min on 2 cores
    .venv/bin/python bench/data_path.py --quick     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tula.core.spec import spec_from_dict
from tula.engine.launch import LocalLauncher
from tula.engine.profile import profile
from tula.engine.train import train


def make_images(root: Path, classes: int, per_class: int, size: int, seed: int = 0) -> Path:
    """An ImageFolder of JPEGs: per image an upsampled 8x8 random colour field plus noise."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        d = root / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            field = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize(
                (size, size), Image.Resampling.BILINEAR
            )
            img = np.asarray(field).astype(np.int16) + rng.integers(-24, 25, (size, size, 3))
            Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(d / f"{i:05d}.jpg", quality=90)
    return root


def model_for(name: str, classes: int, size: int) -> dict:
    if name == "mlp":
        return {"name": "mlp", "kwargs": {"in_features": 3 * size * size, "hidden": 128, "num_classes": classes}}
    return {"name": "small_cnn", "kwargs": {"in_channels": 3, "num_classes": classes, "width": 4}}


def spec_for(root: Path, workers: int, n: int, batch: int, model: dict, epochs: int) -> dict:
    return {
        "name": f"data-path-w{workers}-n{n}",
        "seed": 0,
        "epochs": epochs,
        "model": model,
        "data": {"name": "imagefolder", "root": str(root), "augment": True, "loader_workers": workers},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "search": {"cluster_sizes": [n], "min_batch": batch, "max_batch": batch},
        "profile": {"threads_per_worker": 1},
        "train": {"warmup_epochs": 0},
    }


def train_once(d: dict, n: int, batch: int, out: Path) -> dict:
    t0 = time.perf_counter()
    run = train(spec_from_dict(d), "lbt", n, batch, out, launcher=LocalLauncher(device="cpu", threads_per_worker=1))
    hist = run.history
    measured = hist[1:] or hist
    sps = [h.steps / h.epoch_time_s for h in measured]
    return {
        "steps_per_s": statistics.median(sps),
        "epoch_steps_per_s": sps,
        "first_epoch_s": hist[0].epoch_time_s,
        "steps_per_epoch": run.steps_per_epoch,
        "test_top1": hist[-1].test_top1,
        "wall_s": time.perf_counter() - t0,
    }


def profile_once(d: dict) -> dict:
    rec = profile(spec_from_dict(d), launcher=LocalLauncher(device="cpu", threads_per_worker=1))
    t = next(t for t in rec.trials if t.status == "ok")
    return {
        "t_step_s": t.t_step_s,
        "t_compute_s": t.t_compute_s,
        "t_data_s": t.t_data_s,
        "note": t.note,
        "profiling_s": rec.profiling_s,
    }


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decode_rate(
    root: Path, workers: int, batch: int = 32, n_batches: int = 60, repeats: int = 3
) -> tuple[float, float]:
    """Batches per second of the data path alone (augmentation on), in this process, and
    the CPU seconds per batch it took (this process and the loader's workers)."""
    from tula.engine.data import DataPath, epoch_order
    from tula.engine.workloads import load_dataset

    data = load_dataset(spec_from_dict(spec_for(root, workers, 1, batch, model_for("mlp", 10, 64), 1)).data, 0)
    rates, cpus = [], []
    n_batches = min(n_batches, data.train_size // batch - 1)
    with DataPath(data, "cpu", workers=workers) as path:
        for e in range(repeats):
            it = path.epoch_batches(e, epoch_order(0, e, data.train_size), batch, 0, batch, n_batches + 1)
            next(it)  # the stream is running (workers started, prefetching)
            pids = path.worker_pids
            c0 = time.process_time() + sum(_cpu_s(p) for p in pids)
            t0 = time.perf_counter()
            for _ in it:
                pass
            rates.append(n_batches / (time.perf_counter() - t0))
            cpus.append((time.process_time() + sum(_cpu_s(p) for p in pids) - c0) / n_batches)
    return statistics.median(rates), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--per-class", type=int, default=240)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--models", default="small_cnn,mlp")
    ap.add_argument("--workers", type=int, default=2, help="loader workers per rank of the loader path")
    ap.add_argument("--sizes", default="2,1", help="cluster sizes to train at")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/data_path"))
    ap.add_argument("--parts", default="decode,train,profile", help="which parts to run")
    ap.add_argument("--quick", action="store_true", help="a smoke run: few images, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.per_class, args.epochs, args.repeats, args.profile_repeats = 40, 2, 1, 1
    sizes = [int(s) for s in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    paths = {"per-sample": 0, "loader": args.workers}
    models = args.models.split(",")
    runs: dict[tuple[str, int, str], list[dict]] = {}
    profiles: dict[tuple[str, str], list[dict]] = {}
    n_prof = max(sizes)
    with tempfile.TemporaryDirectory(prefix="tula-data-path-") as tmp:
        t0 = time.perf_counter()
        root = make_images(Path(tmp) / "images", args.classes, args.per_class, args.size)
        print(f"{args.classes * args.per_class} JPEGs of {args.size}x{args.size} in {time.perf_counter() - t0:.1f} s")
        parts = args.parts.split(",")
        decode: dict = {}
        if "decode" in parts:
            torch.set_num_threads(1)
            for rep in range(2):
                for w in [0, 1, args.workers] if rep == 0 else [args.workers, 1, 0]:
                    decode.setdefault(f"workers={w}", []).append(decode_rate(root, w))
            decode = {
                k: {
                    "batches_per_s": statistics.median(r for r, _ in v),
                    "cpu_ms_per_batch": 1e3 * statistics.median(c for _, c in v),
                }
                for k, v in decode.items()
            }
            print(
                f"data path alone (load {os.getloadavg()[0]:.1f}), batches of 32 per second (CPU ms per batch): "
                + ", ".join(f"{k} {v['batches_per_s']:.1f} ({v['cpu_ms_per_batch']:.1f})" for k, v in decode.items()),
                flush=True,
            )
        k = 0
        for rep in range(args.repeats if "train" in parts else 0):
            for m in models:
                for n in sizes:
                    order = list(paths) if (rep + k) % 2 == 0 else list(reversed(paths))
                    for name in order:
                        d = spec_for(
                            root, paths[name], n, args.batch, model_for(m, args.classes, args.size), args.epochs
                        )
                        r = train_once(d, n, args.batch, Path(tmp) / f"run{k}")
                        k += 1
                        runs.setdefault((m, n, name), []).append(r)
                        print(
                            f"train   {m:9s} N={n} {name:10s} rep {rep}: {r['steps_per_s']:.2f} steps/s (epochs "
                            f"{', '.join(f'{s:.2f}' for s in r['epoch_steps_per_s'])}; first epoch "
                            f"{r['first_epoch_s']:.1f} s; load {os.getloadavg()[0]:.1f})",
                            flush=True,
                        )
        for rep in range(args.profile_repeats if "profile" in parts else 0):
            for m in models:
                order = list(paths) if rep % 2 == 0 else list(reversed(paths))
                for name in order:
                    d = spec_for(
                        root, paths[name], n_prof, args.batch, model_for(m, args.classes, args.size), args.epochs
                    )
                    p = profile_once(d)
                    profiles.setdefault((m, name), []).append(p)
                    print(
                        f"profile {m:9s} N={n_prof} {name:10s} rep {rep}: t_step {1e3 * p['t_step_s']:.1f} ms, "
                        f"t_data {1e3 * (p['t_data_s'] or 0):.1f} ms  {p['note']}",
                        flush=True,
                    )

    med = {key: statistics.median(r["steps_per_s"] for r in rs) for key, rs in runs.items()}
    print(
        f"\nB = {args.batch}, {args.classes * args.per_class} JPEGs {args.size}x{args.size} (80 % train), "
        f"augmentation on, {args.repeats} runs each (median), {os.cpu_count()} cores, torch {torch.__version__}"
    )
    print(f"| model | N | per-sample steps/s | loader steps/s ({args.workers} workers/rank) | speed-up |")
    print("|---|---:|---:|---:|---:|")
    summary: dict = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "runs": {f"{m}-N{n}-{name}": rs for (m, n, name), rs in runs.items()},
        "profiles": {f"{m}-{name}": ps for (m, name), ps in profiles.items()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    summary["decode_batches_per_s"] = decode
    for m in models:
        for n in sizes:
            if (m, n, "loader") not in med:
                continue
            a, b = med[m, n, "per-sample"], med[m, n, "loader"]
            print(f"| {m} | {n} | {a:.2f} | {b:.2f} | {b / a:.2f}x |")
            summary[f"speedup_{m}_N{n}"] = b / a
    print(f"\nprofiled vs trained step time at N = {n_prof}, B = {args.batch}:")
    print("| model | path | profiled t_step | profiled t_data (share) | trained step | profiled / trained |")
    print("|---|---|---:|---:|---:|---:|")
    for m in models:
        for name in paths:
            ps = profiles.get((m, name), [])
            if not ps:
                continue
            t_prof = statistics.median(p["t_step_s"] for p in ps)
            t_data = statistics.median(p["t_data_s"] or 0.0 for p in ps)
            if (m, n_prof, name) not in med:
                continue
            t_train = 1.0 / med[m, n_prof, name]
            summary[f"profiled_over_trained_{m}_{name}"] = t_prof / t_train
            print(
                f"| {m} | {name} | {1e3 * t_prof:.1f} ms | {1e3 * t_data:.1f} ms ({100 * t_data / t_prof:.0f} %) | "
                f"{1e3 * t_train:.1f} ms | {t_prof / t_train:.2f} |"
            )
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))
    print(f"\nraw records: {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
