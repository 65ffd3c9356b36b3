"""What a rank of a training world returns to the supervisor: one typed message per way a
world can end (:data:`RankResult`).

Every rank of a world runs :func:`tula.engine.rank_loop.train_world` and returns one of
:class:`Finished`, :class:`Resize`, :class:`OutOfMemory` or :class:`Interrupted`; the
supervisor (:class:`tula.engine.train.TrainSupervisor`) dispatches on the type, and maps a
world that failed -- or a rank that returned nothing it knows -- to :class:`Failed`.  The
messages cross process boundaries (multiprocessing's queues, Dask's futures, a gather over
the control group), so they hold only builtins, lists, dicts, :class:`Segment` and
:class:`~tula.core.config.Config`, and pickle.  They are never written to disk as they are:
the supervisor turns what it keeps into the run's record (``train.json``) itself.

``segments`` (every message but :class:`Failed`): one :class:`Segment` per batch the world
trained at, ``wall_s`` of the first left ``None`` for the supervisor (it counts from the world's start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tula.core.config import Config


@dataclass(frozen=True)
class Segment:
    """One batch a world trained at, from epoch ``from_epoch`` on (a batch change inside the world
    starts the next).

    Parameters
    ----------
    global_batch, n_workers, accumulation_steps : int
        The configuration.
    from_epoch : int
        Its first epoch (from 1).
    wall_s : float or None
        Its wall time, seconds; ``None`` for the world's first segment, which the supervisor counts
        from the world's start.
    """

    global_batch: int
    n_workers: int
    accumulation_steps: int
    from_epoch: int
    wall_s: float | None = None


@dataclass(frozen=True)
class Finished:
    """The world trained the job's last epoch.

    Parameters
    ----------
    config : Config
        The configuration it ended at (a batch change inside the world moves it).
    segments : list of Segment
        The batches this world trained at.
    steps_per_epoch : int
        Optimizer steps per epoch at ``config``'s global batch.
    steps_done : int
        Optimizer steps of the whole run, earlier generations included.
    history : list of dict
        Every epoch's metrics line of the run (rank 0's; the same on every rank).
    traces : dict
        The method's trace summary (rank 0's; empty on the others).
    param_digest : str
        SHA-1 of this rank's parameters: equal on every rank iff the replicas are identical.
    """

    config: Config
    segments: list[Segment]
    steps_per_epoch: int
    steps_done: int
    history: list[dict]
    traces: dict[str, Any]
    param_digest: str


@dataclass(frozen=True)
class Resize:
    """The batch schedule chose another worker count at an epoch boundary: this world ends
    there, its checkpoint written, and the supervisor starts the next generation at ``next``.

    Parameters
    ----------
    config : Config
        The configuration the world ended at.
    segments : list of Segment
        The batches this world trained at.
    epochs_done : int
        The last finished epoch (the checkpoint's).
    steps_done : int
        Optimizer steps of the whole run so far.
    next : Config
        The configuration the schedule chose for the next epoch.
    """

    config: Config
    segments: list[Segment]
    epochs_done: int
    steps_done: int
    next: Config


@dataclass(frozen=True)
class OutOfMemory:
    """The ranks agreed that the first step at ``config`` does not fit (the probe), or a
    rank ran out of memory mid-epoch (the supervisor's mapping of the failed world).

    Parameters
    ----------
    config : Config
        The configuration that ran out of memory.
    segments : list of Segment
        The batches this world trained at before it.
    note : str
        Why: the probe's or the failure's sentence.
    """

    config: Config
    segments: list[Segment]
    note: str


@dataclass(frozen=True)
class Interrupted:
    """The ranks agreed to stop (SIGINT/SIGTERM) at a step or an epoch boundary; the last
    finished epoch's checkpoint is what is kept.

    Parameters
    ----------
    config : Config
        The configuration the world was at.
    segments : list of Segment
        The batches this world trained at.
    epochs_done : int
        The last finished epoch.
    steps_done : int
        Optimizer steps up to that epoch's end.
    signum : int or None
        The signal that asked to stop, when the ranks know it.
    """

    config: Config
    segments: list[Segment]
    epochs_done: int
    steps_done: int
    signum: int | None


@dataclass(frozen=True)
class Failed:
    """A world that gave no result: a rank failed (any cause but out-of-memory and an
    interruption, which have their own messages), or returned nothing a rank returns.

    Parameters
    ----------
    note : str
        The sentence that says what happened.
    rank : int or None
        The rank it happened on, when one is known.
    cause : str
        The failure's cause (:class:`~tula.core.errors.WorkerError`'s: ``crash``, ``timeout``, ...).
    details : str
        The traceback or other detail, for the log.
    """

    note: str
    rank: int | None = None
    cause: str = "crash"
    details: str = field(default="", repr=False)


#: what a rank (or the supervisor, for a world that failed) says about how a world ended
RankResult = Finished | Resize | OutOfMemory | Interrupted | Failed
