import subprocess

import pytest
import yaml

from tula.errors import SpecError
from tula.spec import JobSpec, load_spec, parse_bytes, spec_from_dict

from conftest import ROOT


def test_example_spec_loads():
    spec = load_spec(ROOT / "examples" / "digits_cnn.yaml")
    assert spec.data.name == "digits"
    assert spec.search.cluster_sizes == [1, 2]
    assert spec.objective == "knee"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_spec_validates_and_builds(path):
    from tula.workloads import check_workload

    spec = load_spec(path)
    model, data = check_workload(spec)
    assert data.train_size > spec.search.min_batch
    assert sum(p.numel() for p in model.parameters()) > 0
    assert spec.train.method == "ags"


def test_train_section_errors_are_named():
    with pytest.raises(SpecError, match="spec field 'train.method' is 'sgd', but it must be"):
        spec_from_dict({"train": {"method": "sgd"}})
    with pytest.raises(SpecError, match="train.ags.s_min"):
        spec_from_dict({"train": {"ags": {"s_min": 0}}})
    with pytest.raises(SpecError, match="unknown field 'train.ags.granulrity'"):
        spec_from_dict({"train": {"ags": {"granulrity": "tensor"}}})


def test_defaults_are_valid():
    spec = JobSpec()
    assert spec.collective == "ring" and spec.pricing.kind == "fixed"


def test_unknown_field_is_named():
    with pytest.raises(SpecError, match="unknown field 'search.min_btch'"):
        spec_from_dict({"search": {"min_btch": 4}})


def test_wrong_choice_names_field_and_allowed_values():
    with pytest.raises(SpecError) as e:
        spec_from_dict({"collective": "mesh"})
    msg = str(e.value)
    assert "'collective'" in msg and "'ring'" in msg and "'tree'" in msg


def test_bounds_are_checked():
    with pytest.raises(SpecError, match="max_batch"):
        spec_from_dict({"search": {"min_batch": 64, "max_batch": 32}})
    with pytest.raises(SpecError, match="search.cluster_sizes"):
        spec_from_dict({"search": {"cluster_sizes": [0, 2]}})
    with pytest.raises(SpecError, match="data.root"):
        spec_from_dict({"data": {"name": "cifar10"}})


def test_memory_budget_units():
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("2 GB") == 2 * 10**9
    spec = spec_from_dict({"search": {"memory_budget_bytes": "1GiB"}})
    assert spec.search.memory_budget_bytes == 2**30
    with pytest.raises(SpecError, match="memory_budget_bytes"):
        spec_from_dict({"search": {"memory_budget_bytes": "lots"}})


def test_not_a_mapping(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(p)


def test_cli_bad_spec_exits_2_with_one_sentence(tmp_path, tula_cmd):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"objective": "fastest"}))
    r = subprocess.run([*tula_cmd, "run", str(p), "--out", str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert "objective" in r.stderr and "'knee'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "o").exists()


def test_cli_missing_spec_exits_2(tmp_path, tula_cmd):
    r = subprocess.run([*tula_cmd, "profile", str(tmp_path / "nope.yaml")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert "does not exist" in r.stderr
