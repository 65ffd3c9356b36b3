"""The fitted models as one value, and the one prediction made from them (#43).

A models record (what ``tula fit`` writes) holds a memory model
(:mod:`tula.core.memory_model`), a performance model (:mod:`tula.core.perfmodel`), the run's
costs beyond the profiled step (:class:`RunCosts`), the training set's size, where the profile's
ranks ran and, where measured, the gradient noise scale.  :class:`FittedModels` holds them,
read once (:meth:`FittedModels.from_record`), and :meth:`FittedModels.predict` combines them for
many configurations (N, B, k) at once into :class:`Predictions`: the step, the epoch, the run, its
peak memory and its cost.  The planner, the simulator, the live ranker and the run-cost
comparisons (:func:`tula.core.run_costs.predicted_epoch_s`) all predict through it; what differs
between them is an argument of :meth:`~FittedModels.predict`:

* ``network`` (:class:`Network`): the links the sync crosses, the ranks per node and the compute
  speed.  Default: the fitted one, where the profile's ranks ran (:meth:`Network.fitted`); the
  simulator gives its what-if network;
* ``whole_steps``: an epoch of ``floor(D / B)`` steps, as the runner trains it (default), or Eq.
  4a's ``D / B`` (the planner ranks by it, every sample once);
* ``epochs`` and ``pricing``: the run is ``epochs`` epochs priced as one (the planner); the
  simulator prices one epoch at a time (``epochs=1``), each epoch of a schedule its own;
* ``measured_ratio``: every step and epoch scaled by what a finished run measured (a re-plan).

The run costs' parameter record and the epoch formula (:class:`RunCosts`,
:func:`epoch_time_s`, :func:`run_costs_for`) are defined here so that
:mod:`tula.core.run_costs`, which fits them and compares training runs with the prediction, can
call :meth:`FittedModels.predict` without an import circle; :mod:`tula.core.run_costs` exports
them as before.  Numpy only: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, TypeAdapter, ValidationError

from tula.core.accumulation import fewest_accumulation_steps
from tula.core.config import Config
from tula.core.errors import RecordError
from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import FloatArray, PerfModel, ranks_per_node_of, sync_time_s
from tula.core.pricing import Pricing, SpotPricing
from tula.core.schedules import steps_per_epoch
from tula.core.spec import JobSpec, spec_from_dict
from tula.core.trial import Trial
from tula.core.validation import first_error


# --------------------------------------------------------------------------- the run costs' terms
def epoch_steps(dataset_size: int, global_batch: ArrayLike) -> int | np.ndarray:
    """``S(B)``: :func:`tula.core.schedules.steps_per_epoch` for a scalar or an array of B."""
    big_b = np.asarray(global_batch)
    if big_b.ndim == 0:
        return steps_per_epoch(dataset_size, int(big_b))
    return np.maximum(1, dataset_size // big_b.astype(np.int64))


@dataclass(frozen=True)
class RunCosts:
    """Fitted from the profile's run trials (:func:`tula.core.run_costs.fit_run_costs`).  All
    times in seconds; :mod:`tula.core.run_costs` says what each term is."""

    method: str  # the train.method whose step was measured
    n_workers: tuple[int, ...] = ()  # the cluster sizes of the run trials ...
    step_extra_s: tuple[float, ...] = ()  # ... and the method's extra per step at each
    periodic_s: float = 0.0  # the method's periodic work, per occurrence (the median over the cluster sizes) ...
    periodic_every: int | None = None  # steps between occurrences; None: once per epoch (or none)
    periodic_n_workers: tuple[int, ...] = ()  # ... and per cluster size where measured (older records: none)
    periodic_by_n_s: tuple[float, ...] = ()
    eval_fixed_s: float = 0.0
    eval_sharded_s: float = 0.0  # evaluation at N ranks: eval_fixed_s + eval_sharded_s / N
    epoch_end_s: float = 0.0  # the rest of an epoch's end: reductions, noise scale, checkpoint, metrics
    notes: tuple[str, ...] = field(default=())

    def step_extra_at(self, n_workers: ArrayLike) -> float | np.ndarray:
        """The method's extra per step at ``n_workers`` (scalar or array): the value of the
        nearest measured cluster size (the smaller on a tie); 0 when none was measured."""
        return _nearest(n_workers, self.n_workers, self.step_extra_s, 0.0)

    def periodic_at(self, n_workers: ArrayLike) -> float | np.ndarray:
        """The method's periodic work per occurrence at ``n_workers`` (scalar or array): the
        nearest measured cluster size's, as :meth:`step_extra_at`; ``periodic_s`` where it was
        not measured per cluster size."""
        return _nearest(n_workers, self.periodic_n_workers, self.periodic_by_n_s, self.periodic_s)

    def step_s(self, t_step_s: ArrayLike, n_workers: ArrayLike) -> float | np.ndarray:
        """A step of the method: the plain step ``t_step_s`` plus its extra at ``n_workers``,
        never under 5 % of the plain step (an extra measured negative in noise)."""
        t = np.asarray(t_step_s, float)
        out = np.maximum(t + self.step_extra_at(n_workers), 0.05 * t)
        return float(out) if np.ndim(out) == 0 else out

    def periodic_per_epoch_s(self, n_workers: ArrayLike, steps: ArrayLike) -> float | np.ndarray:
        """The method's periodic work in an epoch of ``steps`` steps at ``n_workers``: its cost
        at that size times its occurrences (once, or every ``periodic_every`` steps)."""
        n = np.asarray(n_workers, float)
        s = np.asarray(steps, float)
        occurrences = np.ones_like(s) if not self.periodic_every else np.ceil(s / self.periodic_every)
        out = self.periodic_at(n) * occurrences
        return float(out) if np.ndim(out) == 0 else out

    def epoch_fixed_s(self, n_workers: ArrayLike, steps: ArrayLike) -> float | np.ndarray:
        """``t_epoch_fixed(N, S)``: an epoch's end and the method's periodic work."""
        n = np.asarray(n_workers, float)
        out = self.eval_fixed_s + self.eval_sharded_s / n + self.epoch_end_s + self.periodic_per_epoch_s(n, steps)
        return float(out) if np.ndim(out) == 0 else out

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> RunCosts:
        d = dict(d)
        for key in ("n_workers", "step_extra_s", "notes", "periodic_n_workers", "periodic_by_n_s"):
            d[key] = tuple(d.get(key) or ())
        return cls(**d)


def _nearest(
    n_workers: ArrayLike, known_n: tuple[int, ...], values: tuple[float, ...], default: float
) -> float | np.ndarray:
    """``values`` at the cluster size in ``known_n`` nearest each of ``n_workers`` (the smaller
    on a tie); ``default`` where ``known_n`` is empty.  Scalar in, scalar out."""
    n = np.asarray(n_workers, float)
    if not known_n:
        out = np.full_like(n, default)
    else:
        nearest = np.abs(n[..., None] - np.asarray(known_n, float)).argmin(axis=-1)
        out = np.asarray(values, float)[nearest]
    return float(out) if out.ndim == 0 else out


def epoch_time_s(
    t_step_s: ArrayLike,
    global_batch: ArrayLike,
    n_workers: ArrayLike,
    dataset_size: int,
    costs: RunCosts | None = None,
    whole_steps: bool = True,
) -> float | np.ndarray:
    """One epoch as the runner trains it: ``S(B)`` steps of ``t_step_s`` plus the method's
    extra per step, plus the epoch's fixed part (:mod:`tula.core.run_costs`).  Scalars or
    arrays; a step never takes less than 5 % of ``t_step_s`` (a negative extra measured in noise).

    ``whole_steps=False``: Eq. 4a's ``D / B`` steps instead, every sample once -- what the
    planner ranks configurations by, so that a batch just above ``D / k`` (whose epoch drops
    almost a batch of samples) does not look faster than it trains."""
    steps = epoch_steps(dataset_size, global_batch) if whole_steps else dataset_size / np.asarray(global_batch, float)
    t = np.asarray(t_step_s, float)
    if costs is None:
        out = steps * t
    else:
        out = steps * costs.step_s(t, n_workers) + costs.epoch_fixed_s(n_workers, steps)
    return float(out) if np.ndim(out) == 0 else out


def describe(costs: RunCosts | None, method: str) -> str:
    """One sentence on what the plan's epoch times include for ``method``."""
    if costs is None:
        return (
            f"the profile has no run trial of method {method!r}: its epochs are predicted as plain DDP steps, "
            "without the method's own work or the epoch's evaluation and checkpoint"
        )
    extra = ", ".join(f"{1e3 * x:+.1f} ms at N = {n}" for n, x in zip(costs.n_workers, costs.step_extra_s))
    return (
        f"epochs include method {costs.method!r}'s step ({extra or 'not compared'} per step against the plain step)"
        f" and each epoch's end: evaluation {costs.eval_fixed_s + costs.eval_sharded_s:.3f} s at N = 1, "
        f"checkpoint and records {costs.epoch_end_s:.3f} s"
        + (
            f", the method's periodic work {_periodic_text(costs)}"
            if costs.periodic_s or any(costs.periodic_by_n_s)
            else ""
        )
    )


def _periodic_text(costs: RunCosts) -> str:
    """The method's periodic work per occurrence, per measured cluster size where it was."""
    if not costs.periodic_n_workers:
        return f"{costs.periodic_s:.3f} s"
    return ", ".join(f"{x:.3f} s at N = {n}" for n, x in zip(costs.periodic_n_workers, costs.periodic_by_n_s))


def run_costs_for(models: Mapping[str, Any] | BaseModel, method: str) -> tuple[RunCosts | None, str]:
    """The run costs a plan for ``method`` uses, from a models record (a
    :class:`~tula.core.records.ModelsRecord`, or a dict as read from JSON), and the sentence that
    says what they include.  For a method the profile did not run, the epoch's end (the same
    for every method) is kept and the step is the plain one: the sentence says so."""
    rc = models.get("run_costs") if isinstance(models, Mapping) else getattr(models, "run_costs", None)
    if not rc:
        return None, describe(None, method)
    costs = rc if isinstance(rc, RunCosts) else RunCosts.from_dict(rc)
    if costs.method == method:
        return costs, describe(costs, method)
    loop = replace(costs, method=method, n_workers=(), step_extra_s=(), periodic_s=0.0, periodic_every=None,
                   periodic_n_workers=(), periodic_by_n_s=(), notes=())  # fmt: skip
    return loop, (
        f"method {method!r}'s step was not measured (the profile ran {costs.method!r}): its steps are predicted "
        f"as plain DDP steps; each epoch's evaluation and checkpoint are included"
    )


# --------------------------------------------------------------------------- the network
@dataclass(frozen=True)
class Network:
    """What a step's sync crosses and how fast its workers compute: the collective, the
    inter-node link (``alpha_s`` seconds per hop, ``beta_s_per_byte``), the intra-node one
    (``None``: the inter-node one), the ranks per node R (``None``: the flat model of one host,
    as fitted there: co-location over all N, the flat sync) and the per-worker compute speed
    (2: twice as fast as the profiled worker)."""

    collective: str
    alpha_s: float = 0.0
    beta_s_per_byte: float = 0.0
    alpha_intra_s: float | None = None
    beta_intra_s_per_byte: float | None = None
    ranks_per_node: int | None = None
    compute_speed: float = 1.0

    @classmethod
    def fitted(cls, perf: PerfModel, ranks_per_node: int | None = None) -> Network:
        """The network the performance model was fitted on: its collective and links, with
        ``ranks_per_node`` (:func:`tula.core.perfmodel.ranks_per_node_of` of its trials)."""
        return cls(perf.collective, perf.alpha, perf.beta, perf.alpha_intra, perf.beta_intra, ranks_per_node)


# --------------------------------------------------------------------------- the predictions
@dataclass(frozen=True, eq=False)
class Predictions:
    """What :meth:`FittedModels.predict` predicts, one element per configuration (arrays of the
    inputs' broadcast shape, at least one-dimensional; float64 unless said).

    Attributes
    ----------
    n_workers, global_batch, accumulation_steps : the configurations (N, B, k)
    local_batch : B / N, a rank's share of a step (not rounded: a what-if may split B unevenly)
    micro_batch : B / (N k), the samples of one forward and backward pass
    feasible : bool; the configuration fits in memory (:meth:`FittedModels.fits_in_memory`): its
        accumulated peak within the budget less the safety margin and its micro-batch below the
        batch that ran out of memory while profiling (all True where neither is known)
    peak_mem_bytes : int64; a rank's predicted peak, rounded down (``None`` without a memory model)
    t_compute_s, t_sync_s : one micro-batch's compute on the network's workers, and the sync
    t_step_s : the plain (DDP) step of k micro-batches (Eq. 2)
    method_step_s : the training method's step: ``t_step_s`` and its measured extra
    steps_per_epoch : ``floor(D / B)`` (whole steps) or ``D / B``
    epoch_fixed_s : an epoch's end (evaluation, checkpoint, the method's periodic work)
    epoch_time_s : an uninterrupted epoch: its steps of the method and its end
    failure_free_time_s : ``epochs`` uninterrupted epochs
    total_time_s : the expected wall time of those epochs under the pricing (spot: with
        preemptions); the failure-free time without a pricing
    cost : of ``total_time_s`` on N nodes (``None`` without a pricing)
    expected_preemptions : under spot pricing (else ``None``)
    sequence_length : L of each configuration, where one was given (else ``None``)
    """

    n_workers: FloatArray
    global_batch: FloatArray
    accumulation_steps: FloatArray
    local_batch: FloatArray
    micro_batch: FloatArray
    feasible: np.ndarray
    peak_mem_bytes: np.ndarray | None
    t_compute_s: FloatArray
    t_sync_s: FloatArray
    t_step_s: FloatArray
    method_step_s: FloatArray
    steps_per_epoch: FloatArray
    epoch_fixed_s: FloatArray
    epoch_time_s: FloatArray
    failure_free_time_s: FloatArray
    total_time_s: FloatArray
    cost: FloatArray | None = None
    expected_preemptions: FloatArray | None = None
    sequence_length: FloatArray | None = None

    def __len__(self) -> int:
        return int(self.n_workers.size)

    def at(self, i: int) -> dict[str, Any]:
        """Configuration ``i`` (an index into the flattened arrays) as a dict of Python numbers."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = None if value is None else value.reshape(-1)[i].item()
        return out


# --------------------------------------------------------------------------- the models
@dataclass(frozen=True)
class FittedModels:
    """The fitted models of one job, read from a models record (:meth:`from_record`).

    Attributes
    ----------
    perf : the performance model
    memory : the memory model (``None``: the record has none; no peak is predicted)
    dataset_size : D, the training samples
    run_costs : the method's step and each epoch's end (``None``: an older profile, plain steps)
    run_costs_note : the sentence saying what ``run_costs`` include (:func:`run_costs_for`)
    method : the training method the run costs are for
    epochs : the spec's epochs, ``predict``'s default
    max_local_batch : the largest micro-batch that fits one step in any world (``None``: no limit
        known): the schedules' cap; whether a configuration fits is :meth:`fits_in_memory`
    ranks_per_node : the ranks per host the fit predicts with (``None``: one host, the flat model)
    noise_scale : the gradient noise scale B_noise the profile measured (``None``: not measured)
    """

    perf: PerfModel
    memory: MemoryModel | None
    dataset_size: int
    run_costs: RunCosts | None = None
    run_costs_note: str = ""
    method: str = ""
    epochs: int = 1
    max_local_batch: int | None = None
    ranks_per_node: int | None = None
    noise_scale: float | None = None
    memory_budget_bytes: int | None = None  # the budget the memory model's limits are within (None: none)
    memory_safety: float = 0.1  # the share of it kept free
    oom_local_batch: int | None = None  # the smallest local batch that ran out of memory, at the data's own length

    def max_local_batch_at(self, sequence_length: int | None = None) -> int | None:
        """The largest micro-batch that fits in memory at sequence length L (``None``, or a memory
        model of one length: :attr:`max_local_batch`): the memory model's limit at L, and below
        the batch that ran out of memory while profiling where L is at least the data's own length."""
        memory = self.memory
        if sequence_length is None or memory is None or memory.sequence_length is None:
            return self.max_local_batch
        limits = [memory.max_local_batch(self.memory_budget_bytes, self.memory_safety, None, sequence_length)]
        if self.oom_local_batch is not None and sequence_length >= memory.sequence_length:
            limits.append(self.oom_local_batch - 1)
        known = [b for b in limits if b is not None]
        return min(known) if known else None

    def fits_in_memory(
        self,
        local_batch: ArrayLike,
        micro_batch: ArrayLike,
        n_workers: ArrayLike,
        sequence_length: ArrayLike | None = None,
    ) -> np.ndarray:
        """Whether a rank's share ``local_batch``, run as micro-batches of ``micro_batch``, fits in
        memory on ``n_workers`` at ``sequence_length`` (default: the length fitted): the one rule of
        the plan's rows, :meth:`predict`'s ``feasible`` and the accumulation chosen
        (:meth:`accumulation_steps_for`), for DDP and FSDP.  Its accumulated peak
        (:meth:`~tula.core.memory_model.MemoryModel.predict_accumulated_peak_bytes`: the
        micro-batch's step, the rest of the share's data and, with k > 1, the gradients held between
        the micro-batches) with the address-space overhead within the budget less the safety
        margin, and the micro-batch below the batch that ran out of memory while profiling (at a
        length at least the data's own).  Without a memory model or a budget, the micro-batch
        against the largest known (:attr:`max_local_batch`, at each length :meth:`max_local_batch_at`).
        A bool array of the inputs' broadcast shape."""
        local, micro, n = np.broadcast_arrays(*(np.asarray(x, float) for x in (local_batch, micro_batch, n_workers)))
        length = None if sequence_length is None else np.broadcast_to(np.asarray(sequence_length, float), local.shape)
        memory, budget = self.memory, self.memory_budget_bytes
        if memory is None or budget is None:  # nothing to predict against: the largest micro-batch known
            if length is None:
                return np.ones(local.shape, bool) if self.max_local_batch is None else micro <= self.max_local_batch
            limits = {v: self.max_local_batch_at(int(v)) for v in np.unique(length).tolist()}
            cap = np.array([np.inf if limits[v] is None else limits[v] for v in np.ravel(length).tolist()], float)
            return np.asarray(micro <= cap.reshape(local.shape))
        usable = budget * (1.0 - self.memory_safety) - memory.address_space_overhead_bytes
        fits = np.asarray(memory.predict_accumulated_peak_bytes(local, micro, n, length), float) <= usable
        if self.oom_local_batch is not None:  # it binds at the data's own length and above
            binds = np.ones(local.shape, bool)
            if length is not None and memory.sequence_length is not None:
                binds = ~(length < memory.sequence_length)
            fits = fits & (~binds | (micro < self.oom_local_batch))
        return np.asarray(fits)

    def accumulation_steps_for(
        self,
        share: int,
        n_workers: int,
        max_steps: int,
        sequence_length: int | None = None,
        max_micro_batch: int | None = None,
    ) -> int | None:
        """The fewest accumulation steps k <= ``max_steps`` that split a rank's ``share`` into k
        equal micro-batches that fit (:meth:`fits_in_memory` on ``n_workers`` at ``sequence_length``,
        and at most ``max_micro_batch`` where given): the largest micro-batch that fits.  None
        where none does."""

        def fits(micro: int) -> bool:
            if max_micro_batch is not None and micro > max_micro_batch:
                return False
            return bool(self.fits_in_memory(share, micro, n_workers, sequence_length).all())

        return fewest_accumulation_steps(share, max_steps, fits)

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | BaseModel, *, method: str | None = None) -> FittedModels:
        """The fitted models of a models record: a dict as :func:`tula.core.records.load_record`
        returns it, or a :class:`tula.core.records.ModelsRecord`.  ``method``: the training
        method whose run costs to use (default: the spec's ``train.method``).

        A record without a performance model or a training-set size, or with a damaged model,
        is a :class:`~tula.core.errors.RecordError` in one sentence (a bad spec inside: the
        spec's :class:`~tula.core.errors.SpecError`)."""
        if not isinstance(record, (Mapping, BaseModel)):
            raise RecordError(f"fitted models are read from a models record, not {type(record).__name__}")
        if isinstance(record, BaseModel):  # a ModelsRecord: its parts typed (made by hand: some may be absent)

            def part(key: str) -> Any:
                return getattr(record, key, None)

        else:  # as read from JSON: each part checked here

            def part(key: str) -> Any:
                return record.get(key)

        for key, what in (("perf", "performance model"), ("dataset_size", "training-set size")):
            if part(key) is None:
                raise RecordError(f"the models record has no {what} ('{key}'): fit a profile first (tula fit)")
        perf = _checked(PerfModel, part("perf"), "performance model")
        memory = _checked(MemoryModel, part("memory"), "memory model") if part("memory") else None
        given_spec = part("spec")
        spec = given_spec if isinstance(given_spec, JobSpec) else spec_from_dict(given_spec or {})
        method = method or spec.train.method
        try:
            costs, note = run_costs_for(record, method)
        except (TypeError, ValueError) as err:
            raise RecordError(f"the models record's run costs are damaged ({err})") from None
        budget = part("memory_budget_bytes")
        limits = []
        if memory is not None:
            limits.append(memory.max_local_batch(budget, spec.search.memory_safety))
        b_oom = part("oom_local_batch")
        limits.append(None if b_oom is None else int(b_oom) - 1)
        known = [b for b in limits if b is not None]
        noise = part("noise_scale")
        b_noise = (noise or {}).get("b_noise") if isinstance(noise, Mapping) else getattr(noise, "b_noise", None)
        return cls(
            perf=perf,
            memory=memory,
            dataset_size=int(part("dataset_size")),
            run_costs=costs,
            run_costs_note=note,
            method=method,
            epochs=spec.epochs,
            max_local_batch=min(known) if known else None,
            ranks_per_node=ranks_per_node_of(_trials(part("trials") or [])),
            noise_scale=None if b_noise is None else float(b_noise),
            memory_budget_bytes=budget,
            memory_safety=spec.search.memory_safety,
            oom_local_batch=b_oom,
        )

    @property
    def network(self) -> Network:
        """The network the performance model was fitted on (:meth:`Network.fitted`)."""
        return Network.fitted(self.perf, self.ranks_per_node)

    def memory_model(self) -> MemoryModel:
        """The memory model, or a :class:`~tula.core.errors.RecordError` where the record has none."""
        if self.memory is None:
            raise RecordError("the models record has no memory model ('memory'): fit a profile first (tula fit)")
        return self.memory

    # ----------------------------------------------------------------------- the step's parts
    def compute_s(
        self,
        micro_batch: ArrayLike,
        n_workers: ArrayLike,
        network: Network | None = None,
        sequence_length: ArrayLike | None = None,
    ) -> FloatArray:
        """One micro-batch's compute on ``network``'s workers: the fitted compute with
        co-location over min(N, R) ranks (all N on the flat model), divided by the compute speed,
        at ``sequence_length`` (default: the length fitted)."""
        net = self.network if network is None else network
        n = np.asarray(n_workers, float)
        m = n if net.ranks_per_node is None else np.minimum(n, net.ranks_per_node)
        return np.asarray(self.perf.t_compute_s(micro_batch, m, sequence_length) / net.compute_speed, float)

    def sync_s(self, n_workers: ArrayLike, network: Network | None = None) -> FloatArray:
        """The sync of N ranks on ``network`` (:func:`tula.core.perfmodel.sync_time_s`; 0 at N = 1)."""
        net = self.network if network is None else network
        return sync_time_s(
            net.collective,
            n_workers,
            self.perf.grad_bytes,
            net.alpha_s,
            net.beta_s_per_byte,
            net.alpha_intra_s,
            net.beta_intra_s_per_byte,
            1 if net.ranks_per_node is None else net.ranks_per_node,
        )

    # ----------------------------------------------------------------------- the one prediction
    def predict(
        self,
        configs: Sequence[Config] | None = None,
        *,
        n_workers: ArrayLike | None = None,
        global_batch: ArrayLike | None = None,
        accumulation_steps: ArrayLike | None = None,
        local_batch: ArrayLike | None = None,
        network: Network | None = None,
        pricing: Pricing | None = None,
        epochs: float | None = None,
        whole_steps: bool = True,
        measured_ratio: float | None = None,
        sequence_length: ArrayLike | None = None,
    ) -> Predictions:
        """Predict many configurations at once.

        Parameters
        ----------
        configs : the configurations, as :class:`~tula.core.config.Config` values; or, instead,
        n_workers, global_batch, accumulation_steps : arrays (or scalars) of N, B and k
            (k default 1), broadcast together; ``local_batch`` (B / N, fractional in a what-if)
            may be given in place of ``global_batch``
        network : the links, ranks per node and compute speed (default: the fitted network,
            :attr:`network`)
        pricing : a :class:`tula.core.pricing.Pricing`: the run's expected wall time and cost
            (default none: the wall time is the failure-free time, no cost)
        epochs : the epochs of the run priced as one (default: the spec's, :attr:`epochs`)
        whole_steps : an epoch of ``floor(D / B)`` steps as the runner trains it (default), or
            Eq. 4a's ``D / B`` (the planner's)
        measured_ratio : scale every step and epoch by a finished run's measured / predicted
        sequence_length : L of each configuration, broadcast with them (default: the data's own
            length, the one the models were fitted at); the step, the peak and whether it fits
            are predicted at it (:class:`~tula.core.memory_model.MemoryModel`'s and
            :class:`~tula.core.perfmodel.PerfModel`'s terms in B*L and B*L^2)

        Returns
        -------
        Predictions
        """
        n, big_b, k, local = self._inputs(configs, n_workers, global_batch, accumulation_steps, local_batch)
        net = self.network if network is None else network
        micro = local / k
        length = None if sequence_length is None else np.broadcast_to(np.asarray(sequence_length, float), n.shape)
        compute = self.compute_s(micro, n, net, length)
        sync = self.sync_s(n, net)
        t_step = np.asarray(self.perf.step_from_parts_s(compute, sync, n, k), float)
        costs, d = self.run_costs, self.dataset_size
        steps = np.asarray(epoch_steps(d, big_b) if whole_steps else d / big_b, float)
        epoch = np.asarray(epoch_time_s(t_step, big_b, n, d, costs, whole_steps), float)
        fixed = np.asarray(costs.epoch_fixed_s(n, steps), float) if costs else np.zeros_like(epoch)
        method_step = np.asarray(costs.step_s(t_step, n), float) if costs else t_step
        if measured_ratio:
            t_step, method_step = t_step * measured_ratio, method_step * measured_ratio
            epoch, fixed = epoch * measured_ratio, fixed * measured_ratio
        peak = None
        if self.memory is not None:
            peak = np.trunc(np.asarray(self.memory.predict_accumulated_peak_bytes(local, micro, n, length), float))
        feasible = self.fits_in_memory(local, micro, n, length)
        free = (self.epochs if epochs is None else epochs) * epoch
        total, cost, lost = free, None, None
        if pricing is not None:
            total = np.asarray(pricing.expected_time_s(free, n, epoch), np.float64)
            peak_bytes: Any = peak  # None without a memory model: a pricing by memory then says so
            cost = np.asarray(pricing.cost(total, n, peak_bytes), np.float64)
            if isinstance(pricing, SpotPricing):
                lost = np.asarray(pricing.expected_preemptions(free, n, epoch), np.float64)
        return Predictions(
            n_workers=_1d(n),
            global_batch=_1d(big_b),
            accumulation_steps=_1d(k),
            local_batch=_1d(local),
            micro_batch=_1d(micro),
            feasible=np.atleast_1d(feasible),
            peak_mem_bytes=None if peak is None else np.atleast_1d(peak).astype(np.int64),
            t_compute_s=_1d(compute),
            t_sync_s=_1d(np.broadcast_to(sync, np.shape(n))),
            t_step_s=_1d(t_step),
            method_step_s=_1d(method_step),
            steps_per_epoch=_1d(steps),
            epoch_fixed_s=_1d(fixed),
            epoch_time_s=_1d(epoch),
            failure_free_time_s=_1d(free),
            total_time_s=_1d(total),
            cost=None if cost is None else _1d(cost),
            expected_preemptions=None if lost is None else _1d(lost),
            sequence_length=None if length is None else _1d(length),
        )

    @staticmethod
    def _inputs(
        configs: Sequence[Config] | None,
        n_workers: ArrayLike | None,
        global_batch: ArrayLike | None,
        accumulation_steps: ArrayLike | None,
        local_batch: ArrayLike | None,
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(N, B, k, B / N) as float arrays of one shape, from ``configs`` or the arrays."""
        if configs is not None:
            if any(x is not None for x in (n_workers, global_batch, accumulation_steps, local_batch)):
                raise ValueError("give the configurations or their arrays, not both")
            n_workers = [c.n_workers for c in configs]
            global_batch = [c.global_batch for c in configs]
            accumulation_steps = [c.accumulation_steps for c in configs]
        if n_workers is None or (global_batch is None) == (local_batch is None):
            raise ValueError("give n_workers and one of global_batch and local_batch")
        k_in = 1 if accumulation_steps is None else accumulation_steps
        batch_in = global_batch if local_batch is None else local_batch
        assert batch_in is not None  # one of the two, checked above
        given: tuple[ArrayLike, ArrayLike, ArrayLike] = (n_workers, batch_in, k_in)
        if configs is None and all(np.ndim(x) == 0 for x in given):
            # one configuration given as scalars: numpy's scalar arithmetic, as its callers computed it before
            # (a power of 0-d values may differ from the vectorised one in the last bit)
            n, batch, k = (np.asarray(x, float) for x in given)
        else:
            n, batch, k = np.broadcast_arrays(*(np.atleast_1d(np.asarray(x, float)) for x in given))
        if local_batch is None:
            return n, batch, k, batch / n
        return n, batch * n, k, batch


def _1d(x: ArrayLike) -> FloatArray:
    """``x`` as a float64 array of at least one dimension (a copy: the predictions own their arrays)."""
    return np.array(x, np.float64, ndmin=1)


_ADAPTERS: dict[str, TypeAdapter[Any]] = {}


def _adapter(kind: type[PerfModel] | type[MemoryModel] | type[Trial]) -> TypeAdapter[Any]:
    """The pydantic validator of ``kind``'s fields (made once)."""
    if kind.__name__ not in _ADAPTERS:
        _ADAPTERS[kind.__name__] = TypeAdapter(kind)
    return _ADAPTERS[kind.__name__]


def _trials(trials: Sequence[Trial | Mapping[str, Any]]) -> list[Trial]:
    """A models record's trials, typed (a record as read from JSON holds them as dicts)."""
    adapter = _adapter(Trial)
    try:
        return [t if isinstance(t, Trial) else adapter.validate_python(t, strict=False) for t in trials]
    except ValidationError as err:
        e = first_error(err)
        raise RecordError(f"the models record's trials are damaged (field {e.where()!r} {e.message})") from None


def _checked(kind: type[PerfModel] | type[MemoryModel], value: Any, what: str) -> Any:
    """``value`` as ``kind`` (an object of ``kind`` as it is; a dict by ``kind.from_dict``), or a
    :class:`~tula.core.errors.RecordError` saying which field of the record's ``what`` is damaged."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise RecordError(f"the models record's {what} is damaged (a mapping of its fields is needed)")
    try:
        _adapter(kind).validate_python(dict(value), strict=False)
        return kind.from_dict(dict(value))
    except ValidationError as err:
        e = first_error(err)
        msg = "is missing" if e.missing else e.message
        raise RecordError(f"the models record's {what} is damaged (field {e.where()!r} {msg})") from None
    except (TypeError, KeyError, ValueError) as err:
        raise RecordError(f"the models record's {what} is damaged ({err})") from None
