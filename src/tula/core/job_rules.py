"""What a job spec allows and where its batch schedule starts.

The tables of training methods (:mod:`tula.core.registry`) and batch schedules
(:mod:`tula.core.schedules`) know nothing of the spec; the spec (:mod:`tula.core.spec`)
reads their names.  The rules that read a :class:`~tula.core.spec.JobSpec` against those
tables live here, above all three, so that none of them imports another in a circle.

:func:`check_train_config` is the one place where every rule a training configuration must
satisfy is checked, before any process starts; the method classes call :func:`check_method`
with the same sentences.  :func:`train_config` and :func:`train_method` are the one rule every
front follows for the configuration and the method to train at: an explicit argument over the
plan's choice over the spec's fields over the defaults; :func:`training_spec` makes the spec a
front trains with, at that configuration's k and at the sequence length the same rule gives
(:func:`train_sequence_length`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tula.core.config import Config
from tula.core.errors import SpecError, SpecOptionError
from tula.core.live_plan import DEFAULT_THRESHOLD, Ranker, WorkerPlan
from tula.core.pricing import make_pricing
from tula.core.records import PlanRecord
from tula.core.registry import METHODS, OBJECTIVES, method_info
from tula.core.schedules import Caps, ScheduleState, initial_state, schedule_info
from tula.core.spec import (
    BatchScheduleSpec,
    JobSpec,
    data_at_sequence_length,
    largest_world,
    reference_sequence_length,
    spec_from_dict,
)


def method_problem(method: str, spec: JobSpec, n_workers: int, global_batch: int) -> str | None:
    """The sentence saying why ``method`` cannot train at (``n_workers``, ``global_batch``)
    under ``spec``, from its constraints in the table; ``None`` when it can."""
    info = method_info(method)
    if spec.train.parallelism == "fsdp" and info.whole_gradient:
        return _whole_gradient_problem(method)
    if n_workers < info.min_workers:
        why = f" {info.min_workers_reason}" if info.min_workers_reason else ""
        return f"method {method!r}{why} and needs at least {info.min_workers} workers, not {n_workers}"
    if info.needs_b_small_below_batch and spec.train.ags.b_small >= global_batch:
        return (
            f"train.ags.b_small ({spec.train.ags.b_small}) must be smaller than the global batch "
            f"({global_batch}) for method {method!r}"
        )
    return None


def _whole_gradient_problem(method: str) -> str:
    return (
        f"method {method!r} {method_info(method).whole_gradient}, which train.parallelism fsdp shards over the "
        f"workers; use method {' or '.join(sharded_methods())} with fsdp, or train.parallelism ddp"
    )


def sharded_methods() -> list[str]:
    """The methods that train on sharded gradients (``train.parallelism: fsdp``)."""
    return [name for name, info in METHODS.items() if not info.whole_gradient]


def parallelism_problem(spec: JobSpec, n_workers: int) -> str | None:
    """The sentence saying why ``train.parallelism`` fsdp cannot train this spec on ``n_workers``
    (beside the method's: :func:`method_problem`); ``None`` when it can (and under ddp)."""
    t = spec.train
    if t.parallelism != "fsdp":
        return None
    if t.precision == "fp16":
        return (
            "train.precision fp16 is not available with train.parallelism fsdp yet (its gradient scaler would "
            "skip a step on the ranks whose shard overflowed and not on the others); use bf16 or fp32"
        )
    if t.noise_scale and n_workers > 1:
        return (
            "train.noise_scale needs each worker's whole gradient before it is averaged, which train.parallelism "
            "fsdp reduce-scatters inside the backward pass; set train.noise_scale to false with fsdp"
        )
    return None


def fsdp_obstacle(spec: JobSpec) -> str | None:
    """With ``train.parallelism: auto``: why the planner may not weigh FSDP for this spec (a method
    that needs the whole gradient, fp16, the noise scale on more than one worker of
    :func:`~tula.core.spec.largest_world`), in one clause for the plan's reason; ``None`` when it may.
    Not a refusal: ``auto`` then plans and trains DDP only."""
    method, t = spec.train.method, spec.train
    if method_info(method).whole_gradient:
        return f"method {method!r} {method_info(method).whole_gradient}, which fsdp shards over the workers"
    if t.precision == "fp16":
        return "fsdp does not train in fp16 yet (its gradient scaler would skip a step on some ranks only)"
    if t.noise_scale and largest_world(spec) > 1:
        return "train.noise_scale needs each worker's whole gradient, which fsdp reduce-scatters"
    return None


def check_parallelism(spec: JobSpec) -> None:
    """``train.parallelism`` fsdp with what it cannot train (the spec's method, fp16, the noise scale
    on more than one worker of :func:`~tula.core.spec.largest_world`): one sentence, before a run
    profiles (training checks its own configuration again: :func:`check_train_config`)."""
    if spec.train.parallelism != "fsdp":
        return
    method = spec.train.method
    problem = _whole_gradient_problem(method) if method_info(method).whole_gradient else None
    problem = problem or parallelism_problem(spec, largest_world(spec))
    if problem:
        raise SpecError(problem)


def check_method(method: str, spec: JobSpec, n_workers: int, global_batch: int) -> None:
    """Raise :func:`method_problem`'s sentence as a :class:`~tula.core.errors.SpecError`."""
    problem = method_problem(method, spec, n_workers, global_batch)
    if problem:
        raise SpecError(problem)


def check_train_config(
    spec: JobSpec,
    method: str,
    n_workers: int,
    global_batch: int,
    dataset_size: int,
    accumulation_steps: int | None = None,
) -> None:
    """Every rule a training configuration must satisfy, checked before any process starts:
    one :class:`~tula.core.errors.SpecError` sentence for the first one broken.
    ``accumulation_steps``: the k it trains at (default: the spec's
    ``train.accumulation_steps``; an out-of-memory fallback may have raised it)."""
    k = spec.train.accumulation_steps if accumulation_steps is None else accumulation_steps
    Config(n_workers, global_batch, k).check()
    if global_batch > dataset_size:
        raise SpecError(f"global batch {global_batch} is larger than the training set ({dataset_size} samples)")
    check_method(method, spec, n_workers, global_batch)
    problem = parallelism_problem(spec, n_workers)
    if problem:
        raise SpecError(problem)


def smallest_batch_for(method: str, spec: JobSpec, n_workers: int) -> int:
    """The smallest global batch ``method`` can train at on ``n_workers``: one sample per
    worker, or the first multiple of ``n_workers`` above ``train.ags.b_small`` for the
    methods that measure on that sub-batch."""
    smallest = n_workers
    if method_info(method).needs_b_small_below_batch:
        smallest = max(smallest, (spec.train.ags.b_small // n_workers + 1) * n_workers)
    return smallest


def schedule_problem(method: str, spec: JobSpec) -> str | None:
    """Why ``method`` cannot follow the spec's batch schedule / growing workers, or None."""
    info = method_info(method)
    sched, workers = spec.train.batch_schedule, spec.train.workers
    if sched is None and workers is None:
        return None
    if spec.train.accumulation_steps > 1:
        return (
            f"train.accumulation_steps ({spec.train.accumulation_steps}) cannot be combined with a batch schedule "
            "or train.workers: a schedule chooses its own accumulation where the memory caps the local batch "
            "(up to search.max_accumulation_steps); set train.accumulation_steps to 1, or train at a constant batch"
        )
    if sched is not None and schedule_info(sched.kind).needs_models and workers is not None and workers.rule != "plan":
        return (
            f"batch schedule {sched.kind!r} chooses the worker count with the batch; set train.workers.rule to "
            "'plan', or leave train.workers out to keep the worker count"
        )
    if workers is not None and workers.min != workers.max and not info.resizable:
        return (
            f"method {method!r} keeps state per rank that cannot move to another worker count; train it with "
            "train.workers.min equal to train.workers.max, or choose another method"
        )
    if workers is not None and workers.min < info.min_workers:
        return f"method {method!r} needs at least {info.min_workers} workers, but train.workers.min is {workers.min}"
    if sched is not None and sched.lr_rule != "keep" and info.scales_lr_with_batch:
        return (
            f"method {method!r} already scales its LR with the global batch; set train.batch_schedule.lr_rule "
            "to 'keep' so that the LR is not scaled twice"
        )
    if sched is not None and schedule_info(sched.kind).needs_b_simple and not info.resizable:
        return (
            f"batch schedule {sched.kind!r} follows the gradient noise scale, which method {method!r} does not "
            "give (its workers do not synchronise their gradients); use another schedule"
        )
    return None


def state_from_spec(spec: JobSpec, first_batch: int, f0: float | None = None) -> ScheduleState:
    """:func:`initial_state` from ``spec.train.batch_schedule`` (``constant`` when it has none)."""
    t = spec.train
    s: BatchScheduleSpec | None = t.batch_schedule
    if s is None:
        return initial_state("constant", first_batch, lr_milestones=t.lr_milestones, lr_gamma=t.lr_gamma)
    return initial_state(
        s.kind,
        first_batch,
        s.params(),
        every_epochs=s.every_epochs,
        lr_rule=s.lr_rule,
        max_batch=s.max_batch,
        lr_milestones=t.lr_milestones,
        lr_gamma=t.lr_gamma,
        f0=f0,
    )


def needs_models_error(spec: JobSpec) -> SpecOptionError:
    """What a run whose spec needs the fitted models (:func:`uses_models`) is told without them
    (the option that passes them named ``models``: a front end spells it)."""
    sched = spec.train.batch_schedule
    what = (
        f"batch schedule {sched.kind!r} chooses the batch"
        if sched is not None and schedule_info(sched.kind).needs_models
        else "train.workers.rule 'plan' chooses the worker count"
    )
    return SpecOptionError(
        f"{what} from the fitted models, and this run has none: `tula run` passes them; give `tula train` "
        "the run's models.json with {models}",
        models="models",
    )


def uses_models(spec: JobSpec) -> bool:
    """Whether training ``spec`` needs the fitted models: ``train.workers.rule: plan``, or a
    batch schedule that ranks batches by them (``goodput``)."""
    w, sched = spec.train.workers, spec.train.batch_schedule
    return (w is not None and w.rule == "plan") or (sched is not None and schedule_info(sched.kind).needs_models)


def caps_from_spec(
    spec: JobSpec,
    first_batch: int,
    first_workers: int,
    dataset_size: int,
    max_local_batch: int | None,
    models: dict | None = None,
    method: str | None = None,
) -> Caps:
    """:class:`Caps` from ``spec.train.workers``: without it the worker count stays
    ``first_workers``; its ``batch_per_worker`` defaults to the first local batch; with
    ``rule: plan`` the fitted ``models`` (a models record) rank the worker counts for
    ``method`` (default ``train.method``) under the job's objective
    (:class:`tula.core.live_plan.WorkerPlan`).  The accumulation a schedule may grow through is
    ``search.max_accumulation_steps``."""
    w = spec.train.workers
    k_max = spec.search.max_accumulation_steps
    if w is None:
        rule = worker_plan(spec, models, method) if uses_models(spec) else None
        return Caps(dataset_size, max_local_batch, first_workers, first_workers, None, k_max, rule)
    if w.rule == "plan":
        return Caps(dataset_size, max_local_batch, w.min, w.max, None, k_max, worker_plan(spec, models, method))
    bpw = w.batch_per_worker or max(1, first_batch // max(first_workers, 1))
    return Caps(dataset_size, max_local_batch, w.min, w.max, bpw, k_max)


def worker_plan(spec: JobSpec, models: dict | None, method: str | None = None) -> WorkerPlan:
    """The :class:`~tula.core.live_plan.WorkerPlan` of ``train.workers: {rule: plan}`` or of
    the goodput schedule: the models rank by time, or by cost where the job's objective
    minimises cost."""
    if not models:
        raise needs_models_error(spec)
    by_cost = OBJECTIVES[spec.objective].rule == "least_cost"
    ranker = Ranker(
        models,
        method or spec.train.method,
        "cost" if by_cost else "time",
        make_pricing(spec.pricing) if by_cost else None,
    )
    threshold = spec.train.workers.threshold if spec.train.workers is not None else None
    return WorkerPlan(ranker, DEFAULT_THRESHOLD if threshold is None else threshold)


def first_workers(spec: JobSpec, first_batch: int) -> int | None:
    """The worker count ``spec.train.workers`` gives the first global batch, so that a run
    with a worker rule needs no worker count of its own: clip(ceil(B / batch_per_worker),
    min, max), or ``min`` when ``batch_per_worker`` is not given (it then defaults to the
    first local batch, B / min).  ``None`` without ``train.workers``.  The runner's first
    decision (:func:`next_config` at epoch 0, with the memory and data-set caps) may still
    round B down to a multiple of it."""
    w = spec.train.workers
    if w is None:
        return None
    if w.rule == "plan" or w.batch_per_worker is None:  # rule plan: the first decision chooses
        return w.min
    return min(max(math.ceil(first_batch / w.batch_per_worker), w.min), w.max)


# --------------------------------------------------------------------------- the configuration to train at
class NoConfigError(SpecError):
    """No source gives both a worker count and a global batch (each front says in its own
    words how to give one)."""


def scheduled(spec: JobSpec) -> bool:
    """Whether ``spec`` grows its batch or its workers (``train.batch_schedule``,
    ``train.workers``): its first configuration is where the schedule starts, and the
    schedule chooses its own accumulation."""
    return spec.train.batch_schedule is not None or spec.train.workers is not None


def train_config(
    spec: JobSpec,
    plan: PlanRecord | Mapping[str, Any] | None = None,
    *,
    n_workers: int | None = None,
    global_batch: int | None = None,
    accumulation_steps: int | None = None,
    world_size: Callable[[], int | None] | None = None,
    checkpoint: Callable[[], Config | None] | None = None,
) -> Config:
    """The configuration to train ``spec`` at: the one rule of every front (``tula train``,
    :meth:`tula.Job.train`, ``tula run`` and the service's runner through
    :mod:`tula.pipeline`, the scikit-learn estimators).

    The worker count N and the global batch B each come from the first source that gives it:

    1. the explicit argument, ``n_workers`` / ``global_batch`` (an option, a keyword);
    2. the plan's choice (``plan``, a plan record);
    3. the spec's ``train.n_workers`` / ``train.global_batch``;
    4. the defaults: for N, the size of the launched world the job runs in (``world_size``),
       then the worker rule's count for the first batch (:func:`first_workers`); for both,
       the checkpoint of the run being resumed (``checkpoint``).

    The accumulation steps k: ``accumulation_steps`` when given; else those of the plan's
    choice or the checkpoint when it gave both N and B (a configuration is taken whole, as it
    was planned or trained; but a spec with a batch schedule or ``train.workers`` does not take
    the plan's k: its schedule chooses its own); else the spec's ``train.accumulation_steps``.

    The sequence length L (a data set that has one: ``text``, a factory that takes
    ``sequence_length``) follows the same precedence, in :func:`train_sequence_length`: the
    explicit argument, else the plan's choice (``search.sequence_lengths`` planned over), else
    the spec's data (``data.sequence_length``, a factory's ``kwargs.sequence_length``).  Every
    front makes the spec it trains with :func:`training_spec` (the configuration's k and that
    L), so the ranks build their data sets at the length the plan chose.

    Parameters
    ----------
    spec : JobSpec
        The job (its ``train`` section).
    plan : PlanRecord or mapping or None
        A plan record (typed, or as read from JSON); its ``choice`` gives ``n_workers``,
        ``global_batch`` and ``accumulation_steps``.
    n_workers, global_batch, accumulation_steps : int or None
        What the caller asks for explicitly; ``None``: not given.
    world_size : callable or None
        The size of the launched world the job trains in (all of whose ranks train; ``None``:
        it joined none), asked only when nothing before it gives N.
    checkpoint : callable or None
        The configuration of the checkpoint a resumed run goes on from (``None``: there is
        none), asked only when nothing before it gives N or B.

    Returns
    -------
    Config
        The configuration, checked to split (B over N, each share into k micro-batches)
        unless the spec is :func:`scheduled`: a schedule's first decision chooses within its
        caps.

    Raises
    ------
    NoConfigError
        If no source gives N or B.
    SpecError
        If the configuration does not split (one sentence, as :func:`check_train_config`'s).
    """
    t = spec.train
    choice = _choice(plan)
    n, b, k = n_workers, global_batch, accumulation_steps
    whole: Config | None = None  # the configuration of the one source that gave both N and B
    if choice is not None and n is None and b is None and not scheduled(spec):
        whole = choice
    if n is None:
        n = choice.n_workers if choice is not None else t.n_workers
    if b is None:
        b = choice.global_batch if choice is not None else t.global_batch
    if n is None and world_size is not None:
        n = world_size()
    if n is None and b is not None and t.workers is not None:
        n = first_workers(spec, b)
    if (n is None or b is None) and checkpoint is not None:
        last = checkpoint()
        if last is not None:
            whole = last if n is None and b is None else whole
            n = last.n_workers if n is None else n
            b = last.global_batch if b is None else b
    if n is None or b is None:
        raise NoConfigError(
            "no configuration to train at: give the number of workers and the global batch, set "
            "train.n_workers and train.global_batch in the spec, or train at a plan's choice"
        )
    if k is None:
        k = whole.accumulation_steps if whole is not None else t.accumulation_steps
    config = Config(n, b, k)
    return config if scheduled(spec) else config.check()


@dataclass(frozen=True)
class PlanChoice:
    """What training reads of a plan's choice: its configuration, its sequence length (``None``:
    the data has none, or the plan was made before lengths were planned), its parallelism and
    whether it is checkpointed."""

    config: Config | None
    """``None``: a plan's choice given only in part (its checkpointing, its length)"""
    sequence_length: int | None = None
    parallelism: str = "ddp"
    checkpointing: bool = False

    @classmethod
    def of(cls, plan: PlanRecord | Mapping[str, Any] | None) -> PlanChoice | None:
        """``plan``'s choice (``None``: no plan); a plan as read from JSON (a file's, a request's), or
        only its ``choice``'s fields, is read at the edge here, once."""
        if plan is None:
            return None
        if isinstance(plan, PlanRecord):
            c = plan.choice
            return cls(c.config, c.sequence_length, c.parallelism, c.checkpointing)
        values = plan["choice"]  # a plan as JSON's values
        n, b, length = values.get("n_workers"), values.get("global_batch"), values.get("sequence_length")
        return cls(
            None if n is None or b is None else Config(int(n), int(b), int(values.get("accumulation_steps") or 1)),
            sequence_length=None if length is None else int(length),
            parallelism=str(values.get("parallelism", "ddp")),
            checkpointing=bool(values.get("checkpointing", False)),
        )


def _choice(plan: PlanRecord | Mapping[str, Any] | None) -> Config | None:
    """The configuration a plan chose (``None``: no plan)."""
    chosen = PlanChoice.of(plan)
    return None if chosen is None else chosen.config


def spec_with(spec: JobSpec, **fields: Any) -> JobSpec:
    """``spec`` with ``fields`` (its top-level parts, typed: ``train=spec.train.model_copy(update=...)``)
    replaced, checked again as a whole spec (a value the spec refuses is the spec's one sentence)."""
    return spec_from_dict(spec.model_copy(update=fields).to_dict())


def spec_at(spec: JobSpec, config: Config) -> JobSpec:
    """``spec`` as it trains at ``config``: its ``train.accumulation_steps`` is the
    configuration's k (the trainer reads k from the spec)."""
    if spec.train.accumulation_steps == config.accumulation_steps:
        return spec
    return spec_with(spec, train=spec.train.model_copy(update={"accumulation_steps": config.accumulation_steps}))


def train_sequence_length(
    spec: JobSpec, plan: PlanRecord | Mapping[str, Any] | None = None, *, sequence_length: int | None = None
) -> int | None:
    """The sequence length L to train ``spec`` at, by :func:`train_config`'s precedence:
    ``sequence_length`` when given (explicitly); else the plan's choice's (``None`` there: the
    data has none, or the plan was made before lengths were planned); else the spec's data's own
    (:func:`~tula.core.spec.reference_sequence_length`; ``None`` for the sets without one)."""
    if sequence_length is not None:
        return sequence_length
    chosen = _chosen_length(plan)
    return chosen if chosen is not None else reference_sequence_length(spec.data)


def _chosen_length(plan: PlanRecord | Mapping[str, Any] | None) -> int | None:
    chosen = PlanChoice.of(plan)
    return None if chosen is None else chosen.sequence_length


def _chosen_parallelism(plan: PlanRecord | Mapping[str, Any] | None) -> str:
    chosen = PlanChoice.of(plan)
    return "ddp" if chosen is None else chosen.parallelism


def _chosen_checkpointing(plan: PlanRecord | Mapping[str, Any] | None) -> bool:
    chosen = PlanChoice.of(plan)
    return chosen is not None and chosen.checkpointing


def training_spec(
    spec: JobSpec,
    config: Config,
    plan: PlanRecord | Mapping[str, Any] | None = None,
    *,
    sequence_length: int | None = None,
) -> JobSpec:
    """``spec`` as every front trains it at ``config`` (:func:`train_config`'s): with the
    configuration's k (:func:`spec_at`) and its data built at :func:`train_sequence_length`'s L
    (``sequence_length`` given explicitly, else ``plan``'s choice, else the spec's own length:
    then the data as the spec gives it), and with ``train.checkpointing: auto`` the plan's choice of
    activation checkpointing (on where its chosen row is checkpointed; off without a plan), with
    ``train.parallelism: auto`` the plan's choice of ddp or fsdp (ddp without a plan)."""
    spec = spec_at(spec, config)
    if spec.train.checkpointing == "auto":
        on = _chosen_checkpointing(plan)
        spec = spec.model_copy(update={"train": spec.train.model_copy(update={"checkpointing": "on" if on else "off"})})
    if spec.train.parallelism == "auto":
        how = _chosen_parallelism(plan)
        spec = spec.model_copy(update={"train": spec.train.model_copy(update={"parallelism": how})})
    length = train_sequence_length(spec, plan, sequence_length=sequence_length)
    if length is None or length == reference_sequence_length(spec.data):
        return spec
    return spec.model_copy(update={"data": data_at_sequence_length(spec.data, length)})


def method_fallback(spec: JobSpec, global_batch: int) -> str | None:
    """Why the spec's method trains with ``lbt`` at ``global_batch``: AGS (or a method like
    it) has nothing to scale when the batch is not above ``train.ags.b_small``; ``None``
    when the spec's method trains."""
    if method_info(spec.train.method).needs_b_small_below_batch and global_batch <= spec.train.ags.b_small:
        return (
            f"the chosen batch {global_batch} is not above train.ags.b_small "
            f"({spec.train.ags.b_small}): nothing to scale, training with lbt"
        )
    return None


def train_method(spec: JobSpec, global_batch: int, method: str | None = None) -> str:
    """The training method, by the one rule of every front: ``method`` when given
    (explicitly: an option, a keyword); else the spec's ``train.method``, or ``lbt`` where it
    has nothing to scale at ``global_batch`` (:func:`method_fallback`)."""
    if method is not None:
        return method
    return "lbt" if method_fallback(spec, global_batch) else spec.train.method
