"""The method registry: one table that the spec, the runner, the CLI and the benchmarks read;
every training-configuration rule checked in one place, with one sentence each."""

import pytest
from helpers import assert_imports_no_torch

from tula.core.errors import SpecError
from tula.core.job_rules import check_train_config, smallest_batch_for
from tula.core.registry import METHOD_NAMES, METHODS, method_class, method_info
from tula.core.spec import METHODS as SPEC_METHODS
from tula.core.spec import spec_from_dict


def test_registry_and_spec_load_without_torch():
    assert_imports_no_torch("tula.core.registry", "tula.core.spec")


def test_the_spec_accepts_exactly_the_registered_methods():
    assert SPEC_METHODS == METHOD_NAMES == tuple(METHODS)
    for name in METHOD_NAMES:
        assert spec_from_dict({"train": {"method": name}}).train.method == name
    with pytest.raises(SpecError, match="spec field 'train.method' is 'sgd', but it must be 'ags', 'static'"):
        spec_from_dict({"train": {"method": "sgd"}})


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_entry_names_its_class(name):
    from tula.engine.optim.methods import Method

    cls = method_class(name)
    assert issubclass(cls, Method) and cls.name == name
    assert method_info(name).summary and "\n" not in method_info(name).summary


def test_an_unknown_method_is_one_sentence():
    with pytest.raises(SpecError, match="unknown training method 'sgd'; use one of ags, static, lbt"):
        method_class("sgd")


@pytest.mark.parametrize(
    "method, n, batch, sentence",
    [
        ("lbt", 0, 64, "the number of workers must be at least 1, not 0"),
        ("lbt", 2, 33, "global batch 33 does not split evenly over 2 workers"),
        ("lbt", 4, 2, "global batch 2 does not split evenly over 4 workers"),
        ("lbt", 2, 4096, "global batch 4096 is larger than the training set (1438 samples)"),
        ("ags", 2, 32, "train.ags.b_small (32) must be smaller than the global batch (32) for method 'ags'"),
        ("static", 1, 16, "train.ags.b_small (32) must be smaller than the global batch (16) for method 'static'"),
        (
            "adascale",
            1,
            64,
            "method 'adascale' estimates the gradient variance across workers and needs at least 2 workers, not 1",
        ),
    ],
)
def test_check_train_config_gives_one_sentence(method, n, batch, sentence):
    with pytest.raises(SpecError) as err:
        check_train_config(spec_from_dict({}), method, n, batch, 1438)
    assert str(err.value) == sentence


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_check_train_config_accepts_a_valid_configuration(method):
    check_train_config(spec_from_dict({}), method, 2, 64, 1438)


def test_smallest_batch_for_follows_the_constraints():
    spec = spec_from_dict({"train": {"ags": {"b_small": 32}}})
    assert smallest_batch_for("lbt", spec, 4) == 4
    assert smallest_batch_for("ags", spec, 4) == 36  # the first multiple of 4 above 32
    assert smallest_batch_for("static", spec, 3) == 33
    for method in METHOD_NAMES:  # the smallest batch passes the method's own check, one fewer worker-step fails
        smallest = smallest_batch_for(method, spec, 2)
        check_train_config(spec, method, 2, smallest, 1438)
        if smallest > 2:
            with pytest.raises(SpecError):
                check_train_config(spec, method, 2, smallest - 2, 1438)


def test_every_objective_has_a_rule_and_one_without_its_rule_is_refused_not_planned_as_the_knee(monkeypatch):
    """The objectives are one table (tula.core.registry.OBJECTIVES): each names the planner's rule
    that chooses for it; an entry whose rule the planner lacks raises instead of falling through."""
    import dataclasses

    from helpers import models_record

    from tula.core import plan as plan_mod
    from tula.core.perfmodel import PerfModel
    from tula.core.registry import OBJECTIVE_NAMES, OBJECTIVES

    assert set(OBJECTIVE_NAMES) == {"time", "cost", "knee", "time_to_accuracy", "cost_to_accuracy", "knee_to_accuracy"}
    assert all(o.rule in plan_mod.RULES for o in OBJECTIVES.values())
    assert [o.name for o in OBJECTIVES.values() if o.to_accuracy] == [
        n for n in OBJECTIVE_NAMES if n.endswith("_to_accuracy")
    ]
    models = models_record(PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6))
    assert plan_mod.make_plan(models, "time").objective == "time"
    monkeypatch.setitem(OBJECTIVES, "time", dataclasses.replace(OBJECTIVES["time"], rule="fastest_wins"))
    with pytest.raises(ValueError, match="objective 'time' has rule 'fastest_wins', which the planner has not"):
        plan_mod.make_plan(models, "time")


def test_the_cluster_kinds_are_one_table_that_the_spec_the_launchers_the_service_and_the_help_read(tmp_path):
    """tula.core.registry.CLUSTERS: each `where` has one kind; one that has none is refused in one
    sentence by the spec and by open_launcher (it used to be taken for a Dask cluster)."""
    from tula.core.registry import CLUSTERS, cluster_kind
    from tula.engine.launch.clusters import open_launcher
    from tula.service.admission import admit
    from tula.service.model_key import _cluster
    from tula.service.settings import ServiceSettings

    kinds = {w: cluster_kind(w).name for w in ("local", "dask", "tcp://10.0.0.1:8786", "slurm.yaml", "q.yml", "env")}
    assert kinds == {"local": "local", "dask": "dask", "tcp://10.0.0.1:8786": "scheduler", "slurm.yaml": "jobqueue",
                     "q.yml": "jobqueue", "env": "env"}  # fmt: skip
    assert [k.name for k in CLUSTERS.values() if k.fixed_world] == ["env"]
    assert [k.name for k in CLUSTERS.values() if k.submittable] == ["local", "dask"]
    assert (_cluster("dask"), _cluster("tcp://10.0.0.1:8786")) == ("single-host", "tcp://10.0.0.1:8786")
    with pytest.raises(SpecError, match=r"'slurm' is not a cluster: use local \(processes on this machine\), dask"):
        spec_from_dict({"cluster": {"where": "slurm"}})
    with pytest.raises(SpecError, match="'slurm' is not a cluster"), open_launcher(spec_from_dict({}), where="slurm"):
        pass
    with pytest.raises(SpecError, match="runs jobs on its own launcher \\(local or dask\\), not on a cluster"):
        admit({"cluster": {"where": "tcp://10.0.0.1:8786"}}, ServiceSettings(home=tmp_path))
    assert admit({"cluster": {"where": "dask"}}, ServiceSettings(home=tmp_path)).cluster.where == "dask"
