"""One profiled configuration of a profile, :class:`Trial`: (N, b) and what was measured there.

Its own module (re-exported by :mod:`tula.core.records`, which reads it as part of the profile and
models records) so that the models fitted to trials (:mod:`tula.core.perfmodel`) can take them typed:
:mod:`tula.core.records` checks a models record's performance model with :mod:`tula.core.perfmodel`,
so that module cannot import the records module back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TRIAL_STATUSES = ("ok", "oom", "skipped", "error", "interrupted")


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
    # the gradient noise scale measured at this trial's local batch from the world's fresh
    # model (the first trial of each world): tula.engine.profile.measure_noise's dict
    noise: dict | None = None
    #: L, the tokens of each sample where the data set has a sequence length (absent in older profiles)
    sequence_length: int | None = None
    #: true: measured with activation checkpointing, a variant train.checkpointing auto profiles besides the
    #: plain trials (absent: as the spec says)
    checkpointing: bool | None = None
