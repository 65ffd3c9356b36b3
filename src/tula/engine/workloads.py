"""Model and data-set registry: turn a ModelSpec/DataSpec into a torch module and data.

Nothing here downloads: data sets come from packages (scikit-learn's digits), are
generated (synthetic), are read from a local folder the user names, or are made by the
user's own code (``data.factory``, :func:`load_dataset` says what it must return).  How a
rank gets its batches of a data set (the tensor path or a DataLoader) is
:mod:`tula.engine.data`.  The loss is a built-in name or the user's own (:func:`build_loss`).
"""

from __future__ import annotations

import functools
import gzip
import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tula.core.errors import WorkloadError
from tula.core.registry import LOSS_NAMES, OPTIMIZER_NAMES
from tula.core.say import first_line, fmt_bytes
from tula.core.spec import DataSpec, JobSpec, ModelSpec, import_ref, in_memory_data_bytes
from tula.engine.batch import MODEL_LOSS, ModelLoss, forward, keys_text, model_loss, model_output
from tula.engine.checkpointing import apply_checkpointing
from tula.engine.data import MEAN_STD, Dataset, SampleView
from tula.engine.data_cache import data_cache_dir, write_cache_file
from tula.engine.gpu_knobs import channels_last_problem, to_memory_format
from tula.engine.memory import is_out_of_memory
from tula.engine.tiny_gpt import TinyGPT


# --------------------------------------------------------------------------- models
class SmallCNN(nn.Module):
    """A small CNN for small images (digits' 1x8x8 by default)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * width, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class SmallCNN1d(nn.Module):
    """A small 1-D CNN for sequences (MNIST-1D's 1x40 by default)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(in_channels, width, 5, padding=2),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Conv1d(width, width, 3, padding=1),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(width, 2 * width, 3, padding=1),
            nn.BatchNorm1d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(4),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(8 * width, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def mlp(in_features: int = 64, hidden: int = 256, num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


BUILTIN_MODELS: dict[str, Callable[..., nn.Module]] = {
    "small_cnn": SmallCNN,
    "small_cnn1d": SmallCNN1d,
    "mlp": mlp,
    "tiny_gpt": TinyGPT,
}


#: prefix of a model name that is a pickled factory: ``pickle:/path/to/factory.pkl``
PICKLED_MODEL = "pickle:"


def _unpickle(path: str, what: str) -> Any:
    """The object in the cloudpickle file at ``path``; one sentence when it cannot be loaded."""
    import pickle

    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except Exception as err:  # noqa: BLE001 - a missing file, a class this process cannot rebuild
        raise WorkloadError(
            f"{what} {path!r} cannot be loaded here ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''})"
        ) from None


def _resolve_factory(name: str) -> Callable[..., nn.Module]:
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    if name.startswith(PICKLED_MODEL):  # written by cloudpickle (tula.sklearn, tula.Job), read where the ranks run
        return _unpickle(name[len(PICKLED_MODEL) :], "the pickled model factory")
    if ":" in name:  # the user's code: any failure to import it is one sentence, as for data.factory
        factory = import_path(name, "model.name")
        if not callable(factory):
            raise WorkloadError(f"model.name {name!r} is not callable (an object of type {type(factory).__name__})")
        return factory
    import torchvision.models as tvm

    if name in tvm.list_models():
        return lambda **kw: tvm.get_model(name, weights=None, **kw)
    raise WorkloadError(
        f"unknown model {name!r}: use a Tula built-in ({', '.join(BUILTIN_MODELS)}), "
        "a torchvision model name such as 'resnet18', an import path 'package.module:factory', "
        "or a pickled factory 'pickle:/path/factory.pkl'"
    )


def build_model(spec: ModelSpec) -> nn.Module:
    factory = _resolve_factory(spec.name)
    try:
        model = factory(**spec.kwargs)
    except TypeError as err:
        raise WorkloadError(f"model {spec.name!r} does not accept the arguments {spec.kwargs} ({err})") from None
    except Exception as err:  # noqa: BLE001 - the user's factory
        raise WorkloadError(f"model factory {spec.name!r} raised {_why(err)}") from None
    if not isinstance(model, nn.Module):
        raise WorkloadError(f"model factory {spec.name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


# --------------------------------------------------------------------------- data
def _split(
    x: torch.Tensor, y: torch.Tensor, test_fraction: float, seed: int
) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    n_test = max(1, int(round(len(x) * test_fraction)))
    te, tr = perm[:n_test], perm[n_test:]
    return torch.utils.data.TensorDataset(x[tr], y[tr]), torch.utils.data.TensorDataset(x[te], y[te])


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``load_digits`` returns them (``data`` float64 (1797, 64),
    ``target`` int), read from the file scikit-learn ships without importing
    ``sklearn.datasets``: that import (scipy and more) cost about 2 s of CPU in every command
    and in the ranks' fork server.  Falls back to ``load_digits`` where the file is not found."""
    spec = importlib.util.find_spec("sklearn")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, mode="rt", encoding="utf-8") as fh:
                data = np.loadtxt(fh, delimiter=",")
            return data[:, :-1], data[:, -1].astype(int, copy=False)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data, d.target


def _digits(spec: DataSpec, seed: int) -> Dataset:
    data, target = digits_arrays()
    x = torch.tensor(data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    x = (x - x.mean()) / x.std()
    y = torch.tensor(target, dtype=torch.long)
    tr, te = _split(x, y, spec.test_fraction, seed)
    return Dataset("digits", tr, te, (1, 8, 8), 10)


#: the arrays a generated MNIST-1D set is kept as in the cache
_MNIST1D_KEYS = ("x", "y", "x_test", "y_test")


def _read_cached(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a cache file, or None where it is missing or cannot be read whole."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in _MNIST1D_KEYS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def _write_cached(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` written to ``path`` whole or not at all (:func:`~tula.engine.data_cache.write_cache_file`)."""
    write_cache_file(path, lambda f: np.savez(f, allow_pickle=True, **arrays))


def mnist1d_arrays(num_samples: int, train_split: float, seed: int) -> dict[str, np.ndarray]:
    """MNIST-1D's ``x``, ``y``, ``x_test`` and ``y_test``, made by the mnist1d package from its
    templates (nothing is downloaded) and kept in :func:`data_cache_dir`.  Making them takes
    2-4 s of CPU on a small machine, in the command and again in every rank of every world
    (a change of the worker count starts a new one); from the cache it takes milliseconds.  A
    cache file that cannot be read is made again."""
    try:  # the package's templates and defaults are its version's
        version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    name = f"mnist1d-{version}-n{num_samples}-train{train_split:.6g}-seed{seed}.npz"
    path = data_cache_dir() / name
    cached = _read_cached(path)
    if cached is not None:
        return cached
    try:  # about 1-2 s of imports (scipy's interpolation among them): only to make the set
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as err:
        raise WorkloadError(f"data set 'mnist1d' needs the mnist1d package ({err})") from None
    args = get_dataset_args()
    args.num_samples, args.train_split, args.seed = num_samples, train_split, seed
    d = make_dataset(args)
    arrays = {k: np.asarray(d[k]) for k in _MNIST1D_KEYS}
    _write_cached(path, arrays)
    return arrays


def _mnist1d(spec: DataSpec, seed: int) -> Dataset:
    """MNIST-1D regenerated locally from the package's templates (:func:`mnist1d_arrays`)."""
    d = mnist1d_arrays(spec.num_samples, 1.0 - spec.test_fraction, seed)

    def tensors(x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(x, dtype=torch.float32).unsqueeze(1), torch.tensor(y, dtype=torch.long)

    tr = torch.utils.data.TensorDataset(*tensors(d["x"], d["y"]))
    te = torch.utils.data.TensorDataset(*tensors(d["x_test"], d["y_test"]))
    return Dataset("mnist1d", tr, te, (1, d["x"].shape[1]), 10)


def _text(spec: DataSpec, seed: int) -> Dataset:
    """Characters of Python's own standard-library sources, for next-character prediction
    (:func:`tula.engine.text_data.text_datasets`): ``num_samples`` sequences of ``sequence_length``."""
    from tula.engine.text_data import text_datasets

    try:
        sets = text_datasets(spec.sequence_length, spec.num_samples, spec.test_fraction, seed)
    except ValueError as err:
        raise WorkloadError(f"data set 'text': {err}") from None
    return Dataset("text", sets["train"], sets["test"], (spec.sequence_length,), sets["num_classes"])


def _synthetic(spec: DataSpec, seed: int) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.num_samples, *spec.sample_shape, generator=g)
    y = torch.randint(0, spec.num_classes, (spec.num_samples,), generator=g)
    tr, te = _split(x, y, spec.test_fraction, seed)
    return Dataset("synthetic", tr, te, tuple(spec.sample_shape), spec.num_classes)


def _arrays(spec: DataSpec, seed: int) -> Dataset:
    """The user's arrays from a ``.npz`` file (``data.path``): ``x``, ``y`` and optionally
    ``x_test``, ``y_test`` (may be empty: no held-out split) and ``num_classes``.  Integer
    ``y`` are class labels (``num_classes``: the entry, else the largest label + 1); float
    ``y`` are regression targets, made 2-D (``num_classes`` is then their number of outputs)."""

    if not spec.path:  # the spec's validation refuses this; a DataSpec built around it gets the same sentence
        raise WorkloadError("data set 'arrays' is read from a .npz file: set data.path to it")
    try:
        with np.load(spec.path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as err:
        raise WorkloadError(f"array file {spec.path!r} cannot be read as a .npz file ({err})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing or ("x_test" in arrays) != ("y_test" in arrays):
        raise WorkloadError(
            f"array file {spec.path!r} must hold arrays 'x' and 'y' (and 'x_test' with 'y_test'), "
            f"but it holds {sorted(arrays)}"
        )
    classes = np.issubdtype(arrays["y"].dtype, np.integer)

    def tensors(x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if len(x) != len(y):
            raise WorkloadError(f"array file {spec.path!r}: x has {len(x)} samples but y has {len(y)}")
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        if classes:
            return xt, torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64)).reshape(-1)
        yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
        return xt, yt.reshape(-1, 1) if yt.ndim == 1 else yt.flatten(1)

    x, y = tensors(arrays["x"], arrays["y"])
    if len(x) == 0:
        raise WorkloadError(f"array file {spec.path!r} holds no training samples")
    if "x_test" in arrays:
        tr = torch.utils.data.TensorDataset(x, y)
        te = torch.utils.data.TensorDataset(*tensors(arrays["x_test"], arrays["y_test"]))
    else:
        tr, te = _split(x, y, spec.test_fraction, seed)
    if classes:
        k = (
            int(arrays["num_classes"])
            if "num_classes" in arrays
            else int(max(int(t.tensors[1].max()) for t in (tr, te) if len(t)) + 1)
        )
    else:
        k = int(y.shape[1])
    return Dataset("arrays", tr, te, tuple(x.shape[1:]), k, seed=seed)


def _views(
    spec: DataSpec, seed: int, train: torch.utils.data.Dataset, test: torch.utils.data.Dataset
) -> tuple[SampleView, SampleView]:
    """The splits of an image set read from disk as :class:`~tula.engine.data.SampleView` views:
    normalised (``data.normalize``), the training split augmented (``data.augment``; no
    flip for MNIST's digits)."""
    mean, std = MEAN_STD[spec.name] if spec.normalize else (None, None)
    flip = spec.name != "mnist"
    return (
        SampleView(train, mean, std, augment=spec.augment, flip=flip, seed=seed),
        SampleView(test, mean, std, augment=False, seed=seed),
    )


def _torchvision(spec: DataSpec, seed: int) -> Dataset:
    import torchvision.datasets as tvd
    import torchvision.transforms as T

    classes = {
        "mnist": (tvd.MNIST, 10),
        "fashionmnist": (tvd.FashionMNIST, 10),
        "cifar10": (tvd.CIFAR10, 10),
        "cifar100": (tvd.CIFAR100, 100),
    }
    cls, k = classes[spec.name]
    try:
        tr = cls(spec.root, train=True, download=False, transform=T.ToTensor())
        te = cls(spec.root, train=False, download=False, transform=T.ToTensor())
    except RuntimeError as err:
        raise WorkloadError(
            f"data set {spec.name!r} is not under {spec.root!r} ({err}); Tula never downloads"
        ) from None
    shape = tuple(tr[0][0].shape)
    tr, te = _views(spec, seed, tr, te)
    return Dataset(spec.name, tr, te, shape, k, seed=seed, loader_workers=spec.loader_workers)


def _imagefolder(spec: DataSpec, seed: int) -> Dataset:
    import torchvision.datasets as tvd
    import torchvision.transforms as T

    size = spec.image_size or 64
    tf = T.Compose([T.Resize((size, size)), T.ToTensor()])
    try:
        full = tvd.ImageFolder(spec.root, transform=tf)
    except (FileNotFoundError, RuntimeError) as err:
        raise WorkloadError(f"image folder {spec.root!r} cannot be read ({err})") from None
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(full), generator=g).tolist()
    n_test = max(1, int(round(len(full) * spec.test_fraction)))
    shape = tuple(full[0][0].shape)
    tr, te = _views(
        spec, seed, torch.utils.data.Subset(full, perm[n_test:]), torch.utils.data.Subset(full, perm[:n_test])
    )
    return Dataset("imagefolder", tr, te, shape, len(full.classes), seed=seed, loader_workers=spec.loader_workers)


# --------------------------------------------------------------------------- the user's own code
def _why(err: BaseException) -> str:
    """An exception as plain text for the end of a sentence: its type and first line."""
    line = first_line(err)
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


def import_path(path: str, field: str) -> Any:
    """The object at ``package.module:attribute`` (the attribute may be dotted), or in the
    cloudpickle file of ``pickle:PATH`` (what :class:`tula.Job` writes for a Python object);
    ``field`` is the spec field that names it, for the sentence when it cannot be loaded."""
    if path.startswith(PICKLED_MODEL):
        return _unpickle(path[len(PICKLED_MODEL) :], field)
    mod_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except Exception as err:  # noqa: BLE001 - importing runs the module's code: any failure is the user's to fix
        raise WorkloadError(f"{field} {path!r} cannot be imported ({_why(err)})") from None
    try:
        return functools.reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise WorkloadError(
            f"{field} {path!r} cannot be imported: module {mod_name!r} has no attribute {attr!r}"
        ) from None


#: the class a ``train.step`` must derive from (:class:`tula.engine.step.TrainStep`), by name: that module imports this one
STEP_BASE = ("tula.engine.step", "TrainStep")


def import_step_class(path: str | None) -> type | None:
    """The class ``train.step`` names (``None``: the built-in one); one sentence when it cannot be
    imported or is not a subclass of :class:`tula.engine.step.TrainStep`."""
    if path is None:
        return None
    obj = import_path(path, "train.step")
    if not isinstance(obj, type) or not any((c.__module__, c.__qualname__) == STEP_BASE for c in obj.__mro__):
        raise WorkloadError(
            f"train.step {path!r} is not a subclass of tula.engine.step.TrainStep (it is "
            f"{'the class ' + obj.__qualname__ if isinstance(obj, type) else 'an object of type ' + type(obj).__name__})"
        )
    return obj


def send_to_ranks(obj: Any, path: Path) -> str:
    """How the user's Python object ``obj`` (a model, data or loss factory) reaches the ranks:
    its import path when importing that finds it again (robust across hosts), else a
    cloudpickle file at ``path`` (:func:`pickle_for_ranks`)."""
    ref = import_ref(obj)
    return ref if ref is not None else pickle_for_ranks(obj, path)


def pickle_for_ranks(obj: Any, path: Path, like: Any = None, what: str | None = None) -> str:
    """``obj`` as a cloudpickle file at ``path`` that every rank loads (``pickle:PATH``).  The
    module of ``like`` (default: ``obj``) goes by value when it cannot be imported by its name
    (a script, a notebook, a file loaded by path), so the ranks need not import it.  One
    sentence naming ``what`` when cloudpickle cannot serialise it."""
    import cloudpickle

    cls = obj if like is None else like
    while isinstance(cls, functools.partial):  # its function's module is the one that matters
        cls = cls.func
    if not hasattr(cls, "__qualname__"):  # a callable object: its class's module
        cls = type(cls)
    home = sys.modules.get(getattr(cls, "__module__", "") or "")
    by_value = home is not None and home.__name__ != "__main__" and import_ref(cls) is None
    if by_value:
        cloudpickle.register_pickle_by_value(home)
    try:
        path.write_bytes(cloudpickle.dumps(obj))
    except Exception as err:  # noqa: BLE001 - what cloudpickle cannot serialise
        name = what or getattr(obj, "__name__", type(obj).__name__)
        raise WorkloadError(f"{name} cannot be pickled for the workers ({_why(err)})") from None
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(home)
    return PICKLED_MODEL + str(path)


#: what a data factory's mapping (or object) may hold; train and test are required
FACTORY_KEYS = ("train", "test", "num_classes", "collate_fn")
_TWO_SETS = "two map-style data sets, as (train, test) or a mapping with keys train and test"


def _factory_parts(path: str, result: Any) -> dict[str, Any]:
    """The parts of what the data factory at ``path`` returned (see :func:`_from_factory`)."""
    what = f"data factory {path!r}"
    if isinstance(result, torch.utils.data.Dataset):
        raise WorkloadError(f"{what} returned one data set ({type(result).__name__}); it must return {_TWO_SETS}")
    if isinstance(result, (tuple, list)):
        if len(result) != 2:
            raise WorkloadError(f"{what} returned {len(result)} values; it must return {_TWO_SETS}")
        parts = {"train": result[0], "test": result[1]}
    elif isinstance(result, Mapping):
        keys = [str(k) for k in result]
        if "train" not in keys or "test" not in keys or any(k not in FACTORY_KEYS for k in keys):
            raise WorkloadError(
                f"{what} returned a mapping with keys {', '.join(keys) or '(none)'}; it must have train and "
                "test, and may have num_classes and collate_fn"
            )
        parts = dict(result)
    elif hasattr(result, "train") and hasattr(result, "test"):
        parts = {k: getattr(result, k) for k in FACTORY_KEYS if hasattr(result, k)}
    else:
        raise WorkloadError(f"{what} returned {type(result).__name__}; it must return {_TWO_SETS}")
    for split in ("train", "test"):
        ds = parts[split]
        if (
            not isinstance(ds, torch.utils.data.Dataset)
            or isinstance(ds, torch.utils.data.IterableDataset)
            or not hasattr(ds, "__len__")
        ):
            raise WorkloadError(
                f"{what} returned {type(ds).__name__} as its {'training' if split == 'train' else 'test'} set, not a map-style "
                "torch.utils.data.Dataset (one with __len__ and __getitem__)"
            )
        try:
            parts[f"{split}_size"] = len(ds)
        except Exception as err:  # noqa: BLE001 - the user's __len__
            raise WorkloadError(f"the {split} set of {what} cannot give its length ({_why(err)})") from None
    k = parts.get("num_classes")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise WorkloadError(f"{what} gave num_classes {k!r}; it must be a positive integer (or left out)")
    if parts.get("collate_fn") is not None and not callable(parts["collate_fn"]):
        raise WorkloadError(
            f"{what} gave a collate_fn that is not callable (an object of type {type(parts['collate_fn']).__name__})"
        )
    if parts["train_size"] == 0:
        raise WorkloadError(f"the training set of {what} is empty")
    return parts


def _from_factory(spec: DataSpec, seed: int) -> Dataset:
    """The user's own data sets: ``data.factory`` called with ``data.kwargs``.

    The factory returns the training and test sets as map-style
    ``torch.utils.data.Dataset`` objects (``__len__`` and ``__getitem__``; the test set may be
    empty), either

    * as a tuple (or list) ``(train, test)``, or
    * as a mapping -- or an object with these attributes -- with keys ``train``, ``test``
      and optionally ``num_classes`` (a positive integer: the model's outputs are checked
      against it, and top-5 is reported above 5 classes) and ``collate_fn`` (a function
      making one batch ``(inputs, targets)`` of tensors from a list of samples; default:
      torch's ``default_collate``, which stacks ``(input, target)`` pairs of tensors,
      numbers or arrays).

    A sample may also be a dict of tensors (a Hugging Face-style ``input_ids``,
    ``attention_mask``, ``labels``): its batch is the dict, the targets inside, and the model
    gives its own loss (``train.loss: model``, :mod:`tula.engine.batch`); the sample shape is
    then ``input_ids``'s (else the first tensor's).

    It is called in the command's process and in every rank, so it must return the same
    sets every time (seed any randomness).  The sample shape is the first training
    sample's.  Both sets are viewed raw by :class:`~tula.engine.data.SampleView` and read
    through the same DataLoader path, per-rank slices, (seed, epoch) order and exact resume
    as the sets read from disk (``data.loader_workers`` processes per rank)."""
    path = str(spec.factory)
    make = import_path(path, "data.factory")
    if not callable(make):
        raise WorkloadError(f"data.factory {path!r} is not callable (an object of type {type(make).__name__})")
    try:
        result = make(**spec.kwargs)
    except Exception as err:  # noqa: BLE001 - the user's code: its error, as one sentence
        raise WorkloadError(f"data factory {path!r} raised {_why(err)}") from None
    parts = _factory_parts(path, result)
    collate = parts.get("collate_fn") or torch.utils.data.default_collate
    try:
        first = parts["train"][0]
    except Exception as err:  # noqa: BLE001 - the user's __getitem__
        raise WorkloadError(
            f"the training set of data factory {path!r} cannot give its first sample ({_why(err)})"
        ) from None
    try:
        batch = collate([first])
    except Exception as err:  # noqa: BLE001 - the user's samples or collate_fn
        raise WorkloadError(
            f"the first training sample of data factory {path!r} cannot be batched ({_why(err)}); a sample must "
            "be an (input, target) pair of tensors, numbers or arrays, or the factory must give a collate_fn"
        ) from None
    dict_batch = isinstance(batch, Mapping) and bool(batch) and all(isinstance(t, torch.Tensor) for t in batch.values())
    if not dict_batch and not (
        isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)
    ):
        if isinstance(batch, Mapping):
            got = f"a dict of keys {', '.join(map(str, batch)) or '(none)'} whose values are not all tensors"
        else:
            got = f"{len(batch)} values" if isinstance(batch, (tuple, list)) else type(batch).__name__
        raise WorkloadError(
            f"a batch of data factory {path!r}'s samples is {got}, not an (inputs, targets) pair of tensors "
            "or a dict of tensors"
        )
    k = parts.get("num_classes")
    if dict_batch:  # a Hugging Face-style batch (input_ids, labels, ...): the model scores itself
        x = batch.get("input_ids", next(iter(batch.values())))
        k = k or 0
    else:
        x, y = batch
    if k is None:  # not given: the outputs of a regression's targets (mse), else unknown (0)
        k = (int(y.shape[1]) if y.ndim == 2 else 1) if y.is_floating_point() else 0
    return Dataset(
        path,
        SampleView(parts["train"], seed=seed, raw=True),
        SampleView(parts["test"], seed=seed, raw=True),
        tuple(int(d) for d in x.shape[1:]),
        int(k),
        seed=seed,
        loader_workers=spec.loader_workers,
        collate_fn=parts.get("collate_fn"),
    )


def load_dataset(spec: DataSpec, seed: int = 0, memory_budget_bytes: int | None = None) -> Dataset:
    """The data set of ``spec`` with its data path's settings (``prefetch``,
    ``device_resident_share`` of ``memory_budget_bytes``: the job's ``search.memory_budget_bytes``,
    None for the GPU's memory).  A set that does not fit in this host's memory is the user's
    :class:`WorkloadError`, in one sentence."""
    make = {
        "factory": _from_factory,
        "digits": _digits,
        "mnist1d": _mnist1d,
        "text": _text,
        "synthetic": _synthetic,
        "imagefolder": _imagefolder,
        "arrays": _arrays,
    }.get(spec.name, _torchvision)
    try:
        data = make(spec, seed)
    except (MemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        held = in_memory_data_bytes(spec)
        size = f" of {fmt_bytes(held)}" if held is not None else ""
        raise WorkloadError(
            f"data set {spec.name!r}{size} does not fit in this host's memory ({_why(err)}); "
            "use fewer or smaller samples"
        ) from None
    data.prefetch, data.resident_share, data.memory_budget_bytes = (
        spec.prefetch, spec.device_resident_share, memory_budget_bytes
    )  # fmt: skip
    return data


def check_workload(spec: JobSpec) -> tuple[nn.Module, Dataset]:
    """Build the model, data, loss (and the user's optimiser) once and run a forward pass of two
    training samples and the loss on it, so that a mismatch is one clear sentence here rather than a traceback in
    every worker."""
    data = load_dataset(spec.data, spec.seed)
    model = build_model(spec.model)
    loss_fn = build_loss(spec.train.loss)
    try:
        x, y = data.batch(2, torch.Generator().manual_seed(0))  # a dict batch: (dict, None)
    except WorkloadError:
        raise
    except Exception as err:  # noqa: BLE001 - a sample the set cannot give, or cannot batch
        raise WorkloadError(f"two training samples of data set {data.name!r} cannot be read ({_why(err)})") from None
    if spec.train.channels_last:  # the rule of which inputs it lays out: tula.engine.gpu_knobs
        problem = channels_last_problem(tuple(x.shape[1:]) if isinstance(x, torch.Tensor) else data.sample_shape)
        if problem:
            raise WorkloadError(problem)
    model = to_memory_format(model, spec.train)  # checked as the ranks run it
    apply_checkpointing(model, spec.train, spec.model.name)  # no block to checkpoint: one sentence here
    if isinstance(loss_fn, ModelLoss):
        _check_model_loss(spec, data, model, x, y)
    else:
        if y is None:
            raise WorkloadError(
                f"data set {data.name!r} gives dict batches ({keys_text(x)}) with the targets inside, so the model "
                f"must give its own loss: set train.loss to 'model', not {spec.train.loss!r}"
            )
        try:
            out = forward(model, x)
        except Exception as err:  # noqa: BLE001 - any failure here is a mismatch the user must fix
            raise WorkloadError(
                f"model {spec.model.name!r} cannot take {data.name} samples of {keys_text(x)} ({_why(err)})"
            ) from None
        if spec.train.loss in LOSS_NAMES:
            _check_builtin_loss(spec, data, out, y)
        _check_loss_value(spec.train.loss, loss_fn, out, y)
    if spec.optimizer.name not in OPTIMIZER_NAMES:
        build_optimizer(model, spec)  # the user's factory: one sentence here if it fails
    import_step_class(spec.train.step)  # the user's step class: one sentence here if it is not one
    return model, data


def _check_builtin_loss(spec: JobSpec, data: Dataset, out: Any, y: torch.Tensor) -> None:
    """Targets and outputs fit ``cross_entropy`` (class labels, one score per class) or ``mse``."""
    regression = y.dtype.is_floating_point
    if spec.train.loss == "mse":
        if not regression:
            raise WorkloadError(
                f"train.loss is 'mse' (regression), but the targets of data set {data.name!r} are "
                "class labels; use train.loss 'cross_entropy'"
            )
        if y.ndim > 2:
            raise WorkloadError(
                f"train.loss 'mse' scores targets of shape (samples, outputs), but data set {data.name!r} has "
                f"targets of shape {tuple(y.shape)}; give train.loss as 'torch.nn:MSELoss' for them"
            )
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(y.shape):
            raise WorkloadError(
                f"model {spec.model.name!r} gives outputs of shape {_shape(out)}, but the "
                f"regression targets have shape {tuple(y.shape)}; give the model "
                f"{y.shape[1] if y.ndim == 2 else 1} output(s)"
            )
        return
    if regression:
        raise WorkloadError(
            f"the targets of data set {data.name!r} are floats (regression), but train.loss is "
            "'cross_entropy'; use train.loss 'mse'"
        )
    # class scores per element (a sequence's tokens: outputs (n, C, L), targets (n, L)) are scored per element
    per_element = isinstance(out, torch.Tensor) and out.ndim > 2 and tuple(out.shape[2:]) == tuple(y.shape[1:])
    if not isinstance(out, torch.Tensor) or (out.ndim != 2 and not per_element) or out.shape[1] < data.num_classes:
        raise WorkloadError(
            f"model {spec.model.name!r} gives outputs of shape {_shape(out)}, but "
            f"{data.name} has {data.num_classes or 'integer-labelled'} classes; set model.kwargs.num_classes"
        )


def _check_model_loss(spec: JobSpec, data: Dataset, model: nn.Module, x: Any, y: Any) -> None:
    """``train.loss: model``: the model takes the batch (a dict as keywords, else with
    ``labels=targets``) and returns its own loss, a single floating-point number with a gradient."""
    how = f"{data.name} batches of {keys_text(x)}" + ("" if y is None or isinstance(x, Mapping) else " with labels")
    try:
        out = model_output(model, x, y)
    except Exception as err:  # noqa: BLE001 - a key the model's forward needs is missing, or another mismatch
        raise WorkloadError(f"model {spec.model.name!r} cannot take {how} ({_why(err)})") from None
    value = model_loss(out)
    if value is None:
        raise WorkloadError(
            f"train.loss is 'model', but model {spec.model.name!r} returned {type(out).__name__} with no loss on "
            f"{how}; return an output with .loss or a dict with 'loss' (give the batch its labels), or name a loss"
        )
    _check_loss_value(spec.train.loss, lambda o, t: value, out, y)


def _shape(out: Any) -> str:
    return str(tuple(out.shape)) if isinstance(out, torch.Tensor) else f"({type(out).__name__}, not a tensor)"


def _check_loss_value(name: str, loss_fn: Callable, out: Any, y: torch.Tensor) -> None:
    """The loss of one batch is a single number that depends on the model's outputs."""
    try:
        value = loss_fn(out, y)
    except Exception as err:  # noqa: BLE001 - the user's loss, or targets the loss cannot score
        raise WorkloadError(
            f"train.loss {name!r} cannot score the model's outputs of shape {_shape(out)} against targets "
            f"of shape {tuple(y.shape)} ({_why(err)})"
        ) from None
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.is_floating_point():
        got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise WorkloadError(
            f"train.loss {name!r} returned {got}, not a single floating-point tensor (reduce it over the batch, "
            "e.g. with its mean)"
        )
    if not value.requires_grad:
        raise WorkloadError(f"train.loss {name!r} does not depend on the model's outputs (no gradient flows back)")


def _loss_itself(fn: Callable) -> bool:
    """Whether ``fn`` is a loss function (two or more required positional parameters: output
    and target) rather than a factory of one (called with no arguments)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: take it as the loss
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is inspect.Parameter.empty]
    return len(required) >= 2 or any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)


def build_loss(name: str, device: torch.device | str | None = None) -> Callable:
    """The training loss ``train.loss`` names: a built-in (:data:`tula.core.registry.LOSSES`)
    or the user's ``package.module:loss`` -- an ``nn.Module`` class (any class) made with no
    arguments, a function of ``(output, target)`` used as it is, or a factory of no arguments
    returning such a callable.  A loss that is an ``nn.Module`` is moved to ``device`` (its
    parameters, if any, are not trained).  ``model``: the model's own loss
    (:class:`tula.engine.batch.ModelLoss`)."""
    if name == MODEL_LOSS:
        return ModelLoss()
    if name == "mse":
        return nn.MSELoss()
    if name == "cross_entropy":
        return nn.CrossEntropyLoss()
    obj = import_path(name, "train.loss")
    if isinstance(obj, type):
        try:
            loss = obj()
        except Exception as err:  # noqa: BLE001 - the user's constructor
            raise WorkloadError(f"loss class {name!r} cannot be made with no arguments ({_why(err)})") from None
    elif callable(obj) and _loss_itself(obj):
        loss = obj
    elif callable(obj):
        try:
            loss = obj()
        except Exception as err:  # noqa: BLE001 - the user's factory
            raise WorkloadError(f"loss factory {name!r} raised {_why(err)}") from None
    else:
        raise WorkloadError(
            f"train.loss {name!r} is not callable (an object of type {type(obj).__name__}); give an nn.Module "
            "class, a function of (output, target), or a factory returning one"
        )
    if not callable(loss):
        raise WorkloadError(
            f"loss factory {name!r} returned an object of type {type(loss).__name__}, which is not callable"
        )
    if isinstance(loss, nn.Module) and device is not None:
        loss = loss.to(device)
    return loss


def build_optimizer(model: nn.Module, spec: JobSpec, lr: float | None = None) -> torch.optim.Optimizer:
    """The spec's optimiser over ``model``'s parameters (``lr`` overrides the spec's LR): a
    built-in, or the user's factory called as ``factory(params, lr=lr, **optimizer.kwargs)``."""
    o = spec.optimizer
    lr = o.lr if lr is None else lr
    if o.name == "sgd":
        return torch.optim.SGD(
            model.parameters(),
            lr=lr,
            momentum=o.momentum,
            nesterov=o.nesterov and o.momentum > 0,
            weight_decay=o.weight_decay,
        )
    if o.name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=o.weight_decay)
    factory = import_path(o.name, "optimizer.name")
    if not callable(factory):
        raise WorkloadError(
            f"optimizer.name {o.name!r} is an object of type {type(factory).__name__}, not a factory "
            "called as factory(params, lr=LR, **kwargs)"
        )
    try:
        opt = factory(model.parameters(), lr=lr, **o.kwargs)
    except Exception as err:  # noqa: BLE001 - the user's factory
        raise WorkloadError(
            f"optimiser factory {o.name!r} raised {_why(err)} when called as factory(params, lr={lr:g}"
            + "".join(f", {k}={v!r}" for k, v in o.kwargs.items())
            + ")"
        ) from None
    if not isinstance(opt, torch.optim.Optimizer):
        raise WorkloadError(
            f"optimiser factory {o.name!r} returned an object of type {type(opt).__name__}, not a torch.optim.Optimizer"
        )
    own = {id(p) for p in model.parameters()}
    stepped = [p for g in opt.param_groups for p in g["params"]]
    if not stepped or any(id(p) not in own for p in stepped):
        raise WorkloadError(
            f"optimiser factory {o.name!r} returned an optimiser over "
            + ("no parameters" if not stepped else "parameters that are not the model's")
            + "; build it over the params it is given"
        )
    return opt
