"""The search space: which (cluster size N, global batch B) configurations exist.

Global batches grow geometrically from ``min_batch`` (x ``batch_growth``) up to
``max_batch`` or the training-set size, and must split evenly over N workers; the local
batch ``b = B / N`` is bounded above by the memory model -- or, with gradient accumulation
(``search.max_accumulation_steps`` > 1), each rank's share ``B / N`` is k micro-batches of
``B / (N k)`` samples and only the micro-batch is bounded (:func:`tula.core.accumulation.accumulation_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tula.core.spec import SearchSpec


@dataclass(frozen=True)
class Config:
    n_workers: int
    global_batch: int

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.n_workers


def max_global_batch(search: SearchSpec, dataset_size: int) -> int:
    return min(search.max_batch or dataset_size, dataset_size) if dataset_size >= search.min_batch else search.min_batch


def candidate_global_batches(search: SearchSpec, dataset_size: int) -> list[int]:
    """``min_batch * growth**k`` up to the largest allowed global batch."""
    hi = max_global_batch(search, dataset_size)
    out, b = [], search.min_batch
    while b <= hi:
        out.append(b)
        b *= search.batch_growth
    return out


def candidate_configs(
    search: SearchSpec, dataset_size: int, max_local_batch: int | None, cluster_sizes: list[int] | None = None
) -> list[Config]:
    """Every candidate (N, B) whose local batch is a positive integer within the memory bound."""
    out = []
    for n in cluster_sizes or search.cluster_sizes:
        for big_b in candidate_global_batches(search, dataset_size):
            if big_b % n or big_b < n:
                continue
            if max_local_batch is not None and big_b // n > max_local_batch:
                continue
            out.append(Config(n, big_b))
    return out


def partial_configs(
    search: SearchSpec, dataset_size: int, max_local_batch: int | None, middle: bool = False
) -> list[Config]:
    """Partial search (§III-A2): only the extreme cluster sizes, each at its smallest and
    largest feasible global batch -- and, with ``middle``, at the candidate nearest their
    geometric mean too (a third batch, from which the performance model fits a host-bound
    floor: :class:`tula.core.perfmodel.PerfModel`'s ``t_floor_s``)."""
    sizes = search.cluster_sizes
    extremes = sorted({sizes[0], sizes[-1]})
    out: list[Config] = []
    for n in extremes:
        cands = candidate_configs(search, dataset_size, max_local_batch, [n])
        if cands:
            out.extend({cands[0], cands[-1]})
            mid = middle_batch([c.global_batch for c in cands]) if middle else None
            if mid is not None:
                out.append(Config(n, mid))
    return sorted(out, key=lambda c: (c.n_workers, c.global_batch))


def middle_batch(batches: list[int]) -> int | None:
    """The partial search's middle batch among sorted ``batches``: the inner one nearest the
    geometric mean of the smallest and the largest; None with fewer than three."""
    if len(batches) < 3:
        return None
    mean = (batches[0] * batches[-1]) ** 0.5
    return min(batches[1:-1], key=lambda b: abs(b - mean))
