"""The run variants a plan weighs (#44): one place that says which variants of the training run
a spec allows and how a row of each is predicted.

A *variant* (:class:`RunVariant`) is a way of running the same step that changes its memory and
its time but not what it computes: activation checkpointing on or off, and DDP or FSDP (FSDP2's
``fully_shard``: each rank holds 1/N of the parameters, gradients and optimiser state).
The profile measures the spec's own variant at every trial and, where the spec leaves the choice
to the planner (``train.checkpointing: auto``), the other at the fewest trials that give its
effect (:func:`tula.engine.profile.checkpointing_configs`: the smallest cluster size's two largest
batches; with ``train.parallelism: auto``, :func:`tula.engine.profile.sharding_configs`: the
smallest cluster size of two or more ranks, its two largest batches and half the smaller, and one
batch at the next such size, sharded; with both ``auto``, one checkpointed and sharded,
:func:`tula.engine.profile.combined_configs`).  The fit records
each effect (:class:`CheckpointingEffect`, the models record's ``checkpointing``;
:class:`ShardingEffect`, its ``sharding``), fitted, not assumed; :func:`variant_models` turns the plain models record
into the models record of a variant -- its memory and performance models with the effect applied
-- so that a row of each variant is predicted by the one prediction every row is
(:meth:`tula.core.fitted.FittedModels.predict`), and the planner plans each variant as it plans
a spec of that variant (:class:`tula.core.plan.Planner`), then chooses among them by the
objective.

With ``train.checkpointing`` ``on`` or ``off`` and ``train.parallelism`` ``ddp`` or ``fsdp`` there
is one variant, the spec's, and nothing here changes a record or a plan.  With both ``auto`` the
variants are crossed (the two effects are measured apart and applied one after the other: the
checkpointed activations, then the sharded state; then what one checkpointed + sharded trial measured
beyond them, :attr:`ShardingEffect.checkpointed_offset_bytes`).  ``train.parallelism: auto`` with what FSDP
cannot train (a method that needs the whole gradient, fp16, the noise scale on several workers:
:func:`tula.core.job_rules.fsdp_obstacle`) plans DDP only, and the plan's reason says why.  Numpy
only: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tula.core.effects import CheckpointingEffect, ShardingEffect
from tula.core.job_rules import fsdp_obstacle, spec_with
from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import PerfModel, world_shape
from tula.core.records import ModelsRecord, Trial
from tula.core.spec import JobSpec, TrainSpec


@dataclass(frozen=True)
class RunVariant:
    """A way of running the step the plan may choose: with activation checkpointing or without,
    under DDP or FSDP (``parallelism``)."""

    checkpointing: bool
    parallelism: str = "ddp"

    @property
    def words(self) -> str:
        """The variant in words, for the plan's reason."""
        return "with activation checkpointing" if self.checkpointing else "without activation checkpointing"

    @property
    def sharded(self) -> bool:
        """Whether the ranks hold shards of the model (FSDP)."""
        return self.parallelism == "fsdp"


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
    ok = [  # not a checkpointed + sharded trial (the sharding effect's)
        t for t in trials
        if t.checkpointing and t.parallelism is None and t.status == "ok" and t.peak_mem_bytes is not None
    ]  # fmt: skip
    if not ok:
        return None
    b = np.array([t.local_batch for t in ok], float)
    n = [t.n_workers for t in ok]
    lengths = None if memory.sequence_length is None else [t.sequence_length or memory.sequence_length for t in ok]
    peaks = np.array([t.peak_mem_bytes for t in ok], float)
    # the plain line without its activations: what the checkpointed one adds its own to
    plain = memory.without_ddp_phase()  # N >= 2 as CheckpointingEffect.memory predicts it: the buckets
    base = np.asarray(plain.predict_peak_bytes(b, n, lengths), float) - memory.activation_bytes_per_sample * b
    if len(np.unique(b)) >= 2:
        slope, intercept = np.polyfit(b, peaks - base, 1)
        activation, delta = float(slope), float(intercept)
    else:
        activation, delta = float(np.mean((peaks - base) / b)), 0.0
    activation = max(activation, 0.0)
    timed = [t for t in ok if t.t_compute_s]
    factor = 1.0
    if timed:
        m = np.array([min(t.n_workers, world_shape(t)[0]) for t in timed], float)
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


def fit_sharding_effect(
    memory: MemoryModel, perf: PerfModel, trials: Sequence[Trial], checkpointing: CheckpointingEffect | None = None
) -> ShardingEffect | None:
    """The effect of FSDP from the profile's sharded trials (``parallelism`` ``fsdp``) against the
    DDP ``memory`` and ``perf`` fitted to the others (:class:`ShardingEffect` says what and why);
    with ``checkpointing`` (the checkpointed step's effect) and a checkpointed + sharded trial, what that
    trial's peak adds to the two effects composed (:attr:`ShardingEffect.checkpointed_offset_bytes`).
    ``None`` where no sharded trial ran."""
    ok = [
        t for t in trials
        if t.parallelism == "fsdp" and not t.checkpointing and t.status == "ok" and t.peak_mem_bytes is not None
        and t.n_workers >= 2  # a one-rank fully_shard is no point of the line in 1/N (sharding_configs)
    ]  # fmt: skip
    if not ok:
        return None
    n_min = min(t.n_workers for t in ok)
    phase_bytes, phase_per_sample, floor = _small_batch_phase([t for t in ok if t.n_workers == n_min])
    smallest = min(t.local_batch for t in ok if t.n_workers == n_min)
    line = [t for t in ok if not (floor and t.n_workers == n_min and t.local_batch == smallest)]  # the others
    b = np.array([t.local_batch for t in line], float)
    n = np.array([t.n_workers for t in line], float)
    lengths = None if memory.sequence_length is None else [t.sequence_length or memory.sequence_length for t in line]
    state = memory.param_bytes + memory.grad_bytes + memory.optimizer_state_bytes
    # the DDP line's static part and activations, no buckets, no small-batch phase, nothing divided: each peak
    # less it is gather - divided * (1 - 1/N), a line in 1/N
    whole = replace(
        memory, sharded=True, sharded_gather_bytes=0, sharded_divided_bytes=0, ddp_bucket_bytes=0, update_peak_bytes=0,
        ddp_floor_bytes=0, ddp_phase_bytes=0, ddp_phase_bytes_per_sample=0.0,
    )  # fmt: skip
    left = np.array([t.peak_mem_bytes for t in line], float) - np.asarray(
        whole.predict_peak_bytes(b, n, lengths), float
    )
    sizes = sorted({int(x) for x in n})
    # the per-sample change, where the trials at one size span two batches: FSDP's peak grows by fewer bytes
    # per sample than DDP's line at small batches (ShardingEffect: measured), so the line through the trials
    spans = any(len({int(x) for x in b[n == size]}) >= 2 for size in sizes)
    divided: int | None = None
    delta = 0.0
    if len(sizes) >= 2:  # two cluster sizes: which bytes divide by N, measured
        columns = [np.ones_like(b), -(1.0 - 1.0 / n), *([b] if spans else [])]
        coef = np.linalg.lstsq(np.stack(columns, axis=1), left, rcond=None)[0]
        if coef[1] > 0:  # below 0: the host's noise; the whole state assumed divided
            divided = int(round(float(coef[1])))
            gather, delta = float(coef[0]), float(coef[2]) if spans else 0.0
    if divided is None:
        held = left + state * (1.0 - 1.0 / n)  # gather + delta * b
        if spans:
            gather, delta = (
                float(c) for c in np.linalg.lstsq(np.stack([np.ones_like(b), b], axis=1), held, rcond=None)[0]
            )
        else:
            gather = float(np.median(held))
    delta = max(delta, -float(memory.activation_bytes_per_sample))
    timed = [t for t in ok if t.t_step_s and t.n_workers == n_min]  # the sync at n_workers (ShardingEffect.perf)
    sync = 0.0
    gather_s: float | None = None
    if timed:
        m = np.array([min(t.n_workers, world_shape(t)[0]) for t in timed], float)
        nt = np.array([t.n_workers for t in timed], float)
        lt = None if perf.sequence_length is None else [t.sequence_length or perf.sequence_length for t in timed]
        own = np.asarray(perf.t_compute_s(np.array([t.local_batch for t in timed], float), m, lt), float)
        compute = perf.combine_s(own, 0.0, nt)
        measured = np.array([t.t_step_s for t in timed], float)
        sync = max(0.0, float(np.median(measured - np.asarray(compute, float))))  # below 0: the host's noise
        # the compute-only steps (every pass under no_sync) still all-gather: their excess over DDP's compute
        # is the part of the sync every micro-batch pays (ShardingEffect: gather_s)
        gathered = [(c, x) for t, x in zip(timed, own) if (c := t.t_compute_s)]
        if gathered:
            excess = float(np.median([c - x for c, x in gathered]))
            gather_s = min(max(excess, 0.0), sync)
    effect = ShardingEffect(
        gather_bytes=int(round(gather)),
        sync_s=sync,
        n_workers=int(n_min),
        state_bytes=int(state),
        trials=len(ok),
        divided_bytes=divided,
        other_n_workers=sizes[1] if len(sizes) >= 2 else None,
        gather_s=gather_s,
        bytes_per_sample_delta=int(round(delta)),
        activation_bytes_per_sample=memory.activation_bytes_per_sample if round(delta) else None,
        small_batch_bytes=phase_bytes,
        small_batch_bytes_per_sample=phase_per_sample,
        small_batch_floor_bytes=floor,
    )
    return effect if checkpointing is None else _with_checkpointed_offset(effect, memory, checkpointing, trials)


def _small_batch_phase(trials: Sequence[Trial]) -> tuple[int, float, int]:
    """FSDP's small-batch phase from the sharded ``trials`` at one cluster size where they ran three batches
    or more (:func:`tula.engine.profile.sharding_configs`: half the smaller of the line's two): the line
    through the two smallest batches' peaks (bytes at b = 0, bytes per sample) and the smallest's peak, a
    floor below it; (0, 0.0, 0) with fewer."""
    small = sorted({t.local_batch for t in trials})
    if len(small) < 3:
        return 0, 0.0, 0
    b1, b2 = small[:2]
    p1, p2 = (max(t.peak_mem_bytes or 0 for t in trials if t.local_batch == b) for b in (b1, b2))
    per_sample = max(0.0, (p2 - p1) / (b2 - b1))
    return int(math.ceil(p1 - per_sample * b1)), per_sample, int(p1)


def _with_checkpointed_offset(
    effect: ShardingEffect, memory: MemoryModel, checkpointing: CheckpointingEffect, trials: Sequence[Trial]
) -> ShardingEffect:
    """``effect`` with what the checkpointed + sharded trials' peaks add to the two effects composed
    (:attr:`ShardingEffect.checkpointed_offset_bytes`, the median); unchanged without such a trial."""
    both = [
        t for t in trials
        if t.parallelism == "fsdp" and t.checkpointing and t.status == "ok" and t.peak_mem_bytes is not None
        and t.n_workers >= 2
    ]  # fmt: skip
    if not both:
        return effect
    composed = effect.memory(checkpointing.memory(memory), checkpointed=True)
    at = composed.predict_peak_bytes(
        np.array([t.local_batch for t in both]), np.array([t.n_workers for t in both]),
        None if memory.sequence_length is None else [t.sequence_length or memory.sequence_length for t in both],
    )  # fmt: skip
    offset = float(np.median(np.array([t.peak_mem_bytes for t in both], float) - np.asarray(at, float)))
    return replace(effect, checkpointed_offset_bytes=int(round(offset)))


def run_variants(spec: JobSpec, models: ModelsRecord) -> list[RunVariant]:
    """The variants the plan weighs: the spec's own (checkpointing ``on``: checkpointed; ``off``:
    plain; parallelism ``ddp`` or ``fsdp``), or, with ``auto``, both where the profile measured the
    other (the models record's ``checkpointing``, ``sharding``), crossed; ``train.parallelism: auto``
    with what FSDP cannot train (:func:`parallelism_auto_note`): DDP only."""
    mode = spec.train.checkpointing
    checkpointed = [mode == "on"] if mode != "auto" else [False, True] if models.checkpointing else [False]
    how = spec.train.parallelism
    if how != "auto":
        parallelisms = [how]
    else:
        parallelisms = ["ddp", "fsdp"] if models.sharding and fsdp_obstacle(spec) is None else ["ddp"]
    return [RunVariant(checkpointing=c, parallelism=p) for p in parallelisms for c in checkpointed]


def parallelism_auto_note(spec: JobSpec, models: ModelsRecord) -> str:
    """With ``train.parallelism: auto`` planned DDP only, why, in one clause for the plan's reason
    (FSDP cannot train this spec, or the profile measured no sharded step); "" otherwise."""
    if spec.train.parallelism != "auto":
        return ""
    obstacle = fsdp_obstacle(spec)
    if obstacle is not None:
        return f"train.parallelism auto planned ddp only: {obstacle}"
    if not models.sharding:
        return (
            "train.parallelism auto planned ddp only: the profile has no sharded trial (it needs a cluster size of "
            "two or more that ran)"
        )
    return ""


def variant_models(models: ModelsRecord, variant: RunVariant) -> ModelsRecord:
    """The models record a row of ``variant`` is predicted from: ``models`` itself for the
    variant the profile measured at every trial; for the checkpointed or the sharded variant of
    an ``auto`` spec, its memory and performance models with :class:`CheckpointingEffect` and
    :class:`ShardingEffect` applied (checkpointing first: it changes the activations, sharding the
    state), the spec's ``auto`` made the variant's, and no plain out-of-memory batch (the plain
    step's limit is not the other variant's: the memory model's is).  The sharded variant plans
    cluster sizes of two or more only (on one rank there is nothing to shard)."""
    spec = models.spec
    checkpointing_auto = spec.train.checkpointing == "auto"
    parallelism_auto = spec.train.parallelism == "auto"
    if not checkpointing_auto and not parallelism_auto:
        return models
    train: dict[str, Any] = {}
    if checkpointing_auto:
        train["checkpointing"] = "on" if variant.checkpointing else "off"
    if parallelism_auto:
        train["parallelism"] = variant.parallelism
    spec_fields: dict[str, Any] = {"train": spec.train.model_copy(update=train)}
    update: dict[str, Any] = {}
    memory, perf = models.memory, models.perf
    changed = False
    if checkpointing_auto and variant.checkpointing:
        assert models.checkpointing is not None  # run_variants offers it only where measured
        memory, perf, changed = models.checkpointing.memory(memory), models.checkpointing.perf(perf), True
    if parallelism_auto and variant.sharded:
        assert models.sharding is not None  # run_variants offers it only where measured
        checkpointed = checkpointing_auto and variant.checkpointing  # the effects composed, and what the trial adds
        memory, perf, changed = models.sharding.memory(memory, checkpointed), models.sharding.perf(perf), True
        sizes = [n for n in spec.search.cluster_sizes if n >= 2]
        if sizes:
            spec_fields["search"] = spec.search.model_copy(update={"cluster_sizes": sizes})
    update["spec"] = spec_with(spec, **spec_fields)  # checked again as a whole spec
    if changed:
        update.update(memory=memory, perf=perf, oom_local_batch=None)
    return models.model_copy(update=update)


def models_as_trained(models: dict, train: TrainSpec) -> dict:
    """The models record (its JSON) of the variant a run trains (``train``: the training spec's, its
    ``auto`` made the plan's choice by :func:`tula.core.job_rules.training_spec`): where the
    profile's spec left the choice to the planner and the run trains the checkpointed or the
    sharded variant, :func:`variant_models` of it, so that planning while training
    (:class:`tula.core.live_plan.Ranker`, which training's schedule and out-of-memory fallback
    rank with: :func:`tula.engine.train.train`) prices the step that runs, not DDP's plain one;
    ``models`` itself otherwise."""
    given = (models.get("spec") or {}).get("train") or {}
    if given.get("checkpointing", "off") != "auto" and given.get("parallelism", "ddp") != "auto":
        return models
    record = ModelsRecord.from_dict(models)
    variant = RunVariant(checkpointing=train.checkpointing == "on", parallelism=train.parallelism)
    if variant not in run_variants(record.spec, record):
        return models  # a variant the profile did not measure (auto without its trials): the record as fitted
    return variant_models(record, variant).to_json_dict()
