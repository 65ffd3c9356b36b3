"""Planning for time to accuracy (issue #17): the gradient noise scale measured by a real
2-rank profile of a problem whose noise scale is known, the planner's epochs scaled by
(B_noise + B) / (B_noise + B0) against a hand calculation, and bad input as one sentence."""

from __future__ import annotations

import json

import pytest
from helpers import env_with_tests, models_record, run_tula, tula_in_process

from tula.core.errors import SpecError
from tula.core.fit import fit_noise_scale
from tula.core.perfmodel import PerfModel
from tula.core.plan import make_plan
from tula.core.records import PlanRecord
from tula.core.trial import NoiseMeasurement, Trial

PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)  # test_plan's hand-checked curves


def _nb(plan: PlanRecord) -> tuple[int, int]:
    return plan.choice.n_workers, plan.choice.global_batch


def test_epochs_to_accuracy_match_a_hand_calculation_and_a_small_noise_scale_prefers_small_batches():
    # per epoch N = 1: T = 10 / B + 1 and N = 2: T = 20 / B + 0.5 (test_plan); B0 = train.base_batch = 128
    plan = make_plan(models_record(PERF), "time_to_accuracy", noise_scale=10.0)
    row = next(r for r in plan.configurations if (r.n_workers, r.global_batch) == (1, 160))
    assert row.epochs_to_accuracy == pytest.approx((10 + 160) / (10 + 128))
    assert row.time_to_accuracy_s == pytest.approx((10 / 160 + 1) * (10 + 160) / 138)
    assert row.cost_to_accuracy == pytest.approx(row.time_to_accuracy_s)  # 1 $ per node-second, N = 1
    # N = 1: (10 + B)^2 / (138 B), least at B = 10 (0.290); N = 2: (200 / B + 25 + B / 2) / 138, least at B = 20 (0.326)
    assert _nb(plan) == (1, 10) and plan.choice.time_to_accuracy_s == pytest.approx(400 / 1380)
    assert _nb(make_plan(models_record(PERF), "time")) == (2, 1000)  # the fixed-epoch view: the largest batch
    assert plan.noise_scale is not None
    assert plan.noise_scale.to_json_dict() == {"b_noise": 10.0, "source": "what-if", "reference_batch": 128}
    assert "needs 0.145 epochs to reach what 1 reach at B0=128 (B_noise 10, a what-if)" in plan.reason
    # a large noise scale: every batch is efficient, so the choice is time's
    assert _nb(make_plan(models_record(PERF), "time_to_accuracy", noise_scale=1e6)) == (2, 1000)
    # cost to accuracy: N = 1 at 1 $/node-s: the same curve as its time; N = 2 costs twice its time
    assert _nb(make_plan(models_record(PERF), "cost_to_accuracy", noise_scale=10.0)) == (1, 10)
    # the knee of the time-to-accuracy curve lies on its falling part, at or below its least time
    knee = make_plan(models_record(PERF), "knee_to_accuracy", noise_scale=1000.0)
    for n, k in knee.knees.items():
        curve = knee.curves[n]
        times = curve.time_to_accuracy_s
        assert times is not None
        least = curve.global_batch[min(range(len(curve.global_batch)), key=times.__getitem__)]
        assert k.global_batch <= least


def test_the_noise_scale_is_one_sentence_when_missing_or_not_positive():
    with pytest.raises(
        SpecError, match="objective time_to_accuracy needs the gradient noise scale, and the profile"
    ) as e:
        make_plan(models_record(PERF), "time_to_accuracy")
    from tula.cli_options import spell  # the core names make_plan's argument; the command line, its flag

    assert str(e.value).endswith("give one as a what-if ('noise_scale')")
    assert e.value.spelled(spell).endswith("give one as a what-if (--noise-scale)")
    for bad in (0, -3.0, float("nan")):
        with pytest.raises(SpecError, match="the noise scale must be a positive number of samples"):
            make_plan(models_record(PERF), "time", noise_scale=bad)
    with pytest.raises(SpecError, match="objective must be one of time, cost, knee, time_to_accuracy"):
        make_plan(models_record(PERF), "fastest")


def _noise_trial(n_workers: int, noise: NoiseMeasurement | None = None) -> Trial:
    """A profiled trial of N workers (local batch 8) with the noise scale's measurement ``noise``."""
    return Trial(n_workers=n_workers, local_batch=8, global_batch=8 * n_workers, status="ok", noise=noise)


def test_the_pooled_noise_scale_and_its_error():
    trials = [
        _noise_trial(1, NoiseMeasurement(b_small=8, b_big=16, steps=2, b_simple=1.0, g2=[1.0, 3.0],
                                         trace_sigma=[30.0, 50.0])),
        _noise_trial(2, NoiseMeasurement(b_small=8, b_big=16, steps=1, b_simple=1.0, g2=[2.0], trace_sigma=[40.0])),
        _noise_trial(2),
    ]  # fmt: skip
    ns = fit_noise_scale(trials)
    assert ns.b_noise == pytest.approx(120 / 6) and ns.steps == 3
    loo = [90 / 5, 70 / 3, 80 / 4]  # leave one batch out
    mean = sum(loo) / 3
    se = (2 / 3 * sum((x - mean) ** 2 for x in loo)) ** 0.5
    assert (ns.low, ns.high) == (pytest.approx(20 - se), pytest.approx(20 + se))
    assert ns.worlds is not None and [w.n_workers for w in ns.worlds] == [1, 2]
    none = fit_noise_scale([_noise_trial(1)])
    assert none.b_noise is None and none.note is not None and none.note.startswith("not measured")
    swamped = NoiseMeasurement(b_small=8, b_big=16, steps=2, b_simple=None, g2=[1.0, -2.0], trace_sigma=[5.0, 5.0])
    flat = fit_noise_scale([_noise_trial(1, swamped)])
    assert flat.b_noise is None and "swamps the signal" in (flat.note or "")


@pytest.mark.slow
def test_a_profile_recovers_a_known_noise_scale_and_plans_to_accuracy(tmp_path):
    """Linear regression y = w* . x + e with d = 16 and unit noise, from w = 0: B_simple is
    d (1 + sigma^2) + 1 = 33 (tests/factories.py).  A real profile on 1 and 2 ranks measures
    it within 30 %; tula plan uses it, and refuses a noise scale that is not positive."""
    spec = {
        "name": "lin",
        "model": {"name": "factories:linear_at_zero"},
        "data": {"factory": "factories:linear_regression", "loader_workers": 0},
        "epochs": 10,
        "optimizer": {"name": "sgd", "lr": 1e-4, "momentum": 0.0},  # the few profile steps barely move w
        "train": {"loss": "mse"},
        "search": {"cluster_sizes": [1, 2], "min_batch": 32, "max_batch": 256, "max_accumulation_steps": 2},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "noise_steps": 20, "min_timed_s": 0},
    }
    (tmp_path / "lin.yaml").write_text(json.dumps(spec))

    r = tula_in_process("plan", "lin.yaml", "--objective", "time_to_accuracy", "--out", "plan.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    prof = json.loads((tmp_path / "profile.json").read_text())
    measured = [t for t in prof["trials"] if t.get("noise")]
    assert sorted(t["n_workers"] for t in measured) == [1, 2]  # the first trial of each world
    assert all(t["noise"]["steps"] == 20 and t["noise"]["seconds"] > 0 for t in measured)
    models = json.loads((tmp_path / "models.json").read_text())
    assert models["noise_scale"]["b_noise"] == pytest.approx(33, rel=0.3)
    # accumulation allowed: each world also timed its largest batch as 2 micro-batches, and the
    # fit says how far its step model is from that (judged on real workloads by the benchmark)
    checks = models["accumulation_check"]
    assert sorted(a["n_workers"] for a in checks) == [1, 2]
    assert all(a["accumulation_steps"] == 2 and a["t_step_s"] > 0 and a["predicted_t_step_s"] > 0 for a in checks)
    assert models["fit_error"]["accumulated_step_max_rel"] == max(a["rel_error"] for a in checks)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["objective"] == "time_to_accuracy" and plan["noise_scale"]["source"] == "profile"
    assert "B_noise" in " ".join(r.stdout.split()) and "to accuracy" in plan["reason"]
    r = run_tula("plan", "models.json", "--noise-scale", "-5", "--out", "p2.json", env=env_with_tests(), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "the noise scale must be a positive number of samples, not -5" in " ".join(r.stderr.split())
    assert not (tmp_path / "p2.json").exists()


def _capped(k_max: int) -> dict:
    """helpers.models_record of PERF whose memory (2000 B static + 100 B per sample, 12 kB with
    no safety margin) holds b <= 100, accumulating up to ``k_max`` micro-batches."""
    m = models_record(PERF, budget=12_000)
    m["spec"]["search"] |= {"memory_safety": 0.0, "max_accumulation_steps": k_max}
    return m


def test_accumulation_carries_a_batch_the_memory_caps_and_its_step_time_is_k_computes_plus_a_sync():
    # memory: 2000 B static + 100 B per sample (test_plan's model); 12 kB with no safety margin: b <= 100
    plain = make_plan(_capped(k_max=1), "time")
    assert plain.max_local_batch == 100 and _nb(plain) == (2, 200)  # N = 2 at b = 100: T = 20 / 200 + 0.5
    m = _capped(k_max=8)
    acc = make_plan(m, "time")
    # a row fits where its accumulated peak does: the micro-batch's step, the rest of the share's data (loaded
    # whole) and the gradients (1,000 B) held between the micro-batches
    row = next(r for r in acc.configurations if (r.n_workers, r.global_batch) == (1, 320))
    assert (row.accumulation_steps, row.micro_batch, row.feasible) == (5, 64, True)
    # N = 1: no sync, so k computes of 0.01 + 0.001 * 64 s
    assert row.t_step_s == pytest.approx(5 * (0.01 + 0.001 * 64))
    assert row.peak_mem_bytes == 2000 + 100 * 64 + 10 * (320 - 64) + 1000 <= 12_000
    # B = 640 on one worker: 8 micro-batches of 80 fit one step each, but not the share's (16,600 B): refused
    over = next(r for r in acc.configurations if (r.n_workers, r.global_batch) == (1, 640))
    assert (over.accumulation_steps, over.micro_batch, over.feasible, over.peak_mem_bytes) == (8, 80, False, 16600)
    assert over.reason.startswith("predicted peak of 8 micro-batches of 80 exceeds the memory budget")
    # N = 2 at B = 640: shares of 320 as 5 micro-batches of 64; the sync overlaps only the last
    big = next(r for r in acc.configurations if (r.n_workers, r.global_batch) == (2, 640))
    assert (big.accumulation_steps, big.micro_batch, big.feasible) == (5, 64, True)
    assert big.t_step_s == pytest.approx(5 * (0.01 + 0.001 * 64) + 0.01)
    # a share no k <= 8 splits into micro-batches of at most 100 (e.g. 997, prime) stays infeasible, saying so
    odd = [r for r in acc.configurations if not r.feasible]
    assert odd and all("no accumulation of up to 8 steps" in r.reason for r in odd)
    assert "accumulated" in acc.reason or acc.choice.accumulation_steps == 1


@pytest.mark.slow
def test_tula_train_at_a_plan_that_accumulates_trains_with_its_k(tiny_spec_dict, tmp_path):
    from tula.core.records import save_record
    from tula.core.spec import spec_from_dict
    from tula.pipeline import at_choice

    plan = make_plan(_capped(k_max=8), "time")
    assert _nb(plan) == (2, 320) and plan.choice.accumulation_steps == 2  # shares of 160 as 2 x 80
    save_record(plan, tmp_path / "plan.json")
    assert at_choice(spec_from_dict(tiny_spec_dict), plan.choice.to_json_dict()).train.accumulation_steps == 2
    (tmp_path / "spec.json").write_text(json.dumps(dict(tiny_spec_dict, epochs=1)))
    r = tula_in_process(
        "train", tmp_path / "spec.json", "--plan", tmp_path / "plan.json", "--method", "lbt", "--out", tmp_path / "run"
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    run = json.loads((tmp_path / "run" / "train.json").read_text())
    assert (run["n_workers"], run["global_batch"], run["accumulation_steps"], run["micro_batch"]) == (2, 320, 2, 80)
