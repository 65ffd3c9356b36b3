"""Functions the tests run on every rank of a launched world (importable by spawned ranks)."""

import os

import torch
import torch.distributed as dist


def allreduce_rank(ctx, scale):
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    ctx.emit({"rank": ctx.rank})
    return {"rank": ctx.rank, "world": ctx.world_size, "sum": t.item() * scale, "backend": ctx.backend}


def fail_on_rank_one(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    t = torch.zeros(1)
    dist.all_reduce(t)  # rank 0 waits here for a rank that never comes
    return "unreachable"


def die_on_rank_one(ctx):
    if ctx.rank == 1:
        os._exit(17)
    dist.barrier()
    return "unreachable"
