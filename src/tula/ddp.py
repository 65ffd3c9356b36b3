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


def check_shared_directory(directory: str, token: str, rank: int, device: torch.device) -> None:
    """Every rank must see the run directory (a shared file system on a cluster): rank 0
    writes ``token`` there, every rank reads it back; a rank that cannot is one sentence."""
    import os

    from .errors import TulaError

    path = os.path.join(directory, f".tula-reach-{token}")
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        with open(path, "w") as fh:
            fh.write(token)
    agree_any(False, device)  # a barrier: the token is written before anyone looks
    try:
        with open(path) as fh:
            missing = fh.read() != token
    except OSError:
        missing = True
    first_missing = int(agree_max(-rank if missing else -float(10**9), device) * -1)
    if first_missing < 10**9:
        if rank == 0:
            os.remove(path)
        raise TulaError(f"the run directory {directory} is not reachable from rank {first_missing} (each rank "
                        f"reads it on its own host); put it on a file system every worker shares (e.g. the "
                        "cluster's home or scratch file system)")
    agree_any(False, device)  # everyone has read it
    if rank == 0:
        os.remove(path)
