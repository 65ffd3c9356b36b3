"""``tula.Job``: the pipeline from Python on real 2-rank DDP -- a spec with Python objects in
place of the model, the data and the loss (functions defined here, which no rank could
import by name: they travel as cloudpickle files), profile -> fit -> plan -> train with
progress through a callback and the records the CLI writes; a YAML spec trains to the same
numbers as ``tula train``; bad input is one sentence."""

from __future__ import annotations

import json

import distributed  # a hard dependency of Tula: not importing it is a failure, never a skip
import pytest
import torch
import yaml
from torch import nn

import tula
from tula.core.errors import TulaError
from tula.core.events import EpochFinished, Event, StageStarted, TrialFinished
from tula.core.records import MODELS_KIND, PLAN_KIND, PROFILE_KIND, TRAIN_KIND

pytestmark = pytest.mark.slow


def _job_objects():
    """A model, data and loss as a notebook would define them: closures, not importable."""

    def make_model():
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))

    def make_data(n: int = 240, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 1, 4, 4, generator=g)
        y = (x.flatten(1).sum(1) > 0).long() + (x[:, 0, 0, 0] > 1).long()  # three classes
        full = torch.utils.data.TensorDataset(x, y)
        return {"train": torch.utils.data.Subset(full, range(200)), "test": torch.utils.data.Subset(full, range(200, n)),
                "num_classes": 3}  # fmt: skip

    class SmoothedCE(nn.Module):
        def forward(self, out, target):
            return nn.functional.cross_entropy(out, target, label_smoothing=0.1)

    return make_model, make_data, SmoothedCE


def test_a_job_of_python_objects_profiles_fits_plans_and_trains(tmp_path):
    make_model, make_data, loss = _job_objects()
    events: list[tuple[str, Event]] = []
    spec = {"name": "py", "epochs": 2, "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 64},
            "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0}}  # fmt: skip
    job = tula.Job(spec, model=make_model, data=make_data, loss=loss, out=tmp_path / "job",
                   on_event=lambda stage, ev: events.append((stage, ev)))  # fmt: skip
    assert job.spec.model.name.startswith("pickle:") and job.spec.data.factory.startswith("pickle:")
    prof = job.profile()
    assert prof.kind == PROFILE_KIND and all(t.status == "ok" for t in prof.trials)
    assert job.fit().kind == MODELS_KIND
    plan = job.plan("time")
    assert plan.kind == PLAN_KIND and plan.objective == "time"
    run = job.train()
    assert run.kind == TRAIN_KIND and run.n_workers == plan.choice.n_workers
    assert run.global_batch == plan.choice.global_batch and len(run.history) == 2
    # the records are the ones the CLI writes, in the same places
    for name, kind in (("profile.json", PROFILE_KIND), ("models.json", MODELS_KIND), ("plan.json", PLAN_KIND)):
        assert json.loads((tmp_path / "job" / name).read_text())["kind"] == kind
    written = json.loads((tmp_path / "job" / "train" / "train.json").read_text())
    assert written == json.loads(json.dumps(run.to_json_dict()))  # the record returned is the one written
    # progress came through the callback, not the terminal
    stages = {s for s, ev in events if isinstance(ev, StageStarted)}
    assert stages == {"profiling", "fitting", "planning", "training"}
    assert any(s == "training" and isinstance(ev, EpochFinished) for s, ev in events)
    assert any(s == "profiling" and isinstance(ev, TrialFinished) for s, ev in events)


def test_a_job_from_a_yaml_spec_trains_as_tula_train_does(reference_run, tmp_path):
    """The session's reference run is ``tula train --method ags --workers 2 --batch 64`` of its spec."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(reference_run.spec_dict()))
    run = tula.Job(path, out=tmp_path / "py").train("ags", 2, 64)
    cli = reference_run.record("train.json")
    assert [h.train_loss for h in run.history] == [h["train_loss"] for h in cli["history"]]


def test_an_optimiser_factory_on_a_dask_client_trains_as_the_built_in_does_locally(
    reference_run, tmp_path, dask_cluster
):
    """The factory (a closure, so it travels pickled) builds the SGD of ``optimizer: {name:
    sgd, momentum: 0.5}`` (not the default 0.9, so an ignored factory shows); on the caller's
    Client (of the module's LocalCluster of 2 worker processes) AGS steps it to the same
    losses as the built-in on local processes (the session's reference run, whose spec says
    that optimizer), and the Client is left open."""
    local = reference_run.record("train.json")
    assert reference_run.spec["optimizer"] == {"momentum": 0.5}
    spec = {k: v for k, v in reference_run.spec_dict().items() if k != "optimizer"}  # the default: momentum 0.9

    def sgd(params, lr):
        return torch.optim.SGD(params, lr=lr, momentum=0.5, weight_decay=5e-4)

    with distributed.Client(dask_cluster) as client:
        job = tula.Job(spec, optimizer=sgd, cluster=client, out=tmp_path / "factory")
        assert job.spec.optimizer.name.startswith("pickle:")
        run = job.train("ags", 2, 64)
        assert client.status == "running"  # the caller's to close
    assert [h.train_loss for h in run.history] == [h["train_loss"] for h in local["history"]]
    with pytest.raises(TulaError, match="cluster is a distributed.Client that is closed"):
        tula.Job(spec, cluster=client, out=tmp_path / "closed")


def test_a_partial_optimiser_travels_pickled_and_builds_over_the_model(tmp_path):
    """``functools.partial(torch.optim.SGD, ...)``, the usual idiom, has no import path of its
    own: it is pickled (functools and torch by reference) and makes the SGD it says."""
    import functools

    from tula.engine.workloads import build_model, build_optimizer

    job = tula.Job({}, optimizer=functools.partial(torch.optim.SGD, momentum=0.5, nesterov=True), out=tmp_path)
    assert job.spec.optimizer.name.startswith("pickle:")
    opt = build_optimizer(build_model(job.spec.model), job.spec, lr=0.2)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.5 and opt.defaults["nesterov"]
    assert opt.defaults["lr"] == 0.2


def test_bad_input_to_a_job_is_one_sentence(tmp_path):
    with pytest.raises(TulaError, match="a job's spec is a dict, a YAML path or a JobSpec, not int"):
        tula.Job(42, out=tmp_path / "a")
    with pytest.raises(TulaError, match="model must be a function or a class"):
        tula.Job({}, model=5, out=tmp_path / "b")
    with pytest.raises(TulaError, match="spec field 'epochs'"):
        tula.Job({"epochs": 0}, out=tmp_path / "c")
    with pytest.raises(TulaError, match="fit needs a profile: call profile"):
        tula.Job({}, out=tmp_path / "d").fit()
    with pytest.raises(TulaError, match="train needs a configuration"):
        tula.Job({}, out=tmp_path / "e").train()
    with pytest.raises(TulaError, match="cluster is a --cluster value .* or an open distributed.Client, not int"):
        tula.Job({}, cluster=3, out=tmp_path / "f")
