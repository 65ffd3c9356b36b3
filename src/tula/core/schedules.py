"""Batch-size schedules: how the global batch (and the worker count with it) moves during a run.

One table, :data:`SCHEDULES`, that the spec, the runner, the CLI and the benchmarks read
(like :data:`tula.core.registry.METHODS`); its parameters and their constraints are data.  No
torch here: the decision is pure arithmetic on the epochs' records.

=============================  =================================================================
``constant``                   B0 for the whole run
``geometric``                  AdaDamp's GeoDamp: B0 * factor ** floor(epoch / delay)
``linear``                     PadaDamp: B0 + ceil(rate * k) after k model updates
``increase_instead_of_decay``  Smith et al.: at each of ``train.lr_milestones`` the batch is
                               multiplied by 1 / ``train.lr_gamma`` instead of decaying the LR;
                               at the largest batch the LR decays instead
``loss_ratio``                 AdaDamp: B0 * (F(w0) - F*) / (F(wk) - F*), F from the epochs'
                               training loss
``adaptive``                   follows the gradient noise scale B_simple
                               (:mod:`tula.core.noise_scale`), clipped, with hysteresis and a
                               maximum growth per boundary
``piecewise``                  a hand-written list: ``batches[i]`` for the i-th period of
                               ``every_epochs`` epochs, the last for the rest of the run
                               (the batch may also shrink)
=============================  =================================================================

The runner calls :func:`next_config` once before the first epoch (``epoch_done=0``, empty
history) and at every epoch boundary after; it is a pure function of the schedule state
(a :class:`ScheduleState`, kept in the checkpoint as JSON: :meth:`ScheduleState.to_dict`), the
finished epochs' records (what a schedule reads of each: :class:`FinishedEpoch`) and the
:class:`Caps`, and returns a :class:`Decision` that carries the next state.  Every
schedule is capped by the memory model's largest local batch times the largest worker
count (times ``Caps.max_accumulation_steps``), by ``max_batch`` and by the training-set
size; the global batch is rounded down to a multiple of the worker count
N = clip(ceil(B / batch_per_worker), min, max).

Growing through accumulation: when the memory caps the local batch and N cannot grow
further, a batch above N x the largest local batch is reached with k accumulation steps
(each rank's share B / N as k micro-batches that fit), k <= ``Caps.max_accumulation_steps``;
the fewest k that split the share evenly (:func:`tula.core.accumulation.accumulation_for`, the
planner's rule), the share rounded down where no k up to the cap splits it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Protocol

from tula.core.accumulation import accumulation_for
from tula.core.config import Config
from tula.core.errors import SpecError

STATE_VERSION = 1
#: how the LR follows the batch, relative to the first batch B0: keep it, times B/B0, times sqrt(B/B0)
LR_RULES: tuple[str, ...] = ("keep", "linear", "sqrt")

_EPS = 1e-9  # floor/ceil tolerance: 32 / 0.1 is 319.99999999999997, 0.1 * 30 is 3.0000000000000004


def _floor(x: float) -> int:
    return math.floor(x + _EPS * max(1.0, abs(x)))


def _ceil(x: float) -> int:
    return math.ceil(x - _EPS * max(1.0, abs(x)))


def steps_per_epoch(dataset_size: int, global_batch: int) -> int:
    """Optimiser steps per epoch: every full global batch (at least one).  The runner trains
    this many; the simulator counts them."""
    return max(1, dataset_size // global_batch)


# ---------------------------------------------------------------------------- parameters as data
@dataclass(frozen=True)
class Param:
    """A schedule's own parameter: its type, default and bounds.

    ``default`` ``None`` means "the first global batch" (``adaptive``'s ``min_batch``).
    ``low``/``high`` bound it, exclusive where ``low_open``/``high_open``."""

    name: str
    type: type
    default: float | int | None
    help: str
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    required: bool = False

    def bounds(self) -> str:
        """The allowed range in words ("greater than 1", "between 0 and 1, exclusive")."""
        if self.low is not None and self.high is not None:
            return (
                f"between {self.low:g} and {self.high:g} (exclusive)"
                if self.low_open and self.high_open
                else f"between {self.low:g} and {self.high:g}"
            )
        if self.low is not None:
            return f"greater than {self.low:g}" if self.low_open else f"at least {self.low:g}"
        if self.high is not None:
            return f"less than {self.high:g}" if self.high_open else f"at most {self.high:g}"
        return "a finite number"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed (a sentence without its subject), or ``None``."""
        if self.type is list:  # a non-empty list of integers, each within the bounds
            if not isinstance(value, (list, tuple)) or not value:
                return f"must be a non-empty list of integers, not {value!r}"
            item = Param(self.name, int, None, self.help, self.low, self.low_open, self.high, self.high_open)
            for i, v in enumerate(value):
                problem = item.problem(v)
                if problem:
                    return f"entry {i} {problem}"
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (self.type is int and not float(value).is_integer())
        ):
            return f"must be {'an integer' if self.type is int else 'a number'}, not {value!r}"
        v = float(value)
        bad = not math.isfinite(v)
        if self.low is not None:
            bad = bad or (v <= self.low if self.low_open else v < self.low)
        if self.high is not None:
            bad = bad or (v >= self.high if self.high_open else v > self.high)
        return f"must be {self.bounds()}, not {value!r}" if bad else None


# ---------------------------------------------------------------------------- the schedules
class RankedConfig(Protocol):
    """One configuration a workers rule ranked for a batch (:class:`tula.core.live_plan.Option`,
    :class:`tula.core.records.RankedOption`): what a :class:`Decision`'s ranking holds."""

    @property
    def global_batch(self) -> int: ...
    @property
    def n_workers(self) -> int: ...
    @property
    def accumulation_steps(self) -> int: ...
    @property
    def epoch_s(self) -> float: ...
    @property
    def score(self) -> float: ...
    @property
    def micro_batch(self) -> int: ...


class EpochFigures(Protocol):
    """An epoch's figures as an object holds them (:class:`tula.core.records.EpochRecord`): what
    :meth:`FinishedEpoch.of` reads of one."""

    @property
    def steps(self) -> int | None: ...
    @property
    def train_loss(self) -> float | None: ...
    @property
    def b_simple(self) -> float | None: ...


@dataclass(frozen=True)
class FinishedEpoch:
    """What a schedule reads of a finished epoch: its model updates, its mean training loss and
    the gradient noise scale measured over it (``None``: not measured), and the configuration it
    ran at.  Made by :meth:`of` from a metrics line (a dict), an
    :class:`~tula.core.records.EpochRecord` or a simulated epoch; a figure it does not give is
    ``None``."""

    steps: int | None
    train_loss: float | None = None
    b_simple: float | None = None
    epoch: int | None = None
    global_batch: int | None = None
    n_workers: int | None = None

    @classmethod
    def of(cls, epoch: FinishedEpoch | EpochFigures | Mapping[str, Any]) -> FinishedEpoch:
        """``epoch``'s figures that a schedule reads."""
        if isinstance(epoch, FinishedEpoch):
            return epoch
        if isinstance(epoch, Mapping):
            return cls(**{f.name: epoch.get(f.name) for f in fields(cls)})
        return cls(**{f.name: getattr(epoch, f.name, None) for f in fields(cls)})


@dataclass
class _Ctx:
    """What a schedule sees at a boundary (``state`` its own, replaced as it settles)."""

    state: ScheduleState
    epoch_done: int
    history: Sequence[FinishedEpoch]
    cap: int  # the largest global batch allowed (memory x workers, max_batch, data set)
    caps: Caps | None = None  # the bounds themselves (goodput reads their workers rule's models)


def _last_b_simple(ctx: _Ctx) -> float | None:
    """The last finished epoch's B_simple, or None where none was measured (None, NaN)."""
    bs = ctx.history[-1].b_simple if ctx.history else None
    return None if bs is None or (isinstance(bs, float) and math.isnan(bs)) else float(bs)


def _train_loss(epoch: FinishedEpoch) -> float:
    """A finished epoch's training loss (a schedule that reads it refuses an epoch without one)."""
    if epoch.train_loss is None:
        raise ValueError(f"the record of epoch {epoch.epoch or '?'} holds no train_loss")
    return float(epoch.train_loss)


@dataclass(frozen=True)
class Schedule:
    """A batch-size schedule with its own parameters (a subclass's fields, in the order of its
    :class:`ScheduleInfo`'s ``params``): :meth:`want` says which global batch it wants after
    ``ctx.epoch_done`` epochs (before caps and rounding), and a one-line reason."""

    name: ClassVar[str] = ""

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        raise NotImplementedError

    def settle(self, ctx: _Ctx, wanted: float, batch: int) -> tuple[str, bool]:
        """After the caps: update ``ctx.state`` knowing the batch actually chosen.  Returns a
        reason to append ('' for none) and whether the LR decays instead of the batch growing."""
        return "", False

    def params(self) -> dict[str, Any]:
        """The parameters as JSON values (the ``params`` of :meth:`ScheduleState.to_dict`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: list(v) if isinstance(v, tuple) else v for name, v in values.items()}


@dataclass(frozen=True)
class Constant(Schedule):
    name: ClassVar[str] = "constant"

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        return ctx.state.b0, f"constant batch {ctx.state.b0}"


@dataclass(frozen=True)
class Geometric(Schedule):
    name: ClassVar[str] = "geometric"
    factor: float
    delay: int

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        b0, j = ctx.state.b0, ctx.epoch_done // self.delay
        return b0 * self.factor**j, f"geometric: {b0} x {self.factor:g}^{j} after epoch {ctx.epoch_done}"


@dataclass(frozen=True)
class Linear(Schedule):
    name: ClassVar[str] = "linear"
    rate: float

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        if any(h.steps is None for h in ctx.history):
            raise ValueError("batch schedule 'linear' counts model updates, but an epoch's record holds no steps")
        b0, rate = ctx.state.b0, self.rate
        k = sum(int(h.steps or 0) for h in ctx.history)
        return b0 + _ceil(rate * k), f"linear: {b0} + ceil({rate:g} x {k} updates)"


@dataclass(frozen=True)
class IncreaseInsteadOfDecay(Schedule):
    """The batch times 1/gamma at each milestone not yet applied; where the cap stops the
    batch short, the LR takes the rest of the factor: LR x gamma * B_new / B_old."""

    name: ClassVar[str] = "increase_instead_of_decay"

    def _pending(self, ctx: _Ctx) -> int:
        s = ctx.state
        return sum(m <= ctx.epoch_done for m in s.lr_milestones) - s.milestones_applied

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        s, p = ctx.state, self._pending(ctx)
        if p <= 0:
            return s.batch, f"no LR milestone reached: batch stays {s.batch}"
        g = s.lr_gamma**p
        return s.batch / g, f"LR milestone: the batch x{1 / g:g} instead of the LR decay"

    def settle(self, ctx: _Ctx, wanted: float, batch: int) -> tuple[str, bool]:
        s, p = ctx.state, self._pending(ctx)
        if p <= 0:
            return "", False
        old = s.batch
        ctx.state = replace(s, milestones_applied=s.milestones_applied + p)
        g = s.lr_gamma**p
        if _floor(wanted) <= ctx.cap:
            return "", False
        decay = min(1.0, g * batch / old)
        ctx.state = replace(ctx.state, lr_decay=ctx.state.lr_decay * decay)
        return f", but the largest batch is {ctx.cap}: the LR decays x{decay:.4g} instead", True


@dataclass(frozen=True)
class LossRatio(Schedule):
    """F(w0) is the state's ``f0``: the loss the runner measured before training if it gave
    one, else the first epoch's training loss (so the first boundary keeps B0)."""

    name: ClassVar[str] = "loss_ratio"
    f_star: float

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        s = ctx.state
        if not ctx.history:
            return s.b0, f"loss ratio: no epoch finished, batch {s.b0}"
        if s.f0 is None:
            s = ctx.state = replace(s, f0=_train_loss(ctx.history[0]))
        f_star, f0, fk = self.f_star, s.f0, _train_loss(ctx.history[-1])
        assert f0 is not None  # set just above
        if not (math.isfinite(fk) and f0 - f_star > 0):
            return s.batch, f"loss ratio undefined (F(w0)={f0:.4g}, F(wk)={fk:.4g}, F*={f_star:g}): batch stays"
        if fk - f_star <= 0:
            return math.inf, f"loss ratio: F(wk)={fk:.4g} is at or below F*={f_star:g}, so the largest batch"
        ratio = (f0 - f_star) / (fk - f_star)
        return s.b0 * ratio, f"loss ratio: {s.b0} x ({f0:.4g} - {f_star:g}) / ({fk:.4g} - {f_star:g})"


@dataclass(frozen=True)
class Adaptive(Schedule):
    """Target = clip(B_simple of the last epoch, min_batch, cap).  The batch changes only
    when the target differs from the current batch by more than ``band`` of it, and then by
    at most ``max_growth`` (up or down) per boundary.  No B_simple (None, NaN): no change;
    an infinite one (no measurable gradient signal above the noise): towards the cap."""

    name: ClassVar[str] = "adaptive"
    min_batch: int | None
    band: float
    max_growth: float

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        s = ctx.state
        cur = s.batch
        if not ctx.history:
            return s.b0, f"adaptive: starting at {s.b0}"
        bs = _last_b_simple(ctx)
        if bs is None:
            return cur, f"adaptive: no B_simple measured, batch stays {cur}"
        lo = self.min_batch if self.min_batch is not None else s.b0
        target = min(max(float(bs), lo), ctx.cap)
        if abs(target - cur) <= self.band * cur:
            if float(bs) < lo:
                return cur, f"adaptive: B_simple {float(bs):.4g} is below the smallest batch {lo}, batch stays {cur}"
            return cur, f"adaptive: B_simple {float(bs):.4g} is within {self.band:g} of batch {cur}, no change"
        new = min(max(target, cur / self.max_growth), cur * self.max_growth)
        limited = " (growth limited)" if new != target else ""
        return new, f"adaptive: B_simple {float(bs):.4g} -> batch {_floor(new)}{limited}"


@dataclass(frozen=True)
class Goodput(Schedule):
    """Pollux's goodput for one job: of the batches within ``max_growth`` of the current one,
    the one whose best worker count has the largest predicted throughput times the
    statistical efficiency (B_noise + B0) / (B_noise + B), B_noise the last epoch's B_simple
    (:func:`tula.core.live_plan.choose_goodput`, through ``Caps.workers_rule``, which holds the
    fitted models).  No B_simple (None, NaN): no change; an infinite one: towards the cap."""

    name: ClassVar[str] = "goodput"
    min_batch: int | None
    max_growth: float

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        s = ctx.state
        cur = s.batch
        if not ctx.history:
            return s.b0, f"goodput: starting at {s.b0}"
        bs = _last_b_simple(ctx)
        if bs is None:
            return cur, f"goodput: no B_simple measured, batch stays {cur}"
        if math.isinf(bs):
            return min(cur * self.max_growth, ctx.cap), "goodput: no gradient noise measurable, towards the cap"
        rule = ctx.caps.workers_rule if ctx.caps is not None else None
        if rule is None or not hasattr(rule, "choose_batch"):
            raise SpecError("batch schedule 'goodput' needs the fitted models to rank batches")
        lo = self.min_batch if self.min_batch is not None else s.b0
        batch, reason = rule.choose_batch(ctx.caps, cur, s.workers, bs, s.b0, self.max_growth, lo, ctx.cap)
        return batch, reason


@dataclass(frozen=True)
class Piecewise(Schedule):
    """``batches[i]`` during the i-th period of ``every_epochs`` epochs; after the list, its last."""

    name: ClassVar[str] = "piecewise"
    batches: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "batches", tuple(self.batches))  # a list as read from JSON

    def want(self, ctx: _Ctx) -> tuple[float, str]:
        batches, every = self.batches, ctx.state.every_epochs
        i = min(ctx.epoch_done // every, len(batches) - 1)
        return batches[i], f"piecewise: entry {i} of {list(batches)}"


# ---------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class ScheduleInfo:
    """A batch-size schedule: its name, class, parameters and what else it reads.

    Attributes
    ----------
    name : what ``train.batch_schedule.kind`` and ``--schedule`` accept
    cls : its :class:`Schedule` subclass
    summary : one line for the CLI's help
    params : its own parameters (fields of ``train.batch_schedule``), with defaults and bounds
    spec_fields : other spec fields it reads
    owns_lr_milestones : it decides what ``train.lr_milestones`` do (the runner must not
        apply the milestone decay itself; the decision's ``lr_decay`` holds the decays taken)
    needs_b_simple : it reads ``b_simple`` from the epochs' records (the runner must
        estimate the gradient noise scale)
    needs_train_loss : it reads ``train_loss`` from the epochs' records (a simulation needs
        a training run's losses to follow it)
    needs_models : it ranks batches by the fitted models (the runner must have a models
        record; ``Caps.workers_rule`` carries them)
    """

    name: str
    cls: type[Schedule]
    summary: str
    params: tuple[Param, ...] = ()
    spec_fields: tuple[str, ...] = ()
    owns_lr_milestones: bool = False
    needs_b_simple: bool = False
    needs_train_loss: bool = False
    needs_models: bool = False

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}


_TABLE = (
    ScheduleInfo("constant", Constant, "the first global batch for the whole run"),
    ScheduleInfo(
        "geometric",
        Geometric,
        "AdaDamp's GeoDamp: B0 x factor^floor(epoch / delay)",
        (
            Param("factor", float, 2.0, "the batch is multiplied by this every `delay` epochs", low=1.0, low_open=True),
            Param("delay", int, 5, "epochs between two growths", low=1),
        ),
    ),
    ScheduleInfo(
        "linear",
        Linear,
        "PadaDamp: B0 + ceil(rate x model updates so far), at epoch boundaries",
        (Param("rate", float, 1.0, "samples added to the batch per model update", low=0.0, low_open=True),),
    ),
    ScheduleInfo(
        "increase_instead_of_decay",
        IncreaseInsteadOfDecay,
        "Smith et al.: at each LR milestone the batch x 1/lr_gamma instead of the LR decay, "
        "the LR decays at the largest batch",
        spec_fields=("train.lr_milestones", "train.lr_gamma"),
        owns_lr_milestones=True,
    ),
    ScheduleInfo(
        "loss_ratio",
        LossRatio,
        "AdaDamp: B0 x (F(w0) - F*) / (F(wk) - F*) from the training loss",
        (Param("f_star", float, 0.0, "the smallest loss the model can reach (F*)"),),
        needs_train_loss=True,
    ),
    ScheduleInfo(
        "adaptive",
        Adaptive,
        "follows the gradient noise scale B_simple, with hysteresis and a maximum growth per boundary",
        (
            Param("min_batch", int, None, "the smallest batch it goes to (default: the first batch)", low=1),
            Param(
                "band",
                float,
                0.2,
                "relative difference between B_simple and the batch that is ignored",
                low=0.0,
                low_open=True,
                high=1.0,
                high_open=True,
            ),
            Param("max_growth", float, 2.0, "largest factor the batch may grow or shrink by at one boundary", low=1.0),
        ),
        needs_b_simple=True,
    ),
    ScheduleInfo(
        "goodput",
        Goodput,
        "the batch (and workers) of the largest predicted goodput: throughput x (B_noise + B0) / (B_noise + B), "
        "Pollux's objective for one job; needs the fitted models",
        (
            Param("min_batch", int, None, "the smallest batch it goes to (default: the first batch)", low=1),
            Param("max_growth", float, 2.0, "largest factor the batch may grow or shrink by at one boundary", low=1.0),
        ),
        needs_b_simple=True,
        needs_models=True,
    ),
    ScheduleInfo(
        "piecewise",
        Piecewise,
        "a hand-written list of global batches, one per period of every_epochs "
        "epochs (the last holds); the batch may shrink too",
        (Param("batches", list, None, "the global batch of each period, e.g. [64, 128, 64]", low=1, required=True),),
    ),
)

SCHEDULES: dict[str, ScheduleInfo] = {s.name: s for s in _TABLE}
SCHEDULE_NAMES: tuple[str, ...] = tuple(SCHEDULES)
#: every schedule parameter name (the fields of ``train.batch_schedule`` besides the common ones)
PARAM_NAMES: tuple[str, ...] = tuple(dict.fromkeys(p.name for s in _TABLE for p in s.params))


def schedule_info(name: str) -> ScheduleInfo:
    """The entry of ``name``; an unknown name is a :class:`~tula.core.errors.SpecError`."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise SpecError(f"unknown batch schedule {name!r}; use one of {', '.join(SCHEDULE_NAMES)}") from None


def param_problem(kind: str, name: str, value: Any) -> str | None:
    """Why ``value`` is not allowed for parameter ``name`` of schedule ``kind`` (a sentence
    fragment the spec prefixes with the field), or ``None``."""
    info = schedule_info(kind)
    p = info.param(name)
    if p is None:
        names = [q.name for q in info.params]
        if not names:
            return f"it does not apply to schedule {kind!r}, which takes no parameters"
        if len(names) == 1:
            return f"it does not apply to schedule {kind!r}, whose only parameter is {names[0]}"
        return f"it does not apply to schedule {kind!r}, whose parameters are {', '.join(names[:-1])} and {names[-1]}"
    return p.problem(value)


def missing_param(kind: str, given: dict[str, Any]) -> str | None:
    """A sentence naming the first required parameter of ``kind`` not in ``given`` (set, not
    ``None``), or ``None``."""
    for p in schedule_info(kind).params:
        if p.required and given.get(p.name) is None:
            return f"batch schedule {kind!r} needs its parameter {p.name!r} ({p.help})"
    return None


# ---------------------------------------------------------------------------- caps and decisions
@dataclass(frozen=True)
class Caps:
    """What bounds the configuration at a boundary.

    Attributes
    ----------
    dataset_size : training samples; the global batch never exceeds it
    max_local_batch : the memory model's largest local batch (``None``: no memory bound)
    min_workers, max_workers : the allowed worker counts (equal when workers do not change)
    batch_per_worker : N = ceil(B / batch_per_worker), clipped to the range (``None``:
        ``min_workers``); N grows further when the local batch would not fit in memory
    max_accumulation_steps : the most micro-batches a rank's share may run as (1: none);
        above ``max_local_batch`` x ``max_workers`` the batch grows through them
    workers_rule : what chooses N and k for a batch instead of ``batch_per_worker`` (AdaDamp's
        rule), or ``None``: an object whose ``choose(global_batch, caps, current_workers)``
        returns ``(config, reason, ranking)``, the :class:`~tula.core.config.Config` within
        these caps, B rounded down to a multiple of N x k
        (:class:`tula.core.live_plan.WorkerPlan`: the fitted models' ranking)
    """

    dataset_size: int
    max_local_batch: int | None = None
    min_workers: int = 1
    max_workers: int = 1
    batch_per_worker: int | None = None
    max_accumulation_steps: int = 1
    workers_rule: Any = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.dataset_size < 1:
            raise SpecError(f"the training set must hold at least 1 sample, not {self.dataset_size}")
        if self.max_local_batch is not None and self.max_local_batch < 1:
            raise SpecError(f"the largest local batch must be at least 1, not {self.max_local_batch}")
        if not 1 <= self.min_workers <= self.max_workers:
            raise SpecError(f"the worker range {self.min_workers}..{self.max_workers} is empty or below 1")
        if self.batch_per_worker is not None and self.batch_per_worker < 1:
            raise SpecError(f"batch_per_worker must be at least 1, not {self.batch_per_worker}")
        if self.max_accumulation_steps < 1:
            raise SpecError(f"max_accumulation_steps must be at least 1, not {self.max_accumulation_steps}")


@dataclass(frozen=True)
class ScheduleState:
    """A schedule's state between two boundaries: its settings and what the decisions so far
    left behind.  Kept with the checkpoint as JSON: :meth:`to_dict`, :meth:`from_dict` (a
    state written by an earlier Tula of the same :data:`STATE_VERSION` loads).

    Attributes
    ----------
    schedule : the schedule with its own parameters (``kind`` and ``params`` in the JSON form)
    b0 : the first global batch B0
    every_epochs : the epochs between two boundaries where the batch may change
    lr_rule : how the LR follows the batch (:data:`LR_RULES`)
    lr_milestones, lr_gamma : the spec's LR milestones and decay (``increase_instead_of_decay``'s)
    batch : the global batch decided last (B0 before the first decision)
    max_batch : the largest global batch the schedule may reach (``None``: no own bound)
    f0 : F(w0) of ``loss_ratio`` (``None``: the first epoch's training loss, once read)
    epoch : finished epochs at the last decision (``None``: none decided yet)
    workers : N decided last (``None``: none decided yet)
    accumulation_steps : k decided last
    lr_decay : the product of the LR decays taken instead of growing the batch
    milestones_applied : the LR milestones ``increase_instead_of_decay`` has applied
    """

    schedule: Schedule
    b0: int
    every_epochs: int
    lr_rule: str
    lr_milestones: tuple[int, ...]
    lr_gamma: float
    batch: int
    max_batch: int | None = None
    f0: float | None = None
    epoch: int | None = None
    workers: int | None = None
    accumulation_steps: int = 1  # a state written before accumulation: k = 1
    lr_decay: float = 1.0
    milestones_applied: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr_milestones", tuple(self.lr_milestones))  # a list as read from JSON

    @property
    def kind(self) -> str:
        """The schedule's name (:data:`SCHEDULE_NAMES`)."""
        return self.schedule.name

    def to_dict(self) -> dict[str, Any]:
        """The state as JSON values, as the checkpoint keeps it."""
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "b0": self.b0,
            "params": self.schedule.params(),
            "every_epochs": self.every_epochs,
            "lr_rule": self.lr_rule,
            "max_batch": self.max_batch,
            "lr_milestones": list(self.lr_milestones),
            "lr_gamma": self.lr_gamma,
            "f0": self.f0,
            # what the decisions so far left behind
            "epoch": self.epoch,
            "batch": self.batch,
            "workers": self.workers,
            "accumulation_steps": self.accumulation_steps,
            "lr_decay": self.lr_decay,
            "milestones_applied": self.milestones_applied,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScheduleState:
        """A state from its JSON form (:meth:`to_dict`; a checkpoint's): another version is a
        :class:`~tula.core.errors.SpecError`; parameters it lacks take the table's defaults."""
        if data.get("version") != STATE_VERSION:
            raise SpecError(f"batch schedule state version {data.get('version')!r} is not {STATE_VERSION}")
        info = schedule_info(data.get("kind", ""))
        schedule = info.cls(**{**info.defaults(), **(data.get("params") or {})})
        own = {f.name for f in fields(cls)} - {"schedule"}
        return cls(schedule=schedule, **{k: v for k, v in data.items() if k in own})


@dataclass(frozen=True)
class Decision:
    """The configuration of the epochs from ``epoch`` on, decided after ``epoch`` epochs.

    Attributes
    ----------
    epoch : finished epochs when it was decided (0: before training)
    global_batch : B, a multiple of ``n_workers`` x ``accumulation_steps``
    n_workers : N
    local_batch : B / N, a rank's share of a step
    wanted_batch : what the schedule asked for before the caps and rounding (``None``: unbounded)
    capped_by : ``"memory"``, ``"max_batch"``, ``"dataset"`` or ``None``
    lr_scale : the LR rule's multiplier relative to the first batch B0 (keep 1, linear
        B/B0, sqrt sqrt(B/B0))
    lr_decay : product of the LR decays taken instead of growing the batch
        (``increase_instead_of_decay``; 1.0 otherwise)
    decayed_instead : at this boundary the LR decayed because the batch was at its cap
    changed : B, N or k differ from the previous decision's
    resize : N differs from the previous decision's (a new world is needed)
    reason : one line
    state : the schedule state after this decision, to keep with the checkpoint
        (:meth:`ScheduleState.to_dict`)
    accumulation_steps : k, the micro-batches of a rank's share (1 unless the memory caps
        the local batch on the most workers and ``Caps.max_accumulation_steps`` allows more)
    ranking : with ``Caps.workers_rule``, the options it ranked for this batch, best first
        (each a :class:`RankedConfig`: B, N, k, the predicted epoch and the score); empty
        otherwise.  An epoch line keeps the decision as a :class:`tula.core.records.ScheduleDecision`
        (:meth:`~tula.core.records.ScheduleDecision.of`)
    """

    epoch: int
    global_batch: int
    n_workers: int
    local_batch: int
    wanted_batch: float | None
    capped_by: str | None
    lr_scale: float
    lr_decay: float
    decayed_instead: bool
    changed: bool
    resize: bool
    reason: str
    state: ScheduleState = field(repr=False, compare=False)
    accumulation_steps: int = 1
    ranking: tuple[RankedConfig, ...] = field(default=(), repr=False, compare=False)

    @property
    def micro_batch(self) -> int:
        """What one forward/backward of a rank holds: B / (N k)."""
        return self.local_batch // self.accumulation_steps

    @property
    def config(self) -> Config:
        """The configuration decided, (N, B, k) as one value."""
        return Config(self.n_workers, self.global_batch, self.accumulation_steps)

    @property
    def lr_multiplier(self) -> float:
        """What the spec's LR (and the method's own rule) is multiplied by: ``lr_scale * lr_decay``."""
        return self.lr_scale * self.lr_decay


def initial_state(
    kind: str,
    first_batch: int,
    params: dict[str, Any] | None = None,
    *,
    every_epochs: int = 1,
    lr_rule: str = "keep",
    max_batch: int | None = None,
    lr_milestones: Sequence[int] = (),
    lr_gamma: float = 0.1,
    f0: float | None = None,
) -> ScheduleState:
    """The state of schedule ``kind`` before training, starting at global batch ``first_batch``.

    ``params`` are the schedule's own parameters (missing ones take the table's defaults;
    others are a :class:`~tula.core.errors.SpecError`); ``f0`` is F(w0) for ``loss_ratio`` if
    the runner measured it (default: the first epoch's training loss)."""
    info = schedule_info(kind)
    given = dict(params or {})
    missing = missing_param(kind, given)
    if missing:
        raise SpecError(missing)
    for name, value in given.items():
        problem = param_problem(kind, name, value)
        if problem:
            raise SpecError(f"batch schedule parameter {name!r}: {problem}")
    if first_batch < 1:
        raise SpecError(f"the first global batch must be at least 1, not {first_batch}")
    if lr_rule not in LR_RULES:
        raise SpecError(f"unknown LR rule {lr_rule!r}; use one of {', '.join(LR_RULES)}")
    if every_epochs < 1:
        raise SpecError(f"every_epochs must be at least 1, not {every_epochs}")
    return ScheduleState(
        schedule=info.cls(**{**info.defaults(), **given}),
        b0=int(first_batch),
        every_epochs=int(every_epochs),
        lr_rule=lr_rule,
        max_batch=None if max_batch is None else int(max_batch),
        lr_milestones=tuple(sorted(int(m) for m in lr_milestones)),
        lr_gamma=float(lr_gamma),
        f0=None if f0 is None else float(f0),
        batch=int(first_batch),
    )


@dataclass(frozen=True)
class _Fitted:
    """A wanted batch within the caps: the configuration (N, B, k), what capped B (or None),
    the cap, and with a workers rule its reason and ranking."""

    config: Config
    capped_by: str | None
    cap: int
    why: str = ""
    ranking: tuple[RankedConfig, ...] = ()


def _fit(wanted: float, caps: Caps, max_batch: int | None, current_workers: int | None = None) -> _Fitted:
    """The configuration for a wanted global batch: N by ``caps.workers_rule`` when there is
    one (``current_workers``: the world now, which it may keep), else AdaDamp's rule."""
    config, capped_by, cap = _fit_by_batch_per_worker(wanted, caps, max_batch)
    if caps.workers_rule is None:
        return _Fitted(config, capped_by, cap)
    b_cap = cap if capped_by else max(1, _floor(wanted))
    config, why, ranking = caps.workers_rule.choose(b_cap, caps, current_workers)
    return _Fitted(config, capped_by, cap, why, tuple(ranking))


def _fit_by_batch_per_worker(wanted: float, caps: Caps, max_batch: int | None) -> tuple[Config, str | None, int]:
    """(the configuration, what capped B, the cap) for a wanted global batch, N = clip(ceil(B /
    batch_per_worker), min, max) and grown until the local batch fits the memory."""
    limits = [(caps.dataset_size, "dataset")]
    if max_batch is not None:
        limits.append((max_batch, "max_batch"))
    if caps.max_local_batch is not None:
        limits.append((caps.max_local_batch * caps.max_workers * caps.max_accumulation_steps, "memory"))
    cap, cap_why = min(limits, key=lambda t: t[0])  # first listed wins a tie: the data set, then max_batch
    capped_by = None
    if wanted >= cap + 1 or math.isinf(wanted):
        b, capped_by = cap, cap_why
    else:
        b = max(1, _floor(wanted))
    n = math.ceil(b / caps.batch_per_worker) if caps.batch_per_worker else caps.min_workers
    if caps.max_local_batch is not None:
        n = max(n, math.ceil(b / caps.max_local_batch))  # the local batch must fit in memory
    n = min(max(n, caps.min_workers), caps.max_workers)
    share = max(1, b // n)
    k = accumulation_for(share, caps.max_local_batch, caps.max_accumulation_steps)
    if k is None:  # no k up to the cap splits the share evenly: the share rounded down to one that splits
        k = math.ceil(share / caps.max_local_batch) if caps.max_local_batch else 1
        share = max(k, share // k * k)
    return Config(n, n * share, k), capped_by, cap


def _still_fits(b: int, n: int | None, k: int, caps: Caps, max_batch: int | None) -> bool:
    """Whether the current (B, N, k) still satisfies ``caps`` (then it is kept as it is:
    rounding B down to a multiple of N can make ceil(B / batch_per_worker) smaller than N)."""
    cap = _cap(caps, max_batch)
    return (
        n is not None
        and caps.min_workers <= n <= caps.max_workers
        and n <= b <= cap
        and b % (n * k) == 0
        and k <= caps.max_accumulation_steps
        and (caps.max_local_batch is None or b // n // k <= caps.max_local_batch)
    )


def _cap(caps: Caps, max_batch: int | None) -> int:
    """The largest global batch the caps allow."""
    return _fit_by_batch_per_worker(math.inf, caps, max_batch)[2]


_CAP_WORDS = {
    "memory": "the memory model (largest local batch x most workers x most accumulation steps)",
    "max_batch": "max_batch",
    "dataset": "the training-set size",
}


def _lr_scale(rule: str, batch: int, b0: int) -> float:
    return {"keep": 1.0, "linear": batch / b0, "sqrt": math.sqrt(batch / b0)}[rule]


def next_config(
    state: ScheduleState | Mapping[str, Any],
    epoch_done: int,
    history: Sequence[FinishedEpoch | EpochFigures | Mapping[str, Any]],
    caps: Caps,
) -> Decision:
    """The configuration after ``epoch_done`` finished epochs.

    Pure: ``state`` is not changed; the decision carries the next state (``decision.state``),
    so deciding twice from the same inputs (a resume) gives the same decision.

    Parameters
    ----------
    state : from :func:`initial_state` / :func:`state_from_spec`, or the previous decision's;
        or its JSON form as the checkpoint keeps it (:meth:`ScheduleState.to_dict`)
    epoch_done : epochs finished (0: before training); decisions come in increasing order
    history : the finished epochs' records, oldest first (metrics lines, typed records or
        :class:`FinishedEpoch`), each with ``train_loss``, ``steps`` (model updates in that
        epoch), ``global_batch``, ``n_workers`` and, for ``adaptive``, ``b_simple``; only the
        first ``epoch_done`` are read
    caps : the bounds at this boundary
    """
    start = state if isinstance(state, ScheduleState) else ScheduleState.from_dict(state)
    if len(history) < epoch_done:
        raise ValueError(f"history holds {len(history)} epochs, fewer than the {epoch_done} finished")
    if start.epoch is not None and epoch_done <= start.epoch:
        raise ValueError(f"epoch {epoch_done} was already decided (the state is from epoch {start.epoch})")
    first = start.workers is None
    seen = [FinishedEpoch.of(h) for h in history[:epoch_done]]
    ctx = _Ctx(start, epoch_done, seen, _cap(caps, start.max_batch), caps)
    k_now = start.accumulation_steps
    keep = not first and _still_fits(start.batch, start.workers, k_now, caps, start.max_batch)
    if first or epoch_done % start.every_epochs == 0:
        schedule = start.schedule
        wanted, reason = schedule.want(ctx)
        ranking: tuple[RankedConfig, ...] = ()
        if keep and math.isfinite(wanted) and _floor(wanted) == start.batch:
            b, n, capped_by, k = start.batch, start.workers, None, k_now
        else:
            f = _fit(wanted, caps, start.max_batch, start.workers)
            b, n, k = f.config.global_batch, f.config.n_workers, f.config.accumulation_steps
            capped_by, ranking = f.capped_by, f.ranking
            reason += f"; workers: {f.why}" if f.why else ""
        more, decayed = schedule.settle(ctx, wanted, b)
        reason += more
        if capped_by and not decayed:
            reason += f"; capped at {b} by {_CAP_WORDS[capped_by]}"
    elif keep:
        wanted, capped_by, decayed, ranking = None, None, False, ()
        b, n, k = start.batch, start.workers, k_now
        reason = f"no change: the batch changes every {start.every_epochs} epochs"
    else:  # the caps moved below the current configuration (e.g. fewer workers available)
        wanted, decayed = start.batch, False
        f = _fit(wanted, caps, start.max_batch, start.workers)
        b, n, k = f.config.global_batch, f.config.n_workers, f.config.accumulation_steps
        capped_by, ranking = f.capped_by, f.ranking
        reason = f"the batch {start.batch} on {start.workers} workers no longer fits the caps"
        reason += f"; workers: {f.why}" if f.why else ""
    assert n is not None  # decided, or kept from a decision
    reason += f" -> global batch {b} on {n} worker{'s' if n > 1 else ''}"
    if k > 1:
        reason += f" as {k} accumulated micro-batches of {b // n // k} (the memory caps the local batch)"
    prev = None if first else (start.batch, start.workers, k_now)
    s = replace(ctx.state, epoch=epoch_done, batch=b, workers=n, accumulation_steps=k)
    return Decision(
        epoch=epoch_done,
        global_batch=b,
        n_workers=n,
        local_batch=b // n,
        wanted_batch=None if wanted is None else float(wanted),
        capped_by=capped_by,
        lr_scale=_lr_scale(s.lr_rule, b, s.b0),
        lr_decay=s.lr_decay,
        decayed_instead=decayed,
        changed=first or (b, n, k) != prev,
        resize=prev is not None and n != prev[1],
        reason=reason,
        state=s,
        accumulation_steps=k,
        ranking=ranking,
    )
