"""``search.sequence_lengths`` checked against the model and the data before any world: the one
check that ``tula check`` and the profile both run (:func:`check_sequence_lengths`)."""

from __future__ import annotations

import inspect

import torch

from tula.core.errors import SpecError
from tula.core.spec import JobSpec
from tula.engine.workloads import import_path


def positional_limit(model: torch.nn.Module) -> int | None:
    """The longest sequence ``model`` takes, where it says: its ``max_positions`` (``tiny_gpt``),
    or its Hugging Face config's ``max_position_embeddings`` or ``n_positions``; ``None`` where
    it says nothing (no limit known)."""
    limit = getattr(model, "max_positions", None)
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        if limit is None and config is not None:
            limit = getattr(config, name, None)
    return int(limit) if isinstance(limit, int) and not isinstance(limit, bool) else None


def check_sequence_lengths(spec: JobSpec, model: torch.nn.Module) -> None:
    """``search.sequence_lengths`` against the model and data, before any world: a length above
    the model's positional limit, or lengths for a data factory that takes no ``sequence_length``,
    is a :class:`SpecError` in one sentence."""
    lengths = spec.search.sequence_lengths
    if not lengths:
        return
    if spec.data.name == "factory":
        make = import_path(str(spec.data.factory), "data.factory")
        try:
            params = inspect.signature(make).parameters.values()
        except (TypeError, ValueError):  # no signature to read: it is given the keyword and says so itself
            params = None
        if params is not None and not any(
            p.name == "sequence_length" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params
        ):
            raise SpecError(
                f"search.sequence_lengths {lengths} are given, but data factory {spec.data.factory!r} takes no "
                "sequence_length keyword to build its sets at each length; add one, or leave sequence_lengths out"
            )
    limit = positional_limit(model)
    if limit is not None and max(lengths) > limit:
        too_long = [n for n in lengths if n > limit]
        raise SpecError(
            f"search.sequence_lengths {too_long} exceed the model's positional limit of {limit} tokens "
            f"(model {spec.model.name!r}); give lengths of at most {limit}, or a model that takes longer sequences"
        )
