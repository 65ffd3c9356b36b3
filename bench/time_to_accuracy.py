"""Time to accuracy (issue #17): does the gradient noise scale from a profile predict how many
more epochs a larger batch needs, and does ``time_to_accuracy`` choose the batch that really
reaches the target first?

For each data set (scikit-learn's digits with tula's SmallCNN, MNIST-1D with SmallCNN1d):

1. a real profile (N = 1, 2; global batches 32 .. 1024) measures B_noise at the start of
   training, and ``tula fit`` fits the models (its ranks with the training runs' ``--threads``);
2. Tula's real training runner trains on one worker at every B of ``--batches`` for each seed
   and method (``lbt``: the spec's SGD as it is; ``ags``), ``--max-epochs`` epochs, recording
   the test top-1 and the epoch time after every epoch;
3. the target is ``--target`` (0.97) x the median final accuracy of the smallest batch's runs
   (per method); a run's epochs to target are the first epoch at or above it, its time to
   target those epochs times its median epoch time (robust to the stalls of a shared
   machine); per B the median over the seeds, when most of them reach it;
4. predicted relative epochs (B_noise + B) / (B_noise + B0), B0 the smallest batch, against the
   measured E(B) / E(B0): the median relative error over B (target: 25 %);
5. ``make_plan(objective="time_to_accuracy")`` on the fitted models (one worker, the batches
   measured, epochs = E(B0) measured, ``train.base_batch`` = B0) against the batch measured
   fastest to the target (target: within 10 % of its time), and what ``time`` chooses.

Results stream into ``OUT/results.jsonl`` (a rerun skips finished runs; ``--fresh`` starts
over); the summary goes to ``OUT/summary.md`` and a plot to ``OUT/epochs_to_target.png``.

    .venv/bin/python bench/time_to_accuracy.py                 # both sets, 3 seeds, lbt and ags
    .venv/bin/python bench/time_to_accuracy.py --quick         # digits, 1 seed, lbt: a smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _stats import describe, error_stats, kendall_tau  # bench/, the folder the script runs from
from rich.console import Console
from rich.table import Table

from tula.core.fit import fit_models
from tula.core.plan import make_plan
from tula.core.records import ModelsRecord
from tula.core.spec import spec_from_dict
from tula.engine.launch import LocalLauncher
from tula.engine.profile import profile
from tula.engine.train import train

console = Console(width=150)

DATASETS = {
    "digits": {
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 32}},
        "data": {"name": "digits"},
    },
    "mnist1d": {
        "model": {"name": "small_cnn1d", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 32}},
        "data": {"name": "mnist1d"},
    },
}


def job(dataset: str, seed: int, epochs: int, batches: list[int], threads: int = 1) -> dict:
    return {
        "name": f"tta-{dataset}",
        **DATASETS[dataset],
        "epochs": epochs,
        "seed": seed,
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
        "search": {"cluster_sizes": [1, 2], "min_batch": batches[0], "max_batch": batches[-1]},
        "train": {"base_batch": batches[0], "warmup_epochs": 0, "ags": {"b_small": max(1, batches[0] // 2)}},
        # the profile's ranks get the training runs' threads: the plan's step times are theirs
        "profile": {"warmup_steps": 2, "timed_steps": 6, "threads_per_worker": threads, "noise_steps": 20},
    }


def run_key(r: dict) -> str:
    return f"{r['dataset']}|{r['method']}|{r['batch']}|{r['seed']}"


def load(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out[run_key(r)] = r
    return out


def reached(history: list[dict], target: float) -> tuple[int | None, float | None]:
    """(epochs, seconds) to the first epoch at or above ``target``; (None, None) if never.
    The seconds are the epochs times the run's median epoch time: on 2 shared cores single
    epochs stall now and then (another process, the first epoch's start-up), and a stall
    is not a property of the batch."""
    per_epoch = statistics.median(h["epoch_time_s"] for h in history)
    for h in history:
        if (h.get("test_top1") or 0.0) >= target:
            return h["epoch"], h["epoch"] * per_epoch
    return None, None


def median_or_none(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(dataset: str, method: str, batches: list[int], runs: dict, target_frac: float, b_noise: float):
    mine = {b: [r for r in runs.values() if (r["dataset"], r["method"], r["batch"]) == (dataset, method, b)]
            for b in batches}  # fmt: skip
    finals = [r["history"][-1]["test_top1"] for r in mine[batches[0]]]
    target = target_frac * statistics.median(finals)
    rows: list[dict[str, Any]] = []
    for b in batches:
        got = [reached(r["history"], target) for r in mine[b]]
        n_ok = sum(e is not None for e, _ in got)
        e = median_or_none([e for e, _ in got]) if n_ok * 2 > len(got) else None  # most seeds reach it
        t = median_or_none([s for _, s in got]) if e is not None else None
        rows.append({"batch": b, "epochs": e, "seconds": t, "reached": f"{n_ok}/{len(got)}"})
    e0 = rows[0]["epochs"]
    for r in rows:
        r["predicted_rel"] = (b_noise + r["batch"]) / (b_noise + batches[0])
        r["measured_rel"] = r["epochs"] / e0 if (r["epochs"] is not None and e0) else None
        r["rel_error"] = abs(r["predicted_rel"] - r["measured_rel"]) / r["measured_rel"] if r["measured_rel"] else None
    return target, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="digits,mnist1d")
    ap.add_argument("--methods", default="lbt,ags")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batches", default="32,64,128,256,512,1024")
    ap.add_argument("--max-epochs", type=int, default=60)
    ap.add_argument("--target", type=float, default=0.97, help="fraction of the smallest batch's final accuracy")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the one training rank")
    ap.add_argument("--out", default="runs/bench-time-to-accuracy")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--quick", action="store_true", help="digits, 1 seed, lbt, 3 batches, 20 epochs")
    a = ap.parse_args()
    if a.quick:
        a.datasets, a.methods, a.seeds, a.batches, a.max_epochs = "digits", "lbt", 1, "32,128,512", 20
    datasets, methods = a.datasets.split(","), a.methods.split(",")
    batches = sorted(int(b) for b in a.batches.split(","))
    out = Path(a.out)
    if a.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    runs = load(results_path)
    launcher = LocalLauncher(device="cpu", threads_per_worker=a.threads)
    t_start = time.perf_counter()
    summary: dict = {"datasets": {}}
    for ds in datasets:
        # 1. the profile and the fitted models, once per data set (kept in OUT)
        mpath = out / f"models-{ds}.json"
        if mpath.exists():  # the models record, and this bench's profiling seconds beside its fields
            cached = json.loads(mpath.read_text())
            models, profiling_s = ModelsRecord.from_dict(cached, str(mpath)), float(cached["bench_profiling_s"])
        else:
            t0 = time.perf_counter()
            prof = profile(
                spec_from_dict(job(ds, 0, 1, batches, threads=a.threads)),
                "partial",
                LocalLauncher(device="cpu", threads_per_worker=a.threads),
            )
            models = fit_models(prof)
            profiling_s = time.perf_counter() - t0
            mpath.write_text(json.dumps({**models.to_json_dict(), "bench_profiling_s": profiling_s}))
        ns = models.noise_scale
        if ns is None or ns.b_noise is None or ns.low is None or ns.high is None:
            raise SystemExit(f"{ds}: the profile measured no gradient noise scale, which this benchmark predicts from")
        console.print(f"[bold]{ds}[/bold]: B_noise {ns.b_noise:.3g} ({ns.low:.3g}-{ns.high:.3g}) from a "
                      f"{profiling_s:.1f} s profile")  # fmt: skip
        # 2. the training runs
        for method in methods:
            for seed in range(a.seeds):
                for b in batches:
                    key = f"{ds}|{method}|{b}|{seed}"
                    if key in runs:
                        continue
                    with tempfile.TemporaryDirectory() as scratch:
                        t0 = time.perf_counter()
                        rec = train(spec_from_dict(job(ds, seed, a.max_epochs, batches)), method, 1, b, scratch,
                                    launcher=launcher)  # fmt: skip
                    r = {"dataset": ds, "method": method, "batch": b, "seed": seed,
                         "history": [{k: getattr(h, k) for k in ("epoch", "test_top1", "epoch_time_s", "train_loss")}
                                     for h in rec.history], "wall_s": time.perf_counter() - t0}  # fmt: skip
                    runs[key] = r
                    with results_path.open("a") as f:
                        f.write(json.dumps(r) + "\n")
                    console.print(f"  {key}: final top-1 {r['history'][-1]['test_top1']:.4f} ({r['wall_s']:.0f} s)")
        # 3-5. per method: epochs to target, predicted vs measured, the plan's choice vs the fastest
        summary["datasets"][ds] = {"b_noise": ns.to_json_dict(), "methods": {}}
        for method in methods:
            target, rows = summarise(ds, method, batches, runs, a.target, ns.b_noise)
            errs = [r["rel_error"] for r in rows[1:] if r["rel_error"] is not None]
            e0 = rows[0]["epochs"]
            plans, predicted_tta = {}, {}
            if e0:
                d = spec_from_dict(job(ds, 0, max(1, round(e0)), batches)).to_dict()
                d["search"]["cluster_sizes"] = [1]
                d["search"]["max_batch"] = batches[-1]
                m = models.model_copy(update={"spec": spec_from_dict(d)})  # checked: model_copy does not validate
                # the plan's choice among the batches trained here (the planner also searches the batches
                # between them, which were not trained, so its own choice may not be measurable)
                for objective, key in (("time_to_accuracy", "time_to_accuracy_s"), ("time", "total_time_s")):
                    plan = make_plan(m, objective)
                    trained = [c for c in plan.configurations if c.feasible and c.global_batch in batches]
                    plans[objective] = min(trained, key=lambda c: getattr(c, key)).global_batch
                    if objective == "time_to_accuracy":  # the plan's ranking of the trained batches
                        predicted_tta = {c.global_batch: getattr(c, key) for c in trained}
                    plans[objective + "_unrestricted"] = plan.choice.global_batch
            timed = [r for r in rows if r["seconds"] is not None]
            fastest = min(timed, key=lambda r: r["seconds"]) if timed else None
            at = {r["batch"]: r for r in rows}

            def time_at(b: int | None, at: dict = at) -> float | None:
                return None if b is None or b not in at else at[b]["seconds"]

            tta_b = plans.get("time_to_accuracy")
            tta_s = time_at(tta_b)
            res = {
                "target": target,
                "rows": rows,
                "median_rel_error": statistics.median(errs) if errs else None,
                "fastest_batch": fastest["batch"] if fastest else None,
                "fastest_s": fastest["seconds"] if fastest else None,
                "tta_choice": tta_b,
                "tta_choice_s": tta_s,
                "tta_vs_fastest": (tta_s / fastest["seconds"]) if (tta_s and fastest) else None,
                "tta_choice_unrestricted": plans.get("time_to_accuracy_unrestricted"),
                "time_choice": plans.get("time"),
                "time_choice_s": time_at(plans.get("time")),
            }
            summary["datasets"][ds]["methods"][method] = res
            t = Table(title=f"{ds} / {method}: target top-1 {target:.4f} ({a.target:.0%} of B={batches[0]}'s final)")
            for col in (
                "B",
                "reached",
                "epochs to target",
                "seconds to target",
                "predicted E/E0",
                "measured E/E0",
                "error",
            ):
                t.add_column(col, justify="right")
            for r in rows:
                t.add_row(str(r["batch"]), r["reached"], "-" if r["epochs"] is None else f"{r['epochs']:g}",
                          "-" if r["seconds"] is None else f"{r['seconds']:.2f}", f"{r['predicted_rel']:.2f}",
                          "-" if r["measured_rel"] is None else f"{r['measured_rel']:.2f}",
                          "-" if r["rel_error"] is None else f"{r['rel_error']:.0%}")  # fmt: skip
            console.print(t)
            # the field's statistics over B > B0 (B0 is 0 by construction), and Kendall's tau between the
            # plan's predicted seconds to target and the measured ones over the batches trained (no run here
            # measures one configuration twice: no noise floor)
            scored = [r for r in rows[1:] if r["measured_rel"]]
            ranked = [
                r for r in rows if r["seconds"] and math.isfinite(predicted_tta.get(r["batch"]) or math.inf)
            ]  # fmt: skip
            if scored:
                res["stats"] = error_stats([r["predicted_rel"] for r in scored], [r["measured_rel"] for r in scored])
                tau = (
                    kendall_tau([predicted_tta[r["batch"]] for r in ranked], [r["seconds"] for r in ranked])
                    if len(ranked) >= 2
                    else None
                )
                res["tau_seconds_to_target"] = tau
                console.print(
                    "  "
                    + describe("predicted relative epochs to target", res["stats"], None, tau)
                    + " (tau: the plan's seconds to target against the measured, over B)",
                    highlight=False,
                    soft_wrap=True,
                )
            console.print(
                f"  median error of predicted relative epochs: "
                f"{'-' if res['median_rel_error'] is None else format(res['median_rel_error'], '.0%')} (target 25 %); "
                f"time_to_accuracy chooses B={tta_b} ({'-' if tta_s is None else format(tta_s, '.2f')} s to target; "
                f"B={res['tta_choice_unrestricted']} among all batches), "
                f"the fastest measured is B={res['fastest_batch']} "
                f"({'-' if res['fastest_s'] is None else format(res['fastest_s'], '.2f')} s): "
                f"{'-' if res['tta_vs_fastest'] is None else format(res['tta_vs_fastest'], '.2f')}x (target <= 1.10); "
                f"time chooses B={res['time_choice']} "
                f"({'never reached' if res['time_choice_s'] is None else format(res['time_choice_s'], '.2f') + ' s'})"
            )
    summary["machine"] = (
        f"{platform.node()}: {torch.get_num_threads()} torch threads, {platform.processor() or platform.machine()}"
    )
    summary["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    summary["seconds"] = time.perf_counter() - t_start
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, out / "epochs_to_target.png")
    console.print(f"summary in {out / 'summary.json'}, plot in {out / 'epochs_to_target.png'}")


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(summary["datasets"])
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.2), squeeze=False)
    for ax, ds in zip(axes[0], sets):
        for k, (method, res) in enumerate(summary["datasets"][ds]["methods"].items()):
            rows = res["rows"]
            col = f"C{k}"
            ax.plot([r["batch"] for r in rows], [r["predicted_rel"] for r in rows], "--", color=col,
                    label=f"{method} predicted (B_noise {summary['datasets'][ds]['b_noise']['b_noise']:.3g})")  # fmt: skip
            meas = [r for r in rows if r["measured_rel"] is not None]
            ax.plot([r["batch"] for r in meas], [r["measured_rel"] for r in meas], "o-", color=col,
                    label=f"{method} measured")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("global batch B")
        ax.set_ylabel("epochs to target / epochs at the smallest B")
        ax.set_title(ds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
