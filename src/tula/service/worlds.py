"""The service's jobs take turns on the operator's Dask scheduler, one world at a time.

A job holds exactly the workers of the world it runs now: a profile's world, the training,
each generation of a growing training.  Between worlds (starting, fitting, planning, writing
its records) it holds none, and the next job's world may use them.  Each world asks the store
for its turn (:meth:`tula.service.store.Store.take_world`): asks are served in the jobs'
submission order, each once enough workers are free, and a later ask never passes an earlier
one that waits, so no job starves.  :class:`StoreWorldGate` is the runner's side of it: the
:class:`~tula.engine.launch.base.WorldGate` its :class:`~tula.engine.launch.dask.DaskLauncher`
asks before a world takes its workers (whose Dask locks still guarantee that two worlds never
share one).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from tula.core.errors import Interrupted, TulaError, WorkerError
from tula.engine import interrupts
from tula.service.store.jobs import WorldTurn

#: how often a world waiting for its turn asks again (seconds)
ASK_EVERY_S = 0.2


def waiting_sentence(need: int, turn: WorldTurn, address: str) -> str:
    """What a running job's row says while its next world waits for workers."""
    why = (
        f"{turn.ahead} earlier job(s) wait first"
        if turn.ahead
        else f"{turn.free} of the {turn.total} free until a running world ends"
    )
    return f"waiting for {need} worker(s) at {address} for its next world: {why}"


class StoreWorldGate:
    """A runner's turns on the operator's workers, taken through the service's store.

    ``enter`` waits (asking every :data:`ASK_EVERY_S`) until the store grants the job's
    world, showing why on the job's row meanwhile; a SIGINT/SIGTERM while it waits (a cancel,
    the service stopping) gives the ask back and raises
    :class:`~tula.core.errors.Interrupted`, and a store that does not answer is asked again.
    ``leave`` gives the workers back."""

    def __init__(self, store: Any, job_id: str, address: str, ask_every_s: float = ASK_EVERY_S) -> None:
        self.store, self.job_id, self.address = store, job_id, address
        self.ask_every_s = ask_every_s

    def enter(self, n_workers: int, total_workers: Callable[[], int]) -> None:
        shown: str | None = None
        before: str | None = None
        try:
            while True:
                signum = interrupts.requested()
                if signum is not None:
                    raise Interrupted(
                        f"stopped while waiting for {n_workers} worker(s) for its next world; what it finished is kept",
                        signum,
                    )
                try:
                    turn = self.store.take_world(self.job_id, n_workers, total_workers())
                except WorkerError:  # the scheduler is gone: the world's failure
                    raise
                except TulaError:  # the store is briefly unavailable: ask again
                    turn = None
                if turn is not None and turn.granted:
                    if shown is not None and before is not None:
                        with contextlib.suppress(TulaError):
                            self.store.update_job(self.job_id, message=before)
                    return
                if turn is not None:
                    sentence = waiting_sentence(turn.need, turn, self.address)
                    if sentence != shown:
                        with contextlib.suppress(TulaError):
                            if shown is None:
                                job = self.store.get_job(self.job_id)
                                before = job.message if job is not None else None
                            self.store.update_job(self.job_id, message=sentence)
                            shown = sentence
                time.sleep(self.ask_every_s)
        except BaseException:
            self.leave()  # an ask left behind would hold back every later job
            raise

    def leave(self) -> None:
        for attempt in range(3):  # a store briefly unavailable; a job that ends frees them anyway
            try:
                self.store.leave_world(self.job_id)
                return
            except TulaError:
                time.sleep(0.5 * (attempt + 1))
