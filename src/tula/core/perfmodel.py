"""Performance model (Eq. 2, 4): step time as compute plus synchronisation.

    t_compute(b, N) = max(t_floor, c0 + c1 * b) * (1 + kappa * (m - 1)) + kappa0 * (m - 1)   (Eq. 2b)
    t_sync(N)       = alpha-beta cost of the collective on the topology         (Eq. 2c), 0 when N = 1
    t_step(b, N)    = ((t_compute * (1 + rho * [N > 1]))**gamma + t_sync**gamma) ** (1 / gamma)
    t_step(b, N, k) = (k - 1) * t_compute(b, N) + t_step(b, N)      (k accumulation steps)

With gradient accumulation a step is k micro-batches of b samples: the first k - 1 backward
passes run under DDP's ``no_sync`` (compute only, no communication threads beside them), the
last is an ordinary step whose sync overlaps its backward.  Under FSDP the k - 1 also all-gather
the parameters (forward and backward): each pays ``sync_share_per_micro_batch`` of the sync
(:class:`tula.core.effects.ShardingEffect`, fitted; 0 under DDP).

``m`` is the number of ranks that share one host: N for the flat model (one host, or no
topology given: ``ranks_per_node=None``), min(N, R) on hosts of R ranks each.

The topology (:func:`sync_time_s`, the one place the rule is written).  N ranks on H =
ceil(N / R) hosts of R ranks each (R is clipped to N); the inter-node link costs ``alpha``
seconds per hop and ``beta`` seconds per byte, the intra-node link ``alpha_intra`` and
``beta_intra`` (``None``: the same as the inter-node link).  ``S`` = ``grad_bytes``, the
gradient bytes per step::

    ring all-reduce   2 (N - 1) synchronous steps, each moving S / N on every edge of the ring
                      at once, so each step costs its slowest edge:
                        H = 1:  2 (N - 1) (alpha_intra + S / N * beta_intra)
                        H > 1:  2 (N - 1) (max(alpha_intra, alpha) + S / N * max(beta_intra, beta))
                      (the ring crosses hosts H times; those edges bind)
    tree (hierarchical: reduce inside the host, a binary tree across hosts, broadcast back)
                      2 ceil(log2 R) alpha_intra + 2 ceil(log2 H) alpha
                      + 2 S * (the slower of the links used: intra if R > 1, inter if H > 1)
                      (pipelined: each link carries the bytes up and down once, whatever the
                      depth; the depth shows in the hops.  Were the bytes proportional to the
                      depth too, latency and bandwidth could not be told apart)
    parameter server  one server on one host, counted at its links:
                        H = 1:  2 alpha_intra + 2 N S beta_intra
                        H > 1:  2 alpha + 2 S ((N - R) beta + R beta_intra)

With R = 1 (one rank per host; for the parameter server also the intra-node link the
inter-node one, for the rank beside the server) these are exactly the flat formulas of
earlier Tula, which :func:`hops` and :func:`link_bytes` still give::

    ring all-reduce     hops 2 (N - 1)        link_bytes 2 (N - 1) / N * S
    parameter server    hops 2                link_bytes 2 N * S   (the server's link)
    tree all-reduce     hops 2 ceil(log2 N)   link_bytes 2 * S

and so are ring and parameter server for any R when the intra-node link is the inter-node
one.  The tree then takes 2 (ceil(log2 R) + ceil(log2 H)) hops, which is 2 ceil(log2 N)
when R is a power of two and up to two hops more otherwise (N = 4, R = 3: 6 hops, not 4):
the hop counts of a hierarchical tree, not a flat one.

Which topology a fit describes.  When every world of the profile ran on one host (the local
launcher), the flat model is fitted (R = 1 in the formula): ``alpha``/``beta`` describe that
host's loopback link and ``alpha_intra``/``beta_intra`` stay ``None``.  When some world
spanned several hosts, each trial is fitted at its own R (the most ranks on one of its
hosts) and H (its hosts), with co-location ``m = min(N, R)``: ``beta`` needs a world across
hosts and ``alpha`` two sizes of them (the tree: two depths ceil(log2 H) of its tree of
hosts); ``beta_intra`` needs a world of two or more ranks on
one host alone (across hosts the slower link binds, which hides the faster) and
``alpha_intra`` two sizes of those (else 0, folded into ``beta_intra``).  Without such a
world ``alpha_intra``/``beta_intra`` stay ``None`` (the intra-node link is taken to be the
inter-node one), are listed in ``frozen`` and a note says so.

``t_floor`` (``t_floor_s``) is the floor under one rank's compute: on a GPU a small step
takes as long as the host needs to launch its kernels, whatever b (ResNet-50 on an H100:
about 20 ms up to b = 32-48).  It needs three batches at one cluster size (a full search, or
the partial search's middle batch, ``search.partial_middle_batch``); with two, a floor and a
line cannot be told apart, and it stays 0.

Sequence length (#44).  Where the profile measured several sequence lengths L, the compute's
time per sample grows with L (every token's work) and with L^2 (attention's), from the length
``sequence_length`` (L_ref) the line was fitted at::

    c1(L) = c1 + c1_per_token * (L - L_ref) + c1_per_token_squared * (L^2 - L_ref^2)

in place of ``c1`` (:meth:`PerfModel.with_sequence_length` fits the two terms; the L^2 one only
where more than two lengths were measured).  With one length (``sequence_length`` None) the
model is the one above, in the batch alone.

``kappa`` is the slowdown of compute when workers share one host (0 on a cluster of
separate nodes) and ``kappa0`` the fixed seconds per step it adds per extra worker (on a
shared host a small step slows down by far more than a large one); ``rho`` the slowdown of compute by the communication threads running
beside it; ``gamma >= 1`` the compute/communication overlap (1: none, large: full), the
form AdaptDL uses.  Parameters the data cannot identify are frozen (kappa when only one
cluster size was measured, alpha when fewer than two cluster sizes above one, ...).

Fitting minimises the log-space error (RMSLE) of t_compute and t_step over the profiled
trials with scipy under bounds.  The overlapped form is kept only when it fits clearly
better than the additive one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tula.core.length_terms import fit_length_terms
from tula.core.trial import Trial

#: what the model's functions return for array inputs (for plain numbers: a float)
FloatArray = NDArray[np.float64]

PARAMS = ("c0", "c1", "t_floor_s", "kappa", "kappa0", "alpha", "beta", "rho", "gamma")
#: the intra-node link, fitted (or frozen) only when the profile's worlds spanned several hosts
INTRA_PARAMS = ("alpha_intra", "beta_intra")
COLLECTIVES = ("ring", "parameter_server", "tree")

NOTE_NO_SHARED_HOST = "no two ranks shared a host: the intra-node link is taken to be the inter-node one"
NOTE_NO_LONE_HOST = (
    "no world ran on one host alone (where ranks shared a host the world also crossed hosts, "
    "and there the slower link binds): the intra-node link is taken to be the inter-node one"
)
NOTE_INTRA_LATENCY = (
    "one size of world on one host only: intra-node latency cannot be told from its bandwidth and is taken as 0"
)


def sync_time_s(
    collective: str,
    n_workers: ArrayLike,
    grad_bytes: float,
    alpha: float,
    beta: float,
    alpha_intra: float | None = None,
    beta_intra: float | None = None,
    ranks_per_node: ArrayLike = 1,
    n_hosts: ArrayLike | None = None,
) -> FloatArray:
    """Alpha-beta synchronisation time of ``collective`` for N ranks on hosts of R ranks each
    (0 when N = 1): the one place the rule is written (see the module docstring).

    ``alpha``/``beta``: seconds per hop and per byte of the inter-node link;
    ``alpha_intra``/``beta_intra``: of the intra-node link (``None``: the inter-node one).
    ``ranks_per_node`` R (clipped to N) and ``n_hosts`` H (default ceil(N / R)) may be arrays
    like ``n_workers``.  R = 1 gives the flat formulas exactly (the parameter server: when the
    intra-node link is the inter-node one)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; use one of {COLLECTIVES}")
    n = np.asarray(n_workers, float)
    r = np.minimum(np.maximum(np.asarray(ranks_per_node, float), 1.0), np.maximum(n, 1.0))
    h = np.ceil(n / r) if n_hosts is None else np.maximum(np.asarray(n_hosts, float), 1.0)
    a_in = alpha if alpha_intra is None else alpha_intra
    b_in = beta if beta_intra is None else beta_intra
    across = h > 1
    s = float(grad_bytes)
    if collective == "ring":
        a_step = np.where(across, np.maximum(a_in, alpha), a_in)
        b_step = np.where(across, np.maximum(b_in, beta), b_in)
        t = a_step * (2.0 * (n - 1)) + b_step * (2.0 * (n - 1) / np.maximum(n, 1.0) * s)
    elif collective == "tree":
        b_link = np.where(across, np.where(r > 1, np.maximum(b_in, beta), beta), b_in)
        t = (a_in * (2.0 * np.ceil(np.log2(r))) + alpha * (2.0 * np.ceil(np.log2(h)))) + b_link * (2.0 * s)
    else:  # parameter server: (N - R) ranks reach the server across hosts, R on its own host
        t_across = alpha * 2.0 + (beta * (2.0 * n * s) + (b_in - beta) * (2.0 * r * s))
        t = np.where(across, t_across, a_in * 2.0 + b_in * (2.0 * n * s))
    return np.where(n > 1, t, 0.0)


def hops(collective: str, n: ArrayLike) -> FloatArray:
    """Latency hops of the flat model (one rank per host): 2 (N - 1), 2, 2 ceil(log2 N)."""
    return sync_time_s(collective, n, 0.0, 1.0, 0.0)


def link_bytes(collective: str, n: ArrayLike, grad_bytes: float) -> FloatArray:
    """Bytes on the busiest link of the flat model: 2 (N - 1) / N S, 2 N S, 2 S."""
    return sync_time_s(collective, n, grad_bytes, 0.0, 1.0)


@overload
def training_time_s(t_step_s: float, global_batch: float, dataset_size: int, epochs: int = 1) -> float: ...
@overload
def training_time_s(t_step_s: ArrayLike, global_batch: ArrayLike, dataset_size: int, epochs: int = 1) -> FloatArray: ...
def training_time_s(
    t_step_s: ArrayLike, global_batch: ArrayLike, dataset_size: int, epochs: int = 1
) -> float | FloatArray:
    """Eq. 4a, the one place it is written: T = E * D / B * t_step (seconds), for a
    predicted or a measured step time."""
    return epochs * dataset_size / np.asarray(global_batch, float) * np.asarray(t_step_s, float)


# --------------------------------------------------------------------------- where the worlds ran
def _ok(trials: Sequence[Trial]) -> list[Trial]:
    return [t for t in trials if t.status == "ok" and t.t_step_s]


def world_shape(trial: Trial) -> tuple[int, int]:
    """(R, H) of a trial's world: the most ranks on one of its hosts and its hosts.  A trial
    that does not say where its ranks ran had them all on one host (the local launcher)."""
    if not trial.hosts:
        return int(trial.n_workers), 1
    per_host = Counter(trial.hosts)
    return int(trial.ranks_per_host or max(per_host.values())), len(per_host)


def trial_topology(trials: Sequence[Trial]) -> tuple[FloatArray, FloatArray] | None:
    """(R, H) per successful trial when some world spanned more than one host -- the fit then
    models the topology -- else ``None``: the flat model, fitted on one host."""
    shapes = [world_shape(t) for t in _ok(trials)]
    if not any(h > 1 for _, h in shapes):
        return None
    return np.array([r for r, _ in shapes], float), np.array([h for _, h in shapes], float)


def ranks_per_node_of(trials: Sequence[Trial]) -> int | None:
    """The R a model fitted on these trials predicts with: the most ranks one host held when
    some world spanned several hosts, else ``None`` (the flat model of one host).  The one
    rule the plan and the simulator's default follow."""
    topo = trial_topology(trials)
    return None if topo is None else int(topo[0].max())


@dataclass(frozen=True)
class PerfModel:
    """Fitted parameters (seconds, seconds per sample, seconds per byte) and what they describe.

    ``alpha``/``beta`` are the inter-node link (the host's loopback when the profile ran on
    one host), ``alpha_intra``/``beta_intra`` the intra-node one (``None``: the same)."""

    collective: str
    grad_bytes: int
    c0: float
    c1: float
    kappa: float = 0.0
    kappa0: float = 0.0
    alpha: float = 0.0
    beta: float = 0.0
    rho: float = 0.0
    gamma: float = 1.0
    frozen: tuple[str, ...] = ()
    rmsle: float | None = None
    n_trials: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    alpha_intra: float | None = None
    beta_intra: float | None = None
    t_floor_s: float = 0.0  # the host-bound floor under one rank's compute (0: none fitted)
    # L_ref, the sequence length c1 was fitted at (None: one length measured, the batch alone) ...
    sequence_length: int | None = None
    # ... and the seconds per sample each extra token adds (the B*L term), and each extra L^2 (the B*L^2 term)
    c1_per_token: float = 0.0
    c1_per_token_squared: float = 0.0
    # the share of t_sync each of the k - 1 micro-batches without gradient sync pays too: FSDP's parameter
    # all-gathers run at every micro-batch's forward and backward, its reduce-scatter once (0: DDP, whose
    # no_sync micro-batches communicate nothing; tula.core.effects.ShardingEffect.perf sets it)
    sync_share_per_micro_batch: float = 0.0

    def c1_at(self, sequence_length: ArrayLike | None = None) -> float | FloatArray:
        """Seconds of compute per sample at sequence length L (``None``, or a model of one
        length: ``c1``), never below a thousandth of ``c1``."""
        if sequence_length is None or self.sequence_length is None:
            return self.c1
        length, ref = np.asarray(sequence_length, float), float(self.sequence_length)
        c1 = self.c1 + self.c1_per_token * (length - ref) + self.c1_per_token_squared * (length**2 - ref**2)
        return np.maximum(c1, 1e-3 * self.c1)

    # ---------------------------------------------------------------- prediction
    @overload
    def t_compute_s(self, local_batch: float, n_workers: float, sequence_length: float | None = None) -> float: ...
    @overload
    def t_compute_s(
        self, local_batch: ArrayLike, n_workers: ArrayLike, sequence_length: ArrayLike | None = None
    ) -> FloatArray: ...
    def t_compute_s(
        self, local_batch: ArrayLike, n_workers: ArrayLike, sequence_length: ArrayLike | None = None
    ) -> float | FloatArray:
        """Compute with ``n_workers`` ranks sharing the host (pass min(N, R) on hosts of R), at
        ``sequence_length`` (default: the length fitted, :meth:`c1_at`)."""
        b, n = np.asarray(local_batch, float), np.asarray(n_workers, float)
        own = np.maximum(self.t_floor_s, self.c0 + self.c1_at(sequence_length) * b)
        return own * (1.0 + self.kappa * (n - 1)) + self.kappa0 * (n - 1)

    def t_sync_s(
        self, n_workers: ArrayLike, ranks_per_node: ArrayLike | None = None, n_hosts: ArrayLike | None = None
    ) -> FloatArray:
        """Sync time of N ranks on hosts of ``ranks_per_node`` (``None`` or 1: one rank per
        host, the flat formula; ``n_hosts``: default ceil(N / R))."""
        return sync_time_s(
            self.collective,
            n_workers,
            self.grad_bytes,
            self.alpha,
            self.beta,
            self.alpha_intra,
            self.beta_intra,
            1 if ranks_per_node is None else ranks_per_node,
            n_hosts,
        )

    @overload
    def t_step_s(
        self,
        local_batch: float,
        n_workers: float,
        ranks_per_node: float | None = None,
        n_hosts: float | None = None,
        accumulation: float = 1,
        sequence_length: float | None = None,
    ) -> float: ...
    @overload
    def t_step_s(
        self,
        local_batch: ArrayLike,
        n_workers: ArrayLike,
        ranks_per_node: ArrayLike | None = None,
        n_hosts: ArrayLike | None = None,
        accumulation: ArrayLike = 1,
        sequence_length: ArrayLike | None = None,
    ) -> FloatArray: ...
    def t_step_s(
        self,
        local_batch: ArrayLike,
        n_workers: ArrayLike,
        ranks_per_node: ArrayLike | None = None,
        n_hosts: ArrayLike | None = None,
        accumulation: ArrayLike = 1,
        sequence_length: ArrayLike | None = None,
    ) -> float | FloatArray:
        """Step time of N ranks.  ``ranks_per_node`` ``None`` (default): the flat model, as
        fitted on one host (co-location over all N, flat sync); R: hosts of R ranks each
        (co-location over min(N, R), the topology's sync).  ``accumulation``: k micro-batches
        of ``local_batch`` per step, the first k - 1 without sync.  ``sequence_length``: L
        (default: the length fitted)."""
        n = np.asarray(n_workers, float)
        m = n if ranks_per_node is None else np.minimum(n, np.asarray(ranks_per_node, float))
        compute = self.t_compute_s(local_batch, m, sequence_length)
        return self.step_from_parts_s(compute, self.t_sync_s(n, ranks_per_node, n_hosts), n, accumulation)

    @overload
    def step_from_parts_s(
        self, t_compute_s: float, t_sync_s: float, n_workers: float, accumulation: float = 1
    ) -> float: ...
    @overload
    def step_from_parts_s(
        self, t_compute_s: ArrayLike, t_sync_s: ArrayLike, n_workers: ArrayLike, accumulation: ArrayLike = 1
    ) -> FloatArray: ...
    def step_from_parts_s(
        self, t_compute_s: ArrayLike, t_sync_s: ArrayLike, n_workers: ArrayLike, accumulation: ArrayLike = 1
    ) -> float | FloatArray:
        """A step of k = ``accumulation`` micro-batches from the compute of one of them and
        the sync (the one place the rule is written): k - 1 computes without sync, then
        one whose sync it overlaps as fitted (:meth:`combine_s`).  Under FSDP each of the k - 1
        also pays :attr:`sync_share_per_micro_batch` of the sync (its parameters' all-gathers)."""
        last = self.combine_s(t_compute_s, t_sync_s, n_workers)
        micro = np.asarray(t_compute_s, float)
        if self.sync_share_per_micro_batch:
            micro = micro + self.sync_share_per_micro_batch * np.asarray(t_sync_s, float)
        return (np.asarray(accumulation, float) - 1.0) * micro + last

    @overload
    def combine_s(self, t_compute_s: float, t_sync_s: float, n_workers: float) -> float: ...
    @overload
    def combine_s(self, t_compute_s: ArrayLike, t_sync_s: ArrayLike, n_workers: ArrayLike) -> FloatArray: ...
    def combine_s(self, t_compute_s: ArrayLike, t_sync_s: ArrayLike, n_workers: ArrayLike) -> float | FloatArray:
        """The step time from its parts (Eq. 2): compute slowed by ``rho`` when N > 1, then
        combined with the sync time under the overlap ``gamma``."""
        n = np.asarray(n_workers, float)
        tc = np.asarray(t_compute_s, float) * (1.0 + self.rho * (n > 1))
        ts = np.asarray(t_sync_s, float)
        g = self.gamma
        if g == 1.0:
            return tc + ts
        return (tc**g + ts**g) ** (1.0 / g)

    @overload
    def epoch_time_s(
        self, global_batch: float, n_workers: float, dataset_size: int, ranks_per_node: float | None = None
    ) -> float: ...
    @overload
    def epoch_time_s(
        self, global_batch: ArrayLike, n_workers: ArrayLike, dataset_size: int, ranks_per_node: ArrayLike | None = None
    ) -> FloatArray: ...
    def epoch_time_s(
        self, global_batch: ArrayLike, n_workers: ArrayLike, dataset_size: int, ranks_per_node: ArrayLike | None = None
    ) -> float | FloatArray:
        """Eq. 4a for one epoch: D / B steps of the predicted t_step."""
        big_b = np.asarray(global_batch, float)
        t = self.t_step_s(big_b / np.asarray(n_workers, float), n_workers, ranks_per_node)
        return training_time_s(t, big_b, dataset_size)

    @overload
    def total_time_s(
        self,
        global_batch: float,
        n_workers: float,
        dataset_size: int,
        epochs: int,
        ranks_per_node: float | None = None,
    ) -> float: ...
    @overload
    def total_time_s(
        self,
        global_batch: ArrayLike,
        n_workers: ArrayLike,
        dataset_size: int,
        epochs: int,
        ranks_per_node: ArrayLike | None = None,
    ) -> FloatArray: ...
    def total_time_s(
        self,
        global_batch: ArrayLike,
        n_workers: ArrayLike,
        dataset_size: int,
        epochs: int,
        ranks_per_node: ArrayLike | None = None,
    ) -> float | FloatArray:
        """Eq. 4a: T = E * D / B * t_step."""
        return epochs * self.epoch_time_s(global_batch, n_workers, dataset_size, ranks_per_node)

    def with_sequence_length(self, reference_length: int, trials: Sequence[Trial]) -> PerfModel:
        """This model (its ``c1`` fitted at ``reference_length``) with the compute's terms in
        B*L and B*L^2 fitted to the successful ``trials`` at other lengths (their
        ``sequence_length``; each one's compute-only time, where its ranks ran): each trial's
        seconds per sample beyond ``c0`` and the co-location, against ``c1``, by least squares on
        relative error.  The L^2 term only where more than two lengths were measured (the
        reference among them), never below 0; unchanged without another length."""
        ok = [t for t in _ok(trials) if t.sequence_length not in (None, reference_length)]
        if not ok:
            return self
        ref = float(reference_length)
        ls = np.array([t.sequence_length for t in ok], float)
        b = np.array([t.local_batch for t in ok], float)
        m = np.array([min(t.n_workers, world_shape(t)[0]) for t in ok], float)
        tc = np.array([t.t_compute_s for t in ok], float)
        own = (tc - self.kappa0 * (m - 1)) / (1.0 + self.kappa * (m - 1))
        per_sample = (own - self.c0) / b - self.c1  # beyond the reference's
        w = b / np.maximum(own, 1e-12)  # relative error of the compute time
        per_token, per_token_sq = fit_length_terms(ls, ref, per_sample, w)
        return replace(
            self, sequence_length=int(reference_length), c1_per_token=float(per_token),
            c1_per_token_squared=float(per_token_sq),
        )  # fmt: skip

    # ---------------------------------------------------------------- records
    def to_dict(self) -> dict:
        d = asdict(self)
        d["frozen"], d["notes"] = list(self.frozen), list(self.notes)
        if self.sequence_length is None:  # a model of one length: its record as before sequence lengths
            for name in ("sequence_length", "c1_per_token", "c1_per_token_squared"):
                d.pop(name)
        if not self.sync_share_per_micro_batch:  # DDP's: its record as before FSDP's accumulation
            d.pop("sync_share_per_micro_batch")
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PerfModel:
        d = dict(d)  # a record from before the intra-node link has none: None, the inter-node one
        d["frozen"], d["notes"] = tuple(d.get("frozen", ())), tuple(d.get("notes", ()))
        return cls(**d)


# --------------------------------------------------------------------------- fitting
def _arrays(trials: Sequence[Trial]) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    ok = _ok(trials)
    b = np.array([t.local_batch for t in ok], float)
    n = np.array([t.n_workers for t in ok], float)
    ts = np.array([t.t_step_s for t in ok], float)
    tc = np.array([t.t_compute_s for t in ok], float)
    return b, n, ts, tc


def _identifiable(
    b: FloatArray, n: FloatArray, topo: tuple[FloatArray, FloatArray] | None = None, collective: str = "ring"
) -> set[str]:
    """Parameters the design can identify (``topo``: each trial's (R, H) when the worlds
    spanned several hosts).  A latency needs two worlds whose hops and bytes differ in ratio:
    two sizes (the tree across hosts: two depths of the tree of hosts)."""
    free = {"c1"}
    if len(np.unique(b)) >= 2:
        free.add("c0")
    if any(len(np.unique(b[n == size])) >= 3 for size in np.unique(n)):  # a floor and a line: three batches
        free.add("t_floor_s")
    m = n if topo is None else np.minimum(n, topo[0])  # ranks sharing a host
    sizes = np.unique(m)
    if len(sizes) >= 2 and any(len(np.unique(b[m == s])) >= 1 for s in sizes):
        free.add("kappa")
        if len(np.unique(b[m > 1])) >= 2:
            free.add("kappa0")
    multi = n > 1
    if topo is None:
        linked, alone = multi, np.zeros_like(multi)
    else:
        linked, alone = multi & (topo[1] > 1), multi & (topo[1] <= 1)  # worlds across hosts; on one host alone
    depth = n if topo is None or collective != "tree" else np.ceil(np.log2(np.maximum(topo[1], 1)))
    if linked.any():
        free.add("beta")
        if len(np.unique(depth[linked])) >= 2:
            free.add("alpha")
    if alone.any():
        free.add("beta_intra")
        if len(np.unique(n[alone] if collective != "tree" else np.ceil(np.log2(n[alone])))) >= 2:
            free.add("alpha_intra")
    if multi.any() and len(np.unique(b[multi])) >= 2:
        free.add("rho")
    if "rho" in free:
        free.add("gamma")
    return free


def _initial(
    b: FloatArray,
    n: FloatArray,
    ts: FloatArray,
    tc: FloatArray,
    collective: str,
    grad_bytes: float,
    topo: tuple[FloatArray, FloatArray] | None = None,
) -> dict[str, float]:
    base = n == n.min()
    if len(np.unique(b[base])) >= 2:
        c1, c0 = np.polyfit(b[base], tc[base], 1)
    else:
        c1, c0 = float(np.median(tc / b)), 0.0
    c1 = max(c1, 1e-9)
    c0 = max(c0, 0.0)
    smallest = base & (b == b[base].min())

    def per_byte(sel: NDArray[np.bool_]) -> float:
        if not sel.any():
            return 0.0
        lb = link_bytes(collective, n[sel], grad_bytes)
        return float(np.median(np.maximum(ts[sel] - tc[sel], 1e-6) / np.maximum(lb, 1.0)))

    multi = n > 1
    if topo is None:
        beta, beta_in = per_byte(multi), 0.0
    else:
        beta, beta_in = per_byte(multi & (topo[1] > 1)), per_byte(multi & (topo[1] <= 1))
    return {
        "c0": c0,
        "c1": c1,
        # at the smallest batch's compute: a floor starts where it binds (below every point its
        # gradient would be 0), and the fit lowers it where a line explains the points
        "t_floor_s": max(float(np.median(tc[smallest])), 1e-6),
        "kappa": 0.01,
        "kappa0": max(0.1 * c0, 1e-5),
        "alpha": 1e-6,
        "beta": max(beta, 1e-15),
        "rho": 0.01,
        "gamma": 1.0,
        "alpha_intra": 1e-6,
        "beta_intra": max(beta_in or beta, 1e-15),
    }


_BOUNDS = {
    "c0": (0.0, np.inf),
    "c1": (1e-12, np.inf),
    "t_floor_s": (0.0, np.inf),
    "kappa": (0.0, 20.0),
    "kappa0": (0.0, np.inf),
    "alpha": (0.0, np.inf),
    "beta": (0.0, np.inf),
    "rho": (0.0, 20.0),
    "gamma": (1.0, 10.0),
    "alpha_intra": (0.0, np.inf),
    "beta_intra": (0.0, np.inf),
}


def _fit_once(
    b: FloatArray,
    n: FloatArray,
    ts: FloatArray,
    tc: FloatArray,
    collective: str,
    grad_bytes: float,
    free: list[str],
    fixed: dict[str, float],
    topo: tuple[FloatArray, FloatArray] | None = None,
) -> tuple[PerfModel, float]:
    from scipy.optimize import least_squares  # here: reading a models record need not import scipy

    init = _initial(b, n, ts, tc, collective, grad_bytes, topo)
    # optimise in scaled units so that every parameter is O(1)
    scale = {k: max(abs(init[k]), 1e-12) if k not in ("kappa", "rho", "gamma") else 1.0 for k in free}
    x0 = np.array([min(max(init[k], _BOUNDS[k][0]), _BOUNDS[k][1]) / scale[k] for k in free])
    lo = np.array([_BOUNDS[k][0] / scale[k] for k in free])
    hi = np.array([_BOUNDS[k][1] / scale[k] for k in free])
    x0 = np.clip(x0, lo + 1e-12, np.where(np.isfinite(hi), hi - 1e-9, np.inf))
    r, h = (None, None) if topo is None else topo

    def build(x: FloatArray) -> PerfModel:
        p: dict[str, Any] = {k: float(v) for k, v in fixed.items()}
        p.update({k: float(v * scale[k]) for k, v in zip(free, x)})
        return PerfModel(collective=collective, grad_bytes=int(grad_bytes), **p)

    def resid(x: FloatArray) -> FloatArray:
        m = build(x)
        rc = np.log(np.maximum(m.t_compute_s(b, n if r is None else np.minimum(n, r)), 1e-12)) - np.log(tc)
        rs = np.log(np.maximum(m.t_step_s(b, n, r, h), 1e-12)) - np.log(ts)
        return np.concatenate([rc, rs])

    sol = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=2000)
    m = build(sol.x)
    err = float(np.sqrt(np.mean(resid(sol.x) ** 2)))
    return m, err


def fit_perf_model(
    trials: Sequence[Trial],
    collective: str = "ring",
    grad_bytes: int = 0,
    overlap: str = "auto",
    min_gain: float = 0.05,
) -> PerfModel:
    """Fit the model to profiled trials (:class:`~tula.core.trial.Trial`: n_workers, local_batch,
    t_step_s, t_compute_s, status, and where the ranks ran: hosts, ranks_per_host).  ``overlap``:
    ``auto`` (keep gamma > 1 only when it lowers the RMSLE by more than ``min_gain``),
    ``never`` or ``always``.  Worlds all on one host: the flat model; some world across
    hosts: the topology, each trial at its own R and H (see the module docstring)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; use one of {COLLECTIVES}")
    b, n, ts, tc = _arrays(trials)
    if len(b) == 0:
        raise ValueError("no successful trial to fit the performance model to")
    topo = trial_topology(trials)
    free_set = _identifiable(b, n, topo, collective)
    params = PARAMS if topo is None else PARAMS + INTRA_PARAMS
    defaults = {"c0": 0.0, "c1": 0.0, "t_floor_s": 0.0, "kappa": 0.0, "kappa0": 0.0, "alpha": 0.0, "beta": 0.0,
                "rho": 0.0, "gamma": 1.0}  # fmt: skip
    notes = []
    if "c0" not in free_set:
        defaults["c0"] = 0.0
        notes.append("one local batch only: compute assumed proportional to the batch (c0 = 0)")
    if "beta" not in free_set:
        notes.append("no trial with more than one worker: sync time cannot be measured and is taken as 0")
    if topo is not None:
        r, h = topo
        notes.append(
            f"worlds across up to {int(h.max())} hosts, up to {int(r.max())} rank(s) on one host: the sync "
            "term is fitted on the topology, each trial at its own ranks per host and hosts"
        )
        if "beta_intra" not in free_set:
            notes.append(NOTE_NO_SHARED_HOST if r.max() < 2 else NOTE_NO_LONE_HOST)
        elif "alpha_intra" not in free_set:
            defaults["alpha_intra"] = 0.0  # folded into beta_intra, as alpha into beta
            notes.append(NOTE_INTRA_LATENCY)
    additive = [k for k in params if k in free_set and k != "gamma"]
    fixed = {k: v for k, v in defaults.items() if k not in additive}
    best, best_err = _fit_once(b, n, ts, tc, collective, grad_bytes, additive, fixed, topo)
    if overlap != "never" and "gamma" in free_set:
        fixed_o = {k: v for k, v in fixed.items() if k != "gamma"}
        m_o, err_o = _fit_once(b, n, ts, tc, collective, grad_bytes, additive + ["gamma"], fixed_o, topo)
        if overlap == "always" or err_o < best_err * (1.0 - min_gain):
            best, best_err = m_o, err_o
            notes.append(f"overlap form kept: gamma = {m_o.gamma:.2f}")
    frozen = tuple(k for k in params if k not in free_set or (k == "gamma" and best.gamma == 1.0))
    best = _floor_only_where_it_binds(best, b)  # every profiled local batch, at every cluster size
    if best.t_floor_s > 0:
        notes.append(floor_note(best))
    return replace(best, frozen=frozen, rmsle=best_err, n_trials=int(len(b)), notes=tuple(notes))


def _floor_only_where_it_binds(model: PerfModel, local_batches: np.ndarray) -> PerfModel:
    """``model`` with its floor at 0 when it binds at no profiled batch (a line explains them
    all, and the floor's value below the smallest is a guess): the same fit, said plainly."""
    line = model.c0 + model.c1 * np.asarray(local_batches, float)
    return model if np.any(model.t_floor_s > line * (1 + 1e-6)) else replace(model, t_floor_s=0.0)


def floor_note(model: PerfModel) -> str:
    """The sentence for a fitted floor: where the step stops getting faster with b."""
    knee = (model.t_floor_s - model.c0) / model.c1 if model.c1 > 0 else float("inf")
    return (
        f"one rank's compute has a floor of {model.t_floor_s * 1e3:.1f} ms (the host, not the device, sets the "
        f"pace of small steps): below a local batch of about {max(knee, 0):.0f} a step takes that long whatever b"
    )


def relative_error(predicted: ArrayLike, measured: ArrayLike) -> np.ndarray:
    """|predicted - measured| / measured, elementwise: the one error metric of every model."""
    m = np.asarray(measured, float)
    return np.abs(np.asarray(predicted, float) - m) / m


def trial_step_s(model: PerfModel, trials: Sequence[Trial]) -> np.ndarray:
    """``model``'s step time at each successful trial, where its ranks ran (its own R and H
    when the worlds spanned several hosts), at its sequence length where it has one."""
    b, n, _, _ = _arrays(trials)
    topo = trial_topology(trials)
    lengths = [t.sequence_length for t in _ok(trials)]
    length = None if model.sequence_length is None else np.array([x or model.sequence_length for x in lengths], float)
    if topo is None:
        return model.t_step_s(b, n, sequence_length=length)
    return model.t_step_s(b, n, *topo, sequence_length=length)


def relative_errors(model: PerfModel, trials: Sequence[Trial]) -> np.ndarray:
    """Relative step-time error of ``model`` over the successful trials."""
    return relative_error(trial_step_s(model, trials), _arrays(trials)[2])
