"""Activation checkpointing as a choice the planner weighs (#44 item 2): ``train.checkpointing: auto``.

The profile measures the plain step at every trial and the checkpointed one at the fewest trials that
give its effect (the smallest cluster size's two largest batches); the fit records the effect (the
activation bytes per sample with checkpointing, the compute factor: fitted, not assumed); the plan
makes rows of both variants and chooses by the objective; training applies the plan's choice
(:func:`tula.core.job_rules.training_spec`).  Real one-rank profiles of ``tiny_gpt`` on ``text``
(gloo); the plan's cases are built from that one profile's fitted models with a memory budget and a
per-step overhead chosen so that the larger batch fits only with checkpointing, or does not need it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import local_launcher, tula_in_process, write_spec

from tula.core.config import Config
from tula.core.effects import CheckpointingEffect
from tula.core.errors import InfeasibleError
from tula.core.fit import fit_models
from tula.core.job_rules import spec_with, training_spec
from tula.core.plan import make_plan
from tula.core.records import ModelsRecord, ProfileRecord
from tula.core.spec import spec_from_dict
from tula.core.variants import RunVariant, run_variants, variant_models
from tula.engine.checkpointing import apply_checkpointing
from tula.engine.profile import profile
from tula.engine.tiny_gpt import _Block
from tula.engine.train import train
from tula.engine.workloads import build_model


def _spec(checkpointing: str = "auto") -> dict:
    """tiny_gpt (4 blocks of width 32) on 256 text sequences of 32 bytes, one rank, batches 16-64."""
    return {
        "name": "gpt-auto",
        "model": {
            "name": "tiny_gpt",
            "kwargs": {"n_layers": 4, "d_model": 32, "n_heads": 2, "max_positions": 32, "dropout": 0.0},
        },
        "data": {"name": "text", "sequence_length": 32, "num_samples": 256},
        "epochs": 1,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "train": {"checkpointing": checkpointing},
        "search": {"cluster_sizes": [1], "min_batch": 16, "max_batch": 64, "max_accumulation_steps": 1},
        "profile": {"warmup_steps": 1, "timed_steps": 2, "threads_per_worker": 1, "min_timed_s": 0, "noise_steps": 0},
    }


@pytest.fixture(scope="module")
def auto_profile() -> ProfileRecord:
    return profile(spec_from_dict(_spec()), "partial", launcher=local_launcher())


@pytest.fixture(scope="module")
def auto_models(auto_profile: ProfileRecord) -> ModelsRecord:
    return fit_models(auto_profile)


@pytest.mark.slow  # real one-rank worlds of the profile
def test_the_profile_measures_the_checkpointed_variant_at_two_batches_and_its_peak_drops(auto_profile, auto_models):
    rec = auto_profile
    checkpointed = [t for t in rec.trials if t.checkpointing]
    plain = {t.local_batch: t for t in rec.trials if not t.checkpointing and t.status == "ok"}
    assert len(checkpointed) == 2 and all(t.status == "ok" for t in checkpointed), rec.trials
    assert sorted(t.local_batch for t in checkpointed) == sorted(plain)[-2:]  # the two largest plain batches
    for t in checkpointed:  # measured: the same batch's peak is lower with the blocks checkpointed
        assert t.peak_mem_bytes is not None and plain[t.local_batch].peak_mem_bytes is not None
        assert t.peak_mem_bytes < 0.9 * plain[t.local_batch].peak_mem_bytes, (t, plain[t.local_batch])
    assert ProfileRecord.from_dict(rec.to_json_dict()).trials == rec.trials  # the file's values read back
    # the fit: the plain models from the plain trials only, the effect from the checkpointed ones
    assert auto_models.checkpointing is not None
    effect = auto_models.checkpointing
    print(f"fitted checkpointing effect: {effect}")
    assert effect.trials == 2
    assert effect.activation_bytes_per_sample < 0.7 * effect.plain_activation_bytes_per_sample
    assert effect.compute_factor >= 1.0  # recomputation never makes the step faster (never fitted below 1)
    assert auto_models.fit_error["peak_mem_max_rel"] < 0.05  # the plain line is not bent by checkpointed peaks
    # the checkpointed variant's memory model predicts its own measured peaks
    mem = effect.memory(auto_models.memory)
    for t in checkpointed:
        assert t.peak_mem_bytes is not None
        assert abs(mem.predict_peak_bytes(t.local_batch, 1) - t.peak_mem_bytes) / t.peak_mem_bytes < 0.05


def _constructed(models: ModelsRecord, budget_bytes: int | None, compute_factor: float = 1.3) -> ModelsRecord:
    """``models`` under ``budget_bytes`` with a per-step overhead c0 of 20 samples' compute (so the
    larger batch trains an epoch faster) and the checkpointed compute ``compute_factor`` x the plain."""
    perf = models.perf
    assert models.checkpointing is not None
    faster = replace(perf, c0=20 * perf.c1, t_floor_s=0.0)
    effect = replace(models.checkpointing, compute_factor=compute_factor)
    return models.model_copy(update={"memory_budget_bytes": budget_bytes, "perf": faster, "checkpointing": effect})


def _budget_for(models: ModelsRecord, checkpointed_b: int) -> tuple[int, int]:
    """The budget where the checkpointed step fits a local batch of ``checkpointed_b`` and no
    more, and the largest the plain step fits under it."""
    assert models.checkpointing is not None
    plain = models.memory
    checkpointed = models.checkpointing.memory(plain)
    safety = models.spec.search.memory_safety
    budget = int(checkpointed.predict_peak_bytes(checkpointed_b) / (1 - safety)) + 1  # any N: with the buckets
    assert checkpointed.max_local_batch(budget, safety) == checkpointed_b
    return budget, plain.max_local_batch(budget, safety) or 0


@pytest.mark.slow  # the profile of the fixture, and one short training run
def test_the_plan_picks_checkpointing_only_when_the_objective_gains(auto_models, tmp_path):
    assert run_variants(auto_models.spec, auto_models) == [RunVariant(False), RunVariant(True)]
    # a budget where B=64 fits only checkpointed: the overhead per step makes the larger batch faster
    budget, plain_limit = _budget_for(auto_models, 64)
    assert 16 <= plain_limit <= 32, plain_limit  # measured: the checkpointed activations are about a third
    plan = make_plan(_constructed(auto_models, budget), "time")
    rows = plan.configurations
    assert {r.checkpointing for r in rows} == {False, True}  # rows of both variants
    plain_fits = [r.local_batch for r in rows if not r.checkpointing and r.feasible]
    assert max(plain_fits) == plain_limit and any(r.checkpointing and r.feasible and r.local_batch == 64 for r in rows)
    assert plan.choice.checkpointing and plan.choice.global_batch == 64, plan.reason
    best_plain = min(r.total_time_s for r in rows if not r.checkpointing and r.feasible)
    assert plan.choice.total_time_s < best_plain  # priced at its slower step, and still faster
    assert "with activation checkpointing (compute x1.3 fitted): the best without it" in plan.reason, plan.reason
    assert plan.spec.train.checkpointing == "auto"
    # training applies the plan's choice
    trained = training_spec(plan.spec, plan.choice.config, plan)
    assert trained.train.checkpointing == "on"
    run = train(trained, "lbt", plan.choice.n_workers, plan.choice.global_batch, tmp_path, launcher=local_launcher())
    assert run.spec.train.checkpointing == "on" and [e.epoch for e in run.history] == [1]

    # no budget: everything fits plain, checkpointing only slows the step -- not chosen
    plan = make_plan(_constructed(auto_models, None), "time")
    assert not plan.choice.checkpointing and plan.choice.global_batch == 64, plan.reason
    assert "without activation checkpointing: its step is x1.3 slower" in plan.reason, plan.reason
    assert training_spec(plan.spec, plan.choice.config, plan).train.checkpointing == "off"

    # the same budget with checkpointing forbidden: the rows that fit only with it say so
    spec = auto_models.spec
    off_spec = spec_with(spec, train=spec.train.model_copy(update={"checkpointing": "off"}))
    off = _constructed(auto_models, budget).model_copy(update={"spec": off_spec})
    plan = make_plan(off, "time")
    assert {r.checkpointing for r in plan.configurations} == {False} and plan.choice.local_batch == plain_limit
    big = next(r for r in plan.configurations if r.local_batch == 64)
    assert not big.feasible and "fits with train.checkpointing: on" in (big.reason or ""), big.reason
    # a budget below every plain batch: the infeasible plan names the knob that would make it fit
    tiny, plain_limit = _budget_for(auto_models, 16)
    assert plain_limit < 16
    with pytest.raises(InfeasibleError, match="fits with train.checkpointing: on"):
        make_plan(off.model_copy(update={"memory_budget_bytes": tiny}), "time")


def test_on_and_off_plan_one_variant_and_the_models_record_is_the_variant_s_own():
    models = {"spec": _spec("on")}
    rec = ModelsRecord.model_construct(spec=spec_from_dict(_spec("on")), checkpointing=None)
    assert run_variants(spec_from_dict(models["spec"]), rec) == [RunVariant(True)]
    assert variant_models(rec, RunVariant(True)) is rec  # on/off: the record as it is
    effect = CheckpointingEffect(
        activation_bytes_per_sample=100, plain_activation_bytes_per_sample=300, static_delta_bytes=0,
        compute_factor=1.2, trials=2,
    )  # fmt: skip
    off = ModelsRecord.model_construct(spec=spec_from_dict(_spec("off")), checkpointing=effect)
    assert run_variants(spec_from_dict(_spec("off")), off) == [RunVariant(False)]


def test_training_applies_the_plan_s_choice_and_the_ranks_recompute_the_blocks():
    """``auto`` with a plan whose choice is checkpointed trains with the blocks checkpointed: each
    block's forward runs twice per step (the forward and its recomputation in the backward pass)."""
    spec = spec_from_dict(_spec("auto"))
    plan = {"choice": {"checkpointing": True, "sequence_length": None}}
    trained = training_spec(spec, Config(1, 16), plan)
    assert trained.train.checkpointing == "on"
    assert training_spec(spec, Config(1, 16)).train.checkpointing == "off"  # no plan: plain
    for mode, calls_per_block in (("on", 2), ("off", 1)):
        train = trained.train.model_copy(update={"checkpointing": mode})
        model = apply_checkpointing(build_model(trained.model), train, trained.model.name)
        assert _block_layer_calls(model) == 4 * calls_per_block, mode


def _block_layer_calls(model: torch.nn.Module) -> int:
    """How often the blocks' first layers run in one forward and backward pass (a recomputed block's again)."""
    calls: list[int] = []
    for block in model.modules():
        if isinstance(block, _Block):  # its first layer: called again when the block is recomputed
            next(block.children()).register_forward_pre_hook(lambda *_: calls.append(1))
    model(torch.randint(0, 64, (2, 32))).sum().backward()
    return len(calls)


def test_tula_check_accepts_auto_and_refuses_it_without_blocks(tmp_path):
    r = tula_in_process("check", write_spec(tmp_path, _spec("auto")))
    assert r.returncode == 0, (r.stdout, r.stderr)
    d = _spec("auto")
    d["train"]["checkpoint_modules"] = ["NoSuchBlock"]
    r = tula_in_process("check", write_spec(tmp_path, d))
    assert r.returncode == 2 and "train.checkpointing is auto, but model 'tiny_gpt' has no submodule" in (
        r.stdout + r.stderr
    )


def test_checkpointing_auto_has_a_stored_model_key_of_its_own_and_off_and_on_keep_theirs():
    """An auto profile measured the checkpointed step besides the plain one: its models are not
    those of an off (or on) profile, so the service must not reuse one for the other."""
    from tula.service.model_key import key_parts_for_new_job, model_key

    facts = {"device": "cpu", "cpu": "Test CPU", "gpu": None, "cores": 8, "torch": "2.14.1"}
    base = {
        "name": "k",
        "model": {"name": "tiny_gpt", "kwargs": {"vocab_size": 64, "n_layers": 2, "d_model": 32, "n_heads": 2}},
        "data": {"name": "text", "sequence_length": 16, "num_samples": 64},
    }
    keys = {}
    for mode in ("off", "on", "auto"):
        parts = key_parts_for_new_job({**base, "train": {"checkpointing": mode}}, facts, 2)
        keys[mode] = (model_key(parts), parts)
    assert len({k for k, _ in keys.values()}) == 3
    assert "checkpointing" not in keys["off"][1] and "checkpointing_auto" not in keys["off"][1]
    assert keys["on"][1]["checkpointing"] == "found" and "checkpointing_auto" not in keys["on"][1]
    assert keys["auto"][1]["checkpointing_auto"] == "found" and "checkpointing" not in keys["auto"][1]
