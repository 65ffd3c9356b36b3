"""Gradient accumulation's one rule: how many micro-batches a rank's share of a step runs as.

Pure arithmetic, read by the planner (:mod:`tula.core.plan`, through the search space) and by
the batch schedules (:mod:`tula.core.schedules`), so that a plan and a schedule split the
same share the same way.  The fewest accumulation steps whose micro-batches fit
(:func:`fewest_accumulation_steps`); what fits is the caller's: a bound on the micro-batch
(:func:`accumulation_for`), or the accumulated peak against the memory budget
(:meth:`tula.core.fitted.FittedModels.accumulation_steps_for`).
"""

from __future__ import annotations

from collections.abc import Callable


def fewest_accumulation_steps(share: int, max_steps: int, fits: Callable[[int], bool]) -> int | None:
    """The fewest accumulation steps k <= ``max_steps`` that split a rank's ``share`` of the
    global batch into k equal micro-batches for which ``fits(micro_batch)`` holds (k = 1: the
    share itself, whatever ``max_steps``); None when no such k exists."""
    for k in range(1, max(max_steps, 1) + 1):
        if share % k == 0 and fits(share // k):
            return k
    return None


def accumulation_for(share: int, max_micro_batch: int | None, max_steps: int) -> int | None:
    """The fewest accumulation steps k <= ``max_steps`` that split a rank's ``share`` of the
    global batch into k equal micro-batches of at most ``max_micro_batch`` samples (1 when
    the share fits or there is no bound); None when no such k exists."""
    if max_micro_batch is None:
        return 1
    return fewest_accumulation_steps(share, max_steps, lambda micro: micro <= max_micro_batch)
