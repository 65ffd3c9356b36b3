"""``tula simulate`` at other sequence lengths and run variants (#44 items 1 and 6): the rows at a
length L are the fitted models' predictions at L (the per-token terms), with tokens per second;
a run variant's rows are those of its models with the fitted effect applied, as the planner
applies it; each what-if the models record cannot answer is one sentence and exit code 2.
Records made by hand (no profile runs, no ranks): about 8 s together on a loaded 2-core CPU, most of
it the three commands that plot."""

import json

import pytest
from helpers import memory_model, models_record, tula_in_process

from tula.core.effects import CheckpointingEffect, ShardingEffect
from tula.core.fitted import FittedModels
from tula.core.perfmodel import COLLECTIVES, PerfModel
from tula.core.records import ModelsRecord, validate_record
from tula.core.simulate import simulated_collectives, simulator_from_models, what_if
from tula.core.variants import RunVariant, variant_models
from tula.report import simulation_summary, simulation_tables

#: compute 0.01 + c1(L) b s, c1 fitted at L = 32 with terms in L and L^2
PERF = PerfModel(
    "ring",
    grad_bytes=10**6,
    c0=0.01,
    c1=0.001,
    alpha=1e-5,
    beta=1e-9,
    sequence_length=32,
    c1_per_token=2e-5,
    c1_per_token_squared=1e-7,
)
#: 2000 static bytes, 100 per sample at L = 32, + 2 per token and 0.01 per token squared
MEMORY = memory_model(sequence_length=32, bytes_per_token=2.0, bytes_per_token_squared=0.01)
BUDGET = 7000  # with 10 % kept free: b <= 43 at L = 32, b <= 22 at L = 64

GPT = {
    "name": "gpt-lengths",
    "model": {"name": "tiny_gpt", "kwargs": {"n_layers": 2, "d_model": 32, "n_heads": 2, "max_positions": 128}},
    "data": {"name": "text", "sequence_length": 32, "num_samples": 256},
    "search": {"cluster_sizes": [1, 2], "min_batch": 8, "max_batch": 64, "sequence_lengths": [32, 64]},
    "train": {"method": "lbt", "noise_scale": False},
    "pricing": {"kind": "fixed", "price_per_node_hour": 3600.0},
}
CHECKPOINTED = CheckpointingEffect(
    activation_bytes_per_sample=30,
    plain_activation_bytes_per_sample=90,
    static_delta_bytes=100,
    compute_factor=1.3,
    trials=2,
)
SHARDED = ShardingEffect(gather_bytes=500, sync_s=0.004, n_workers=2, state_bytes=2000, trials=3, gather_s=0.001)


def _trial(n: int, b: int, length: int) -> dict:
    return {
        "status": "ok",
        "n_workers": n,
        "global_batch": b,
        "local_batch": b // n,
        "sequence_length": length,
        "t_step_s": 0.01 + 0.001 * b / n,
        "t_compute_s": 0.01 + 0.001 * b / n,
        "peak_mem_bytes": 5000,
    }


def _record(train: dict | None = None, lengths: bool = True, effects: bool = False, spec: dict | None = None) -> dict:
    """A models record of :data:`GPT` (``train`` replacing its training fields) fitted at lengths 32
    and 64 (``lengths`` false: at 32 only, no per-token terms), with the checkpointing and sharding
    effects where ``effects``."""
    spec = spec or {**GPT, "train": {**GPT["train"], **(train or {})}}
    if not lengths:
        spec = {**spec, "search": {k: v for k, v in spec["search"].items() if k != "sequence_lengths"}}
    perf = PERF if lengths else PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, alpha=1e-5, beta=1e-9)
    trials = [_trial(n, b, 32) for n in (1, 2) for b in (16, 32)]
    trials += [_trial(n, 16, 64) for n in (1, 2)] if lengths else []
    rec = models_record(perf, budget=BUDGET, spec=spec, trials=trials)
    rec["memory"] = (MEMORY if lengths else memory_model()).to_dict()
    if effects:
        rec.update(checkpointing=CHECKPOINTED.to_dict(), sharding=SHARDED.to_dict())
    return validate_record(rec, "test")


def _simulate(tmp_path, rec: dict, *args: str):
    path = tmp_path / "models.json"
    path.write_text(json.dumps(rec))
    return tula_in_process("simulate", path, "--workers", "1,2", "--batch", "32", "--out", tmp_path / "s.png", *args)


def test_the_rows_at_another_length_are_the_fitted_models_predictions_there():
    rec = _record()
    sim = simulator_from_models(rec, sequence_length=64)
    assert (sim.sequence_length, sim.profiled_step) == (64, False)
    rows = sim.constant(32, [1, 2], ["ring"])
    p = FittedModels.from_record(rec).predict(
        n_workers=[1, 2], global_batch=32, sequence_length=64, network=sim.network("ring")
    )
    assert [r.sequence_length for r in rows] == [64, 64]
    assert [r.t_step_s for r in rows] == pytest.approx(list(p.t_step_s), rel=1e-12)
    assert [r.fits_memory for r in rows] == list(p.feasible) == [False, True]  # b = 32 exceeds the limit at 64
    assert [r.tokens_per_s for r in rows] == pytest.approx([32 * 64 / t for t in p.t_step_s], rel=1e-12)
    assert "at most 22" in rows[0].note
    own = simulator_from_models(rec).constant(32, [1, 2], ["ring"])  # the data's own length: another step
    assert own[0].fits_memory and own[0].t_step_s < rows[0].t_step_s
    assert [r.sequence_length for r in own] == [32, 32] and simulator_from_models(rec).profiled_step
    one_length = simulator_from_models(_record(lengths=False), sequence_length=32)  # its own length: no what-if
    assert (one_length.sequence_length, one_length.profiled_step) == (32, True)


def test_several_lengths_are_one_table_with_tokens_per_second(tmp_path):
    rec = _record()
    sims = [simulator_from_models(rec, sequence_length=length) for length in (32, 96)]
    w = what_if(rec, sims, [1, 2], ["ring"], batch=32)
    assert [(r.sequence_length, r.n_workers) for r in w.rows] == [(32, 1), (32, 2), (96, 1), (96, 2)]
    assert w.title == "gpt-lengths: constant global batch 32 (L=32,96)"
    assert [m.n_workers for m in w.measured] == [1, 2]  # the profiled step (L = 32) is among them
    assert any("L=96 is outside the sequence lengths profiled (32 to 64)" in n for n in sims[1].notes)
    (table,) = simulation_tables(sims[0], w.rows)
    headers = [str(c.header) for c in table.columns]
    assert headers[:5] == ["N", "b", "L", "step ms", "tokens/s"]
    speed = [str(c) for c in table.columns[headers.index("speed-up")]._cells]
    assert speed[0] == speed[2] == "1.00x" and speed[1] != speed[3]  # each length over its own N = 1
    summary = simulation_summary(w.rows)
    assert [str(c) for c in summary.columns[0]._cells] == ["1 (L=32)", "2 (L=32)", "1 (L=96)", "2 (L=96)"]
    r = _simulate(tmp_path, rec, "--sequence-length", "32,64")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "gpt-lengths: constant global batch 32 (L=32,64)" in out and "tokens/s" in out


def test_a_run_variant_is_its_models_with_the_fitted_effect_applied(tmp_path):
    rec = _record({"parallelism": "auto", "checkpointing": "auto"}, effects=True)
    sim = simulator_from_models(rec, parallelism="fsdp", checkpointing="on", sequence_length=64)
    assert (sim.parallelism, sim.checkpointing, sim.profiled_step, sim.notes) == ("fsdp", True, False, ())
    variant = variant_models(ModelsRecord.from_dict(rec), RunVariant(checkpointing=True, parallelism="fsdp"))
    p = FittedModels.from_record(variant).predict(
        n_workers=[2], global_batch=32, sequence_length=64, network=sim.network("ring")
    )
    w = what_if(rec, sim, [1, 2], ["ring"], batch=32)
    assert [(r.parallelism, r.checkpointing, r.sequence_length) for r in w.rows] == [("fsdp", True, 64)] * 2
    one, two = w.rows
    assert one.t_step_s is None and one.note.startswith("FSDP on one worker: nothing to shard")  # as the plan
    assert two.t_step_s == pytest.approx(float(p.t_step_s[0]), rel=1e-12)
    plain = simulator_from_models(rec, sequence_length=64).constant(32, [2], ["ring"])[0]
    assert plain.t_step_s is not None and two.t_step_s > plain.t_step_s  # recomputation and the gathers
    assert w.measured == []  # the trials ran another step
    assert w.title == "gpt-lengths: constant global batch 32 (L=64, fsdp, checkpointed)"
    r = _simulate(tmp_path, rec, "--parallelism", "fsdp", "--checkpointing", "on")
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if " N " in line and " step ms " in line)
    cells = [h.strip() for h in header.split("┃")[1:6]]
    assert cells[:3] == ["N", "b", "L"] and cells[3].startswith("par") and cells[4] == "ckpt", header
    row = next(line for line in r.stdout.splitlines() if line.lstrip("│ ").startswith("2 "))
    assert "fsdp" in row and " on " in row, row


def test_fsdp_s_step_says_its_fitted_sync_not_a_network(tmp_path):
    rec = _record({"parallelism": "auto"}, effects=True)
    sim, plain = simulator_from_models(rec, parallelism="fsdp"), simulator_from_models(rec)
    assert sim.sharding == SHARDED and plain.sharding is None
    assert simulated_collectives(sim) == ("ring",) and simulated_collectives(plain) == COLLECTIVES
    w = what_if(rec, sim, [1, 2, 4], simulated_collectives(sim), batch=32)
    _, two, four = w.rows
    assert two.t_sync_s == pytest.approx(SHARDED.sync_s, rel=1e-12)  # the fitted sync at the N it was measured at
    assert four.t_sync_s == pytest.approx(SHARDED.sync_s * 1.5, rel=1e-12)  # a ring's 2 (N - 1) / N: 3/2 of N = 2's
    (table,) = simulation_tables(sim, w.rows)
    title = str(table.title)
    words = (
        "FSDP's all-gathers and reduce-scatter: the profile's fitted sync, 4 ms a step at N=2 (25% of it all-gathers, "
        "paid at every micro-batch), scaled over N as a ring's bytes per link; compute x1, 2 rank(s) per node"
    )
    assert title.endswith(words) and "Gbit/s" not in title and "latency" not in title, title
    assert not any("bandwidth" in n or "latency" in n for n in sim.notes), sim.notes
    assert "bandwidth" in str(simulation_tables(plain, plain.constant(32, [2], ["ring"]))[0].title)  # DDP's: a link
    r = _simulate(tmp_path, rec, "--parallelism", "fsdp")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "FSDP's all-gathers and reduce-scatter: the profile's fitted sync" in out, out
    assert "Simulated ring" in out and "Simulated tree" not in out and "Gbit/s" not in out


#: an auto profile with FSDP's effect fitted, and what-if links or collectives asked of its FSDP step
FSDP_WHAT_IF = {"train": {"parallelism": "auto"}, "effects": True}


@pytest.mark.parametrize(
    "record, args, words",
    [
        (
            {"spec": {"name": "cnn", "search": {"cluster_sizes": [1, 2]}, "pricing": GPT["pricing"]}},
            ["--sequence-length", "64"],
            "--sequence-length applies to data of sequences; the models record's trials ran at no sequence length",
        ),
        (
            {"lengths": False},
            ["--sequence-length", "64"],
            "the models were fitted at one sequence length (32) and cannot predict at 64; profile with "
            "search.sequence_lengths",
        ),
        (
            {},
            ["--sequence-length", "64,256"],
            "sequence length 256 exceeds the model's positional limit of 128 tokens (model.kwargs.max_positions)",
        ),
        ({}, ["--sequence-length", "6x"], "sequence length '6x' is not a whole number"),
        (
            {},
            ["--parallelism", "fsdp"],
            "the profile did not measure FSDP (train.parallelism is ddp): profile with train.parallelism: auto or fsdp",
        ),
        (
            {"train": {"parallelism": "auto"}},
            ["--parallelism", "fsdp"],
            "the profile did not measure FSDP: it ran no sharded trial",
        ),
        (
            {"train": {"parallelism": "auto", "noise_scale": True}, "effects": True},
            ["--parallelism", "fsdp"],
            "FSDP cannot train this spec (",
        ),
        (
            {"train": {"parallelism": "fsdp"}},
            ["--parallelism", "ddp"],
            "the profile did not measure DDP (train.parallelism is fsdp): profile with train.parallelism: auto or ddp",
        ),
        (
            {},
            ["--checkpointing", "on"],
            "the profile did not measure activation checkpointing (train.checkpointing is off): profile with "
            "train.checkpointing: auto or on",
        ),
        (
            {"train": {"checkpointing": "auto"}},
            ["--checkpointing", "on"],
            "the profile did not measure activation checkpointing: it ran no checkpointed trial",
        ),
        ({}, ["--parallelism", "zero3"], "--parallelism is ddp or fsdp, not 'zero3'"),
        ({}, ["--checkpointing", "yes"], "--checkpointing is on or off, not 'yes'"),
        (
            {},
            ["--sequence-length", "32,64", "--schedule", "geometric:factor=2"],
            "--schedule simulates one sequence length; give one --sequence-length",
        ),
        (
            FSDP_WHAT_IF,
            ["--parallelism", "fsdp", "--bandwidth", "100Gbit/s"],
            "--bandwidth does not apply to FSDP's step: its all-gathers and reduce-scatter are the profile's fitted "
            "sync, scaled over N as a ring's bytes per link, not a network's bandwidth and latency; leave "
            "--bandwidth out to simulate FSDP on the profiled network, or simulate DDP on another",
        ),
        (
            FSDP_WHAT_IF,
            ["--parallelism", "fsdp", "--latency", "5us", "--intra-bandwidth", "600GB/s"],
            "--latency, --intra-bandwidth do not apply to FSDP's step: its all-gathers and reduce-scatter are",
        ),
        (
            FSDP_WHAT_IF,
            ["--parallelism", "fsdp", "--collective", "ring,tree"],
            "--collective tree does not apply to FSDP's step: its all-gathers and reduce-scatter are the profile's "
            "fitted sync, scaled over N as a ring's bytes per link; give ring or leave --collective out",
        ),
    ],
    ids=[
        "no-length",
        "one-length",
        "positional-limit",
        "not-a-number",
        "ddp-spec",
        "auto-without-sharded-trials",
        "fsdp-obstacle",
        "fsdp-spec",
        "checkpointing-off",
        "auto-without-checkpointed-trials",
        "bad-parallelism",
        "bad-checkpointing",
        "schedule-at-two-lengths",
        "fsdp-bandwidth",
        "fsdp-links",
        "fsdp-collective",
    ],
)
def test_what_the_models_record_cannot_answer_is_one_sentence_and_exit_2(tmp_path, record, args, words):
    spec = record.get("spec")
    rec = _record(record.get("train"), record.get("lengths", True), record.get("effects", False), spec)
    if spec is not None:  # a CNN's: no lengths in its trials
        for t in rec["trials"]:
            t["sequence_length"] = None
    r = _simulate(tmp_path, rec, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    err = " ".join(r.stderr.split())
    assert err.startswith("error:") and words in err and "Traceback" not in err, err
    assert not (tmp_path / "s.png").exists()
