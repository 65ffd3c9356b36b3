"""The transformer's plan on this machine (issue #44, "Benchmark"): do the models fitted over
sequence lengths predict held-out (B, L, N) points, the largest batch under a memory cap, and
does the planner pick a configuration within 5 % of the fastest measured?

On the built-in ``tiny_gpt`` (2 layers, width 64) and the ``text`` data set, gloo, the CPU:

1. **Fit**: one partial profile over ``search.sequence_lengths`` (cluster sizes 1 and 2), with
   ``train.checkpointing: auto`` and ``train.parallelism: auto`` (so the profile measures the
   checkpointed and the sharded step at its few extra trials), through Tula's own profiler
   (:func:`tula.engine.profile.profile`), fitted with :func:`tula.core.fit.fit_models`.
2. **Held-out grid** (no point of it is a fitted trial): (B, L, N) with N in {1, 2} under DDP,
   plus FSDP (``train.parallelism: fsdp``) and activation checkpointing (``train.checkpointing:
   on``) points.  Each point is one real world (a one-configuration profile: its trial's step
   time and its peak as :mod:`tula.engine.memory` measures it); the points are measured
   ``--repeats`` times, interleaved (repeat 1 of every point, then repeat 2, ...), so the
   machine's repeat-to-repeat spread is measured in the same run.
3. **Predictions** (:meth:`tula.core.fitted.FittedModels.predict` at each point's N, B and L, on
   the models record of the point's run variant: :func:`tula.core.variants.variant_models`, the
   fitted checkpointing and sharding effects applied, as the planner predicts its rows) against
   the measurements: peak memory median / max error (target <= 3 % / 8 %), step time median error
   against 1.5x the median spread.  The DDP rows and the FSDP / checkpointing rows are scored
   apart; a variant the profile did not measure is predicted as plain DDP and marked not modelled.
4. **Memory cap** (``search.memory_budget_bytes``): at each L of the grid (DDP, no
   checkpointing, N = 1), and at the grid's longest L checkpointed (N = 1) and sharded (N = 2), the
   largest local batch b* whose predicted peak fits the budget; worlds at 0.95 b* and 1.05 b* check
   that the first fits and the second does not -- against the peak measured by the repo's tensor
   accounting (:mod:`tula.engine.memory`), not under an enforced address-space cap.
5. **Planner**: :func:`tula.core.plan.make_plan` (objective ``time``: tokens per second) on the
   fitted models (DDP or FSDP, checkpointing or not: the planner weighs them), planned right after
   the fit; its choice is measured among the grid's points, in the same interleaved repeats (so
   that the machine's load, which moves over minutes on a shared host, is the same for both), and
   its tokens/s compared with the fastest of the grid's points (target: within 5 %); likewise the
   grid point the models rank first.  The profile record the models were fitted on is written
   beside ``--out`` (``*.profile.json``), so that the fit and the plan can be checked again
   offline (:func:`tula.core.fit.fit_models` on it), and the load average at the fit's start and
   end and at each repeat is recorded: a fit made while the load moved predicts the worlds of one
   cluster size slower than those of another.

Run:  .venv/bin/python bench/transformer_plan.py --out runs/bench/transformer_plan.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from _stats import describe, error_stats, kendall_tau, noise_floor  # bench/, the folder the script runs from
from rich.console import Console
from rich.table import Table

from tula.core.fit import fit_models
from tula.core.fitted import FittedModels
from tula.core.plan import make_plan
from tula.core.records import ModelsRecord
from tula.core.spec import spec_from_dict
from tula.core.variants import RunVariant, run_variants, variant_models
from tula.engine.profile import profile

console = Console(width=150)  # the tables are wide; a log file is not a terminal

MODEL = {"name": "tiny_gpt", "kwargs": {"n_layers": 2, "d_model": 64, "n_heads": 2, "max_positions": 128}}
FIT_LENGTH = 32  # the data's own length: the models' reference L
MEMORY_TARGET_MEDIAN, MEMORY_TARGET_MAX, PLAN_TARGET = 0.03, 0.08, 0.05
# each timed round of a world lasts about this long (profile.min_timed_s): the fit's trials longer than the
# grid's, because the plan's choice across N and L turns on single trials (the per-token terms come from one
# trial at each other length), and a round of 0.2 s on this shared host caught load bursts (a quick run,
# 2026-11-29 09:41, load 6: N=1 b=64 L=16 timed 19.2 ms with sync and 34.4 ms without, a 78.8 % fit error)
GRID_MIN_TIMED_S, FIT_MIN_TIMED_S = 0.2, 1.0


@dataclass(frozen=True)
class Point:
    """One held-out configuration: N ranks, global batch B, sequence length L, how it trains."""

    n_workers: int
    global_batch: int
    sequence_length: int
    parallelism: str = "ddp"
    checkpointing: bool = False

    @property
    def covered(self) -> bool:
        """Whether this point is plain DDP without checkpointing (the profile's own step)."""
        return self.parallelism == "ddp" and not self.checkpointing

    @property
    def variant(self) -> RunVariant:
        return RunVariant(checkpointing=self.checkpointing, parallelism=self.parallelism)

    @property
    def label(self) -> str:
        extra = ("" if self.parallelism == "ddp" else f" {self.parallelism}") + (" ckpt" if self.checkpointing else "")
        return f"N={self.n_workers} B={self.global_batch} L={self.sequence_length}{extra}"


def grid(quick: bool) -> list[Point]:
    """The held-out points: B and L between and beside the fitted ones (B 8-64, L 16/32/64)."""
    if quick:
        return [Point(1, 24, 48), Point(2, 24, 24), Point(2, 24, 48, "fsdp"), Point(1, 24, 48, "ddp", True)]
    points = [Point(n, b, length) for n in (1, 2) for b in (12, 40, 64) for length in (24, 48)]
    points += [Point(2, b, length, "fsdp") for b in (12, 40) for length in (24, 48)]
    points += [Point(n, 40, length, "ddp", True) for n in (1, 2) for length in (24, 48)]
    points.append(Point(2, 40, 48, "fsdp", True))
    return points


def spec_dict(
    *,
    sequence_length: int,
    cluster_sizes: list[int],
    batch: tuple[int, int],
    timed_steps: int,
    min_timed_s: float = GRID_MIN_TIMED_S,
    lengths: list[int] | None = None,
    parallelism: str = "ddp",
    checkpointing: str = "off",
) -> dict:
    spec: dict = {
        "name": "bench-transformer-plan",
        "model": MODEL,
        "data": {"name": "text", "sequence_length": sequence_length, "num_samples": 1024},
        "optimizer": {"name": "adamw", "lr": 0.01},
        # lbt: a method FSDP trains (the default, ags, needs the whole gradient: auto would plan DDP only)
        "train": {"parallelism": parallelism, "checkpointing": checkpointing, "method": "lbt", "noise_scale": False},
        "search": {"cluster_sizes": cluster_sizes, "min_batch": batch[0], "max_batch": batch[1]},
        "profile": {
            "warmup_steps": 2,
            "timed_steps": timed_steps,
            "threads_per_worker": 1,
            "min_timed_s": min_timed_s,
            "noise_steps": 0,
        },
    }
    if lengths is not None:
        spec["search"]["sequence_lengths"] = lengths
    return spec


def planner_choice(plan_choice: Point, rows: list[dict], choice_row: dict) -> dict:
    """The planner's verdict from measured rows (each a grid row: ``modelled``, ``label``,
    ``global_batch``, ``sequence_length``, ``t_step_pred_s`` and, where measured, ``tokens_per_s``
    and ``t_step_s``): the choice's tokens per second (``choice_row``, measured in the same repeats)
    against the fastest measured row the planner weighs (the modelled ones; the choice is one of
    them when it lies on the grid), and the grid row the models rank first against it."""
    measured = [r for r in rows if r["modelled"] and "tokens_per_s" in r]  # the rows the planner weighs
    best = max(measured, key=lambda r: r["tokens_per_s"])
    ranked_first = max(measured, key=lambda r: r["global_batch"] * r["sequence_length"] / r["t_step_pred_s"])
    out: dict = {
        "choice": asdict(plan_choice),
        "best_grid": best["label"],
        "best_grid_tokens_per_s": best["tokens_per_s"],
    }
    if "tokens_per_s" in choice_row:
        tps = choice_row["tokens_per_s"]
        out |= {"choice_t_step_s": choice_row["t_step_s"], "choice_tokens_per_s": tps}
        out["choice_t_step_pred_s"] = choice_row["t_step_pred_s"]
        out["choice_vs_best"] = tps / max(tps, best["tokens_per_s"])
    out["models_first_in_grid"] = ranked_first["label"]
    out["models_first_vs_best"] = ranked_first["tokens_per_s"] / best["tokens_per_s"]
    return out


def measured_row(models: ModelsRecord, p: Point, ms: list[dict]) -> dict:
    """A point's row: its predictions and, from its repeats ``ms`` that ran, the median step time,
    the median peak and the tokens per second at the median step."""
    ok = [m for m in ms if m["status"] == "ok"]
    t_pred, m_pred, modelled = predict(models, p)
    row = {**asdict(p), "label": p.label, "covered": p.covered, "modelled": modelled}
    row["statuses"] = [m["status"] for m in ms]
    row |= {"t_step_pred_s": t_pred, "peak_pred_bytes": m_pred}
    if ok:
        times = [m["t_step_s"] for m in ok]
        row |= {"t_step_s": times, "t_step_median_s": float(np.median(times))}
        row |= {"peak_mem_bytes": float(np.median([m["peak_mem_bytes"] for m in ok]))}
        row |= {"tokens_per_s": p.global_batch * p.sequence_length / float(np.median(times))}
    return row


def measure(p: Point, timed_steps: int) -> dict:
    """One world at ``p``: its trial's step time and measured peak (a one-configuration profile)."""
    spec = spec_dict(
        sequence_length=p.sequence_length,
        cluster_sizes=[p.n_workers],
        batch=(p.global_batch, p.global_batch),
        timed_steps=timed_steps,
        parallelism=p.parallelism,
        checkpointing="on" if p.checkpointing else "off",
    )
    rec = profile(spec_from_dict(spec), "partial")
    trial = next((t for t in rec.trials if t.n_workers == p.n_workers and t.global_batch == p.global_batch), None)
    if trial is None or trial.status != "ok":
        return {"status": "missing" if trial is None else trial.status, "note": "" if trial is None else trial.note}
    return {"status": "ok", "t_step_s": trial.t_step_s, "peak_mem_bytes": trial.peak_mem_bytes}


def fitted_for(models: ModelsRecord, variant: RunVariant) -> tuple[FittedModels, bool]:
    """The fitted models a row of ``variant`` is predicted with, as the planner predicts it
    (:func:`tula.core.variants.variant_models`), and whether the variant is modelled (the profile
    measured its effect); a variant it did not measure: plain DDP's, not modelled."""
    if variant in run_variants(models.spec, models):
        return FittedModels.from_record(variant_models(models, variant)), True
    return FittedModels.from_record(variant_models(models, RunVariant(False))), variant == RunVariant(False)


def predict(models: ModelsRecord, p: Point) -> tuple[float, float, bool]:
    """The models' step time (s) and peak (bytes) at ``p``, under its variant's models, and whether
    that variant is modelled (:func:`fitted_for`)."""
    fitted, modelled = fitted_for(models, p.variant)
    pr = fitted.predict(n_workers=p.n_workers, global_batch=p.global_batch, sequence_length=p.sequence_length)
    assert pr.peak_mem_bytes is not None, "the models record has no memory model"
    return float(pr.t_step_s[0]), float(pr.peak_mem_bytes[0]), modelled


def largest_fitting_batch(
    models: ModelsRecord, length: int, budget_bytes: int, variant: RunVariant, n_workers: int = 1, limit: int = 4096
) -> int:
    """The largest local batch on ``n_workers`` whose predicted peak at L, under ``variant``'s
    models, is within the budget (no safety share)."""
    b = np.arange(1, limit + 1)
    pr = fitted_for(models, variant)[0].predict(n_workers=n_workers, local_batch=b, sequence_length=length)
    assert pr.peak_mem_bytes is not None
    fits = np.nonzero(np.asarray(pr.peak_mem_bytes, float) <= budget_bytes)[0]
    return int(b[fits[-1]]) if fits.size else 0


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(args: argparse.Namespace) -> dict:
    quick, timed = args.quick, args.timed_steps
    lengths = [16, 32] if quick else [16, 32, 64]
    res: dict = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {_cpu_model()}",
        "torch": torch.__version__,
        "quick": quick,
        "repeats": args.repeats,
        "timed_steps": timed,
        "load_average_start": _load(),
    }
    console.print(
        f"date {res['date_utc']} UTC; machine {res['machine']}; torch {res['torch']}; "
        f"load average (1, 5, 15 min) {res['load_average_start']}; repeats {args.repeats}, timed steps {timed}"
    )
    t0 = time.perf_counter()
    fit_spec = spec_dict(
        sequence_length=FIT_LENGTH,
        cluster_sizes=[1, 2],
        batch=(8, 64),
        timed_steps=timed,
        min_timed_s=FIT_MIN_TIMED_S,
        lengths=lengths,
        parallelism="auto",
        checkpointing="auto",
    )
    rec = profile(spec_from_dict(fit_spec), "partial")
    res["load_average_after_profile"] = _load()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    profile_path = args.out.with_name(args.out.stem + ".profile.json")
    profile_path.write_text(json.dumps(rec.to_json_dict(), indent=1))
    res["profile_record"] = str(profile_path)
    models = fit_models(rec)
    fitted_points = sorted(
        (t.n_workers, t.global_batch, t.sequence_length or FIT_LENGTH) for t in rec.trials if t.status == "ok"
    )
    res["variant_trials"] = sorted(
        (t.n_workers, t.global_batch, t.parallelism or "ddp", bool(t.checkpointing))
        for t in rec.trials
        if t.status == "ok" and (t.checkpointing or t.parallelism)
    )
    res["checkpointing_effect"] = None if models.checkpointing is None else models.checkpointing.to_dict()
    res["sharding_effect"] = None if models.sharding is None else models.sharding.to_dict()
    res["profile_s"] = time.perf_counter() - t0
    res["fitted_trials"] = fitted_points
    res["fit_error"] = models.fit_error
    res["perf_model"] = models.perf.to_dict()
    console.print(
        f"fitted on {len(fitted_points)} trials (N, B, L) {fitted_points} in {res['profile_s']:.0f} s; "
        f"load average {res['load_average_start']} -> {res['load_average_after_profile']}; step-time fit error "
        f"median {_pct(models.fit_error['t_step_median_rel'])}, max {_pct(models.fit_error['t_step_max_rel'])}"
    )
    # the planner's choice, planned now so that it is measured in the grid's repeats
    plan = make_plan(models, "time")
    c = plan.choice
    choice = Point(c.n_workers, c.global_batch, c.sequence_length or FIT_LENGTH, c.parallelism, c.checkpointing)

    # ---------------------------------------------------------------- the held-out grid and the choice, interleaved
    points = grid(quick)
    assert not {(p.n_workers, p.global_batch, p.sequence_length) for p in points} & set(fitted_points)
    measured_points = points if choice in points else [*points, choice]
    reps: list[list[dict]] = [[] for _ in measured_points]
    res["load_average_repeats"] = []
    t0 = time.perf_counter()
    for r in range(args.repeats):
        for i, p in enumerate(measured_points):
            reps[i].append(measure(p, timed))
        res["load_average_repeats"].append(_load())
        console.print(f"repeat {r + 1} of {args.repeats} done ({time.perf_counter() - t0:.0f} s)")
    rows = [measured_row(models, p, ms) for p, ms in zip(points, reps)]
    choice_row = rows[points.index(choice)] if choice in points else measured_row(models, choice, reps[-1])
    res["grid_s"] = time.perf_counter() - t0
    res["grid"] = rows

    # spread: every pair of repeats of a point, |a / b - 1|
    pairs = [(r["t_step_s"][i], r["t_step_s"][j]) for r in rows if "t_step_s" in r
             for i in range(len(r["t_step_s"])) for j in range(i + 1, len(r["t_step_s"]))]  # fmt: skip
    res["spread_t_step"] = noise_floor([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None
    groups = {
        "covered": lambda r: r["covered"],
        "variants": lambda r: not r["covered"] and r["modelled"],
        "not_modelled": lambda r: not r["modelled"],
    }
    for group, keep in groups.items():
        sel = [r for r in rows if keep(r) and "t_step_median_s" in r]
        if not sel:
            continue
        res[f"t_step_{group}"] = error_stats([r["t_step_pred_s"] for r in sel], [r["t_step_median_s"] for r in sel])
        res[f"peak_{group}"] = error_stats([r["peak_pred_bytes"] for r in sel], [r["peak_mem_bytes"] for r in sel])
        if len(sel) > 1:
            res[f"tau_{group}"] = kendall_tau(
                [r["t_step_pred_s"] / r["global_batch"] / r["sequence_length"] for r in sel],
                [r["t_step_median_s"] / r["global_batch"] / r["sequence_length"] for r in sel],
            )

    # ---------------------------------------------------------------- the memory cap
    budget = int(predict(models, Point(1, 32, FIT_LENGTH))[1])  # b* = 32 at the fitted length
    res["memory_budget_bytes"] = budget
    caps = []
    grid_lengths = sorted({p.sequence_length for p in points})
    cap_points = [(length, RunVariant(False), 1) for length in grid_lengths]
    cap_points += [(grid_lengths[-1], RunVariant(True), 1), (grid_lengths[-1], RunVariant(False, "fsdp"), 2)]
    for length, variant, n in cap_points:
        if not fitted_for(models, variant)[1]:
            continue  # the profile did not measure the variant
        b_star = largest_fitting_batch(models, length, budget, variant, n)
        row: dict = {"sequence_length": length, "b_star": b_star, "n_workers": n, "variant": asdict(variant)}
        for factor in (0.95, 1.05):
            b = max(1, int(round(factor * b_star)))
            if factor > 1 and b == b_star:
                b += 1
            m = measure(Point(n, n * b, length, variant.parallelism, variant.checkpointing), timed)
            peak = m.get("peak_mem_bytes")
            row[str(factor)] = {
                "local_batch": b,
                "peak_mem_bytes": peak,
                "fits": None if peak is None else peak <= budget,
            }
        row["met"] = row["0.95"]["fits"] is True and row["1.05"]["fits"] is False
        caps.append(row)
    res["memory_cap"] = caps

    # ---------------------------------------------------------------- the planner
    planner = planner_choice(choice, rows, choice_row)
    planner |= {"reason": plan.reason, "choice_in_grid": choice in points}
    res["planner"] = planner
    res["load_average_end"] = _load()
    return res


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "cpu"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def report(res: dict) -> list[str]:
    """Print the tables and the verdicts; return the verdict lines."""
    tab = Table(title="Held-out grid: measured (median of the repeats) and predicted")
    for col in ("configuration", "modelled", "step ms (repeats)", "pred ms", "err", "peak MiB", "pred MiB", "err"):
        tab.add_column(col, justify="right")
    for r in res["grid"]:
        if "t_step_median_s" not in r:
            tab.add_row(r["label"], "yes" if r["modelled"] else "no", "/".join(r["statuses"]), "", "", "", "", "")
            continue
        tab.add_row(
            r["label"],
            "yes" if r["modelled"] else "no",
            " / ".join(f"{1e3 * t:.1f}" for t in r["t_step_s"]),
            f"{1e3 * r['t_step_pred_s']:.1f}",
            _pct(abs(r["t_step_pred_s"] / r["t_step_median_s"] - 1)),
            f"{r['peak_mem_bytes'] / 2**20:.2f}",
            f"{r['peak_pred_bytes'] / 2**20:.2f}",
            _pct(abs(r["peak_pred_bytes"] / r["peak_mem_bytes"] - 1)),
        )
    console.print(tab)
    spread = res["spread_t_step"]
    lines = []
    if "load_average_after_profile" in res:
        fe = res["fit_error"]
        lines.append(
            f"fit: load average {res['load_average_start']} at the profile's start, {res['load_average_after_profile']} "
            f"at its end, {res.get('load_average_repeats')} after each repeat; step-time error on its own trials "
            f"median {_pct(fe['t_step_median_rel'])}, max {_pct(fe['t_step_max_rel'])}"
        )
    if spread is not None:
        lines.append(describe("step time, repeat-to-repeat spread (every pair of repeats)", spread))
    groups = (
        ("covered", "DDP, no checkpointing"),
        ("variants", "FSDP or checkpointing (the fitted effects)"),
        ("not_modelled", "NOT MODELLED (a variant the profile did not measure)"),
    )
    for group, what in groups:
        if f"t_step_{group}" not in res:
            continue
        lines.append(describe(f"step time, {what}", res[f"t_step_{group}"], spread, res.get(f"tau_{group}")))
        lines.append(describe(f"peak memory, {what}", res[f"peak_{group}"]))
    st, pk = res.get("t_step_covered"), res.get("peak_covered")
    if pk is not None:
        ok = pk["median"] <= MEMORY_TARGET_MEDIAN and pk["max"] <= MEMORY_TARGET_MAX
        lines.append(
            f"target peak memory median <= 3 %, max <= 8 % (DDP rows): {'met' if ok else 'MISSED'} "
            f"({_pct(pk['median'])}, {_pct(pk['max'])})"
        )
    if st is not None and spread is not None:
        ok = st["median"] <= 1.5 * spread["median"]
        lines.append(
            f"target step time median <= 1.5x the spread (DDP rows): {'met' if ok else 'MISSED'} "
            f"({_pct(st['median'])} against 1.5 x {_pct(spread['median'])})"
        )
    pv = res.get("peak_variants")
    if pv is not None:
        ok = pv["median"] <= MEMORY_TARGET_MEDIAN and pv["max"] <= MEMORY_TARGET_MAX
        lines.append(
            f"target peak memory median <= 3 %, max <= 8 % (FSDP / checkpointing rows): {'met' if ok else 'MISSED'} "
            f"({_pct(pv['median'])}, {_pct(pv['max'])})"
        )
    lines.append(f"memory cap {res['memory_budget_bytes'] / 2**20:.2f} MiB:")
    for c in res["memory_cap"]:
        lo, hi = c["0.95"], c["1.05"]
        v = RunVariant(**c["variant"])
        how = v.parallelism + (" ckpt" if v.checkpointing else "")
        lines.append(
            f"  L={c['sequence_length']} N={c['n_workers']} {how}: b* {c['b_star']}; "
            f"b={lo['local_batch']} peak {_mib(lo['peak_mem_bytes'])} "
            f"fits={lo['fits']}; b={hi['local_batch']} peak {_mib(hi['peak_mem_bytes'])} fits={hi['fits']}: "
            f"{'met' if c['met'] else 'MISSED'}"
        )
    pl = res["planner"]
    ratio = pl.get("choice_vs_best")
    lines.append(
        f"planner chose {Point(**pl['choice']).label} ({'a grid point' if pl['choice_in_grid'] else 'not a grid point'}): "
        f"{_tps(pl.get('choice_tokens_per_s'))} against the grid's "
        f"fastest {pl['best_grid']} {_tps(pl['best_grid_tokens_per_s'])}: "
        + ("not measured" if ratio is None else f"{ratio:.3f}x ({'met' if ratio >= 1 - PLAN_TARGET else 'MISSED'})")
    )
    lines.append(
        f"the models' first of the grid {pl['models_first_in_grid']}: {pl['models_first_vs_best']:.3f}x the fastest"
    )
    lines.append(f"load average at the end (1, 5, 15 min): {res['load_average_end']}")
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    return lines


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:.2f} MiB"


def _tps(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} tokens/s"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/bench/transformer_plan.json"))
    ap.add_argument("--quick", action="store_true", help="two lengths, four held-out points (about a minute)")
    ap.add_argument("--repeats", type=int, default=None, help="measurements of each point (default 3, quick 2)")
    ap.add_argument("--timed-steps", type=int, default=None, help="timed steps per world (default 5, quick 3)")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 3)
    args.timed_steps = args.timed_steps or (3 if args.quick else 5)
    t0 = time.perf_counter()
    res = run(args)
    res["wall_s"] = time.perf_counter() - t0
    res["verdicts"] = report(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=float))
    console.print(f"results in {args.out}; {res['wall_s']:.0f} s")
    return res


if __name__ == "__main__":
    main()
