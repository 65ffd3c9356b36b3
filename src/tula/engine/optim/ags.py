"""Adaptive gradient scaling (AGS, §III-B/C, Algorithm 1) as a wrapper of any optimiser.

Every step, before the wrapped optimiser's update:

1. the gradient variability Δ(G) of Eq. 5 is tracked from the gradient as it is (under
   DDP: already synchronised, so one norm per step and no communication):
   Δ_i = | (|G_i|² - |G_{i-1}|²) / |G_{i-1}|² |  (infinite on the first step);
2. while Δ < δ the gradients are multiplied by the current factors; at or above δ
   (a *sensitive* step) they pass through unscaled.  δ = 0 never scales.

Factors: ``mode="static"`` uses one factor ``static_scale`` for every parameter
(U(s), Eq. 8).  ``mode="adaptive"`` starts from 1 and is updated by
:meth:`AGS.update_factors` from a small-batch gradient (Algorithm 1, UPDATEGRADSCALE):

    s = clamp(|g_small / (g_large + eps)|, s_min, s_max),  s_max = sqrt(b_large / b_small)

per element (``granularity="element"``) or per tensor with the ratio of norms
(``granularity="tensor"``).  ``s_min > 0`` is enforced: Lemma 1 needs every factor
bounded away from zero, which Algorithm 1 as printed does not guarantee.

The gate runs on the gradients' device: Δ, the decision and the step counters are
0-d tensors and the factor applied is ``where(scaled, s, 1)``, so :meth:`AGS.step` never
reads a value back to the host (no device sync per step).  The per-step Δ and decisions
are kept on the device until :meth:`AGS.drain_trace` moves them to the host (the runner
does so once per epoch); at most ``trace_capacity`` steps are kept between two drains, and
checkpoints carry only O(1) counters.

The wrapper keeps torch's optimiser contract -- ``param_groups`` and ``state`` are the
wrapped optimiser's own objects, ``state_dict``/``load_state_dict`` carry both the
wrapped state and the AGS state, ``zero_grad`` is passed through, step and state-dict
hooks registered on it run -- so LR schedulers and checkpoints work on it unchanged.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any, overload

import torch

TRACE_CAPACITY = 65536  # steps of per-step values kept between two drains (the oldest go first)

_HOOK_DICTS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


class GradientVariability:
    """Δ(G) of Eq. 5 from one squared gradient norm per step, as a float64 0-d tensor on the
    norm's device (no host sync).  Infinite on the first step; after a zero or non-finite
    norm it is infinite or NaN, so no comparison ``Δ < δ`` holds (the step is sensitive)."""

    def __init__(self) -> None:
        self.prev_sq_norm: torch.Tensor | None = None

    def update(self, sq_norm: torch.Tensor | float) -> torch.Tensor:
        sq = (
            sq_norm
            if isinstance(sq_norm, torch.Tensor) and sq_norm.dtype == torch.float64
            else torch.as_tensor(sq_norm, dtype=torch.float64)
        )
        prev, self.prev_sq_norm = self.prev_sq_norm, sq
        if prev is None:
            return torch.full((), math.inf, dtype=torch.float64, device=sq.device)
        return ((sq - prev) / prev).abs()


def grad_sq_norm(grads: list[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """Squared L2 norm of a list of tensors as a float64 0-d tensor on their device: one fused
    norm per device, no host sync."""
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    norms = list(torch._foreach_norm(grads))
    dev = grads[0].device
    if any(g.device != dev for g in grads):
        norms = [n.to(dev) for n in norms]
    return (torch.linalg.vector_norm(torch.stack(norms)) ** 2).double()


class _StepTrace:
    """Per-step Δ and scaling decisions kept on the device, as the 0-d tensors the step made
    (no work per step), until drained; at most ``capacity`` steps, the oldest go first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"trace_capacity must be at least 1, not {capacity}")
        self.steps: deque[tuple[torch.Tensor, torch.Tensor]] = deque(maxlen=capacity)

    def append(self, delta: torch.Tensor, scaled: torch.Tensor) -> None:
        self.steps.append((delta, scaled))

    def drain(self) -> tuple[list[float], list[bool]]:
        if not self.steps:
            return [], []
        delta, scaled = zip(*self.steps)
        self.steps.clear()
        both = torch.stack([torch.stack(delta), torch.stack(scaled).to(torch.float64)]).cpu()  # one sync
        return both[0].tolist(), [bool(v) for v in both[1].tolist()]


class _Gate:
    """Multiplies gradients by ``factor if scaled else 1`` with ``scaled`` a 0-d bool tensor,
    on the device.  The factors are row 1 of a ``(2, n)`` buffer whose row 0 is ones (the
    per-parameter factors are views of it); each step one ``index_select`` copies row
    ``scaled`` into a second buffer whose views multiply the gradients in one
    ``_foreach_mul_`` (a row copy, not an elementwise ``where``: several times faster on
    CPU).  ``x * 1`` is ``x`` exactly, so a sensitive step's gradients pass through
    bit-identical.  One factor (static scaling) applies to every gradient."""

    def __init__(self, factors: list[torch.Tensor]) -> None:
        f0 = factors[0]
        self.both: torch.Tensor | None = None
        if all(f.dtype == f0.dtype and f.device == f0.device for f in factors):
            flat = torch.cat([f.reshape(-1) for f in factors])
            self.both = torch.stack([torch.ones_like(flat), flat])
            self.chosen = torch.empty_like(flat).unsqueeze(0)
            sizes = [f.numel() for f in factors]
            self.factors = [v.view_as(f) for v, f in zip(self.both[1].split(sizes), factors)]
            self.views = [v.view_as(f) for v, f in zip(self.chosen[0].split(sizes), factors)]
        else:  # mixed dtypes or devices: one where per factor
            self.factors = list(factors)

    def apply(self, params: Sequence[torch.Tensor], grads: list[torch.Tensor], scaled: torch.Tensor) -> None:
        """Scale ``grads``, the gradients of those ``params`` (one factor each) that have one."""
        if self.both is not None:
            torch.index_select(self.both, 0, scaled.reshape(1).long(), out=self.chosen)
            chosen = self.views
        else:
            chosen = [torch.where(scaled, f, torch.ones((), dtype=f.dtype, device=f.device)) for f in self.factors]
        # per tensor the factors are 0-d views, which broadcast
        if len(chosen) == 1:  # one factor for every gradient
            torch._foreach_mul_(grads, chosen[0])
        elif len(grads) == len(params):
            torch._foreach_mul_(grads, chosen)
        else:
            torch._foreach_mul_(grads, [c for p, c in zip(params, chosen) if p.grad is not None])


class AGS(torch.optim.Optimizer):
    """Wrap ``optimizer`` with adaptive (or static) gradient scaling.

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
        The optimiser to wrap (SGD, SGD with Nesterov momentum, Adam, ...).
    b_large, b_small : int
        Global batch of a step and of the factor sub-batch; they give
        ``s_max = sqrt(b_large / b_small)`` unless ``s_max`` is set.
    delta : float
        Variability threshold δ: steps with Δ(G) >= δ are not scaled.
    s_min : float
        Lower bound of every factor, > 0.
    s_max : float or None
        Upper bound of every factor (default ``sqrt(b_large / b_small)``).
    granularity : str
        ``tensor`` (one factor per parameter tensor, ratio of norms) or
        ``element`` (one factor per element).
    mode : str
        ``adaptive`` (Algorithm 1) or ``static`` (U(s), Eq. 8, factor ``static_scale``).
    static_scale : float
        The factor s of static scaling (``mode="static"``).
    eps : float
        Stability term ε of Algorithm 1.
    trace_capacity : int
        Per-step values kept between two :meth:`drain_trace` calls.

    Notes
    -----
    In your own training loop (``examples/own_loop.py``, also ``tula.AGS``)::

        optimizer = AGS(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), b_large=B, b_small=32)
        for step, (x, y) in enumerate(batches):          # x, y: this rank's slice of a global batch
            optimizer.zero_grad()
            loss_fn(ddp(x), y).backward()                  # synchronised by DDP
            if step % steps_per_epoch == 0:               # the factors, from a small batch
                k = 32 // world_size                       # this rank's share of b_small
                optimizer.measure_factors(lambda: loss_fn(model(x[:k]), y[:k]), model)
            optimizer.step()                               # gate and scale on the device, then step

    ``measure_factors`` goes between the backward and ``step()``; its closure runs the bare
    model (not the DDP wrapper).  Without it (or with ``mode="static"``) the gradients are
    scaled by the last factors measured (1 before the first).  ``state_dict`` /
    ``load_state_dict`` carry the AGS state for exact resume.

    Attributes
    ----------
    factors : list[torch.Tensor] or None
        Current factors, one tensor (or 0-d tensor) per parameter with a gradient.
    steps : int
        Steps taken (over the whole run, restored from checkpoints).
    factor_updates : int
        Factor updates so far.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        b_large: int,
        b_small: int,
        delta: float = 0.5,
        s_min: float = 0.1,
        s_max: float | None = None,
        granularity: str = "tensor",
        mode: str = "adaptive",
        static_scale: float = 2.0,
        eps: float = 1e-8,
        trace_capacity: int = TRACE_CAPACITY,
    ):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"AGS wraps a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if granularity not in ("tensor", "element"):
            raise ValueError(f"granularity must be 'tensor' or 'element', not {granularity!r}")
        if mode not in ("adaptive", "static"):
            raise ValueError(f"mode must be 'adaptive' or 'static', not {mode!r}")
        if not 0 < b_small < b_large:
            raise ValueError(f"need 0 < b_small < b_large, got b_small={b_small}, b_large={b_large}")
        s_max = math.sqrt(b_large / b_small) if s_max is None else s_max
        if not 0.0 < s_min <= s_max:
            raise ValueError(
                f"need 0 < s_min <= s_max, got s_min={s_min}, s_max={s_max:.3g} "
                "(Lemma 1 needs every factor bounded away from zero)"
            )
        if delta < 0:
            raise ValueError(f"delta must be >= 0, not {delta}")
        # torch.optim.Optimizer.__init__ is not called, since it would replace param_groups
        # and state, which are the wrapped optimiser's own (shared, not copies).  What it sets
        # up for hooks is done here: the hook dictionaries, and the class's step wrapped once
        # by torch (Optimizer._patch_step_function), which runs the step pre and post hooks.
        self.optimizer = optimizer
        self.defaults = optimizer.defaults
        for name in _HOOK_DICTS:
            setattr(self, name, OrderedDict())
        self._patch_step_function()
        self._warned_capturable_if_run_uncaptured = True
        self.b_large, self.b_small = b_large, b_small
        self.delta, self.s_min, self.s_max, self.eps = float(delta), float(s_min), float(s_max), float(eps)
        self.granularity, self.mode, self.static_scale = granularity, mode, float(static_scale)
        self.variability = GradientVariability()
        self.factors: list[torch.Tensor] | None = None  # per parameter (in param_groups order)
        self._gate: _Gate | None = None  # applies where(scaled, factor, 1) to the gradients
        self.steps = 0
        self._scaled_steps: torch.Tensor | int = 0  # a device counter once a step ran
        self.factor_updates = 0
        self._trace = _StepTrace(trace_capacity)

    # ------------------------------------------------------------------ torch contract
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> defaultdict[torch.Tensor, Any]:
        return self.optimizer.state

    @state.setter
    def state(self, value: defaultdict[torch.Tensor, Any]) -> None:
        self.optimizer.state = value

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)
        self.factors, self._gate = None, None  # the factor list no longer matches the parameters

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._patch_step_function()

    def __repr__(self) -> str:
        return (
            f"AGS(mode={self.mode}, granularity={self.granularity}, delta={self.delta}, s_min={self.s_min}, "
            f"s_max={self.s_max:.3g}, wrapping {type(self.optimizer).__name__})"
        )

    # ------------------------------------------------------------------ scaling
    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Gate, scale and step, with no host sync: Δ, the decision and the factor applied
        stay 0-d tensors on the gradients' device."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        grads = [p.grad for p in params if p.grad is not None]
        d = self.variability.update(grad_sq_norm(grads, params[0].device if params else None))
        scaled = d < self.delta  # NaN and δ = 0: never
        self.steps += 1
        if isinstance(self._scaled_steps, int):
            self._scaled_steps = torch.full((), self._scaled_steps, dtype=torch.int64, device=d.device)
        self._scaled_steps.add_(scaled)
        self._trace.append(d, scaled)
        if grads:
            if self.mode == "static" and self._gate is None:
                self._gate = _Gate([torch.full((), self.static_scale, dtype=grads[0].dtype, device=grads[0].device)])
            if self._gate is not None:
                self._gate.apply(params, grads, scaled)
        self.optimizer.step()
        return loss

    @torch.no_grad()
    def measure_factors(
        self,
        small_batch_loss: Callable[[], torch.Tensor],
        module: torch.nn.Module | None = None,
        loss_scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Measure the factors from a small batch: what a training loop calls at a factor
        update, after the (synchronised) backward of the large batch and before :meth:`step`.

        ``small_batch_loss()`` is the loss of this rank's share of the small batch through
        the *bare* module (not the DDP wrapper, so that DDP does not synchronise it), e.g.
        ``lambda: loss_fn(model(x[:k]), y[:k])`` with ``k = b_small / world size`` (a dict batch:
        ``lambda: model(**{key: t[:k] for key, t in batch.items()}).loss``).  Its
        gradient is taken with ``torch.autograd.grad`` (the large batch's ``.grad`` stay as
        they are), averaged over the ranks with one all-reduce when a process group is up,
        and compared with the large-batch gradient (:meth:`update_factors`); ``module``'s
        buffers (BatchNorm statistics) are put back as they were, so the measurement leaves
        no trace on the model.  Under fp16 give ``loss_scale`` (the gradient scaler's
        ``get_scale()``; the large batch's gradients already unscaled): the small loss is
        scaled by it before its backward, as the large one was, so its float16 gradients do
        not underflow, and divided out after.  Returns the squared norms (|g_small|^2
        averaged over the ranks, |g_large|^2) as float64 0-d tensors: a gradient noise
        scale's pair."""
        import torch.distributed as dist

        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        buffers = [b.detach().clone() for b in module.buffers()] if module is not None else []
        small = self._small_grads(small_batch_loss, params, loss_scale)
        if loss_scale is not None and not all(bool(torch.isfinite(g).all()) for g in small):
            small = self._small_grads(small_batch_loss, params, None)  # the scale overflowed the small batch
        if module is not None:
            with torch.no_grad():
                for b, saved in zip(module.buffers(), buffers):
                    b.copy_(saved)
        if dist.is_initialized() and dist.get_world_size() > 1:
            flat = torch.cat([g.reshape(-1) for g in small])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            small = [t.view_as(g) for t, g in zip(torch.split(flat, [g.numel() for g in small]), small)]
        self.update_factors(small, params)
        small_sq = sum(torch.linalg.vector_norm(g, dtype=torch.float64).square() for g in small)
        large_sq = sum(torch.linalg.vector_norm(p.grad, dtype=torch.float64).square() for p in params)
        return small_sq, large_sq

    @staticmethod
    def _small_grads(
        small_batch_loss: Callable[[], torch.Tensor], params: list[torch.Tensor], loss_scale: float | None
    ) -> list[torch.Tensor]:
        """The gradient of ``small_batch_loss()`` for ``params`` (zeros where unused), its
        backward taken at ``loss_scale`` times the loss and divided back."""
        with torch.enable_grad():
            loss = small_batch_loss()
            grads = torch.autograd.grad(loss * loss_scale if loss_scale else loss, params, allow_unused=True)
        small = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
        return [g / loss_scale for g in small] if loss_scale else small

    def update_factors(self, small_grads: list[torch.Tensor], params: list[torch.Tensor] | None = None) -> None:
        """UPDATEGRADSCALE: compare ``small_grads`` (the gradient of a ``b_small`` sub-batch,
        one tensor per parameter of ``params``) with the parameters' current gradient (the
        large batch) and set the factors.  Call it after backward and before :meth:`step`."""
        if self.mode != "adaptive":
            return
        all_params = self._params()
        targets: Sequence[torch.Tensor] = all_params if params is None else params
        if len(small_grads) != len(targets):
            raise ValueError(f"{len(small_grads)} small-batch gradients for {len(targets)} parameters")
        by_param = {id(p): g for p, g in zip(targets, small_grads)}
        factors = []
        for p in all_params:
            g_small, g_large = by_param.get(id(p)), p.grad
            if g_small is None or g_large is None:
                s = torch.ones((), device=p.device) if self.granularity == "tensor" else torch.ones_like(p)
            elif self.granularity == "element":
                s = (g_small / (g_large + self.eps)).abs_().clamp_(self.s_min, self.s_max)
            else:
                ratio = torch.linalg.vector_norm(g_small) / (torch.linalg.vector_norm(g_large) + self.eps)
                s = ratio.clamp(self.s_min, self.s_max)
            factors.append(s.to(p.dtype))
        self._gate = _Gate(factors)
        self.factors = self._gate.factors
        self.factor_updates += 1

    # ------------------------------------------------------------------ what it did
    @property
    def scaled_steps(self) -> int:
        """Steps so far whose gradients were scaled (reads the device counter: not per step)."""
        return int(self._scaled_steps)

    @property
    def scaled_fraction(self) -> float:
        """Fraction of steps so far whose gradients were scaled."""
        return self.scaled_steps / self.steps if self.steps else 0.0

    def drain_trace(self) -> dict[str, list]:
        """The per-step values since the last drain, moved to the host at once, and cleared:
        ``{"delta": [Δ, None where infinite or NaN], "scaled": [bool]}``."""
        delta, scaled = self._trace.drain()
        return {"delta": [d if math.isfinite(d) else None for d in delta], "scaled": scaled}

    def factor_summary(self) -> dict[str, float] | None:
        """Mean, min and max of the current factors (over elements)."""
        if self.mode == "static":
            return {"mean": self.static_scale, "min": self.static_scale, "max": self.static_scale}
        if self.factors is None:
            return None
        flat = torch.cat([f.reshape(-1).float().cpu() for f in self.factors])
        return {"mean": float(flat.mean()), "min": float(flat.min()), "max": float(flat.max())}

    def traces(self) -> dict[str, Any]:
        """A bounded summary of what it did (the per-step values: :meth:`drain_trace`)."""
        return {
            "steps": self.steps,
            "scaled_steps": self.scaled_steps,
            "scaled_fraction": self.scaled_fraction,
            "factors": self.factor_summary(),
            "factor_updates": self.factor_updates,
            "s_max": self.s_max,
            "s_min": self.s_min,
            "delta_threshold": self.delta,
            "mode": self.mode,
            "granularity": self.granularity,
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        prev = self.variability.prev_sq_norm
        state = {
            "optimizer": self.optimizer.state_dict(),
            "ags": {
                "factors": None if self.factors is None else [f.detach().cpu().clone() for f in self.factors],
                "prev_sq_norm": None if prev is None else prev.item(),
                "steps": self.steps,
                "scaled_steps": self.scaled_steps,
                "factor_updates": self.factor_updates,
            },
        }
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state)
            if result is not None:
                state = result
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        self.optimizer.load_state_dict(state_dict["optimizer"])
        a = state_dict["ags"]
        params = self._params()
        device = params[0].device if params else None
        if a["factors"] is None:
            self.factors, self._gate = None, None
        else:
            if len(a["factors"]) != len(params):
                raise ValueError(f"the AGS state has {len(a['factors'])} factors for {len(params)} parameters")
            self._gate = _Gate([f.to(p.device) for f, p in zip(a["factors"], params)])
            self.factors = self._gate.factors
        prev = a["prev_sq_norm"]
        self.variability.prev_sq_norm = None if prev is None else torch.tensor(prev, dtype=torch.float64, device=device)
        if "steps" in a:
            self.steps, scaled = int(a["steps"]), int(a["scaled_steps"])
        else:  # a checkpoint from before the histories were dropped from the state
            self.steps, scaled = len(a["delta_history"]), sum(map(bool, a["scaled_history"]))
        self._scaled_steps = scaled
        self.factor_updates = int(a["factor_updates"])
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)
