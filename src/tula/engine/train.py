"""Training runner: DDP training at a chosen (N, B) with a training method (AGS or a baseline).

The caller (:func:`train`) launches one N-rank world; every rank runs :func:`train_world`:

* data: each epoch is a permutation of the training set seeded by (seed, epoch); step
  ``i`` takes global batch ``i`` of it and rank ``r`` its ``r``-th slice, so a resumed
  run sees exactly the batches an uninterrupted one would;
* before the first step at a batch size, a *probe* forward/backward under ``no_sync()``
  whose out-of-memory verdict all ranks agree on (:func:`tula.engine.ddp.probe_fits`): the world
  then returns ``status: oom`` instead of hanging in a collective; BatchNorm statistics
  are restored after the probe;
* after each epoch: evaluation (top-1, and top-5 where there are more than 5 classes) on
  the test split, sharded over the ranks; a checkpoint with a checksum (model, method
  state, RNG, epoch history; :mod:`tula.engine.checkpoint`, the last two kept) written by rank 0;
  the epoch's metrics, with the method's per-step traces, appended to ``metrics.jsonl``;
* a batch schedule's new batch at the same worker count: the world goes on, the method
  rebuilt at the new batch from the state just checkpointed (:func:`_restore`, what a new
  generation does with the checkpoint file), then probed; only a new worker count ends
  the world (``status: resize``) for the caller to start the next generation;
* SIGINT/SIGTERM: the ranks agree to stop at the next step boundary (no new epoch
  starts); the last finished epoch's checkpoint is what is kept.

Out of memory -- the probe's agreed verdict, or a rank failing with cause ``oom`` mid-epoch --
makes the caller relaunch from the last checkpoint at half the micro-batch: the same global
batch in twice the accumulation steps while the micro-batch is even, else the next smaller
global batch (split evenly over the workers; :func:`next_fallback`): completed epochs are
kept, the interrupted epoch is re-run whole, none is lost or repeated.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tula.core.errors import InfeasibleError, Interrupted, RunDirError, SpecError, TulaError, WorkerError
from tula.core.job_rules import (
    caps_from_spec,
    check_train_config,
    schedule_problem,
    smallest_batch_for,
    state_from_spec,
    uses_models,
    worker_plan,
)
from tula.core.noise_scale import NoiseScale
from tula.core.records import TRAIN_KIND, VERSIONS, read_jsonl, write_atomic
from tula.core.registry import LOSS_NAMES
from tula.core.schedules import next_config, steps_per_epoch  # noqa: F401 (re-exported)
from tula.core.sinks import check_sinks
from tula.core.spec import JobSpec
from tula.engine import interrupts
from tula.engine.checkpoint import CHECKPOINT, checkpoint_meta, has_checkpoint, load_checkpoint, save_checkpoint
from tula.engine.data import data_path, epoch_order
from tula.engine.ddp import (
    LocalGradNorms,
    OneRank,
    check_shared_directory,
    local_norms_allreduce_hook,
    probe_fits,
    start_together,
    synced_sq_norm,
    wrap_ddp,
)
from tula.engine.gpu_knobs import set_backend_knobs, to_memory_format
from tula.engine.launch import Launcher, WorkerContext
from tula.engine.memory import cap_address_space, errno_evidence
from tula.engine.metrics_sinks import EpochSinks
from tula.engine.optim.methods import build_method
from tula.engine.precision import Precision, check_precision
from tula.engine.rundir import check_out_dir, locked
from tula.engine.workloads import Dataset, build_loss, build_model, check_workload, load_dataset

log = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
STEP_TRACES = "step_traces"  # key of an epoch line's per-step method traces (metrics.jsonl only)


class TrainFailed(WorkerError):
    """A worker failed mid-training; the epochs finished before it are in the checkpoint."""


def next_fallback(
    global_batch: int, n_workers: int, accumulation_steps: int, max_steps: int | None = None
) -> tuple[int, int]:
    """The ``(global batch, accumulation steps)`` to go on at after an out-of-memory at
    (B, k) on ``n_workers``: what runs out is the micro-batch b = B / (N k), so it is halved.
    While b is even (so >= 2) and 2k is within ``max_steps`` (``None``: no bound) the global
    batch is kept and k doubled -- the same updates, only more, smaller passes; else b
    halves (rounded down) at the same k, a smaller global batch B = N k floor(b / 2) -- at
    k = 1 half the global batch, rounded down to a multiple of N.  A global batch of 0 means
    nothing smaller is left (b was 1)."""
    micro = global_batch // n_workers // accumulation_steps
    if micro >= 2 and micro % 2 == 0 and (max_steps is None or 2 * accumulation_steps <= max_steps):
        return global_batch, 2 * accumulation_steps
    return n_workers * accumulation_steps * (micro // 2), accumulation_steps


# --------------------------------------------------------------------------- inside a rank
def _local_batch(
    data: Dataset, perm: torch.Tensor, step: int, global_batch: int, rank: int, local_batch: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    start = step * global_batch + rank * local_batch
    x, y = data.take(perm[start : start + local_batch])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Dataset,
    rank: int,
    world: int,
    eval_batch: int,
    device: torch.device,
    loss: str = "cross_entropy",
    loss_fn: Callable | None = None,
) -> dict[str, float]:
    """The test split's mean loss and score, each rank taking every ``world``-th sample; the
    sums are all-reduced.  ``cross_entropy``: top-1 (and top-5 with more than 5 classes);
    ``mse``: R^2 (the mean over outputs, as scikit-learn's ``r2_score``); the user's own loss
    (``loss_fn``): :func:`_evaluate_own_loss`.  An empty test split (no held-out data) gives NaN."""
    if loss == "mse":
        return _evaluate_mse(model, data, rank, world, eval_batch, device)
    if loss not in LOSS_NAMES:
        if loss_fn is None:
            raise ValueError(f"evaluating with the loss {loss!r} needs the loss function")
        return _evaluate_own_loss(model, data, rank, world, eval_batch, device, loss_fn)
    was_training = model.training
    model.eval()
    k5 = data.num_classes > 5
    sums = torch.zeros(4, dtype=torch.float64)  # samples, loss, top1, top5
    for x, y in data_path(data, device).eval_batches(rank, world, eval_batch):  # samples rank, rank + world, ...
        out = model(x)
        sums[0] += len(y)
        sums[1] += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        top = out.topk(5 if k5 else 1, dim=1).indices
        sums[2] += float((top[:, 0] == y).sum())
        if k5:
            sums[3] += float((top == y[:, None]).any(dim=1).sum())
    model.train(was_training)
    if dist.is_initialized():
        dev_sums = sums.to(device)
        dist.all_reduce(dev_sums)
        sums = dev_sums.cpu()
    n = float(sums[0]) if sums[0] > 0 else math.nan
    res = {"test_loss": float(sums[1]) / n, "test_top1": float(sums[2]) / n}
    if k5:
        res["test_top5"] = float(sums[3]) / n
    return res


def _integer_labels(out: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether ``y`` are class labels of ``out``'s dimension 1: integer targets of ``out``'s
    shape without that dimension (``(n,)`` for ``(n, C)``, ``(n, H, W)`` for ``(n, C, H, W)``)."""
    return (
        isinstance(out, torch.Tensor)
        and not y.is_floating_point()
        and not y.is_complex()
        and y.dtype != torch.bool
        and out.ndim == y.ndim + 1
        and out.shape[1] >= 2
        and out.shape[0] == y.shape[0]
        and out.shape[2:] == y.shape[1:]
    )


def _evaluate_own_loss(
    model: nn.Module, data: Dataset, rank: int, world: int, eval_batch: int, device: torch.device, loss_fn: Callable
) -> dict[str, float]:
    """The user's loss on the test split: ``test_loss`` is the loss of each evaluation batch
    weighted by its number of samples (the mean over samples for a loss that averages over
    its batch), and ``test_top1`` -- only when the targets are integer labels of the output's
    dimension 1 (:func:`_integer_labels`) -- the fraction of labels, per sample or per
    element (pixel), that are the output's largest score there; negative labels (e.g.
    ``CrossEntropyLoss``'s ignore_index -100) are not counted."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # samples, loss x samples, correct labels, labels counted
    for x, y in data_path(data, device).eval_batches(rank, world, eval_batch):
        out = model(x)
        n_batch = len(x)
        sums[0] += n_batch
        sums[1] += float(loss_fn(out, y)) * n_batch
        if _integer_labels(out, y):
            counted = y >= 0
            sums[2] += float(((out.argmax(1) == y) & counted).sum())
            sums[3] += float(counted.sum())
    model.train(was_training)
    if dist.is_initialized():
        dev_sums = sums.to(device)
        dist.all_reduce(dev_sums)
        sums = dev_sums.cpu()
    n = float(sums[0]) if sums[0] > 0 else math.nan
    res = {"test_loss": float(sums[1]) / n}
    if sums[3] > 0:
        res["test_top1"] = float(sums[2]) / float(sums[3])
    return res


def _evaluate_mse(
    model: nn.Module, data: Dataset, rank: int, world: int, eval_batch: int, device: torch.device
) -> dict[str, float]:
    was_training = model.training
    model.eval()
    t = data.num_classes  # outputs
    sums = torch.zeros(1 + 3 * t, dtype=torch.float64)  # samples, then per output: sum y, sum y^2, squared error
    for x, y in data_path(data, device).eval_batches(rank, world, eval_batch):
        out, y = model(x).double(), y.double()
        sums[0] += len(y)
        sums[1 : 1 + t] += y.sum(0).cpu()
        sums[1 + t : 1 + 2 * t] += y.square().sum(0).cpu()
        sums[1 + 2 * t :] += (out - y).square().sum(0).cpu()
    model.train(was_training)
    if dist.is_initialized():
        dev_sums = sums.to(device)
        dist.all_reduce(dev_sums)
        sums = dev_sums.cpu()
    n = float(sums[0])
    if n == 0:
        return {"test_loss": math.nan, "test_r2": math.nan}
    sum_y, sum_y2, sse = sums[1 : 1 + t], sums[1 + t : 1 + 2 * t], sums[1 + 2 * t :]
    sst = (sum_y2 - sum_y.square() / n).clamp_min(0)
    # a constant target: 1 when predicted exactly, else 0 (scikit-learn's force_finite)
    r2 = torch.where(sst > 0, 1 - sse / sst.clamp_min(1e-300), (sse == 0).double())
    return {"test_loss": float(sse.sum()) / (n * t), "test_r2": float(r2.mean())}


def param_digest(model: nn.Module) -> str:
    """SHA-1 of every parameter's bytes: equal on two ranks iff their replicas are identical."""
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _rewrite_metrics(path: Path, upto_epoch: int) -> None:
    """Keep the metrics lines of epochs up to ``upto_epoch`` (drop lines written after the
    checkpoint, if any), so every epoch appears exactly once after a resume."""
    lines = [r for r in read_jsonl(path) if r["epoch"] <= upto_epoch]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in lines))


def _drain_step_traces(method: Any) -> dict[str, list]:
    drain = getattr(method, "drain_step_traces", None)
    return drain() if drain is not None else {}


def ddp_has_comm_hook(ddp: nn.Module) -> bool:
    """Whether a method registered its own DDP comm hook (DDP takes one)."""
    return bool(getattr(ddp, "_comm_hooks", []))


class _NoiseScaleFeed:
    """Feeds the gradient noise scale (McCandlish et al., App. A) one step's pair of squared
    gradient norms: each rank's local gradient (batch b) averaged over the ranks, and the
    synchronised gradient (batch B).  The ranks' local norms meet in one one-element
    all-reduce that runs in the background while the next step computes (it is waited for
    at the next step or by :meth:`flush`); no host sync.  A method that measures the pair
    anyway (AdaScale every step; AGS, whose sub-batch is the small batch when there is one
    worker) gives its own."""

    def __init__(self, gns: NoiseScale, own_norms: LocalGradNorms | None, world: int) -> None:
        self.gns, self.own_norms, self.world = gns, own_norms, world
        self.pending: tuple | None = None

    def step(
        self,
        method: Any,
        params: list,
        local_batch: int,
        global_batch: int,
        loss_scale: float | None = None,
        skip: bool = False,
    ) -> None:
        """One step's pair; ``loss_scale``: fp16's factor, in the local norms the DDP hook took
        before the gradients were unscaled; ``skip``: the step overflowed (fp16), its norms are
        dropped."""
        if skip:
            if self.own_norms is not None:
                self.own_norms.take()
            method.step_norms = None
            return
        if self.own_norms is not None:
            local = self.own_norms.take().reshape(1)
            if loss_scale is not None:
                local /= loss_scale**2
            work = dist.all_reduce(local, async_op=True)
            synced = synced_sq_norm(params)
            self.flush()
            self.pending = (work, local, synced, local_batch, global_batch)
        elif method.step_norms is not None and (self.world > 1 or method.step_norms_batches is not None):
            small, big = method.step_norms_batches or (local_batch, global_batch)
            self.gns.update(method.step_norms[0], method.step_norms[1], small, big)
            method.step_norms = None

    def flush(self) -> None:
        """Complete the last step's measurement (before reading or saving the estimate)."""
        if self.pending is not None:
            work, local, synced, b, big = self.pending
            self.pending = None
            work.wait()
            self.gns.update(local[0] / self.world, synced, b, big)


def _restore(
    state: dict | None,
    model: nn.Module,
    method: Any,
    gns: NoiseScale,
    n_steps: int,
    spec: JobSpec,
    global_batch: int,
    schedule: dict | None,
) -> tuple[int, int, list, dict | None, float]:
    """Put this rank where the checkpoint ``state`` left the run (``None``: the start),
    with ``method`` just built for this world's batch (``n_steps`` steps per epoch): the
    model, the method's state (its LR rule re-applied at the new batch), the RNG, the
    batch schedule's state and LR multiplier, the noise scale.  What a new generation does
    with the checkpoint file, and a batch change inside a world with the state it has just
    checkpointed: one function, so both give the same numbers.  Returns ``(start_epoch,
    steps_done, history, schedule_state, lr_multiplier)``."""
    start_epoch, steps_done, history = 0, 0, []
    sched_state = schedule["state"] if schedule else None
    lr_mult = schedule["lr_multiplier"] if schedule else 1.0
    if state is not None:
        model.load_state_dict(state["model"])
        start_epoch, steps_done, history = state["epoch"], state["steps_done"], state["history"]
        # the LR schedule's position is counted in epochs: a generation at another batch has
        # another number of steps per epoch
        method.load_state_dict(state["method_state"], step=start_epoch * n_steps)
        torch.set_rng_state(state["torch_rng"])
        if schedule and state.get("schedule_state") is not None:
            sched_state, lr_mult = state["schedule_state"], state["lr_multiplier"]
        if state.get("noise_scale"):
            gns.load_state_dict(state["noise_scale"])
    if schedule:
        if sched_state is None:  # a checkpoint written before the run had a schedule
            sched_state = state_from_spec(spec, global_batch)
        method.set_schedule_lr(lr_mult, start_epoch * n_steps)
    return start_epoch, steps_done, history, sched_state, lr_mult


def _probe(
    data: Dataset,
    spec: JobSpec,
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
) -> tuple[bool, str]:
    """Can every rank run a step at this batch?  One forward/backward under ``no_sync()`` on
    the epoch's first batch -- its first micro-batch (``micro_batch`` samples of the rank's
    share) when the step accumulates, whose activations are what a step holds at once
    (:func:`tula.engine.ddp.probe_fits`); BatchNorm statistics and the gradients are put back
    as they were."""
    buffers = [b.detach().clone() for b in model.buffers()]

    def probe_step() -> None:
        x, y = _local_batch(
            data, epoch_order(spec.seed, epoch, data.train_size), 0, global_batch, rank, local_batch, device
        )
        if micro_batch is not None:
            x, y = x[:micro_batch], y[:micro_batch]
        with ddp.no_sync():
            with prec.autocast() if prec is not None else contextlib.nullcontext():
                loss = loss_fn(ddp(x), y)
            loss.backward()

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
        schedule: dict | None,
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
        self.ddp: Any = wrap_ddp(self.model, self.device)
        self.loss_fn = build_loss(spec.train.loss, self.device)
        self.prec = Precision(spec.train.precision, self.device)
        self.skipped_steps = 0  # fp16: this epoch's steps whose gradients overflowed
        self.gns = NoiseScale()
        self.own_norms: LocalGradNorms | None = None
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.method: Any = None
        self.segments: list[dict] = []  # the batches this world trained at
        self.segment_t0 = 0.0  # when the current in-world segment began
        self.epoch_t0 = 0.0  # when the current epoch's steps began (every rank at once: run_epoch)

    # ------------------------------------------------------------------ the batch it trains at
    def start_at(self, global_batch: int, state: dict | None) -> None:
        """Build the method at ``global_batch`` and put this rank where ``state`` (a
        checkpoint, or ``None``: the start) left the run (:func:`_restore`)."""
        self.global_batch, self.local_batch = global_batch, global_batch // self.world
        self.micro_batch = self.local_batch // self.accum  # b: the samples of one forward/backward
        self.n_steps = steps_per_epoch(self.data.train_size, global_batch)
        self.method = build_method(self.method_name, self.ddp, self.spec, global_batch, self.world, self.n_steps)
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
        self.start_epoch, self.steps_done, self.history, self.sched_state, self.lr_mult = _restore(
            state, self.model, self.method, self.gns, self.n_steps, self.spec, global_batch, self.schedule
        )
        if state is not None:
            self.prec.load_state_dict(state.get("precision"))  # fp16: the scaler's scale and counters
        self.report_every = max(1, self.n_steps // 25)

    def result(self, status: str, **extra: Any) -> dict:
        """What the world returns: this batch's figures, the segments so far, and ``extra``."""
        return {
            "global_batch": self.global_batch,
            "local_batch": self.local_batch,
            "accumulation_steps": self.accum,
            "micro_batch": self.micro_batch,
            "n_workers": self.world,
            "steps_per_epoch": self.n_steps,
            "start_epoch": self.start_epoch,
            "status": status,
            **extra,
            "segments": self.segments,
        }

    def resized(self, epoch: int, nxt: tuple[int, int, int]) -> dict:
        """The world ends after ``epoch`` for the next generation at ``nxt`` = (B, N, k)."""
        return self.result(
            "resize",
            epochs_done=epoch + 1,
            steps_done=self.steps_done,
            next_global_batch=nxt[0],
            next_n_workers=nxt[1],
            next_accumulation_steps=nxt[2],
        )

    def finished(self) -> dict:
        if len(self.segments) > 1:
            self.segments[-1]["wall_s"] = time.perf_counter() - self.segment_t0
        return self.result(
            "ok",
            history=self.history,
            steps_done=self.steps_done,
            traces=self.method.traces() if self.rank == 0 else {},
            param_digest=param_digest(self.model),
        )

    def probe(self) -> dict | None:
        """The agreed out-of-memory probe at this batch: ``status: oom`` when it does not fit,
        else ``None`` and a new segment begins."""
        fits, note = _probe(
            self.data,
            self.spec,
            self.start_epoch,
            self.global_batch,
            self.local_batch,
            self.rank,
            self.device,
            self.model,
            self.ddp,
            self.method,
            self.loss_fn,
            self.prec,
            self.micro_batch if self.accum > 1 else None,
        )
        if not fits:
            return self.result("oom", note=note)
        self.segments.append(
            {
                "global_batch": self.global_batch,
                "n_workers": self.world,
                "accumulation_steps": self.accum,
                "from_epoch": self.start_epoch + 1,
                "wall_s": None,
            }
        )
        return None

    # ------------------------------------------------------------------ one epoch
    def run_epoch(self, epoch: int) -> tuple[torch.Tensor, float] | dict:
        """The epoch's steps: ``(loss sum on the device, seconds)``, or the interrupted
        result when the ranks agreed to stop at a step.

        A step takes this rank's share of the global batch (B / N samples) whole; with k
        accumulation steps it runs as k micro-batches of b = B / (N k) samples in order, the
        first k - 1 backward passes under DDP ``no_sync()`` (gradients summed locally) and the
        last one synchronised, each micro-batch's loss divided by k: the gradient is the
        mean over the share, as at k = 1.  What follows the backward -- unscaling, the
        method's ``after_backward`` (on the whole share: AGS's small batch is its first
        samples), the noise scale (the comm hook sees the accumulated gradient of the share,
        so its local batch is B / N), the update -- is the same for every k."""
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
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # on device: no host sync per step
        stop = ctx.stop
        for i in range(self.n_steps):
            if stop is not None and stop.poll():  # every rank sees the same answer at the same step
                return self.result("interrupted", epochs_done=epoch, steps_done=self.steps_done - i, signal=stop.signum)
            x, y = next(batches)  # this rank's slice of global batch i (DataLoader workers for on-disk sets)
            loss_sum += self.train_step(epoch * self.n_steps + i, x, y).double()
            if self.rank == 0 and (i + 1) % self.report_every == 0:
                ctx.emit({"type": "step", "epoch": epoch, "step": i + 1, "steps_per_epoch": self.n_steps})
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return loss_sum, time.perf_counter() - t0

    def train_step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One optimiser step of the method on this rank's share ``x``, ``y``, as the
        ``step``-th of the run (the method's periodic work, AGS's factor measurement, is due
        by it): the step training runs and the profile's run trial times
        (:func:`tula.engine.run_trial.run_trial`).  The step's loss, detached, on the device.

        A failure carries the C errno it surfaced with (:func:`~tula.engine.memory.errno_evidence`):
        under an address-space cap that is how the launcher tells out-of-memory from a crash."""
        with errno_evidence():
            return self._step(step, x, y)

    def _step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        method = self.method
        method.optimizer.zero_grad(set_to_none=True)
        loss = self._forward_backward(x, y)
        self.prec.unscale(method.optimizer)  # fp16: every reader of the gradients sees them unscaled
        finite = self.prec.grads_finite(method.optimizer)  # fp16: a step that overflowed is skipped
        self.skipped_steps += not finite
        if finite:
            method.loss_scale = self.prec.loss_scale()
            with self.prec.autocast():  # AGS's small batch in the same arithmetic as the large one
                method.after_backward(step, x, y, self.loss_fn)
        if self.spec.train.noise_scale:
            self.gns_feed.step(method, self.params, self.local_batch, self.global_batch,
                               loss_scale=self.prec.loss_scale(), skip=not finite)  # fmt: skip
        self.prec.step(method.optimizer)
        method.lr_schedule.step()
        self.steps_done += 1
        return loss

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step's backward pass(es) over the share ``x``, ``y`` (:meth:`run_epoch`); the
        step's loss (the mean of its micro-batches' losses), detached."""
        k, b = self.accum, self.micro_batch
        if k == 1:
            with self.prec.autocast():
                loss = self.loss_fn(self.ddp(x), y)
            self.prec.backward(loss)
            return loss.detach()
        total = torch.zeros((), device=self.device)
        for j in range(k):
            # the forward too under no_sync: DDP decides at the forward whether the backward syncs
            with self.ddp.no_sync() if j < k - 1 else contextlib.nullcontext():
                with self.prec.autocast():
                    loss = self.loss_fn(self.ddp(x[j * b : (j + 1) * b]), y[j * b : (j + 1) * b]) / k
                self.prec.backward(loss)
            total += loss.detach().float()
        return total

    def epoch_record(self, epoch: int, loss_sum: torch.Tensor, epoch_s: float) -> tuple[dict, dict]:
        """The epoch's line of ``metrics.jsonl`` (loss and time agreed over the ranks, the
        evaluation, the noise scale) and the method's per-step traces."""
        t_end = time.perf_counter()
        self.method.before_eval()
        loss_total = loss_sum.reshape(1)
        slowest_s = torch.tensor([epoch_s], dtype=torch.float64, device=self.device)
        dist.all_reduce(loss_total)
        dist.all_reduce(slowest_s, op=dist.ReduceOp.MAX)
        t_eval = time.perf_counter()
        with self.prec.autocast():  # the test split in the training arithmetic
            scores = evaluate(
                self.model,
                self.data,
                self.rank,
                self.world,
                self.spec.train.eval_batch,
                self.device,
                self.spec.train.loss,
                self.loss_fn,
            )
        eval_s = time.perf_counter() - t_eval
        rec = {
            "epoch": epoch + 1,
            "steps": self.n_steps,
            "steps_done": self.steps_done,
            "global_batch": self.global_batch,
            "n_workers": self.world,
            "accumulation_steps": self.accum,
            "micro_batch": self.micro_batch,
            "lr": self.method.lr,
            "train_loss": float(loss_total) / (self.n_steps * self.world),
            "epoch_time_s": float(slowest_s),
            **scores,
        }
        if self.prec.scaler is not None:  # fp16: the steps the scaler skipped (gradients overflowed)
            rec["skipped_steps"], self.skipped_steps = self.skipped_steps, 0
        self.gns_feed.flush()
        rec["b_simple"] = self.gns.b_simple()  # the batch the model could use now (one host sync per epoch)
        step_traces = _drain_step_traces(self.method)
        if step_traces.get("scaled"):
            rec["scaled_fraction"] = sum(map(bool, step_traces["scaled"])) / len(step_traces["scaled"])
        # the epoch's work after its steps (this rank's): evaluation, and with it the reductions and the noise scale
        rec["eval_s"], rec["epoch_end_s"] = eval_s, time.perf_counter() - t_end
        self.history.append(rec)
        return rec, step_traces

    def now(self) -> tuple[int, int, int]:
        """The configuration it trains at: (B, N, k)."""
        return self.global_batch, self.world, self.accum

    def decide(self, epoch: int, rec: dict) -> tuple[int, int, int]:
        """The batch schedule's (B, N, k) for the next epoch (the same on every rank: the
        history is all-reduced); an LR change at the same batch is applied here."""
        if not self.schedule:
            return self.now()
        assert self.sched_state is not None, "_restore gives a run with a schedule the schedule's state"
        d = next_config(self.sched_state, epoch + 1, self.history, self.schedule["caps"])
        self.sched_state, nxt = d.state, (d.global_batch, d.n_workers, d.accumulation_steps)
        rec["schedule"] = d.record()
        if nxt == self.now() and d.lr_multiplier != self.lr_mult:
            self.method.set_schedule_lr(d.lr_multiplier, (epoch + 1) * self.n_steps)
        self.lr_mult = d.lr_multiplier
        return nxt

    def checkpoint_state(self, epoch: int, nxt: tuple[int, int, int]) -> dict:
        return {
            "epoch": epoch + 1,
            "steps_done": self.steps_done,
            "history": self.history,
            "method": self.method_name,
            "global_batch": self.global_batch,
            "n_workers": self.world,
            "accumulation_steps": self.accum,
            "fallbacks": self.fallbacks,
            "model": self.model.state_dict(),
            "method_state": self.method.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "schedule_state": self.sched_state,
            "lr_multiplier": self.lr_mult,
            "next_global_batch": nxt[0],
            "next_n_workers": nxt[1],
            "next_accumulation_steps": nxt[2],
            "noise_scale": self.gns.state_dict(),
            "precision": self.prec.state_dict(),
        }

    def write_epoch(self, ckpt: dict | None, rec: dict, step_traces: dict) -> None:
        """Rank 0: the checkpoint, the metrics line, the progress event."""
        if self.rank != 0:
            return
        assert ckpt is not None, "rank 0 always builds the checkpoint (_train_in_world)"
        t0 = time.perf_counter()
        save_checkpoint(ckpt, self.out)
        rec["checkpoint_s"] = time.perf_counter() - t0
        # the epoch as the plan predicts it, on rank 0's clock from the ranks' common start: its steps,
        # its end (evaluation, reductions, the schedule's decision), its checkpoint
        rec["epoch_wall_s"] = time.perf_counter() - self.epoch_t0
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps({**rec, STEP_TRACES: step_traces} if step_traces else rec) + "\n")
        self.ctx.emit({"type": "epoch", **rec})

    # ------------------------------------------------------------------ a new batch, same workers
    def change_batch(self, epoch: int, new_batch: int, new_k: int, ckpt: dict) -> dict | None:
        """Go on in this world at ``new_batch`` with ``new_k`` accumulation steps: the method
        again at the new batch, from the state just checkpointed (``ckpt``), as a new
        generation would take it from the file; then the probe.  ``None`` when training goes
        on; else the result that ends the world (``oom`` at the new batch, or ``resize`` when
        the wrapper cannot be renewed)."""
        t_change = time.perf_counter()
        resize = self.resized(epoch, (new_batch, self.world, new_k))
        self.method.release()
        self.method = None
        if self.own_norms is None and ddp_has_comm_hook(self.ddp):  # the method's own hook is on the wrapper
            held = [self.ddp]
            self.ddp = None
            self.ddp = _fresh_ddp(self.model, self.device, held)
            if self.ddp is None:
                return resize
        if self.rank == 0:
            self.ctx.emit(
                {
                    "type": "resize",
                    "at_epoch": epoch + 1,
                    "global_batch": new_batch,
                    "n_workers": self.world,
                    "accumulation_steps": new_k,
                    "new_world": False,
                }
            )
        self.accum = new_k
        self.start_at(new_batch, ckpt)
        if self.rank == 0:
            self.ctx.emit(
                {
                    "type": "start",
                    "global_batch": self.global_batch,
                    "n_workers": self.world,
                    "accumulation_steps": self.accum,
                    "micro_batch": self.micro_batch,
                    "steps_per_epoch": self.n_steps,
                    "epochs": self.spec.epochs,
                }
            )
        oom = self.probe()
        if oom is not None:
            return oom
        self.segment_t0 = t_change
        return None


def train_world(
    ctx: WorkerContext,
    spec_dict: dict,
    method_name: str,
    global_batch: int,
    out_dir: str,
    fallbacks: list[dict],
    mem_cap_bytes: int | None = None,
    reach_token: str | None = None,
    schedule: dict | None = None,
    accumulation_steps: int | None = None,
) -> dict:
    """Run on every rank: train ``spec.epochs`` epochs at ``global_batch`` with ``method_name``,
    resuming from the checkpoint in ``out_dir`` when there is one.  Returns ``{"status":
    "ok", ...}`` with the history and the method's trace summary, ``{"status": "oom", ...}``
    when the ranks agreed that the first step at a batch does not fit, ``{"status":
    "interrupted", ...}`` when they agreed to stop (SIGINT/SIGTERM), or ``{"status":
    "resize", ...}`` when the batch schedule (``schedule``: its state, LR multiplier and
    :class:`~tula.core.schedules.Caps`) chose another worker count at an epoch boundary: this
    world ends there, its checkpoint written, and the caller starts the next generation.

    A new batch at the same worker count goes on in this world: after the epoch's
    checkpoint is written, the method is built again at the new batch and takes the state
    just checkpointed through :func:`_restore`, as a new generation would take it from the
    file (same process group, same DDP model -- a new DDP wrapper of the same module only
    for a method with its own comm hook, AdaScale and post-local SGD), then the new batch
    is probed; an out-of-memory there returns ``status: oom`` as at the start of a world.
    The parameters then equal a new generation's bit for bit with two workers; with more,
    the first all-reduce after the change sums in the kept wrapper's (rebuilt) bucket
    order where a new generation's sums in DDP's first order, which can differ in the last
    bits -- as a resumed run's first step does from an uninterrupted run's.
    Every result carries ``segments``: one ``{global_batch, n_workers, from_epoch,
    wall_s}`` per batch this world trained at (``wall_s`` of an in-world change: from the
    change to the segment's end; the first segment's is left to the caller).
    ``accumulation_steps``: the k each step runs with (:meth:`_RankTrainer.run_epoch`;
    default the spec's ``train.accumulation_steps``), which the caller may have raised
    after an out-of-memory."""
    spec = JobSpec.model_validate(spec_dict)
    if reach_token is not None:
        check_shared_directory(out_dir, reach_token, ctx.rank, ctx.device)
    k = spec.train.accumulation_steps if accumulation_steps is None else accumulation_steps
    rt = _RankTrainer(ctx, spec, method_name, out_dir, fallbacks, schedule, k)
    try:
        return _train_in_world(rt, ctx, spec, method_name, global_batch, out_dir, mem_cap_bytes)
    finally:
        rt.data.close()  # the prefetching thread and the loader's workers, whichever way the world ends


def check_resumed_precision(state: dict, spec: JobSpec, out_dir: str | Path) -> None:
    """One sentence when the checkpoint ``state`` (or its header) was trained in another
    precision than the spec's."""
    trained_in = (state.get("precision") or {}).get("name", "fp32")
    if trained_in != spec.train.precision:
        raise SpecError(
            f"the checkpoint in {out_dir} was trained in {trained_in}, not train.precision "
            f"{spec.train.precision}; resume it in {trained_in}, or train into another --out"
        )


def _train_in_world(
    rt: _RankTrainer,
    ctx: WorkerContext,
    spec: JobSpec,
    method_name: str,
    global_batch: int,
    out_dir: str,
    mem_cap_bytes: int | None,
) -> dict:
    """:func:`train_world`'s epochs, on this rank's trainer ``rt``."""
    state = None
    if has_checkpoint(rt.out):
        state = load_checkpoint(rt.out, map_location=ctx.device)
        check_resumed_precision(state, spec, out_dir)
        if state["method"] != method_name:
            raise SpecError(
                f"the checkpoint in {out_dir} was trained with method {state['method']!r}, "
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
        if isinstance(ran, dict):  # interrupted at a step
            return ran
        rec, step_traces = rt.epoch_record(epoch, *ran)
        nxt = rt.decide(epoch, rec)
        change = nxt != rt.now() and epoch + 1 < spec.epochs
        in_world = change and nxt[1] == rt.world
        ckpt = rt.checkpoint_state(epoch, nxt) if rt.rank == 0 or in_world else None
        rt.write_epoch(ckpt, rec, step_traces)
        if stop is not None and epoch + 1 < spec.epochs and stop.agree():  # no new epoch starts
            return rt.result("interrupted", epochs_done=epoch + 1, steps_done=rt.steps_done, signal=stop.signum)
        if not change:
            continue
        if len(rt.segments) > 1:  # the wall time of an in-world segment ends here
            rt.segments[-1]["wall_s"] = time.perf_counter() - rt.segment_t0
        if not in_world:  # another worker count: the next generation's world
            return rt.resized(epoch, nxt)
        try:  # what the caller checks before a new generation (it says why when this fails)
            check_train_config(spec, method_name, rt.world, nxt[0], rt.data.train_size, nxt[2])
        except TulaError:
            return rt.resized(epoch, nxt)
        assert ckpt is not None  # every rank keeps it for an in-world change
        ended = rt.change_batch(epoch, nxt[0], nxt[2], ckpt)
        del ckpt
        if ended is not None:
            return ended
    return rt.finished()


# --------------------------------------------------------------------------- in the caller
def validate_config(
    spec: JobSpec,
    method: str,
    n_workers: int,
    global_batch: int,
    dataset_size: int,
    accumulation_steps: int | None = None,
) -> None:
    """One sentence for a configuration that cannot train, before any process starts
    (the rules are :func:`tula.core.job_rules.check_train_config`'s)."""
    check_train_config(spec, method, n_workers, global_batch, dataset_size, accumulation_steps)


def step_traces(metrics_path: Path) -> dict[str, list]:
    """The method's per-step traces of a run, joined from its metrics lines."""
    out: dict[str, list] = {}
    for line in read_jsonl(metrics_path):
        for key, values in (line.get(STEP_TRACES) or {}).items():
            out.setdefault(key, []).extend(values)
    return out


def _available(
    launcher: Launcher,
    global_batch: int,
    n_workers: int,
    schedule: dict | None,
    emit: Callable[[dict], None],
    dataset_size: int,
    accumulation_steps: int = 1,
) -> tuple[int, int]:
    """The generation's (B, N) with the workers the launcher can provide: when the cluster gives
    fewer within its wait, the run goes on with as many as there are (the schedule's worker
    cap is lowered to that) and says so.  The new B is the nearest to the old one that
    splits into ``accumulation_steps`` equal micro-batches on each of them."""
    got = launcher.provide(n_workers) if hasattr(launcher, "provide") else n_workers
    if got >= n_workers:
        return global_batch, n_workers
    unit = got * accumulation_steps  # B = N x k x b
    fewer = max(unit, round(global_batch / unit) * unit)  # the nearest batch that splits over them
    if fewer > dataset_size:
        fewer = dataset_size // unit * unit
    emit(
        {
            "type": "note",
            "message": f"the cluster gave {got} of the {n_workers} workers asked for; going on with "
            f"{got} worker(s) at global batch {fewer}",
        }
    )
    if schedule is not None:
        caps = schedule["caps"]
        schedule["caps"] = replace(caps, max_workers=got, min_workers=min(caps.min_workers, got))
    return fewer, got


def _segments_from_history(epochs: list[dict]) -> list[dict]:
    """The batches a world that failed had trained at, from its epochs in the checkpoint
    (``wall_s``: the sum of their epoch times, the world's own time being unknown)."""
    segments: list[dict] = []
    for h in epochs:
        last = segments[-1] if segments else {}
        if not segments or (last["global_batch"], last["n_workers"], last["accumulation_steps"]) != (
            h["global_batch"],
            h["n_workers"],
            h.get("accumulation_steps", 1),
        ):
            segments.append(
                {
                    "global_batch": h["global_batch"],
                    "n_workers": h["n_workers"],
                    "accumulation_steps": h.get("accumulation_steps", 1),
                    "from_epoch": h["epoch"],
                    "wall_s": 0.0,
                }
            )
        segments[-1]["wall_s"] += h.get("epoch_time_s") or 0.0
    return segments


def _interrupted(signum: int | None, epochs_done: int, epochs: int, out: Path) -> Interrupted:
    import signal as _signal

    signum = signum or interrupts.requested() or _signal.SIGINT
    kept = (
        f"epochs 1-{epochs_done} of {epochs} are kept in {out / CHECKPOINT}"
        if epochs_done
        else "no epoch had finished, so there is no checkpoint yet"
    )
    return Interrupted(f"training stopped by {_signal.Signals(signum).name}: {kept}", signum)


def train(
    spec: JobSpec,
    method: str,
    n_workers: int,
    global_batch: int,
    out_dir: str | Path,
    resume: bool = False,
    launcher: Launcher | None = None,
    on_event: Callable[[dict], None] | None = None,
    models: dict | None = None,
) -> dict:
    """Train ``spec`` with ``method`` on ``n_workers`` at ``global_batch``; return the run record.

    Writes ``checkpoint.pt`` and ``metrics.jsonl`` into ``out_dir`` as it goes, holding the
    directory's lock.  With ``resume`` an existing checkpoint is continued (at its own
    global batch, which may be smaller than ``global_batch`` after an out-of-memory
    fallback); without it an existing checkpoint is an error, so nothing trained is
    overwritten.

    Gradient accumulation (``spec.train.accumulation_steps``, k): every step's share of a
    rank, B / N samples, runs as k micro-batches of b = B / (N k)
    (:meth:`_RankTrainer.run_epoch`).  The record's ``local_batch`` is the share B / N (the
    samples a rank's gradient averages, and what the noise scale counts as the local
    batch), ``micro_batch`` is b (what one forward/backward holds in memory) and
    ``accumulation_steps`` is k; each epoch line carries the last two.  A resume goes on at
    the checkpoint's k, as at its global batch (an out-of-memory fallback may have raised
    it; a note says so when the spec asks for another k): the steps and their samples are
    the same at any k, only the summation order of the gradient differs.  Out of memory
    halves the micro-batch: at the same global batch with k doubled while b is even, else
    a smaller global batch (:func:`next_fallback`); each ``fallbacks`` entry says
    ``from_``/``to_global_batch`` and ``from_``/``to_accumulation_steps``.  SIGINT/SIGTERM
    end the run with :class:`~tula.core.errors.Interrupted` once the ranks have stopped; the
    last finished epoch's checkpoint is kept.

    With a batch schedule, a change of the worker count starts a new world (a generation)
    from the checkpoint; a new batch on the same workers goes on in the same world
    (:func:`train_world`).  The record's ``generations`` has one entry per stretch of
    epochs at one (N, B) that this call trained: ``n_workers``, ``global_batch``,
    ``from_epoch`` (its first epoch), ``wall_s``, ``world`` (1, 2, ...: entries with the
    same number ran in one world, one process group) and ``new_world`` (true where the
    entry started its world -- the first, after a change of N, or after an out-of-memory
    fallback --, false for a batch change inside the world).  The record's ``n_workers``,
    ``global_batch``, ``local_batch`` and ``steps_per_epoch`` are the last entry's.

    ``models``: the job's models record (``tula run`` passes it), which
    ``train.workers: {rule: plan}`` needs: at each batch change the worker count the models
    rank best (:class:`tula.core.live_plan.WorkerPlan`); each decision's ranking is in the
    epoch's ``schedule`` line."""
    if launcher is None:
        from tula.engine.launch.clusters import open_launcher

        with open_launcher(spec, n_workers=n_workers) as opened:
            return _train(spec, method, n_workers, global_batch, out_dir, resume, opened, on_event, models)
    return _train(spec, method, n_workers, global_batch, out_dir, resume, launcher, on_event, models)


def _check_fixed_world(launcher: Launcher, n_workers: int, spec: JobSpec) -> None:
    """A launched world (``--cluster env``) has one size: training uses all of its ranks, and
    a worker count cannot grow or shrink in it."""
    size = launcher.world_size
    if size is None:
        return
    started_by = getattr(getattr(launcher, "world", None), "source", "its launcher")
    if n_workers != size:
        raise SpecError(
            f"this world (started by {started_by}) has {size} ranks; train on {size} workers "
            f"(--workers {size}, or leave --workers out), not {n_workers}"
        )
    w = spec.train.workers
    if w is not None and (w.min != size or w.max != size):
        raise SpecError(
            f"train.workers grows or shrinks the worker count ({w.min} to {w.max}), but a world started by "
            f"{started_by} keeps its {size} ranks; set train.workers.min and max to {size}, or use another --cluster"
        )


def _check_before_any_world(
    spec: JobSpec, method: str, n_workers: int, launcher: Launcher, models: dict | None = None
) -> None:
    """The sentences a run is refused with before its directory is locked: a batch schedule
    the method cannot follow, the plan's worker rule without the models, a worker count a
    launched world cannot have, fp16 on a CPU."""
    if spec.train.batch_schedule is not None or spec.train.workers is not None:
        problem = schedule_problem(method, spec)
        if problem:
            raise SpecError(problem)
    if uses_models(spec):
        worker_plan(spec, models, method)  # the models are there and rank this job's method
    _check_fixed_world(launcher, n_workers, spec)
    check_sinks(spec.train.loggers)  # a metrics sink whose package is missing: one sentence naming it
    if spec.train.precision == "fp16":  # fp16 on a CPU: one sentence before any world
        device = getattr(launcher, "device", "auto")
        check_precision("fp16", launcher.facts()["device"] if device == "auto" else device)


def _train(
    spec: JobSpec,
    method: str,
    n_workers: int,
    global_batch: int,
    out_dir: str | Path,
    resume: bool,
    launcher: Launcher,
    on_event: Callable[[dict], None] | None,
    models: dict | None = None,
) -> dict:
    out = check_out_dir(Path(out_dir))
    _check_before_any_world(spec, method, n_workers, launcher, models)
    _, data = check_workload(spec)
    # the one hook of the metrics sinks (train.loggers): every finished epoch's event, in this process only
    sinks = EpochSinks(spec, method, out, resume, on_event)
    run = TrainSupervisor(spec, method, n_workers, global_batch, out, launcher, sinks, data.train_size, models)
    with interrupts.graceful_signals(), locked(out), sinks:
        record = run.run(resume)
        late = interrupts.requested()
    if late:  # the stop came as the last epoch ended: everything is kept, and the command still ends as stopped
        raise _interrupted(late, spec.epochs, spec.epochs, out)
    return record


class TrainSupervisor:
    """A training run as its caller supervises it (:func:`train`): the generations -- one
    launched world each -- from the resume state and the first configuration to the record.

    Its steps are methods, each testable without a world: :meth:`resume_from` (the state a
    checkpoint's header gives), :meth:`first_schedule` (epoch 0's configuration under a
    batch schedule), :meth:`generation` (one world run, its failure mapped to a status or a
    sentence), :meth:`resize` (the next generation's configuration:
    :meth:`next_configuration`), :meth:`fall_back` (the configuration after an
    out-of-memory) and :meth:`record` (the run's ``train.json``).  Between them the
    configuration the next world starts at is ``global_batch``, ``n_workers`` and
    ``accum`` (k)."""

    def __init__(
        self,
        spec: JobSpec,
        method: str,
        n_workers: int,
        global_batch: int,
        out: Path,
        launcher: Launcher,
        on_event: Callable[[dict], None] | None,
        train_size: int,
        models: dict | None = None,
    ) -> None:
        self.spec, self.method, self.out, self.launcher, self.train_size = spec, method, out, launcher, train_size
        self.models = models  # the fitted models: train.workers.rule 'plan' ranks worker counts by them
        self.emit: Callable[[dict], None] = on_event or (lambda ev: None)
        self.scheduled = spec.train.batch_schedule is not None or spec.train.workers is not None
        self.global_batch, self.n_workers, self.accum = global_batch, n_workers, spec.train.accumulation_steps
        self.fallbacks: list[dict] = []
        self.resumed_from_epoch: int | None = None
        self.first_trained: dict | None = None  # a resumed run's first epoch (its schedule's caps start there)
        self.notes: list[str] = []
        self.schedule: dict | None = None  # a batch schedule's state, LR multiplier and caps
        self.generations: list[dict] = []
        self.at_epoch = 0  # the last finished epoch when a world starts
        self.first_batch = global_batch
        self.device = "cpu"
        self.t0 = time.perf_counter()

    # ------------------------------------------------------------------ the whole run
    def run(self, resume: bool) -> dict:
        """Train: the resume state, the first configuration, then generations until one
        finishes (``ok``), each ended by a resize or an out-of-memory starting the next."""
        self.resume_state(resume)
        for message in self.notes:
            self.emit({"type": "note", "message": message})
        if self.scheduled:
            self.first_schedule()
        validate_config(self.spec, self.method, self.n_workers, self.global_batch, self.train_size, self.accum)
        self.device = self.launcher.facts()["device"]
        self.first_batch = self.global_batch
        self.t0 = time.perf_counter()
        self.at_epoch = self.resumed_from_epoch or 0
        while True:
            status, note, res = self.generation()
            if status == "ok":
                assert res is not None
                return self.record(res)
            if status == "interrupted":
                assert res is not None
                raise _interrupted(res[0].get("signal"), res[0]["epochs_done"], self.spec.epochs, self.out)
            if status == "resize":  # the next generation: a new world of its own size, on a fresh port
                assert res is not None
                self.resize(res[0])
                continue
            self.fall_back(note)

    # ------------------------------------------------------------------ before the first world
    def resume_state(self, resume: bool) -> None:
        """Where the run starts: a checkpoint in the directory is continued only with
        ``resume`` (:meth:`resume_from`), and ``resume`` needs one."""
        if has_checkpoint(self.out):
            if not resume:
                raise RunDirError(
                    f"{self.out} already holds a training run; pass --resume {self.out} to continue it, or choose "
                    "another output directory"
                )
            self.resume_from(checkpoint_meta(self.out))
        elif resume:
            raise RunDirError(f"there is no checkpoint in {self.out} to resume; run without --resume to start training")

    def resume_from(self, meta: dict) -> None:
        """Go on from a checkpoint's header ``meta``: its method (and, without a schedule, its
        worker count) must be this run's; its global batch, accumulation steps and fallbacks
        are taken (an out-of-memory fallback may have changed the first two; a note says so
        when k differs from the spec's), and with a schedule the configuration it chose
        after the last finished epoch."""
        check_resumed_precision(meta, self.spec, self.out)  # before any world: the ranks check it again on loading
        if meta["method"] != self.method or (not self.scheduled and meta["n_workers"] != self.n_workers):
            raise SpecError(
                f"the checkpoint in {self.out} was trained with method {meta['method']!r} on "
                f"{meta['n_workers']} worker(s), not {self.method!r} on {self.n_workers}; resume it with those"
            )
        self.global_batch, self.fallbacks = meta["global_batch"], list(meta.get("fallbacks", []))
        # the checkpoint's k, as its global batch: an out-of-memory fallback may have raised it
        trained_k = meta.get("accumulation_steps", 1)
        if trained_k != self.accum and not self.scheduled:  # a schedule chooses its own k
            self.notes.append(
                f"resuming at the checkpoint's {trained_k} accumulation step(s), not train.accumulation_steps "
                f"{self.accum} (the same samples and updates; only the micro-batch differs)"
            )
        self.accum = trained_k
        if self.scheduled:  # the generation the schedule chose after the last finished epoch
            self.global_batch = meta.get("next_global_batch") or self.global_batch
            self.n_workers = meta.get("next_n_workers") or meta["n_workers"]
            self.accum = meta.get("next_accumulation_steps") or self.accum
        self.resumed_from_epoch = meta["epoch"]
        self.first_trained = meta["history"][0] if meta["epoch"] and meta["history"] else None

    def first_schedule(self) -> None:
        """A batch schedule's caps (their defaults, e.g. batch_per_worker, from the run's first
        configuration) and, for a new run, epoch 0's configuration within them; a resumed run
        takes the schedule's state and LR multiplier from the checkpoint.  Then the workers
        the launcher can provide (:func:`_available`)."""
        first = self.first_trained or {"global_batch": self.global_batch, "n_workers": self.n_workers}
        caps = caps_from_spec(
            self.spec,
            first["global_batch"],
            first["n_workers"],
            self.train_size,
            max_local_batch=None,
            models=self.models,
            method=self.method,
        )
        if self.resumed_from_epoch is None:  # epoch 0's configuration, within the caps
            d = next_config(state_from_spec(self.spec, self.global_batch), 0, [], caps)
            self.global_batch, self.n_workers, self.accum = d.global_batch, d.n_workers, d.accumulation_steps
            self.schedule = {"state": d.state, "lr_multiplier": d.lr_multiplier, "caps": caps}
        else:  # the state and LR multiplier come from the checkpoint
            self.schedule = {"state": None, "lr_multiplier": 1.0, "caps": caps}
        self.global_batch, self.n_workers = _available(
            self.launcher, self.global_batch, self.n_workers, self.schedule, self.emit, self.train_size, self.accum
        )

    # ------------------------------------------------------------------ one generation
    def epochs_kept(self) -> int:
        """The last finished epoch: the checkpoint's (0 without one)."""
        return checkpoint_meta(self.out)["epoch"] if has_checkpoint(self.out) else 0

    def generation(self) -> tuple[str, str, list[dict] | None]:
        """One world at the current configuration (:func:`train_world` on every rank):
        ``(status, note, the ranks' results)`` -- ``ok``, ``interrupted``, ``resize`` or
        ``oom``; a failed world is mapped by :meth:`world_failed` (results ``None``).  The
        batches it trained at join ``generations``."""
        if interrupts.requested():
            kept = self.epochs_kept() if has_checkpoint(self.out) else (self.resumed_from_epoch or 0)
            raise _interrupted(None, kept, self.spec.epochs, self.out)
        self.emit(
            {
                "type": "start",
                "global_batch": self.global_batch,
                "n_workers": self.n_workers,
                "accumulation_steps": self.accum,
                "micro_batch": self.global_batch // self.n_workers // self.accum,
                "steps_per_epoch": steps_per_epoch(self.train_size, self.global_batch),
                "epochs": self.spec.epochs,
            }
        )
        started = time.perf_counter()
        cap = self.spec.search.memory_budget_bytes if self.spec.search.enforce_memory_cap else None
        res: list[dict] | None = None
        try:
            res = self.launcher.run(
                train_world,
                self.n_workers,
                self.spec.to_dict(),
                self.method,
                self.global_batch,
                str(self.out),
                self.fallbacks,
                cap,
                uuid.uuid4().hex,
                self.schedule,
                self.accum,
                on_event=lambda rank, ev: self.emit(ev),
                timeout_s=None,
            )
            status, note, segments = res[0]["status"], res[0].get("note", ""), res[0]["segments"]
            # the batch the world was at when it ended (a batch change inside it moves it)
            self.global_batch, self.accum = res[0]["global_batch"], res[0]["accumulation_steps"]
        except WorkerError as err:
            status, note, segments = self.world_failed(err)
        except Interrupted as err:  # stopped before it began (its launcher's world gate: waiting for workers)
            kept = self.epochs_kept() if has_checkpoint(self.out) else (self.resumed_from_epoch or 0)
            raise _interrupted(err.signum, kept, self.spec.epochs, self.out) from None
        self.add_segments(segments, started)
        return status, note, res

    def world_failed(self, err: WorkerError) -> tuple[str, str, list[dict]]:
        """A world that failed: an interruption raises :class:`~tula.core.errors.Interrupted`,
        any cause but out-of-memory :class:`TrainFailed` (saying which epochs are kept); an
        out-of-memory is ``("oom", note, segments)``, the segments from the epochs it
        checkpointed, and the configuration the one it went on at after them."""
        meta = checkpoint_meta(self.out) if has_checkpoint(self.out) else None
        done = meta["epoch"] if meta else 0
        if err.cause == "interrupted" or interrupts.requested():
            raise _interrupted(None, done, self.spec.epochs, self.out) from None
        if err.cause != "oom":
            raise TrainFailed(
                f"{err}; the {done} epoch(s) finished before it are kept in {self.out / CHECKPOINT}"
                if done
                else str(err),
                rank=err.rank,
                details=err.details,
                cause=err.cause,
            ) from None
        segments = _segments_from_history(meta["history"][self.at_epoch : done] if meta else [])
        if segments and meta is not None and meta.get("next_n_workers") == self.n_workers:
            # it went on at the next batch
            self.global_batch = meta.get("next_global_batch") or self.global_batch
            self.accum = meta.get("next_accumulation_steps") or self.accum
        return "oom", str(err), segments

    def add_segments(self, segments: list[dict], started: float) -> None:
        """A world's segments (one per batch it trained at) join ``generations`` under the
        next world number; the first one's time, when the world left it open, counts from
        ``started`` (the world's start)."""
        if not segments:
            return
        world_no = self.generations[-1]["world"] + 1 if self.generations else 1
        if segments[0]["wall_s"] is None:  # the world's start counts to its first batch
            later = sum(g["wall_s"] for g in segments[1:])
            segments[0] = {**segments[0], "wall_s": time.perf_counter() - started - later}
        self.generations.extend({**g, "world": world_no, "new_world": k == 0} for k, g in enumerate(segments))

    # ------------------------------------------------------------------ between generations
    def next_configuration(self, result: dict) -> tuple[int, int, int]:
        """The next generation's ``(global batch, workers, accumulation steps)`` after a world
        that ended for a resize (``result``: its rank 0's): the one the batch schedule chose.
        The place for a rule that chooses the worker count at a batch change."""
        return result["next_global_batch"], result["next_n_workers"], result.get("next_accumulation_steps", self.accum)

    def resize(self, result: dict) -> None:
        """Move to the next generation after a world that ended for a resize: its
        configuration (:meth:`next_configuration`), with the workers the launcher can
        provide (:func:`_available`), checked, and said in a ``resize`` event."""
        self.at_epoch = result["epochs_done"]
        global_batch, n_workers, self.accum = self.next_configuration(result)
        self.global_batch, self.n_workers = _available(
            self.launcher, global_batch, n_workers, self.schedule, self.emit, self.train_size, self.accum
        )
        validate_config(self.spec, self.method, self.n_workers, self.global_batch, self.train_size, self.accum)
        log.info(
            "after epoch %d: a new world of %d worker(s) at B=%d", self.at_epoch, self.n_workers, self.global_batch
        )
        self.emit(
            {
                "type": "resize",
                "at_epoch": self.at_epoch,
                "global_batch": self.global_batch,
                "n_workers": self.n_workers,
                "accumulation_steps": self.accum,
                "new_world": True,
            }
        )

    def fall_back(self, note: str) -> None:
        """After an out-of-memory (``note``: why) the micro-batch halves -- k doubles at the
        same global batch while it can, then B halves (:func:`next_fallback`) -- from the last
        checkpoint; a schedule's caps stop it growing back into the micro-batch that ran out.
        The fallback joins ``fallbacks`` and is emitted; :class:`InfeasibleError` when no
        smaller batch is left."""
        max_k = None
        if self.schedule:  # the schedule must not grow back into the micro-batch that ran out of memory
            failed_micro = self.global_batch // self.n_workers // self.accum
            caps = self.schedule["caps"]
            lim = caps.max_local_batch
            self.schedule["caps"] = replace(
                caps, max_local_batch=min(lim or failed_micro, failed_micro - 1) if failed_micro > 1 else lim
            )
            max_k = caps.max_accumulation_steps  # a schedule's k stays within its caps
        smaller, new_k = next_fallback(self.global_batch, self.n_workers, self.accum, max_k)
        self.at_epoch = self.epochs_kept()
        self.fallbacks.append(
            {
                "from_global_batch": self.global_batch,
                "to_global_batch": smaller,
                "from_accumulation_steps": self.accum,
                "to_accumulation_steps": new_k,
                "at_epoch": self.at_epoch,
                "reason": note[:300],
            }
        )
        self.emit({"type": "fallback", **self.fallbacks[-1]})
        log.info(
            "out of memory at B=%d (k=%d): going on from epoch %d at B=%d (k=%d): %s",
            self.global_batch, self.accum, self.at_epoch, smaller, new_k, note[:300],
        )  # fmt: skip
        if smaller < smallest_batch_for(self.method, self.spec, self.n_workers):
            micro = self.global_batch // self.n_workers // self.accum
            raise InfeasibleError(
                f"global batch {self.global_batch} ran out of memory on {self.n_workers} worker(s)"
                + (f" at a micro-batch of {micro} ({self.accum} accumulation steps)" if self.accum > 1 else "")
                + " and no smaller batch is left to fall back to"
            )
        self.global_batch, self.accum = smaller, new_k

    # ------------------------------------------------------------------ the record
    def record(self, res: list[dict]) -> dict:
        """The run's record (``train.json``) from the last world's results ``res`` (one per
        rank): the configuration it ended at, the history, the fallbacks, the generations."""
        rank0 = res[0]
        hist = rank0["history"]
        spec = self.spec
        return {
            "kind": TRAIN_KIND,
            "version": VERSIONS[TRAIN_KIND],
            "spec": spec.to_dict(),
            "method": self.method,
            "n_workers": self.n_workers,
            "requested_global_batch": self.first_batch,
            "global_batch": self.global_batch,
            "local_batch": self.global_batch // self.n_workers,
            "accumulation_steps": self.accum,
            "micro_batch": self.global_batch // self.n_workers // self.accum,
            "steps_per_epoch": rank0["steps_per_epoch"],
            "epochs": spec.epochs,
            "steps_done": rank0["steps_done"],
            "resumed_from_epoch": self.resumed_from_epoch,
            "fallbacks": self.fallbacks,
            "history": hist,
            "final": hist[-1] if hist else {},
            "best_test_top1": max((h["test_top1"] for h in hist if "test_top1" in h), default=math.nan),
            "replicas_identical": len({r["param_digest"] for r in res}) == 1,
            "traces": {**rank0["traces"], **step_traces(self.out / METRICS)},
            "train_s": time.perf_counter() - self.t0,
            "device": self.device,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "batch_schedule": None if spec.train.batch_schedule is None else spec.train.batch_schedule.kind,
            "generations": self.generations,
        }
