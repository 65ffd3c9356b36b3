"""What a run variant changes in the fitted models (#44), as small parameter records: their own
module so that the models record (:mod:`tula.core.records`) holds them typed while
:mod:`tula.core.variants`, which fits and applies them, reads the records (it re-exports them).

Numpy only: no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import PerfModel, link_bytes

#: the all-gathers' share of FSDP's per-step sync where the record has no fitted split: two all-gathers of
#: the parameters (forward, backward) and one reduce-scatter of the gradients, the same bytes each
ASSUMED_GATHER_SHARE = 2.0 / 3.0


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
            plain.without_ddp_phase(),  # N >= 2: the buckets (the plain step's small-batch phase not measured here)
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


@dataclass(frozen=True)
class ShardingEffect:
    """What FSDP (``fully_shard`` per block, then the root) changes, fitted to the sharded trials
    against the DDP models at the same (N, b, L).  Bytes, seconds.

    Memory: a rank of N holds ``(param + grad + optimizer state) / N`` of the model's state (the
    memory model's own bytes, divided), the buffers and the workspaces as under DDP (no DDP buckets),
    the activations as under DDP (``b * bytes_per_sample(L)``), and the gathered blocks' working set
    (``gather_bytes``: a block's parameters all-gathered for its forward and backward, its whole
    gradients before they are reduce-scattered, FSDP's own buffers).  That working set is what is
    left of the sharded trials' measured peaks after the sharded state and the activations: the
    median over the trials (it may be negative where FSDP frees more than the model says).
    Measured (tiny_gpt 4 x 64, CPU, fitted at N = 2, b = 4 and 32): the fitted peaks within 4.2 %; at
    N = 4, -1.8 % at b = 32 but -12 % at b = 8 (the DDP line's intercept beyond the state is not divided).

    Time: an additive per-step term, ``sync_s`` -- the sharded trials' step time less the DDP
    model's compute at the same (b, N) (its ``rho`` slowdown included), the median over the
    trials, never below 0.  Additive, not a factor on the compute: what FSDP adds per step is its
    all-gathers (forward and backward) and reduce-scatters, whose bytes are the parameters'
    whatever the batch, and which a rank waits for before each block (not overlapped with the
    backward as DDP's bucketed all-reduce is, so added, not combined under ``gamma``).  It was
    measured at one N (``n_workers``); at other N it is scaled as the fitted collective's bytes
    per link (a ring's ``2 (N - 1) / N * S``), so the sharded step's sync is ``sync_s *
    link_bytes(N) / link_bytes(n_workers)``, 0 at N = 1.

    With accumulation (k > 1) the step runs its first k - 1 micro-batches under
    :meth:`tula.engine.fsdp.Sharded.no_sync` (``set_requires_gradient_sync(False)``: no
    reduce-scatter, the whole gradients kept), but the blocks still reshard after their forward and
    backward, so every micro-batch all-gathers each block's parameters twice; the gradients are
    reduce-scattered once, at the last.  The sync therefore has two parts: ``gather_s``, what each
    micro-batch pays (the all-gathers), and ``sync_s - gather_s``, once per step (the reduce-scatter,
    and what more the synchronised micro-batch costs).  They are told apart by the profile's own
    timings: a sharded trial's compute-only steps (``train_step(sync=False)``, every pass under
    ``no_sync``) still all-gather, so its ``t_compute_s`` less the DDP model's compute at the same
    (b, N, L) is the all-gathers (the median over the trials at ``n_workers``, within 0 and
    ``sync_s``).  The sharded step of k micro-batches is then ``(k - 1) (compute + gather_s) +
    compute (1 + rho) + sync_s`` (:attr:`~tula.core.perfmodel.PerfModel.sync_share_per_micro_batch`,
    both parts scaled over N alike: a ring all-gather and reduce-scatter each move (N - 1) / N of
    the bytes per link).  A record fitted before the split (``gather_s`` ``None``) assumes the
    all-gathers' share of the bytes: two all-gathers of the parameters and one reduce-scatter of
    the gradients, the same bytes each, 2/3 of the sync.  Measured (tiny_gpt 4 x 64, L = 32,
    AdamW, gloo, 2 ranks, a shared 2-core CPU at load 2-7): the fitted share 0.52 and 0.65 in two
    profiles; in one world, 25 interleaved steps each of k = 1, k = 1 without sync and k = 2 at
    b = 32, the k = 2 step from that world's parts was within -3.3 % and +4.2 % of the measured one
    with the all-gathers per micro-batch, -13.9 % and -24.5 % with the sync once per step (+13.5 %
    and -1.4 % at load 7).

    Which static bytes divide by N is measured where the sharded trials ran at two cluster sizes
    (:func:`tula.engine.profile.sharding_configs`: the smallest N >= 2's two largest batches (and half
    the smaller) and one batch at the next N >= 2 that ran; not N = 1, whose one-rank ``fully_shard`` is no point of
    the line): what is left of each peak after the DDP line's static part and activations is
    ``gather_bytes - divided_bytes * (1 - 1/N)``, a line in 1/N whose slope is ``divided_bytes``
    (the state a rank holds 1/N of) and whose value at 1/N = 1 is ``gather_bytes`` (what no N
    divides).  Measured (tiny_gpt 4 x 64, AdamW, CPU, fitted at N = 2 and 4): 3.30 MB of the
    3.76 MB state divided (an earlier measurement: from N = 2 to N = 4 the peak drops by
    (parameters + optimiser state) / 4, not by the gradients' share too).  With one size measured,
    ``divided_bytes`` is ``None`` and the whole state is assumed divided.

    Small local batches.  FSDP's peak is not DDP's line less a constant: it is the larger of two lines,
    and at small batches it sits at another point of the backward, with fewer bytes per sample and
    more static bytes.  Measured (a script not kept in the repository, 2026-11-29: bench/transformer_plan's
    tiny_gpt 2 x 64, AdamW, gloo, 2 ranks, MemTracker after the optimiser's first step, b 2-32 at L = 24
    and 32): a rank's peak is ``max(1.014 MB + 11,840 B * b * L, 1.546 MB + 9,528 B * b * L)``, the second
    line above the first below about 230 tokens a rank; DDP's peaks at N = 2 have the same two slopes
    (its intercepts 0.68 MB and 0.78 MB higher), so the DDP line, fitted at the larger batches, is
    itself low there.  Run 4's 16.2 % miss (N = 2, B = 12, L = 24: 2.78 MiB measured, 2.33 predicted)
    had a second cause: the profile's sharded world measured its first trial (b = 4) at the optimiser's
    first step, whose AdamW state (1/N of it, 565 kB) did not exist yet at the backward's peak (2,200,584
    bytes measured there, 2,765,952 after one step; :meth:`tula.engine.profile._Worker.trial` now measures
    after an update).  The fit takes the line through the sharded trials at each size: where they span two
    batches, ``bytes_per_sample_delta`` (their per-sample growth less DDP's, least squares with the
    terms above), which the sharded model adds to the activations per sample (scaled by the
    activations of the line it is applied to over ``activation_bytes_per_sample``, the DDP model's it
    was fitted against, so a checkpointed line keeps its share).  A chord of the two lines: on the
    run-4 profile with its b = 4 peak as measured after one step, the held-out FSDP points within
    +0.7 %, +1.5 %, +0.8 % and +5.0 % (b = 6 at L = 48), checkpointed + FSDP -1.9 %; the script's
    peaks at L = 32 from b = 4 to 32 within 5.0 % (high between the fitted batches), at b = 2 6.1 % low.
    Below the smaller batch the chord falls under the small-batch line, so the profile runs a third
    sharded trial at half the smaller local batch (:func:`tula.engine.profile.sharding_configs`; one trial
    more in the sharded world), and the fit takes the small-batch phase as the line through the two
    smallest (``small_batch_bytes``, ``small_batch_bytes_per_sample``: the sharded model's N >= 2 phase,
    :meth:`~tula.core.memory_model.MemoryModel.ddp_phase_peak_bytes`), the smallest's peak a floor below it,
    and the chord through the other two.  Each line through two peaks of a convex curve lies above it
    between them, so the sharded peak is not predicted low from the smallest sharded batch to the
    largest.  Measured (engineer I's script, 2026-11-29: the 2-rank worlds of
    :func:`tula.engine.profile.profile_world`, 13 (b, L) from b 1 to 32 and L 16 to 48, fitted on run 4's
    profile, its sharded trials at b 2, 4 and 32): FSDP's peaks from -13.9 % (b = 1), -8.4 % (b = 2,
    L = 24) and -6.9 % (b = 4, L = 16) with the chord alone to never low (0.0 % to +5.0 %, median 0.8 %;
    +12.2 % at b = 1 and +7.6 % at b = 2, L = 24, the floor's, which is per sample, not per token).  The
    phase is measured at the smallest N >= 2; at a larger N (a rank holds less of the state) it is high.

    Checkpointed and sharded (both ``auto``s).  The effects are measured apart (checkpointing at the
    smallest N, sharding at N >= 2) and composed -- the checkpointed activations, then the sharded state --
    but checkpointing moves the peak to another point of the step (its recomputed block, in the backward),
    where FSDP holds other bytes: measured (the script, 13 (b, L) at N = 2), the composition predicted every
    checkpointed + sharded peak low, -1.5 % to -5.0 %.  Such a peak less the one-rank checkpointed line is
    nearly a constant (-324 to -398 kB from b 1 to 32 at L 32), so the profile runs one
    checkpointed + sharded trial (:func:`tula.engine.profile.combined_configs`: the sharded world's largest
    batch at its size, in a world of its own: 3.7 and 3.9 s at bench/transformer_plan's fit settings, load
    3-4, beside 6-9 s of the sharded world, to which the third sharded trial added 0-2 s; the profile took 12
    trials, not 10) and the checkpointed sharded model adds what it measured beyond the composition
    (``checkpointed_offset_bytes``; the small-batch phase, the plain step's, is left out): every one of the 13
    peaks never low, 0.0 % to +5.5 % (median 4.4 %; high at small batches, where the scaled chord's slope is
    below the checkpointed one), and the stored grid's N = 2, B = 40, L = 48 row +0.7 % (-1.9 % composed).

    Accumulation's memory.  Under ``no_sync`` every micro-batch's backward leaves the whole gradients
    unsharded on each rank until the last one reduce-scatters them, so a step of k > 1 micro-batches
    peaks above the micro-batch's own step by the whole ``grad_bytes`` (not ``(1 - 1/N)`` of them):
    measured (the script, L = 24, 2 ranks) 565,248 + 3,072 bytes at micro-batches of 10 and 16, and
    498 kB at micro-batches of 2 and 6 (the small-batch line's point already holds part of them);
    :meth:`~tula.core.memory_model.MemoryModel.predict_accumulated_peak_bytes` adds ``grad_bytes``.

    gather_bytes : the gathered blocks' working set, fitted (with ``divided_bytes``: what no N divides)
    sync_s : the per-step all-gather and reduce-scatter time at ``n_workers``, fitted
    n_workers : the smallest cluster size of two or more the sharded trials ran at
    state_bytes : the parameters', gradients' and optimiser state's bytes the DDP memory model holds
        (divided by N under FSDP where ``divided_bytes`` is ``None``)
    trials : how many sharded trials it was fitted to
    divided_bytes : the static bytes a rank of N holds 1/N of, fitted over two cluster sizes
        (``None``: one size measured; ``state_bytes`` assumed)
    other_n_workers : the second cluster size the sharded trials ran at (``None``: one)
    gather_s : the all-gathers' part of ``sync_s``, paid at every micro-batch, fitted (``None``: a
        record from before the split; :data:`ASSUMED_GATHER_SHARE` of ``sync_s`` assumed)
    bytes_per_sample_delta : the sharded peak's bytes per sample less the DDP line's, fitted where the
        sharded trials at one size span two batches (0: not measured, or a record from before it)
    activation_bytes_per_sample : the DDP model's activations per sample the delta was fitted against
        (``None`` with no delta)
    small_batch_bytes, small_batch_bytes_per_sample : the small-batch phase's line (a rank's peak at
        ``n_workers``, at the DDP model's length), through the two smallest sharded batches
    small_batch_floor_bytes : the peak at the smallest sharded batch, a floor below it (0: the phase not
        measured: fewer than three sharded batches at ``n_workers``, or a record from before it)
    checkpointed_offset_bytes : what the checkpointed + sharded trial's peak adds to the checkpointing effect
        and this one composed, fitted (``None``: no such trial; the composition alone)
    """

    gather_bytes: int
    sync_s: float
    n_workers: int
    state_bytes: int
    trials: int
    divided_bytes: int | None = None
    other_n_workers: int | None = None
    gather_s: float | None = None
    bytes_per_sample_delta: int = 0
    activation_bytes_per_sample: int | None = None
    small_batch_bytes: int = 0
    small_batch_bytes_per_sample: float = 0.0
    small_batch_floor_bytes: int = 0
    checkpointed_offset_bytes: int | None = None

    @property
    def gather_share(self) -> float:
        """The share of the per-step sync every micro-batch pays (its all-gathers), in [0, 1]."""
        if self.gather_s is None:
            return ASSUMED_GATHER_SHARE
        return min(1.0, max(0.0, self.gather_s / self.sync_s)) if self.sync_s > 0 else 0.0

    def memory(self, plain: MemoryModel, checkpointed: bool = False) -> MemoryModel:
        """``plain`` (DDP's) sharded: its state divided by N in a world of N
        (:meth:`~tula.core.memory_model.MemoryModel.world_bytes`), the gathered working set added,
        no DDP buckets, no optimiser-step floor (the update runs on the shards), and the activations per
        sample changed by the fitted :attr:`bytes_per_sample_delta` (scaled as ``plain``'s activations are to
        those it was fitted against: a checkpointed ``plain`` keeps its share).  Where the sharded trials
        measured the small-batch phase (:attr:`small_batch_floor_bytes`) and ``plain`` is the step it was
        measured on (not ``checkpointed``: :meth:`CheckpointingEffect.memory`'s), that phase, as the memory model's
        N >= 2 phase (:meth:`~tula.core.memory_model.MemoryModel.ddp_phase_peak_bytes`); none otherwise (not
        DDP's).  ``checkpointed``: the checkpointed + sharded trial's :attr:`checkpointed_offset_bytes` added."""
        delta = float(self.bytes_per_sample_delta)
        if delta and self.activation_bytes_per_sample:
            delta *= plain.activation_bytes_per_sample / self.activation_bytes_per_sample
        phase = not checkpointed and self.small_batch_floor_bytes > 0
        offset = (self.checkpointed_offset_bytes or 0) if checkpointed else 0
        return replace(
            plain,
            activation_bytes_per_sample=max(0, int(round(plain.activation_bytes_per_sample + delta))),
            other_static_bytes=plain.other_static_bytes + offset,
            sharded=True,
            sharded_gather_bytes=int(self.gather_bytes),
            sharded_divided_bytes=self.divided_bytes,
            ddp_bucket_bytes=0,
            update_peak_bytes=0,
            ddp_floor_bytes=self.small_batch_floor_bytes if phase else 0,
            ddp_phase_bytes=self.small_batch_bytes if phase else 0,
            ddp_phase_bytes_per_sample=self.small_batch_bytes_per_sample if phase else 0.0,
        )

    def perf(self, plain: PerfModel) -> PerfModel:
        """``plain`` (DDP's) with its sync replaced by the fitted per-step term, scaled over N as
        the collective's bytes per link, added to the compute (``gamma`` 1, no latency term); with
        accumulation its all-gathers' share (:attr:`gather_share`) paid at every micro-batch."""
        at = float(link_bytes(plain.collective, self.n_workers, float(max(plain.grad_bytes, 1))))
        beta = self.sync_s / at if at > 0 else 0.0
        return replace(
            plain,
            alpha=0.0,
            beta=beta,
            alpha_intra=None,
            beta_intra=None,
            gamma=1.0,
            sync_share_per_micro_batch=self.gather_share,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardingEffect:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})  # a one-size record: no divided_bytes
