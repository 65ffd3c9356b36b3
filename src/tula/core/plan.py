"""Planner (§III-A3): predict every (N, B) in the space and choose one by objective.

* ``time``  -- the feasible configuration with the least predicted training time;
* ``cost``  -- the one with the least predicted cost;
* ``knee``  -- per cluster size, the knee of the dense predicted time-vs-global-batch
  curve (Kneedle: :mod:`tula.core.kneedle`); where Kneedle finds none, the smallest batch
  whose time is within ``KNEE_FALLBACK_TOL`` of that cluster size's fastest.  Across cluster
  sizes, the knee point with the least time.

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
and for a service's re-plan alike; its steps (the rows, their predictions, the constraints, the
curves and knees, the choice by the objective's rule, the reason, the record) are the methods
of :class:`Planner`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import ValidationError

from tula.core.accumulation import accumulation_for
from tula.core.errors import InfeasibleError, SpecError
from tula.core.fitted import FittedModels
from tula.core.kneedle import knee_index
from tula.core.pricing import SpotPricing, make_pricing
from tula.core.records import PLAN_KIND, VERSIONS
from tula.core.registry import OBJECTIVE_NAMES, OBJECTIVES
from tula.core.run_costs import RunCosts
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
        knee = knee_index(global_batch, total_time, sensitivity=1.0)
        if knee is not None:
            return knee, "kneedle"
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


def _times(x: float, best: float) -> str:
    """``x`` as a multiple of ``best`` ("1.25x"); a free best (a price of 0) is "1.00x" when
    ``x`` is free too, else "more than"."""
    if best > 0:
        return f"{x / best:.2f}x"
    return "1.00x" if x <= 0 else "more than"


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
class Planner:
    """One plan, in the steps :func:`make_plan` takes; each is a method that can be called,
    and tested, on its own:

    1. the options resolved (the constructor): the spec with the pricing and constraints to
       plan under, the objective and its rule, the noise scale, the pricing, the method and a
       finished run's measured ratio;
    2. :meth:`grid`: a row per (N, B) of the search space, and whether it fits in memory;
    3. :meth:`predict`: each row's predicted step, epoch, time and cost;
    4. :meth:`mark_constraints` and :meth:`candidates`: the rows that meet the constraints, and
       the feasible and the eligible ones (or the sentence saying why there are none);
    5. :meth:`curves` and :meth:`knees`: per cluster size, the dense curves and the knee;
    6. :meth:`choose`: the objective's rule (:data:`RULES`) among the eligible rows;
    7. :meth:`reason`: the choice in one sentence, with its notes;
    8. :meth:`record`: the plan record.

    :meth:`plan` runs them in that order.  The constructor takes :func:`make_plan`'s
    arguments (but ``compare_spot``) and raises what it raises for a bad option."""

    def __init__(
        self,
        models: dict,
        objective: str | None = None,
        constraints: Any = None,
        *,
        pricing: Any = None,
        noise_scale: float | None = None,
        method: str | None = None,
        measured: dict | None = None,
    ) -> None:
        # the fitted models (memory, performance, the method's run costs) every row is predicted from
        self.fitted = FittedModels.from_record(models, method=method)
        spec, self.mem, self.perf = spec_from_dict(models["spec"]), self.fitted.memory_model(), self.fitted.perf
        if pricing is not None:
            spec = _with_pricing(spec, pricing)
        self.cons = Constraints.of(spec.constraints if constraints is None else constraints)
        if constraints is not None:  # the plan's spec says what it was planned under
            planned_under = {"deadline_s": self.cons.deadline_s, "budget": self.cons.budget}
            spec = spec_from_dict({**spec.to_dict(), "constraints": planned_under})
        self.models, self.spec, self.noise_scale, self.measured = models, spec, noise_scale, measured
        self.objective = _checked_objective(objective or spec.objective)
        self.to_accuracy = OBJECTIVES[self.objective].to_accuracy
        self.noise = noise_assumed(models, noise_scale, spec.train.base_batch)
        if self.to_accuracy and not self.noise["b_noise"]:
            raise SpecError(
                f"objective {self.objective} needs the gradient noise scale, and the profile has none "
                f"({self.noise['note']}); give one as a what-if (--noise-scale)"
            )
        self.pricing = make_pricing(spec.pricing)
        self.spot = isinstance(self.pricing, SpotPricing)
        self.budget = models.get("memory_budget_bytes")
        self.b_mem = self.mem.max_local_batch(self.budget, spec.search.memory_safety)
        self.b_oom = models.get("oom_local_batch")
        # cluster sizes the profile could not place (one rank per GPU): no step was measured there,
        # and the fitted sync term says nothing about them, so they are listed but not ranked
        self.not_measured: dict[str, str] = dict(models.get("not_measured") or {})
        self.method = self.fitted.method  # ``method``, else the spec's train.method
        # a finished run of this method: its measured / predicted, on every configuration
        self.ratio = measured.get("ratio") if measured is not None and measured.get("method") == self.method else None
        # the columns the choice, the constraints and the knees read
        self.tk, self.ck = ("time_to_accuracy_s", "cost_to_accuracy") if self.to_accuracy else ("total_time_s", "cost")

    @cached_property
    def run_costs(self) -> tuple[RunCosts | None, str]:
        """The method's run costs (its step and each epoch's end) and the sentence saying what
        they include (:func:`tula.core.run_costs.run_costs_for`), as the fitted models hold them."""
        return self.fitted.run_costs, self.fitted.run_costs_note

    def plan(self, compare_spot: bool = False) -> dict:
        """The plan record (:func:`make_plan`): every step in turn."""
        rows = self.grid()
        self.predict(rows)
        self.mark_constraints(rows)
        feas, eligible = self.candidates(rows)
        knees = self.knees(rows, feas)
        curves = self.curves(rows, feas)
        chosen, why = self.choose(rows, eligible, knees)
        reason = self.reason(rows, feas, chosen, why)
        plan = self.record(rows, feas, eligible, knees, curves, chosen, reason)
        if compare_spot:
            plan["spot_comparison"] = _compare_spot(
                plan, self.models, self.objective, self.cons, self.spec.pricing, self.noise_scale, self.method,
                self.measured,
            )  # fmt: skip
        return plan

    # ----------------------------------------------------------------------- the rows
    def grid(self) -> list[dict]:
        """A row per (N, B) the plan evaluates: for each cluster size N, the local batches b from
        ``min_batch / N`` to ``max_batch / N``, dense (:data:`DENSE_POINTS_PER_OCTAVE`), the
        candidate global batches' and the memory limits' among them; each row with its
        micro-batch and accumulation steps and whether it fits in memory (``feasible``, or the
        ``reason`` why not).  Raises :class:`~tula.core.errors.InfeasibleError` for an empty space."""
        search, d = self.spec.search, self.models["dataset_size"]
        grid = candidate_global_batches(search, d)
        big_lo, big_hi = search.min_batch, max_global_batch(search, d)
        limits = [b for b in (self.b_mem, None if self.b_oom is None else self.b_oom - 1) if b is not None]
        rows: list[dict] = []
        for n in search.cluster_sizes:
            lo, hi = max(1, math.ceil(big_lo / n)), big_hi // n
            cand_local = [g // n for g in grid if g % n == 0 and g >= n]
            for b in _dense_local_batches(lo, hi, cand_local + limits):
                rows.append(self.row(n, b, n * b in grid, min(limits) if limits else None))
        if not rows:
            raise InfeasibleError(
                "the search space is empty: no global batch between min_batch and max_batch splits over the "
                "cluster sizes"
            )
        return rows

    def row(self, n: int, b: int, candidate: bool, limit: int | None) -> dict:
        """The row of N workers at local batch b: where memory caps the local batch at ``limit``,
        k micro-batches of b / k may carry it (up to ``max_accumulation_steps``); the row is
        feasible when its micro-batch fits the memory budget and is below the batch that ran out
        of memory, and its cluster size was measured."""
        k_max = self.spec.search.max_accumulation_steps
        k = accumulation_for(b, limit, k_max) or 1
        micro, reason = b // k, ""
        if self.b_mem is not None and micro > self.b_mem:
            reason = f"predicted peak exceeds the memory budget (local batch > {self.b_mem})"
        elif self.b_oom is not None and micro >= self.b_oom:
            reason = f"a local batch of {self.b_oom} ran out of memory while profiling"
        if reason and k_max > 1:
            reason += f", and no accumulation of up to {k_max} steps splits {b} into micro-batches that fit"
        if str(n) in self.not_measured:
            reason = self.not_measured[str(n)]
        return {
            "n_workers": n,
            "global_batch": n * b,
            "local_batch": b,
            "micro_batch": micro,
            "accumulation_steps": k,
            "candidate": candidate,
            "feasible": not reason,
            "reason": reason,
        }

    def predict(self, rows: list[dict]) -> None:
        """Add to each row its predicted step (``t_step_s``), epoch (``epoch_time_s``, of which
        ``epoch_steps_s`` and ``epoch_fixed_s``), training time (``total_time_s``: expected with
        preemptions on spot), ``cost`` and ``peak_mem_bytes``, for the spec's epochs of the
        method; every step and epoch scaled by a finished run's measured ratio of this method.
        With a noise scale, also the time and cost to accuracy (:meth:`predict_to_accuracy`); on
        spot, ``failure_free_time_s`` and ``expected_preemptions``."""
        # one call of the fitted models' prediction (tula.core.fitted): on the network the profile's
        # ranks ran on, Eq. 4a's D / B steps of the method's step and each epoch's end, the spec's
        # epochs priced as one run (spot: expected, with preemptions)
        n_arr, b_arr, k_arr = (
            np.array([r[key] for r in rows], float) for key in ("n_workers", "local_batch", "accumulation_steps")
        )
        p = self.fitted.predict(
            n_workers=n_arr, global_batch=n_arr * b_arr, accumulation_steps=k_arr, pricing=self.pricing,
            epochs=self.spec.epochs, whole_steps=False, measured_ratio=self.ratio,
        )  # fmt: skip
        assert p.cost is not None and p.peak_mem_bytes is not None  # priced, with the memory model
        columns = zip(
            p.t_step_s.tolist(),
            p.epoch_time_s.tolist(),
            p.epoch_fixed_s.tolist(),
            p.total_time_s.tolist(),
            p.cost.tolist(),
            p.peak_mem_bytes.tolist(),
        )
        for r, (t_s, e_s, f_s, tot_s, c, pk) in zip(rows, columns):
            r.update(t_step_s=t_s, epoch_time_s=e_s, epoch_steps_s=e_s - f_s, epoch_fixed_s=f_s, total_time_s=tot_s,
                     cost=c, peak_mem_bytes=pk)  # fmt: skip
        if self.noise["b_noise"]:
            self.predict_to_accuracy(rows, n_arr, n_arr * b_arr, p.epoch_time_s, p.peak_mem_bytes)
        if p.expected_preemptions is not None:
            for r, f_s, n_lost in zip(rows, p.failure_free_time_s.tolist(), p.expected_preemptions.tolist()):
                r.update(failure_free_time_s=f_s, expected_preemptions=n_lost)

    def predict_to_accuracy(
        self, rows: list[dict], n: np.ndarray, global_batch: np.ndarray, epoch: np.ndarray, peak: np.ndarray
    ) -> None:
        """Add to each row the epochs, the time and the cost to the accuracy the spec's epochs
        reach at B0 (``epochs_to_accuracy``, ``time_to_accuracy_s``, ``cost_to_accuracy``), from
        the rows' cluster sizes, global batches, epoch times and peaks."""
        e_acc = epochs_to_accuracy(self.spec.epochs, global_batch, self.noise["b_noise"], self.noise["reference_batch"])
        t_acc = self.pricing.expected_time_s(e_acc * epoch, n, epoch)
        c_acc = self.pricing.cost(t_acc, n, peak)
        for r, e_a, t_a, c_a in zip(rows, e_acc.tolist(), t_acc.tolist(), c_acc.tolist()):
            r.update(epochs_to_accuracy=e_a, time_to_accuracy_s=t_a, cost_to_accuracy=c_a)

    def mark_constraints(self, rows: list[dict]) -> None:
        """Set each row's ``meets_constraints``: its time and cost (to accuracy, for a
        to-accuracy objective) within the deadline and the budget."""
        for r in rows:
            in_time, in_budget = self.cons.meets(r[self.tk], r[self.ck])
            r["meets_constraints"] = in_time and in_budget

    def candidates(self, rows: list[dict]) -> tuple[list[int], list[int]]:
        """The indices of the feasible rows and of those that also meet the constraints; raises
        :class:`~tula.core.errors.InfeasibleError` in one sentence when either is empty."""
        feas = [i for i, r in enumerate(rows) if r["feasible"]]
        if not feas:
            raise InfeasibleError(
                f"no configuration is feasible: the smallest local batch in the space "
                f"({min(r['local_batch'] for r in rows)}) does not fit the memory budget of {self.budget} bytes"
            )
        eligible = [i for i in feas if rows[i]["meets_constraints"]]
        if not eligible:
            raise InfeasibleError(_unmet(rows, feas, self.cons, self.pricing.unit, self.tk, self.ck))
        return feas, eligible

    # ----------------------------------------------------------------------- per cluster size
    def by_size(self, rows: list[dict], feas: list[int]) -> dict[int, list[int]]:
        """The feasible rows' indices per cluster size, in the spec's order (sizes with none left out)."""
        by_n: dict[int, list[int]] = {}
        for i in feas:
            by_n.setdefault(rows[i]["n_workers"], []).append(i)
        return {n: by_n[n] for n in self.spec.search.cluster_sizes if by_n.get(n)}

    def curves(self, rows: list[dict], feas: list[int]) -> dict[str, dict]:
        """Per cluster size, the feasible rows' global batches and their times and costs (to
        accuracy too, where the rows have them): the dense curves the plot draws."""
        curves: dict[str, dict] = {}
        for n, idx in self.by_size(rows, feas).items():
            curves[str(n)] = {"global_batch": [rows[i]["global_batch"] for i in idx]}
            for key in ("total_time_s", "cost", "time_to_accuracy_s", "cost_to_accuracy"):
                if key in rows[idx[0]]:
                    curves[str(n)][key] = [rows[i][key] for i in idx]
        return curves

    def knees(self, rows: list[dict], feas: list[int]) -> dict[str, dict]:
        """Per cluster size, the knee of its feasible rows' time-vs-batch curve (:func:`find_knee`;
        to accuracy, of the falling part up to the fastest): its row, batch and how it was found."""
        knees: dict[str, dict] = {}
        for n, idx in self.by_size(rows, feas).items():
            gb = np.array([rows[i]["global_batch"] for i in idx], float)
            tt = np.array([rows[i][self.tk] for i in idx])
            last = int(np.argmin(tt)) + 1 if self.to_accuracy else len(idx)  # to accuracy: the falling part
            k, how = find_knee(gb[:last], tt[:last])
            knees[str(n)] = {"row": idx[k], "global_batch": int(gb[k]), "method": how}
        return knees

    # ----------------------------------------------------------------------- the choice
    def choose(self, rows: list[dict], eligible: list[int], knees: dict[str, dict]) -> tuple[int, str]:
        """The index of the row the objective's rule (:data:`RULES`) chooses among the eligible
        ones, and the words of why."""
        ranking = Ranking(
            rows, eligible, knees, self.tk, self.ck, self.spot, self.to_accuracy,
            self.cons.describe(self.pricing.unit), self.cons.active,
        )  # fmt: skip
        return RULES[OBJECTIVES[self.objective].rule](ranking)

    def reason(self, rows: list[dict], feas: list[int], chosen: int, why: str) -> str:
        """The plan's one sentence: why, the choice, what it trains in what time for what cost,
        against the fastest and the cheapest feasible rows, then :meth:`notes`."""
        c, tk, ck, noise, epochs = rows[chosen], self.tk, self.ck, self.noise, self.spec.epochs
        fastest = min(rows[i][tk] for i in feas)
        cheapest = min(rows[i][ck] for i in feas)
        took = f"{c[tk]:.1f} s" + (f" expected ({c['expected_preemptions']:.2g} preemptions)" if self.spot else "")
        if self.to_accuracy:
            trains = (
                f"needs {c['epochs_to_accuracy']:.3g} epochs to reach what {epochs} reach at "
                f"B0={noise['reference_batch']} (B_noise {noise['b_noise']:.3g}, "
                f"{'a what-if' if noise['source'] == 'what-if' else 'from the profile'})"
            )
        else:
            trains = f"trains {epochs} epochs"
        acc = f" as {c['accumulation_steps']} x {c['micro_batch']} accumulated" if c["accumulation_steps"] > 1 else ""
        return (
            f"{why}: N={c['n_workers']}, B={c['global_batch']} (b={c['local_batch']}{acc}) {trains} in "
            f"{took} for {c[ck]:.4g} {self.pricing.unit} "
            f"({_times(c[tk], fastest)} the fastest, {_times(c[ck], cheapest)} the cheapest)"
        ) + self.notes(c)

    def notes(self, choice: dict) -> str:
        """The reason's bracketed notes: the hosts the models were fitted on, the cluster sizes
        not measured, and a finished run's measured ratio (applied or not)."""
        out = ""
        fitted_on = self.models.get("placement") or {}
        if fitted_on.get("n_hosts"):
            where = (
                f"fitted on {fitted_on['n_hosts']} host(s) with up to {fitted_on['max_ranks_per_host']} rank(s) "
                f"per host, N <= {fitted_on['max_workers']} measured"
            )
            if fitted_on["n_hosts"] == 1 and choice["n_workers"] > 1:
                where += "; the choice's sync time is from ranks sharing one host, not a network"
            out += f" [{where}]"
        if self.not_measured:
            out += "".join(f" [{why}]" for why in dict.fromkeys(self.not_measured.values()))
        if self.measured is not None:
            out += f" [{_measured_note(self.measured, bool(self.ratio), self.method)}]"
        return out

    def record(
        self,
        rows: list[dict],
        feas: list[int],
        eligible: list[int],
        knees: dict[str, dict],
        curves: dict[str, dict],
        chosen: int,
        reason: str,
    ) -> dict:
        """The plan record: the choice (each row marked ``chosen`` or not), the reason, the
        knees, the Pareto frontier of the feasible rows, the curves, every row, the spec, the
        constraints, the noise scale, the method's run costs and the measured ratio.  Its
        ``spot_comparison`` is None (:meth:`plan` fills it when asked)."""
        for i, r in enumerate(rows):
            r["chosen"] = i == chosen
        front = pareto_frontier(np.array([rows[i][self.tk] for i in feas]), np.array([rows[i][self.ck] for i in feas]))
        costs, costs_note = self.run_costs
        return {
            "kind": PLAN_KIND,
            "version": VERSIONS[PLAN_KIND],
            "objective": self.objective,
            "choice": dict(rows[chosen]),
            "reason": reason,
            "max_local_batch": self.b_mem,
            "oom_local_batch": self.b_oom,
            "memory_budget_bytes": self.budget,
            "knees": {n: {"global_batch": k["global_batch"], "method": k["method"]} for n, k in knees.items()},
            "frontier": [dict(rows[feas[j]]) for j in front],
            "curves": curves,
            "configurations": rows,
            "spec": self.spec.to_dict(),
            "dataset_size": self.models["dataset_size"],
            "fitted_on": self.models.get("placement") or {},
            "constraints": {
                "deadline_s": self.cons.deadline_s,
                "budget": self.cons.budget,
                "unit": self.pricing.unit,
                "n_feasible": len(feas),
                "n_meeting": len(eligible),
            },
            "spot_comparison": None,
            "noise_scale": self.noise,
            "not_measured": self.not_measured,
            # the method the epochs were predicted for, the terms used, and what they include
            "method": self.method,
            "run_costs": None if costs is None else costs.to_dict(),
            "run_costs_note": costs_note,
            # a finished run's measured / predicted epoch time, and whether this plan's epochs are scaled by it
            "measured_ratio": None if self.measured is None else {**self.measured, "applied": bool(self.ratio)},
        }


def _checked_objective(objective: str) -> str:
    """An objective of :data:`tula.core.registry.OBJECTIVES` whose rule the planner has (a
    :class:`~tula.core.errors.SpecError` for a name that is not one, a ValueError for an entry
    whose rule was not written)."""
    if objective not in OBJECTIVE_NAMES:
        raise SpecError(f"objective must be one of {', '.join(OBJECTIVE_NAMES)}, not {objective!r}")
    if OBJECTIVES[objective].rule not in RULES:  # a table entry whose rule was not written
        raise ValueError(f"objective {objective!r} has rule {OBJECTIVES[objective].rule!r}, which the planner has not")
    return objective


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
    return Planner(
        models, objective, constraints, pricing=pricing, noise_scale=noise_scale, method=method, measured=measured
    ).plan(compare_spot)


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
    _check_comparable(ps)
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
    out: dict[str, Any] = {
        "spot": _summary(spot_plan) if spot_plan else {"infeasible": alt_error},
        "on_demand": _summary(od_plan) if od_plan else {"infeasible": alt_error},
        "spot_price_per_node_hour": ps.spot_price_per_node_hour,
        "on_demand_price_per_node_hour": ps.price_per_node_hour,
        "preemption_rate_per_node_hour": ps.preemption_rate_per_node_hour,
        "cheaper": None,
        "break_even_rate_per_node_hour": None,
    }
    if spot_plan is None or od_plan is None:
        which = "spot" if spot_plan is None else "on-demand"
        out["cheaper"] = "on_demand" if spot_plan is None else "spot"
        out["sentence"] = (
            f"only {'on-demand' if spot_plan is None else 'spot'} can meet the constraints: on "
            f"{which} nodes {_lower_first(alt_error or '')}"
        )
        return out
    out.update(_spot_vs_on_demand(out["spot"], out["on_demand"], ps, plan["constraints"]["unit"]))
    return out


def _check_comparable(ps: PricingSpec) -> None:
    """Refuse (:class:`~tula.core.errors.SpecError`) to compare spot with on-demand under memory
    pricing or without the spot price and the preemption rate."""
    if ps.kind == "memory":
        raise SpecError(
            "comparing spot with on-demand needs node-hour pricing (pricing.kind fixed or spot), not memory pricing"
        )
    missing = [f for f in ("spot_price_per_node_hour", "preemption_rate_per_node_hour") if getattr(ps, f) is None]
    if missing:
        raise SpecError(f"comparing spot with on-demand needs pricing.{' and pricing.'.join(missing)}")


def _spot_vs_on_demand(s: dict, o: dict, ps: PricingSpec, unit: str) -> dict:
    """The spot choice ``s`` against the on-demand one ``o`` (their summaries): at the spot
    choice, the same run's cost on demand and the preemption rate where the two cost the same;
    which is cheaper; and the sentence that says so."""
    assert ps.spot_price_per_node_hour is not None and ps.preemption_rate_per_node_hour is not None  # checked
    spot_p = SpotPricing(
        ps.spot_price_per_node_hour, ps.preemption_rate_per_node_hour, ps.checkpoint_interval_s, ps.restart_s
    )
    free, epoch = s["failure_free_time_s"], s["epoch_time_s"]
    be = spot_p.break_even_rate(free, s["n_workers"], ps.price_per_node_hour, epoch)
    if s["cost"] < o["cost"]:
        cheaper, verdict = "spot", f"spot is cheaper by {1 - s['cost'] / o['cost']:.0%}"
    elif s["cost"] > o["cost"]:
        cheaper, verdict = "on_demand", f"on-demand is cheaper by {1 - o['cost'] / s['cost']:.0%}"
    else:
        cheaper, verdict = "equal", "spot and on-demand cost the same"
    if be is None:
        limit = "spot's price is not below on-demand's, so no preemption rate makes it cheaper"
    elif math.isinf(be):
        limit = "spot is free, so cheaper at any preemption rate"
    else:
        limit = (
            f"at N={s['n_workers']}, B={s['global_batch']} spot costs less than on-demand while nodes are "
            f"preempted less than {be:.3g} times per node-hour (now {ps.preemption_rate_per_node_hour:g})"
        )
    return {
        "break_even_rate_per_node_hour": be,
        "on_demand_cost_at_spot_choice": free / 3600.0 * s["n_workers"] * ps.price_per_node_hour,
        "cheaper": cheaper,
        "sentence": (
            f"{verdict}: spot N={s['n_workers']}, B={s['global_batch']} is expected to take "
            f"{format_duration(s['total_time_s'])} ({s['expected_preemptions']:.2g} preemptions) for "
            f"{_money(s['cost'], unit)}, on-demand N={o['n_workers']}, B={o['global_batch']} "
            f"{format_duration(o['total_time_s'])} for {_money(o['cost'], unit)}; {limit}"
        ),
    }
