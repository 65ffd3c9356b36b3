"""The gradient noise scale's feed during training: one step's pair of squared gradient norms
(:class:`_NoiseScaleFeed`, used by :class:`tula.engine.rank_loop._RankTrainer`)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from tula.core.noise_scale import NoiseScale
from tula.engine.ddp import LocalGradNorms, synced_sq_norm


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
