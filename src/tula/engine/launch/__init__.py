"""Launchers run a function as an N-rank torch.distributed world and gather its results.

Profiling and training call a launcher; they never spawn processes themselves.  A
launcher calls ``fn(ctx, *args)`` on every rank after the process group is up, where
``ctx`` is a :class:`WorkerContext`, and returns the per-rank results in rank order.
What a rank does is written once (:mod:`.runtime`); a launcher only decides where ranks
run and how they meet.  A failed world raises :class:`~tula.core.errors.WorkerError` whose
``cause`` says why, as data.
"""

from tula.engine.launch.base import Launcher, RankFailure, WorkerContext
from tula.engine.launch.local import LocalLauncher

__all__ = ["Launcher", "LocalLauncher", "RankFailure", "WorkerContext"]
