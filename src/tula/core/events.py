"""The progress events the engine's workers and stages send to the fronts, as typed, frozen objects.

A rank emits them (``WorkerContext.emit``), its launcher carries them to the launching process
(pickled: across a process's queue or a Dask queue), the profiler and the trainer pass them to
their ``on_event``, and the pipeline's :class:`~tula.pipeline.Observer` hears them as
``event(stage, ev)``.  A consumer matches on the class::

    match ev:
        case StepDone():
            bar.update(task, completed=ev.epoch * ev.steps_per_epoch + ev.step)
        case EpochFinished(record=rec):
            losses.append(rec.train_loss)

Profiling sends :class:`Checked`, :class:`TrialsPlanned`, :class:`RankTrialFinished` (kept by
the profiler, not passed on) and :class:`TrialFinished`; training :class:`WorldStarted`,
:class:`StepDone`, :class:`EpochFinished`, :class:`Resized` and :class:`FellBack`; both
:class:`Note`.  ``tula.Job``'s callback also hears :class:`StageStarted`, :class:`StageDone` and
:class:`RecordSaved`.

Where an event leaves Python (a logger's sink, a callback written for the dict events these
replace) :meth:`Event.to_json_dict` gives it as it was sent before: ``{"type": kind, ...}``; an
event itself is read by its attributes (``ev.epoch``), not by keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from tula.core.records import EpochRecord, Fallback, Trial

__all__ = [
    "Checked",
    "EpochFinished",
    "Event",
    "FellBack",
    "Note",
    "RankTrialFinished",
    "RecordSaved",
    "Resized",
    "StageDone",
    "StageStarted",
    "StepDone",
    "TrialFinished",
    "TrialsPlanned",
    "WorldStarted",
]


@dataclass(frozen=True)
class Event:
    """A progress event; ``kind`` names it in :meth:`to_json_dict` (its ``type``)."""

    kind: ClassVar[str] = "event"

    def to_json_dict(self) -> dict[str, Any]:
        """The event as plain values (``{"type": kind, field: value, ...}``), as the dict events
        these replace were sent: a field left at ``None`` is not written."""
        out: dict[str, Any] = {"type": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class Note(Event):
    """A sentence for the user (a cluster size not profiled, fewer workers than asked for ...)."""

    kind: ClassVar[str] = "note"
    message: str


@dataclass(frozen=True)
class Checked(Event):
    """The workload and the workers passed every check before a profiling trial."""

    kind: ClassVar[str] = "checked"


@dataclass(frozen=True)
class TrialsPlanned(Event):
    """The profile's trials: ``total`` of them, ``done`` already finished (a resumed profile).  The
    first world's rank 0 also sends what its memory probe found (``memory``, ``max_local_batch``
    and the chosen ``configs``: (N, B) or (N, B, L) each)."""

    kind: ClassVar[str] = "plan"
    total: int
    done: int = 0
    memory: dict[str, Any] | None = None
    max_local_batch: int | None = None
    configs: tuple[tuple[int, ...], ...] | None = None

    def to_json_dict(self) -> dict[str, Any]:
        out = super().to_json_dict()
        if self.configs is not None:
            out["configs"] = [list(c) for c in self.configs]
        return out


@dataclass(frozen=True)
class RankTrialFinished(Event):
    """One rank finished a profiling trial (the profiler keeps it: a world that dies later keeps it)."""

    kind: ClassVar[str] = "rank_trial"
    rank: int
    trial: Trial

    def to_json_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "rank": self.rank, "trial": asdict(self.trial)}


@dataclass(frozen=True)
class TrialFinished(Event):
    """A profiling trial at (N, B) ended with ``status`` (``index``: its place in the world's order)."""

    kind: ClassVar[str] = "trial"
    n_workers: int
    global_batch: int
    status: str
    index: int | None = None


@dataclass(frozen=True)
class WorldStarted(Event):
    """Training starts (a world, or a new batch in the same world) at this configuration."""

    kind: ClassVar[str] = "start"
    global_batch: int
    n_workers: int
    accumulation_steps: int
    micro_batch: int
    steps_per_epoch: int
    epochs: int


@dataclass(frozen=True)
class StepDone(Event):
    """``step`` steps of epoch ``epoch`` (from 0: the epochs finished before it) are done."""

    kind: ClassVar[str] = "step"
    epoch: int
    step: int
    steps_per_epoch: int


@dataclass(frozen=True)
class EpochFinished(Event):
    """An epoch finished: its line of ``metrics.jsonl``."""

    kind: ClassVar[str] = "epoch"
    record: EpochRecord

    def to_json_dict(self) -> dict[str, Any]:
        return {"type": self.kind, **self.record.model_dump(mode="python", exclude_unset=True)}


@dataclass(frozen=True)
class Resized(Event):
    """After epoch ``at_epoch`` training moves to this configuration: in a new world, or in the
    same one (a batch change)."""

    kind: ClassVar[str] = "resize"
    at_epoch: int
    global_batch: int
    n_workers: int
    accumulation_steps: int
    new_world: bool


@dataclass(frozen=True)
class FellBack(Event):
    """Training ran out of memory and goes on from the last checkpoint at a smaller micro-batch."""

    kind: ClassVar[str] = "fallback"
    fallback: Fallback

    def to_json_dict(self) -> dict[str, Any]:
        return {"type": self.kind, **self.fallback.to_json_dict()}


@dataclass(frozen=True)
class StageStarted(Event):
    """A stage of the pipeline begins (``tula.Job``'s callback); ``info``: training's ``method``,
    ``n_workers`` and ``global_batch`` (and ``sequence_length`` where the data has one)."""

    kind: ClassVar[str] = "stage"
    info: dict[str, Any] = field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        return {"type": self.kind, **self.info}


@dataclass(frozen=True)
class StageDone(Event):
    """A stage of the pipeline ended (finished, failed or interrupted)."""

    kind: ClassVar[str] = "done"


@dataclass(frozen=True)
class RecordSaved(Event):
    """A record or a plot of ``record_kind`` was written to ``path``."""

    kind: ClassVar[str] = "saved"
    record_kind: str
    path: str

    def to_json_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "kind": self.record_kind, "path": self.path}
