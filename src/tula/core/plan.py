"""Planner (§III-A3): predict every (N, B) in the space and choose one by objective.

* ``time``  -- the feasible configuration with the least predicted training time;
* ``cost``  -- the one with the least predicted cost;
* ``knee``  -- per cluster size, the knee of the dense predicted time-vs-global-batch
  curve (Kneedle, via ``kneed``); where Kneedle finds none, the smallest batch whose time
  is within ``KNEE_FALLBACK_TOL`` of that cluster size's fastest.  Across cluster sizes,
  the knee point with the least time.

The ``*_to_accuracy`` objectives (``time_to_accuracy``, ``cost_to_accuracy``,
``knee_to_accuracy``) plan for the time to an accuracy rather than for a number of epochs
(McCandlish et al. 2018; Pollux's goodput): a larger batch needs more epochs to reach the
same loss, so the spec's epochs, which it reaches at the reference batch B0
(``train.base_batch``), become ``epochs * (B_noise + B) / (B_noise + B0)`` at a global
batch B, where B_noise is the gradient noise scale the profile measured at the start of
training (:func:`tula.core.fit.fit_noise_scale`) or a what-if's.  Every row then also holds
``epochs_to_accuracy``, ``time_to_accuracy_s`` and ``cost_to_accuracy``; the choice, the
constraints and the knee use those, and the plan says the noise scale it assumed.  The
noise scale grows as training goes (the mean gradient shrinks), so the early estimate makes
the scaling conservative for late training: large batches pay more epochs early than late.

Under **constraints** (a deadline on the expected training time, a budget on its cost) the
choice is the best by the objective among the configurations that meet both; where none
does, a :class:`~tula.core.errors.InfeasibleError` says which constraint no configuration meets
and by how much.  Under the knee objective, a knee that misses a constraint gives way to the
configuration that meets them nearest (in log batch) to its cluster size's knee.

With **spot** pricing every time is the expected wall time with preemptions
(:mod:`tula.core.pricing`); ``compare_spot`` plans the same job on demand (or on spot, when the
spec prices on demand) and says which is cheaper and up to which preemption rate spot stays
so.

The plan holds every evaluated configuration (whether it fits in memory: ``feasible``;
whether it meets the constraints: ``meets_constraints``), the dense curves per cluster
size, the Pareto frontier of time vs cost, the constraints, and a one-line reason.
:func:`make_plan` is a plain function of a models record and options (no I/O), for the CLI
and for a service's re-plan alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from kneed import KneeLocator
from pydantic import ValidationError

from tula.core.accumulation import accumulation_for
from tula.core.errors import InfeasibleError, SpecError
from tula.core.fit import models_from
from tula.core.perfmodel import ranks_per_node_of
from tula.core.pricing import SpotPricing, make_pricing
from tula.core.records import PLAN_KIND, VERSIONS
from tula.core.registry import OBJECTIVE_NAMES, OBJECTIVES
from tula.core.run_costs import epoch_time_s, run_costs_for
from tula.core.space import candidate_global_batches, max_global_batch
from tula.core.spec import ConstraintsSpec, JobSpec, PricingSpec, format_duration, spec_from_dict

KNEE_FALLBACK_TOL = 0.05
DENSE_POINTS_PER_OCTAVE = 16


def _dense_local_batches(lo: int, hi: int, extra: list[int]) -> list[int]:
    if hi < lo:
        return []
    pts = {lo, hi, *[b for b in extra if lo <= b <= hi]}
    if hi > lo:
        k = int(math.ceil(math.log2(hi / lo) * DENSE_POINTS_PER_OCTAVE)) + 1
        pts.update(np.rint(np.geomspace(lo, hi, k)).astype(np.int64).tolist())  # rint: round half to even, as round()
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


# --------------------------------------------------------------------------- constraints
@dataclass(frozen=True)
class Constraints:
    """A deadline on the (expected) training time in seconds and a budget on its cost in the
    pricing's unit; ``None``: no such constraint."""

    deadline_s: float | None = None
    budget: float | None = None

    @classmethod
    def of(cls, value: Any) -> Constraints:
        """From ``None`` (no constraint), a :class:`Constraints`, a spec's
        :class:`~tula.core.spec.ConstraintsSpec`, or a mapping such as ``{"deadline": "8h",
        "budget": 50}``; a bad value is a :class:`~tula.core.errors.SpecError`."""
        if value is None:
            return cls()
        if isinstance(value, Constraints):
            return value
        if isinstance(value, ConstraintsSpec):
            return cls(value.deadline_s, value.budget)
        if not isinstance(value, dict):
            raise SpecError(f"constraints must be a mapping of deadline and budget, not {type(value).__name__}")
        try:
            c = ConstraintsSpec.model_validate(value)
        except ValidationError as err:
            e = err.errors()[0]
            where = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "is not a constraint (use deadline and budget)"
            raise SpecError(f"constraint {where!r}: {msg}") from None
        return cls(c.deadline_s, c.budget)

    @property
    def active(self) -> bool:
        return self.deadline_s is not None or self.budget is not None

    def describe(self, unit: str) -> str:
        """``"the 8.0 h deadline and the 50 $ budget"``."""
        parts = []
        if self.deadline_s is not None:
            parts.append(f"the {format_duration(self.deadline_s)} deadline")
        if self.budget is not None:
            parts.append(f"the {self.budget:.4g} {unit} budget")
        return " and ".join(parts) or "no constraint"

    def meets(self, total_time_s: float, cost: float) -> tuple[bool, bool]:
        """(within the deadline, within the budget); a relative 1e-9 of slack for rounding."""
        in_time = self.deadline_s is None or total_time_s <= self.deadline_s * (1 + 1e-9)
        in_budget = self.budget is None or cost <= self.budget * (1 + 1e-9) + 1e-12
        return in_time, in_budget


def _where(r: dict) -> str:
    return f"N={r['n_workers']}, B={r['global_batch']}"


def _money(x: float, unit: str) -> str:
    return f"{x:.4g} {unit}"


def _unmet(rows: list[dict], feas: list[int], cons: Constraints, unit: str, tk: str, ck: str) -> str:
    """The sentence saying which constraint no feasible configuration meets, and by how much
    (times in column ``tk``, costs in ``ck``)."""
    rows = [{**r, "total_time_s": r[tk], "cost": r[ck]} for r in rows]
    fastest = rows[min(feas, key=lambda i: (rows[i]["total_time_s"], rows[i]["cost"]))]
    cheapest = rows[min(feas, key=lambda i: (rows[i]["cost"], rows[i]["total_time_s"]))]
    late = cons.deadline_s is not None and fastest["total_time_s"] > cons.deadline_s
    dear = cons.budget is not None and cheapest["cost"] > cons.budget
    dl = f"the {format_duration(cons.deadline_s)} deadline" if cons.deadline_s is not None else ""
    bg = f"the {_money(cons.budget, unit)} budget" if cons.budget is not None else ""
    if late:
        over_t = (
            f"the fastest takes {format_duration(fastest['total_time_s'])} ({_where(fastest)}), "
            f"{format_duration(fastest['total_time_s'] - cons.deadline_s)} too long"
        )
    if dear:
        over_c = (
            f"the cheapest costs {_money(cheapest['cost'], unit)} ({_where(cheapest)}), "
            f"{_money(cheapest['cost'] - cons.budget, unit)} over it"
        )
    if late and dear:
        return f"no configuration finishes within {dl} or stays within {bg}: {over_t}, and {over_c}"
    if late:
        return f"no configuration finishes within {dl}: {over_t}"
    if dear:
        return f"no configuration stays within {bg}: {over_c}"
    # each constraint alone is met, both together are not
    in_time = [i for i in feas if cons.meets(rows[i]["total_time_s"], rows[i]["cost"])[0]]
    in_budget = [i for i in feas if cons.meets(rows[i]["total_time_s"], rows[i]["cost"])[1]]
    a = rows[min(in_time, key=lambda i: (rows[i]["cost"], rows[i]["total_time_s"]))]
    b = rows[min(in_budget, key=lambda i: (rows[i]["total_time_s"], rows[i]["cost"]))]
    return (
        f"no configuration meets both {dl} and {bg}: the cheapest within the deadline costs "
        f"{_money(a['cost'], unit)} ({_where(a)}), {_money(a['cost'] - cons.budget, unit)} over the budget, "
        f"and the fastest within the budget takes {format_duration(b['total_time_s'])} ({_where(b)}), "
        f"{format_duration(b['total_time_s'] - cons.deadline_s)} past the deadline"
    )


def _with_pricing(spec: JobSpec, pricing: Any) -> JobSpec:
    if isinstance(pricing, PricingSpec):
        pricing = pricing.model_dump(mode="json")
    if not isinstance(pricing, dict):
        raise SpecError(f"pricing must be a mapping of pricing fields, not {type(pricing).__name__}")
    d = spec.to_dict()
    d["pricing"] = {**d["pricing"], **pricing}
    return spec_from_dict(d)


# --------------------------------------------------------------------------- statistical efficiency
def noise_assumed(models: dict, noise_scale: float | None, reference_batch: int) -> dict:
    """The gradient noise scale a plan assumes: ``noise_scale`` (a what-if) when given, else
    the models' (``noise_scale.b_noise``, measured by the profile); ``b_noise`` None with a
    ``note`` when there is none."""
    if noise_scale is not None:
        if isinstance(noise_scale, bool) or not isinstance(noise_scale, (int, float)):
            raise SpecError(f"the noise scale is a number of samples, not {noise_scale!r}")
        if not (math.isfinite(noise_scale) and noise_scale > 0):
            raise SpecError(f"the noise scale must be a positive number of samples, not {noise_scale:g}")
        return {"b_noise": float(noise_scale), "source": "what-if", "reference_batch": reference_batch}
    measured = models.get("noise_scale") or {}
    out = {k: measured.get(k) for k in ("b_noise", "low", "high", "steps")}
    note = measured.get("note") or "not measured: these models were fitted before Tula measured it"
    return {
        **out,
        "source": "profile",
        "reference_batch": reference_batch,
        **({} if out["b_noise"] else {"note": note}),
    }


def epochs_to_accuracy(epochs: float, global_batch: Any, b_noise: float, reference_batch: int) -> Any:
    """The epochs a global batch needs to reach what ``epochs`` reach at ``reference_batch``:
    ``epochs * (B_noise + B) / (B_noise + B0)`` (McCandlish et al., Eq. 2.11's steps-samples
    trade-off, in epochs)."""
    return epochs * (b_noise + np.asarray(global_batch, float)) / (b_noise + reference_batch)


# --------------------------------------------------------------------------- the objectives' rules
@dataclass(frozen=True)
class Ranking:
    """What an objective's rule chooses among: the plan's rows, the indices of those that
    fit and meet the constraints (``eligible``), each cluster size's knee (its row and
    batch), the keys of the time and the cost the objective ranks by (``tk``, ``ck``: to
    accuracy or for the spec's epochs), and the words of the reason."""

    rows: list[dict]
    eligible: list[int]
    knees: dict[str, dict]
    tk: str
    ck: str
    spot: bool
    to_accuracy: bool
    constraints: str  # the constraints in words
    constrained: bool

    def within(self) -> str:
        return f" within {self.constraints}" if self.constrained else ""

    def to_acc(self) -> str:
        return " to accuracy" if self.to_accuracy else ""


def _least_time(r: Ranking) -> tuple[int, str]:
    chosen = min(r.eligible, key=lambda i: (r.rows[i][r.tk], r.rows[i][r.ck]))
    return chosen, (
        "least expected training time" if r.spot else "least predicted training time"
    ) + r.to_acc() + r.within()


def _least_cost(r: Ranking) -> tuple[int, str]:
    chosen = min(r.eligible, key=lambda i: (r.rows[i][r.ck], r.rows[i][r.tk]))
    return chosen, ("least expected cost" if r.spot else "least predicted cost") + r.to_acc() + r.within()


def _at_knee(r: Ranking) -> tuple[int, str]:
    """The fastest of the cluster sizes' knees that meet the constraints; when every knee
    misses them, the configuration meeting them nearest to its cluster size's knee."""
    rows = r.rows
    ok_knees = [k["row"] for k in r.knees.values() if rows[k["row"]]["meets_constraints"]]
    if ok_knees:
        chosen = min(ok_knees, key=lambda i: (rows[i][r.tk], rows[i][r.ck]))
        kn = r.knees[str(rows[chosen]["n_workers"])]
        why = (
            f"knee of the predicted time{r.to_acc()}-vs-batch curve"
            if kn["method"] == "kneedle"
            else f"no knee found; smallest batch within {KNEE_FALLBACK_TOL:.0%} of the fastest"
        ) + r.within()
        return chosen, why

    def off_knee(i: int) -> float:
        return abs(math.log(rows[i]["global_batch"] / r.knees[str(rows[i]["n_workers"])]["global_batch"]))

    chosen = min(r.eligible, key=lambda i: (off_knee(i), rows[i][r.tk], rows[i][r.ck]))
    return (
        chosen,
        f"every knee misses {r.constraints}; the configuration meeting them nearest to its cluster size's knee",
    )


#: how each rule of :data:`tula.core.registry.OBJECTIVES` chooses: the index of the chosen row and why
RULES: dict[str, Callable[[Ranking], tuple[int, str]]] = {
    "least_time": _least_time,
    "least_cost": _least_cost,
    "knee": _at_knee,
}


# --------------------------------------------------------------------------- the plan
def make_plan(
    models: dict,
    objective: str | None = None,
    constraints: Any = None,
    *,
    pricing: Any = None,
    compare_spot: bool = False,
    noise_scale: float | None = None,
    method: str | None = None,
    measured: dict | None = None,
) -> dict:
    """Evaluate the search space with fitted models and choose a configuration.

    Parameters
    ----------
    models : a models record (what ``tula fit`` writes)
    objective : a name of :data:`tula.core.registry.OBJECTIVES` (default: the spec's)
    constraints : a deadline and a budget (:meth:`Constraints.of` takes a mapping such as
        ``{"deadline": "8h", "budget": 50}``); default: the spec's ``constraints``
    pricing : fields of the spec's ``pricing`` to replace (a mapping or a PricingSpec)
    compare_spot : also plan on the other of spot and on-demand pricing and say which is
        cheaper (``spot_comparison`` in the plan); needs the spot price and preemption rate
    noise_scale : the gradient noise scale B_noise to assume (a what-if); default: the one the
        profile measured.  With either, every row also holds the time to accuracy
    method : the training method the epochs are predicted for (default: the spec's
        ``train.method``): its step and each epoch's end as the profile's run trials measured
        them (:mod:`tula.core.run_costs`); a method they did not run is said so in ``run_costs_note``
    measured : what a finished training run of the job measured against its prediction
        (:func:`tula.core.run_costs.measured_ratio`): every predicted step and epoch is scaled by
        its ratio when it trained the same method (``measured_ratio`` in the plan says whether)

    Raises :class:`~tula.core.errors.InfeasibleError` (one sentence) when no configuration fits in
    memory or none meets the constraints.
    """
    spec, mem, perf = models_from(models)
    if pricing is not None:
        spec = _with_pricing(spec, pricing)
    cons = Constraints.of(spec.constraints if constraints is None else constraints)
    if constraints is not None:  # the plan's spec says what it was planned under
        spec = spec_from_dict({**spec.to_dict(), "constraints": {"deadline_s": cons.deadline_s, "budget": cons.budget}})
    objective = objective or spec.objective
    if objective not in OBJECTIVE_NAMES:
        raise SpecError(f"objective must be one of {', '.join(OBJECTIVE_NAMES)}, not {objective!r}")
    if OBJECTIVES[objective].rule not in RULES:  # a table entry whose rule was not written
        raise ValueError(f"objective {objective!r} has rule {OBJECTIVES[objective].rule!r}, which the planner has not")
    to_accuracy = OBJECTIVES[objective].to_accuracy
    noise = noise_assumed(models, noise_scale, spec.train.base_batch)
    if to_accuracy and not noise["b_noise"]:
        raise SpecError(
            f"objective {objective} needs the gradient noise scale, and the profile has none ({noise['note']}); "
            "give one as a what-if (--noise-scale)"
        )
    d, epochs = models["dataset_size"], spec.epochs
    pricing_model = make_pricing(spec.pricing)
    spot = isinstance(pricing_model, SpotPricing)
    budget = models.get("memory_budget_bytes")
    b_mem = mem.max_local_batch(budget, spec.search.memory_safety)
    b_oom = models.get("oom_local_batch")
    grid = candidate_global_batches(spec.search, d)
    k_max = spec.search.max_accumulation_steps
    big_lo, big_hi = spec.search.min_batch, max_global_batch(spec.search, d)

    rows: list[dict] = []
    curves: dict[str, dict] = {}
    # cluster sizes the profile could not place (one rank per GPU): no step was measured there,
    # and the fitted sync term says nothing about them, so they are listed but not ranked
    not_measured: dict[str, str] = dict(models.get("not_measured") or {})
    for n in spec.search.cluster_sizes:
        lo, hi = max(1, math.ceil(big_lo / n)), big_hi // n
        cand_local = [g // n for g in grid if g % n == 0 and g >= n]
        limits = [b for b in (b_mem, None if b_oom is None else b_oom - 1) if b is not None]
        for b in _dense_local_batches(lo, hi, cand_local + limits):
            # where memory caps the local batch, k micro-batches of b / k may carry it
            k = accumulation_for(b, min(limits) if limits else None, k_max) or 1
            micro, reason = b // k, ""
            if b_mem is not None and micro > b_mem:
                reason = f"predicted peak exceeds the memory budget (local batch > {b_mem})"
            elif b_oom is not None and micro >= b_oom:
                reason = f"a local batch of {b_oom} ran out of memory while profiling"
            if reason and k_max > 1:
                reason += f", and no accumulation of up to {k_max} steps splits {b} into micro-batches that fit"
            if str(n) in not_measured:
                reason = not_measured[str(n)]
            rows.append(
                {
                    "n_workers": n,
                    "global_batch": n * b,
                    "local_batch": b,
                    "micro_batch": micro,
                    "accumulation_steps": k,
                    "candidate": n * b in grid,
                    "feasible": not reason,
                    "reason": reason,
                }
            )
    if not rows:
        raise InfeasibleError(
            "the search space is empty: no global batch between min_batch and max_batch splits over the cluster sizes"
        )
    n_arr = np.array([r["n_workers"] for r in rows], float)
    b_arr = np.array([r["local_batch"] for r in rows], float)
    micro_arr = np.array([r["micro_batch"] for r in rows], float)
    k_arr = np.array([r["accumulation_steps"] for r in rows], float)
    # on the hosts it was fitted for: R ranks per host when the profile spanned several, else the flat model
    t_step = perf.t_step_s(micro_arr, n_arr, ranks_per_node_of(models.get("trials") or []), None, k_arr)
    method = method or spec.train.method
    costs, costs_note = run_costs_for(models, method)
    # Eq. 4a with the run's own terms: D / B steps of the method's step, and each epoch's end
    epoch = epoch_time_s(t_step, n_arr * b_arr, n_arr, d, costs, whole_steps=False)
    fixed = costs.epoch_fixed_s(n_arr, d / (n_arr * b_arr)) if costs else np.zeros_like(epoch)
    # a finished run of this method: its measured / predicted, on every configuration
    ratio = measured.get("ratio") if measured is not None and measured.get("method") == method else None
    scaled = bool(ratio)
    if scaled:
        t_step, epoch, fixed = t_step * ratio, epoch * ratio, fixed * ratio
    free = epochs * epoch  # Eq. 4a: uninterrupted training
    total = pricing_model.expected_time_s(free, n_arr, epoch)  # with preemptions, on spot
    peak = mem.predict_accumulated_peak_bytes(b_arr, micro_arr)
    cost = pricing_model.cost(total, n_arr, peak)
    lost = pricing_model.expected_preemptions(free, n_arr, epoch) if isinstance(pricing_model, SpotPricing) else None
    columns = zip(
        t_step.tolist(), epoch.tolist(), fixed.tolist(), total.tolist(), cost.tolist(), peak.astype(np.int64).tolist()
    )
    for r, (t_s, e_s, f_s, tot_s, c, pk) in zip(rows, columns):
        r.update(t_step_s=t_s, epoch_time_s=e_s, epoch_steps_s=e_s - f_s, epoch_fixed_s=f_s, total_time_s=tot_s,
                 cost=c, peak_mem_bytes=pk)  # fmt: skip
    if noise["b_noise"]:  # the time and cost to the accuracy the spec's epochs reach at B0
        e_acc = epochs_to_accuracy(epochs, n_arr * b_arr, noise["b_noise"], noise["reference_batch"])
        t_acc = pricing_model.expected_time_s(e_acc * epoch, n_arr, epoch)
        c_acc = pricing_model.cost(t_acc, n_arr, peak)
        for r, e_a, t_a, c_a in zip(rows, e_acc.tolist(), t_acc.tolist(), c_acc.tolist()):
            r.update(epochs_to_accuracy=e_a, time_to_accuracy_s=t_a, cost_to_accuracy=c_a)
    # the columns the choice, the constraints and the knees read
    tk, ck = ("time_to_accuracy_s", "cost_to_accuracy") if to_accuracy else ("total_time_s", "cost")
    if lost is not None:
        for r, f_s, n_lost in zip(rows, free.tolist(), lost.tolist()):
            r.update(failure_free_time_s=f_s, expected_preemptions=n_lost)
    for r in rows:
        in_time, in_budget = cons.meets(r[tk], r[ck])
        r["meets_constraints"] = in_time and in_budget
    feas = [i for i, r in enumerate(rows) if r["feasible"]]
    if not feas:
        raise InfeasibleError(
            f"no configuration is feasible: the smallest local batch in the space "
            f"({int(b_arr.min())}) does not fit the memory budget of {budget} bytes"
        )
    eligible = [i for i in feas if rows[i]["meets_constraints"]]
    if not eligible:
        raise InfeasibleError(_unmet(rows, feas, cons, pricing_model.unit, tk, ck))
    knees: dict[str, dict] = {}
    feas_by_n: dict[int, list[int]] = {}
    for i in feas:
        feas_by_n.setdefault(rows[i]["n_workers"], []).append(i)
    for n in spec.search.cluster_sizes:
        idx = feas_by_n.get(n, [])
        if not idx:
            continue
        gb = np.array([rows[i]["global_batch"] for i in idx], float)
        curves[str(n)] = {"global_batch": gb.astype(int).tolist()}
        for key in ("total_time_s", "cost", "time_to_accuracy_s", "cost_to_accuracy"):
            if key in rows[idx[0]]:
                curves[str(n)][key] = [rows[i][key] for i in idx]
        tt = np.array([rows[i][tk] for i in idx])
        last = int(np.argmin(tt)) + 1 if to_accuracy else len(idx)  # to accuracy: the falling part
        k, how = find_knee(gb[:last], tt[:last])
        knees[str(n)] = {"row": idx[k], "global_batch": int(gb[k]), "method": how}

    ranking = Ranking(rows, eligible, knees, tk, ck, spot, to_accuracy, cons.describe(pricing_model.unit), cons.active)
    chosen, why = RULES[OBJECTIVES[objective].rule](ranking)
    c = rows[chosen]
    fastest = min(rows[i][tk] for i in feas)
    cheapest = min(rows[i][ck] for i in feas)
    took = f"{c[tk]:.1f} s" + (f" expected ({c['expected_preemptions']:.2g} preemptions)" if spot else "")
    if to_accuracy:
        trains = (
            f"needs {c['epochs_to_accuracy']:.3g} epochs to reach what {epochs} reach at B0={noise['reference_batch']} "
            f"(B_noise {noise['b_noise']:.3g}, {'a what-if' if noise['source'] == 'what-if' else 'from the profile'})"
        )
    else:
        trains = f"trains {epochs} epochs"
    acc = f" as {c['accumulation_steps']} x {c['micro_batch']} accumulated" if c["accumulation_steps"] > 1 else ""
    reason = (
        f"{why}: N={c['n_workers']}, B={c['global_batch']} (b={c['local_batch']}{acc}) {trains} in "
        f"{took} for {c[ck]:.4g} {pricing_model.unit} "
        f"({c[tk] / fastest:.2f}x the fastest, {c[ck] / cheapest:.2f}x the cheapest)"
    )
    fitted_on = models.get("placement") or {}
    if fitted_on.get("n_hosts"):
        where = (
            f"fitted on {fitted_on['n_hosts']} host(s) with up to {fitted_on['max_ranks_per_host']} rank(s) "
            f"per host, N <= {fitted_on['max_workers']} measured"
        )
        if fitted_on["n_hosts"] == 1 and c["n_workers"] > 1:
            where += "; the choice's sync time is from ranks sharing one host, not a network"
        reason += f" [{where}]"
    if not_measured:
        reason += "".join(f" [{why}]" for why in dict.fromkeys(not_measured.values()))
    if measured is not None:
        reason += f" [{_measured_note(measured, scaled, method)}]"
    for i, r in enumerate(rows):
        r["chosen"] = i == chosen
    front = pareto_frontier(np.array([rows[i][tk] for i in feas]), np.array([rows[i][ck] for i in feas]))
    plan = {
        "kind": PLAN_KIND,
        "version": VERSIONS[PLAN_KIND],
        "objective": objective,
        "choice": dict(c),
        "reason": reason,
        "max_local_batch": b_mem,
        "oom_local_batch": b_oom,
        "memory_budget_bytes": budget,
        "knees": {n: {"global_batch": k["global_batch"], "method": k["method"]} for n, k in knees.items()},
        "frontier": [dict(rows[feas[j]]) for j in front],
        "curves": curves,
        "configurations": rows,
        "spec": spec.to_dict(),
        "dataset_size": d,
        "fitted_on": fitted_on,
        "constraints": {
            "deadline_s": cons.deadline_s,
            "budget": cons.budget,
            "unit": pricing_model.unit,
            "n_feasible": len(feas),
            "n_meeting": len(eligible),
        },
        "spot_comparison": None,
        "noise_scale": noise,
        "not_measured": not_measured,
        # the method the epochs were predicted for, the terms used, and what they include
        "method": method,
        "run_costs": None if costs is None else costs.to_dict(),
        "run_costs_note": costs_note,
        # a finished run's measured / predicted epoch time, and whether this plan's epochs are scaled by it
        "measured_ratio": None if measured is None else {**measured, "applied": scaled},
    }
    if compare_spot:
        plan["spot_comparison"] = _compare_spot(
            plan, models, objective, cons, spec.pricing, noise_scale, method, measured
        )
    return plan


def _measured_note(measured: dict, applied: bool, method: str) -> str:
    at = f"N={measured['n_workers']}, B={measured['global_batch']}"
    if applied:
        return (
            f"epochs scaled by {measured['ratio']:.2f}, what a finished run measured against its prediction "
            f"({measured['epochs_compared']} epoch(s) at {at})"
        )
    return (
        f"the finished run trained {measured.get('method')!r}, not {method!r}: its measured ratio "
        f"{measured['ratio']:.2f} is not applied"
    )


# --------------------------------------------------------------------------- spot vs on-demand
def _summary(plan: dict) -> dict:
    c = plan["choice"]
    return {
        k: c[k]
        for k in (
            "n_workers",
            "global_batch",
            "local_batch",
            "total_time_s",
            "epoch_time_s",
            "cost",
            "failure_free_time_s",
            "expected_preemptions",
        )
        if k in c
    }


def _lower_first(sentence: str) -> str:
    return sentence[:1].lower() + sentence[1:]


def _compare_spot(
    plan: dict,
    models: dict,
    objective: str,
    cons: Constraints,
    ps: PricingSpec,
    noise_scale: float | None = None,
    method: str | None = None,
    measured: dict | None = None,
) -> dict:
    """Plan the job on the other of spot and on-demand pricing (the same method and measured
    ratio) and compare the two choices."""
    if ps.kind == "memory":
        raise SpecError(
            "comparing spot with on-demand needs node-hour pricing (pricing.kind fixed or spot), not memory pricing"
        )
    missing = [f for f in ("spot_price_per_node_hour", "preemption_rate_per_node_hour") if getattr(ps, f) is None]
    if missing:
        raise SpecError(f"comparing spot with on-demand needs pricing.{' and pricing.'.join(missing)}")
    other = {"kind": "fixed" if ps.kind == "spot" else "spot"}
    try:
        alt = make_plan(
            models,
            objective,
            cons,
            pricing={**ps.model_dump(mode="json"), **other},
            noise_scale=noise_scale,
            method=method,
            measured=measured,
        )
        alt_error = None
    except InfeasibleError as err:
        alt, alt_error = None, str(err)
    spot_plan, od_plan = (plan, alt) if ps.kind == "spot" else (alt, plan)
    assert ps.spot_price_per_node_hour is not None and ps.preemption_rate_per_node_hour is not None  # checked above
    spot_p = SpotPricing(
        ps.spot_price_per_node_hour, ps.preemption_rate_per_node_hour, ps.checkpoint_interval_s, ps.restart_s
    )
    out: dict[str, Any] = {
        "spot": _summary(spot_plan) if spot_plan else {"infeasible": alt_error},
        "on_demand": _summary(od_plan) if od_plan else {"infeasible": alt_error},
        "spot_price_per_node_hour": ps.spot_price_per_node_hour,
        "on_demand_price_per_node_hour": ps.price_per_node_hour,
        "preemption_rate_per_node_hour": ps.preemption_rate_per_node_hour,
        "cheaper": None,
        "break_even_rate_per_node_hour": None,
    }
    unit = plan["constraints"]["unit"]
    if spot_plan is None or od_plan is None:
        which = "spot" if spot_plan is None else "on-demand"
        out["cheaper"] = "on_demand" if spot_plan is None else "spot"
        out["sentence"] = (
            f"only {'on-demand' if spot_plan is None else 'spot'} can meet the constraints: on "
            f"{which} nodes {_lower_first(alt_error or '')}"
        )
        return out
    s, o = out["spot"], out["on_demand"]
    # at the spot choice: the same run on demand, and the preemption rate where the two cost the same
    free, epoch = s["failure_free_time_s"], s["epoch_time_s"]
    same_od_cost = free / 3600.0 * s["n_workers"] * ps.price_per_node_hour
    be = spot_p.break_even_rate(free, s["n_workers"], ps.price_per_node_hour, epoch)
    out["break_even_rate_per_node_hour"] = be
    out["on_demand_cost_at_spot_choice"] = same_od_cost
    if s["cost"] < o["cost"]:
        out["cheaper"], verdict = "spot", f"spot is cheaper by {1 - s['cost'] / o['cost']:.0%}"
    elif s["cost"] > o["cost"]:
        out["cheaper"], verdict = "on_demand", f"on-demand is cheaper by {1 - o['cost'] / s['cost']:.0%}"
    else:
        out["cheaper"], verdict = "equal", "spot and on-demand cost the same"
    if be is None:
        limit = "spot's price is not below on-demand's, so no preemption rate makes it cheaper"
    elif math.isinf(be):
        limit = "spot is free, so cheaper at any preemption rate"
    else:
        limit = (
            f"at N={s['n_workers']}, B={s['global_batch']} spot costs less than on-demand while nodes are "
            f"preempted less than {be:.3g} times per node-hour (now {ps.preemption_rate_per_node_hour:g})"
        )
    out["sentence"] = (
        f"{verdict}: spot N={s['n_workers']}, B={s['global_batch']} is expected to take "
        f"{format_duration(s['total_time_s'])} ({s['expected_preemptions']:.2g} preemptions) for "
        f"{_money(s['cost'], unit)}, on-demand N={o['n_workers']}, B={o['global_batch']} "
        f"{format_duration(o['total_time_s'])} for {_money(o['cost'], unit)}; {limit}"
    )
    return out
