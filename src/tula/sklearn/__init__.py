"""Tula training behind scikit-learn's API: :class:`TulaClassifier` and :class:`TulaRegressor`.

An estimator is a thin front of the training runner (:func:`tula.engine.train.train`): ``fit``
writes the arrays to a ``.npz`` file in a temporary run directory, builds a job spec (data
set ``arrays``, ``train.loss`` cross_entropy or mse, the method, the batch or its schedule,
the workers) and trains it as ``tula train`` would -- DDP ranks through a launcher, AGS or a
baseline, growing batches and worlds, checkpoints, the out-of-memory fallback -- then loads
the last checkpoint's weights into ``module_`` and removes the directory.  The parameters'
checks and their translation into the job spec are :mod:`tula.sklearn.spec` (no torch); the
launcher comes from the launcher factory (:mod:`tula.engine.launch.clusters`).

Parameters follow skorch's conventions: ``module__x`` goes to the module's constructor,
``optimizer__x`` to the optimiser, ``method__x`` to the training method, ``batch_size__x``
to the batch schedule, ``workers__x`` to the growing worker count; they work with
``get_params``/``set_params``/``clone`` and therefore in ``GridSearchCV`` and pipelines.

Decisions
---------
* **Held-out data.** ``validation_fraction`` (default 0.1) of the samples, drawn with the
  estimator's seed, are not trained on: they are the run's test split, scored after every
  epoch (``history_``: ``test_loss`` and ``test_top1``, or ``test_r2`` for regression).
  ``validation_fraction=0`` trains on everything; the per-epoch test figures are then NaN.
* **The module in the ranks.** A module name string is a spec model name (a Tula built-in
  such as ``"mlp"``, a torchvision name, ``"package.module:factory"``).  A class or factory
  that can be imported by its module and qualified name (not ``__main__``, not a local
  class), with JSON-serialisable ``module__`` arguments, travels by that import reference;
  anything else (a class defined in a script or notebook, a module *instance*, arguments
  that are not JSON) is pickled with cloudpickle into the run directory
  (``pickle:PATH``) and loaded by every rank.  ``module_`` itself is always built in the
  caller from the object given, so it pickles as the user's class.
* **Dimensions of the built-ins.** For ``mlp``, ``small_cnn`` and ``small_cnn1d`` the input
  size (``in_features`` or ``in_channels``) and the output size (``num_classes``: the
  number of classes, or of regression outputs) come from the data unless ``module__``
  arguments give them; a user's module gets exactly its ``module__`` arguments.
* **Where the ranks run.** ``cluster=None``: processes on this machine; a world of one
  worker runs in this process (:class:`~tula.engine.launch.local.LocalLauncher` with
  ``in_process``: the same rank runtime, without a process start).  A
  ``distributed.Client`` or a scheduler address ``"tcp://HOST:PORT"`` (also ``"dask"``: a
  LocalCluster for the fit): one rank per Dask worker.  The run directory must be readable
  by every worker: a LocalCluster shares this machine's file system; a remote cluster needs
  ``tmp_dir`` on a file system every worker mounts (the run says so in one sentence when a
  rank cannot read it), and a module given by import reference must be importable there.
* **Pickling and the cluster.** A fitted estimator pickles (``pickle``, ``joblib``) and predicts
  in any process, whatever became of its cluster: predicting needs only ``module_`` and the
  fitted attributes.  A ``distributed.Client`` cannot travel, so the pickle holds its
  scheduler's address ``"tcp://HOST:PORT"`` in its place: the address it has while connected,
  or once closed the one the estimator saw while it was (when the Client was given -- to the
  constructor, ``set_params`` or by assignment -- or at ``fit``).  The estimator pickled keeps
  the Client; the unpickled one's ``get_params()["cluster"]`` is that address, so ``clone`` and
  ``fit`` of it train on the same scheduler, or say in one sentence that none answers there
  (``set_params(cluster=...)`` points it elsewhere).  An address rather than None: a refit
  must not move silently from the cluster to this machine.  The one exception, a Client
  already closed when given and never seen connected, pickles as None (local processes) with
  a warning.  A string address pickles as it is.
* **Batch sizes** larger than the training set are clipped to it (with a warning), and
  rounded down to a multiple of the worker count.

Bad parameters are a :class:`ParamError` (both a :class:`~tula.core.errors.TulaError` and a
``ValueError``) with one sentence, raised by ``fit``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, clone
from sklearn.preprocessing import LabelEncoder
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from tula.core.errors import SpecError, WorkloadError
from tula.core.spec import ModelSpec, import_ref
from tula.sklearn.spec import (
    _PREFIX_TUPLE,
    DEFAULT_INITIAL_BATCH,
    PREFIXES,
    JobSpecParams,
    ParamError,
    _is_client,
    _name_of,
)

__all__ = ["DEFAULT_INITIAL_BATCH", "PREFIXES", "ParamError", "TulaClassifier", "TulaRegressor"]


# --------------------------------------------------------------------------- helpers
def _is_json(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


def _to_numpy(a: Any) -> Any:
    """Dask collections are computed, torch tensors copied to numpy; others pass through."""
    if a is None:
        return None
    if hasattr(a, "dask") and hasattr(a, "compute"):
        a = a.compute()
    try:
        import torch

        if isinstance(a, torch.Tensor):
            return a.detach().cpu().numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return a


#: the scheduler address of every ``distributed.Client`` an estimator saw connected, kept for
#: as long as the Client lives: a closed Client no longer tells it
_CLIENT_ADDRESSES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _client_address(c: Any) -> str | None:
    """The scheduler address of the Client ``c``: as it is while connected (and then remembered),
    the one remembered once closed, None when it was never seen connected."""
    address = getattr(getattr(c, "scheduler", None), "address", None)
    if isinstance(address, str) and address:
        try:
            _CLIENT_ADDRESSES[c] = address
        except TypeError:  # not weakly referenceable: known only while connected
            pass
        return address
    try:
        return _CLIENT_ADDRESSES.get(c)
    except TypeError:
        return None


# --------------------------------------------------------------------------- the estimators
class _TulaEstimator(JobSpecParams, BaseEstimator):
    """What :class:`TulaClassifier` and :class:`TulaRegressor` share (see the module's doc)."""

    _loss = "cross_entropy"

    def __init__(
        self,
        module: Any = "mlp",
        *,
        criterion: Any = None,
        optimizer: Any = "sgd",
        lr: float = 0.01,
        max_epochs: int = 10,
        batch_size: Any = 128,
        method: str = "lbt",
        n_workers: int = 1,
        cluster: Any = None,
        device: str = "auto",
        random_state: Any = None,
        verbose: int = 0,
        validation_fraction: float = 0.1,
        tmp_dir: str | None = None,
        threads_per_worker: int | None = None,
        **kwargs: Any,
    ):
        self.module = module
        self.criterion = criterion
        self.optimizer = optimizer
        self.lr = lr
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.method = method
        self.n_workers = n_workers
        self.cluster = cluster
        self.device = device
        self.random_state = random_state
        self.verbose = verbose
        self.validation_fraction = validation_fraction
        self.tmp_dir = tmp_dir
        self.threads_per_worker = threads_per_worker
        # every keyword is kept as given (scikit-learn validates nothing in __init__); a name
        # that is not ``prefix__name`` is refused by fit
        self._unrouted = tuple(k for k in kwargs if not k.startswith(_PREFIX_TUPLE))
        for key, value in kwargs.items():
            setattr(self, key, value)

    # ------------------------------------------------------------------ params
    def __sklearn_clone__(self) -> _TulaEstimator:
        """As scikit-learn clones, except that a ``distributed.Client`` in ``cluster`` is shared
        by the clone (a connection cannot be deep-copied)."""
        if self.cluster is None or isinstance(self.cluster, str):
            return super().__sklearn_clone__()
        params = self.get_params(deep=False)
        return type(self)(**{k: v if k == "cluster" else clone(v, safe=False) for k, v in params.items()})

    def __setattr__(self, name: str, value: Any) -> None:
        # a Client's address is remembered whenever one is given (constructor, set_params,
        # assignment), so that the estimator still pickles once the Client is closed
        if name == "cluster" and _is_client(value):
            _client_address(value)
        super().__setattr__(name, value)

    def __getstate__(self) -> dict:
        """A ``distributed.Client`` in ``cluster`` is pickled as its scheduler's address, also
        once closed (the address it had); None, with a warning, when that was never known."""
        state = super().__getstate__()
        c = state.get("cluster")
        if _is_client(c):
            address = _client_address(c)
            if address is None:
                warnings.warn(
                    f"cluster is a closed distributed.Client whose scheduler address {type(self).__name__} "
                    "never saw, so the pickled estimator's cluster is None (a refit runs on local processes)",
                    UserWarning,
                    stacklevel=2,
                )
            state = {**state, "cluster": address}
        return state

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's parameters and every ``prefix__name`` parameter set."""
        params = super().get_params(deep=deep)
        params.update(self._routed())
        return params

    def set_params(self, **params: Any) -> _TulaEstimator:
        """Set parameters; ``prefix__name`` ones (module, optimizer, method, batch_size,
        workers) are stored as given, the others as scikit-learn does."""
        routed = {k: v for k, v in params.items() if k.startswith(_PREFIX_TUPLE)}
        for key, value in routed.items():
            setattr(self, key, value)
        rest = {k: v for k, v in params.items() if k not in routed}
        if rest:
            super().set_params(**rest)
        return self

    # ------------------------------------------------------------------ the module
    def _model_spec(self, run_dir: Path, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The spec's ``model``: a name and its kwargs, an import reference, or a pickled factory."""
        import torch.nn as nn

        m = self.module
        if isinstance(m, str):
            return {"name": m, "kwargs": kwargs}
        if isinstance(m, nn.Module):
            factory: Any = functools.partial(copy.deepcopy, m)
            if kwargs:
                raise ParamError(
                    "module is a module instance, which takes no module__ arguments; pass its class instead"
                )
        elif callable(m):
            ref = import_ref(m)
            if ref is not None and _is_json(kwargs):
                return {"name": ref, "kwargs": kwargs}
            factory = functools.partial(m, **kwargs)
        else:
            raise ParamError(
                f"module must be a torch.nn.Module class or factory, a module instance, or a model name "
                f"such as 'mlp', not {type(m).__name__}"
            )
        from tula.engine.workloads import pickle_for_ranks

        cls = m if isinstance(m, type) or not isinstance(m, nn.Module) else type(m)
        try:  # the class's module by value when it is not importable by name (a file loaded by path)
            ref = pickle_for_ranks(factory, run_dir / "module.pkl", like=cls, what=f"module {_name_of(m)}")
        except WorkloadError as err:
            raise ParamError(str(err)) from None
        return {"name": ref, "kwargs": {}}

    def _build_module_here(self, model_spec: dict, kwargs: dict[str, Any]) -> Any:
        """``module_``, built in this process from the object the user gave."""
        import torch.nn as nn

        from tula.engine.workloads import build_model

        m = self.module
        if isinstance(m, str):
            return build_model(ModelSpec(**model_spec))
        if isinstance(m, nn.Module):
            return copy.deepcopy(m)
        return m(**kwargs)

    # ------------------------------------------------------------------ fit
    def _validate_fit_data(self, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray, int]:
        raise NotImplementedError

    def fit(self, X: Any, y: Any) -> _TulaEstimator:
        """Train the module on ``X``, ``y`` (numpy arrays, torch tensors or dask arrays)
        through Tula's training runner; returns the estimator."""
        self._check_params()
        X, y = _to_numpy(X), _to_numpy(y)
        X, y_enc, n_out = self._validate_fit_data(X, y)
        classify = self._loss_name() == "cross_entropy"
        train_idx, val_idx = self._validation_split(len(X))
        # the module's and the schedule's parameters, checked before anything is written
        train, batch, n_workers = self._train_spec(len(train_idx))
        optimizer = self._optimizer_spec()
        kwargs = self._module_kwargs(X.shape[1:], n_out)
        run_dir = Path(tempfile.mkdtemp(prefix="tula-sklearn-", dir=self.tmp_dir))
        try:
            arrays = self._write_arrays(run_dir, X, y_enc, train_idx, val_idx, n_out if classify else None)
            model_spec = self._model_spec(run_dir, kwargs)
            spec, threads = self._job_spec(model_spec, arrays, optimizer, train, n_workers)
            record = self._train_named(spec, batch, n_workers, run_dir / "run", threads, model_spec)
            module = self._trained_module(run_dir / "run", model_spec, kwargs)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        self.module_ = module
        self.history_ = record["history"]
        self.train_record_ = record
        return self

    def _validation_split(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The training and validation rows: ``validation_fraction`` of ``n`` held out, drawn
        with the estimator's seed (none when that would leave no training row)."""
        vf = float(self.validation_fraction)
        n_val = int(round(n * vf)) if vf > 0 else 0
        if n - n_val < 1:
            n_val = 0
        perm = np.random.RandomState(self._seed() % (2**32)).permutation(n)
        return perm[n_val:], perm[:n_val]

    def _write_arrays(
        self,
        run_dir: Path,
        X: np.ndarray,
        y_enc: np.ndarray,
        train_idx: np.ndarray,
        val_idx: np.ndarray,
        num_classes: int | None,
    ) -> Path:
        """The data as the spec's ``arrays`` data set reads it: one ``.npz`` in ``run_dir``
        (``num_classes`` for a classifier)."""
        arrays = {"x": X[train_idx], "y": y_enc[train_idx], "x_test": X[val_idx], "y_test": y_enc[val_idx]}
        if num_classes is not None:
            arrays["num_classes"] = np.asarray(num_classes)
        path = run_dir / "arrays.npz"
        np.savez(path, **arrays)
        return path

    def _train_named(self, spec: Any, batch: int, n_workers: int, out: Path, threads: int, model_spec: dict) -> dict:
        """:meth:`_run`, its errors in the estimator's words: the user's module named instead of
        the pickle file it travelled in; a configuration the runner refuses as a parameter error."""
        try:
            return self._run(spec, batch, n_workers, out, threads)
        except WorkloadError as err:
            raise WorkloadError(
                str(err).replace(f"model {model_spec['name']!r}", f"module {_name_of(self.module)}")
            ) from None
        except SpecError as err:  # e.g. adascale on one worker
            raise ParamError(str(err)) from None

    def _trained_module(self, out: Path, model_spec: dict, kwargs: dict) -> Any:
        """The module built in this process with the run's last checkpointed parameters: the
        checkpoint's own, or under ``method__parallelism="fsdp"`` (its ``checkpoint.pt`` holds no
        tensors) its shards gathered whole (:func:`tula.engine.fsdp.full_state_from_shards`)."""
        from tula.engine.checkpoint import load_checkpoint
        from tula.engine.fsdp import full_state_from_shards
        from tula.engine.rank_checkpoint import RankCheckpoint

        state = RankCheckpoint.from_state(load_checkpoint(out, map_location="cpu"))
        weights = state.model
        if state.shards:  # sharded (FSDP): the weights are in checkpoint.shards/, not in checkpoint.pt
            weights = full_state_from_shards(out, state.shards)["model"]
        module = self._build_module_here(model_spec, kwargs)
        module.load_state_dict(weights)
        module.eval()
        return module

    def _run(self, spec: Any, batch: int, n_workers: int, out: Path, threads: int) -> dict:
        """Train through the runner on the launcher ``cluster`` asks for, at the configuration
        of the rule every front follows (:func:`tula.core.job_rules.train_config`; the
        estimator's parameters are explicit arguments)."""
        from tula.core.job_rules import train_config, train_method, training_spec
        from tula.engine.train import train

        config = train_config(spec, n_workers=n_workers, global_batch=batch)
        spec, method = training_spec(spec, config), train_method(spec, config.global_batch, self.method)
        with self._launcher(spec, config.n_workers) as launcher:
            on_event = self._printer() if self.verbose else None
            run = train(spec, method, config.n_workers, config.global_batch, out, launcher=launcher, on_event=on_event)
        # train_record_ and history_ are the record as train.json holds it (a dict): the typed TrainRecord's JSON
        return run.to_json_dict()

    @contextlib.contextmanager
    def _launcher(self, spec: Any, n_workers: int) -> Iterator[Any]:
        """The launcher of this fit, from the launcher factory
        (:mod:`tula.engine.launch.clusters`): local processes, a world of one running in this
        process, for ``cluster=None``; a cluster an address, ``'dask'`` or a jobqueue file
        names, opened (and closed) for this fit; or one rank per worker of a Client's cluster."""
        from tula.engine.launch.clusters import launcher_for_client, open_launcher

        c = self.cluster
        if c is None or isinstance(c, str):
            # the spec's cluster.where: c, or local; with c None a one-worker fit needs no process of its own
            with open_launcher(spec, n_workers=n_workers, in_process=c is None) as launcher:
                yield launcher
        elif _is_client(c):
            _client_address(c)  # remembered while connected: the estimator pickles once it is closed
            # the workers' cores shared by the ranks on each host, as tula train does on Dask
            yield launcher_for_client(c, spec, max(spec.search.cluster_sizes), threads=self.threads_per_worker)
        else:
            raise ParamError(
                f"cluster must be None (local processes), a distributed.Client or a scheduler address "
                f"'tcp://HOST:PORT', not {type(c).__name__}"
            )

    def _printer(self):
        from tula.core.events import EpochFinished, Event, FellBack, Note, Resized
        from tula.core.records import epoch_score

        def on_event(ev: Event) -> None:
            if isinstance(ev, EpochFinished):
                rec = ev.record
                label, _, text = epoch_score(rec)
                print(
                    f"epoch {rec.epoch:>3}  B={rec.global_batch} N={rec.n_workers}  train loss "
                    f"{rec.train_loss:.4f}  test loss {rec.test_loss:.4f}  {label} {text}  "
                    f"{rec.epoch_time_s:.2f} s",
                    flush=True,
                )
            elif isinstance(ev, Note | Resized | FellBack):  # as its JSON: 'note: message=...'
                fields = ev.to_json_dict()
                print(f"{ev.kind}: " + ", ".join(f"{k}={v}" for k, v in fields.items() if k != "type"), flush=True)

        return on_event

    # ------------------------------------------------------------------ predict
    def _forward(self, X: Any) -> np.ndarray:
        import torch

        check_is_fitted(self, "module_")
        X = validate_data(self, _to_numpy(X), reset=False, dtype=np.float32, allow_nd=True)
        module = self.module_
        module.eval()
        outs = []
        with torch.no_grad():
            for start in range(0, len(X), 4096):
                outs.append(module(torch.from_numpy(np.ascontiguousarray(X[start : start + 4096]))).double())
        return torch.cat(outs).numpy()


class TulaClassifier(ClassifierMixin, _TulaEstimator):
    """A PyTorch classifier trained by Tula (cross-entropy; scored by accuracy).

    ``fit`` trains the module as ``tula train`` would (DDP ranks, AGS or a baseline, growing
    batches and worlds, checkpoints), then keeps the trained module in ``module_``.
    Parameters named ``prefix__name`` are routed as in skorch: ``module__x`` to the module's
    constructor, ``optimizer__x`` to the optimiser, ``method__x`` to the training method,
    ``batch_size__x`` to the batch schedule, ``workers__x`` to the growing worker count.

    Parameters
    ----------
    module : type or callable or torch.nn.Module or str
        An ``nn.Module`` class or factory, a module instance, or a model name (``"mlp"``,
        ``"small_cnn"``, a torchvision name, ``"package.module:factory"``); ``module__x``
        arguments go to it.
    criterion : None or str or type
        ``None`` (cross-entropy), ``"cross_entropy"`` or ``torch.nn.CrossEntropyLoss``.
    optimizer : str or type
        ``"sgd"``, ``"adam"``, ``"adamw"`` or ``torch.optim.SGD`` / ``Adam`` / ``AdamW``, with
        ``optimizer__momentum``, ``optimizer__nesterov``, ``optimizer__weight_decay`` (default:
        the spec's, 0.9, False, 5e-4); or any other ``torch.optim.Optimizer`` class importable
        by its name (``torch.optim.RMSprop``), made as ``cls(params, lr=lr, **optimizer__*)``.
    lr : float
        The learning rate (at the first global batch).
    max_epochs : int
        Epochs to train.
    batch_size : int or str or type
        The global batch (an int), or a batch schedule's name or class from
        :data:`tula.core.schedules.SCHEDULES` (``"geometric"``,
        ``tula.core.schedules.Geometric``, ...) with ``batch_size__initial`` (the first batch,
        default 32) and ``batch_size__*`` (the fields of ``train.batch_schedule``: factor,
        delay, rate, max_batch, lr_rule, ...).
    method : str
        A training method of :data:`tula.core.registry.METHODS` (``lbt``: plain SGD at
        ``lr``; ``ags``, ``lars``, ...); ``method__x`` go to its spec section
        (``method__delta`` -> ``train.ags.delta``) or to ``train.x``
        (``method__warmup_epochs``).
    n_workers : int
        The worker count (DDP ranks); ``workers__min``, ``workers__max`` and
        ``workers__batch_per_worker`` let it grow with a batch schedule.
    cluster : None or distributed.Client or str
        ``None`` (processes on this machine), a ``distributed.Client``, or a scheduler address
        ``"tcp://HOST:PORT"``.  A Client is pickled as its scheduler's address, the one it had
        while connected if it is closed by then (see the module's "Pickling and the cluster"):
        an unpickled estimator's ``cluster`` is that string.
    device : str
        ``"auto"`` (CUDA where the ranks see it), ``"cpu"`` or ``"cuda"``.
    random_state : int or None
        Seed of the initialisation, the batches and the validation split.
    verbose : int
        Print a line per epoch when > 0.
    validation_fraction : float
        Share of the samples held out and scored after each epoch (0: none).
    tmp_dir : str or None
        Where the fit's temporary run directory goes (default: the system's); on a remote
        Dask cluster, a directory every worker can read.
    threads_per_worker : int or None
        Torch threads in each rank (default: this machine's cores / the largest worker count,
        as ``tula train``; a Dask cluster's ranks share their workers' cores).
    **kwargs : Any
        The routed ``prefix__name`` parameters (``module__``, ``optimizer__``, ``method__``,
        ``batch_size__``, ``workers__``); any other name is refused by ``fit``.

    Attributes
    ----------
    module_ : torch.nn.Module
        The trained module, on the CPU, in eval mode.
    history_ : list of dict
        One dict per epoch (``train_loss``, ``test_loss``, ``test_top1``, ``lr``,
        ``global_batch``, ``n_workers``, ``epoch_time_s``, ...).
    train_record_ : dict
        The runner's training record.
    classes_ : numpy.ndarray
        The class labels.
    n_features_in_ : int
        Number of features seen in ``fit``.

    Raises
    ------
    ParamError
        From ``fit``, for a bad parameter (one sentence; both a ``TulaError`` and a
        ``ValueError``).

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from tula.sklearn import TulaClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> clf = TulaClassifier("mlp", max_epochs=2, batch_size=128, random_state=0).fit(X / 16, y)
    >>> accuracy = clf.score(X / 16, y)
    """

    _loss = "cross_entropy"

    def _validate_fit_data(self, X, y):
        X, y = validate_data(self, X, y, dtype=np.float32, allow_nd=True)
        check_classification_targets(y)
        enc = LabelEncoder()
        y_enc = enc.fit_transform(y).astype(np.int64)
        self.classes_ = enc.classes_
        return X, y_enc, len(self.classes_)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities (softmax of the module's first ``len(classes_)`` outputs)."""
        out = self._forward(X)[:, : len(self.classes_)]
        out = out - out.max(axis=1, keepdims=True)
        e = np.exp(out)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class of each sample."""
        out = self._forward(X)[:, : len(self.classes_)]
        return self.classes_[np.argmax(out, axis=1)]


class TulaRegressor(RegressorMixin, _TulaEstimator):
    """A PyTorch regressor trained by Tula (mean squared error; scored by R^2).

    ``y`` may have one output or several; the module must give as many.  ``history_`` holds
    ``test_loss`` (the MSE) and ``test_r2`` per epoch.

    Parameters
    ----------
    module : type or callable or torch.nn.Module or str
        As for :class:`TulaClassifier`; a built-in's output size is the number of outputs.
    criterion : None or str or type
        ``None`` (mean squared error), ``"mse"`` or ``torch.nn.MSELoss``.
    optimizer, lr, max_epochs, batch_size, method, n_workers, cluster, device : Any
        As for :class:`TulaClassifier`.
    random_state, verbose, validation_fraction, tmp_dir, threads_per_worker : Any
        As for :class:`TulaClassifier`.
    **kwargs : Any
        The routed ``prefix__name`` parameters, as for :class:`TulaClassifier`.

    Attributes
    ----------
    module_, history_, train_record_, n_features_in_ : Any
        As for :class:`TulaClassifier`.
    n_outputs_ : int
        The number of regression outputs.

    Examples
    --------
    >>> import numpy as np
    >>> from tula.sklearn import TulaRegressor
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(512, 8)).astype("float32")
    >>> y = X @ rng.normal(size=8)
    >>> reg = TulaRegressor("mlp", max_epochs=2, batch_size=64, random_state=0).fit(X, y)
    >>> r2 = reg.score(X, y)
    """

    _loss = "mse"

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def _validate_fit_data(self, X, y):
        X, y = validate_data(self, X, y, dtype=np.float32, allow_nd=True, multi_output=True, y_numeric=True)
        y = np.asarray(y, dtype=np.float32)
        self._y_ndim = y.ndim
        y2 = y.reshape(len(y), -1)
        self.n_outputs_ = y2.shape[1]
        return X, y2, self.n_outputs_

    def predict(self, X: Any) -> np.ndarray:
        """The module's outputs (1-D when ``y`` was)."""
        out = self._forward(X)
        return out.ravel() if getattr(self, "_y_ndim", 2) == 1 and out.ndim == 2 and out.shape[1] == 1 else out
