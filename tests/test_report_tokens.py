"""Tokens as the unit for language models (#44: "Language-model users count throughput and batch
in tokens"; item 1: "objectives may be stated per token").

Where the rows have a sequence length L (``text`` data, ``search.sequence_lengths``) the plan's
table shows ``tokens/batch`` (B L) and ``tokens/s`` (B L / t_step) beside the samples, its rows
carry ``tokens_per_batch`` and ``tokens_per_s``, its reason says the chosen batch in tokens and
its throughput, the noise scale is said in tokens too, the profile's and training's tables and
the epoch line say tokens/s.  A CNN's tables, rows and reason are as before.  Records made by hand
from the stored ones (``tests/data/records``): no worlds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import epoch, known_trials, profile_record, tiny_spec, train_record

from tula.cli_console import epoch_tokens_per_s
from tula.core.plan import make_plan
from tula.core.records import PlanRecord, PlanRow, ProfileRecord
from tula.core.say import Table
from tula.core.spec import spec_from_dict
from tula.report import models_table, plan_table, train_table, trials_table

RECORDS = Path(__file__).parent / "data" / "records"
TOKEN_HEADERS = {"tokens/batch", "tokens/s", "tokens to acc."}


def _spec(sequence_length: int, lengths: list[int] | None = None) -> dict:
    """tiny_gpt on 512 sequences of ``text`` of ``sequence_length`` tokens, planned over ``lengths``."""
    search: dict = {"cluster_sizes": [1], "min_batch": 8, "max_batch": 32}
    if lengths is not None:
        search["sequence_lengths"] = lengths
    return {
        "name": "tokens",
        "model": {"name": "tiny_gpt", "kwargs": {"n_layers": 2, "d_model": 64, "n_heads": 2, "max_positions": 128}},
        "data": {"name": "text", "sequence_length": sequence_length, "num_samples": 512},
        "search": search,
    }


def _models(spec: dict, lengths: bool = False) -> dict:
    """The stored models record under ``spec``; ``lengths``: as if profiled over several
    sequence lengths from L_ref = 32 (a term in B*L in memory and in compute)."""
    models = json.loads((RECORDS / "models.json").read_text())
    models["spec"] = spec_from_dict(spec).to_dict()
    if lengths:
        models["memory"] |= {"sequence_length": 32, "bytes_per_token": 100.0}
        models["perf"] |= {"sequence_length": 32, "c1_per_token": 2e-6}
    return models


def _column(table: Table, header: str) -> list[str]:
    """The cells of the column ``header`` of a rich table."""
    return [str(c) for c in next(col for col in table.columns if col.header == header).cells]


def _shown(plan: PlanRecord) -> list[PlanRow]:
    """The rows the plan's table shows, in its order."""
    return [r for r in plan.configurations if r.candidate or r.chosen]


def test_a_transformer_plan_over_lengths_counts_tokens_and_chooses_per_token():
    plan = make_plan(_models(_spec(32, [16, 32, 64]), lengths=True), "time")
    rows = plan.configurations
    assert {r.sequence_length for r in rows} == {16, 32, 64}
    for r in rows:  # plan.json's rows: the batch in tokens and the throughput
        assert r.tokens_per_batch == r.global_batch * r.sequence_length
        assert r.tokens_per_s == pytest.approx(r.global_batch * r.sequence_length / r.t_step_s, rel=1e-12)
    table = plan_table(plan)
    headers = [c.header for c in table.columns]
    assert {"L", "tokens/batch", "tokens/s"} <= set(headers)
    assert headers.index("tokens/batch") < headers.index("t_step ms") < headers.index("tokens/s")
    shown = _shown(plan)
    assert _column(table, "tokens/batch") == [str(r.global_batch * r.sequence_length) for r in shown]
    assert _column(table, "tokens/s") == [f"{r.global_batch * r.sequence_length / r.t_step_s:.4g}" for r in shown]
    # the objective per token: the length chosen is the one whose fastest eligible row takes the least time per token
    c = plan.choice
    per_token = {
        n: min(r.total_time_s for r in rows if r.sequence_length == n and r.feasible and r.meets_constraints) / n
        for n in (16, 32, 64)
    }
    assert c.sequence_length == min(per_token, key=lambda n: per_token[n])
    assert c.sequence_length != min(per_token, key=lambda n: per_token[n] * n)  # per run, another length wins
    tokens_per_s = c.global_batch * c.sequence_length / c.t_step_s
    note = (
        f" [at sequence length L={c.sequence_length}: B={c.global_batch} is {c.global_batch * c.sequence_length} "
        f"tokens, {tokens_per_s:.4g} tokens/s; the least time per token of L = 16, 32, 64]"
    )
    assert note in plan.reason, plan.reason
    assert plan.reason.count("tokens/s") == 1  # said once


def test_a_one_length_transformer_plan_says_tokens_and_its_noise_scale_in_tokens():
    plan = make_plan(_models(_spec(32)), "time_to_accuracy", noise_scale=200.0)
    c = plan.choice
    assert c.sequence_length == 32 and c.tokens_per_batch == c.global_batch * 32
    table = plan_table(plan)
    headers = [col.header for col in table.columns]
    assert "L" not in headers and {"tokens/batch", "tokens/s", "tokens to acc."} <= set(headers)
    shown = _shown(plan)
    assert _column(table, "tokens to acc.") == [
        f"{r.epochs_to_accuracy * plan.dataset_size * 32:.4g}" for r in shown if r.epochs_to_accuracy is not None
    ]
    assert "B_noise 200 = 6.4e+03 tokens at L=32 (what-if)" in str(table.title)
    assert c.epochs_to_accuracy is not None
    tokens_to_acc = c.epochs_to_accuracy * plan.dataset_size * 32
    assert f"epochs ({tokens_to_acc:.3g} tokens) to reach" in plan.reason
    assert "(B_noise 200 = 6.4e+03 tokens at L=32, a what-if)" in plan.reason
    tokens_per_s = c.global_batch * 32 / c.t_step_s
    assert plan.reason.endswith(
        f" [at sequence length L=32: B={c.global_batch} is {c.global_batch * 32} tokens, {tokens_per_s:.4g} tokens/s]"
    ), plan.reason
    # the models' table says the measured noise scale in tokens at the length it was measured at
    text = dict(
        zip(_column(models_table(_models(_spec(32))), "what"), _column(models_table(_models(_spec(32))), "value"))
    )
    assert "45.2 samples (27.3-63.1, one jackknife error), 1.45e+03 tokens at L=32, at the start" in text["noise scale"]


def test_plans_before_the_token_fields_load_and_dump_as_they_were():
    plan = make_plan(_models(_spec(32)), "time").to_json_dict()
    for row in [plan["choice"], *plan["configurations"], *plan["frontier"]]:
        del row["tokens_per_batch"], row["tokens_per_s"]
    old = PlanRecord.from_dict(plan)
    assert old.choice.tokens_per_batch is None and old.to_json_dict() == plan  # nothing added on the way back
    assert "tokens/s" in [c.header for c in plan_table(old).columns]  # the table counts them from B, L, t_step


def test_a_cnn_shows_no_tokens_anywhere():
    stored = json.loads((RECORDS / "plan.json").read_text())
    models = json.loads((RECORDS / "models.json").read_text())
    plan = make_plan(models, stored["objective"])
    assert plan.reason == stored["reason"] and "token" not in plan.reason
    dumped = plan.to_json_dict()
    assert not any(k.startswith("tokens") for row in dumped["configurations"] for k in row)
    assert not TOKEN_HEADERS & {c.header for c in plan_table(plan).columns}
    with_acc = make_plan(models, "time_to_accuracy")
    assert not TOKEN_HEADERS & {c.header for c in plan_table(with_acc).columns}
    assert "token" not in str(plan_table(with_acc).title) and "token" not in with_acc.reason
    assert not any("token" in v for v in _column(models_table(models), "value"))
    profile = ProfileRecord.from_dict(profile_record(tiny_spec()))
    assert not TOKEN_HEADERS & {c.header for c in trials_table(profile).columns}
    run = train_record([epoch(1)])
    assert "tokens/s" not in [c.header for c in train_table(run).columns]
    assert epoch_tokens_per_s(epoch(1), None) == ""


def test_the_profile_and_training_tables_and_the_epoch_line_say_tokens_per_second():
    trials = [{**t, "sequence_length": 32} for t in known_trials()]
    profile = ProfileRecord.from_dict(profile_record(_spec(32), trials))
    table = trials_table(profile)
    assert "L" not in [c.header for c in table.columns]  # one length: no L column, but tokens
    assert _column(table, "tokens/batch") == [str(t.global_batch * 32) for t in profile.trials]
    assert _column(table, "tokens/s") == [
        "-" if not t.t_step_s else f"{t.global_batch * 32 / t.t_step_s:.4g}" for t in profile.trials
    ]
    # an epoch of 10 steps of B = 64 sequences of 32 tokens in 2 s: 10240 tokens/s
    line = epoch(1, epoch_time_s=2.0)
    run = train_record([line], spec=_spec(32))
    assert _column(train_table(run), "tokens/s") == ["1.024e+04"]
    assert epoch_tokens_per_s(line, 32) == ", 1.024e+04 tokens/s"


def test_the_console_epoch_line_says_tokens_per_second_where_training_has_a_length(capsys):
    from tula.cli_console import ConsoleObserver
    from tula.core.events import EpochFinished

    lines = {}
    for length in (32, None):
        observer = ConsoleObserver()
        observer.stage(
            "training", method="lbt", n_workers=2, global_batch=64, **({"sequence_length": length} if length else {})
        )
        observer.event("training", EpochFinished(epoch(1, epoch_time_s=2.0)))
        observer.done("training")
        lines[length] = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("epoch 1: ")]
    assert lines[32] == ["epoch 1: train loss 1.0000, test loss 1.0000, 2.00 s, 1.024e+04 tokens/s"]
    assert lines[None] == ["epoch 1: train loss 1.0000, test loss 1.0000, 2.00 s"]  # as before
