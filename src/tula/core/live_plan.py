"""Planning while training (issue #30): at a batch boundary, the configuration the fitted models
rank best, and the batch a goodput schedule picks.  Pure arithmetic on a models record; no torch.

AdaDamp's rule sets the worker count from the batch alone, N = ceil(B / batch_per_worker),
whatever the network does.  Here the models decide instead:

- :class:`Ranker` lists, for a global batch B, every (N, k) within the :class:`~tula.core.schedules.Caps`
  (workers, the memory model's largest local batch, accumulation) with the epoch time the fitted
  models predict for it (:meth:`tula.core.fitted.FittedModels.predict`: the fitted step and the
  run's per-epoch costs, ``floor(D / B)`` steps) and the objective's score (seconds, or cost, per
  epoch), best first.
- :func:`choose_workers` keeps the current worker count unless the best option beats it by more
  than a threshold (default 5 %, where AdaptDL settled after restarting on every small gain): a
  new world costs a restart, and a predicted gain inside the models' error is no gain.
- :func:`choose_goodput` picks the batch too: among the batches a boundary may move to, the one
  whose best (N, k) has the largest goodput, Pollux's objective for a single job,
  ``throughput x statistical efficiency`` with the efficiency ``(B_noise + B0) / (B_noise + B)``
  (McCandlish et al.; the same factor the to-accuracy objectives use,
  :func:`tula.core.plan.epochs_to_accuracy`), B_noise the running noise scale.

Every choice returns the ranking behind it, so that a generation's record can show what was
predicted next to what was measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tula.core.accumulation import accumulation_for
from tula.core.config import Config
from tula.core.errors import SpecError
from tula.core.fitted import FittedModels, Network
from tula.core.records import ModelsRecord, RankedOption, TrainRecord, as_epoch
from tula.core.run_costs import measured_epoch_s
from tula.core.schedules import Caps

#: a new worker count must beat the current one's predicted score by more than this share
DEFAULT_THRESHOLD = 0.05
#: what a boundary's options are ranked by: "time" (seconds per epoch) or "cost" (pricing per epoch)
RANK_BY: tuple[str, ...] = ("time", "cost")


@dataclass(frozen=True)
class Option:
    """One configuration for a global batch, as the models predict it.

    Attributes
    ----------
    global_batch : B, a multiple of ``n_workers`` x ``accumulation_steps`` (the wanted batch
        rounded down to one)
    n_workers : N
    accumulation_steps : k, the micro-batches of a rank's share
    epoch_s : the predicted epoch (steps and the run's per-epoch costs), seconds
    score : what the objective ranks, lower is better: ``epoch_s``, or the cost of an epoch
    """

    global_batch: int
    n_workers: int
    accumulation_steps: int
    epoch_s: float
    score: float

    @property
    def micro_batch(self) -> int:
        return self.global_batch // self.n_workers // self.accumulation_steps

    @property
    def config(self) -> Config:
        """The option's configuration (N, B, k) as one value."""
        return Config(self.n_workers, self.global_batch, self.accumulation_steps)

    def record(self) -> RankedOption:
        """The option as a decision's ranking keeps it in an epoch line."""
        return RankedOption.of(self)


class Ranker:
    """The fitted models' view of one job's configurations at its batch boundaries.

    Parameters
    ----------
    models : a models record (``perf``, ``dataset_size``, optionally ``run_costs`` and ``trials``)
    method : the training method whose step the prediction uses (the run costs of another
        method fall back to the plain step, :func:`tula.core.run_costs.run_costs_for`)
    rank_by : ``"time"`` or ``"cost"`` (:data:`RANK_BY`)
    pricing : what an epoch costs on N workers (a :class:`tula.core.pricing.Pricing`); needed
        for ``rank_by="cost"``
    epoch_s_of : ``(B, N, k) -> seconds`` in place of the fitted models' prediction (kept for
        compatibility: give ``network`` for a what-if network)
    network : the network to predict on (:class:`tula.core.fitted.Network`; the simulator's
        what-if); default: the one the profile's ranks ran on
    """

    def __init__(
        self,
        models: dict | ModelsRecord,
        method: str,
        rank_by: str = "time",
        pricing: Any = None,
        epoch_s_of: Callable[[int, int, int], float] | None = None,
        network: Network | None = None,
    ):
        if rank_by not in RANK_BY:
            raise SpecError(f"unknown ranking {rank_by!r}; use one of {', '.join(RANK_BY)}")
        if rank_by == "cost" and pricing is None:
            raise SpecError("ranking worker counts by cost needs the job's pricing")
        for key in ("perf", "dataset_size"):
            if isinstance(models, dict) and key not in models:
                raise SpecError(f"the models record has no {key!r}: planning while training needs a fitted profile")
        self.models, self.method, self.rank_by, self.pricing = models, method, rank_by, pricing
        self.epoch_s_of, self.network = epoch_s_of, network
        self.fitted = FittedModels.from_record(models, method=method)  # the method's run costs
        self.dataset_size = self.fitted.dataset_size
        self.memory = self.fitted.memory

    def epoch_s(self, global_batch: int, n_workers: int, accumulation_steps: int = 1) -> float:
        """The predicted epoch at (B, N, k): the fitted models', or ``epoch_s_of``'s."""
        if self.epoch_s_of is not None:
            return float(self.epoch_s_of(global_batch, n_workers, accumulation_steps))
        p = self.fitted.predict(
            n_workers=n_workers, global_batch=global_batch, accumulation_steps=accumulation_steps, network=self.network
        )
        return float(p.epoch_time_s[0])

    def score(self, epoch_s: float, n_workers: int, share: int, accumulation_steps: int) -> float:
        """``epoch_s``, or an epoch's cost as the planner and the simulator price it: the expected
        wall time (spot preemptions), on N workers each at the predicted peak of a rank's share
        run as k micro-batches (memory pricing)."""
        if self.rank_by == "time":
            return epoch_s
        wall = self.pricing.expected_time_s(epoch_s, n_workers, epoch_s)
        peak = (
            None
            if self.memory is None
            else self.memory.predict_accumulated_peak_bytes(share, share // accumulation_steps, n_workers)
        )
        return float(self.pricing.cost(wall, n_workers, peak))

    def options(self, global_batch: int, caps: Caps) -> list[Option]:
        """Every (N, k) within ``caps`` for a wanted global batch (at most the data set), best
        first (ties: fewer workers, then fewer micro-batches).  Empty when none fits."""
        wanted = min(int(global_batch), caps.dataset_size)
        configs: list[Config] = []
        for n in range(caps.min_workers, caps.max_workers + 1):
            share = wanted // n
            if share < 1:
                break
            # the plan's rule: the fewest micro-batches whose accumulated peak fits, within the caps' micro-batch;
            # where none does, the caps' alone (as the batch schedules bound it: a run goes on as they planned)
            k_max = caps.max_accumulation_steps
            k = self.fitted.accumulation_steps_for(share, n, k_max, None, caps.max_local_batch) or accumulation_for(
                share, caps.max_local_batch, k_max
            )
            if k is None:
                continue
            configs.append(Config(n, n * (share // k * k), k))
        out = []
        for c in configs:  # one at a time (scalars), as the ranking was computed before the one prediction
            b, n, k = c.global_batch, c.n_workers, c.accumulation_steps
            if self.epoch_s_of is not None:
                epoch_s = self.epoch_s(b, n, k)
                out.append(Option(b, n, k, epoch_s, self.score(epoch_s, n, b // n, k)))
                continue
            by_cost = self.rank_by == "cost"  # an epoch priced alone, as score() prices it
            p = self.fitted.predict(
                n_workers=n, global_batch=b, accumulation_steps=k, network=self.network,
                pricing=self.pricing if by_cost else None, epochs=1,
            )  # fmt: skip
            epoch_s = score = p.epoch_time_s.reshape(-1)[0].item()
            if by_cost:
                assert p.cost is not None, "ranking by cost has a pricing (__init__), which prices each epoch"
                score = p.cost.reshape(-1)[0].item()
            out.append(Option(b, n, k, epoch_s, score))
        return sorted(out, key=lambda o: (o.score, o.n_workers, o.accumulation_steps))


def choose_workers(
    options: Sequence[Option], current_workers: int | None, threshold: float = DEFAULT_THRESHOLD
) -> tuple[Option, str]:
    """The option to train on, and one line saying why.  The best option, unless the one on
    ``current_workers`` (None: before the first world) is within ``threshold`` of it: then
    the world stays as it is."""
    if not options:
        raise SpecError("no worker count fits this batch within the memory model and the worker range")
    if not 0.0 <= threshold < 1.0:
        raise SpecError(f"the worker-change threshold must be at least 0 and below 1, not {threshold!r}")
    best = options[0]
    current = next((o for o in options if o.n_workers == current_workers), None)
    if current is None or current is best:
        return best, f"{_say(best)} ranks best"
    gain = 1.0 - best.score / current.score if current.score > 0 else 0.0
    if gain > threshold:
        return best, f"{_say(best)} ranks best, {gain:.1%} better than {_say(current)} (threshold {threshold:.0%})"
    return current, (
        f"{_say(current)} kept: {_say(best)} ranks {gain:.1%} better, within the threshold of {threshold:.0%}"
    )


@dataclass(frozen=True)
class WorkerPlan:
    """``train.workers: {rule: plan}``: at each batch change the worker count (and the
    accumulation steps) the fitted models rank best for the new batch, kept while within
    ``threshold`` of the best.  The ``workers_rule`` of :class:`~tula.core.schedules.Caps`."""

    ranker: Ranker
    threshold: float = DEFAULT_THRESHOLD

    def choose(
        self, global_batch: int, caps: Caps, current_workers: int | None
    ) -> tuple[Config, str, list[RankedOption]]:
        """``(config, reason, ranking)`` for ``global_batch`` (already within the caps): the
        configuration chosen, why, and every option ranked, best first."""
        options = self.ranker.options(global_batch, caps)
        chosen, why = choose_workers(options, current_workers, self.threshold)
        return chosen.config, why, [o.record() for o in options]

    def choose_batch(
        self,
        caps: Caps,
        current_batch: int,
        current_workers: int | None,
        b_noise: float,
        reference_batch: int,
        max_growth: float,
        min_batch: int,
        max_batch: int,
    ) -> tuple[int, str]:
        """The goodput schedule's batch (:func:`choose_goodput`) and its reason; its worker
        count is then :meth:`choose`'s for that batch."""
        c = choose_goodput(
            self.ranker, caps, current_batch, current_workers, b_noise, reference_batch,
            max_growth=max_growth, threshold=self.threshold, min_batch=min_batch, max_batch=max_batch,
        )  # fmt: skip
        return c.option.global_batch, c.reason


def statistical_efficiency(global_batch: float, b_noise: float, reference_batch: float) -> float:
    """``(B_noise + B0) / (B_noise + B)``: the progress a sample makes at batch B relative to
    one at B0 (1 at B0, falling as B passes B_noise)."""
    if b_noise is None or not math.isfinite(b_noise) or b_noise < 0:
        raise SpecError(f"the gradient noise scale must be a finite number of at least 0, not {b_noise!r}")
    return (b_noise + reference_batch) / (b_noise + global_batch)


def goodput(option: Option, dataset_size: int, b_noise: float, reference_batch: float) -> float:
    """Samples per second at ``option``'s predicted epoch, times the statistical efficiency of
    its batch: the useful progress per second Pollux maximises."""
    return dataset_size / option.epoch_s * statistical_efficiency(option.global_batch, b_noise, reference_batch)


@dataclass(frozen=True)
class GoodputRow:
    """One epoch of a goodput schedule's run (:func:`goodput_per_epoch`): what the report's
    goodput panel and the dashboard's goodput chart draw.

    Attributes
    ----------
    epoch : the epoch, from 1
    global_batch : B it trained at
    n_workers : N it trained with
    b_noise : the B_noise its batch was chosen with (the epoch before's B_simple), samples
    efficiency : its batch's statistical efficiency against the run's first batch B0
    measured : useful samples per second, measured (its ``epoch_wall_s``)
    predicted : useful samples per second as predicted (None: no prediction for it)
    """

    epoch: int
    global_batch: int
    n_workers: int
    b_noise: float
    efficiency: float
    measured: float
    predicted: float | None


def goodput_per_epoch(run: TrainRecord | Mapping[str, Any]) -> list[GoodputRow]:
    """A goodput schedule's run (a training record) epoch by epoch after the first: the
    B_noise its batch was chosen with (the epoch before's B_simple), that batch's statistical
    efficiency against the run's first batch B0, and its goodput -- useful samples per second,
    the samples the epoch trained over its time times that efficiency -- measured (its
    ``epoch_wall_s``) and as predicted (the ranking's epoch time where the decision before it
    changed the batch, else the plan's ``predicted_epoch_s`` where the run was compared with
    it: :func:`tula.core.run_costs.compare_with_plan`).  ``[]`` for a run of another
    schedule; epochs without a B_simple before them are left out."""
    data = run.to_json_dict() if isinstance(run, TrainRecord) else run
    hist = [as_epoch(h) for h in data.get("history") or []]
    if data.get("batch_schedule") != "goodput" or not hist:
        return []
    b0 = hist[0].global_batch
    out = []
    for prev, h in zip(hist, hist[1:]):
        b_noise = prev.b_simple
        if b_noise is None or not math.isfinite(b_noise) or b_noise < 0:
            continue
        eff = statistical_efficiency(h.global_batch, b_noise, b0)
        samples = h.steps * h.global_batch
        ranking = prev.schedule.ranking if prev.schedule is not None else ()
        best = ranking[0] if ranking else None  # a decision that changed B
        same = best is not None and (best.global_batch, best.n_workers) == (h.global_batch, h.n_workers)
        planned_s = best.epoch_s if best is not None and same else h.predicted_epoch_s  # else the plan's, if compared
        out.append(
            GoodputRow(
                epoch=h.epoch,
                global_batch=h.global_batch,
                n_workers=h.n_workers,
                b_noise=float(b_noise),
                efficiency=eff,
                measured=samples / measured_epoch_s(h) * eff,
                predicted=samples / planned_s * eff if planned_s else None,
            )
        )
    return out


def candidate_batches(current_batch: int, caps: Caps, max_growth: float = 2.0, per_doubling: int = 4) -> list[int]:
    """The global batches a boundary may move to: ``per_doubling`` steps per factor of 2
    from ``current_batch / max_growth`` to ``current_batch x max_growth``, the current batch
    among them, within 1 and the data set."""
    if max_growth < 1.0:
        raise SpecError(f"max_growth must be at least 1, not {max_growth!r}")
    span = math.log2(max_growth) if max_growth > 1 else 0.0
    steps = round(span * per_doubling)
    out = {int(current_batch)}
    for i in range(-steps, steps + 1):
        out.add(round(current_batch * 2.0 ** (i / per_doubling)))
    return sorted(b for b in out if 1 <= b <= caps.dataset_size)


@dataclass(frozen=True)
class GoodputChoice:
    """What :func:`choose_goodput` decided: the option, why, and the candidates behind it
    (each batch's best option and its goodput)."""

    option: Option
    reason: str
    candidates: tuple[tuple[Option, float], ...]

    def record(self) -> dict[str, Any]:
        return {
            **self.option.record().to_json_dict(),
            "reason": self.reason,
            "candidates": [{**o.record().to_json_dict(), "goodput": g} for o, g in self.candidates],
        }


def choose_goodput(
    ranker: Ranker,
    caps: Caps,
    current_batch: int,
    current_workers: int | None,
    b_noise: float,
    reference_batch: int,
    *,
    max_growth: float = 2.0,
    threshold: float = DEFAULT_THRESHOLD,
    min_batch: int = 1,
    max_batch: int | None = None,
) -> GoodputChoice:
    """The batch, worker count and micro-batches of the next epochs: of the
    :func:`candidate_batches` within ``min_batch``/``max_batch``, the one whose best (N, k)
    (:meth:`Ranker.options`) has the largest :func:`goodput`.  The current batch and world stay
    unless the winner's goodput beats theirs by more than ``threshold``."""
    lo, hi = max(1, min_batch), caps.dataset_size if max_batch is None else min(max_batch, caps.dataset_size)
    rows: list[tuple[Option, float]] = []
    for b in candidate_batches(current_batch, caps, max_growth):
        if not lo <= b <= hi:
            continue
        options = ranker.options(b, caps)
        if options:
            rows.append((options[0], goodput(options[0], ranker.dataset_size, b_noise, reference_batch)))
    if not rows:
        raise SpecError(f"no batch within {lo}..{hi} near {current_batch} fits the memory model on the workers allowed")
    rows.sort(key=lambda r: (-r[1], r[0].n_workers, r[0].global_batch))
    best, best_g = rows[0]
    here = [
        (o, goodput(o, ranker.dataset_size, b_noise, reference_batch))
        for o in ranker.options(current_batch, caps)
        if o.n_workers == current_workers and o.global_batch == current_batch
    ]
    said = f"B_noise {b_noise:.4g}, B0 {reference_batch}"
    if here and here[0][0] != best:
        now, now_g = here[0]
        gain = best_g / now_g - 1.0 if now_g > 0 else math.inf
        if gain <= threshold:
            return GoodputChoice(
                now,
                f"goodput: {_say(now)} kept ({now_g:.4g} samples/s useful), {_say(best)} within the "
                f"threshold of {threshold:.0%} ({gain:+.1%}; {said})",
                tuple(rows),
            )
        return GoodputChoice(
            best, f"goodput: {_say(best)} at {best_g:.4g} samples/s useful, {gain:+.1%} over {_say(now)} ({said})",
            tuple(rows),
        )  # fmt: skip
    return GoodputChoice(best, f"goodput: {_say(best)} at {best_g:.4g} samples/s useful ({said})", tuple(rows))


def _say(o: Option) -> str:
    k = f" x {o.accumulation_steps} micro-batches" if o.accumulation_steps > 1 else ""
    return f"B={o.global_batch} on {o.n_workers} worker{'s' if o.n_workers > 1 else ''}{k} ({o.epoch_s:.3g} s/epoch)"
