"""The metrics sinks a training run can write its epochs to (``train.loggers``): one table that
the spec, the trainer and the docs read.

Each entry says where the sink's class lives (imported only when a run opens it, so this module
and :mod:`tula.core.spec` load without torch or the sink's package), which package it needs and
how to install it, and which fields of a ``train.loggers`` entry it reads.  Adding a sink: its
class in :mod:`tula.engine.metrics_sinks` (or anywhere, by ``target``) and an entry here.

:func:`missing_packages` is the check a run makes before any worker starts: a sink whose
package is not installed is one sentence naming what to install (``importlib.util.find_spec``
only: nothing is imported here).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from tula.core.errors import SpecError

__all__ = [
    "SinkInfo",
    "SINKS",
    "SINK_NAMES",
    "SINK_FIELDS",
    "sink_info",
    "sink_class",
    "missing_package",
    "check_sinks",
]


@dataclass(frozen=True)
class SinkInfo:
    """A metrics sink: its name, its class and what it needs.

    Attributes
    ----------
    name : str
        What ``train.loggers[].kind`` accepts.
    target : str
        ``"package.module:Class"`` of its sink class (:class:`tula.engine.metrics_sinks.Sink`).
    summary : str
        One line for the docs.
    requires : str
        The top-level module it imports (checked with ``importlib.util.find_spec``).
    install : str
        What to run when that module is missing.
    fields : tuple of str
        The fields of a ``train.loggers`` entry it reads (besides ``kind``).
    """

    name: str
    target: str
    summary: str
    requires: str
    install: str
    fields: tuple[str, ...] = ()


#: the sinks, in the order the docs list them
_SINK_TABLE = (
    SinkInfo(
        "tensorboard",
        "tula.engine.metrics_sinks:TensorBoardSink",
        "TensorBoard event files (torch.utils.tensorboard's SummaryWriter), one scalar per metric per epoch",
        "tensorboard",
        "pip install tensorboard",
        fields=("dir",),
    ),
    SinkInfo(
        "mlflow",
        "tula.engine.metrics_sinks:MLflowSink",
        "an MLflow run: the configuration as params, each metric per epoch (step = epoch)",
        "mlflow",
        "pip install mlflow-skinny (or mlflow)",
        fields=("tracking_uri", "experiment", "run_name"),
    ),
)
SINKS: dict[str, SinkInfo] = {s.name: s for s in _SINK_TABLE}
SINK_NAMES: tuple[str, ...] = tuple(SINKS)
#: every field some sink reads (the spec's LoggerSpec has each of them)
SINK_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(f for s in _SINK_TABLE for f in s.fields))


def sink_info(name: str) -> SinkInfo:
    """The entry of ``name``; an unknown name is a :class:`~tula.core.errors.SpecError`."""
    try:
        return SINKS[name]
    except KeyError:
        raise SpecError(f"unknown metrics sink {name!r} in train.loggers; use one of {', '.join(SINK_NAMES)}") from None


def sink_class(name: str) -> Any:
    """The sink class of ``name``, imported on first use (it may import torch or the sink's package)."""
    module, _, attr = sink_info(name).target.partition(":")
    return getattr(importlib.import_module(module), attr)


def missing_package(name: str) -> str | None:
    """The sentence saying what to install when sink ``name``'s package is not importable, else None."""
    info = sink_info(name)
    try:
        found = importlib.util.find_spec(info.requires) is not None
    except (ImportError, ValueError):  # a broken or half-imported package counts as absent
        found = False
    if found:
        return None
    return f"train.loggers asks for {info.name}, which is not installed: {info.install}."


def check_sinks(kinds: Any) -> None:
    """Refuse, before any worker starts, the sinks among ``kinds`` (names, or entries with a
    ``kind``) whose package is not installed: a :class:`~tula.core.errors.SpecError` whose
    one sentence names the package to install."""
    for k in kinds:
        problem = missing_package(getattr(k, "kind", k))
        if problem:
            raise SpecError(problem)
