"""Table I on this machine: test accuracy of large-batch training methods vs a small batch.

For each data set (scikit-learn's digits with tula's SmallCNN, MNIST-1D regenerated locally
with tula's SmallCNN1d), each seed, the small-batch reference (SB: vanilla SGD at
``--sb``) and each large batch of ``--batches``, every method trains the same number of
epochs with Tula's real training runner (:func:`tula.engine.train.train_world`: 2-rank gloo DDP,
evaluation after every epoch, checkpoints), all cells inside one launched world.  The
accuracy of a run is the test top-1 after its last epoch.

Printed: mean ± std of that accuracy over the seeds per (data set, method, batch), seconds
per epoch, AGS's fraction of scaled steps, the share of the gap closed,
(AGS - LBT) / (SB - LBT), per cell, AGS vs LBT on average over the large batches, the
per-tensor vs per-element comparison of AGS, and AGS's step time over the wrapped
optimiser's (LBT, the same SGD) measured interleaved in one world.

Results stream into ``OUT/results.jsonl`` as the cells finish; a rerun with the same OUT
skips the cells already there (``--fresh`` starts over).  Plots: ``accuracy_vs_batch.png``
and ``ags_trace_<data>.png``; a markdown summary in ``summary.md``.

    .venv/bin/python bench/large_batch.py               # 3 seeds, ~25 min on 2 cores
    .venv/bin/python bench/large_batch.py --quick       # 1 seed, 4 epochs: a smoke run
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tula.core.config import Config
from tula.core.events import Event
from tula.core.registry import METHODS as METHOD_TABLE
from tula.core.spec import spec_from_dict
from tula.engine.launch import LocalLauncher, WorkerContext
from tula.engine.rank_messages import Finished
from tula.engine.train import METRICS, step_traces, steps_per_epoch, train_world
from tula.engine.workloads import load_dataset

console = Console(width=140)

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
# label -> (tula method, spec overrides): every method of tula's registry under its label,
# the baselines first; "AGS" is the default granularity, "AGS-element" the other one, run
# too, to choose the default.
OVERRIDES: dict[str, dict[str, Any]] = {
    # LARS steps are lr * trust_coeff (0.001) * |w| / |g|: it needs a LARS-scale LR, not SGD's
    "lars": {"optimizer": {"lr": 1.0}},
    "ags": {"train": {"ags": {"granularity": "tensor"}}},
}
METHODS = {
    m.label: (m.name, OVERRIDES.get(m.name, {})) for m in sorted(METHOD_TABLE.values(), key=lambda m: not m.is_baseline)
}
METHODS["AGS-element"] = ("ags", {"train": {"ags": {"granularity": "element"}}})
TABLE_METHODS = ["SB", *METHODS]


def job_spec(dataset: str, seed: int, epochs: int, overrides: dict) -> dict:
    d: dict[str, Any] = {
        "name": f"large-batch-{dataset}",
        **DATASETS[dataset],
        "epochs": epochs,
        "seed": seed,
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
        "train": {"lr_milestones": [epochs // 2, (3 * epochs) // 4], "lr_gamma": 0.1},
        "profile": {"threads_per_worker": 1, "device": "cpu"},
    }
    for key, val in overrides.items():
        d[key] = {**d.get(key, {}), **val} if isinstance(val, dict) else val
        if key == "train" and "ags" in val:
            d["train"]["ags"] = dict(val["ags"])
    return spec_from_dict(d).to_dict()


def cell_key(c: dict) -> str:
    return f"{c['dataset']}/seed{c['seed']}/{c['label']}/B{c['global_batch']}"


def make_cells(
    datasets: list[str], seeds: list[int], sb: int, batches: list[int], epochs: int, labels: list[str]
) -> list[dict]:
    cells = []
    for seed in seeds:
        for ds in datasets:
            if "SB" in labels:
                cells.append(
                    {
                        "dataset": ds,
                        "seed": seed,
                        "label": "SB",
                        "method": "lbt",
                        "global_batch": sb,
                        "spec": job_spec(ds, seed, epochs, {}),
                    }
                )
            for b in batches:
                for label in labels:
                    if label == "SB":
                        continue
                    method, over = METHODS[label]
                    cells.append(
                        {
                            "dataset": ds,
                            "seed": seed,
                            "label": label,
                            "method": method,
                            "global_batch": b,
                            "spec": job_spec(ds, seed, epochs, over),
                        }
                    )
    return cells


# --------------------------------------------------------------------------- in every rank
@dataclass(frozen=True)
class CellDone(Event):
    """Rank 0 trained one cell: its row of ``results.jsonl`` (``row``)."""

    kind: ClassVar[str] = "cell"
    row: dict[str, Any]


@dataclass(frozen=True)
class OverheadRound(Event):
    """Rank 0 finished round ``round`` of the step-time overhead's interleaved runs."""

    kind: ClassVar[str] = "overhead_round"
    round: int


def train_cell(ctx: WorkerContext, spec: dict, method: str, global_batch: int, out: Path) -> Finished:
    """One run of the runner at ``global_batch`` on this world, to the job's last epoch."""
    res = train_world(
        ctx, spec, method_name=method, config=Config(ctx.world_size, global_batch), out_dir=str(out), fallbacks=[]
    )
    if not isinstance(res, Finished):
        raise RuntimeError(f"{method} at B={global_batch} did not finish: {res}")
    return res


def run_cells(ctx: WorkerContext, cells: list[dict], scratch: str) -> int:
    """Train every cell in turn with the runner; rank 0 reports each as an event."""
    for c in cells:
        out = Path(scratch) / cell_key(c).replace("/", "_")
        out.mkdir(parents=True, exist_ok=True)
        res = train_cell(ctx, c["spec"], c["method"], c["global_batch"], out)
        if ctx.rank == 0:
            hist = res.history
            tr = {**res.traces, **step_traces(out / METRICS)}  # per-step values: metrics.jsonl
            ctx.emit(
                CellDone(
                    {
                        "key": cell_key(c),
                        **{k: c[k] for k in ("dataset", "seed", "label", "method", "global_batch")},
                        "epochs": len(hist),
                        "steps_per_epoch": res.steps_per_epoch,
                        "test_top1": hist[-1]["test_top1"],
                        "best_test_top1": max(h["test_top1"] for h in hist),
                        "test_loss": hist[-1]["test_loss"],
                        "train_loss": hist[-1]["train_loss"],
                        "s_per_epoch": statistics.median(h["epoch_time_s"] for h in hist),
                        "scaled_fraction": tr.get("scaled_fraction"),
                        "factors": tr.get("factors"),
                        "delta": tr.get("delta") if c["seed"] == 0 else None,
                        "scaled": tr.get("scaled") if c["seed"] == 0 else None,
                        "delta_threshold": tr.get("delta_threshold"),
                        # whole metrics lines (train.png's figure reads them), without the per-step traces
                        "history": [{k: v for k, v in h.items() if k != "step_traces"} for h in hist],
                    }
                )
            )
    return 0


def time_overhead(
    ctx: WorkerContext, spec_lbt: dict, spec_ags: dict, global_batch: int, rounds: int, scratch: str
) -> dict:
    """LBT (the wrapped SGD alone) and AGS with once-per-epoch factor updates, interleaved
    ``rounds`` times in this world; per-step seconds from the runner's epoch times."""
    per_step: dict[str, list[float]] = {"lbt": [], "ags": []}
    for r in range(rounds):
        for name, spec in (
            (("lbt", spec_lbt), ("ags", spec_ags)) if r % 2 == 0 else (("ags", spec_ags), ("lbt", spec_lbt))
        ):
            out = Path(scratch) / f"overhead_{name}_{r}"
            out.mkdir(parents=True, exist_ok=True)
            res = train_cell(ctx, spec, name, global_batch, out)
            per_step[name] += [h["epoch_time_s"] / h["steps"] for h in res.history[1:]]  # epoch 1: warm-up
        if ctx.rank == 0:
            ctx.emit(OverheadRound(r + 1))
    return per_step


# --------------------------------------------------------------------------- in the caller
def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def load_results(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def summarise(results: dict[str, dict], datasets: list[str], sb: int, batches: list[int]) -> dict:
    """Per (data set, label, batch): accuracies over seeds and their mean ± std, etc."""
    cells: dict[tuple, list[dict]] = {}
    for r in results.values():
        cells.setdefault((r["dataset"], r["label"], r["global_batch"]), []).append(r)
    out = {}
    for key, rs in cells.items():
        accs = [r["test_top1"] for r in rs]
        m, s = mean_std(accs)
        sf = [r["scaled_fraction"] for r in rs if r.get("scaled_fraction") is not None]
        out[key] = {
            "n_seeds": len(rs),
            "mean": m,
            "std": s,
            "s_per_epoch": statistics.fmean(r["s_per_epoch"] for r in rs),
            "scaled_fraction": statistics.fmean(sf) if sf else None,
        }
    return out


def print_table(summary: dict, datasets: list[str], sb: int, batches: list[int], labels: list[str]) -> list[str]:
    """Rich table to the console; the same as markdown lines for docs/benchmarks-history.md."""
    md = []
    for ds in datasets:
        if not any(k[0] == ds for k in summary):
            continue
        t = Table(title=f"{ds}: final test top-1 (mean ± std over seeds), s/epoch; AGS: % of steps scaled")
        t.add_column("method")
        for b in [sb] + batches:
            t.add_column(f"B={b}", justify="right")
        md += [
            f"**{ds}** (test top-1 %, mean ± std over seeds; s/epoch in brackets)",
            "",
            "| method | " + " | ".join(f"B={b}" for b in [sb] + batches) + " |",
            "|---|" + "---:|" * (1 + len(batches)),
        ]
        for lab in labels:
            row = []
            for b in [sb] + batches:
                if (lab == "SB") != (b == sb):
                    row.append("")
                    continue
                c = summary.get((ds, lab, b))
                if c is None:
                    row.append("-")
                    continue
                txt = f"{100 * c['mean']:.1f} ± {100 * c['std']:.1f} ({c['s_per_epoch']:.2f} s)"
                if c["scaled_fraction"] is not None:
                    txt += f" {c['scaled_fraction']:.0%} sc."
                row.append(txt)
            t.add_row(lab, *row)
            md.append(f"| {lab} | " + " | ".join(row) + " |")
        console.print(t)
        md.append("")
    return md


def gap_report(summary: dict, datasets: list[str], sb: int, batches: list[int]) -> tuple[list[str], dict]:
    lines, verdict = [], {}
    for ds in datasets:
        ref = summary.get((ds, "SB", sb))
        if ref is None:
            continue
        gains, gaps = [], []
        for b in batches:
            lbt, ags = summary.get((ds, "LBT", b)), summary.get((ds, "AGS", b))
            if lbt is None or ags is None:
                continue
            gap = ref["mean"] - lbt["mean"]
            share = (ags["mean"] - lbt["mean"]) / gap if abs(gap) > 1e-9 else math.nan
            gains.append(ags["mean"] - lbt["mean"])
            gaps.append(gap)
            lines.append(
                f"{ds} B={b}: SB {100 * ref['mean']:.1f}, LBT {100 * lbt['mean']:.1f}, AGS "
                f"{100 * ags['mean']:.1f}: AGS - LBT = {100 * (ags['mean'] - lbt['mean']):+.1f} points, "
                f"gap closed {share:.0%}"
                if math.isfinite(share)
                else f"{ds} B={b}: no gap between SB and LBT"
            )
        if gains:
            g = statistics.fmean(gains)
            # pooled over the large batches: a per-cell share is meaningless where the gap is ~0
            gap = statistics.fmean(gaps)
            c = g / gap if gap > 1e-9 else math.nan
            verdict[ds] = {"ags_minus_lbt_points": 100 * g, "gap_closed": c}
            lines.append(
                f"{ds}: on average over the large batches AGS - LBT = {100 * g:+.1f} points "
                f"(target >= +5: {'met' if 100 * g >= 5 else 'MISSED'}), gap closed {c:.0%} of "
                f"{100 * gap:.1f} points (mean AGS - LBT over mean SB - LBT; target >= 50%: "
                f"{'met' if c >= 0.5 else 'MISSED'})"
            )
    return lines, verdict


def granularity_report(summary: dict, datasets: list[str], batches: list[int]) -> list[str]:
    diffs = []
    for ds in datasets:
        for b in batches:
            t, e = summary.get((ds, "AGS", b)), summary.get((ds, "AGS-element", b))
            if t and e:
                diffs.append(e["mean"] - t["mean"])
    if not diffs:
        return []
    d = statistics.fmean(diffs)
    wins = sum(x > 0 for x in diffs)
    better = "element" if d > 0 else "tensor"
    return [
        f"AGS per-element minus per-tensor: {100 * d:+.2f} points on average over {len(diffs)} cells "
        f"(element better in {wins} of {len(diffs)}): the better granularity here is {better}"
    ]


def plot_accuracy(
    summary: dict, datasets: list[str], sb: int, batches: list[int], labels: list[str], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [ds for ds in datasets if any(k[0] == ds for k in summary)]
    fig, axes = plt.subplots(1, len(shown), figsize=(6.5 * len(shown), 4.6), squeeze=False)
    for ax, ds in zip(axes[0], shown):
        ref = summary.get((ds, "SB", sb))
        if ref:
            ax.axhline(100 * ref["mean"], color="black", ls="--", lw=1, label=f"SB (B={sb})")
        for lab in labels:
            if lab == "SB":
                continue
            pts = [(b, summary[(ds, lab, b)]) for b in batches if (ds, lab, b) in summary]
            if not pts:
                continue
            style = {"lw": 2.5} if lab == "AGS" else {"lw": 1.2, "alpha": 0.85}
            ax.errorbar(
                [b for b, _ in pts],
                [100 * c["mean"] for _, c in pts],
                yerr=[100 * c["std"] for _, c in pts],
                marker="o",
                capsize=3,
                label=lab,
                **style,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches)
        ax.set_xticklabels([str(b) for b in batches])
        ax.set_xlabel("global batch B (2 workers)")
        ax.set_ylabel("final test top-1 (%)")
        ax.set_title(ds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ags_trace(results: dict[str, dict], ds: str, batch: int, path: Path) -> bool:
    from pydantic import ValidationError

    from tula.core.records import TrainRecord
    from tula.report import plot_training

    r = results.get(f"{ds}/seed0/AGS/B{batch}")
    if not r or not r.get("delta"):
        return False
    try:  # the cell as the training record it trained (its one configuration every epoch's)
        run = TrainRecord(
            kind="tula.train",
            version=1,
            spec=job_spec(ds, 0, r["epochs"], {}),
            method="ags",
            n_workers=2,
            global_batch=batch,
            steps_per_epoch=r["steps_per_epoch"],
            epochs=r["epochs"],
            steps_done=r["steps_per_epoch"] * r["epochs"],
            history=r["history"],
            traces={
                "delta": r["delta"],
                "scaled": r["scaled"],
                "scaled_fraction": r["scaled_fraction"],
                "delta_threshold": r["delta_threshold"],
                "factors": r["factors"],
            },
        )
    except ValidationError:  # results of an earlier version kept only the epoch, top-1 and loss of each epoch
        return False
    plot_training(run, path)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="digits,mnist1d")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=30, help="the epoch budget of every run")
    ap.add_argument("--sb", type=int, default=32, help="the small-batch reference")
    ap.add_argument("--batches", default="256,512,1024", help="the large global batches")
    ap.add_argument("--methods", default=",".join(TABLE_METHODS))
    ap.add_argument("--overhead-rounds", type=int, default=4)
    ap.add_argument("--overhead-batch", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/large_batch"))
    ap.add_argument("--fresh", action="store_true", help="discard the results already in --out")
    ap.add_argument("--quick", action="store_true", help="1 seed, 4 epochs, 2 overhead rounds: a smoke run")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: report the results in --out (and the overhead measured by the last full invocation)",
    )
    a = ap.parse_args()
    if a.quick:
        a.seeds, a.epochs, a.overhead_rounds = 1, 4, 2
    datasets = a.datasets.split(",")
    batches = [int(b) for b in a.batches.split(",")]
    labels = a.methods.split(",")
    unknown = [lab for lab in labels if lab != "SB" and lab not in METHODS]
    if unknown:
        ap.error(f"unknown method label(s) {unknown}; choose from SB, {', '.join(METHODS)}")
    a.out.mkdir(parents=True, exist_ok=True)
    res_path = a.out / "results.jsonl"
    if a.fresh and res_path.exists():
        res_path.unlink()
    meta_path = a.out / "meta.json"
    meta = {"epochs": a.epochs, "sb": a.sb, "batches": batches}
    if res_path.exists() and meta_path.exists() and json.loads(meta_path.read_text()) != meta:
        ap.error(f"{res_path} holds results of another setting ({meta_path}); pass --fresh or another --out")
    meta_path.write_text(json.dumps(meta))

    started = time.strftime("%Y-%m-%d %H:%M %Z")
    machine = f"{platform.machine()}, {os.cpu_count()} cores, CPU only; torch {torch.__version__}"
    for ds in datasets:
        d = load_dataset(spec_from_dict(DATASETS[ds]).data, 0)
        console.print(
            f"{ds}: {d.train_size} training / {d.test_size} test samples; steps per epoch "
            + ", ".join(f"B={b}: {steps_per_epoch(d.train_size, b)}" for b in [a.sb] + batches)
        )

    done = load_results(res_path)
    cells = [
        c
        for c in make_cells(datasets, list(range(a.seeds)), a.sb, batches, a.epochs, labels)
        if cell_key(c) not in done
    ]
    console.print(
        f"{len(done)} cells already in {res_path}; {len(cells)} to run, {a.epochs} epochs each, 2-rank gloo DDP"
    )
    launcher = LocalLauncher(device="cpu", threads_per_worker=1)
    scratch = tempfile.mkdtemp(prefix="tula-large-batch-")
    # the ranks' function and events by the module's name, not __main__'s: a rank's event unpickles here
    by_name = importlib.import_module("large_batch")
    t0 = time.perf_counter()
    if a.report_only:
        cells = []
    try:
        if cells:
            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as bar:
                task = bar.add_task("cells", total=len(cells))

                def on_event(rank: int, ev: Event) -> None:
                    if isinstance(ev, by_name.CellDone):
                        with open(res_path, "a") as fh:
                            fh.write(json.dumps(ev.row) + "\n")
                        bar.update(task, advance=1, description=f"{ev.row['key']}: top-1 {ev.row['test_top1']:.1%}")

                launcher.run(by_name.run_cells, 2, cells, scratch, on_event=on_event, timeout_s=None)
        ds0 = datasets[-1]
        if a.report_only:
            per_step = json.loads((a.out / "summary.json").read_text())["overhead"]["samples"]
        else:
            console.print("[bold]AGS step-time overhead[/] (AGS, once-per-epoch factor updates, vs the wrapped SGD)")
            spec_lbt = job_spec(ds0, 0, 6, {})
            spec_ags = job_spec(ds0, 0, 6, METHODS["AGS"][1])
            per_step = launcher.run(
                by_name.time_overhead,
                2,
                spec_lbt,
                spec_ags,
                a.overhead_batch,
                a.overhead_rounds,
                scratch,
                timeout_s=None,
            )[0]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - t0

    results = load_results(res_path)
    summary = summarise(results, datasets, a.sb, batches)
    md = print_table(summary, datasets, a.sb, batches, labels)
    gap_lines, verdict = gap_report(summary, datasets, a.sb, batches)
    gran = granularity_report(summary, datasets, batches)
    lbt_s, ags_s = statistics.median(per_step["lbt"]), statistics.median(per_step["ags"])
    ratio = ags_s / lbt_s
    over = [
        f"AGS step time / wrapped SGD step time on {ds0}, B={a.overhead_batch}, {a.overhead_rounds} interleaved "
        f"rounds of 5 timed epochs: {1e3 * ags_s:.2f} ms / {1e3 * lbt_s:.2f} ms = {ratio:.3f} "
        f"({100 * (ratio - 1):+.1f}%; target <= +3%: {'met' if ratio <= 1.03 else 'MISSED'})"
    ]
    for line in gap_lines + gran + over:
        console.print(line)
    plot_accuracy(summary, datasets, a.sb, batches, labels, a.out / "accuracy_vs_batch.png")
    plots = ["accuracy_vs_batch.png"]
    for ds in datasets:
        if plot_ags_trace(results, ds, batches[-1], a.out / f"ags_trace_{ds}.png"):
            plots.append(f"ags_trace_{ds}.png")
    seeds_done = sorted({r["seed"] for r in results.values()})
    if a.report_only:  # the date and length of the invocation that measured
        prev = json.loads((a.out / "summary.json").read_text()).get("run", {})
        started, wall = prev.get("started", started), prev.get("wall_s", wall)
    header = [
        f"Run {started} on {machine}; {a.epochs} epochs per run, seeds {seeds_done}, "
        f"2 workers (gloo), this invocation {wall / 60:.1f} min.",
        "",
    ]
    (a.out / "summary.md").write_text("\n".join(header + md + ["```"] + gap_lines + gran + over + ["```", ""]))
    json.dump(
        {
            "run": {"started": started, "wall_s": wall, "machine": machine},
            "summary": {"|".join(map(str, k)): v for k, v in summary.items()},
            "verdict": verdict,
            "overhead": {"lbt_s_per_step": lbt_s, "ags_s_per_step": ags_s, "ratio": ratio, "samples": per_step},
            "granularity": gran,
        },
        open(a.out / "summary.json", "w"),
        indent=1,
    )
    console.print(f"results in {a.out}: results.jsonl, summary.md, summary.json, {', '.join(plots)}")


if __name__ == "__main__":
    main()
