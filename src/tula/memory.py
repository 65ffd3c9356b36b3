"""Memory model (Eq. 3, §III-A1): peak memory of one training step as a function of the
local batch, and the largest local batch that fits a budget.

    M_total(b) = M_param + M_grad + M_opt + M_buffers + M_other  +  b * (m_act + m_batch)

The static part is read from the model and optimiser; the per-sample part is measured
from real training steps at two small local batches (after a first step, so that the
lazily created optimiser state exists).  Measured peaks come from torch's MemTracker on
CPU and ``torch.cuda.max_memory_allocated`` on CUDA, the same measure the profiler uses.
"""

from __future__ import annotations

import math
import resource
from dataclasses import asdict, dataclass, replace
from typing import Callable

import numpy as np
import torch
from torch import nn


def is_out_of_memory(err: BaseException) -> bool:
    """True for CUDA OOM, the CPU allocator's failure under an address-space cap, and MemoryError."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    msg = str(err).lower()
    return isinstance(err, RuntimeError) and ("can't allocate memory" in msg or "out of memory" in msg
                                              or "cannot allocate memory" in msg)


def measure_step_peak_bytes(run_step: Callable[[], None], model: nn.Module, optimizer: torch.optim.Optimizer,
                            device: torch.device) -> int:
    """Peak bytes of tensors alive during ``run_step()`` (parameters and optimiser state included)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run_step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        run_step()
    peaks = tracker.get_tracker_snapshot("peak")
    return int(sum(v["Total"] for v in peaks.values()))


def measure_phase_peaks(forward_backward: Callable[[], None], update: Callable[[], None], model: nn.Module,
                        optimizer: torch.optim.Optimizer, device: torch.device) -> tuple[int, int]:
    """Peak bytes of live tensors during ``forward_backward()`` and, separately, during
    ``update()`` (the optimiser step).  They are different curves: the first grows with the
    batch (activations), the second does not (gradients, optimiser state and the update's
    temporaries), and at small batches the second can be the higher one -- a line through
    two whole-step peaks there would miss the activations' growth."""
    return (measure_step_peak_bytes(forward_backward, model, optimizer, device),
            measure_step_peak_bytes(update, model, optimizer, device))


def tensor_bytes(tensors) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return tensor_bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


@dataclass(frozen=True)
class MemoryModel:
    """Fitted memory model of one (model, data, optimiser, device).  All sizes in bytes."""

    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    buffer_bytes: int
    other_static_bytes: int  # measured intercept minus the static parts above (workspaces, DDP, rounding)
    activation_bytes_per_sample: int  # measured slope minus the data batch
    batch_bytes_per_sample: int
    probe_local_batches: tuple[int, int]
    probe_peak_bytes: tuple[int, int]
    device: str
    update_peak_bytes: int = 0  # peak during the optimiser step: a floor under every batch's peak

    @property
    def static_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_state_bytes + self.buffer_bytes + \
            self.other_static_bytes

    @property
    def bytes_per_sample(self) -> int:
        return self.activation_bytes_per_sample + self.batch_bytes_per_sample

    def predict_peak_bytes(self, local_batch):
        """Predicted peak bytes for a local batch (scalar or numpy array): the forward/backward
        line, or the optimiser step's peak where that is higher."""
        line = self.static_bytes + self.bytes_per_sample * np.asarray(local_batch)
        peak = np.maximum(line, self.update_peak_bytes)
        return int(peak) if peak.ndim == 0 else peak

    def max_local_batch(self, budget_bytes: int | None, safety: float = 0.1) -> int | None:
        """Largest local batch whose predicted peak stays within ``(1 - safety) * budget``;
        ``None`` when there is no budget, 0 when not even one sample fits."""
        if budget_bytes is None:
            return None
        room = budget_bytes * (1.0 - safety) - self.static_bytes
        if room < self.bytes_per_sample or self.update_peak_bytes > budget_bytes * (1.0 - safety):
            return 0
        return int(math.floor(room / max(self.bytes_per_sample, 1)))

    def refit(self, local_batches, peak_bytes) -> "MemoryModel":
        """The same static decomposition with intercept and slope refitted to more measured
        peaks (e.g. the profiled trials), by least squares on relative error over the
        larger half of the batches."""
        b = np.concatenate([np.asarray(self.probe_local_batches, float), np.asarray(local_batches, float)])
        p = np.concatenate([np.asarray(self.probe_peak_bytes, float), np.asarray(peak_bytes, float)])
        # at small batches the peak can sit in another phase of the step (optimiser update
        # rather than backward), so the line is fitted to the larger half of the batches
        keep = b >= np.median(b)
        if len(np.unique(b[keep])) < 2:
            keep = np.ones_like(b, dtype=bool)
        if len(np.unique(b[keep])) < 2:
            return self
        slope, intercept = np.polyfit(b[keep], p[keep], 1, w=1.0 / p[keep])
        slope = max(float(slope), 0.0)
        known = self.param_bytes + self.grad_bytes + self.optimizer_state_bytes + self.buffer_bytes
        return replace(self, other_static_bytes=int(round(intercept)) - known,
                       activation_bytes_per_sample=int(math.ceil(slope)) - self.batch_bytes_per_sample)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "MemoryModel":
        d = dict(d)
        d["probe_local_batches"] = tuple(d["probe_local_batches"])
        d["probe_peak_bytes"] = tuple(d["probe_peak_bytes"])
        return cls(**d)


def fit_memory_model(model: nn.Module, optimizer: torch.optim.Optimizer, sample_bytes: int,
                     local_batches: tuple[int, int], peaks: tuple[int, int], device: torch.device,
                     update_peak_bytes: int = 0) -> MemoryModel:
    """Build the model from two measured forward/backward peaks (after the optimiser state
    exists) and the optimiser step's peak."""
    (b1, b2), (p1, p2) = local_batches, peaks
    if b2 <= b1:
        raise ValueError("memory probe batches must be increasing")
    slope = max((p2 - p1) / (b2 - b1), 0.0)
    intercept = p1 - slope * b1
    params = [p for p in model.parameters()]
    param_bytes = tensor_bytes(params)
    grad_bytes = tensor_bytes(p for p in params if p.requires_grad)
    opt_bytes = optimizer_state_bytes(optimizer)
    buffer_bytes = tensor_bytes(model.buffers())
    static_known = param_bytes + grad_bytes + opt_bytes + buffer_bytes
    per_sample = int(math.ceil(slope))
    return MemoryModel(
        param_bytes=param_bytes, grad_bytes=grad_bytes, optimizer_state_bytes=opt_bytes, buffer_bytes=buffer_bytes,
        other_static_bytes=int(round(intercept)) - static_known,
        activation_bytes_per_sample=per_sample - sample_bytes, batch_bytes_per_sample=sample_bytes,
        probe_local_batches=(b1, b2), probe_peak_bytes=(int(p1), int(p2)), device=device.type,
        update_peak_bytes=int(update_peak_bytes))


def probe_memory_model(measure: Callable[[int], tuple[int, int]], model: nn.Module, optimizer: torch.optim.Optimizer,
                       sample_bytes: int, local_batches: tuple[int, int], device: torch.device,
                       max_batch: int, max_extra_probes: int = 4, min_growth: float = 0.02) -> MemoryModel:
    """Fit the memory model from probe steps.  ``measure(b)`` runs one step at local batch
    ``b`` and returns its (forward/backward peak, optimiser-update peak), both including the
    data batch.

    Probing starts at ``local_batches``.  While the forward/backward peak has not grown by
    ``min_growth`` from one probe to the next, the activations are still hidden under a
    batch-independent peak (for a large model under DDP: gradients and their buckets at the
    end of backward), so the batch is doubled, up to ``max_extra_probes`` times and
    ``max_batch``, and once it grows one probe more is taken.  The line is fitted to the
    last two probes; the update's peak and the earlier probes' peaks are a floor under it."""
    batches = list(local_batches)
    peaks = {b: measure(b) for b in batches}
    extra = 0
    while (extra < max_extra_probes and 2 * batches[-1] <= max_batch
           and peaks[batches[-1]][0] < (1.0 + min_growth) * peaks[batches[-2]][0]):
        batches.append(2 * batches[-1])
        peaks[batches[-1]] = measure(batches[-1])
        extra += 1
    if extra and 2 * batches[-1] <= max_batch:
        # the peak has just started to grow: the probe before may still sit on the floor,
        # so fit the line through this probe and one more
        batches.append(2 * batches[-1])
        peaks[batches[-1]] = measure(batches[-1])
    b1, b2 = batches[-2], batches[-1]
    floor = max([up for _, up in peaks.values()] + [peaks[b][0] for b in batches[:-2]])
    return fit_memory_model(model, optimizer, sample_bytes, (b1, b2), (peaks[b1][0], peaks[b2][0]), device,
                            update_peak_bytes=floor)


def cap_address_space(budget_bytes: int) -> int:
    """Cap this process's address space at its current size plus the budget (Linux), so that
    exceeding the budget raises the CPU allocator's out-of-memory error; returns the cap."""
    with open("/proc/self/status") as fh:
        vm_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmSize:"))
    cap = vm_kb * 1024 + budget_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap
