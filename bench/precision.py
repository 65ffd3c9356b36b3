"""Step time and peak memory of the same job in fp32 and bf16, predicted against measured (issue #18).

For each precision, a real ``tula profile --search full`` (small_cnn width 32 on digits, N in
{1, 2}, global batches 32..512, 1 torch thread per rank); the models are fitted on the partial
subset of that profile (each N at its smallest and largest batch, as ``--search partial``
measures) and every other trial is held out: its step time and peak memory are predicted by
the fitted models and compared with the measured ones.  Also: bf16's step time and bytes per
sample relative to fp32's, measured.  CPU here (bf16 autocast on CPU); on a GPU the same script
measures CUDA's bf16.

Run:  .venv/bin/python bench/precision.py
"""

from __future__ import annotations

import copy
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
from _stats import describe, kendall_tau, summarise  # bench/, the folder the script runs from

from tula.core.fit import fit_models
from tula.core.perfmodel import ranks_per_node_of

BIN = Path(sys.executable).parent
SPEC = {
    "name": "precision-bench",
    "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 32}},
    "data": {"name": "digits"},
    "search": {"cluster_sizes": [1, 2], "min_batch": 32, "max_batch": 512},
    "profile": {"warmup_steps": 2, "timed_steps": 8, "threads_per_worker": 1},
}


def profile(precision: str, tmp: Path) -> dict:
    spec = tmp / f"{precision}.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "train": {"precision": precision}}))
    out = tmp / precision / "profile.json"
    r = subprocess.run([str(BIN / "tula"), "profile", str(spec), "--search", "full", "--out", str(out)],
                       capture_output=True, text=True, timeout=1800)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"the {precision} profile failed: {r.stderr[-2000:]}")
    return json.loads(out.read_text())


def partial(prof: dict) -> tuple[dict, set[tuple[int, int]]]:
    sub = copy.deepcopy(prof)
    ok = [t for t in prof["trials"] if t["status"] == "ok"]
    keep: set[tuple[int, int]] = set()
    for n in {t["n_workers"] for t in ok}:
        bs = sorted(t["global_batch"] for t in ok if t["n_workers"] == n)
        keep |= {(n, bs[0]), (n, bs[-1])}
    sub["trials"] = [t for t in prof["trials"] if (t["n_workers"], t["global_batch"]) in keep]
    return sub, keep


def judge(prof: dict) -> dict:
    sub, kept = partial(prof)
    models = fit_models(sub)
    mm, perf = models.memory, models.perf
    rpn = ranks_per_node_of(models.trials)
    held = [t for t in prof["trials"] if t["status"] == "ok" and (t["n_workers"], t["global_batch"]) not in kept]
    step_err = [abs(float(perf.t_step_s(t["local_batch"], t["n_workers"], rpn)) - t["t_step_s"]) / t["t_step_s"]
                for t in held]  # fmt: skip
    mem_err = [
        abs(mm.predict_peak_bytes(t["local_batch"], t["n_workers"]) - t["peak_mem_bytes"]) / t["peak_mem_bytes"]
        for t in held
    ]
    pred_per_sample = [float(perf.t_step_s(t["local_batch"], t["n_workers"], rpn)) / t["global_batch"] for t in held]
    stats = {"step": summarise(step_err), "mem": summarise(mem_err),
             "tau": kendall_tau(pred_per_sample, [t["t_step_s"] / t["global_batch"] for t in held])}  # fmt: skip
    return {"stats": stats, "held_out": len(held), "step_median": statistics.median(step_err), "step_max": max(step_err),
            "mem_median": statistics.median(mem_err), "mem_max": max(mem_err),
            "bytes_per_sample": mm.bytes_per_sample, "precision": mm.precision,
            "t_step_s": {(t["n_workers"], t["global_batch"]): t["t_step_s"] for t in prof["trials"] if t["status"] == "ok"},
            "peak": {(t["n_workers"], t["global_batch"]): t["peak_mem_bytes"] for t in prof["trials"] if t["status"] == "ok"}}  # fmt: skip


def main() -> None:
    print(f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.machine()}, {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        res = {p: judge(profile(p, Path(tmp))) for p in ("fp32", "bf16")}
    print(
        "| precision | held-out trials | step time error median (max) | peak memory error median (max) | bytes/sample |"
    )
    print("|---|---:|---:|---:|---:|")
    for p, r in res.items():
        print(f"| {p} | {r['held_out']} | {100 * r['step_median']:.1f} % ({100 * r['step_max']:.1f} %) | "
              f"{100 * r['mem_median']:.1f} % ({100 * r['mem_max']:.1f} %) | {r['bytes_per_sample']} |")  # fmt: skip
    for p, r in res.items():  # the field's statistics; one profile per precision: no noise floor of its own
        print(describe(f"{p} step time, held out", r["stats"]["step"], None, r["stats"]["tau"]))
        print(describe(f"{p} peak memory, held out", r["stats"]["mem"], None))
    common = sorted(set(res["fp32"]["t_step_s"]) & set(res["bf16"]["t_step_s"]))
    speed = statistics.median(res["fp32"]["t_step_s"][c] / res["bf16"]["t_step_s"][c] for c in common)
    mem = statistics.median(res["bf16"]["peak"][c] / res["fp32"]["peak"][c] for c in common)
    print(
        f"bf16 vs fp32, measured over {len(common)} configurations: step time x{1 / speed:.2f} "
        f"(median), peak memory x{mem:.2f} (median)"
    )


if __name__ == "__main__":
    main()
