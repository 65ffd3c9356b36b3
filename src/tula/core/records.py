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

    n_workers: int
    local_batch: int
    global_batch: int
    status: Literal["ok", "oom", "skipped", "error", "interrupted"]
    t_step_s: float | None = None
    t_compute_s: float | None = None
    t_sync_s: float | None = None
    t_data_s: float | None = None  # median wait for the next batch (data loading) per step
    peak_mem_bytes: int | None = None
    t_step_spread: float | None = None
    timed_steps: int = 0
    note: str = ""
    step_times_s: list[float] = field(default_factory=list)
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
    # unknown fields are kept (a newer minor writer may add some); known ones must be right
    model_config = ConfigDict(extra="allow")

    kind: str
    version: int = Field(ge=1)

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
    name: str
    param_count: int = Field(ge=0)
    grad_bytes: int = Field(ge=0)


class ProfileRecord(_Record):
    kind: Literal["tula.profile"]
    spec: dict
    search: Literal["full", "partial"]
    device: str
    backend: str
    threads_per_worker: int = Field(ge=1)
    memory_budget_bytes: int | None
    enforce_memory_cap: bool
    dataset_size: int = Field(ge=1)
    sample_shape: list[int]
    model: ModelInfo
    memory: dict
    max_local_batch: int | None
    #: every (N, B) the search chose; trials not yet in ``trials`` are still to run
    configs: list[tuple[int, int]] = Field(default_factory=list)
    trials: list[Trial]
    profiling_s: float = Field(ge=0)
    created: str
    failed: str | None = None
    interrupted: str | None = None
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
    kind: Literal["tula.models"]
    spec: dict
    search: Literal["full", "partial"]
    device: str
    dataset_size: int = Field(ge=1)
    memory_budget_bytes: int | None
    memory: dict
    memory_probed: dict
    perf: dict
    oom_local_batch: int | None
    fit_error: dict[str, float]
    trials: list[Trial]
    profiling_s: float | None = None

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))
    _mem = field_validator("memory", "memory_probed")(classmethod(lambda cls, v: _valid_memory(v)))
    _perf = field_validator("perf")(classmethod(lambda cls, v: _valid_perf(v)))


class PlanRow(BaseModel):
    model_config = ConfigDict(extra="allow")

    n_workers: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    local_batch: int = Field(ge=1)
    feasible: bool  # fits in memory
    t_step_s: float
    total_time_s: float  # expected, with preemptions, under spot pricing
    cost: float
    peak_mem_bytes: int
    meets_constraints: bool = True  # within the deadline and the budget (version 2; none before)


class PlanConstraints(BaseModel):
    """What a plan was made under (version 2): the deadline and budget (``None``: none) and
    how many configurations fit in memory and how many of those meet both."""

    model_config = ConfigDict(extra="allow")

    deadline_s: float | None = Field(default=None, gt=0)
    budget: float | None = Field(default=None, ge=0)
    unit: str = "$"
    n_feasible: int = Field(ge=0)
    n_meeting: int = Field(ge=0)


class PlanRecord(_Record):
    """A plan.  Version 1 (before constraints) loads with ``constraints`` and
    ``spot_comparison`` ``None`` and every row's ``meets_constraints`` true."""

    kind: Literal["tula.plan"]
    objective: Literal[OBJECTIVE_NAMES]  # type: ignore[valid-type]
    choice: PlanRow
    reason: str
    spec: dict
    dataset_size: int = Field(ge=1)
    configurations: list[PlanRow]
    curves: dict[str, dict]
    knees: dict[str, dict]
    frontier: list[PlanRow]
    constraints: PlanConstraints | None = None
    spot_comparison: dict | None = None

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))

    @model_validator(mode="after")
    def _v2_fields(self) -> PlanRecord:
        if self.version >= 2 and self.constraints is None:
            raise ValueError("field 'constraints' is missing (a version 2 plan records what it was planned under)")
        return self


class EpochRecord(BaseModel):
    """One line of ``metrics.jsonl``: an epoch's figures (and, for some methods, per-step traces)."""

    model_config = ConfigDict(extra="allow")

    epoch: int = Field(ge=1)
    steps: int = Field(ge=1)
    steps_done: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    n_workers: int = Field(ge=1)
    lr: float
    train_loss: float
    epoch_time_s: float
    test_loss: float
    test_top1: float | None = None  # classification (train.loss cross_entropy, or a user's loss on integer labels)
    test_r2: float | None = None  # regression (train.loss mse)
    accumulation_steps: int = Field(default=1, ge=1)  # k micro-batches per step (lines before it had 1)
    micro_batch: int | None = Field(default=None, ge=1)  # b = global_batch / (n_workers x k)


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
    kind: Literal["tula.train"]
    spec: dict
    method: str
    n_workers: int = Field(ge=1)
    global_batch: int = Field(ge=1)
    steps_per_epoch: int = Field(ge=1)
    epochs: int = Field(ge=1)
    steps_done: int = Field(ge=0)
    accumulation_steps: int = Field(default=1, ge=1)  # the last configuration's k (records before it: 1)
    micro_batch: int | None = Field(default=None, ge=1)  # its b = local_batch / k; local_batch is B / N
    history: list[EpochRecord]
    fallbacks: list[dict] = Field(default_factory=list)
    traces: dict = Field(default_factory=dict)

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))


class RunManifest(_Record):
    """What ``tula run`` was asked to do in a run directory, so ``tula run --resume DIR`` can
    continue it without the original command line."""

    kind: Literal["tula.run"]
    spec: dict
    search: Literal["full", "partial"]
    objective: Literal[OBJECTIVE_NAMES] | None = None  # type: ignore[valid-type]
    train: bool = True
    created: str = ""

    _spec = field_validator("spec")(classmethod(lambda cls, v: _valid_spec(v)))


class CheckpointMeta(_Record):
    """The parts of a checkpoint the caller reads before it launches anything."""

    kind: Literal["tula.checkpoint"]
    epoch: int = Field(ge=0)
    steps_done: int = Field(ge=0)
    method: str
    global_batch: int = Field(ge=1)
    n_workers: int = Field(ge=1)
    accumulation_steps: int = Field(default=1, ge=1)  # checkpoints before gradient accumulation: 1
    fallbacks: list[dict] = Field(default_factory=list)
    history: list[EpochRecord] = Field(default_factory=list)


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
