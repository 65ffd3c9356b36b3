"""The search space's partial search (paper §III-A2) and its middle batch."""

from tula.core.space import Config, partial_configs
from tula.core.spec import SearchSpec


def test_partial_search_measures_the_extremes_and_with_middle_their_geometric_mean():
    search = SearchSpec(cluster_sizes=[1, 2, 4], min_batch=32, max_batch=1024)
    two = partial_configs(search, 5000, None)
    assert two == [Config(1, 32), Config(1, 1024), Config(4, 32), Config(4, 1024)]
    three = partial_configs(search, 5000, None, middle=True)
    assert three == [Config(1, 32), Config(1, 128), Config(1, 1024), Config(4, 32), Config(4, 128), Config(4, 1024)]


def test_the_middle_batch_respects_the_memory_bound_and_needs_three_candidates():
    search = SearchSpec(cluster_sizes=[1, 2], min_batch=32, max_batch=1024)
    bounded = partial_configs(search, 5000, 128, middle=True)  # local batch <= 128
    assert bounded == [Config(1, 32), Config(1, 64), Config(1, 128), Config(2, 32), Config(2, 64), Config(2, 256)]
    small = SearchSpec(cluster_sizes=[1], min_batch=32, max_batch=64)
    assert partial_configs(small, 5000, None, middle=True) == [Config(1, 32), Config(1, 64)]


def test_the_profile_adds_the_middle_batch_on_a_gpu_unless_the_spec_says():
    from tula.core.memory_model import MemoryModel
    from tula.core.spec import spec_from_dict
    from tula.engine.profile import select_configs

    mm = MemoryModel(1000, 1000, 1000, 0, 0, 100, 10, (2, 4), (4000, 4200), "cpu")
    search = {"cluster_sizes": [1], "min_batch": 32, "max_batch": 256}
    spec = spec_from_dict({"search": search})
    batches = lambda on_gpu, s=spec: [c.global_batch for c in select_configs(s, "partial", 5000, mm, None, on_gpu)[1]]  # noqa: E731
    assert batches(False) == [32, 256] and batches(True) == [32, 64, 256]
    off = spec_from_dict({"search": {**search, "partial_middle_batch": False}})
    on = spec_from_dict({"search": {**search, "partial_middle_batch": True}})
    assert batches(True, off) == [32, 256] and batches(False, on) == [32, 64, 256]
    assert len(select_configs(spec, "full", 5000, mm, None, True)[1]) == 4  # the full search: every candidate
