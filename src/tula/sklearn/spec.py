"""The estimators' parameters as a job spec, without torch: :class:`JobSpecParams`, the part of
:class:`~tula.sklearn.TulaClassifier` and :class:`~tula.sklearn.TulaRegressor` that checks
their parameters and translates them into the spec's sections (``train``, ``optimizer``, the
model's arguments) and the :class:`~tula.core.spec.JobSpec` of a fit.

It reads the parameters as scikit-learn keeps them, as attributes of the estimator
(``prefix__name`` ones included: :data:`PREFIXES`).  torch is imported only to recognise a
torch class or loss given as a parameter; parameters given by name translate without it.
Bad parameters are a :class:`ParamError` with one sentence.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from tula.core.errors import SpecError
from tula.core.registry import METHOD_NAMES, METHODS, OPTIMIZER_NAMES
from tula.core.schedules import SCHEDULE_NAMES, SCHEDULES
from tula.core.spec import AGSSpec, JobSpec, TrainSpec, import_ref, spec_from_dict

#: parameter prefixes routed by double underscore, and where each goes
PREFIXES: dict[str, str] = {
    "module": "the module's constructor",
    "optimizer": "the optimiser (momentum, nesterov, weight_decay)",
    "method": "the training method (its spec section, e.g. train.ags, and train's fields it reads)",
    "batch_size": "the batch schedule (initial, and train.batch_schedule's fields)",
    "workers": "the growing worker count (min, max, batch_per_worker)",
}
_PREFIX_TUPLE = tuple(f"{p}__" for p in PREFIXES)
_OPTIMIZER_FIELDS = ("momentum", "nesterov", "weight_decay")
_WORKER_FIELDS = ("min", "max", "batch_per_worker")
#: train fields a method__ parameter may not set: the estimator's own parameters set them
_TRAIN_OWN = ("method", "loss", "n_workers", "global_batch", "batch_schedule", "workers", "ags")
#: the built-ins whose input and output sizes come from the data: name -> (input kwarg, how)
_BUILTIN_DIMS = {
    "mlp": ("in_features", "flat"),
    "small_cnn": ("in_channels", "channels"),
    "small_cnn1d": ("in_channels", "channels"),
}
DEFAULT_INITIAL_BATCH = 32  # a schedule's first global batch when batch_size__initial is not given


class ParamError(SpecError, ValueError):
    """A parameter of a Tula estimator is invalid (one sentence); a ``ValueError`` too, as
    scikit-learn expects of bad parameters."""


def _name_of(value: Any) -> str:
    return getattr(value, "__name__", None) or repr(value)


def _is_client(c: Any) -> bool:
    """``c`` looks like a ``distributed.Client`` (not None, an address string or another value)."""
    return c is not None and not isinstance(c, str) and hasattr(c, "scheduler") and hasattr(c, "submit")


class JobSpecParams:
    """A mixin of the estimators: their parameters checked (:meth:`_check_params`) and read as
    the job spec's sections.  The estimator holds the parameters (``module``, ``criterion``,
    ``optimizer``, ``lr``, ``batch_size``, ``method``, ``n_workers``, ``cluster``, ...) and
    ``_loss``, the loss it trains with."""

    _loss = "cross_entropy"
    module: Any
    criterion: Any
    optimizer: Any
    lr: float
    max_epochs: int
    batch_size: Any
    method: str
    n_workers: int
    cluster: Any
    device: str
    random_state: Any
    validation_fraction: float
    threads_per_worker: int | None

    def _routed(self) -> dict[str, Any]:
        extra = getattr(self, "_unrouted", ())
        return {k: v for k, v in vars(self).items() if k.startswith(_PREFIX_TUPLE) or k in extra}

    def _prefixed(self, prefix: str) -> dict[str, Any]:
        n = len(prefix) + 2
        return {k[n:]: v for k, v in self._routed().items() if k.startswith(prefix + "__")}

    def _check_params(self) -> None:
        """Each parameter checked, the first problem raised as one sentence (:class:`ParamError`)."""
        self._check_scalars()
        self._check_batch_size()

    def _check_scalars(self) -> None:
        unrouted = [k for k in getattr(self, "_unrouted", ()) if k in vars(self)]
        if unrouted:
            raise ParamError(
                f"{unrouted[0]!r} is not a parameter of {type(self).__name__}; routed parameters start "
                f"with {', '.join(_PREFIX_TUPLE)}"
            )
        if self.method not in METHOD_NAMES:
            raise ParamError(
                f"method {self.method!r} is not a Tula training method; use one of {', '.join(METHOD_NAMES)}"
            )
        n = self.n_workers
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ParamError(f"n_workers must be a positive integer, not {n!r}")
        e = self.max_epochs
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or e < 1:
            raise ParamError(f"max_epochs must be a positive integer, not {e!r}")
        if (
            isinstance(self.lr, bool)
            or not isinstance(self.lr, (int, float, np.floating, np.integer))
            or not (math.isfinite(self.lr) and self.lr > 0)
        ):
            raise ParamError(f"lr must be a positive number, not {self.lr!r}")
        vf = self.validation_fraction
        if isinstance(vf, bool) or not isinstance(vf, (int, float, np.floating)) or not 0 <= vf < 1:
            raise ParamError(f"validation_fraction must be a number in [0, 1), not {vf!r}")
        t = self.threads_per_worker
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1):
            raise ParamError(f"threads_per_worker must be None or a positive integer, not {t!r}")
        c = self.cluster
        if _is_client(c) and (
            getattr(c, "scheduler", None) is None or getattr(c, "status", "") in ("closing", "closed")
        ):
            raise ParamError(
                "cluster is a distributed.Client that is closed; give an open Client or its scheduler's "
                "address 'tcp://HOST:PORT'"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise ParamError(f"device must be 'auto', 'cpu' or 'cuda', not {self.device!r}")

    def _check_batch_size(self) -> None:
        b = self.batch_size
        if isinstance(b, str):
            if b not in SCHEDULE_NAMES:
                raise ParamError(
                    f"batch_size {b!r} is neither a batch size nor a Tula batch schedule; use a "
                    f"positive integer or one of {', '.join(SCHEDULE_NAMES)}"
                )
        elif isinstance(b, type):
            if self._schedule_kind() is None:
                raise ParamError(
                    f"batch_size {_name_of(b)} is not one of Tula's batch schedules ({', '.join(SCHEDULE_NAMES)})"
                )
        elif isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise ParamError(f"batch_size must be a positive integer or a batch schedule's name, not {b!r}")
        elif self._prefixed("batch_size"):
            first = next(iter(self._prefixed("batch_size")))
            raise ParamError(
                f"batch_size__{first} belongs to a batch schedule, but batch_size is the constant {b}; "
                "give batch_size a schedule's name (e.g. 'geometric') and batch_size__initial"
            )

    def _schedule_kind(self) -> str | None:
        """The schedule ``batch_size`` names (a name, or a class of :data:`tula.core.schedules.SCHEDULES`)."""
        b = self.batch_size
        if isinstance(b, str):
            return b if b in SCHEDULES else None
        if isinstance(b, type):
            return next((name for name, info in SCHEDULES.items() if info.cls is b), None)
        return None

    def _loss_name(self) -> str:
        """The loss the spec names: the estimator's own, given as None, its name, or torch's class
        or instance of it (torch is imported only then)."""
        c = self.criterion
        if c is None or (isinstance(c, str) and c == self._loss):
            return self._loss
        import torch.nn as nn

        own = {"cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss}[self._loss]
        if c == self._loss or c is own or (isinstance(c, own) and type(c) is own):
            return self._loss
        raise ParamError(
            f"criterion {_name_of(c)} is not one {type(self).__name__} trains with; leave it None "
            f"(or give {self._loss!r} / torch.nn.{own.__name__})"
        )

    def _optimizer_spec(self) -> dict[str, Any]:
        """The spec's ``optimizer``: one of Tula's by name (or torch's class of it), or any other
        ``torch.optim.Optimizer`` class by its import reference (torch is imported only for a class)."""
        o = self.optimizer
        prefixed = {k: v.item() if isinstance(v, np.generic) else v for k, v in self._prefixed("optimizer").items()}
        if isinstance(o, str) and o.lower() in OPTIMIZER_NAMES:
            name = o.lower()
        else:
            own = self._optimizer_class_name(o)
            if own is None:  # another optimiser class: made as cls(params, lr=lr, **optimizer__*)
                return {"name": import_ref(o), "lr": float(self.lr), "kwargs": prefixed}
            name = own
        spec = {"name": name, "lr": float(self.lr)}
        for key, value in prefixed.items():
            if key not in _OPTIMIZER_FIELDS:
                raise ParamError(
                    f"optimizer__{key} is not a setting of {name!r}; use one of "
                    f"{', '.join('optimizer__' + f for f in _OPTIMIZER_FIELDS)}, or an optimiser class whose "
                    "own settings these are"
                )
            spec[key] = value
        return spec

    @staticmethod
    def _optimizer_class_name(o: Any) -> str | None:
        """The name of Tula's optimiser the torch class ``o`` is (SGD, Adam, AdamW); None for
        another ``torch.optim.Optimizer`` class importable by its name; else a :class:`ParamError`."""
        import torch.optim as optim

        classes = {optim.SGD: "sgd", optim.Adam: "adam", optim.AdamW: "adamw"}
        if isinstance(o, type) and o in classes:
            return classes[o]
        if isinstance(o, type) and issubclass(o, optim.Optimizer) and import_ref(o) is not None:
            return None
        raise ParamError(
            f"optimizer {_name_of(o)} is not one Tula's training methods wrap; use 'sgd', 'adam', "
            "'adamw' or a torch.optim.Optimizer class importable by its name (torch.optim.RMSprop, say)"
        )

    def _train_spec(self, n_train: int) -> tuple[dict[str, Any], int, int]:
        """``train`` section, first global batch, first worker count."""
        info = METHODS[self.method]
        train: dict[str, Any] = {"method": self.method, "loss": self._loss_name()}
        ags_fields = set(AGSSpec.model_fields) if info.spec_section == "train.ags" else set()
        train_fields = set(TrainSpec.model_fields) - set(_TRAIN_OWN)
        for key, value in self._prefixed("method").items():
            value = value.item() if isinstance(value, np.generic) else value
            if key in ags_fields:
                train.setdefault("ags", {})[key] = value
            elif key in train_fields:
                train[key] = value
            else:
                allowed = sorted(ags_fields | train_fields)
                raise ParamError(
                    f"method__{key} is not a setting of method {self.method!r}; it takes "
                    f"{', '.join('method__' + a for a in allowed)}"
                )
        n_workers = int(self.n_workers)
        workers = self._prefixed("workers")
        if workers:
            unknown = sorted(set(workers) - set(_WORKER_FIELDS))
            if unknown:
                raise ParamError(
                    f"workers__{unknown[0]} is not a setting of the growing worker count; use "
                    f"{', '.join('workers__' + f for f in _WORKER_FIELDS)}"
                )
            if "max" not in workers:
                raise ParamError(
                    "workers__max is needed when the worker count may grow (workers__min or "
                    "workers__batch_per_worker is set)"
                )
            train["workers"] = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in workers.items()}
            n_workers = int(workers.get("min", 1))
        kind = self._schedule_kind()
        if kind is None:
            wanted = int(self.batch_size)
        else:
            sched = self._prefixed("batch_size")
            wanted = int(sched.pop("initial", DEFAULT_INITIAL_BATCH))
            train["batch_schedule"] = {
                "kind": kind,
                **{k: (v.item() if isinstance(v, np.generic) else v) for k, v in sched.items()},
            }
        if n_train < n_workers:
            raise ParamError(f"{n_workers} workers need at least {n_workers} training samples, but there are {n_train}")
        batch = min(wanted, n_train)
        batch -= batch % n_workers
        if batch < wanted and kind is None:
            warnings.warn(
                f"batch_size {wanted} is larger than the {n_train} training samples; it is clipped to {batch}",
                UserWarning,
                stacklevel=3,
            )
        train["n_workers"], train["global_batch"] = n_workers, batch
        return train, batch, n_workers

    # ------------------------------------------------------------------ the module
    def _module_kwargs(self, x_shape: tuple[int, ...], n_out: int) -> dict[str, Any]:
        kwargs = {k: v.item() if isinstance(v, np.generic) else v for k, v in self._prefixed("module").items()}
        if isinstance(self.module, str):
            if self.module in _BUILTIN_DIMS:
                key, how = _BUILTIN_DIMS[self.module]
                kwargs.setdefault(key, int(np.prod(x_shape)) if how == "flat" else int(x_shape[0]))
                kwargs.setdefault("num_classes", n_out)
            elif ":" not in self.module:  # a torchvision name
                kwargs.setdefault("num_classes", n_out)
        return kwargs

    def _seed(self) -> int:
        rs = self.random_state
        if isinstance(rs, (int, np.integer)) and not isinstance(rs, bool):
            return int(rs)
        return int(check_random_state(rs).randint(np.iinfo(np.int32).max))

    def _job_spec(
        self, model_spec: dict, arrays: Path, optimizer: dict, train: dict, n_workers: int
    ) -> tuple[JobSpec, int]:
        """The job spec of this fit and the torch threads of each local rank."""
        largest = max(n_workers, int(train.get("workers", {}).get("max", n_workers)))
        # local ranks: as tula train's default; a Dask cluster's: its workers' cores (the launcher's default)
        threads = int(self.threads_per_worker or max(1, (os.cpu_count() or 1) // largest))
        spec_dict = {
            "name": type(self).__name__,
            "model": model_spec,
            "data": {"name": "arrays", "path": str(arrays)},
            "epochs": int(self.max_epochs),
            "seed": self._seed(),
            "optimizer": optimizer,
            "train": train,
            "search": {"cluster_sizes": [largest]},
            "profile": {
                "device": self.device,
                "threads_per_worker": threads if self.cluster is None else self.threads_per_worker,
            },
        }
        if isinstance(self.cluster, str):
            spec_dict["cluster"] = {"where": self.cluster}
        try:
            return spec_from_dict(spec_dict), threads
        except SpecError as err:
            raise ParamError(str(err)) from None
