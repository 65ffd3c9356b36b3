"""Predicted against measured `tula train` epoch time, per training method (issue #26).

For each data set (digits with SmallCNN, MNIST-1D with SmallCNN1D) and each method, a real
profile (N = 1, 2, partial search) with ``train.method`` set to that method -- so its run
trial measures the method's own step and each epoch's end -- is fitted and planned; then
Tula's training runner trains at the plan's choice and at two other (N, B), and each
configuration's measured epoch (steps, evaluation, checkpoint: ``epoch_wall_s``, the median
over the epochs after the first) is set against the plan's prediction for it
(:func:`tula.core.run_costs.compare_with_plan`).  Targets: median error <= 5 %, max <= 10 %,
in each of ``--repeats`` repeats.  Methods that need two workers (AdaScale) or that cannot
train a configuration are skipped there, and said so.

    .venv/bin/python bench/run_prediction.py                          # ~30 min on 2 cores
    .venv/bin/python bench/run_prediction.py --datasets digits --methods ags,lbt --repeats 1
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from tula.core.errors import TulaError
from tula.core.fit import fit_models
from tula.core.job_rules import check_train_config
from tula.core.plan import make_plan
from tula.core.records import ModelsRecord
from tula.core.registry import METHOD_NAMES
from tula.core.run_costs import (
    EPOCH_TIMES,
    compare_with_plan,
    fitted_step_s,
    measured_epoch_s,
    predicted_step_s,
    run_costs_for,
)
from tula.core.spec import spec_from_dict
from tula.engine.launch import LocalLauncher
from tula.engine.launch.clusters import default_threads
from tula.engine.profile import profile
from tula.engine.train import train

console = Console(width=150)
DATASETS = {
    "digits": {
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 16}},
        "data": {"name": "digits"},
    },
    "mnist1d": {
        "model": {"name": "small_cnn1d", "kwargs": {"num_classes": 10}},
        "data": {"name": "mnist1d", "num_samples": 4000},
    },
}
OTHERS = [(1, 128), (2, 512)]  # the two other (N, B) besides the plan's choice


def spec(dataset: str, method: str, epochs: int, middle: bool = False) -> dict:
    return {
        "name": f"pred-{dataset}-{method}",
        **DATASETS[dataset],
        "epochs": epochs,
        "search": {"cluster_sizes": [1, 2], "min_batch": 64, "max_batch": 1024, "partial_middle_batch": middle},
        "train": {"method": method, "warmup_epochs": 1},
    }


def one(dataset: str, method: str, epochs: int, middle: bool = False) -> list[dict]:
    job = spec(dataset, method, epochs, middle)
    # torch threads per rank as `tula run` sets them (the cores over the largest world): torch's own
    # default (every core in every rank) oversubscribes the cores at N = 2, whose epochs then took
    # 2-10x their time at random (measured 2026-11-26 on the 2-core machine)
    launcher = LocalLauncher(device="cpu", threads_per_worker=default_threads(spec_from_dict(job)))
    t0 = time.perf_counter()
    rows = [{"dataset": dataset, "middle": middle, **r} for r in predict_and_train(job, launcher, OTHERS)]
    console.print(f"{dataset} {method}{' (middle batch)' if middle else ''}: {time.perf_counter() - t0:.0f} s")
    return rows


def predict_and_train(
    job_dict: dict, launcher, others: list[tuple[int, int]], objective: str = "knee", cap_others: int | None = None
) -> list[dict]:
    """Profile ``job_dict`` (partial search, its ``train.method``), fit and plan (``objective``),
    then train at the plan's choice and at each of ``others`` (N, B) -- the first ``cap_others``
    of them that are not the choice, when given (bench/gpu.py's ``--run-prediction`` calls this
    on a GPU): one row per configuration, measured epoch (median of the epochs after the first)
    against the plan's prediction, or the sentence that skipped it."""
    job = spec_from_dict(job_dict)
    method = job.train.method
    models = fit_models(profile(job, "partial", launcher))
    plan = make_plan(models, objective)
    choice = (plan.choice.n_workers, plan.choice.global_batch)
    rest = [c for c in dict.fromkeys(others) if c != choice]
    rows = []
    for n, big_b in [choice, *rest[:cap_others]]:
        row = {"method": method, "n_workers": n, "global_batch": big_b, "chosen": (n, big_b) == choice}
        try:
            check_train_config(job, method, n, big_b, models.dataset_size)
        except TulaError as err:
            rows.append({**row, "skipped": str(err)})
            continue
        with tempfile.TemporaryDirectory() as out:
            run = compare_with_plan(train(job, method, n, big_b, Path(out), launcher=launcher), models)
        later = run.history[1:]
        measured = statistics.median(measured_epoch_s(h) for h in later)
        predicted = later[0].predicted_epoch_s
        assert predicted is not None, "compare_with_plan predicts every epoch"
        steps = later[0].steps
        end_p, periodic_p = predicted_end_s(models, method, n, steps)
        rows.append(
            {
                **row,
                "measured_epoch_s": measured,
                "predicted_epoch_s": predicted,
                "error": measured / predicted - 1.0,
                "steps_s": statistics.median(h.epoch_time_s for h in later),
                "end_s": statistics.median((h.epoch_end_s or 0.0) + (h.checkpoint_s or 0.0) for h in later),
                "steps_per_epoch": steps,
                # a step as the epoch's steps ran it: the method's periodic work falls inside them
                "measured_step_s": statistics.median(h.epoch_time_s / h.steps for h in later),
                "predicted_step_s": predicted_step_s(models, method, big_b, n) + periodic_p / steps,
                "predicted_end_s": end_p,
                # the parts, to tell which one a miss is in: the trained epochs' and the run trial's
                "epochs": [{k: getattr(h, k) for k in EPOCH_TIMES} for h in later],
                "run_trial": trial_parts(models, method),
            }
        )
    return rows


def predicted_end_s(models: ModelsRecord, method: str, n_workers: int, steps: int) -> tuple[float, float]:
    """The plan's end of an epoch of ``steps`` steps at N (evaluation, the epoch's records, the
    checkpoint), to set beside the trained epochs' ``end_s``, and the method's periodic work
    in that epoch, which training does inside its steps (``RunCosts.epoch_fixed_s``; 0 and 0
    without run costs)."""
    costs, _ = run_costs_for(models, method)
    if costs is None:
        return 0.0, 0.0
    periodic = float(costs.periodic_per_epoch_s(n_workers, steps))
    return float(costs.epoch_fixed_s(n_workers, steps)) - periodic, periodic


def trial_parts(models: ModelsRecord, method: str) -> list[dict]:
    """The profile's run trials of ``method`` as measured (their batch, medians of the
    method's and the plain steps side by side, the epoch's end), with the fitted plain step
    at the same batch: what the plan's per-step and per-epoch terms were fitted from."""
    out = []
    for t in models.run_trials:
        if t.status != "ok" or t.method != method or t.global_batch is None:
            continue
        keys = ("n_workers", "global_batch", "t_run_step_s", "t_due_step_s", "t_step_plain_s", "eval_s",
                "epoch_end_s", "checkpoint_s")  # fmt: skip
        fitted = fitted_step_s(models, t.global_batch, t.n_workers)
        out.append({**{k: getattr(t, k) for k in keys}, "fitted_plain_step_s": fitted})
    return out


def stat_lines(results: list[dict]) -> list[str]:
    """The accuracy as the field states it (``bench/_stats.py``), per repeat (and with or without the
    middle batch): mean, median, p95 and max of ``|predicted / measured - 1|`` over the trained
    configurations, Kendall's tau between the predicted and the measured ranking of their epochs,
    and the noise floor of this run: the same configuration (data, method, N, B) trained twice here
    (in two repeats, or without and with the middle batch, which changes the prediction only)."""
    from _stats import describe, error_stats, kendall_tau, noise_floor  # bench/, the folder the script runs from

    done = [x for x in results if "measured_epoch_s" in x]
    seen: dict[tuple, list[float]] = {}
    for x in done:
        seen.setdefault((x["dataset"], x["method"], x["n_workers"], x["global_batch"]), []).append(
            x["measured_epoch_s"]
        )
    twice = [v[:2] for v in seen.values() if len(v) >= 2]
    noise = noise_floor([v[0] for v in twice], [v[1] for v in twice]) if twice else None
    out = []
    for r in sorted({x["repeat"] for x in done}):
        for middle in (False, True):
            sel = [x for x in done if x["repeat"] == r and x["middle"] == middle]
            if not sel:
                continue
            pred, meas = [x["predicted_epoch_s"] for x in sel], [x["measured_epoch_s"] for x in sel]
            label = f"epoch time, repeat {r}{', middle batch' if middle else ''}"
            out.append(describe(label, error_stats(pred, meas), noise, kendall_tau(pred, meas)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="digits,mnist1d")
    ap.add_argument("--methods", default=",".join(METHOD_NAMES))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--middle",
        choices=("off", "on", "both"),
        default="off",
        help="the partial search's middle batch (search.partial_middle_batch; off by default on a CPU); "
        "both: each method without and with it, one after the other",
    )
    ap.add_argument("--out", default="runs/bench-run-prediction.json")
    a = ap.parse_args()
    results = []
    for r in range(a.repeats):
        for dataset in a.datasets.split(","):
            for method in a.methods.split(","):
                for middle in {"off": [False], "on": [True], "both": [False, True]}[a.middle]:
                    results += [{**x, "repeat": r + 1} for x in one(dataset, method, a.epochs, middle)]
    t = Table(title=f"Predicted vs measured epoch time ({platform.node()}, torch {torch.__version__})")
    cols = (
        "repeat",
        "data",
        "method",
        "middle",
        "N",
        "B",
        "chosen",
        "predicted s",
        "measured s",
        "error",
        "end predicted s",
        "end measured s",
    )
    for col in cols:
        t.add_column(col, justify="right")
    for x in results:
        if "skipped" in x:
            t.add_row(str(x["repeat"]), x["dataset"], x["method"], "yes" if x["middle"] else "", str(x["n_workers"]), str(x["global_batch"]),
                      "", "-", "-", "skipped", "-", x["skipped"][:40])  # fmt: skip
            continue
        t.add_row(
            str(x["repeat"]), x["dataset"], x["method"], "yes" if x["middle"] else "", str(x["n_workers"]),
            str(x["global_batch"]), "*" if x["chosen"] else "", f"{x['predicted_epoch_s']:.3f}", f"{x['measured_epoch_s']:.3f}",
            f"{x['error']:+.1%}", f"{x.get('predicted_end_s', float('nan')):.3f}", f"{x['end_s']:.3f}",
        )  # fmt: skip
    console.print(t)
    for r in range(1, a.repeats + 1):
        for middle in (False, True):
            errs = [abs(x["error"]) for x in results if x["repeat"] == r and x["middle"] == middle and "error" in x]
            if errs:
                console.print(
                    f"repeat {r}{', middle batch' if middle else ''}: median |error| {statistics.median(errs):.1%} "
                    f"(target 5 %), max {max(errs):.1%} (target 10 %) over {len(errs)} configurations"
                )
    for line in stat_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    console.print(f"results written to {a.out}")


if __name__ == "__main__":
    main()
