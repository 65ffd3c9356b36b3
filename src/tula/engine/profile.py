"""Profiler: short real DDP trials at chosen (N, b) configurations.

Each cluster size is one launched world that runs all its trials in turn.  A trial:

1. a *probe* step under ``no_sync()`` (no collective), after which every rank says
   whether it ran out of memory; the ranks agree through one all-reduce, so an OOM is a
   result (``status: oom``) and no rank is left waiting in a collective;
   the first trial of each world that fits then measures the gradient noise scale over
   ``profile.noise_steps`` batches with no update (``noise``: the world's model as made,
   after the probe steps -- the start of training, which the planner's
   ``*_to_accuracy`` objectives need);
2. one synchronised step under the memory tracker: ``peak_mem_bytes``;
3. warm-up steps, then timed rounds: synchronised steps back to back (``t_step``, as
   training runs them), then as many ``no_sync`` steps (``t_compute``), so both see about
   the same machine noise; the exposed sync time is ``t_step - t_compute``.  Times are the
   per-step maximum over ranks, then the median over steps; another round runs while the
   spread is wide.

The first world also probes the memory model (two small local batches) before its trials,
which bounds the batches to profile.

Every step here runs through :class:`tula.engine.step.TrainStep` (``train.step``'s class), the
object training steps with: the profile times the forward, backward and update training runs.

The model is held as training holds it (:func:`tula.engine.fsdp.wrap_for_world`): DDP, or under
``train.parallelism: fsdp`` FSDP2's shards (:class:`tula.engine.fsdp.Sharded`), so a trial's
``peak_mem_bytes`` and ``t_step`` are those of the sharded step, its all-gathers and
reduce-scatters included.  Under FSDP the compute-only steps (``Sharded.no_sync``:
``set_requires_gradient_sync(False)``) are not free of collectives: each block's parameters are
still all-gathered for its forward and its backward, only the gradients' reduce-scatter is left
out (each rank keeps its whole gradients), so ``t_compute`` holds the all-gathers and
``t_step - t_compute`` is the reduce-scatter's exposed time alone.  The out-of-memory probe is
the synchronised sharded step (:func:`tula.engine.ddp.probe_fits`): a rank that runs out of memory
there fails the world with cause ``oom``, which :meth:`ProfileSession.world_failed` records as the
trial's ``oom`` (smaller batches in a fresh world).  The gradient noise scale is not
measured under FSDP (no rank holds a whole local gradient; ``noise`` is absent, as training refuses
``train.noise_scale`` with fsdp).
"""

from __future__ import annotations

import gc
import math
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from pydantic import TypeAdapter

from tula.core.errors import InfeasibleError, Interrupted, PlacementError, SpecError, TulaError, WorkerError
from tula.core.events import Checked, Event, Note, RankTrialFinished, TrialFinished, TrialsPlanned
from tula.core.gpus import too_many_ranks_sentence, unplaceable_sizes, unplaced_note
from tula.core.job_rules import fsdp_obstacle
from tula.core.noise_scale import NoiseScale
from tula.core.records import (
    PROFILE_KIND,
    VERSIONS,
    AccumulationTrial,
    ProfileRecord,
    RunTrial,
    Trial,
    parse_record,
    placement,
)
from tula.core.space import Config, candidate_configs, partial_configs
from tula.core.spec import DataSpec, JobSpec, data_at_sequence_length, reference_sequence_length
from tula.core.trial import NoiseMeasurement
from tula.engine import interrupts
from tula.engine.batch import batch_bytes, batch_loss, slice_batch
from tula.engine.checkpointing import apply_checkpointing
from tula.engine.data import data_path
from tula.engine.ddp import OneRank, agree_max, probe_fits
from tula.engine.fsdp import Sharded, wrap_for_world
from tula.engine.gpu_knobs import set_backend_knobs, to_memory_format
from tula.engine.launch import Launcher, WorkerContext
from tula.engine.launch.clusters import default_threads, open_launcher
from tula.engine.memory import (
    AddressSpace,
    MemoryModel,
    cap_address_space,
    measure_phase_peaks,
    measure_step_peak_bytes,
    probe_memory_model,
    with_address_space_overhead,
)
from tula.engine.precision import Precision, check_precision
from tula.engine.run_trial import RankRunTrial, RunTrialNotRun, merge_run_trials, run_trial
from tula.engine.sequence_lengths import check_sequence_lengths
from tula.engine.step import TrainStep, step_class
from tula.engine.workloads import (
    build_loss,
    build_model,
    build_optimizer,
    check_workload,
    load_dataset,
)

MAX_SPREAD = 0.15  # (p75 - p25) / median of step times above which another timed round runs
MAX_ROUNDS = 3
DATA_SHARE_NOTE = 0.1  # a trial whose wait for data is at least this share of its step says so
FINISHED = ("ok", "oom", "skipped")  # trial statuses a resumed profile does not run again

#: a configuration a profile runs: (N, B) at the data's own sequence length, or (N, B, L) at another
ConfigTuple = tuple[int, int] | tuple[int, int, int]


class ProfileFailed(WorkerError):
    """A worker failed mid-profile; ``record`` holds every trial finished before it (the
    typed record, what the caller saves)."""

    def __init__(
        self,
        message: str,
        rank: int | None = None,
        details: str = "",
        record: ProfileRecord | None = None,
        cause: str = "crash",
    ):
        super().__init__(message, rank=rank, details=details, cause=cause)
        self.record = record


class ProfileInterrupted(Interrupted):
    """SIGINT/SIGTERM stopped profiling; ``record`` holds every trial finished before it (the
    typed record)."""

    def __init__(self, message: str, signum: int, record: ProfileRecord | None):
        super().__init__(message, signum)
        self.record = record


# --------------------------------------------------------------------------- inside a rank
@dataclass(frozen=True)
class MemoryProbe:
    """What the first world's memory probe found (or a resumed record kept): the memory model,
    the largest local batch it allows within the budget (``None``: no budget) and every
    configuration (N, B) the search chose."""

    memory: MemoryModel
    max_local_batch: int | None
    configs: tuple[ConfigTuple, ...]


@dataclass(frozen=True)
class AccumulationTiming:
    """A rank's step times of a batch it ran as ``accumulation_steps`` micro-batches
    (:meth:`_Worker.accumulation_trial`)."""

    local_batch: int
    micro_batch: int
    accumulation_steps: int
    step_times_s: list[float]


@dataclass(frozen=True)
class RankProfile:
    """One rank's result of a profiling world (:func:`profile_world`), as it comes back to the
    caller: its trials in order of batch; the first world's memory probe (``probe``); the
    address-space cap it ran under; the signal that stopped it (``interrupted``; the trials
    not run are left out); its accumulated-step timing and its run trial
    (:func:`tula.engine.run_trial.run_trial`'s figures)."""

    rank: int
    trials: tuple[Trial, ...]
    probe: MemoryProbe | None = None
    address_space_cap_bytes: int | None = None
    interrupted: int | None = None
    accumulation: AccumulationTiming | None = None
    run_trial: RankRunTrial | RunTrialNotRun | None = None


class _Worker:
    """One rank's model, optimiser and data for a world of trials."""

    def __init__(self, ctx: WorkerContext, spec: JobSpec):
        self.ctx, self.spec = ctx, spec
        torch.manual_seed(spec.seed)
        # L_ref: the data's own sequence length, which every trial records where the data has one
        self.ref_length = trial_sequence_length(spec)
        self.data = load_dataset(data_at_length(spec, None), spec.seed, spec.search.memory_budget_bytes)
        self.ref_data = self.data
        self.length_data: dict[int, Any] = {}  # the data set built at each other length a trial ran at
        set_backend_knobs(spec.train)  # TF32, cuDNN's autotuner: profiled as trained
        model = to_memory_format(build_model(spec.model).to(ctx.device), spec.train)
        apply_checkpointing(model, spec.train, spec.model.name)  # profiled as trained
        self.ddp: Any = wrap_for_world(model, ctx.device, spec.train)  # DDP or FSDP shards: profiled as trained
        self.optimizer = build_optimizer(model, spec)  # the module DDP or the shards hold
        self.loss_fn = build_loss(spec.train.loss, ctx.device)
        self.prec = Precision(spec.train.precision, ctx.device)  # profiled as trained
        # the step training runs (train.step: the user's subclass), with the plain optimiser for the method's
        self.stepper: TrainStep = step_class(spec)(self.ddp, self.loss_fn, self.prec, optimizer=self.optimizer)
        self.gen = torch.Generator().manual_seed(spec.seed * 1000 + ctx.rank)
        self.batches: Any = None  # random batches of local batch self.batches_b through the data path
        self.batches_b = 0
        self.data_waits: list[float] = []
        self.x: Any = None  # the loaded batch: tensors, or a dict batch and None (tula.engine.batch)
        self.y: Any = None

    @property
    def sample_bytes(self) -> int:
        x, y = self.data.batch(1, torch.Generator().manual_seed(0))
        return batch_bytes(x) + batch_bytes(y)

    def use_length(self, sequence_length: int | None) -> None:
        """The next batches from the data set built at ``sequence_length`` (``None``: the data's
        own length), built once."""
        if sequence_length is None or sequence_length == self.ref_length:
            data = self.ref_data
        else:
            if sequence_length not in self.length_data:
                spec = self.spec
                self.length_data[sequence_length] = load_dataset(
                    data_at_length(spec, sequence_length), spec.seed, spec.search.memory_budget_bytes
                )
            data = self.length_data[sequence_length]
        if data is not self.data:
            self.data, self.batches, self.batches_b = data, None, 0

    def at_own_length(self, trials: Sequence[Trial]) -> list[Trial]:
        """The ``trials`` at the data's own length; the next batches from it."""
        self.use_length(None)
        return [t for t in trials if t.sequence_length == self.ref_length]

    def close(self) -> None:
        """The data sets' prefetching threads and loaders' workers closed."""
        for data in (self.ref_data, *self.length_data.values()):
            data.close()

    def load_batch(self, local_batch: int) -> None:
        """The next random batch through the data path training uses (DataLoader workers
        prefetching for sets read from disk)."""
        if self.batches is None or self.batches_b != local_batch:
            self.batches = data_path(self.data, self.ctx.device).random_batches(local_batch, self.gen)
            self.batches_b = local_batch
        self.x, self.y = next(self.batches)

    def forward_backward(self, sync: bool = True) -> None:
        """The loaded batch's passes as training runs them (:meth:`TrainStep.forward_backward`)."""
        assert self.x is not None
        self.stepper.forward_backward(self.x, self.y, sync=sync)

    def update(self) -> None:
        """The update after :meth:`forward_backward` (:meth:`TrainStep.optimizer_step`); the
        gradients freed."""
        assert self.x is not None
        self.stepper.optimizer_step(0, self.x, self.y)
        self._after_step()

    def _after_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def step(self, sync: bool = True) -> None:
        """One step of the loaded batch, the one training runs (:meth:`TrainStep.train_step`);
        ``sync=False``: without gradient synchronisation."""
        assert self.x is not None
        self.stepper.train_step((self.x, self.y), sync=sync)
        self._after_step()

    def accumulated_step(self, k: int) -> None:
        """One step of the loaded batch as ``k`` micro-batches, as training accumulates
        (:meth:`TrainStep.forward_backward`): the first k - 1 passes under ``no_sync``, each loss
        divided by k."""
        self.stepper.accumulation_steps = k
        try:
            self.step(True)
        finally:
            self.stepper.accumulation_steps = 1

    def accumulation_trial(self, local_batch: int, k: int, timed: int) -> AccumulationTiming:
        """Step times of ``local_batch`` per rank as ``k`` accumulated micro-batches (a
        batch an ordinary trial already ran, so it fits): what the planner's accumulation
        model is checked against."""
        self.load_batch(local_batch)
        self.accumulated_step(k)  # warm-up
        times = []
        for _ in range(timed):
            t0 = time.perf_counter()
            self.load_batch(local_batch)
            self.accumulated_step(k)
            times.append(time.perf_counter() - t0)
        self.release()
        return AccumulationTiming(local_batch, local_batch // k, k, times)

    def timed(self, sync: bool) -> float:
        """One step with the wait for its batch included, as training runs it."""
        t0 = time.perf_counter()
        self.load_batch(self.batches_b)
        t1 = time.perf_counter()
        self.step(sync)
        self.data_waits.append(t1 - t0)
        return time.perf_counter() - t0

    def agree_max(self, value: float) -> float:
        return agree_max(value, self.ctx.device)

    def release(self) -> None:
        self.x = self.y = None
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def measure_peak(self) -> int:
        return measure_step_peak_bytes(lambda: self.step(True), self.ddp.module, self.optimizer, self.ctx.device)

    def measure_noise(self, local_batch: int, steps: int) -> NoiseMeasurement | None:
        """The gradient noise scale's pair over ``steps`` fresh batches, with no update
        (:class:`tula.core.noise_scale.NoiseScale`): with N >= 2 ranks each rank's local gradient
        (``local_batch`` samples; squared norms averaged over the ranks) against their mean
        (``N * local_batch``); with one rank the first half of the batch against all of it.
        Per batch the unbiased estimates of |G|^2 and tr(Sigma); under fp16 a batch whose
        gradients overflowed is left out.  ``None`` when one rank has a batch of one."""
        n, b = self.ctx.world_size, local_batch
        if (n == 1 and b < 2) or isinstance(self.ddp, Sharded):  # FSDP: no rank holds a whole local gradient
            return None
        module = self.ddp.module
        params = [p for p in module.parameters() if p.requires_grad]
        scale = self.prec.loss_scale()
        t0 = time.perf_counter()

        def grads(x: Any, y: Any) -> list[torch.Tensor]:
            with self.prec.autocast():
                loss = batch_loss(module, self.loss_fn, x, y)
            gs = torch.autograd.grad(loss * scale if scale else loss, params, allow_unused=True)
            return [torch.zeros_like(p) if g is None else (g / scale if scale else g) for g, p in zip(gs, params)]

        def sq(gs: list[torch.Tensor]) -> torch.Tensor:
            return sum(torch.linalg.vector_norm(g, dtype=torch.float64).square() for g in gs)

        g2s: list[float] = []
        traces: list[float] = []
        b_small, b_big = (b, n * b) if n > 1 else (b // 2, b)
        for _ in range(steps):
            self.load_batch(b)
            assert self.x is not None
            if n > 1:
                local = grads(self.x, self.y)
                flat = torch.cat([g.reshape(-1) for g in local])
                pair = torch.stack([sq(local), torch.zeros((), dtype=torch.float64, device=flat.device)])
                dist.all_reduce(flat)
                flat /= n
                pair[1] = torch.linalg.vector_norm(flat, dtype=torch.float64).square()
                dist.all_reduce(pair[:1])
                small_sq, big_sq = float(pair[0]) / n, float(pair[1])
            else:
                small_sq = float(sq(grads(slice_batch(self.x, 0, b // 2), slice_batch(self.y, 0, b // 2))))
                big_sq = float(sq(grads(self.x, self.y)))
            if not (math.isfinite(small_sq) and math.isfinite(big_sq)):
                continue
            g2, tr = NoiseScale.estimates(small_sq, big_sq, b_small, b_big)
            g2s.append(float(g2))
            traces.append(float(tr))
        mean_g2 = sum(g2s) / len(g2s) if g2s else math.nan
        mean_tr = sum(traces) / len(traces) if traces else math.nan
        return NoiseMeasurement(
            b_small=b_small,
            b_big=b_big,
            steps=len(g2s),
            g2=g2s,
            trace_sigma=traces,
            b_simple=mean_tr / mean_g2 if g2s and mean_g2 > 0 else None,
            seconds=time.perf_counter() - t0,
        )

    def probe_memory(self, local_batches: tuple[int, int]) -> MemoryModel:
        """One untracked step (creates the optimiser state), then probe steps with their
        forward/backward and their optimiser update tracked separately
        (:func:`tula.engine.memory.probe_memory_model`).  Every rank runs the same probes (the
        steps are synchronised; the decision to probe further uses rank 0's peaks)."""
        self.load_batch(local_batches[0])
        self.step(True)
        sb = self.sample_bytes

        def measure(b: int) -> tuple[int, int]:
            self.load_batch(b)
            fb, up = measure_phase_peaks(
                self.forward_backward, self.update, self.ddp.module, self.optimizer, self.ctx.device
            )
            self.release()
            # the data batch is created outside the tracked steps: add its bytes back; the
            # ranks agree on the peaks so that every rank takes the same probing decisions
            return int(self.agree_max(fb + sb * b)), int(self.agree_max(up + sb * b))

        mm = probe_memory_model(
            measure,
            self.ddp.module,
            self.optimizer,
            sb,
            local_batches,
            self.ctx.device,
            max_batch=self.data.train_size,
            resident_data_bytes=data_path(self.data, self.ctx.device).resident_bytes,
        )
        # DDP's buckets hold the gradients (gradient_as_bucket_view); FSDP has none
        buckets = 0 if isinstance(self.ddp, Sharded) else mm.grad_bytes
        if buckets and not isinstance(self.ddp, OneRank):  # a DDP world: its peaks hold the buckets, the line not
            mm = replace(
                mm,
                other_static_bytes=mm.other_static_bytes - buckets,
                probe_peak_bytes=(mm.probe_peak_bytes[0] - buckets, mm.probe_peak_bytes[1] - buckets),
            )
        return replace(mm, precision=self.spec.train.precision, ddp_bucket_bytes=buckets)

    def trial(self, cfg: Config, warmup: int, timed: int, noise_steps: int = 0, min_timed_s: float = 0.0) -> Trial:
        """Time one configuration; ``noise_steps`` > 0: first measure the gradient noise
        scale there (:meth:`measure_noise`).  A round times ``timed`` steps with sync, then
        as many without, or more where steps are short, so that a round lasts about
        ``min_timed_s`` (:func:`timed_pairs`)."""
        b = cfg.local_batch

        def probe(sync: bool) -> None:  # DDP: without synchronisation; FSDP: the synchronised step (probe_fits)
            self.load_batch(b)
            self.step(sync=sync)  # an update too: the optimiser's state exists before the peak is measured

        fits, note = probe_fits(probe, self.ctx.device, self.ctx.rank, self.ddp)
        if not fits:
            self.release()
            return Trial(n_workers=cfg.n_workers, local_batch=b, global_batch=cfg.global_batch, status="oom", note=note)
        noise = self.measure_noise(b, noise_steps) if noise_steps > 0 else None
        peak = self.measure_peak()
        for _ in range(warmup):
            t0 = time.perf_counter()
            self.step(True)
            t_warm = time.perf_counter() - t0
        timed = timed_pairs(timed, min_timed_s, self.agree_max(t_warm))  # the same count on every rank
        steps: list[float] = []
        comps: list[float] = []
        self.data_waits = []
        for _ in range(MAX_ROUNDS):
            # the synchronised steps back to back, as training runs them, then the compute-only ones:
            # at N = 2 on 2 shared cores a synchronised step that followed a compute-only one ran
            # 15-30 % faster than one that followed another synchronised step (#26, measured 2026-11-26)
            steps += [self.timed(True) for _ in range(timed)]
            comps += [self.timed(False) for _ in range(timed)]
            spread = self.agree_max(_spread(steps[-timed:]))
            if spread <= MAX_SPREAD:
                break
        self.release()
        return Trial(
            n_workers=cfg.n_workers,
            local_batch=b,
            global_batch=cfg.global_batch,
            status="ok",
            peak_mem_bytes=peak,
            step_times_s=steps,
            compute_times_s=comps,
            timed_steps=len(steps),
            t_data_s=statistics.median(self.data_waits),
            noise=noise,
        )


def timed_pairs(timed: int, min_timed_s: float, step_s: float) -> int:
    """Pairs of steps a timed round runs: ``timed``, or as many as take about ``min_timed_s``
    at ``step_s`` a step (the last warm-up step, the slowest rank's), at most 100.  On a shared
    host the short steps of a small batch vary most; a handful of them is a few tens of
    milliseconds, a sample of the host's noise rather than of the step."""
    if step_s <= 0.0:
        return timed
    return max(timed, min(100, math.ceil(min_timed_s / (2.0 * step_s))))


def _spread(xs: list[float]) -> float:
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / max(statistics.median(xs), 1e-12)


def select_configs(
    spec: JobSpec, search: str, dataset_size: int, mm: MemoryModel, budget_bytes: int | None, on_gpu: bool = False
) -> tuple[int | None, list[Config]]:
    """The memory bound on the local batch and the configurations a search profiles (the
    partial search's middle batch: ``search.partial_middle_batch``, by default on a GPU)."""
    b_max = mm.max_local_batch(budget_bytes, spec.search.memory_safety)
    if search != "partial":
        return b_max, candidate_configs(spec.search, dataset_size, b_max)
    middle = spec.search.partial_middle_batch
    return b_max, partial_configs(spec.search, dataset_size, b_max, on_gpu if middle is None else middle)


def length_configs(spec: JobSpec, chosen: Sequence[Config], b_max: int | None) -> list[tuple[int, int, int]]:
    """The configurations (N, B, L) at the other lengths of ``search.sequence_lengths``: the
    fewest runs that separate the memory and compute terms in B*L and B*L^2 from the batch's
    line, which the ``chosen`` configurations fit at the data's own length L_ref (its static
    part and ``c0`` do not depend on L) -- one trial per other length, on the smallest cluster
    size at its largest chosen local batch (the most bytes and seconds per sample to measure),
    above L_ref scaled down by L_ref / L where the memory bound ``b_max`` would not hold it.
    Two lengths besides L_ref are what the L^2 terms need.

    Why no second batch at another length (which would identify a static part or ``c0`` that
    depends on L): measured (2026-11-29, tiny_gpt 2 layers of width 64 on ``text``, AdamW, one rank,
    this module's full search: b 8, 12, 16, 24, 32, 48, 64 at each L of 16, 24, 32, 48, 64, twice),
    the peak is exactly ``1,696,000 + 8 * L + b * 11,840 * L`` bytes at all 70 points: the intercept
    grows by 8 bytes per token of L (0.015 % of it from L 32 to 64), the bytes per sample by 11,840
    per token, with no L^2 term.  One trial per other length at the largest batch recovers that
    (11,840.1 bytes per token; the other 31 (b, L) peaks within 0.9 %, median 0.2 %); a second batch
    at L 16 or at L 64 left the max at 0.66 % / 0.96 %.  ``c0`` per length (14 points each, load 5-13
    on 2 cores, repeats 64 % apart in the median) was 12 +- 3, 4 +- 7, -6 +- 8, 13 +- 11 and -2 +- 15
    ms: no dependence on L distinguishable from the timing's noise, which one more batch could not
    resolve either.  So a profile over ``[16, 32, 64]`` runs the same two trials at other lengths as
    before (six plain trials with cluster sizes [1, 2], four with [1])."""
    lengths, ref = spec.search.sequence_lengths or [], reference_sequence_length(spec.data)
    others = [n for n in lengths if n != ref]
    if not others or not chosen or ref is None:
        return []
    n0 = min(c.n_workers for c in chosen)
    b_top = max(c.local_batch for c in chosen if c.n_workers == n0)
    out = []
    for length in others:
        b = b_top
        if b_max is not None and length > ref:
            b = max(1, min(b, b_max * ref // length))
        out.append((n0, n0 * b, length))
    return out


def checkpointing_configs(trials: Sequence[Trial]) -> list[ConfigTuple]:
    """The configurations (N, B) ``train.checkpointing: auto`` measures checkpointed: the fewest
    that give its memory and time effect -- the smallest cluster size's two largest local batches
    that ran plain at the data's own length (a line: bytes per sample and compute per sample),
    below the batch that ran out of memory; none where fewer than two ran."""
    ok = [t for t in trials if t.status == "ok" and not t.checkpointing and t.parallelism is None]
    if not ok:
        return []
    n0 = min(t.n_workers for t in ok)
    ref = [t for t in ok if t.n_workers == n0 and t.sequence_length == ok[0].sequence_length]
    batches = sorted({t.global_batch for t in ref})[-2:]
    return [(n0, b) for b in batches] if len(batches) == 2 else []


def sharding_configs(trials: Sequence[Trial]) -> list[ConfigTuple]:
    """The configurations (N, B) ``train.parallelism: auto`` measures sharded (FSDP): the fewest that
    give its memory and sync effect -- the smallest cluster size of two ranks or more that ran, its
    two largest local batches that ran under DDP at the data's own length (below the batch that ran
    out of memory) and half the smaller of them (where that is a sample or more: the small-batch
    phase, :class:`tula.core.effects.ShardingEffect`), and one batch at a second cluster size of two or
    more where one ran (of its local batches that ran, the nearest to the first size's largest), so that
    the fit measures which bytes
    divide by N (:func:`tula.core.variants.fit_sharding_effect`); none where no size of two or more
    ran two batches."""
    plain = [t for t in trials if t.status == "ok" and not t.checkpointing and t.parallelism is None]
    ok = [t for t in plain if t.n_workers >= 2]
    if not ok:
        return []
    n0 = min(t.n_workers for t in ok)
    length = ok[0].sequence_length
    ref = [t for t in ok if t.n_workers == n0 and t.sequence_length == length]
    batches = sorted({t.global_batch for t in ref})[-2:]
    if len(batches) != 2:
        return []
    configs: list[ConfigTuple] = [(n0, b) for b in batches]
    # and half the smaller local batch: FSDP's small-batch phase (ShardingEffect: the larger of two lines; the
    # chord through the two alone predicted up to 8 % low below the smaller)
    half = batches[0] // n0 // 2
    if half >= 1:
        configs.insert(0, (n0, n0 * half))
    # not one rank: fully_shard there is no point of the 1/N line (measured, tiny_gpt 4 x 64, AdamW: its
    # peak 1.7 MB below DDP's at b = 128, where N = 2's is 1.3 MB below at b = 64 -- a fit through it divided
    # 1.1 MB of the 3.8 MB state and missed N = 4's peaks by up to +16 %)
    second = min((t.n_workers for t in ok if t.n_workers > n0 and t.sequence_length == length), default=None)
    if second is not None:
        ran = sorted({t.local_batch for t in plain if t.n_workers == second and t.sequence_length == length})
        top = batches[-1] // n0  # the nearest local batch to it (in ratio; a tie: the smaller, less extrapolated)
        local = min(ran, key=lambda b: abs(math.log(b / top)))
        configs.append((second, second * local))
    return configs


def combined_configs(trials: Sequence[Trial]) -> list[ConfigTuple]:
    """The configuration (N, B) both ``auto``s measure checkpointed and sharded: the sharded variant's
    largest batch at its smallest cluster size (:func:`sharding_configs`), one trial -- the two effects,
    measured apart (checkpointing at the smallest N, sharding at N >= 2), compose to a peak that sits
    elsewhere in the step (:class:`tula.core.effects.ShardingEffect`: measured); none without sharded ones."""
    configs = sharding_configs(trials)
    if not configs:
        return []
    n0 = configs[0][0]
    return [(n0, max(c[1] for c in configs if c[0] == n0))]


def trial_sequence_length(spec: JobSpec) -> int | None:
    """The sequence length a trial at the data's own length records: ``text``'s, or a factory's
    where lengths are planned over (it is then given one); ``None`` for data without one."""
    if spec.data.name == "text" or spec.search.sequence_lengths:
        return reference_sequence_length(spec.data)
    return None


def data_at_length(spec: JobSpec, sequence_length: int | None) -> DataSpec:
    """``spec``'s data set at ``sequence_length`` (``None``: its own length): ``text``'s
    ``sequence_length``, a factory's ``sequence_length`` keyword (given whenever lengths are
    planned over, so that every trial's length is known); the data as given otherwise."""
    data = spec.data
    if sequence_length is None:
        if data.name != "factory" or not spec.search.sequence_lengths:
            return data
        sequence_length = reference_sequence_length(data)
        if sequence_length is None:
            return data
    return data_at_sequence_length(data, sequence_length)


def profile_world(
    ctx: WorkerContext,
    spec_dict: dict,
    configs: list[ConfigTuple] | None,
    mem_cap_bytes: int | None,
    search: str,
    budget_bytes: int | None,
    oom_local_batch: int | None = None,
    checkpointed: bool = False,
    sharded: bool = False,
) -> RankProfile:
    """Run in every rank of one world: the trials of ``configs`` ((n_workers, global_batch)
    pairs of this world's size) in order of batch.

    With ``configs=None`` (the first world) the memory model is probed first, the search
    space is bounded with it, and this world runs the configurations of its own size.
    Local batches at or above ``oom_local_batch`` (one already ran out of memory) are
    skipped.  After each trial the ranks agree whether to stop (SIGINT/SIGTERM); then
    ``interrupted`` holds the signal number and the trials not run are left out.

    ``checkpointed``: the world of ``train.checkpointing: auto``'s checkpointed variant
    (:func:`checkpointing_configs`): its trials with the blocks checkpointed and marked so,
    without the noise scale, the accumulation check and the run trial.  ``sharded``: likewise the
    world of ``train.parallelism: auto``'s sharded variant (:func:`sharding_configs`), FSDP's."""
    spec = _world_spec(spec_dict, checkpointed, sharded)
    w = _Worker(ctx, spec)
    set_up = AddressSpace.now() if mem_cap_bytes is not None and ctx.device.type == "cpu" else None
    trials: list[Trial] = []
    probe: MemoryProbe | None = None
    cap_bytes: int | None = None
    interrupted: int | None = None
    accumulation: AccumulationTiming | None = None
    stop = ctx.stop
    if configs is None:
        mm = w.probe_memory(spec.profile.memory_probe_batches)
        if set_up is not None:  # under the cap, the budget also holds what tensors do not show
            mm = with_address_space_overhead(mm, set_up)
        b_max, chosen = select_configs(spec, search, w.data.train_size, mm, budget_bytes, ctx.device.type == "cuda")
        probe = MemoryProbe(mm, b_max, (*_pairs(chosen), *length_configs(spec, chosen, b_max)))
        if ctx.rank == 0:  # the event crosses the process boundary as JSON's values
            ctx.emit(
                TrialsPlanned(
                    total=len(probe.configs), memory=mm.to_dict(), max_local_batch=b_max, configs=probe.configs
                )
            )
        configs = [c for c in probe.configs if c[0] == ctx.world_size]
    if mem_cap_bytes is not None and ctx.device.type == "cpu":
        cap_bytes = cap_address_space(mem_cap_bytes, since=set_up)
    oom_at = oom_local_batch
    # at the first trial that runs: the model is as the world made it
    noise_steps = 0 if checkpointed or sharded else spec.profile.noise_steps  # a variant's world: its trials only
    # the trials at the data's own length in order of batch, then those at the other lengths
    for i, (n, big_b, length) in enumerate(_in_run_order(configs)):
        if stop is not None and stop.agree():
            interrupted = stop.signum or signal.SIGINT
            break
        cfg = Config(n, big_b)
        if length is None and oom_at is not None and cfg.local_batch >= oom_at:
            t = Trial(
                n, cfg.local_batch, big_b, "skipped", note=f"not run: local batch {oom_at} already ran out of memory"
            )
        else:  # at another length: its own trial (no noise, no out-of-memory threshold of the data's own length)
            w.use_length(length)
            noise = noise_steps if length is None else 0
            t = w.trial(cfg, spec.profile.warmup_steps, spec.profile.timed_steps, noise, spec.profile.min_timed_s)
            if length is None and t.status == "ok":
                noise_steps = 0
            if length is None and t.status == "oom":
                oom_at = cfg.local_batch if oom_at is None else min(oom_at, cfg.local_batch)
        t = replace(  # where this rank ran it, and how it met the others, at which length
            t,
            sequence_length=w.ref_length if length is None else length,
            checkpointing=True if checkpointed else None,
            parallelism="fsdp" if sharded else None,
            hosts=[ctx.host],
            devices=[_device_name(ctx.device)],
            interfaces=[ctx.interface],
            interface_sources=[ctx.interface_source],
            local_ranks=[ctx.local_rank],
        )
        trials.append(t)
        # kept if the world dies later (the event is pickled across the launcher's queue)
        ctx.emit(RankTrialFinished(rank=ctx.rank, trial=t))
        if ctx.rank == 0:
            ctx.emit(TrialFinished(n_workers=n, global_batch=big_b, status=t.status, index=i))
    at_ref = w.at_own_length(trials)  # the checks below at the data's own length
    ok = [t.local_batch for t in at_ref if t.status == "ok" and t.local_batch % 2 == 0]
    if spec.search.max_accumulation_steps > 1 and ok and interrupted is None and not (checkpointed or sharded):
        # the planner may accumulate: one check of its step model, at k = 2 on the largest batch run
        accumulation = w.accumulation_trial(max(ok), 2, spec.profile.timed_steps)
    if interrupted is None and stop is not None and stop.agree():
        interrupted = stop.signum or signal.SIGINT
    # the trainer's own step and epoch end (tula.engine.run_trial)
    run_trial_figures = (
        _run_trial(ctx, spec, [t for t in at_ref if t.status == "ok"], w)
        if interrupted is None and not (checkpointed or sharded)
        else None
    )
    w.close()  # the prefetching threads and the loaders' workers
    return RankProfile(ctx.rank, tuple(trials), probe, cap_bytes, interrupted, accumulation, run_trial_figures)


def _world_spec(spec_dict: dict, checkpointed: bool, sharded: bool = False) -> JobSpec:
    """The spec a world's ranks run: the job's, with the blocks checkpointed in the world of
    ``train.checkpointing: auto``'s checkpointed variant, sharded (fsdp) in the world of
    ``train.parallelism: auto``'s sharded variant, and DDP in the other worlds of ``auto``."""
    spec = JobSpec.model_validate(spec_dict)
    update: dict[str, str] = {}
    if checkpointed:
        update["checkpointing"] = "on"
    if spec.train.parallelism == "auto":
        update["parallelism"] = "fsdp" if sharded else "ddp"
    if not update:
        return spec
    return spec.model_copy(update={"train": spec.train.model_copy(update=update)})


def _config_tuple(config: Sequence[Any]) -> ConfigTuple:
    """A configuration as a record or an event holds it ((N, B) or (N, B, L)), as integers."""
    if len(config) > 2:
        return int(config[0]), int(config[1]), int(config[2])
    return int(config[0]), int(config[1])


def _pairs(configs: Sequence[Config]) -> list[tuple[int, int]]:
    """(N, B) of each configuration."""
    return [(c.n_workers, c.global_batch) for c in configs]


def _in_run_order(configs: Sequence[Sequence[int]]) -> list[tuple[int, int, int | None]]:
    """A world's configurations as (N, B, L) in its order of trials (:func:`_run_order`), L
    ``None`` at the data's own length."""
    return [(c[0], c[1], c[2] if len(c) > 2 else None) for c in sorted(configs, key=_run_order)]


def _run_order(config: Sequence[int]) -> tuple[bool, int]:
    """A world's order of trials: those at the data's own length by batch, then the others."""
    return len(config) > 2, config[1]


def _run_trial(
    ctx: WorkerContext, spec: JobSpec, done: list[Trial], w: _Worker
) -> RankRunTrial | RunTrialNotRun | None:
    """The run trial of this world (:mod:`tula.engine.run_trial`), beside ``w``'s plain steps,
    at the smallest global batch the method can train at on this world that is at least the
    smallest one profiled here and at most the largest (so it fits in memory); ``None`` when
    no trial ran here, a ``skipped`` record saying why when the method cannot train within them."""
    from tula.core.job_rules import check_method, smallest_batch_for

    if not done:
        return None
    n, method = ctx.world_size, spec.train.method
    lo, hi = min(t.global_batch for t in done), max(t.global_batch for t in done)
    big_b = max(lo, smallest_batch_for(method, spec, n))
    big_b = -(-big_b // n) * n  # a whole local batch per rank
    why = (
        f"method {method!r} trains at a global batch of at least {big_b} on {n} worker(s), above the largest "
        f"profiled here ({hi})"
        if big_b > hi
        else ""
    )
    if not why:
        try:
            check_method(method, spec, n, big_b)
        except TulaError as err:
            why = str(err)
    if why:
        return RunTrialNotRun(n, method, "skipped", note=why)

    def plain(b: int = big_b // n) -> None:
        w.load_batch(b)
        w.step(True)

    return run_trial(ctx, spec, big_b, spec.profile.timed_steps, spec.profile.min_timed_s, plain)


# --------------------------------------------------------------------------- in the caller
def _world_trials(rank_results: list[RankProfile]) -> list[Trial]:
    """A world's trials from its ranks' results: per step the slowest rank sets the pace; then
    the median over steps (:func:`merge_trials`)."""
    return merge_trials([list(r.trials) for r in rank_results])


def _merge_ranks(rank_results: list[RankProfile]) -> list[dict]:
    """:func:`_world_trials` as JSON's values (a record's ``trials``)."""
    return [asdict(t) for t in _world_trials(rank_results)]


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"


def _merge_trials(rank_trials: list[list[dict]]) -> list[dict]:
    """:func:`merge_trials` of trials as dicts, as JSON's values."""
    return [asdict(t) for t in merge_trials([[Trial(**t) for t in trials] for trials in rank_trials])]


def merge_trials(rank_trials: list[list[Trial]]) -> list[Trial]:
    """One trial per configuration from every rank's (``rank_trials[rank][i]``): where each
    rank ran (in rank order); for an ``ok`` trial per step the slowest rank, then the medians,
    the largest peak and the slowest wait for data (with a note when the loader is a
    bottleneck); for an ``oom`` trial the rank's note that says where memory ran out."""
    merged = []
    for per_rank in zip(*rank_trials):
        first = per_rank[0]
        hosts = [h for r in per_rank for h in r.hosts]  # in rank order
        t = replace(
            first,
            hosts=hosts,
            devices=[d for r in per_rank for d in r.devices],
            interfaces=[v for r in per_rank for v in r.interfaces],
            interface_sources=[v for r in per_rank for v in r.interface_sources],
            local_ranks=[v for r in per_rank for v in r.local_ranks],
            ranks_per_host=max(Counter(hosts).values()) if hosts else None,
        )
        if t.status == "ok":
            steps = [max(xs) for xs in zip(*(r.step_times_s for r in per_rank))]
            comps = [max(xs) for xs in zip(*(r.compute_times_s for r in per_rank))]
            t_step_s, t_compute_s = statistics.median(steps), statistics.median(comps)
            t = replace(
                t,
                step_times_s=steps,
                compute_times_s=comps,
                t_step_s=t_step_s,
                t_compute_s=t_compute_s,
                t_sync_s=max(t_step_s - t_compute_s, 0.0),
                t_step_spread=_spread(steps),
                peak_mem_bytes=max(r.peak_mem_bytes for r in per_rank if r.peak_mem_bytes is not None),
            )
            if first.t_data_s is not None:  # the slowest rank's median wait for its batch
                t_data_s = max(r.t_data_s for r in per_rank if r.t_data_s is not None)
                share = t_data_s / max(t_step_s, 1e-12)
                note = (
                    f"data loading is {100 * share:.0f} % of the step: the loader is a bottleneck "
                    "(more data.loader_workers, or faster storage, would help)"
                    if share >= DATA_SHARE_NOTE
                    else t.note
                )
                t = replace(t, t_data_s=t_data_s, note=note)
        elif t.status == "oom":
            t = replace(t, note=next((r.note for r in per_rank if r.note.startswith("out of memory on rank")), t.note))
        merged.append(t)
    return merged


def _oom_threshold(trials: list[Trial]) -> int | None:
    bad = [t.local_batch for t in trials if t.status == "oom"]
    return min(bad) if bad else None


def profile(
    spec: JobSpec,
    search: str = "partial",
    launcher: Launcher | None = None,
    on_event: Callable[[Event], None] | None = None,
    previous: dict | ProfileRecord | None = None,
    on_snapshot: Callable[[ProfileRecord], None] | None = None,
) -> ProfileRecord:
    """Profile ``spec`` (``search`` = ``full`` | ``partial``); return the typed, frozen profile
    record (:class:`~tula.core.records.ProfileRecord`, its trials :class:`~tula.core.records.Trial`;
    ``.to_json_dict()`` is what ``profile.json`` holds).

    ``previous`` is a partial profile record of the same spec (interrupted or failed):
    its memory model and configuration list are reused and its finished trials are kept,
    so only the rest run.  ``on_event`` receives :class:`~tula.core.events.Checked` once the model, data,
    loss and workers passed the checks made before any world starts (a failing check raises
    before it), :class:`~tula.core.events.TrialsPlanned` once the trials are known and
    :class:`~tula.core.events.TrialFinished` after each trial; ``on_snapshot`` the record so far
    (``in_progress``) each time a trial has finished on every rank, so that a process killed
    mid-profile loses no finished trial when its caller saved the snapshot.

    A failed world raises :class:`ProfileFailed`, SIGINT/SIGTERM :class:`ProfileInterrupted`;
    both carry the record of every trial finished before it."""
    if launcher is None:
        with open_launcher(spec) as opened:
            return _profile(spec, search, opened, on_event, previous, on_snapshot)
    return _profile(spec, search, launcher, on_event, previous, on_snapshot)


def _profile(
    spec: JobSpec,
    search: str,
    launcher: Launcher,
    on_event: Callable[[Event], None] | None,
    previous: dict | ProfileRecord | None,
    on_snapshot: Callable[[ProfileRecord], None] | None = None,
) -> ProfileRecord:
    if search not in ("full", "partial"):
        raise ValueError(f"search must be 'full' or 'partial', not {search!r}")
    session = ProfileSession(spec, search, launcher, on_event, on_snapshot)
    session.check()
    if previous is not None:
        session.resume_from(parse_record(previous, ProfileRecord, "the profile to resume"))
    with interrupts.graceful_signals():
        record = session.run()
        late = interrupts.requested()
    if late:  # the stop came as the last world ended: every trial is kept, and the command still ends as stopped
        raise session.stopped(late)
    return record


class ProfileSession:
    """A profile as its caller runs it (:func:`profile`): the checks before any world, then
    one world per cluster size (:func:`profile_world` on every rank), the first also probing
    the memory model and choosing the configurations, and the record.

    Its steps are methods: :meth:`check` (the workload, the workers, the sizes a launched
    world or the GPUs allow), :meth:`resume_from` (a partial record's memory model and
    finished trials), :meth:`configs_to_run` (the configurations still to run, the ones
    this launcher cannot run recorded as skipped), :meth:`run_world` (one world, its
    failure mapped by :meth:`world_failed`: an out-of-memory is a result, anything else
    :class:`ProfileFailed`), :meth:`merge_world` (the ranks' results joined) and
    :meth:`record` (``profile.json``, also as snapshots while a world runs)."""

    def __init__(
        self,
        spec: JobSpec,
        search: str,
        launcher: Launcher,
        on_event: Callable[[Event], None] | None,
        on_snapshot: Callable[[ProfileRecord], None] | None = None,
    ) -> None:
        self.spec, self.search, self.launcher, self.on_snapshot = spec, search, launcher, on_snapshot
        self.emit: Callable[[Event], None] = on_event or (lambda ev: None)
        self.t_start = time.perf_counter()
        self.streamed: dict[int, list[Trial]] = {}  # rank -> trials of the world now running
        self.accumulation: list[AccumulationTrial] = []  # each world's accumulated step (max_accumulation_steps > 1)
        self.run_trials: list[RunTrial] = []  # each world's run trial (tula.engine.run_trial)
        self.probe: MemoryProbe | None = None  # the memory model, the largest local batch, the configurations
        self.trials: list[Trial] = []
        self.spent_before = 0.0
        self.world_size = 0  # the running world's size
        self.snapped = 0  # its trials already in a snapshot
        self.world_variant = (False, False)  # its variant: (checkpointed, sharded)
        self.not_measured: dict[str, str] = {}  # cluster sizes the launcher cannot place: N -> why
        self.fixed: int | None = None  # a launched world's one size
        self.started_by = "its launcher"

    # ------------------------------------------------------------------ before any world
    def check(self) -> None:
        """What is known and checked before any world: the model and data
        (:func:`check_workload`), the workers' hardware and precision, threads and memory
        budget, the cluster sizes this launcher can run (:meth:`sizes_to_run`); then the
        ``checked`` event."""
        spec = self.spec
        model, data = check_workload(spec)
        check_sequence_lengths(spec, model)  # a length above the model's limit, or for a set without lengths
        self.ref_length = trial_sequence_length(spec)
        self.dataset_size, self.sample_shape = data.train_size, list(data.sample_shape)
        self.facts = self.launcher.facts()  # the workers' hardware, read on a worker
        self.device = self.facts.device
        check_precision(spec.train.precision, self.device)  # fp16 on a CPU: one sentence before any world
        self.threads = self.launcher.threads_per_worker or default_threads(spec)
        budget = spec.search.memory_budget_bytes
        if budget is None and self.device == "cuda":
            budget = self.facts.gpu_memory_bytes
        self.budget = budget
        self.cap = budget if spec.search.enforce_memory_cap else None
        self.sizes = self.sizes_to_run(list(spec.search.cluster_sizes))
        self.emit(Checked())  # the workload and the workers passed every check before a trial
        self.grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        self.param_count = sum(p.numel() for p in model.parameters())
        n_max_trials = len(candidate_configs(spec.search, data.train_size, None)) + len(
            spec.search.sequence_lengths or []
        )
        self.timeout = spec.profile.trial_timeout_s * (n_max_trials + 1)

    def sizes_to_run(self, sizes: list[int]) -> list[int]:
        """The cluster sizes this launcher can run: a launched world (``--cluster env``) only
        its own (it must be one of them), a launcher placing every rank on one host only
        those with a GPU per rank (``not_measured`` says why for the others; none left is a
        :class:`PlacementError`).  Each size left out is said in a note."""
        fixed = self.fixed = self.launcher.world_size
        if fixed is not None:
            self.started_by = getattr(getattr(self.launcher, "world", None), "source", "its launcher")
            if fixed not in sizes:
                raise SpecError(
                    f"this world (started by {self.started_by}) has {fixed} ranks, and search.cluster_sizes "
                    f"{list(sizes)} has no {fixed}: profiling here runs only the trials of N = {fixed}; add it"
                )
            cannot = [n for n in sizes if n != fixed]
            if cannot:
                self.emit(
                    Note(
                        f"N = {', '.join(map(str, cannot))} not profiled: this world (started "
                        f"by {self.started_by}) has {fixed} ranks, and every trial here uses all of them"
                    )
                )
            sizes = [fixed]
        # one rank per GPU: the sizes a launcher placing every rank on one host cannot run
        gpus_per_host = getattr(self.launcher, "gpus_per_host", None)  # None: no GPU limit (CPU, or not one host)
        unplaced = unplaceable_sizes(sizes, gpus_per_host)
        if not unplaced:
            return sizes
        assert gpus_per_host is not None
        placeable = [n for n in sizes if n not in unplaced]
        if not placeable:
            raise PlacementError(
                too_many_ranks_sentence(
                    min(sizes), gpus_per_host, "this machine (the local launcher runs every rank here)"
                )
            )
        unplaced_why = unplaced_note(unplaced, gpus_per_host)
        self.not_measured = {str(n): unplaced_why for n in unplaced}
        self.emit(Note(f"{unplaced_why}: their trials are skipped, and the plan does not rank them"))
        return placeable

    def resume_from(self, previous: ProfileRecord) -> None:
        """Go on from ``previous``, a partial record of the same spec: its memory model and
        configurations, its finished trials (``ok``, ``oom``, ``skipped``: not run again),
        its accumulation and run trials and its time so far; a ``plan`` event says how
        many trials are done."""
        self.probe = MemoryProbe(
            previous.memory, previous.max_local_batch, tuple(_config_tuple(c) for c in previous.configs)
        )
        self.trials = [t for t in previous.trials if t.status in FINISHED]
        self.accumulation = list(previous.accumulation_trials or [])
        self.run_trials = list(previous.run_trials or [])
        self.spent_before = previous.profiling_s
        self.emit(TrialsPlanned(total=len(self.probe.configs), done=len(self.trials)))

    # ------------------------------------------------------------------ the worlds
    def run(self) -> ProfileRecord:
        """The first world (memory probe, configurations, its own trials) unless a previous
        record gave them, then one world per cluster size with trials still to run; the
        record."""
        if self.probe is None:
            # first world: memory probe, search space, then its own trials
            self.run_world(self.sizes[0], None)
        configs = self.configs_to_run()
        # the trials at other sequence lengths (search.sequence_lengths) on the sizes that run
        sizes = {c.n_workers for c in configs}
        at_lengths = [c for c in self._probed().configs if len(c) > 2 and c[0] in sizes]
        done = {self.trial_key(t) for t in self.trials if not t.checkpointing and t.parallelism is None}
        for n in sorted(sizes):
            todo: list[ConfigTuple] = [
                (c.n_workers, c.global_batch)
                for c in configs
                if c.n_workers == n and (c.n_workers, c.global_batch, None) not in done
            ]
            todo += [c for c in at_lengths if c[0] == n and (c[0], c[1], c[2]) not in done]
            if todo:
                self.run_world(n, todo)
        if self.spec.train.checkpointing == "auto":  # the checkpointed variant, at a few trials
            ran = [t for t in self.trials if t.checkpointing and t.parallelism is None]  # not a combined one
            measured = {(t.n_workers, t.global_batch) for t in ran}
            at_own = [t for t in self.trials if t.sequence_length in (None, self.ref_length)]
            todo_checkpointed = [c for c in checkpointing_configs(at_own) if c not in measured]
            if todo_checkpointed:
                self.run_world(todo_checkpointed[0][0], todo_checkpointed, checkpointed=True)
        if self.spec.train.parallelism == "auto" and fsdp_obstacle(self.spec) is None:  # the sharded variant
            ran = [t for t in self.trials if t.parallelism == "fsdp" and not t.checkpointing]
            measured = {(t.n_workers, t.global_batch) for t in ran}
            at_own = [t for t in self.trials if t.sequence_length in (None, self.ref_length)]
            todo_sharded = [c for c in sharding_configs(at_own) if c not in measured]
            for n in dict.fromkeys(c[0] for c in todo_sharded):  # a world per cluster size, the smallest N >= 2 first
                self.run_world(n, [c for c in todo_sharded if c[0] == n], sharded=True)
            if self.spec.train.checkpointing == "auto":  # both auto: the checkpointed step sharded, at one trial
                ran = [t for t in self.trials if t.parallelism == "fsdp" and t.checkpointing]
                combined = {(t.n_workers, t.global_batch) for t in ran}
                todo_both = [c for c in combined_configs(at_own) if (c[0], c[1]) not in combined]
                if todo_both:
                    self.run_world(todo_both[0][0], todo_both, checkpointed=True, sharded=True)
        return self.record()

    def trial_key(self, t: Trial) -> tuple[int, int, int | None]:
        """(N, B, L) of a trial, L ``None`` at the data's own length (its configuration's key)."""
        length = None if t.sequence_length in (None, self.ref_length) else t.sequence_length
        return t.n_workers, t.global_batch, length

    def configs_to_run(self) -> list[Config]:
        """The probed configurations this launcher can run (:class:`InfeasibleError` when the
        memory model left none); those of a size a launched world does not have, or that
        cannot be placed, are recorded as ``skipped`` trials with the reason (and a
        ``trial`` event each)."""
        probe = self._probed()
        configs = [Config(c[0], c[1]) for c in probe.configs if len(c) == 2]
        if not configs:
            budget = self.budget
            raise InfeasibleError(
                f"no configuration fits: the memory model allows a local batch of at most {probe.max_local_batch} "
                f"within the budget of {budget} bytes, below every candidate (min_batch {self.spec.search.min_batch} "
                f"over up to {max(self.sizes)} workers)"
                + (
                    f": {probe.memory.shortfall(budget, self.spec.search.memory_safety)}"
                    if probe.max_local_batch == 0 and budget is not None  # 0 only under a budget
                    else ""
                )
            )
        fixed, not_measured = self.fixed, self.not_measured
        if fixed is not None:  # the configurations this world cannot run, said so in the record
            note = f"not run: this world (started by {self.started_by}) has {fixed} ranks"
            configs = self._skip(configs, lambda c: c.n_workers != fixed, lambda c: note)
        if not_measured:  # the sizes this host cannot place (one rank per GPU), said so in the record
            configs = self._skip(
                configs, lambda c: str(c.n_workers) in not_measured, lambda c: not_measured[str(c.n_workers)]
            )
        return configs

    def _skip(
        self, configs: list[Config], cannot: Callable[[Config], bool], why: Callable[[Config], str]
    ) -> list[Config]:
        """Record the configurations this launcher ``cannot`` run and that have no trial yet as
        ``skipped`` (with ``why``), each with a ``trial`` event; the others."""
        done_now = {(t.n_workers, t.global_batch) for t in self.trials}
        for c in configs:
            if cannot(c) and (c.n_workers, c.global_batch) not in done_now:
                self.trials.append(Trial(c.n_workers, c.local_batch, c.global_batch, "skipped", note=why(c)))
                self.emit(TrialFinished(n_workers=c.n_workers, global_batch=c.global_batch, status="skipped"))
        return [c for c in configs if not cannot(c)]

    def forward(self, rank: int, ev: Event) -> None:
        """A rank's event: a rank's finished trial is kept (and, once every rank has finished
        it, a snapshot of the record with it is given to ``on_snapshot``); the first world's
        ``plan`` is the probe; the others go to ``on_event``."""
        if isinstance(ev, RankTrialFinished):  # a rank's trial as it crossed the process boundary
            self.streamed.setdefault(rank, []).append(replace(ev.trial))  # its own copy (one process: the rank's)
            k = min((len(self.streamed.get(r, [])) for r in range(self.world_size)), default=0)
            if self.on_snapshot is not None and k > self.snapped and self.probe is not None:
                self.snapped = k  # every rank finished trial k: a snapshot with it
                done = merge_trials([self.streamed[r][:k] for r in range(self.world_size)])
                self.on_snapshot(self.record(extra=done, in_progress=True))
            return
        if isinstance(ev, TrialsPlanned) and ev.memory is not None:  # the first world's probe (no budget: no max)
            # the event's values (rank 0's to_dict), checked and converted as the record's memory part is
            memory = TypeAdapter(MemoryModel).validate_python(ev.memory, strict=False)
            self.probe = MemoryProbe(memory, ev.max_local_batch, tuple(_config_tuple(c) for c in ev.configs or ()))
        self.emit(ev)

    def run_world(
        self, n: int, configs: list[ConfigTuple] | None, checkpointed: bool = False, sharded: bool = False
    ) -> None:
        """One world of ``n`` ranks running ``configs`` (``None``: the first world, which
        probes the memory model and chooses them); its trials join the record
        (:meth:`merge_world`), a failed world is :meth:`world_failed`'s.  ``checkpointed``: the
        world of ``train.checkpointing: auto``'s checkpointed variant (:func:`profile_world`);
        ``sharded``: of ``train.parallelism: auto``'s sharded one."""
        self.streamed.clear()
        self.world_size, self.snapped = n, 0
        self.world_variant = (checkpointed, sharded)  # a fresh world after an out-of-memory runs the same variant
        signum = interrupts.requested()
        if signum:
            raise self.stopped(signum)
        oom_at = _oom_threshold(
            [t for t in self.trials if t.n_workers == n and not t.checkpointing and t.parallelism is None]
        )
        try:
            res = self.launcher.run(
                profile_world,
                n,
                self.spec.to_dict(),
                configs,
                self.cap,
                self.search,
                self.budget,
                None if checkpointed or sharded else oom_at,
                checkpointed,
                sharded,
                on_event=self.forward,
                timeout_s=self.timeout,
            )
        except WorkerError as err:
            before = len(self.trials)
            self.world_failed(err, n, configs)
            if checkpointed:  # its trials (and the one that ran out of memory) are the checkpointed variant's
                self.trials[before:] = [replace(t, checkpointing=True) for t in self.trials[before:]]
            if sharded:  # likewise the sharded variant's
                self.trials[before:] = [replace(t, parallelism="fsdp") for t in self.trials[before:]]
            return
        except Interrupted as err:  # stopped before it began (its launcher's world gate: waiting for workers)
            raise self.stopped(err.signum) from None
        self.merge_world(n, res)

    def world_failed(self, err: WorkerError, n: int, configs: list[ConfigTuple] | None) -> None:
        """A world of ``n`` ranks that failed running ``configs``: the trials every rank
        finished are kept; an interruption is :class:`ProfileInterrupted`; an out-of-memory
        after the probe step is that trial's result (:meth:`out_of_memory`), after the world's
        last trial (its accumulated-step check or run trial) the run trial's (``oom``); anything else
        records the trials not run as ``error`` and raises :class:`ProfileFailed` with the
        record (re-raised as it is when nothing was measured yet)."""
        # keep every trial all ranks finished; the one in flight and the rest are not
        done = merge_trials([self.streamed.get(r, []) for r in range(n)]) if len(self.streamed) == n else []
        self.trials.extend(done)
        if err.cause == "interrupted" or interrupts.requested():
            raise self.stopped(interrupts.requested() or signal.SIGINT) from None
        if self.probe is None:
            raise err  # nothing measured yet
        finished = {self.trial_key(t) for t in done}
        todo = sorted(
            (
                tuple(c)
                for c in (configs or [c for c in self.probe.configs if c[0] == n])
                if (c[0], c[1], c[2] if len(c) > 2 else None) not in finished
            ),
            key=_run_order,  # the world's own order
        )
        if err.cause == "oom" and todo:
            self.out_of_memory(err, n, todo)
            return
        if err.cause == "oom" and done:
            # every trial finished: the world ran out of memory after them, in its accumulated-step check or
            # its run trial (FSDP's probes fail their world: tula.engine.ddp.probe_fits); the trials are kept
            note = f"the world ran out of memory after its trials (its accumulated-step check or run trial): {err}"
            self.run_trials.append(RunTrial(n_workers=n, method=self.spec.train.method, status="oom", note=note[:300]))
            return
        for i, c in enumerate(todo):
            note = str(err) if i == 0 else "not run: the world failed earlier"
            self.trials.append(Trial(c[0], c[1] // c[0], c[1], "error", note=note, sequence_length=self.length_of(c)))
        record = self.record(failed=str(err))
        raise ProfileFailed(str(err), rank=err.rank, details=err.details, cause=err.cause, record=record) from None

    def out_of_memory(self, err: WorkerError, n: int, todo: list[tuple[int, ...]]) -> None:
        """A rank of a world of ``n`` ran out of memory after the probe step (a synchronised or
        timed step) at ``todo[0]``, the first trial not finished: that trial is an
        out-of-memory result, those of larger local batches are skipped, and a fresh world
        runs the smaller ones still to do."""
        first, rest = todo[0], todo[1:]
        variant = self.world_variant  # the failed world's (checkpointed, sharded): the fresh one runs it too
        n_oom, b_oom = first[0], first[1]
        b_local = b_oom // n_oom
        self.trials.append(
            Trial(n_oom, b_local, b_oom, "oom", note=str(err)[:300], sequence_length=self.length_of(first))
        )
        if len(first) > 2:  # at another sequence length: says nothing of the others
            if rest:
                self.run_world(n, [tuple(c) for c in rest], *variant)  # type: ignore[misc]  # (N, B) or (N, B, L)
            return
        skipped = f"not run: local batch {b_local} already ran out of memory"
        at_ref = [c for c in rest if len(c) == 2]
        self.trials.extend(
            Trial(c[0], c[1] // c[0], c[1], "skipped", note=skipped, sequence_length=self.ref_length)
            for c in at_ref
            if c[1] // c[0] >= b_local
        )
        smaller: list[ConfigTuple] = [(c[0], c[1]) for c in at_ref if c[1] // c[0] < b_local]
        smaller += [(c[0], c[1], c[2]) for c in rest if len(c) > 2]
        if smaller:
            self.run_world(n, smaller, *variant)

    def length_of(self, config: Sequence[int]) -> int | None:
        """The sequence length a trial of ``config`` ((N, B) or (N, B, L)) records."""
        return config[2] if len(config) > 2 else self.ref_length

    def merge_world(self, n: int, res: list[RankProfile]) -> None:
        """A world's results (one per rank of ``n``) joined: its trials (per step the slowest
        rank), its run trial and accumulated-step check; :class:`ProfileInterrupted` when
        the ranks agreed to stop."""
        self.trials.extend(_world_trials(res))
        run_trials = [r.run_trial for r in res if r.run_trial]
        if len(run_trials) == len(res):  # the trainer's own step and epoch end, slowest rank
            self.run_trials.append(merge_run_trials(run_trials))
        timings = [r.accumulation for r in res if r.accumulation is not None]
        if timings and len(timings) == len(res):  # per step the slowest rank, then the median
            steps = [max(xs) for xs in zip(*(a.step_times_s for a in timings))]
            first = timings[0]
            self.accumulation.append(
                AccumulationTrial(
                    local_batch=first.local_batch,
                    micro_batch=first.micro_batch,
                    accumulation_steps=first.accumulation_steps,
                    step_times_s=steps,
                    n_workers=n,
                    t_step_s=statistics.median(steps),
                )
            )
        if any(r.interrupted is not None for r in res):
            raise self.stopped(res[0].interrupted or signal.SIGINT)

    # ------------------------------------------------------------------ the record
    def stopped(self, signum: int) -> ProfileInterrupted:
        """SIGINT/SIGTERM (``signum``) stopped profiling: the error, with the record so far."""
        name = signal.Signals(signum).name
        if self.probe is None:
            return ProfileInterrupted(
                f"profiling stopped by {name} during the memory probe; nothing was measured yet", signum, None
            )
        n_done = sum(t.status in FINISHED for t in self.trials)
        return ProfileInterrupted(
            f"profiling stopped by {name}: {n_done} of {len(self.probe.configs)} trial(s) finished",
            signum,
            self.record(interrupted=name),
        )

    def _probed(self) -> MemoryProbe:
        """The memory probe's result, which every step after the first world needs."""
        if self.probe is None:
            raise WorkerError("the first profiling world ended without its memory probe's result")
        return self.probe

    def record(
        self,
        failed: str | None = None,
        interrupted: str | None = None,
        extra: Sequence[Trial] = (),
        in_progress: bool = False,
    ) -> ProfileRecord:
        """The profile record (``profile.json``'s, typed): the trials so far (and ``extra``, a
        running world's finished ones) by (N, B), the memory model and configurations, the
        hardware; ``failed``, ``interrupted`` and ``in_progress`` when it is not the whole
        profile.  ``.to_json_dict()`` makes it JSON's values."""
        spec, probe = self.spec, self._probed()
        ordered = sorted(
            [*self.trials, *extra],
            key=lambda t: (
                t.n_workers,
                t.global_batch,
                t.sequence_length or 0,
                bool(t.checkpointing),
                t.parallelism or "",
            ),
        )
        partial: dict[str, Any] = {
            **({"failed": failed} if failed else {}),
            **({"interrupted": interrupted} if interrupted else {}),
            **({"in_progress": True} if in_progress else {}),
        }
        return ProfileRecord(
            kind=PROFILE_KIND,
            version=VERSIONS[PROFILE_KIND],
            spec=spec.to_dict(),
            search=self.search,  # checked by profile(): full or partial
            device=self.device,
            backend="nccl" if self.device == "cuda" else "gloo",
            threads_per_worker=self.threads,
            precision=spec.train.precision,
            memory_budget_bytes=self.budget,
            enforce_memory_cap=spec.search.enforce_memory_cap,
            dataset_size=self.dataset_size,
            sample_shape=self.sample_shape,
            model={"name": spec.model.name, "param_count": self.param_count, "grad_bytes": self.grad_bytes},
            memory=probe.memory,
            max_local_batch=probe.max_local_batch,
            configs=list(probe.configs),
            trials=ordered,
            accumulation_trials=self.accumulation,
            run_trials=self.run_trials,
            placement=placement(ordered),
            launcher=getattr(self.launcher, "name", type(self.launcher).__name__),
            facts=self.facts,  # the hardware it was measured on (a fitted model's key for reuse reads it)
            # cluster sizes the launcher could not place (one rank per GPU): N -> why
            **({"not_measured": self.not_measured} if self.not_measured else {}),
            profiling_s=self.spent_before + time.perf_counter() - self.t_start,
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **partial,
        )
