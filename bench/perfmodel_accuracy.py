"""How well do Tula's fitted models predict step time and peak memory on this machine?

For each model, this benchmark runs real DDP profiles through Tula's own profiler:

* one **partial** search (extreme cluster sizes x extreme batches: 4 trials),
* two **full** searches of the same grid (N in {1, 2}, 6 global batches), A and B.

It fits one model from the partial profile and one from full profile A, and scores both
against the step times and peaks measured in full profile B (so neither is scored on the
measurements it was fitted to).  The noise floor is the relative difference between the
two full profiles' measurements of the same configuration.  It prints median and max
relative errors and the profiling seconds of partial vs full search.

Run:  .venv/bin/python bench/perfmodel_accuracy.py [--timed-steps 10] [--models small_cnn,resnet18]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _stats import describe, kendall_tau, summarise  # bench/, the folder the script runs from
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tula.core.events import Event, TrialFinished, TrialsPlanned
from tula.core.fit import fit_models, save_record
from tula.core.spec import spec_from_dict
from tula.engine.memory import MemoryModel
from tula.engine.profile import profile

WORKLOADS: dict[str, dict[str, Any]] = {
    "small_cnn": {
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 32}},
        "data": {"name": "digits"},
        "search": {"min_batch": 16, "max_batch": 512},
    },
    "resnet18": {
        "model": {"name": "resnet18", "kwargs": {"num_classes": 10}},
        "data": {"name": "synthetic", "sample_shape": [3, 32, 32], "num_samples": 2048},
        "search": {"min_batch": 8, "max_batch": 256},
    },
    "mobilenet_v3_small": {
        "model": {"name": "mobilenet_v3_small", "kwargs": {"num_classes": 10}},
        "data": {"name": "synthetic", "sample_shape": [3, 32, 32], "num_samples": 2048},
        "search": {"min_batch": 8, "max_batch": 256},
    },
}

console = Console()


def _profile(spec, search: str, label: str) -> dict:
    with Progress(
        TextColumn(f"[bold]{label}[/] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("memory probe", total=None)

        def on_event(ev: Event) -> None:
            if isinstance(ev, TrialsPlanned):
                bar.update(task, total=ev.total, description="trials")
            elif isinstance(ev, TrialFinished):  # not the profile's other events (Checked, ...), which name no trial
                bar.update(task, advance=1, description=f"N={ev.n_workers} B={ev.global_batch}")

        return profile(spec, search, on_event=on_event).to_json_dict()  # the comparisons read the trials' JSON


def _key(t):
    return t["n_workers"], t["global_batch"]


def _rel(pred, meas):
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return np.abs(pred - meas) / meas


def evaluate(name: str, timed_steps: int, out_dir: Path) -> dict:
    w = WORKLOADS[name]
    spec = spec_from_dict(
        {
            "name": f"bench-{name}",
            **w,
            "epochs": 1,
            "search": {**w["search"], "cluster_sizes": [1, 2]},
            "profile": {"warmup_steps": 3, "timed_steps": timed_steps},
        }
    )
    t0 = time.perf_counter()
    part = _profile(spec, "partial", f"{name} partial")
    t_part = time.perf_counter() - t0
    t0 = time.perf_counter()
    full_a = _profile(spec, "full", f"{name} full A")
    t_full = time.perf_counter() - t0
    full_b = _profile(spec, "full", f"{name} full B")
    for label, rec in (("partial", part), ("full_a", full_a), ("full_b", full_b)):
        save_record(rec, out_dir / f"{name}_{label}.json")

    truth = {_key(t): t for t in full_b["trials"] if t["status"] == "ok"}
    a = {_key(t): t for t in full_a["trials"] if t["status"] == "ok"}
    common = sorted(set(truth) & set(a))
    noise = _rel([a[k]["t_step_s"] for k in common], [truth[k]["t_step_s"] for k in common])
    noise_mem = _rel([a[k]["peak_mem_bytes"] for k in common], [truth[k]["peak_mem_bytes"] for k in common])

    n = np.array([k[0] for k in common], float)
    b = np.array([truth[k]["local_batch"] for k in common], float)
    meas_t = [truth[k]["t_step_s"] for k in common]
    meas_m = [truth[k]["peak_mem_bytes"] for k in common]
    res: dict[str, Any] = {
        "model": name,
        "configs": len(common),
        "partial_trials": len(part["trials"]),
        "profiling_s_partial": t_part,
        "profiling_s_full": t_full,
        "noise_t_step_median": float(np.median(noise)),
        "noise_t_step_max": float(noise.max()),
        "noise_mem_max": float(noise_mem.max()),
        "per_config": {f"N={k[0]} B={k[1]}": {"measured_s": truth[k]["t_step_s"]} for k in common},
        "stats": {"noise_t_step": summarise(noise), "noise_mem": summarise(noise_mem)},
    }
    global_b = np.array([k[1] for k in common], float)
    for label, rec in (("partial", part), ("full", full_a)):
        models = fit_models(rec)
        perf, mem = models.perf, models.memory
        pred_t = perf.t_step_s(b, n)
        e_t = _rel(pred_t, meas_t)
        e_m = _rel(mem.predict_peak_bytes(b, n), meas_m)
        res[f"t_step_{label}_median"] = float(np.median(e_t))
        res[f"t_step_{label}_max"] = float(e_t.max())
        res[f"mem_{label}_median"] = float(np.median(e_m))
        res[f"mem_{label}_max"] = float(e_m.max())
        res["stats"][f"t_step_{label}"] = summarise(e_t)
        res["stats"][f"mem_{label}"] = summarise(e_m)
        # a plan ranks configurations by their time per sample: the step over the global batch
        res["stats"][f"tau_{label}"] = kendall_tau(pred_t / global_b, np.asarray(meas_t) / global_b)
        res[f"perf_{label}"] = models.to_json_dict()["perf"]
        for k, p in zip(common, pred_t):
            res["per_config"][f"N={k[0]} B={k[1]}"][f"{label}_pred_s"] = float(p)
    # the memory model straight from the two probe steps, before any trial refines it
    probed = MemoryModel.from_dict(part["memory"])
    e_probe = _rel(probed.predict_peak_bytes(b, n), meas_m)
    res["mem_probe_only_median"], res["mem_probe_only_max"] = float(np.median(e_probe)), float(e_probe.max())
    res["stats"]["mem_probe_only"] = summarise(e_probe)
    return res


def stat_lines(r: dict) -> list[str]:
    """The accuracy as the field states it (``bench/_stats.py``): mean, median, p95 and max, each
    beside the noise floor of the same run (profile A against profile B), and Kendall's tau."""
    s, name = r["stats"], r["model"]
    return [
        describe(f"{name} step time, partial search", s["t_step_partial"], s["noise_t_step"], s["tau_partial"]),
        describe(f"{name} step time, full search", s["t_step_full"], s["noise_t_step"], s["tau_full"]),
        describe(f"{name} peak memory, partial fit", s["mem_partial"], s["noise_mem"]),
        describe(f"{name} peak memory, probe only", s["mem_probe_only"], s["noise_mem"]),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="small_cnn,resnet18", help="comma-separated: " + ", ".join(WORKLOADS))
    ap.add_argument("--timed-steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/perfmodel_accuracy"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    console.print(
        f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; machine {platform.machine()} "
        f"{os.cpu_count()} cores, {platform.processor() or 'cpu'}; torch {torch.__version__}; "
        f"timed steps {args.timed_steps}"
    )
    results = [evaluate(m.strip(), args.timed_steps, args.out) for m in args.models.split(",")]
    (args.out / "results.json").write_text(json.dumps(results, indent=1))

    tab = Table(title="Prediction error vs a second full profile (median / max relative error)")
    for col in (
        "model",
        "configs",
        "noise t_step",
        "partial t_step",
        "full t_step",
        "memory (partial)",
        "memory (probe only)",
        "profiling s partial / full",
    ):
        tab.add_column(col, justify="right")
    for r in results:
        tab.add_row(
            r["model"],
            str(r["configs"]),
            f"{r['noise_t_step_median']:.1%} / {r['noise_t_step_max']:.1%}",
            f"{r['t_step_partial_median']:.1%} / {r['t_step_partial_max']:.1%}",
            f"{r['t_step_full_median']:.1%} / {r['t_step_full_max']:.1%}",
            f"{r['mem_partial_median']:.1%} / {r['mem_partial_max']:.1%}",
            f"{r['mem_probe_only_median']:.1%} / {r['mem_probe_only_max']:.1%}",
            f"{r['profiling_s_partial']:.0f} / {r['profiling_s_full']:.0f}",
        )
    console.print(tab)
    for r in results:
        t = Table(title=f"{r['model']}: step time per configuration (ms)")
        for col in ("config", "measured (B)", "partial pred", "full pred"):
            t.add_column(col, justify="right")
        for k, v in r["per_config"].items():
            t.add_row(
                k, f"{1e3 * v['measured_s']:.2f}", f"{1e3 * v['partial_pred_s']:.2f}", f"{1e3 * v['full_pred_s']:.2f}"
            )
        console.print(t)
    targets = [
        ("partial t_step median <= 5%", all(r["t_step_partial_median"] <= 0.05 for r in results)),
        ("full t_step median <= 3%", all(r["t_step_full_median"] <= 0.03 for r in results)),
        ("memory median <= 3%", all(r["mem_partial_median"] <= 0.03 for r in results)),
    ]
    for what, ok in targets:
        console.print(f"target {what}: {'met' if ok else 'MISSED'}")
    for r in results:
        for line in stat_lines(r):
            console.print(line, highlight=False, soft_wrap=True)
    console.print(f"raw profiles and results in {args.out}")


if __name__ == "__main__":
    main()
