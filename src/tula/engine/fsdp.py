"""How a rank holds its model in the world (``train.parallelism``): :func:`wrap_for_world` wraps it
as DDP (:func:`tula.engine.ddp.wrap_ddp`) or as FSDP2 (:class:`Sharded`), so that the trainer does
not branch on the kind; and the sharded checkpoint an FSDP world writes and reads.

FSDP (``torch.distributed.fsdp.fully_shard``) shards each block of the model, then the model itself
(the parameters outside every block): a rank holds 1/N of the parameters, their gradients and the
optimiser's state (DTensors); a block's parameters are all-gathered for its forward and again for its
backward, its gradients reduce-scattered (averaged, as DDP's all-reduce averages them).  The blocks
are the outermost submodules of ``train.checkpoint_modules``' classes, or, when none are named, of the
classes activation checkpointing finds (:func:`tula.engine.checkpointing.auto_block_classes`); a model
without any is sharded as one unit (its root), which still divides the state by N but gathers all
parameters at once for the forward.

A sharded checkpoint: every rank writes its shards of the model and the optimiser's state with
``torch.distributed.checkpoint`` (DCP) into ``checkpoint.shards/epoch-NNNN/`` of the run directory,
then rank 0 writes ``checkpoint.pt`` as under DDP with the rest (epoch, history, RNG, method extras)
and the shards' directory under ``shards``; the shards of the last two checkpoints are kept.  DCP
reads them back into any worker count (a new generation, the out-of-memory fallback), and
:func:`full_state_from_shards` reads them into one state dict without a process group.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tula.core.errors import RecordError, SpecError
from tula.core.spec import TrainSpec
from tula.engine.checkpointing import auto_block_classes
from tula.engine.ddp import wrap_ddp
from tula.engine.rank_checkpoint import RankCheckpoint

#: the directory of the run directory that holds the sharded checkpoints
SHARDS_DIR = "checkpoint.shards"
#: the checkpoint's header key naming its shards' directory (relative to the run directory)
SHARDS_KEY = "shards"


def wrap_for_world(model: nn.Module, device: torch.device, train: TrainSpec) -> nn.Module:
    """``model`` (on ``device``) as this rank runs it in its world, as ``train.parallelism`` says:
    DDP (:func:`tula.engine.ddp.wrap_ddp`; :class:`~tula.engine.ddp.OneRank` in a one-rank world)
    or FSDP2 (:class:`Sharded`).  Both have ``module`` (the model) and ``no_sync()``."""
    if train.parallelism == "fsdp":
        return Sharded(model, device, train.checkpoint_modules)
    return wrap_ddp(model, device)


def shard_blocks(model: nn.Module, device: torch.device, class_names: list[str] | None = None) -> int:
    """``fully_shard`` each outermost submodule of ``model`` whose class is named in ``class_names``
    (``None``: :func:`~tula.engine.checkpointing.auto_block_classes`), then ``model`` itself, on a
    one-dimensional mesh of the whole world.  Returns how many blocks were sharded (0: the model is
    one unit)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = set(class_names) if class_names else None
    classes = auto_block_classes(model) if names is None else set()
    if device.type == "cpu":
        # the autograd engine starts its device threads once, at the process's first backward pass: after
        # fully_shard, 8 of them on a CPU (measured, torch 2.14), each reserving a stack, which the training's
        # address-space cap then refuses (EAGAIN in the out-of-memory probe); a backward pass before it, none
        torch.ones(1, requires_grad=True).sum().backward()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if (type(child).__name__ in names) if names is not None else (type(child) in classes):
                blocks.append(child)
            else:
                visit(child)

    visit(model)
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return len(blocks)


class Sharded(nn.Module):
    """The model of an FSDP2 world, with the part of DDP's interface that profiling and training
    use: ``module`` (the model, whose parameters are now sharded DTensors), ``no_sync()`` (gradient
    accumulation: the backward keeps whole gradients and reduce-scatters none), and
    :meth:`gathered` (the whole model on every rank, no collective inside: the evaluation).  The
    out-of-memory probe runs the synchronised sharded step, not gathered
    (:func:`tula.engine.ddp.probe_fits` says why).

    Parameters
    ----------
    model : nn.Module
        The rank's model on its device; sharded in place (:func:`shard_blocks`).
    device : torch.device
        The rank's device; the mesh is of its type.
    class_names : list of str or None
        ``train.checkpoint_modules``: the block classes sharded one by one.
    """

    def __init__(self, model: nn.Module, device: torch.device, class_names: list[str] | None = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise SpecError("train.parallelism fsdp needs a process group; train it through tula train or tula run")
        self.block_count = shard_blocks(model, device, class_names)  # 0: the model is one unit
        self.module = model
        self._device = device

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _units(self) -> list[Any]:
        """The sharded units as FSDP's modules: the model itself first (its unshard initialises FSDP's
        state for all of them), then its blocks."""
        from torch.distributed.fsdp import FSDPModule

        return [m for m in self.module.modules() if isinstance(m, FSDPModule)]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """The backward passes inside keep the whole gradients on each rank (nothing is
        reduce-scattered); the first synchronised backward after it reduces them with its own.
        The parameters are still all-gathered for every forward and backward inside (the blocks
        reshard after each, as outside): accumulation pays the all-gathers per micro-batch, the
        reduce-scatter once (:class:`tula.core.effects.ShardingEffect`)."""
        root: Any = self.module
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Every unit's parameters gathered once on entry (all ranks together), then forward and
        backward passes with no collective inside: nothing resharded, no gradient reduced, so a
        rank may run a pass the others do not (an evaluation with one more batch).  On exit the whole gradients are dropped and the units resharded.
        Holds the whole parameters and gradients, as DDP does."""
        units = self._units()
        for unit in units:
            unit.unshard()
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.set_reshard_after_backward(False, recurse=False)
            unit.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for p in self.module.parameters():  # the whole parameters while gathered: their gradients
                p.grad = None
            for unit in units:
                # the root keeps its parameters after its forward (its backward needs them next), as fully_shard sets it
                unit.set_reshard_after_forward(unit is not self.module, recurse=False)
                unit.set_reshard_after_backward(True, recurse=False)
                unit.set_requires_gradient_sync(True, recurse=False)
                unit.reshard()


def gathered(model: nn.Module) -> contextlib.AbstractContextManager[None]:
    """:meth:`Sharded.gathered` for a sharded model; nothing for DDP and ``OneRank``, whose
    forward passes hold no collective the ranks must meet in (DDP's buffer broadcast aside)."""
    if isinstance(model, Sharded):
        return model.gathered()
    return contextlib.nullcontext()


def full_parameters(model: nn.Module) -> Iterator[torch.Tensor]:
    """``model``'s parameters whole: a sharded one all-gathered (every rank must call it, in the same
    order), another as it is."""
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        yield p.full_tensor() if isinstance(p, DTensor) else p


# ---------------------------------------------------------------------------- sharded checkpoints
def save_shards(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    out_dir: str | Path,
    epoch: int,
    state: RankCheckpoint | None,
) -> RankCheckpoint | None:
    """Under FSDP (``model`` a :class:`Sharded`; every rank calls it): write this rank's shards of
    the model and of ``optimizer``'s state into ``checkpoint.shards/epoch-NNNN`` (DCP) and return
    ``state`` (the checkpoint rank 0 writes; ``None`` elsewhere) as ``checkpoint.pt`` holds it: no
    model tensors, no optimiser state, and the shards' directory under ``shards``.  Under DDP
    ``state`` unchanged."""
    if not isinstance(model, Sharded):
        return state
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    ref = f"{SHARDS_DIR}/epoch-{epoch:04d}"
    model_state, optim_state = get_state_dict(model.module, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=Path(out_dir) / ref)
    if state is None:
        return None
    return replace(state, model={}, method_state={**state.method_state, "optimizer": None}, shards=ref)


def prune_shards(out_dir: str | Path) -> None:
    """Rank 0, after ``checkpoint.pt`` is written: remove the shards neither kept checkpoint
    (``checkpoint.pt``, ``checkpoint.prev.pt``) names; nothing when there are none (DDP)."""
    from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, _read

    base = Path(out_dir) / SHARDS_DIR
    if not base.is_dir():
        return
    keep = set()
    for name in (CHECKPOINT, PREVIOUS):
        path = Path(out_dir) / name
        if path.exists():
            with contextlib.suppress(RecordError):  # a damaged one names nothing to keep
                keep.add(_read(path, "cpu").get(SHARDS_KEY))
    for path in base.iterdir():
        if f"{SHARDS_DIR}/{path.name}" not in keep:
            shutil.rmtree(path, ignore_errors=True)


def load_shards(
    model: nn.Module, optimizer: torch.optim.Optimizer, out_dir: str | Path, state: RankCheckpoint
) -> RankCheckpoint:
    """The checkpoint ``state`` (read from ``checkpoint.pt`` on every rank) with its model and
    optimiser state put back: under FSDP its shards read (DCP, into this world's shards) into
    ``model`` and ``optimizer``, and returned as they now hold them, so that
    :func:`tula.engine.rank_loop._restore` loads them as it loads a DDP checkpoint's.  A DDP
    checkpoint under FSDP, or the reverse, is one sentence."""
    ref = state.shards
    if not isinstance(model, Sharded):
        if ref is not None:
            raise SpecError(
                f"the checkpoint in {out_dir} was trained with train.parallelism fsdp (sharded); resume it with "
                "fsdp, or train into another --out"
            )
        return state
    if ref is None:
        raise SpecError(
            f"the checkpoint in {out_dir} was trained with train.parallelism ddp; resume it with ddp, or train "
            "into another --out"
        )
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model.module, optimizer)
    dcp.load({"model": model_state, "optimizer": optim_state}, checkpoint_id=Path(out_dir) / ref)  # in place
    set_state_dict(model.module, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    method_state = {**state.method_state, "optimizer": optimizer.state_dict()}
    return replace(state, model=model.module.state_dict(), method_state=method_state)


def full_state_from_shards(out_dir: str | Path, ref: str) -> dict[str, Any]:
    """The model's and the optimiser's state of the sharded checkpoint ``ref`` (its header's
    ``shards``) in ``out_dir``, whole, as one state dict (``{"model": ..., "optimizer": ...}``,
    keyed by parameter names); no process group needed."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "whole.pt"
        dcp_to_torch_save(Path(out_dir) / ref, whole)
        loaded: dict[str, Any] = torch.load(whole, weights_only=False)
    return loaded
