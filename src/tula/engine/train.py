"""Training runner: DDP training at a chosen (N, B) with a training method (AGS or a baseline).

The caller (:func:`train`) launches one N-rank world; every rank runs :func:`train_world`
(:mod:`tula.engine.rank_loop`: the per-rank loop -- data order, the probe, evaluation
(:mod:`tula.engine.evaluation`), checkpoints, the noise scale's feed (:mod:`tula.engine.noise_feed`),
a batch change inside the world, SIGINT/SIGTERM).  This module holds the entry points and the
supervisor of generations (:class:`TrainSupervisor`); the checks made before any world are
in :mod:`tula.engine.train_checks`.

Out of memory -- the probe's agreed verdict, or a rank failing with cause ``oom`` mid-epoch --
makes the caller relaunch from the last checkpoint at half the micro-batch: the same global
batch in twice the accumulation steps while the micro-batch is even, else the next smaller
global batch (split evenly over the workers; :func:`next_fallback`): completed epochs are
kept, the interrupted epoch is re-run whole, none is lost or repeated.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from tula.core.config import Config
from tula.core.errors import InfeasibleError, Interrupted, RunDirError, SpecError, WorkerError
from tula.core.events import Event, FellBack, Note, Resized, WorldStarted
from tula.core.job_rules import caps_from_spec, check_train_config, smallest_batch_for, state_from_spec
from tula.core.records import (
    TRAIN_KIND,
    VERSIONS,
    CheckpointMeta,
    EpochRecord,
    Fallback,
    Generation,
    TrainRecord,
    read_jsonl,
)
from tula.core.say import fmt_bytes
from tula.core.schedules import next_config, steps_per_epoch  # noqa: F401 (re-exported)
from tula.core.spec import JobSpec
from tula.core.variants import models_as_trained
from tula.engine import interrupts, rank_messages
from tula.engine.checkpoint import CHECKPOINT, checkpoint_header, has_checkpoint
from tula.engine.evaluation import evaluate  # noqa: F401 (re-exported)
from tula.engine.launch import Launcher
from tula.engine.metrics_sinks import EpochSinks
from tula.engine.rank_loop import METRICS, STEP_TRACES, ScheduleStart, train_world  # noqa: F401 (re-exported)
from tula.engine.rank_messages import Failed, Finished, OutOfMemory, RankResult, Resize, Segment
from tula.engine.rundir import check_out_dir, locked
from tula.engine.train_checks import (  # noqa: F401 (re-exported)
    _check_before_any_world,
    check_resumed_precision,
    check_resumed_sequence_length,
)
from tula.engine.workloads import check_workload

log = logging.getLogger(__name__)


class TrainFailed(WorkerError):
    """A worker failed mid-training; the epochs finished before it are in the checkpoint."""


def next_fallback(
    global_batch: int, n_workers: int, accumulation_steps: int, max_steps: int | None = None
) -> tuple[int, int]:
    """The ``(global batch, accumulation steps)`` to go on at after an out-of-memory at
    (B, k) on ``n_workers``: what runs out is the micro-batch b = B / (N k), so it is halved.
    While b is even (so >= 2) and 2k is within ``max_steps`` (``None``: no bound) the global
    batch is kept and k doubled -- the same updates, only more, smaller passes; else b
    halves (rounded down) at the same k, a smaller global batch B = N k floor(b / 2) -- at
    k = 1 half the global batch, rounded down to a multiple of N.  A global batch of 0 means
    nothing smaller is left (b was 1)."""
    micro = global_batch // n_workers // accumulation_steps
    if micro >= 2 and micro % 2 == 0 and (max_steps is None or 2 * accumulation_steps <= max_steps):
        return global_batch, 2 * accumulation_steps
    return n_workers * accumulation_steps * (micro // 2), accumulation_steps


# --------------------------------------------------------------------------- in the caller
def step_traces(metrics_path: Path) -> dict[str, list]:
    """The method's per-step traces of a run, joined from its metrics lines."""
    out: dict[str, list] = {}
    for line in read_jsonl(metrics_path):
        for key, values in (line.get(STEP_TRACES) or {}).items():
            out.setdefault(key, []).extend(values)
    return out


def _available(
    launcher: Launcher,
    wanted: Config,
    *,
    schedule: ScheduleStart | None,
    emit: Callable[[Event], None],
    dataset_size: int,
) -> Config:
    """The generation's configuration ``wanted`` with the workers the launcher can provide: when
    the cluster gives fewer within its wait, the run goes on with as many as there are (the
    schedule's worker cap is lowered to that) and says so.  The new B is the nearest to the
    old one that splits into ``wanted.accumulation_steps`` equal micro-batches on each of
    them; k stays."""
    global_batch, n_workers = wanted.global_batch, wanted.n_workers
    got = launcher.provide(n_workers) if hasattr(launcher, "provide") else n_workers
    if got >= n_workers:
        return wanted
    unit = got * wanted.accumulation_steps  # B = N x k x b
    fewer = max(unit, round(global_batch / unit) * unit)  # the nearest batch that splits over them
    if fewer > dataset_size:
        fewer = dataset_size // unit * unit
    emit(
        Note(
            f"the cluster gave {got} of the {n_workers} workers asked for; going on with "
            f"{got} worker(s) at global batch {fewer}"
        )
    )
    if schedule is not None:
        caps = schedule.caps
        schedule.caps = replace(caps, max_workers=got, min_workers=min(caps.min_workers, got))
    return replace(wanted, n_workers=got, global_batch=fewer)


def _segments_from_history(epochs: list[EpochRecord]) -> list[Segment]:
    """The batches a world that failed had trained at, from its epochs in the checkpoint
    (``wall_s``: the sum of their epoch times, the world's own time being unknown), as the
    ranks' messages carry them (:class:`~tula.engine.rank_messages.OutOfMemory`'s ``segments``)."""
    runs: list[tuple[tuple[int, int, int], int, float]] = []  # ((B, N, k), first epoch, wall_s)
    for h in epochs:
        at = (h.global_batch, h.n_workers, h.accumulation_steps)
        if not runs or runs[-1][0] != at:
            runs.append((at, h.epoch, 0.0))
        runs[-1] = (at, runs[-1][1], runs[-1][2] + (h.epoch_time_s or 0.0))
    return [
        Segment(global_batch=b, n_workers=n, accumulation_steps=k, from_epoch=first, wall_s=wall_s)
        for (b, n, k), first, wall_s in runs
    ]


_RANK_MESSAGES = (Finished, Resize, OutOfMemory, rank_messages.Interrupted)


def _rank_results(got: list[Any], n_workers: int) -> list[RankResult]:
    """The ranks' messages, checked: one per rank, each a message a rank returns
    (:func:`train_world`), all of one kind (the ranks agree on how a world ends).  Else one
    :class:`~tula.engine.rank_messages.Failed` that says what came back instead."""
    if len(got) != n_workers:
        return [Failed(f"the {n_workers}-worker world returned {len(got)} result(s), not one per worker")]
    for rank, value in enumerate(got):
        if not isinstance(value, _RANK_MESSAGES):
            what = "no result" if value is None else f"a {type(value).__name__}, not a rank's message"
            return [Failed(f"worker rank {rank} of the {n_workers}-worker world returned {what}", rank=rank)]
        if type(value) is not type(got[0]):
            return [
                Failed(
                    f"worker rank {rank} ended its world with {type(value).__name__} where rank 0 ended it with "
                    f"{type(got[0]).__name__}",
                    rank=rank,
                )
            ]
    return list(got)


def _interrupted(signum: int | None, epochs_done: int, epochs: int, out: Path) -> Interrupted:
    import signal as _signal

    signum = signum or interrupts.requested() or _signal.SIGINT
    kept = (
        f"epochs 1-{epochs_done} of {epochs} are kept in {out / CHECKPOINT}"
        if epochs_done
        else "no epoch had finished, so there is no checkpoint yet"
    )
    return Interrupted(f"training stopped by {_signal.Signals(signum).name}: {kept}", signum)


def train(
    spec: JobSpec,
    method: str,
    n_workers: int,
    global_batch: int,
    out_dir: str | Path,
    *,
    resume: bool = False,
    launcher: Launcher | None = None,
    on_event: Callable[[Event], None] | None = None,
    models: dict | None = None,
) -> TrainRecord:
    """Train ``spec`` with ``method`` on ``n_workers`` at ``global_batch``; return the typed, frozen
    run record (:class:`~tula.core.records.TrainRecord`, its history
    :class:`~tula.core.records.EpochRecord`; ``.to_json_dict()`` is what ``train.json`` holds).

    Writes ``checkpoint.pt`` and ``metrics.jsonl`` into ``out_dir`` as it goes, holding the
    directory's lock.  With ``resume`` an existing checkpoint is continued (at its own
    global batch, which may be smaller than ``global_batch`` after an out-of-memory
    fallback); without it an existing checkpoint is an error, so nothing trained is
    overwritten.

    Gradient accumulation (``spec.train.accumulation_steps``, k): every step's share of a
    rank, B / N samples, runs as k micro-batches of b = B / (N k)
    (:meth:`tula.engine.rank_loop._RankTrainer.run_epoch`).  The record's ``local_batch`` is the share B / N (the
    samples a rank's gradient averages, and what the noise scale counts as the local
    batch), ``micro_batch`` is b (what one forward/backward holds in memory) and
    ``accumulation_steps`` is k; each epoch line carries the last two.  A resume goes on at
    the checkpoint's k, as at its global batch (an out-of-memory fallback may have raised
    it; a note says so when the spec asks for another k): the steps and their samples are
    the same at any k, only the summation order of the gradient differs.  Out of memory
    halves the micro-batch: at the same global batch with k doubled while b is even, else
    a smaller global batch (:func:`next_fallback`); each ``fallbacks`` entry says
    ``from_``/``to_global_batch`` and ``from_``/``to_accumulation_steps``.  SIGINT/SIGTERM
    end the run with :class:`~tula.core.errors.Interrupted` once the ranks have stopped; the
    last finished epoch's checkpoint is kept.

    With a batch schedule, a change of the worker count starts a new world (a generation)
    from the checkpoint; a new batch on the same workers goes on in the same world
    (:func:`train_world`).  The record's ``generations`` has one entry per stretch of
    epochs at one (N, B) that this call trained: ``n_workers``, ``global_batch``,
    ``from_epoch`` (its first epoch), ``wall_s``, ``world`` (1, 2, ...: entries with the
    same number ran in one world, one process group) and ``new_world`` (true where the
    entry started its world -- the first, after a change of N, or after an out-of-memory
    fallback --, false for a batch change inside the world).  The record's ``n_workers``,
    ``global_batch``, ``local_batch`` and ``steps_per_epoch`` are the last entry's.

    ``models``: the job's models record (``tula run`` passes it), which
    ``train.workers: {rule: plan}`` needs: at each batch change the worker count the models
    rank best (:class:`tula.core.live_plan.WorkerPlan`); each decision's ranking is in the
    epoch's ``schedule`` line."""
    with contextlib.ExitStack() as stack:
        if launcher is None:
            from tula.engine.launch.clusters import open_launcher

            launcher = stack.enter_context(open_launcher(spec, n_workers=n_workers))
        return _train(
            spec,
            method,
            n_workers=n_workers,
            global_batch=global_batch,
            out_dir=out_dir,
            resume=resume,
            launcher=launcher,
            on_event=on_event,
            models=models,
        )


def _train(
    spec: JobSpec,
    method: str,
    *,
    n_workers: int,
    global_batch: int,
    out_dir: str | Path,
    resume: bool,
    launcher: Launcher,
    on_event: Callable[[Event], None] | None,
    models: dict | None = None,
) -> TrainRecord:
    out = check_out_dir(Path(out_dir))
    _check_before_any_world(spec, method, n_workers, launcher, models)
    _, data = check_workload(spec)
    # the one hook of the metrics sinks (train.loggers): every finished epoch's event, in this process only
    sinks = EpochSinks(spec, method, out, resume, on_event)
    run = TrainSupervisor(
        spec,
        method,
        n_workers=n_workers,
        global_batch=global_batch,
        out=out,
        launcher=launcher,
        on_event=sinks,
        train_size=data.train_size,
        models=models,
    )
    with interrupts.graceful_signals(), locked(out), sinks:
        record = run.run(resume)
        late = interrupts.requested()
    if late:  # the stop came as the last epoch ended: everything is kept, and the command still ends as stopped
        raise _interrupted(late, spec.epochs, spec.epochs, out)
    return record


class TrainSupervisor:
    """A training run as its caller supervises it (:func:`train`): the generations -- one
    launched world each -- from the resume state and the first configuration to the record.

    Its steps are methods, each testable without a world: :meth:`resume_from` (the state a
    checkpoint's header gives), :meth:`first_schedule` (epoch 0's configuration under a
    batch schedule), :meth:`generation` (one world run: the ranks' messages,
    :mod:`tula.engine.rank_messages`, or its failure mapped to one by :meth:`world_failed`),
    :meth:`resize` (the next generation's configuration:
    :meth:`next_configuration`), :meth:`fall_back` (the configuration after an
    out-of-memory) and :meth:`record` (the run's ``train.json``), chosen by :meth:`dispatch`
    on the type of the world's message.  Between them the configuration the next world
    starts at is ``global_batch``, ``n_workers`` and ``accum`` (k): :meth:`config`."""

    def __init__(
        self,
        spec: JobSpec,
        method: str,
        *,
        n_workers: int,
        global_batch: int,
        out: Path,
        launcher: Launcher,
        on_event: Callable[[Event], None] | None,
        train_size: int,
        models: dict | None = None,
    ) -> None:
        self.spec, self.method, self.out, self.launcher, self.train_size = spec, method, out, launcher, train_size
        self.models = models  # the fitted models: train.workers.rule 'plan' ranks worker counts by them
        self.emit: Callable[[Event], None] = on_event or (lambda ev: None)
        self.scheduled = spec.train.batch_schedule is not None or spec.train.workers is not None
        self.global_batch, self.n_workers, self.accum = global_batch, n_workers, spec.train.accumulation_steps
        self.fallbacks: list[Fallback] = []
        self.resumed_from_epoch: int | None = None
        self.first_trained: EpochRecord | None = None  # a resumed run's first epoch (its schedule's caps start there)
        self.notes: list[str] = []
        self.schedule: ScheduleStart | None = None  # a batch schedule's state, LR multiplier and caps
        self.generations: list[Generation] = []
        self.at_epoch = 0  # the last finished epoch when a world starts
        self.first_batch = global_batch
        self.device = "cpu"
        self.t0 = time.perf_counter()

    # ------------------------------------------------------------------ the whole run
    def run(self, resume: bool) -> TrainRecord:
        """Train: the resume state, the first configuration, then generations until one
        finishes (:class:`~tula.engine.rank_messages.Finished`), each ended by a resize or an
        out-of-memory starting the next; the world's end dispatched on rank 0's message."""
        self.resume_state(resume)
        for message in self.notes:
            self.emit(Note(message))
        if self.scheduled:
            self.first_schedule()
        check_train_config(self.spec, self.method, self.n_workers, self.global_batch, self.train_size, self.accum)
        self.device = self.launcher.facts().device
        self.first_batch = self.global_batch
        self.t0 = time.perf_counter()
        self.at_epoch = self.resumed_from_epoch or 0
        while True:
            record = self.dispatch(self.generation())
            if record is not None:
                return record

    def dispatch(self, results: list[RankResult]) -> TrainRecord | None:
        """What a world's end (``results``: :meth:`generation`'s, dispatched on rank 0's
        message) means for the run: the record when it finished (:meth:`record`), ``None`` when
        a next generation follows (:meth:`resize`, :meth:`fall_back`); a stop raises
        :class:`~tula.core.errors.Interrupted`, a failure :class:`TrainFailed`."""
        match results[0]:
            case Finished():
                return self.record([r for r in results if isinstance(r, Finished)])
            case rank_messages.Interrupted(signum=signum, epochs_done=epochs_done):
                raise _interrupted(signum, epochs_done, self.spec.epochs, self.out)
            case Resize() as resize:  # the next generation: a new world of its own size, on a fresh port
                self.resize(resize)
            case OutOfMemory(note=note):
                self.fall_back(note)
            case Failed(note=note, rank=rank, details=details, cause=cause):
                raise TrainFailed(note, rank=rank, details=details, cause=cause)
        return None

    # ------------------------------------------------------------------ before the first world
    def resume_state(self, resume: bool) -> None:
        """Where the run starts: a checkpoint in the directory is continued only with
        ``resume`` (:meth:`resume_from`), and ``resume`` needs one."""
        if has_checkpoint(self.out):
            if not resume:
                raise RunDirError(
                    f"{self.out} already holds a training run; pass --resume {self.out} to continue it, or choose "
                    "another output directory"
                )
            self.resume_from(checkpoint_header(self.out))
        elif resume:
            raise RunDirError(f"there is no checkpoint in {self.out} to resume; run without --resume to start training")

    def resume_from(self, meta: CheckpointMeta) -> None:
        """Go on from a checkpoint's header ``meta``: its method (and, without a schedule, its
        worker count) must be this run's; its global batch, accumulation steps and fallbacks
        are taken (an out-of-memory fallback may have changed the first two; a note says so
        when k differs from the spec's), and with a schedule the configuration it chose
        after the last finished epoch."""
        # before any world: the ranks check it again on loading
        check_resumed_precision(meta.precision, self.spec, self.out)
        check_resumed_sequence_length(meta.sequence_length, self.spec, self.out)
        if meta.method != self.method or (not self.scheduled and meta.n_workers != self.n_workers):
            raise SpecError(
                f"the checkpoint in {self.out} was trained with method {meta.method!r} on "
                f"{meta.n_workers} worker(s), not {self.method!r} on {self.n_workers}; resume it with those"
            )
        self.global_batch, self.fallbacks = meta.global_batch, list(meta.fallbacks)
        # the checkpoint's k, as its global batch: an out-of-memory fallback may have raised it
        trained_k = meta.accumulation_steps
        if trained_k != self.accum and not self.scheduled:  # a schedule chooses its own k
            self.notes.append(
                f"resuming at the checkpoint's {trained_k} accumulation step(s), not train.accumulation_steps "
                f"{self.accum} (the same samples and updates; only the micro-batch differs)"
            )
        self.accum = trained_k
        if self.scheduled:  # the generation the schedule chose after the last finished epoch
            self.global_batch = meta.next_global_batch or self.global_batch
            self.n_workers = meta.next_n_workers or meta.n_workers
            self.accum = meta.next_accumulation_steps or self.accum
        self.resumed_from_epoch = meta.epoch
        self.first_trained = meta.history[0] if meta.epoch and meta.history else None

    def first_schedule(self) -> None:
        """A batch schedule's caps (their defaults, e.g. batch_per_worker, from the run's first
        configuration) and, for a new run, epoch 0's configuration within them; a resumed run
        takes the schedule's state and LR multiplier from the checkpoint.  Then the workers
        the launcher can provide (:func:`_available`)."""
        first = self.first_trained
        caps = caps_from_spec(
            self.spec,
            self.global_batch if first is None else first.global_batch,
            self.n_workers if first is None else first.n_workers,
            self.train_size,
            max_local_batch=None,
            # the models of the variant this run trains (train.parallelism auto's fsdp: the sharded memory model)
            models=None if self.models is None else models_as_trained(self.models, self.spec.train),
            method=self.method,
        )
        if self.resumed_from_epoch is None:  # epoch 0's configuration, within the caps
            d = next_config(state_from_spec(self.spec, self.global_batch), 0, [], caps)
            self.global_batch, self.n_workers, self.accum = d.global_batch, d.n_workers, d.accumulation_steps
            self.schedule = ScheduleStart(state=d.state, lr_multiplier=d.lr_multiplier, caps=caps)
        else:  # the state and LR multiplier come from the checkpoint
            self.schedule = ScheduleStart(state=None, lr_multiplier=1.0, caps=caps)
        there = _available(
            self.launcher, self.config(), schedule=self.schedule, emit=self.emit, dataset_size=self.train_size
        )
        self.global_batch, self.n_workers = there.global_batch, there.n_workers

    # ------------------------------------------------------------------ one generation
    def epochs_kept(self) -> int:
        """The last finished epoch: the checkpoint's (0 without one)."""
        return checkpoint_header(self.out).epoch if has_checkpoint(self.out) else 0

    def config(self) -> Config:
        """The configuration the next world starts at."""
        return Config(n_workers=self.n_workers, global_batch=self.global_batch, accumulation_steps=self.accum)

    def generation(self) -> list[RankResult]:
        """One world at the current configuration (:func:`train_world` on every rank): the
        ranks' messages in rank order, all of one kind (:func:`_rank_results`), or one message
        for a world that gave none (:meth:`world_failed`).  The batches it trained at join
        ``generations``; the configuration becomes the one the world ended at."""
        if interrupts.requested():
            kept = self.epochs_kept() if has_checkpoint(self.out) else (self.resumed_from_epoch or 0)
            raise _interrupted(None, kept, self.spec.epochs, self.out)
        self.emit(
            WorldStarted(
                global_batch=self.global_batch,
                n_workers=self.n_workers,
                accumulation_steps=self.accum,
                micro_batch=self.global_batch // self.n_workers // self.accum,
                steps_per_epoch=steps_per_epoch(self.train_size, self.global_batch),
                epochs=self.spec.epochs,
            )
        )
        started = time.perf_counter()
        cap = self.spec.search.memory_budget_bytes if self.spec.search.enforce_memory_cap else None
        world = partial(
            train_world,
            spec_dict=self.spec.to_dict(),
            method_name=self.method,
            config=self.config(),
            out_dir=str(self.out),
            fallbacks=[f.to_json_dict() for f in self.fallbacks],  # the ranks keep them in the checkpoint's dict
            mem_cap_bytes=cap,
            reach_token=uuid.uuid4().hex,
            schedule=self.schedule,
        )
        results: list[RankResult]
        try:
            got = self.launcher.run(world, self.n_workers, on_event=lambda rank, ev: self.emit(ev), timeout_s=None)
            results = _rank_results(got, self.n_workers)
        except WorkerError as err:
            results = [self.world_failed(err)]
        except Interrupted as err:  # stopped before it began (its launcher's world gate: waiting for workers)
            kept = self.epochs_kept() if has_checkpoint(self.out) else (self.resumed_from_epoch or 0)
            raise _interrupted(err.signum, kept, self.spec.epochs, self.out) from None
        ended = results[0]
        if not isinstance(ended, Failed):
            self.add_segments(ended.segments, started)
            # the batch the world was at when it ended (a batch change inside it moves it)
            self.global_batch, self.accum = ended.config.global_batch, ended.config.accumulation_steps
        return results

    def world_failed(self, err: WorkerError) -> RankResult:
        """A world that failed, as the message its ranks could not send: an interruption is
        :class:`~tula.engine.rank_messages.Interrupted`, any cause but out-of-memory
        :class:`~tula.engine.rank_messages.Failed` (its sentence saying which epochs are kept);
        an out-of-memory is :class:`~tula.engine.rank_messages.OutOfMemory` with the segments
        from the epochs it checkpointed, at the configuration it went on at after them."""
        meta = checkpoint_header(self.out) if has_checkpoint(self.out) else None
        done = meta.epoch if meta else 0
        if err.cause == "interrupted" or interrupts.requested():
            steps_done = meta.steps_done if meta else 0
            return rank_messages.Interrupted(
                config=self.config(), segments=[], epochs_done=done, steps_done=steps_done, signum=None
            )
        if err.cause != "oom":
            kept = f"; the {done} epoch(s) finished before it are kept in {self.out / CHECKPOINT}" if done else ""
            return Failed(f"{err}{kept}", rank=err.rank, cause=err.cause, details=err.details)
        segments = _segments_from_history(meta.history[self.at_epoch : done] if meta else [])
        config = self.config()
        if segments and meta is not None and meta.next_n_workers == self.n_workers:
            # it went on at the next batch
            config = Config(
                n_workers=self.n_workers,
                global_batch=meta.next_global_batch or self.global_batch,
                accumulation_steps=meta.next_accumulation_steps or self.accum,
            )
        return OutOfMemory(config=config, segments=segments, note=str(err))

    def add_segments(self, segments: list[Segment], started: float) -> None:
        """A world's segments (one per batch it trained at) join ``generations`` under the
        next world number; the first one's time, when the world left it open, counts from
        ``started`` (the world's start)."""
        if not segments:
            return
        world_no = (self.generations[-1].world or 0) + 1 if self.generations else 1
        if segments[0].wall_s is None:  # the world's start counts to its first batch
            later = sum(g.wall_s or 0.0 for g in segments[1:])
            segments = [replace(segments[0], wall_s=time.perf_counter() - started - later), *segments[1:]]
        self.generations.extend(
            Generation.model_validate({**asdict(g), "world": world_no, "new_world": k == 0})
            for k, g in enumerate(segments)
        )

    # ------------------------------------------------------------------ between generations
    def next_configuration(self, result: Resize) -> Config:
        """The next generation's configuration after a world that ended for a resize
        (``result``: its rank 0's): the one the batch schedule chose.  The place for a rule
        that chooses the worker count at a batch change."""
        return result.next

    def resize(self, result: Resize) -> None:
        """Move to the next generation after a world that ended for a resize: its
        configuration (:meth:`next_configuration`), with the workers the launcher can
        provide (:func:`_available`), checked, and said in a ``resize`` event."""
        self.at_epoch = result.epochs_done
        there = _available(
            self.launcher,
            self.next_configuration(result),
            schedule=self.schedule,
            emit=self.emit,
            dataset_size=self.train_size,
        )
        self.global_batch, self.n_workers, self.accum = there.global_batch, there.n_workers, there.accumulation_steps
        check_train_config(self.spec, self.method, self.n_workers, self.global_batch, self.train_size, self.accum)
        log.info(
            "after epoch %d: a new world of %d worker(s) at B=%d", self.at_epoch, self.n_workers, self.global_batch
        )
        self.emit(
            Resized(
                at_epoch=self.at_epoch,
                global_batch=self.global_batch,
                n_workers=self.n_workers,
                accumulation_steps=self.accum,
                new_world=True,
            )
        )

    def fall_back(self, note: str) -> None:
        """After an out-of-memory (``note``: why) the micro-batch halves -- k doubles at the
        same global batch while it can, then B halves (:func:`next_fallback`) -- from the last
        checkpoint; a schedule's caps stop it growing back into the micro-batch that ran out.
        The fallback joins ``fallbacks`` and is emitted; when no smaller batch is left (the
        micro-batch was 1 sample, or the halved batch is below the smallest the method trains
        at) :class:`InfeasibleError` with :meth:`cannot_fit`'s sentence instead, nothing
        emitted: the last checkpoint stays as it is."""
        max_k = None
        if self.schedule:  # the schedule must not grow back into the micro-batch that ran out of memory
            failed_micro = self.global_batch // self.n_workers // self.accum
            caps = self.schedule.caps
            lim = caps.max_local_batch
            self.schedule.caps = replace(
                caps, max_local_batch=min(lim or failed_micro, failed_micro - 1) if failed_micro > 1 else lim
            )
            max_k = caps.max_accumulation_steps  # a schedule's k stays within its caps
        smaller, new_k = next_fallback(self.global_batch, self.n_workers, self.accum, max_k)
        self.at_epoch = self.epochs_kept()
        if smaller < smallest_batch_for(self.method, self.spec, self.n_workers):
            raise InfeasibleError(self.cannot_fit(smaller))
        self.fallbacks.append(
            Fallback(
                from_global_batch=self.global_batch,
                to_global_batch=smaller,
                from_accumulation_steps=self.accum,
                to_accumulation_steps=new_k,
                at_epoch=self.at_epoch,
                reason=note[:300],
            )
        )
        self.emit(FellBack(self.fallbacks[-1]))
        log.info(
            "out of memory at B=%d (k=%d): going on from epoch %d at B=%d (k=%d): %s",
            self.global_batch, self.accum, self.at_epoch, smaller, new_k, note[:300],
        )  # fmt: skip
        self.global_batch, self.accum = smaller, new_k

    def cannot_fit(self, smaller: int) -> str:
        """The sentence that ends a run whose out-of-memory at the current configuration has no
        smaller batch to fall back to (``smaller``: :func:`next_fallback`'s, below the smallest
        the method trains at): the batch that did not fit, the memory it did not fit in (the
        spec's enforced cap per worker, else the device's), and the epochs kept."""
        micro = self.global_batch // self.n_workers // self.accum
        spec = self.spec
        if spec.search.enforce_memory_cap and spec.search.memory_budget_bytes is not None:
            cap = fmt_bytes(spec.search.memory_budget_bytes)
            where = f"under the memory cap of {cap} per worker (search.memory_budget_bytes)"
        else:
            where = f"in the {self.device} device's memory"
        smallest = smallest_batch_for(self.method, spec, self.n_workers)
        floor = (
            f" (method {self.method!r} trains at a global batch of {smallest} at least on {self.n_workers} worker(s))"
            if smaller > 0
            else ""
        )
        done = (
            f"epoch 1 of {spec.epochs} is" if self.at_epoch == 1 else f"epochs 1-{self.at_epoch} of {spec.epochs} are"
        )
        kept = f"{done} kept in {self.out / CHECKPOINT}" if self.at_epoch else "no epoch had finished, so none is kept"
        return (
            f"the model does not fit {where}: global batch {self.global_batch} on {self.n_workers} worker(s) ran out "
            f"of memory at a micro-batch of {micro} sample(s) per worker"
            + (f" ({self.accum} accumulation steps)" if self.accum > 1 else "")
            + f" and no smaller batch is left to fall back to{floor}; {kept}"
        )

    # ------------------------------------------------------------------ the record
    def record(self, res: list[Finished]) -> TrainRecord:
        """The run's record (``train.json``'s, typed) from the last world's messages ``res`` (one
        per rank): the configuration it ended at, the history, the fallbacks, the generations.
        ``.to_json_dict()`` makes it JSON's values."""
        rank0 = res[0]
        history = [EpochRecord.model_validate(h) for h in rank0.history]
        spec = self.spec
        return TrainRecord(
            kind=TRAIN_KIND,
            version=VERSIONS[TRAIN_KIND],
            spec=spec.to_dict(),
            method=self.method,
            n_workers=self.n_workers,
            requested_global_batch=self.first_batch,
            global_batch=self.global_batch,
            local_batch=self.global_batch // self.n_workers,
            accumulation_steps=self.accum,
            micro_batch=self.global_batch // self.n_workers // self.accum,
            steps_per_epoch=rank0.steps_per_epoch,
            epochs=spec.epochs,
            steps_done=rank0.steps_done,
            resumed_from_epoch=self.resumed_from_epoch,
            fallbacks=self.fallbacks,
            history=history,
            final=history[-1].model_dump(exclude_unset=True) if history else {},  # as its metrics line has it
            best_test_top1=max((h.test_top1 for h in history if h.test_top1 is not None), default=math.nan),
            replicas_identical=len({r.param_digest for r in res}) == 1,
            traces={**rank0.traces, **step_traces(self.out / METRICS)},
            train_s=time.perf_counter() - self.t0,
            device=self.device,
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            batch_schedule=None if spec.train.batch_schedule is None else spec.train.batch_schedule.kind,
            generations=self.generations,
        )
