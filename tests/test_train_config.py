"""One rule for the configuration to train at (issue #43, item 5): an explicit argument over
the plan's choice over the spec's fields over the defaults, in one function
(:func:`tula.core.job_rules.train_config`) that every front calls -- the table checked
exhaustively on small cases, then every front trained on the same spec and plan."""

from __future__ import annotations

import itertools
import json

import pytest
from helpers import models_record, tiny_spec, tula_in_process, write_spec

from tula.core.config import Config
from tula.core.errors import SpecError
from tula.core.job_rules import (
    NoConfigError,
    check_train_config,
    spec_at,
    train_config,
    train_method,
    train_sequence_length,
    training_spec,
)
from tula.core.perfmodel import PerfModel
from tula.core.plan import make_plan
from tula.core.records import TrainRecord
from tula.core.spec import spec_from_dict

PLAN = {"choice": {"n_workers": 2, "global_batch": 64, "accumulation_steps": 2}}


def _spec(n: int | None = None, b: int | None = None, k: int = 1, **train) -> object:
    return spec_from_dict(
        {"name": "rule", "train": {"n_workers": n, "global_batch": b, "accumulation_steps": k, **train}}
    )


def _first(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


@pytest.mark.parametrize(
    "explicit_n, explicit_b, explicit_k, plan, spec_n, spec_b, spec_k",
    list(itertools.product([None, 4], [None, 128], [None, 4], [None, PLAN], [None, 1], [None, 32], [1, 2])),
)
def test_an_argument_wins_over_the_plan_which_wins_over_the_spec(
    explicit_n, explicit_b, explicit_k, plan, spec_n, spec_b, spec_k
):
    """Every combination of the three sources for N, B and k (all of them split: shares of at
    least 8 samples, k at most 4)."""
    spec = _spec(spec_n, spec_b, spec_k)
    choice = plan["choice"] if plan else {}
    n = _first(explicit_n, choice.get("n_workers"), spec_n)
    b = _first(explicit_b, choice.get("global_batch"), spec_b)
    whole_plan = plan is not None and explicit_n is None and explicit_b is None  # the choice as planned
    k = _first(explicit_k, choice["accumulation_steps"] if whole_plan else None, spec_k)
    asked = dict(n_workers=explicit_n, global_batch=explicit_b, accumulation_steps=explicit_k)
    if n is None or b is None:
        with pytest.raises(NoConfigError, match="no configuration to train at"):
            train_config(spec, plan, **asked)
        return
    got = train_config(spec, plan, **asked)
    assert got == Config(n, b, k)
    assert (got.local_batch, got.micro_batch) == (b // n, b // n // k)
    assert spec_at(spec, got).train.accumulation_steps == k


def test_the_defaults_come_after_the_spec_and_are_asked_only_when_needed():
    asked: list[str] = []

    def world() -> int:
        asked.append("world")
        return 4

    def checkpoint() -> Config:
        asked.append("checkpoint")
        return Config(2, 96, 3)

    # the spec's N before the launched world's size, which is then not asked
    assert train_config(_spec(1, 32), world_size=world, checkpoint=checkpoint) == Config(1, 32)
    assert asked == []
    # the launched world's size before the checkpoint's N; the checkpoint's B where nothing gives one
    assert train_config(_spec(), world_size=world, checkpoint=checkpoint) == Config(4, 96)
    assert asked == ["world", "checkpoint"]
    # the checkpoint's whole configuration, k included, where nothing else gives N or B
    assert train_config(_spec(), checkpoint=checkpoint) == Config(2, 96, 3)
    assert train_config(_spec(), checkpoint=lambda: None, global_batch=8, n_workers=2) == Config(2, 8)
    with pytest.raises(NoConfigError):
        train_config(_spec(), checkpoint=lambda: None)
    # the worker rule's N for the first batch (ceil(100 / 32)), after the plan's and the spec's
    ruled = _spec(b=100, workers={"min": 1, "max": 8, "batch_per_worker": 32})
    assert train_config(ruled) == Config(4, 100)  # a schedule's first configuration: not checked to split
    assert train_config(ruled, PLAN, global_batch=100) == Config(2, 100)


def test_a_schedule_keeps_its_own_accumulation_and_a_bad_split_is_the_trainers_sentence():
    geometric = spec_from_dict({"name": "rule", "train": {"batch_schedule": {"kind": "geometric"}}})
    assert train_config(geometric, PLAN) == Config(2, 64, 1)  # the plan's k is not taken: the schedule chooses
    for config, k in (((2, 33), 1), ((2, 64), 3), ((3, 2), 1)):
        with pytest.raises(SpecError) as got:
            train_config(_spec(*config, k))
        with pytest.raises(SpecError) as trainer:
            check_train_config(_spec(k=k), "lbt", *config, 1438)
        assert str(got.value) == str(trainer.value)
    with pytest.raises(SpecError, match="the number of workers must be at least 1, not 0"):
        train_config(_spec(2, 64), n_workers=0)


@pytest.mark.parametrize(
    "explicit, spec_method, batch, expected",
    [
        ("lars", "ags", 16, "lars"),  # an explicit method as it is, even where AGS would fall back
        ("ags", "lbt", 16, "ags"),  # (and check_method refuses it then, in the trainer's sentence)
        (None, "lars", 16, "lars"),
        (None, "ags", 64, "ags"),
        (None, "ags", 32, "lbt"),  # the spec's AGS with nothing to scale: B not above train.ags.b_small (32)
        (None, "static", 16, "lbt"),
    ],
)
def test_the_method_is_the_argument_else_the_spec_s_else_lbt_where_ags_has_nothing_to_scale(
    explicit, spec_method, batch, expected
):
    assert train_method(_spec(method=spec_method), batch, explicit) == expected


def test_the_sequence_length_is_the_argument_else_the_plan_s_else_the_spec_s():
    """L by the same precedence (train_sequence_length), applied to the data by training_spec:
    text's data.sequence_length, a factory's kwargs.sequence_length; data without one as it is."""
    text = spec_from_dict({"name": "rule", "data": {"name": "text", "sequence_length": 32}})
    planned = {"choice": {**PLAN["choice"], "sequence_length": 16}}
    config = train_config(text, planned)
    assert train_sequence_length(text) == 32
    assert train_sequence_length(text, PLAN) == 32  # a plan without lengths: the spec's
    assert train_sequence_length(text, planned) == 16
    assert train_sequence_length(text, planned, sequence_length=24) == 24
    at = training_spec(text, config, planned)
    assert (at.data.sequence_length, at.train.accumulation_steps) == (16, 2)
    assert training_spec(text, config, planned, sequence_length=24).data.sequence_length == 24
    assert training_spec(text, config, PLAN).data == text.data
    factory = spec_from_dict(
        {"name": "rule", "data": {"factory": "test_sequence_length:text_factory", "kwargs": {"n": 64}}}
    )
    assert training_spec(factory, config, planned).data.kwargs == {"n": 64, "sequence_length": 16}
    assert training_spec(factory, config, PLAN).data == factory.data
    digits = _spec()
    assert train_sequence_length(digits) is None and training_spec(digits, config, PLAN).data == digits.data


# --------------------------------------------------------------------------- every front
#: test_plan's hand-checked curves; with test_time_to_accuracy's memory (b <= 100, and a share's
#: accumulated peak within 12 kB) the time plan chooses 2 workers at B = 320, each share of 160 as 2
#: micro-batches of 80
PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)


def _configuration(run: TrainRecord | dict) -> tuple:
    """The configuration a training run record (typed, or as its file holds it) trained at."""
    run = run if isinstance(run, TrainRecord) else TrainRecord.from_dict(run)
    return run.method, run.n_workers, run.global_batch, run.accumulation_steps, run.micro_batch


@pytest.mark.slow
def test_every_front_trains_a_spec_and_a_plan_at_the_same_configuration(tmp_path):
    """``tula train SPEC --plan P``, ``tula.Job(SPEC).train(plan=P)``, and the pipeline that
    ``tula run`` and the service's runner call, resuming a run that holds P: the spec's
    train.n_workers and train.global_batch (1, 64) differ from the plan's choice (2 workers at
    B = 320 as 2 micro-batches of 80), and each front trains at the choice.  (Before the one
    rule, ``tula train`` took the spec's and ``tula.Job.train`` took no plan.)  The estimators
    take no plan: their parameters are explicit arguments."""
    import tula
    from tula.core.records import save_record
    from tula.pipeline import run_pipeline

    models = models_record(PERF, budget=12_000, full=True)
    models["spec"]["search"] |= {"memory_safety": 0.0, "max_accumulation_steps": 8}
    plan = make_plan(models, "time")
    assert (plan.choice.n_workers, plan.choice.global_batch, plan.choice.accumulation_steps) == (2, 320, 2)
    spec = dict(tiny_spec(profile=False), epochs=1, train={"method": "lbt", "n_workers": 1, "global_batch": 64})
    save_record(plan, tmp_path / "plan.json")
    planned = ("lbt", 2, 320, 2, 80)

    r = tula_in_process(
        "train", write_spec(tmp_path, spec), "--plan", tmp_path / "plan.json", "--out", tmp_path / "cli"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert _configuration(json.loads((tmp_path / "cli" / "train.json").read_text())) == planned

    job = tula.Job(spec, out=tmp_path / "job")
    assert _configuration(job.train(plan=tmp_path / "plan.json")) == planned
    assert _configuration(json.loads((tmp_path / "job" / "train" / "train.json").read_text())) == planned

    run_dir = tmp_path / "run"  # a run stopped after planning: its models and plan, no training yet
    run_dir.mkdir()
    save_record(models, run_dir / "models.json")
    save_record(plan, run_dir / "plan.json")
    done = run_pipeline(spec_from_dict(spec), run_dir, resuming=True)
    assert _configuration(done.train) == planned
    assert _configuration(json.loads((run_dir / "train" / "train.json").read_text())) == planned


@pytest.mark.slow
def test_tula_train_says_the_method_fallback_once_it_trains(tmp_path):
    """The spec's AGS at B = 32, not above train.ags.b_small (32): ``tula train`` trains with lbt
    and says so, once training's checks have passed (a refused command prints only its sentence:
    test_live_plan_train)."""
    spec = dict(tiny_spec(profile=False), epochs=1)
    r = tula_in_process("train", write_spec(tmp_path, spec), "--workers", 1, "--batch", 32, "--out", tmp_path / "t")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "nothing to scale, training with lbt" in r.stdout, r.stdout
    assert json.loads((tmp_path / "t" / "train.json").read_text())["method"] == "lbt"
