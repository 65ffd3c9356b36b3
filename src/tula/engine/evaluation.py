"""Evaluation on the test split, sharded over a world's ranks: the mean loss and the score
(top-1, and top-5 with more than 5 classes, and the perplexity of a sequence's tokens; R^2 for
``mse``; the user's own loss and, where the targets are class labels, its top-1; the model's own
loss (``train.loss: model``) and its perplexity), all-reduced.  The trainer evaluates after every epoch
(:meth:`tula.engine.rank_loop._RankTrainer.epoch_record`) through its step object
(:meth:`tula.engine.step.TrainStep.evaluate`, which a ``train.step`` subclass may override); the
run trial times it."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from tula.core.registry import LOSS_NAMES
from tula.engine.batch import MODEL_LOSS, ModelLoss, batch_size, forward, model_output
from tula.engine.data import data_path
from tula.engine.workloads import Dataset


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Dataset,
    rank: int,
    world: int,
    eval_batch: int,
    device: torch.device,
    loss: str = "cross_entropy",
    loss_fn: Callable | None = None,
) -> dict[str, float]:
    """The test split's mean loss and score, each rank taking every ``world``-th sample; the
    sums are all-reduced.  ``cross_entropy``: top-1 (and top-5 with more than 5 classes);
    ``mse``: R^2 (the mean over outputs, as scikit-learn's ``r2_score``); the user's own loss
    (``loss_fn``): :func:`_evaluate_own_loss`; the model's own (``model``): :func:`_evaluate_model_loss`.
    Class scores per token of a sequence (outputs ``(n, C, L)``) also give ``test_perplexity``,
    ``exp(test_loss)``.  An empty test split (no held-out data) gives NaN."""
    if loss == "mse":
        return _evaluate_mse(model, data, rank, world, eval_batch, device)
    if loss == MODEL_LOSS:
        return _evaluate_model_loss(model, data, rank, world, eval_batch, device)
    if loss not in LOSS_NAMES:
        if loss_fn is None:
            raise ValueError(f"evaluating with the loss {loss!r} needs the loss function")
        return _evaluate_own_loss(model, data, rank, world, eval_batch, device, loss_fn)
    was_training = model.training
    model.eval()
    k5 = data.num_classes > 5
    sums = torch.zeros(4, dtype=torch.float64)  # labels (samples, or tokens of (n, C, L) outputs), loss, top1, top5
    sequence = False  # class scores per token of a sequence: the perplexity is reported too
    for x, y in data_path(data, device).eval_batches(rank, world, eval_batch):  # samples rank, rank + world, ...
        out = model(x)
        sequence = out.ndim == 3
        sums[0] += y.numel()
        sums[1] += float(nn.functional.cross_entropy(out, y, reduction="sum"))
        top = out.topk(5 if k5 else 1, dim=1).indices
        sums[2] += float((top[:, 0] == y).sum())
        if k5:
            sums[3] += float((top == y.unsqueeze(1)).any(dim=1).sum())
    model.train(was_training)
    sums = _summed_over_ranks(sums, device)
    n = float(sums[0]) if sums[0] > 0 else math.nan
    res = {"test_loss": float(sums[1]) / n, "test_top1": float(sums[2]) / n}
    if k5:
        res["test_top5"] = float(sums[3]) / n
    if sequence:
        res["test_perplexity"] = _perplexity(res["test_loss"])
    return res


def _perplexity(mean_loss: float) -> float:
    """``exp`` of a mean cross-entropy per token (inf past float's range, NaN stays NaN)."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf


def _evaluate_model_loss(
    model: nn.Module, data: Dataset, rank: int, world: int, eval_batch: int, device: torch.device
) -> dict[str, float]:
    """``train.loss: model``: the model's own loss on the test split (the model called as in
    training, :func:`tula.engine.batch.model_output`), each evaluation batch's loss weighted by
    its labels counted (``labels`` other than -100, Hugging Face's ignored index) when the batch
    has integer ``labels`` -- the mean per token, as a language model's loss is -- else by its
    samples; ``test_perplexity`` is ``exp(test_loss)``.  No top-1."""
    was_training = model.training
    model.eval()
    own = ModelLoss()
    sums = torch.zeros(2, dtype=torch.float64)  # weight (labels or samples), loss x weight
    for x, y in data_path(data, device).eval_batches(rank, world, eval_batch):
        labels = x.get("labels") if isinstance(x, dict) and y is None else y
        if isinstance(labels, torch.Tensor) and not labels.is_floating_point():
            weight = float((labels != -100).sum())
        else:
            weight = float(batch_size(x))
        sums[0] += weight
        sums[1] += float(own(model_output(model, x, y))) * weight
    model.train(was_training)
    sums = _summed_over_ranks(sums, device)
    n = float(sums[0]) if sums[0] > 0 else math.nan
    test_loss = float(sums[1]) / n
    return {"test_loss": test_loss, "test_perplexity": _perplexity(test_loss)}


def _integer_labels(out: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether ``y`` are class labels of ``out``'s dimension 1: integer targets of ``out``'s
    shape without that dimension (``(n,)`` for ``(n, C)``, ``(n, H, W)`` for ``(n, C, H, W)``)."""
    return (
        isinstance(out, torch.Tensor)
        and not y.is_floating_point()
        and not y.is_complex()
        and y.dtype != torch.bool
        and out.ndim == y.ndim + 1
        and out.shape[1] >= 2
        and out.shape[0] == y.shape[0]
        and out.shape[2:] == y.shape[1:]
    )


def _evaluate_own_loss(
    model: nn.Module, data: Dataset, rank: int, world: int, eval_batch: int, device: torch.device, loss_fn: Callable
) -> dict[str, float]:
    """The user's loss on the test split: ``test_loss`` is the loss of each evaluation batch
    weighted by its number of samples (the mean over samples for a loss that averages over
    its batch), and ``test_top1`` -- only when the targets are integer labels of the output's
    dimension 1 (:func:`_integer_labels`) -- the fraction of labels, per sample or per
    element (pixel), that are the output's largest score there; negative labels (e.g.
    ``CrossEntropyLoss``'s ignore_index -100) are not counted."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64)  # samples, loss x samples, correct labels, labels counted
    for x, y in data_path(data, device).eval_batches(rank, world, eval_batch):
        out = forward(model, x)
        n_batch = batch_size(x)
        sums[0] += n_batch
        sums[1] += float(loss_fn(out, y)) * n_batch
        if _integer_labels(out, y):
            counted = y >= 0
            sums[2] += float(((out.argmax(1) == y) & counted).sum())
            sums[3] += float(counted.sum())
    model.train(was_training)
    sums = _summed_over_ranks(sums, device)
    n = float(sums[0]) if sums[0] > 0 else math.nan
    res = {"test_loss": float(sums[1]) / n}
    if sums[3] > 0:
        res["test_top1"] = float(sums[2]) / float(sums[3])
    return res


def _evaluate_mse(
    model: nn.Module, data: Dataset, rank: int, world: int, eval_batch: int, device: torch.device
) -> dict[str, float]:
    was_training = model.training
    model.eval()
    t = data.num_classes  # outputs
    sums = torch.zeros(1 + 3 * t, dtype=torch.float64)  # samples, then per output: sum y, sum y^2, squared error
    for x, y in data_path(data, device).eval_batches(rank, world, eval_batch):
        out, y = model(x).double(), y.double()
        sums[0] += len(y)
        sums[1 : 1 + t] += y.sum(0).cpu()
        sums[1 + t : 1 + 2 * t] += y.square().sum(0).cpu()
        sums[1 + 2 * t :] += (out - y).square().sum(0).cpu()
    model.train(was_training)
    sums = _summed_over_ranks(sums, device)
    n = float(sums[0])
    if n == 0:
        return {"test_loss": math.nan, "test_r2": math.nan}
    sum_y, sum_y2, sse = sums[1 : 1 + t], sums[1 + t : 1 + 2 * t], sums[1 + 2 * t :]
    sst = (sum_y2 - sum_y.square() / n).clamp_min(0)
    # a constant target: 1 when predicted exactly, else 0 (scikit-learn's force_finite)
    r2 = torch.where(sst > 0, 1 - sse / sst.clamp_min(1e-300), (sse == 0).double())
    return {"test_loss": float(sse.sum()) / (n * t), "test_r2": float(r2.mean())}


def _summed_over_ranks(sums: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``sums`` added up over the world's ranks (on ``device``, as the backend needs), on the CPU;
    as they are outside a world."""
    if not dist.is_initialized():
        return sums
    on_device = sums.to(device)
    dist.all_reduce(on_device)
    return on_device.cpu()
