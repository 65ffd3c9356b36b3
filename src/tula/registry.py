"""The training methods Tula knows: one table that the spec, the runner, the CLI, the
service and the benchmarks read.

Each entry says where the method's class lives (imported only when a method is built, so
this module and :mod:`tula.spec` load without torch), what the CLI's help says about it,
which part of the spec configures it, and its constraints *as data*:

* ``min_workers`` -- the fewest ranks it can train on (AdaScale estimates the gradient
  variance from the spread of the workers' local gradients);
* ``needs_b_small_below_batch`` -- it measures on a sub-batch of ``train.ags.b_small``
  samples, which must be smaller than the global batch.

:func:`check_train_config` is the one place where every rule a training configuration
must satisfy is checked, before any process starts; the method classes call
:func:`check_method` with the same sentences.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import SpecError

if TYPE_CHECKING:
    from .spec import JobSpec


@dataclass(frozen=True)
class MethodInfo:
    """A training method: its name, its class and its constraints.

    Attributes
    ----------
    name : what ``train.method`` and ``--method`` accept
    target : ``"package.module:Class"`` of its :class:`tula.optim.methods.Method` subclass
    summary : one line for the CLI's help
    label : its name in tables and plots (the paper's Table I)
    spec_section : the spec section that configures it (``"train.ags"``), if any
    spec_fields : other spec fields it reads
    min_workers : the fewest workers it can train on
    min_workers_reason : why (completes "method 'x' ... and needs at least N workers")
    needs_b_small_below_batch : ``train.ags.b_small`` must be smaller than the global batch
    is_baseline : a method Tula is compared with (not one of Tula's own)
    scales_lr_with_batch : its own LR rule already follows the global batch (a batch schedule's
        ``lr_rule`` must then be ``keep``, or the LR would be scaled twice)
    resizable : its state can move to another worker count (post-local SGD keeps one momentum
        per rank, which has no meaning on another count)
    """

    name: str
    target: str
    summary: str
    label: str
    spec_section: str | None = None
    spec_fields: tuple[str, ...] = ()
    min_workers: int = 1
    min_workers_reason: str = ""
    needs_b_small_below_batch: bool = False
    is_baseline: bool = True
    scales_lr_with_batch: bool = False
    resizable: bool = True


_TABLE = (
    MethodInfo("ags", "tula.optim.methods:AdaptiveScaling",
               "Tula's adaptive gradient scaling (Algorithm 1)", "AGS", spec_section="train.ags",
               needs_b_small_below_batch=True, is_baseline=False),
    MethodInfo("static", "tula.optim.methods:StaticScaling",
               "static gradient scaling U(s) (Eq. 8) outside sensitive phases", "static", spec_section="train.ags",
               needs_b_small_below_batch=True, is_baseline=False),
    MethodInfo("lbt", "tula.optim.methods:Method", "vanilla large-batch training at the spec's LR", "LBT",
               spec_fields=("optimizer",)),
    MethodInfo("lrs", "tula.optim.methods:LRS", "linear LR scaling from train.base_batch with warm-up", "LRS",
               spec_fields=("train.base_batch", "train.warmup_epochs"), scales_lr_with_batch=True),
    MethodInfo("lars", "tula.optim.baselines:LARS", "LARS (timm) with linear LR scaling and warm-up", "LARS",
               spec_fields=("train.base_batch", "train.warmup_epochs"), scales_lr_with_batch=True),
    MethodInfo("polo", "tula.optim.baselines:PostLocalSGD", "post-local SGD", "PoLo",
               spec_fields=("train.polo_switch_epoch", "train.polo_averages_per_epoch", "train.warmup_epochs"),
               resizable=False),
    MethodInfo("adascale", "tula.optim.baselines:AdaScale", "AdaScale SGD, the LR times the gain ratio", "AdaScale",
               spec_fields=("train.base_batch",), min_workers=2,
               min_workers_reason="estimates the gradient variance across workers"),
    MethodInfo("lamb", "tula.optim.baselines:LAMB", "LAMB (timm) at train.lamb_lr with square-root LR scaling",
               "LAMB", spec_fields=("train.lamb_lr", "train.base_batch", "train.warmup_epochs"),
               scales_lr_with_batch=True),
)

METHODS: dict[str, MethodInfo] = {m.name: m for m in _TABLE}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


#: the training losses (``train.loss``): name -> what it trains and how an epoch is scored
LOSSES: dict[str, str] = {
    "cross_entropy": "classification: integer class labels; per epoch test loss, top-1 (and top-5)",
    "mse": "regression: float targets of shape (n, outputs); per epoch test MSE and R^2",
}
LOSS_NAMES: tuple[str, ...] = tuple(LOSSES)


def method_info(name: str) -> MethodInfo:
    """The entry of ``name``; an unknown name is a :class:`~tula.errors.SpecError`."""
    try:
        return METHODS[name]
    except KeyError:
        raise SpecError(f"unknown training method {name!r}; use one of {', '.join(METHOD_NAMES)}") from None


def method_class(name: str) -> Any:
    """The method class of ``name``, imported on first use (it imports torch)."""
    module, _, attr = method_info(name).target.partition(":")
    return getattr(importlib.import_module(module), attr)


def method_problem(method: str, spec: "JobSpec", n_workers: int, global_batch: int) -> str | None:
    """The sentence saying why ``method`` cannot train at (``n_workers``, ``global_batch``)
    under ``spec``, from its constraints in the table; ``None`` when it can."""
    info = method_info(method)
    if n_workers < info.min_workers:
        why = f" {info.min_workers_reason}" if info.min_workers_reason else ""
        return f"method {method!r}{why} and needs at least {info.min_workers} workers, not {n_workers}"
    if info.needs_b_small_below_batch and spec.train.ags.b_small >= global_batch:
        return (f"train.ags.b_small ({spec.train.ags.b_small}) must be smaller than the global batch "
                f"({global_batch}) for method {method!r}")
    return None


def check_method(method: str, spec: "JobSpec", n_workers: int, global_batch: int) -> None:
    """Raise :func:`method_problem`'s sentence as a :class:`~tula.errors.SpecError`."""
    problem = method_problem(method, spec, n_workers, global_batch)
    if problem:
        raise SpecError(problem)


def check_train_config(spec: "JobSpec", method: str, n_workers: int, global_batch: int, dataset_size: int) -> None:
    """Every rule a training configuration must satisfy, checked before any process starts:
    one :class:`~tula.errors.SpecError` sentence for the first one broken."""
    if n_workers < 1:
        raise SpecError(f"the number of workers must be at least 1, not {n_workers}")
    if global_batch < n_workers or global_batch % n_workers:
        raise SpecError(f"global batch {global_batch} does not split evenly over {n_workers} workers")
    if global_batch > dataset_size:
        raise SpecError(f"global batch {global_batch} is larger than the training set ({dataset_size} samples)")
    check_method(method, spec, n_workers, global_batch)


def smallest_batch_for(method: str, spec: "JobSpec", n_workers: int) -> int:
    """The smallest global batch ``method`` can train at on ``n_workers``: one sample per
    worker, or the first multiple of ``n_workers`` above ``train.ags.b_small`` for the
    methods that measure on that sub-batch."""
    smallest = n_workers
    if method_info(method).needs_b_small_below_batch:
        smallest = max(smallest, (spec.train.ags.b_small // n_workers + 1) * n_workers)
    return smallest


def schedule_problem(method: str, spec: "JobSpec") -> str | None:
    """Why ``method`` cannot follow the spec's batch schedule / growing workers, or None."""
    info = method_info(method)
    sched, workers = spec.train.batch_schedule, spec.train.workers
    if sched is None and workers is None:
        return None
    if workers is not None and workers.min != workers.max and not info.resizable:
        return (f"method {method!r} keeps state per rank that cannot move to another worker count; train it with "
                "train.workers.min equal to train.workers.max, or choose another method")
    if workers is not None and workers.min < info.min_workers:
        return (f"method {method!r} needs at least {info.min_workers} workers, but train.workers.min is "
                f"{workers.min}")
    if sched is not None and sched.lr_rule != "keep" and info.scales_lr_with_batch:
        return (f"method {method!r} already scales its LR with the global batch; set train.batch_schedule.lr_rule "
                "to 'keep' so that the LR is not scaled twice")
    if sched is not None and sched.kind == "adaptive" and not info.resizable:
        return (f"batch schedule 'adaptive' follows the gradient noise scale, which method {method!r} does not "
                "give (its workers do not synchronise their gradients); use another schedule")
    return None
