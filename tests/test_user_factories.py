"""Data sets and losses from the user's own code (``data.factory``, ``train.loss:
package.module:loss``), through the CLI on real 2-rank DDP: they profile, plan and train,
read by the same DataLoader path with exact resume; the service imports them only from its
allow-list; and every way they can go wrong is one sentence and exit code 2 before any worker
starts.  The user's code is tests/factories.py."""

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import assert_refused, env_with_tests, run_tula, tula_in_process, write_spec

from tula.core.errors import SpecError
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import load_checkpoint
from tula.engine.workloads import check_workload, load_dataset

HERE = Path(__file__).resolve().parent


def _spec(**changes) -> dict:
    """A segmentation job: 200 samples of a 1x8x8 image and an 8x8 mask, a per-pixel BCE, a
    tiny fully-convolutional net; one DataLoader worker per rank."""
    d = {
        "name": "seg",
        "model": {"name": "factories:tiny_fcn", "kwargs": {"width": 8}},
        "data": {"factory": "factories:make_segmentation", "kwargs": {"n": 200}, "loader_workers": 1},
        "epochs": 2,
        "optimizer": {"name": "sgd", "lr": 0.2},
        "train": {"loss": "factories:PixelBCE", "ags": {"b_small": 8}},
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 64},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            d[section] = {**d[section], field: value}
        else:
            d[section] = value
    return d


@pytest.mark.slow  # a real DDP world
def test_a_data_factory_and_a_custom_loss_profile_plan_and_train(tmp_path):
    spec = write_spec(tmp_path, _spec(epochs=1), "seg.yaml")
    out = tmp_path / "run"
    r = tula_in_process("run", spec, "--out", str(out))
    assert r.returncode == 0, r.stderr
    prof = json.loads((out / "profile.json").read_text())
    assert {t["status"] for t in prof["trials"]} == {"ok"}
    assert prof["sample_shape"] == [1, 8, 8] and prof["dataset_size"] == 200
    assert {t["n_workers"] for t in prof["trials"]} == {1, 2}
    tr = json.loads((out / "train" / "train.json").read_text())
    (h,) = tr["history"]
    assert h["test_loss"] > 0 and "test_top1" not in h  # float masks: the test loss is the score
    assert tr["replicas_identical"]
    assert "final test loss" in r.stdout


@pytest.mark.slow  # a real DDP world
def test_two_epochs_equal_one_epoch_and_a_resume_to_two(tmp_path):
    spec = write_spec(tmp_path, _spec(), "seg.yaml")
    train = ["train", spec, "--workers", "2", "--batch", "40"]
    a, b = tmp_path / "a", tmp_path / "b"
    r = tula_in_process(*train, "--epochs", "2", "--out", str(a))
    assert r.returncode == 0, r.stderr
    r = tula_in_process(*train, "--epochs", "1", "--out", str(b))
    assert r.returncode == 0, r.stderr
    r = tula_in_process(*train, "--epochs", "2", "--resume", str(b))
    assert r.returncode == 0, r.stderr

    ref, resumed = (json.loads((d / "train.json").read_text()) for d in (a, b))
    assert resumed["resumed_from_epoch"] == 1 and [h["epoch"] for h in resumed["history"]] == [1, 2]
    assert ref["steps_done"] == resumed["steps_done"] == 2 * 5  # 200 samples / 40
    assert ref["replicas_identical"] and resumed["replicas_identical"]
    loss = [h["train_loss"] for h in ref["history"]]
    assert loss[1] < loss[0], loss  # it learns the masks
    keys = ("train_loss", "test_loss", "lr")
    assert [{k: h[k] for k in keys} for h in resumed["history"]] == [{k: h[k] for k in keys} for h in ref["history"]]
    model_a, model_b = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert model_a.keys() == model_b.keys()
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a), "resumed weights differ"


def test_the_factory_return_contract_and_the_data_path(tests_on_path):
    from tula.engine.data import DataPath, SampleView

    tuple_spec = spec_from_dict(_spec()).data
    data = load_dataset(tuple_spec, 3)
    assert data.sample_shape == (1, 8, 8) and data.train_size == 200 and data.test_size == 50
    assert isinstance(data.train, SampleView) and not data.in_memory and data.loader_workers == 1
    assert data.num_classes == 1  # float masks: one output per pixel (not a class count)

    mapping = spec_from_dict(
        _spec(data={"factory": "factories:make_segmentation", "kwargs": {"labels": True, "as_mapping": True}})
    )
    d2 = load_dataset(mapping.data, 0)
    assert d2.num_classes == 2 and d2.collate_fn.__name__ == "stack_pairs"
    # the same (seed, epoch) batches for a rank whether read in the rank or by loader workers
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(1))
    got = []
    for workers in (0, 2):
        with DataPath(d2, "cpu", workers=workers) as path:
            got.append(list(path.epoch_batches(0, perm, 40, 1, 20, 5)))
    assert all(torch.equal(x0, x2) and torch.equal(y0, y2) for (x0, y0), (x2, y2) in zip(*got))
    x, y = got[0][0]
    assert x.shape == (20, 1, 8, 8) and y.shape == (20, 8, 8) and y.dtype == torch.long
    assert torch.equal(x, torch.stack([d2.train[int(i)][0] for i in perm[20:40]]))


def test_per_pixel_cross_entropy_reports_top1_over_pixels(tests_on_path):
    """A user's loss on integer masks: test loss and per-pixel top-1 (evaluation in one process)."""
    from tula.engine.evaluation import evaluate
    from tula.engine.workloads import build_loss

    spec = spec_from_dict(
        _spec(
            model={"name": "factories:tiny_fcn", "kwargs": {"out_channels": 2}},
            data={"factory": "factories:make_segmentation", "kwargs": {"labels": True}, "loader_workers": 0},
            train={"loss": "torch.nn:CrossEntropyLoss"},
        )
    )
    model, data = check_workload(spec)
    res = evaluate(model, data, 0, 1, 16, torch.device("cpu"), spec.train.loss, build_loss(spec.train.loss))
    assert set(res) == {"test_loss", "test_top1"} and 0 <= res["test_top1"] <= 1
    model.eval()
    x, y = data.take(torch.arange(50), "test")
    with torch.no_grad():
        out = model(x)
    assert res["test_top1"] == pytest.approx(float((out.argmax(1) == y).double().mean()))
    assert res["test_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(out, y)), rel=1e-5)


BAD = [
    ({"data__factory": "nosuchpkg.datasets:make"}, "data.factory 'nosuchpkg.datasets:make' cannot be imported"),
    ({"data__factory": "factories:no_such_factory"}, "module 'factories' has no attribute 'no_such_factory'"),
    ({"data__factory": "factories:one_set"}, "data factory 'factories:one_set' returned one data set"),
    ({"data__factory": "factories:not_datasets"}, "returned list as its training set, not a map-style"),
    (
        {"data__factory": "factories:raises"},
        "data factory 'factories:raises' raised ValueError: the bucket s3://[bold]seg[/bold] is not reachable",
    ),
    ({"data__factory": "factories:three_channel"}, "cannot take factories:three_channel samples of shape (3, 8, 8)"),
    ({"train__loss": "nosuchpkg.losses:Dice"}, "train.loss 'nosuchpkg.losses:Dice' cannot be imported"),
    ({"train__loss": "factories:NOT_A_LOSS"}, "train.loss 'factories:NOT_A_LOSS' is not callable"),
    ({"train__loss": "dice"}, "spec field 'train.loss': 'dice' is not a loss"),
    ({"data__kwargs": {"n": 200, "colour": 1}}, "raised TypeError: make_segmentation() got an unexpected keyword"),
    (
        {"optimizer": {"name": "torch.optim:RMSprop", "kwargs": {"colour": 1}}},
        "optimiser factory 'torch.optim:RMSprop' raised TypeError:",
    ),
    ({"optimizer": {"name": "rmsprop"}}, "spec field 'optimizer.name': 'rmsprop' is not an optimiser"),
    (
        {"data__normalize": True},
        "data.normalize applies to image sets read from disk; a data factory's sets are used as they are given",
    ),
]


@pytest.mark.parametrize("change, sentence", BAD, ids=[s[:40] for _, s in BAD])
def test_bad_factories_and_losses_are_one_sentence_and_exit_2_before_any_worker(tmp_path, change, sentence):
    """Checked in this process through the command's entry point (tula.cli.main)."""
    spec = write_spec(tmp_path, _spec(**change), "seg.yaml")
    r = tula_in_process("profile", spec, "--out", str(tmp_path / "p.json"), path=(HERE,))
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = " ".join(r.stderr.split())  # rich wraps long lines
    assert sentence in err, err
    assert "Traceback" not in r.stderr and err.count("error:") == 1
    assert "0/?" not in r.stdout + r.stderr and "profiling" not in r.stderr  # no bar of a profile that never began
    assert_refused(r, sentence)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(
    "command, source, why",
    [
        ("profile", 'raise RuntimeError("no [bold]GPU[/bold] here")\n', "(RuntimeError: no [bold]GPU[/bold] here)"),
        ("run", "def make(:\n", "(SyntaxError: "),
    ],
    ids=["raises-profile", "syntax-error-run"],
)
def test_a_model_module_failing_at_import_is_one_sentence_and_exit_2(tmp_path, command, source, why):
    """The module of a model factory raises when imported: one sentence naming the factory and
    the exception (its message as plain text: rich markup shown, not applied), exit code 2,
    no progress line, no profile written.  `profile` is checked in this process (through
    tula.cli.main), `run` as the real command."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "broken_model.py").write_text(source)
    spec = write_spec(tmp_path, _spec(model={"name": "broken_model:make"}), "seg.yaml")
    out = tmp_path / "out"
    target = out / "profile.json" if command == "profile" else out  # tula run writes its profile.json there
    if command == "profile":
        r = tula_in_process(command, spec, "--out", str(target), path=(HERE, code))
    else:
        r = run_tula(command, spec, "--out", target, env=env_with_tests(code))
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = " ".join(r.stderr.split())
    assert f"model.name 'broken_model:make' cannot be imported {why}" in err, err
    assert "Traceback" not in r.stdout + r.stderr and err.count("error:") == 1
    assert "0/?" not in r.stdout + r.stderr and "profiling" not in r.stderr
    assert_refused(r, f"model.name 'broken_model:make' cannot be imported {why}")
    assert not (out / "profile.json").exists()  # tula run keeps its run.json, for --resume


def test_a_model_factory_that_raises_or_is_not_callable_is_one_sentence(tests_on_path):
    from tula.core.errors import WorkloadError
    from tula.engine.workloads import build_model

    for name, sentence in (
        ("factories:raises", "model factory 'factories:raises' raised ValueError: the bucket s3://[bold]seg[/bold]"),
        ("factories:NOT_A_LOSS", "model.name 'factories:NOT_A_LOSS' is not callable (an object of type int)"),
    ):
        with pytest.raises(WorkloadError, match=re.escape(sentence)):
            build_model(spec_from_dict(_spec(model={"name": name})).model)


def test_normalize_is_off_for_a_data_factory_and_an_explicit_true_is_refused():
    """A factory's sets are used as they give their samples: the spec says so (normalize false,
    kept through the record's round trip), false may be written, true is one sentence."""
    spec = spec_from_dict(_spec())
    assert spec.data.normalize is False and spec_from_dict(spec.to_dict()).data.normalize is False
    assert spec_from_dict(_spec(data__normalize=False)).data.normalize is False
    assert spec_from_dict({"data": {"name": "cifar10", "root": "/data"}}).data.normalize is True  # built-in sets: on
    with pytest.raises(SpecError, match="spec field 'data': data.normalize applies to image sets read from disk"):
        spec_from_dict(_spec(data__normalize=True))


def test_an_optimiser_factory_builds_over_the_model_and_bad_ones_are_one_sentence(tests_on_path):
    from tula.core.errors import WorkloadError
    from tula.engine.workloads import build_model, build_optimizer

    def spec(**optimizer):
        return spec_from_dict(_spec(optimizer={"lr": 0.3, **optimizer}))

    model = build_model(spec().model)
    opt = build_optimizer(model, spec(name="torch.optim:RMSprop", kwargs={"alpha": 0.5}), lr=0.7)
    assert isinstance(opt, torch.optim.RMSprop) and opt.defaults["alpha"] == 0.5 and opt.defaults["lr"] == 0.7
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    for name, sentence in (
        ("factories:not_an_optimizer", "returned an object of type list, not a torch.optim.Optimizer"),
        ("factories:own_parameters", "returned an optimiser over parameters that are not the model's"),
        ("factories:NOT_A_LOSS", "is an object of type int, not a factory called as factory(params, lr=LR"),
    ):
        with pytest.raises(WorkloadError, match=sentence.replace("(", r"\(")):
            build_optimizer(model, spec(name=name))
    for optimizer, sentence in (
        ({"name": "adam", "kwargs": {"amsgrad": True}}, "'adam' is a built-in, set with optimizer.momentum"),
        ({"name": "torch.optim:Adam", "kwargs": {"lr": 1.0}}, "must not hold 'lr' or 'params'"),
    ):
        with pytest.raises(SpecError, match=sentence):
            spec(**optimizer)


def test_the_service_imports_a_data_factory_or_a_loss_only_from_its_allow_list(tmp_path):
    from fastapi.testclient import TestClient

    from tula.service.admission import admit
    from tula.service.app import create_app
    from tula.service.settings import ServiceSettings

    closed = ServiceSettings(home=tmp_path / "closed", import_allowlist=("torch",))
    spec = _spec(model={"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 2, "width": 4}})
    with pytest.raises(SpecError, match="spec field 'data.factory' imports 'factories', which is not on"):
        admit(spec, closed)
    only_data = _spec(model={"name": "small_cnn"}, train={"loss": "tests_losses.dice:Dice"})
    with pytest.raises(SpecError, match="spec field 'train.loss' imports 'tests_losses.dice', which is not on"):
        admit(only_data, ServiceSettings(home=tmp_path / "d", import_allowlist=("factories",)))
    opened = ServiceSettings(home=tmp_path / "open", import_allowlist=("factories",))
    assert admit(_spec(), opened).data.factory == "factories:make_segmentation"
    own_optimizer = _spec(optimizer={"name": "torch.optim:RMSprop"})
    with pytest.raises(SpecError, match="spec field 'optimizer.name' imports 'torch.optim', which is not on"):
        admit(own_optimizer, opened)
    assert admit(own_optimizer, ServiceSettings(home=tmp_path / "t", import_allowlist=("factories", "torch")))

    # through the web layer: 422 naming the field; 202 once the module is allowed
    for settings, status in ((closed, 422), (opened, 202)):
        with TestClient(create_app(settings, dispatch=False)) as client:
            r = client.post("/v1/jobs", json={"spec": spec if status == 422 else _spec()})
            assert r.status_code == status, r.text
            if status == 422:
                detail = r.json()["detail"]
                assert detail.startswith("spec field 'data.factory' imports 'factories'") and "\n" not in detail
