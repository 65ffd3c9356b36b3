import pytest
import torch

from tula.core.errors import WorkloadError
from tula.core.spec import spec_from_dict
from tula.engine.workloads import build_model, check_workload, load_dataset


def test_digits_dataset_splits_and_shapes():
    spec = spec_from_dict({})
    data = load_dataset(spec.data, 0)
    assert data.sample_shape == (1, 8, 8) and data.num_classes == 10
    assert data.train_size + len(data.test) == 1797
    x, y = data.batch(32, torch.Generator().manual_seed(0))
    assert x.shape == (32, 1, 8, 8) and y.shape == (32,)
    x2, y2 = data.batch(5000, torch.Generator().manual_seed(0))  # larger than the set: with replacement
    assert x2.shape[0] == 5000
    # every row is a training sample with its label, and 5000 draws from 1438 repeat samples
    x_all, y_all = data.train.tensors
    labels_of: dict[tuple, set[int]] = {}
    for r, c in zip(x_all.flatten(1), y_all):
        labels_of.setdefault(tuple(r.tolist()), set()).add(int(c))
    drawn = [tuple(r.tolist()) for r in x2.flatten(1)]
    assert all(r in labels_of for r in drawn), "a drawn sample is not one of the training set's"
    assert all(int(c) in labels_of[r] for r, c in zip(drawn, y2))
    assert len(set(drawn)) < 5000 and len(set(drawn)) > len(labels_of) // 2  # repeats, across the set


def test_digits_are_read_as_scikit_learn_loads_them_without_its_data_sets_module():
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits

    from tula.engine.workloads import digits_arrays

    data, target = digits_arrays()
    d = load_digits()
    assert data.dtype == d.data.dtype and target.dtype == d.target.dtype
    assert np.array_equal(data, d.data) and np.array_equal(target, d.target)
    # a fresh process that loads the set never imports sklearn.datasets (scipy and more: seconds)
    code = "import sys; from tula.engine.workloads import digits_arrays; digits_arrays(); print('sklearn.datasets' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr


def test_unknown_model_is_one_sentence():
    spec = spec_from_dict({"model": {"name": "resnet9000"}})
    with pytest.raises(WorkloadError, match="unknown model 'resnet9000'"):
        build_model(spec.model)


def test_torchvision_model_and_import_path():
    m = build_model(spec_from_dict({"model": {"name": "resnet18", "kwargs": {"num_classes": 10}}}).model)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    m2 = build_model(
        spec_from_dict({"model": {"name": "tula.engine.workloads:mlp", "kwargs": {"in_features": 64}}}).model
    )
    assert m2(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    with pytest.raises(WorkloadError, match="model.name 'nosuchpkg.mod:f' cannot be imported"):
        build_model(spec_from_dict({"model": {"name": "nosuchpkg.mod:f"}}).model)


def test_mismatched_model_and_data_is_caught_before_launch():
    spec = spec_from_dict({"model": {"name": "mlp", "kwargs": {"in_features": 100}}})
    with pytest.raises(WorkloadError, match="cannot take digits samples of shape"):
        check_workload(spec)
    spec = spec_from_dict({"model": {"name": "small_cnn", "kwargs": {"num_classes": 3}}})
    with pytest.raises(WorkloadError, match="num_classes"):
        check_workload(spec)


def test_synthetic_dataset():
    spec = spec_from_dict(
        {"data": {"name": "synthetic", "sample_shape": [3, 16, 16], "num_samples": 100, "num_classes": 5}}
    )
    data = load_dataset(spec.data, 0)
    assert data.sample_shape == (3, 16, 16) and data.num_classes == 5 and data.train_size == 80


def _write_idx(path, arr):
    """An MNIST idx file (unsigned bytes, big-endian dimensions)."""
    import struct

    path.write_bytes(bytes([0, 0, 8, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape) + arr.tobytes())


def test_mnist_from_disk_is_normalised_and_augmented_without_flips(tmp_path):
    import numpy as np

    from tula.engine.data import DataPath, augment_image, sample_key

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 30), ("t10k", 10)):
        _write_idx(raw / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        _write_idx(raw / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, (n,), dtype=np.uint8))
    spec = spec_from_dict({"seed": 5, "data": {"name": "mnist", "root": str(tmp_path), "augment": True}})
    data = load_dataset(spec.data, 5)
    assert not data.in_memory and data.train_size == 30 and data.test_size == 10 and data.sample_shape == (1, 28, 28)
    assert data.loader_workers == 2
    plain = torch.from_numpy(np.fromfile(raw / "train-images-idx3-ubyte", np.uint8)[16:].reshape(30, 1, 28, 28))
    plain = plain.float() / 255
    x, y = data.train[7]  # evaluation's view: normalised, not augmented
    assert torch.allclose(x, (plain[7] - 0.1307) / 0.3081, atol=1e-6) and isinstance(y, int)
    for epoch in range(3):  # training's view: cropped, never flipped (digits are not mirror images)
        want = (augment_image(plain[7], sample_key(5, epoch, 7), flip=False) - 0.1307) / 0.3081
        assert torch.allclose(data.train[(epoch, 7)][0], want, atol=1e-6)
    with DataPath(data, "cpu", workers=2) as path:
        xe, ye = next(path.eval_batches(0, 1, 10))
    assert torch.equal(xe, data.take(torch.arange(10), "test")[0]) and ye.dtype == torch.int64
    raw_off = load_dataset(spec_from_dict({"data": {"name": "mnist", "root": str(tmp_path), "normalize": False}}).data)
    assert torch.equal(raw_off.train[7][0], plain[7])


def test_missing_torchvision_set_is_one_sentence(tmp_path):
    spec = spec_from_dict({"data": {"name": "cifar10", "root": str(tmp_path)}})
    with pytest.raises(WorkloadError, match="Tula never downloads"):
        load_dataset(spec.data)
