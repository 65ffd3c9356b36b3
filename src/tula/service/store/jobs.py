"""The store's job queue: a job is created ``queued``, claimed by one runner (a lease kept
alive by its heartbeat), moved through the pipeline's states, and ended; a job whose runner
stopped heartbeating is queued again (or failed, after too many tries); cancelling is a flag
its runner sees in its next heartbeat.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from tula.core.registry import OBJECTIVE_NAMES
from tula.core.say import plain
from tula.service.store.database import Database, JobRow, UnknownJob, now_utc
from tula.service.store.schema import jobs, plain_json

#: a job's states, in pipeline order, then its ends
JOB_STATES = ("queued", "profiling", "fitting", "planning", "training", "done", "failed", "cancelled")
RUNNING_STATES = ("profiling", "fitting", "planning", "training")
ENDED_STATES = ("done", "failed", "cancelled")
#: a job between worlds: it neither asks for nor holds workers (:meth:`JobQueue.take_world`)
NO_WORLD = {"world_workers": None, "world_granted_at": None}
#: PostgreSQL's advisory lock that serialises the decisions of :meth:`JobQueue.take_world`
#: (SQLite's writers are serialised already)
_WORLD_LOCK_KEY = 0x7475_6C61  # "tula"


def new_id() -> str:
    """A short url-safe id: 12 hex digits of a random UUID."""
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class WorldTurn:
    """:meth:`JobQueue.take_world`'s answer to a job's ask for a world."""

    granted: bool
    """whether the world may take its workers now"""
    need: int
    """the workers it asked for, capped at ``total``"""
    free: int
    """the workers the other jobs' granted worlds leave free"""
    ahead: int
    """the earlier jobs whose worlds wait for their turn first"""
    total: int
    """the workers of the operator's cluster"""


def _turn(rows: list[Any], job_id: str, n_workers: int, total: int) -> tuple[WorldTurn, Any]:
    """:meth:`JobQueue.take_world`'s rule on the running jobs' worlds ``rows`` (in submission
    order): the answer, and ``job_id``'s row (None: it is not running, never granted)."""
    need = min(int(n_workers), total)
    mine = next((r for r in rows if r.id == job_id), None)
    if mine is None:
        return WorldTurn(granted=False, need=need, free=0, ahead=0, total=total), None
    held = sum(min(r.world_workers, total) for r in rows if r.world_granted_at is not None and r.id != job_id)
    free = max(0, total - held)
    if mine.world_granted_at is not None and mine.world_workers == n_workers:
        return WorldTurn(granted=True, need=need, free=free, ahead=0, total=total), mine  # asking again keeps it
    earlier = rows[: rows.index(mine)]
    ahead = sum(1 for r in earlier if r.world_workers is not None and r.world_granted_at is None)
    granted = total > 0 and ahead == 0 and need <= free
    return WorldTurn(granted=granted, need=need, free=free, ahead=ahead, total=total), mine


class JobQueue(Database):
    """Jobs and their states: create, list, claim, update, heartbeat, requeue, cancel."""

    def create_job(
        self, spec: dict, *, search: str = "partial", objective: str | None = None, train: bool = True
    ) -> str:
        """A new queued job; returns its id.  ``spec`` is a checked job spec as a dict."""
        if search not in ("full", "partial"):
            raise ValueError(f"search must be 'full' or 'partial', not {search!r}")
        if objective is not None and objective not in OBJECTIVE_NAMES:
            raise ValueError(f"objective must be time, cost, knee or None, not {objective!r}")
        if not isinstance(spec, dict):
            raise ValueError("spec must be a dict")
        now = now_utc()
        job_id = new_id()
        with self._write() as conn:
            conn.execute(
                sa.insert(jobs).values(
                    id=job_id,
                    state="queued",
                    spec=plain_json(spec),
                    search=search,
                    objective=objective,
                    train=bool(train),
                    progress=0.0,
                    message=None,
                    error=None,
                    created_at=now,
                    started_at=None,
                    updated_at=now,
                    finished_at=None,
                    heartbeat_at=None,
                    runner=None,
                    attempts=0,
                    reused_models_from=None,
                    cancel_requested=False,
                    **NO_WORLD,
                )
            )
        return job_id

    def get_job(self, job_id: str) -> JobRow | None:
        with self._read() as conn:
            return self._get_job(conn, job_id)

    def list_jobs(
        self, state: str | Iterable[str] | None = None, limit: int = 50, offset: int = 0
    ) -> tuple[list[JobRow], int]:
        """Jobs newest first (optionally in ``state``, a state or several), and how many match."""
        where = []
        if state is not None:
            states = [state] if isinstance(state, str) else list(state)
            bad = [s for s in states if s not in JOB_STATES]
            if bad:
                raise ValueError(f"unknown job state {bad[0]!r}; the states are {', '.join(JOB_STATES)}")
            where.append(jobs.c.state.in_(states))
        with self._read() as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(jobs).where(*where)).scalar_one()
            rows = conn.execute(
                sa.select(jobs)
                .where(*where)
                .order_by(jobs.c.created_at.desc(), jobs.c.id.desc())
                .limit(max(0, int(limit)))
                .offset(max(0, int(offset)))
            ).all()
        return [JobRow.from_row(r) for r in rows], int(total)

    def oldest_queued(self) -> JobRow | None:
        """The job :meth:`claim_job` would take next (the oldest queued), or None."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(jobs).where(jobs.c.state == "queued").order_by(jobs.c.created_at, jobs.c.id).limit(1)
            ).first()
        return JobRow.from_row(row) if row is not None else None

    def claim_job(self, runner: str, job_id: str | None = None) -> JobRow | None:
        """Take the oldest queued job (or the job ``job_id``, while it is queued) for ``runner``
        (state ``profiling``, attempts + 1, heartbeat now), or None when none is queued.  Two
        claimers never get the same job: PostgreSQL skips rows another claimer holds (FOR
        UPDATE SKIP LOCKED); SQLite serialises writers; and the update only takes a job that
        is still queued."""
        only = [jobs.c.id == job_id] if job_id is not None else []
        for _ in range(20):
            now = now_utc()
            with self._write() as conn:
                row = conn.execute(
                    sa.select(jobs.c.id)
                    .where(jobs.c.state == "queued", *only)
                    .order_by(jobs.c.created_at, jobs.c.id)
                    .limit(1)
                    .with_for_update(skip_locked=True)
                ).first()
                if row is None:
                    return None
                res = conn.execute(
                    sa.update(jobs)
                    .where(jobs.c.id == row.id, jobs.c.state == "queued")
                    .values(
                        state="profiling",
                        runner=runner,
                        heartbeat_at=now,
                        updated_at=now,
                        started_at=sa.func.coalesce(jobs.c.started_at, now),
                        attempts=jobs.c.attempts + 1,
                        **NO_WORLD,
                    )
                )
                if res.rowcount == 1:
                    return self._get_job(conn, row.id)
        return None  # pragma: no cover - only under a storm of competing claimers

    def update_job(
        self,
        job_id: str,
        *,
        state: str | None = None,
        progress: float | None = None,
        message: str | None = None,
        error: str | None = None,
        reused_models_from: str | None = None,
    ) -> None:
        """Set the fields given (None: unchanged).  Entering an end state sets ``finished_at``;
        going back to ``queued`` clears the runner."""
        if state is not None and state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}; the states are {', '.join(JOB_STATES)}")
        if progress is not None and not (0.0 <= float(progress) <= 1.0):
            raise ValueError(f"progress must be in [0, 1], not {progress!r}")
        now = now_utc()
        given = dict(
            state=state,
            progress=None if progress is None else float(progress),
            message=None if message is None else plain(message),
            error=None if error is None else plain(error),
            reused_models_from=reused_models_from,
        )
        values: dict[str, Any] = {"updated_at": now, **{k: v for k, v in given.items() if v is not None}}
        if state is not None and state not in RUNNING_STATES:  # a job that stops running holds no workers
            values.update(NO_WORLD)
        if state in ENDED_STATES:
            values.update(finished_at=now)
        elif state == "queued":
            values.update(runner=None, heartbeat_at=None, finished_at=None)
        with self._write() as conn:
            if conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values)).rowcount != 1:
                raise UnknownJob(f"there is no job {job_id!r} in the store")

    def note_queued(self, job_id: str, message: str) -> None:
        """Set a queued job's message (what it waits for); a job no longer queued is left as it is."""
        with self._write() as conn:
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == "queued")
                .values(message=plain(message), updated_at=now_utc())
            )

    def heartbeat(self, job_id: str, runner: str) -> bool:
        """Record that ``runner`` is alive and working on ``job_id``.  False when the job is no
        longer this runner's to run (re-queued, taken by another runner, ended) or its
        cancellation was requested: the runner should stop."""
        now = now_utc()
        with self._write() as conn:
            res = conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id, jobs.c.runner == runner, jobs.c.state.in_(RUNNING_STATES))
                .values(heartbeat_at=now)
            )
            if res.rowcount != 1:
                return False
            return not conn.execute(sa.select(jobs.c.cancel_requested).where(jobs.c.id == job_id)).scalar_one()

    def requeue_stale(
        self,
        stale_after_s: float,
        max_attempts: int | None = None,
        runners_gone: Sequence[str] = (),
        keep: Sequence[str] = (),
    ) -> list[str]:
        """Jobs in a running state whose heartbeat is older than ``stale_after_s`` (their
        runner was killed), or whose runner is one of ``runners_gone`` (known dead: its process
        is gone), go back to ``queued``, runner cleared; returns their ids.  Such a job whose
        cancellation was requested ends ``cancelled`` instead, and one that has already been
        claimed ``max_attempts`` times ends ``failed`` (neither is returned).  The jobs in ``keep``
        (their runners are known to be starting) are left as they are."""
        now = now_utc()
        cutoff = now - timedelta(seconds=float(stale_after_s))
        beat = sa.func.coalesce(jobs.c.heartbeat_at, jobs.c.started_at, jobs.c.updated_at)
        silent = beat < cutoff if not runners_gone else sa.or_(beat < cutoff, jobs.c.runner.in_(list(runners_gone)))
        stale = sa.and_(jobs.c.state.in_(RUNNING_STATES), silent)
        if keep:
            stale = sa.and_(stale, jobs.c.id.notin_(list(keep)))
        requeued: list[str] = []
        with self._write() as conn:
            rows = conn.execute(
                sa.select(jobs.c.id, jobs.c.cancel_requested, jobs.c.attempts)
                .where(stale)
                .order_by(jobs.c.created_at)
                .with_for_update(skip_locked=True)
            ).all()
            for r in rows:
                cond = sa.and_(jobs.c.id == r.id, stale)
                if r.cancel_requested:
                    conn.execute(
                        sa.update(jobs)
                        .where(cond)
                        .values(
                            state="cancelled",
                            runner=None,
                            **NO_WORLD,
                            finished_at=now,
                            updated_at=now,
                            message="cancelled (its runner stopped before it could finish cancelling)",
                        )
                    )
                elif max_attempts is not None and r.attempts >= max_attempts:
                    conn.execute(
                        sa.update(jobs)
                        .where(cond)
                        .values(
                            state="failed",
                            runner=None,
                            **NO_WORLD,
                            finished_at=now,
                            updated_at=now,
                            error=f"the job's runner stopped without a word {r.attempts} time(s); it is not retried again",
                        )
                    )
                elif (
                    conn.execute(
                        sa.update(jobs)
                        .where(cond)
                        .values(
                            state="queued",
                            runner=None,
                            heartbeat_at=None,
                            **NO_WORLD,
                            updated_at=now,
                            message="re-queued: its runner stopped heartbeating",
                        )
                    ).rowcount
                    == 1
                ):
                    requeued.append(r.id)
        return requeued

    def request_cancel(self, job_id: str) -> JobRow:
        """Cancel ``job_id``: a queued job ends ``cancelled`` at once; a running one gets
        ``cancel_requested`` (its runner sees it in :meth:`heartbeat` and stops); an ended one
        is left as it is.  Returns the job as it is now."""
        now = now_utc()
        with self._write() as conn:
            job = self._need_job(conn, job_id, lock=True)
            if job.state == "queued":
                conn.execute(
                    sa.update(jobs)
                    .where(jobs.c.id == job_id, jobs.c.state == "queued")
                    .values(state="cancelled", cancel_requested=True, finished_at=now, updated_at=now)
                )
            elif job.state in RUNNING_STATES and not job.cancel_requested:
                conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(cancel_requested=True, updated_at=now))
            return self._need_job(conn, job_id)

    def count_running(self) -> int:
        with self._read() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).select_from(jobs).where(jobs.c.state.in_(RUNNING_STATES))
                ).scalar_one()
            )

    # ------------------------------------------------------------------ worlds on the operator's cluster
    def take_world(self, job_id: str, n_workers: int, total_workers: int) -> WorldTurn:
        """Ask, for the running job ``job_id``, for a world of ``n_workers`` of the operator's
        ``total_workers``, and take it if it is this job's turn (:class:`WorldTurn`).

        The rule, decided in one transaction (PostgreSQL: under an advisory lock; SQLite
        serialises its writers): the running jobs' asks are served in submission order, each
        once the workers the granted worlds leave free are enough for it.  A later ask never
        passes an earlier one that waits, so no job starves: the worlds it waits for are
        finite and free their workers when they end (:meth:`leave_world`).  ``need`` is
        ``n_workers`` capped at ``total_workers``: a world larger than the cluster gets all
        of it when its turn comes (its launcher then says how many there are).  Asking again
        while granted keeps the grant; a job no longer running is never granted."""
        total = max(0, int(total_workers))
        with self._read() as conn:  # a waiting world asks often: no write while nothing changes
            turn, mine = _turn(self._worlds(conn), job_id, n_workers, total)
        if mine is None or (not turn.granted and mine.world_workers == n_workers and mine.world_granted_at is None):
            return turn
        with self._write() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _WORLD_LOCK_KEY})
            turn, mine = _turn(self._worlds(conn), job_id, n_workers, total)
            if mine is not None and (mine.world_workers, mine.world_granted_at is not None) != (
                n_workers,
                turn.granted,
            ):
                conn.execute(
                    sa.update(jobs)
                    .where(jobs.c.id == job_id)
                    .values(world_workers=int(n_workers), world_granted_at=now_utc() if turn.granted else None)
                )
            return turn

    @staticmethod
    def _worlds(conn: Any) -> list[Any]:
        """The running jobs' worlds, in submission order."""
        return conn.execute(
            sa.select(jobs.c.id, jobs.c.created_at, jobs.c.world_workers, jobs.c.world_granted_at)
            .where(jobs.c.state.in_(RUNNING_STATES))
            .order_by(jobs.c.created_at, jobs.c.id)
        ).all()

    def leave_world(self, job_id: str) -> None:
        """The job's world ended (or it stopped waiting for one): its workers are free."""
        with self._write() as conn:
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**NO_WORLD))
