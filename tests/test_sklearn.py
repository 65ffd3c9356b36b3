"""tula.sklearn: scikit-learn's estimator checks, model selection and pipelines on real
training through Tula's runner (in-process worlds of one rank, local processes, a Dask
LocalCluster), pickling, the AdaDamp example, and bad parameters as one sentence."""

import os
import pickle
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import local_launcher, run_python
from sklearn.base import clone
from sklearn.datasets import load_digits, make_regression
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from tula.core.errors import Interrupted, TulaError
from tula.core.events import StepDone
from tula.core.records import TRAIN_KIND, validate_record
from tula.core.spec import spec_from_dict
from tula.engine.launch import LocalLauncher
from tula.engine.train import train
from tula.sklearn import ParamError, TulaClassifier, TulaRegressor

ROOT = Path(__file__).resolve().parents[1]


class Net(nn.Module):
    """A module importable by name (``test_sklearn:Net``): it travels to the ranks by reference."""

    def __init__(self, in_features=64, hidden=16, n_out=10):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, n_out))

    def forward(self, x):
        return self.body(x)


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits(return_X_y=True)
    return (X / 16.0).astype(np.float32), y


def _small(est_cls, **kw):
    """Few epochs of a small MLP: what the estimator checks fit (dozens of times)."""
    return est_cls(
        **{
            "max_epochs": 2,
            "batch_size": 32,
            "lr": 0.05,
            "optimizer": "adam",
            "module__hidden": 32,
            "random_state": 0,
            **kw,
        }
    )


# --------------------------------------------------------------------------- scikit-learn's checks
#: every check of scikit-learn's suite that does not pass, and why (xfail, strict)
EXPECTED_FAILED = {
    "check_no_attributes_set_in_init": "routed parameters given to __init__ (module__hidden here) are stored as "
    "attributes, skorch's convention, and reported by get_params; the check only "
    "knows the names in the __init__ signature",
}
# skipped by scikit-learn itself in this environment (reported with -ra):
#   check_array_api_input -- SCIPY_ARRAY_API is not set (the estimator converts inputs to numpy anyway);
#   check_classifier_data_not_an_array / check_regressor_data_not_an_array -- pandas is not installed.


@parametrize_with_checks(
    [_small(TulaClassifier), _small(TulaRegressor)],
    expected_failed_checks=lambda est: EXPECTED_FAILED,
    xfail_strict=True,
)
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # batch sizes clipped to the checks' small data sets
        check(estimator)


# --------------------------------------------------------------------------- model selection, pipelines
def test_grid_search_over_lr_and_batch_size_on_digits(digits):
    X, y = digits
    base = TulaClassifier(max_epochs=3, module__hidden=32, optimizer="adam", random_state=0)
    gs = GridSearchCV(base, param_grid={"lr": [1e-4, 0.03], "batch_size": [32, 128]}, cv=2)
    gs.fit(X, y)
    assert set(gs.best_params_) == {"lr", "batch_size"}
    assert gs.best_params_["lr"] == 0.03  # 1e-4 barely moves in 3 epochs
    assert gs.best_score_ > 0.85
    means = gs.cv_results_["mean_test_score"]
    assert len(means) == 4 and means.max() - means.min() > 0.2  # the grid's points trained differently
    best = gs.best_estimator_
    assert best.batch_size == gs.best_params_["batch_size"] and best.module__hidden == 32
    assert best.history_[-1]["global_batch"] == best.batch_size


def test_cross_val_score_and_a_pipeline_with_a_scaler(digits):
    X, y = digits
    X = X * 16.0  # raw pixel counts 0..16: the scaler's job
    pipe = make_pipeline(
        StandardScaler(),
        TulaClassifier(max_epochs=2, batch_size=64, lr=0.01, optimizer="adam", module__hidden=32, random_state=0),
    )
    scores = cross_val_score(pipe, X, y, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.75
    pipe.fit(X, y)
    assert pipe.score(X, y) > 0.85
    assert pipe[-1].n_features_in_ == 64 and list(pipe[-1].classes_) == list(range(10))


def test_clone_and_set_params_route_double_underscore_parameters():
    est = TulaClassifier(module__hidden=8, optimizer__weight_decay=0.0, method="ags", method__delta=0.3)
    p = est.get_params()
    assert p["module__hidden"] == 8 and p["optimizer__weight_decay"] == 0.0 and p["method__delta"] == 0.3
    est.set_params(batch_size="geometric", batch_size__factor=3, module__hidden=4, lr=0.2)
    c = clone(est)
    assert c is not est
    assert c.get_params() == est.get_params()
    assert (c.batch_size, c.batch_size__factor, c.module__hidden, c.lr) == ("geometric", 3, 4, 0.2)
    assert "module__hidden=4" in repr(c)


# --------------------------------------------------------------------------- fitted estimators
def test_fitted_classifier_pickles_with_equal_predictions_and_keeps_its_history(digits, tmp_path):
    X, y = digits
    est = TulaClassifier(
        module=Net, module__hidden=32, max_epochs=3, batch_size=64, lr=0.05, optimizer="adam", random_state=0
    ).fit(torch.from_numpy(X), torch.from_numpy(y))
    # an importable module class travels to the ranks by its import reference
    assert est.train_record_["spec"]["model"]["name"] == "test_sklearn:Net"
    assert isinstance(est.module_, Net) and not est.module_.training
    assert [h["epoch"] for h in est.history_] == [1, 2, 3]
    assert all(h["n_workers"] == 1 and h["global_batch"] == 64 for h in est.history_)
    # the held-out 10 % (180 samples) is scored every epoch
    assert est.history_[-1]["test_top1"] > 0.8
    validate_record(est.train_record_, "the estimator's record", (TRAIN_KIND,))
    blob = pickle.dumps(est)
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again.predict(X), est.predict(X))
    np.testing.assert_array_equal(again.predict_proba(X), est.predict_proba(X))
    assert again.score(X, y) == est.score(X, y) > 0.85


def test_regressor_multi_output_module_instance_and_no_validation_split():
    X, y = make_regression(n_samples=300, n_features=5, n_targets=2, noise=0.1, random_state=0)
    y = y / y.std(axis=0)
    module = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 2))  # an instance: pickled to the ranks
    est = TulaRegressor(
        module=module, max_epochs=15, batch_size=32, lr=0.01, optimizer="adam", validation_fraction=0, random_state=0
    ).fit(X, y)
    assert est.train_record_["spec"]["model"]["name"].startswith("pickle:")
    assert est.predict(X).shape == (300, 2) and est.n_outputs_ == 2
    assert est.score(X, y) > 0.9
    assert all(np.isnan(h["test_loss"]) and np.isnan(h["test_r2"]) for h in est.history_)  # nothing held out
    assert est.history_[-1]["train_loss"] < est.history_[0]["train_loss"]
    assert module[0].weight.grad is None  # the user's instance itself was not trained


def test_regressor_reports_r2_on_the_held_out_split_like_sklearn():
    from sklearn.metrics import r2_score

    X, y = make_regression(n_samples=400, n_features=8, noise=5.0, random_state=1)
    y = y / y.std()
    est = TulaRegressor(
        max_epochs=10,
        batch_size=32,
        lr=0.01,
        optimizer="adam",
        module__hidden=32,
        validation_fraction=0.25,
        random_state=3,
    ).fit(X, y)
    # the same held-out samples, drawn as fit draws them
    perm = np.random.RandomState(3).permutation(400)
    val = perm[:100]
    assert est.history_[-1]["test_r2"] == pytest.approx(r2_score(y[val], est.predict(X[val])), abs=1e-5)
    assert est.history_[-1]["test_loss"] == pytest.approx(np.mean((y[val] - est.predict(X[val])) ** 2), rel=1e-4)


# --------------------------------------------------------------------------- the runner's regression loss
def test_the_runner_trains_a_regression_spec_on_an_arrays_file_and_its_record_reads_back(tmp_path):
    from tula.core.records import load_record, load_train, save_record
    from tula.report import train_table

    rng = np.random.RandomState(0)
    x = rng.randn(256, 6).astype(np.float32)
    y = (x @ rng.randn(6, 1)).astype(np.float32)  # float targets: regression
    np.savez(tmp_path / "xy.npz", x=x, y=y)  # no x_test: data.test_fraction (0.25) is held out
    spec = spec_from_dict(
        {
            "model": {"name": "mlp", "kwargs": {"in_features": 6, "hidden": 32, "num_classes": 1}},
            "data": {"name": "arrays", "path": str(tmp_path / "xy.npz"), "test_fraction": 0.25},
            "epochs": 4,
            "optimizer": {"name": "adam", "lr": 0.01},
            "train": {"method": "lbt", "loss": "mse"},
        }
    )
    run = train(spec, "lbt", 1, 32, tmp_path / "run", launcher=LocalLauncher(device="cpu", in_process=True))
    assert run.steps_per_epoch == 192 // 32
    h = run.history
    assert not h[-1].given("test_top1") and h[-1].test_r2 > h[0].test_r2 and h[-1].test_r2 > 0.8
    save_record(run, tmp_path / "train.json")
    back = load_record(tmp_path / "train.json", (TRAIN_KIND,))
    assert back["history"][-1]["test_r2"] == h[-1].test_r2 and back["history"][-1]["test_top1"] is None
    table = train_table(load_train(tmp_path / "train.json"))  # the table takes the typed record
    assert "R^2" in [c.header for c in table.columns]
    # a class-label spec with train.loss mse is one sentence before anything starts
    np.savez(tmp_path / "labels.npz", x=x, y=(y[:, 0] > 0).astype(np.int64))
    bad = spec_from_dict({**spec.to_dict(), "data": {"name": "arrays", "path": str(tmp_path / "labels.npz")}})
    with pytest.raises(
        TulaError, match="train.loss is 'mse' \\(regression\\), but the targets of data set 'arrays' are class labels"
    ):
        train(bad, "lbt", 1, 32, tmp_path / "bad", launcher=LocalLauncher(device="cpu", in_process=True))


# --------------------------------------------------------------------------- where the ranks run
@pytest.mark.slow  # a world of spawned ranks
def test_two_workers_on_local_processes_with_a_local_module_class(digits):
    class Local(nn.Module):  # defined here: not importable, so pickled by value (cloudpickle) into the ranks
        def __init__(self, hidden=32):
            super().__init__()
            self.f = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

        def forward(self, x):
            return self.f(x)

    X, y = digits
    est = TulaClassifier(
        module=Local, max_epochs=2, batch_size=64, lr=0.05, optimizer="adam", n_workers=2, random_state=0
    ).fit(X, y)
    rec = est.train_record_
    assert rec["spec"]["model"]["name"].startswith("pickle:")
    assert rec["n_workers"] == 2 and rec["local_batch"] == 32 and rec["replicas_identical"]
    assert all(h["n_workers"] == 2 for h in est.history_)
    assert est.score(X, y) > 0.85


@pytest.mark.slow  # two worlds of spawned ranks
def test_a_fit_under_fsdp_loads_its_weights_from_the_shards(digits):
    """method__parallelism fsdp: checkpoint.pt holds no model tensors (the shards in
    checkpoint.shards/ do), and the fitted module_ is gathered from them -- the weights a DDP fit
    of the same job trains (FSDP's reduce-scatter averages as DDP's all-reduce does)."""
    X, y = digits
    kw = {"max_epochs": 2, "batch_size": 64, "lr": 0.05, "optimizer": "adam", "n_workers": 2, "random_state": 0}
    sharded = TulaClassifier(Net, method__parallelism="fsdp", method__noise_scale=False, **kw).fit(X, y)
    ddp = TulaClassifier(Net, method__noise_scale=False, **kw).fit(X, y)
    assert sharded.train_record_["spec"]["train"]["parallelism"] == "fsdp"
    mine, theirs = sharded.module_.state_dict(), ddp.module_.state_dict()
    assert mine.keys() == theirs.keys()
    assert all(torch.allclose(mine[k], theirs[k], rtol=1e-4, atol=1e-6) for k in mine), "FSDP's weights differ"
    assert sharded.score(X, y) == ddp.score(X, y) > 0.85


def _rank_that_seeds(ctx):
    torch.manual_seed(7)
    torch.rand(3)
    return ctx.rank, ctx.world_size, torch.get_num_threads(), os.getpid()


def test_an_in_process_rank_leaves_the_caller_s_threads_and_random_state_as_they_were():
    torch.manual_seed(123)
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    res = LocalLauncher(device="cpu", threads_per_worker=threads + 1, in_process=True).run(_rank_that_seeds, 1)
    assert res == [(0, 1, threads + 1, os.getpid())]  # rank 0 of 1, here, with its own thread count
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)


@pytest.mark.slow  # a world of spawned ranks
def test_an_in_process_world_trains_as_a_spawned_one(tiny_spec_dict, tmp_path):
    spec = spec_from_dict({**tiny_spec_dict, "epochs": 1, "train": {"method": "lbt"}})
    here = train(
        spec,
        "lbt",
        1,
        128,
        tmp_path / "here",
        launcher=local_launcher(in_process=True),
    )
    spawned = train(spec, "lbt", 1, 128, tmp_path / "spawned", launcher=local_launcher())
    assert here.history[0].train_loss == spawned.history[0].train_loss
    assert here.history[0].test_top1 == spawned.history[0].test_top1


def test_sigint_stops_an_in_process_world_at_a_step_boundary(tiny_spec_dict, tmp_path):
    spec = spec_from_dict({**tiny_spec_dict, "epochs": 3, "train": {"method": "lbt"}})
    sent = []

    def on_event(ev):
        if isinstance(ev, StepDone) and not sent:
            sent.append(ev)
            os.kill(os.getpid(), signal.SIGINT)  # the caller is the rank: its handler only asks to stop

    before = signal.getsignal(signal.SIGINT)  # whatever the caller had (an earlier test's library may have set one)
    with pytest.raises(Interrupted) as err:
        train(
            spec,
            "lbt",
            1,
            32,
            tmp_path,
            on_event=on_event,
            launcher=local_launcher(in_process=True),
        )
    assert err.value.signal_name == "SIGINT" and "no epoch had finished" in str(err.value)
    assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back


@pytest.mark.slow
def test_dask_client_and_dask_arrays(digits, dask_cluster):
    """On a Client of the module's LocalCluster of 2 worker processes."""
    import dask.array as da
    import distributed

    X, y = digits
    with distributed.Client(dask_cluster) as client:
        est = TulaClassifier(
            module=Net,
            module__hidden=32,
            max_epochs=2,
            batch_size=64,
            lr=0.05,
            optimizer="adam",
            n_workers=2,
            cluster=client,
            random_state=0,
        )
        c = clone(est)
        assert c.cluster is client  # a connection is shared, not copied
        c.fit(da.from_array(X, chunks=600), da.from_array(y, chunks=600))
        assert c.train_record_["n_workers"] == 2 and c.train_record_["replicas_identical"]
        assert c.score(X, y) > 0.85
        again = pickle.loads(pickle.dumps(c))  # a Client pickles as its scheduler's address
        assert again.cluster == client.scheduler.address
        np.testing.assert_array_equal(again.predict(X), c.predict(X))


#: run in a new process: load each pickled estimator (pickle or joblib), predict, save the predictions
_PREDICT_ELSEWHERE = """
import pickle, sys
import joblib, numpy as np
X = np.load(sys.argv[1])
out = {}
for path in sys.argv[3:]:
    est = joblib.load(path) if path.endswith(".joblib") else pickle.load(open(path, "rb"))
    out[path.rsplit("/", 1)[-1]] = est.predict(X)
    out[path.rsplit("/", 1)[-1] + ".cluster"] = np.array(str(est.cluster))
np.savez(sys.argv[2], **out)
print("distributed imported" if "distributed" in sys.modules else "no distributed")
"""


@pytest.mark.slow
def test_a_fitted_estimator_pickles_after_its_cluster_closed_and_predicts_in_a_new_process(digits, tmp_path):
    """Issue #18: fitted with a Client of a LocalCluster, pickled after both were closed, loaded
    and predicting in another Python process; a Client pickles as its scheduler's address,
    also once closed, and a string address as it is."""
    import logging

    import dask
    import distributed
    import joblib

    from tula.engine.launch.clusters import WORKER_CONFIG

    X, y = digits
    dask.config.set(WORKER_CONFIG)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        address = client.scheduler.address
        # the report's run: a geometric schedule, the batch 32 -> 64 -> 128 and the workers 1 -> 1 -> 2
        est = TulaClassifier(
            module__hidden=32,
            max_epochs=3,
            batch_size="geometric",
            batch_size__initial=32,
            batch_size__factor=2,
            batch_size__delay=1,
            workers__max=2,
            workers__batch_per_worker=64,
            lr=0.05,
            optimizer="adam",
            cluster=client,
            random_state=0,
        ).fit(X, y)
        assert [(h["global_batch"], h["n_workers"]) for h in est.history_] == [(32, 1), (64, 1), (128, 2)]
        # a string address: the fit opens its own Client to it and closes it
        by_address = TulaClassifier(
            module__hidden=32,
            max_epochs=1,
            batch_size=64,
            n_workers=2,
            optimizer="adam",
            cluster=address,
            random_state=0,
        ).fit(X, y)
        # an unfitted estimator given a Client by address (no LocalCluster object behind it), closed below
        other = distributed.Client(address)
        unfitted = TulaClassifier(cluster=other, module__hidden=8)
        other.close()
        never_seen = distributed.Client(address)  # closed before any estimator saw it
        never_seen.close()
    assert client.status == "closed" and other.status == "closed"
    with pytest.raises(ParamError) as err:  # a refit on the closed Client: one sentence
        clone(est).fit(X, y)
    assert str(err.value).startswith("cluster is a distributed.Client that is closed;") and "\n" not in str(err.value)
    with pytest.warns(UserWarning, match="pickled estimator's cluster is None"):
        assert pickle.loads(pickle.dumps(TulaClassifier(cluster=never_seen))).cluster is None
    expected = est.predict(X)
    paths = {"est.pkl": est, "by_address.pkl": by_address, "unfitted.pkl": unfitted}
    for name, obj in paths.items():
        (tmp_path / name).write_bytes(pickle.dumps(obj))
    joblib.dump(est, tmp_path / "est.joblib")
    # the live estimators keep what they were given
    assert est.cluster is client and unfitted.cluster is other and by_address.cluster == address
    assert pickle.loads((tmp_path / "unfitted.pkl").read_bytes()).get_params()["cluster"] == address
    np.save(tmp_path / "X.npy", X)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    files = [str(tmp_path / n) for n in ("est.pkl", "est.joblib", "by_address.pkl")]
    out = subprocess.run(
        [sys.executable, "-c", _PREDICT_ELSEWHERE, str(tmp_path / "X.npy"), str(tmp_path / "pred.npz"), *files],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "no distributed"  # predicting needs no Dask
    pred = np.load(tmp_path / "pred.npz")
    np.testing.assert_array_equal(pred["est.pkl"], expected)
    np.testing.assert_array_equal(pred["est.joblib"], expected)
    np.testing.assert_array_equal(pred["by_address.pkl"], by_address.predict(X))
    assert str(pred["est.pkl.cluster"]) == str(pred["est.joblib.cluster"]) == address
    assert str(pred["by_address.pkl.cluster"]) == address
    assert est.score(X, y) > 0.85


# --------------------------------------------------------------------------- the AdaDamp example
@pytest.mark.slow
def test_adadamp_example_grows_the_batch_and_the_workers():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "sklearn_regressor.py"),
            "--samples",
            "600",
            "--epochs",
            "4",
            "--delay",
            "2",
            "--initial-batch",
            "16",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert "global batch per epoch: [16, 16, 80, 80]" in lines
    assert "workers per epoch:      [1, 1, 2, 2]" in lines
    fit_line = next(s for s in lines if s.startswith("fit in"))
    assert float(fit_line.split("held-out 10 % ")[1]) > 0.9


# --------------------------------------------------------------------------- bad parameters
@pytest.mark.parametrize(
    "params, words",
    [
        ({"method": "sgdx"}, "method 'sgdx' is not a Tula training method"),
        ({"batch_size": "exponential"}, "batch_size 'exponential' is neither a batch size nor a Tula batch schedule"),
        ({"n_workers": 0}, "n_workers must be a positive integer"),
        ({"optimizer": nn.Linear}, "optimizer Linear is not one Tula's training methods wrap"),
        ({"optimizer__betas": (0.9, 0.99)}, "optimizer__betas is not a setting"),
        ({"method__delta": 0.5}, "method__delta is not a setting of method 'lbt'"),
        ({"batch_size__factor": 2}, "batch_size__factor belongs to a batch schedule"),
        ({"batch_size": "geometric", "batch_size__factor": 0.5}, "factor"),
        ({"workers__min": 2}, "workers__max is needed"),
        ({"criterion": nn.L1Loss}, "criterion L1Loss is not one TulaClassifier trains with"),
        ({"lrr": 0.1}, "'lrr' is not a parameter of TulaClassifier"),
        ({"module": 3}, "module must be a torch.nn.Module class or factory"),
        ({"threads_per_worker": 0}, "threads_per_worker must be None or a positive integer"),
    ],
)
def test_bad_parameters_are_one_sentence_at_fit(params, words):
    X, y = np.random.RandomState(0).rand(40, 4), np.arange(40) % 2
    est = TulaClassifier(**{"max_epochs": 1, "batch_size": 8, **params})  # nothing is checked before fit
    with pytest.raises(ParamError) as err:
        est.fit(X, y)
    assert isinstance(err.value, ValueError) and isinstance(err.value, TulaError)
    msg = str(err.value)
    assert words in msg and "\n" not in msg and "Traceback" not in msg


def test_any_optimiser_class_trains_with_its_own_settings():
    """An optimiser class beyond SGD/Adam/AdamW is Tula's optimiser factory, ``optimizer__*``
    its settings; a setting it does not take is one sentence before any rank starts."""
    X, y = np.random.RandomState(0).rand(60, 4), np.arange(60) % 2
    est = TulaClassifier(optimizer=torch.optim.RMSprop, optimizer__alpha=0.9, lr=0.01, max_epochs=1, batch_size=16)
    assert est._optimizer_spec() == {"name": "torch.optim.rmsprop:RMSprop", "lr": 0.01, "kwargs": {"alpha": 0.9}}
    assert est.fit(X, y).predict(X).shape == (60,)
    with pytest.raises(TulaError) as err:
        TulaClassifier(optimizer=torch.optim.RMSprop, optimizer__colour=1, max_epochs=1, batch_size=16).fit(X, y)
    assert "optimiser factory 'torch.optim.rmsprop:RMSprop' raised TypeError" in str(err.value)


#: the processes a PidNet was built in
PIDS: list[int] = []


class PidNet(Net):
    """Net, noting the process each one is built in."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        PIDS.append(os.getpid())


def test_a_one_worker_fit_runs_its_rank_in_this_process():
    """cluster=None: the launcher factory's local launcher, its world of one in this process."""
    PIDS.clear()
    X, y = np.random.RandomState(0).rand(40, 64).astype(np.float32), np.arange(40) % 10
    TulaClassifier(PidNet, max_epochs=1, batch_size=8, device="cpu").fit(X, y)
    assert PIDS == [os.getpid()] * len(PIDS) and len(PIDS) >= 2  # the rank's module and module_, both here


def test_parameters_given_by_name_translate_to_a_job_spec_without_torch():
    """The translation (tula.sklearn.spec) of parameters given by name loads no torch."""
    code = """
import sys
from pathlib import Path
from tula.sklearn import TulaRegressor
est = TulaRegressor(max_epochs=3, batch_size="geometric", batch_size__initial=16, batch_size__factor=2,
                    method="ags", method__delta=0.1, optimizer="adam", optimizer__weight_decay=0.0,
                    workers__min=2, workers__max=4, workers__batch_per_worker=8, random_state=7,
                    threads_per_worker=1, module__hidden=8)
est._check_params()
train, batch, n = est._train_spec(100)
model = {"name": "mlp", "kwargs": est._module_kwargs((5, 3), 2)}
spec, threads = est._job_spec(model, Path("arrays.npz"), est._optimizer_spec(), train, n)
assert (batch, n, threads) == (16, 2, 1), (batch, n, threads)
assert model["kwargs"] == {"hidden": 8, "in_features": 15, "num_classes": 2}, model
t = spec.train
assert (t.method, t.loss, t.ags.delta, t.batch_schedule.kind, t.workers.max) == ("ags", "mse", 0.1, "geometric", 4)
assert (spec.optimizer.name, spec.optimizer.weight_decay, spec.epochs, spec.seed) == ("adam", 0.0, 3, 7)
assert spec.search.cluster_sizes == [4] and spec.data.name == "arrays"
loaded = [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
assert not loaded, f"torch was imported: {loaded[:5]}"
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr


def test_nan_targets_and_a_module_that_does_not_fit_the_data_are_one_sentence():
    X = np.random.RandomState(0).rand(40, 4)
    y = np.linspace(0, 1, 40)
    y[3] = np.nan
    with pytest.raises(ValueError, match="y contains NaN"):
        TulaRegressor(max_epochs=1, batch_size=8).fit(X, y)
    with pytest.raises(TulaError) as err:  # 4 features into a module built for 64
        TulaRegressor(module=Net, module__n_out=1, max_epochs=1, batch_size=8).fit(X, np.linspace(0, 1, 40))
    assert "cannot take arrays samples of shape (4,)" in str(err.value) and "\n" not in str(err.value)
