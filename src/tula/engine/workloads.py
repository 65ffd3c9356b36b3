"""Model and data-set registry: turn a ModelSpec/DataSpec into a torch module and data.

Nothing here downloads: data sets come from packages (scikit-learn's digits), are
generated (synthetic), or are read from a local folder the user names.  How a rank gets
its batches of a data set (the tensor path or a DataLoader) is :mod:`tula.engine.data`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tula.core.errors import WorkloadError
from tula.core.spec import DataSpec, JobSpec, ModelSpec
from tula.engine.data import MEAN_STD, Dataset, SampleView


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


BUILTIN_MODELS: dict[str, Callable[..., nn.Module]] = {"small_cnn": SmallCNN, "small_cnn1d": SmallCNN1d, "mlp": mlp}


#: prefix of a model name that is a pickled factory: ``pickle:/path/to/factory.pkl``
PICKLED_MODEL = "pickle:"


def _resolve_factory(name: str) -> Callable[..., nn.Module]:
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    if name.startswith(PICKLED_MODEL):  # written by cloudpickle (tula.sklearn), read where the ranks run
        import pickle

        path = name[len(PICKLED_MODEL) :]
        try:
            with open(path, "rb") as fh:
                return pickle.load(fh)
        except Exception as err:  # noqa: BLE001 - a missing file, a class this process cannot rebuild
            raise WorkloadError(
                f"the pickled model factory {path!r} cannot be loaded here ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''})"
            ) from None
    if ":" in name:
        mod_name, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as err:
            raise WorkloadError(f"model import path {name!r} cannot be loaded ({err})") from None
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
    if not isinstance(model, nn.Module):
        raise WorkloadError(f"model factory {spec.name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


# --------------------------------------------------------------------------- data
def _split(x: torch.Tensor, y: torch.Tensor, test_fraction: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    n_test = max(1, int(round(len(x) * test_fraction)))
    te, tr = perm[:n_test], perm[n_test:]
    return torch.utils.data.TensorDataset(x[tr], y[tr]), torch.utils.data.TensorDataset(x[te], y[te])


def _digits(spec: DataSpec, seed: int) -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    x = (x - x.mean()) / x.std()
    y = torch.tensor(d.target, dtype=torch.long)
    tr, te = _split(x, y, spec.test_fraction, seed)
    return Dataset("digits", tr, te, (1, 8, 8), 10)


def _mnist1d(spec: DataSpec, seed: int) -> Dataset:
    """MNIST-1D regenerated locally from the package's templates (nothing is downloaded)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as err:
        raise WorkloadError(f"data set 'mnist1d' needs the mnist1d package ({err})") from None
    args = get_dataset_args()
    args.num_samples, args.train_split, args.seed = spec.num_samples, 1.0 - spec.test_fraction, seed
    d = make_dataset(args)

    def tensors(x, y):
        return torch.tensor(x, dtype=torch.float32).unsqueeze(1), torch.tensor(y, dtype=torch.long)

    tr = torch.utils.data.TensorDataset(*tensors(d["x"], d["y"]))
    te = torch.utils.data.TensorDataset(*tensors(d["x_test"], d["y_test"]))
    return Dataset("mnist1d", tr, te, (1, d["x"].shape[1]), 10)


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
    import numpy as np

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


def _views(spec: DataSpec, seed: int, train: torch.utils.data.Dataset, test: torch.utils.data.Dataset):
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
    te = torch.utils.data.Subset(full, perm[:n_test])
    tr = torch.utils.data.Subset(full, perm[n_test:])
    shape = tuple(full[0][0].shape)
    tr, te = _views(spec, seed, tr, te)
    return Dataset("imagefolder", tr, te, shape, len(full.classes), seed=seed, loader_workers=spec.loader_workers)


def load_dataset(spec: DataSpec, seed: int = 0) -> Dataset:
    if spec.name == "digits":
        return _digits(spec, seed)
    if spec.name == "mnist1d":
        return _mnist1d(spec, seed)
    if spec.name == "synthetic":
        return _synthetic(spec, seed)
    if spec.name == "imagefolder":
        return _imagefolder(spec, seed)
    if spec.name == "arrays":
        return _arrays(spec, seed)
    return _torchvision(spec, seed)


def check_workload(spec: JobSpec) -> tuple[nn.Module, Dataset]:
    """Build the model and data once and run a forward pass on two samples, so that a
    mismatch is one clear sentence here rather than a traceback in every worker."""
    data = load_dataset(spec.data, spec.seed)
    model = build_model(spec.model)
    x, y = data.batch(2, torch.Generator().manual_seed(0))
    try:
        out = model(x)
    except Exception as err:  # noqa: BLE001 - any failure here is a mismatch the user must fix
        from tula.core.say import first_line

        raise WorkloadError(
            f"model {spec.model.name!r} cannot take {data.name} samples of shape "
            f"{tuple(x.shape[1:])} ({type(err).__name__}: {first_line(err)})"
        ) from None
    regression = y.dtype.is_floating_point
    if spec.train.loss == "mse":
        if not regression:
            raise WorkloadError(
                f"train.loss is 'mse' (regression), but the targets of data set {data.name!r} are "
                "class labels; use train.loss 'cross_entropy'"
            )
        if tuple(out.shape) != tuple(y.shape):
            raise WorkloadError(
                f"model {spec.model.name!r} gives outputs of shape {tuple(out.shape)}, but the "
                f"regression targets have shape {tuple(y.shape)}; give the model "
                f"{y.shape[1]} output(s)"
            )
        return model, data
    if regression:
        raise WorkloadError(
            f"the targets of data set {data.name!r} are floats (regression), but train.loss is "
            "'cross_entropy'; use train.loss 'mse'"
        )
    if out.ndim != 2 or out.shape[1] < data.num_classes:
        raise WorkloadError(
            f"model {spec.model.name!r} gives outputs of shape {tuple(out.shape)}, but "
            f"{data.name} has {data.num_classes} classes; set model.kwargs.num_classes"
        )
    return model, data


def build_loss(name: str) -> nn.Module:
    """The training loss ``train.loss`` names (:data:`tula.core.registry.LOSSES`)."""
    if name == "mse":
        return nn.MSELoss()
    return nn.CrossEntropyLoss()


def build_optimizer(model: nn.Module, spec: JobSpec, lr: float | None = None) -> torch.optim.Optimizer:
    """The spec's optimiser over ``model``'s parameters (``lr`` overrides the spec's LR)."""
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
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=o.weight_decay)
