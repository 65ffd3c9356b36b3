import copy
import json

import pytest
import yaml
from helpers import damaged_bytes, json_values, mutation_site, other_types, run_tula
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tula import examples
from tula.core.errors import SpecError, TulaError
from tula.core.spec import JobSpec, load_spec, parse_bytes, spec_from_dict


def test_example_spec_loads():
    spec = load_spec(examples.path("digits"))
    assert spec.data.name == "digits"
    assert spec.search.cluster_sizes == [1, 2]
    assert spec.objective == "knee"


@pytest.mark.parametrize("path", [examples.path(name) for name in examples.names()], ids=lambda p: p.name)
def test_every_example_spec_validates_and_builds(path):
    from tula.engine.workloads import check_workload

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


def test_cli_bad_spec_exits_2_with_one_sentence(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"objective": "fastest"}))
    r = run_tula("run", p, "--out", tmp_path / "o", timeout=120)
    assert r.returncode == 2
    assert "objective" in r.stderr and "'knee'" in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "o").exists()


def test_cli_missing_spec_exits_2(tmp_path):
    r = run_tula("profile", tmp_path / "nope.yaml", timeout=120)
    assert r.returncode == 2
    assert "does not exist" in r.stderr


# --------------------------------------------------------------------------- damaged spec files
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FULL_SPEC = {  # every section set, so mutations reach every validator
    "name": "full",
    "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
    "data": {"name": "digits", "num_samples": 4096, "test_fraction": 0.2},
    "epochs": 3,
    "seed": 1,
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0005},
    "search": {
        "cluster_sizes": [1, 2],
        "min_batch": 16,
        "max_batch": 256,
        "batch_growth": 2,
        "memory_budget_bytes": "512MiB",
        "memory_safety": 0.1,
        "enforce_memory_cap": True,
    },
    "collective": "tree",
    "pricing": {"kind": "memory", "price_per_gb_hour": 0.15},
    "objective": "cost",
    "profile": {
        "warmup_steps": 1,
        "timed_steps": 3,
        "device": "cpu",
        "threads_per_worker": 1,
        "memory_probe_batches": [16, 32],
    },
    "train": {
        "method": "ags",
        "lr_milestones": [1, 2],
        "warmup_epochs": 1,
        "polo_switch_epoch": 1,
        "ags": {"delta": 0.5, "b_small": 32, "s_min": 0.1, "update_every": 4, "granularity": "element"},
    },
}


def _base_specs():
    specs = [FULL_SPEC]
    for name in examples.names():
        specs.append(yaml.safe_load(examples.path(name).read_text()))
    return specs


BASES = _base_specs()
yaml_values = json_values()


def _mutate(data, tree):
    """Delete a key, give a value another type, a random value of its type or any random value,
    or add a key, somewhere in ``tree`` (helpers.mutation_site)."""
    site = mutation_site(data, tree)
    if site is None:
        return
    node, key = site
    op = data.draw(st.sampled_from(["delete", "retype", "number", "random", "new key"]))
    if op == "delete":
        del node[key]
    elif op == "retype":
        node[key] = data.draw(st.sampled_from(other_types(node[key], 0.5, "12 GiB")))
    elif op == "number":
        node[key] = data.draw(st.integers() | st.floats())
    elif op == "random":
        node[key] = data.draw(yaml_values)
    elif isinstance(node, dict):
        node[data.draw(st.text(max_size=8))] = data.draw(yaml_values)


def assert_loads_or_one_sentence(path, raw: bytes):
    """``load_spec`` on ``raw``: a JobSpec that survives the round trip records make of it, or
    Tula's one sentence, never another exception."""
    path.write_bytes(raw)
    try:
        spec = load_spec(path)
    except SpecError as err:
        msg = str(err)
        assert len(msg.splitlines()) == 1 and "Traceback" not in msg, msg
        assert str(path) in msg or "field '" in msg or msg.startswith("the spec must be a YAML mapping"), msg
        return None
    except TulaError as err:  # pragma: no cover - a TulaError of the wrong kind is still a bug
        raise AssertionError(f"load_spec raised {type(err).__name__}, not SpecError: {err}") from None
    # every record embeds spec.to_dict() and validates it again on load
    assert json.dumps(spec_from_dict(spec.to_dict()).to_dict()) == json.dumps(spec.to_dict())
    return spec


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("specs")


@SETTINGS
@given(value=yaml_values)
def test_random_yaml_loads_or_is_one_sentence(scratch, value):
    assert_loads_or_one_sentence(scratch / "random.yaml", yaml.safe_dump(value).encode())


@SETTINGS
@given(data=st.data())
def test_mutated_specs_load_or_are_one_sentence(scratch, data):
    tree = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(data, tree)
    assert_loads_or_one_sentence(
        scratch / "mutated.yaml", yaml.safe_dump(tree, allow_unicode=data.draw(st.booleans())).encode()
    )


@SETTINGS
@given(data=st.data())
def test_truncated_or_byte_flipped_specs_load_or_are_one_sentence(scratch, data):
    raw = examples.path(data.draw(st.sampled_from(examples.names()))).read_bytes()
    assert_loads_or_one_sentence(scratch / "bytes.yaml", damaged_bytes(data, raw))


@pytest.mark.parametrize(
    "raw",
    [
        b"name: caf\xe9\n",
        b"\xff\xfe\x00n\x00a",
        b"seed: " + b"9" * 5000 + b"\n",
        b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    ],
    ids=["latin-1", "utf-16", "5000-digit-int", "nested-5000-deep"],
)
def test_spec_files_yaml_cannot_read_are_one_sentence(tmp_path, raw):
    """Bytes that are not UTF-8, an integer Python refuses to parse, nesting deeper than the
    recursion limit: each was a UnicodeDecodeError, ValueError or RecursionError traceback."""
    path = tmp_path / "spec.yaml"
    path.write_bytes(raw)
    with pytest.raises(SpecError, match="is not valid YAML") as e:
        load_spec(path)
    assert str(path) in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_key_with_a_line_break_stays_one_line(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text('search: {"min_\\nbatch": 4, "café": 1}\n')
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert str(e.value).startswith("unknown field 'search.min_\\nbatch'")  # shown escaped, on one line


@pytest.mark.parametrize("budget", [float("inf"), "1" + "0" * 400 + " GiB"], ids=["inf", "400-digit"])
def test_an_infinite_memory_budget_is_one_sentence(budget):
    with pytest.raises(SpecError, match="memory_budget_bytes"):
        spec_from_dict({"search": {"memory_budget_bytes": budget}})
