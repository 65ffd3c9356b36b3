"""What-if simulation: training time and cost on clusters far larger than the one profiled.

From a fitted models record (what ``tula fit`` writes) the simulator predicts step time,
epoch time, total time and cost for worker counts N far beyond the profiled ones, for
three collectives, a constant global batch or a batch schedule of :mod:`tula.core.schedules`
(workers growing with the batch), on the fitted network or a given one.  Pure numpy: no
torch, no profiling, no I/O.

The step model (the fitted one, Eq. 2; :class:`~tula.core.perfmodel.PerfModel`)
--------------------------------------------------------------------------
With local batch ``b = B / N``, gradient bytes ``S`` (the model's gradients per step), R
ranks per node on H = ceil(N / R) nodes, the inter-node link's bandwidth ``BW`` (bytes per
second) and latency ``a`` (seconds per message hop) and the intra-node link's ``BWi`` and
``ai``::

    t_compute(b, N) = ((c0 + c1 b) (1 + kappa (m - 1)) + kappa0 (m - 1)) / speed,  m = min(N, R)
    t_sync(N)       = the alpha-beta cost of the collective on that topology  (0 when N = 1)
    t_step          = ((t_compute (1 + rho [N > 1]))^gamma + t_sync^gamma)^(1 / gamma)

and the alpha-beta costs of the three collectives (:func:`tula.core.perfmodel.sync_time_s`, the
same rule the fit uses)::

    ring all-reduce   H = 1:  t_sync = 2 (N - 1) (ai + S / N / BWi)
                      H > 1:  t_sync = 2 (N - 1) (max(ai, a) + S / N / min(BWi, BW))
                      (reduce-scatter then all-gather: 2 (N - 1) synchronous steps, each
                      moving S / N on every edge at once; across nodes the slowest edge binds)
    parameter server  H = 1:  t_sync = 2 ai + 2 N S / BWi
                      H > 1:  t_sync = 2 a + 2 S ((N - R) / BW + R / BWi)
                      (one server, counted at the server's links: N gradients in, N models
                      out; sharding the server over k nodes divides the bytes term by k)
    tree              t_sync = 2 ceil(log2 R) ai + 2 ceil(log2 H) a + 2 S / (the slower link used)
                      (hierarchical: reduce inside the node, a binary tree across nodes,
                      broadcast back, pipelined: each link carries the bytes twice whatever
                      the depth, the depth shows in the latency; the unpipelined tree,
                      2 log2 N (a + S / BW), is slower)

With R = 1 (a node per worker) these are the flat formulas: ring ``2 (N - 1) a + 2 (N - 1) /
N * S / BW``, tree ``2 ceil(log2 N) a + 2 S / BW``, parameter server ``2 a + 2 N S / BW``
(when the intra-node link is the inter-node one: one worker shares the server's node); with
the intra-node link the inter-node one they still are for any R, but for the tree's hops
when R is not a power of two (2 (ceil(log2 R) + ceil(log2 H)), up to two more).

``speed`` is the per-worker compute factor (``--compute-speed``: 2 is a worker twice as
fast).  ``R`` is how many workers share a node (``ranks_per_node``; default: the most
ranks one host held when the profile's worlds spanned several hosts, else the largest N
profiled): the fitted co-location slowdown ``kappa, kappa0`` is applied to at most R
workers, the others being taken to run on nodes of their own -- co-location on one host is
not extrapolated to N = 1024 -- and the sync crosses nodes once N > R.  Give
``ranks_per_node=1`` for a cluster of one worker per node.

The network: where the fit gives a communication term, the effective network is read off
it -- ``BW = 1 / beta``, ``a = alpha`` and, when the profile had ranks sharing a host alone,
``BWi = 1 / beta_intra``, ``ai = alpha_intra`` -- so that with no override the simulator
gives exactly the fitted model's step times at the profiled worlds (and any N <= R) for the
fitted collective; the other collectives run on that same network.  ``bandwidth`` and
``latency`` replace the inter-node link, ``intra_bandwidth`` and ``intra_latency`` the
intra-node one; an intra-node term neither fitted nor given is the inter-node one.  A
parameter the profile could not identify (alpha needs two cluster sizes above 1, beta one;
alpha_intra two sizes of world on one host, beta_intra one) was frozen by the fit: the
simulator says so and uses 0 latency / free bandwidth / the inter-node link unless given
one.  A profile of one host fits the flat model: its link is that host's loopback (a note
says so), taken for both links unless given others.

Time and cost: an epoch is ``floor(D / B)`` model updates (the runner's count,
:func:`tula.core.schedules.steps_per_epoch`; Eq. 4a's ``D / B`` counts the partial last batch
too), the total E epochs; the expected wall time and the cost come from the spec's pricing
(:mod:`tula.core.pricing`; spot pricing adds the expected preemption losses per epoch, each epoch
ending in a checkpoint).  A schedule is simulated epoch by epoch through
:func:`tula.core.schedules.next_config`, with the workers rule N = clip(ceil(B /
batch_per_worker), min, max); the schedules that follow the training loss or the gradient
noise scale (``loss_ratio``, ``adaptive``) replay a training run's measured per-epoch values.
A transformer's step (#44): by default the rows are of the models record's own step (the data's
own sequence length; the spec's parallelism and checkpointing, ``auto``'s plain variant); a
simulator at another sequence length L predicts with the fitted per-token terms (refused where
the models were fitted at one length, or L is above the positional limit the spec gives:
:func:`check_sequence_length`), and one of another run variant (DDP or FSDP, checkpointing on
or off) from the models with the fitted effect applied, as the planner applies it (refused where
the profile did not measure it: :func:`variant_record`); a constant batch's rows then carry
tokens per second, B * L / t_step.  FSDP's step from that effect has no network of its own: its
all-gathers and reduce-scatter are the sync the profile's sharded trials measured at one N, scaled
over N as the fitted collective's bytes per link (:meth:`tula.core.effects.ShardingEffect.perf`), so
it is simulated on the fitted collective alone, said as that sync (:func:`sharded_sync_words`), and a
bandwidth, latency or other collective given for it is refused in one sentence.
Not modelled: the seconds a resize takes (a new world when N changes: 0.1 s with the local
launcher here, 2 s before its ranks forked from a fork server, see docs/benchmarks.md; a new
batch on the same workers stays in its world, milliseconds), stragglers, and network contention beyond the alpha-beta model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Any, ClassVar, overload

import numpy as np
from numpy.typing import ArrayLike

from tula.core.effects import ShardingEffect
from tula.core.errors import OptionError, TulaError
from tula.core.fitted import FittedModels, Network, Predictions
from tula.core.job_rules import fsdp_obstacle
from tula.core.live_plan import DEFAULT_THRESHOLD, Ranker, WorkerPlan
from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import (
    COLLECTIVES,
    NOTE_NO_LONE_HOST,
    NOTE_NO_SHARED_HOST,
    FloatArray,
    PerfModel,
)
from tula.core.plan import epochs_to_accuracy, noise_assumed
from tula.core.pricing import Pricing, SpotPricing, make_pricing
from tula.core.records import EpochRecord, ModelsRecord, NoiseScale, Placement, as_epoch, parse_record
from tula.core.run_costs import RunCosts, epoch_time_s
from tula.core.schedules import (
    SCHEDULE_NAMES,
    Caps,
    Decision,
    FinishedEpoch,
    ScheduleInfo,
    ScheduleState,
    initial_state,
    next_config,
    schedule_info,
    steps_per_epoch,
)
from tula.core.spec import JobSpec, parse_bandwidth, parse_duration, reference_sequence_length, spec_from_dict
from tula.core.variants import RunVariant, variant_models

#: a training run's epochs to replay: typed, or as read from JSON (metrics.jsonl lines, train.json's history)
Epochs = Sequence[EpochRecord | Mapping[str, Any]]

#: the default worker counts: 1, 2, 4, ..., 1024
DEFAULT_WORKERS: tuple[int, ...] = tuple(2**k for k in range(11))


def parse_collectives(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"ring,tree"`` or a list into collective names (``None``: all three)."""
    if value is None:
        return COLLECTIVES
    names = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    aliases = {"ps": "parameter_server", "parameter-server": "parameter_server", "allreduce": "ring"}
    names = [aliases.get(n, n) for n in names]
    bad = [n for n in names if n not in COLLECTIVES]
    if bad or not names:
        raise TulaError(
            f"unknown collective {bad[0] if bad else value!r}; use one or more of "
            f"{', '.join(COLLECTIVES)} (comma-separated)"
        )
    return tuple(dict.fromkeys(names))


def parse_workers(value: str | Sequence[int] | None) -> tuple[int, ...]:
    """``"1,2,4,64"`` or a list into worker counts (``None``: 1, 2, 4, ..., 1024)."""
    if value is None:
        return DEFAULT_WORKERS
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for v in items:
        try:
            n = int(str(v).strip())
        except ValueError:
            raise TulaError(
                f"worker count {str(v).strip()!r} is not a whole number; give counts such as 1,2,4,64"
            ) from None
        if n < 1:
            raise TulaError(f"worker count {n} is below 1; every cluster has at least one worker")
        out.append(n)
    if not out:
        raise TulaError("no worker count given; give counts such as 1,2,4,64")
    return tuple(sorted(set(out)))


def parse_sequence_lengths(value: str | Sequence[int] | None) -> tuple[int, ...]:
    """``"64,128"`` or a list into sequence lengths, ascending, each once (``None``: none asked, ``()``)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for v in items:
        try:
            length = int(str(v).strip())
        except ValueError:
            raise TulaError(
                f"sequence length {str(v).strip()!r} is not a whole number; give lengths such as 64,128"
            ) from None
        if length < 1:
            raise TulaError(f"sequence length {length} is below 1; give lengths such as 64,128")
        out.append(length)
    if not out:
        raise TulaError("no sequence length given; give lengths such as 64,128")
    return tuple(sorted(set(out)))


def parse_schedule(text: str) -> tuple[str, dict[str, Any]]:
    """``"geometric:factor=2,delay=5"`` into (kind, settings).  Settings are the schedule's
    parameters and ``every_epochs``, ``max_batch``, ``lr_rule``."""
    kind, _, rest = text.partition(":")
    kind = kind.strip()
    if kind not in SCHEDULE_NAMES:
        raise TulaError(f"unknown batch schedule {kind!r}; use one of {', '.join(SCHEDULE_NAMES)}")
    settings: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq:
            raise TulaError(f"schedule setting {item!r} is not KEY=VALUE (e.g. geometric:factor=2,delay=5)")
        key, val = key.strip(), val.strip()
        if key == "lr_rule":
            settings[key] = val
            continue
        try:
            num = float(val)
        except ValueError:
            raise TulaError(f"schedule setting {key}={val!r} is not a number") from None
        settings[key] = int(num) if num.is_integer() and key != "factor" else num
    return kind, settings


# ---------------------------------------------------------------------------- what a simulation gives
@dataclass(frozen=True)
class ConstantRow:
    """One configuration of a constant global batch on one collective, simulated: a row of
    ``tula simulate``'s table.  Where N is above B (a local batch below one sample) it holds a
    ``note`` and no times.

    Attributes
    ----------
    collective, n_workers, global_batch : the configuration (the collective, N, B)
    local_batch : B / N (not rounded)
    updates : model updates over the simulated epochs
    note : why the row has no times, or that the local batch exceeds memory ('' for none)
    t_step_s, t_compute_s, t_sync_s : a step, its compute and its sync (``None``: not simulated)
    epoch_time_s : an uninterrupted epoch
    total_time_s : the expected wall time of the epochs under the pricing (spot: with preemptions)
    failure_free_time_s : the epochs without preemptions (``None``: not simulated)
    cost : of ``total_time_s``
    fits_memory : the local batch fits in memory
    epochs_to_accuracy, time_to_accuracy_s, cost_to_accuracy : with a gradient noise scale, the
        epochs, time and cost to the accuracy the spec's epochs reach at ``train.base_batch``
        (``None``: no noise scale, or no times)
    sequence_length, parallelism, checkpointing : the step the row is of, as a plan's row says it
        (L; ddp or fsdp; the blocks checkpointed), where the models record has them
        (:attr:`Simulator.sequence_length`; ``None``: it has not, e.g. a CNN's)
    tokens_per_s : where L is known, the tokens a step trains per second, B * L / ``t_step_s``
    """

    collective: str
    n_workers: int
    global_batch: int
    local_batch: float
    updates: int
    note: str = ""
    t_step_s: float | None = None
    t_compute_s: float | None = None
    t_sync_s: float | None = None
    epoch_time_s: float | None = None
    total_time_s: float | None = None
    failure_free_time_s: float | None = None
    cost: float | None = None
    fits_memory: bool | None = None
    epochs_to_accuracy: float | None = None
    time_to_accuracy_s: float | None = None
    cost_to_accuracy: float | None = None
    sequence_length: int | None = None
    parallelism: str | None = None
    checkpointing: bool | None = None
    tokens_per_s: float | None = None

    #: the figures a row without them leaves out of its JSON (the others are ``null`` there)
    _OMITTED_UNSET: ClassVar[frozenset[str]] = frozenset(
        {
            "failure_free_time_s",
            "epochs_to_accuracy",
            "time_to_accuracy_s",
            "cost_to_accuracy",
            "sequence_length",
            "parallelism",
            "checkpointing",
            "tokens_per_s",
        }
    )

    def to_json_dict(self) -> dict[str, Any]:
        """The row as JSON values (the figures it does not have named in ``_OMITTED_UNSET`` left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in self._OMITTED_UNSET}


@dataclass(frozen=True)
class ScheduledEpoch:
    """The configuration of one epoch of a simulated schedule, as its rule decided it
    (:meth:`Simulator.schedule_epochs`): the epoch (from 1), (B, N, k), B / N, B / (N k), its
    model updates and the decision's reason."""

    epoch: int
    global_batch: int
    n_workers: int
    local_batch: int
    accumulation_steps: int
    micro_batch: int
    steps: int
    reason: str


@dataclass(frozen=True)
class SimulatedEpoch(ScheduledEpoch):
    """A scheduled epoch priced alone on one collective: its mean step, its uninterrupted time,
    its expected wall time under the pricing and its cost."""

    t_step_s: float
    epoch_time_s: float
    expected_time_s: float
    cost: float


@dataclass(frozen=True)
class ScheduleRow:
    """A batch schedule simulated on one collective: its totals and each epoch.

    Attributes
    ----------
    schedule : its label (what ``--schedule`` was given)
    collective : the collective
    updates : model updates over the epochs
    max_batch, max_workers, max_accumulation_steps : the largest B, N and k it reached
    resizes : epochs whose N differs from the one before (a new world each)
    t_step_s : the mean step (the epochs' uninterrupted time over their updates)
    epoch_time_s : the mean uninterrupted epoch
    failure_free_time_s : the epochs without preemptions
    total_time_s : the expected wall time under the pricing
    cost : of the epochs
    epochs : each epoch's configuration, time and cost
    """

    schedule: str
    collective: str
    updates: int
    max_batch: int
    max_workers: int
    max_accumulation_steps: int
    resizes: int
    t_step_s: float
    epoch_time_s: float
    failure_free_time_s: float
    total_time_s: float
    cost: float
    epochs: tuple[SimulatedEpoch, ...]

    def to_json_dict(self) -> dict[str, Any]:
        """The row as JSON values, its epochs a list."""
        return {**asdict(self), "epochs": [asdict(e) for e in self.epochs]}


#: a row of ``tula simulate``: a constant batch's configuration or a schedule
SimulatedRow = ConstantRow | ScheduleRow


@dataclass(frozen=True)
class MeasuredPoint:
    """A profiled configuration at the simulated batch: N and the total time of the epochs at its
    measured step time."""

    n_workers: int
    total_time_s: float

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Simulator:
    """The fitted performance model on a network and compute speed of one's choosing.

    Build one with :func:`simulator_from_models`; ``bandwidth_bytes_per_s`` ``inf`` and
    ``latency_s`` 0 are a network that costs nothing.  ``bandwidth_bytes_per_s`` and
    ``latency_s`` are the inter-node link, ``intra_bandwidth_bytes_per_s`` and
    ``intra_latency_s`` the intra-node one (``None``: the inter-node one).  ``sequence_length``,
    ``parallelism`` and ``checkpointing``: the step its models are of (:func:`simulated_step`),
    which each constant-batch row carries (``None``: the models record does not say); a step at
    ``sequence_length`` is predicted at it (the fitted per-token terms; :meth:`predict`).
    ``record``: the models record of that step (a run variant's: :func:`variant_record`);
    ``profiled_step``: whether the profile's plain trials ran this very step (the data's own
    length, the record's own variant), so that their measured times may be shown beside it."""

    perf: PerfModel
    dataset_size: int
    epochs: int
    pricing: Pricing
    memory: MemoryModel
    max_local_batch: int | None
    bandwidth_bytes_per_s: float
    latency_s: float
    compute_speed: float = 1.0
    ranks_per_node: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)
    intra_bandwidth_bytes_per_s: float | None = None
    intra_latency_s: float | None = None
    run_costs: RunCosts | None = None  # the method's step and each epoch's end (tula.core.run_costs)
    sequence_length: int | None = None  # L of the data the models were fitted at
    parallelism: str | None = None  # ddp or fsdp
    checkpointing: bool | None = None  # the blocks' activations recomputed
    memory_budget_bytes: int | None = None  # the budget the limit at another length is within (None: none)
    memory_safety: float = 0.1  # the share of it kept free
    oom_local_batch: int | None = None  # the smallest local batch that ran out of memory, at the data's own length
    record: ModelsRecord | None = field(default=None, compare=False, repr=False)
    profiled_step: bool = True
    sharded_min_workers: int = 1  # FSDP's effect applied to a DDP profile: fitted at N >= 2 (the plan's sizes)
    # FSDP's fitted effect whose sync this step's is (ShardingEffect.perf: the measured sync scaled over N as the
    # fitted collective's bytes per link, no network's bandwidth or latency); None: the sync is the network's
    sharding: ShardingEffect | None = None

    # ---------------------------------------------------------------- the step
    @cached_property
    def fitted(self) -> FittedModels:
        """The fitted models this simulator predicts from (:class:`tula.core.fitted.FittedModels`),
        always on its own network (:meth:`network`)."""
        return FittedModels(
            perf=self.perf,
            memory=self.memory,
            dataset_size=self.dataset_size,
            run_costs=self.run_costs,
            epochs=self.epochs,
            max_local_batch=self.max_local_batch,
            memory_budget_bytes=self.memory_budget_bytes,
            memory_safety=self.memory_safety,
            oom_local_batch=self.oom_local_batch,
        )

    def network(self, collective: str | None = None) -> Network:
        """This simulator's network for ``collective`` (default: the fitted one): its links, its
        ranks per node and its compute speed."""
        return Network(
            collective=self.perf.collective if collective is None else collective,
            alpha_s=self.latency_s,
            beta_s_per_byte=_per_byte(self.bandwidth_bytes_per_s),
            alpha_intra_s=self.intra_latency_s,
            beta_intra_s_per_byte=(
                None if self.intra_bandwidth_bytes_per_s is None else _per_byte(self.intra_bandwidth_bytes_per_s)
            ),
            ranks_per_node=self.ranks_per_node,
            compute_speed=self.compute_speed,
        )

    def predict(
        self,
        collective: str | None = None,
        *,
        n_workers: ArrayLike,
        global_batch: ArrayLike | None = None,
        local_batch: ArrayLike | None = None,
        accumulation_steps: ArrayLike = 1,
    ) -> Predictions:
        """:meth:`tula.core.fitted.FittedModels.predict` on this network with ``collective``
        (default: the fitted one): epochs of ``floor(D / B)`` steps, each priced alone
        (``epochs=1``: the simulator adds its epochs up, a schedule's each at its own configuration),
        at :attr:`sequence_length` where the step has one."""
        return self.fitted.predict(
            n_workers=n_workers,
            global_batch=global_batch,
            local_batch=local_batch,
            accumulation_steps=accumulation_steps,
            network=self.network(collective),
            pricing=self.pricing,
            epochs=1,
            sequence_length=self.sequence_length,
        )

    @overload
    def t_compute_s(self, local_batch: float, n_workers: float) -> float: ...
    @overload
    def t_compute_s(self, local_batch: ArrayLike, n_workers: ArrayLike) -> FloatArray: ...
    def t_compute_s(self, local_batch: ArrayLike, n_workers: ArrayLike) -> float | FloatArray:
        """Per-worker compute: the fitted compute with co-location counted up to R workers,
        divided by the compute speed (:meth:`tula.core.fitted.FittedModels.compute_s`)."""
        out = self.fitted.compute_s(local_batch, n_workers, self.network(), self.sequence_length)
        return float(out) if out.ndim == 0 else out

    def t_sync_s(self, collective: str, n_workers: ArrayLike) -> FloatArray:
        """Alpha-beta synchronisation time of ``collective`` for N workers on nodes of
        ``ranks_per_node`` on this network (0 when N = 1)."""
        return self.fitted.sync_s(n_workers, self.network(collective))

    def epoch_s(self, global_batch: int, n_workers: int, accumulation_steps: int = 1) -> float:
        """One epoch at (B, N, k) with the fitted collective on this network: what a simulated
        ``train.workers: {rule: plan}`` and goodput schedule rank by."""
        p = self.predict(n_workers=n_workers, global_batch=global_batch, accumulation_steps=accumulation_steps)
        return float(p.epoch_time_s[0])

    @overload
    def t_step_s(
        self, collective: str, local_batch: float, n_workers: float, accumulation_steps: float = 1
    ) -> float: ...
    @overload
    def t_step_s(
        self, collective: str, local_batch: ArrayLike, n_workers: ArrayLike, accumulation_steps: ArrayLike = 1
    ) -> FloatArray: ...
    def t_step_s(
        self, collective: str, local_batch: ArrayLike, n_workers: ArrayLike, accumulation_steps: ArrayLike = 1
    ) -> float | FloatArray:
        """A step whose share ``local_batch`` runs as ``accumulation_steps`` micro-batches
        (:meth:`tula.core.perfmodel.PerfModel.step_from_parts_s`) on this network: the
        ``t_step_s`` of :meth:`predict`."""
        t = self.predict(
            collective, n_workers=n_workers, local_batch=local_batch, accumulation_steps=accumulation_steps
        ).t_step_s
        scalar = all(np.ndim(x) == 0 for x in (local_batch, n_workers, accumulation_steps))
        return float(t[0]) if scalar else t

    # ---------------------------------------------------------------- a constant batch
    def constant(
        self, global_batch: int, workers: Sequence[int] = DEFAULT_WORKERS, collectives: Sequence[str] = COLLECTIVES
    ) -> list[ConstantRow]:
        """One row per (collective, N) for a constant global batch; N above the batch (a
        local batch below one sample) gets a row with ``note`` and no times."""
        if global_batch < 1:
            raise TulaError(f"the global batch must be at least 1, not {global_batch}")
        workers = parse_workers(list(workers))
        collectives = parse_collectives(list(collectives))
        per_epoch = steps_per_epoch(self.dataset_size, global_batch)
        rows = []
        for c in collectives:
            for n in workers:
                row = ConstantRow(
                    c,
                    n,
                    int(global_batch),
                    global_batch / n,
                    per_epoch * self.epochs,
                    sequence_length=self.sequence_length,
                    parallelism=self.parallelism,
                    checkpointing=self.checkpointing,
                )
                if n > global_batch:
                    rows.append(replace(row, note="N > B: fewer than one sample per worker"))
                    continue
                if n < self.sharded_min_workers:  # as variant_models plans it: nothing to shard on one rank
                    rows.append(replace(row, note="FSDP on one worker: nothing to shard (the plan weighs N >= 2)"))
                    continue
                # an epoch at (B, N), its wall time and cost alone; one configuration at a time (scalars), as
                # before the one prediction: a vectorised step may differ in its last bit where gamma != 1
                one = self.predict(c, n_workers=n, global_batch=global_batch)
                assert one.cost is not None  # priced
                b, epoch_free, fits = global_batch / n, float(one.epoch_time_s[0]), bool(one.feasible[0])
                t_step = float(one.t_step_s[0])
                if self.sequence_length is not None:  # B * L tokens a step
                    row = replace(row, tokens_per_s=global_batch * self.sequence_length / t_step)
                rows.append(
                    replace(
                        row,
                        note="" if fits else f"local batch {b:g} exceeds memory (at most {self.max_local_batch})",
                        t_step_s=t_step,
                        t_compute_s=float(one.t_compute_s[0]),
                        t_sync_s=float(one.t_sync_s[0]),
                        epoch_time_s=epoch_free,
                        total_time_s=float(one.total_time_s[0]) * self.epochs,
                        failure_free_time_s=epoch_free * self.epochs,
                        cost=float(one.cost[0]) * self.epochs,
                        fits_memory=fits,
                    )
                )
        return rows

    # ---------------------------------------------------------------- a batch schedule
    def schedule(
        self,
        kind: str,
        first_batch: int,
        caps: Caps,
        settings: dict[str, Any] | None = None,
        collectives: Sequence[str] = COLLECTIVES,
        lr_milestones: Sequence[int] = (),
        lr_gamma: float = 0.1,
        history: Epochs | None = None,
        label: str | None = None,
    ) -> list[ScheduleRow]:
        """One result per collective for batch schedule ``kind`` starting at ``first_batch``.

        ``settings``: the schedule's parameters and ``every_epochs``, ``max_batch``,
        ``lr_rule``; ``caps``: the data set, memory and workers rule; ``history``: a training
        run's epoch records whose ``train_loss`` and ``b_simple`` the schedule reads (needed
        by ``loss_ratio`` and ``adaptive``)."""
        info = schedule_info(kind)
        settings = dict(settings or {})
        common = {k: settings.pop(k) for k in ("every_epochs", "max_batch", "lr_rule") if k in settings}
        check_history(kind, info, history, self.epochs)
        state = initial_state(
            kind,
            int(first_batch),
            settings,
            every_epochs=int(common.get("every_epochs", 1)),
            lr_rule=common.get("lr_rule", "keep"),
            max_batch=common.get("max_batch"),
            lr_milestones=lr_milestones,
            lr_gamma=lr_gamma,
        )
        epochs = self.schedule_epochs(state, caps, history)
        return [self._schedule_result(label or kind, c, epochs) for c in parse_collectives(list(collectives))]

    def decide(self, state: ScheduleState, epoch: int, done: Sequence[FinishedEpoch], caps: Caps) -> Decision:
        """The (N, B, k) of epoch ``epoch`` (0-based) after the epochs ``done``: the schedule's
        rule (:func:`tula.core.schedules.next_config`).  The one place a simulated run decides
        its configuration at a batch change."""
        return next_config(state, epoch, done, caps)

    def schedule_epochs(self, state: ScheduleState, caps: Caps, history: Epochs | None) -> list[ScheduledEpoch]:
        """The configuration of each of the simulated run's epochs, decided epoch by epoch
        (:meth:`decide`) from the epochs before it; their ``train_loss`` and ``b_simple`` are
        replayed from ``history`` where it has them."""
        epochs: list[ScheduledEpoch] = []
        done: list[FinishedEpoch] = []
        for e in range(self.epochs):
            d = self.decide(state, e, done, caps)
            state = d.state
            steps = steps_per_epoch(self.dataset_size, d.global_batch)
            epochs.append(
                ScheduledEpoch(
                    epoch=e + 1,
                    global_batch=d.global_batch,
                    n_workers=d.n_workers,
                    local_batch=d.local_batch,
                    accumulation_steps=d.accumulation_steps,
                    micro_batch=d.micro_batch,
                    steps=steps,
                    reason=d.reason,
                )
            )
            past = as_epoch(history[e]) if history and e < len(history) else None  # the training run replayed
            done.append(
                FinishedEpoch(
                    epoch=e + 1,
                    steps=steps,
                    global_batch=d.global_batch,
                    n_workers=d.n_workers,
                    train_loss=getattr(past, "train_loss", None),
                    b_simple=None if past is None else past.b_simple,
                )
            )
        return epochs

    def _schedule_result(self, name: str, collective: str, epochs: list[ScheduledEpoch]) -> ScheduleRow:
        """The simulated run of ``epochs`` (:meth:`schedule_epochs`) with ``collective``: its
        totals and each epoch's time and cost."""
        n = np.array([x.n_workers for x in epochs], float)
        b = np.array([x.local_batch for x in epochs], float)
        k = np.array([x.accumulation_steps for x in epochs], float)
        updates = np.array([x.steps for x in epochs], float)
        p = self.predict(collective, n_workers=n, local_batch=b, accumulation_steps=k)  # each epoch priced alone
        assert p.cost is not None  # priced
        t_step, free, wall, cost = p.t_step_s, p.epoch_time_s, p.total_time_s, p.cost
        per_epoch = tuple(
            SimulatedEpoch(
                **asdict(x),
                t_step_s=float(t_step[i]),
                epoch_time_s=float(free[i]),
                expected_time_s=float(wall[i]),
                cost=float(cost[i]),
            )
            for i, x in enumerate(epochs)
        )
        return ScheduleRow(
            schedule=name,
            collective=collective,
            updates=int(updates.sum()),
            max_batch=int(max(x.global_batch for x in epochs)),
            max_workers=int(n.max()),
            max_accumulation_steps=int(k.max()),
            resizes=int(np.sum(n[1:] != n[:-1])),
            t_step_s=float(np.sum(free) / updates.sum()),
            epoch_time_s=float(np.mean(free)),
            failure_free_time_s=float(np.sum(free)),
            total_time_s=float(np.sum(wall)),
            cost=float(np.sum(cost)),
            epochs=per_epoch,
        )


def check_history(kind: str, info: ScheduleInfo, history: Epochs | None, epochs: int) -> None:
    """Refuse to simulate ``epochs`` epochs of a schedule that follows values measured while
    training (``info``: its :class:`~tula.core.schedules.ScheduleInfo`) without a training
    run's epochs to replay, or with fewer than it reads."""
    reads = [f for f, need in (("train_loss", info.needs_train_loss), ("b_simple", info.needs_b_simple)) if need]
    if not reads:
        return
    if not history:  # the option named as the core knows it; a front end spells it (the CLI: its flag)
        raise OptionError(
            f"batch schedule {kind!r} follows the {' and '.join(reads)} measured while training, "
            "which a performance model cannot predict; give a training run's record to replay ({history})",
            history="history",
        )
    if len(history) < epochs - 1:
        raise TulaError(
            f"the training run to replay has {len(history)} epochs, but {kind!r} needs the "
            f"first {epochs - 1} to simulate {epochs}"
        )


@dataclass
class _NetworkNotes:
    """What the simulator says about the network the fit could not tell, one sentence per
    matter (``None``: nothing to say, or a link given replaced what it was about)."""

    bandwidth: str | None = None
    latency: str | None = None
    loopback: str | None = None
    intra_latency: str | None = None
    intra: str | None = None

    def sentences(self) -> tuple[str, ...]:
        """The notes in this order: bandwidth, latency, loopback, intra-node latency, intra-node link."""
        said = (self.bandwidth, self.latency, self.loopback, self.intra_latency, self.intra)
        return tuple(note for note in said if note is not None)


def _per_byte(bandwidth_bytes_per_s: float) -> float:
    return 0.0 if math.isinf(bandwidth_bytes_per_s) else 1.0 / bandwidth_bytes_per_s


def _network_from_fit(
    perf: PerfModel, placement: Placement
) -> tuple[float, float, float | None, float | None, _NetworkNotes]:
    """(bandwidth, latency, intra-node bandwidth, intra-node latency, the notes about them) read
    off the fitted sync term; an intra-node term ``None``: the inter-node one."""
    notes = _NetworkNotes()
    bw = math.inf if perf.beta <= 0 else 1.0 / perf.beta
    if "beta" in perf.frozen or perf.beta <= 0:
        notes.bandwidth = (
            "the profile gives no bandwidth (no trial with more than one worker, or no sync time "
            "measured): sync bytes are taken as free; give a bandwidth"
        )
    if "alpha" in perf.frozen:
        notes.latency = (
            "the profile cannot tell latency from bandwidth (fewer than two cluster sizes above "
            "one): latency taken as 0; give a latency"
        )
    if placement.n_hosts == 1 and (placement.max_workers or 0) > 1:
        notes.loopback = (
            f"the fitted network is {placement.max_workers} ranks sharing one host "
            "(loopback), not a network between nodes"
        )
    ibw = None if perf.beta_intra is None else (math.inf if perf.beta_intra <= 0 else 1.0 / perf.beta_intra)
    if "alpha_intra" in perf.frozen and "beta_intra" not in perf.frozen:
        notes.intra_latency = (
            "the profile cannot tell intra-node latency from bandwidth (fewer than two sizes of "
            "world on one host alone): intra-node latency taken as 0; give an intra-node "
            "latency"
        )
    return bw, perf.alpha, ibw, perf.alpha_intra, notes


def _bandwidth(value: Any, intra: bool) -> float:
    try:
        return parse_bandwidth(value)
    except ValueError as err:
        raise TulaError(
            str(err).replace(
                " is not a bandwidth", " is not an intra-node bandwidth" if intra else " is not a bandwidth", 1
            )
        ) from None


def _latency(value: Any, intra: bool) -> float:
    try:
        seconds = parse_duration(value)
        if seconds is None:
            raise ValueError("no latency")
        return seconds
    except ValueError:
        raise TulaError(
            f"{str(value)[:40]!r} is not {'an intra-node' if intra else 'a'} latency; use seconds or a "
            "number with a unit such as '5us', '50us' or '0.1ms'"
        ) from None


def simulator_from_models(
    models: dict | ModelsRecord,
    bandwidth: Any = None,
    latency: Any = None,
    compute_speed: float = 1.0,
    ranks_per_node: int | None = None,
    epochs: int | None = None,
    pricing: dict | None = None,
    intra_bandwidth: Any = None,
    intra_latency: Any = None,
    *,
    sequence_length: int | None = None,
    parallelism: str | None = None,
    checkpointing: str | bool | None = None,
) -> Simulator:
    """A :class:`Simulator` from a models record.

    Parameters
    ----------
    models : a models record, typed or as read from JSON (checked here: another record kind is a
        one-sentence error)
    bandwidth : the inter-node link's bytes per second or a string such as ``"100Gbit/s"``/``"10GB/s"``
        (default: 1 / beta of the fit)
    latency : the inter-node link's seconds per hop or a string such as ``"5us"`` (default: alpha of the fit)
    compute_speed : per-worker compute speed relative to the profiled worker (> 0)
    ranks_per_node : workers that share a node: the fitted co-location slowdown applies to at
        most that many, and the sync crosses nodes beyond them (default: the most ranks one
        host held when the profile's worlds spanned several hosts, else the largest N profiled)
    epochs : default: the spec's
    pricing : fields of the spec's pricing to replace
    intra_bandwidth, intra_latency : the intra-node link, as ``bandwidth`` and ``latency``
        (default: the fitted beta_intra / alpha_intra, else the inter-node link)
    sequence_length : L to predict at, with the fitted per-token terms (default: the data's own);
        refused where the models were fitted at one length, or L is above the model's positional
        limit the spec gives (:func:`check_sequence_length`)
    parallelism, checkpointing : the run variant to predict (``ddp`` or ``fsdp``; ``on``/``off`` or
        a bool; default: the record's own), the fitted effect applied as the planner does;
        refused where the profile did not measure it (:func:`variant_record`); FSDP's step from its
        fitted effect refuses the links (``bandwidth``, ``latency``, ``intra_bandwidth``,
        ``intra_latency``): its sync is the profile's measured one, not a network's
    """
    original = _models_record(models)
    rec = variant_record(original, parallelism, checkpointing)
    # FSDP's fitted effect applied to an auto profile's DDP models (variant_models): its sync is that effect's
    sharded = original.spec.train.parallelism == "auto" and rec.spec.train.parallelism == "fsdp"
    sharding = original.sharding if sharded else None
    if sharding is not None:
        links = {"bandwidth": bandwidth, "latency": latency, "intra_bandwidth": intra_bandwidth}
        _refuse_links_for_sharded_sync(rec.perf.collective, {**links, "intra_latency": intra_latency})
    own_length = simulated_step(original).sequence_length
    if sequence_length is not None:
        check_sequence_length(rec, sequence_length)
    spec: JobSpec = rec.spec
    if pricing:
        d = spec.to_dict()
        d["pricing"] = {**d["pricing"], **pricing}
        spec = spec_from_dict(d)
    fitted = FittedModels.from_record(rec, method=spec.train.method)
    perf, mem = fitted.perf, fitted.memory_model()
    placement = rec.placement or Placement()
    bw, lat, ibw, ilat, notes = _network(perf, placement, bandwidth, latency, intra_bandwidth, intra_latency)
    if not (isinstance(compute_speed, (int, float)) and math.isfinite(compute_speed) and compute_speed > 0):
        raise TulaError(
            f"the compute speed must be a positive factor (2: workers twice as fast), not {compute_speed!r}"
        )
    r = _ranks_per_node(rec, fitted.ranks_per_node, ranks_per_node)
    _note_intra_link(notes, perf, ibw, ilat, r)
    if sharding is not None:  # no link of the network the sync runs on: nothing to say of one
        notes.bandwidth = notes.latency = notes.intra_latency = notes.intra = None
        if notes.loopback is not None:
            notes.loopback = (
                "FSDP's all-gathers and reduce-scatter were measured with ranks sharing one host (loopback), not "
                "over a network between nodes"
            )
    if epochs is not None and epochs < 1:
        raise TulaError(f"epochs must be at least 1, not {epochs}")
    max_local_batch = fitted.max_local_batch  # within the budget, below the batch that ran out of memory
    step = simulated_step(rec, spec)
    if sequence_length is not None and sequence_length != step.sequence_length:
        max_local_batch = fitted.max_local_batch_at(sequence_length)
        step = replace(step, sequence_length=sequence_length, notes=(*step.notes, *_length_notes(rec, sequence_length)))
    return Simulator(
        perf=perf,
        dataset_size=rec.dataset_size,
        epochs=epochs or spec.epochs,
        pricing=make_pricing(spec.pricing),
        memory=mem,
        max_local_batch=max_local_batch,
        bandwidth_bytes_per_s=bw,
        latency_s=float(lat),
        compute_speed=float(compute_speed),
        ranks_per_node=r,
        notes=(*notes.sentences(), *step.notes),
        intra_bandwidth_bytes_per_s=ibw,
        intra_latency_s=None if ilat is None else float(ilat),
        run_costs=fitted.run_costs,
        sequence_length=step.sequence_length,
        parallelism=step.parallelism,
        checkpointing=step.checkpointing,
        memory_budget_bytes=fitted.memory_budget_bytes,
        memory_safety=fitted.memory_safety,
        oom_local_batch=fitted.oom_local_batch,
        record=rec,
        profiled_step=rec is original and step.sequence_length == own_length,
        sharded_min_workers=2 if sharding is not None else 1,
        sharding=sharding,
    )


#: how a collective's bytes per link are said (FSDP's fitted sync is scaled over N by them)
_BYTES_PER_LINK_WORDS = {"ring": "a ring's", "tree": "a tree's", "parameter_server": "a parameter server's"}


def sharded_sync_words(sharding: ShardingEffect, collective: str) -> str:
    """FSDP's sync as the simulator predicts it from the fitted effect (:meth:`ShardingEffect.perf`), in
    words for a table's title: the profile's fitted all-gathers and reduce-scatter at the cluster size
    they were measured at, scaled over N as ``collective``'s bytes per link -- no bandwidth, no latency."""
    share = f"{sharding.gather_share:.0%}" + (" assumed" if sharding.gather_s is None else "")
    return (
        f"FSDP's all-gathers and reduce-scatter: the profile's fitted sync, {sharding.sync_s * 1e3:.3g} ms a step at "
        f"N={sharding.n_workers} ({share} of it all-gathers, paid at every micro-batch), scaled over N as "
        f"{_BYTES_PER_LINK_WORDS.get(collective, collective)} bytes per link"
    )


def _refuse_links_for_sharded_sync(collective: str, links: Mapping[str, Any]) -> None:
    """Refuse, in one sentence, a network given for FSDP's step from its fitted effect: its sync is the
    profile's measured one scaled over N, not an alpha-beta term a bandwidth or latency would replace."""
    given = tuple(name for name, value in links.items() if value is not None)
    if given:
        raise OptionError(
            "{links} " + ("does" if len(given) == 1 else "do") + " not apply to FSDP's step: its all-gathers and "
            "reduce-scatter are the profile's fitted sync, scaled over N as "
            f"{_BYTES_PER_LINK_WORDS.get(collective, collective)} bytes per link, not a network's bandwidth and "
            "latency; leave {links} out to simulate FSDP on the profiled network, or simulate DDP on another",
            links=given,
        )


def simulated_collectives(sim: Simulator, collectives: Sequence[str] | None = None) -> tuple[str, ...]:
    """The collectives ``sim``'s rows are simulated on: ``collectives`` (``None``: all three); for FSDP's
    step from its fitted effect (:attr:`Simulator.sharding`) the fitted one alone, whose bytes per link
    scale its sync (its all-gathers and reduce-scatter are no all-reduce to choose), ``collectives``
    naming another being one sentence."""
    if sim.sharding is None:
        return COLLECTIVES if collectives is None else tuple(collectives)
    fitted = sim.perf.collective
    other = next((c for c in collectives or () if c != fitted), None)
    if other is not None:
        raise OptionError(
            f"{{collective}} {other} does not apply to FSDP's step: its all-gathers and reduce-scatter are the "
            f"profile's fitted sync, scaled over N as {_BYTES_PER_LINK_WORDS.get(fitted, fitted)} bytes per link; "
            f"give {fitted} or leave {{collective}} out",
            collective="collective",
        )
    return (fitted,)


#: the model's keyword arguments that say its positional limit, as a spec may give them (tiny_gpt's
#: ``max_positions``, a Hugging Face config's ``max_position_embeddings`` or ``n_positions``)
POSITIONAL_LIMIT_KWARGS: tuple[str, ...] = ("max_positions", "max_position_embeddings", "n_positions")


def positional_limit_of(spec: JobSpec) -> tuple[int, str] | None:
    """The longest sequence the spec's model takes where the spec says it (a keyword argument of
    :data:`POSITIONAL_LIMIT_KWARGS` in ``model.kwargs``), with that keyword; ``None`` where it says
    nothing (the model's own default is the engine's to read: ``tula check``)."""
    kwargs = spec.model.kwargs or {}
    for name in POSITIONAL_LIMIT_KWARGS:
        value = kwargs.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value, name
    return None


def check_sequence_length(models: dict | ModelsRecord, sequence_length: int) -> None:
    """Refuse to predict at ``sequence_length`` in one sentence where the models record cannot:
    its data has no sequence length (a CNN's), L is above the model's positional limit the spec
    gives (:func:`positional_limit_of`), or L is another than the data's own and the memory and
    performance models were fitted at that one length only (no ``search.sequence_lengths``)."""
    rec = _models_record(models)
    own = simulated_step(rec).sequence_length
    if own is None:
        raise OptionError(
            "{sequence_length} applies to data of sequences; the models record's trials ran at no sequence "
            "length (its data has none)",
            sequence_length="sequence_length",
        )
    limit = positional_limit_of(rec.spec)
    if limit is not None and sequence_length > limit[0]:
        raise TulaError(
            f"sequence length {sequence_length} exceeds the model's positional limit of {limit[0]} tokens "
            f"(model.kwargs.{limit[1]}); give lengths of at most {limit[0]}"
        )
    fitted_lengths = (rec.perf.sequence_length, rec.memory.sequence_length if rec.memory else None)
    if sequence_length != own and any(length is None for length in fitted_lengths):
        raise TulaError(
            f"the models were fitted at one sequence length ({own}) and cannot predict at {sequence_length}; "
            "profile with search.sequence_lengths to fit the per-token terms"
        )


def _length_notes(models: ModelsRecord, sequence_length: int) -> tuple[str, ...]:
    """A note where ``sequence_length`` is outside the lengths the profile's trials ran at."""
    ran = sorted({t.sequence_length for t in models.trials if t.status == "ok" and t.sequence_length is not None})
    if ran and not ran[0] <= sequence_length <= ran[-1]:
        return (
            f"L={sequence_length} is outside the sequence lengths profiled ({ran[0]} to {ran[-1]}): the per-token "
            "terms are extrapolated there",
        )
    return ()


def _parse_checkpointing(value: str | bool | None) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if value in ("on", "off"):
        return value == "on"
    raise OptionError(f"{{checkpointing}} is on or off, not {value!r}", checkpointing="checkpointing")


def variant_record(
    models: dict | ModelsRecord, parallelism: str | None = None, checkpointing: str | bool | None = None
) -> ModelsRecord:
    """The models record of the run variant asked (``parallelism`` ``ddp`` or ``fsdp``,
    ``checkpointing`` ``on``/``off`` or a bool; ``None``: the record's own, which its rows are of,
    :func:`simulated_step`): the record itself for its own step, else the fitted effect applied as
    the planner applies it (:func:`tula.core.variants.variant_models`).  A variant the profile did not
    measure (no fitted effect for it, or the spec fixed the other one) is one sentence."""
    rec = _models_record(models)
    if parallelism is not None and parallelism not in ("ddp", "fsdp"):
        raise OptionError(f"{{parallelism}} is ddp or fsdp, not {parallelism!r}", parallelism="parallelism")
    ckpt = _parse_checkpointing(checkpointing)
    train = rec.spec.train
    own = RunVariant(
        checkpointing=train.checkpointing == "on",
        parallelism="ddp" if train.parallelism == "auto" else train.parallelism,
    )
    asked = RunVariant(
        checkpointing=own.checkpointing if ckpt is None else ckpt,
        parallelism=own.parallelism if parallelism is None else parallelism,
    )
    if asked == own:
        return rec
    if asked.parallelism != own.parallelism:
        _check_parallelism_measured(rec, asked.parallelism)
    if asked.checkpointing != own.checkpointing:
        _check_checkpointing_measured(rec, asked.checkpointing)
    return variant_models(rec, asked)


def _check_parallelism_measured(rec: ModelsRecord, parallelism: str) -> None:
    """Refuse ``parallelism`` where the record has no fitted step of it, in one sentence."""
    how = rec.spec.train.parallelism
    if how != "auto":
        name = parallelism.upper()
        raise TulaError(
            f"the profile did not measure {name} (train.parallelism is {how}): profile with train.parallelism: "
            f"auto or {parallelism}"
        )
    obstacle = fsdp_obstacle(rec.spec)
    if obstacle is not None:
        raise TulaError(f"FSDP cannot train this spec ({obstacle}), so the profile did not measure it")
    if rec.sharding is None:
        raise TulaError(
            "the profile did not measure FSDP: it ran no sharded trial (train.parallelism: auto runs them at a "
            "cluster size of two or more); profile with search.cluster_sizes including 2, or train.parallelism: fsdp"
        )


def _check_checkpointing_measured(rec: ModelsRecord, checkpointed: bool) -> None:
    """Refuse checkpointing on or off where the record has no fitted step of it, in one sentence."""
    mode = rec.spec.train.checkpointing
    asked = "on" if checkpointed else "off"
    if mode != "auto":
        what = "activation checkpointing" if checkpointed else "the step without activation checkpointing"
        raise TulaError(
            f"the profile did not measure {what} (train.checkpointing is {mode}): profile with "
            f"train.checkpointing: auto or {asked}"
        )
    if rec.checkpointing is None:
        raise TulaError(
            "the profile did not measure activation checkpointing: it ran no checkpointed trial; profile with "
            "train.checkpointing: auto again, or on"
        )


@dataclass(frozen=True)
class SimulatedStep:
    """The step a models record's own models predict (:func:`simulated_step`): its sequence
    length, parallelism and checkpointing where the record has them (``None`` where not), and
    the notes on the variants an ``auto`` spec's plan weighs besides it."""

    sequence_length: int | None = None
    parallelism: str | None = None
    checkpointing: bool | None = None
    notes: tuple[str, ...] = ()

    def words(self) -> str:
        """The step in words for a title (``""`` where the record says nothing of it)."""
        parts = [f"L={self.sequence_length}"] if self.sequence_length is not None else []
        parts += [self.parallelism] if self.parallelism is not None else []
        if self.checkpointing is not None:
            parts.append("checkpointed" if self.checkpointing else "not checkpointed")
        return ", ".join(parts)


def simulated_step(models: dict | ModelsRecord, spec: JobSpec | None = None) -> SimulatedStep:
    """The step ``models``' own memory and performance models are of -- the data's own sequence
    length (where its trials ran at one), the spec's parallelism and checkpointing (``auto``: the
    plain variant, DDP without checkpointing, the one every trial but the variants' measured;
    shown where the spec asks for one besides ddp and off, or the profile measured it) -- and,
    with ``auto`` and the other variant measured, a note that the plan weighs it too
    (:func:`tula.core.variants.run_variants`; these rows are not of it)."""
    rec = _models_record(models)
    spec = spec or rec.spec
    t = spec.train
    length = reference_sequence_length(spec.data) if any(x.sequence_length is not None for x in rec.trials) else None
    sharded = rec.sharding is not None or any(x.parallelism is not None for x in rec.trials)
    parallelism = ("ddp" if t.parallelism == "auto" else t.parallelism) if t.parallelism != "ddp" or sharded else None
    checkpointed = rec.checkpointing is not None or any(x.checkpointing for x in rec.trials)
    checkpointing = t.checkpointing == "on" if t.checkpointing != "off" or checkpointed else None
    notes = []
    if t.parallelism == "auto" and rec.sharding is not None:
        notes.append("train.parallelism is auto: these rows are DDP's; the plan weighs FSDP as well (tula plan)")
    if t.checkpointing == "auto" and rec.checkpointing is not None:
        notes.append(
            "train.checkpointing is auto: these rows are the step without checkpointing; the plan weighs the "
            "checkpointed one as well (tula plan)"
        )
    return SimulatedStep(length, parallelism, checkpointing, tuple(notes))


def _network(
    perf: PerfModel,
    placement: Placement,
    bandwidth: Any,
    latency: Any,
    intra_bandwidth: Any,
    intra_latency: Any,
) -> tuple[float, float, float | None, float | None, _NetworkNotes]:
    """The network read off the fit (:func:`_network_from_fit`) with the links given replacing
    its parts, and the notes about what the fit could not tell that still apply."""
    bw, lat, ibw, ilat, notes = _network_from_fit(perf, placement)
    if bandwidth is not None:
        bw = _bandwidth(bandwidth, intra=False)
        notes.bandwidth = None
    if latency is not None:
        lat = _latency(latency, intra=False)
        notes.latency = None
    if bandwidth is not None and latency is not None:
        notes.loopback = None
    if intra_bandwidth is not None:
        ibw = _bandwidth(intra_bandwidth, intra=True)
    if intra_latency is not None:
        ilat = _latency(intra_latency, intra=True)
        notes.intra_latency = None
    return bw, lat, ibw, ilat, notes


def _ranks_per_node(models: ModelsRecord, fitted_ranks_per_node: int | None, given: int | None) -> int:
    """The workers that share a node: ``given``, else the most ranks one host held when the
    profile's worlds spanned several hosts (``fitted_ranks_per_node``: what the fit was for,
    :func:`tula.core.perfmodel.ranks_per_node_of`), else the largest N profiled."""
    if given is None:
        ok = [t for t in models.trials if t.status == "ok"]
        given = fitted_ranks_per_node or max((t.n_workers for t in ok), default=1)
    r = int(given)
    if r < 1:
        raise TulaError(f"ranks per node must be at least 1, not {r}")
    return r


def _note_intra_link(
    notes: _NetworkNotes, perf: PerfModel, ibw: float | None, ilat: float | None, ranks_per_node: int
) -> None:
    """Say in ``notes`` which parts of the intra-node link are taken to be the inter-node
    one's (a fit across hosts without a world on one host alone); no intra-node note where no
    two workers share a node."""
    assumed = [w for w, v in (("bandwidth", ibw), ("latency", ilat)) if v is None]
    if assumed and "beta_intra" in perf.frozen:  # fitted across hosts without a world on one host alone
        why = next(
            (x.split(":")[0] for x in perf.notes if x in (NOTE_NO_SHARED_HOST, NOTE_NO_LONE_HOST)),
            "the profile gives no intra-node link",
        )
        notes.intra = (
            f"{why}: the intra-node {' and '.join(assumed)} taken to be the inter-node "
            f"{'ones' if len(assumed) > 1 else 'one'}; give an intra-node {' and '.join(assumed)}"
        )
    if ranks_per_node == 1:  # no two workers share a node: the intra-node link is never used
        notes.intra = notes.intra_latency = None


def _models_record(models: dict | ModelsRecord) -> ModelsRecord:
    """``models`` typed (a record read from JSON is checked: another kind is one sentence)."""
    return parse_record(models, ModelsRecord, "the models given")


def default_batch(models: dict | ModelsRecord) -> int:
    """The constant batch simulated by default: the spec's ``train.global_batch``, else the
    largest global batch profiled."""
    rec = _models_record(models)
    spec = rec.spec
    if spec.train.global_batch:
        return spec.train.global_batch
    ok = [t.global_batch for t in rec.trials if t.status == "ok"]
    return max(ok) if ok else spec.search.min_batch


def schedule_caps(
    models: dict | ModelsRecord,
    sim: Simulator,
    first_batch: int,
    workers: Sequence[int],
    min_workers: int | None = None,
    max_workers: int | None = None,
    batch_per_worker: int | None = None,
    max_accumulation_steps: int | None = None,
    workers_rule: str | None = None,
    threshold: float | None = None,
    needs_models: bool = False,
) -> Caps:
    """The workers rule of a simulated schedule: the spec's ``train.workers`` where it has one,
    else 1 to the largest of ``workers`` with ``batch_per_worker`` the first batch; the
    accumulation it may grow through, ``search.max_accumulation_steps``; each option given
    replaces its part.  ``workers_rule`` ``"plan"`` (or the spec's), or a schedule that
    ``needs_models`` (goodput): the worker count the models rank best on the simulated
    network, kept within ``threshold`` (:class:`tula.core.live_plan.WorkerPlan`)."""
    models = _models_record(models)
    spec = models.spec
    w = spec.train.workers
    rule = workers_rule or (w.rule if w else "batch_per_worker")
    if rule not in ("plan", "batch_per_worker"):
        raise TulaError(f"the workers rule is 'plan' or 'batch_per_worker', not {rule!r}")
    if threshold is not None and rule != "plan":
        raise OptionError("{threshold} applies to the workers rule 'plan' only", threshold="threshold")
    if rule == "plan" and batch_per_worker is not None:
        raise OptionError(
            "{batch_per_worker} applies to the workers rule 'batch_per_worker'; 'plan' chooses N by the models",
            batch_per_worker="batch_per_worker",
        )
    lo = min_workers if min_workers is not None else (w.min if w else 1)
    hi = max_workers if max_workers is not None else (w.max if w else max(workers))
    bpw = batch_per_worker if batch_per_worker is not None else ((w.batch_per_worker if w else None) or first_batch)
    k_max = max_accumulation_steps if max_accumulation_steps is not None else spec.search.max_accumulation_steps
    for name, v in (("min workers", lo), ("max workers", hi), ("batch per worker", bpw), ("max accumulation", k_max)):
        if v < 1:
            raise TulaError(f"{name} must be at least 1, not {v}")
    if lo > hi:
        raise TulaError(f"min workers ({lo}) is above max workers ({hi})")
    if rule == "plan" or needs_models:
        if threshold is None:
            threshold = w.threshold if w is not None and w.threshold is not None else DEFAULT_THRESHOLD
        if not 0 <= threshold < 1:
            raise OptionError(f"{{threshold}} must be at least 0 and below 1, not {threshold!r}", threshold="threshold")
        # the models' ranking on this network; a what-if step (another length or run variant) ranked by its own epochs
        step_epoch_s = None if sim.profiled_step else sim.epoch_s
        ranker = Ranker(sim.record or models, spec.train.method, epoch_s_of=step_epoch_s, network=sim.network())
        if rule != "plan":  # goodput under AdaDamp's rule: the batch by goodput, on the first worker count
            hi = lo
        return Caps(sim.dataset_size, sim.max_local_batch, lo, hi, None, k_max, WorkerPlan(ranker, threshold))
    return Caps(sim.dataset_size, sim.max_local_batch, lo, hi, bpw, k_max)


def schedule_settings(models: dict | ModelsRecord, kind: str, given: dict[str, Any]) -> dict[str, Any]:
    """The spec's ``train.batch_schedule`` settings when it is of ``kind``, updated with ``given``."""
    spec = _models_record(models).spec
    s = spec.train.batch_schedule
    base: dict[str, Any] = {}
    if s is not None and s.kind == kind:
        base = {**s.params(), "every_epochs": s.every_epochs, "lr_rule": s.lr_rule}
        if s.max_batch is not None:
            base.update(max_batch=s.max_batch)
    return {**base, **given}


@dataclass
class WhatIf:
    """What ``tula simulate`` shows: the simulated rows (one per configuration and
    collective, or per schedule, collective and epoch), the plot's title, and the profiled
    points at the same batch (``None`` for schedules)."""

    rows: list[ConstantRow] | list[ScheduleRow]
    title: str
    measured: list[MeasuredPoint] | None


def what_if(
    models: dict | ModelsRecord,
    sim: Simulator | Sequence[Simulator],
    workers: Sequence[int],
    collectives: Sequence[str],
    batch: int | None = None,
    schedules: Sequence[tuple[str, str, dict[str, Any]]] = (),
    history: Epochs | None = None,
    min_workers: int | None = None,
    max_workers: int | None = None,
    batch_per_worker: int | None = None,
    noise_scale: float | None = None,
    max_accumulation_steps: int | None = None,
    workers_rule: str | None = None,
    threshold: float | None = None,
) -> WhatIf:
    """The what-if of ``tula simulate``: a constant global ``batch`` (default
    :func:`default_batch`) on each of ``workers``, or each of ``schedules`` (``(label, kind,
    given parameters)``) from the first batch ``batch`` (default ``train.global_batch``, else
    ``search.min_batch``) with the workers rule (:func:`schedule_caps`); ``history``: a
    training run's epochs that loss_ratio and adaptive follow; ``max_accumulation_steps``: the
    accumulation a schedule may grow through where the memory model caps the local batch
    (default ``search.max_accumulation_steps``).  With a gradient noise scale
    (``noise_scale``, a what-if, else the one the profile measured) each constant-batch row
    also holds the epochs, time and cost to the accuracy the spec's epochs reach at
    ``train.base_batch`` (:func:`tula.core.plan.epochs_to_accuracy`).  ``sim``: one simulator, or
    one per sequence length asked (:func:`simulator_from_models`'s ``sequence_length``; a constant
    batch only), whose rows follow one another."""
    models = _models_record(models)
    job = models.spec
    sims = [sim] if isinstance(sim, Simulator) else list(sim)
    if not sims:
        raise ValueError("what_if needs a simulator")
    if len(sims) > 1 and schedules:
        raise OptionError(
            "{schedule} simulates one sequence length; give one {sequence_length}",
            schedule="schedules",
            sequence_length="sequence_length",
        )
    sim = sims[0]
    collectives = simulated_collectives(sim, collectives)  # FSDP's fitted sync: on the fitted collective alone
    schedule_only = {
        "min_workers": min_workers,
        "max_workers": max_workers,
        "batch_per_worker": batch_per_worker,
        "max_accumulation_steps": max_accumulation_steps,
        "history": history,
        "workers_rule": workers_rule,
        "threshold": threshold,
    }
    given = tuple(option for option, value in schedule_only.items() if value is not None)
    if given and not schedules:
        raise OptionError(
            f"{{given}} {'applies' if len(given) == 1 else 'apply'} to batch schedules only; "
            "add a {schedule}, or leave it out for a constant batch",
            given=given,
            schedule="schedules",
        )
    if schedules:
        b0 = batch or job.train.global_batch or job.search.min_batch
        needs_models = any(schedule_info(kind).needs_models for _, kind, _ in schedules)
        caps = schedule_caps(
            models, sim, b0, workers, min_workers, max_workers, batch_per_worker, max_accumulation_steps,
            workers_rule, threshold, needs_models,
        )  # fmt: skip
        return _schedules_what_if(models, sim, job, b0, caps, collectives, schedules, history)
    big_b = batch or default_batch(models)
    fitted_collective = sim.perf.collective
    profiled = any(s.profiled_step for s in sims)  # the trials' own step simulated: their times beside it
    measured = [
        MeasuredPoint(
            t.n_workers,
            sim.epochs * float(epoch_time_s(t.t_step_s, big_b, t.n_workers, sim.dataset_size, sim.run_costs)),
        )
        for t in models.trials
        if t.status == "ok"
        and t.t_step_s is not None
        and t.global_batch == big_b
        and fitted_collective in collectives
        and not t.checkpointing  # train.checkpointing auto's checkpointed trials: another step than the plain one
        and t.parallelism is None  # train.parallelism auto's sharded trials: likewise
        and profiled
    ]
    rows: list[ConstantRow] = []
    words = ""
    noise = NoiseScale.model_validate(noise_assumed(models, noise_scale, job.train.base_batch))
    for one in sims:  # each length's rows after the one before
        mine = one.constant(big_b, workers, collectives)
        if noise.b_noise:
            mine, words = _to_accuracy(mine, one, big_b, noise)
        rows += mine
    step = _steps_words(sims)
    title = f"{job.name}: constant global batch {big_b}" + (f" ({step})" if step else "") + words
    return WhatIf(rows, title, measured)


def _steps_words(sims: Sequence[Simulator]) -> str:
    """The simulated steps in words for a title: one's (:meth:`SimulatedStep.words`), or, for one per
    sequence length, their lengths together (``L=64,128, fsdp``)."""
    first = SimulatedStep(sims[0].sequence_length, sims[0].parallelism, sims[0].checkpointing).words()
    if len(sims) == 1:
        return first
    lengths = ",".join(str(s.sequence_length) for s in sims)
    return ", ".join([f"L={lengths}", *first.split(", ")[1:]])


def _schedules_what_if(
    models: ModelsRecord,
    sim: Simulator,
    job: JobSpec,
    b0: int,
    caps: Caps,
    collectives: Sequence[str],
    schedules: Sequence[tuple[str, str, dict[str, Any]]],
    history: Epochs | None,
) -> WhatIf:
    """The what-if of each of ``schedules`` from the first batch ``b0`` under ``caps``."""
    rows: list[ScheduleRow] = []
    for label, kind, given in schedules:
        settings = schedule_settings(models, kind, given)
        rows += sim.schedule(
            kind, b0, caps, settings, collectives, job.train.lr_milestones, job.train.lr_gamma, history, label=label
        )
    rule = (
        f"N = the models' best of {caps.min_workers}..{caps.max_workers} (kept within {caps.workers_rule.threshold:.0%})"
        if caps.workers_rule is not None
        else f"N = clip(ceil(B / {caps.batch_per_worker}), {caps.min_workers}, {caps.max_workers})"
    )
    title = f"{job.name}: schedules from B0={b0}, {rule}" + (
        f", up to {caps.max_accumulation_steps} accumulation steps" if caps.max_accumulation_steps > 1 else ""
    )
    step = SimulatedStep(sim.sequence_length, sim.parallelism, sim.checkpointing).words()
    title += f" ({step})" if step else ""
    return WhatIf(rows, title, None)


def _to_accuracy(
    rows: list[ConstantRow], sim: Simulator, big_b: int, noise: NoiseScale
) -> tuple[list[ConstantRow], str]:
    """Each constant-batch row (at ``big_b``) with, where it has times, the epochs, time and cost
    to accuracy under the gradient noise scale ``noise`` (:func:`tula.core.plan.noise_assumed`);
    and the title's words for it."""
    assert noise.b_noise is not None and noise.reference_batch is not None  # the noise a plan assumes
    e_acc = float(epochs_to_accuracy(sim.epochs, big_b, noise.b_noise, noise.reference_batch))
    out = []
    for r in rows:
        if r.total_time_s is None or r.epoch_time_s is None:
            out.append(r)
            continue
        t_acc = float(sim.pricing.expected_time_s(e_acc * r.epoch_time_s, r.n_workers, r.epoch_time_s))
        cost_acc = None if r.cost is None else r.cost * t_acc / r.total_time_s
        out.append(replace(r, epochs_to_accuracy=e_acc, time_to_accuracy_s=t_acc, cost_to_accuracy=cost_acc))
    words = (
        f"; to accuracy: {e_acc:.3g} epochs reach what {sim.epochs} reach at B0={noise.reference_batch} "
        f"(B_noise {noise.b_noise:.3g}, {'a what-if' if noise.source == 'what-if' else 'profiled'})"
    )
    return out, words


@overload
def fitted_step_s(models: dict, local_batch: float, n_workers: float) -> float: ...
@overload
def fitted_step_s(models: dict, local_batch: ArrayLike, n_workers: ArrayLike) -> FloatArray: ...
def fitted_step_s(models: dict, local_batch: ArrayLike, n_workers: ArrayLike) -> float | FloatArray:
    """The fitted model's own step time prediction (the simulator's reference at profiled N),
    at the R it was fitted for (:func:`tula.core.perfmodel.ranks_per_node_of`).

    A compatibility wrapper: ``t_step_s`` of :meth:`tula.core.fitted.FittedModels.predict` on
    the fitted network."""
    t = FittedModels.from_record(models).predict(n_workers=n_workers, local_batch=local_batch).t_step_s
    return float(t[0]) if np.ndim(local_batch) == 0 and np.ndim(n_workers) == 0 else t


def uses_spot(sim: Simulator) -> bool:
    return isinstance(sim.pricing, SpotPricing)


__all__ = [
    "DEFAULT_WORKERS",
    "ConstantRow",
    "MeasuredPoint",
    "ScheduleRow",
    "ScheduledEpoch",
    "SimulatedEpoch",
    "SimulatedRow",
    "Simulator",
    "simulator_from_models",
    "SimulatedStep",
    "simulated_step",
    "parse_collectives",
    "parse_workers",
    "parse_schedule",
    "parse_sequence_lengths",
    "check_sequence_length",
    "positional_limit_of",
    "variant_record",
    "default_batch",
    "schedule_caps",
    "schedule_settings",
    "fitted_step_s",
    "uses_spot",
]
