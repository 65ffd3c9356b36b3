import pytest
import torch

from tula.errors import WorkloadError
from tula.spec import spec_from_dict
from tula.workloads import build_model, check_workload, load_dataset


def test_digits_dataset_splits_and_shapes():
    spec = spec_from_dict({})
    data = load_dataset(spec.data, 0)
    assert data.sample_shape == (1, 8, 8) and data.num_classes == 10
    assert data.train_size + len(data.test) == 1797
    x, y = data.batch(32, torch.Generator().manual_seed(0))
    assert x.shape == (32, 1, 8, 8) and y.shape == (32,)
    x2, _ = data.batch(5000, torch.Generator().manual_seed(0))  # larger than the set: with replacement
    assert x2.shape[0] == 5000


def test_unknown_model_is_one_sentence():
    spec = spec_from_dict({"model": {"name": "resnet9000"}})
    with pytest.raises(WorkloadError, match="unknown model 'resnet9000'"):
        build_model(spec.model)


def test_torchvision_model_and_import_path():
    m = build_model(spec_from_dict({"model": {"name": "resnet18", "kwargs": {"num_classes": 10}}}).model)
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    m2 = build_model(spec_from_dict({"model": {"name": "tula.workloads:mlp", "kwargs": {"in_features": 64}}}).model)
    assert m2(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    with pytest.raises(WorkloadError, match="cannot be loaded"):
        build_model(spec_from_dict({"model": {"name": "nosuchpkg.mod:f"}}).model)


def test_mismatched_model_and_data_is_caught_before_launch():
    spec = spec_from_dict({"model": {"name": "mlp", "kwargs": {"in_features": 100}}})
    with pytest.raises(WorkloadError, match="cannot take digits samples of shape"):
        check_workload(spec)
    spec = spec_from_dict({"model": {"name": "small_cnn", "kwargs": {"num_classes": 3}}})
    with pytest.raises(WorkloadError, match="num_classes"):
        check_workload(spec)


def test_synthetic_dataset():
    spec = spec_from_dict({"data": {"name": "synthetic", "sample_shape": [3, 16, 16], "num_samples": 100,
                                    "num_classes": 5}})
    data = load_dataset(spec.data, 0)
    assert data.sample_shape == (3, 16, 16) and data.num_classes == 5 and data.train_size == 80
