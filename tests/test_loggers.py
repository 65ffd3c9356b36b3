"""Metrics sinks (``train.loggers``): a real 2-rank training run written to TensorBoard and MLflow,
read back with their own readers (tensorboard's EventAccumulator, MLflow's MlflowClient) against
train.json; a resumed run goes on in the same log directory and MLflow run without writing an
epoch twice; a sink that fails leaves training going on; a sink whose package is missing is one
sentence naming it, exit 2, before any worker starts; the library logs through `logging`."""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import sys

import pytest
from helpers import assert_refused, local_launcher, run_python, tiny_spec, train_args, train_in_two, write_spec

from tula.core.errors import SpecError
from tula.core.sinks import SINK_NAMES, SINKS, check_sinks, missing_package
from tula.core.spec import spec_from_dict
from tula.engine.metrics_sinks import STATE, epoch_metrics

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None
needs_tensorboard = pytest.mark.skipif(
    not HAS_TENSORBOARD, reason="tensorboard is not installed (pip install tensorboard)"
)
needs_mlflow = pytest.mark.skipif(not HAS_MLFLOW, reason="mlflow is not installed (pip install mlflow-skinny)")

METHOD, WORKERS, BATCH = "ags", 2, 64  # AGS keeps per-step traces: their per-epoch mean is written too
#: the numbers each epoch is checked by, in train.json's history and in both sinks
CHECKED = ("train_loss", "test_loss", "test_top1", "lr", "global_batch", "n_workers", "epoch_time_s")


def spec_with(loggers: list[dict], epochs: int = 2) -> dict:
    d = tiny_spec(profile=False)
    d["epochs"] = epochs
    d["train"] = {"method": METHOD, "loggers": loggers}
    return d


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``folder``: ``{tag: [(step, value), ...]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@needs_tensorboard
@needs_mlflow
def test_both_sinks_hold_each_epoch_once_across_a_resume(tmp_path):
    from mlflow.tracking import MlflowClient

    out, tb = tmp_path / "run", tmp_path / "tb"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    d = spec_with(
        [{"kind": "tensorboard", "dir": str(tb)}, {"kind": "mlflow", "tracking_uri": uri, "experiment": "loggers-test"}]
    )
    # epoch 1, then a resume in the same directory to epoch 2: one TensorBoard directory, one MLflow run
    rec = train_in_two(d, METHOD, WORKERS, BATCH, out, local_launcher())
    history = rec.history
    assert [h.epoch for h in history] == [1, 2]

    scalars = tensorboard_scalars(tb)
    for name in CHECKED:
        assert [s for s, _ in scalars[name]] == [1, 2], (name, scalars[name])  # once per epoch, not twice
        for (_, value), h in zip(scalars[name], history):
            assert value == pytest.approx(getattr(h, name), rel=1e-6), (name, value, getattr(h, name))
    assert "trace_delta_mean" in scalars  # AGS's per-step traces, summarised per epoch
    assert len(list(tb.glob("events.out.tfevents.*"))) == 2  # the resumed run added its file beside the first

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("loggers-test")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]  # the resume went on in the same run
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["method"] == METHOD
    assert run.data.params["spec.train.method"] == METHOD
    assert int(run.data.params["start.global_batch"]) == BATCH
    assert int(run.data.params["start.n_workers"]) == WORKERS
    for name in CHECKED:
        points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert [s for s, _ in points] == [1, 2], (name, points)
        for (_, value), h in zip(points, history):
            assert value == pytest.approx(getattr(h, name), rel=1e-6), (name, value, getattr(h, name))

    state = json.loads((out / STATE).read_text())
    assert state["0:tensorboard"]["last_epoch"] == 2 and state["1:mlflow"]["last_epoch"] == 2
    assert state["1:mlflow"]["run_id"] == run.info.run_id


@needs_tensorboard
def test_a_sink_added_on_resume_gets_the_epochs_before_it(tmp_path):
    from tula.engine.train import train

    out = tmp_path / "run"
    launcher = local_launcher()
    train(spec_from_dict(spec_with([], epochs=1)), METHOD, WORKERS, BATCH, out, launcher=launcher)
    rec = train(
        spec_from_dict(spec_with([{"kind": "tensorboard"}])),
        METHOD,
        WORKERS,
        BATCH,
        out,
        resume=True,
        launcher=launcher,
    )
    # the default directory: tensorboard/ in the training output directory, epoch 1 written from metrics.jsonl
    scalars = tensorboard_scalars(out / "tensorboard")
    assert [s for s, _ in scalars["train_loss"]] == [1, 2]
    assert [v for _, v in scalars["test_loss"]] == pytest.approx([h.test_loss for h in rec.history], rel=1e-6)


@needs_tensorboard
def test_a_failing_sink_is_a_warning_and_training_goes_on(tmp_path, caplog):
    from tula.engine.train import train

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the event files would go\n")
    d = spec_with([{"kind": "tensorboard", "dir": str(blocked / "tb")}], epochs=1)
    with caplog.at_level(logging.WARNING, logger="tula.engine.metrics_sinks"):
        rec = train(spec_from_dict(d), METHOD, WORKERS, BATCH, tmp_path / "run", launcher=local_launcher())
    assert [h.epoch for h in rec.history] == [1]  # trained, checkpointed, recorded
    assert (tmp_path / "run" / "checkpoint.pt").is_file()
    said = [r.getMessage() for r in caplog.records if r.name == "tula.engine.metrics_sinks"]
    assert any("train.loggers[0] (tensorboard) could not be opened" in m and "training goes on" in m for m in said), (
        said
    )


# --------------------------------------------------------------------------- a package that is not installed
@pytest.mark.parametrize("kind", SINK_NAMES)
def test_a_missing_package_is_one_sentence_naming_it(kind, monkeypatch):
    monkeypatch.setitem(sys.modules, SINKS[kind].requires, None)  # the package made unimportable
    sentence = f"train.loggers asks for {kind}, which is not installed: {SINKS[kind].install}."
    assert missing_package(kind) == sentence
    spec = spec_from_dict(spec_with([{"kind": kind}]))
    with pytest.raises(SpecError) as err:
        check_sinks(spec.train.loggers)
    assert str(err.value) == sentence


def test_tula_train_refuses_a_missing_sink_package_before_any_worker(tmp_path):
    spec = write_spec(tmp_path, spec_with([{"kind": "mlflow"}]))
    out = tmp_path / "run"
    args = [str(a) for a in train_args(spec, out, method=METHOD, workers=WORKERS, batch=BATCH)]
    code = (
        "import sys\n"
        "sys.modules['mlflow'] = None  # mlflow hidden from this interpreter: as if not installed\n"
        f"sys.argv = ['tula', *{args!r}]\n"
        "from tula.__main__ import main\n"
        "main()\n"
    )
    r = run_python(code, timeout=300)
    assert_refused(r, "train.loggers asks for mlflow, which is not installed: pip install mlflow-skinny (or mlflow).")
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoint.pt").exists()  # no worker trained


def test_tula_run_refuses_a_missing_sink_package_before_profiling(tmp_path, monkeypatch):
    from tula.pipeline import run_pipeline

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    spec = spec_from_dict({**spec_with([{"kind": "tensorboard"}]), "profile": tiny_spec()["profile"]})
    with pytest.raises(SpecError, match="train.loggers asks for tensorboard, which is not installed"):
        run_pipeline(spec, tmp_path / "run", launcher=local_launcher())
    assert not (tmp_path / "run" / "profile.json").exists()
    # planning only (no training): the sinks are not needed
    assert check_sinks([]) is None


# --------------------------------------------------------------------------- the spec's fields
def test_the_spec_takes_each_field_for_its_own_kind_only():
    ok = spec_from_dict(spec_with([{"kind": "tensorboard", "dir": "tb"}, {"kind": "mlflow", "experiment": "e"}]))
    assert [entry.kind for entry in ok.train.loggers] == ["tensorboard", "mlflow"]
    assert spec_from_dict(tiny_spec()).train.loggers == []
    with pytest.raises(SpecError, match="tracking_uri applies to kind mlflow, not tensorboard"):
        spec_from_dict(spec_with([{"kind": "tensorboard", "tracking_uri": "sqlite:///x.db"}]))
    with pytest.raises(SpecError, match="'train.loggers.0.kind' is 'wandb'"):
        spec_from_dict(spec_with([{"kind": "wandb"}]))
    with pytest.raises(SpecError, match="unknown field 'train.loggers.0.project'"):
        spec_from_dict(spec_with([{"kind": "mlflow", "project": "p"}]))


def test_epoch_metrics_are_the_records_numbers_and_trace_means():
    rec = {"epoch": 3, "train_loss": 0.5, "lr": 0.1, "n_workers": 2, "test_top1": float("nan"), "schedule": {"x": 1}}
    rec["step_traces"] = {"delta": [0.2, None, 0.4], "scaled": [True, False, False, False]}
    epoch, metrics = epoch_metrics(copy.deepcopy(rec))
    assert epoch == 3
    assert metrics == {
        "train_loss": 0.5,
        "lr": 0.1,
        "n_workers": 2.0,
        "trace_delta_mean": pytest.approx(0.3),
        "trace_scaled_mean": 0.25,
    }


def test_the_service_keeps_a_jobs_sinks_in_its_own_directory(tmp_path):
    from tula.service.admission import admit
    from tula.service.settings import ServiceSettings

    settings = ServiceSettings(home=tmp_path)
    assert admit(spec_with([{"kind": "tensorboard"}, {"kind": "mlflow"}]), settings).train.loggers[1].kind == "mlflow"
    with pytest.raises(SpecError, match="'train.loggers.0.dir' is set, but the service writes"):
        admit(spec_with([{"kind": "tensorboard", "dir": "/etc/tb"}]), settings)
    with pytest.raises(SpecError, match="'train.loggers.0.tracking_uri' is set"):
        admit(spec_with([{"kind": "mlflow", "tracking_uri": "http://10.0.0.1:5000"}]), settings)


# --------------------------------------------------------------------------- logging
def test_the_service_processes_log_through_logging_at_the_level_asked():
    # a fresh interpreter, as a runner process or `tula serve` starts: no handler anywhere yet
    code = (
        "import logging, sys\n"
        "from tula.service.logs import configure_logging\n"
        "logger = configure_logging(sys.stdout)\n"
        "assert configure_logging(sys.stdout) is logger and len(logger.handlers) == 1  # once\n"
        "logging.getLogger('tula.service.runner').debug('a debug line')\n"
        "logging.getLogger('tula.service.runner').info('an info line')\n"
        "logging.getLogger('other').warning('not ours')\n"
        "print('root handlers', len(logging.getLogger().handlers))\n"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert " INFO tula.service.runner: an info line" in r.stdout and "a debug line" not in r.stdout, r.stdout
    assert "not ours" not in r.stdout and "root handlers 0" in r.stdout  # the root logger is left alone
    debug = run_python(code, env={**os.environ, "TULA_LOG_LEVEL": "debug"})
    assert " DEBUG tula.service.runner: a debug line" in debug.stdout, debug.stdout + debug.stderr
    # an application that configured logging itself keeps its own handlers
    kept = run_python(
        "import logging, sys\nlogging.basicConfig(stream=sys.stdout)\n"
        "from tula.service.logs import configure_logging\nprint(len(configure_logging().handlers))\n"
    )
    assert kept.stdout.strip() == "0", kept.stdout + kept.stderr


def test_the_library_and_service_print_nothing_themselves():
    """print() is left to the command line (tula.cli) and to what a rank or an estimator says on
    its own output; the service and the library's stages log."""
    from pathlib import Path

    import tula

    src = Path(tula.__file__).parent
    allowed = {
        "cli.py",  # the CLI's own console output
        "engine/launch/forkserver_signals.py",  # a rank that could not start: one line on its own stderr
        "engine/launch/env.py",  # a worker rank that lost its driver: one line on its own stderr
        "sklearn/__init__.py",  # the estimator's verbose=True progress, as scikit-learn estimators print
    }
    printing = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel in allowed or rel.startswith("cli"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("print(") or "traceback.print_exc" in line:
                printing.append(f"{rel}:{n}: {line.strip()}")
    assert not printing, printing


def test_a_runner_process_logs_its_job_under_its_module_name(tmp_path):
    """``python -m tula.service.runner`` (the module is ``__main__`` there) logs as
    ``tula.service.runner`` through the handler :func:`configure_logging` gives it."""
    import subprocess

    from tula.service.settings import ServiceSettings
    from tula.service.store import Store

    settings = ServiceSettings(home=tmp_path)
    store = Store(settings.store_url, tmp_path)
    bad = {**tiny_spec(), "model": {"name": "no_such_model"}}  # fails in the pipeline, before any worker
    job_id = store.create_job(spec_from_dict(bad).to_dict(), search="partial", objective=None, train=True)
    runner = "test-host:1/1"
    assert store.claim_job(runner, job_id=job_id) is not None
    cmd = [sys.executable, "-m", "tula.service.runner", "--db", settings.store_url, "--home", str(tmp_path)]
    r = subprocess.run([*cmd, "--job", job_id, "--runner", runner], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert f" INFO tula.service.runner: job {job_id}: runner {runner} (pid " in r.stderr, r.stderr
    assert store.get_job(job_id).state == "failed"
    store.close()
