"""Pricing: the expected wall time and the cost of a training run, behind one interface.

``fixed``  -- Eq. 4b: C = T * N * price per node-hour.
``memory`` -- §IV-C2: C = T * N * peak memory per worker (GB) * price per GB-hour.
``spot``   -- C = E[T] * N * spot price per node-hour, with E[T] the expected wall time of
              a run that needs T seconds of uninterrupted training when nodes are preempted.

Every pricing answers two questions: :meth:`expected_time_s` (the wall time a run that
needs ``T`` seconds of training takes: ``T`` itself on on-demand nodes) and :meth:`cost`
(what ``wall`` seconds on N nodes cost).  The planner and the simulator call both, in
that order.

Spot: the expected wall time (a renewal model)
----------------------------------------------
Each of the N nodes is preempted as a Poisson process of rate ``lambda`` per node-hour,
independently, so the synchronous world (it stops when any rank goes) is interrupted at
rate ``L = N * lambda / 3600`` per second.  Training checkpoints every ``tau`` seconds of
progress (``checkpoint_interval_s``; by default every epoch, as ``tula train`` does).  A
preemption loses the work since the last checkpoint and costs ``R`` seconds
(``restart_s``: a replacement node, a new world, the checkpoint loaded) before training
goes on from that checkpoint.

Split the T seconds of work into ``k = floor(T / tau)`` segments of ``tau`` and a rest
``r = T - k tau``.  Let X be the wall time to finish one segment of length s.  The first
attempt either sees no preemption (probability ``exp(-L s)``; it takes s) or is preempted
at time ``t < s`` (density ``L exp(-L t)``), after which ``t + R`` seconds are spent and
the segment starts again from its checkpoint, which is the same problem (memoryless
arrivals: a renewal argument)::

    E[X] = exp(-L s) s + integral_0^s (t + R + E[X]) L exp(-L t) dt
         = exp(-L s) s + (1 - exp(-L s)) / L - s exp(-L s) + (R + E[X]) (1 - exp(-L s))

so ``E[X] exp(-L s) = (1 - exp(-L s)) (1/L + R)``, i.e. ``E[X] = (exp(L s) - 1) (1/L + R)``,
and, the segments being independent,

    E[T_wall] = (k (exp(L tau) - 1) + (exp(L r) - 1)) * (1/L + R)            (-> T as L -> 0)

The expected number of preemptions is ``k (exp(L tau) - 1) + (exp(L r) - 1)`` (each
attempt succeeds with probability ``exp(-L s)``).  To first order in ``L tau`` this is
``E[T_wall] ~ T + L T (tau / 2 + R)``: each of the ``L T`` preemptions loses half an
interval and the restart, the simpler model -- which underestimates once ``L tau`` is not
small, because work redone can be preempted again; the renewal form is used here.

Assumed: no preemption during a restart, checkpoints take no time, all N nodes are billed
for the whole expected wall time (the survivors wait while a node is replaced), and the
spot price does not change during the run.  Spot is cheaper than on-demand at a
configuration exactly when ``spot_price * E[T_wall] < on_demand_price * T``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike

from tula.core.spec import PricingSpec

GB = 1e9


class Pricing(Protocol):
    @property
    def unit(self) -> str: ...

    def expected_time_s(
        self, total_time_s: ArrayLike, n_workers: ArrayLike, epoch_time_s: ArrayLike | None = None
    ) -> np.ndarray:
        """Expected wall time of a run that needs ``total_time_s`` of uninterrupted training on
        ``n_workers`` nodes (``epoch_time_s``: its epoch time, where checkpoints follow epochs)."""
        ...

    def cost(self, total_time_s: ArrayLike, n_workers: ArrayLike, peak_mem_bytes: ArrayLike) -> np.ndarray:
        """Cost of ``total_time_s`` of wall time on ``n_workers`` each peaking at ``peak_mem_bytes``
        (for spot pricing pass :meth:`expected_time_s`'s result)."""
        ...


@dataclass(frozen=True)
class FixedPricing:
    price_per_node_hour: float
    unit: str = "$"

    def expected_time_s(
        self, total_time_s: ArrayLike, n_workers: ArrayLike | None = None, epoch_time_s: ArrayLike | None = None
    ) -> np.ndarray:
        return np.asarray(total_time_s, float)

    def cost(
        self, total_time_s: ArrayLike, n_workers: ArrayLike, peak_mem_bytes: ArrayLike | None = None
    ) -> np.ndarray:
        return np.asarray(total_time_s, float) / 3600.0 * np.asarray(n_workers, float) * self.price_per_node_hour


@dataclass(frozen=True)
class MemoryPricing:
    price_per_gb_hour: float
    unit: str = "$"

    def expected_time_s(
        self, total_time_s: ArrayLike, n_workers: ArrayLike | None = None, epoch_time_s: ArrayLike | None = None
    ) -> np.ndarray:
        return np.asarray(total_time_s, float)

    def cost(self, total_time_s: ArrayLike, n_workers: ArrayLike, peak_mem_bytes: ArrayLike) -> np.ndarray:
        gb = np.asarray(peak_mem_bytes, float) / GB
        return np.asarray(total_time_s, float) / 3600.0 * np.asarray(n_workers, float) * gb * self.price_per_gb_hour


@dataclass(frozen=True)
class SpotPricing:
    """Spot nodes: a price per node-hour, preemptions at ``preemption_rate_per_node_hour`` per
    node, a checkpoint every ``checkpoint_interval_s`` (``None``: every epoch) and
    ``restart_s`` per preemption; see the module docstring for the expectation."""

    price_per_node_hour: float
    preemption_rate_per_node_hour: float
    checkpoint_interval_s: float | None = None
    restart_s: float = 60.0
    unit: str = "$"

    def _interval(self, total_time_s: ArrayLike, epoch_time_s: ArrayLike | None) -> np.ndarray:
        if self.checkpoint_interval_s is not None:
            return np.broadcast_to(np.asarray(self.checkpoint_interval_s, float), np.shape(total_time_s))
        if epoch_time_s is None:
            raise ValueError("spot pricing checkpoints every epoch by default: give the epoch time")
        return np.asarray(epoch_time_s, float)

    def _segments(
        self, total_time_s: ArrayLike, n_workers: ArrayLike, epoch_time_s: ArrayLike | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rate per second, k full intervals, interval, rest)."""
        t = np.asarray(total_time_s, float)
        tau = np.maximum(self._interval(t, epoch_time_s), 1e-12)
        rate = np.asarray(n_workers, float) * self.preemption_rate_per_node_hour / 3600.0
        k = np.floor(t / tau + 1e-9)
        rest = np.maximum(t - k * tau, 0.0)
        return rate, k, tau, rest

    def expected_preemptions(
        self, total_time_s: ArrayLike, n_workers: ArrayLike, epoch_time_s: ArrayLike | None = None
    ) -> np.ndarray:
        """Expected number of preemptions before the run finishes."""
        rate, k, tau, rest = self._segments(total_time_s, n_workers, epoch_time_s)
        with np.errstate(over="ignore", invalid="ignore"):
            return k * np.expm1(rate * tau) + np.expm1(rate * rest)

    def expected_time_s(
        self, total_time_s: ArrayLike, n_workers: ArrayLike, epoch_time_s: ArrayLike | None = None
    ) -> np.ndarray:
        """E[T_wall] = (k (exp(L tau) - 1) + (exp(L r) - 1)) (1/L + R), L = N lambda / 3600."""
        rate, k, tau, rest = self._segments(total_time_s, n_workers, epoch_time_s)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            safe = np.where(rate > 0, rate, 1.0)
            # (exp(L s) - 1) / L, which is s when L = 0
            per_rate = np.where(rate > 0, (k * np.expm1(rate * tau) + np.expm1(rate * rest)) / safe, k * tau + rest)
            out = per_rate + self.expected_preemptions(total_time_s, n_workers, epoch_time_s) * self.restart_s
        return np.where(np.isnan(out), np.inf, out)

    def cost(
        self, total_time_s: ArrayLike, n_workers: ArrayLike, peak_mem_bytes: ArrayLike | None = None
    ) -> np.ndarray:
        return np.asarray(total_time_s, float) / 3600.0 * np.asarray(n_workers, float) * self.price_per_node_hour

    def break_even_rate(
        self,
        total_time_s: float,
        n_workers: int,
        on_demand_price_per_node_hour: float,
        epoch_time_s: float | None = None,
    ) -> float | None:
        """The preemption rate per node-hour below which this spot run costs less than the same
        run on demand (``None``: spot is never cheaper, its price is not below on-demand;
        ``inf``: always cheaper, which only a price of 0 gives)."""
        if self.price_per_node_hour >= on_demand_price_per_node_hour:
            return None
        if self.price_per_node_hour == 0:
            return math.inf
        target = on_demand_price_per_node_hour / self.price_per_node_hour  # E[T_wall] / T at break-even

        def ratio(lam: float) -> float:
            p = SpotPricing(self.price_per_node_hour, lam, self.checkpoint_interval_s, self.restart_s)
            return float(p.expected_time_s(total_time_s, n_workers, epoch_time_s)) / total_time_s

        lo, hi = 0.0, 1e-6
        while ratio(hi) < target:
            lo, hi = hi, hi * 4.0
            if hi > 1e9:
                return math.inf
        for _ in range(100):  # bisection: the ratio grows with the rate
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if ratio(mid) < target else (lo, mid)
        return 0.5 * (lo + hi)


def make_pricing(spec: PricingSpec) -> Pricing:
    if spec.kind == "fixed":
        return FixedPricing(spec.price_per_node_hour)
    if spec.kind == "spot":
        assert (
            spec.spot_price_per_node_hour is not None and spec.preemption_rate_per_node_hour is not None
        )  # the spec's rule
        return SpotPricing(
            spec.spot_price_per_node_hour,
            spec.preemption_rate_per_node_hour,
            spec.checkpoint_interval_s,
            spec.restart_s,
        )
    return MemoryPricing(spec.price_per_gb_hour)
