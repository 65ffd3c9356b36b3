"""The launcher interface and the context a rank's function receives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch


@dataclass
class WorkerContext:
    """What a rank knows about its world.  ``emit`` sends a small event (a dict) to the
    launching process, e.g. for a progress bar; it never blocks training."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    _emit: Callable[[dict], None] | None = field(default=None, repr=False)

    def emit(self, event: dict) -> None:
        if self._emit is not None:
            self._emit(event)


class Launcher(Protocol):
    def run(self, fn: Callable[..., Any], n_workers: int, *args: Any,
            on_event: Callable[[int, dict], None] | None = None, timeout_s: float | None = None) -> list[Any]:
        """Run ``fn(ctx, *args)`` on ``n_workers`` ranks; return results in rank order.

        Raises :class:`~tula.errors.WorkerError` naming the first rank that failed or died."""
        ...


def pick_device(kind: str) -> str:
    """``auto`` -> ``cuda`` where a GPU is visible, else ``cpu``."""
    if kind == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return kind
