"""How far is ``tula simulate`` from configurations measured here but left out of the fit?

Runs a real ``tula profile`` of the digits example (``src/tula/examples/digits.yaml``, search
full: N in {1, 2} x global batches 128..1024) twice (A and B, minutes apart), or reads
profiles given with ``--profile``.  From profile A it refits the models without some
measured configurations and simulates those (:func:`tula.core.simulate.simulator_from_models`,
no override: the fitted network and compute, the fitted collective), then prints the
relative error of the simulated step time -- and so of the epoch and total time, which are
``E * floor(D / B)`` times it -- per held-out configuration against A's measurement (and
against B's), and the median per hold-out:

* ``largest batch``  -- every trial at the largest global batch held out (extrapolating up in B);
* ``smallest batch`` -- every trial at the smallest global batch held out (extrapolating down);
* ``N=2``            -- every two-worker trial held out: a fit on one worker alone, which
                        knows no sync time and no co-location (what a one-node profile tells);
* ``leave one out``  -- each configuration held out in turn.

The noise floor is the relative difference between A's and B's measurement of the same
configuration: no simulation of a held-out configuration can be expected to be closer.

Run:  python bench/simulate_accuracy.py [--profile A.json [B.json]] [--timed-steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from _stats import describe, kendall_tau, summarise  # bench/, the folder the script runs from
from rich.console import Console
from rich.table import Table

from tula.core.fit import fit_models
from tula.core.records import ProfileRecord, load_profile
from tula.core.schedules import steps_per_epoch
from tula.core.simulate import simulator_from_models
from tula.core.trial import Trial

ROOT = Path(__file__).resolve().parents[1]
console = Console(width=140)


def run_profile(spec_path: Path, out: Path, timed_steps: int) -> ProfileRecord:
    """A real ``tula profile --search full`` of the spec (timed steps overridden)."""
    spec = yaml.safe_load(spec_path.read_text())
    spec.setdefault("profile", {})["timed_steps"] = timed_steps
    tmp = out.with_suffix(".yaml")
    tmp.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "tula.cli", "profile", str(tmp), "--search", "full", "--out", str(out), "--force"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"tula profile failed ({r.returncode}): {r.stderr[-2000:]}")
    console.print(f"profiled {out.name} in {time.perf_counter() - t0:.0f} s")
    return load_profile(out)


def _key(t: Trial) -> tuple[int, int]:
    return t.n_workers, t.global_batch


def simulate_held_out(prof: ProfileRecord, held: set[tuple[int, int]]) -> list[dict]:
    """Refit ``prof`` without the ``held`` configurations; simulate each of them."""
    models = fit_models(prof.model_copy(update={"trials": [t for t in prof.trials if _key(t) not in held]}))
    sim = simulator_from_models(models)
    coll, epochs, d = models.perf.collective, sim.epochs, sim.dataset_size
    out = []
    for t in prof.trials:
        if _key(t) not in held or t.status != "ok" or t.t_step_s is None:
            continue
        row = sim.constant(t.global_batch, [t.n_workers], [coll])[0]
        assert row.t_step_s is not None, "a configuration the profile ran is simulated"
        measured_total = epochs * steps_per_epoch(d, t.global_batch) * t.t_step_s
        out.append(
            {
                "n_workers": t.n_workers,
                "global_batch": t.global_batch,
                "measured_s": t.t_step_s,
                "simulated_s": row.t_step_s,
                "measured_total_s": measured_total,
                "simulated_total_s": row.total_time_s,
                "rel_error": abs(row.t_step_s - t.t_step_s) / t.t_step_s,
                "frozen": list(models.perf.frozen),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", type=Path, default=ROOT / "src" / "tula" / "examples" / "digits.yaml")
    ap.add_argument("--profile", type=Path, nargs="+", help="profile A (and B) to read instead of profiling")
    ap.add_argument("--timed-steps", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/simulate_accuracy"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    console.print(
        f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; machine {platform.machine()} {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.1f}; spec {args.spec.name}"
    )
    if args.profile:
        profs = [load_profile(p) for p in args.profile]
    else:
        profs = [run_profile(args.spec, args.out / f"profile_{x}.json", args.timed_steps) for x in "AB"]
    a = profs[0]
    ok = sorted(_key(t) for t in a.trials if t.status == "ok")
    batches = sorted({b for _, b in ok})
    schemes = {
        "largest batch": [{k for k in ok if k[1] == batches[-1]}],
        "smallest batch": [{k for k in ok if k[1] == batches[0]}],
        "N=2": [{k for k in ok if k[0] == 2}],
        "leave one out": [{k} for k in ok],
    }
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "spec": str(args.spec),
        "configs": ok,
        "schemes": {},
    }

    noise, b_steps = {}, {}
    if len(profs) > 1:
        b_steps = {_key(t): t.t_step_s for t in profs[1].trials if t.status == "ok" and t.t_step_s is not None}
        noise = {
            _key(t): abs(t.t_step_s - b_steps[_key(t)]) / b_steps[_key(t)]
            for t in a.trials
            if t.status == "ok" and t.t_step_s is not None and _key(t) in b_steps
        }
        results["noise"] = {f"N={k[0]} B={k[1]}": v for k, v in noise.items()}

    summary = Table(title="Simulated step time of held-out configurations: relative error (median / max)")
    for col in ("held out", "configs", "median", "max", "median vs B", "noise floor A-B (median)"):
        summary.add_column(col, justify="right" if col != "held out" else "left")
    lines = []
    for name, helds in schemes.items():
        rows = [r for held in helds for r in simulate_held_out(a, held)]
        errs = np.array([r["rel_error"] for r in rows])
        results["schemes"][name] = {"rows": rows, "median": float(np.median(errs)), "max": float(errs.max())}
        t = Table(title=f"held out: {name}")
        for col in (
            "N",
            "B",
            "measured ms (A)",
            "simulated ms",
            "rel. error",
            "rel. error vs B",
            f"total s measured / simulated ({a.spec.epochs} epochs)",
            "noise A-B",
            "frozen in the fit",
        ):
            t.add_column(col, justify="right")
        for r in rows:
            k = (r["n_workers"], r["global_batch"])
            r["rel_error_vs_b"] = abs(r["simulated_s"] - b_steps[k]) / b_steps[k] if k in b_steps else None
            t.add_row(
                str(k[0]),
                str(k[1]),
                f"{1e3 * r['measured_s']:.2f}",
                f"{1e3 * r['simulated_s']:.2f}",
                f"{r['rel_error']:.1%}",
                "-" if r["rel_error_vs_b"] is None else f"{r['rel_error_vs_b']:.1%}",
                f"{r['measured_total_s']:.2f} / {r['simulated_total_s']:.2f}",
                f"{noise[k]:.1%}" if k in noise else "-",
                ", ".join(r["frozen"]),
            )
        console.print(t)
        nf = (
            np.median(
                [
                    noise[(r["n_workers"], r["global_batch"])]
                    for r in rows
                    if (r["n_workers"], r["global_batch"]) in noise
                ]
            )
            if noise
            else float("nan")
        )
        vs_b = [r["rel_error_vs_b"] for r in rows if r["rel_error_vs_b"] is not None]
        results["schemes"][name]["median_vs_b"] = float(np.median(vs_b)) if vs_b else None
        # the field's statistics: mean, median, p95, max; the noise floor of these configurations; the ranking
        # of the configurations by their whole run's time, simulated against measured (Kendall's tau)
        held_noise = [
            noise[(r["n_workers"], r["global_batch"])] for r in rows if (r["n_workers"], r["global_batch"]) in noise
        ]
        error_stats = summarise(errs)
        noise_stats = summarise(held_noise) if held_noise else None
        tau = kendall_tau([r["simulated_total_s"] for r in rows], [r["measured_total_s"] for r in rows])
        results["schemes"][name]["stats"] = {"error": error_stats, "noise": noise_stats, "tau": tau}
        lines.append(describe(f"held out: {name}", error_stats, noise_stats, tau))
        summary.add_row(
            name,
            str(len(rows)),
            f"{np.median(errs):.1%}",
            f"{errs.max():.1%}",
            f"{np.median(vs_b):.1%}" if vs_b else "-",
            "-" if np.isnan(nf) else f"{nf:.1%}",
        )
    console.print(summary)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    console.print(f"profiles and results in {args.out}")


if __name__ == "__main__":
    main()
