"""Pricing: the cost of a training run, behind one interface.

``fixed``  -- Eq. 4b: C = T * N * price per node-hour.
``memory`` -- §IV-C2: C = T * N * peak memory per worker (GB) * price per GB-hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .spec import PricingSpec

GB = 1e9


class Pricing(Protocol):
    unit: str

    def cost(self, total_time_s, n_workers, peak_mem_bytes):
        """Cost of a run of ``total_time_s`` on ``n_workers`` each peaking at ``peak_mem_bytes``."""
        ...


@dataclass(frozen=True)
class FixedPricing:
    price_per_node_hour: float
    unit: str = "$"

    def cost(self, total_time_s, n_workers, peak_mem_bytes=None):
        return np.asarray(total_time_s, float) / 3600.0 * np.asarray(n_workers, float) * self.price_per_node_hour


@dataclass(frozen=True)
class MemoryPricing:
    price_per_gb_hour: float
    unit: str = "$"

    def cost(self, total_time_s, n_workers, peak_mem_bytes):
        gb = np.asarray(peak_mem_bytes, float) / GB
        return np.asarray(total_time_s, float) / 3600.0 * np.asarray(n_workers, float) * gb * self.price_per_gb_hour


def make_pricing(spec: PricingSpec) -> Pricing:
    if spec.kind == "fixed":
        return FixedPricing(spec.price_per_node_hour)
    return MemoryPricing(spec.price_per_gb_hour)
