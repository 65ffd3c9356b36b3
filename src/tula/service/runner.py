"""Job runners: the processes that run submitted jobs, and the dispatcher that starts them.

The web process never runs a job.  Its :class:`Dispatcher` thread re-queues jobs whose
heartbeat went stale (their runner or the whole service was killed), claims queued jobs
while fewer than ``max_concurrent_jobs`` run, and starts one runner process per job
(``python -m tula.service.runner``).  A runner runs :func:`tula.pipeline.run_pipeline` in
the job's directory under the service's home, always resuming: a re-queued job continues
from its records (finished profile trials and epochs are not redone).  Its
:class:`StoreObserver` writes the job's state, progress and every record into the store as
the pipeline writes them; a heartbeat thread keeps the row alive and turns a cancel request
into SIGTERM, which the pipeline answers by stopping at the next step.

A new job whose model key (:mod:`tula.service.model_key`) matches models fitted by an
earlier job is planned from those, without profiling; its row names the job it reused.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tula.core.errors import Interrupted, TulaError, WorkerError
from tula.core.events import EpochFinished, Event, StepDone, TrialFinished, TrialsPlanned, WorldStarted
from tula.core.records import ProfileRecord
from tula.core.registry import cluster_kind
from tula.core.say import plain
from tula.engine import interrupts
from tula.pipeline import AnyRecord, Observer, run_pipeline
from tula.service.cluster import WorkerRoom
from tula.service.logs import configure_logging
from tula.service.memory_guard import MemoryGuard
from tula.service.settings import ServiceSettings
from tula.service.store import RUNNING_STATES, JobRow, Store
from tula.service.worlds import StoreWorldGate

log = logging.getLogger("tula.service.runner")  # its name also where it runs as __main__ (python -m)

PROGRESS_EVERY_S = 1.0  # progress is written at most this often (the heartbeat carries it too)
#: the failures of a world that a job on a cluster is re-queued after (a worker, host or link
#: lost, or the scheduler: the dispatcher holds the queue until it answers again), and how many
#: runs (attempts) a job gets in all before such a failure ends it
LOST_CAUSES = ("lost_worker", "unreachable", "scheduler_lost")
MAX_ATTEMPTS = 3
#: how long a runner this dispatcher started may take to start (its imports, opening the store)
#: before its first heartbeat: it is not stale meanwhile.  A start on busy cores can outlast
#: stale_after_s, and a runner replaced then starts as slowly again: on 2 loaded cores each of
#: three jobs' runners was replaced 6 times and none got to run (2026-11-29)
START_LIMIT_S = 600.0


class StoreObserver(Observer):
    """The pipeline's observer in a runner: state, progress and records into the store."""

    def __init__(self, store: Store, job_id: str, home: Path) -> None:
        self.store, self.job_id, self.home = store, job_id, home
        self.profile: ProfileRecord | None = None
        self.total = 0
        self.done_count = 0
        self.last_write = 0.0

    def stage(self, name: str, **info: Any) -> None:
        message = {
            "profiling": "profiling",
            "fitting": "fitting the models",
            "planning": "planning",
            "training": f"training {info.get('method')} at N={info.get('n_workers')}, B={info.get('global_batch')}",
        }[name]
        self.total, self.done_count = 0, 0
        self.store.update_job(self.job_id, state=name, progress=0.0, message=message)

    def event(self, stage: str, ev: Event) -> None:
        match ev:
            case TrialsPlanned():
                self.total, self.done_count = ev.total, ev.done
            case TrialFinished():
                self.done_count += 1
            case WorldStarted():
                self.total = ev.epochs * ev.steps_per_epoch
            case StepDone():
                self.done_count = ev.epoch * ev.steps_per_epoch + ev.step
            case EpochFinished(record=rec):
                self.done_count = rec.epoch * rec.steps
            case _:
                return
        now = time.monotonic()
        finished_one = isinstance(ev, TrialFinished | EpochFinished)  # a trial's or an epoch's end: written at once
        if self.total and (now - self.last_write >= PROGRESS_EVERY_S or finished_one):
            self.last_write = now
            self.store.update_job(self.job_id, progress=min(1.0, self.done_count / self.total))

    def saved(self, kind: str, record: dict | AnyRecord | None, path: Path) -> None:
        from tula.core.records import MODELS_KIND, PROFILE_KIND, TRAIN_KIND, ModelsRecord, as_record
        from tula.service.model_key import model_key, model_key_parts

        if record is None:  # a plot
            self.store.add_artifact(self.job_id, path.name, path)
            return
        self.store.put_record(self.job_id, record)
        if kind == TRAIN_KIND:  # the checkpoints stay files, referenced from the job's rows
            for name in ("checkpoint.pt", "checkpoint.prev.pt"):
                if (path.parent / name).is_file():
                    self.store.add_artifact(self.job_id, name, path.parent / name)
        if kind == PROFILE_KIND:
            self.profile = as_record(record, ProfileRecord)
        elif kind == MODELS_KIND and self.profile is not None:
            models = as_record(record, ModelsRecord)
            if not models.given("reused_models_from"):  # another job's models: stored under their key already
                parts = model_key_parts(models.spec, self.profile)
                self.store.put_models(self.job_id, model_key(parts), parts, models)

    def note(self, message: str) -> None:
        self.store.update_job(self.job_id, message=message)


def _reusable_models(store: Store, job: JobRow, spec, launcher) -> tuple[dict, str] | None:
    """Models fitted by an earlier job (submitted before it) with the same key, rebased onto this
    job's spec, and that job's id; or None.  Never a later job's: jobs submitted together would then profile or not
    by which runner got further first (the first of them, its runner started late or queued
    again before its first trial, could be planned from a later one's models and have no profile)."""
    from tula.core.fit import rebase_models
    from tula.engine.workloads import check_workload
    from tula.service.model_key import key_parts_for_new_job, model_key

    try:
        parts = key_parts_for_new_job(spec.to_dict(), launcher.facts(), launcher.threads_per_worker)
    except ValueError:  # a key that cannot be known before profiling (e.g. the shape of a user's arrays)
        return None
    found = store.find_models(model_key(parts), submitted_before=job.id)
    if found is None:
        return None
    models, from_job = found
    _, data = check_workload(spec)
    return rebase_models(models.to_json_dict(), spec.to_dict(), data.train_size, from_job), from_job


def on_the_services_cluster(spec, settings: ServiceSettings):
    """``spec`` as the service runs it: on the operator's cluster (``settings.cluster``) when it
    is not this host's processes; else where the submission asked (local, or dask: a
    LocalCluster), as admission allowed.  The records then say where the job ran, and the
    model key tells a scheduler's models from this host's."""
    from tula.core.spec import spec_from_dict

    if settings.cluster == "local" or spec.cluster.where == settings.cluster:
        return spec
    d = spec.to_dict()
    return spec_from_dict({**d, "cluster": {**d["cluster"], "where": settings.cluster}})


def _beats(stop: threading.Event, every_s: float) -> Iterator[None]:
    """A beat at once, then one every ``every_s`` until ``stop`` is set.  At once: the dispatcher
    holds a runner that is starting (that has not beaten since its claim) as not stale."""
    wait = 0.0
    while not stop.wait(wait):
        yield
        wait = every_s


def run_job(settings: ServiceSettings, job_id: str, runner: str) -> int:
    """Run (or resume) one claimed job to its end; the exit code of the runner process."""
    from tula.core.spec import spec_from_dict
    from tula.engine.launch.clusters import open_launcher

    store = Store(settings.store_url, settings.home)
    job = store.get_job(job_id)
    if job is None or job.runner != runner:
        return 0  # re-queued or taken by another runner meanwhile
    stop = threading.Event()
    cancelled = threading.Event()

    def heartbeat() -> None:
        for _ in _beats(stop, settings.heartbeat_s):
            try:
                mine = store.heartbeat(job_id, runner)
                row = store.get_job(job_id)
            except TulaError:
                continue  # the store is briefly unavailable: try again at the next beat
            if not mine or (row and row.cancel_requested):
                cancelled.set() if row and row.cancel_requested else None
                os.kill(os.getpid(), signal.SIGTERM)  # the pipeline stops at the next step
                return

    beat = threading.Thread(target=heartbeat, name="tula-heartbeat", daemon=True)
    beat.start()
    log.info("job %s: runner %s (pid %d) starts it (attempt %s)", job_id, runner, os.getpid(), job.attempts)
    out = store.job_dir(job_id)
    observer = StoreObserver(store, job_id, settings.home)
    try:
        spec = on_the_services_cluster(spec_from_dict(job.spec), settings)
        with interrupts.graceful_signals(), open_launcher(spec) as launcher:
            if cluster_kind(settings.cluster).name == "scheduler" and hasattr(launcher, "world_gate"):
                # the operator's workers are shared: each world takes its turn (tula.service.worlds)
                launcher.world_gate = StoreWorldGate(store, job_id, settings.cluster)
            models = None
            if not (out / "profile.json").exists() and not (out / "models.json").exists():
                reused = _reusable_models(store, job, spec, launcher)
                if reused is not None:
                    models, from_job = reused
                    store.update_job(
                        job_id, reused_models_from=from_job, message=f"planned from the models of job {from_job}"
                    )
            run_pipeline(
                spec,
                out,
                search=job.search,
                objective=job.objective,
                train_after=job.train,
                resuming=True,
                launcher=launcher,
                observer=observer,
                models=models,
            )
        store.update_job(job_id, state="done", progress=1.0, message="done")
        log.info("job %s: done", job_id)
        return 0
    except Interrupted as err:
        if cancelled.is_set():
            store.update_job(job_id, state="cancelled", message=f"cancelled: {plain(err)}")
            return 0
        return 143  # stopped from outside (the service is shutting down): the dispatcher re-queues it
    except WorkerError as err:
        return _after_a_failed_world(store, job, err, settings)
    except TulaError as err:
        store.update_job(job_id, state="failed", error=plain(err))
        return 2
    except Exception as err:  # a bug: the job fails with the error, the traceback goes to the log
        log.exception("job %s failed with an internal error", job_id)
        store.update_job(job_id, state="failed", error=f"internal error: {type(err).__name__}: {plain(err)}")
        return 1
    finally:
        stop.set()
        store.close()


def _after_a_failed_world(store: Store, job: JobRow, err: WorkerError, settings: ServiceSettings) -> int:
    """A world of the job failed: where a worker, its host or its link was lost on a cluster,
    the job is queued again (exit 3) and goes on from its records (the last checkpoint, the
    finished trials) on the workers there are, once enough are free -- at most
    :data:`MAX_ATTEMPTS` runs in all; any other failure ends it (exit 2)."""
    if err.cause in LOST_CAUSES and job.attempts < MAX_ATTEMPTS and settings.cluster != "local":
        where = "once the scheduler answers" if err.cause == "scheduler_lost" else "on the workers left"
        store.update_job(
            job.id,
            state="queued",
            message=f"queued again to resume {where} (attempt {job.attempts} of {MAX_ATTEMPTS}): {plain(err)}",
        )
        log.warning("job %s: a world failed (%s); queued again to resume %s: %s", job.id, err.cause, where, plain(err))
        return 3
    store.update_job(job.id, state="failed", error=plain(err))
    log.info("job %s: failed: %s", job.id, plain(err))
    return 2


class Dispatcher:
    """A thread in the web process: re-queue stale jobs, start a runner per claimed job."""

    def __init__(self, settings: ServiceSettings, store: Store, name: str | None = None) -> None:
        self.settings, self.store = settings, store
        self.name = name or f"{os.uname().nodename}:{os.getpid()}"
        self.children: dict[str, subprocess.Popen] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="tula-dispatcher", daemon=True)
        self.log = settings.home / "runners.log"
        self.pid_files = settings.home / "runners"  # <job id>: its runner's name and pid, on this host
        self.room = WorkerRoom(settings)  # the operator's workers a queued job waits for
        # stops a job whose processes on this host hold more than max_job_memory_bytes (0: no limit)
        self.guard = MemoryGuard(settings.max_job_memory_bytes) if settings.max_job_memory_bytes else None
        self.starting: dict[str, tuple[Any, float]] = {}  # job id -> its heartbeat at the claim, when claimed

    def start(self) -> None:
        # a runner of an earlier service on this host whose process is gone (the service and
        # its runners killed): its job is queued again now, not after stale_after_s
        self.store.requeue_stale(self.settings.stale_after_s, runners_gone=self.runners_gone())
        if self.guard is not None:
            self.guard.start()
        self.thread.start()

    def runners_gone(self) -> list[str]:
        """The runners this host started (their pid files) whose process no longer runs:
        no process of that pid, or one that is not that job's runner (the pid was reused)."""
        gone = []
        for path in sorted(self.pid_files.glob("*")) if self.pid_files.is_dir() else []:
            try:
                runner, pid = path.read_text().split()
                proc = Path(f"/proc/{int(pid)}/cmdline")
            except (OSError, ValueError):  # a damaged pid file says nothing: the heartbeat decides
                runner, proc = "", None
            try:
                cmdline = proc.read_bytes().split(b"\0") if proc is not None else []
            except OSError:  # no such process
                cmdline = []
            if b"tula.service.runner" in cmdline and path.name.encode() in cmdline:
                continue  # alive
            if runner.startswith(f"{os.uname().nodename}:"):
                gone.append(runner)
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        return gone

    def _loop(self) -> None:
        while not self.stopping.wait(self.settings.poll_s):
            try:
                self.tick()
            except TulaError as err:  # the store is unavailable: say so and try again
                log.warning(
                    "the dispatcher could not reach the store (it tries again in %s s): %s",
                    self.settings.poll_s,
                    plain(err),
                )

    def tick(self) -> None:
        for job_id, proc in list(self.children.items()):
            if proc.poll() is not None:
                log.info("job %s: its runner (pid %d) exited with code %s", job_id, proc.pid, proc.returncode)
                del self.children[job_id]
                (self.pid_files / job_id).unlink(missing_ok=True)
                over_memory = self.guard.forget(job_id) if self.guard is not None else None
                job = self.store.get_job(job_id)
                if over_memory is not None and job and job.state not in ("done", "cancelled"):
                    self.store.update_job(job_id, state="failed", error=over_memory)
                elif job and job.state in RUNNING_STATES and job.runner and job.runner.startswith(self.name):
                    # the runner ended without finishing the job (killed, stopped): queue it again
                    self.store.update_job(
                        job_id,
                        state="queued",
                        message=f"runner exited with code {proc.returncode}; queued again to resume",
                    )
        self.store.requeue_stale(self.settings.stale_after_s, keep=self._starting())
        while not self.stopping.is_set() and self.store.count_running() < self.settings.max_concurrent_jobs:
            head = self.store.oldest_queued()
            if head is None:
                return
            running = self.store.list_jobs(state=RUNNING_STATES, limit=10_000)[0]
            wait = self.room.why_wait(running)
            if wait is not None:  # in submission order: no later job passes it
                if head.message != wait:
                    self.store.note_queued(head.id, wait)
                return
            runner = f"{self.name}/{time.monotonic_ns()}"
            job = self.store.claim_job(runner, job_id=head.id)
            if job is None:  # cancelled meanwhile: look again
                continue
            stale = self.children.pop(job.id, None)
            if stale is not None and stale.poll() is None:
                # its runner is still alive but was silent past stale_after_s once it had
                # started (or never started within START_LIMIT_S): it is replaced, never left
                # running beside the new one
                stale.kill()
                stale.wait()
            proc = self.children[job.id] = self._spawn(job.id, runner)
            self.starting[job.id] = (job.heartbeat_at, time.monotonic())
            log.info(
                "job %s: claimed; runner %s started (pid %d, its output in %s)", job.id, runner, proc.pid, self.log
            )
            if self.guard is not None:
                self.guard.watch(job.id, proc.pid)
            self.pid_files.mkdir(parents=True, exist_ok=True)
            (self.pid_files / job.id).write_text(f"{runner} {proc.pid}\n")

    def _starting(self) -> list[str]:
        """The jobs whose runner, started here, is alive and has not beaten since its claim, for
        at most :data:`START_LIMIT_S`: starting, not stale.  Once it has beaten, stale_after_s
        holds (a runner silent then is replaced, never left running beside the new one)."""
        for job_id, (claimed_beat, since) in list(self.starting.items()):
            proc = self.children.get(job_id)
            job = self.store.get_job(job_id) if proc is not None and proc.poll() is None else None
            if job is None or job.heartbeat_at != claimed_beat or time.monotonic() - since > START_LIMIT_S:
                del self.starting[job_id]
        return list(self.starting)

    def _spawn(self, job_id: str, runner: str) -> subprocess.Popen:
        s = self.settings
        env = {**os.environ, "TULA_HOME": str(s.home)}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tula.service.runner",
                    "--db",
                    s.store_url,
                    "--home",
                    str(s.home),
                    "--job",
                    job_id,
                    "--runner",
                    runner,
                    "--heartbeat-s",
                    str(s.heartbeat_s),
                    "--cluster",
                    s.cluster,
                ],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop dispatching; ask running runners to stop at their next step (they are
        re-queued and resume when the service starts again)."""
        self.stopping.set()
        for proc in self.children.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.children.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        for job_id in list(self.children):
            job = self.store.get_job(job_id)
            if job and job.state in RUNNING_STATES:
                self.store.update_job(job_id, state="queued", message="the service stopped; queued again to resume")
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        if self.guard is not None:
            self.guard.close()
        self.room.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tula.service.runner", description="run one claimed Tula job")
    ap.add_argument("--db", required=True)
    ap.add_argument("--home", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--runner", required=True)
    ap.add_argument("--heartbeat-s", type=float, default=2.0)
    ap.add_argument("--cluster", default="local", help="the service's cluster setting: where the job runs")
    a = ap.parse_args(argv)
    configure_logging()  # a runner process: its tula.* loggers write to its stderr, runners.log
    settings = ServiceSettings(home=Path(a.home), db_url=a.db, heartbeat_s=a.heartbeat_s, cluster=a.cluster)
    return run_job(settings, a.job, a.runner)


if __name__ == "__main__":
    sys.exit(main())
