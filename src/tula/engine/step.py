"""One rank's training step, in one place: :class:`TrainStep`.

The profiler's trials (:class:`tula.engine.profile._Worker`), the run trial
(:mod:`tula.engine.run_trial`) and training (:class:`tula.engine.rank_loop._RankTrainer`) all
run their steps through this class, so the step the profile times is the step training runs:
a change of the precision, of the accumulation or of the update is made here once.

A job may name its own subclass in the spec (``train.step: "package.module:MyStep"``, see
:func:`step_class`); the profile and training then both use it.  The step, the epoch's loop
and the evaluation are public methods to override, as skorch's ``train_step``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tula.core.spec import JobSpec
from tula.engine.batch import batch_loss, batch_size, slice_batch
from tula.engine.evaluation import evaluate
from tula.engine.memory import errno_evidence
from tula.engine.precision import Precision
from tula.engine.workloads import Dataset, import_step_class

Batch = tuple[Any, Any]
"""(inputs, targets): tensors, or a dict batch and ``None`` (:mod:`tula.engine.batch`)."""


@dataclass
class EpochSteps:
    """What :meth:`TrainStep.run_epoch` ran: the sum of its steps' losses (float64, on the device:
    no host sync per step), the steps it ran, and whether it stopped early because the ranks
    agreed to stop."""

    loss_sum: torch.Tensor
    steps: int
    stopped: bool = False


class TrainStep:
    """One rank's step: forward, loss and backward over the micro-batches, then the update.

    Parameters
    ----------
    ddp : nn.Module
        The rank's model as a world runs it: a ``DistributedDataParallel`` wrapper, or
        :class:`tula.engine.ddp.OneRank` in a world of one rank (both have ``no_sync()``).
    loss_fn : callable
        The training loss, called as ``loss_fn(output, target)``; ``train.loss: model``'s
        :class:`tula.engine.batch.ModelLoss` takes the model's own (:func:`tula.engine.batch.batch_loss`).
    precision : Precision
        The arithmetic of the step (:class:`tula.engine.precision.Precision`: autocast, and the
        gradient scaler under fp16).
    optimizer : torch.optim.Optimizer, optional
        The optimiser of a step without a training method (the profile's plain step); training
        gives the method instead (:meth:`use_method`), whose optimiser it then steps.
    accumulation_steps : int
        ``k``: each step runs its batch as ``k`` micro-batches (see :meth:`forward_backward`).

    Attributes
    ----------
    method : object or None
        The training method (:mod:`tula.engine.optim.methods`: AGS, the baselines) whose hooks
        the update runs, or ``None`` for the plain optimiser.
    on_gradients : callable or None
        Called as ``on_gradients(finite)`` after the method's hooks and before the update, with
        whether the step's gradients are finite (training feeds the gradient noise scale here).

    Notes
    -----
    A subclass named in ``train.step`` is made by the ranks with these arguments, so it takes
    them on to ``super().__init__(*args, **kwargs)``.  Override :meth:`train_step` for the
    whole step (its loss is summed into the epoch's training loss), :meth:`forward_backward`
    for the passes only, :meth:`optimizer_step` for the update, :meth:`run_epoch` for the loop
    over an epoch's batches and :meth:`evaluate` for the test split's metrics.  The profile
    times :meth:`train_step` as training runs it; in its trials :attr:`method` is ``None`` (the
    spec's plain optimiser: the run trial measures the method's extra apart), so an override
    works with and without a method.
    """

    def __init__(
        self,
        ddp: nn.Module,
        loss_fn: Callable,
        precision: Precision,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        accumulation_steps: int = 1,
    ) -> None:
        self.ddp: Any = ddp  # DDP or OneRank: no_sync() is theirs, not nn.Module's
        self.loss_fn, self.prec = loss_fn, precision
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.method: Any = None
        self.on_gradients: Callable[[bool], None] | None = None

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are."""
        return next(self.model.parameters()).device

    @property
    def model(self) -> nn.Module:
        """The model itself (inside its DDP wrapper)."""
        module: nn.Module = getattr(self.ddp, "module", self.ddp)
        return module

    def use_method(self, method: Any) -> None:
        """Update with ``method``'s optimiser and hooks from the next step on (``None``: none yet)."""
        self.method = method
        self.optimizer = method.optimizer if method is not None else None

    # ------------------------------------------------------------------ the step
    def train_step(self, batch: Batch, step: int = 0, *, sync: bool = True) -> torch.Tensor:
        """One optimiser step on this rank's share of the global batch.

        Parameters
        ----------
        batch : (x, y)
            This rank's share of the global batch (B / N samples) and its targets: tensors, or
            a dict batch (``input_ids``, ``labels``, ...) and ``None`` (:mod:`tula.engine.batch`).
        step : int
            The step's index in the run (a method's periodic work, AGS's factor measurement,
            falls due by it).
        sync : bool
            ``False``: no gradient synchronisation at all (the profile's compute-only steps
            and its out-of-memory probe).

        Returns
        -------
        torch.Tensor
            The step's loss (the mean of its micro-batches' losses), detached, on the device.
        """
        x, y = batch
        assert self.optimizer is not None, "a step needs an optimizer or a method (use_method)"
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(x, y, sync=sync)
        self.optimizer_step(step, x, y)
        return loss

    def forward_backward(
        self, x: Any, y: Any, *, sync: bool = True, accumulation_steps: int | None = None
    ) -> torch.Tensor:
        """The step's forward and backward passes over ``x``, ``y``.

        With ``k`` = :attr:`accumulation_steps` > 1 the share runs as ``k`` micro-batches of
        ``batch_size(x) // k`` samples in order (every tensor of a dict batch sliced alike), the
        first ``k - 1`` (forward too: DDP decides at the forward whether the backward syncs)
        under DDP's ``no_sync()`` and the last one synchronised, each micro-batch's loss divided
        by ``k``: the gradient is the mean over the share, as at ``k = 1``.  ``sync=False``: every pass under ``no_sync()``.
        Under FSDP (:class:`tula.engine.fsdp.Sharded`) ``no_sync()`` skips the reduce-scatter only:
        every micro-batch still all-gathers its blocks' parameters for its forward and backward
        (they reshard after each), so the step pays the all-gathers ``k`` times and the
        reduce-scatter once (:class:`tula.core.effects.ShardingEffect`).
        ``accumulation_steps``: another ``k`` for this call (the out-of-memory probe runs one
        micro-batch as ``k = 1``).

        Returns
        -------
        torch.Tensor
            The loss (the mean over the micro-batches), detached.
        """
        k = self.accumulation_steps if accumulation_steps is None else accumulation_steps
        if k == 1:
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                with self.prec.autocast():
                    loss = batch_loss(self.ddp, self.loss_fn, x, y)
                self.prec.backward(loss)
            return loss.detach()
        b = batch_size(x) // k
        total = torch.zeros((), device=self.device)
        for j in range(k):
            with self.ddp.no_sync() if j < k - 1 or not sync else contextlib.nullcontext():
                with self.prec.autocast():
                    micro_x, micro_y = slice_batch(x, j * b, (j + 1) * b), slice_batch(y, j * b, (j + 1) * b)
                    loss = batch_loss(self.ddp, self.loss_fn, micro_x, micro_y) / k
                self.prec.backward(loss)
            total += loss.detach().float()
        return total

    def optimizer_step(self, step: int, x: Any, y: Any) -> bool:
        """The update after the backward pass(es): the gradients unscaled (fp16) before
        anything reads them, the method's ``after_backward`` on the share ``x``, ``y`` (in the
        step's arithmetic; skipped when the gradients overflowed), :attr:`on_gradients`, the
        optimiser's step (fp16: skipped on an overflow) and the method's LR schedule.

        Training measures the gradient noise scale (``train.noise_scale``) and counts fp16's
        skipped steps in :attr:`on_gradients`: an override of :meth:`train_step` or
        :meth:`forward_backward` keeps both; one of this method that does not call it must call
        ``self.on_gradients(finite)`` itself between the backward and the update.

        Returns
        -------
        bool
            Whether the step's gradients were finite (always under fp32 and bf16).
        """
        optimizer, method = self.optimizer, self.method
        assert optimizer is not None, "a step needs an optimizer or a method (use_method)"
        self.prec.unscale(optimizer)  # fp16: every reader of the gradients sees them unscaled
        finite = self.prec.grads_finite(optimizer)  # fp16: a step that overflowed is skipped
        if finite and method is not None:
            method.loss_scale = self.prec.loss_scale()
            with self.prec.autocast():  # AGS's small batch in the same arithmetic as the large one
                method.after_backward(step, x, y, self.loss_fn)
        if self.on_gradients is not None:
            self.on_gradients(finite)
        self.prec.step(optimizer)
        if method is not None:
            method.lr_schedule.step()
        return finite

    # ------------------------------------------------------------------ the epoch
    def run_epoch(
        self,
        batches: Iterator[Batch],
        n_steps: int,
        *,
        first_step: int = 0,
        should_stop: Callable[[], bool] | None = None,
        after_step: Callable[[int], None] | None = None,
    ) -> EpochSteps:
        """An epoch's steps: :meth:`train_step` on each of ``n_steps`` batches of ``batches``.

        Parameters
        ----------
        batches : iterator of (x, y)
            This rank's share of each global batch of the epoch, in order.
        n_steps : int
            The steps of the epoch.
        first_step : int
            The run's index of the epoch's first step (:meth:`train_step`'s ``step``).
        should_stop : callable, optional
            Asked before each step; ``True`` (the same answer on every rank at the same step)
            ends the epoch there.
        after_step : callable, optional
            Called with the number of steps done in the epoch after each step (progress).

        Returns
        -------
        EpochSteps
            The sum of the steps' losses on the device, the steps run, and whether it stopped.

        A failing step carries the C errno it surfaced with
        (:func:`~tula.engine.memory.errno_evidence`): under an address-space cap that is how the
        launcher tells out-of-memory from a crash.
        """
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)  # on the device: no host sync per step
        for i in range(n_steps):
            if should_stop is not None and should_stop():
                return EpochSteps(loss_sum, i, stopped=True)
            batch = next(batches)
            with errno_evidence():
                loss_sum += self.train_step(batch, first_step + i).double()
            if after_step is not None:
                after_step(i + 1)
        return EpochSteps(loss_sum, n_steps)

    # ------------------------------------------------------------------ the evaluation
    def evaluate(self, data: Dataset, rank: int, world: int, eval_batch: int, loss: str) -> dict[str, float]:
        """The test split's metrics in the step's arithmetic (:func:`tula.engine.evaluation.evaluate`:
        the mean loss and the score, sharded over the ``world`` ranks and all-reduced).

        Parameters
        ----------
        data : Dataset
            The job's data set (its test split is evaluated).
        rank, world : int
            This rank and the world's size: rank ``r`` takes samples ``r``, ``r + world``, ...
        eval_batch : int
            Samples per forward pass.
        loss : str
            ``train.loss``: the name that says how the split is scored.

        Returns
        -------
        dict
            ``test_loss`` and the score (``test_top1``, ``test_top5``, ``test_r2``; ``test_perplexity``
            for ``train.loss: model`` and sequences' ``cross_entropy``).
        """
        with self.prec.autocast():
            return evaluate(self.model, data, rank, world, eval_batch, self.device, loss, self.loss_fn)


def step_class(spec: JobSpec) -> type[TrainStep]:
    """The step class ``train.step`` names (checked before any world starts by
    :func:`tula.engine.workloads.import_step_class`), else :class:`TrainStep`."""
    cls = import_step_class(spec.train.step)
    if cls is None:
        return TrainStep
    assert issubclass(cls, TrainStep), "import_step_class checked it"
    return cls
