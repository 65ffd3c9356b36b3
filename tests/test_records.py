"""Records and checkpoints on load: every input either loads or is refused with Tula's one
sentence (:class:`~tula.core.errors.RecordError`: one line, no traceback, naming the file), never
another exception -- for each damaged record the issue names, and for random and mutated
records (hypothesis): keys deleted, values of another type, random values, the file cut
short, bytes flipped."""

import copy
import json
from dataclasses import asdict

import pytest
import torch
from helpers import damaged_bytes, json_values, memory_model, mutation_site, other_types, profile_record, tiny_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tula.core.errors import RecordError, TulaError
from tula.core.fit import fit_models
from tula.core.plan import make_plan
from tula.core.records import (
    MODELS_KIND,
    PLAN_KIND,
    PROFILE_KIND,
    RUN_KIND,
    TRAIN_KIND,
    VERSIONS,
    Trial,
    load_record,
    read_jsonl,
    save_record,
    validate_record,
)
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint, save_checkpoint

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- valid records
def _valid_records(spec_dict: dict) -> dict[str, dict]:
    """One valid record of every kind: a profile made by hand (as `tula profile` writes it),
    the models and plan the real fit and plan make of it, a training run and a run manifest."""
    spec = spec_from_dict(spec_dict).to_dict()
    mem = memory_model(
        param_bytes=4000,
        grad_bytes=4000,
        optimizer_state_bytes=4000,
        other_static_bytes=2000,
        activation_bytes_per_sample=19000,
        batch_bytes_per_sample=264,
        probe_local_batches=(16, 32),
        probe_peak_bytes=(322224, 630448),
    )

    def trial(n, b, t):
        return asdict(
            Trial(
                n,
                b,
                n * b,
                "ok",
                t_step_s=1.2 * t,
                t_compute_s=t,
                t_sync_s=0.2 * t,
                peak_mem_bytes=mem.predict_peak_bytes(b),
                timed_steps=3,
                step_times_s=[1.2 * t] * 3,
                compute_times_s=[t] * 3,
            )
        )

    trials = [trial(1, 16, 0.002), trial(1, 256, 0.024), trial(2, 8, 0.003), trial(2, 128, 0.015)]
    profile = profile_record(
        spec,
        trials,
        search="partial",
        model={"name": "small_cnn", "param_count": 1000, "grad_bytes": 4000},
        memory=mem.to_dict(),
        profiling_s=3.5,
        created="2025-01-01T00:00:00+0000",
    )
    models = fit_models(profile).to_json_dict()
    plan = make_plan(models).to_json_dict()
    epoch = {
        "epoch": 1,
        "steps": 11,
        "steps_done": 11,
        "global_batch": 128,
        "n_workers": 2,
        "lr": 0.05,
        "train_loss": 1.9,
        "epoch_time_s": 0.5,
        "test_loss": 1.5,
        "test_top1": 0.6,
        "test_top5": 0.9,
    }
    history = [epoch, {**epoch, "epoch": 2, "steps_done": 22, "train_loss": 1.2}]
    train = {
        "kind": TRAIN_KIND,
        "version": 1,
        "spec": spec,
        "method": "ags",
        "n_workers": 2,
        "requested_global_batch": 128,
        "global_batch": 128,
        "local_batch": 64,
        "steps_per_epoch": 11,
        "epochs": 2,
        "steps_done": 22,
        "resumed_from_epoch": None,
        "fallbacks": [],
        "history": history,
        "final": history[-1],
        "traces": {"delta": [None, 0.3], "scaled": [False, True]},
    }
    run = {
        "kind": RUN_KIND,
        "version": 1,
        "spec": spec,
        "search": "partial",
        "objective": "knee",
        "train": True,
        "created": "2025-01-01T00:00:00+0000",
    }
    recs = {PROFILE_KIND: profile, MODELS_KIND: models, PLAN_KIND: plan, TRAIN_KIND: train, RUN_KIND: run}
    return json.loads(json.dumps(recs))  # as a file holds them


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    tiny = tiny_spec(profile=False)
    recs = _valid_records(tiny)
    for kind, rec in recs.items():  # the base of every mutation is a record Tula reads back as it wrote it
        p = save_record(rec, tmp_path_factory.mktemp("valid") / "rec.json")
        assert load_record(p)["kind"] == kind
    return recs


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("scratch")


def assert_sentence(err: BaseException, *names: str) -> str:
    """``err`` is Tula's one sentence: a RecordError, one line, no traceback, naming one of ``names``."""
    assert isinstance(err, RecordError), f"{type(err).__name__}: {err}"
    msg = str(err)
    assert len(msg.splitlines()) == 1, msg
    assert "Traceback" not in msg and 'File "' not in msg, msg
    assert any(n in msg for n in names), f"{msg!r} names none of {names}"
    return msg


def assert_loads_or_one_sentence(path, raw: bytes):
    path.write_bytes(raw)
    try:
        return load_record(path)
    except RecordError as err:
        assert_sentence(err, str(path))
        return None


# --------------------------------------------------------------------------- the damaged records the issue names
def _write(path, rec) -> str:
    path.write_text(json.dumps(rec))
    return str(path)


@pytest.mark.parametrize(
    "kind, key",
    [
        (MODELS_KIND, "spec"),
        (MODELS_KIND, "perf"),
        (PLAN_KIND, "spec"),
        (PROFILE_KIND, "trials"),
        (TRAIN_KIND, "history"),
    ],
)
def test_a_record_missing_a_key_names_the_file_and_the_key(records, tmp_path, kind, key):
    rec = copy.deepcopy(records[kind])
    del rec[key]
    path = _write(tmp_path / "rec.json", rec)
    with pytest.raises(RecordError) as e:
        load_record(path)
    msg = assert_sentence(e.value, path)
    assert f"field '{key}' is missing" in msg


def test_a_memory_model_missing_its_probe_batches_is_named(records, tmp_path):
    for kind in (PROFILE_KIND, MODELS_KIND):
        rec = copy.deepcopy(records[kind])
        del rec["memory"]["probe_local_batches"]
        path = _write(tmp_path / f"{kind}.json", rec)
        with pytest.raises(RecordError) as e:
            load_record(path)
        msg = assert_sentence(e.value, path)
        assert "memory" in msg and "probe_local_batches" in msg


def test_an_ok_trial_without_its_step_time_is_named(records, tmp_path):
    rec = copy.deepcopy(records[PROFILE_KIND])
    del rec["trials"][1]["t_step_s"]
    path = _write(tmp_path / "profile.json", rec)
    with pytest.raises(RecordError) as e:
        load_record(path)
    assert "trial 1 is 'ok' but lacks its measured times" in assert_sentence(e.value, path)


def test_truncated_json_is_named(records, tmp_path):
    path = tmp_path / "models.json"
    raw = json.dumps(records[MODELS_KIND]).encode()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(RecordError) as e:
        load_record(path)
    assert "not valid JSON, perhaps truncated" in assert_sentence(e.value, str(path))


@pytest.mark.parametrize(
    "content",
    [
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe",
        b"name: a yaml spec\n",
        b"",
        b"PK\x03\x04 a zip (torch.save) file",
    ],
    ids=["png", "yaml", "empty", "zip"],
)
def test_a_file_that_is_not_json_is_named(tmp_path, content):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    with pytest.raises(RecordError) as e:
        load_record(path)
    assert "is not" in assert_sentence(e.value, str(path))


@pytest.mark.parametrize(
    "foreign",
    [
        {"name": "left-pad", "version": "1.3.0"},
        [1, 2, 3],
        "tula.plan",
        42,
        None,
        {"kind": "tula.checkpoint2", "version": 1},
        {"kind": 7},
    ],
    ids=["package-json", "list", "string", "number", "null", "unknown-kind", "kind-not-text"],
)
def test_a_foreign_json_file_is_named(tmp_path, foreign):
    path = _write(tmp_path / "models.json", foreign)
    with pytest.raises(RecordError) as e:
        load_record(path)
    msg = assert_sentence(e.value, path)
    assert "not a Tula record" in msg or "unknown kind" in msg


@pytest.mark.parametrize("kind", [PROFILE_KIND, MODELS_KIND, PLAN_KIND, TRAIN_KIND, RUN_KIND])
def test_a_record_from_a_newer_version_asks_for_an_upgrade(records, tmp_path, kind):
    rec = dict(records[kind], version=VERSIONS[kind] + 1)
    path = _write(tmp_path / "rec.json", rec)
    with pytest.raises(RecordError) as e:
        load_record(path)
    msg = assert_sentence(e.value, path)
    assert f"version {VERSIONS[kind] + 1}" in msg and "upgrade Tula" in msg


def test_a_record_of_the_wrong_kind_says_which_is_needed(records, tmp_path):
    path = _write(tmp_path / "plan.json", records[PLAN_KIND])
    with pytest.raises(RecordError) as e:
        load_record(path, expect=(MODELS_KIND,))
    assert "is a plan record, but a models record is needed here" in assert_sentence(e.value, path)
    assert load_record(path, expect=(PLAN_KIND, MODELS_KIND))["choice"] == records[PLAN_KIND]["choice"]


def test_missing_file_and_directory_are_named(tmp_path):
    for path, words in ((tmp_path / "nope.json", "does not exist"), (tmp_path, "is a directory")):
        with pytest.raises(RecordError) as e:
            load_record(path)
        assert words in assert_sentence(e.value, str(path))


def test_a_damaged_metrics_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = {
        "epoch": 1,
        "steps": 5,
        "steps_done": 5,
        "global_batch": 64,
        "n_workers": 2,
        "lr": 0.1,
        "train_loss": 2.0,
        "epoch_time_s": 0.1,
        "test_loss": 1.9,
        "test_top1": 0.4,
    }
    path.write_text(json.dumps(good) + "\n" + json.dumps(good)[:30] + "\n")
    with pytest.raises(RecordError) as e:
        read_jsonl(path)
    assert "line 2" in assert_sentence(e.value, str(path))


def test_a_key_with_a_line_break_stays_on_one_line(records, tmp_path):
    rec = copy.deepcopy(records[MODELS_KIND])
    rec["fit_error"]["two\nlines"] = "not a number"
    path = _write(tmp_path / "models.json", rec)
    with pytest.raises(RecordError) as e:
        load_record(path)
    assert "field 'fit_error.two\\nlines'" in assert_sentence(e.value, path)


@pytest.mark.parametrize(
    "raw",
    [b'{"kind": "tula.plan", "version": ' + b"9" * 5000 + b"}", b"[" * 100000],
    ids=["5000-digit-number", "nested-100000-deep"],
)
def test_json_python_refuses_to_parse_is_named(tmp_path, raw):
    """Python's JSON reader raises ValueError (not JSONDecodeError) for an integer of more than
    4300 digits and RecursionError for deep nesting: each was a traceback."""
    path = tmp_path / "plan.json"
    path.write_bytes(raw)
    with pytest.raises(RecordError) as e:
        load_record(path)
    assert "is not" in assert_sentence(e.value, str(path))
    path.write_bytes(raw + b"\n")
    with pytest.raises(RecordError) as e:  # a metrics line too
        read_jsonl(path)
    assert "line 1" in assert_sentence(e.value, str(path))


@pytest.mark.parametrize(
    "kind, section, key",
    [
        (PROFILE_KIND, "memory", "batch_bytes_per_sample"),
        (MODELS_KIND, "perf", "c0"),
        (MODELS_KIND, "memory", "param_bytes"),
    ],
)
def test_a_record_that_loads_can_be_used_by_the_next_stage(records, tmp_path, kind, section, key):
    rec = copy.deepcopy(records[kind])
    rec[section][key] = str(rec[section][key])
    path = _write(tmp_path / "rec.json", rec)
    try:
        loaded = load_record(path)
    except RecordError as err:  # refusing it is right too
        assert_sentence(err, path)
        return
    # it loaded, so the next stage uses it: a plan, not an error of the fit or the planner
    plan = make_plan(fit_models(loaded) if kind == PROFILE_KIND else loaded)
    assert plan.choice.n_workers >= 1 and plan.choice.global_batch >= 1, plan.choice


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("value", [-1.0, 0.0, float("nan")], ids=["negative", "zero", "nan"])
def test_an_ok_trial_with_an_impossible_time_is_named(records, tmp_path, value):
    rec = copy.deepcopy(records[PROFILE_KIND])
    rec["trials"][0]["t_compute_s"] = value
    path = _write(tmp_path / "profile.json", rec)
    try:
        loaded = load_record(path)
    except RecordError as err:
        assert "trial 0" in assert_sentence(err, path) and "t_compute_s" in str(err), str(err)
        return
    # loaded: then the fit must name it -- a fit that goes on with it is the failure
    with pytest.raises(TulaError) as e:
        fit_models(loaded)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "t_compute_s" in msg and "Traceback" not in msg, msg


def test_a_record_tula_would_not_read_back_is_not_written(records, tmp_path):
    rec = copy.deepcopy(records[MODELS_KIND])
    rec["perf"]["c1"] = "fast"
    with pytest.raises(RecordError, match="perf"):
        save_record(rec, tmp_path / "models.json")
    assert not (tmp_path / "models.json").exists()


# --------------------------------------------------------------------------- random and mutated records
VALUES = json_values()


def _mutate(data, rec):
    """Delete a key, give a value another type or a random value, somewhere in ``rec``
    (helpers.mutation_site: top-level fields are hit often)."""
    site = mutation_site(data, rec)
    if site is None:
        return
    node, key = site
    op = data.draw(st.sampled_from(["delete", "retype", "random", "number"]))
    if op == "delete":
        del node[key]
    elif op == "number":  # the same type, a random value: negative, zero, huge, nan, inf
        node[key] = data.draw(st.integers() if isinstance(node[key], int) else st.floats())
    elif op == "retype":
        node[key] = data.draw(st.sampled_from(other_types(node[key])))
    else:
        node[key] = data.draw(VALUES)


@SETTINGS
@given(value=VALUES)
def test_random_json_is_refused_with_one_sentence(scratch, value):
    assert assert_loads_or_one_sentence(scratch / "random.json", json.dumps(value).encode()) is None


@SETTINGS
@given(
    kind=st.sampled_from(sorted(VERSIONS)),
    version=st.integers(-2, 3) | VALUES,
    extra=st.dictionaries(
        st.sampled_from(
            ["spec", "trials", "memory", "perf", "choice", "history", "search", "objective", "configurations", "model"]
        ),
        VALUES,
        max_size=4,
    ),
)
def test_random_fields_under_a_tula_kind_load_or_are_refused(scratch, kind, version, extra):
    assert_loads_or_one_sentence(
        scratch / "kinded.json", json.dumps({"kind": kind, "version": version, **extra}).encode()
    )


@SETTINGS
@given(data=st.data())
def test_mutated_records_load_or_are_refused(records, scratch, data):
    kind = data.draw(st.sampled_from(sorted(records)))
    rec = copy.deepcopy(records[kind])
    for _ in range(data.draw(st.integers(1, 3))):
        _mutate(data, rec)
    loaded = assert_loads_or_one_sentence(scratch / "mutated.json", json.dumps(rec).encode())
    if loaded is not None:
        assert loaded["kind"] == rec["kind"]


@SETTINGS
@given(data=st.data())
def test_truncated_or_byte_flipped_records_load_or_are_refused(records, scratch, data):
    kind = data.draw(st.sampled_from(sorted(records)))
    raw = json.dumps(records[kind], indent=1).encode()
    assert_loads_or_one_sentence(scratch / "bytes.json", damaged_bytes(data, raw))


# --------------------------------------------------------------------------- checkpoints
def _state(epoch: int) -> dict:
    torch.manual_seed(epoch)
    return {
        "epoch": epoch,
        "steps_done": 11 * epoch,
        "method": "lbt",
        "global_batch": 128,
        "n_workers": 2,
        "fallbacks": [],
        "history": [],
        "model": {"w": torch.randn(4, 3), "b": torch.zeros(3)},
        "method_state": {"optimizer": {"state": {}, "param_groups": []}, "extra": {}},
        "torch_rng": torch.get_rng_state(),
    }


def _two_checkpoints(out):
    save_checkpoint(_state(1), out)
    save_checkpoint(_state(2), out)
    return out / CHECKPOINT, out / PREVIOUS


def test_the_latest_checkpoint_loads_and_the_one_before_is_kept(tmp_path):
    current, previous = _two_checkpoints(tmp_path)
    assert current.exists() and previous.exists()
    state = load_checkpoint(tmp_path)
    assert state["epoch"] == 2 and torch.equal(state["model"]["w"], _state(2)["model"]["w"])
    save_checkpoint(_state(3), tmp_path)  # only the last two are kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CHECKPOINT, PREVIOUS])
    current.rename(tmp_path / "moved")
    assert load_checkpoint(tmp_path)["epoch"] == 2  # killed between the two renames: the previous is the latest


def _truncate(path):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 100])


def _flip(path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage, why", [(_truncate, "cut short"), (_flip, "checksum does not match")], ids=["truncated", "byte-flipped"]
)
def test_a_damaged_checkpoint_points_at_the_previous_one(tmp_path, damage, why):
    current, previous = _two_checkpoints(tmp_path)
    damage(current)
    with pytest.raises(RecordError) as e:
        load_checkpoint(tmp_path)
    msg = assert_sentence(e.value, str(current))
    assert why in msg
    assert f"the previous checkpoint {previous} (epoch 1) is intact" in msg
    assert current.exists() and previous.exists()  # nothing deleted: the user decides


@pytest.mark.parametrize(
    "damage, why", [(_truncate, "cut short"), (_flip, "checksum does not match")], ids=["truncated", "byte-flipped"]
)
def test_a_damaged_checkpoint_without_a_previous_one_cannot_be_resumed(tmp_path, damage, why):
    save_checkpoint(_state(1), tmp_path)
    damage(tmp_path / CHECKPOINT)
    with pytest.raises(RecordError) as e:
        load_checkpoint(tmp_path)
    msg = assert_sentence(e.value, str(tmp_path / CHECKPOINT))
    assert why in msg and "no earlier checkpoint is kept, so this run cannot be resumed" in msg


def test_both_checkpoints_damaged_cannot_be_resumed(tmp_path):
    current, previous = _two_checkpoints(tmp_path)
    _truncate(current)
    _flip(previous)
    with pytest.raises(RecordError) as e:
        load_checkpoint(tmp_path)
    assert "is damaged too, so this run cannot be resumed" in assert_sentence(e.value, str(current))


def test_foreign_and_headerless_checkpoints_are_refused(tmp_path):
    torch.save(_state(1), tmp_path / CHECKPOINT)  # a plain torch file, as older Tula wrote
    with pytest.raises(RecordError) as e:
        load_checkpoint(tmp_path)
    assert "not a Tula checkpoint" in assert_sentence(e.value, str(tmp_path / CHECKPOINT))
    (tmp_path / CHECKPOINT).unlink()
    with pytest.raises(RecordError) as e:
        load_checkpoint(tmp_path)
    assert "there is no checkpoint" in assert_sentence(e.value, str(tmp_path))


@pytest.mark.parametrize(
    "change, words",
    [
        ({"method": None}, "field 'method'"),
        ({"epoch": -1}, "field 'epoch'"),
        ({"version": 99}, "version 99"),
        ({"model": None}, None),
    ],
    ids=["method", "epoch", "newer", "no-model"],
)
def test_a_checkpoint_with_a_bad_header_field_is_named(tmp_path, change, words):
    state = _state(1)
    for k, v in change.items():
        if v is None:
            del state[k]
        else:
            state[k] = v
    save_checkpoint(state, tmp_path)
    with pytest.raises(RecordError) as e:
        load_checkpoint(tmp_path)
    msg = assert_sentence(e.value, str(tmp_path / CHECKPOINT))
    assert (words or "has no 'model'") in msg


@SETTINGS
@given(data=st.data())
def test_any_truncation_or_byte_flip_of_a_checkpoint_is_caught(tmp_path_factory, data):
    out = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(_state(1), out)
    path = out / CHECKPOINT
    raw = bytearray(path.read_bytes())
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    path.write_bytes(bytes(raw))
    try:
        state = load_checkpoint(out)
    except RecordError as err:
        assert_sentence(err, str(path))
    else:  # a flip that kept it a valid checkpoint (a header digit) must not change what it holds
        assert state["epoch"] == 1 and torch.equal(state["model"]["w"], _state(1)["model"]["w"])


def test_tula_errors_are_one_family():
    assert issubclass(RecordError, TulaError)
    with pytest.raises(RecordError, match="^a list is not a Tula record"):
        validate_record([], "a list")
