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


class _DiesOnRankOne(torch.nn.Module):
    """A small model whose rank-1 process dies (like a killed node) on a large batch."""

    def __init__(self, die_at_batch: int = 100):
        super().__init__()
        self.die_at_batch = die_at_batch
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 10))

    def forward(self, x):
        if dist.is_initialized() and dist.get_rank() == 1 and x.shape[0] >= self.die_at_batch:
            os._exit(9)
        return self.net(x)


def dies_on_rank_one(die_at_batch: int = 100):
    return _DiesOnRankOne(die_at_batch)
