"""Activation checkpointing (``train.checkpointing``): a model's blocks keep only their inputs in
the forward pass and recompute their activations in the backward pass, less memory for a slower step.

:func:`checkpoint_blocks` wraps the ``forward`` of each block it finds with
:func:`torch.utils.checkpoint.checkpoint` (``use_reentrant=False``, which DDP takes without a static
graph); a wrapped block runs plain in evaluation mode or without gradients.  The blocks are the
outermost submodules whose class is named in ``train.checkpoint_modules``, or, when none are named,
found by one rule (:func:`auto_block_classes`):

- ``torch.nn.TransformerEncoderLayer``, ``torch.nn.TransformerDecoderLayer`` and ``tiny_gpt``'s
  block, wherever they appear;
- any other class whose name ends in ``Block`` or ``Layer``, that holds parameters and no batch norm
  (a recomputed batch norm would update its running statistics twice), and of which the model holds
  at least two instances (the repeated unit of a deep model).

:func:`apply_checkpointing` is what the check, the profile and the training ranks call: nothing
when checkpointing is off, and a :class:`~tula.core.errors.WorkloadError` sentence naming the
classes looked for when it is on and no block matches.
"""

from __future__ import annotations

import types
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from tula.core.errors import WorkloadError
from tula.core.spec import TrainSpec
from tula.engine.tiny_gpt import _Block as TinyGPTBlock

#: block classes checkpointed wherever they appear when no names are given
KNOWN_BLOCKS: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, TinyGPTBlock)
#: the endings of the class names the automatic rule takes as a model's repeated blocks
BLOCK_NAME_ENDINGS = ("Block", "Layer")
#: the attribute a wrapped block carries (it is wrapped once)
_MARK = "_tula_checkpointed"


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The block's own ``forward`` through :func:`torch.utils.checkpoint.checkpoint` in training
    with gradients, plain otherwise.  Bound to the block (a deep copy rebinds it to the copy)."""
    own = type(self).forward.__get__(self)
    if self.training and torch.is_grad_enabled():
        return checkpoint(own, *args, use_reentrant=False, **kwargs)
    return own(*args, **kwargs)


def _has_batch_norm(module: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def auto_block_classes(model: nn.Module) -> set[type[nn.Module]]:
    """The classes of ``model``'s submodules the automatic rule checkpoints (the module's docstring)."""
    subs = [m for name, m in model.named_modules() if name]
    counts = Counter(type(m) for m in subs)
    found = {cls for cls in counts if issubclass(cls, KNOWN_BLOCKS)}
    for cls, count in counts.items():
        if count >= 2 and cls.__name__.endswith(BLOCK_NAME_ENDINGS) and cls not in found:
            members = [m for m in subs if type(m) is cls]
            if all(any(True for _ in m.parameters()) and not _has_batch_norm(m) for m in members):
                found.add(cls)
    return found


def describe_looked_for(class_names: list[str] | None) -> str:
    """The classes :func:`checkpoint_blocks` looks for, in words (for the sentence of no match)."""
    if class_names:
        return ("class " if len(class_names) == 1 else "the classes ") + ", ".join(repr(n) for n in class_names)
    return (
        "nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, tiny_gpt's blocks, or a class named *Block or "
        "*Layer with parameters and no batch norm that appears at least twice"
    )


def checkpoint_blocks(model: nn.Module, class_names: list[str] | None = None, *, wrap: bool = True) -> int:
    """Wrap the ``forward`` of each outermost submodule of ``model`` whose class is named in
    ``class_names`` (``None``: :func:`auto_block_classes`) with activation checkpointing; the model
    itself is never wrapped, nor a block inside a wrapped one.  Returns how many blocks are wrapped
    (already-wrapped ones included: a second call wraps nothing twice); ``wrap`` False: how many
    would be, wrapping none."""
    names = set(class_names) if class_names else None
    classes = auto_block_classes(model) if names is None else set()

    def matches(m: nn.Module) -> bool:
        return type(m).__name__ in names if names is not None else type(m) in classes

    wrapped = 0

    def visit(module: nn.Module) -> None:
        nonlocal wrapped
        for child in module.children():
            if matches(child):
                if wrap and not getattr(child, _MARK, False):
                    child.forward = types.MethodType(_checkpointed_forward, child)
                    setattr(child, _MARK, True)
                wrapped += 1
            else:
                visit(child)

    visit(model)
    return wrapped


def apply_checkpointing(model: nn.Module, train: TrainSpec, model_name: str = "the model") -> nn.Module:
    """``model`` with ``train.checkpointing`` applied (:func:`checkpoint_blocks` when ``on``;
    nothing when ``off``, nor when ``auto``: the plan chooses, and training gets on or off from
    it, :func:`tula.core.job_rules.training_spec`).  No block to wrap (on) or to choose to wrap
    (auto) is the user's :class:`~tula.core.errors.WorkloadError`, one sentence naming the classes
    looked for."""
    if train.checkpointing == "off":
        return model
    if checkpoint_blocks(model, train.checkpoint_modules, wrap=train.checkpointing == "on") == 0:
        raise WorkloadError(
            f"train.checkpointing is {train.checkpointing}, but model {model_name!r} has no submodule of "
            f"{describe_looked_for(train.checkpoint_modules)} to checkpoint; name its repeated block class in "
            "train.checkpoint_modules, or set train.checkpointing to 'off'"
        )
    return model
