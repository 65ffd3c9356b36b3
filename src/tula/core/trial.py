"""One profiled configuration of a profile, :class:`Trial`: (N, b) and what was measured there.

Its own module (re-exported by :mod:`tula.core.records`, which reads it as part of the profile and
models records) so that the models fitted to trials (:mod:`tula.core.perfmodel`) can take them typed:
:mod:`tula.core.records` checks a models record's performance model with :mod:`tula.core.perfmodel`,
so that module cannot import the records module back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

TRIAL_STATUSES = ("ok", "oom", "skipped", "error", "interrupted")


@dataclass(frozen=True)
class NoiseMeasurement:
    """The gradient noise scale's measurement at one trial's local batch, from the world's fresh model
    (``tula.engine.profile``): per batch the unbiased estimates of |G|^2 and
    tr(Sigma) from a smaller and a larger batch's gradients (:func:`tula.core.fit.fit_noise_scale`
    pools them over the worlds)."""

    #: the smaller batch compared, samples
    b_small: int
    #: the larger batch compared, samples
    b_big: int
    #: the batches measured (those whose gradients did not overflow)
    steps: int
    #: each batch's estimate of |G|^2
    g2: list[float] = field(default_factory=list)
    #: each batch's estimate of tr(Sigma)
    trace_sigma: list[float] = field(default_factory=list)
    #: the world's estimate of B_simple = tr(Sigma) / |G|^2, samples (null: no signal above the noise)
    b_simple: float | None = None
    #: the seconds the measurement took
    seconds: float = 0.0


@dataclass
class Trial:
    """One profiled configuration: (N, b) and what was measured there.

    ``status``: ``ok`` (timed), ``oom`` (the ranks agreed it does not fit), ``skipped``
    (a smaller local batch already ran out of memory), ``error`` (the world failed),
    ``interrupted`` (Ctrl-C / SIGTERM before it ran)."""

    #: N, the ranks of the world
    n_workers: int
    #: b, the samples each rank's step takes
    local_batch: int
    #: B = N x b
    global_batch: int
    #: how the trial ended (the class's description says each)
    status: Literal["ok", "oom", "skipped", "error", "interrupted"]
    #: the median time of a training step, seconds
    t_step_s: float | None = None
    #: the median time of a step's forward and backward computation, seconds
    t_compute_s: float | None = None
    #: the median time a step spends synchronising the gradients beyond the computation, seconds
    t_sync_s: float | None = None
    t_data_s: float | None = None  # median wait for the next batch (data loading) per step
    #: the most memory a rank held during the trial, bytes
    peak_mem_bytes: int | None = None
    #: the spread of the timed steps relative to their median
    t_step_spread: float | None = None
    #: how many steps were timed
    timed_steps: int = 0
    #: why a trial that is not ok ended so, or what to know about it
    note: str = ""
    #: each timed step's time, seconds
    step_times_s: list[float] = field(default_factory=list)
    #: each timed step's computation time, seconds
    compute_times_s: list[float] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)  # each rank's host (its worker's address), in rank order
    interfaces: list[str] = field(default_factory=list)  # each rank's network interface ("": torch's default)
    interface_sources: list[str] = field(
        default_factory=list
    )  # why each one (tula.engine.launch.netif.choose_interface)
    local_ranks: list[int] = field(default_factory=list)  # each rank's position among the ranks on its host
    devices: list[str] = field(default_factory=list)  # each rank's device
    ranks_per_host: int | None = None  # the most ranks that shared one host
    #: the gradient noise scale measured at this trial's local batch from the world's fresh
    #: model (the first trial of each world)
    noise: NoiseMeasurement | None = None
    #: L, the tokens of each sample where the data set has a sequence length (absent in older profiles)
    sequence_length: int | None = None
    #: true: measured with activation checkpointing, a variant train.checkpointing auto profiles besides the
    #: plain trials (absent: as the spec says)
    checkpointing: bool | None = None
    #: fsdp: measured sharded, a variant train.parallelism auto profiles besides the DDP trials (absent: as the
    #: spec says)
    parallelism: Literal["fsdp"] | None = None

    def __post_init__(self) -> None:
        # a trial rebuilt from its dict (``Trial(**asdict(t))``, as the profiler merges its ranks') has its
        # noise measurement as a dict: typed here, so that every Trial holds the measurement object
        if isinstance(self.noise, Mapping):
            self.noise = NoiseMeasurement(**self.noise)
