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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
from pydantic import ValidationError

from tula.core.accumulation import accumulation_for
from tula.core.config import Config
from tula.core.errors import InfeasibleError, SpecError, SpecOptionError
from tula.core.fitted import FittedModels
from tula.core.kneedle import knee_index
from tula.core.pricing import SpotPricing, make_pricing
from tula.core.records import (
    PLAN_KIND,
    VERSIONS,
    MeasuredRatio,
    ModelsRecord,
    NoiseScale,
    Placement,
    PlanConstraints,
    PlanRecord,
    PlanRow,
    SpotComparison,
)
from tula.core.registry import OBJECTIVE_NAMES, OBJECTIVES
from tula.core.run_costs import RunCosts
from tula.core.space import candidate_global_batches, max_global_batch
from tula.core.spec import (
    ConstraintsSpec,
    JobSpec,
    PricingSpec,
    format_duration,
    planned_sequence_lengths,
    spec_from_dict,
)
from tula.core.validation import first_error
from tula.core.variants import (
    RunVariant,
    parallelism_auto_note,
    run_variants,
    variant_models,
)

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
            e = first_error(err)
            msg = "is not a constraint (use deadline and budget)" if e.type == "extra_forbidden" else e.message
            raise SpecError(f"constraint {e.where()!r}: {msg}") from None
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


def _where(r: PlanRow) -> str:
    return f"N={r.n_workers}, B={r.global_batch}"


def _times(x: float, best: float) -> str:
    """``x`` as a multiple of ``best`` ("1.25x"); a free best (a price of 0) is "1.00x" when
    ``x`` is free too, else "more than"."""
    if best > 0:
        return f"{x / best:.2f}x"
    return "1.00x" if x <= 0 else "more than"


def _money(x: float, unit: str) -> str:
    return f"{x:.4g} {unit}"


def _first_least(indices: Sequence[int] | np.ndarray, *keys: np.ndarray) -> int:
    """The first of ``indices`` with the least ``keys[0]``, ties broken by ``keys[1]``, then
    ``keys[2]`` ... (each key an array over every row), as ``min(indices, key=...)`` picks."""
    idx = np.asarray(indices, np.int64)
    order = np.lexsort(tuple(k[idx] for k in reversed(keys)))  # lexsort: the last key is the primary one
    return int(idx[order[0]])


def _unmet(
    rows: Sequence[PlanRow], time_s: np.ndarray, cost: np.ndarray, feas: list[int], cons: Constraints, unit: str
) -> str:
    """The sentence saying which constraint no feasible configuration meets, and by how much
    (each row's time ``time_s`` and ``cost``, as the objective ranks them)."""
    i_fast, i_cheap = _first_least(feas, time_s, cost), _first_least(feas, cost, time_s)
    fastest, cheapest = rows[i_fast], rows[i_cheap]
    t_fast, c_cheap = float(time_s[i_fast]), float(cost[i_cheap])
    late = cons.deadline_s is not None and t_fast > cons.deadline_s
    dear = cons.budget is not None and c_cheap > cons.budget
    dl = f"the {format_duration(cons.deadline_s)} deadline" if cons.deadline_s is not None else ""
    bg = f"the {_money(cons.budget, unit)} budget" if cons.budget is not None else ""
    if late:
        assert cons.deadline_s is not None
        over_t = (
            f"the fastest takes {format_duration(t_fast)} ({_where(fastest)}), "
            f"{format_duration(t_fast - cons.deadline_s)} too long"
        )
    if dear:
        assert cons.budget is not None
        over_c = (
            f"the cheapest costs {_money(c_cheap, unit)} ({_where(cheapest)}), "
            f"{_money(c_cheap - cons.budget, unit)} over it"
        )
    if late and dear:
        return f"no configuration finishes within {dl} or stays within {bg}: {over_t}, and {over_c}"
    if late:
        return f"no configuration finishes within {dl}: {over_t}"
    if dear:
        return f"no configuration stays within {bg}: {over_c}"
    # each constraint alone is met, both together are not
    assert cons.deadline_s is not None and cons.budget is not None
    met = [cons.meets(float(time_s[i]), float(cost[i])) for i in feas]
    in_time = [i for i, (ok, _) in zip(feas, met) if ok]
    in_budget = [i for i, (_, ok) in zip(feas, met) if ok]
    a, b = _first_least(in_time, cost, time_s), _first_least(in_budget, time_s, cost)
    return (
        f"no configuration meets both {dl} and {bg}: the cheapest within the deadline costs "
        f"{_money(float(cost[a]), unit)} ({_where(rows[a])}), {_money(float(cost[a]) - cons.budget, unit)} over the "
        f"budget, and the fastest within the budget takes {format_duration(float(time_s[b]))} ({_where(rows[b])}), "
        f"{format_duration(float(time_s[b]) - cons.deadline_s)} past the deadline"
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
def noise_assumed(models: Mapping[str, Any] | ModelsRecord, noise_scale: float | None, reference_batch: int) -> dict:
    """The gradient noise scale a plan assumes: ``noise_scale`` (a what-if) when given, else
    the models' (``noise_scale.b_noise``, measured by the profile); ``b_noise`` None with a
    ``note`` when there is none.  ``models``: a models record, as a dict or typed."""
    if noise_scale is not None:
        if isinstance(noise_scale, bool) or not isinstance(noise_scale, (int, float)):
            raise SpecError(f"the noise scale is a number of samples, not {noise_scale!r}")
        if not (math.isfinite(noise_scale) and noise_scale > 0):
            raise SpecError(f"the noise scale must be a positive number of samples, not {noise_scale:g}")
        return {"b_noise": float(noise_scale), "source": "what-if", "reference_batch": reference_batch}
    if isinstance(models, ModelsRecord):
        measured = models.noise_scale.to_json_dict() if models.noise_scale is not None else {}
    else:
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
class Knee:
    """A cluster size's knee: the index of its row, its global batch and how it was found
    (``kneedle`` or ``fallback``: :func:`find_knee`)."""

    row: int
    global_batch: int
    method: str


@dataclass(frozen=True, eq=False)
class Ranking:
    """What an objective's rule chooses among, as arrays over the plan's rows: the time and the
    cost the objective ranks by (``time_s``, ``cost``: to accuracy or for the spec's epochs),
    each row's N and B and whether it meets the constraints; the indices of the rows that fit
    and meet them (``eligible``), each cluster size's knee, and the words of the reason."""

    time_s: np.ndarray
    cost: np.ndarray
    n_workers: np.ndarray
    global_batch: np.ndarray
    meets_constraints: np.ndarray
    eligible: np.ndarray
    knees: dict[str, Knee]
    spot: bool
    to_accuracy: bool
    constraints: str  # the constraints in words
    constrained: bool

    def within(self) -> str:
        return f" within {self.constraints}" if self.constrained else ""

    def to_acc(self) -> str:
        return " to accuracy" if self.to_accuracy else ""


def _least_time(r: Ranking) -> tuple[int, str]:
    chosen = _first_least(r.eligible, r.time_s, r.cost)
    return chosen, (
        "least expected training time" if r.spot else "least predicted training time"
    ) + r.to_acc() + r.within()


def _least_cost(r: Ranking) -> tuple[int, str]:
    chosen = _first_least(r.eligible, r.cost, r.time_s)
    return chosen, ("least expected cost" if r.spot else "least predicted cost") + r.to_acc() + r.within()


def _at_knee(r: Ranking) -> tuple[int, str]:
    """The fastest of the cluster sizes' knees that meet the constraints; when every knee
    misses them, the configuration meeting them nearest to its cluster size's knee."""
    ok_knees = [k.row for k in r.knees.values() if r.meets_constraints[k.row]]
    if ok_knees:
        chosen = _first_least(ok_knees, r.time_s, r.cost)
        kn = r.knees[str(int(r.n_workers[chosen]))]
        why = (
            f"knee of the predicted time{r.to_acc()}-vs-batch curve"
            if kn.method == "kneedle"
            else f"no knee found; smallest batch within {KNEE_FALLBACK_TOL:.0%} of the fastest"
        ) + r.within()
        return chosen, why
    # how far (in log batch) each row is from its cluster size's knee; rows of sizes without one are not eligible
    off_knee = np.full(r.time_s.shape, math.inf)
    for i in r.eligible.tolist():
        knee = r.knees[str(int(r.n_workers[i]))]
        off_knee[i] = abs(math.log(int(r.global_batch[i]) / knee.global_batch))
    chosen = _first_least(r.eligible, off_knee, r.time_s, r.cost)
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
@dataclass(frozen=True)
class GridPoint:
    """A configuration a plan evaluates, before its predictions: N workers, each taking a local
    batch b = B / N as k micro-batches, whether the plan's table shows it (``candidate``) and why
    it does not fit in memory or was not measured (``reason``; empty where it fits)."""

    n_workers: int
    local_batch: int
    accumulation_steps: int
    candidate: bool
    reason: str = ""
    sequence_length: int | None = None  # L, the tokens of each sample (None: the data has no sequence length)

    @property
    def global_batch(self) -> int:
        """B = N b."""
        return self.n_workers * self.local_batch

    @property
    def micro_batch(self) -> int:
        """b / k, the samples of one forward and backward pass."""
        return self.local_batch // self.accumulation_steps

    @property
    def feasible(self) -> bool:
        """Whether it fits in memory (and its cluster size was measured)."""
        return not self.reason

    @property
    def config(self) -> Config:
        """(N, B, k) as one value."""
        return Config(self.n_workers, self.global_batch, self.accumulation_steps)


def _variant_of(row: PlanRow) -> RunVariant:
    """The run variant a plan row is of."""
    return RunVariant(checkpointing=row.checkpointing, parallelism=row.parallelism)


def _tokens(global_batch: int, sequence_length: int | None, t_step_s: float) -> dict[str, int | float]:
    """A row's figures in tokens, where it has a sequence length L: ``tokens_per_batch`` (B L)
    and ``tokens_per_s`` (B L / t_step); none without one (a row as before sequence lengths)."""
    if sequence_length is None:
        return {}
    tokens = global_batch * sequence_length
    return {"tokens_per_batch": tokens, "tokens_per_s": tokens / t_step_s if t_step_s else math.inf}


def _typed_models(models: Mapping[str, Any] | ModelsRecord) -> ModelsRecord:
    """A models record as the typed object the planner reads: the object as it is, a whole
    record (a dict with its ``kind``) checked (:func:`tula.core.records.parse_record`)."""
    if isinstance(models, ModelsRecord):
        return models
    return ModelsRecord.from_dict(models, "the models record")


class Planner:
    """One plan, in the steps :func:`make_plan` takes; each is a method that can be called,
    and tested, on its own:

    1. the options resolved (the constructor): the spec with the pricing and constraints to
       plan under, the objective and its rule, the noise scale, the pricing, the method and a
       finished run's measured ratio;
    2. :meth:`grid`: a :class:`GridPoint` per (N, B) of the search space, and whether it fits in memory;
    3. :meth:`predict`: the rows (:class:`~tula.core.records.PlanRow`), from one prediction of
       every point's step, epoch, time and cost, each marked whether it meets the constraints
       (:meth:`meets_constraints`);
    4. :meth:`candidates`: the feasible and the eligible rows (or the sentence saying why there are none);
    5. :meth:`curves` and :meth:`knees`: per cluster size, the dense curves and the knee;
    6. :meth:`choose`: the objective's rule (:data:`RULES`) among the eligible rows, on arrays;
    7. :meth:`reason`: the choice in one sentence, with its notes;
    8. :meth:`record`: the plan record (:class:`~tula.core.records.PlanRecord`).

    :meth:`plan` runs them in that order.  The constructor takes :func:`make_plan`'s
    arguments (but ``compare_spot``) and raises what it raises for a bad option."""

    def __init__(
        self,
        models: Mapping[str, Any] | ModelsRecord,
        objective: str | None = None,
        constraints: Any = None,
        *,
        pricing: Any = None,
        noise_scale: float | None = None,
        method: str | None = None,
        measured: MeasuredRatio | Mapping[str, Any] | None = None,
    ) -> None:
        # the options as given: a variant's own planner (:meth:`variant_planners`) is made with them
        self.options: dict[str, Any] = {
            "objective": objective, "constraints": constraints, "pricing": pricing, "noise_scale": noise_scale,
            "method": method, "measured": measured,
        }  # fmt: skip
        # the fitted models (memory, performance, the method's run costs) every row is predicted from
        self.fitted = FittedModels.from_record(models, method=method)
        self.mem = self.fitted.memory_model()  # a record without one: that sentence, before the whole record's check
        self.given_models, self.models = models, _typed_models(models)
        spec, self.perf = self.models.spec, self.fitted.perf
        if pricing is not None:
            spec = _with_pricing(spec, pricing)
        self.cons = Constraints.of(spec.constraints if constraints is None else constraints)
        if constraints is not None:  # the plan's spec says what it was planned under
            planned_under = {"deadline_s": self.cons.deadline_s, "budget": self.cons.budget}
            spec = spec_from_dict({**spec.to_dict(), "constraints": planned_under})
        self.spec, self.noise_scale = spec, noise_scale
        self.measured = None if measured is None else MeasuredRatio.model_validate(measured)
        self.objective = _checked_objective(objective or spec.objective)
        self.to_accuracy = OBJECTIVES[self.objective].to_accuracy
        self.noise = NoiseScale.model_validate(noise_assumed(self.models, noise_scale, spec.train.base_batch))
        if self.to_accuracy and not self.noise.b_noise:
            raise SpecOptionError(
                f"objective {self.objective} needs the gradient noise scale, and the profile has none "
                f"({self.noise.note}); give one as a what-if ({{noise_scale}})",
                noise_scale="noise_scale",
            )
        self.pricing = make_pricing(spec.pricing)
        self.spot = isinstance(self.pricing, SpotPricing)
        self.budget = self.models.memory_budget_bytes
        # sharded (fsdp): the limit depends on N (b_mem_at); here at the smallest N planned
        sharded_at = min(spec.search.cluster_sizes) if self.mem.sharded else None
        self.b_mem = self.mem.max_local_batch(self.budget, spec.search.memory_safety, sharded_at)
        self.b_oom = self.models.oom_local_batch
        # cluster sizes the profile could not place (one rank per GPU): no step was measured there,
        # and the fitted sync term says nothing about them, so they are listed but not ranked
        self.not_measured: dict[str, str] = dict(self.models.not_measured or {})
        self.method = self.fitted.method  # ``method``, else the spec's train.method
        # a finished run of this method: its measured / predicted, on every configuration
        self.ratio = self.measured.ratio if self.measured is not None and self.measured.method == self.method else None
        # the fields of a row the choice, the constraints and the knees read
        self.tk, self.ck = ("time_to_accuracy_s", "cost_to_accuracy") if self.to_accuracy else ("total_time_s", "cost")

    @cached_property
    def run_costs(self) -> tuple[RunCosts | None, str]:
        """The method's run costs (its step and each epoch's end) and the sentence saying what
        they include (:func:`tula.core.run_costs.run_costs_for`), as the fitted models hold them."""
        return self.fitted.run_costs, self.fitted.run_costs_note

    def plan(self, compare_spot: bool = False) -> PlanRecord:
        """The plan record (:func:`make_plan`): every step in turn."""
        rows = self.variant_rows()
        # the rows of one sequence length and one variant: the curves, knees and choice are of them
        at = self.length_to_plan(rows)
        sub = [rows[i] for i in at]
        feas, eligible = self.candidates(sub)
        knees = self.knees(sub, feas)
        curves = self.curves(sub, feas)
        chosen, why = self.choose(sub, eligible, knees)
        own = self.planner_of(sub[chosen])  # the chosen variant's planner: its limits, its notes
        reason = own.reason(sub, feas, chosen, why) + self.length_note(rows, sub[chosen])
        reason += self.variant_note(rows, sub[chosen]) + self.parallelism_note(rows, sub[chosen])
        back = {n: Knee(at[k.row], k.global_batch, k.method) for n, k in knees.items()}
        plan = own.record(rows, [at[i] for i in feas], [at[i] for i in eligible], back, curves, at[chosen], reason)
        if own is not self:  # the spec as given (train.checkpointing or train.parallelism auto)
            plan = plan.model_copy(update={"spec": self.spec})  # checked: model_copy does not validate
        if compare_spot:
            comparison = _compare_spot(
                plan, self.given_models, self.objective, self.cons, self.spec.pricing, self.noise_scale, self.method,
                self.measured,
            )  # fmt: skip
            plan = plan.model_copy(update={"spot_comparison": SpotComparison.model_validate(comparison)})
        return plan

    # ----------------------------------------------------------------------- run variants
    @cached_property
    def variant_planners(self) -> list[tuple[RunVariant, Planner]]:
        """Each run variant the spec allows (:func:`tula.core.variants.run_variants`) and the
        planner of its rows: this one where the spec fixes the variant (``train.checkpointing``
        on or off, ``train.parallelism`` ddp or fsdp); with ``auto``, one per variant, over the models
        record of that variant (:func:`tula.core.variants.variant_models`), made with this planner's
        options."""
        variants = run_variants(self.spec, self.models)
        if self.spec.train.checkpointing != "auto" and self.spec.train.parallelism != "auto":
            return [(variants[0], self)]
        return [(v, Planner(variant_models(self.models, v), **self.options)) for v in variants]

    def planner_of(self, row: PlanRow) -> Planner:
        """The planner of ``row``'s variant."""
        for variant, planner in self.variant_planners:
            if variant == _variant_of(row):
                return planner
        return self

    def variant_rows(self) -> list[PlanRow]:
        """The rows of every variant (:meth:`variant_planners`), each predicted by its own planner."""
        rows: list[PlanRow] = []
        for _, planner in self.variant_planners:
            rows += planner.predict(planner.grid())
        return rows

    def variant_note(self, rows: Sequence[PlanRow], choice: PlanRow) -> str:
        """The reason's words on activation checkpointing: with ``auto``, whether it was chosen and
        why (the best row of the other variant, or that none of it fits, and the fitted compute
        factor); with ``off``, a note where no row fits (the checkpointed step was not measured)."""
        mode = self.spec.train.checkpointing
        if mode != "auto":
            return ""
        if not any(v.checkpointing for v, _ in self.variant_planners):
            return (
                " [train.checkpointing auto: the profile has no checkpointed trial, so only the plain step was planned]"
            )
        assert self.models.checkpointing is not None  # two variants: the effect was fitted
        factor = float(self.models.checkpointing.compute_factor)
        by_cost, chosen_value, best = self.best_other_variant(
            rows, choice, lambda r: r.checkpointing != choice.checkpointing and r.parallelism == choice.parallelism
        )
        what = "cost" if by_cost else "time"
        if choice.checkpointing:
            head = f" [with activation checkpointing (compute x{factor:.3g} fitted)"
            if best is None:
                return f"{head}: without it no configuration fits]"
            return (
                f"{head}: the best without it, N={best[0].n_workers}, B={best[0].global_batch}, takes "
                f"{_times(best[1], chosen_value)} the {what}]"
            )
        if best is None:
            return " [without activation checkpointing: with it no configuration fits the constraints better]"
        return (
            f" [without activation checkpointing: its step is x{factor:.3g} slower, and its best, "
            f"N={best[0].n_workers}, B={best[0].global_batch}, takes {_times(best[1], chosen_value)} "
            f"the {what}]"
        )

    def best_other_variant(
        self, rows: Sequence[PlanRow], choice: PlanRow, other: Callable[[PlanRow], bool]
    ) -> tuple[bool, float, tuple[PlanRow, float] | None]:
        """For a variant note: whether the objective ranks by cost, the chosen row's time (or
        cost), and the best feasible row meeting the constraints at the chosen sequence length
        that ``other`` picks (another variant), with its value (``None``: there is none)."""
        time_s, cost = self.ranked(rows)
        by_cost = OBJECTIVES[self.objective].rule == "least_cost"
        value = cost if by_cost else time_s
        others = [
            i for i, r in enumerate(rows)
            if other(r) and r.feasible and r.meets_constraints and r.sequence_length == choice.sequence_length
        ]  # fmt: skip
        chosen_value = float(value[rows.index(choice)])
        if not others:
            return by_cost, chosen_value, None
        best = min(others, key=lambda i: float(value[i]))
        return by_cost, chosen_value, (rows[best], float(value[best]))

    def parallelism_note(self, rows: Sequence[PlanRow], choice: PlanRow) -> str:
        """The reason's words on the parallelism, with ``train.parallelism: auto``: why fsdp was
        chosen (a local batch fits sharded where no DDP row of the same N fits it, or it is
        faster or cheaper, by how much), or why ddp (faster or cheaper than the best fsdp row, by
        how much, or fsdp fits nothing better); where auto planned ddp only, why (one clause)."""
        if self.spec.train.parallelism != "auto":
            return ""
        only_ddp = parallelism_auto_note(self.spec, self.models)
        if only_ddp:
            return f" [{only_ddp}]"
        assert self.models.sharding is not None  # two parallelisms: the effect was fitted
        effect = self.models.sharding
        by_cost, chosen_value, best = self.best_other_variant(
            rows, choice, lambda r: r.parallelism != choice.parallelism
        )
        better = "cheaper" if by_cost else "faster"
        sync = f"its sync {effect.sync_s * 1e3:.3g} ms per step at N={effect.n_workers} fitted"
        if choice.parallelism == "fsdp":
            ddp_fits = [
                r.micro_batch or r.local_batch for r in rows
                if r.parallelism == "ddp" and r.feasible and r.n_workers == choice.n_workers
            ]  # fmt: skip
            micro = choice.micro_batch or choice.local_batch
            if not ddp_fits or micro > max(ddp_fits):
                return f" [fsdp: fits at b={micro} on N={choice.n_workers} where ddp does not]"
            if best is None:
                return " [fsdp: with ddp no configuration meets the constraints]"
            gain = 100.0 * (best[1] / max(chosen_value, 1e-300) - 1.0)
            return (
                f" [fsdp: {better} by {gain:.3g} % than the best with ddp, N={best[0].n_workers}, "
                f"B={best[0].global_batch}]"
            )
        if best is None:
            return " [ddp: with fsdp no configuration fits the constraints better]"
        gain = 100.0 * (best[1] / max(chosen_value, 1e-300) - 1.0)
        return (
            f" [ddp: {better} by {gain:.3g} % than the best with fsdp, N={best[0].n_workers}, "
            f"B={best[0].global_batch} ({sync})]"
        )

    # ----------------------------------------------------------------------- sequence lengths
    @cached_property
    def lengths(self) -> list[int | None]:
        """The sequence lengths the rows are at (:func:`tula.core.spec.planned_sequence_lengths`);
        a :class:`~tula.core.errors.SpecError` where several are asked of models fitted at one."""
        lengths = planned_sequence_lengths(self.spec)
        fitted_at = self.perf.sequence_length
        if fitted_at is None and self.mem.sequence_length is None and len(lengths) > 1:
            raise SpecError(
                f"search.sequence_lengths {lengths} are asked, but the models were fitted at one sequence length; "
                "profile with these sequence_lengths first (tula profile)"
            )
        return lengths

    def length_to_plan(self, rows: Sequence[PlanRow]) -> list[int]:
        """The indices of the rows at the sequence length (and run variant, :meth:`variant_planners`)
        the plan chooses at: with one of each, every row; with several, the one whose own choice (:meth:`choose` among its rows)
        trains a token in the least time (by cost: for the least cost) -- each length's time
        and cost divided by L, the same D sequences of L tokens an epoch at each."""
        groups = [(length, v) for length in self.lengths for v, _ in self.variant_planners]
        if len(groups) <= 1:
            return list(range(len(rows)))
        best: tuple[float, list[int]] | None = None
        first_error: InfeasibleError | None = None
        for length, variant in groups:
            at = [i for i, r in enumerate(rows) if r.sequence_length == length and _variant_of(r) == variant]
            sub = [rows[i] for i in at]
            try:
                feas, eligible = self.candidates(sub)
            except InfeasibleError as err:  # nothing fits, or meets the constraints, at this length
                first_error = first_error or err
                continue
            chosen, _ = self.choose(sub, eligible, self.knees(sub, feas))
            time_s, cost = self.ranked(sub)
            by_cost = OBJECTIVES[self.objective].rule == "least_cost"
            per_token = float((cost if by_cost else time_s)[chosen]) / float(length or 1)
            if best is None or per_token < best[0]:
                best = (per_token, at)
        if best is None:
            assert first_error is not None
            raise first_error
        return best[1]

    def length_note(self, rows: Sequence[PlanRow], choice: PlanRow) -> str:
        """The reason's words on the sequence length, where the rows have one: the length, the
        chosen batch in tokens (B L) and its tokens per second (B L / t_step); where several were
        planned, that the length chosen trains a token in the least time (or cost) of them."""
        if choice.sequence_length is None:
            return ""
        length = choice.sequence_length
        tokens = choice.global_batch * length
        tokens_per_s = tokens / choice.t_step_s if choice.t_step_s else math.inf
        note = (
            f" [at sequence length L={length}: B={choice.global_batch} is {tokens} tokens, {tokens_per_s:.4g} tokens/s"
        )
        if len(self.lengths) <= 1:
            return note + "]"
        planned = ", ".join(str(n) for n in self.lengths)
        by = "cost" if OBJECTIVES[self.objective].rule == "least_cost" else "time"
        return f"{note}; the least {by} per token of L = {planned}]"

    # ----------------------------------------------------------------------- the rows
    def grid(self) -> list[GridPoint]:
        """A point per (N, B) the plan evaluates: for each cluster size N, the local batches b from
        ``min_batch / N`` to ``max_batch / N``, dense (:data:`DENSE_POINTS_PER_OCTAVE`), the
        candidate global batches' and the memory limits' among them; each with its micro-batch
        and accumulation steps and whether it fits in memory (its ``reason`` why not).  Raises
        :class:`~tula.core.errors.InfeasibleError` for an empty space."""
        search, d = self.spec.search, self.fitted.dataset_size
        grid = candidate_global_batches(search, d)
        big_lo, big_hi = search.min_batch, max_global_batch(search, d)
        points: list[GridPoint] = []
        for length in self.lengths:
            for n in search.cluster_sizes:
                # per N: a sharded model's limit depends on it (b_mem_at)
                oom_limit = None if self.b_oom is None else self.b_oom - 1
                limits = [b for b in (self.b_mem_at(n), oom_limit) if b is not None]
                at = self.limits_at(length, n)
                at_limits = limits if at is None else [at[0]] if at[0] is not None else []
                lo, hi = max(1, math.ceil(big_lo / n)), big_hi // n
                cand_local = [g // n for g in grid if g % n == 0 and g >= n]
                for b in _dense_local_batches(lo, hi, cand_local + at_limits):
                    limit = min(at_limits) if at_limits else None
                    points.append(replace(self.row(n, b, n * b in grid, limit, at, length), sequence_length=length))
        if not points:
            raise InfeasibleError(
                "the search space is empty: no global batch between min_batch and max_batch splits over the "
                "cluster sizes"
            )
        return points

    def b_mem_at(self, n: int) -> int | None:
        """The memory model's largest local batch of one step on N workers, its prediction there
        (:meth:`FittedModels.fits_in_memory` at k = 1): DDP's the same for every N >= 2; a sharded
        one's (fsdp) larger on more workers."""
        return self.mem.max_local_batch(self.budget, self.spec.search.memory_safety, n)

    def limits_at(self, length: int | None, n: int | None = None) -> tuple[int | None, int | None] | None:
        """At a sequence length other than the one the models were fitted at: the memory
        model's largest local batch there and the batch that ran out of memory while profiling
        where it binds there too (:meth:`FittedModels.max_local_batch_at`); ``None`` at the
        fitted length (or models of one length): :attr:`b_mem` and :attr:`b_oom` as they are."""
        fitted_at = self.mem.sequence_length
        if length is None or fitted_at is None or length == fitted_at:
            return None
        b_mem = self.mem.max_local_batch(self.budget, self.spec.search.memory_safety, n, length)
        b_oom = self.b_oom if length >= fitted_at else None
        both = [b for b in (b_mem, None if b_oom is None else b_oom - 1) if b is not None]
        return (min(both) if both else None), b_mem

    def row(
        self,
        n: int,
        b: int,
        candidate: bool,
        limit: int | None,
        at_length: tuple[int | None, int | None] | None = None,
        sequence_length: int | None = None,
    ) -> GridPoint:
        """The point of N workers at local batch b: where memory caps the local batch at ``limit``,
        k micro-batches of b / k may carry it (up to ``max_accumulation_steps``); the point is
        feasible when its micro-batch fits the memory budget and is below the batch that ran out
        of memory, and its cluster size was measured.  ``at_length``: the limits at another
        sequence length (:meth:`limits_at`), and ``sequence_length`` that length.  The k micro-batches
        are the fewest whose accumulated peak fits (:meth:`FittedModels.accumulation_steps_for`, the rule
        of the row's feasibility too: the rest of the share's data and the gradients held between
        them count); where none does, the fewest within ``limit``, refused."""
        k_max = self.spec.search.max_accumulation_steps
        fitting = self.fitted.accumulation_steps_for(b, n, k_max, sequence_length, limit)
        k = fitting or accumulation_for(b, limit, k_max) or 1
        micro, reason = b // k, ""
        b_mem, b_oom = (self.b_mem_at(n), self.b_oom) if at_length is None else (at_length[1], None)
        if at_length is not None and at_length[0] is not None and (b_mem is None or at_length[0] < b_mem):
            b_oom = at_length[0] + 1  # the batch that ran out of memory binds here
        if b_mem is not None and micro > b_mem:
            reason = f"predicted peak exceeds the memory budget (local batch > {b_mem})"
        elif b_oom is not None and micro >= b_oom:
            reason = f"a local batch of {b_oom} ran out of memory while profiling"
        elif fitting is None:  # the micro-batch fits one step, but not the share's k micro-batches
            reason = (
                f"predicted peak of {k} micro-batches of {micro} exceeds the memory budget (the rest of the "
                f"share's data and the gradients held between micro-batches)"
            )
        if reason and k_max > 1:
            reason += f", and no accumulation of up to {k_max} steps splits {b} into micro-batches that fit"
        if reason and self.checkpointed_limit is not None and micro <= self.checkpointed_limit:
            reason += "; fits with train.checkpointing: on (or auto)"  # the knob the spec forbids
        sharded_fits = self.sharded_limit(n)
        if reason and sharded_fits is not None and micro <= sharded_fits:
            reason += "; fits with train.parallelism: fsdp (or auto)"  # the knob the spec forbids
        if str(n) in self.not_measured:
            reason = self.not_measured[str(n)]
        return GridPoint(n, b, k, candidate, reason)

    @cached_property
    def checkpointed_limit(self) -> int | None:
        """With ``train.checkpointing: off`` and models that measured the checkpointed step (its
        effect fitted): the largest local batch that fits with it (the spec forbids it; a row
        infeasible without it says so).  ``None`` otherwise: nothing can be said of it."""
        if self.spec.train.checkpointing != "off" or not self.models.checkpointing:
            return None
        return self.models.checkpointing.memory(self.mem).max_local_batch(self.budget, self.spec.search.memory_safety)

    def sharded_limit(self, n: int) -> int | None:
        """With ``train.parallelism: ddp`` and models that measured the sharded step (its effect
        fitted): the largest local batch that fits sharded on ``n`` workers (the spec forbids it; a
        row infeasible without it says so).  ``None`` otherwise, and on one worker."""
        if self.spec.train.parallelism != "ddp" or not self.models.sharding or n < 2:
            return None
        sharded = self.models.sharding.memory(self.mem)
        return sharded.max_local_batch(self.budget, self.spec.search.memory_safety, n)

    def predict(self, points: Sequence[GridPoint]) -> list[PlanRow]:
        """The plan's rows: each point with its predicted step (``t_step_s``), epoch
        (``epoch_time_s``, of which ``epoch_steps_s`` and ``epoch_fixed_s``), training time
        (``total_time_s``: expected with preemptions on spot), ``cost`` and ``peak_mem_bytes``, for
        the spec's epochs of the method, every step and epoch scaled by a finished run's measured
        ratio of this method; with a noise scale, also the time and cost to accuracy
        (:meth:`predict_to_accuracy`); on spot, ``failure_free_time_s`` and
        ``expected_preemptions``; and whether it meets the constraints (:meth:`meets_constraints`)."""
        # one call of the fitted models' prediction (tula.core.fitted): on the network the profile's
        # ranks ran on, Eq. 4a's D / B steps of the method's step and each epoch's end, the spec's
        # epochs priced as one run (spot: expected, with preemptions)
        with_lengths = self.perf.sequence_length is not None or self.mem.sequence_length is not None
        p = self.fitted.predict(
            [pt.config for pt in points], pricing=self.pricing, epochs=self.spec.epochs, whole_steps=False,
            measured_ratio=self.ratio,
            sequence_length=np.array([pt.sequence_length or np.nan for pt in points], float) if with_lengths else None,
        )  # fmt: skip
        checkpointing = self.spec.train.checkpointing == "on"
        parallelism = "fsdp" if self.spec.train.parallelism == "fsdp" else "ddp"
        assert p.cost is not None and p.peak_mem_bytes is not None  # priced, with the memory model
        columns: dict[str, np.ndarray] = {
            "t_step_s": p.t_step_s,
            "epoch_time_s": p.epoch_time_s,
            "epoch_steps_s": p.epoch_time_s - p.epoch_fixed_s,
            "epoch_fixed_s": p.epoch_fixed_s,
            "total_time_s": p.total_time_s,
            "cost": p.cost,
            "peak_mem_bytes": p.peak_mem_bytes,
        }
        if self.noise.b_noise:
            columns.update(self.predict_to_accuracy(p.n_workers, p.global_batch, p.epoch_time_s, p.peak_mem_bytes))
        if p.expected_preemptions is not None:
            columns.update(failure_free_time_s=p.failure_free_time_s, expected_preemptions=p.expected_preemptions)
        meets = self.meets_constraints(columns[self.tk], columns[self.ck]).tolist()
        values = [dict(zip(columns, each)) for each in zip(*(c.tolist() for c in columns.values()))]
        return [
            PlanRow(
                n_workers=pt.n_workers,
                global_batch=pt.global_batch,
                local_batch=pt.local_batch,
                micro_batch=pt.micro_batch,
                accumulation_steps=pt.accumulation_steps,
                candidate=pt.candidate,
                feasible=pt.feasible,
                reason=pt.reason,
                **predicted,
                meets_constraints=ok,
                chosen=False,
                sequence_length=pt.sequence_length,
                parallelism=parallelism,
                checkpointing=checkpointing,
                **_tokens(pt.global_batch, pt.sequence_length, predicted["t_step_s"]),
            )
            for pt, predicted, ok in zip(points, values, meets)
        ]

    def predict_to_accuracy(
        self, n: np.ndarray, global_batch: np.ndarray, epoch: np.ndarray, peak: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The epochs, the time and the cost to the accuracy the spec's epochs reach at B0
        (``epochs_to_accuracy``, ``time_to_accuracy_s``, ``cost_to_accuracy``), from the
        configurations' cluster sizes, global batches, epoch times and peaks."""
        assert self.noise.b_noise is not None and self.noise.reference_batch is not None  # with a noise scale
        e_acc = epochs_to_accuracy(self.spec.epochs, global_batch, self.noise.b_noise, self.noise.reference_batch)
        t_acc = self.pricing.expected_time_s(e_acc * epoch, n, epoch)
        c_acc = self.pricing.cost(t_acc, n, peak)
        return {
            "epochs_to_accuracy": np.asarray(e_acc, float),
            "time_to_accuracy_s": np.asarray(t_acc, float),
            "cost_to_accuracy": np.asarray(c_acc, float),
        }

    def forbidden_knob_note(self, rows: Sequence[PlanRow]) -> str:
        """What a knob the spec forbids would do where nothing fits: ``fits with
        train.checkpointing: on`` where the checkpointed step was measured and fits; where it was
        not measured (``off``), that it was not, so whether it fits is not known."""
        smallest = min(r.micro_batch or r.local_batch for r in rows)
        sharded = [n for n in self.spec.search.cluster_sizes if (self.sharded_limit(n) or 0) >= smallest]
        if sharded:
            return f"; a local batch of {smallest} fits with train.parallelism: fsdp (or auto) on N={max(sharded)}"
        if self.spec.train.checkpointing != "off":
            return ""
        if self.checkpointed_limit is not None:
            if smallest <= self.checkpointed_limit:
                return f"; a local batch of {smallest} fits with train.checkpointing: on (or auto)"
            return ""
        return (
            "; activation checkpointing is off and was not measured, so whether it would make one fit is not known "
            "(train.checkpointing: auto profiles it)"
        )

    def meets_constraints(self, time_s: np.ndarray, cost: np.ndarray) -> np.ndarray:
        """Whether each time and cost (to accuracy, for a to-accuracy objective) is within the
        deadline and the budget (:meth:`Constraints.meets`), as a bool array."""
        return np.array([all(self.cons.meets(t, c)) for t, c in zip(time_s.tolist(), cost.tolist())], bool)

    def ranked(self, rows: Sequence[PlanRow]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's time and cost as the objective ranks them (to accuracy, or for the spec's epochs)."""
        time_s = np.array([getattr(r, self.tk) for r in rows], float)
        cost = np.array([getattr(r, self.ck) for r in rows], float)
        return time_s, cost

    def candidates(self, rows: Sequence[PlanRow]) -> tuple[list[int], list[int]]:
        """The indices of the feasible rows and of those that also meet the constraints; raises
        :class:`~tula.core.errors.InfeasibleError` in one sentence when either is empty."""
        feasible = np.array([r.feasible for r in rows], bool)
        feas = np.flatnonzero(feasible).tolist()
        if not feas:
            raise InfeasibleError(
                f"no configuration is feasible: the smallest local batch in the space "
                f"({min(r.local_batch for r in rows)}) does not fit the memory budget of {self.budget} bytes"
                + self.forbidden_knob_note(rows)
            )
        meets = np.array([r.meets_constraints for r in rows], bool)
        eligible = np.flatnonzero(feasible & meets).tolist()
        if not eligible:
            raise InfeasibleError(_unmet(rows, *self.ranked(rows), feas, self.cons, self.pricing.unit))
        return feas, eligible

    # ----------------------------------------------------------------------- per cluster size
    def by_size(self, rows: Sequence[PlanRow], feas: list[int]) -> dict[int, list[int]]:
        """The feasible rows' indices per cluster size, in the spec's order (sizes with none left out)."""
        by_n: dict[int, list[int]] = {}
        for i in feas:
            by_n.setdefault(rows[i].n_workers, []).append(i)
        return {n: by_n[n] for n in self.spec.search.cluster_sizes if by_n.get(n)}

    def curves(self, rows: Sequence[PlanRow], feas: list[int]) -> dict[str, dict]:
        """Per cluster size, the feasible rows' global batches and their times and costs (to
        accuracy too, where the rows have them): the dense curves the plot draws."""
        curves: dict[str, dict] = {}
        for n, idx in self.by_size(rows, feas).items():
            curve: dict[str, list] = {"global_batch": [rows[i].global_batch for i in idx]}
            for name in ("total_time_s", "cost", "time_to_accuracy_s", "cost_to_accuracy"):
                if rows[idx[0]].given(name):
                    curve[name] = [getattr(rows[i], name) for i in idx]
            curves[str(n)] = curve
        return curves

    def knees(self, rows: Sequence[PlanRow], feas: list[int]) -> dict[str, Knee]:
        """Per cluster size, the knee of its feasible rows' time-vs-batch curve (:func:`find_knee`;
        to accuracy, of the falling part up to the fastest): its row, batch and how it was found."""
        time_s, _ = self.ranked(rows)
        knees: dict[str, Knee] = {}
        for n, idx in self.by_size(rows, feas).items():
            gb = np.array([rows[i].global_batch for i in idx], float)
            tt = time_s[idx]
            last = int(np.argmin(tt)) + 1 if self.to_accuracy else len(idx)  # to accuracy: the falling part
            k, how = find_knee(gb[:last], tt[:last])
            knees[str(n)] = Knee(row=idx[k], global_batch=int(gb[k]), method=how)
        return knees

    # ----------------------------------------------------------------------- the choice
    def choose(self, rows: Sequence[PlanRow], eligible: list[int], knees: dict[str, Knee]) -> tuple[int, str]:
        """The index of the row the objective's rule (:data:`RULES`) chooses among the eligible
        ones, and the words of why."""
        time_s, cost = self.ranked(rows)
        ranking = Ranking(
            time_s=time_s,
            cost=cost,
            n_workers=np.array([r.n_workers for r in rows], np.int64),
            global_batch=np.array([r.global_batch for r in rows], np.int64),
            meets_constraints=np.array([r.meets_constraints for r in rows], bool),
            eligible=np.asarray(eligible, np.int64),
            knees=knees,
            spot=self.spot,
            to_accuracy=self.to_accuracy,
            constraints=self.cons.describe(self.pricing.unit),
            constrained=self.cons.active,
        )
        return RULES[OBJECTIVES[self.objective].rule](ranking)

    def reason(self, rows: Sequence[PlanRow], feas: list[int], chosen: int, why: str) -> str:
        """The plan's one sentence: why, the choice, what it trains in what time for what cost,
        against the fastest and the cheapest feasible rows, then :meth:`notes`."""
        c, noise, epochs = rows[chosen], self.noise, self.spec.epochs
        time_s, cost = self.ranked(rows)
        c_time, c_cost = float(time_s[chosen]), float(cost[chosen])
        fastest, cheapest = float(time_s[feas].min()), float(cost[feas].min())
        took = f"{c_time:.1f} s" + (f" expected ({c.expected_preemptions:.2g} preemptions)" if self.spot else "")
        if self.to_accuracy:
            assert noise.b_noise is not None and c.epochs_to_accuracy is not None
            length = c.sequence_length  # with one: the epochs and the noise scale in tokens too (B L)
            tokens = (
                "" if length is None else f" ({c.epochs_to_accuracy * self.fitted.dataset_size * length:.3g} tokens)"
            )
            in_tokens = "" if length is None else f" = {noise.b_noise * length:.3g} tokens at L={length}"
            trains = (
                f"needs {c.epochs_to_accuracy:.3g} epochs{tokens} to reach what {epochs} reach at "
                f"B0={noise.reference_batch} (B_noise {noise.b_noise:.3g}{in_tokens}, "
                f"{'a what-if' if noise.source == 'what-if' else 'from the profile'})"
            )
        else:
            trains = f"trains {epochs} epochs"
        acc = f" as {c.accumulation_steps} x {c.micro_batch} accumulated" if c.accumulation_steps > 1 else ""
        return (
            f"{why}: N={c.n_workers}, B={c.global_batch} (b={c.local_batch}{acc}) {trains} in "
            f"{took} for {c_cost:.4g} {self.pricing.unit} "
            f"({_times(c_time, fastest)} the fastest, {_times(c_cost, cheapest)} the cheapest)"
        ) + self.notes(c)

    def notes(self, choice: PlanRow) -> str:
        """The reason's bracketed notes: the hosts the models were fitted on, the cluster sizes
        not measured, and a finished run's measured ratio (applied or not)."""
        out = ""
        fitted_on = self.models.placement or Placement()
        if fitted_on.n_hosts:
            where = (
                f"fitted on {fitted_on.n_hosts} host(s) with up to {fitted_on.max_ranks_per_host} rank(s) "
                f"per host, N <= {fitted_on.max_workers} measured"
            )
            if fitted_on.n_hosts == 1 and choice.n_workers > 1:
                where += "; the choice's sync time is from ranks sharing one host, not a network"
            out += f" [{where}]"
        if self.not_measured:
            out += "".join(f" [{why}]" for why in dict.fromkeys(self.not_measured.values()))
        if self.measured is not None:
            out += f" [{_measured_note(self.measured, bool(self.ratio), self.method)}]"
        return out

    def record(
        self,
        rows: Sequence[PlanRow],
        feas: list[int],
        eligible: list[int],
        knees: dict[str, Knee],
        curves: dict[str, dict],
        chosen: int,
        reason: str,
    ) -> PlanRecord:
        """The plan record: the choice (each row marked ``chosen`` or not), the reason, the
        knees, the Pareto frontier of the feasible rows, the curves, every row, the spec, the
        constraints, the noise scale, the method's run costs and the measured ratio.  Its
        ``spot_comparison`` is None (:meth:`plan` fills it when asked)."""
        marked = [r.model_copy(update={"chosen": i == chosen}) for i, r in enumerate(rows)]
        time_s, cost = self.ranked(marked)
        front = pareto_frontier(time_s[feas], cost[feas])
        costs, costs_note = self.run_costs
        return PlanRecord(
            kind=PLAN_KIND,
            version=VERSIONS[PLAN_KIND],
            objective=self.objective,
            choice=marked[chosen],
            reason=reason,
            max_local_batch=self.b_mem,
            oom_local_batch=self.b_oom,
            memory_budget_bytes=self.budget,
            knees={n: {"global_batch": k.global_batch, "method": k.method} for n, k in knees.items()},
            frontier=[marked[feas[j]] for j in front],
            curves=curves,
            configurations=marked,
            spec=self.spec.to_dict(),
            dataset_size=self.fitted.dataset_size,
            fitted_on=self.models.placement or Placement(),
            constraints=PlanConstraints(
                deadline_s=self.cons.deadline_s,
                budget=self.cons.budget,
                unit=self.pricing.unit,
                n_feasible=len(feas),
                n_meeting=len(eligible),
            ),
            spot_comparison=None,
            noise_scale=self.noise,
            not_measured=self.not_measured,
            # the method the epochs were predicted for, the terms used, and what they include
            method=self.method,
            run_costs=costs,
            run_costs_note=costs_note,
            # a finished run's measured / predicted epoch time, and whether this plan's epochs are scaled by it
            measured_ratio=self.measured and self.measured.model_copy(update={"applied": bool(self.ratio)}),
        )


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
    models: Mapping[str, Any] | ModelsRecord,
    objective: str | None = None,
    constraints: Any = None,
    *,
    pricing: Any = None,
    compare_spot: bool = False,
    noise_scale: float | None = None,
    method: str | None = None,
    measured: MeasuredRatio | Mapping[str, Any] | None = None,
) -> PlanRecord:
    """Evaluate the search space with fitted models and choose a configuration: the plan record
    (:class:`~tula.core.records.PlanRecord`; ``.to_json_dict()`` where it is written or sent).

    Parameters
    ----------
    models : a models record (what ``tula fit`` writes), typed or as a dict
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


def _measured_note(measured: MeasuredRatio, applied: bool, method: str) -> str:
    at = f"N={measured.n_workers}, B={measured.global_batch}"
    if applied:
        return (
            f"epochs scaled by {measured.ratio:.2f}, what a finished run measured against its prediction "
            f"({measured.epochs_compared} epoch(s) at {at})"
        )
    return (
        f"the finished run trained {measured.method!r}, not {method!r}: its measured ratio "
        f"{measured.ratio:.2f} is not applied"
    )


# --------------------------------------------------------------------------- spot vs on-demand
def _summary(plan: PlanRecord) -> dict:
    c = plan.choice.to_json_dict()
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
    plan: PlanRecord,
    models: Mapping[str, Any] | ModelsRecord,
    objective: str,
    cons: Constraints,
    ps: PricingSpec,
    noise_scale: float | None = None,
    method: str | None = None,
    measured: MeasuredRatio | None = None,
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
        return out | {
            "cheaper": "on_demand" if spot_plan is None else "spot",
            "sentence": (
                f"only {'on-demand' if spot_plan is None else 'spot'} can meet the constraints: on "
                f"{which} nodes {_lower_first(alt_error or '')}"
            ),
        }
    unit = plan.constraints.unit if plan.constraints is not None else make_pricing(ps).unit
    return out | _spot_vs_on_demand(spot_plan.choice, od_plan.choice, ps, unit)


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


def _spot_vs_on_demand(s: PlanRow, o: PlanRow, ps: PricingSpec, unit: str) -> dict:
    """The spot choice ``s`` against the on-demand one ``o``: at the spot choice, the same run's
    cost on demand and the preemption rate where the two cost the same; which is cheaper; and the
    sentence that says so."""
    assert ps.spot_price_per_node_hour is not None and ps.preemption_rate_per_node_hour is not None  # checked
    spot_p = SpotPricing(
        ps.spot_price_per_node_hour, ps.preemption_rate_per_node_hour, ps.checkpoint_interval_s, ps.restart_s
    )
    free, epoch = s.failure_free_time_s, s.epoch_time_s
    assert free is not None and epoch is not None  # a row priced on spot has them
    be = spot_p.break_even_rate(free, s.n_workers, ps.price_per_node_hour, epoch)
    if s.cost < o.cost:
        cheaper, verdict = "spot", f"spot is cheaper by {1 - s.cost / o.cost:.0%}"
    elif s.cost > o.cost:
        cheaper, verdict = "on_demand", f"on-demand is cheaper by {1 - o.cost / s.cost:.0%}"
    else:
        cheaper, verdict = "equal", "spot and on-demand cost the same"
    if be is None:
        limit = "spot's price is not below on-demand's, so no preemption rate makes it cheaper"
    elif math.isinf(be):
        limit = "spot is free, so cheaper at any preemption rate"
    else:
        limit = (
            f"at N={s.n_workers}, B={s.global_batch} spot costs less than on-demand while nodes are "
            f"preempted less than {be:.3g} times per node-hour (now {ps.preemption_rate_per_node_hour:g})"
        )
    return {
        "break_even_rate_per_node_hour": be,
        "on_demand_cost_at_spot_choice": free / 3600.0 * s.n_workers * ps.price_per_node_hour,
        "cheaper": cheaper,
        "sentence": (
            f"{verdict}: spot N={s.n_workers}, B={s.global_batch} is expected to take "
            f"{format_duration(s.total_time_s)} ({s.expected_preemptions:.2g} preemptions) for "
            f"{_money(s.cost, unit)}, on-demand N={o.n_workers}, B={o.global_batch} "
            f"{format_duration(o.total_time_s)} for {_money(o.cost, unit)}; {limit}"
        ),
    }
