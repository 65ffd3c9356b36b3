"""Training runner: DDP training at a chosen (N, B) with a training method (AGS or a baseline).

The caller (:func:`train`) launches one N-rank world; every rank runs :func:`train_world`:

* data: each epoch is a permutation of the training set seeded by (seed, epoch); step
  ``i`` takes global batch ``i`` of it and rank ``r`` its ``r``-th slice, so a resumed
  run sees exactly the batches an uninterrupted one would;
* before the first step at a batch size, a *probe* forward/backward under ``no_sync()``
  (no collective), after which the ranks agree through one all-reduce whether anyone ran
  out of memory -- the world then returns ``status: oom`` instead of hanging in a
  collective; BatchNorm statistics are restored after the probe;
* after each epoch: evaluation (top-1, and top-5 where there are more than 5 classes) on
  the test split, sharded over the ranks; an atomic checkpoint (model, method state, RNG,
  history) written by rank 0; the epoch's metrics appended to ``metrics.jsonl``.

Out of memory -- the probe's agreed verdict, or a rank failing with the CPU allocator's or
CUDA's out-of-memory error mid-epoch -- makes the caller relaunch from the last checkpoint
at the next smaller global batch (half, split evenly over the workers): completed epochs
are kept, the interrupted epoch is re-run whole, none is lost or repeated.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .errors import InfeasibleError, SpecError, TulaError, WorkerError
from .launch import Launcher, LocalLauncher, WorkerContext
from .launch.base import pick_device
from .memory import cap_address_space, is_out_of_memory
from .optim.methods import build_method
from .profile import default_threads
from .spec import JobSpec
from .workloads import Dataset, build_model, check_workload, load_dataset

TRAIN_KIND = "tula.train"
CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


class TrainFailed(WorkerError):
    """A worker failed during training for a reason other than memory; the last checkpoint is kept."""


def steps_per_epoch(dataset_size: int, global_batch: int) -> int:
    """Optimiser steps per epoch: every full global batch (at least one)."""
    return max(1, dataset_size // global_batch)


def next_smaller_batch(global_batch: int, n_workers: int) -> int:
    """Half the global batch, rounded down to a multiple of the worker count (0: none left)."""
    b_local = (global_batch // 2) // n_workers
    return b_local * n_workers


# --------------------------------------------------------------------------- inside a rank
def _epoch_indices(seed: int, epoch: int, dataset_size: int) -> torch.Tensor:
    return torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


def _local_batch(data: Dataset, perm: torch.Tensor, step: int, global_batch: int, rank: int, local_batch: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    start = step * global_batch + rank * local_batch
    x, y = data.take(perm[start:start + local_batch])
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def _agree_any(flag: bool, device: torch.device) -> bool:
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


@torch.no_grad()
def evaluate(model: nn.Module, data: Dataset, rank: int, world: int, eval_batch: int,
             device: torch.device) -> dict[str, float]:
    """Top-1 (and top-5 with more than 5 classes) accuracy and mean loss on the test split,
    each rank taking every ``world``-th sample; the sums are all-reduced."""
    was_training = model.training
    model.eval()
    idx = torch.arange(rank, data.test_size, world)
    k5 = data.num_classes > 5
    sums = torch.zeros(4, dtype=torch.float64)  # samples, loss, top1, top5
    for chunk in torch.split(idx, eval_batch):
        x, y = data.take(chunk, "test")
        x, y = x.to(device), y.to(device)
        out = model(x)
        sums[0] += len(y)
        sums[1] += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        top = out.topk(5 if k5 else 1, dim=1).indices
        sums[2] += float((top[:, 0] == y).sum())
        if k5:
            sums[3] += float((top == y[:, None]).any(dim=1).sum())
    model.train(was_training)
    if dist.is_initialized():
        dev_sums = sums.to(device)
        dist.all_reduce(dev_sums)
        sums = dev_sums.cpu()
    n = max(float(sums[0]), 1.0)
    res = {"test_loss": float(sums[1]) / n, "test_top1": float(sums[2]) / n}
    if k5:
        res["test_top5"] = float(sums[3]) / n
    return res


def param_digest(model: nn.Module) -> str:
    """SHA-1 of every parameter's bytes: equal on two ranks iff their replicas are identical."""
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _save_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def _write_metrics(path: Path, history: list[dict]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(h) + "\n" for h in history))
    tmp.replace(path)


def train_world(ctx: WorkerContext, spec_dict: dict, method_name: str, global_batch: int, out_dir: str,
                fallbacks: list[dict], mem_cap_bytes: int | None = None) -> dict:
    """Run on every rank: train ``spec.epochs`` epochs at ``global_batch`` with ``method_name``,
    resuming from ``out_dir/checkpoint.pt`` when it exists.  Returns ``{"status": "ok", ...}``
    with the history and the method's traces, or ``{"status": "oom", ...}`` when the
    ranks agreed that the first step at this batch does not fit."""
    spec = JobSpec.model_validate(spec_dict)
    out = Path(out_dir)
    ckpt_path, metrics_path = out / CHECKPOINT, out / METRICS
    device, rank, world = ctx.device, ctx.rank, ctx.world_size
    torch.manual_seed(spec.seed)
    data = load_dataset(spec.data, spec.seed)
    model = build_model(spec.model).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    local_batch = global_batch // world
    n_steps = steps_per_epoch(data.train_size, global_batch)
    method = build_method(method_name, ddp, spec, global_batch, world, n_steps)
    loss_fn = nn.CrossEntropyLoss()

    start_epoch, steps_done, history = 0, 0, []
    if ckpt_path.exists():
        state = torch.load(ckpt_path, map_location=device, weights_only=False)
        if state["method"] != method_name:
            raise SpecError(f"the checkpoint in {out_dir} was trained with method {state['method']!r}, "
                            f"not {method_name!r}; use another --out or the same method")
        model.load_state_dict(state["model"])
        start_epoch, steps_done, history = state["epoch"], state["steps_done"], state["history"]
        method.load_state_dict(state["method_state"], step=start_epoch * n_steps)
        torch.set_rng_state(state["torch_rng"])
        if rank == 0:
            _write_metrics(metrics_path, history)  # drop lines written after the checkpoint, if any
    if mem_cap_bytes is not None and device.type == "cpu":
        cap_address_space(mem_cap_bytes)

    base = {"global_batch": global_batch, "local_batch": local_batch, "n_workers": world,
            "steps_per_epoch": n_steps, "start_epoch": start_epoch}
    if start_epoch >= spec.epochs:
        return {**base, "status": "ok", "history": history, "steps_done": steps_done, "traces": method.traces(),
                "param_digest": param_digest(model)}

    # probe: can this rank run a step at this batch?  No collective inside, so an OOM
    # cannot leave another rank waiting; then all agree.
    failed, err_msg = False, ""
    buffers = [b.detach().clone() for b in model.buffers()]
    try:
        x, y = _local_batch(data, _epoch_indices(spec.seed, start_epoch, data.train_size), 0, global_batch, rank,
                            local_batch, device)
        with ddp.no_sync():
            loss_fn(ddp(x), y).backward()
    except Exception as err:  # noqa: BLE001
        if not is_out_of_memory(err):
            raise
        failed, err_msg = True, str(err).splitlines()[0][:200]
    method.optimizer.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)
    del buffers
    if _agree_any(failed, device):
        return {**base, "status": "oom", "note": f"rank {rank}: {err_msg}" if failed else "another rank"}

    report_every = max(1, n_steps // 25)
    for epoch in range(start_epoch, spec.epochs):
        perm = _epoch_indices(spec.seed, epoch, data.train_size)
        model.train()
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # on device: no host sync per step
        for i in range(n_steps):
            step = epoch * n_steps + i
            x, y = _local_batch(data, perm, i, global_batch, rank, local_batch, device)
            method.optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            method.after_backward(step, x, y, loss_fn)
            method.optimizer.step()
            method.scheduler.step()
            loss_sum += loss.detach().double()
            steps_done += 1
            if rank == 0 and (i + 1) % report_every == 0:
                ctx.emit({"type": "step", "epoch": epoch, "step": i + 1, "steps_per_epoch": n_steps})
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        epoch_s = time.perf_counter() - t0
        method.before_eval()
        loss_total = loss_sum.reshape(1)
        slowest_s = torch.tensor([epoch_s], dtype=torch.float64, device=device)
        dist.all_reduce(loss_total)
        dist.all_reduce(slowest_s, op=dist.ReduceOp.MAX)
        rec = {"epoch": epoch + 1, "steps": n_steps, "steps_done": steps_done, "global_batch": global_batch,
               "n_workers": world, "lr": method.lr, "train_loss": float(loss_total) / (n_steps * world),
               "epoch_time_s": float(slowest_s),
               **evaluate(model, data, rank, world, spec.train.eval_batch, device)}
        tr = method.traces()
        if "scaled" in tr:
            recent = tr["scaled"][-n_steps:]
            rec["scaled_fraction"] = sum(recent) / max(len(recent), 1)
        history.append(rec)
        if rank == 0:
            _save_atomic({"epoch": epoch + 1, "steps_done": steps_done, "history": history, "method": method_name,
                          "global_batch": global_batch, "n_workers": world, "fallbacks": fallbacks,
                          "model": model.state_dict(), "method_state": method.state_dict(),
                          "torch_rng": torch.get_rng_state()}, ckpt_path)
            with open(metrics_path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            ctx.emit({"type": "epoch", **rec})
    return {**base, "status": "ok", "history": history, "steps_done": steps_done,
            "traces": method.traces() if rank == 0 else {}, "param_digest": param_digest(model)}


# --------------------------------------------------------------------------- in the caller
def _oom_text(err: WorkerError) -> bool:
    return is_out_of_memory(RuntimeError(str(err))) or "MemoryError" in str(err)  # also OutOfMemoryError


def validate_config(spec: JobSpec, method: str, n_workers: int, global_batch: int, dataset_size: int) -> None:
    """One sentence for a configuration that cannot train, before any process starts."""
    if n_workers < 1:
        raise SpecError(f"the number of workers must be at least 1, not {n_workers}")
    if global_batch < n_workers or global_batch % n_workers:
        raise SpecError(f"global batch {global_batch} does not split evenly over {n_workers} workers")
    if global_batch > dataset_size:
        raise SpecError(f"global batch {global_batch} is larger than the training set ({dataset_size} samples)")
    if method in ("ags", "static") and spec.train.ags.b_small >= global_batch:
        raise SpecError(f"train.ags.b_small ({spec.train.ags.b_small}) must be smaller than the global batch "
                        f"({global_batch}) for method {method!r}")
    if method == "adascale" and n_workers < 2:
        raise SpecError("method 'adascale' estimates the gradient variance across workers and needs at least 2")


def train(spec: JobSpec, method: str, n_workers: int, global_batch: int, out_dir: str | Path,
          resume: bool = False, launcher: Launcher | None = None,
          on_event: Callable[[dict], None] | None = None) -> dict:
    """Train ``spec`` with ``method`` on ``n_workers`` at ``global_batch``; return the run record.

    Writes ``checkpoint.pt`` and ``metrics.jsonl`` into ``out_dir`` as it goes.  With
    ``resume`` an existing checkpoint is continued (at its own global batch, which may be
    smaller than ``global_batch`` after an out-of-memory fallback); without it an existing
    checkpoint is an error, so nothing trained is overwritten."""
    _, data = check_workload(spec)
    out = Path(out_dir)
    ckpt = out / CHECKPOINT
    fallbacks: list[dict] = []
    resumed_from_epoch: int | None = None
    if ckpt.exists():
        if not resume:
            raise TulaError(f"{ckpt} already holds a training run; pass --resume to continue it, or choose "
                            "another output directory")
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        if state["n_workers"] != n_workers or state["method"] != method:
            raise SpecError(f"the checkpoint in {out} was trained with method {state['method']!r} on "
                            f"{state['n_workers']} worker(s), not {method!r} on {n_workers}; resume it with those")
        global_batch, fallbacks = state["global_batch"], list(state.get("fallbacks", []))
        resumed_from_epoch = state["epoch"]
        del state
    validate_config(spec, method, n_workers, global_batch, data.train_size)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(spec.profile.device)
    launcher = launcher or LocalLauncher(device=device, threads_per_worker=default_threads(spec))
    cap = spec.search.memory_budget_bytes if spec.search.enforce_memory_cap else None
    emit = on_event or (lambda ev: None)
    first_batch = global_batch
    t0 = time.perf_counter()
    while True:
        emit({"type": "start", "global_batch": global_batch, "n_workers": n_workers,
              "steps_per_epoch": steps_per_epoch(data.train_size, global_batch), "epochs": spec.epochs})
        try:
            res = launcher.run(train_world, n_workers, spec.to_dict(), method, global_batch, str(out), fallbacks,
                               cap, on_event=lambda rank, ev: emit(ev), timeout_s=None)
            status, note = res[0]["status"], res[0].get("note", "")
        except WorkerError as err:
            if not _oom_text(err):
                raise TrainFailed(f"{err}; the epochs finished before it are kept in {ckpt}" if ckpt.exists()
                                  else str(err), rank=err.rank, details=err.details) from None
            status, note = "oom", str(err)
        if status == "ok":
            break
        smaller = next_smaller_batch(global_batch, n_workers)
        done = torch.load(ckpt, map_location="cpu", weights_only=False)["epoch"] if ckpt.exists() else 0
        fallbacks.append({"from_global_batch": global_batch, "to_global_batch": smaller, "at_epoch": done,
                          "reason": note[:300]})
        emit({"type": "fallback", **fallbacks[-1]})
        if smaller < n_workers or (method in ("ags", "static") and smaller <= spec.train.ags.b_small):
            raise InfeasibleError(f"global batch {global_batch} ran out of memory on {n_workers} worker(s) and "
                                  "no smaller batch is left to fall back to")
        global_batch = smaller
    rank0 = res[0]
    hist = rank0["history"]
    return {
        "kind": TRAIN_KIND, "version": 1, "spec": spec.to_dict(), "method": method, "n_workers": n_workers,
        "requested_global_batch": first_batch, "global_batch": global_batch, "local_batch": global_batch // n_workers,
        "steps_per_epoch": rank0["steps_per_epoch"], "epochs": spec.epochs, "steps_done": rank0["steps_done"],
        "resumed_from_epoch": resumed_from_epoch, "fallbacks": fallbacks, "history": hist, "final": hist[-1] if hist else {},
        "best_test_top1": max((h["test_top1"] for h in hist), default=math.nan),
        "replicas_identical": len({r["param_digest"] for r in res}) == 1,
        "traces": rank0["traces"], "train_s": time.perf_counter() - t0, "device": device,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
