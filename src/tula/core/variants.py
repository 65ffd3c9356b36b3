"""The run variants a plan weighs (#44): one place that says which variants of the training run
a spec allows and how a row of each is predicted.

A *variant* (:class:`RunVariant`) is a way of running the same step that changes its memory and
its time but not what it computes: activation checkpointing on or off (and, next, DDP or FSDP).
The profile measures the spec's own variant at every trial and, where the spec leaves the choice
to the planner (``train.checkpointing: auto``), the other at the fewest trials that give its
effect (:func:`tula.engine.profile.checkpointing_configs`: the smallest cluster size's two largest
batches).  The fit records that effect (:class:`CheckpointingEffect`, the models record's
``checkpointing``), fitted, not assumed; :func:`variant_models` turns the plain models record
into the models record of a variant -- its memory and performance models with the effect applied
-- so that a row of each variant is predicted by the one prediction every row is
(:meth:`tula.core.fitted.FittedModels.predict`), and the planner plans each variant as it plans
a spec of that variant (:class:`tula.core.plan.Planner`), then chooses among them by the
objective.

With ``train.checkpointing`` ``on`` or ``off`` there is one variant, the spec's, and nothing here
changes a record or a plan.  Numpy only: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import PerfModel, world_shape
from tula.core.records import ModelsRecord, Trial
from tula.core.spec import JobSpec


@dataclass(frozen=True)
class RunVariant:
    """A way of running the step the plan may choose: with activation checkpointing or without
    (``parallelism``: ``ddp`` only, for now)."""

    checkpointing: bool
    parallelism: str = "ddp"

    @property
    def words(self) -> str:
        """The variant in words, for the plan's reason."""
        return "with activation checkpointing" if self.checkpointing else "without activation checkpointing"


@dataclass(frozen=True)
class CheckpointingEffect:
    """What checkpointing changes, fitted to the checkpointed trials against the plain models
    at the same (N, b, L).  Bytes, seconds.

    activation_bytes_per_sample : the activations a sample keeps with the blocks checkpointed (the
        memory model's ``activation_bytes_per_sample`` of the checkpointed variant; the plain
        model's is beside it for the ratio)
    plain_activation_bytes_per_sample : the plain model's, at the same fit
    static_delta_bytes : the change of the line's intercept (0 with one trial: not separable)
    compute_factor : the checkpointed compute over the plain model's prediction (the median
        over the trials, never below 1): the recomputed forward passes, fitted
    trials : how many checkpointed trials it was fitted to
    """

    activation_bytes_per_sample: int
    plain_activation_bytes_per_sample: int
    static_delta_bytes: int
    compute_factor: float
    trials: int

    def memory(self, plain: MemoryModel) -> MemoryModel:
        """``plain`` with the blocks checkpointed: the activations per sample (and their terms in
        the sequence length, scaled alike) and the intercept's change."""
        ratio = self.activation_bytes_per_sample / max(self.plain_activation_bytes_per_sample, 1)
        return replace(
            plain,
            activation_bytes_per_sample=int(self.activation_bytes_per_sample),
            other_static_bytes=int(plain.other_static_bytes + self.static_delta_bytes),
            bytes_per_token=plain.bytes_per_token * ratio,
            bytes_per_token_squared=plain.bytes_per_token_squared * ratio,
        )

    def perf(self, plain: PerfModel) -> PerfModel:
        """``plain`` with its compute scaled by the fitted factor (the sync is unchanged)."""
        f = self.compute_factor
        return replace(
            plain,
            c0=plain.c0 * f,
            c1=plain.c1 * f,
            t_floor_s=plain.t_floor_s * f,
            c1_per_token=plain.c1_per_token * f,
            c1_per_token_squared=plain.c1_per_token_squared * f,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CheckpointingEffect:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def fit_checkpointing_effect(
    memory: MemoryModel, perf: PerfModel, trials: Sequence[Trial]
) -> CheckpointingEffect | None:
    """The effect of checkpointing from the profile's checkpointed trials (``checkpointing``
    true) against the plain ``memory`` and ``perf`` fitted to the others: with two batches or
    more, the bytes per sample are the checkpointed peaks' slope over the batch (less the data
    batch's share) and the intercept's change what is left; with one, the intercept is kept and
    the slope is that trial's.  The compute factor is the median of each trial's measured
    compute over the plain model's at the same (b, N, L), where its ranks ran.  ``None``
    where no checkpointed trial ran."""
    ok = [t for t in trials if t.checkpointing and t.status == "ok" and t.peak_mem_bytes is not None]
    if not ok:
        return None
    b = np.array([t.local_batch for t in ok], float)
    n = [t.n_workers for t in ok]
    lengths = None if memory.sequence_length is None else [t.sequence_length or memory.sequence_length for t in ok]
    peaks = np.array([t.peak_mem_bytes for t in ok], float)
    # the plain line without its activations: what the checkpointed one adds its own to
    base = np.asarray(memory.predict_peak_bytes(b, n, lengths), float) - memory.activation_bytes_per_sample * b
    if len(np.unique(b)) >= 2:
        slope, intercept = np.polyfit(b, peaks - base, 1)
        activation, delta = float(slope), float(intercept)
    else:
        activation, delta = float(np.mean((peaks - base) / b)), 0.0
    activation = max(activation, 0.0)
    timed = [t for t in ok if t.t_compute_s]
    factor = 1.0
    if timed:
        m = np.array([min(t.n_workers, world_shape(asdict(t))[0]) for t in timed], float)
        lt = None if perf.sequence_length is None else [t.sequence_length or perf.sequence_length for t in timed]
        predicted = perf.t_compute_s(np.array([t.local_batch for t in timed], float), m, lt)
        measured = np.array([t.t_compute_s for t in timed], float)
        # never below 1: recomputing the blocks adds work (a ratio below 1 is the host's noise)
        factor = max(1.0, float(np.median(measured / np.asarray(predicted, float))))
    return CheckpointingEffect(
        activation_bytes_per_sample=int(round(activation)),
        plain_activation_bytes_per_sample=int(memory.activation_bytes_per_sample),
        static_delta_bytes=int(round(delta)),
        compute_factor=factor,
        trials=len(ok),
    )


def run_variants(spec: JobSpec, models: ModelsRecord) -> list[RunVariant]:
    """The variants the plan weighs: the spec's own (``on``: checkpointed; ``off``: plain), or,
    with ``train.checkpointing: auto``, the plain one and, where the profile measured it (the
    models record's ``checkpointing``), the checkpointed one."""
    mode = spec.train.checkpointing
    if mode != "auto":
        return [RunVariant(checkpointing=mode == "on")]
    plain = RunVariant(checkpointing=False)
    return [plain, RunVariant(checkpointing=True)] if models.checkpointing else [plain]


def variant_models(models: ModelsRecord, variant: RunVariant) -> ModelsRecord:
    """The models record a row of ``variant`` is predicted from: ``models`` itself for the
    variant the profile measured at every trial; for the checkpointed variant of an ``auto``
    spec, its memory and performance models with :class:`CheckpointingEffect` applied, the
    spec's ``train.checkpointing`` ``on``, and no plain out-of-memory batch (the plain step's
    limit is not the checkpointed one's: the memory model's is)."""
    spec = models.spec
    mode = (spec.get("train") or {}).get("checkpointing", "off")
    if mode != "auto":
        return models
    train = {**(spec.get("train") or {}), "checkpointing": "on" if variant.checkpointing else "off"}
    update: dict[str, Any] = {"spec": {**spec, "train": train}}
    if variant.checkpointing:
        assert models.checkpointing is not None  # run_variants offers it only where measured
        effect = CheckpointingEffect.from_dict(models.checkpointing)
        update.update(
            memory=effect.memory(MemoryModel.from_dict(models.memory)).to_dict(),
            perf=effect.perf(PerfModel.from_dict(models.perf)).to_dict(),
            oom_local_batch=None,
        )
    return models.model_copy(update=update)
