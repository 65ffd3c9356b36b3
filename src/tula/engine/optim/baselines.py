"""The large-batch baselines Tula is compared with (§IV-D): LARS, LAMB, post-local SGD, AdaScale.

The table of :mod:`tula.core.registry` names these classes (``lars``, ``lamb``, ``polo``,
``adascale``); :func:`~tula.engine.optim.methods.build_method` imports this module on first use.

* ``lars`` -- timm's :class:`~timm.optim.Lars` (You et al. 2017), linear LR scaling from
  ``train.base_batch`` with warm-up, as in the paper;
* ``lamb`` -- timm's :class:`~timm.optim.Lamb` (You et al. 2020) at ``train.lamb_lr``
  with square-root LR scaling and warm-up;
* ``polo`` -- post-local SGD (Lin et al. 2020) from torch's own parts: synchronous SGD
  for ``train.polo_switch_epoch`` epochs, then local SGD on every worker with the
  models averaged ``train.polo_averages_per_epoch`` times per epoch;
* ``adascale`` -- AdaScale SGD (Johnson et al. 2020): the spec's LR times the gain ratio
  estimated from the spread of the workers' local gradients.

In ``lars`` and ``lamb`` the parameters with ``ndim <= 1`` (biases, normalisation
layers) get no weight decay and no layer-wise adaptation; every other parameter is
adapted even when ``optimizer.weight_decay`` is 0.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from tula.core.spec import JobSpec
from tula.engine.ddp import LocalGradNorms, OneRank, local_norms_allreduce_hook
from tula.engine.optim.ags import TRACE_CAPACITY
from tula.engine.optim.methods import LRS, LossFn, Method, sqrt_scale


def adaptive_param_groups(module: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Parameter groups for a layer-wise adaptive optimiser (timm's ``Lars``/``Lamb``).

    Parameters with ``ndim > 1`` (weights of convolutions and linear layers) get
    ``weight_decay`` and are always adapted; those with ``ndim <= 1`` (biases,
    normalisation scales and shifts) get neither.  timm adapts a group only when its
    ``weight_decay`` is non-zero or ``always_adapt`` is set, so the flags are per group.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay, "always_adapt": True},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0, "always_adapt": False},
    ]


class LARS(LRS):
    """LARS: timm's ``Lars`` with the spec's momentum and weight decay (``optimizer.name``
    is not read), linear LR scaling relative to ``train.base_batch`` and warm-up.

    timm's trust ratio is ``trust_coeff * |w| / (|g| + weight_decay * |w|)`` with
    :attr:`trust_coeff` = 0.001 (You et al.; timm's default), so the step of a layer is
    the scaled LR times about a thousandth of ``|w| / |g|``: LARS needs a larger
    ``optimizer.lr`` than SGD on models whose weights are not much larger than their
    gradients.
    """

    name = "lars"
    trust_coeff = 0.001

    def build_optimizer(self) -> torch.optim.Optimizer:
        from timm.optim import Lars  # timm imports torchvision and its models: seconds, so only when used

        o = self.spec.optimizer
        return Lars(
            adaptive_param_groups(self.module, o.weight_decay),
            lr=self.base_lr(),
            momentum=o.momentum,
            nesterov=o.nesterov and o.momentum > 0,
            trust_coeff=self.trust_coeff,
        )


class LAMB(Method):
    """LAMB: timm's ``Lamb`` (its default betas, eps and global gradient-norm clipping at 1)
    at ``train.lamb_lr`` times sqrt(B / ``train.base_batch``), with warm-up; weight decay
    ``optimizer.weight_decay`` on the adapted parameters."""

    name = "lamb"
    warmup = True

    def lr_scale(self) -> float:
        return sqrt_scale(self.global_batch, self.spec.train.base_batch)

    def base_lr(self) -> float:
        return self.spec.train.lamb_lr * self.lr_scale()

    def build_optimizer(self) -> torch.optim.Optimizer:
        from timm.optim import Lamb  # see LARS.build_optimizer

        return Lamb(adaptive_param_groups(self.module, self.spec.optimizer.weight_decay), lr=self.base_lr())


class PostLocalSGD(Method):
    """Post-local SGD with torch's ``post_localSGD_hook``, ``PeriodicModelAverager`` and
    ``PostLocalSGDOptimizer`` around the spec's optimiser, at the spec's LR with warm-up.

    For the first ``train.polo_switch_epoch`` epochs the DDP hook all-reduces the gradients
    as usual.  From then on every worker is its own node: the hook all-reduces within an
    explicit single-rank subgroup (so the local gradient stays as it is) and the
    optimiser averages the parameters over all ranks after every ``period`` steps,
    ``period = steps_per_epoch // polo_averages_per_epoch`` (at least 1).  Momentum buffers
    stay local.  :meth:`before_eval` averages parameters and floating-point buffers, so
    evaluation and checkpoints see one model.  With one worker there is nothing to average
    and the method is the spec's optimiser alone.
    """

    name = "polo"
    warmup = True

    def __init__(self, ddp: nn.Module, spec: JobSpec, global_batch: int, n_workers: int, steps_per_epoch: int) -> None:
        t = spec.train
        switch_steps = t.polo_switch_epoch * steps_per_epoch
        self.hook_state: PostLocalSGDState | None = None
        self.averager: PeriodicModelAverager | None = None
        self.subgroup: dist.ProcessGroup | None = None
        if n_workers > 1:
            # every worker is its own node: an explicit single-rank subgroup per rank (torch's
            # default, one subgroup per node found through CUDA's device count, fails on gloo/CPU)
            self.subgroup, _ = dist.new_subgroups(group_size=1)
            self.hook_state = PostLocalSGDState(
                process_group=None, subgroup=self.subgroup, start_localSGD_iter=switch_steps
            )
            self.averager = PeriodicModelAverager(
                period=max(1, steps_per_epoch // t.polo_averages_per_epoch), warmup_steps=switch_steps
            )
        super().__init__(ddp, spec, global_batch, n_workers, steps_per_epoch)
        if self.hook_state is not None:
            assert isinstance(ddp, (DDP, OneRank)), "a world of more than one rank trains a DDP model (wrap_ddp)"
            ddp.register_comm_hook(self.hook_state, post_localSGD_hook)

    def build_optimizer(self) -> torch.optim.Optimizer:
        local = super().build_optimizer()
        if self.averager is None:
            return local
        return PostLocalSGDOptimizer(optim=local, averager=self.averager)

    def before_eval(self) -> None:
        """Average the replicas (parameters and floating-point buffers), and gather every
        rank's own optimiser state (momentum stays local in the local phase) so that the
        checkpoint, written by rank 0, holds all of them."""
        if self.averager is None:
            return
        tensors = [t for t in (*self.module.parameters(), *self.module.buffers()) if t.is_floating_point()]
        with torch.no_grad():
            flat = torch.cat([t.reshape(-1) for t in tensors])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            for t, avg in zip(tensors, torch.split(flat, [t.numel() for t in tensors])):
                t.copy_(avg.view_as(t))
            local = self._local_state_tensors()
            if local:  # the same on every rank: the state exists once a step has run
                mine = torch.cat([t.reshape(-1) for t in local])
                gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
                dist.all_gather(gathered, mine)
                self._rank_states = [g.cpu() for g in gathered]

    def release(self) -> None:
        """Also destroy this rank's single-rank subgroup (a new method makes its own)."""
        super().release()
        if self.hook_state is not None and self.subgroup is not None:
            dist.destroy_process_group(self.subgroup)
            self.subgroup = None

    def _averaging_optimizer(self) -> PostLocalSGDOptimizer:
        """The optimiser as :meth:`build_optimizer` wraps it whenever there is an averager."""
        assert isinstance(self.optimizer, PostLocalSGDOptimizer), "only called where there is an averager"
        return self.optimizer

    def _local_state_tensors(self) -> list[torch.Tensor]:
        """This rank's optimiser state tensors (e.g. momentum buffers) in parameter order."""
        inner = self._averaging_optimizer().optim
        return [
            v
            for g in inner.param_groups
            for p in g["params"]
            for _, v in sorted(inner.state.get(p, {}).items())
            if torch.is_tensor(v) and v.dim() > 0
        ]

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.averager is not None:
            # torch's PostLocalSGDOptimizer.load_state_dict gives the inner optimiser new param
            # groups but keeps its own reference to the old list, through which the LR schedule
            # writes: re-link them, or the LR stays frozen at the checkpoint's value
            self.optimizer.param_groups = self._averaging_optimizer().optim.param_groups
        self.load_extra_state(state.get("extra") or {})
        self.set_step(step)

    def traces(self) -> dict[str, Any]:
        if self.averager is None:
            return {}
        return {"switch_step": self.averager.warmup_steps, "averaging_period_steps": self.averager.period}

    def extra_state(self) -> dict[str, Any]:
        if self.averager is None or self.hook_state is None:  # both or neither: n_workers > 1
            return {}
        return {
            "averager_step": self.averager.step,
            "hook_iter": self.hook_state.iter,
            "rank_optimizer_state": getattr(self, "_rank_states", None),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self.averager is not None and self.hook_state is not None and state:
            self.averager.step = int(state["averager_step"])
            self.hook_state.iter = int(state["hook_iter"])
            per_rank = state.get("rank_optimizer_state")
            if per_rank is not None:  # each rank takes back its own momentum
                local = self._local_state_tensors()
                mine = per_rank[dist.get_rank()]
                with torch.no_grad():
                    for t, v in zip(local, torch.split(mine, [t.numel() for t in local])):
                        t.copy_(v.view_as(t))


class AdaScale(Method):
    """AdaScale SGD: the spec's optimiser at ``optimizer.lr * lr_factor(step) * r_t``.

    The gain ratio r_t = (σ²/B0 + |μ|²) / (σ²/B + |μ|²), with B0 = ``train.base_batch``
    and B the global batch, is clamped between 1 and B/B0.  σ² (the trace of the
    per-sample gradient covariance) and |μ|² (the squared norm of the true gradient) come
    from the N workers' local gradients g_i (local batch b = B/N) and their mean ḡ:
    E|g_i|² = |μ|² + σ²/b and E|ḡ|² = |μ|² + σ²/B, so

        σ² = (mean_i |g_i|² - |ḡ|²) / (1/b - 1/B),    |μ|² = |ḡ|² - σ²/B.

    The local squared norms are taken by a DDP comm hook before its all-reduce, and
    summed over the ranks with one scalar all-reduce per step.  Both estimates are
    clipped at 0 and smoothed by an exponential moving average with decay
    :attr:`ema_decay` = 0.9 (the first step initialises it).  The LR schedule (milestones;
    no warm-up, the gain ramps the LR up by itself) runs on plain steps, not on
    AdaScale's scale-invariant iterations.

    The gain is part of :meth:`lr_factor`, so the scheduler and :meth:`after_backward`
    agree: the scheduler's step sets the next step's LR with the last gain, and
    :meth:`after_backward` puts the scheduler at the same step again with the new gain just
    before the update.  At least 2 workers (:mod:`tula.core.registry`).

    The gain of every step is kept until :meth:`drain_step_traces` (at most
    ``TRACE_CAPACITY`` steps between two calls); :meth:`traces` and checkpoints hold its
    running minimum, maximum and mean.
    """

    name = "adascale"
    ema_decay = 0.9

    def __init__(self, ddp: nn.Module, spec: JobSpec, global_batch: int, n_workers: int, steps_per_epoch: int) -> None:
        self.gain = 1.0
        self.gain_steps: deque[float] = deque(maxlen=TRACE_CAPACITY)  # since the last drain
        self.gain_stats = {"count": 0, "sum": 0.0, "min": math.inf, "max": -math.inf}  # the whole run
        self.variance_ema: float | None = None
        self.mean_sq_norm_ema: float | None = None
        self.sq_norm_state = LocalGradNorms(
            [p for p in ddp.parameters() if p.requires_grad], next(ddp.parameters()).device
        )
        super().__init__(ddp, spec, global_batch, n_workers, steps_per_epoch)
        assert isinstance(ddp, (DDP, OneRank)), "AdaScale runs on at least 2 ranks (checked above): a DDP model"
        ddp.register_comm_hook(self.sq_norm_state, local_norms_allreduce_hook)

    def lr_factor(self, step: int) -> float:
        return super().lr_factor(step) * self.gain

    def after_backward(self, step: int, x: Any, y: Any, loss_fn: LossFn) -> None:
        local_sq = self.sq_norm_state.take().reshape(1)
        dist.all_reduce(local_sq)
        mean_local_sq = float(local_sq) / self.n_workers / (self.loss_scale or 1.0) ** 2  # fp16: taken scaled
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        global_sq = float(
            torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
            ).square()
        )
        batch, local_batch = self.global_batch, self.global_batch / self.n_workers
        self.step_norms = (mean_local_sq, global_sq)  # the runner's gradient noise scale reads them
        variance = max(0.0, (mean_local_sq - global_sq) / (1.0 / local_batch - 1.0 / batch))
        mean_sq_norm = max(0.0, global_sq - variance / batch)
        self.variance_ema = self._smooth(self.variance_ema, variance)
        self.mean_sq_norm_ema = self._smooth(self.mean_sq_norm_ema, mean_sq_norm)
        self.gain = self.gain_ratio(self.variance_ema, self.mean_sq_norm_ema)
        self.gain_steps.append(self.gain)
        st = self.gain_stats
        st["count"], st["sum"] = st["count"] + 1, st["sum"] + self.gain
        st["min"], st["max"] = min(st["min"], self.gain), max(st["max"], self.gain)
        self.lr_schedule.set_step(step)  # this step's LR with the new gain

    def _smooth(self, average: float | None, value: float) -> float:
        return value if average is None else self.ema_decay * average + (1.0 - self.ema_decay) * value

    def gain_ratio(self, variance: float, mean_sq_norm: float) -> float:
        """r = (σ²/B0 + |μ|²) / (σ²/B + |μ|²), clamped between 1 and B/B0 (1 when both are 0)."""
        base, batch = self.spec.train.base_batch, self.global_batch
        denominator = variance / batch + mean_sq_norm
        if denominator <= 0.0:
            return 1.0
        low, high = sorted((1.0, batch / base))
        return min(high, max(low, (variance / base + mean_sq_norm) / denominator))

    def drain_step_traces(self) -> dict[str, list]:
        """``{"gain": [r_t]}``: the gain of every step since the last call."""
        gains, self.gain_steps = list(self.gain_steps), deque(maxlen=TRACE_CAPACITY)
        return {"gain": gains}

    def traces(self) -> dict[str, Any]:
        st = self.gain_stats
        return {
            "gain_last": self.gain,
            "gain_min": st["min"] if st["count"] else None,
            "gain_max": st["max"] if st["count"] else None,
            "gain_mean": st["sum"] / st["count"] if st["count"] else None,
            "gain_steps": st["count"],
            "variance_per_sample": self.variance_ema,
            "mean_grad_sq_norm": self.mean_sq_norm_ema,
            "ema_decay": self.ema_decay,
        }

    def extra_state(self) -> dict[str, Any]:
        return {
            "gain": self.gain,
            "gain_stats": dict(self.gain_stats),
            "variance_ema": self.variance_ema,
            "mean_sq_norm_ema": self.mean_sq_norm_ema,
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if state:
            self.gain = float(state["gain"])
            if "gain_stats" in state:
                self.gain_stats = dict(state["gain_stats"])
            else:  # a checkpoint from before the history was dropped from the state
                h = [float(g) for g in state.get("gain_history", [])]
                self.gain_stats = {
                    "count": len(h),
                    "sum": sum(h),
                    "min": min(h, default=math.inf),
                    "max": max(h, default=-math.inf),
                }
            self.variance_ema, self.mean_sq_norm_ema = state["variance_ema"], state["mean_sq_norm_ema"]
