"""Sequence length as a dimension of the profile, the models and the plan (#44 items 1 and 6).

``search.sequence_lengths``: the profile runs one more trial per other length (the data set built
at that length, on the smallest cluster size at its largest profiled local batch), each trial
records its ``sequence_length``, the memory model gains terms in B*L and B*L^2 and the compute's
time per sample likewise, and the plan's rows carry ``sequence_length``, ``parallelism`` and
``checkpointing``.  With one length every model, record and plan is as before (the stored records
of ``tests/data/records`` are the oracle).  Real profiles of ``tiny_gpt`` on ``text`` (gloo, one
rank, a few steps); the refusals are one sentence and exit 2 before any worker starts.

Measured (2026-11-29, the shared 2-core host at a load average of about 5, three profiles): the
peak memory at held-out (b, L) points (b=12 L=48, b=24 L=24, b=20 L=40) within 0.07 % of the
measured peak; the step time within 6-190 % -- on this loaded host the step time of the same
configuration moves by more than that between two worlds, so the time checks here are loose (a
factor of 3) and the per-token growth of compute is what is asserted of it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_refused, tula_in_process, write_spec

from tula.core.fit import fit_models
from tula.core.fitted import FittedModels
from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import PerfModel
from tula.core.plan import make_plan
from tula.core.records import ProfileRecord, load_profile
from tula.core.space import Config
from tula.core.spec import spec_from_dict
from tula.core.trial import Trial
from tula.engine.profile import length_configs, profile
from tula.report import plan_table, trials_table

RECORDS = Path(__file__).parent / "data" / "records"


def _spec(sequence_length: int = 32, lengths: list[int] | None = None, batch: tuple[int, int] = (8, 32)) -> dict:
    """tiny_gpt (2 layers of width 64, positions up to 128) on 512 sequences of text, one rank."""
    spec: dict = {
        "name": "lengths",
        "model": {"name": "tiny_gpt", "kwargs": {"n_layers": 2, "d_model": 64, "n_heads": 2, "max_positions": 128}},
        "data": {"name": "text", "sequence_length": sequence_length, "num_samples": 512},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "search": {"cluster_sizes": [1], "min_batch": batch[0], "max_batch": batch[1]},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0.2, "noise_steps": 0},
    }
    if lengths is not None:
        spec["search"]["sequence_lengths"] = lengths
    return spec


def _rel(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


# --------------------------------------------------------------------------- one length: as before
def test_one_length_fits_and_plans_the_stored_records_exactly():
    profile_rec = json.loads((RECORDS / "profile.json").read_text())
    stored_models = json.loads((RECORDS / "models.json").read_text())
    stored_plan = json.loads((RECORDS / "plan.json").read_text())
    assert all(t.sequence_length is None for t in load_profile(RECORDS / "profile.json").trials)  # old files load
    models = json.loads(json.dumps(fit_models(profile_rec).to_json_dict()))
    assert models["perf"] == stored_models["perf"]  # no new keys, the same numbers
    # the memory line is now the one-rank trials' alone, and the two-rank trials fit what a DDP world holds
    # beyond it (MemoryModel.with_ddp_phase; measured 2026-11-29: a two-rank peak is the one-rank line's at
    # large batches, above it only at small ones), where it was fitted over both sizes less the buckets
    # (53,032 bytes): the line is 154,456 + 20,480 b (was 110,050 + 21,159 b), the two-rank excess at b 32
    # 5,184 bytes, the two-rank trials' line 182,339 + 19,770.7 b floored at its b 8 peak; the four trials'
    # peaks now fitted exactly (were off 2.7 % median, 6.7 % max)
    changed = {
        "other_static_bytes": -4984, "activation_bytes_per_sample": 20216, "ddp_bucket_bytes": 5184,
        "ddp_floor_bytes": 340504, "ddp_phase_bytes": 182339,
    }  # fmt: skip
    per_sample = {"ddp_phase_bytes_per_sample": pytest.approx(19770.67)}
    assert models["memory"] == {**stored_models["memory"], **changed, **per_sample}
    assert models["fit_error"] == {
        **stored_models["fit_error"], "peak_mem_median_rel": pytest.approx(0, abs=1e-6),
        "peak_mem_max_rel": pytest.approx(0, abs=1e-6),
    }  # fmt: skip
    plan = make_plan(stored_models, stored_plan["objective"]).to_json_dict()
    assert plan["reason"] == stored_plan["reason"]
    for row, old in zip(plan["configurations"], stored_plan["configurations"], strict=True):
        assert {k: row[k] for k in old} == old
        assert row["sequence_length"] is None and row["parallelism"] == "ddp" and row["checkpointing"] is False


def test_the_terms_in_l_recover_known_coefficients_and_vanish_at_the_reference():
    mem = MemoryModel.from_dict(json.loads((RECORDS / "models.json").read_text())["memory"])
    per_token, per_token_sq, ref = 1000.0, 7.0, 32
    lengths = [16, 32, 64, 128]
    batches = [24, 16, 12, 8]

    def truth(b: int, length: int) -> float:
        extra = per_token * (length - ref) + per_token_sq * (length**2 - ref**2)
        return mem.static_bytes + b * (mem.bytes_per_sample + extra)

    fitted = mem.with_sequence_length(ref, lengths, batches, [int(truth(b, n)) for b, n in zip(batches, lengths)])
    assert fitted.bytes_per_token == pytest.approx(per_token, rel=1e-3)
    assert fitted.bytes_per_token_squared == pytest.approx(per_token_sq, rel=1e-3)
    assert fitted.predict_peak_bytes(20, 1, ref) == mem.predict_peak_bytes(20, 1)  # at L_ref: the line as it was
    assert fitted.predict_peak_bytes(20, 1, 96) == pytest.approx(truth(20, 96), rel=1e-6)
    # two lengths (the reference and one other): the L^2 term is not fitted
    two = mem.with_sequence_length(ref, [32, 64], [16, 16], [int(truth(16, 32)), int(truth(16, 64))])
    assert two.bytes_per_token_squared == 0.0 and two.bytes_per_token > 0
    assert MemoryModel.from_dict(fitted.to_dict()) == fitted  # the record round-trips
    assert "bytes_per_token" not in mem.to_dict()  # a model of one length: its record as before

    perf = PerfModel(collective="ring", grad_bytes=1000, c0=0.002, c1=0.0004)
    trials = [
        Trial(status="ok", n_workers=1, local_batch=b, global_batch=b, sequence_length=n, t_step_s=1.0,
              t_compute_s=0.002 + b * (0.0004 + 2e-6 * (n - ref) + 3e-8 * (n**2 - ref**2)))
        for b, n in zip(batches, lengths)
    ]  # fmt: skip
    fitted_perf = perf.with_sequence_length(ref, trials)
    assert fitted_perf.c1_per_token == pytest.approx(2e-6, rel=1e-6)
    assert fitted_perf.c1_per_token_squared == pytest.approx(3e-8, rel=1e-6)
    assert fitted_perf.t_step_s(16, 2, sequence_length=ref) == perf.t_step_s(16, 2)
    assert "c1_per_token" not in perf.to_dict() and PerfModel.from_dict(fitted_perf.to_dict()) == fitted_perf


def test_one_trial_per_other_length_at_the_largest_batch_recovers_the_measured_peaks():
    """``length_configs``' design against the peaks measured on the host (2026-11-29, tiny_gpt 2 x 64 on
    ``text``, AdamW, one rank, b 8-64 at L 16-64: exactly 1,696,000 + 8 L + 11,840 b L bytes at 70 points,
    the intercept's 8 bytes per token of L and no L^2 term): the trials it chooses fit the terms, and the
    smallest batches at the other lengths, which no trial ran, are predicted as measured."""
    spec = _spec(32, [16, 32, 64])
    spec["search"]["cluster_sizes"] = [1, 2]
    job = spec_from_dict(spec)
    chosen = [Config(1, 8), Config(1, 64), Config(2, 8), Config(2, 64)]
    assert length_configs(job, chosen, None) == [(1, 64, 16), (1, 64, 64)]  # the smallest size's largest batch
    assert length_configs(job, chosen, 48) == [(1, 64, 16), (1, 24, 64)]  # above L_ref: scaled to the bound

    def measured(b: int, length: int) -> int:
        return 1_696_000 + 8 * length + 11_840 * b * length

    ref = 32
    mem = MemoryModel(
        param_bytes=565_248, grad_bytes=565_248, optimizer_state_bytes=1_130_616, buffer_bytes=0,
        other_static_bytes=measured(0, ref) - 2_261_112, activation_bytes_per_sample=11_840 * ref - 512,
        batch_bytes_per_sample=512, probe_local_batches=(16, 32), probe_peak_bytes=(measured(16, ref), measured(32, ref)),
        device="cpu",
    )  # fmt: skip
    fitted = mem.with_sequence_length(ref, [16, 64], [64, 64], [measured(64, 16), measured(64, 64)])
    assert fitted.bytes_per_token == pytest.approx(11_840, rel=1e-4)
    assert fitted.bytes_per_token_squared == pytest.approx(0.0, abs=1e-3)
    for b in (1, 8, 12, 40, 64):
        for length in (16, 24, 48, 64):
            assert _rel(float(fitted.predict_peak_bytes(b, 1, length)), measured(b, length)) < 2e-4, (b, length)


# --------------------------------------------------------------------------- a real profile over lengths
@pytest.mark.slow  # real worlds
def test_a_profile_over_lengths_predicts_held_out_batches_and_lengths(tmp_path):
    rec = profile(spec_from_dict(_spec(32, [16, 32, 64])), "partial")
    assert isinstance(rec, ProfileRecord)
    by_length = sorted((t.sequence_length, t.local_batch) for t in rec.trials)
    assert by_length == [(16, 32), (32, 8), (32, 32), (64, 32)]  # one trial per other length, at the largest batch
    assert all(t.status == "ok" for t in rec.trials)
    assert sorted(c for c in rec.configs if len(c) == 3) == [(1, 32, 16), (1, 32, 64)]
    assert ProfileRecord.from_dict(rec.to_json_dict()).trials == rec.trials  # the file's values read back
    assert "L" in [c.header for c in trials_table(rec).columns]  # the profile's table says each trial's length
    models = fit_models(rec)
    assert models.memory.sequence_length == models.perf.sequence_length == 32
    assert models.fit_error["peak_mem_max_rel"] < 0.02
    fitted = FittedModels.from_record(models)
    # the compute per sample grows with L: compared across a factor of 4 in tokens, since one trial per
    # length on shared cores varies up to 2.2x (measured); neighbouring lengths are within that noise
    per_sample = [float(fitted.perf.c1_at(n)) for n in (16, 32, 64)]
    assert per_sample[0] < per_sample[2], per_sample
    # held-out (b, L): a world at each, the data built at its own length
    for b, length in ((12, 48), (24, 24)):
        held = profile(spec_from_dict(_spec(length, batch=(b, b))), "partial")
        t = next(t for t in held.trials if t.status == "ok")
        assert t.sequence_length == length
        p = fitted.predict(n_workers=1, local_batch=b, sequence_length=length)
        assert p.peak_mem_bytes is not None
        # a small batch at another length, where no trial ran (measured within 0.07 %; run 4 of bench/transformer_plan
        # missed N 1, B 12, L 24 by 9 %, its static part 574 kB low)
        assert _rel(float(p.peak_mem_bytes[0]), t.peak_mem_bytes) < 0.01, (b, length)
        assert 1 / 4 < float(p.t_step_s[0]) / t.t_step_s < 4, (b, length, float(p.t_step_s[0]), t.t_step_s)

    # the plan searches the lengths: each row carries its L, the table shows it
    plan = make_plan(models, "time")
    lengths = sorted({r.sequence_length for r in plan.configurations})
    assert lengths == [16, 32, 64]
    assert all(r.parallelism == "ddp" and r.checkpointing is False for r in plan.configurations)
    assert plan.choice.sequence_length in lengths and "tokens/s" in plan.reason
    assert "L" in [c.header for c in plan_table(plan).columns]
    # a longer sequence's row at the same batch predicts more memory and a longer step
    at = {(r.sequence_length, r.global_batch): r for r in plan.configurations}
    assert at[(64, 16)].peak_mem_bytes > at[(32, 16)].peak_mem_bytes > at[(16, 16)].peak_mem_bytes
    assert at[(64, 16)].t_step_s > at[(16, 16)].t_step_s


def test_one_length_plan_rows_say_the_data_length_and_no_l_column():
    models = json.loads((RECORDS / "models.json").read_text())
    spec = spec_from_dict(_spec(32))
    rec = {**models, "spec": spec.to_dict()}
    plan = make_plan(rec, "time")
    assert {r.sequence_length for r in plan.configurations} == {32}
    assert "L" not in [c.header for c in plan_table(plan).columns]
    # several lengths asked of models fitted at one: a sentence, not a silent guess
    several = {**models, "spec": spec_from_dict(_spec(32, [32, 64])).to_dict()}
    with pytest.raises(Exception, match="fitted at one sequence length"):
        make_plan(several, "time")


def test_memory_limits_bind_per_length():
    mem = MemoryModel.from_dict(json.loads((RECORDS / "models.json").read_text())["memory"])
    mem = replace(mem, sequence_length=32, bytes_per_token=2000.0, bytes_per_token_squared=10.0)
    budget = mem.static_bytes + 64 * mem.bytes_per_sample
    at = {n: mem.max_local_batch(budget, 0.0, 1, n) for n in (16, 32, 64)}
    assert at[16] > at[32] > at[64] > 0
    assert mem.max_local_batch(budget, 0.0, 1) == at[32]
    assert np.all(np.diff(mem.predict_peak_bytes(8, 1, np.array([16, 32, 64]))) > 0)


def text_factory(sequence_length: int = 16, n: int = 256) -> dict:
    """A user's data factory that takes ``sequence_length`` (``test_sequence_length:text_factory``)."""
    from tula.engine.text_data import text_datasets

    sets = text_datasets(sequence_length, n)
    return {"train": sets["train"], "test": sets["test"], "num_classes": sets["num_classes"]}


@pytest.mark.slow  # a real world
def test_a_data_factory_that_takes_sequence_length_is_built_at_each_length():
    spec = _spec(16, [16, 32], batch=(8, 16))
    spec["data"] = {"factory": "test_sequence_length:text_factory", "kwargs": {"sequence_length": 16}}
    rec = profile(spec_from_dict(spec), "partial")
    assert sorted((t.sequence_length, t.local_batch, t.status) for t in rec.trials) == [
        (16, 8, "ok"),
        (16, 16, "ok"),
        (32, 16, "ok"),
    ]
    at = {t.sequence_length: t for t in rec.trials if t.local_batch == 16}
    assert at[32].peak_mem_bytes > at[16].peak_mem_bytes  # the set was built at 32: longer samples
    models = fit_models(rec)
    assert models.memory.sequence_length == 16 and models.memory.bytes_per_token > 0


# --------------------------------------------------------------------------- training at the plan's length
@pytest.mark.slow  # a real profile and training world
def test_tula_run_trains_at_the_sequence_length_its_plan_chose(tmp_path):
    """The spec's data is at L = 32 and its plan searches only 16 and 24: ``tula run`` trains at
    the plan's L (the one rule, :func:`tula.core.job_rules.training_spec`), its ranks' data sets
    built at it -- before, training took ``data.sequence_length`` whatever the plan chose."""
    spec = _spec(32, [16, 24], batch=(8, 16))
    spec["data"]["num_samples"] = 256
    spec |= {"epochs": 1, "train": {"method": "lbt"}}
    r = tula_in_process("run", write_spec(tmp_path, spec), "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    chosen = plan["choice"]["sequence_length"]
    assert chosen in (16, 24)
    run = json.loads((tmp_path / "run" / "train" / "train.json").read_text())
    assert run["spec"]["data"]["sequence_length"] == chosen  # the spec the ranks built their data from
    assert (run["n_workers"], run["global_batch"]) == (plan["choice"]["n_workers"], plan["choice"]["global_batch"])
    assert run["history"] and run["history"][-1]["test_loss"] > 0
    # the epoch line counts tokens at the length trained: steps x B x L over the epoch's time
    h = run["history"][0]
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("epoch 1: train loss"))
    assert line.endswith(f", {h['steps'] * h['global_batch'] * chosen / h['epoch_time_s']:.4g} tokens/s"), line


# --------------------------------------------------------------------------- refusals
def test_lengths_above_the_positional_limit_are_refused_before_any_worker(tmp_path):
    spec = _spec(32, [32, 256])
    path = write_spec(tmp_path, spec, "long.yaml")
    assert_refused(
        tula_in_process("profile", path, "--out", str(tmp_path / "out")),
        "search.sequence_lengths [256] exceed the model's positional limit of 128 tokens",
    )
    assert not (tmp_path / "out" / "profile.json").exists()


def test_lengths_for_a_data_set_without_one_are_refused(tmp_path):
    spec = {"name": "digits", "search": {"sequence_lengths": [16, 32]}}
    path = write_spec(tmp_path, spec, "digits.yaml")
    assert_refused(
        tula_in_process("profile", path, "--out", str(tmp_path / "out")),
        "data set 'digits' has no sequence length",
    )
    factory = {
        **_spec(32, [16, 32]),
        "model": {"name": "factories:linear_at_zero"},
        "data": {"factory": "factories:linear_regression", "kwargs": {"n": 200}},
        "train": {"loss": "mse"},
    }
    path = write_spec(tmp_path, factory, "factory.yaml")
    assert_refused(
        tula_in_process("profile", path, "--out", str(tmp_path / "out2")),
        "takes no sequence_length keyword",
    )
