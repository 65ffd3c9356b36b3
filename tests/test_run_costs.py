"""Predicting the run that trains (#26): the epoch-time formula and the run costs' fit, by hand;
a plan for a method the profile did not run says so; and a real 2-rank profile and training
of digits whose epochs, for AGS and LBT, are predicted within the spread measured beside them."""

import statistics

import numpy as np
import pytest
from helpers import epoch, local_launcher, train_record

from tula.core.perfmodel import PerfModel
from tula.core.plan import make_plan
from tula.core.records import RunTrial
from tula.core.run_costs import (
    RunCosts,
    compare_with_plan,
    epoch_steps,
    epoch_time_s,
    fit_run_costs,
    measured_epoch_s,
    run_costs_for,
)
from tula.core.spec import spec_from_dict
from tula.engine.memory import MemoryModel

COSTS = RunCosts(
    method="ags",
    n_workers=(1, 4),
    step_extra_s=(0.01, 0.03),
    periodic_s=0.03,
    periodic_every=None,
    eval_fixed_s=0.1,
    eval_sharded_s=0.2,
    epoch_end_s=0.05,
)


def test_the_epoch_is_its_whole_steps_with_the_method_and_its_end():
    assert epoch_steps(1000, 300) == 3 and list(epoch_steps(1000, np.array([300, 1000, 2000]))) == [3, 1, 1]
    # N = 2: 3 steps of 0.1 + 0.01 (the nearest measured N is 1), then 0.1 + 0.2 / 2 + 0.05 + 0.03 once
    assert epoch_time_s(0.1, 300, 2, 1000, COSTS) == pytest.approx(3 * 0.11 + 0.28)
    assert epoch_time_s(0.1, 300, 2, 1000) == pytest.approx(0.3)  # no run costs: whole steps only
    # the planner's Eq. 4a: D / B steps, every sample once
    assert epoch_time_s(0.1, 300, 2, 1000, COSTS, whole_steps=False) == pytest.approx(1000 / 300 * 0.11 + 0.28)
    arr = epoch_time_s(np.array([0.1, 0.1]), np.array([300, 300]), np.array([3, 8]), 1000, COSTS)
    assert arr == pytest.approx([3 * 0.13 + 0.1 + 0.2 / 3 + 0.08, 3 * 0.13 + 0.1 + 0.2 / 8 + 0.08])
    every = RunCosts(method="ags", periodic_s=0.02, periodic_every=2)
    assert every.epoch_fixed_s(1, 5) == pytest.approx(3 * 0.02)  # steps 0, 2, 4
    # a negative extra measured in noise never makes a step shorter than 5 % of the plain one
    neg = RunCosts(method="ags", n_workers=(1,), step_extra_s=(-1.0,))
    assert epoch_time_s(0.1, 300, 1, 1000, neg) == pytest.approx(3 * 0.005)


def test_the_nearest_measured_cluster_size_gives_the_extra():
    c = RunCosts(method="ags", n_workers=(1, 3), step_extra_s=(0.01, 0.03))
    assert [c.step_extra_at(n) for n in (1, 2, 3, 8)] == [0.01, 0.01, 0.03, 0.03]  # a tie goes to the smaller
    assert RunCosts(method="ags").step_extra_at(4) == 0.0
    # the periodic work likewise; a record without it per cluster size has its one value everywhere
    p = RunCosts(method="ags", periodic_s=0.1, periodic_n_workers=(1, 4), periodic_by_n_s=(0.01, 0.2))
    assert [p.periodic_at(n) for n in (1, 2, 3, 8)] == [0.01, 0.01, 0.2, 0.2]
    assert list(p.periodic_at(np.array([1, 4]))) == [0.01, 0.2]
    assert RunCosts(method="ags", periodic_s=0.1).periodic_at(4) == 0.1


def _run_trial(n, run, plain, due, eval_s, end, ckpt, method="ags"):
    return {
        "n_workers": n, "method": method, "status": "ok", "global_batch": 64, "steps_per_epoch": 20,
        "update_every": 20, "t_run_step_s": run, "t_step_plain_s": plain, "t_due_step_s": due,
        "eval_s": eval_s, "epoch_end_s": end, "checkpoint_s": ckpt,
    }  # fmt: skip


def test_the_run_costs_fit_a_hand_made_record():
    trials = [
        _run_trial(1, 0.012, 0.010, 0.020, 0.3, 0.35, 0.05),
        _run_trial(2, 0.016, 0.013, 0.020, 0.2, 0.26, 0.04),
        _run_trial(2, 0.5, 0.1, None, 9.0, 9.0, 9.0, method="lars"),  # another method: not read
        {"n_workers": 4, "method": "ags", "status": "skipped", "note": "x"},
    ]
    assert [RunTrial.model_validate(t).to_json_dict() for t in trials] == trials  # typed, written back as read
    c = fit_run_costs(trials, "ags")
    assert c.n_workers == (1, 2) and c.step_extra_s == pytest.approx((0.002, 0.003))
    assert c.periodic_s == pytest.approx(statistics.median([0.008, 0.004])) and c.periodic_every is None
    # per cluster size too: AGS's factor measurement all-reduces at N = 2, not at N = 1
    assert c.periodic_n_workers == (1, 2) and c.periodic_by_n_s == pytest.approx((0.008, 0.004))
    assert [c.periodic_at(n) for n in (1, 2, 8)] == pytest.approx([0.008, 0.004, 0.004])
    assert c.epoch_fixed_s(1, 20) - c.epoch_fixed_s(2, 20) == pytest.approx(0.1 + 0.008 - 0.004)
    # evaluation a + c / N through (1, 0.3) and (2, 0.2): a = 0.1, c = 0.2
    assert (c.eval_fixed_s, c.eval_sharded_s) == pytest.approx((0.1, 0.2))
    assert c.epoch_end_s == pytest.approx(0.1)  # (0.35 - 0.3 + 0.05), (0.26 - 0.2 + 0.04)
    assert RunCosts.from_dict(c.to_dict()) == c
    one = fit_run_costs(trials[:1], "ags")  # one cluster size: evaluation sharded alone
    assert (one.eval_fixed_s, one.eval_sharded_s) == pytest.approx((0.0, 0.3))
    assert fit_run_costs(trials, "adascale") is None
    assert c.notes == ()
    # a method step measured below the plain step is the machine's noise: 0 there, and a note says so
    noisy = fit_run_costs([_run_trial(1, 0.012, 0.010, 0.020, 0.3, 0.35, 0.05),
                           _run_trial(2, 0.010, 0.013, 0.020, 0.2, 0.26, 0.04)], "ags")  # fmt: skip
    assert noisy.step_extra_s == pytest.approx((0.002, 0.0))
    assert any("below the plain step at N = 2" in n for n in noisy.notes)


def _models(run_costs=None):
    spec = spec_from_dict({"search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 256}})
    mem = MemoryModel(1000, 1000, 0, 0, 0, 90, 10, (1, 2), (2100, 2200), "cpu")
    perf = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)
    return {
        "kind": "tula.models", "version": 1, "search": "full", "device": "cpu", "spec": spec.to_dict(),
        "dataset_size": 1000, "memory_budget_bytes": None, "memory": mem.to_dict(), "memory_probed": mem.to_dict(),
        "perf": perf.to_dict(), "oom_local_batch": None, "fit_error": {"t_step_median_rel": 0.0}, "trials": [],
        "run_costs": None if run_costs is None else run_costs.to_dict(),
    }  # fmt: skip


def test_a_plan_says_what_its_epochs_include_and_which_method_was_not_measured():
    from rich.console import Console

    from tula.report import plan_table

    plan = make_plan(_models(COSTS), "time")
    assert plan.method == "ags" and plan.run_costs is not None and plan.run_costs.method == "ags"
    c = plan.choice
    assert c.epoch_time_s == pytest.approx(c.epoch_steps_s + c.epoch_fixed_s)
    assert c.epoch_fixed_s > 0.1 and "method 'ags''s step" in plan.run_costs_note
    other = make_plan(_models(COSTS), "time", method="lars")
    assert other.method == "lars" and "'lars''s step was not measured" in other.run_costs_note
    assert other.run_costs is not None
    assert other.run_costs.step_extra_s == () and other.run_costs.eval_sharded_s == 0.2
    assert other.to_json_dict()["run_costs"]["step_extra_s"] == []  # written as the list it was
    console = Console(width=200, record=True)
    console.print(plan_table(other))
    text = " ".join(console.export_text().split())
    assert "of which end s" in text and "'lars''s step was not measured" in text
    bare = make_plan(_models(), "time")
    assert bare.run_costs is None and "has no run trial" in bare.run_costs_note
    costs, note = run_costs_for(_models(), "ags")
    assert costs is None and "plain DDP steps" in note


def test_a_training_record_is_compared_with_the_plan_epoch_by_epoch():
    models = _models(COSTS)
    history = [
        epoch(e, global_batch=200, n_workers=2, steps=5, epoch_time_s=1.0, epoch_end_s=0.2, checkpoint_s=0.1,
              epoch_wall_s=w)
        for e, w in ((1, 9.0), (2, 1.3), (3, 1.2), (4, 1.4))
    ]  # fmt: skip
    run = compare_with_plan(train_record(history), models)
    # predicted: 5 steps of t_step(100, 2) = 0.01 + 0.1 + 0.01 sync, + 0.01 extra, then the epoch's end
    p = 5 * (0.12 + 0.01) + 0.1 + 0.1 + 0.05 + 0.03
    assert run.history[0].predicted_epoch_s == pytest.approx(p)
    assert run.prediction is not None
    assert run.prediction.median_ratio == pytest.approx(1.3 / p)  # the first epoch left out
    assert run.prediction.epochs_compared == 3
    assert measured_epoch_s(epoch(epoch_time_s=1.0, epoch_end_s=0.5)) == 1.5  # a record without the wall time
    line = epoch(epoch_time_s=1.0, epoch_end_s=0.5).to_json_dict()
    assert measured_epoch_s(line) == 1.5  # its metrics line as read from JSON


def test_the_epochs_are_predicted_at_the_sequence_length_trained():
    """The plan chose another L (search.sequence_lengths) and training built its data at it
    (job_rules.training_spec sets the spec's data.sequence_length): each epoch is predicted at
    that L, not at the length the models were fitted at (32 here); a record without a length in
    its spec (images) is predicted at the fitted length as before."""
    from dataclasses import replace

    from tula.core.errors import RecordError
    from tula.core.records import TrainRecord
    from tula.core.run_costs import predicted_epoch_s, trained_sequence_length

    models = _models(COSTS)
    perf = PerfModel.from_dict(models["perf"])
    models["perf"] = replace(perf, sequence_length=32, c1_per_token=perf.c1 / 32).to_dict()  # c1 per token
    spec = spec_from_dict(
        {"model": {"name": "tiny_gpt"}, "data": {"name": "text", "sequence_length": 64},
         "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 256, "sequence_lengths": [32, 64]}}
    )  # fmt: skip
    lines = [
        {"epoch": e, "global_batch": 200, "n_workers": 2, "epoch_time_s": 1.0, "epoch_end_s": 0.2,
         "checkpoint_s": 0.1, "epoch_wall_s": w, "train_loss": 1.0, "test_loss": 1.0, "test_top1": 0.5,
         "steps": 5, "steps_done": 5 * e, "lr": 0.1}
        for e, w in ((1, 9.0), (2, 1.3), (3, 1.2))
    ]  # fmt: skip
    history = [epoch(**line) for line in lines]
    at_64, at_32 = (predicted_epoch_s(models, "ags", 200, 2, sequence_length=n) for n in (64, 32))
    assert at_32 == pytest.approx(predicted_epoch_s(models, "ags", 200, 2))  # the fitted length: as before
    # 5 steps of t_step(100, 2): compute 0.01 + 100 * 0.001 * (1 + (64 - 32) / 32) at L = 64, sync 0.01, extra 0.01
    assert at_64 == pytest.approx(5 * (0.01 + 0.2 + 0.01 + 0.01) + 0.1 + 0.1 + 0.05 + 0.03)
    run = compare_with_plan(train_record(history, spec=spec.to_dict()), models)
    assert trained_sequence_length(train_record(spec=spec.to_dict())) == 64
    assert [h.predicted_epoch_s for h in run.history] == pytest.approx([at_64] * 3)
    ratios = [h.measured_to_predicted for h in run.history]
    assert ratios == pytest.approx([9.0 / at_64, 1.3 / at_64, 1.2 / at_64])
    assert run.prediction is not None and run.prediction.median_ratio == pytest.approx(1.25 / at_64)
    # the typed record (what tula run hands on) reads its spec the same
    typed = TrainRecord(kind="tula.train", version=1, spec=spec.to_dict(), method="ags", n_workers=2,
                        global_batch=200, steps_per_epoch=5, epochs=3, steps_done=15, history=lines)  # fmt: skip
    assert compare_with_plan(typed, models).history[1].predicted_epoch_s == pytest.approx(at_64)
    # trained at the fitted length, or without a length in the spec: the fitted length's prediction
    at_ref = spec.model_copy(update={"data": spec.data.model_copy(update={"sequence_length": 32})})
    digits = spec_from_dict({"search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 256}})
    for record in ({"spec": at_ref.to_dict()}, {"spec": digits.to_dict()}, {}):  # {}: the helper's digits
        other = compare_with_plan(train_record(history, **record), models)
        assert other.history[1].predicted_epoch_s == pytest.approx(at_32)
    assert trained_sequence_length(train_record(spec=digits.to_dict())) is None
    assert trained_sequence_length(train_record()) is None
    damaged = train_record(spec=spec.to_dict()).to_json_dict()
    damaged["spec"]["data"]["sequence_length"] = 0
    with pytest.raises(RecordError, match=r"damaged training run record: field 'spec'.*sequence_length"):
        TrainRecord.from_dict(damaged)  # a damaged record is refused where it is read, before a comparison


@pytest.mark.slow
@pytest.mark.serial  # the profile's step times against the training's
@pytest.mark.parametrize("method", ["ags", "lbt"])
def test_a_real_profile_predicts_the_epochs_that_tula_train_runs(tmp_path, tiny_spec_dict, method):
    """2 ranks on digits: the profile's run trial measures the method's step and the epoch's end;
    the epochs trained afterwards (after the first) take the predicted time, within the
    spread measured beside them: the epochs' own (max - min) / median, plus the profile's
    step spread at the trained batch, plus 10 %."""
    from tula.core.fit import fit_models
    from tula.engine.profile import profile
    from tula.engine.train import train

    d = dict(tiny_spec_dict, epochs=6)
    d["train"] = {"method": method, "warmup_epochs": 0}
    d["search"] = {"cluster_sizes": [2], "min_batch": 64, "max_batch": 128}
    d["profile"] = {**d["profile"], "min_timed_s": 0.3}
    spec = spec_from_dict(d)
    launcher = local_launcher()
    rec = profile(spec, launcher=launcher)
    (rt,) = rec.run_trials or []
    assert rt.status == "ok" and rt.method == method and rt.n_workers == 2
    assert rt.step_times_s is not None and rt.plain_step_times_s is not None
    assert len(rt.step_times_s) == len(rt.plain_step_times_s) >= 8
    models = fit_models(rec).to_json_dict()  # compare_with_plan reads the models as their JSON
    assert models["run_costs"]["method"] == method
    run = compare_with_plan(train(spec, method, 2, 128, tmp_path / "run", launcher=launcher), models)
    later = run.history[1:]
    walls = [measured_epoch_s(h) for h in later]
    for h in later:
        assert h.epoch_wall_s is not None and h.checkpoint_s is not None
        assert h.epoch_wall_s >= h.epoch_time_s + h.checkpoint_s
    trial = next(t for t in rec.trials if t.global_batch == 128)
    tolerance = 0.10 + (max(walls) - min(walls)) / statistics.median(walls) + (trial.t_step_spread or 0.0)
    assert run.prediction is not None and run.prediction.median_ratio is not None
    ratio = run.prediction.median_ratio
    assert abs(ratio - 1.0) <= tolerance, (
        f"{method}: epochs took {ratio:.2f}x the prediction (tolerance {tolerance:.0%}); "
        f"measured {walls}, predicted {later[0].predicted_epoch_s:.3f} s"
    )


def test_the_dashboard_and_the_table_show_each_epoch_beside_its_prediction():
    from rich.console import Console

    from tula.report import train_table
    from tula.service.dashboard_charts import train_charts

    history = [
        epoch(e, global_batch=200, n_workers=2, steps=5, epoch_end_s=0.2, checkpoint_s=0.1, epoch_wall_s=w,
              test_top1=0.5)
        for e, w in ((1, 2.0), (2, 1.3))
    ]  # fmt: skip
    plain = train_record(history, local_batch=100)
    run = compare_with_plan(plain, _models(COSTS))
    html = train_charts(run)
    assert "Epoch time: measured and planned" in html
    predicted = run.history[1].predicted_epoch_s
    assert predicted is not None
    ratio = 1.3 / predicted
    assert f"epoch 2 at N=2, B=200: 1.300 s measured, {predicted:.3f} s planned ({ratio:.2f}x)" in html
    console = Console(width=200, record=True)
    console.print(train_table(run))
    text = console.export_text()
    assert "planned s" in text and f"{ratio:.2f}x" in text
    assert "Epoch time" not in train_charts(plain)  # not planned by Tula: no such chart


def test_a_finished_runs_measured_ratio_scales_a_replan_of_its_method_only():
    """tula.core.run_costs.measured_ratio: the median measured / predicted of a run's epochs
    after the first; make_plan(measured=...) scales every step and epoch by it for the method
    the run trained, and only says so for another."""
    from tula.core.run_costs import measured_ratio, predicted_epoch_s
    from tula.service.replan import Problem, Replan, replan_from_models

    models = _models(COSTS)
    p = predicted_epoch_s(models, "ags", 200, 2)
    history = [epoch(e, global_batch=200, n_workers=2, steps=5, epoch_time_s=w, epoch_wall_s=w)
               for e, w in ((1, 9.0), (2, 1.2 * p), (3, 1.3 * p), (4, 1.25 * p))]  # fmt: skip
    run = train_record(history)
    m = measured_ratio(run, models)
    assert m is not None and m.to_json_dict() == {
        "ratio": pytest.approx(1.25), "epochs_compared": 3, "method": "ags", "n_workers": 2, "global_batch": 200,
    }  # fmt: skip
    assert measured_ratio(train_record(), models) is None  # no epoch
    base, scaled = make_plan(models, "time"), make_plan(models, "time", measured=m)
    for a, b in zip(base.configurations, scaled.configurations):
        assert b.epoch_time_s == pytest.approx(1.25 * a.epoch_time_s)
        assert b.t_step_s == pytest.approx(1.25 * a.t_step_s)
    assert scaled.measured_ratio is not None and scaled.measured_ratio.applied
    assert "epochs scaled by 1.25" in scaled.reason
    other = make_plan(models, "time", method="lars", measured=m)
    assert other.measured_ratio is not None and other.measured_ratio.applied is False
    assert "is not applied" in other.reason
    assert other.choice.epoch_time_s == pytest.approx(make_plan(models, "time", method="lars").choice.epoch_time_s)
    with pytest.raises(Problem, match="no training run yet"):
        replan_from_models(models, Replan(use_measured=True), None)
    with pytest.raises(Problem, match="no epoch to compare"):
        replan_from_models(models, Replan(use_measured=True), train_record().to_json_dict())  # as the store has it


def test_timed_indices_cover_the_time_asked_and_one_due_step():
    from tula.engine.run_trial import MAX_STEPS, MIN_STEPS, timed_indices

    # after warm-up steps 0 and 1: at least MIN_STEPS, or as many as 2 s at 0.1 s a pair
    assert timed_indices(1, 0.0, 0.1, None) == list(range(2, 2 + MIN_STEPS))
    assert timed_indices(1, 2.0, 0.1, None) == list(range(2, 22))
    assert timed_indices(30, 2.0, 0.1, None) == list(range(2, 32))  # `timed` is a floor
    assert len(timed_indices(1, 1e6, 0.1, None)) == MAX_STEPS  # the time asked is capped
    assert len(timed_indices(1, 1.0, 0.0, None)) == MAX_STEPS  # an instant step: no division by 0
    # periodic work every 4 steps falls due at 4 and 8 within 2..9; every 50: one due step added
    assert timed_indices(1, 0.0, 0.1, 4) == list(range(2, 10))
    assert timed_indices(1, 0.0, 0.1, 50) == [*range(2, 10), 50]
