"""Planner (§III-A3): predict every (N, B) in the space and choose one by objective.

* ``time``  -- the feasible configuration with the least predicted training time;
* ``cost``  -- the one with the least predicted cost;
* ``knee``  -- per cluster size, the knee of the dense predicted time-vs-global-batch
  curve (Kneedle, via ``kneed``); where Kneedle finds none, the smallest batch whose time
  is within ``KNEE_FALLBACK_TOL`` of that cluster size's fastest.  Across cluster sizes,
  the knee point with the least time.

The plan holds every evaluated configuration, the dense curves per cluster size, the
Pareto frontier of time vs cost, and a one-line reason.
"""

from __future__ import annotations

import math

import numpy as np
from kneed import KneeLocator

from .errors import InfeasibleError
from .fit import models_from
from .perfmodel import training_time_s
from .records import PLAN_KIND
from .pricing import make_pricing
from .space import candidate_global_batches, max_global_batch

KNEE_FALLBACK_TOL = 0.05
DENSE_POINTS_PER_OCTAVE = 16


def _dense_local_batches(lo: int, hi: int, extra: list[int]) -> list[int]:
    if hi < lo:
        return []
    pts = {lo, hi, *[b for b in extra if lo <= b <= hi]}
    if hi > lo:
        k = int(math.ceil(math.log2(hi / lo) * DENSE_POINTS_PER_OCTAVE)) + 1
        pts.update(int(round(v)) for v in np.geomspace(lo, hi, k))
    return sorted(pts)


def find_knee(global_batch: np.ndarray, total_time: np.ndarray) -> tuple[int, str]:
    """Index of the knee of a time-vs-batch curve and how it was found (``kneedle`` or ``fallback``).

    A curve that varies by less than the fallback tolerance has no knee worth the name
    (Kneedle would find one in rounding noise)."""
    spread = float(np.max(total_time) - np.min(total_time))
    if len(global_batch) >= 3 and spread > KNEE_FALLBACK_TOL * float(np.min(total_time)):
        kl = KneeLocator(global_batch, total_time, curve="convex", direction="decreasing", S=1.0)
        if kl.knee is not None:
            return int(np.argmin(np.abs(global_batch - kl.knee))), "kneedle"
    best = float(np.min(total_time))
    within = np.nonzero(total_time <= best * (1.0 + KNEE_FALLBACK_TOL))[0]
    return int(within[0]), "fallback"


def pareto_frontier(time_s: np.ndarray, cost: np.ndarray) -> list[int]:
    """Indices of the points no other point beats in both time and cost, by increasing time."""
    order = np.lexsort((cost, time_s))
    out, best_cost = [], math.inf
    for i in order:
        if cost[i] < best_cost:
            out.append(int(i))
            best_cost = cost[i]
    return out


def make_plan(models: dict, objective: str | None = None) -> dict:
    """Evaluate the search space with fitted models and choose a configuration."""
    spec, mem, perf = models_from(models)
    objective = objective or spec.objective
    if objective not in ("time", "cost", "knee"):
        raise ValueError(f"objective must be time, cost or knee, not {objective!r}")
    d, epochs = models["dataset_size"], spec.epochs
    pricing = make_pricing(spec.pricing)
    budget = models.get("memory_budget_bytes")
    b_mem = mem.max_local_batch(budget, spec.search.memory_safety)
    b_oom = models.get("oom_local_batch")
    grid = candidate_global_batches(spec.search, d)
    big_lo, big_hi = spec.search.min_batch, max_global_batch(spec.search, d)

    rows: list[dict] = []
    curves: dict[str, dict] = {}
    for n in spec.search.cluster_sizes:
        lo, hi = max(1, math.ceil(big_lo / n)), big_hi // n
        cand_local = [g // n for g in grid if g % n == 0 and g >= n]
        limits = [b for b in (b_mem, None if b_oom is None else b_oom - 1) if b is not None]
        for b in _dense_local_batches(lo, hi, cand_local + limits):
            reason = ""
            if b_mem is not None and b > b_mem:
                reason = f"predicted peak exceeds the memory budget (local batch > {b_mem})"
            elif b_oom is not None and b >= b_oom:
                reason = f"a local batch of {b_oom} ran out of memory while profiling"
            rows.append({"n_workers": n, "global_batch": n * b, "local_batch": b, "candidate": n * b in grid,
                         "feasible": not reason, "reason": reason})
    if not rows:
        raise InfeasibleError("the search space is empty: no global batch between min_batch and max_batch "
                              "splits over the cluster sizes")
    n_arr = np.array([r["n_workers"] for r in rows], float)
    b_arr = np.array([r["local_batch"] for r in rows], float)
    t_step = perf.t_step_s(b_arr, n_arr)
    epoch = training_time_s(t_step, n_arr * b_arr, d)
    total = epochs * epoch
    peak = mem.predict_peak_bytes(b_arr)
    cost = pricing.cost(total, n_arr, peak)
    for i, r in enumerate(rows):
        r.update(t_step_s=float(t_step[i]), epoch_time_s=float(epoch[i]), total_time_s=float(total[i]),
                 cost=float(cost[i]), peak_mem_bytes=int(peak[i]))
    feas = [i for i, r in enumerate(rows) if r["feasible"]]
    if not feas:
        raise InfeasibleError(f"no configuration is feasible: the smallest local batch in the space "
                              f"({int(b_arr.min())}) does not fit the memory budget of {budget} bytes")
    knees: dict[str, dict] = {}
    for n in spec.search.cluster_sizes:
        idx = [i for i in feas if rows[i]["n_workers"] == n]
        if not idx:
            continue
        gb = np.array([rows[i]["global_batch"] for i in idx], float)
        tt = np.array([rows[i]["total_time_s"] for i in idx])
        curves[str(n)] = {"global_batch": gb.astype(int).tolist(), "total_time_s": tt.tolist(),
                          "cost": [rows[i]["cost"] for i in idx]}
        k, how = find_knee(gb, tt)
        knees[str(n)] = {"row": idx[k], "global_batch": int(gb[k]), "method": how}

    if objective == "time":
        chosen = min(feas, key=lambda i: (rows[i]["total_time_s"], rows[i]["cost"]))
        why = "least predicted training time"
    elif objective == "cost":
        chosen = min(feas, key=lambda i: (rows[i]["cost"], rows[i]["total_time_s"]))
        why = "least predicted cost"
    else:
        chosen = min((k["row"] for k in knees.values()), key=lambda i: (rows[i]["total_time_s"], rows[i]["cost"]))
        kn = knees[str(rows[chosen]["n_workers"])]
        why = ("knee of the predicted time-vs-batch curve" if kn["method"] == "kneedle" else
               f"no knee found; smallest batch within {KNEE_FALLBACK_TOL:.0%} of the fastest")
    c = rows[chosen]
    fastest = min(rows[i]["total_time_s"] for i in feas)
    cheapest = min(rows[i]["cost"] for i in feas)
    reason = (f"{why}: N={c['n_workers']}, B={c['global_batch']} (b={c['local_batch']}) trains {epochs} epochs in "
              f"{c['total_time_s']:.1f} s for {c['cost']:.4g} {pricing.unit} "
              f"({c['total_time_s'] / fastest:.2f}x the fastest, {c['cost'] / cheapest:.2f}x the cheapest)")
    fitted_on = models.get("placement") or {}
    if fitted_on.get("n_hosts"):
        where = (f"fitted on {fitted_on['n_hosts']} host(s) with up to {fitted_on['max_ranks_per_host']} rank(s) "
                 f"per host, N <= {fitted_on['max_workers']} measured")
        if fitted_on["n_hosts"] == 1 and c["n_workers"] > 1:
            where += "; the choice's sync time is from ranks sharing one host, not a network"
        reason += f" [{where}]"
    for i, r in enumerate(rows):
        r["chosen"] = i == chosen
    front = pareto_frontier(np.array([rows[i]["total_time_s"] for i in feas]), np.array([rows[i]["cost"] for i in feas]))
    return {
        "kind": PLAN_KIND, "version": 1, "objective": objective, "choice": dict(c), "reason": reason,
        "max_local_batch": b_mem, "oom_local_batch": b_oom, "memory_budget_bytes": budget,
        "knees": {n: {"global_batch": k["global_batch"], "method": k["method"]} for n, k in knees.items()},
        "frontier": [dict(rows[feas[j]]) for j in front], "curves": curves, "configurations": rows,
        "spec": spec.to_dict(), "dataset_size": d, "fitted_on": fitted_on,
    }
