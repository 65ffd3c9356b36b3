"""The job spec: what the user wants trained, on which resources, to which objective.

A spec is a YAML file validated once, here, at the edge; inner code trusts it.  Every
bad field becomes a :class:`~tula.core.errors.SpecError` with one sentence naming the field
and what is allowed.
"""

from __future__ import annotations

import importlib
import math
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tula.core.errors import SpecError
from tula.core.registry import LOSS_NAMES, METHOD_NAMES, OBJECTIVE_NAMES, OPTIMIZER_NAMES, cluster_kind
from tula.core.schedules import LR_RULES, PARAM_NAMES, SCHEDULE_NAMES, SCHEDULES, missing_param, param_problem
from tula.core.sinks import SINK_FIELDS, SINK_NAMES, SINKS
from tula.core.validation import first_error, lowered

MODEL_LOSS = "model"
"""``train.loss: model``: the model returns its own loss (an output with ``.loss``, or a dict with
``"loss"``), as a Hugging Face model given its ``labels`` does (see :mod:`tula.engine.batch`)."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "tb": 10**12,
}


def parse_bytes(value: Any) -> int | None:
    """Parse ``123``, ``"512MiB"``, ``"2 GB"`` into a byte count (``None`` stays ``None``)."""
    if value is None or isinstance(value, int):
        return value
    bad = f"{str(value)[:40]!r} is not a size; use bytes or a number with a unit such as '512MiB' or '2GB'"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(bad)
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(bad)
    number = float(m.group(1))
    if not math.isfinite(number):
        raise ValueError(bad)
    return int(number * _UNITS[m.group(2).lower()])


_DURATION_UNITS = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?"


def parse_duration(value: Any) -> float | None:
    """Parse a duration into seconds: ``28800``, ``"8h"``, ``"90 min"``, ``"1h30m"``, ``"5us"``
    (``None`` stays ``None``).  The one parser of durations: deadlines, latencies, checkpoint
    intervals and restart times all go through it."""
    if value is None:
        return None
    bad = (
        f"{str(value)[:40]!r} is not a duration; use seconds or a number with a unit such as "
        "'8h', '90min', '1h30m', '30s' or '5us'"
    )
    if isinstance(value, bool):
        raise ValueError(bad)
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(bad)
        return float(value)
    text = str(value).strip()
    parts = re.findall(rf"\s*({_NUMBER})\s*([a-zA-Zµ]*)", text)
    if not text or not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", text):
        raise ValueError(bad)
    if len(parts) > 1 and any(u == "" for _, u in parts):  # "1h 30" is ambiguous
        raise ValueError(bad)
    total = 0.0
    for number, unit in parts:
        if unit.lower() not in _DURATION_UNITS and unit not in _DURATION_UNITS:
            raise ValueError(bad)
        total += float(number) * _DURATION_UNITS.get(unit, _DURATION_UNITS.get(unit.lower(), 0.0))
    if not math.isfinite(total):
        raise ValueError(bad)
    return total


def format_duration(seconds: float) -> str:
    """A duration for a sentence: ``"850 ms"``, ``"42.0 s"``, ``"12.5 min"``, ``"9.3 h"``, ``"2.1 d"``."""
    s = float(seconds)
    if not math.isfinite(s):
        return "forever"
    if s < 1.0:
        return f"{s * 1e3:.3g} ms"
    if s < 120.0:
        return f"{s:.1f} s"
    if s < 2 * 3600.0:
        return f"{s / 60:.1f} min"
    if s < 2 * 86400.0:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


_RATE_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}


def parse_bandwidth(value: Any) -> float:
    """Parse a network bandwidth into bytes per second: ``"100Gbit/s"``, ``"100 Gb/s"``,
    ``"100Gbps"`` (bits), ``"10GB/s"``, ``"10 GiB/s"`` (bytes), or a plain number (bytes per
    second).  ``b``/``bit`` are bits, ``B``/``byte`` bytes."""
    bad = (
        f"{str(value)[:40]!r} is not a bandwidth; use a number with a unit such as '100Gbit/s', '25Gb/s', "
        "'100Gbps' or '10GB/s'"
    )
    if isinstance(value, bool):
        raise ValueError(bad)
    if isinstance(value, (int, float)):
        rate = float(value)
    else:
        m = re.fullmatch(
            rf"\s*({_NUMBER})\s*(Ki|Mi|Gi|Ti|k|K|M|G|T)?(bits?|b|B|bytes?|Bytes?)\s*(/\s*s|ps)\s*", str(value)
        )
        if m is None:
            try:
                rate = float(str(value).strip())
            except ValueError:
                raise ValueError(bad) from None
        else:
            number, prefix, unit = float(m.group(1)), m.group(2) or "", m.group(3)
            bits = unit in ("b", "bit", "bits")
            rate = number * _RATE_PREFIX[prefix] / (8.0 if bits else 1.0)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(bad)
    return rate


class _Strict(BaseModel):
    # a docstring right under a field is its description (the JSON Schema's, the reference page's)
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


#: an import path ``package.module:attribute`` (the attribute may be dotted: ``module:Class.method``)
IMPORT_PATH = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
)


def is_import_path(value: str) -> bool:
    """Whether ``value`` names the user's code: ``package.module:attribute``, or ``pickle:PATH``
    (a cloudpickle file :class:`tula.Job` writes for a Python object); resolved in the engine."""
    return IMPORT_PATH.fullmatch(value) is not None or (value.startswith("pickle:") and len(value) > 7)


def import_ref(obj: Any) -> str | None:
    """``"package.module:Qual.Name"`` when ``obj`` is found again by importing that, else None."""
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not mod or not qual or mod == "__main__" or "<locals>" in qual or "<lambda>" in qual:
        return None
    try:
        found: Any = importlib.import_module(mod)
        for part in qual.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{mod}:{qual}" if found is obj else None


class ModelSpec(_Strict):
    """The network: a Tula built-in (``small_cnn``, ``mlp``), a torchvision model name,
    an import path ``package.module:factory``, or a factory pickled with cloudpickle
    ``pickle:/path/factory.pkl`` (a file every rank can read; :mod:`tula.sklearn` writes one
    for a module it cannot import by name); ``kwargs`` go to its constructor."""

    name: str = "small_cnn"
    """a built-in (small_cnn, small_cnn1d, mlp), a torchvision model name, an import path
    'package.module:factory', or 'pickle:PATH'"""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """keyword arguments of the model's constructor or factory"""


class DataSpec(_Strict):
    """The training data.

    ``digits`` (scikit-learn, 1x8x8), ``mnist1d`` (MNIST-1D, 1x40, regenerated locally by
    the ``mnist1d`` package: ``num_samples`` of them), ``text`` (``num_samples`` sequences of
    ``sequence_length`` characters of Python's own standard-library sources, each with the next
    character of every position as its targets: the built-in ``tiny_gpt``'s data), ``synthetic`` (random tensors of ``sample_shape``),
    torchvision sets read from a local ``root`` (``mnist``, ``fashionmnist``, ``cifar10``,
    ``cifar100``), ``imagefolder`` (a local folder of class sub-folders) and ``arrays`` (the
    user's own arrays: a ``.npz`` file at ``path`` holding ``x`` and ``y``, and optionally
    ``x_test`` and ``y_test`` -- without them ``test_fraction`` of the samples are held out;
    integer ``y`` are class labels, float ``y`` regression targets; an optional
    ``num_classes`` entry gives the number of classes).

    Sets read from disk are decoded by ``loader_workers`` DataLoader processes per rank,
    normalised per channel (``normalize``) and, with ``augment``, their training split is
    randomly cropped (4 pixels of padding) and flipped (not MNIST's digits), drawn from
    (seed, epoch, sample) so that resume stays exact; in-memory sets ignore these.

    ``factory`` (``package.module:make_datasets``, called with ``kwargs``; ``name`` is then
    ``factory``): the user's own training and test sets, map-style ``torch.utils.data.Dataset``s
    returned as ``(train, test)`` or as a mapping (or an object with these attributes) with
    ``train``, ``test`` and optionally ``num_classes`` and ``collate_fn``
    (:func:`tula.engine.workloads.load_dataset` reads the contract).  They are read by
    ``loader_workers`` DataLoader processes per rank, as sets read from disk are, but used as
    they give their samples: ``normalize`` is false for them and ``augment`` cannot be set
    (transform in your set).  Only the path is stored here; it is imported in the engine.
    """

    name: Literal[
        "digits",
        "mnist1d",
        "text",
        "synthetic",
        "mnist",
        "fashionmnist",
        "cifar10",
        "cifar100",
        "imagefolder",
        "arrays",
        "factory",
    ] = "digits"
    """the data set (the section above describes each); 'factory' when data.factory is set"""
    factory: str | None = Field(
        default=None,
        description="the user's data sets: an import path 'package.module:make_datasets' returning (train, test)",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="factory: the arguments it is called with")
    root: str | None = None
    """mnist, fashionmnist, cifar10, cifar100, imagefolder: the local folder the set is read from"""
    path: str | None = Field(default=None, description="arrays: the .npz file of x, y (and x_test, y_test)")
    sample_shape: tuple[int, ...] = (3, 32, 32)
    """synthetic: the shape of one sample (channels, height, width)"""
    num_samples: int = Field(default=4096, ge=1)
    """synthetic, mnist1d, text: how many samples (text: sequences) are generated"""
    sequence_length: int = Field(default=64, ge=1)
    """text: the characters (tokens) of one sample"""
    num_classes: int = Field(default=10, ge=2)
    """synthetic: the number of classes of its random labels"""
    image_size: int | None = Field(default=None, ge=1, description="resize imagefolder images to this square size")
    test_fraction: float = Field(default=0.2, gt=0, lt=1)
    """the share of the samples held out as the test split, drawn with the seed (digits, mnist1d,
    text, synthetic, imagefolder, and arrays without x_test)"""
    augment: bool = Field(
        default=False,
        description="sets read from disk: random crop (padding 4) and horizontal flip of the training split",
    )
    normalize: bool = Field(
        default=True,
        description="sets read from disk: per-channel mean and standard deviation "
        "(the set's published values; ImageNet's for imagefolder); off for a data factory's sets, "
        "which normalise themselves",
    )
    loader_workers: int = Field(
        default=2,
        ge=0,
        description="sets read from disk: DataLoader worker processes per "
        "rank (0: read in the training process, sample by sample)",
    )
    prefetch: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="prepare the next batch while the step computes, in a thread of the rank: on CUDA it is "
        "gathered or collated into pinned memory and copied on a side stream; 'auto' is on for CUDA and off on a "
        "CPU (where the thread would take cores from the step), 'on' also on a CPU, 'off' never",
    )
    device_resident_share: float = Field(
        default=0.25,
        ge=0.0,
        le=0.9,
        description="in-memory sets (digits, mnist1d, synthetic, arrays) on CUDA stay on the device when both "
        "splits take at most this share of the memory budget (search.memory_budget_bytes, else the GPU's "
        "memory); batches are then indexed there, and the memory model counts the bytes; 0: never",
    )

    @model_validator(mode="before")
    @classmethod
    def _factory_names_the_set(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("factory") is not None:
            # a factory's samples are used as its sets give them: not normalised unless the user
            # asks for it, which _root_needed refuses (the record then says what applies)
            data = {"name": "factory", "normalize": False, **data}
        return data

    @field_validator("factory")
    @classmethod
    def _factory_path(cls, v: str | None) -> str | None:
        if v is not None and not is_import_path(v):
            raise ValueError(f"{v[:80]!r} is not an import path; use 'package.module:make_datasets'")
        return v

    @model_validator(mode="after")
    def _root_needed(self) -> DataSpec:
        if self.name == "factory" and self.factory is None:
            raise ValueError(
                "data set 'factory' is made by your own code: set data.factory to 'package.module:function'"
            )
        if self.factory is not None and self.name != "factory":
            raise ValueError(
                f"data.factory makes the data set, so data.name cannot also be {self.name!r}; give one of them"
            )
        if self.kwargs and self.factory is None:
            raise ValueError("data.kwargs are the arguments of data.factory, which is not set")
        if self.factory is not None and (self.root is not None or self.path is not None):
            field = "root" if self.root is not None else "path"
            raise ValueError(f"data.{field} is not read for a data factory; pass it to the factory in data.kwargs")
        if self.name in ("mnist", "fashionmnist", "cifar10", "cifar100", "imagefolder") and not self.root:
            raise ValueError(f"data set {self.name!r} is read from a local folder: set data.root to it")
        if self.name == "arrays" and not self.path:
            raise ValueError("data set 'arrays' is read from a .npz file: set data.path to it")
        if self.augment and self.factory is not None:
            raise ValueError(
                "data.augment applies to image sets read from disk; a data factory's sets augment themselves"
            )
        if self.normalize and self.factory is not None:
            raise ValueError(
                "data.normalize applies to image sets read from disk; a data factory's sets are used as they are "
                "given, so normalise in your set (or leave data.normalize out)"
            )
        if self.augment and self.name not in ("mnist", "fashionmnist", "cifar10", "cifar100", "imagefolder"):
            raise ValueError(f"data.augment applies to image sets read from disk, not {self.name!r}")
        return self


class OptimizerSpec(_Strict):
    """The optimiser the methods step (AGS wraps it; ``lars`` and ``lamb`` use their own).

    ``name``: ``sgd``, ``adam``, ``adamw`` (with ``momentum``, ``nesterov``, ``weight_decay``
    as they apply), or your own factory as an import path ``package.module:make_optimizer``
    (or ``pickle:PATH``, what :class:`tula.Job` writes for a function it cannot import by
    name), called as ``factory(params, lr=LR, **kwargs)`` and returning a
    ``torch.optim.Optimizer`` -- ``torch.optim:RMSprop`` itself is such a factory.  Tula owns
    the learning rate (``lr``, the methods' scaling rules, warm-up and milestones set it on
    the optimiser's parameter groups); a factory's other settings are ``kwargs``."""

    name: str = "sgd"
    """sgd, adam, adamw, or an optimiser factory 'package.module:make_optimizer' (or 'pickle:PATH')"""
    lr: float = Field(default=0.05, gt=0)
    """the base learning rate, which the methods' scaling rules, warm-up and milestones set the rate from"""
    momentum: float = Field(default=0.9, ge=0, lt=1)
    """sgd: the momentum"""
    nesterov: bool = False
    """sgd: Nesterov momentum (with a momentum above 0)"""
    weight_decay: float = Field(default=5e-4, ge=0)
    """weight decay of sgd, adam and adamw (decoupled for adamw)"""
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of an optimiser factory (not of the built-ins)"
    )

    @field_validator("name")
    @classmethod
    def _optimizer_name(cls, v: str) -> str:
        if v in OPTIMIZER_NAMES or is_import_path(v):
            return v
        raise ValueError(
            f"{v[:80]!r} is not an optimiser; use {', '.join(OPTIMIZER_NAMES)}, or an import path "
            "'package.module:make_optimizer' of a factory called as factory(params, lr=LR, **kwargs)"
        )

    @model_validator(mode="after")
    def _kwargs_for_factories(self) -> OptimizerSpec:
        if self.kwargs and self.name in OPTIMIZER_NAMES:
            raise ValueError(
                f"optimizer.kwargs are passed to an optimiser factory; {self.name!r} is a built-in, set with "
                "optimizer.momentum, nesterov and weight_decay"
            )
        if "lr" in self.kwargs or "params" in self.kwargs:
            raise ValueError("optimizer.kwargs must not hold 'lr' or 'params': Tula passes them (set optimizer.lr)")
        return self


class SearchSpec(_Strict):
    """The space the planner may choose from.

    Global batches grow geometrically from ``min_batch`` by ``batch_growth`` up to
    ``max_batch`` (default: the data set size), cut by the memory bound per worker.
    """

    cluster_sizes: list[int] = Field(default_factory=lambda: [1, 2])
    """the worker counts N profiled and planned over"""
    min_batch: int = Field(default=32, ge=1)
    """the smallest global batch B of the search"""
    max_batch: int | None = Field(default=None, ge=1)
    """the largest global batch B of the search (default: the training set's size)"""
    batch_growth: int = Field(default=2, ge=2)
    """the factor between one global batch of the search and the next"""
    memory_budget_bytes: int | None = Field(default=None, gt=0, description="memory each worker may use")
    memory_safety: float = Field(default=0.1, ge=0, lt=1, description="fraction of the budget kept free")
    max_accumulation_steps: int = Field(
        default=1,
        ge=1,
        description="gradient accumulation the planner, and a batch schedule, may use where the memory caps "
        "the local batch: each rank's share B / N as k <= this many micro-batches (1: none).  A schedule "
        "grows B through k once N is at its largest (the memory cap of a training run: the micro-batch "
        "that ran out of memory; of tula simulate: the memory model's)",
    )
    partial_middle_batch: bool | None = Field(
        default=None,
        description="the partial search also profiles each extreme cluster size at its middle candidate batch "
        "(the geometric mean of its smallest and largest), so the performance model can fit the floor under small "
        "steps, where the host, not the device, sets the pace (None: on a GPU, where launching kernels sets that "
        "floor; not on a CPU, whose compute is the host's)",
    )
    enforce_memory_cap: bool = Field(
        default=False,
        description="on CPU, cap each worker's address space "
        "at its size after set-up plus the budget, so exceeding it is a real OOM",
    )
    sequence_lengths: list[int] | None = Field(
        default=None,
        description="the sequence lengths L (tokens per sample) to profile and plan over, for a data set that has "
        "one (text, or a data factory that takes sequence_length); default: the data's own length only",
    )

    _mem = field_validator("memory_budget_bytes", mode="before")(classmethod(lambda cls, v: parse_bytes(v)))

    @field_validator("sequence_lengths")
    @classmethod
    def _lengths(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(n < 1 for n in v)):
            raise ValueError("sequence_lengths must be a non-empty list of positive lengths")
        return None if v is None else sorted(set(v))

    @field_validator("cluster_sizes")
    @classmethod
    def _sizes(cls, v: list[int]) -> list[int]:
        if not v or any(n < 1 for n in v):
            raise ValueError("cluster_sizes must be a non-empty list of positive worker counts")
        return sorted(set(v))

    @model_validator(mode="after")
    def _bounds(self) -> SearchSpec:
        if self.max_batch is not None and self.max_batch < self.min_batch:
            raise ValueError(f"max_batch ({self.max_batch}) is below min_batch ({self.min_batch})")
        if self.enforce_memory_cap and self.memory_budget_bytes is None:
            raise ValueError("enforce_memory_cap needs memory_budget_bytes")
        return self


class ProfileSpec(_Strict):
    """How each profiling trial runs."""

    warmup_steps: int = Field(default=3, ge=1)
    """steps each trial runs before it times any"""
    timed_steps: int = Field(default=8, ge=2)
    """steps each trial times (more where steps are short: see min_timed_s)"""
    min_timed_s: float = Field(
        default=0.5,
        ge=0,
        description="seconds each timed round of a trial lasts at least: where steps are short, more than "
        "timed_steps pairs of steps are timed (at most 100), so that a small batch's step is not a sample "
        "of a few tens of milliseconds of a shared host's noise (0: exactly timed_steps)",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where the ranks compute: cuda, cpu, or auto (cuda where there is a GPU, else cpu)"""
    threads_per_worker: int | None = Field(
        default=None,
        ge=1,
        description="torch threads per rank; default: "
        "cores // largest cluster size, so compute is the same for every N",
    )
    trial_timeout_s: float = Field(default=300, gt=0)
    """seconds allowed per trial: a profiling world is stopped once it has run this long for each of its
    trials, plus one"""
    memory_probe_batches: tuple[int, int] = Field(
        default=(16, 32), description="two small local batches the memory model is measured at"
    )
    noise_steps: int = Field(
        default=10,
        ge=0,
        description="gradient noise scale: batches measured (no update) at the first trial of every world, "
        "from its fresh model (0: not measured; the *_to_accuracy objectives then need a --noise-scale)",
    )


class PricingSpec(_Strict):
    """``fixed``: C = T * N * price_per_node_hour (Eq. 4b).  ``memory``: C = T * N *
    peak_GB * price_per_gb_hour (§IV-C2).  ``spot``: C = E[T] * N * spot_price_per_node_hour,
    where E[T] is the expected wall time when each node is preempted at
    ``preemption_rate_per_node_hour`` and every preemption loses the work since the last
    checkpoint plus ``restart_s`` (:class:`tula.core.pricing.SpotPricing` derives it);
    ``price_per_node_hour`` stays the on-demand price spot is compared with."""

    kind: Literal["fixed", "memory", "spot"] = "fixed"
    """how a configuration's cost is computed (the section above gives each formula)"""
    price_per_node_hour: float = Field(default=2.48, ge=0, description="on-demand price per node-hour")
    price_per_gb_hour: float = Field(default=0.15, ge=0)
    """memory: price per GB of peak memory per hour"""
    spot_price_per_node_hour: float | None = Field(default=None, ge=0, description="spot: price per node-hour")
    preemption_rate_per_node_hour: float | None = Field(
        default=None, ge=0, description="spot: expected preemptions of one node per hour"
    )
    checkpoint_interval_s: float | None = Field(
        default=None,
        gt=0,
        description="spot: seconds between "
        "checkpoints (a duration such as '10min'); default: every "
        "epoch, as `tula train` checkpoints",
    )
    restart_s: float = Field(
        default=60.0,
        ge=0,
        description="spot: seconds from a preemption until training "
        "runs again (a replacement node, the world, the checkpoint loaded)",
    )

    _durations = field_validator("checkpoint_interval_s", "restart_s", mode="before")(
        classmethod(lambda cls, v: parse_duration(v))
    )

    @model_validator(mode="after")
    def _spot_needs(self) -> PricingSpec:
        if self.kind == "spot":
            missing = [
                f for f in ("spot_price_per_node_hour", "preemption_rate_per_node_hour") if getattr(self, f) is None
            ]
            if missing:
                raise ValueError(f"spot pricing needs {' and '.join(missing)}")
        return self


class ConstraintsSpec(_Strict):
    """What the plan's choice must meet: finish within ``deadline`` (a duration such as
    ``8h``, or seconds) and cost at most ``budget`` (in the pricing's unit, $).  ``None``:
    no such constraint."""

    deadline_s: float | None = Field(
        default=None,
        gt=0,
        validation_alias=AliasChoices("deadline_s", "deadline"),
        description="training must finish within this many seconds",
    )
    budget: float | None = Field(default=None, ge=0, description="training may cost at most this much")

    _deadline = field_validator("deadline_s", mode="before")(classmethod(lambda cls, v: parse_duration(v)))


class AGSSpec(_Strict):
    """Adaptive gradient scaling (§III-C, Algorithm 1) and static scaling U(s) (Eq. 8)."""

    delta: float = Field(default=0.5, ge=0, description="scale only while the gradient variability is below this")
    b_small: int = Field(default=32, ge=1, description="global size of the sub-batch the factors are measured on")
    s_min: float = Field(default=0.1, gt=0, description="lower bound of every factor (Lemma 1 needs it > 0)")
    update_every: int | None = Field(
        default=None, ge=1, description="steps between factor updates (default: once per epoch)"
    )
    granularity: Literal["tensor", "element"] = "tensor"
    """tensor: one factor per parameter tensor (a ratio of norms); element: one factor per element"""
    static_scale: float = Field(default=2.0, gt=0, description="the factor s of static scaling (method 'static')")


class BatchScheduleSpec(_Strict):
    """How the global batch moves during training (the table is :data:`tula.core.schedules.SCHEDULES`).

    ``constant``; ``geometric``: B0 x factor^floor(epoch / delay) (AdaDamp's GeoDamp);
    ``linear``: B0 + ceil(rate x model updates) (PadaDamp); ``increase_instead_of_decay``:
    at each ``train.lr_milestones`` the batch x 1/``train.lr_gamma`` instead of the LR decay,
    the LR decays once the batch is at its largest (Smith et al.); ``loss_ratio``:
    B0 x (F(w0) - F*) / (F(wk) - F*) (AdaDamp); ``adaptive``: follows the gradient noise
    scale B_simple; ``goodput``: the batch and workers of the largest predicted goodput (the
    fitted models' throughput x the statistical efficiency from B_simple, Pollux's objective);
    ``piecewise``: the list ``batches``, one per period of ``every_epochs``.  B0 is the first global batch (the plan's, else ``train.global_batch``).
    Each parameter belongs to one kind; unset ones take that kind's default."""

    kind: Literal[SCHEDULE_NAMES] = "constant"  # type: ignore[valid-type]  # the names of tula.core.schedules.SCHEDULES
    """how the global batch moves (the section above describes each kind)"""
    every_epochs: int = Field(default=1, ge=1, description="the batch may change every this many epochs")
    lr_rule: Literal[LR_RULES] = Field(  # type: ignore[valid-type]  # a runtime table
        default="keep",
        description="the LR when the batch changes, relative to "
        "the first batch: keep, linear (x B/B0), sqrt (x sqrt(B/B0))",
    )
    max_batch: int | None = Field(
        default=None,
        ge=1,
        description="largest global batch (also capped by memory x the largest worker count and by the training set)",
    )
    factor: float | None = Field(default=None, description="geometric: growth factor (> 1, default 2)")
    delay: int | None = Field(default=None, description="geometric: epochs between growths (>= 1, default 5)")
    rate: float | None = Field(default=None, description="linear: samples added per model update (> 0, default 1)")
    f_star: float | None = Field(default=None, description="loss_ratio: the lowest reachable loss F* (default 0)")
    min_batch: int | None = Field(
        default=None, description="adaptive, goodput: smallest batch (default: the first batch)"
    )
    band: float | None = Field(
        default=None,
        description="adaptive: relative difference between B_simple and the "
        "batch that is ignored (in (0, 1), default 0.2)",
    )
    max_growth: float | None = Field(
        default=None, description="adaptive, goodput: largest factor per boundary (>= 1, default 2)"
    )
    batches: list[int] | None = Field(
        default=None,
        description="piecewise: the global batch of each period of "
        "every_epochs epochs, the last for the rest of the run (required)",
    )

    @field_validator(*PARAM_NAMES, mode="after")
    @classmethod
    def _belongs_to_kind(cls, v: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if v is None or kind is None:  # an invalid kind has its own error
            return v
        problem = param_problem(kind, str(info.field_name), v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _required_given(self) -> BatchScheduleSpec:
        missing = missing_param(self.kind, self.params())
        if missing:
            raise ValueError(missing)
        return self

    def params(self) -> dict[str, Any]:
        """The parameters set for this kind (the others are ``None``)."""
        return {name: getattr(self, name) for name in PARAM_NAMES if getattr(self, name) is not None}


class WorkersSpec(_Strict):
    """Workers that change with the batch, within min..max, at every boundary where the batch
    schedule changes the batch (a new world when N changes).  ``rule``: ``batch_per_worker``
    (AdaDamp's rule, N = clip(ceil(B / batch_per_worker), min, max)) or ``plan`` (the worker
    count and accumulation steps the fitted models rank best for the new batch under the
    job's objective, kept unless the best is ``threshold`` better; needs the models record)."""

    min: int = Field(default=1, ge=1)
    """the fewest workers"""
    max: int = Field(ge=1)
    """the most workers"""
    rule: Literal["batch_per_worker", "plan"] = Field(
        default="batch_per_worker",
        description="batch_per_worker: N = ceil(B / batch_per_worker); plan: the models' best N for each batch",
    )
    batch_per_worker: int | None = Field(
        default=None, ge=1, description="rule batch_per_worker: default, the first local batch"
    )
    threshold: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="rule plan: the predicted gain (a share of the epoch's time or cost) below which N stays "
        "(default 0.05)",
    )

    @model_validator(mode="after")
    def _range(self) -> WorkersSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        if self.rule == "plan" and self.batch_per_worker is not None:
            raise ValueError("batch_per_worker applies to rule 'batch_per_worker'; rule 'plan' chooses N by the models")
        if self.rule != "plan" and self.threshold is not None:
            raise ValueError("threshold applies to rule 'plan' only")
        return self


class LoggerSpec(_Strict):
    """A metrics sink that each finished epoch of training is written to (an entry of
    ``train.loggers``; the kinds are :data:`tula.core.sinks.SINKS`).  Each field belongs to the
    kinds that read it; unset ones take that kind's default."""

    kind: Literal[SINK_NAMES]  # type: ignore[valid-type]  # the names of tula.core.sinks.SINKS
    """which sink: tensorboard (TensorBoard event files) or mlflow (an MLflow run)"""
    dir: str | None = Field(default=None, min_length=1)
    """tensorboard: the directory of the event files (default: tensorboard/ in the training output directory)"""
    tracking_uri: str | None = Field(default=None, min_length=1)
    """mlflow: the tracking URI, e.g. sqlite:///mlflow.db or http://HOST:5000 (default: $MLFLOW_TRACKING_URI,
    else sqlite:///mlflow.db in the training output directory)"""
    experiment: str | None = Field(default=None, min_length=1)
    """mlflow: the experiment's name, created when it does not exist (default: the spec's name)"""
    run_name: str | None = Field(default=None, min_length=1)
    """mlflow: the run's name (default: the name of the training output directory)"""

    @model_validator(mode="after")
    def _fields_of_kind(self) -> LoggerSpec:
        for name in SINK_FIELDS:
            if getattr(self, name) is not None and name not in SINKS[self.kind].fields:
                readers = " and ".join(s.name for s in SINKS.values() if name in s.fields)
                raise ValueError(f"{name} applies to kind {readers}, not {self.kind}")
        return self


class TrainSpec(_Strict):
    """How ``tula train`` trains: the method, the configuration, the LR schedule.

    ``ags``: Tula's adaptive gradient scaling; ``static``: static scaling U(s);
    ``lbt``: vanilla large-batch SGD; ``lrs``: linear LR scaling from ``base_batch`` with
    warm-up; ``lars``/``lamb``: layer-wise adaptive optimisers (timm); ``polo``:
    post-local SGD; ``adascale``: AdaScale's gain-ratio LR scaling.
    """

    method: Literal[METHOD_NAMES] = "ags"  # type: ignore[valid-type]  # the names of tula.core.registry.METHODS
    """the training method (the section above describes each)"""
    loss: str = Field(
        default="cross_entropy",
        description="cross_entropy (classification: "
        "test top-1 per epoch), mse (regression: test MSE and R^2 per epoch), or your own loss as an "
        "import path 'package.module:loss' (an nn.Module class made with no arguments, a function of "
        "(output, target), or a factory of no arguments returning one; test loss per epoch, and top-1 "
        "when the targets are integer labels of the output's dimension 1), or model (the model returns its "
        "own loss, an output with .loss or a dict with 'loss', as a Hugging Face model given labels: it is "
        "called as model(**batch) on a dict batch, else as model(inputs, labels=targets); test loss and "
        "perplexity per epoch)",
    )
    step: str | None = None
    """your own training step: an import path 'package.module:MyStep' of a subclass of
    tula.engine.step.TrainStep (overriding train_step, run_epoch or evaluate), used by both the profile and
    training; default the built-in TrainStep"""
    n_workers: int | None = Field(
        default=None,
        ge=1,
        description="the worker count where no plan is given (a plan's choice and an explicit count win over it)",
    )
    global_batch: int | None = Field(
        default=None,
        ge=1,
        description="the global batch where no plan is given (a plan's choice and an explicit batch win over it)",
    )
    lr_milestones: list[int] = Field(
        default_factory=list, description="epochs after which the LR is multiplied by lr_gamma"
    )
    lr_gamma: float = Field(default=0.1, gt=0, le=1)
    """the factor the LR is multiplied by after each of lr_milestones"""
    base_batch: int = Field(
        default=128, ge=1, description="reference batch of LR scaling (lrs, lars, lamb) and of AdaScale's gain"
    )
    warmup_epochs: int = Field(default=5, ge=0, description="LR warm-up of lrs, lars, lamb and polo")
    polo_switch_epoch: int = Field(default=5, ge=0, description="post-local SGD: epochs of synchronous SGD first")
    polo_averages_per_epoch: int = Field(default=4, ge=1)
    """post-local SGD: model averages per epoch after polo_switch_epoch"""
    lamb_lr: float = Field(default=0.01, gt=0, description="LAMB's LR at base_batch (Adam-like scale)")
    ags: AGSSpec = Field(default_factory=AGSSpec)
    """adaptive gradient scaling (method ags) and static scaling (method static)"""
    eval_batch: int = Field(default=1024, ge=1, description="samples per evaluation forward pass")
    batch_schedule: BatchScheduleSpec | None = Field(default=None, description="default: a constant batch")
    workers: WorkersSpec | None = Field(default=None, description="default: the worker count stays")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        default="fp32",
        description="the arithmetic of the forward and backward passes: fp32, bf16 (torch autocast; "
        "CPU and CUDA) or fp16 (autocast with a gradient scaler; CUDA only).  Profiled as trained: the step "
        "times and the memory model's bytes per sample are those of this precision",
    )
    tf32: bool | None = Field(
        default=None,
        description="TF32 on CUDA, for float32 matrix products (torch.backends.cuda.matmul.allow_tf32) and cuDNN "
        "convolutions (torch.backends.cudnn.allow_tf32): true turns both on (faster float32 steps on Ampere and "
        "newer GPUs, a 10-bit mantissa in the products), false both off (strict float32); left out, torch's "
        "defaults: off for matrix products, on for convolutions.  No effect on a CPU.  Profiled as trained, and "
        "part of the stored-model key when set",
    )
    channels_last: bool = Field(
        default=False,
        description="the model's weights and its input batches in torch.channels_last memory format (NHWC), "
        "which tensor-core convolutions prefer; the inputs are converted where the model consumes them.  Only "
        "for image samples (channels, height, width): a job whose samples have another shape is refused.  "
        "Works on a CPU too.  Profiled as trained, and part of the stored-model key",
    )
    cudnn_benchmark: bool = Field(
        default=False,
        description="cuDNN's autotuner (torch.backends.cudnn.benchmark): each new input shape is timed over "
        "several convolution algorithms once, and the fastest kept.  No effect on a CPU.  Profiled as "
        "trained, and part of the stored-model key",
    )
    accumulation_steps: int = Field(
        default=1,
        ge=1,
        description="gradient accumulation: each rank's share of a global step (B / N samples) "
        "runs as this many micro-batches of b = B / (N x k) samples, one after the other, the gradients "
        "summed locally (DDP no_sync) and synchronised once, on the last; the update is the same as at "
        "k = 1 (up to the summation order), so B = N x b x k and a batch above N x the memory's largest b is "
        "reachable.  The memory a rank needs is that of b (activations) plus its share's data batch; "
        "BatchNorm statistics are then over b samples, not B / N.  B / N must divide by it.  An out-of-memory "
        "fallback doubles it (halving b) before it halves B",
    )
    noise_scale: bool = Field(
        default=True,
        description="measure the gradient noise scale B_simple every step (a "
        "DDP comm hook for the local gradient norms and one one-element all-reduce); false "
        "saves that work, and train.json has no B_simple",
    )
    checkpointing: Literal["off", "on", "auto"] = "off"
    """activation checkpointing: on keeps only each block's input in the forward pass and recomputes the
    block's activations in the backward pass (torch.utils.checkpoint, non-reentrant), less memory for a
    slower step (training mode only; evaluation runs plain); the blocks are checkpoint_modules' classes.  auto:
    the planner's choice per configuration -- the profile measures the checkpointed step at a few trials besides
    the plain ones, the fit records its memory and compute effect, the plan weighs both and training applies its
    choice (off where no plan says on).  on and off are profiled as trained"""
    checkpoint_modules: list[str] | None = Field(default=None, min_length=1)
    """the class names of the blocks checkpointing wraps, e.g. [Block] (the outermost matching submodules);
    default found automatically: torch.nn.TransformerEncoderLayer and TransformerDecoderLayer, tiny_gpt's
    blocks, and any class whose name ends in Block or Layer, holds parameters and no batch norm, and appears
    at least twice.  Checkpointing on that matches no submodule is refused"""
    parallelism: Literal["ddp", "fsdp", "auto"] = "ddp"
    """how the ranks hold the model: ddp (DistributedDataParallel: every rank holds all parameters, gradients
    and optimiser state, the gradients all-reduced) or fsdp (FSDP2's fully_shard per block, the blocks
    checkpoint_modules' classes or found as checkpointing finds them, then the whole model: each rank holds
    1/N of them, a block's parameters all-gathered for its forward and backward, its gradients
    reduce-scattered; checkpoints are sharded, torch.distributed.checkpoint).  fsdp trains with methods lbt
    and lrs, in fp32 or bf16, with train.noise_scale false.  auto: the planner's choice per configuration -- the
    profile measures DDP's trials and the sharded step at a few trials besides (the smallest cluster size of two
    or more, and one batch at the next such size), the fit records its memory effect (which state divides by N,
    measured where two sizes ran) and its sync, the plan weighs both and training applies its choice
    (ddp where no plan says fsdp); with what fsdp cannot train, auto plans ddp only and the plan says why"""
    loggers: list[LoggerSpec] = Field(default_factory=list)
    """metrics sinks each finished epoch is written to, by the process that supervises training (never by
    every rank): {kind: tensorboard, dir: ...} and {kind: mlflow, tracking_uri: ..., experiment: ...};
    default none (metrics.jsonl and train.json are always written)"""

    @field_validator("loss")
    @classmethod
    def _loss_name(cls, v: str) -> str:
        if v in LOSS_NAMES or is_import_path(v):
            return v
        functions = [name for name in LOSS_NAMES if name != MODEL_LOSS]
        raise ValueError(
            f"{v[:80]!r} is not a loss; use {', '.join(functions)} or {MODEL_LOSS} (the model's own loss), or an "
            "import path 'package.module:loss'"
        )

    @field_validator("step")
    @classmethod
    def _step_path(cls, v: str | None) -> str | None:
        if v is None or is_import_path(v):
            return v
        raise ValueError(f"{v[:80]!r} is not an import path; give the step class as 'package.module:MyStep'")

    @model_validator(mode="after")
    def _schedule_needs(self) -> TrainSpec:
        kind = self.batch_schedule.kind if self.batch_schedule is not None else None
        if kind is not None and SCHEDULES[kind].needs_b_simple and not self.noise_scale:
            raise ValueError(
                f"batch schedule {kind!r} follows the gradient noise scale, which train.noise_scale false turns off"
            )
        if self.batch_schedule is not None and self.batch_schedule.kind == "increase_instead_of_decay":
            if not self.lr_milestones:
                raise ValueError(
                    "batch schedule 'increase_instead_of_decay' grows the batch at train.lr_milestones, which is empty"
                )
            if self.lr_gamma >= 1:
                raise ValueError(
                    "batch schedule 'increase_instead_of_decay' grows the batch by 1 / train.lr_gamma, "
                    "which must be below 1"
                )
        return self


METHODS: tuple[str, ...] = METHOD_NAMES  # kept for callers; the table is tula.core.registry.METHODS


class ClusterSpec(_Strict):
    """Where the ranks run (``--cluster`` overrides ``where``).

    ``where``: ``local`` (one process per rank on this machine), ``dask`` (a Dask
    LocalCluster started for the run, one worker process per rank), ``tcp://HOST:PORT`` (an
    existing Dask scheduler), the path of a dask-jobqueue YAML file (SLURM or PBS; see the
    README), or ``env`` (the ranks of a world someone else started: every process of
    ``torchrun``, ``srun`` or ``mpirun`` runs the same command).  Every launcher runs the same profiling and training; it only decides where the
    ranks run and how they meet."""

    where: str = "local"
    """local, dask, tcp://HOST:PORT, a dask-jobqueue YAML file, or env (the section above describes each)"""
    dask_workers: int | None = Field(
        default=None,
        ge=1,
        description="workers of a LocalCluster started for the "
        "run (default: the largest cluster size in search or train)",
    )
    dask_threads_per_worker: int = Field(default=1, ge=1, description="Dask threads per worker process")
    pg_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="torch.distributed timeout: a rank waiting this "
        "long in a collective (e.g. for a lost worker) fails the world",
    )
    worker_wait_s: float = Field(default=120.0, gt=0, description="how long to wait for enough Dask workers")
    connect_timeout_s: float = Field(
        default=30.0, gt=0, description="how long to wait for a Dask scheduler (tcp://HOST:PORT) to answer"
    )
    heartbeat_timeout_s: float = Field(
        default=20.0,
        gt=0,
        description="a Dask worker the scheduler has not heard "
        "from for this long is taken as lost (its host, link or process is down)",
    )
    interface: str | None = Field(
        default=None,
        description="network interface of the ranks' collectives, e.g. "
        "ib0 (default: the one that carries each worker's address; GLOO_SOCKET_IFNAME / "
        "NCCL_SOCKET_IFNAME set on a worker win)",
    )
    backend: Literal["gloo", "nccl"] | None = Field(default=None, description="default: nccl on GPU, gloo on CPU")

    @field_validator("where")
    @classmethod
    def _where(cls, v: str) -> str:
        try:
            cluster_kind(v)  # tula.core.registry.CLUSTERS
        except SpecError as err:
            raise ValueError(str(err)) from None
        return v


#: in-memory sets generated from the spec: (samples, values per sample) when not the spec's own
_GENERATED_SETS = {"digits": (1797, 64)}


def largest_world(spec: JobSpec) -> int:
    """The most workers any world of the job uses: its largest profiled cluster size, its fixed
    training worker count, or the most its batch schedule grows to (``train.workers.max``)."""
    grow = spec.train.workers.max if spec.train.workers is not None else 1
    return max([*spec.search.cluster_sizes, spec.train.n_workers or 1, grow])


def training_world(spec: JobSpec, n_workers: int) -> int:
    """The most workers the job's training uses at once when it starts at ``n_workers`` (its
    plan's choice): that, or the most its worker rule grows to (``train.workers.max``)."""
    grow = spec.train.workers.max if spec.train.workers is not None else 1
    return max(int(n_workers), grow)


def in_memory_data_bytes(data: DataSpec) -> int | None:
    """The bytes the data set described by ``data`` holds in memory once generated -- float32
    samples and int64 labels (``synthetic``: ``num_samples`` x ``sample_shape``; ``mnist1d``:
    ``num_samples`` x 40; ``digits``: 1797 x 64; ``text``: int64 inputs and targets of
    ``sequence_length`` each) -- or ``None`` for the sets read from disk or
    made by the user's code, whose size the spec does not say."""
    if data.name == "synthetic":
        n, values = data.num_samples, math.prod(data.sample_shape)
    elif data.name == "mnist1d":
        n, values = data.num_samples, 40
    elif data.name == "text":
        return data.num_samples * data.sequence_length * 2 * 8
    elif data.name in _GENERATED_SETS:
        n, values = _GENERATED_SETS[data.name]
    else:
        return None
    return n * (values * 4 + 8)


class JobSpec(_Strict):
    """A job: the model and data to train, the space the planner searches, the objective, and how
    profiling, training and the cluster run.  Every section has defaults; a spec gives what differs."""

    name: str = "job"
    """the job's name: the commands write under runs/NAME unless told another place"""
    model: ModelSpec = Field(default_factory=ModelSpec)
    """the network"""
    data: DataSpec = Field(default_factory=DataSpec)
    """the training and test data"""
    epochs: int = Field(default=10, ge=1)
    """training epochs (also those the plan predicts the time and cost of)"""
    seed: int = 0
    """the seed of the data split, the model's initialisation and the sampling"""
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """the optimiser the methods step"""
    search: SearchSpec = Field(default_factory=SearchSpec)
    """the worker counts and global batches the planner may choose from"""
    collective: Literal["ring", "parameter_server", "tree"] = "ring"
    """the gradient exchange the performance model is fitted for: ring all-reduce, a parameter server, or a tree"""
    pricing: PricingSpec = Field(default_factory=PricingSpec)
    """how a configuration's cost is computed"""
    constraints: ConstraintsSpec = Field(default_factory=ConstraintsSpec)
    """the deadline and budget the plan's choice must meet"""
    objective: Literal[OBJECTIVE_NAMES] = "knee"  # type: ignore[valid-type]  # tula.core.registry.OBJECTIVES
    """what the plan chooses by: time or cost (the least predicted for the spec's epochs), knee (the knee of
    the predicted time-vs-batch curve), or their *_to_accuracy forms, whose epochs are scaled by the gradient
    noise scale to reach the accuracy the spec's epochs reach at train.base_batch"""
    profile: ProfileSpec = Field(default_factory=ProfileSpec)
    """how each profiling trial runs"""
    train: TrainSpec = Field(default_factory=TrainSpec)
    """how training runs: the method, the configuration, the schedules"""
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    """where the ranks run"""

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @model_validator(mode="after")
    def _lengths_need_a_length(self) -> JobSpec:
        if self.search.sequence_lengths is not None and self.data.name not in ("text", "factory"):
            raise ValueError(
                f"search.sequence_lengths {self.search.sequence_lengths} are given, but data set {self.data.name!r} "
                "has no sequence length (text has, and a data factory that takes sequence_length)"
            )
        return self


def reference_sequence_length(data: DataSpec) -> int | None:
    """L_ref, the tokens of a sample of the data as the spec gives it: ``text``'s
    ``sequence_length``; a factory's ``kwargs.sequence_length`` (else ``data.sequence_length``,
    which a factory that takes one is given where lengths are planned over); ``None`` for the
    sets that have none."""
    if data.name == "text":
        return data.sequence_length
    if data.name == "factory":
        given = data.kwargs.get("sequence_length")
        return int(given) if isinstance(given, int) else data.sequence_length
    return None


def data_at_sequence_length(data: DataSpec, sequence_length: int) -> DataSpec:
    """``data`` built at ``sequence_length``: ``text``'s ``sequence_length``, a factory's
    ``sequence_length`` keyword; the data as given for the sets that have none."""
    if data.name == "text":
        return data.model_copy(update={"sequence_length": sequence_length})
    if data.name == "factory":
        return data.model_copy(update={"kwargs": {**data.kwargs, "sequence_length": sequence_length}})
    return data


def planned_sequence_lengths(spec: JobSpec) -> list[int | None]:
    """The sequence lengths a plan's rows are at: ``search.sequence_lengths``, else the data's own
    length (``text``), else ``[None]`` (no sequence length)."""
    if spec.search.sequence_lengths:
        return list(spec.search.sequence_lengths)
    return [spec.data.sequence_length if spec.data.name == "text" else None]


def _sentence(err: ValidationError) -> str:
    e = first_error(err)
    loc, msg = e.where(escape_keys=True), e.message  # a key may hold a line break
    if e.type == "extra_forbidden":
        return f"unknown field '{loc}' in the spec; check its spelling against the documented fields"
    if e.type == "literal_error":
        return f"spec field '{loc}' is {e.input!r}, but it must be {msg.removeprefix('Input should be ')}"
    where = f"spec field '{loc}'" if loc else "the spec"
    return f"{where}: {lowered(msg)}" if msg else f"{where} is invalid"


def spec_from_dict(data: Any) -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError("the spec must be a YAML mapping of fields (name, model, data, search, ...)")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_sentence(err)) from None


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML job spec."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"spec file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, RecursionError) as err:  # not text, 4300+ digits, too deep
        raise SpecError(f"spec file {str(p)!r} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpecError(f"spec file {str(p)!r} is not a YAML mapping of fields (name, model, data, search, ...)")
    return spec_from_dict(data)
