"""Metrics sinks: each finished training epoch written to TensorBoard or MLflow (``train.loggers``).

The kinds are one table, :data:`tula.core.sinks.SINKS`; a sink is a small class with three
methods (:class:`Sink`): ``open`` once per training call, ``log_epoch`` with each finished
epoch's record (the line :mod:`tula.engine.train` appends to ``metrics.jsonl``), ``close`` at
the end.  :class:`EpochSinks` is the one hook: the trainer's supervisor (the process that
launched the world, never a rank) passes every event of the run through it; it opens the
spec's sinks at the first world's start, writes each ``epoch`` event to each of them and
closes them when the run ends.

What is written, per epoch (step = the epoch number, 1, 2, ...): every number of the epoch's
record under its own name -- ``train_loss``, ``test_loss``, ``test_top1``, ``test_top5`` (or
``test_mse``, ``test_r2``), ``lr``, ``global_batch``, ``n_workers``, ``accumulation_steps``,
``epoch_time_s``, ``epoch_wall_s``, ``b_simple`` (the gradient noise scale), AGS's
``scaled_fraction``, ... -- and the mean of each per-step trace the method kept
(``trace_delta_mean`` for AGS, ``trace_gain_mean`` for AdaScale).

A resumed run goes on in the same TensorBoard directory and the same MLflow run, from the epoch
after the last one each sink holds: ``loggers.json`` in the training output directory keeps,
per sink, the last epoch written (and the MLflow run's id), and epochs that reached
``metrics.jsonl`` but not a sink (a run stopped between the two) are written first.  A sink
that fails while training logs a warning and is dropped; training goes on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from tula.core.errors import Interrupted
from tula.core.events import EpochFinished, Event, WorldStarted
from tula.core.records import read_jsonl, write_atomic
from tula.core.say import first_line
from tula.core.sinks import sink_class
from tula.core.spec import JobSpec, LoggerSpec

log = logging.getLogger(__name__)

#: the sinks' state in the training output directory: per sink, the last epoch written (and MLflow's run id)
STATE = "loggers.json"
METRICS = "metrics.jsonl"  # tula.engine.train.METRICS (not imported: train imports this module)
STEP_TRACES = "step_traces"
#: fields of an epoch record that are not metrics (the step itself)
_NOT_METRICS = ("epoch", "type")


class Sink(Protocol):
    """A metrics sink: opened once per training call, fed each finished epoch, closed at the end."""

    def open(self, run: RunInfo) -> None:
        """Start writing: a new run, or (``run.resumed``) the one ``run.state`` names."""

    def log_epoch(self, record: dict) -> None:
        """Write one finished epoch's record (a line of ``metrics.jsonl``; :func:`epoch_metrics`)."""

    def close(self, status: str) -> None:
        """Finish: ``status`` is ``finished``, ``interrupted`` or ``failed``."""


class RunInfo:
    """What a sink is opened with.

    Parameters
    ----------
    out : Path
        The training output directory (checkpoints, ``metrics.jsonl``).
    spec : JobSpec
        The job.
    method : str
        The training method.
    start : dict
        The first world's ``start`` event: ``global_batch``, ``n_workers``, ``accumulation_steps``, ...
    resumed : bool
        Whether the run goes on from a checkpoint.
    state : dict
        This sink's entry of ``loggers.json`` (empty for a new one); a sink may add to it (MLflow's run id).
    """

    def __init__(self, out: Path, spec: JobSpec, method: str, start: dict, resumed: bool, state: dict) -> None:
        self.out, self.spec, self.method, self.start, self.resumed, self.state = (
            out,
            spec,
            method,
            start,
            resumed,
            state,
        )

    def params(self) -> dict[str, str]:
        """The run's configuration as flat ``name: text`` pairs: the method, the first world's
        configuration and every field of the spec (``spec.train.lr_gamma``, ...)."""
        first = {k: v for k, v in self.start.items() if k != "type"}
        flat = {"method": self.method, **{f"start.{k}": v for k, v in first.items()}}
        flat.update(_flatten(self.spec.to_dict(), "spec"))
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in flat.items()}


def _flatten(d: dict, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}.{k}"))
        else:
            out[f"{prefix}.{k}"] = v
    return out


def epoch_metrics(record: dict) -> tuple[int, dict[str, float]]:
    """``(epoch, {name: value})`` of an epoch's record: every finite number in it (not the epoch
    itself, nor booleans or nested records) and the mean of each per-step trace
    (``trace_<name>_mean``)."""
    metrics: dict[str, float] = {}
    for k, v in record.items():
        if k in _NOT_METRICS or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            metrics[k] = float(v)
    for k, values in (record.get(STEP_TRACES) or {}).items():
        finite = [float(x) for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
        if finite:
            metrics[f"trace_{k}_mean"] = sum(finite) / len(finite)
    return int(record["epoch"]), metrics


class TensorBoardSink:
    """TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``): one scalar per metric
    per epoch, and the configuration as text at the first epoch.  ``dir``: the entry's, else
    ``tensorboard/`` in the training output directory; a resumed run adds an event file there,
    purging any step after the last epoch kept."""

    def __init__(self, entry: LoggerSpec) -> None:
        self.entry = entry
        self.writer: Any = None
        self.dir: Path | None = None

    def open(self, run: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(self.entry.dir).expanduser() if self.entry.dir else run.out / "tensorboard"
        last = int(run.state.get("last_epoch", 0))
        # a resumed run: anything written after the last epoch it keeps is dropped from the view
        self.writer = SummaryWriter(log_dir=str(self.dir), purge_step=last + 1 if last else None)
        if not last:
            params = run.params()
            self.writer.add_text("config", "\n".join(f"    {k} = {v}" for k, v in params.items()), global_step=0)
        run.state["dir"] = str(self.dir)

    def log_epoch(self, record: dict) -> None:
        epoch, metrics = epoch_metrics(record)
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, global_step=epoch)
        self.writer.flush()

    def close(self, status: str) -> None:  # noqa: ARG002 - TensorBoard has no run status
        if self.writer is not None:
            self.writer.close()


class MLflowSink:
    """An MLflow run (``mlflow.tracking.MlflowClient``): params are the configuration
    (:meth:`RunInfo.params`), metrics each epoch's numbers with step = epoch; the run ends
    FINISHED, KILLED (interrupted) or FAILED.  ``tracking_uri``: the entry's, else
    ``$MLFLOW_TRACKING_URI``, else ``sqlite:///`` ``mlflow.db`` in the training output directory;
    ``experiment``: the entry's, else the spec's name (created when missing); a resumed run goes
    on in the run ``loggers.json`` names."""

    #: MLflow's limit of params per log_batch call
    BATCH = 100

    def __init__(self, entry: LoggerSpec) -> None:
        self.entry = entry
        self.client: Any = None
        self.run_id: str | None = None

    def tracking_uri(self, out: Path) -> str:
        """The tracking URI this sink writes to."""
        if self.entry.tracking_uri:
            return self.entry.tracking_uri
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(out / 'mlflow.db').resolve()}"

    def open(self, run: RunInfo) -> None:
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri(run.out)
        self.client = MlflowClient(tracking_uri=uri)
        run_id = run.state.get("run_id") if run.state.get("tracking_uri") == uri else None
        if run_id is not None and self._continue(run_id):
            self.run_id = run_id
            return
        name = self.entry.experiment or run.spec.name
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(name)
        created = self.client.create_run(experiment_id, run_name=self.entry.run_name or run.out.resolve().name)
        self.run_id = created.info.run_id
        run.state.clear()  # a new run: every epoch kept is written to it
        run.state.update(tracking_uri=uri, run_id=self.run_id, experiment=name)
        from mlflow.entities import Param

        params = [Param(k, v[:6000]) for k, v in run.params().items()]
        for i in range(0, len(params), self.BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + self.BATCH])

    def _continue(self, run_id: str) -> bool:
        """Go on in the earlier run ``run_id``; False when it is gone (deleted, another store)."""
        try:
            found = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - MLflow raises its own exception for a run it does not know
            return False
        if found.info.lifecycle_stage != "active":
            return False
        self.client.update_run(run_id, status="RUNNING")
        return True

    def log_epoch(self, record: dict) -> None:
        from mlflow.entities import Metric

        epoch, metrics = epoch_metrics(record)
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, epoch) for k, v in metrics.items()])

    def close(self, status: str) -> None:
        if self.client is not None and self.run_id is not None:
            ended = {"finished": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED")
            self.client.set_terminated(self.run_id, status=ended)


class EpochSinks:
    """The spec's ``train.loggers`` for one training call: every event of the run passes through
    it (``on_event`` first), the sinks open at the first ``start`` event, each ``epoch`` event is
    written to each of them, and :meth:`close` (the context's exit) ends them.

    Parameters
    ----------
    spec : JobSpec
        The job; its ``train.loggers`` are the sinks (none: events are only passed on).
    method : str
        The training method.
    out : Path
        The training output directory.
    resume : bool
        Whether the run goes on from the checkpoint in ``out``.
    on_event : callable or None
        The caller's handler of the run's events, called first with each.
    """

    def __init__(self, spec: JobSpec, method: str, out: Path, resume: bool, on_event: Any = None) -> None:
        self.spec, self.method, self.out, self.resume = spec, method, Path(out), resume
        self.forward = on_event
        self.entries = list(spec.train.loggers)
        self.sinks: dict[str, Any] = {}  # key in loggers.json -> the open sink
        self.state: dict[str, dict] = {}
        self.opened = False

    def __call__(self, ev: Event) -> None:
        if self.forward is not None:
            self.forward(ev)
        if not self.entries:
            return
        try:  # the sinks get the events' JSON (a logger's run parameters, an epoch's metrics line)
            if isinstance(ev, WorldStarted) and not self.opened:
                self.opened = True
                self._open(ev.to_json_dict())
            elif isinstance(ev, EpochFinished) and self.sinks:
                self._log(ev.to_json_dict())
        except Exception as err:  # noqa: BLE001 - the sinks never stop training (each failure is also caught below)
            log.warning("train.loggers: %s: %s; training goes on", type(err).__name__, first_line(err, 300))

    def __enter__(self) -> EpochSinks:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        status = "finished" if exc_type is None else "interrupted" if issubclass(exc_type, Interrupted) else "failed"
        self.close(status)

    # ------------------------------------------------------------------ opening
    def _open(self, start: dict) -> None:
        saved = self._read_state() if self.resume else {}
        kept = self._epochs_kept()
        for i, entry in enumerate(self.entries):
            key = f"{i}:{entry.kind}"
            state = dict(saved[key]) if isinstance(saved.get(key), dict) else {}
            last = state.get("last_epoch")
            state["last_epoch"] = min(last if isinstance(last, int) and last >= 0 else 0, kept)
            try:
                sink = sink_class(entry.kind)(entry)
                sink.open(RunInfo(self.out, self.spec, self.method, start, self.resume and kept > 0, state))
            except Exception as err:  # noqa: BLE001 - a sink never stops training
                self._warn(key, "could not be opened", err)
                continue
            state.setdefault("last_epoch", 0)
            self.sinks[key], self.state[key] = sink, state
            log.info("train.loggers[%d]: %s opened%s", i, entry.kind, _where(state))
        self._catch_up(kept)
        self._write_state()

    def _epochs_kept(self) -> int:
        """The last finished epoch the run goes on from (0 for a new run)."""
        if not self.resume:
            return 0
        from tula.engine.checkpoint import checkpoint_header, has_checkpoint

        return checkpoint_header(self.out).epoch if has_checkpoint(self.out) else 0

    def _catch_up(self, kept: int) -> None:
        """The epochs up to ``kept`` that ``metrics.jsonl`` holds and a sink does not (it was
        added on resume, or the run stopped between the metrics line and the sink)."""
        behind = {key: st["last_epoch"] for key, st in self.state.items() if st["last_epoch"] < kept}
        if not behind:
            return
        try:
            lines = read_jsonl(self.out / METRICS)
        except Exception as err:  # noqa: BLE001 - the metrics file is the trainer's; a sink only reads it
            log.warning("train.loggers: the epochs before the resume were not written (%s)", first_line(err))
            return
        for rec in lines:
            if isinstance(rec, dict) and isinstance(rec.get("epoch"), int) and rec["epoch"] <= kept:
                self._log(rec, only=behind)

    # ------------------------------------------------------------------ each epoch
    def _log(self, ev: dict, only: dict[str, int] | None = None) -> None:
        epoch = ev.get("epoch")
        if not isinstance(epoch, int):
            return
        if only is None:  # a live epoch: its per-step traces are in its metrics.jsonl line
            ev = {**ev, STEP_TRACES: self._traces_of(epoch)}
        for key in list(self.sinks):
            if only is not None and (key not in only or epoch <= only[key]):  # catching up: only what it lacks
                continue
            try:
                self.sinks[key].log_epoch(ev)
            except Exception as err:  # noqa: BLE001 - a sink never stops training
                self._warn(key, f"failed at epoch {epoch}", err)
                self._drop(key, "failed")
                continue
            self.state[key]["last_epoch"] = epoch
        self._write_state()

    def _traces_of(self, epoch: int) -> dict:
        """The per-step traces of ``epoch``'s line in ``metrics.jsonl`` (written just before its event)."""
        try:
            with open(self.out / METRICS, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - (1 << 22)))  # the last 4 MiB hold the last line
                tail = fh.read().splitlines()
            for raw in reversed(tail):
                if raw.startswith(b"{") and b'"epoch": %d,' % epoch in raw:
                    rec = json.loads(raw)
                    if rec.get("epoch") == epoch:
                        return rec.get(STEP_TRACES) or {}
        except (OSError, ValueError):
            pass
        return {}

    # ------------------------------------------------------------------ the end
    def close(self, status: str = "finished") -> None:
        """End every open sink with ``status`` (``finished``, ``interrupted``, ``failed``)."""
        for key in list(self.sinks):
            self._drop(key, status)
        self._write_state()

    def _drop(self, key: str, status: str) -> None:
        sink = self.sinks.pop(key)
        try:
            sink.close(status)
        except Exception as err:  # noqa: BLE001
            self._warn(key, "could not be closed", err)

    def _warn(self, key: str, what: str, err: BaseException) -> None:
        i, _, kind = key.partition(":")
        log.warning(
            "train.loggers[%s] (%s) %s and is left out; training goes on: %s: %s",
            i,
            kind,
            what,
            type(err).__name__,
            first_line(err, 300),
        )

    # ------------------------------------------------------------------ loggers.json
    def _read_state(self) -> dict:
        try:
            data = json.loads((self.out / STATE).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_state(self) -> None:
        if not self.state:
            return
        try:
            saved = self._read_state()
            write_atomic(self.out / STATE, json.dumps({**saved, **self.state}, indent=1) + "\n")
        except OSError as err:
            log.warning("train.loggers: %s could not be written: %s", self.out / STATE, first_line(err))


def _where(state: dict) -> str:
    if "dir" in state:
        return f" in {state['dir']}"
    if "run_id" in state:
        return f" (run {state['run_id']} in {state.get('tracking_uri')})"
    return ""
