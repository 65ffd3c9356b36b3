"""The records the pipeline hands from stage to stage, typed and versioned, in one place.

Every record Tula writes is a JSON object with a ``kind`` and a ``version``; every record
it reads is checked here against its schema before any stage looks inside, so a damaged,
truncated or foreign file is one sentence naming the file and what is wrong
(:class:`~tula.core.errors.RecordError`), never a ``KeyError`` three modules later.

Nothing here imports torch: fitting and planning read these records without it.

=================  =====================================================  ===========
kind               written by                                             schema
=================  =====================================================  ===========
``tula.profile``   ``tula profile`` (also partial: ``failed``/``interrupted``)  :class:`ProfileRecord`
``tula.models``    ``tula fit``                                           :class:`ModelsRecord`
``tula.plan``      ``tula plan``                                          :class:`PlanRecord`
``tula.train``     ``tula train``                                         :class:`TrainRecord`
``tula.run``       ``tula run`` (what the run directory is for)           :class:`RunManifest`
=================  =====================================================  ===========

Checkpoints are torch files; their header is checked against :class:`CheckpointMeta`
(``tula.checkpoint``).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tula.core.config import Config
from tula.core.effects import CheckpointingEffect, ShardingEffect
from tula.core.errors import RecordError
from tula.core.fitted import RunCosts
from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import PerfModel
from tula.core.registry import OBJECTIVE_NAMES
from tula.core.schedules import Decision, RankedConfig
from tula.core.spec import JobSpec, spec_from_dict
from tula.core.trial import TRIAL_STATUSES, Trial
from tula.core.validation import first_error, lowered

__all__ = ["TRIAL_STATUSES", "Trial"]  # re-exported: parts of the profile and models records

PROFILE_KIND = "tula.profile"
MODELS_KIND = "tula.models"
PLAN_KIND = "tula.plan"
TRAIN_KIND = "tula.train"
RUN_KIND = "tula.run"
CHECKPOINT_KIND = "tula.checkpoint"

#: the newest version of each kind this Tula writes and reads (older ones are read too)
VERSIONS = {PROFILE_KIND: 1, MODELS_KIND: 1, PLAN_KIND: 2, TRAIN_KIND: 1, RUN_KIND: 1, CHECKPOINT_KIND: 1}
#: what each version added, per kind; an older record loads with the added fields' defaults
CHANGES = {
    PLAN_KIND: {
        2: "constraints (deadline, budget; which configurations meet them: each row's "
        "meets_constraints) and spot_comparison"
    }
}
#: what each kind is called in a sentence
NAMES = {
    PROFILE_KIND: "profile",
    MODELS_KIND: "models",
    PLAN_KIND: "plan",
    TRAIN_KIND: "training run",
    RUN_KIND: "run manifest",
    CHECKPOINT_KIND: "checkpoint",
}


def placement(trials: Sequence[Trial]) -> Placement:
    """Where a profile's worlds ran: the hosts, the most ranks one host held, the devices --
    so that a model fitted on one host is never silently taken for a multi-host one."""
    hosts = sorted({h for t in trials for h in t.hosts})
    per_host = max((max(Counter(t.hosts).values()) for t in trials if t.hosts), default=0)
    return Placement(
        hosts=hosts,
        n_hosts=len(hosts),
        max_ranks_per_host=per_host,
        devices=sorted({d for t in trials for d in t.devices}),
        max_workers=max((t.n_workers for t in trials if t.status == "ok"), default=0),
    )


class _Frozen(BaseModel):
    """A part of a record as an object: frozen (assigning a field raises), unknown fields kept (a
    newer minor writer may add some), known ones checked.  A docstring right under a field is its
    description (the JSON Schema's, the reference page's).

    ``_OMITTED_UNSET`` names the fields typed here that writers leave out where they do not apply
    (a row's spot figures, a record's noise scale): such a field is written back only when it was
    given, so a record dumps as it was read (``"failure_free_time_s" in row`` keeps its meaning)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True, frozen=True)

    _OMITTED_UNSET: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self._OMITTED_UNSET - self.model_fields_set:
            data.pop(name, None)
        return data

    def to_json_dict(self) -> dict[str, Any]:
        """The record as plain values for ``json.dumps`` (what is written to a file or sent over HTTP):
        dicts, lists, strings, numbers -- an infinite or NaN figure stays one (``Infinity`` in the
        file, as the writers write it), not ``null``."""
        return self.model_dump(mode="python")

    def given(self, name: str) -> bool:
        """Whether the field ``name`` was in what this object was read from (not a default)."""
        return name in self.model_fields_set or name in (self.model_extra or {})


RecordT = TypeVar("RecordT", bound="_Record")


def _in_order(data: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """``data`` with the keys of ``order`` first, in that order, then the rest as they were."""
    ordered = {key: data.pop(key) for key in order if key in data}
    return {**ordered, **data}


class _Record(_Frozen):
    """A whole record: a kind and a version, checked against what this Tula reads."""

    @classmethod
    def from_dict(cls: type[RecordT], data: Any, source: str | None = None) -> RecordT:
        """``data`` (a record as a dict) checked and typed: :func:`parse_record`."""
        return parse_record(data, cls, source)

    kind: str
    """what the record is: tula.profile, tula.models, tula.plan, tula.train, tula.run or tula.checkpoint"""
    version: int = Field(ge=1)
    """the version of its kind's format; a version newer than this Tula reads is refused"""

    @model_validator(mode="after")
    def _version_known(self) -> _Record:
        newest = VERSIONS[self.kind]
        if self.version > newest:
            raise ValueError(
                f"it is a version {self.version} {NAMES[self.kind]} record, newer than this Tula "
                f"reads (up to version {newest}); upgrade Tula"
            )
        return self


def _valid_spec(value: Any) -> JobSpec:
    """The check of a record's job spec: a :class:`~tula.core.spec.JobSpec` is taken as it is; a mapping
    (as read from JSON) is checked by :func:`~tula.core.spec.spec_from_dict`, and a damaged one is one
    sentence naming the field ("the job spec inside is invalid (...)")."""
    if isinstance(value, JobSpec):
        return value
    if not isinstance(value, Mapping):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    try:
        return spec_from_dict(dict(value))
    except Exception as err:  # noqa: BLE001 - SpecError's sentence becomes this field's
        raise ValueError(f"the job spec inside is invalid ({err})") from None


def _spec_json(spec: JobSpec) -> dict[str, Any]:
    return spec.to_dict()


#: a record's job spec: typed in memory, its ``to_dict()`` in the file
SpecPart = Annotated[
    JobSpec, PlainValidator(_valid_spec, json_schema_input_type=dict[str, Any]), PlainSerializer(_spec_json)
]


#: the tuple fields of the run costs, which older writers may have left null (read as empty)
_RUN_COSTS_TUPLES = ("n_workers", "step_extra_s", "notes", "periodic_n_workers", "periodic_by_n_s")


def _typed_part(kind: type[Any], what: str, verb: str = "is") -> WrapValidator:
    """The check of a record's part that is one of the models' own frozen dataclasses (a memory or
    performance model, the run costs, an effect): an object of ``kind`` is taken as it is; a mapping
    of its fields (as read from JSON) is checked and converted by pydantic, and a damaged one is one
    sentence naming the part and its field ("the memory model inside is damaged (field ...)")."""
    adapters: list[TypeAdapter[Any]] = []  # made at the first check: importing the records stays quick

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, kind):
            return value
        if not isinstance(value, Mapping):
            raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
        data = dict(value)
        if kind is RunCosts:
            data.update({k: () for k in _RUN_COSTS_TUPLES if k in data and data[k] is None})
        if not adapters:
            adapters.append(TypeAdapter(kind))
        try:
            return adapters[0].validate_python(data, strict=False)
        except ValidationError as err:
            raise ValueError(f"the {what} inside {verb} damaged ({_first_error(err)})") from None

    return WrapValidator(check)


def _part_json(part: MemoryModel | PerfModel | RunCosts | CheckpointingEffect | ShardingEffect) -> dict[str, Any]:
    """A typed part as its record writes it (its ``to_dict``: the fields of a model of one sequence
    length as before lengths, tuples as lists where the writer wrote lists)."""
    return part.to_dict()


#: a memory model inside a record: :class:`~tula.core.memory_model.MemoryModel`, written as its ``to_dict``
MemoryPart = Annotated[MemoryModel, _typed_part(MemoryModel, "memory model"), PlainSerializer(_part_json)]
#: a performance model inside a record: :class:`~tula.core.perfmodel.PerfModel`
PerfPart = Annotated[PerfModel, _typed_part(PerfModel, "performance model"), PlainSerializer(_part_json)]
#: the run costs inside a record: :class:`~tula.core.fitted.RunCosts`
RunCostsPart = Annotated[RunCosts, _typed_part(RunCosts, "run costs", "are"), PlainSerializer(_part_json)]
#: checkpointing's effect inside a record: :class:`~tula.core.effects.CheckpointingEffect`
CheckpointingPart = Annotated[
    CheckpointingEffect, _typed_part(CheckpointingEffect, "checkpointing effect"), PlainSerializer(_part_json)
]
#: sharding's (FSDP's) effect inside a record: :class:`~tula.core.effects.ShardingEffect`
ShardingPart = Annotated[ShardingEffect, _typed_part(ShardingEffect, "sharding effect"), PlainSerializer(_part_json)]


class Placement(_Frozen):
    """Where a profile's worlds ran (:func:`placement`): the hosts, the most ranks one host held, the
    devices, the largest world measured.  A plan's ``fitted_on`` is its models' (empty: none known)."""

    _OMITTED_UNSET = frozenset({"hosts", "n_hosts", "max_ranks_per_host", "devices", "max_workers"})

    hosts: list[str] | None = None
    """each host the ranks ran on"""
    n_hosts: int | None = None
    """how many hosts"""
    max_ranks_per_host: int | None = None
    """the most ranks one host held"""
    devices: list[str] | None = None
    """each device the ranks computed on"""
    max_workers: int | None = None
    """the largest world that ran a trial"""


class HostFacts(_Frozen):
    """The hardware of a machine where ranks run, as a launcher read it there
    (:func:`tula.engine.launch.base.host_facts`): the device kind the ranks use, the CPU model, the
    cores, torch's version, and the GPU's name and memory where one is visible.  A fact is written
    back only where it was read (a CPU host has no ``gpu``), so a profile's ``facts`` dumps as it was
    written; the key of its fitted models (:mod:`tula.service.model_key`) reads ``device``, ``cpu``
    or ``gpu``, ``cores`` and ``torch``."""

    _OMITTED_UNSET = frozenset(
        {"cpu", "cores", "torch", "cuda_available", "gpu", "gpu_memory_bytes", "gpus", "memory_bytes"}
    )

    # the fields in the order host_facts writes them (the file's order)
    device: str
    """the device kind the ranks use: cpu or cuda (``auto`` resolved where they run)"""
    cpu: str | None = None
    """the CPU model as the OS names it"""
    cores: int | None = None
    """the machine's CPU cores (null: the OS did not say)"""
    torch: str | None = None
    """torch's version"""
    cuda_available: bool | None = None
    """whether a CUDA GPU is visible"""
    gpu: str | None = None
    """the first visible GPU's name (only where one is visible)"""
    gpu_memory_bytes: int | None = None
    """the first visible GPU's memory, bytes (only where one is visible)"""
    gpus: int | None = None
    """how many GPUs are visible (only where one is)"""
    memory_bytes: int | None = None
    """the machine's memory, bytes (where /proc/meminfo says)"""


class ModelInfo(_Frozen):
    """The network a profile measured."""

    model_config = ConfigDict(extra="ignore")

    name: str
    """the spec's model.name"""
    param_count: int = Field(ge=0)
    """its parameters"""
    grad_bytes: int = Field(ge=0)
    """the bytes of its gradients, which every step synchronises"""


class NoiseWorld(_Frozen):
    """One world's measurement of the gradient noise scale (two local batches, many steps)."""

    _OMITTED_UNSET = frozenset({"n_workers", "b_small", "b_big", "steps", "b_simple"})

    n_workers: int | None = None
    """N, the ranks of the world"""
    b_small: int | None = None
    """the smaller batch compared"""
    b_big: int | None = None
    """the larger batch compared"""
    steps: int | None = None
    """the steps measured"""
    b_simple: float | None = None
    """the world's estimate of B_simple, samples"""


class NoiseScale(_Frozen):
    """The gradient noise scale B_noise (samples), as the models measured it (``worlds``) or a plan used it
    (``reference_batch``, ``source``)."""

    _OMITTED_UNSET = frozenset({"b_noise", "low", "high", "steps", "worlds", "note", "reference_batch", "source"})

    b_noise: float | None = None
    """B_noise, samples (null or absent: not measured; ``note`` says why)"""
    low: float | None = None
    """one jackknife error below"""
    high: float | None = None
    """one jackknife error above"""
    steps: int | None = None
    """the batches it was measured over"""
    worlds: list[NoiseWorld] | None = None
    """each world's measurement"""
    note: str | None = None
    """why it was not measured, or what to know about it"""
    reference_batch: int | None = None
    """B0, the global batch the spec's epochs are meant at (a plan's)"""
    source: str | None = None
    """where a plan's value came from: profile, or what-if (given by hand)"""


class AccumulationTrial(_Frozen):
    """One world's accumulated step as the profile measured it (the profile's ``accumulation_trials``):
    a batch an ordinary trial already ran, as ``accumulation_steps`` micro-batches, slowest rank."""

    local_batch: int = Field(ge=1)
    """b, the samples each rank's step takes"""
    micro_batch: int = Field(ge=1)
    """the micro-batch each of the k passes takes"""
    accumulation_steps: int = Field(ge=1)
    """k"""
    step_times_s: list[float]
    """each timed step, seconds (per step the slowest rank)"""
    n_workers: int = Field(ge=1)
    """N"""
    t_step_s: float = Field(gt=0)
    """the median of the timed steps, seconds"""


class AccumulationCheck(_Frozen):
    """An accumulated step measured by the profile against the performance model's prediction."""

    n_workers: int
    """N"""
    local_batch: int
    """b, the samples each rank's step takes"""
    micro_batch: int
    """the micro-batch each of the k passes takes"""
    accumulation_steps: int
    """k"""
    t_step_s: float
    """the measured step time, seconds"""
    predicted_t_step_s: float
    """the model's step time, seconds"""
    rel_error: float
    """|predicted - measured| / measured"""


class RunTrial(_Frozen):
    """One world's run trial (the profile's ``run_trials``): the trainer's own step of the method
    beside the plain profiled step at one (N, B), and the epoch's end, slowest rank; ``oom`` or
    ``skipped`` (``note`` says why) where it timed nothing."""

    _OMITTED_UNSET = frozenset(
        {
            "global_batch", "note", "local_batch", "steps_per_epoch", "update_every", "step_times_s",
            "plain_step_times_s", "due", "eval_s", "epoch_end_s", "checkpoint_s", "t_run_step_s", "t_due_step_s",
            "t_step_plain_s",
        }
    )  # fmt: skip

    n_workers: int = Field(ge=1)
    """N"""
    global_batch: int | None = None
    """B (a skipped trial: absent)"""
    method: str
    """the training method timed"""
    status: str
    """ok (timed), oom (the trainer's probe step did not fit) or skipped (note: why)"""
    note: str | None = None
    """why a skipped trial was skipped"""
    local_batch: int | None = None
    """b = B / N"""
    steps_per_epoch: int | None = None
    """the steps of an epoch at B"""
    update_every: int | None = None
    """the method's periodic work: every so many steps (null: none)"""
    step_times_s: list[float] | None = None
    """each timed step of the method, seconds (slowest rank)"""
    plain_step_times_s: list[float] | None = None
    """each timed plain step beside it, seconds"""
    due: list[bool] | None = None
    """which of the timed steps the periodic work fell due at"""
    eval_s: float | None = None
    """the evaluation, seconds"""
    epoch_end_s: float | None = None
    """the epoch's end (the evaluation included), seconds"""
    checkpoint_s: float | None = None
    """writing the checkpoint, seconds"""
    t_run_step_s: float | None = None
    """the median regular step of the method, seconds"""
    t_due_step_s: float | None = None
    """the median step the periodic work fell due at, seconds (null: none timed)"""
    t_step_plain_s: float | None = None
    """the median plain step, seconds"""


class ProfileRecord(_Record):
    """What ``tula profile`` measured: a trial of short real training steps at each chosen (N, B)."""

    kind: Literal["tula.profile"]
    spec: SpecPart
    """the job spec profiled (the reference's spec page has its fields)"""
    search: Literal["full", "partial"]
    """full: every candidate (N, B); partial: only the extreme cluster sizes and batches"""
    device: str
    """where the ranks computed: cpu or cuda"""
    backend: str
    """the torch.distributed backend: gloo (CPU) or nccl (CUDA)"""
    threads_per_worker: int = Field(ge=1)
    """torch threads per rank"""
    memory_budget_bytes: int | None
    """the memory each worker could use (null: no budget)"""
    enforce_memory_cap: bool
    """whether each worker's address space was capped at the budget (CPU)"""
    dataset_size: int = Field(ge=1)
    """training samples"""
    sample_shape: list[int]
    """the shape of one sample"""
    model: ModelInfo
    """the network"""
    memory: MemoryPart
    """the memory model measured at profile.memory_probe_batches (tula.core.memory_model.MemoryModel)"""
    max_local_batch: int | None
    """the largest local batch the memory model allows within the budget (null: no budget)"""
    #: every (N, B) the search chose, and (N, B, L) at each other sequence length planned over
    #: (search.sequence_lengths); trials not yet in ``trials`` are still to run
    configs: list[tuple[int, int] | tuple[int, int, int]] = Field(default_factory=list)
    trials: list[Trial]
    """every trial run so far, by N and B"""
    profiling_s: float = Field(ge=0)
    """seconds spent profiling (over every resumption)"""
    created: str
    """when the record was written (ISO 8601, with the host's UTC offset)"""
    failed: str | None = None
    """why profiling stopped, when a world failed; the finished trials are kept"""
    interrupted: str | None = None
    """the signal that stopped profiling, when one did; `tula profile SPEC --resume DIR` continues it"""
    #: a snapshot written while trials still ran (the process may have died since): the
    #: finished trials are kept and the rest run when it is resumed, as for ``interrupted``
    in_progress: bool = False
    facts: HostFacts | None = None
    """what the launcher read where the ranks ran (:class:`HostFacts`): the device kind, the CPU model or
    GPU name, the cores, torch's version (records before it: absent)"""
    precision: str | None = None
    """the precision the trials trained in (train.precision)"""
    accumulation_trials: list[AccumulationTrial] | None = None
    """the trials at k > 1 micro-batches a step, checking the step time's model of accumulation"""
    run_trials: list[RunTrial] | None = None
    """each world's run trial: the trainer's own step and epoch end at one (N, B), slowest rank"""
    placement: Placement | None = None
    """where the ranks ran: the hosts, the ranks per host, the devices, the largest world measured"""
    launcher: str | None = None
    """the launcher that started the ranks (local, env, ssh, ...)"""
    not_measured: dict[str, str] | None = None
    """cluster sizes the launcher could not place (one rank per GPU): N -> why"""

    _OMITTED_UNSET = frozenset(
        {"facts", "precision", "accumulation_trials", "run_trials", "placement", "launcher", "not_measured"}
    )

    #: the order of the fields in ``profile.json`` (as it was written before the typed record)
    _FILE_ORDER: ClassVar[tuple[str, ...]] = (
        "kind", "version", "spec", "search", "device", "backend", "threads_per_worker", "precision",
        "memory_budget_bytes", "enforce_memory_cap", "dataset_size", "sample_shape", "model", "memory",
        "max_local_batch", "configs", "trials", "accumulation_trials", "run_trials", "placement", "launcher", "facts",
        "not_measured", "profiling_s", "created", "failed", "interrupted", "in_progress",
    )  # fmt: skip

    def to_json_dict(self) -> dict[str, Any]:
        """The record as ``profile.json`` holds it: ``failed``, ``interrupted`` and ``in_progress``
        only where they were given, the configurations as lists, the fields in the file's order."""
        data = super().to_json_dict()
        for name in ("failed", "interrupted", "in_progress"):
            if not self.given(name):
                data.pop(name, None)
        data["configs"] = [list(c) for c in self.configs]
        return _in_order(data, self._FILE_ORDER)

    @model_validator(mode="after")
    def _ok_trials_measured(self) -> ProfileRecord:
        for i, t in enumerate(self.trials):
            if t.status != "ok":
                continue
            if t.t_step_s is None or t.t_compute_s is None or t.peak_mem_bytes is None:
                raise ValueError(f"trial {i} is 'ok' but lacks its measured times or peak memory")
            for name in ("t_step_s", "t_compute_s", "peak_mem_bytes"):
                v = getattr(t, name)
                if not (math.isfinite(v) and v > 0):
                    raise ValueError(f"trial {i} is 'ok' but its {name} is {v!r}, not a positive measurement")
        return self


class ModelsRecord(_Record):
    """What ``tula fit`` fitted to a profile: the memory and performance models the planner predicts with."""

    kind: Literal["tula.models"]
    spec: SpecPart
    """the job spec profiled"""
    search: Literal["full", "partial"]
    """the profile's search"""
    device: str
    """where the profile's ranks computed: cpu or cuda"""
    dataset_size: int = Field(ge=1)
    """training samples"""
    memory_budget_bytes: int | None
    """the memory each worker could use (null: no budget)"""
    memory: MemoryPart
    """the memory model refitted to the trials' measured peaks (tula.core.memory_model.MemoryModel)"""
    memory_probed: MemoryPart
    """the memory model as the profile's probes measured it, before the refit"""
    perf: PerfPart
    """the performance model: step time from compute and synchronisation (tula.core.perfmodel.PerfModel)"""
    oom_local_batch: int | None
    """the smallest local batch that ran out of memory (null: none did)"""
    fit_error: dict[str, float]
    """relative errors of the models on the trials they were fitted to: the median and the largest, of the
    step time and of the peak memory"""
    trials: list[Trial]
    """the profile's trials"""
    profiling_s: float | None = None
    """seconds the profile took"""
    accumulation_check: list[AccumulationCheck] = Field(default_factory=list)
    """the profile's accumulated steps against the performance model (where the planner may accumulate)"""
    noise_scale: NoiseScale | None = None
    """the gradient noise scale the profile measured"""
    placement: Placement | None = None
    """where the profile's worlds ran (:func:`placement`): the hosts, the most ranks one host held, the devices"""
    run_costs: RunCostsPart | None = None
    """the method's own step and each epoch's end, from the run trials (tula.core.run_costs.RunCosts; null: none)"""
    run_trials: list[RunTrial] = Field(default_factory=list)
    """the profile's run trials (the method's steps and epoch ends)"""
    not_measured: dict[str, str] | None = None
    """cluster sizes the profile could not place (one rank per GPU): N -> why; the plan does not rank them"""
    checkpointing: CheckpointingPart | None = None
    """train.checkpointing auto: the checkpointed step's effect fitted to its trials
    (tula.core.effects.CheckpointingEffect: activation bytes per sample, compute factor; null: not measured)"""
    sharding: ShardingPart | None = None
    """train.parallelism auto: the sharded (FSDP) step's effect fitted to its trials
    (tula.core.effects.ShardingEffect: the gathered working set, the per-step sync; null: not measured)"""

    _OMITTED_UNSET = frozenset(
        {
            "accumulation_check",
            "noise_scale",
            "placement",
            "run_costs",
            "run_trials",
            "not_measured",
            "checkpointing",
            "sharding",
        }
    )


class PlanRow(_Frozen):
    """One configuration (N, B) of a plan and its predictions."""

    n_workers: int = Field(ge=1)
    """N, the workers"""
    global_batch: int = Field(ge=1)
    """B, the global batch"""
    local_batch: int = Field(ge=1)
    """b = B / N"""
    feasible: bool
    """whether it fits in memory"""
    t_step_s: float
    """the predicted time of a step, seconds"""
    total_time_s: float
    """the predicted time of the spec's epochs, seconds (expected, with preemptions, under spot pricing)"""
    cost: float
    """the predicted cost of the spec's epochs, in the pricing's unit"""
    peak_mem_bytes: int
    """the predicted peak memory of a worker, bytes"""
    meets_constraints: bool = True
    """within the deadline and the budget (version 2; true before)"""
    candidate: bool = False
    """one of the rows the plan's table shows (per cluster size: the batches around the knee and the best)"""
    chosen: bool = False
    """the configuration chosen"""
    accumulation_steps: int = Field(default=1, ge=1)
    """k, the micro-batches of a step (plans before gradient accumulation: 1)"""
    micro_batch: int | None = None
    """the micro-batch b / k"""
    epoch_time_s: float | None = None
    """the predicted time of an epoch, seconds: its steps and its end"""
    epoch_steps_s: float | None = None
    """of which the steps, seconds"""
    epoch_fixed_s: float | None = None
    """of which the epoch's end (evaluation, checkpoint, the method's periodic work), seconds"""
    failure_free_time_s: float | None = None
    """spot pricing: the time of the epochs without preemptions, seconds"""
    expected_preemptions: float | None = None
    """spot pricing: the preemptions expected"""
    epochs_to_accuracy: float | None = None
    """the spec's epochs scaled by the noise scale to reach their accuracy at B0"""
    time_to_accuracy_s: float | None = None
    """the predicted time of those epochs, seconds"""
    cost_to_accuracy: float | None = None
    """the predicted cost of those epochs"""
    reason: str | None = None
    """why the row is what it is (infeasible, over a limit), where the planner says"""
    sequence_length: int | None = Field(default=None, ge=1)
    """L, the tokens of each sample (null: the data set has no sequence length; plans before it: absent)"""
    parallelism: Literal["ddp", "fsdp"] = "ddp"
    """how the ranks share the model: ddp (every rank holds all of it) or fsdp (sharded)"""
    checkpointing: bool = False
    """whether the blocks' activations are recomputed in the backward pass (train.checkpointing)"""
    tokens_per_batch: int | None = Field(default=None, ge=1)
    """B * L, the tokens of a global batch (null or absent: no sequence length; plans before it)"""
    tokens_per_s: float | None = None
    """B * L / t_step_s, the tokens trained per second (null or absent: no sequence length; plans before it)"""

    @property
    def config(self) -> Config:
        """The row's configuration (N, B, k) as one value."""
        return Config(self.n_workers, self.global_batch, self.accumulation_steps)

    _OMITTED_UNSET = frozenset(
        {
            "candidate",
            "chosen",
            "accumulation_steps",
            "micro_batch",
            "epoch_time_s",
            "epoch_steps_s",
            "epoch_fixed_s",
            "failure_free_time_s",
            "expected_preemptions",
            "epochs_to_accuracy",
            "time_to_accuracy_s",
            "cost_to_accuracy",
            "reason",
            "sequence_length",
            "parallelism",
            "checkpointing",
            "tokens_per_batch",
            "tokens_per_s",
        }
    )


class PlanConstraints(_Frozen):
    """What a plan was made under (version 2): the deadline and budget (``None``: none) and
    how many configurations fit in memory and how many of those meet both."""

    deadline_s: float | None = Field(default=None, gt=0)
    """the deadline, seconds (null: none)"""
    budget: float | None = Field(default=None, ge=0)
    """the budget, in unit (null: none)"""
    unit: str = "$"
    """the pricing's unit of cost"""
    n_feasible: int = Field(ge=0)
    """configurations that fit in memory"""
    n_meeting: int = Field(ge=0)
    """feasible configurations that also meet the deadline and the budget"""


class PlanCurve(_Frozen):
    """One cluster size's dense curve in a plan (:attr:`PlanRecord.curves`): its feasible rows'
    global batches and, at each, the predicted time and cost (to accuracy too, where the rows have them)."""

    _OMITTED_UNSET = frozenset({"time_to_accuracy_s", "cost_to_accuracy"})

    global_batch: list[int]
    """B of each point"""
    total_time_s: list[float]
    """the predicted time of the spec's epochs at each B, seconds"""
    cost: list[float]
    """the predicted cost of those epochs at each B"""
    time_to_accuracy_s: list[float | None] | None = None
    """the predicted time to accuracy at each B, seconds (absent: the rows have none)"""
    cost_to_accuracy: list[float | None] | None = None
    """the predicted cost to accuracy at each B (absent: the rows have none)"""


class PlanKnee(_Frozen):
    """One cluster size's knee of its time-vs-batch curve (:attr:`PlanRecord.knees`)."""

    global_batch: int
    """B at the knee"""
    method: str
    """how it was found (tula.core.plan.find_knee: kneedle, or the fallback named)"""


class SpotChoice(_Frozen):
    """One side of a plan's spot comparison (:class:`SpotComparison`): its chosen configuration's
    figures, or why none met the constraints (``infeasible``)."""

    _OMITTED_UNSET = frozenset(
        {
            "n_workers", "global_batch", "local_batch", "total_time_s", "epoch_time_s", "cost",
            "failure_free_time_s", "expected_preemptions", "infeasible",
        }
    )  # fmt: skip

    n_workers: int | None = None
    """N of the choice"""
    global_batch: int | None = None
    """B of the choice"""
    local_batch: int | None = None
    """b = B / N"""
    total_time_s: float | None = None
    """the predicted time of the spec's epochs, seconds (expected, with preemptions, on spot)"""
    epoch_time_s: float | None = None
    """the predicted time of an epoch, seconds"""
    cost: float | None = None
    """the predicted cost of the spec's epochs"""
    failure_free_time_s: float | None = None
    """spot: the time of the epochs without preemptions, seconds"""
    expected_preemptions: float | None = None
    """spot: the preemptions expected"""
    infeasible: str | None = None
    """why no configuration met the constraints under this pricing (the planner's sentence)"""


class SpotComparison(_Frozen):
    """A plan's spot against on-demand pricing (``tula plan --compare-spot``): each one's choice,
    the prices, which is cheaper, and the preemption rate where the two cost the same."""

    _OMITTED_UNSET = frozenset({"on_demand_cost_at_spot_choice"})

    spot: SpotChoice
    """the choice on spot nodes"""
    on_demand: SpotChoice
    """the choice on on-demand nodes"""
    spot_price_per_node_hour: float | None = None
    """the spot price of a node-hour"""
    on_demand_price_per_node_hour: float | None = None
    """the on-demand price of a node-hour"""
    preemption_rate_per_node_hour: float | None = None
    """the preemptions per node-hour assumed"""
    cheaper: str | None = None
    """spot, on_demand or equal"""
    break_even_rate_per_node_hour: float | None = None
    """the preemption rate below which spot costs less at its choice (null: none; infinite: any)"""
    on_demand_cost_at_spot_choice: float | None = None
    """the spot choice's failure-free time priced on demand"""
    sentence: str = ""
    """the comparison in one sentence"""


class MeasuredRatio(_Frozen):
    """What a finished training run measured against its prediction
    (:func:`tula.core.run_costs.measured_ratio`), and in a plan whether its epochs were scaled by it."""

    _OMITTED_UNSET = frozenset({"applied"})

    ratio: float
    """the median measured / predicted epoch time over the epochs after the first"""
    epochs_compared: int = Field(ge=1)
    """the epochs the median is over"""
    method: str | None = None
    """the training method the run trained"""
    n_workers: int = Field(ge=1)
    """N the run trained at last"""
    global_batch: int = Field(ge=1)
    """B the run trained at last"""
    applied: bool | None = None
    """a plan's: whether its epochs are scaled by the ratio (the run trained the plan's method)"""


class RunPrediction(_Frozen):
    """A training run compared with its plan (:func:`tula.core.run_costs.compare_with_plan`)."""

    median_ratio: float | None = None
    """the median measured / predicted epoch time over the epochs after the first (null: none compared)"""
    epochs_compared: int = 0
    """the epochs compared"""
    note: str = ""
    """what the predicted epochs include"""


class PlanRecord(_Record):
    """A plan.  Version 1 (before constraints) loads with ``constraints`` and
    ``spot_comparison`` ``None`` and every row's ``meets_constraints`` true."""

    kind: Literal["tula.plan"]
    objective: Literal[OBJECTIVE_NAMES]  # type: ignore[valid-type]
    """what the choice was made by"""
    choice: PlanRow
    """the chosen configuration"""
    reason: str
    """why it was chosen, in one sentence"""
    spec: SpecPart
    """the job spec planned"""
    dataset_size: int = Field(ge=1)
    """training samples"""
    configurations: list[PlanRow]
    """every configuration evaluated"""
    curves: dict[str, PlanCurve]
    """per cluster size N (a string key): the feasible rows' predictions as lists, by global batch"""
    knees: dict[str, PlanKnee]
    """per cluster size N: the knee of its time-vs-batch curve (its global_batch, and the method that found it)"""
    frontier: list[PlanRow]
    """the Pareto frontier of the feasible configurations in time and cost"""
    constraints: PlanConstraints | None = None
    """what the plan was made under (version 2)"""
    spot_comparison: SpotComparison | None = None
    """spot against on-demand pricing, when asked for"""
    method: str | None = None
    """the training method the epochs' costs are of"""
    run_costs: RunCostsPart | None = None
    """what an epoch costs beyond its steps, as measured (tula.core.run_costs.RunCosts)"""
    run_costs_note: str | None = None
    """what the predicted epochs include, in words"""
    noise_scale: NoiseScale | None = None
    """the noise scale the to-accuracy predictions used"""
    max_local_batch: int | None = None
    """the largest local batch the memory model allows within the budget (null: no budget)"""
    oom_local_batch: int | None = None
    """the smallest local batch that ran out of memory while profiling (null: none did)"""
    memory_budget_bytes: int | None = None
    """the memory each worker could use (null: no budget)"""
    fitted_on: Placement | None = None
    """where the models' profile ran (the models' placement: hosts, ranks per host, devices)"""
    not_measured: dict[str, str] | None = None
    """cluster sizes the profile could not place: N -> why (listed, not ranked)"""
    measured_ratio: MeasuredRatio | None = None
    """a finished run's measured / predicted epoch time, and whether this plan's epochs are scaled by it"""

    _OMITTED_UNSET = frozenset(
        {
            "method",
            "run_costs",
            "run_costs_note",
            "noise_scale",
            "max_local_batch",
            "oom_local_batch",
            "memory_budget_bytes",
            "fitted_on",
            "not_measured",
            "measured_ratio",
        }
    )

    @model_validator(mode="after")
    def _v2_fields(self) -> PlanRecord:
        if self.version >= 2 and self.constraints is None:
            raise ValueError("field 'constraints' is missing (a version 2 plan records what it was planned under)")
        return self


class RankedOption(_Frozen):
    """One configuration a batch schedule's workers rule ranked for a batch
    (:class:`tula.core.live_plan.Option` as an epoch line keeps it)."""

    global_batch: int = Field(ge=1)
    """B, a multiple of n_workers x accumulation_steps"""
    n_workers: int = Field(ge=1)
    """N"""
    accumulation_steps: int = Field(ge=1)
    """k, the micro-batches of a rank's share"""
    epoch_s: float
    """the predicted epoch (steps and the run's per-epoch costs), seconds"""
    score: float
    """what the rule ranked by, lower is better: epoch_s, or the cost of an epoch"""
    micro_batch: int = Field(ge=1)
    """b = global_batch / (n_workers x k)"""

    @property
    def config(self) -> Config:
        """The option's configuration (N, B, k) as one value."""
        return Config(self.n_workers, self.global_batch, self.accumulation_steps)

    @classmethod
    def of(cls, option: RankedConfig) -> RankedOption:
        """``option`` (a :class:`tula.core.live_plan.Option`, or one of these) as an epoch line keeps it."""
        if isinstance(option, RankedOption):
            return option
        return cls(
            global_batch=option.global_batch,
            n_workers=option.n_workers,
            accumulation_steps=option.accumulation_steps,
            epoch_s=option.epoch_s,
            score=option.score,
            micro_batch=option.micro_batch,
        )


class ScheduleDecision(_Frozen):
    """A batch schedule's decision for the epochs after an epoch (:attr:`EpochRecord.schedule`):
    a :class:`tula.core.schedules.Decision` as its line keeps it (:meth:`of`)."""

    epoch: int = Field(ge=0)
    """finished epochs when it was decided"""
    global_batch: int = Field(ge=1)
    """B of the next epochs"""
    n_workers: int = Field(ge=1)
    """N of the next epochs"""
    local_batch: int = Field(ge=1)
    """B / N, a rank's share of a step"""
    wanted_batch: float | None
    """what the schedule asked for before the caps and rounding (null: unbounded)"""
    capped_by: str | None
    """what capped B: memory, max_batch, dataset, or null"""
    lr_scale: float
    """the LR rule's multiplier relative to the first batch B0"""
    lr_decay: float
    """the product of the LR decays taken instead of growing the batch"""
    decayed_instead: bool
    """at this boundary the LR decayed because the batch was at its cap"""
    changed: bool
    """B, N or k differ from the previous decision's"""
    resize: bool
    """N differs from the previous decision's (a new world)"""
    reason: str
    """one line saying why"""
    accumulation_steps: int = Field(default=1, ge=1)
    """k of the next epochs (lines written before gradient accumulation: absent, 1)"""
    ranking: tuple[RankedOption, ...] = ()
    """with a workers rule, the options it ranked for this batch, best first (absent otherwise)"""
    lr_multiplier: float
    """what the spec's LR is multiplied by: lr_scale x lr_decay"""
    micro_batch: int | None = Field(default=None, ge=1)
    """B / (N k), what one forward/backward of a rank holds (lines before gradient accumulation: absent)"""

    _OMITTED_UNSET = frozenset({"accumulation_steps", "ranking", "micro_batch"})

    @property
    def config(self) -> Config:
        """The configuration decided, (N, B, k) as one value."""
        return Config(self.n_workers, self.global_batch, self.accumulation_steps)

    @classmethod
    def of(cls, decision: Decision) -> ScheduleDecision:
        """``decision`` as the trainer writes it into the epoch's line: without the schedule's state
        (the checkpoint keeps that), an unbounded wanted batch as null, the ranking only where there is one."""
        wanted = decision.wanted_batch
        ranked = {"ranking": tuple(RankedOption.of(o) for o in decision.ranking)} if decision.ranking else {}
        return cls(
            epoch=decision.epoch,
            global_batch=decision.global_batch,
            n_workers=decision.n_workers,
            local_batch=decision.local_batch,
            wanted_batch=None if wanted is None or not math.isfinite(wanted) else wanted,
            capped_by=decision.capped_by,
            lr_scale=decision.lr_scale,
            lr_decay=decision.lr_decay,
            decayed_instead=decision.decayed_instead,
            changed=decision.changed,
            resize=decision.resize,
            reason=decision.reason,
            accumulation_steps=decision.accumulation_steps,
            lr_multiplier=decision.lr_multiplier,
            micro_batch=decision.micro_batch,
            **ranked,
        )


class EpochRecord(_Frozen):
    """One line of ``metrics.jsonl``: an epoch's figures (and, for some methods, per-step traces)."""

    epoch: int = Field(ge=1)
    """the epoch, from 1"""
    steps: int = Field(ge=1)
    """steps in this epoch"""
    steps_done: int = Field(ge=1)
    """steps since training began, this epoch's included"""
    global_batch: int = Field(ge=1)
    """B during the epoch"""
    n_workers: int = Field(ge=1)
    """N during the epoch"""
    lr: float
    """the learning rate at the epoch's end"""
    train_loss: float
    """the mean training loss of the epoch's steps"""
    epoch_time_s: float
    """the epoch's training time, seconds"""
    test_loss: float
    """the loss on the test split after the epoch"""
    test_top1: float | None = None
    """top-1 accuracy on the test split (classification: cross_entropy, or a user's loss on integer labels)"""
    test_r2: float | None = None
    """R^2 on the test split (regression: train.loss mse)"""
    accumulation_steps: int = Field(default=1, ge=1)
    """k, the micro-batches of each step (lines written before gradient accumulation: 1)"""
    micro_batch: int | None = Field(default=None, ge=1)
    """b = global_batch / (n_workers x k)"""
    test_top5: float | None = None
    """top-5 accuracy on the test split (classification over more than five classes)"""
    test_perplexity: float | None = None
    """exp(test_loss): a language model's score (train.loss model, or cross_entropy over sequences)"""
    skipped_steps: int | None = None
    """fp16: the steps the loss scaler skipped (their gradients overflowed)"""
    b_simple: float | None = None
    """the gradient noise scale measured over the epoch, in samples (null: not measured)"""
    scaled_fraction: float | None = None
    """AGS: the fraction of the epoch's steps whose update was scaled"""
    eval_s: float | None = None
    """seconds the evaluation on the test split took"""
    epoch_end_s: float | None = None
    """seconds of the epoch's work after its steps (the reductions, the evaluation, the noise scale)"""
    schedule: ScheduleDecision | None = None
    """the batch schedule's decision for the next epoch (its ranking of configurations), where one runs"""
    checkpoint_s: float | None = None
    """seconds writing the epoch's checkpoint and records took"""
    epoch_wall_s: float | None = None
    """the epoch's wall time, seconds: its steps, its end and its checkpoint"""
    predicted_epoch_s: float | None = None
    """the plan's predicted epoch time at the epoch's (B, N, k), where the run was compared with the plan"""
    measured_to_predicted: float | None = None
    """measured / predicted epoch time, where the run was compared with the plan"""

    _OMITTED_UNSET = frozenset(
        {
            "test_top5", "test_perplexity", "skipped_steps", "b_simple", "scaled_fraction", "eval_s",
            "epoch_end_s", "schedule", "checkpoint_s", "epoch_wall_s", "predicted_epoch_s", "measured_to_predicted",
        }
    )  # fmt: skip


def epoch_score(h: EpochRecord | Mapping[str, Any]) -> tuple[str, float, str]:
    """An epoch's test score (``h`` an :class:`EpochRecord` or its metrics line): ``("top-1",
    value, "93.10%")`` for classification, ``("R^2", value, "0.8123")`` for regression
    (``train.loss`` mse), ``("perplexity", value, "12.34")`` for a language model without top-1
    (``train.loss`` model), ``("loss", value, "0.4321")`` -- the test loss -- for a user's loss
    whose targets are no class labels."""
    e = h if isinstance(h, EpochRecord) else as_epoch(h)
    if e.test_top1 is None and e.test_r2 is not None:
        return "R^2", float(e.test_r2), f"{e.test_r2:.4f}"
    if e.test_top1 is None and e.test_perplexity is not None:
        return "perplexity", float(e.test_perplexity), f"{e.test_perplexity:.2f}"
    if e.test_top1 is None and e.given("test_loss"):
        return "loss", float(e.test_loss), f"{e.test_loss:.4f}"
    v = float(e.test_top1) if e.test_top1 is not None else math.nan
    return "top-1", v, f"{v:.2%}"


class Fallback(_Frozen):
    """One out-of-memory fallback of a training run: the micro-batch halved -- k doubled at the same
    global batch, or a smaller global batch -- from the last checkpoint."""

    from_global_batch: int = Field(ge=1)
    """B that ran out of memory"""
    to_global_batch: int = Field(ge=0)
    """B training went on at (below the smallest it can train at: the run ended infeasible)"""
    from_accumulation_steps: int = Field(default=1, ge=1)
    """k that ran out of memory (records before gradient accumulation: absent, 1)"""
    to_accumulation_steps: int = Field(default=1, ge=1)
    """k training went on at"""
    at_epoch: int = Field(ge=0)
    """the last finished epoch, whose checkpoint training went on from"""
    reason: str = ""
    """what ran out of memory, as the error said it (at most 300 characters)"""

    _OMITTED_UNSET = frozenset({"from_accumulation_steps", "to_accumulation_steps", "reason"})


class Generation(_Frozen):
    """One stretch of a training run's epochs at one configuration: a world, or a batch change
    inside one."""

    global_batch: int = Field(ge=1)
    """B of the stretch"""
    n_workers: int = Field(ge=1)
    """N of the stretch"""
    accumulation_steps: int = Field(default=1, ge=1)
    """k of the stretch (records before gradient accumulation: absent, 1)"""
    from_epoch: int = Field(ge=1)
    """its first epoch"""
    wall_s: float | None = None
    """its wall time, seconds (a world's first stretch counts from the world's start)"""
    world: int | None = None
    """which world (1, 2, ...) it ran in: stretches of one world have the same number"""
    new_world: bool | None = None
    """whether it started its world (the first, after a change of N or an out-of-memory fallback)"""

    _OMITTED_UNSET = frozenset({"accumulation_steps", "world", "new_world"})

    @property
    def config(self) -> Config:
        """The stretch's configuration (N, B, k) as one value."""
        return Config(self.n_workers, self.global_batch, self.accumulation_steps)


class FactorSummary(_Frozen):
    """AGS's per-parameter scaling factors over a run: their mean, least and largest."""

    mean: float
    """the mean factor"""
    min: float
    """the least factor"""
    max: float
    """the largest factor"""


class MethodTraces(_Frozen):
    """A training method's traces (:attr:`TrainRecord.traces`): a summary of what it did and its per-step
    values, where it keeps some.  The fields typed here are the ones the reports read (AGS's); each method's
    other figures (AdaScale's gains, the averaging period, ...) are kept as they were written.  Written
    back with the keys in the order they were read."""

    _OMITTED_UNSET = frozenset({"scaled_fraction", "factors", "delta_threshold", "delta", "scaled"})

    scaled_fraction: float | None = None
    """AGS: the share of the steps whose update was scaled"""
    factors: FactorSummary | None = None
    """AGS: its scaling factors' summary (null: none computed yet)"""
    delta_threshold: float | None = None
    """AGS: the gradient variability δ below which a step is scaled"""
    delta: list[float | None] | None = None
    """AGS: each step's gradient variability Δ(G) (null: not measured at that step)"""
    scaled: list[bool] | None = None
    """AGS: whether each step's update was scaled"""

    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _keep_order(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> MethodTraces:
        traces = handler(data)
        if isinstance(data, Mapping):
            traces._keys = tuple(data)
        return traces

    @model_serializer(mode="wrap")
    def _in_read_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in self._OMITTED_UNSET - self.model_fields_set:
            data.pop(name, None)
        return _in_order(data, self._keys)

    def __bool__(self) -> bool:
        """Whether the method kept any traces (an empty one, as ``{}`` was, is false)."""
        return bool(self.model_fields_set or self.model_extra)


class TrainRecord(_Record):
    """What ``tula train`` did: the configuration it ended at and every epoch's figures."""

    kind: Literal["tula.train"]
    spec: SpecPart
    """the job spec trained"""
    method: str
    """the training method (train.method)"""
    n_workers: int = Field(ge=1)
    """N of the last configuration"""
    global_batch: int = Field(ge=1)
    """B of the last configuration"""
    steps_per_epoch: int = Field(ge=1)
    """steps per epoch at that batch"""
    epochs: int = Field(ge=1)
    """the epochs trained"""
    steps_done: int = Field(ge=0)
    """the steps taken"""
    accumulation_steps: int = Field(default=1, ge=1)
    """the last configuration's k (records before gradient accumulation: 1)"""
    micro_batch: int | None = Field(default=None, ge=1)
    """its micro-batch b = local_batch / k, where local_batch is B / N"""
    history: list[EpochRecord]
    """each epoch's figures, as metrics.jsonl has them"""
    fallbacks: list[Fallback] = Field(default_factory=list)
    """each out-of-memory fallback: the batch and accumulation before and after, and the epoch"""
    traces: MethodTraces = Field(default_factory=MethodTraces)
    """per-step traces of the method (AGS's factors and gates, the noise scale), where it keeps some"""
    requested_global_batch: int | None = None
    """the B training was asked to start at (before any out-of-memory fallback)"""
    local_batch: int | None = None
    """B / N of the last configuration"""
    resumed_from_epoch: int | None = None
    """the epoch a resumed run continued after (null: not resumed)"""
    final: dict | None = None
    """the last epoch's figures, as its metrics.jsonl line has them (empty: no epoch finished)"""
    best_test_top1: float | None = None
    """the best test top-1 accuracy over the epochs (NaN: no epoch measured one)"""
    replicas_identical: bool | None = None
    """whether every rank ended with the same parameters"""
    train_s: float | None = None
    """seconds training took, launches included"""
    device: str | None = None
    """where the ranks computed: cpu or cuda"""
    created: str | None = None
    """when the record was written (ISO 8601, with the host's UTC offset)"""
    batch_schedule: str | None = None
    """the batch schedule's kind (train.batch_schedule; null: a constant batch)"""
    generations: list[Generation] | None = None
    """each world's stretch of epochs: its configuration, first epoch and wall time"""
    prediction: RunPrediction | None = None
    """the comparison with the plan: the median measured / predicted epoch time, the epochs compared, a note"""

    _OMITTED_UNSET = frozenset(
        {
            "requested_global_batch", "local_batch", "resumed_from_epoch", "final", "best_test_top1",
            "replicas_identical", "train_s", "device", "created", "batch_schedule", "generations", "prediction",
        }
    )  # fmt: skip

    #: the order of the fields in ``train.json`` (as it was written before the typed record)
    _FILE_ORDER: ClassVar[tuple[str, ...]] = (
        "kind", "version", "spec", "method", "n_workers", "requested_global_batch", "global_batch", "local_batch",
        "accumulation_steps", "micro_batch", "steps_per_epoch", "epochs", "steps_done", "resumed_from_epoch",
        "fallbacks", "history", "final", "best_test_top1", "replicas_identical", "traces", "train_s", "device",
        "created", "batch_schedule", "generations",
    )  # fmt: skip

    def to_json_dict(self) -> dict[str, Any]:
        """The record as ``train.json`` holds it: each epoch as its metrics.jsonl line has it (only
        the fields the rank wrote), the fields in the file's order."""
        data = super().to_json_dict()
        data["history"] = [h.model_dump(exclude_unset=True) for h in self.history]
        return _in_order(data, self._FILE_ORDER)


class RunManifest(_Record):
    """What ``tula run`` was asked to do in a run directory, so ``tula run --resume DIR`` can
    continue it without the original command line."""

    kind: Literal["tula.run"]
    spec: SpecPart
    """the job spec the run was started with"""
    search: Literal["full", "partial"]
    """the profile's search"""
    objective: Literal[OBJECTIVE_NAMES] | None = None  # type: ignore[valid-type]
    """the objective asked for on the command line (null: the spec's)"""
    train: bool = True
    """whether the run trains after planning"""
    created: str = ""
    """when the run was started (empty where the writer did not record it)"""


class CheckpointMeta(_Record):
    """The parts of a checkpoint the caller reads before it launches anything."""

    kind: Literal["tula.checkpoint"]
    epoch: int = Field(ge=0)
    """the epochs finished"""
    steps_done: int = Field(ge=0)
    """the steps taken"""
    method: str
    """the training method"""
    global_batch: int = Field(ge=1)
    """B to continue at"""
    n_workers: int = Field(ge=1)
    """N to continue with"""
    accumulation_steps: int = Field(default=1, ge=1)
    """k to continue with (checkpoints before gradient accumulation: 1)"""
    fallbacks: list[Fallback] = Field(default_factory=list)
    """the out-of-memory fallbacks so far"""
    history: list[EpochRecord] = Field(default_factory=list)
    """the finished epochs' figures"""
    next_global_batch: int | None = None
    """B the next epoch trains at (the schedule's or a fallback's; absent in older checkpoints)"""
    next_n_workers: int | None = None
    """N the next epoch trains with"""
    next_accumulation_steps: int | None = None
    """k the next epoch trains with"""
    precision: dict | None = None
    """the precision trained in and its loss scaler's state (absent in older checkpoints: fp32)"""
    sequence_length: int | None = Field(default=None, ge=1)
    """the sequence length trained at (absent for data without one, and in older checkpoints)"""

    _OMITTED_UNSET = frozenset(
        {"next_global_batch", "next_n_workers", "next_accumulation_steps", "precision", "sequence_length"}
    )


SCHEMAS: dict[str, type[_Record]] = {
    PROFILE_KIND: ProfileRecord,
    MODELS_KIND: ModelsRecord,
    PLAN_KIND: PlanRecord,
    TRAIN_KIND: TrainRecord,
    RUN_KIND: RunManifest,
    CHECKPOINT_KIND: CheckpointMeta,
}


def _first_error(err: ValidationError) -> str:
    e = first_error(err)
    loc = e.where(escape_keys=True)  # a key may hold a line break
    if e.missing:
        return f"field '{loc}' is missing"
    return f"field '{loc}': {lowered(e.message)}" if loc else e.message


def _kinds(expect: tuple[str, ...]) -> str:
    names = [NAMES[k] for k in expect]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _checked(data: Any, source: str, expect: tuple[str, ...] | None) -> _Record:
    """``data`` (a parsed record) checked against its kind's schema, as its typed object."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str) or not data["kind"].startswith("tula."):
        raise RecordError(
            f"{source} is not a Tula record (no 'kind' naming a Tula profile, models, plan or training run)"
        )
    kind = data["kind"]
    if kind not in SCHEMAS:
        raise RecordError(f"{source} is a record of an unknown kind {kind!r}")
    if expect is not None and kind not in expect:
        raise RecordError(f"{source} is a {NAMES[kind]} record, but a {_kinds(expect)} record is needed here")
    try:
        return SCHEMAS[kind].model_validate(data)
    except ValidationError as err:
        raise RecordError(f"{source} is a damaged {NAMES[kind]} record: {_first_error(err)}") from None


def validate_record(data: Any, source: str, expect: tuple[str, ...] | None = None) -> dict:
    """Check ``data`` (a parsed record) against its kind's schema and return it as a plain
    dict with defaults filled in.  ``source`` names it in the error sentence (a path).
    :func:`parse_record` returns the typed object instead."""
    return _checked(data, source, expect).model_dump(mode="json")  # as before the typed loaders: inf -> None


def _kind_of(cls: type[_Record]) -> str:
    return next(k for k, c in SCHEMAS.items() if c is cls)


def parse_record(data: Any, cls: type[RecordT], source: str | None = None) -> RecordT:
    """A record already in memory (a dict as a writer made it, or read from JSON) checked and
    returned as the typed, frozen object ``cls``; an object of ``cls`` is returned as it is.
    ``source`` names it in the error sentence (default: "the record")."""
    if isinstance(data, cls):
        return data
    kind = _kind_of(cls)
    source = source or "the record"
    if isinstance(data, dict):  # numpy numbers and tuples as the JSON on disk would have them
        try:
            data = json.loads(json.dumps(data, default=_jsonable))
        except (TypeError, ValueError) as err:
            raise RecordError(f"{source} cannot be read as JSON ({err})") from None
    rec = _checked(data, source, (kind,))
    assert isinstance(rec, cls)  # SCHEMAS[kind] is cls
    return rec


def as_record(data: Any, cls: type[RecordT]) -> RecordT:
    """``data`` as the typed object ``cls`` where it comes into a module that reads records: an
    object of ``cls`` as it is; a whole record as its JSON (a dict with its ``kind``: a file's, an
    HTTP answer's, the store's) checked by :func:`parse_record`.  A dict of a record's parts only
    (no ``kind``) is a :class:`~tula.core.errors.RecordError` -- build the record whole, with its
    class (``TrainRecord(...)``) --, and anything else a ``TypeError``: one sentence each."""
    if isinstance(data, cls):
        return data
    name = NAMES[_kind_of(cls)]
    if isinstance(data, Mapping):
        if "kind" not in data:
            raise RecordError(
                f"a whole {name} record is needed here, not a dict of some of its fields (it has no 'kind')"
            )
        return parse_record(dict(data), cls)
    raise TypeError(f"a {name} record is needed here, not {type(data).__name__}")


def read_record(path: str | Path, cls: type[RecordT]) -> RecordT:
    """Read and check the JSON record at ``path`` as the typed, frozen object ``cls`` (e.g.
    ``read_record(p, PlanRecord)``); a record of another kind, or a damaged one, is a
    :class:`~tula.core.errors.RecordError` naming the file (and the field)."""
    rec = _checked(_read_json(path), repr(str(Path(path))), (_kind_of(cls),))
    assert isinstance(rec, cls)
    return rec


def load_profile(path: str | Path) -> ProfileRecord:
    """The profile record at ``path`` (``profile.json``), typed."""
    return read_record(path, ProfileRecord)


def load_models(path: str | Path) -> ModelsRecord:
    """The models record at ``path`` (``models.json``), typed."""
    return read_record(path, ModelsRecord)


def load_plan(path: str | Path) -> PlanRecord:
    """The plan record at ``path`` (``plan.json``; version 1 plans too), typed."""
    return read_record(path, PlanRecord)


def load_train(path: str | Path) -> TrainRecord:
    """The training run record at ``path`` (``train/train.json``), typed."""
    return read_record(path, TrainRecord)


def load_run_manifest(path: str | Path) -> RunManifest:
    """The run manifest at ``path`` (``run.json``), typed."""
    return read_record(path, RunManifest)


def load_record(path: str | Path, expect: tuple[str, ...] | None = None) -> dict:
    """Read and check a JSON record; ``expect`` limits the kinds accepted here.  The typed
    loaders (:func:`read_record`, :func:`load_plan`, ...) return the objects instead."""
    return validate_record(_read_json(path), repr(str(Path(path))), expect)


def _read_json(path: str | Path) -> Any:
    """The parsed JSON of a record file; a missing, unreadable or malformed one is a RecordError."""
    p = Path(path)
    if p.is_dir():
        raise RecordError(f"{str(p)!r} is a directory, not a record file")
    if not p.is_file():
        raise RecordError(f"record file {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise RecordError(f"{str(p)!r} is not a JSON record (it is not text)") from None
    except json.JSONDecodeError as err:
        raise RecordError(f"{str(p)!r} is not valid JSON, perhaps truncated ({err.msg} at line {err.lineno})") from None
    except (ValueError, RecursionError) as err:  # a number of more than 4300 digits, nesting too deep
        raise RecordError(f"{str(p)!r} is not a JSON record Tula can read ({str(err).split(';')[0][:120]})") from None
    except OSError as err:
        raise RecordError(f"{str(p)!r} cannot be read ({err.strerror})") from None
    return data


def _jsonable(o: Any) -> Any:
    np: Any
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None
    if np is not None and isinstance(o, np.generic):
        return o.item()
    if np is not None and isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file, flushed to disk and renamed, so
    a crash or a kill never leaves half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, p)
    return p


def save_record(rec: dict | _Record, path: str | Path) -> Path:
    """Write a record atomically (a record Tula writes is one it can read: checked first); a typed
    record object is written as its :meth:`~_Frozen.to_json_dict`."""
    if isinstance(rec, _Record):
        rec = rec.to_json_dict()
    kind = rec.get("kind")
    if kind in SCHEMAS and kind != CHECKPOINT_KIND:
        validate_record(json.loads(json.dumps(rec, default=_jsonable)), f"the {NAMES[kind]} record to write")
    return write_atomic(path, json.dumps(rec, indent=1, default=_jsonable))


def read_jsonl(path: str | Path) -> list[dict]:
    """The epoch lines of a ``metrics.jsonl``; a damaged line is one sentence naming it."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            EpochRecord.model_validate(data)
        except (ValueError, RecursionError):  # JSONDecodeError and ValidationError are ValueErrors
            raise RecordError(f"line {i} of {str(p)!r} is not an epoch record (the file is damaged)") from None
        out.append(data)
    return out


def read_record_of(path: str | Path, classes: tuple[type[_Record], ...]) -> _Record:
    """Read and check the JSON record at ``path`` as the typed object of whichever of ``classes`` its
    kind is (``read_record_of(p, (ProfileRecord, ModelsRecord))``: a profile or a models record); any
    other kind, or a damaged record, is the :class:`~tula.core.errors.RecordError` of :func:`load_record`."""
    return _checked(_read_json(path), repr(str(Path(path))), tuple(_kind_of(c) for c in classes))


def as_epoch(data: EpochRecord | Mapping[str, Any]) -> EpochRecord:
    """One epoch's figures as an :class:`EpochRecord` where they come into a module that reads
    them: an ``EpochRecord`` as it is; a whole metrics line as its JSON (a ``metrics.jsonl`` line,
    an entry of a training record's ``history``; lines written before the later figures --
    ``accumulation_steps``, the noise scale, the wall times -- too) checked, the figures it
    carries beyond the typed ones kept (``step_traces``).  A line without a figure every epoch
    has (``epoch``, ``steps``, ``steps_done``, ``global_batch``, ``n_workers``, ``lr``,
    ``train_loss``, ``epoch_time_s``, ``test_loss``) or with a damaged one is a
    :class:`~tula.core.errors.RecordError` naming the field; anything else a ``TypeError``."""
    if isinstance(data, EpochRecord):
        return data
    if not isinstance(data, Mapping):
        raise TypeError(
            f"an epoch's figures (an EpochRecord or a metrics line) are needed here, not {type(data).__name__}"
        )
    try:
        return EpochRecord.model_validate(dict(data))
    except ValidationError as err:
        raise RecordError(f"an epoch's metrics line is damaged: {_first_error(err)}") from None
