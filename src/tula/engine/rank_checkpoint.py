"""What a rank's checkpoint holds, typed: :class:`RankCheckpoint`.

The ranks build one after each epoch (:meth:`tula.engine.rank_loop._RankTrainer.checkpoint_state`)
and resume from one (:func:`tula.engine.rank_loop._restore`); the file holds it as the dict
``torch.save`` writes (:mod:`tula.engine.checkpoint`).  :meth:`RankCheckpoint.to_state` and
:meth:`RankCheckpoint.from_state` are that edge, the one place the dict's keys are spelled: a
checkpoint written before a field existed loads with the field's default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from tula.core.records import EpochRecord, as_epoch
from tula.core.schedules import ScheduleState

#: the order of an epoch's figures in its ``metrics.jsonl`` line (as the rank wrote them before the typed record);
#: the evaluation's scores come in this order whichever of them it gives
_LINE_ORDER = (
    "epoch", "steps", "steps_done", "global_batch", "n_workers", "accumulation_steps", "micro_batch", "lr",
    "train_loss", "epoch_time_s", "test_loss", "test_top1", "test_top5", "test_r2", "test_perplexity",
    "skipped_steps", "b_simple", "scaled_fraction", "eval_s", "epoch_end_s",
)  # fmt: skip


def epoch_line(figures: EpochRecord) -> dict[str, Any]:
    """An epoch's figures as its ``metrics.jsonl`` line holds them (the rank's edge: the line, the
    checkpoint's history and the ranks' messages are JSON's values): only the figures given, in the
    line's order; the schedule's decision and the checkpoint's times after them."""
    data = figures.model_dump(exclude_unset=True)
    ordered = {key: data.pop(key) for key in _LINE_ORDER if key in data}
    return {**ordered, **data}


#: the fields written only when they hold something (a DDP checkpoint has no shards; data without a length no L)
_WRITTEN_WHEN_SET = ("sequence_length", "shards")


@dataclass(frozen=True)
class RankCheckpoint:
    """A training run after its last finished epoch, as a rank saves and resumes it.

    Parameters
    ----------
    epoch : int
        The epochs finished.
    steps_done : int
        Optimizer steps since training began.
    history : list of EpochRecord
        The finished epochs' figures (the file holds their ``metrics.jsonl`` lines: :func:`epoch_line`).
    method : str
        The training method.
    global_batch, n_workers, accumulation_steps : int
        The configuration the last epoch trained at.
    fallbacks : list of dict
        The out-of-memory fallbacks so far (:class:`~tula.core.records.Fallback`'s JSON).
    model : dict
        The model's state dict (empty under FSDP: its tensors are in the shards).
    method_state : dict
        The method's state (its optimiser's, ``None`` under FSDP, and its extras).
    torch_rng : torch.Tensor
        The CPU generator's state.
    schedule_state : ScheduleState, dict or None
        The batch schedule's state (JSON's values, :meth:`ScheduleState.to_dict`); ``None`` without one.
    lr_multiplier : float
        The LR multiplier the schedule set.
    next_global_batch, next_n_workers, next_accumulation_steps : int or None
        The configuration the next epoch trains at (absent in older checkpoints).
    noise_scale : dict or None
        The gradient noise scale's state (:meth:`tula.core.noise_scale.NoiseScale.state_dict`).
    precision : dict or None
        The precision trained in and its loss scaler's state (absent in older checkpoints: fp32).
    sequence_length : int or None
        The sequence length trained at (``None``: data without one, or a checkpoint from before it was recorded).
    shards : str or None
        Under FSDP, the directory of the shards (``checkpoint.shards/epoch-NNNN``) the model and optimiser
        state are in.
    """

    epoch: int
    steps_done: int
    history: list[EpochRecord]
    method: str
    global_batch: int
    n_workers: int
    accumulation_steps: int
    fallbacks: list[dict[str, Any]]
    model: dict[str, Any]
    method_state: dict[str, Any]
    torch_rng: torch.Tensor
    schedule_state: ScheduleState | dict[str, Any] | None = None
    lr_multiplier: float = 1.0
    next_global_batch: int | None = None
    next_n_workers: int | None = None
    next_accumulation_steps: int | None = None
    noise_scale: dict[str, Any] | None = None
    precision: dict[str, Any] | None = None
    sequence_length: int | None = None
    shards: str | None = None

    def to_state(self) -> dict[str, Any]:
        """The checkpoint as the file's dict (:func:`tula.engine.checkpoint.save_checkpoint` writes it):
        the keys in the order they have always been written, ``sequence_length`` and ``shards`` only
        when they hold a value."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["history"] = [epoch_line(h) for h in self.history]
        for name in _WRITTEN_WHEN_SET:
            if state[name] is None:
                del state[name]
        return state

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> RankCheckpoint:
        """The checkpoint a file's dict holds (:func:`tula.engine.checkpoint.load_checkpoint` checked it):
        the fields it lacks (a checkpoint written before them) at their defaults; the header's ``kind``
        and ``version`` dropped."""
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in state.items() if k in names}
        # what a checkpoint from before a field means by its absence (the later fields: their defaults)
        values.setdefault("accumulation_steps", 1)  # before gradient accumulation
        values.setdefault("fallbacks", [])
        values["history"] = [as_epoch(h) for h in state.get("history", [])]
        return cls(**values)
