"""The training methods Tula knows: one table that the spec, the runner, the CLI, the
service and the benchmarks read.

Each entry says where the method's class lives (imported only when a method is built, so
this module and :mod:`tula.core.spec` load without torch), what the CLI's help says about it,
which part of the spec configures it, and its constraints *as data*:

* ``min_workers`` -- the fewest ranks it can train on (AdaScale estimates the gradient
  variance from the spread of the workers' local gradients);
* ``needs_b_small_below_batch`` -- it measures on a sub-batch of ``train.ags.b_small``
  samples, which must be smaller than the global batch.

The table knows no spec: the rules that read a :class:`~tula.core.spec.JobSpec` against it
are :mod:`tula.core.job_rules`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tula.core.errors import SpecError


@dataclass(frozen=True)
class MethodInfo:
    """A training method: its name, its class and its constraints.

    Attributes
    ----------
    name : what ``train.method`` and ``--method`` accept
    target : ``"package.module:Class"`` of its :class:`tula.engine.optim.methods.Method` subclass
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
    whole_gradient : why it needs the whole gradient or the whole model on every rank, which
        ``train.parallelism: fsdp`` shards (completes "method 'x' ..."); empty when it trains on
        sharded gradients
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
    whole_gradient: str = ""


_TABLE = (
    MethodInfo(
        "ags",
        "tula.engine.optim.methods:AdaptiveScaling",
        "Tula's adaptive gradient scaling (Algorithm 1)",
        "AGS",
        spec_section="train.ags",
        needs_b_small_below_batch=True,
        is_baseline=False,
        whole_gradient="compares the norms of the whole small-batch and large-batch gradients",
    ),
    MethodInfo(
        "static",
        "tula.engine.optim.methods:StaticScaling",
        "static gradient scaling U(s) (Eq. 8) outside sensitive phases",
        "static",
        spec_section="train.ags",
        needs_b_small_below_batch=True,
        is_baseline=False,
        whole_gradient="gates its scaling on the norm of the whole gradient",
    ),
    MethodInfo(
        "lbt",
        "tula.engine.optim.methods:Method",
        "vanilla large-batch training at the spec's LR",
        "LBT",
        spec_fields=("optimizer",),
    ),
    MethodInfo(
        "lrs",
        "tula.engine.optim.methods:LRS",
        "linear LR scaling from train.base_batch with warm-up",
        "LRS",
        spec_fields=("train.base_batch", "train.warmup_epochs"),
        scales_lr_with_batch=True,
    ),
    MethodInfo(
        "lars",
        "tula.engine.optim.baselines:LARS",
        "LARS (timm) with linear LR scaling and warm-up",
        "LARS",
        spec_fields=("train.base_batch", "train.warmup_epochs"),
        scales_lr_with_batch=True,
        whole_gradient="scales each layer by the norms of its whole weight and gradient",
    ),
    MethodInfo(
        "polo",
        "tula.engine.optim.baselines:PostLocalSGD",
        "post-local SGD",
        "PoLo",
        spec_fields=("train.polo_switch_epoch", "train.polo_averages_per_epoch", "train.warmup_epochs"),
        resizable=False,
        whole_gradient="averages whole model replicas",
    ),
    MethodInfo(
        "adascale",
        "tula.engine.optim.baselines:AdaScale",
        "AdaScale SGD, the LR times the gain ratio",
        "AdaScale",
        spec_fields=("train.base_batch",),
        min_workers=2,
        min_workers_reason="estimates the gradient variance across workers",
        whole_gradient="reads each worker's whole gradient from DDP's buckets",
    ),
    MethodInfo(
        "lamb",
        "tula.engine.optim.baselines:LAMB",
        "LAMB (timm) at train.lamb_lr with square-root LR scaling",
        "LAMB",
        spec_fields=("train.lamb_lr", "train.base_batch", "train.warmup_epochs"),
        scales_lr_with_batch=True,
        whole_gradient="scales each layer by the norms of its whole weight and update",
    ),
)

METHODS: dict[str, MethodInfo] = {m.name: m for m in _TABLE}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


#: the training losses (``train.loss``): name -> what it trains and how an epoch is scored
LOSSES: dict[str, str] = {
    "cross_entropy": "classification: integer class labels; per epoch test loss, top-1 (and top-5)",
    "mse": "regression: float targets of shape (n, outputs); per epoch test MSE and R^2",
    "model": "the model's own loss (an output with .loss or ['loss'], Hugging Face style); per epoch test loss "
    "and perplexity",
}
LOSS_NAMES: tuple[str, ...] = tuple(LOSSES)


@dataclass(frozen=True)
class ObjectiveInfo:
    """One of the planner's objectives (``objective``, ``--objective``): what it chooses, by
    which of the planner's rules (:data:`tula.core.plan.RULES`: ``least_time``,
    ``least_cost``, ``knee``), and whether it ranks by the time to an accuracy (the epochs
    scaled by the gradient noise scale) rather than by the spec's epochs."""

    name: str
    what: str
    rule: str
    to_accuracy: bool = False


#: the planner's objectives.  Adding one: an entry here, and its rule in tula.core.plan.RULES
#: when no existing rule chooses as it does
_OBJECTIVE_TABLE = (
    ObjectiveInfo("time", "the least predicted time of the spec's epochs", "least_time"),
    ObjectiveInfo("cost", "the least predicted cost of the spec's epochs", "least_cost"),
    ObjectiveInfo("knee", "the knee of the predicted time-vs-batch curve of the spec's epochs", "knee"),
    ObjectiveInfo(
        "time_to_accuracy",
        "the least predicted time to the accuracy the spec's epochs reach at train.base_batch "
        "(epochs scaled by the gradient noise scale: (B_noise + B) / (B_noise + B0))",
        "least_time",
        to_accuracy=True,
    ),
    ObjectiveInfo("cost_to_accuracy", "the least predicted cost to that accuracy", "least_cost", to_accuracy=True),
    ObjectiveInfo(
        "knee_to_accuracy", "the knee of the time-to-accuracy curve, before its minimum", "knee", to_accuracy=True
    ),
)
OBJECTIVES: dict[str, ObjectiveInfo] = {o.name: o for o in _OBJECTIVE_TABLE}
OBJECTIVE_NAMES: tuple[str, ...] = tuple(OBJECTIVES)


@dataclass(frozen=True)
class ClusterKind:
    """One kind of ``cluster.where`` (``--cluster``): how a ``where`` of it is written and
    recognised, what it is, which launcher runs it (:func:`tula.engine.launch.clusters.open_launcher`),
    whether the cluster fixes the world's size, whether its ranks run on this host, and
    whether a submission to the service may name it."""

    name: str
    written: str  # how a `where` of this kind is written, in the CLI's help
    what: str
    launcher: str  # local | dask | env
    matches: Callable[[str], bool]
    fixed_world: bool = False  # the cluster's own world size (torchrun/srun): the profile runs only that size
    on_this_host: bool = False  # its ranks run on the machine that runs the command
    submittable: bool = False  # a job submitted to the service may name it


#: the kinds of cluster, in the order the help lists them.  Adding a launcher: its module under
#: tula.engine.launch, an entry here, and its branch in tula.engine.launch.clusters.open_launcher
_CLUSTER_TABLE = (
    ClusterKind("local", "local", "processes on this machine", "local", lambda w: w == "local",
                on_this_host=True, submittable=True),
    ClusterKind("dask", "dask", "a Dask LocalCluster started for the run", "dask", lambda w: w == "dask",
                on_this_host=True, submittable=True),
    ClusterKind("scheduler", "tcp://HOST:PORT", "an existing Dask scheduler", "dask",
                lambda w: w.startswith("tcp://")),
    ClusterKind("jobqueue", "a dask-jobqueue YAML file", "SLURM/PBS", "dask",
                lambda w: w.endswith((".yaml", ".yml"))),
    ClusterKind("env", "env", "inside a world started by torchrun, srun or mpirun: run the same command on every rank",
                "env", lambda w: w == "env", fixed_world=True),
)  # fmt: skip
CLUSTERS: dict[str, ClusterKind] = {k.name: k for k in _CLUSTER_TABLE}
#: a Dask worker a world holds is locked under this prefix and its address (the launcher takes
#: the locks; the service reads them to show which workers are in a world)
WORKER_LOCK_PREFIX = "tula-worker-"


def cluster_kind(where: str) -> ClusterKind:
    """The kind of ``where``; one that is none of them is a :class:`~tula.core.errors.SpecError`."""
    for kind in _CLUSTER_TABLE:
        if kind.matches(where):
            return kind
    raise SpecError(f"{where!r} is not a cluster: use {clusters_in_words()}")


def clusters_in_words(kinds: tuple[ClusterKind, ...] = _CLUSTER_TABLE) -> str:
    """``local (processes on this machine), dask (...), ..., or env (...)``."""
    said = [f"{k.written} ({k.what})" for k in kinds]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + ", or " + said[-1]


#: the built-in optimisers (``optimizer.name``); an import path names the user's own factory
OPTIMIZER_NAMES: tuple[str, ...] = ("sgd", "adam", "adamw")


def method_info(name: str) -> MethodInfo:
    """The entry of ``name``; an unknown name is a :class:`~tula.core.errors.SpecError`."""
    try:
        return METHODS[name]
    except KeyError:
        raise SpecError(f"unknown training method {name!r}; use one of {', '.join(METHOD_NAMES)}") from None


def method_class(name: str) -> Any:
    """The method class of ``name``, imported on first use (it imports torch)."""
    module, _, attr = method_info(name).target.partition(":")
    return getattr(importlib.import_module(module), attr)
