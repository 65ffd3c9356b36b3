"""What "a batch" is, in one place: a tensor, a tuple or list of tensors, or a mapping of
tensors (a Hugging Face-style batch: ``input_ids``, ``attention_mask``, ``labels``).

The data path yields ``(inputs, targets)`` pairs.  ``inputs`` is any of the above; a data set
whose samples are mappings (a data factory yielding dicts) gives its batch as the inputs and
``None`` as the targets -- the targets are inside (``labels``) and the model scores itself
(``train.loss: model``).  The step's micro-batches, a training method's small batch, the copy to
the device and the evaluation all go through these helpers, so a dict flows where a tensor did.

``train.loss: model`` (:data:`MODEL_LOSS`): the model returns its own loss, an output with
``.loss`` or a mapping with ``"loss"`` (:func:`model_loss`); it is called with the batch's
mapping as keywords (``model(**batch)``), or, with ``(inputs, targets)`` tensors, as
``model(inputs, labels=targets)`` (:func:`batch_loss`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from tula.core.spec import MODEL_LOSS

__all__ = [
    "MODEL_LOSS",
    "ModelLoss",
    "as_pair",
    "batch_bytes",
    "batch_loss",
    "batch_size",
    "forward",
    "keys_text",
    "map_tensors",
    "model_loss",
    "model_output",
    "pin",
    "record_stream",
    "slice_batch",
    "to_device",
]


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with ``fn`` applied to each of its tensors (anything else kept as it is)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(v, fn) for v in batch)
    return batch


def _tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of ``batch``, in :func:`map_tensors`' order."""
    out: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        out.append(t)
        return t

    map_tensors(batch, keep)
    return out


def as_pair(collated: Any) -> tuple[Any, Any]:
    """A collated batch as ``(inputs, targets)``: a mapping (a dict batch) is the inputs with
    ``None`` as targets (they are inside it); anything else is unpacked as a pair."""
    if isinstance(collated, Mapping):
        return collated, None
    x, y = collated
    return x, y


def batch_size(batch: Any) -> int:
    """The samples of ``batch``: the first dimension of its first tensor (0 for ``None``)."""
    tensors = _tensors(batch)
    return int(tensors[0].shape[0]) if tensors else 0


def slice_batch(batch: Any, lo: int, hi: int) -> Any:
    """Samples ``lo`` to ``hi`` of ``batch`` (every tensor sliced on its first dimension;
    ``None`` stays ``None``)."""
    return map_tensors(batch, lambda t: t[lo:hi])


def to_device(batch: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """``batch`` on ``device`` (unchanged on the CPU)."""
    if device.type == "cpu":
        return batch
    return map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def pin(batch: Any) -> Any:
    """``batch`` in pinned host memory."""
    return map_tensors(batch, lambda t: t.pin_memory())


def record_stream(batch: Any, stream: Any) -> None:
    """Each of ``batch``'s tensors records ``stream`` (the allocator keeps it until that stream's work ran)."""
    for t in _tensors(batch):
        t.record_stream(stream)


def batch_bytes(batch: Any) -> int:
    """Bytes of ``batch``'s tensors."""
    return sum(t.numel() * t.element_size() for t in _tensors(batch))


def keys_text(batch: Any) -> str:
    """How a batch's inputs are described in a sentence: its keys, or its shape."""
    if isinstance(batch, Mapping):
        return "keys " + ", ".join(str(k) for k in batch)
    if isinstance(batch, torch.Tensor):
        return f"shape {tuple(batch.shape[1:])}"
    return type(batch).__name__


def forward(model: nn.Module | Callable, x: Any) -> Any:
    """``model`` on the inputs ``x``: a mapping as keywords (``model(**x)``), anything else as
    one argument."""
    if isinstance(x, Mapping):
        return model(**x)
    return model(x)


def model_loss(output: Any) -> Any:
    """The loss a model returned: ``output.loss``, or ``output["loss"]`` of a mapping (``None``
    when it has none)."""
    if isinstance(output, Mapping):
        return output.get("loss")
    return getattr(output, "loss", None)


class ModelLoss:
    """``train.loss: model``: the model's own loss.  Called as a loss, ``loss(output, target)``
    is the output's loss (the target unused); :func:`batch_loss` calls the model so that it
    computes one."""

    name = MODEL_LOSS

    def __call__(self, output: Any, target: Any = None) -> torch.Tensor:
        loss = model_loss(output)
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"train.loss is 'model', but the model returned {type(output).__name__} without a loss "
                "(an output with .loss, or a dict with 'loss')"
            )
        return loss

    def __repr__(self) -> str:
        return "ModelLoss()"


def batch_loss(model: nn.Module | Callable, loss_fn: Callable, x: Any, y: Any) -> torch.Tensor:
    """The loss of ``model`` on the batch ``(x, y)``: ``loss_fn(forward(model, x), y)``; with
    ``train.loss: model`` (a :class:`ModelLoss`) the model's own loss, the model called with
    the batch's mapping as keywords or, given targets ``y``, as ``model(x, labels=y)``."""
    if isinstance(loss_fn, ModelLoss):
        return loss_fn(model_output(model, x, y), y)
    return loss_fn(forward(model, x), y)


def model_output(model: nn.Module | Callable, x: Any, y: Any) -> Any:
    """``model``'s output on the batch when it gives its own loss (``train.loss: model``): a dict
    batch as keywords (``model(**x)``, the targets inside; targets ``y`` given beside it as
    ``labels``), else ``model(x, labels=y)``."""
    if y is None:
        return forward(model, x)
    if isinstance(x, Mapping):
        return model(**{"labels": y, **x})
    return model(x, labels=y)
