"""The re-plan question that the API (``POST /v1/jobs/{id}/replan``) and the dashboard's form
both answer from a job's fitted models: the question's body, its answer, and the error either
front turns into its own response."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tula.core.errors import InfeasibleError
from tula.core.records import ModelsRecord, PlanRecord, TrainRecord, as_record
from tula.core.registry import OBJECTIVE_NAMES
from tula.core.say import plain
from tula.pipeline import with_spec


class Problem(Exception):
    """An error answered with ``status`` and one sentence."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class Replan(BaseModel):
    """Another question for a job's fitted models; whatever is left out stays as the job had it.
    A field it does not have is refused (422), not ignored."""

    model_config = ConfigDict(extra="forbid")

    objective: Literal[OBJECTIVE_NAMES] | None = None  # type: ignore[valid-type]
    pricing: dict[str, Any] | None = Field(default=None, description="e.g. {kind: fixed, price_per_node_hour: 3.2}")
    cluster_sizes: list[int] | None = Field(default=None, description="the cluster sizes to plan over")
    epochs: int | None = Field(default=None, ge=1)
    deadline: str | float | None = Field(default=None, description="finish within this duration (e.g. 8h) or seconds")
    budget: float | None = Field(default=None, ge=0, description="cost at most this, in the pricing's unit")
    noise_scale: float | None = Field(
        default=None,
        gt=0,
        description="the gradient noise scale B_noise to assume (a what-if; default: the profiled one), for the "
        "*_to_accuracy objectives",
    )
    use_measured: bool = Field(
        default=False,
        description="scale the predicted epochs by what the job's finished training run measured against its "
        "prediction (the median ratio over its epochs after the first)",
    )


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that are not None."""
    return {k: v for k, v in fields.items() if v is not None}


def replan_from_models(models: dict | ModelsRecord, body: Replan, run: dict | TrainRecord | None = None) -> PlanRecord:
    """The plan ``body`` asks for from ``models``; ``run``: the job's training record, which
    ``body.use_measured`` needs (a 409 without one, or without an epoch to compare)."""
    from tula.core.plan import make_plan
    from tula.core.run_costs import measured_ratio
    from tula.core.spec import spec_from_dict

    measured = None
    if body.use_measured:
        if run is None:
            raise Problem(409, "the job has no training run yet: use_measured needs a finished one")
        measured = measured_ratio(as_record(run, TrainRecord), models)  # the store's JSON, as the record
        if measured is None:
            raise Problem(409, "the job's training run has no epoch to compare with its prediction")

    stored = as_record(models, ModelsRecord).spec.to_dict()  # the job's spec, as its JSON
    constraints = None
    if body.deadline is not None or body.budget is not None:
        kept = {
            k: v for k, v in (stored.get("constraints") or {}).items() if k != "deadline_s" or body.deadline is None
        }
        constraints = {**kept, **_given(deadline=body.deadline, budget=body.budget)}
    search = None if body.cluster_sizes is None else {**stored["search"], "cluster_sizes": body.cluster_sizes}
    asked = _given(pricing=body.pricing, search=search, epochs=body.epochs, constraints=constraints)
    spec = spec_from_dict({**stored, **asked})  # a bad pricing or size list is a SpecError: 422
    try:
        plan = make_plan(with_spec(models, spec), body.objective, noise_scale=body.noise_scale, measured=measured)
        return plan
    except InfeasibleError as err:
        raise Problem(422, plain(err)) from None
