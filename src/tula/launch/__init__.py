"""Launchers run a function as an N-rank torch.distributed world and gather its results.

Profiling and training call a launcher; they never spawn processes themselves.  A
launcher calls ``fn(ctx, *args)`` on every rank after the process group is up, where
``ctx`` is a :class:`WorkerContext`, and returns the per-rank results in rank order.
"""

from .base import Launcher, WorkerContext
from .local import LocalLauncher

__all__ = ["Launcher", "LocalLauncher", "WorkerContext"]
