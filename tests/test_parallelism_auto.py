"""Sharded data parallel as a choice the planner weighs (#44 item 3): ``train.parallelism: auto``.

The profile measures DDP's trials as the spec asks and the sharded (FSDP2) step in one extra world
at the smallest cluster size of two ranks or more (its two largest batches); the fit records the
effect (:class:`tula.core.effects.ShardingEffect`: the gathered working set and the per-step sync,
fitted, not assumed); the plan makes rows of both and chooses by the objective; training applies
the choice (:func:`tula.core.job_rules.training_spec`).  One real profile of ``tiny_gpt`` on
``text`` (gloo, worlds of 1 and 2 ranks); the plans are made from its fitted models with a memory
budget that only the sharded step fits, or none, and a sync time set so the choice does not hang
on the loaded host's timing.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import local_launcher, memory_model, models_record

from tula.core.config import Config
from tula.core.errors import InfeasibleError, SpecError
from tula.core.fit import fit_models
from tula.core.job_rules import check_parallelism, spec_with, training_spec, worker_plan
from tula.core.memory_model import MemoryModel
from tula.core.perfmodel import PerfModel
from tula.core.plan import make_plan
from tula.core.records import ModelsRecord, ProfileRecord, Trial
from tula.core.spec import spec_from_dict
from tula.core.variants import (
    RunVariant,
    ShardingEffect,
    fit_sharding_effect,
    models_as_trained,
    parallelism_auto_note,
    run_variants,
    variant_models,
)
from tula.engine.fsdp import SHARDS_DIR
from tula.engine.profile import combined_configs, profile, sharding_configs
from tula.engine.train import train
from tula.report import plan_table, trials_table


def _spec(parallelism: str = "auto", **train: object) -> dict:
    """tiny_gpt (4 blocks of width 64) on 256 text sequences of 32 bytes, worlds of 1 and 2 ranks."""
    return {
        "name": "gpt-fsdp-auto",
        "model": {
            "name": "tiny_gpt",
            "kwargs": {"n_layers": 4, "d_model": 64, "n_heads": 2, "max_positions": 32, "dropout": 0.0},
        },
        "data": {"name": "text", "sequence_length": 32, "num_samples": 256},
        "epochs": 1,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "train": {"parallelism": parallelism, "method": "lbt", "noise_scale": False, **train},
        "search": {"cluster_sizes": [1, 2], "min_batch": 8, "max_batch": 64, "max_accumulation_steps": 1},
        "profile": {"warmup_steps": 1, "timed_steps": 2, "threads_per_worker": 1, "min_timed_s": 0, "noise_steps": 0},
    }


@pytest.fixture(scope="module")
def auto_profile() -> ProfileRecord:
    return profile(spec_from_dict(_spec()), "partial", launcher=local_launcher())


@pytest.fixture(scope="module")
def auto_models(auto_profile: ProfileRecord) -> ModelsRecord:
    return fit_models(auto_profile)


@pytest.mark.slow  # real worlds of 1 and 2 ranks
def test_the_profile_measures_the_sharded_variant_and_its_fitted_memory_predicts_its_peaks(auto_profile, auto_models):
    rec = auto_profile
    sharded = [t for t in rec.trials if t.parallelism == "fsdp"]
    ddp = {t.local_batch: t for t in rec.trials if t.parallelism is None and t.n_workers == 2 and t.status == "ok"}
    assert len(sharded) == 3 and all(t.status == "ok" and t.n_workers == 2 for t in sharded), rec.trials
    two = sorted(ddp)[-2:]  # the two largest DDP batches at N=2, and half the smaller (the small-batch phase)
    assert sorted(t.local_batch for t in sharded) == [two[0] // 2, *two]
    for t in (t for t in sharded if t.local_batch in ddp):  # measured: a rank holds half the state: a lower peak
        assert t.peak_mem_bytes is not None and ddp[t.local_batch].peak_mem_bytes is not None
        assert t.peak_mem_bytes < ddp[t.local_batch].peak_mem_bytes, (t, ddp[t.local_batch])
    assert ProfileRecord.from_dict(rec.to_json_dict()).trials == rec.trials  # the file's values read back
    assert "parallelism" in [c.header for c in trials_table(rec).columns]  # the sharded trials: a column
    # the fit: DDP's models from DDP's trials only, the sharding effect from the sharded ones
    effect = auto_models.sharding
    assert isinstance(effect, ShardingEffect) and effect.trials == 3 and effect.n_workers == 2
    assert effect.small_batch_floor_bytes == min(sharded, key=lambda t: t.local_batch).peak_mem_bytes
    assert effect.sync_s >= 0.0
    # the all-gathers' part (every micro-batch's) from the sharded compute-only steps, within the sync
    assert effect.gather_s is not None and 0.0 <= effect.gather_s <= effect.sync_s, effect
    ddp_only = rec.model_copy(update={"trials": [t for t in rec.trials if t.parallelism is None]})
    plain = fit_models(ddp_only)  # the DDP models are those of DDP's trials alone
    assert plain.memory == auto_models.memory and plain.perf == auto_models.perf and plain.sharding is None
    assert ModelsRecord.from_dict(auto_models.to_json_dict()).sharding == effect  # written and read back
    # the sharded memory model predicts the sharded trials' measured peaks (measured: within 4.2 %)
    mem = effect.memory(auto_models.memory)
    errors = []
    for t in sharded:
        assert t.peak_mem_bytes is not None
        errors.append((mem.predict_peak_bytes(t.local_batch, 2) - t.peak_mem_bytes) / t.peak_mem_bytes)
    print(f"fitted sharding effect: {effect}; relative errors of the sharded peaks: {errors}")
    assert max(abs(e) for e in errors) < 0.08, errors
    # the state divided by N: a rank of 4 holds a quarter, so the limit grows with N
    assert mem.predict_peak_bytes(8, 4) < mem.predict_peak_bytes(8, 2) < auto_models.memory.predict_peak_bytes(8, 2)


def _with_sync(models: ModelsRecord, budget_bytes: int | None, sync_s: float = 0.05) -> ModelsRecord:
    """``models`` under ``budget_bytes``, the sharded step's sync ``sync_s`` per step (set: on a
    loaded host the fitted one varies from run to run)."""
    assert models.sharding is not None
    return models.model_copy(
        update={"memory_budget_bytes": budget_bytes, "sharding": replace(models.sharding, sync_s=sync_s)}
    )


def _budget_where_only_fsdp_fits(models: ModelsRecord) -> int:
    """The budget where the sharded step fits a local batch of 4 on 2 ranks (B = 8, the smallest
    global batch) and DDP fits neither b = 4 on 2 ranks nor b = 8 on one."""
    assert models.sharding is not None
    safety = models.spec.search.memory_safety
    sharded = models.sharding.memory(models.memory)
    budget = int(sharded.predict_peak_bytes(4, 2) / (1 - safety)) + 1
    assert (sharded.max_local_batch(budget, safety, 2) or 0) >= 4
    assert (models.memory.max_local_batch(budget, safety, 2) or 0) < 4, "DDP fits b=4 on 2 ranks"
    assert (models.memory.max_local_batch(budget, safety, 1) or 0) < 8, "DDP fits b=8 on 1 rank"
    return budget


@pytest.mark.slow  # the profile of the fixture, and one short training run
def test_the_plan_picks_fsdp_where_memory_forces_it_and_ddp_where_it_does_not(auto_models, tmp_path):
    assert run_variants(auto_models.spec, auto_models) == [RunVariant(False), RunVariant(False, "fsdp")]
    budget = _budget_where_only_fsdp_fits(auto_models)
    plan = make_plan(_with_sync(auto_models, budget), "time")
    rows = plan.configurations
    assert {r.parallelism for r in rows} == {"ddp", "fsdp"}
    assert {r.n_workers for r in rows if r.parallelism == "fsdp"} == {2}  # nothing to shard on one rank
    assert not any(r.feasible for r in rows if r.parallelism == "ddp")
    assert plan.choice.parallelism == "fsdp" and plan.choice.n_workers == 2, plan.reason
    assert f"[fsdp: fits at b={plan.choice.local_batch} on N=2 where ddp does not]" in plan.reason, plan.reason
    assert plan.spec.train.parallelism == "auto"  # the spec as given
    assert "parallelism" in [c.header for c in plan_table(plan).columns]  # a plan with fsdp rows: its column
    trained = training_spec(plan.spec, plan.choice.config, plan)
    assert trained.train.parallelism == "fsdp"  # training applies the plan's choice
    run = train(trained, "lbt", plan.choice.n_workers, plan.choice.global_batch, tmp_path, launcher=local_launcher())
    assert run.spec.train.parallelism == "fsdp" and [e.epoch for e in run.history] == [1]
    assert (tmp_path / SHARDS_DIR).is_dir()  # its checkpoint is sharded: FSDP trained it

    # no budget: DDP fits everything and FSDP only adds its sync -- ddp, and by how much it is faster
    plan = make_plan(_with_sync(auto_models, None), "time")
    assert plan.choice.parallelism == "ddp", plan.reason
    assert "[ddp: faster by " in plan.reason and "than the best with fsdp" in plan.reason, plan.reason
    assert training_spec(plan.spec, plan.choice.config, plan).train.parallelism == "ddp"

    # the same budget with ddp asked: the rows that fit only sharded say so, and nothing is feasible
    ddp = _with_sync(auto_models, budget)
    ddp_spec = spec_with(ddp.spec, train=ddp.spec.train.model_copy(update={"parallelism": "ddp"}))
    ddp = ddp.model_copy(update={"spec": ddp_spec})
    with pytest.raises(InfeasibleError, match=r"fits with train.parallelism: fsdp \(or auto\) on N=2"):
        make_plan(ddp, "time")
    roomier = ddp.model_copy(update={"memory_budget_bytes": int(budget * 1.6)})
    plan = make_plan(roomier, "time")
    assert {r.parallelism for r in plan.configurations} == {"ddp"}
    assert "parallelism" not in [c.header for c in plan_table(plan).columns]  # ddp only: no column
    only_sharded = [r for r in plan.configurations if not r.feasible and r.n_workers == 2]
    assert only_sharded and "fits with train.parallelism: fsdp (or auto)" in (only_sharded[0].reason or "")


def _models(spec: dict) -> ModelsRecord:
    effect = ShardingEffect(gather_bytes=10, sync_s=0.01, n_workers=2, state_bytes=100, trials=2)
    return ModelsRecord.model_construct(spec=spec_from_dict(spec), checkpointing=None, sharding=effect)


def test_auto_plans_ddp_only_with_what_fsdp_cannot_train_and_says_why():
    cases = {
        "ags": ("method 'ags' compares the norms of the whole small-batch and large-batch gradients, which fsdp "
                "shards over the workers"),
        "fp16": "fsdp does not train in fp16 yet (its gradient scaler would skip a step on some ranks only)",
        "noise": "train.noise_scale needs each worker's whole gradient, which fsdp reduce-scatters",
    }  # fmt: skip
    specs = {
        "ags": _spec(method="ags"),
        "fp16": _spec(precision="fp16"),
        "noise": _spec(noise_scale=True),
    }
    for case, d in specs.items():
        spec = spec_from_dict(d)
        assert run_variants(spec, _models(d)) == [RunVariant(False)], case
        assert parallelism_auto_note(spec, _models(d)) == f"train.parallelism auto planned ddp only: {cases[case]}"
    ok = spec_from_dict(_spec())
    assert run_variants(ok, _models(_spec())) == [RunVariant(False), RunVariant(False, "fsdp")]
    assert parallelism_auto_note(ok, _models(_spec())) == ""
    no_trial = ModelsRecord.model_construct(spec=ok, checkpointing=None, sharding=None)
    assert "the profile has no sharded trial" in parallelism_auto_note(ok, no_trial)
    # fixed parallelisms: one variant, the spec's
    assert run_variants(spec_from_dict(_spec("fsdp")), _models(_spec("fsdp"))) == [RunVariant(False, "fsdp")]
    assert run_variants(spec_from_dict(_spec("ddp")), _models(_spec("ddp"))) == [RunVariant(False)]
    # both auto: the variants crossed
    both = _spec(checkpointing="auto")
    crossed = ModelsRecord.model_construct(
        spec=spec_from_dict(both), checkpointing=object(), sharding=_models(both).sharding
    )
    assert len(run_variants(spec_from_dict(both), crossed)) == 4
    # training without a plan: ddp
    assert training_spec(ok, Config(2, 16)).train.parallelism == "ddp"
    assert training_spec(ok, Config(2, 16), {"choice": {"parallelism": "fsdp"}}).train.parallelism == "fsdp"


def test_run_s_check_accepts_auto_with_a_method_fsdp_cannot_train_and_refuses_it_for_fsdp():
    """``tula run``'s check before any worker (:func:`tula.core.job_rules.check_parallelism`): auto
    with a method that needs the whole gradient plans ddp only, so it is not refused; fsdp is."""
    check_parallelism(spec_from_dict(_spec(method="ags")))
    check_parallelism(spec_from_dict(_spec(precision="fp16", noise_scale=True)))
    with pytest.raises(SpecError, match="which train.parallelism fsdp shards over the workers"):
        check_parallelism(spec_from_dict(_spec("fsdp", method="ags")))


def test_parallelism_auto_has_a_stored_model_key_of_its_own():
    """An auto profile measured the sharded step besides DDP's: its models are not a ddp (or fsdp)
    profile's, so the service must not reuse one for the other."""
    from tula.service.model_key import key_parts_for_new_job, model_key

    facts = {"device": "cpu", "cpu": "Test CPU", "gpu": None, "cores": 8, "torch": "2.14.1"}
    keys = {}
    for how in ("ddp", "fsdp", "auto"):
        parts = key_parts_for_new_job(_spec(how), facts, 2)
        keys[how] = (model_key(parts), parts)
    assert len({k for k, _ in keys.values()}) == 3
    assert "parallelism" not in keys["ddp"][1] and keys["auto"][1]["parallelism"] == "auto"


def _sharded_trial(n: int, b: int, peak: int) -> Trial:
    return Trial(n_workers=n, local_batch=b, global_batch=n * b, status="ok", peak_mem_bytes=peak, parallelism="fsdp")


def test_the_fit_measures_which_state_bytes_divide_by_n_where_two_cluster_sizes_ran():
    """Sharded peaks made by a sharded model that divides 3000 of the 4000 state bytes by N and holds
    700 gathered bytes: with N = 2 and 4 the fit finds both (the slope in 1/N and the rest); with
    one size it assumes the whole state divided, as before; the record reads back either way."""
    memory = memory_model(optimizer_state_bytes=2000, other_static_bytes=500)
    perf = PerfModel("ring", 10**6, 0.01, 0.001)
    true = ShardingEffect(gather_bytes=700, sync_s=0.0, n_workers=2, state_bytes=4000, trials=3, divided_bytes=3000)
    made = true.memory(memory)
    peaks = {(n, b): int(made.predict_peak_bytes(b, n)) for n, b in ((2, 4), (2, 64), (4, 32))}
    assert peaks[(4, 32)] - (memory.static_bytes + 32 * memory.bytes_per_sample) == 700 - 3000 * 3 // 4
    effect = fit_sharding_effect(memory, perf, [_sharded_trial(n, b, p) for (n, b), p in peaks.items()])
    assert effect is not None and (effect.divided_bytes, effect.gather_bytes) == (3000, 700), effect
    assert (effect.n_workers, effect.other_n_workers, effect.trials, effect.state_bytes) == (2, 4, 3, 4000)
    fitted = effect.memory(memory)
    for (n, b), p in peaks.items():
        assert fitted.predict_peak_bytes(b, n) == p
    assert fitted.predict_peak_bytes(8, 8) == made.predict_peak_bytes(8, 8)  # N = 8, not measured: the same line
    assert ShardingEffect.from_dict(effect.to_dict()) == effect
    assert MemoryModel.from_dict(fitted.to_dict()) == fitted
    # one size: the whole state divided (as a record without divided_bytes reads back)
    one = fit_sharding_effect(memory, perf, [_sharded_trial(2, b, peaks[(2, b)]) for b in (4, 64)])
    assert one is not None and one.divided_bytes is None and one.other_n_workers is None
    assert one.gather_bytes == 700 - 3000 // 2 + 4000 // 2  # the same peaks at N = 2
    old = {k: v for k, v in one.to_dict().items() if k not in ("divided_bytes", "other_n_workers")}
    assert ShardingEffect.from_dict(old) == one
    # a one-rank fully_shard trial is left out of the line (sharding_configs never runs one)
    with_one = fit_sharding_effect(
        memory, perf, [_sharded_trial(1, 8, 10**6), *[_sharded_trial(2, b, peaks[(2, b)]) for b in (4, 64)]]
    )
    assert with_one == one


def test_with_accumulation_the_sharded_step_all_gathers_at_every_micro_batch_and_reduce_scatters_once():
    """Sharded trials made by a step whose micro-batch all-gathers for 20 ms and whose step reduce-scatters
    for 10 ms more (the compute-only steps, every pass under no_sync, still all-gather): the fit splits
    the 30 ms sync into them, and a step of k micro-batches pays the all-gathers k times, the
    reduce-scatter once (as Sharded.no_sync runs it); a record without the split assumes 2/3."""
    perf = PerfModel("ring", 10**6, 0.01, 0.001)
    memory = memory_model(optimizer_state_bytes=2000)

    def trial(b: int) -> Trial:
        compute = 0.01 + 0.001 * b
        return replace(_sharded_trial(2, b, 10**6), t_compute_s=compute + 0.02, t_step_s=compute + 0.03)

    effect = fit_sharding_effect(memory, perf, [trial(4), trial(64)])
    assert effect is not None and effect.gather_s is not None
    assert effect.sync_s == pytest.approx(0.03) and effect.gather_s == pytest.approx(0.02)
    sharded = effect.perf(perf)
    assert sharded.sync_share_per_micro_batch == pytest.approx(2 / 3)
    compute = 0.01 + 0.001 * 8
    for k in (1, 2, 4):
        step = sharded.t_step_s(8, 2, accumulation=k)
        assert step == pytest.approx(k * (compute + 0.02) + 0.01), k
    assert sharded.to_dict()["sync_share_per_micro_batch"] == pytest.approx(2 / 3)
    assert PerfModel.from_dict(sharded.to_dict()) == sharded
    assert "sync_share_per_micro_batch" not in perf.to_dict()  # DDP's record as before
    assert perf.t_step_s(8, 2, accumulation=2) == pytest.approx(2 * compute)  # DDP: no sync at all here (beta 0)
    # a record fitted before the split: the all-gathers' share of the bytes (two all-gathers, one reduce-scatter)
    old = ShardingEffect.from_dict({k: v for k, v in effect.to_dict().items() if k != "gather_s"})
    assert old.gather_s is None and old.perf(perf).sync_share_per_micro_batch == pytest.approx(2 / 3)
    # compute-only steps no slower than DDP's compute: nothing paid per micro-batch
    quiet = fit_sharding_effect(memory, perf, [replace(trial(b), t_compute_s=0.01 + 0.001 * b) for b in (4, 64)])
    assert quiet is not None and quiet.gather_s == 0.0 and quiet.perf(perf).sync_share_per_micro_batch == 0.0


def test_the_sharded_variant_runs_at_a_second_cluster_size_of_two_or_more_only():
    """sharding_configs: the smallest N >= 2's two largest batches and half the smaller, and at the next N >= 2
    the local batch nearest its largest; a one-rank world is never a second size.  combined_configs (both
    ``auto``s): the checkpointed + sharded trial at the largest of the smallest N >= 2."""

    def ran(n: int, b: int) -> Trial:
        return Trial(n_workers=n, local_batch=b, global_batch=n * b, status="ok", sequence_length=32)

    trials = [ran(1, 8), ran(1, 128), ran(2, 4), ran(2, 64), ran(4, 2), ran(4, 32), ran(8, 1), ran(8, 16)]
    assert sharding_configs(trials) == [(2, 4), (2, 8), (2, 128), (4, 128)]
    assert sharding_configs([t for t in trials if t.n_workers <= 2]) == [(2, 4), (2, 8), (2, 128)]
    assert sharding_configs([ran(1, 8), ran(2, 4)]) == []  # one batch at N = 2: nothing to fit
    assert sharding_configs([ran(2, 1), ran(2, 8)]) == [(2, 2), (2, 16)]  # no half of one sample
    assert combined_configs(trials) == [(2, 128)] and combined_configs([ran(1, 8)]) == []


def test_planning_while_training_prices_the_variant_the_run_trains():
    """The live ranker (train.workers: {rule: plan}, the goodput schedule, the out-of-memory fallback's
    schedule) takes the models of the variant the run trains, as training gives them
    (tula.core.variants.models_as_trained): fsdp's sharded memory model where the plan chose fsdp,
    DDP's otherwise."""
    memory = memory_model(optimizer_state_bytes=2000)
    effect = ShardingEffect(gather_bytes=700, sync_s=0.01, n_workers=2, state_bytes=4000, trials=3, divided_bytes=3000)
    d = _spec()
    d["train"]["workers"] = {"rule": "plan", "min": 1, "max": 2}
    base = models_record(PerfModel("ring", 10**6, 0.01, 0.001), full=True, spec=d)
    models = ModelsRecord.from_dict({**base, "memory": memory.to_dict(), "sharding": effect.to_dict()})
    fsdp = training_spec(spec_from_dict(d), Config(2, 16), {"choice": {"parallelism": "fsdp"}})
    ddp = training_spec(spec_from_dict(d), Config(2, 16))
    given = models.to_json_dict()
    sharded_rank = worker_plan(fsdp, models_as_trained(given, fsdp.train)).ranker
    assert sharded_rank.memory is not None and sharded_rank.memory.sharded
    assert sharded_rank.memory.predict_peak_bytes(8, 2) == effect.memory(memory).predict_peak_bytes(8, 2)
    plain_rank = worker_plan(ddp, models_as_trained(given, ddp.train)).ranker
    assert plain_rank.memory is not None and not plain_rank.memory.sharded
    assert models_as_trained(given, fsdp.train) == variant_models(models, RunVariant(False, "fsdp")).to_json_dict()
    fixed = {**models.to_json_dict(), "spec": _spec("ddp")}  # not auto: the record as it is
    assert models_as_trained(fixed, ddp.train) is fixed
