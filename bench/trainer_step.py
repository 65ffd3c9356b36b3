"""Where a training epoch's steps differ from the run trial's (issue #26), in one rank's process.

The plan predicts a training step as the profile's fitted plain step plus the method's extra,
measured by the run trial (:mod:`tula.engine.run_trial`): the trainer's step and a plain step
side by side, each to a ``synchronize``.  Training runs the same step in its epoch loop, without
a ``synchronize`` per step.  On a GPU the two came apart for small, host-bound steps (ResNet-18
at 32x32: 9 ms predicted, 11 ms trained).  This bench builds the trainer once
(:class:`tula.engine.rank_loop._RankTrainer`) and times, interleaved, per step in ms (median over
rounds):

* ``loop``      : the training loop itself (``run_epoch``: epoch batches, no synchronize per
  step), its mean step (the method's periodic work included: AGS's once an epoch);
* ``synced``    : the same epoch's steps one by one, each to a ``synchronize`` (as the run
  trial): their mean, and their median (without the periodic step);
* ``trial run`` / ``trial due`` / ``trial plain``: :func:`tula.engine.run_trial.run_trial` at
  the same batch, beside the profile's plain step (``tula.engine.profile._Worker``), as the
  profile measures them: the method's regular and due steps and the plain step, medians.

    PYTHONPATH=src python bench/trainer_step.py --model resnet18 --shape 3,32,32 --batch 128
    PYTHONPATH=src python bench/trainer_step.py --dry-run          # the CPU: a tiny model
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "src", ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import torch  # noqa: E402

from tula.core.spec import spec_from_dict  # noqa: E402
from tula.engine.data import data_path, epoch_order  # noqa: E402
from tula.engine.launch import LocalLauncher, WorkerContext  # noqa: E402
from tula.engine.rank_messages import Interrupted  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(ctx: WorkerContext, spec_dict: dict, method: str, global_batch: int, rounds: int) -> dict:
    """Run in the rank: the variants of the module's docstring, ``rounds`` times interleaved."""
    from tula.engine.profile import _Worker
    from tula.engine.rank_loop import _RankTrainer
    from tula.engine.run_trial import RankRunTrial, run_trial

    spec = spec_from_dict(spec_dict)
    out = tempfile.mkdtemp(prefix="tula-trainer-step-")
    rt = _RankTrainer(ctx, spec, method, out, [], None, 1)
    rt.start_at(global_batch, None)
    if rt.probe() is not None:
        return {"status": "oom"}
    w = _Worker(ctx, spec)
    got: dict[str, list[float]] = {k: [] for k in ("loop", "synced", "synced median", "trial run", "trial due",
                                                  "trial plain")}  # fmt: skip
    n = rt.n_steps

    def plain(b: int = global_batch // ctx.world_size) -> None:
        w.load_batch(b)
        w.step(True)

    rt.run_epoch(0)  # warm-up: the first epoch's kernels
    for r in range(rounds):
        ran = rt.run_epoch(1 + 2 * r)
        if isinstance(ran, Interrupted):
            return {"status": "interrupted"}
        got["loop"].append(ran[1] / n)
        perm = epoch_order(spec.seed, 2 + 2 * r, rt.data.train_size)
        batches = data_path(rt.data, ctx.device).epoch_batches(
            2 + 2 * r, perm, rt.global_batch, rt.rank, rt.local_batch, n
        )
        rt.model.train()
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            rt.stepper.train_step(next(batches), (2 + 2 * r) * n + i)
            _sync(ctx.device)
            times.append(time.perf_counter() - t0)
        got["synced"].append(sum(times) / n)
        got["synced median"].append(statistics.median(times))
        t = run_trial(ctx, spec, global_batch, 20, 0.5, plain)
        if not isinstance(t, RankRunTrial):
            return {"status": t.status, "note": t.note}
        regular = [s for s, d in zip(t.step_times_s, t.due) if not d]
        got["trial run"].append(statistics.median(regular))
        got["trial plain"].append(statistics.median(t.plain_step_times_s))
        due = [s for s, d in zip(t.step_times_s, t.due) if d]
        got["trial due"].append(statistics.median(due) if due else 0.0)
    rt.data.close()
    return {"status": "ok", "steps_per_epoch": n, "per_round_s": got}


def _shape(text: str) -> list[int]:
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each dimension must be at least 1")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the CPU: a tiny model, a few rounds")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--shape", default="3,32,32", type=_shape, help="a sample's shape, comma-separated")
    ap.add_argument("--samples", type=int, default=8000)
    ap.add_argument("--batch", type=int, nargs="+", default=[128])
    ap.add_argument("--methods", default="ags,lbt")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="ranks in the world (rank 0's times are shown)")
    ap.add_argument("--digits", action="store_true", help="scikit-learn's digits with SmallCNN (width 16), as "
                    "bench/run_prediction.py trains it, instead of the synthetic set")  # fmt: skip
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    device = "cpu" if a.dry_run or not torch.cuda.is_available() else "cuda"
    if a.dry_run:
        a.model, a.shape, a.samples, a.batch, a.rounds = "small_cnn", [1, 8, 8], 512, [32], 2
    label = "small_cnn digits" if a.digits else f"{a.model} {'x'.join(map(str, a.shape))}"
    precision = a.precision if device == "cuda" else "fp32"  # the CPU trains in fp32
    shape = a.shape
    # on a CPU the cores shared out over the ranks, as `tula run` sets them
    cpu_threads = max(1, (os.cpu_count() or 1) // a.workers)
    launcher = LocalLauncher(device=device, threads_per_worker=cpu_threads if device == "cpu" else None)
    results = []
    print(f"{device}: {torch.cuda.get_device_name(0) if device == 'cuda' else 'CPU'}, torch {torch.__version__}")
    print("| model | precision | method | B | steps | loop ms | synced ms | synced median ms | trial run ms | "
          "trial due ms | trial plain ms |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for big_b in a.batch:
        for method in a.methods.split(","):
            kwargs = {"num_classes": 10}
            if a.model == "small_cnn":
                kwargs.update(in_channels=shape[0], width=8)
            model = {"name": a.model, "kwargs": kwargs}
            data = {"name": "synthetic", "sample_shape": shape, "num_classes": 10, "num_samples": a.samples}
            if a.digits:
                model = {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 16}}
                data = {"name": "digits"}
            spec = {
                "name": "trainer-step",
                "model": model,
                "data": data,
                "epochs": 2 + 2 * a.rounds,
                "profile": {"device": device},
                "train": {
                    "method": method,
                    "precision": precision,
                    "ags": {"b_small": max(2, big_b // 8)},
                },  # fmt: skip
            }
            # by its module's name: a spawned rank cannot find __main__'s functions
            r = launcher.run(importlib.import_module("trainer_step").measure, a.workers, spec, method, big_b,
                             a.rounds)[0]  # fmt: skip
            results.append({"model": a.model, "method": method, "global_batch": big_b, **r})
            if r["status"] != "ok":
                print(f"| {label} N={a.workers} | {precision} | {method} | {big_b} | - | {r['status']} | | | |")
                continue
            med = {k: 1e3 * statistics.median(v) for k, v in r["per_round_s"].items()}
            print(f"| {label} N={a.workers} | {precision} | {method} | {big_b} | {r['steps_per_epoch']} | "
                  f"{med['loop']:.2f} | {med['synced']:.2f} | {med['synced median']:.2f} | {med['trial run']:.2f} | "
                  f"{med['trial due']:.2f} | {med['trial plain']:.2f} |",
                  flush=True)  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
