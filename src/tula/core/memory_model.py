"""The memory model (Eq. 3, §III-A1) as a small parameter record: peak memory of one training
step as a function of the local batch, and the largest local batch that fits a budget.

    M_total(b) = M_param + M_grad + M_opt + M_buffers + M_other + M_data  +  b * (m_act + m_batch)

(M_data: an in-memory data set resident on the device, ``resident_data_bytes``; 0 otherwise.)

The line is a one-rank world's.  A DDP world of N >= 2 (measured, tiny_gpt and small_cnn) peaks at
the line (plus ``ddp_bucket_bytes``) at large batches and in another phase of its step, with fewer
bytes per sample, above it at small ones: max(line, phase), bounded from above by the N >= 2 trials'
own line and, below their smallest batch, by its peak (:meth:`MemoryModel.with_ddp_phase`).

Sequence length (#44).  Where the profile measured several sequence lengths L, the bytes per
sample grow with L (a transformer's activations: every token's) and with L^2 (attention's
scores, unless a fused kernel avoids them), from the length ``sequence_length`` the line was
measured at, L_ref:

    bytes_per_sample(L) = bytes_per_sample + bytes_per_token * (L - L_ref) + bytes_per_token_squared * (L^2 - L_ref^2)

so M(b, L) = static + b * bytes_per_sample(L): terms in B*L and B*L^2.  ``bytes_per_token_squared``
is fitted only where more than two lengths were measured (else 0); with one length
(``sequence_length`` None) the model is the line above, in the batch alone.

It is measured in :mod:`tula.engine.memory` (which needs torch); this module is numpy only, so
fitting and planning from saved records never import torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import overload

import numpy as np
from numpy.typing import ArrayLike

from tula.core.length_terms import fit_length_terms


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


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
    # address space a worker maps beyond its tensors (oneDNN kernels and primitives, the
    # allocator's heap, thread stacks), measured by the probe when a cap is enforced; 0 otherwise
    address_space_overhead_bytes: int = 0
    precision: str = "fp32"  # train.precision of the steps it was measured on (a plan never mixes them)
    # an in-memory data set kept on the device (CUDA, data.device_resident_share): both splits, per worker
    resident_data_bytes: int = 0
    # what a rank of a world of N >= 2 holds beyond the line, which is a one-rank world's: DDP's
    # gradient buckets, allocated for the whole run (gradients as bucket views), where a one-rank
    # world (not wrapped in DDP) allocates its gradients in the backward pass.  0 in records made
    # before one-rank worlds went unwrapped: their line was measured with the buckets in it.
    ddp_bucket_bytes: int = 0
    # L_ref, the sequence length the line was measured at (None: one length measured, the batch alone) ...
    sequence_length: int | None = None
    # ... and the bytes per sample each extra token adds (the B*L term), and each extra L^2 (the B*L^2 term)
    bytes_per_token: float = 0.0
    bytes_per_token_squared: float = 0.0
    # train.parallelism fsdp (tula.core.effects.ShardingEffect): a rank of N holds 1/N of the parameters,
    # gradients and optimiser state, and the gathered blocks' working set besides (world_bytes); False: DDP's
    sharded: bool = False
    sharded_gather_bytes: int = 0
    # ... and the state bytes a rank of N holds 1/N of (fitted over two cluster sizes; None: all of param + grad + optimizer)
    sharded_divided_bytes: int | None = None
    # DDP, N >= 2, as the profile's trials measured it (refit): the peak is the one-rank line's plus
    # ddp_bucket_bytes (then the extra at the largest batch measured) at large batches, but at small ones another
    # phase of the step, with fewer bytes per sample, sits higher (tiny_gpt, 2026-11-29: max(line, line + 631 kB
    # - 2,312 b L)).  Bounded from above by the N >= 2 trials' own line (ddp_phase_bytes + ddp_phase_bytes_per_sample
    # * b, the per-sample scaled with L as the line's) and, below the smallest batch measured, by its peak
    # (ddp_floor_bytes).  0: not measured (a profile without N >= 2 trials, records made before)
    ddp_floor_bytes: int = 0
    ddp_phase_bytes: int = 0
    ddp_phase_bytes_per_sample: float = 0.0

    @property
    def static_bytes(self) -> int:
        return (
            self.param_bytes
            + self.grad_bytes
            + self.optimizer_state_bytes
            + self.buffer_bytes
            + self.other_static_bytes
            + self.resident_data_bytes
        )

    @property
    def bytes_per_sample(self) -> int:
        return self.activation_bytes_per_sample + self.batch_bytes_per_sample

    def bytes_per_sample_at(self, sequence_length: ArrayLike | None = None) -> float | np.ndarray:
        """The bytes each sample adds at sequence length L (``None``, or a model of one length:
        :attr:`bytes_per_sample`, measured at L_ref), never below the data batch's share."""
        if sequence_length is None or self.sequence_length is None:
            return self.bytes_per_sample
        length, ref = np.asarray(sequence_length, float), float(self.sequence_length)
        extra = self.bytes_per_token * (length - ref) + self.bytes_per_token_squared * (length**2 - ref**2)
        per_sample = np.maximum(self.bytes_per_sample + extra, self.batch_bytes_at(length))
        return float(per_sample) if per_sample.ndim == 0 else per_sample

    def batch_bytes_at(self, sequence_length: ArrayLike | None = None) -> float | np.ndarray:
        """The data batch's bytes per sample at sequence length L: proportional to L (its tokens)."""
        if sequence_length is None or self.sequence_length is None:
            return self.batch_bytes_per_sample
        scaled = self.batch_bytes_per_sample * np.asarray(sequence_length, float) / self.sequence_length
        return float(scaled) if scaled.ndim == 0 else scaled

    def world_bytes(self, n_workers: ArrayLike | None = None) -> int | np.ndarray:
        """What a rank of an ``n_workers`` world holds beyond a one-rank world's: DDP's buckets
        where N >= 2; ``None`` (the worker count not known yet): as for N >= 2, the larger.  A
        sharded model (FSDP): the gathered working set less the (N - 1) / N of the state a rank does
        not hold (``None``: as for N = 1, the larger)."""
        if self.sharded:
            n = np.asarray(1 if n_workers is None else n_workers, float)
            state = self.param_bytes + self.grad_bytes + self.optimizer_state_bytes
            if self.sharded_divided_bytes is not None:
                state = self.sharded_divided_bytes
            held = np.rint(self.sharded_gather_bytes - state * (1.0 - 1.0 / np.maximum(n, 1.0))).astype(np.int64)
            return int(held) if held.ndim == 0 else held
        if n_workers is None:
            return self.ddp_bucket_bytes
        return np.where(np.asarray(n_workers) > 1, self.ddp_bucket_bytes, 0)

    def ddp_phase_peak_bytes(
        self, local_batch: ArrayLike, n_workers: ArrayLike | None = None, sequence_length: ArrayLike | None = None
    ) -> float | np.ndarray:
        """The small-batch phase of a DDP world of N >= 2 (``None``: as for N >= 2): the N >= 2
        trials' own line, never below the peak at their smallest batch; 0 where N is 1, or where the
        profile measured no N >= 2 world (see ``ddp_floor_bytes``).  A sharded model's is FSDP's own,
        measured at its smallest N >= 2 (:meth:`tula.core.effects.ShardingEffect.memory` sets it; at a
        larger N, where a rank holds less of the state, it is high)."""
        if not self.ddp_floor_bytes:
            return 0.0
        scale = np.asarray(self.bytes_per_sample_at(sequence_length), float) / max(self.bytes_per_sample, 1)
        phase = self.ddp_phase_bytes + self.ddp_phase_bytes_per_sample * scale * np.asarray(local_batch, float)
        peak = np.maximum(phase, float(self.ddp_floor_bytes))
        if n_workers is not None:
            peak = np.where(np.asarray(n_workers) > 1, peak, 0.0)
        return float(peak) if np.ndim(peak) == 0 else peak

    @overload
    def predict_peak_bytes(
        self, local_batch: int, n_workers: int | None = None, sequence_length: int | None = None
    ) -> int: ...

    @overload
    def predict_peak_bytes(
        self, local_batch: ArrayLike, n_workers: ArrayLike | None = None, sequence_length: ArrayLike | None = None
    ) -> int | np.ndarray: ...

    def predict_peak_bytes(
        self, local_batch: ArrayLike, n_workers: ArrayLike | None = None, sequence_length: ArrayLike | None = None
    ) -> int | np.ndarray:
        """Predicted peak bytes of a rank for a local batch (scalar or numpy array) in a world of
        ``n_workers`` (default: any N, :meth:`world_bytes`) at ``sequence_length`` (default: the
        length measured, :meth:`bytes_per_sample_at`): the forward/backward line, or the
        optimiser step's peak where that is higher, or in a DDP world of N >= 2 its small-batch
        phase (:meth:`ddp_phase_peak_bytes`) where that is."""
        line = self.static_bytes + self.bytes_per_sample_at(sequence_length) * np.asarray(local_batch)
        peak = np.maximum(line + self.world_bytes(n_workers), self.update_peak_bytes)
        peak = np.maximum(peak, self.ddp_phase_peak_bytes(local_batch, n_workers, sequence_length))
        return int(peak) if peak.ndim == 0 else peak

    @overload
    def predict_accumulated_peak_bytes(
        self, local_batch: int, micro_batch: int, n_workers: int | None = None, sequence_length: int | None = None
    ) -> int: ...

    @overload
    def predict_accumulated_peak_bytes(
        self,
        local_batch: ArrayLike,
        micro_batch: ArrayLike,
        n_workers: ArrayLike | None = None,
        sequence_length: ArrayLike | None = None,
    ) -> int | np.ndarray: ...

    def predict_accumulated_peak_bytes(
        self,
        local_batch: ArrayLike,
        micro_batch: ArrayLike,
        n_workers: ArrayLike | None = None,
        sequence_length: ArrayLike | None = None,
    ) -> int | np.ndarray:
        """Predicted peak bytes when a rank's share ``local_batch`` runs as micro-batches of
        ``micro_batch`` (gradient accumulation): the micro-batch's forward/backward, plus the
        rest of the share's data, which is loaded whole and then sliced.  Equal to
        :meth:`predict_peak_bytes` when ``micro_batch`` is the share.

        With more than one micro-batch the forward/backward also holds the whole gradients
        (``grad_bytes``, not divided by N) from the first micro-batch's backward on: the step's
        ``zero_grad`` leaves none, and under ``no_sync`` each backward accumulates into gradients of
        its own -- a one-rank world's, a DDP rank's beside its buckets (they become bucket views at
        the synchronised last micro-batch only), an FSDP rank's unsharded until the last one
        reduce-scatters them (:class:`tula.core.effects.ShardingEffect`).  The optimiser step's
        peak holds them at any k, so it is not raised.  Measured (a throwaway script, 2026-11-29:
        the profile's worker, MemTracker, gloo, k 2 and 4 against k = 1 at the micro-batch less the
        rest of the share's data): the forward/backward's extra 0.87-1.01 ``grad_bytes`` for the
        digits MLP and tiny_gpt at N = 1 and 2 (the lower end in the small-batch phase); the
        accumulated peaks, k = 1's set to the measured, within -0.2 % to +1.7 % (without the
        gradients' term -15 % to 0 %)."""
        local, micro = np.asarray(local_batch), np.asarray(micro_batch)
        held = np.where(micro < local, self.grad_bytes, 0)  # k > 1: the whole gradients, between the micro-batches
        line = self.static_bytes + self.bytes_per_sample_at(sequence_length) * micro + self.world_bytes(n_workers)
        passes = np.maximum(line, self.ddp_phase_peak_bytes(micro, n_workers, sequence_length)) + held
        rest_of_share = self.batch_bytes_at(sequence_length) * (local - micro)
        peak = np.maximum(passes, self.update_peak_bytes) + rest_of_share
        return int(peak) if np.ndim(peak) == 0 else peak

    @overload
    def predict_budget_bytes(self, local_batch: int) -> int: ...

    @overload
    def predict_budget_bytes(self, local_batch: ArrayLike) -> int | np.ndarray: ...

    def predict_budget_bytes(self, local_batch: ArrayLike) -> int | np.ndarray:
        """What a local batch charges to the memory budget: the predicted peak of tensors plus,
        under an address-space cap, the worker's address-space overhead."""
        return self.predict_peak_bytes(local_batch) + self.address_space_overhead_bytes

    def max_local_batch(
        self,
        budget_bytes: int | None,
        safety: float = 0.1,
        n_workers: int | None = None,
        sequence_length: int | None = None,
    ) -> int | None:
        """Largest local batch whose predicted peak (plus the address-space overhead, see
        :meth:`predict_budget_bytes`) stays within ``(1 - safety) * budget`` in a world of
        ``n_workers`` (default: any N) at ``sequence_length`` (default: the length measured);
        ``None`` when there is no budget, 0 when not even one sample fits (:meth:`shortfall`
        says why)."""
        if budget_bytes is None:
            return None
        usable = budget_bytes * (1.0 - safety) - self.address_space_overhead_bytes
        room = usable - self.static_bytes - int(self.world_bytes(n_workers))
        per_sample = float(self.bytes_per_sample_at(sequence_length))
        if room < per_sample or self.update_peak_bytes > usable:
            return 0
        largest = int(math.floor(room / max(per_sample, 1)))
        if float(self.ddp_phase_peak_bytes(1, n_workers, sequence_length)):  # N >= 2's small-batch phase
            if self.ddp_floor_bytes > usable:
                return 0
            phase_per_sample = self.ddp_phase_bytes_per_sample * per_sample / max(self.bytes_per_sample, 1)
            if phase_per_sample > 0:
                largest = min(largest, int(math.floor((usable - self.ddp_phase_bytes) / phase_per_sample)))
        return max(largest, 0)

    def shortfall(self, budget_bytes: int, safety: float = 0.1) -> str:
        """Why not one sample fits ``budget_bytes`` (a clause for an error message)."""
        usable = budget_bytes * (1.0 - safety)
        need = (
            max(max(self.static_bytes + self.bytes_per_sample, self.update_peak_bytes) + self.ddp_bucket_bytes,
                float(self.ddp_phase_peak_bytes(1)))
            + self.address_space_overhead_bytes
        )  # fmt: skip
        parts = [
            f"{_mib(max(self.static_bytes, self.update_peak_bytes))} of parameters, gradients, optimiser "
            f"state and workspaces"
            + (f" (of which {_mib(self.resident_data_bytes)} the data set kept on the device)"
               if self.resident_data_bytes else "")
        ]  # fmt: skip
        if self.address_space_overhead_bytes:
            parts.append(
                f"{_mib(self.address_space_overhead_bytes)} of address space beyond tensors under the "
                "memory cap (oneDNN kernels, allocator heap, thread stacks)"
            )
        return (
            f"a step needs at least {_mib(need)} per worker ({', '.join(parts)}, then "
            f"{self.bytes_per_sample} bytes per sample), more than the {_mib(usable)} left of the "
            f"{_mib(budget_bytes)} budget after the {safety:.0%} safety margin"
        )

    def refit(
        self, local_batches: Sequence[int], peak_bytes: Sequence[int], n_workers: Sequence[int] | None = None
    ) -> MemoryModel:
        """The same static decomposition with intercept and slope refitted to more measured
        peaks (e.g. the profiled trials, in worlds of ``n_workers``; default: one rank), by
        least squares on relative error over the larger half of the batches.

        Where the trials ran one-rank worlds at two batches or more and DDP worlds of N >= 2 too,
        the line is the one-rank trials' alone and the N >= 2 trials fit what a DDP world holds
        beyond it (:meth:`with_ddp_phase`): measured (tiny_gpt, 2026-11-29), a two-rank peak is the
        one-rank line's at large batches and another phase's above it at small ones, so the
        line less a constant for the buckets fitted over both sizes came out 574 kB low.
        Otherwise the probes' peaks (on the line already) join the trials, a DDP world's less
        its buckets (``ddp_bucket_bytes``)."""
        ns = np.ones(len(local_batches)) if n_workers is None else np.asarray(n_workers, float)
        batches, peaks = np.asarray(local_batches, float), np.asarray(peak_bytes, float)
        one = ns <= 1
        if not self.sharded and not one.all() and len(np.unique(batches[one])) >= 2:
            line = self._refit_line(batches[one], peaks[one])
            return line.with_ddp_phase(batches[~one].tolist(), peaks[~one].tolist())
        b = np.concatenate([np.asarray(self.probe_local_batches, float), batches])
        p = np.concatenate([np.asarray(self.probe_peak_bytes, float), peaks - self.world_bytes(ns)])
        return self._refit_line(b, p)

    def _refit_line(self, b: np.ndarray, p: np.ndarray) -> MemoryModel:
        """Intercept and slope fitted to peaks ``p`` at local batches ``b`` (see :meth:`refit`)."""
        # at small batches the peak can sit in another phase of the step (optimiser update
        # rather than backward), so the line is fitted to the larger half of the batches
        keep = b >= np.median(b)
        if len(np.unique(b[keep])) < 2:
            keep = np.ones_like(b, dtype=bool)
        if len(np.unique(b[keep])) < 2:
            return self
        slope, intercept = np.polyfit(b[keep], p[keep], 1, w=1.0 / p[keep])
        slope = max(float(slope), 0.0)
        known = (
            self.param_bytes + self.grad_bytes + self.optimizer_state_bytes + self.buffer_bytes
            + self.resident_data_bytes
        )  # fmt: skip
        return replace(
            self,
            other_static_bytes=int(round(intercept)) - known,
            activation_bytes_per_sample=int(math.ceil(slope)) - self.batch_bytes_per_sample,
        )

    def with_ddp_phase(self, local_batches: Sequence[int], peak_bytes: Sequence[int]) -> MemoryModel:
        """This model (its line a one-rank world's) with what a DDP world of N >= 2 holds beyond it
        fitted to N >= 2 peaks measured at the line's length: ``ddp_bucket_bytes`` the excess over
        the line at the largest batch (not below 0), ``ddp_floor_bytes`` the peak at the smallest,
        and the phase line through those two peaks (raised until no peak lies above the model).

        The peak is max(line, a phase with fewer bytes per sample): convex in the batch, so the line
        through two peaks lies above it between them, and beyond the largest batch the line plus
        its excess there; below the smallest the phase's peak only falls.  Never low, at most the
        phase line's excess over the truth between the two batches.  Unchanged without peaks."""
        b, p = np.asarray(local_batches, float), np.asarray(peak_bytes, float)
        if not len(b) or self.sharded:
            return self
        smallest, largest = float(b.min()), float(b.max())
        floor = float(p[b == smallest].max())
        at_largest = float(p[b == largest].max())
        line = self.static_bytes + self.bytes_per_sample * b
        extra = max(0.0, float((p - line)[b == largest].max()))
        per_sample = max(0.0, (at_largest - floor) / (largest - smallest)) if largest > smallest else 0.0
        phase = floor - per_sample * smallest
        model = np.maximum(np.maximum(line + extra, phase + per_sample * b), floor)
        phase += max(0.0, float((p - model).max()))  # a peak between the two batches above the phase line
        return replace(
            self,
            ddp_bucket_bytes=int(math.ceil(extra)),
            ddp_floor_bytes=int(math.ceil(floor)),
            ddp_phase_bytes=int(math.ceil(phase)),
            ddp_phase_bytes_per_sample=float(per_sample),
        )

    def without_ddp_phase(self) -> MemoryModel:
        """This model with a DDP world's N >= 2 term as its gradient buckets alone (``grad_bytes``), as
        before :meth:`with_ddp_phase`: for a variant of the step whose N >= 2 worlds the phase was not
        measured on (checkpointing: run 4, N 2, b 20, L 24 and 48, 379 and 419 kB above the
        checkpointed line, where the plain step's phase line predicted +50 % and +68 %)."""
        if not self.ddp_floor_bytes:
            return self
        return replace(
            self, ddp_bucket_bytes=self.grad_bytes, ddp_floor_bytes=0, ddp_phase_bytes=0, ddp_phase_bytes_per_sample=0.0
        )

    def with_sequence_length(
        self,
        reference_length: int,
        lengths: Sequence[int],
        local_batches: Sequence[int],
        peak_bytes: Sequence[int],
        n_workers: Sequence[int] | None = None,
    ) -> MemoryModel:
        """This model (the line measured at ``reference_length``) with the terms in B*L and B*L^2
        fitted to peaks measured at other lengths (``lengths``, ``local_batches``, ``peak_bytes``,
        in worlds of ``n_workers``; default one rank): each peak's bytes per sample beyond the
        static part, against the reference's, by least squares on relative error.  The L^2 term
        only where more than two lengths were measured (the reference among them), and never
        below 0 (a fused attention kernel: no L^2 activations); unchanged without another length."""
        ls = np.asarray(lengths, float)
        ns = np.ones(len(ls)) if n_workers is None else np.asarray(n_workers, float)
        keep = ls != reference_length
        if not keep.any():
            return self
        ref = float(reference_length)
        ls, bs = ls[keep], np.asarray(local_batches, float)[keep]
        peaks = np.asarray(peak_bytes, float)[keep] - self.world_bytes(ns[keep])
        per_sample = (peaks - self.static_bytes) / bs - self.bytes_per_sample  # beyond the reference's
        w = bs / np.maximum(peaks, 1.0)  # relative error of the peak
        per_token, per_token_sq = fit_length_terms(ls, ref, per_sample, w)
        return replace(
            self,
            sequence_length=int(reference_length),
            bytes_per_token=float(per_token),
            bytes_per_token_squared=float(per_token_sq),
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.sequence_length is None:  # a model of one length: its record as before sequence lengths
            for name in ("sequence_length", "bytes_per_token", "bytes_per_token_squared"):
                d.pop(name)
        if not self.sharded:  # DDP's: its record as before sharding
            d.pop("sharded"), d.pop("sharded_gather_bytes"), d.pop("sharded_divided_bytes")
        if not self.ddp_floor_bytes:  # no N >= 2 world measured beyond the line: its record as before
            d.pop("ddp_floor_bytes"), d.pop("ddp_phase_bytes"), d.pop("ddp_phase_bytes_per_sample")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MemoryModel:
        d = dict(d)
        d["probe_local_batches"] = tuple(d["probe_local_batches"])
        d["probe_peak_bytes"] = tuple(d["probe_peak_bytes"])
        return cls(**d)
