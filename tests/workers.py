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


def abort_on_rank_zero_in_teardown(ctx):
    """Rank 0 aborts (SIGABRT, as glibc's "double free or corruption") while its process group is
    destroyed, after its function returned: a group only this function holds is freed in
    ``destroy_process_group``, and its finalizer aborts the process there."""
    import resource
    import weakref

    group = dist.new_group(backend="gloo")  # every rank creates it; only rank 0 aborts when it goes
    if ctx.rank == 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        weakref.finalize(group, os.abort)
    dist.barrier(group=group)
    return ctx.rank


def _mlp() -> torch.nn.Module:
    """The body of the models below: 8x8 digits through 32 hidden units to 10 classes."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


class _DiesOnRankOne(torch.nn.Module):
    """A small model whose rank-1 process dies (like a killed node) on a large batch."""

    def __init__(self, die_at_batch: int = 100):
        super().__init__()
        self.die_at_batch = die_at_batch
        self.net = _mlp()

    def forward(self, x):
        if dist.is_initialized() and dist.get_rank() == 1 and x.shape[0] >= self.die_at_batch:
            os._exit(9)
        return self.net(x)


def dies_on_rank_one(die_at_batch: int = 100):
    return _DiesOnRankOne(die_at_batch)


def lr_after_resume(ctx, runs, global_batch, steps_per_epoch, n_steps):
    """For each ``(name, spec_dict)`` of ``runs``: step a method ``n_steps`` times (DDP
    backward, ``after_backward``, optimiser step, scheduler step, different batches on every
    rank), save its state and restore it into a fresh method at step ``n_steps``; then take
    one more step with both.  Returns, per method, the LRs the schedulers report
    (``get_last_lr()``) and the param groups hold right after the restore, and the LRs each
    reports and applies at that next step (read after ``after_backward``, before the update)."""
    import io

    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tula.core.spec import spec_from_dict
    from tula.engine.optim.methods import build_method
    from tula.engine.workloads import SmallCNN, load_dataset

    out = {}
    for name, spec_dict in runs:
        spec = spec_from_dict(spec_dict)
        data = load_dataset(spec.data, spec.seed)
        generator = torch.Generator().manual_seed(100 + ctx.rank)
        batches = [data.batch(global_batch // ctx.world_size, generator) for _ in range(n_steps + 1)]

        def build(spec=spec, name=name):  # this iteration's job
            torch.manual_seed(spec.seed)
            ddp = DDP(SmallCNN(width=8))
            return ddp, build_method(name, ddp, spec, global_batch, ctx.world_size, steps_per_epoch)

        def step(ddp, method, i, batches=batches):
            x, y = batches[i]
            method.optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            method.after_backward(i, x, y, F.cross_entropy)
            applied = [g["lr"] for g in method.optimizer.param_groups]
            reported = list(method.scheduler.get_last_lr())
            method.optimizer.step()
            method.scheduler.step()
            return applied, reported

        ddp, method = build()
        for i in range(n_steps):
            step(ddp, method, i)
        buf = io.BytesIO()
        torch.save({"model": ddp.module.state_dict(), "method": method.state_dict()}, buf)
        buf.seek(0)
        saved = torch.load(buf, weights_only=False)
        ddp2, restored = build()
        ddp2.module.load_state_dict(saved["model"])
        restored.load_state_dict(saved["method"], n_steps)
        res = {
            "reported": list(method.scheduler.get_last_lr()),
            "restored_reported": list(restored.scheduler.get_last_lr()),
            "restored_groups": [g["lr"] for g in restored.optimizer.param_groups],
        }
        res["next_applied"], res["next_reported"] = step(ddp, method, n_steps)
        res["restored_next_applied"], res["restored_next_reported"] = step(ddp2, restored, n_steps)
        out[name] = res
    return out


def user_error_on_rank_one(ctx):
    from tula.core.errors import TulaError

    if ctx.rank == 1:
        raise TulaError("rank 1 says: this input is wrong")
    t = torch.zeros(1)
    dist.all_reduce(t)  # rank 0 then sees a connection error: not the root cause
    return "unreachable"


def heap_serves_block(ctx, nbytes: int) -> bool:
    """Whether glibc serves a freshly malloc'ed block of ``nbytes`` from the main heap (the
    ``[heap]`` mapping) rather than mapping it on its own."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    block = libc.malloc(nbytes)
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                if line.rstrip().endswith("[heap]"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    return lo <= block < hi
        return False
    finally:
        libc.free(block)


def hold_and_time(ctx, seconds):
    """Hold a world for ``seconds`` and say when and where it ran."""
    import time

    from distributed import get_worker

    dist.barrier()
    start = time.time()
    time.sleep(seconds)
    dist.barrier()
    return {"rank": ctx.rank, "start": start, "end": time.time(), "worker": get_worker().address}


def where_am_i(ctx):
    return {"rank": ctx.rank, "host": ctx.host, "local_rank": ctx.local_rank}


class _OomAbove(torch.nn.Module):
    """A small model that runs out of memory (``torch.OutOfMemoryError``) when it trains on
    more than ``local_batch`` samples at once."""

    def __init__(self, local_batch: int = 32):
        super().__init__()
        self.local_batch = local_batch
        self.net = _mlp()

    def forward(self, x):
        if self.training and x.shape[0] > self.local_batch:
            raise torch.OutOfMemoryError(f"{x.shape[0]} samples do not fit (at most {self.local_batch})")
        return self.net(x)


def oom_above(local_batch: int = 32):
    return _OomAbove(local_batch)


def marks_when_built(marker: str, **kwargs):
    """tula's small CNN, built only after a file ``MARKER.PID`` is written: what built the model
    (a workload check in the command's own process, or a rank in another) leaves its pid behind."""
    from pathlib import Path

    from tula.engine.workloads import SmallCNN

    Path(f"{marker}.{os.getpid()}").write_text("built\n")
    return SmallCNN(**kwargs)


class _Sleepy(torch.nn.Module):
    """A small MLP whose every training step in a world of more than one rank takes at least
    ``sleep_s`` (a sleep, no CPU): such an epoch of a few steps stays in flight long enough to
    be interrupted, while a 1-rank epoch runs at full speed."""

    def __init__(self, sleep_s: float):
        super().__init__()
        self.sleep_s = sleep_s
        self.net = _mlp()

    def forward(self, x):
        if self.training and dist.is_initialized() and dist.get_world_size() > 1:
            import time

            time.sleep(self.sleep_s)
        return self.net(x)


def sleepy_mlp(sleep_s: float = 0.1):
    return _Sleepy(sleep_s)
