"""The arithmetic of a training step: ``train.precision`` (fp32, bf16, fp16), in one place.

Profiling and training run their forward and backward passes through the same
:class:`Precision`, so the step times and memory the profile measures are those of training:

* ``fp32``: as written;
* ``bf16``: the forward pass (and the loss) under ``torch.autocast`` with bfloat16, on CPU
  and CUDA.  Parameters, their gradients and the optimiser stay float32 (autocast casts the
  operands of each operation, not the model), so AGS's Δ(G) and factors, the gradient noise
  scale and every checkpoint see float32 gradients; bf16 has float32's range, so no loss
  scaling is needed;
* ``fp16``: autocast with float16 and a ``torch.amp.GradScaler`` (CUDA only): the loss is
  scaled before the backward pass, the gradients are unscaled (:meth:`unscale`) before
  anything reads them -- AGS's gate and factors, a method's hooks -- and the scaler skips a
  step whose gradients overflowed and adjusts its scale; its state is checkpointed.  A step
  that overflowed feeds nothing else either (:meth:`grads_finite`): no gradient noise scale
  pair, no AGS factor measurement (it is taken at the next finite step).

``TULA_FP16_ON_CPU=1`` lets fp16 run on a CPU (torch's CPU autocast and ``GradScaler``,
slow): a switch for testing the fp16 path on machines without a GPU, not for training.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from tula.core.errors import SpecError

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """How one rank computes its steps at ``name`` on ``device``."""

    def __init__(self, name: str, device: torch.device) -> None:
        check_precision(name, device.type)
        self.name, self.device = name, device
        self.dtype = _DTYPES.get(name)
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
        if self.scaler is not None:  # a skipped step leaves the LR schedule a step ahead, as intended
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        self._unscaled = False

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward pass and the loss in this precision (nothing for fp32)."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """The backward pass of ``loss`` (scaled first under fp16)."""
        self._unscaled = False
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Put the gradients back to their true size before anything reads them (fp16; once
        per step; nothing otherwise)."""
        if self.scaler is not None and not self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled = True

    def loss_scale(self) -> float | None:
        """The factor the loss was multiplied by before this step's backward (fp16), else None."""
        return float(self.scaler.get_scale()) if self.scaler is not None else None

    def grads_finite(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this step's (unscaled) gradients are finite: always under fp32 and bf16;
        under fp16 what the scaler found when it unscaled them (one host sync, which the
        scaler's step makes anyway)."""
        if self.scaler is None:
            return True
        self.unscale(optimizer)
        found = self.scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]  # torch 2.x
        return not any(bool(v.item()) for v in found.values())

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimiser's step (fp16: skipped when the gradients overflowed, then the scale
        is adjusted)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.unscale(optimizer)
        self.scaler.step(optimizer)
        self.scaler.update()
        self._unscaled = False

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state and state.get("scaler") and self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])


def check_precision(name: str, device_kind: str) -> None:
    """One sentence for a precision this device cannot train in."""
    if name not in PRECISIONS:
        raise SpecError(f"train.precision {name!r} is not one of {', '.join(PRECISIONS)}")
    if name == "fp16" and device_kind != "cuda" and os.environ.get("TULA_FP16_ON_CPU") != "1":
        raise SpecError(
            "train.precision fp16 needs a CUDA device (its gradient scaler and float16 kernels); on "
            f"{device_kind} use bf16 or fp32"
        )
