"""Gradient accumulation's one rule: how many micro-batches a rank's share of a step runs as.

Pure arithmetic, read by the planner (:mod:`tula.core.plan`, through the search space) and by
the batch schedules (:mod:`tula.core.schedules`), so that a plan and a schedule split the
same share the same way.
"""

from __future__ import annotations


def accumulation_for(share: int, max_micro_batch: int | None, max_steps: int) -> int | None:
    """The fewest accumulation steps k <= ``max_steps`` that split a rank's ``share`` of the
    global batch into k equal micro-batches of at most ``max_micro_batch`` samples (1 when
    the share fits or there is no bound); None when no such k exists."""
    if max_micro_batch is None or share <= max_micro_batch:
        return 1
    for k in range(2, max_steps + 1):
        if share % k == 0 and share // k <= max_micro_batch:
            return k
    return None
