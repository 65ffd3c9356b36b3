"""The run trial: what a training run spends beyond the profile's plain step (#26), measured
by the trainer itself in a profiled world.

The profile times plain DDP steps.  ``tula train`` runs the method's step (AGS's gate and its
periodic factor measurement, LARS's trust ratios, AdaScale's gain, ...) and, after every
epoch, evaluates, reduces the epoch's figures, flushes the noise scale and writes a
checkpoint and a metrics line.  A run trial, at the end of each profiled world, builds the
real trainer (:class:`tula.engine.rank_loop._RankTrainer`, the job's ``train.method``; its
epoch's end and checkpoint are timed too) at one configuration the world already ran, and times:

* its steps (:meth:`tula.engine.step.TrainStep.train_step` with the method, the step training
  runs; the plain steps beside them are the same class's without a method),
  one by one after warm-up, each beside one of the profile's plain steps, so the method's
  extra per step is a difference of two medians measured side by side; the steps at which
  the method's periodic work falls due (``update_every``) are told apart from the others;
  it runs at the smallest global batch the method can train at within the ones the world
  profiled (the extra is the method's work on gradients and parameters, not on samples; a
  small batch keeps the two models within memory);
* one epoch's end: evaluation (``eval_s``), the rest of
  :meth:`~tula.engine.rank_loop._RankTrainer.epoch_record` (``epoch_end_s``, evaluation included)
  and the checkpoint's write (``checkpoint_s``: under DDP rank 0's file, under FSDP every rank's
  shards and rank 0's file, the slowest rank's; into a temporary folder, removed).

:func:`tula.core.run_costs.fit_run_costs` turns the trials into the plan's per-step and
per-epoch terms.
"""

from __future__ import annotations

import math
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from tula.core.records import RunTrial
from tula.core.spec import JobSpec
from tula.engine.checkpoint import save_checkpoint
from tula.engine.data import data_path
from tula.engine.ddp import agree_max, start_together
from tula.engine.fsdp import Sharded, prune_shards, save_shards
from tula.engine.launch import WorkerContext
from tula.engine.memory import errno_evidence
from tula.engine.rank_loop import _RankTrainer

MAX_STEPS = 60  # timed pairs of steps of a run trial at most
MIN_STEPS = 8  # and at least: the extra is a difference of two medians


@dataclass(frozen=True)
class RankRunTrial:
    """One rank's timed run trial (:func:`run_trial`): the method's steps beside the plain ones,
    seconds each, which of them the periodic work fell due at, and the epoch's end."""

    n_workers: int
    global_batch: int
    method: str
    local_batch: int
    steps_per_epoch: int
    update_every: int | None  # the method's periodic work: every so many steps (None: none)
    step_times_s: list[float]
    plain_step_times_s: list[float]
    due: list[bool]
    eval_s: float
    epoch_end_s: float
    checkpoint_s: float  # DDP: rank 0's (0.0 on the others); FSDP: every rank's, its shards and rank 0's file


@dataclass(frozen=True)
class RunTrialNotRun:
    """A run trial that timed nothing: ``oom`` (the trainer's probe step did not fit at
    ``global_batch``) or ``skipped`` (``note`` says why: the method cannot train within the
    batches the world profiled)."""

    n_workers: int
    method: str
    status: Literal["oom", "skipped"]
    global_batch: int | None = None
    note: str = ""

    def as_run_trial(self) -> RunTrial:
        """As the profile record's ``run_trials`` holds it: an ``oom`` trial with its batch, a
        ``skipped`` one with its note."""
        if self.status == "oom":
            return RunTrial(n_workers=self.n_workers, global_batch=self.global_batch, method=self.method, status="oom")
        return RunTrial(n_workers=self.n_workers, method=self.method, status=self.status, note=self.note)


def timed_indices(timed: int, min_timed_s: float, t_warm_s: float, every: int | None) -> list[int]:
    """The indices of a run trial's timed steps, after its two warm-up steps (0 and 1): at
    least ``timed`` and :data:`MIN_STEPS`, enough for ``min_timed_s`` at ``t_warm_s`` a pair of
    steps (up to :data:`MAX_STEPS`), and, when the method's periodic work falls due every
    ``every`` steps, at least one step at which it is due."""
    n = max(timed, MIN_STEPS, min(MAX_STEPS, math.ceil(min_timed_s / max(t_warm_s, 1e-9))))
    indices = list(range(2, 2 + n))
    if every and not any(i % every == 0 for i in indices):
        indices.append(every * math.ceil(indices[-1] / every))  # one due step: the periodic work's cost
    return indices


class _SideBySide:
    """A run trial's two kinds of timed step: the trainer's and the profile's plain one."""

    def __init__(self, ctx: WorkerContext, rt: _RankTrainer, plain_step: Callable[[], None]) -> None:
        self.ctx, self.rt, self.plain_step = ctx, rt, plain_step
        self.batches = data_path(rt.data, ctx.device).random_batches(rt.local_batch, torch.Generator().manual_seed(7))
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)

    def step(self, index: int) -> float:
        """One step as the training loop runs it (:meth:`tula.engine.step.TrainStep.run_epoch`):
        the ranks' stop check (its answer is the profile's to act on, at its next trial
        boundary), the batch, the method's step, the loss summed on the device."""
        ctx = self.ctx
        t0 = time.perf_counter()
        if ctx.stop is not None:
            ctx.stop.poll()
        batch = next(self.batches)
        with errno_evidence():
            self.loss_sum += self.rt.stepper.train_step(batch, index).double()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        return time.perf_counter() - t0

    def plain(self) -> float:
        t0 = time.perf_counter()
        self.plain_step()
        return time.perf_counter() - t0


def _time_epoch_end(
    ctx: WorkerContext, spec: JobSpec, rt: _RankTrainer, loss_sum: torch.Tensor, train_s: float
) -> tuple[float, float]:
    """One epoch's end, as training runs it (evaluation once first: its shapes' first run):
    ``(eval_s, epoch_end_s)``."""
    rt.stepper.evaluate(rt.data, rt.rank, rt.world, spec.train.eval_batch, spec.train.loss)
    if ctx.stop is not None:
        ctx.stop.drain()  # the last step's stop check, before the epoch end's collectives
    t0 = time.perf_counter()
    rec, _ = rt.epoch_record(0, loss_sum, train_s)
    epoch_end_s = time.perf_counter() - t0
    assert rec.eval_s is not None, "epoch_record times the evaluation of every epoch"
    return rec.eval_s, epoch_end_s


def _time_checkpoint(ctx: WorkerContext, rt: _RankTrainer, out: str) -> float:
    """The checkpoint's second write into ``out`` (as every epoch after the first writes it, beside the
    one before), as :meth:`~tula.engine.rank_loop._RankTrainer.write_epoch` writes it; this rank's
    seconds (the caller takes the slowest rank's).

    Under DDP rank 0 writes ``checkpoint.pt`` alone (0.0 on the others).  Under FSDP every rank writes
    its shards of the model and the optimiser's state (DCP, :func:`tula.engine.fsdp.save_shards`: its
    collectives hold the ranks together), then rank 0 the small ``checkpoint.pt`` and the pruning of
    the shards no checkpoint names; each rank into its own ``out`` (DCP makes the shards' folder on
    every rank), as a run directory on a file system every rank shares holds them."""
    sharded = isinstance(rt.ddp, Sharded)
    if ctx.rank != 0 and not sharded:
        return 0.0

    def write(epoch: int) -> None:
        ckpt = rt.checkpoint_state(epoch - 1, rt.now()) if ctx.rank == 0 else None
        ckpt = save_shards(rt.ddp, rt.method.optimizer, out, epoch, ckpt)
        if ckpt is not None:  # rank 0
            save_checkpoint(ckpt.to_state(), out)
            prune_shards(out)

    write(1)
    if sharded:
        start_together(ctx.device)  # the others do not wait for rank 0's first file inside the timed write
    t0 = time.perf_counter()
    write(2)
    return time.perf_counter() - t0


def run_trial(
    ctx: WorkerContext,
    spec: JobSpec,
    global_batch: int,
    timed: int,
    min_timed_s: float,
    plain_step: Callable[[], None],
) -> RankRunTrial | RunTrialNotRun:
    """Time the trainer of ``spec.train.method`` at ``global_batch`` on this world (see the
    module's docstring), each of its steps beside a ``plain_step()`` (the profile's own
    synchronised step with its batch, on the profile's model), so that the method's extra per
    step is a difference measured side by side; this rank's figures (the caller takes the
    slowest rank per step).  :class:`RunTrialNotRun` ``oom`` when the trainer's own probe step
    does not fit under DDP; under FSDP the probe is the synchronised sharded step
    (:func:`tula.engine.ddp.probe_fits`), and a rank that runs out of memory there fails the world
    with cause ``oom``, which the profile records as this world's run trial ``oom``, its trials kept
    (:meth:`tula.engine.profile.ProfileSession.world_failed`)."""
    method = spec.train.method
    out = tempfile.mkdtemp(prefix="tula-run-trial-")
    rt = _RankTrainer(ctx, spec, method, out, [], None, 1)
    try:
        rt.start_at(global_batch, None)
        if rt.probe() is not None:
            return RunTrialNotRun(ctx.world_size, method, "oom", global_batch=global_batch)
        every = getattr(rt.method, "update_every", None)  # the method's periodic work: every so many steps
        pair = _SideBySide(ctx, rt, plain_step)
        rt.model.train()
        pair.step(0)  # warm-up, and the first periodic measurement (step 0 is due)
        pair.plain()
        t_warm = pair.step(1) + pair.plain()
        indices = timed_indices(timed, min_timed_s, agree_max(t_warm, ctx.device), every)
        times, plains = [], []
        for i in indices:  # side by side: both see the same machine noise
            times.append(pair.step(i))
            plains.append(pair.plain())
        due = [bool(every and i % every == 0) for i in indices]
        rt.steps_done = 2 + len(indices)  # the trainer's steps this trial ran: the epoch's record counts them
        eval_s, epoch_end_s = _time_epoch_end(ctx, spec, rt, pair.loss_sum, sum(times))
        return RankRunTrial(
            n_workers=ctx.world_size,
            global_batch=global_batch,
            method=method,
            local_batch=rt.local_batch,
            steps_per_epoch=rt.n_steps,
            update_every=every,
            step_times_s=times,
            plain_step_times_s=plains,
            due=due,
            eval_s=eval_s,
            epoch_end_s=epoch_end_s,
            checkpoint_s=_time_checkpoint(ctx, rt, out),
        )
    finally:
        rt.data.close()
        shutil.rmtree(out, ignore_errors=True)


def merge_run_trials(per_rank: list[RankRunTrial | RunTrialNotRun]) -> RunTrial:
    """One run trial from every rank's, as the profile record's ``run_trials`` holds it: per
    step the slowest rank (the method's and the plain one's), then medians; the epoch's end
    the slowest rank's.  A trial that timed nothing is rank 0's (the ranks agree on it)."""
    first = per_rank[0]
    timed = [r for r in per_rank if isinstance(r, RankRunTrial)]
    if isinstance(first, RunTrialNotRun) or len(timed) != len(per_rank):
        return first.as_run_trial() if isinstance(first, RunTrialNotRun) else _not_run_everywhere(per_rank)
    steps = [max(xs) for xs in zip(*(r.step_times_s for r in timed))]
    plains = [max(xs) for xs in zip(*(r.plain_step_times_s for r in timed))]
    regular = [t for t, d in zip(steps, first.due) if not d] or steps
    due = [t for t, d in zip(steps, first.due) if d]
    return RunTrial(
        n_workers=first.n_workers,
        global_batch=first.global_batch,
        method=first.method,
        status="ok",
        local_batch=first.local_batch,
        steps_per_epoch=first.steps_per_epoch,
        update_every=first.update_every,
        step_times_s=steps,
        plain_step_times_s=plains,
        due=first.due,
        eval_s=max(r.eval_s for r in timed),
        epoch_end_s=max(r.epoch_end_s for r in timed),
        checkpoint_s=max(r.checkpoint_s for r in timed),
        t_run_step_s=statistics.median(regular),
        t_due_step_s=statistics.median(due) if due else None,
        t_step_plain_s=statistics.median(plains),
    )


def _not_run_everywhere(per_rank: list[RankRunTrial | RunTrialNotRun]) -> RunTrial:
    """The run trial of a world whose ranks disagreed (rank 0 timed, another did not): the
    first rank's that timed nothing."""
    return next(r for r in per_rank if isinstance(r, RunTrialNotRun)).as_run_trial()
