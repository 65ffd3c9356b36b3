"""``tula simulate`` says the step its rows are of (#44 item 6): the sequence length, the
parallelism and the checkpointing, as a plan's rows carry them, where the models record has them;
a record without them (a CNN's) simulates as before, its rows' JSON and table unchanged."""

import json

import pytest
from helpers import models_record, tula_in_process

from tula.core.perfmodel import PerfModel
from tula.core.records import validate_record
from tula.core.simulate import simulated_step, simulator_from_models, what_if
from tula.report import simulation_tables

PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, alpha=1e-5, beta=1e-9)

GPT = {
    "name": "gpt-sim",
    "model": {"name": "tiny_gpt", "kwargs": {"n_layers": 2, "d_model": 32, "n_heads": 2, "max_positions": 64}},
    "data": {"name": "text", "sequence_length": 32, "num_samples": 256},
    "search": {"cluster_sizes": [1, 2], "min_batch": 8, "max_batch": 64},
    "pricing": {"kind": "fixed", "price_per_node_hour": 3600.0},
}


def _trial(n: int, b: int, length: int | None) -> dict:
    return {
        "status": "ok",
        "n_workers": n,
        "global_batch": b,
        "local_batch": b // n,
        "sequence_length": length,
        "t_step_s": 0.01 + 0.001 * b / n,
        "t_compute_s": 0.01 + 0.001 * b / n,
        "peak_mem_bytes": 10_000,
    }


def _record(spec: dict, length: int | None = 32) -> dict:
    trials = [_trial(n, b, length) for n in (1, 2) for b in (16, 32)]
    return validate_record(models_record(PERF, full=True, spec=spec, trials=trials), "test")


def _headers(table) -> list[str]:
    return [str(c.header) for c in table.columns]


def test_a_transformer_s_rows_carry_its_length_and_the_table_shows_it():
    rec = _record(GPT)
    sim = simulator_from_models(rec)
    assert (sim.sequence_length, sim.parallelism, sim.checkpointing) == (32, None, None)  # ddp and off: not said
    w = what_if(rec, sim, [1, 2], ["ring"], batch=32)
    assert {(r.sequence_length, r.parallelism, r.checkpointing) for r in w.rows} == {(32, None, None)}
    assert w.title == "gpt-sim: constant global batch 32 (L=32)"
    (table,) = simulation_tables(sim, w.rows)
    assert _headers(table)[:3] == ["N", "b", "L"]
    assert w.rows[0].to_json_dict()["sequence_length"] == 32 and "parallelism" not in w.rows[0].to_json_dict()


@pytest.mark.parametrize(
    "train, step, cells",
    [
        ({"parallelism": "fsdp", "method": "lbt", "noise_scale": False}, ("fsdp", None), {"parallelism": "fsdp"}),
        ({"checkpointing": "on"}, (None, True), {"ckpt": "on"}),
        ({"checkpointing": "auto"}, (None, False), {"ckpt": "off"}),  # auto's own models: the plain step
    ],
    ids=["fsdp", "checkpointing-on", "checkpointing-auto"],
)
def test_the_parallelism_and_checkpointing_the_spec_asks_for_are_each_row_s(train, step, cells):
    rec = _record({**GPT, "train": train})
    sim = simulator_from_models(rec)
    w = what_if(rec, sim, [1, 2], ["ring"], batch=32)
    assert {(r.sequence_length, r.parallelism, r.checkpointing) for r in w.rows} == {(32, *step)}
    (table,) = simulation_tables(sim, w.rows)
    assert _headers(table)[2:4] == ["L", *cells]
    for column in table.columns:
        if column.header in cells:
            assert [str(c) for c in column._cells] == [cells[column.header]] * 2
    assert not sim.notes or "auto" in train.values()  # auto without the other variant measured: no note


def test_a_record_without_lengths_or_variants_simulates_as_before():
    cnn = {"name": "cnn", "pricing": GPT["pricing"], "search": GPT["search"]}
    rec = _record(cnn, length=None)
    step = simulated_step(rec)
    assert (step.sequence_length, step.parallelism, step.checkpointing, step.notes) == (None, None, None, ())
    sim = simulator_from_models(rec)
    w = what_if(rec, sim, [1, 2], ["ring"], batch=32)
    assert w.title == "cnn: constant global batch 32"
    assert all(k not in r.to_json_dict() for r in w.rows for k in ("sequence_length", "parallelism", "checkpointing"))
    (table,) = simulation_tables(sim, w.rows)
    assert _headers(table) == [
        "N",
        "b",
        "step ms",
        "sync ms",
        "epoch",
        "total",
        "cost $",
        "updates",
        "speed-up",
        "note",
    ]


def test_tula_simulate_prints_the_length_column(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps(_record(GPT)))
    r = tula_in_process("simulate", path, "--workers", "1,2", "--batch", "32", "--out", tmp_path / "sim.png")
    assert r.returncode == 0, r.stderr
    assert "gpt-sim: constant global batch 32 (L=32)" in " ".join(r.stdout.split())
    header = next(line for line in r.stdout.splitlines() if " N " in line and " step ms " in line)
    assert [h.strip() for h in header.split("┃")[1:4]] == ["N", "b", "L"], header
