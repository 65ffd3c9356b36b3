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

The wrapper keeps torch's optimiser contract -- ``param_groups`` and ``state`` are the
wrapped optimiser's own objects, ``state_dict``/``load_state_dict`` carry both the
wrapped state and the AGS state, ``zero_grad`` is passed through -- so LR schedulers and
checkpoints work on it unchanged.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch


class GradientVariability:
    """Δ(G) of Eq. 5 from one squared gradient norm per step."""

    def __init__(self) -> None:
        self.prev_sq_norm: float | None = None

    def update(self, sq_norm: float) -> float:
        prev, self.prev_sq_norm = self.prev_sq_norm, sq_norm
        if prev is None or prev == 0.0 or not math.isfinite(prev):
            return math.inf
        return abs((sq_norm - prev) / prev)


def grad_sq_norm(grads: list[torch.Tensor]) -> float:
    """Squared L2 norm of a list of tensors: one fused norm per device, one host sync."""
    if not grads:
        return 0.0
    norms = torch._foreach_norm(grads)
    return float(torch.linalg.vector_norm(torch.stack(norms)) ** 2)


class AGS(torch.optim.Optimizer):
    """Wrap ``optimizer`` with adaptive (or static) gradient scaling.

    Parameters
    ----------
    optimizer : the optimiser to wrap (SGD, SGD with Nesterov momentum, Adam, ...)
    b_large, b_small : global batch of a step and of the factor sub-batch; give
        ``s_max = sqrt(b_large / b_small)`` unless ``s_max`` is set
    delta : variability threshold δ: steps with Δ(G) >= δ are not scaled
    s_min : lower bound of every factor, > 0
    granularity : ``tensor`` (one factor per parameter tensor, ratio of norms) or
        ``element`` (one factor per element)
    mode : ``adaptive`` (Algorithm 1) or ``static`` (U(s), Eq. 8, factor ``static_scale``)
    eps : stability term ε of Algorithm 1

    Attributes
    ----------
    factors : current factors, one tensor (or 0-d tensor) per parameter with a gradient
    delta_history : Δ(G) of every step (``inf`` for the first)
    scaled_history : whether each step was scaled
    """

    def __init__(self, optimizer: torch.optim.Optimizer, b_large: int, b_small: int, delta: float = 0.5,
                 s_min: float = 0.1, s_max: float | None = None, granularity: str = "tensor",
                 mode: str = "adaptive", static_scale: float = 2.0, eps: float = 1e-8):
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
            raise ValueError(f"need 0 < s_min <= s_max, got s_min={s_min}, s_max={s_max:.3g} "
                             "(Lemma 1 needs every factor bounded away from zero)")
        if delta < 0:
            raise ValueError(f"delta must be >= 0, not {delta}")
        # torch.optim.Optimizer.__init__ is not called: param_groups and state are the
        # wrapped optimiser's, shared, not copies
        self.optimizer = optimizer
        self.defaults = optimizer.defaults
        self._optimizer_step_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict = OrderedDict()
        self.b_large, self.b_small = b_large, b_small
        self.delta, self.s_min, self.s_max, self.eps = float(delta), float(s_min), float(s_max), float(eps)
        self.granularity, self.mode, self.static_scale = granularity, mode, float(static_scale)
        self.variability = GradientVariability()
        self.factors: list[torch.Tensor] | None = None  # per parameter (in param_groups order)
        self.delta_history: list[float] = []
        self.scaled_history: list[bool] = []
        self.factor_updates = 0

    # ------------------------------------------------------------------ torch contract
    @property
    def param_groups(self) -> list[dict]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self):  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value) -> None:
        self.optimizer.state = value

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)
        self.factors = None  # the factor list no longer matches the parameters

    def __repr__(self) -> str:
        return (f"AGS(mode={self.mode}, granularity={self.granularity}, delta={self.delta}, s_min={self.s_min}, "
                f"s_max={self.s_max:.3g}, wrapping {type(self.optimizer).__name__})")

    # ------------------------------------------------------------------ scaling
    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params()
        grads = [p.grad for p in params if p.grad is not None]
        d = self.variability.update(grad_sq_norm(grads))
        scaled = d < self.delta
        self.delta_history.append(d)
        self.scaled_history.append(scaled)
        if scaled and grads:
            if self.mode == "static":
                torch._foreach_mul_(grads, self.static_scale)
            elif self.factors is not None:
                pairs = [(p.grad, s) for p, s in zip(params, self.factors) if p.grad is not None]
                # per tensor the factors are 0-d tensors, which broadcast
                torch._foreach_mul_([g for g, _ in pairs], [s for _, s in pairs])
        self.optimizer.step()
        return loss

    @torch.no_grad()
    def update_factors(self, small_grads: list[torch.Tensor], params: list[torch.Tensor] | None = None) -> None:
        """UPDATEGRADSCALE: compare ``small_grads`` (the gradient of a ``b_small`` sub-batch,
        one tensor per parameter of ``params``) with the parameters' current gradient (the
        large batch) and set the factors.  Call it after backward and before :meth:`step`."""
        if self.mode != "adaptive":
            return
        all_params = self._params()
        params = all_params if params is None else params
        if len(small_grads) != len(params):
            raise ValueError(f"{len(small_grads)} small-batch gradients for {len(params)} parameters")
        by_param = {id(p): g for p, g in zip(params, small_grads)}
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
        self.factors = factors
        self.factor_updates += 1

    # ------------------------------------------------------------------ what it did
    @property
    def scaled_fraction(self) -> float:
        """Fraction of steps so far whose gradients were scaled."""
        return sum(self.scaled_history) / len(self.scaled_history) if self.scaled_history else 0.0

    def factor_summary(self) -> dict[str, float] | None:
        """Mean, min and max of the current factors (over elements)."""
        if self.mode == "static":
            return {"mean": self.static_scale, "min": self.static_scale, "max": self.static_scale}
        if self.factors is None:
            return None
        flat = torch.cat([f.reshape(-1).float().cpu() for f in self.factors])
        return {"mean": float(flat.mean()), "min": float(flat.min()), "max": float(flat.max())}

    def traces(self) -> dict[str, Any]:
        return {"delta": [None if not math.isfinite(d) else d for d in self.delta_history],
                "scaled": list(self.scaled_history), "scaled_fraction": self.scaled_fraction,
                "factors": self.factor_summary(), "factor_updates": self.factor_updates,
                "s_max": self.s_max, "s_min": self.s_min, "delta_threshold": self.delta, "mode": self.mode,
                "granularity": self.granularity}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return {"optimizer": self.optimizer.state_dict(),
                "ags": {"factors": None if self.factors is None else [f.detach().cpu().clone() for f in self.factors],
                        "prev_sq_norm": self.variability.prev_sq_norm, "delta_history": list(self.delta_history),
                        "scaled_history": list(self.scaled_history), "factor_updates": self.factor_updates}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.optimizer.load_state_dict(state_dict["optimizer"])
        a = state_dict["ags"]
        params = self._params()
        if a["factors"] is None:
            self.factors = None
        else:
            if len(a["factors"]) != len(params):
                raise ValueError(f"the AGS state has {len(a['factors'])} factors for {len(params)} parameters")
            self.factors = [f.to(p.device) for f, p in zip(a["factors"], params)]
        self.variability.prev_sq_norm = a["prev_sq_norm"]
        self.delta_history = list(a["delta_history"])
        self.scaled_history = list(a["scaled_history"])
        self.factor_updates = int(a["factor_updates"])
