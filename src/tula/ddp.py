"""What profiling and training share inside a rank: building the DDP model, and the
out-of-memory probe whose verdict every rank agrees on.

The probe runs a forward/backward (and whatever ``step`` does) with no collective inside,
so a rank that runs out of memory cannot leave another waiting in one; the ranks then
agree through one all-reduce.  An out-of-memory is a result, not a crash.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .memory import run_probe_step


def wrap_ddp(model: nn.Module, device: torch.device) -> DDP:
    """The one DDP construction: gradients as bucket views (no extra copy)."""
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)


def _collective_device(device: torch.device) -> torch.device:
    return device if device.type == "cuda" else torch.device("cpu")


def agree_any(flag: bool, device: torch.device) -> bool:
    """True on every rank if ``flag`` is True on any rank (one all-reduce)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=_collective_device(device))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def agree_max(value: float, device: torch.device) -> float:
    """The largest ``value`` over the ranks (one all-reduce)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=_collective_device(device))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def probe_fits(step: Callable[[], None], device: torch.device, rank: int) -> tuple[bool, str]:
    """Run ``step`` (no collective inside) and agree whether it fit on every rank.

    Returns ``(fits, note)``; the note names the rank that ran out of memory and the
    allocator's words.  Any failure that is not out of memory is raised."""
    fits_here, why = run_probe_step(step)  # raises what is not out of memory
    failed, note = not fits_here, f"out of memory on rank {rank}: {why}" if not fits_here else ""
    if agree_any(failed, device):
        return False, note or "out of memory on another rank"
    return True, ""
