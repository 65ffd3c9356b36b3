"""The typed, frozen records of :mod:`tula.core.records` (#43): every kind round-trips object -> JSON ->
object equal, the JSON it writes back keeps what the file said, stored files of today's format and a
version-1 plan load, a damaged field is one sentence naming the file and the field, and the objects
are frozen.

``tests/data/records/`` holds real records of ``tula run`` of the tiny spec (``helpers.tiny_spec`` with
``max_batch: 64`` and 1 epoch: profile, models, plan, run manifest; the training run's ``train.json``
and ``metrics.jsonl`` are of the tiny spec as it is), and ``plan_v1.json``: that plan with what version
2 added taken out (``constraints``, ``spot_comparison``, each row's ``meets_constraints``), as
:data:`tula.core.records.CHANGES` documents it.
"""

from __future__ import annotations

import json
import math
from dataclasses import FrozenInstanceError
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tula.core.errors import RecordError
from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import PerfModel
from tula.core.records import (
    NAMES,
    EpochRecord,
    Fallback,
    Generation,
    ModelsRecord,
    PlanRecord,
    ProfileRecord,
    RunManifest,
    TrainRecord,
    Trial,
    load_models,
    load_plan,
    load_profile,
    load_record,
    load_run_manifest,
    load_train,
    parse_record,
    read_jsonl,
    read_record,
    validate_record,
)

DATA = Path(__file__).parent / "data" / "records"

#: each kind: its file in a run directory, its typed loader and its class
KINDS = {
    "profile": ("profile.json", load_profile, ProfileRecord),
    "models": ("models.json", load_models, ModelsRecord),
    "plan": ("plan.json", load_plan, PlanRecord),
    "train": ("train/train.json", load_train, TrainRecord),
    "run": ("run.json", load_run_manifest, RunManifest),
}


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _added(disk: Any, back: Any, path: str = "") -> list[tuple[str, Any]]:
    """What ``back`` (a record written back) adds to ``disk`` (the file it was read from): the paths and
    values of its keys the file did not have.  A value the file had and ``back`` changed or dropped fails."""
    if isinstance(disk, dict):
        assert isinstance(back, dict), path
        missing = disk.keys() - back.keys()
        assert not missing, f"{path}: {sorted(missing)} dropped"
        out = [(f"{path}.{k}", back[k]) for k in back.keys() - disk.keys()]
        return out + [a for k in disk for a in _added(disk[k], back[k], f"{path}.{k}")]
    if isinstance(disk, list):
        assert isinstance(back, list) and len(back) == len(disk), path
        return [a for i, (x, y) in enumerate(zip(disk, back)) for a in _added(x, y, f"{path}.{i}")]
    assert _same(disk, back), f"{path}: {disk!r} written back as {back!r}"
    return []


def _json(rec: dict) -> dict:
    return json.loads(json.dumps(rec))  # as a file would have it


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_round_trips_object_json_object_and_keeps_what_the_file_said(tiny_pipeline, kind):
    rel, load, cls = KINDS[kind]
    path = tiny_pipeline.dir / rel
    rec = load(path)
    assert type(rec) is cls
    back = _json(rec.to_json_dict())
    again = cls.from_dict(back)
    assert again == rec  # object -> JSON -> object
    assert parse_record(back, cls) == rec == read_record(path, cls)
    assert parse_record(rec, cls) is rec  # an object is taken as it is
    disk = json.loads(path.read_text())
    disk_spec, back_spec = disk.pop("spec"), back.pop("spec")
    from tula.core.spec import spec_from_dict

    assert spec_from_dict(disk_spec) == spec_from_dict(back_spec)  # the spec with its defaults filled in
    # nothing the file said is lost or changed; what is added is a field's default (e.g. a history
    # line's test_r2: null), never a typed field the writer left out (a row's spot figures stay absent)
    added = _added(disk, back)
    assert all(v in (None, False, True, 0, 1, "", [], {}) for _, v in added), added
    assert not any(p.endswith(("failure_free_time_s", "noise_scale", "accumulation_check")) for p, _ in added)
    # the dict API reads the file as the typed object dumps itself
    assert load_record(path) == rec.model_dump(mode="json")


def test_the_typed_records_of_a_finished_run_say_what_its_dicts_say(tiny_pipeline):
    d = tiny_pipeline.dir
    plan, models, profile, train = (
        load_plan(d / "plan.json"),
        load_models(d / "models.json"),
        load_profile(d / "profile.json"),
        load_train(d / "train" / "train.json"),
    )
    raw = tiny_pipeline.record("plan.json")
    assert plan.choice.n_workers == raw["choice"]["n_workers"] and plan.choice.chosen
    assert [r.global_batch for r in plan.configurations] == [r["global_batch"] for r in raw["configurations"]]
    assert plan.constraints is not None and plan.constraints.n_feasible == raw["constraints"]["n_feasible"]
    assert all(isinstance(t, Trial) for t in profile.trials + models.trials)
    assert profile.model.param_count > 0 and profile.facts is not None and profile.facts.device == "cpu"
    assert isinstance(models.memory, MemoryModel) and isinstance(models.perf, PerfModel)  # the models' parts typed
    assert models.memory_probed == profile.memory and isinstance(profile.memory, MemoryModel)  # the probe, typed
    assert all(isinstance(h, EpochRecord) for h in train.history) and train.history[-1].epoch == train.epochs
    lines = [EpochRecord.model_validate(h) for h in read_jsonl(d / "train" / "metrics.jsonl")]
    assert [(h.epoch, h.train_loss, h.test_loss) for h in train.history] == [
        (h.epoch, h.train_loss, h.test_loss) for h in lines
    ]  # the lines also keep the per-step traces, the record the prediction beside each epoch


@pytest.mark.parametrize("name", ["profile", "models", "plan", "train", "run"])
def test_stored_records_of_todays_format_load(name):
    rel, load, cls = KINDS[name]
    path = DATA / Path(rel).name
    rec = load(path)
    assert type(rec) is cls and rec.version >= 1
    assert load_record(path) == rec.model_dump(mode="json")
    assert cls.from_dict(_json(rec.to_json_dict())) == rec


#: one world's accumulated step as the profile records it
ACCUMULATED = {"local_batch": 16, "micro_batch": 8, "accumulation_steps": 2, "step_times_s": [0.3, 0.5],
               "n_workers": 2, "t_step_s": 0.4}  # fmt: skip
SLOW = {**ACCUMULATED, "t_step_s": "slow"}  # one damaged


def test_the_profiles_parts_are_their_typed_objects_and_are_written_back_as_they_were_read():
    """The profile record's memory probe, accumulated steps and run trials are typed (the fit reads them
    without ``from_dict``), and the record dumps the file's JSON as it was, key for key, in its order."""
    from tula.core.records import AccumulationTrial, RunTrial

    raw = json.loads((DATA / "profile.json").read_text())
    raw["accumulation_trials"] = [ACCUMULATED]
    profile = ProfileRecord.from_dict(raw)
    assert isinstance(profile.memory, MemoryModel) and profile.memory == MemoryModel.from_dict(raw["memory"])
    assert profile.accumulation_trials == [AccumulationTrial(**ACCUMULATED)]
    assert profile.run_trials and all(isinstance(t, RunTrial) for t in profile.run_trials)
    assert [t.status for t in profile.run_trials] == [t["status"] for t in raw["run_trials"]]
    written = profile.to_json_dict()
    for part in ("memory", "accumulation_trials", "run_trials"):
        assert json.dumps(written[part]) == json.dumps(raw[part]), part
    assert ProfileRecord.from_dict(_json(written)) == profile
    with pytest.raises(ValidationError):
        profile.run_trials[0].method = "sgd"  # type: ignore[misc]


def test_the_models_parts_are_their_typed_objects_and_are_written_back_as_they_were_read():
    """The models record's memory and performance models, run costs, run trials and placement are the
    typed objects the planner predicts with (no ``from_dict`` at the reader), and the record dumps the
    file's JSON as it was: a model of one sequence length without the length's terms, tuples as lists."""
    from tula.core.fitted import RunCosts
    from tula.core.records import Placement, RunTrial

    raw = json.loads((DATA / "models.json").read_text())
    models = load_models(DATA / "models.json")
    assert isinstance(models.memory, MemoryModel) and isinstance(models.memory_probed, MemoryModel)
    assert isinstance(models.perf, PerfModel) and isinstance(models.run_costs, RunCosts)
    assert isinstance(models.placement, Placement) and all(isinstance(t, RunTrial) for t in models.run_trials)
    assert models.memory == MemoryModel.from_dict(raw["memory"]) and models.perf == PerfModel.from_dict(raw["perf"])
    assert models.run_costs == RunCosts.from_dict(raw["run_costs"]) and models.placement.n_hosts == 1
    written = models.to_json_dict()
    for part in ("memory", "memory_probed", "perf", "run_costs", "run_trials", "placement"):
        assert json.dumps(written[part]) == json.dumps(raw[part]), part  # the file's JSON, key for key, in its order
    assert ModelsRecord.from_dict(models.to_json_dict()) == models
    with pytest.raises(FrozenInstanceError):
        models.perf.c0 = 1.0  # type: ignore[misc]


def test_a_version_1_plan_loads_with_the_version_2_fields_defaulted_and_reports_as_its_version_2():
    from rich.console import Console

    from tula.report import plan_chart_data, plan_table

    old, new = load_plan(DATA / "plan_v1.json"), load_plan(DATA / "plan.json")
    assert (old.version, new.version) == (1, 2)
    assert old.constraints is None and old.spot_comparison is None
    assert all(r.meets_constraints for r in [*old.configurations, *old.frontier, old.choice])
    assert "meets_constraints" not in json.loads((DATA / "plan_v1.json").read_text())["choice"]
    assert old.configurations == new.configurations and old.choice == new.choice  # all met no constraint

    def text(plan: PlanRecord) -> str:
        console = Console(width=200, record=True)
        console.print(plan_table(plan))
        return console.export_text()

    assert text(old) == text(new)  # a plan without constraints says none
    trials = load_models(DATA / "models.json").trials
    assert plan_chart_data(old, trials) == plan_chart_data(new, trials)


def test_a_v2_plan_without_its_constraints_is_refused_in_one_sentence(tmp_path):
    plan = json.loads((DATA / "plan.json").read_text())
    del plan["constraints"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    with pytest.raises(RecordError) as err:
        load_plan(path)
    assert str(err.value) == (
        f"{str(path)!r} is a damaged plan record: field 'constraints' is missing (a version 2 plan records "
        "what it was planned under)"
    )


@pytest.mark.parametrize(
    ("name", "damage", "field", "what"),
    [
        ("plan.json", lambda d: d["configurations"][3].update(cost="cheap"), "configurations.3.cost", "valid number"),
        ("plan.json", lambda d: d["choice"].update(candidate="perhaps"), "choice.candidate", "valid boolean"),
        ("models.json", lambda d: d["noise_scale"].update(b_noise=[1]), "noise_scale.b_noise", "valid number"),
        ("models.json", lambda d: d["memory"].update(param_bytes="lots"), "memory", "memory model inside is damaged"),
        ("models.json", lambda d: d["perf"].pop("c0"), "perf", "performance model inside is damaged (field 'c0' is"),
        ("models.json", lambda d: d["run_costs"].update(eval_fixed_s="x"), "run_costs", "the run costs inside are"),
        ("models.json", lambda d: d["placement"].update(n_hosts="two"), "placement.n_hosts", "valid integer"),
        ("models.json", lambda d: d["run_trials"][0].update(status=None), "run_trials.0.status", "valid string"),
        ("profile.json", lambda d: d["trials"][0].update(t_step_s=None), "", "trial 0 is 'ok' but lacks"),
        ("profile.json", lambda d: d["memory"].pop("param_bytes"), "memory", "memory model inside is damaged (field"),
        ("profile.json", lambda d: d["run_trials"][1].update(due="often"), "run_trials.1.due", "valid list"),
        ("profile.json", lambda d: d.update(accumulation_trials=[SLOW]), "accumulation_trials.0.t_step_s", "number"),
        ("train.json", lambda d: d["history"][1].update(epoch=0), "history.1.epoch", "greater than or equal to 1"),
        ("run.json", lambda d: d.update(train="sometimes"), "train", "valid boolean"),
    ],
)
def test_a_damaged_field_names_the_file_and_itself_in_one_sentence(tmp_path, name, damage, field, what):
    data = json.loads((DATA / name).read_text())
    damage(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    kind = data["kind"]
    cls = {"tula.profile": ProfileRecord, "tula.models": ModelsRecord, "tula.plan": PlanRecord}.get(kind)
    cls = cls or {"tula.train": TrainRecord, "tula.run": RunManifest}[kind]
    with pytest.raises(RecordError) as typed:
        read_record(path, cls)
    with pytest.raises(RecordError) as as_dict:
        load_record(path)
    msg = str(typed.value)
    assert msg == str(as_dict.value)  # the typed loader says what the dict one says
    assert msg.startswith(f"{str(path)!r} is a damaged ") and "\n" not in msg
    said = msg.removeprefix(f"{str(path)!r} is a damaged {NAMES[kind]} record: ")
    assert said.startswith(f"field '{field}': ") if field else not said.startswith("field")
    assert what in said
    with pytest.raises(RecordError) as in_memory:
        parse_record(data, cls, source="the record sent")
    assert str(in_memory.value) == msg.replace(repr(str(path)), "the record sent")


def test_a_typed_loader_refuses_another_kind_and_a_missing_file_as_the_dict_loader_does(tmp_path):
    with pytest.raises(RecordError, match=r"is a models record, but a plan record is needed here$"):
        load_plan(DATA / "models.json")
    with pytest.raises(RecordError, match="does not exist"):
        load_train(tmp_path / "nothing.json")
    (tmp_path / "cut.json").write_text((DATA / "run.json").read_text()[:100])
    with pytest.raises(RecordError, match="is not valid JSON, perhaps truncated"):
        load_run_manifest(tmp_path / "cut.json")
    with pytest.raises(RecordError, match="is a plan record, but a training run record is needed here"):
        TrainRecord.from_dict(json.loads((DATA / "plan.json").read_text()))


def test_the_records_are_frozen():
    plan, train, models = (
        load_plan(DATA / "plan.json"),
        load_train(DATA / "train.json"),
        load_models(DATA / "models.json"),
    )
    assert models.noise_scale is not None and models.noise_scale.worlds
    for obj, field, value in (
        (plan, "objective", "cost"),
        (plan.choice, "n_workers", 8),
        (plan.configurations[0], "feasible", False),
        (plan.constraints, "budget", 1.0),
        (train, "epochs", 99),
        (train.history[0], "test_top1", 1.0),
        (models, "dataset_size", 1),
        (models.noise_scale, "b_noise", 1.0),
        (models.noise_scale.worlds[0], "b_big", 1),
        (load_profile(DATA / "profile.json").model, "name", "other"),
    ):
        with pytest.raises(ValidationError, match="frozen"):
            setattr(obj, field, value)
    assert plan == load_plan(DATA / "plan.json")


def test_a_record_written_from_its_object_is_the_record_the_writer_wrote(tmp_path):
    """JSON only at the edge: the object's to_json_dict written as a file reads back equal, with the
    fields a writer leaves out still left out (a row without spot figures has none)."""
    from tula.core.records import save_record

    for name, cls in (("plan.json", PlanRecord), ("train.json", TrainRecord), ("models.json", ModelsRecord)):
        rec = read_record(DATA / name, cls)
        out = save_record(rec.to_json_dict(), tmp_path / name)
        assert read_record(out, cls) == rec
        written = json.loads(out.read_text())
        disk = json.loads((DATA / name).read_text())
        assert {k for k in written if k != "spec"} >= {k for k in disk if k != "spec"}
        if name == "plan.json":
            assert all("failure_free_time_s" not in r for r in written["configurations"])
            assert written["configurations"][0].keys() == disk["configurations"][0].keys()


def test_report_and_dashboard_read_a_typed_plan_as_its_dict():
    from rich.console import Console

    from tula.report import models_table, plan_chart_data, plan_table, trials_table
    from tula.service.dashboard_charts import plan_charts

    def text(table: Any) -> str:
        console = Console(width=200, record=True)
        console.print(table)
        return console.export_text()

    raw = {n: json.loads((DATA / f"{n}.json").read_text()) for n in ("profile", "models", "plan")}
    typed = {"profile": load_profile(DATA / "profile.json"), "models": load_models(DATA / "models.json")}
    typed["plan"] = load_plan(DATA / "plan.json")
    assert text(trials_table(raw["profile"])) == text(trials_table(typed["profile"]))
    assert text(models_table(raw["models"])) == text(models_table(typed["models"]))
    assert text(plan_table(raw["plan"])) == text(plan_table(typed["plan"]))
    chart = plan_chart_data(typed["plan"], typed["models"].trials)
    assert chart == plan_chart_data(raw["plan"], raw["models"]["trials"])
    assert plan_charts(chart) == plan_charts(plan_chart_data(raw["plan"], raw["models"]["trials"]))
    assert chart.choice == typed["plan"].choice and [s.n_workers for s in chart.series] == [1, 2]


def test_validate_record_still_returns_the_dict_it_did():
    """The dict API other modules still use: defaults filled in, an infinite figure as null."""
    train = json.loads((DATA / "train.json").read_text())
    as_dict = validate_record(_json(train), "the training run")
    assert isinstance(as_dict, dict) and as_dict["history"][0]["test_r2"] is None
    typed = TrainRecord.from_dict(train)
    assert as_dict == typed.model_dump(mode="json")
    assert math.isinf(train["history"][0]["b_simple"])  # written as Infinity: the object keeps it
    assert math.isinf(typed.history[0].b_simple or 0) and as_dict["history"][0]["b_simple"] is None


def test_as_record_takes_a_typed_record_or_a_whole_one_and_refuses_a_records_parts():
    """Where a record comes into a module: its object passes as it is, its JSON (with its kind) is
    checked whole; a dict of some of its fields is one sentence -- a record is built whole, with its
    class --, and so is a value of another type."""
    from tula.core.records import as_record

    whole = json.loads((DATA / "plan.json").read_text())
    plan = as_record(whole, PlanRecord)
    assert isinstance(plan, PlanRecord) and as_record(plan, PlanRecord) is plan
    parts = {k: whole[k] for k in ("objective", "configurations", "reason")}
    with pytest.raises(RecordError) as refused:
        as_record(parts, PlanRecord)
    assert (
        str(refused.value) == "a whole plan record is needed here, not a dict of some of its fields (it has no 'kind')"
    )
    with pytest.raises(RecordError, match="is a damaged plan record: field 'choice' is missing"):
        as_record({**parts, "kind": "tula.plan", "version": 2}, PlanRecord)  # a whole record is checked whole
    with pytest.raises(RecordError, match="is a damaged plan record: field 'objective'"):
        as_record({**whole, "objective": "fastest"}, PlanRecord)
    with pytest.raises(TypeError, match="^a training run record is needed here, not PlanRecord$"):
        as_record(plan, TrainRecord)
    with pytest.raises(TypeError, match="^a plan record is needed here, not list$"):
        as_record([whole], PlanRecord)


def test_as_epoch_takes_an_epoch_or_a_whole_metrics_line_of_today_or_before():
    """Every line of a stored metrics.jsonl is an epoch (the figures beyond the typed ones kept); a
    line of before gradient accumulation, the noise scale and the wall times (the figures every
    epoch has since the first trainer) too; a line without one of those is refused by name."""
    from tula.core.records import as_epoch

    lines = [json.loads(ln) for ln in (DATA / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    epochs = [as_epoch(ln) for ln in lines]
    assert [e.epoch for e in epochs] == [ln["epoch"] for ln in lines]
    assert epochs[0].to_json_dict()["step_traces"] == lines[0]["step_traces"]  # kept as written
    assert as_epoch(epochs[0]) is epochs[0]
    first = ("epoch", "steps", "steps_done", "global_batch", "n_workers", "lr", "train_loss", "epoch_time_s")
    old = {k: lines[0][k] for k in (*first, "test_loss", "test_top1")}
    e = as_epoch(old)
    assert e.accumulation_steps == 1 and e.b_simple is None and e.epoch_wall_s is None
    assert e.model_dump(exclude_unset=True) == old  # written back as it was read (a training record writes so)
    for name in (*first, "test_loss"):
        with pytest.raises(RecordError, match=f"^an epoch's metrics line is damaged: field '{name}' is missing$"):
            as_epoch({k: v for k, v in old.items() if k != name})
    with pytest.raises(RecordError, match="^an epoch's metrics line is damaged: field 'steps': "):
        as_epoch({**old, "steps": 0})
    with pytest.raises(TypeError, match="not str$"):
        as_epoch("epoch 1")  # type: ignore[arg-type]


def test_a_language_models_epochs_are_scored_by_perplexity_and_the_table_shows_it():
    """The figures a metrics line carries beyond the core ones are typed attributes, written back only where
    given; an epoch with a perplexity and no top-1 (train.loss model) is scored by it, and a sequence model's
    top-1 run shows its perplexity beside the top-1."""
    from rich.console import Console

    from tula.core.records import epoch_score
    from tula.report import train_table

    train = json.loads((DATA / "train.json").read_text())
    line = train["history"][0]
    epoch = EpochRecord.model_validate(line)
    assert epoch.eval_s == line["eval_s"] and epoch.test_top5 == line["test_top5"] and epoch.test_perplexity is None
    assert "test_perplexity" not in epoch.to_json_dict() and "skipped_steps" not in epoch.to_json_dict()
    rec = TrainRecord.from_dict(train)
    assert rec.local_batch == train["local_batch"] and rec.final == train["final"] and rec.train_s == train["train_s"]

    def text(run: dict) -> str:
        console = Console(width=240, record=True)
        console.print(train_table(TrainRecord.from_dict(run)))
        return console.export_text()

    own_loss = [{k: v for k, v in h.items() if k not in ("test_top1", "test_top5")} for h in train["history"]]
    own_loss = [{**h, "test_perplexity": math.exp(h["test_loss"])} for h in own_loss]
    assert epoch_score(own_loss[0]) == ("perplexity", math.exp(line["test_loss"]), f"{math.exp(line['test_loss']):.2f}")
    table = text({**train, "history": own_loss})
    assert "perplexity" in table and f"{math.exp(line['test_loss']):.2f}" in table and "top-1" not in table
    sequence = [{**h, "test_perplexity": math.exp(h["test_loss"])} for h in train["history"]]
    assert epoch_score(sequence[0])[0] == "top-1"
    table = text({**train, "history": sequence})
    assert "top-1" in table and "perplexity" in table and f"{math.exp(line['test_loss']):.2f}" in table
    assert "perplexity" not in text(train)


def test_a_training_runs_generations_and_fallbacks_are_typed_and_written_back_as_they_were_read():
    """The stored train.json's generations load as :class:`Generation`; a fallback and a generation
    of a run before gradient accumulation (no k in them) load with k = 1 and are written back without
    it, and today's are written in the order the trainer wrote them."""
    stored = _json(json.loads((DATA / "train.json").read_text()))
    rec = load_train(DATA / "train.json")
    assert rec.generations and all(isinstance(g, Generation) for g in rec.generations)
    assert rec.generations[0].config.n_workers == stored["generations"][0]["n_workers"]
    assert _json(rec.to_json_dict())["generations"] == stored["generations"]
    old_fallback = {"from_global_batch": 128, "to_global_batch": 64, "at_epoch": 1, "reason": "OutOfMemoryError"}
    old_generation = {"n_workers": 2, "global_batch": 64, "from_epoch": 2, "wall_s": 1.5}
    old = TrainRecord.from_dict({**stored, "fallbacks": [old_fallback], "generations": [old_generation]})
    (fb,), (gen,) = old.fallbacks, old.generations or []
    assert isinstance(fb, Fallback) and (fb.from_accumulation_steps, fb.to_accumulation_steps, fb.at_epoch) == (1, 1, 1)
    assert gen.accumulation_steps == 1 and gen.world is None and gen.new_world is None
    back = _json(old.to_json_dict())
    assert back["fallbacks"] == [old_fallback] and back["generations"] == [old_generation]
    now = Fallback(
        from_global_batch=64, to_global_batch=64, from_accumulation_steps=1, to_accumulation_steps=2, at_epoch=0
    )
    assert list(now.to_json_dict()) == [
        "from_global_batch", "to_global_batch", "from_accumulation_steps", "to_accumulation_steps", "at_epoch"
    ]  # fmt: skip
    with pytest.raises(RecordError, match="fallbacks.0.from_global_batch"):
        TrainRecord.from_dict({**stored, "fallbacks": [{**old_fallback, "from_global_batch": 0}]}, "train.json")


def test_a_plans_curves_and_knees_and_a_runs_traces_are_typed_and_written_back_as_they_were_read():
    """The stored plan's curves and knees load as :class:`PlanCurve` and :class:`PlanKnee`; the stored
    run's traces as :class:`MethodTraces` (AGS's per-step values and summary typed, another method's
    figures kept as written); both write back the JSON they were read from, keys in the file's order."""
    from tula.core.records import FactorSummary, MethodTraces, PlanCurve, PlanKnee

    stored_plan = json.loads((DATA / "plan.json").read_text())
    plan = load_plan(DATA / "plan.json")
    curve = plan.curves["1"]
    assert isinstance(curve, PlanCurve) and isinstance(plan.knees["1"], PlanKnee)
    assert curve.global_batch == stored_plan["curves"]["1"]["global_batch"] and curve.time_to_accuracy_s
    assert plan.knees["2"].global_batch == stored_plan["knees"]["2"]["global_batch"]
    back = plan.to_json_dict()
    assert back["curves"] == stored_plan["curves"] and back["knees"] == stored_plan["knees"]
    without = {n: {k: v for k, v in c.items() if "accuracy" not in k} for n, c in stored_plan["curves"].items()}
    older = PlanRecord.from_dict({**stored_plan, "curves": without})
    assert older.curves["1"].time_to_accuracy_s is None and older.to_json_dict()["curves"] == without
    with pytest.raises(RecordError, match="field 'curves.1.global_batch'"):
        PlanRecord.from_dict({**stored_plan, "curves": {"1": {**without["1"], "global_batch": "many"}}}, "plan.json")

    stored_run = json.loads((DATA / "train.json").read_text())
    tr = load_train(DATA / "train.json").traces
    assert isinstance(tr, MethodTraces) and isinstance(tr.factors, FactorSummary)
    assert tr.delta_threshold == stored_run["traces"]["delta_threshold"] and tr.delta and tr.delta[0] is None
    assert tr.scaled == stored_run["traces"]["scaled"] and tr.steps == stored_run["traces"]["steps"]  # kept
    assert list(tr.to_json_dict()) == list(stored_run["traces"])  # the order the method wrote
    polo = TrainRecord.from_dict({**stored_run, "traces": {"switch_step": 6, "averaging_period_steps": 3}})
    assert polo.traces.scaled_fraction is None and polo.to_json_dict()["traces"] == {
        "switch_step": 6, "averaging_period_steps": 3
    }  # fmt: skip
    none = TrainRecord.from_dict({**stored_run, "traces": {}})
    assert not none.traces and none.to_json_dict()["traces"] == {}
