"""One rank's part of a training world: :func:`train_world` runs on every rank of the world the
caller (:func:`tula.engine.train.train`) launches, :class:`_RankTrainer` holding the rank's pieces:

* data: each epoch is a permutation of the training set seeded by (seed, epoch); step
  ``i`` takes global batch ``i`` of it and rank ``r`` its ``r``-th slice, so a resumed
  run sees exactly the batches an uninterrupted one would;
* before the first step at a batch size, a *probe* forward/backward (:func:`tula.engine.ddp.probe_fits`):
  under DDP under ``no_sync()``, its out-of-memory verdict agreed by all ranks, so that the world
  returns :class:`~tula.engine.rank_messages.OutOfMemory` instead of hanging in a collective; under
  FSDP synchronised, as training runs it, a rank that runs out of memory failing the world with
  cause ``oom`` (which the caller takes as ``OutOfMemory``); BatchNorm statistics are restored and
  the probe's gradients dropped after it;
* after each epoch: evaluation (top-1, and top-5 where there are more than 5 classes) on
  the test split, sharded over the ranks; a checkpoint with a checksum (model, method
  state, RNG, epoch history; :mod:`tula.engine.checkpoint`, the last two kept) written by rank 0;
  the epoch's metrics, with the method's per-step traces, appended to ``metrics.jsonl``;
* a batch schedule's new batch at the same worker count: the world goes on, the method
  rebuilt at the new batch from the state just checkpointed (:func:`_restore`, what a new
  generation does with the checkpoint file), then probed; only a new worker count ends
  the world (:class:`~tula.engine.rank_messages.Resize`) for the caller to start the next generation;
* SIGINT/SIGTERM: the ranks agree to stop at the next step boundary (no new epoch
  starts); the last finished epoch's checkpoint is what is kept.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tula.core.config import Config
from tula.core.errors import SpecError, TulaError
from tula.core.events import EpochFinished, Resized, StepDone, WorldStarted
from tula.core.job_rules import check_train_config, state_from_spec
from tula.core.noise_scale import NoiseScale
from tula.core.records import EpochRecord, ScheduleDecision, read_jsonl, write_atomic
from tula.core.schedules import Caps, ScheduleState, next_config, steps_per_epoch
from tula.core.spec import JobSpec, reference_sequence_length
from tula.engine.batch import slice_batch, to_device
from tula.engine.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from tula.engine.checkpointing import apply_checkpointing
from tula.engine.data import data_path, epoch_order
from tula.engine.ddp import (
    LocalGradNorms,
    OneRank,
    check_shared_directory,
    local_norms_allreduce_hook,
    probe_fits,
    start_together,
    wrap_ddp,
)
from tula.engine.fsdp import full_parameters, gathered, load_shards, prune_shards, save_shards, wrap_for_world
from tula.engine.gpu_knobs import set_backend_knobs, to_memory_format
from tula.engine.launch import WorkerContext
from tula.engine.memory import cap_address_space
from tula.engine.noise_feed import _NoiseScaleFeed
from tula.engine.optim.methods import build_method
from tula.engine.precision import Precision
from tula.engine.rank_checkpoint import RankCheckpoint, epoch_line
from tula.engine.rank_messages import Finished, Interrupted, OutOfMemory, RankResult, Resize, Segment
from tula.engine.step import TrainStep, step_class
from tula.engine.train_checks import check_resumed_precision, check_resumed_sequence_length
from tula.engine.workloads import Dataset, build_loss, build_model, load_dataset

METRICS = "metrics.jsonl"
STEP_TRACES = "step_traces"  # key of an epoch line's per-step method traces (metrics.jsonl only)


def _local_batch(
    data: Dataset, perm: torch.Tensor, step: int, global_batch: int, rank: int, local_batch: int, device: torch.device
) -> tuple[Any, Any]:
    start = step * global_batch + rank * local_batch
    x, y = data.take(perm[start : start + local_batch])
    return to_device(x, device), to_device(y, device)


def param_digest(model: nn.Module) -> str:
    """SHA-1 of every parameter's bytes: equal on two ranks iff their replicas are identical (FSDP's
    shards gathered whole: every rank calls it)."""
    h = hashlib.sha1()
    for p in full_parameters(model):
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _rewrite_metrics(path: Path, upto_epoch: int) -> None:
    """Keep the metrics lines of epochs up to ``upto_epoch`` (drop lines written after the
    checkpoint, if any), so every epoch appears exactly once after a resume."""
    lines = [r for r in read_jsonl(path) if r["epoch"] <= upto_epoch]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in lines))


@dataclass
class ScheduleStart:
    """What a world's ranks start a batch schedule from (``train_world``'s ``schedule``): the
    schedule's state and LR multiplier (``None`` and 1: a resumed run's come from its checkpoint)
    and the caps its choices stay within.  The supervisor lowers the caps between worlds (fewer
    workers given, an out-of-memory fallback)."""

    #: the schedule's state (epoch 0's decision's; a checkpoint keeps it as JSON's values), or None
    state: ScheduleState | dict[str, Any] | None
    #: the LR multiplier the schedule set
    lr_multiplier: float
    #: the workers, local batch and accumulation its choices stay within
    caps: Caps


def _drain_step_traces(method: Any) -> dict[str, list]:
    drain = getattr(method, "drain_step_traces", None)
    return drain() if drain is not None else {}


def ddp_has_comm_hook(ddp: nn.Module) -> bool:
    """Whether a method registered its own DDP comm hook (DDP takes one)."""
    return bool(getattr(ddp, "_comm_hooks", []))


def _restore(
    state: RankCheckpoint | None,
    *,
    model: nn.Module,
    method: Any,
    gns: NoiseScale,
    n_steps: int,
    spec: JobSpec,
    global_batch: int,
    schedule: ScheduleStart | None,
) -> tuple[int, int, list[EpochRecord], ScheduleState | dict | None, float]:
    """Put this rank where the checkpoint ``state`` left the run (``None``: the start),
    with ``method`` just built for this world's batch (``n_steps`` steps per epoch): the
    model, the method's state (its LR rule re-applied at the new batch), the RNG, the
    batch schedule's state and LR multiplier, the noise scale.  What a new generation does
    with the checkpoint file, and a batch change inside a world with the state it has just
    checkpointed: one function, so both give the same numbers.  Returns ``(start_epoch,
    steps_done, history, schedule_state, lr_multiplier)``."""
    start_epoch, steps_done, history = 0, 0, []
    sched_state = schedule.state if schedule else None
    lr_mult = schedule.lr_multiplier if schedule else 1.0
    if state is not None:
        model.load_state_dict(state.model)
        start_epoch, steps_done, history = state.epoch, state.steps_done, list(state.history)
        # the LR schedule's position is counted in epochs: a generation at another batch has
        # another number of steps per epoch
        method.load_state_dict(state.method_state, step=start_epoch * n_steps)
        torch.set_rng_state(state.torch_rng)
        if schedule and state.schedule_state is not None:
            sched_state, lr_mult = state.schedule_state, state.lr_multiplier
        if state.noise_scale:
            gns.load_state_dict(state.noise_scale)
    if schedule:
        if sched_state is None:  # a checkpoint written before the run had a schedule
            sched_state = state_from_spec(spec, global_batch)
        method.set_schedule_lr(lr_mult, start_epoch * n_steps)
    return start_epoch, steps_done, history, sched_state, lr_mult


def _probe(
    data: Dataset,
    spec: JobSpec,
    *,
    epoch: int,
    global_batch: int,
    local_batch: int,
    rank: int,
    device: torch.device,
    model: nn.Module,
    ddp: DDP | OneRank,
    method: Any,
    loss_fn: Callable,
    prec: Precision | None = None,
    micro_batch: int | None = None,
    stepper: TrainStep | None = None,
) -> tuple[bool, str]:
    """Can every rank run a step at this batch?  The forward/backward of the epoch's first batch
    through ``stepper``'s passes (the step training runs; default the built-in one over ``ddp``,
    ``loss_fn`` and ``prec``), as :func:`tula.engine.ddp.probe_fits` runs it: under DDP one pass
    under ``no_sync()`` -- of the first micro-batch (``micro_batch`` samples of the rank's share)
    when the step accumulates, whose activations are what a step holds at once --, the ranks
    agreeing on the verdict; under FSDP synchronised, as training runs it -- when the step
    accumulates its first two micro-batches, the first under ``no_sync()`` (each rank's whole
    gradients kept, as a step holds them) and the second synchronised (which reduces them with
    its own) --, an out-of-memory failing the world.  BatchNorm statistics and the gradients are
    put back as they were (none: the probe's are dropped, so no update takes them)."""
    buffers = [b.detach().clone() for b in model.buffers()]
    passes = stepper if stepper is not None else TrainStep(ddp, loss_fn, prec or Precision("fp32", device))

    def probe_step(sync: bool) -> None:
        x, y = _local_batch(
            data, epoch_order(spec.seed, epoch, data.train_size), 0, global_batch, rank, local_batch, device
        )
        micro_batches = 1
        if micro_batch is not None:
            micro_batches = 2 if sync else 1  # FSDP: an accumulated step's whole gradients, then its reduce-scatter
            x, y = slice_batch(x, 0, micro_batches * micro_batch), slice_batch(y, 0, micro_batches * micro_batch)
        passes.forward_backward(x, y, sync=sync, accumulation_steps=micro_batches)

    fits, note = probe_fits(probe_step, device, rank, ddp)
    method.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)
    return fits, note


def _fresh_ddp(model: nn.Module, device: torch.device, old: list) -> Any | None:
    """A new DDP wrapper of ``model`` in the same process group, for a method that registers
    its own comm hook (a DDP takes one hook, once).  ``old`` holds the wrapper being
    replaced (a one-element list, emptied here): it must be gone first, or its gradient
    hooks would still fire.  ``None`` when it cannot be freed: the caller then ends the
    world instead."""
    import gc
    import weakref

    gone = weakref.ref(old.pop())
    if gone() is not None:
        gc.collect()
    if gone() is not None:
        return None
    return wrap_ddp(model, device)


class _RankTrainer:
    """One rank's part of one world (:func:`train_world`): the job's pieces built once, the
    batch it trains at now, and the steps, records, checkpoints and decisions of its epochs.
    A batch change at the same worker count rebuilds only the method (:meth:`change_batch`)."""

    def __init__(
        self,
        ctx: WorkerContext,
        spec: JobSpec,
        method_name: str,
        out_dir: str,
        fallbacks: list[dict],
        schedule: ScheduleStart | None,
        accumulation_steps: int = 1,
    ) -> None:
        self.ctx, self.spec, self.method_name, self.fallbacks, self.schedule = (
            ctx,
            spec,
            method_name,
            fallbacks,
            schedule,
        )
        self.accum = accumulation_steps  # k: micro-batches per step (a schedule may change it: change_batch)
        self.out = Path(out_dir)
        self.metrics_path = self.out / METRICS
        self.device, self.rank, self.world = ctx.device, ctx.rank, ctx.world_size
        torch.manual_seed(spec.seed)
        self.data = load_dataset(spec.data, spec.seed, spec.search.memory_budget_bytes)
        set_backend_knobs(spec.train)  # TF32, cuDNN's autotuner: as profiled
        self.model = to_memory_format(build_model(spec.model).to(self.device), spec.train)
        apply_checkpointing(self.model, spec.train, spec.model.name)  # before DDP, as profiled
        self.ddp: Any = wrap_for_world(self.model, self.device, spec.train)  # DDP, or FSDP's shards
        self.loss_fn = build_loss(spec.train.loss, self.device)
        self.prec = Precision(spec.train.precision, self.device)
        # the step the profile timed (train.step: the user's subclass), with the method from start_at on
        self.stepper: TrainStep = step_class(spec)(
            self.ddp, self.loss_fn, self.prec, accumulation_steps=accumulation_steps
        )
        self.stepper.on_gradients = self._on_gradients
        self.skipped_steps = 0  # fp16: this epoch's steps whose gradients overflowed
        self.gns = NoiseScale()
        self.own_norms: LocalGradNorms | None = None
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.method: Any = None
        self.segments: list[Segment] = []  # the batches this world trained at
        self.segment_t0 = 0.0  # when the current in-world segment began
        self.epoch_t0 = 0.0  # when the current epoch's steps began (every rank at once: run_epoch)

    # ------------------------------------------------------------------ the batch it trains at
    def start_at(self, global_batch: int, state: RankCheckpoint | None) -> None:
        """Build the method at ``global_batch`` and put this rank where ``state`` (a
        checkpoint, or ``None``: the start) left the run (:func:`_restore`)."""
        self.global_batch, self.local_batch = global_batch, global_batch // self.world
        self.micro_batch = self.local_batch // self.accum  # b: the samples of one forward/backward
        self.n_steps = steps_per_epoch(self.data.train_size, global_batch)
        self.method = build_method(self.method_name, self.ddp, self.spec, global_batch, self.world, self.n_steps)
        self.stepper.ddp, self.stepper.accumulation_steps = self.ddp, self.accum  # change_batch may renew both
        self.stepper.use_method(self.method)
        if (
            self.own_norms is None
            and self.spec.train.noise_scale
            and self.world > 1
            and not ddp_has_comm_hook(self.ddp)
        ):
            # each rank's gradient norm before the all-reduce, from a comm hook (AdaScale has its own)
            self.own_norms = LocalGradNorms(self.params, self.device)
            self.ddp.register_comm_hook(self.own_norms, local_norms_allreduce_hook)
        self.gns_feed = _NoiseScaleFeed(self.gns, self.own_norms, self.world)
        if state is not None:  # FSDP: the shards read into the model and the optimiser (DCP)
            state = load_shards(self.ddp, self.method.optimizer, self.out, state)
        self.start_epoch, self.steps_done, self.history, self.sched_state, self.lr_mult = _restore(
            state,
            model=self.model,
            method=self.method,
            gns=self.gns,
            n_steps=self.n_steps,
            spec=self.spec,
            global_batch=global_batch,
            schedule=self.schedule,
        )
        if state is not None:
            self.prec.load_state_dict(state.precision)  # fp16: the scaler's scale and counters
        self.report_every = max(1, self.n_steps // 25)

    def resized(self, epoch: int, nxt: Config) -> Resize:
        """The world ends after ``epoch`` for the next generation at ``nxt``."""
        return Resize(
            config=self.now(), segments=self.segments, epochs_done=epoch + 1, steps_done=self.steps_done, next=nxt
        )

    def interrupted(self, epochs_done: int, steps_done: int, signum: int | None) -> Interrupted:
        """The world ends because the ranks agreed to stop after ``epochs_done`` epochs."""
        return Interrupted(
            config=self.now(), segments=self.segments, epochs_done=epochs_done, steps_done=steps_done, signum=signum
        )

    def end_segment(self) -> None:
        """The wall time of an in-world segment (not the world's first: the caller counts that one) ends now."""
        if len(self.segments) > 1:
            self.segments[-1] = replace(self.segments[-1], wall_s=time.perf_counter() - self.segment_t0)

    def finished(self) -> Finished:
        self.end_segment()
        return Finished(
            config=self.now(),
            segments=self.segments,
            steps_per_epoch=self.n_steps,
            steps_done=self.steps_done,
            history=[epoch_line(h) for h in self.history],  # the ranks' messages carry the lines
            traces=self.method.traces() if self.rank == 0 else {},
            param_digest=param_digest(self.model),
        )

    def probe(self) -> OutOfMemory | None:
        """The agreed out-of-memory probe at this batch: :class:`OutOfMemory` when it does not
        fit, else ``None`` and a new segment begins."""
        fits, note = _probe(
            self.data,
            self.spec,
            epoch=self.start_epoch,
            global_batch=self.global_batch,
            local_batch=self.local_batch,
            rank=self.rank,
            device=self.device,
            model=self.model,
            ddp=self.ddp,
            method=self.method,
            loss_fn=self.loss_fn,
            prec=self.prec,
            micro_batch=self.micro_batch if self.accum > 1 else None,
            stepper=self.stepper,
        )
        if not fits:
            return OutOfMemory(config=self.now(), segments=self.segments, note=note)
        self.segments.append(
            Segment(
                global_batch=self.global_batch,
                n_workers=self.world,
                accumulation_steps=self.accum,
                from_epoch=self.start_epoch + 1,
            )
        )
        return None

    # ------------------------------------------------------------------ one epoch
    def run_epoch(self, epoch: int) -> tuple[torch.Tensor, float] | Interrupted:
        """The epoch's steps: ``(loss sum on the device, seconds)``, or the interrupted
        result when the ranks agreed to stop at a step.

        A step takes this rank's share of the global batch (B / N samples) whole; with k
        accumulation steps it runs as k micro-batches of b = B / (N k) samples in order, the
        first k - 1 backward passes under DDP ``no_sync()`` (gradients summed locally) and the
        last one synchronised, each micro-batch's loss divided by k: the gradient is the
        mean over the share, as at k = 1.  What follows the backward -- unscaling, the
        method's ``after_backward`` (on the whole share: AGS's small batch is its first
        samples), the noise scale (the comm hook sees the accumulated gradient of the share,
        so its local batch is B / N), the update -- is the same for every k.  The steps are
        :meth:`tula.engine.step.TrainStep.run_epoch`'s (``train.step``'s class), as the profile ran them."""
        spec, ctx = self.spec, self.ctx
        perm = epoch_order(spec.seed, epoch, self.data.train_size)
        batches = data_path(self.data, self.device).epoch_batches(
            epoch, perm, self.global_batch, self.rank, self.local_batch, self.n_steps
        )
        self.model.train()
        # the epoch's clock starts on every rank at once: at N > 1 the others would otherwise count
        # rank 0's write of the previous epoch's checkpoint (its checkpoint_s) into this epoch's first step
        start_together(self.device)
        t0 = self.epoch_t0 = time.perf_counter()
        stop = ctx.stop

        def progress(done: int) -> None:
            if self.rank == 0 and done % self.report_every == 0:
                ctx.emit(StepDone(epoch=epoch, step=done, steps_per_epoch=self.n_steps))

        ran = self.stepper.run_epoch(  # this rank's slice of each global batch (DataLoader workers for on-disk sets)
            batches,
            self.n_steps,
            first_step=epoch * self.n_steps,
            should_stop=stop.poll if stop is not None else None,  # every rank sees the same answer at the same step
            after_step=progress,
        )
        if ran.stopped:
            return self.interrupted(epochs_done=epoch, steps_done=self.steps_done, signum=getattr(stop, "signum", None))
        self.steps_done += ran.steps
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return ran.loss_sum, time.perf_counter() - t0

    def _on_gradients(self, finite: bool) -> None:
        """Between a step's backward and its update (:attr:`TrainStep.on_gradients`): the fp16
        steps skipped, the gradient noise scale's pair."""
        self.skipped_steps += not finite
        if self.spec.train.noise_scale:
            self.gns_feed.step(self.method, self.params, self.local_batch, self.global_batch,
                               loss_scale=self.prec.loss_scale(), skip=not finite)  # fmt: skip

    def epoch_record(self, epoch: int, loss_sum: torch.Tensor, epoch_s: float) -> tuple[EpochRecord, dict]:
        """The epoch's figures (loss and time agreed over the ranks, the evaluation, the noise
        scale), the last of :attr:`history`, and the method's per-step traces."""
        t_end = time.perf_counter()
        self.method.before_eval()
        loss_total = loss_sum.reshape(1)
        slowest_s = torch.tensor([epoch_s], dtype=torch.float64, device=self.device)
        dist.all_reduce(loss_total)
        dist.all_reduce(slowest_s, op=dist.ReduceOp.MAX)
        t_eval = time.perf_counter()
        # the test split in the training arithmetic (train.step's class may override it)
        with gathered(self.ddp):  # FSDP: whole on every rank, so a rank's extra batch meets no collective
            scores = self.stepper.evaluate(
                self.data, self.rank, self.world, self.spec.train.eval_batch, self.spec.train.loss
            )
        eval_s = time.perf_counter() - t_eval
        skipped: dict[str, int] = {}
        if self.prec.scaler is not None:  # fp16: the steps the scaler skipped (gradients overflowed)
            skipped, self.skipped_steps = {"skipped_steps": self.skipped_steps}, 0
        self.gns_feed.flush()
        step_traces = _drain_step_traces(self.method)
        scaled = step_traces.get("scaled")
        figures = EpochRecord(  # checked as the record types them; written as the line has them
            epoch=epoch + 1,
            steps=self.n_steps,
            steps_done=self.steps_done,
            global_batch=self.global_batch,
            n_workers=self.world,
            accumulation_steps=self.accum,
            micro_batch=self.micro_batch,
            lr=self.method.lr,
            train_loss=float(loss_total) / (self.n_steps * self.world),
            epoch_time_s=float(slowest_s),
            **scores,
            **skipped,
            b_simple=self.gns.b_simple(),  # the batch the model could use now (one host sync per epoch)
            **({"scaled_fraction": sum(map(bool, scaled)) / len(scaled)} if scaled else {}),
            # the epoch's work after its steps (this rank's): evaluation, the reductions and the noise scale
            eval_s=eval_s,
            epoch_end_s=time.perf_counter() - t_end,
        )
        self.history.append(figures)
        return figures, step_traces

    def now(self) -> Config:
        """The configuration it trains at."""
        return Config(n_workers=self.world, global_batch=self.global_batch, accumulation_steps=self.accum)

    def decide(self, epoch: int) -> Config:
        """The batch schedule's configuration for the next epoch (the same on every rank: the
        history is all-reduced), its decision joining the epoch's figures (the last of
        :attr:`history`); an LR change at the same batch is applied here."""
        if not self.schedule:
            return self.now()
        assert self.sched_state is not None, "_restore gives a run with a schedule the schedule's state"
        d = next_config(self.sched_state, epoch + 1, self.history, self.schedule.caps)
        self.sched_state = d.state.to_dict()  # the checkpoint keeps the state as JSON
        nxt = Config(n_workers=d.n_workers, global_batch=d.global_batch, accumulation_steps=d.accumulation_steps)
        self.history[-1] = self.history[-1].model_copy(update={"schedule": ScheduleDecision.of(d)})
        if nxt == self.now() and d.lr_multiplier != self.lr_mult:
            self.method.set_schedule_lr(d.lr_multiplier, (epoch + 1) * self.n_steps)
        self.lr_mult = d.lr_multiplier
        return nxt

    def checkpoint_state(self, epoch: int, nxt: Config) -> RankCheckpoint:
        """The run after ``epoch``, which trains at ``nxt`` next."""
        return RankCheckpoint(
            epoch=epoch + 1,
            steps_done=self.steps_done,
            history=list(self.history),
            method=self.method_name,
            global_batch=self.global_batch,
            n_workers=self.world,
            accumulation_steps=self.accum,
            fallbacks=self.fallbacks,
            model=self.model.state_dict(),
            method_state=self.method.state_dict(),
            torch_rng=torch.get_rng_state(),
            schedule_state=self.sched_state,
            lr_multiplier=self.lr_mult,
            next_global_batch=nxt.global_batch,
            next_n_workers=nxt.n_workers,
            next_accumulation_steps=nxt.accumulation_steps,
            noise_scale=self.gns.state_dict(),
            precision=self.prec.state_dict(),
            sequence_length=reference_sequence_length(self.spec.data),
        )

    def write_epoch(self, ckpt: RankCheckpoint | None, step_traces: dict) -> RankCheckpoint | None:
        """The epoch's checkpoint ``ckpt`` (FSDP: every rank its shards first), then on rank 0 the
        file, the epoch's times joining its figures, its ``metrics.jsonl`` line and the progress event.
        Returns the checkpoint as the run goes on from it (FSDP: naming the shards just written; its
        history with rank 0's times), ``None`` where ``ckpt`` is."""
        t0 = time.perf_counter()
        ckpt = save_shards(self.ddp, self.method.optimizer, self.out, self.history[-1].epoch, ckpt)
        if self.rank != 0:
            return ckpt
        assert ckpt is not None, "rank 0 always builds the checkpoint (_train_in_world)"
        save_checkpoint(ckpt.to_state(), self.out)
        prune_shards(self.out)
        rec = self.history[-1] = self.history[-1].model_copy(
            update={
                "checkpoint_s": time.perf_counter() - t0,
                # the epoch as the plan predicts it, on rank 0's clock from the ranks' common start: its steps,
                # its end (evaluation, reductions, the schedule's decision), its checkpoint
                "epoch_wall_s": time.perf_counter() - self.epoch_t0,
            }
        )
        line = epoch_line(rec)
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps({**line, STEP_TRACES: step_traces} if step_traces else line) + "\n")
        self.ctx.emit(EpochFinished(rec))
        return replace(ckpt, history=list(self.history))

    # ------------------------------------------------------------------ a new batch, same workers
    def change_batch(self, epoch: int, new_batch: int, new_k: int, ckpt: RankCheckpoint) -> OutOfMemory | Resize | None:
        """Go on in this world at ``new_batch`` with ``new_k`` accumulation steps: the method
        again at the new batch, from the state just checkpointed (``ckpt``), as a new
        generation would take it from the file; then the probe.  ``None`` when training goes
        on; else the result that ends the world (:class:`OutOfMemory` at the new batch, or
        :class:`Resize` when the wrapper cannot be renewed)."""
        t_change = time.perf_counter()
        resize = self.resized(epoch, Config(n_workers=self.world, global_batch=new_batch, accumulation_steps=new_k))
        self.method.release()
        self.method = None
        self.stepper.use_method(None)
        self.stepper.ddp = None  # the step holds no wrapper the renewal must free (start_at gives it the new one)
        if self.own_norms is None and ddp_has_comm_hook(self.ddp):  # the method's own hook is on the wrapper
            held = [self.ddp]
            self.ddp = None
            self.ddp = _fresh_ddp(self.model, self.device, held)
            if self.ddp is None:
                return resize
        if self.rank == 0:
            self.ctx.emit(
                Resized(
                    at_epoch=epoch + 1,
                    global_batch=new_batch,
                    n_workers=self.world,
                    accumulation_steps=new_k,
                    new_world=False,
                )
            )
        self.accum = new_k
        self.start_at(new_batch, ckpt)
        if self.rank == 0:
            self.ctx.emit(
                WorldStarted(
                    global_batch=self.global_batch,
                    n_workers=self.world,
                    accumulation_steps=self.accum,
                    micro_batch=self.micro_batch,
                    steps_per_epoch=self.n_steps,
                    epochs=self.spec.epochs,
                )
            )
        oom = self.probe()
        if oom is not None:
            return oom
        self.segment_t0 = t_change
        return None


def train_world(
    ctx: WorkerContext,
    spec_dict: dict,
    *,
    method_name: str,
    config: Config,
    out_dir: str,
    fallbacks: list[dict],
    mem_cap_bytes: int | None = None,
    reach_token: str | None = None,
    schedule: ScheduleStart | None = None,
) -> RankResult:
    """Run on every rank: train ``spec.epochs`` epochs at ``config`` with ``method_name``,
    resuming from the checkpoint in ``out_dir`` when there is one.  Returns
    (:mod:`tula.engine.rank_messages`) :class:`~tula.engine.rank_messages.Finished` with the
    history and the method's trace summary, :class:`~tula.engine.rank_messages.OutOfMemory`
    when the ranks agreed that the first step at a batch does not fit,
    :class:`~tula.engine.rank_messages.Interrupted` when they agreed to stop (SIGINT/SIGTERM),
    or :class:`~tula.engine.rank_messages.Resize` when the batch schedule (``schedule``: its
    state, LR multiplier and :class:`~tula.core.schedules.Caps`) chose another worker count at
    an epoch boundary: this world ends there, its checkpoint written, and the caller starts
    the next generation.  ``config.n_workers`` is the world's size.

    A new batch at the same worker count goes on in this world: after the epoch's
    checkpoint is written, the method is built again at the new batch and takes the state
    just checkpointed through :func:`_restore`, as a new generation would take it from the
    file (same process group, same DDP model -- a new DDP wrapper of the same module only
    for a method with its own comm hook, AdaScale and post-local SGD), then the new batch
    is probed; an out-of-memory there returns ``OutOfMemory`` as at the start of a world.
    The parameters then equal a new generation's bit for bit with two workers; with more,
    the first all-reduce after the change sums in the kept wrapper's (rebuilt) bucket
    order where a new generation's sums in DDP's first order, which can differ in the last
    bits -- as a resumed run's first step does from an uninterrupted run's.
    Every result carries ``segments``: one :class:`~tula.engine.rank_messages.Segment` per batch this
    world trained at (``wall_s`` of an in-world change: from the
    change to the segment's end; the first segment's is left to the caller).
    ``config.accumulation_steps``: the k each step runs with (:meth:`_RankTrainer.run_epoch`),
    which the caller may have raised after an out-of-memory."""
    spec = JobSpec.model_validate(spec_dict)
    if reach_token is not None:
        check_shared_directory(out_dir, reach_token, ctx.rank, ctx.device)
    rt = _RankTrainer(ctx, spec, method_name, out_dir, fallbacks, schedule, config.accumulation_steps)
    try:
        return _train_in_world(
            rt, method_name=method_name, global_batch=config.global_batch, out_dir=out_dir, mem_cap_bytes=mem_cap_bytes
        )
    finally:
        rt.data.close()  # the prefetching thread and the loader's workers, whichever way the world ends


def _train_in_world(
    rt: _RankTrainer, *, method_name: str, global_batch: int, out_dir: str, mem_cap_bytes: int | None
) -> Finished | Resize | OutOfMemory | Interrupted:
    """:func:`train_world`'s epochs, on this rank's trainer ``rt``."""
    ctx, spec = rt.ctx, rt.spec
    state = None
    if has_checkpoint(rt.out):
        state = RankCheckpoint.from_state(load_checkpoint(rt.out, map_location=ctx.device))
        check_resumed_precision(state.precision, spec, out_dir)
        check_resumed_sequence_length(state.sequence_length, spec, out_dir)
        if state.method != method_name:
            raise SpecError(
                f"the checkpoint in {out_dir} was trained with method {state.method!r}, "
                f"not {method_name!r}; use another --out or the same method"
            )
    rt.start_at(global_batch, state)
    if state is not None and rt.rank == 0:
        _rewrite_metrics(rt.metrics_path, rt.start_epoch)
    del state
    if mem_cap_bytes is not None and ctx.device.type == "cpu":
        cap_address_space(mem_cap_bytes)
    if rt.start_epoch >= spec.epochs:
        return rt.finished()
    oom = rt.probe()
    if oom is not None:
        return oom

    stop = ctx.stop
    for epoch in range(rt.start_epoch, spec.epochs):
        ran = rt.run_epoch(epoch)
        if isinstance(ran, Interrupted):  # interrupted at a step
            return ran
        _, step_traces = rt.epoch_record(epoch, *ran)
        nxt = rt.decide(epoch)
        change = nxt != rt.now() and epoch + 1 < spec.epochs
        in_world = change and nxt.n_workers == rt.world
        ckpt = rt.write_epoch(rt.checkpoint_state(epoch, nxt) if rt.rank == 0 or in_world else None, step_traces)
        if stop is not None and epoch + 1 < spec.epochs and stop.agree():  # no new epoch starts
            return rt.interrupted(epochs_done=epoch + 1, steps_done=rt.steps_done, signum=stop.signum)
        if not change:
            continue
        rt.end_segment()
        if not in_world:  # another worker count: the next generation's world
            return rt.resized(epoch, nxt)
        try:  # what the caller checks before a new generation (it says why when this fails)
            check_train_config(
                spec, method_name, rt.world, nxt.global_batch, rt.data.train_size, nxt.accumulation_steps
            )
        except TulaError:
            return rt.resized(epoch, nxt)
        assert ckpt is not None  # every rank keeps it for an in-world change
        ended = rt.change_batch(epoch, nxt.global_batch, nxt.accumulation_steps, ckpt)
        del ckpt
        if ended is not None:
            return ended
    return rt.finished()
