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


def _replica_spread(module):
    """Largest difference between this rank's parameters and any other rank's."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return max(float((g - flat).abs().max()) for g in gathered)


def train_with_method(ctx, name, spec_dict, global_batch, steps_per_epoch, n_steps):
    """Train tula's SmallCNN on digits with the method ``name`` for ``n_steps`` steps of a
    fixed batch sequence (different on every rank), the way the runner drives a method.

    Returns the test loss before and after, the LR set at each step and the LR the update
    actually applied to the last layer's weight (``-Δw·g / |g|²``, meaningful for plain SGD
    without momentum and weight decay), the replicas' spread before and after
    ``before_eval()``, and the method's traces and extra state; for ``adascale`` also
    whether a fresh method restored from a (serialised) state dict matches the trained one.
    """
    import io

    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tula.optim.methods import build_method
    from tula.spec import spec_from_dict
    from tula.workloads import SmallCNN, load_dataset

    spec = spec_from_dict(spec_dict)
    data = load_dataset(spec.data, spec.seed)
    test_x, test_y = data.test.tensors

    def test_loss(module):
        module.eval()
        with torch.no_grad():
            loss = float(F.cross_entropy(module(test_x), test_y))
        module.train()
        return loss

    def build():
        torch.manual_seed(spec.seed)
        ddp = DDP(SmallCNN(width=8))
        return ddp, build_method(name, ddp, spec, global_batch, ctx.world_size, steps_per_epoch)

    ddp, method = build()
    generator = torch.Generator().manual_seed(100 + ctx.rank)
    batches = [data.batch(global_batch // ctx.world_size, generator) for _ in range(n_steps)]
    last = ddp.module.classifier[-1].weight
    loss_before = test_loss(ddp.module)
    lr_set, lr_applied = [], []
    for step, (x, y) in enumerate(batches):
        method.optimizer.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        method.after_backward(step, x, y, F.cross_entropy)
        before, grad = last.detach().clone(), last.grad.detach().clone()
        lr_set.append(method.lr)
        method.optimizer.step()
        method.scheduler.step()
        lr_applied.append(float(-(last.detach() - before).flatten() @ grad.flatten() / grad.square().sum()))
    spread_trained = _replica_spread(ddp.module)
    method.before_eval()
    result = {"loss_before": loss_before, "loss_after": test_loss(ddp.module), "lr_set": lr_set,
              "lr_applied": lr_applied, "spread_trained": spread_trained,
              "spread_after_eval_sync": _replica_spread(ddp.module), "traces": method.traces(),
              "extra_state": method.extra_state()}
    if name == "adascale":
        saved = io.BytesIO()
        torch.save(method.state_dict(), saved)
        saved.seek(0)
        _, restored = build()
        restored.load_state_dict(torch.load(saved, weights_only=False), n_steps)
        result["restored_matches"] = (restored.extra_state() == method.extra_state()
                                      and restored.lr == method.lr)
    return result


def train_methods(ctx, runs, global_batch, steps_per_epoch, n_steps):
    """:func:`train_with_method` for each ``(name, spec_dict)`` of ``runs`` in turn, in one
    world (a launch costs seconds, training here a fraction of one)."""
    return {name: train_with_method(ctx, name, spec_dict, global_batch, steps_per_epoch, n_steps)
            for name, spec_dict in runs}
