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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from tula.core.errors import RecordError
from tula.core.registry import OBJECTIVE_NAMES

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

TRIAL_STATUSES = ("ok", "oom", "skipped", "error", "interrupted")


@dataclass
class Trial:
    """One profiled configuration: (N, b) and what was measured there.

    ``status``: ``ok`` (timed), ``oom`` (the ranks agreed it does not fit), ``skipped``
    (a smaller local batch already ran out of memory), ``error`` (the world failed),
    ``interrupted`` (Ctrl-C / SIGTERM before it ran)."""

    #: N, the ranks of the world
    n_workers: int
    #: b, the samples each rank's step takes
    local_batch: int
    #: B = N x b
    global_batch: int
    #: how the trial ended (the class's description says each)
    status: Literal["ok", "oom", "skipped", "error", "interrupted"]
    #: the median time of a training step, seconds
    t_step_s: float | None = None
    #: the median time of a step's forward and backward computation, seconds
    t_compute_s: float | None = None
    #: the median time a step spends synchronising the gradients beyond the computation, seconds
    t_sync_s: float | None = None
    t_data_s: float | None = None  # median wait for the next batch (data loading) per step
    #: the most memory a rank held during the trial, bytes
    peak_mem_bytes: int | None = None
    #: the spread of the timed steps relative to their median
    t_step_spread: float | None = None
    #: how many steps were timed
    timed_steps: int = 0
    #: why a trial that is not ok ended so, or what to know about it
    note: str = ""
    #: each timed step's time, seconds
    step_times_s: list[float] = field(default_factory=list)
    #: each timed step's computation time, seconds
    compute_times_s: list[float] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # each rank's host (its worker's address), in rank order
    interfaces: list[str] = field(default_factory=list)  # each rank's network interface ("": torch's default)
    interface_sources: list[str] = field(
        default_factory=list
    )  # why each one (tula.engine.launch.netif.choose_interface)
    local_ranks: list[int] = field(default_factory=list)  # each rank's position among the ranks on its host
    devices: list[str] = field(default_factory=list)  # each rank's device
    ranks_per_host: int | None = None  # the most ranks that shared one host
    # the gradient noise scale measured at this trial's local batch from the world's fresh
    # model (the first trial of each world): tula.engine.profile.measure_noise's dict
    noise: dict | None = None


def placement(trials: list[dict]) -> dict:
    """Where a profile's worlds ran: the hosts, the most ranks one host held, the devices --
    so that a model fitted on one host is never silently taken for a multi-host one."""
    hosts = sorted({h for t in trials for h in t.get("hosts") or []})
    per_host = max((max(Counter(t["hosts"]).values()) for t in trials if t.get("hosts")), default=0)
    return {
        "hosts": hosts,
        "n_hosts": len(hosts),
        "max_ranks_per_host": per_host,
        "devices": sorted({d for t in trials for d in t.get("devices") or []}),
        "max_workers": max((t["n_workers"] for t in trials if t.get("status") == "ok"), default=0),
    }


class _Record(BaseModel):
    # unknown fields are kept (a newer minor writer may add some); known ones must be right.  A docstring
    # right under a field is its description (the JSON Schema's, the reference page's)
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

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


def _valid_spec(value: Any) -> dict:
    from tula.core.spec import spec_from_dict

    try:
        return spec_from_dict(value).to_dict()
    except Exception as err:  # noqa: BLE001 - SpecError's sentence becomes this field's
        raise ValueError(f"the job spec inside is invalid ({err})") from None


def _valid_memory(value: Any) -> dict:
    from tula.core.memory_model import MemoryModel  # a frozen dataclass; pydantic checks its fields' types

    try:
        model = TypeAdapter(MemoryModel).validate_python(value, strict=False)
    except ValidationError as err:
        raise ValueError(f"the memory model inside is damaged ({_first_error(err)})") from None
    return model.to_dict()  # the checked, converted values, not the raw ones


def _valid_perf(value: Any) -> dict:
    from tula.core.perfmodel import PerfModel

    try:
        model = TypeAdapter(PerfModel).validate_python(value, strict=False)
    except ValidationError as err:
        raise ValueError(f"the performance model inside is damaged ({_first_error(err)})") from None
    return model.to_dict()


class ModelInfo(BaseModel):
    """The network a profile measured."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str
    """the spec's model.name"""
    param_count: int = Field(ge=0)
    """its parameters"""
    grad_bytes: int = Field(ge=0)
    """the bytes of its gradients, which every step synchronises"""


class ProfileRecord(_Record):
    """What ``tula profile`` measured: a trial of short real training steps at each chosen (N, B)."""

    kind: Literal["tula.profile"]
    spec: dict
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
    memory: dict
    """the memory model measured at profile.memory_probe_batches (tula.core.memory_model.MemoryModel)"""
    max_local_batch: int | None
    """the largest local batch the memory model allows within the budget (null: no budget)"""
    #: every (N, B) the search chose; trials not yet in ``trials`` are still to run
    configs: list[tuple[int, int]] = Field(default_factory=list)
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

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))
    _mem = field_validator("memory")(classmethod(lambda cls, v: _valid_memory(v)))

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
    spec: dict
    """the job spec profiled"""
    search: Literal["full", "partial"]
    """the profile's search"""
    device: str
    """where the profile's ranks computed: cpu or cuda"""
    dataset_size: int = Field(ge=1)
    """training samples"""
    memory_budget_bytes: int | None
    """the memory each worker could use (null: no budget)"""
    memory: dict
    """the memory model refitted to the trials' measured peaks (tula.core.memory_model.MemoryModel)"""
    memory_probed: dict
    """the memory model as the profile's probes measured it, before the refit"""
    perf: dict
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

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))
    _mem = field_validator("memory", "memory_probed")(classmethod(lambda cls, v: _valid_memory(v)))
    _perf = field_validator("perf")(classmethod(lambda cls, v: _valid_perf(v)))


class PlanRow(BaseModel):
    """One configuration (N, B) of a plan and its predictions."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

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


class PlanConstraints(BaseModel):
    """What a plan was made under (version 2): the deadline and budget (``None``: none) and
    how many configurations fit in memory and how many of those meet both."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

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
    spec: dict
    """the job spec planned"""
    dataset_size: int = Field(ge=1)
    """training samples"""
    configurations: list[PlanRow]
    """every configuration evaluated"""
    curves: dict[str, dict]
    """per cluster size N (a string key): the feasible rows' predictions as lists, by global batch"""
    knees: dict[str, dict]
    """per cluster size N: the knee of its time-vs-batch curve (its global_batch, and the method that found it)"""
    frontier: list[PlanRow]
    """the Pareto frontier of the feasible configurations in time and cost"""
    constraints: PlanConstraints | None = None
    """what the plan was made under (version 2)"""
    spot_comparison: dict | None = None
    """spot against on-demand pricing, when asked for"""

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))

    @model_validator(mode="after")
    def _v2_fields(self) -> PlanRecord:
        if self.version >= 2 and self.constraints is None:
            raise ValueError("field 'constraints' is missing (a version 2 plan records what it was planned under)")
        return self


class EpochRecord(BaseModel):
    """One line of ``metrics.jsonl``: an epoch's figures (and, for some methods, per-step traces)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

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


def epoch_score(h: dict) -> tuple[str, float, str]:
    """An epoch's test score: ``("top-1", value, "93.10%")`` for classification, ``("R^2",
    value, "0.8123")`` for regression (``train.loss`` mse), ``("loss", value, "0.4321")`` --
    the test loss -- for a user's loss whose targets are no class labels."""
    if h.get("test_top1") is None and h.get("test_r2") is not None:
        v = float(h["test_r2"])
        return "R^2", v, f"{v:.4f}"
    if h.get("test_top1") is None and h.get("test_r2") is None and h.get("test_loss") is not None:
        v = float(h["test_loss"])
        return "loss", v, f"{v:.4f}"
    v = float(h["test_top1"]) if h.get("test_top1") is not None else math.nan
    return "top-1", v, f"{v:.2%}"


class TrainRecord(_Record):
    """What ``tula train`` did: the configuration it ended at and every epoch's figures."""

    kind: Literal["tula.train"]
    spec: dict
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
    fallbacks: list[dict] = Field(default_factory=list)
    """each out-of-memory fallback: the batch and accumulation before and after, and the epoch"""
    traces: dict = Field(default_factory=dict)
    """per-step traces of the method (AGS's factors and gates, the noise scale), where it keeps some"""

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))


class RunManifest(_Record):
    """What ``tula run`` was asked to do in a run directory, so ``tula run --resume DIR`` can
    continue it without the original command line."""

    kind: Literal["tula.run"]
    spec: dict
    """the job spec the run was started with"""
    search: Literal["full", "partial"]
    """the profile's search"""
    objective: Literal[OBJECTIVE_NAMES] | None = None  # type: ignore[valid-type]
    """the objective asked for on the command line (null: the spec's)"""
    train: bool = True
    """whether the run trains after planning"""
    created: str = ""
    """when the run was started (empty where the writer did not record it)"""

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))


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
    fallbacks: list[dict] = Field(default_factory=list)
    """the out-of-memory fallbacks so far"""
    history: list[EpochRecord] = Field(default_factory=list)
    """the finished epochs' figures"""


SCHEMAS: dict[str, type[_Record]] = {
    PROFILE_KIND: ProfileRecord,
    MODELS_KIND: ModelsRecord,
    PLAN_KIND: PlanRecord,
    TRAIN_KIND: TrainRecord,
    RUN_KIND: RunManifest,
    CHECKPOINT_KIND: CheckpointMeta,
}


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(repr(p)[1:-1] if isinstance(p, str) else str(p) for p in e["loc"])  # a key may hold a line break
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "missing":
        return f"field '{loc}' is missing"
    return f"field '{loc}': {msg[0].lower() + msg[1:]}" if loc else msg


def _kinds(expect: tuple[str, ...]) -> str:
    names = [NAMES[k] for k in expect]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def validate_record(data: Any, source: str, expect: tuple[str, ...] | None = None) -> dict:
    """Check ``data`` (a parsed record) against its kind's schema and return it as a plain
    dict with defaults filled in.  ``source`` names it in the error sentence (a path)."""
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
        rec = SCHEMAS[kind].model_validate(data)
    except ValidationError as err:
        raise RecordError(f"{source} is a damaged {NAMES[kind]} record: {_first_error(err)}") from None
    return rec.model_dump(mode="json")


def load_record(path: str | Path, expect: tuple[str, ...] | None = None) -> dict:
    """Read and check a JSON record; ``expect`` limits the kinds accepted here."""
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
    return validate_record(data, repr(str(p)), expect)


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


def save_record(rec: dict, path: str | Path) -> Path:
    """Write a record atomically (a record Tula writes is one it can read: checked first)."""
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
