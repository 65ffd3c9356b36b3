"""What profiling and training share inside a rank: building the DDP model (a one-rank world's
model is not wrapped: :class:`OneRank`; the choice between DDP and FSDP is
:func:`tula.engine.fsdp.wrap_for_world`'s), and the out-of-memory probe (:func:`probe_fits`).

Under DDP the probe runs a forward/backward (and whatever ``step`` does) with no collective
inside, so a rank that runs out of memory cannot leave another waiting in one; the ranks then
agree through one all-reduce.  An out-of-memory is a result, not a crash.  Under FSDP it runs
the synchronised sharded step, and a rank that runs out of memory fails the world (cause
``oom``), whose caller falls back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from tula.engine.memory import errno_evidence, run_probe_step


def wrap_ddp(model: nn.Module, device: torch.device) -> DDP | OneRank:
    """The one DDP construction: gradients as bucket views (no extra copy).  A world of one
    rank has no gradients to average: its model is :class:`OneRank`, not DDP."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        return _ddp(model, device)
    return OneRank(model, device)


def _ddp(model: nn.Module, device: torch.device) -> DDP:
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)


class OneRank(nn.Module):
    """The model of a one-rank world, with the part of DDP's interface that profiling and
    training use (``module``, ``no_sync()``, ``register_comm_hook``) and none of its work.

    DDP on one rank still averages every gradient bucket through the collective library and
    broadcasts the BatchNorm buffers at every forward: measured on an H100 (torch 2.11,
    ResNet-50/224, ``bench/gpu_step_overhead.py``) 1.05-1.29x the plain loop's step, for the
    same gradients.  A method that reads DDP's buckets through a comm hook (AdaScale's local
    norms) gets a real DDP from its registration on: the hook then runs as it does on N ranks."""

    _hooked: DDP | None  # set with object.__setattr__ (not a submodule), so nn.Module's __getattr__ never types it

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.module = model
        self._device = device
        self._comm_hooks: list[tuple[Any, Any]] = []  # as DDP keeps them (ddp_has_comm_hook reads it)
        object.__setattr__(self, "_hooked", None)  # the DDP a comm hook needs; not a second submodule

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return (self._hooked or self.module)(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self._hooked.no_sync() if self._hooked is not None else contextlib.nullcontext()

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        hooked = self._hooked
        if hooked is None:
            hooked = _ddp(self.module, self._device)
            object.__setattr__(self, "_hooked", hooked)
        hooked.register_comm_hook(state, hook)
        self._comm_hooks.append((hook, state))

    def train(self, mode: bool = True) -> OneRank:
        super().train(mode)
        if self._hooked is not None:
            self._hooked.train(mode)
        return self


@contextlib.contextmanager
def _no_buffer_broadcast(model: nn.Module) -> Iterator[None]:
    """DDP's forward without its broadcast of the module's buffers (BatchNorm's statistics)
    from rank 0, for the block; outside DDP nothing.  DDP broadcasts them at the start of a
    forward unless the forward before it ran under ``no_sync()`` and finished: a probe step
    that failed for lack of memory inside its forward left the flag set, so its retry on that
    rank alone broadcast, while the other rank waited in the probe's agreement -- gloo's
    30 s timeout, or "connection closed by peer" (tests/test_dask.py's capped fallback, about
    1 run in 10, 2026-11-26)."""
    if not isinstance(model, DDP):
        yield
        return
    before = model.require_forward_param_sync
    model.require_forward_param_sync = False
    try:
        yield
    finally:
        model.require_forward_param_sync = before


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


def start_together(device: torch.device) -> None:
    """Hold every rank here until all have arrived (one tiny all-reduce; nothing when not
    distributed), so that clocks started after it start together: the ranks that wait here
    for rank 0's checkpoint write wait outside the timed span, not in its first step."""
    agree_max(0.0, device)


def probe_fits(step: Callable[[bool], None], device: torch.device, rank: int, model: nn.Module) -> tuple[bool, str]:
    """Run ``step`` -- a forward/backward of ``model`` (the rank's DDP, :class:`OneRank` or FSDP's
    :class:`tula.engine.fsdp.Sharded`), and whatever else the caller's step does; ``step(sync)``:
    with the gradients synchronised or under ``no_sync()`` -- and return whether it fit on every rank.

    Returns ``(fits, note)``; the note names the rank that ran out of memory and the allocator's
    words.  Any failure that is not out of memory is raised.

    Under DDP (and :class:`OneRank`) the step runs under ``no_sync()`` (``step(False)``) with no
    collective inside (:func:`_no_buffer_broadcast`): a rank may run it twice
    (:func:`tula.engine.memory.run_probe_step` retries a capped failure with the cap lifted) while
    the others wait in the agreement, one all-reduce.

    Under FSDP the step is the one training runs, synchronised (``step(True)``): each block's
    parameters all-gathered for its forward and its backward, its gradients reduce-scattered.  With
    collectives inside no rank can run it alone, so there is no capped retry and no agreement: a
    rank that runs out of memory raises (with the errno it failed with:
    :func:`~tula.engine.memory.errno_evidence`), its world fails with cause ``oom`` ("rank 1 of 2
    ran out of memory (...)"; the peers' "Connection closed by peer" ranks below it), and the
    world-level fallbacks take it: the profile records the trial as ``oom`` and runs the smaller
    batches in a fresh world (``ProfileSession.world_failed``), training ends the world as
    :class:`~tula.engine.rank_messages.OutOfMemory` and falls back to a smaller micro-batch
    (``TrainSupervisor.world_failed``).  When it ran, the step's gradients (the reduce-scattered
    shards) are dropped: a synchronised backward leaves no whole gradient in FSDP's accumulators
    (a probe under ``no_sync()`` would, and the next synchronised backward would reduce them with
    its own).

    Why not the whole model gathered for the step (``Sharded.gathered()``, the probe before
    2026-11-29: one all-gather per unit on entry, then no collective inside): it does not measure
    the sharded step and is neither exact nor a safe bound of it (measured 2026-11-29, tiny_gpt,
    4 blocks, 2 gloo ranks, B = 4, L = 16):

    * in tensors it holds more -- the whole parameters and gradients on every rank (MemTracker peaks
      of the forward/backward: 43.0 MB gathered against 36.1 MB sharded at d_model 256, 160.0
      against 138.2 MB at 512) --, so a batch that fits only sharded, FSDP's reason, was refused;
    * under an address-space cap (CPU, ``search.enforce_memory_cap``) it is not an upper bound
      either: what a step adds to the address space depends on where the allocator puts its
      buffers (the sharded step allocates each block's all-gather and reduce-scatter buffers
      anew), not on its tensor bytes.  Capped at the end of set-up (d_model 512) the gathered
      probe ran with 38 and 45 MiB of headroom, one synchronised sharded forward/backward needed
      60-90 MiB (out of memory at 45 and 60, ran at 90): it accepted caps its sharded step exceeded;
    * its entry's all-gather allocates each unit's whole parameters inside a collective, so a rank
      that could not failed its world anyway (at 15 and 30 MiB: "rank 1 of 2 ran out of memory
      ... 12609536 bytes", one block's whole parameters).

    The synchronised sharded step under the same caps failed its world with cause ``oom``, the
    peer's gloo error never hiding it (8 of 8 runs, 2026-11-29); as the profile's probe (a whole
    step, AdamW's first update included, d_model 512, B = 8) every world capped at 30 to 120 MiB
    above set-up ended as the trial's ``oom`` with the world's sentence (8 of 8), at 160 and 200
    MiB the trial ran."""
    if hasattr(model, "gathered"):  # FSDP's Sharded (tula.engine.fsdp, which imports this module)
        with errno_evidence():  # an out of memory fails the world, with the errno that says so
            step(True)
        for p in model.parameters():  # the probe's gradient shards: no update takes them
            p.grad = None
        return True, ""
    with _no_buffer_broadcast(model):
        fits_here, why = run_probe_step(lambda: step(False))  # raises what is not out of memory
    failed, note = not fits_here, f"out of memory on rank {rank}: {why}" if not fits_here else ""
    if agree_any(failed, device):
        return False, note or "out of memory on another rank"
    return True, ""


def check_shared_directory(directory: str, token: str, rank: int, device: torch.device) -> None:
    """Every rank must see the run directory (a shared file system on a cluster): rank 0
    writes ``token`` there, every rank reads it back; a rank that cannot is one sentence."""
    import os

    from tula.core.errors import TulaError

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
        raise TulaError(
            f"the run directory {directory} is not reachable from rank {first_missing} (each rank "
            f"reads it on its own host); put it on a file system every worker shares (e.g. the "
            "cluster's home or scratch file system)"
        )
    agree_any(False, device)  # everyone has read it
    if rank == 0:
        os.remove(path)


class LocalGradNorms:
    """State of :func:`local_norms_allreduce_hook`: this rank's squared gradient norm per
    parameter, taken from the buckets of the current backward pass.

    The norms are kept per parameter and summed in the model's parameter order, so the
    total does not depend on how DDP grouped the parameters into buckets: DDP rebuilds its
    buckets after the first step of every new process, so a resumed run's first step uses
    other buckets than an uninterrupted run's, and a per-bucket sum would differ in the
    last digits (and so would the gain and the parameters)."""

    def __init__(self, params: list[torch.nn.Parameter], device: torch.device) -> None:
        self.device = device
        self.order = {id(p): i for i, p in enumerate(params)}
        self.per_param: dict[int, torch.Tensor] = {}

    def add(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        # one fused kernel for the bucket's norms, in the gradients' precision (a float64
        # copy of every gradient cost more than the all-reduce on CPU); squared and summed
        # in float64 by take()
        for p, n in zip(params, torch._foreach_norm(list(grads))):
            self.per_param[self.order[id(p)]] = n

    def take(self) -> torch.Tensor:
        if not self.per_param:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        norms = torch.stack([self.per_param[i] for i in sorted(self.per_param)])
        self.per_param = {}
        return norms.double().square().sum()


def local_norms_allreduce_hook(state: LocalGradNorms, bucket):  # type: ignore[no-untyped-def]  # DDP refuses string annotations here
    """DDP comm hook: keep the squared norm of each local gradient in the bucket in
    ``state``, then average the bucket over the ranks as DDP does without a hook.

    ``bucket`` is a ``dist.GradBucket`` and the result a ``torch.futures.Future`` of the
    averaged bucket; they are not annotated because DDP compares the annotations with
    those types, and this module's annotations are strings."""
    state.add(bucket.parameters(), bucket.gradients())
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]  # torch's hook reads None as the default group


def synced_sq_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """|G_B|^2 of the (synchronised) gradients, on their device, in float64: no host sync."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    return torch.stack(torch._foreach_norm(grads)).double().square().sum()
