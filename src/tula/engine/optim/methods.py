"""Training methods: how a DDP model is optimised at a large global batch.

A method bundles what the training runner needs and nothing else:

* ``optimizer`` -- a ``torch.optim.Optimizer`` (possibly a wrapper) the runner calls
  ``zero_grad()`` and ``step()`` on, checkpointed through ``state_dict()``;
* ``scheduler`` -- a per-step LR scheduler (:class:`MethodSchedule`): the LR factor of
  :meth:`Method.lr_factor` (LR scaling, linear warm-up, milestone decay) on the
  optimiser's base LR; ``get_last_lr()`` is the LR of the next step, also after a resume;
* hooks: :meth:`after_backward` (after the synchronised backward, before the step: AGS
  measures its factors there, AdaScale its gain), :meth:`before_eval` (post-local SGD
  averages the replicas there), :meth:`release` (before a new method at another batch
  replaces it in the same world);
* what it did: :meth:`drain_step_traces` (per-step values since the last call, which the
  runner writes into each epoch's metrics) and :meth:`traces` (a bounded summary).

The runner (``tula.engine.train``) builds a method per rank with :func:`build_method` and
never looks inside it.  The methods, their classes and constraints are the table of
:mod:`tula.core.registry`.  Methods of this module: ``lbt`` (vanilla large-batch training),
``lrs`` (linear LR scaling with warm-up, Goyal et al.), ``static`` (static gradient
scaling U(s), Eq. 8) and ``ags`` (adaptive gradient scaling, Algorithm 1); the other
baselines (``lars``, ``lamb``, ``polo``, ``adascale``) are in :mod:`tula.engine.optim.baselines`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from tula.core.job_rules import check_method
from tula.core.registry import METHODS, method_class
from tula.core.spec import JobSpec
from tula.engine.batch import batch_loss, slice_batch
from tula.engine.optim.ags import AGS
from tula.engine.workloads import build_optimizer

LossFn = Callable[[Any, Any], torch.Tensor]


def _schedule_owns_milestones(kind: str) -> bool:
    from tula.core.schedules import SCHEDULES

    return SCHEDULES[kind].owns_lr_milestones


class MethodSchedule(LambdaLR):
    """``LambdaLR`` on a method's :meth:`Method.lr_factor` that can also be put at any step
    (a resume, the out-of-memory fallback) and re-applied within a step when the factor's
    inputs change (AdaScale's gain), keeping ``get_last_lr()`` equal to the LR the
    optimiser holds, which is the LR of the next step."""

    def set_step(self, step: int) -> None:
        """Put the schedule at optimiser step ``step``: its LR into every param group."""
        self.last_epoch = step
        for group, base, factor in zip(self.optimizer.param_groups, self.base_lrs, self.lr_lambdas):
            group["initial_lr"] = base  # the base of this method's rule, not a loaded checkpoint's
            group["lr"] = base * factor(step)
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


class Method:
    """Vanilla large-batch training (LBT): the spec's optimiser at the spec's LR.

    Parameters
    ----------
    ddp : the ``DistributedDataParallel`` model of this rank
    spec : the job spec (``optimizer`` and ``train`` sections are read)
    global_batch : samples per step over all ranks
    n_workers : ranks in the world
    steps_per_epoch : optimiser steps in one epoch
    """

    name = "lbt"
    warmup = False  # linear LR warm-up over spec.train.warmup_epochs

    def __init__(self, ddp: nn.Module, spec: JobSpec, global_batch: int, n_workers: int, steps_per_epoch: int):
        if self.name in METHODS:
            check_method(self.name, spec, n_workers, global_batch)  # the registry's constraints
        self.ddp, self.spec = ddp, spec
        self.global_batch, self.n_workers, self.steps_per_epoch = global_batch, n_workers, steps_per_epoch
        # a batch schedule's LR multiplier (its LR rule, and LR decays it takes instead of
        # growing the batch); when the schedule owns the milestones they are not applied here
        self.schedule_lr = 1.0
        # (|G_b|^2 averaged over the ranks, |G_B|^2) of the last step when the method measures
        # them anyway (AdaScale every step, AGS at its factor updates); the runner's gradient
        # noise scale takes them instead of measuring again; None when there are none
        self.step_norms: tuple | None = None
        self.step_norms_batches: tuple[int, int] | None = None
        # fp16's loss scale of the current step (set by the runner before after_backward; None
        # otherwise): what a method reading gradients from a DDP hook, before they were unscaled,
        # divides by
        self.loss_scale: float | None = None
        sched = spec.train.batch_schedule
        self.milestones_owned = sched is not None and _schedule_owns_milestones(sched.kind)
        self.optimizer = self.build_optimizer()
        self.scheduler: MethodSchedule | None = MethodSchedule(self.optimizer, self.lr_factor)

    # ------------------------------------------------------------ what subclasses change
    @property
    def lr_schedule(self) -> MethodSchedule:
        """The LR schedule (``scheduler``), which :meth:`release` lets go."""
        if self.scheduler is None:
            raise RuntimeError(f"the {self.name} method was released: it has no LR schedule any more")
        return self.scheduler

    @property
    def module(self) -> nn.Module:
        return getattr(self.ddp, "module", self.ddp)

    def lr_scale(self) -> float:
        """Multiplier of the spec's LR once warm-up is over (LR scaling rules go here)."""
        return 1.0

    def base_lr(self) -> float:
        return self.spec.optimizer.lr * self.lr_scale()

    def build_optimizer(self) -> torch.optim.Optimizer:
        return build_optimizer(self.module, self.spec, lr=self.base_lr())

    def lr_factor(self, step: int) -> float:
        """LR multiplier at optimiser step ``step``: warm-up (from the unscaled LR, or a tenth
        of the LR when there is no scaling) and a ``lr_gamma`` decay after each milestone."""
        t = self.spec.train
        epoch = step / max(self.steps_per_epoch, 1)
        f = 1.0 if self.milestones_owned else t.lr_gamma ** sum(epoch >= m for m in t.lr_milestones)
        if self.warmup and t.warmup_epochs > 0 and epoch < t.warmup_epochs:
            scale = self.lr_scale()
            start = 1.0 / scale if scale > 1.0 else 0.1
            f *= start + (1.0 - start) * epoch / t.warmup_epochs
        return f * self.schedule_lr

    def set_schedule_lr(self, multiplier: float, step: int) -> None:
        """Apply a batch schedule's LR multiplier from optimiser step ``step`` on."""
        self.schedule_lr = float(multiplier)
        self.set_step(step)

    # ------------------------------------------------------------ hooks
    def after_backward(self, step: int, x: Any, y: Any, loss_fn: LossFn) -> None:
        """Called on every rank after the synchronised backward of step ``step`` and before
        ``optimizer.step()``; ``x``, ``y`` are this rank's local batch (tensors, or a dict batch and
        ``None``: slice and call the model through :mod:`tula.engine.batch`)."""

    def before_eval(self) -> None:
        """Called on every rank before evaluation and before a checkpoint is written."""

    def release(self) -> None:
        """The method is done: a new one replaces it in the same world (a batch change at the
        same worker count).  Free what it holds outside itself (a process group of its own),
        and let it go without waiting for the garbage collector (its LR schedule refers back
        to it)."""
        self.scheduler = None

    def drain_step_traces(self) -> dict[str, list]:
        """Per-step values (one list entry per optimiser step) since the last call, moved to
        the host and cleared: the runner calls it at every epoch end.  Their keys never
        appear in :meth:`traces`.  ``{}`` for methods that keep none."""
        return {}

    def traces(self) -> dict[str, Any]:
        """A bounded, JSON-serialisable summary of what the method did, for the run record."""
        return {}

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "extra": self.extra_state()}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Restore the optimiser (and extras) and put the LR schedule at ``step``.

        The LR itself is recomputed from this method's rule, not taken from the saved
        param groups, so that a resume at another global batch (out-of-memory fallback)
        gets the LR of the new batch."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.load_extra_state(state.get("extra") or {})
        self.set_step(step)

    def set_step(self, step: int) -> None:
        self.lr_schedule.set_step(step)

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


class LRS(Method):
    """Linear LR scaling relative to ``train.base_batch`` with warm-up (Goyal et al.)."""

    name = "lrs"
    warmup = True

    def lr_scale(self) -> float:
        return self.global_batch / self.spec.train.base_batch


class ScaledGradients(Method):
    """Base of ``static`` and ``ags``: the spec's optimiser wrapped in :class:`AGS`."""

    mode = "adaptive"
    optimizer: AGS  # what build_optimizer returns here

    def __init__(self, ddp: nn.Module, spec: JobSpec, global_batch: int, n_workers: int, steps_per_epoch: int) -> None:
        a = spec.train.ags  # b_small < global batch: checked by Method.__init__ (tula.core.registry)
        self.local_small = max(1, a.b_small // n_workers)
        self.update_every = a.update_every or steps_per_epoch
        self._measured_at: int | None = None  # the step of the last factor measurement in this process
        super().__init__(ddp, spec, global_batch, n_workers, steps_per_epoch)

    def build_optimizer(self) -> AGS:
        a = self.spec.train.ags
        return AGS(
            super().build_optimizer(),
            b_large=self.global_batch,
            b_small=self.local_small * self.n_workers,
            delta=a.delta,
            s_min=a.s_min,
            granularity=a.granularity,
            mode=self.mode,
            static_scale=a.static_scale,
        )

    def drain_step_traces(self) -> dict[str, list]:
        """``{"delta": [Δ(G) or None where infinite], "scaled": [bool]}`` per step."""
        return self.optimizer.drain_trace()

    def traces(self) -> dict[str, Any]:
        return self.optimizer.traces()


class StaticScaling(ScaledGradients):
    """Static gradient scaling U(s) (Eq. 8): gradients times ``ags.static_scale`` except in
    sensitive phases (gradient variability at or above ``ags.delta``)."""

    name = "static"
    mode = "static"


class AdaptiveScaling(ScaledGradients):
    """Adaptive gradient scaling (Algorithm 1).  Every ``update_every`` steps the factors are
    measured: the gradient of a sub-batch (the first ``b_small / N`` samples of each rank's
    local batch, through the bare module so DDP does not synchronise it) is averaged over
    the ranks with one all-reduce and compared with the already synchronised large-batch
    gradient.  Every rank then holds the same factors; BatchNorm running statistics are
    restored afterwards, so the measurement leaves no trace on the model."""

    name = "ags"

    def after_backward(self, step: int, x: Any, y: Any, loss_fn: LossFn) -> None:
        # every update_every steps; when the runner skipped the step it was due at (an fp16
        # overflow: it does not call this), at the next step it calls this at
        due_at = step - step % self.update_every
        if step != due_at:
            if self._measured_at is None:  # started or resumed after due_at: measured there before
                self._measured_at = due_at
            if self._measured_at >= due_at:
                return
        self._measured_at = step
        module, k = self.module, self.local_small
        # the sub-batch and the batch gradient: with one worker, the gradient noise scale's pair
        self.step_norms = self.optimizer.measure_factors(
            lambda: batch_loss(module, loss_fn, slice_batch(x, 0, k), slice_batch(y, 0, k)),
            module,
            loss_scale=self.loss_scale,
        )
        self.step_norms_batches = (self.local_small * self.n_workers, self.global_batch)


def build_method(
    name: str, ddp: nn.Module, spec: JobSpec, global_batch: int, n_workers: int, steps_per_epoch: int
) -> Method:
    """The method ``name`` (one of :data:`tula.core.registry.METHOD_NAMES`) for this rank's DDP
    model; an unknown name or a broken constraint is a :class:`~tula.core.errors.SpecError`."""
    return method_class(name)(ddp, spec, global_batch, n_workers, steps_per_epoch)


def sqrt_scale(global_batch: int, base_batch: int) -> float:
    """Square-root LR scaling (used by LAMB)."""
    return math.sqrt(global_batch / base_batch)
