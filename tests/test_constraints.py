"""Plans under a deadline and a budget, spot pricing, and the duration parser (issue #11, part 3).

The curves are the hand-checked ones of test_plan.py: t_step = 0.01 + 0.001 b (+ 0.01 sync
when N = 2), D = 1000, E = 1, 1 $ per node-second, so

    N = 1: T = 10 / B + 1     cost = 10 / B + 1
    N = 2: T = 20 / B + 0.5   cost = 40 / B + 1          (B from 10 to 1000)
"""

import copy
import json
import math

import numpy as np
import pytest
from helpers import MODELS_D, assert_refused, models_record, profile_record, run_tula, tiny_spec, tula_in_process

from tula.core.errors import InfeasibleError, RecordError, SpecError
from tula.core.fit import fit_models
from tula.core.perfmodel import PerfModel
from tula.core.plan import Constraints, make_plan
from tula.core.pricing import FixedPricing, SpotPricing
from tula.core.records import PLAN_KIND, VERSIONS, load_record, save_record, validate_record
from tula.core.spec import format_duration, parse_duration, spec_from_dict

D = MODELS_D
PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)


def _models(perf=PERF, pricing=None, constraints=None, sizes=(1, 2)) -> dict:
    return models_record(perf, sizes=sizes, pricing=pricing, constraints=constraints, full=True)


def _nb(plan):
    return plan.choice.n_workers, plan.choice.global_batch


# --------------------------------------------------------------------------- durations
@pytest.mark.parametrize(
    "text, seconds",
    [
        ("8h", 28800),
        ("90min", 5400),
        ("1h30m", 5400),
        ("30 s", 30),
        ("5us", 5e-6),
        ("2d", 172800),
        (28800, 28800),
        ("1.5 hours", 5400),
        ("250ms", 0.25),
    ],
)
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["soon", "8x", "-1h", "1h 30", "", "h", float("inf"), -5, True])
def test_a_bad_duration_is_one_sentence(bad):
    with pytest.raises(ValueError, match="is not a duration; use seconds or a number with a unit"):
        parse_duration(bad)


def test_durations_read_back_in_sentences():
    assert [format_duration(s) for s in (0.52, 42, 5400, 33480, 3 * 86400)] == [
        "520 ms",
        "42.0 s",
        "90.0 min",
        "9.3 h",
        "3.0 d",
    ]


# --------------------------------------------------------------------------- constraints on hand-checked curves
def test_no_constraint_chooses_as_before_and_records_that_every_row_meets_them():
    plan = make_plan(_models(), "cost")
    assert _nb(plan) == (1, 1000)
    c = plan.constraints
    assert c.deadline_s is None and c.budget is None and c.n_meeting == c.n_feasible
    assert all(r.meets_constraints for r in plan.configurations)


def test_a_deadline_moves_the_cheapest_choice_to_two_nodes():
    # unconstrained the cheapest is N=1, B=1000 (1.01 $ in 1.01 s); within 0.6 s only N = 2 with B >= 200 remains,
    # whose cheapest is B = 1000: 40 / 1000 + 1 = 1.04 $, in 0.52 s
    plan = make_plan(_models(), "cost", {"deadline": "0.6s"})
    assert _nb(plan) == (2, 1000)
    assert plan.choice.cost == pytest.approx(1.04)
    assert plan.choice.total_time_s == pytest.approx(0.52)
    rows = plan.configurations
    for r in rows:  # exactly the rows within 0.6 s meet it
        assert r.meets_constraints == (r.total_time_s <= 0.6)
    assert not any(r.meets_constraints for r in rows if r.n_workers == 1)
    assert plan.constraints.n_meeting == sum(r.meets_constraints for r in rows)
    assert "within the 600 ms deadline" in plan.reason
    assert plan.spec.constraints.deadline_s == pytest.approx(0.6)


def test_a_budget_moves_the_fastest_choice_to_one_node():
    # unconstrained the fastest is N=2, B=1000 (0.52 s for 1.04 $); at most 1.03 $ leaves N = 1 with B >= 334,
    # whose fastest is B = 1000: 1.01 s
    plan = make_plan(_models(), "time", Constraints(budget=1.03))
    assert _nb(plan) == (1, 1000)
    assert plan.choice.total_time_s == pytest.approx(1.01)
    assert all(r.cost <= 1.03 for r in plan.configurations if r.meets_constraints)
    assert min(r.global_batch for r in plan.configurations if r.meets_constraints) >= 334


def test_an_infeasible_deadline_names_the_deadline_and_the_shortfall():
    with pytest.raises(InfeasibleError) as e:
        make_plan(_models(), "time", {"deadline": 0.5})
    msg = str(e.value)
    assert msg == (
        "no configuration finishes within the 500 ms deadline: the fastest takes 520 ms (N=2, B=1000), 20 ms too long"
    )


def test_an_infeasible_budget_names_the_budget_and_the_shortfall():
    with pytest.raises(InfeasibleError) as e:
        make_plan(_models(), "cost", {"budget": 1.0})
    assert str(e.value) == (
        "no configuration stays within the 1 $ budget: the cheapest costs 1.01 $ (N=1, B=1000), 0.01 $ over it"
    )


def test_constraints_met_alone_but_not_together():
    # within 0.6 s: N = 2 only, at least 1.04 $; within 1.03 $: N = 1 only, at least 1.01 s
    with pytest.raises(InfeasibleError) as e:
        make_plan(_models(), "cost", {"deadline": "600ms", "budget": 1.03})
    msg = str(e.value)
    assert msg.startswith("no configuration meets both the 600 ms deadline and the 1.03 $ budget")
    assert "the cheapest within the deadline costs 1.04 $ (N=2, B=1000), 0.01 $ over the budget" in msg
    assert "the fastest within the budget takes 1.0 s (N=1, B=1000), 410 ms past the deadline" in msg
    assert len(msg.splitlines()) == 1


def test_both_constraints_missed_name_both():
    with pytest.raises(InfeasibleError) as e:
        make_plan(_models(), "knee", {"deadline": 0.5, "budget": 1.0})
    msg = str(e.value)
    assert "500 ms deadline" in msg and "1 $ budget" in msg and "20 ms too long" in msg and "0.01 $ over" in msg


def test_knee_that_misses_the_deadline_gives_way_to_the_nearest_that_meets_it():
    free = make_plan(_models(), "knee")
    knee_b = free.knees["2"].global_batch  # about 100 (the hyperbola's knee), T = 0.7 s
    assert 90 <= knee_b <= 112
    plan = make_plan(_models(), "knee", {"deadline": 0.6})
    ok = [r for r in plan.configurations if r.feasible and r.meets_constraints]
    assert {r.n_workers for r in ok} == {2}
    # the nearest to the knee in log batch among those meeting the deadline: the smallest such batch
    assert _nb(plan) == (2, min(r.global_batch for r in ok))
    assert plan.choice.total_time_s <= 0.6
    assert "every knee misses the 600 ms deadline" in plan.reason


def test_a_knee_that_meets_the_constraints_is_kept():
    assert _nb(make_plan(_models(), "knee", {"deadline": "1h", "budget": 100})) == _nb(make_plan(_models(), "knee"))


def test_the_spec_carries_constraints_and_an_argument_replaces_them():
    m = _models(constraints={"deadline": "0.6s"})
    assert _nb(make_plan(m, "cost")) == (2, 1000)
    assert _nb(make_plan(m, "cost", Constraints())) == (1, 1000)  # explicitly none
    with pytest.raises(SpecError, match="constraint 'deadline'"):
        make_plan(_models(), "cost", {"deadline": "soon"})
    with pytest.raises(SpecError, match="is not a constraint"):
        make_plan(_models(), "cost", {"deadlines": "1h"})
    with pytest.raises(SpecError, match="constraints.deadline"):
        spec_from_dict({"constraints": {"deadline": "tomorrow"}})


def test_plan_records_are_version_2_and_version_1_plans_still_load(tmp_path):
    plan = make_plan(_models(), "cost", {"deadline": "0.6s", "budget": 2})
    assert plan.version == VERSIONS[PLAN_KIND] == 2
    back = load_record(save_record(plan, tmp_path / "plan.json"))
    assert back["constraints"]["deadline_s"] == pytest.approx(0.6) and back["constraints"]["budget"] == 2
    assert [r["meets_constraints"] for r in back["configurations"]] == [
        r.meets_constraints for r in plan.configurations
    ]
    # a plan written before constraints existed
    old = copy.deepcopy(json.loads(json.dumps(make_plan(_models(), "cost").to_json_dict())))
    old["version"] = 1
    for key in ("constraints", "spot_comparison"):
        del old[key]
    for r in [old["choice"], *old["configurations"], *old["frontier"]]:
        del r["meets_constraints"]
    (tmp_path / "v1.json").write_text(json.dumps(old))
    v1 = load_record(tmp_path / "v1.json")
    assert v1["version"] == 1 and v1["constraints"] is None and v1["spot_comparison"] is None
    assert all(r["meets_constraints"] for r in v1["configurations"])
    # a version 2 plan must say what it was planned under
    bad = dict(old, version=2)
    with pytest.raises(RecordError, match="'constraints' is missing"):
        validate_record(bad, "plan.json")


# --------------------------------------------------------------------------- spot pricing
def _monte_carlo_wall_s(work_s, rate_per_s, tau_s, restart_s, runs=40000, seed=0):
    """Simulate preempted runs directly: each checkpoint interval is retried until it runs
    through without a preemption; a preemption costs the time since the checkpoint and the restart."""
    rng = np.random.default_rng(seed)
    segments = [tau_s] * int(work_s // tau_s) + ([work_s % tau_s] if work_s % tau_s else [])
    total = np.zeros(runs)
    for s in segments:
        pending = np.ones(runs, bool)
        while pending.any():
            t = rng.exponential(1.0 / rate_per_s, size=runs)
            hit = pending & (t < s)
            done = pending & ~hit
            total[done] += s
            total[hit] += t[hit] + restart_s
            pending = hit
    return total.mean()


def test_spot_expected_time_by_hand_and_by_simulating_preemptions():
    # 1 h of work on one node preempted once an hour on average, a checkpoint every 10 min, 60 s to restart:
    # 6 intervals, each (e^(600/3600) - 1)(3600 + 60) s in expectation
    spot = SpotPricing(
        price_per_node_hour=1.0, preemption_rate_per_node_hour=1.0, checkpoint_interval_s=600, restart_s=60
    )
    hand = 6 * (math.exp(1 / 6) - 1) * (3600 + 60)
    assert hand == pytest.approx(3982.7, abs=0.1)
    assert float(spot.expected_time_s(3600, 1)) == pytest.approx(hand, rel=1e-12)
    assert float(spot.expected_preemptions(3600, 1)) == pytest.approx(6 * (math.exp(1 / 6) - 1), rel=1e-12)
    assert float(spot.cost(spot.expected_time_s(3600, 1), 1)) == pytest.approx(hand / 3600)
    # a partial last interval: 1000 s = 600 + 400, on 4 nodes (rate 4 per hour)
    hand2 = ((math.exp(4 * 600 / 3600) - 1) + (math.exp(4 * 400 / 3600) - 1)) * (3600 / 4 + 60)
    assert float(spot.expected_time_s(1000, 4)) == pytest.approx(hand2, rel=1e-12)
    # the renewal formula against preemptions drawn at random
    for work, n in ((3600, 1), (1000, 4)):
        mc = _monte_carlo_wall_s(work, n / 3600, 600, 60)
        assert float(spot.expected_time_s(work, n)) == pytest.approx(mc, rel=0.01)
    # no preemptions: the uninterrupted time; first order: T + L T (tau / 2 + R)
    assert float(SpotPricing(1.0, 0.0, 600, 60).expected_time_s(3600, 8)) == pytest.approx(3600)
    small = SpotPricing(1.0, 0.001, 600, 60)
    assert float(small.expected_time_s(3600, 1)) == pytest.approx(3600 + 0.001 * 1 * (300 + 60), rel=1e-4)


def test_spot_checkpoints_every_epoch_by_default():
    spot = SpotPricing(1.0, 2.0, None, 30)
    # 10 epochs of 360 s on 2 nodes: rate 4 per hour, each epoch (e^(0.4) - 1)(900 + 30)
    assert float(spot.expected_time_s(3600, 2, 360)) == pytest.approx(10 * (math.exp(0.4) - 1) * 930, rel=1e-12)
    with pytest.raises(ValueError, match="epoch time"):
        spot.expected_time_s(3600, 2)


def test_break_even_rate_is_where_spot_and_on_demand_cost_the_same():
    spot = SpotPricing(1.0, 0.5, 600, 60)
    rate = spot.break_even_rate(3600, 4, on_demand_price_per_node_hour=3.0)
    at = SpotPricing(1.0, rate, 600, 60)
    spot_cost = float(at.cost(at.expected_time_s(3600, 4), 4))
    assert spot_cost == pytest.approx(float(FixedPricing(3.0).cost(3600, 4)), rel=1e-6)
    assert SpotPricing(3.0, 0.5, 600, 60).break_even_rate(3600, 4, 3.0) is None  # never cheaper


def _spot_models(rate, price=1.0, on_demand=3.0):
    return _models(
        pricing={
            "kind": "spot",
            "spot_price_per_node_hour": price * 3600,
            "price_per_node_hour": on_demand * 3600,
            "preemption_rate_per_node_hour": rate,
            "checkpoint_interval_s": 0.1,
            "restart_s": 0.05,
        }
    )


def test_a_spot_plan_prices_the_expected_time():
    plan = make_plan(_spot_models(rate=3600.0), "cost")  # one preemption per node-second
    c = plan.choice
    spot = SpotPricing(3600.0, 3600.0, 0.1, 0.05)
    assert c.total_time_s == pytest.approx(float(spot.expected_time_s(c.failure_free_time_s, c.n_workers)))
    assert c.cost == pytest.approx(c.total_time_s * c.n_workers)  # 1 $ per node-second on spot
    assert c.total_time_s > c.failure_free_time_s
    assert "expected" in plan.reason and "preemptions" in plan.reason


def test_compare_spot_says_when_spot_is_cheaper_and_when_not():
    # spot at a third of the on-demand price: cheaper while E[T] / T < 3
    cheap = make_plan(_spot_models(rate=36.0), "cost", compare_spot=True).spot_comparison
    assert cheap is not None and cheap.cheaper == "spot" and cheap.sentence.startswith("spot is cheaper by")
    assert cheap.break_even_rate_per_node_hour is not None and cheap.break_even_rate_per_node_hour > 36.0
    dear = make_plan(_spot_models(rate=72000.0), "cost", compare_spot=True).spot_comparison
    assert dear is not None and dear.cheaper == "on_demand" and dear.sentence.startswith("on-demand is cheaper by")
    assert dear.break_even_rate_per_node_hour is not None and dear.break_even_rate_per_node_hour < 72000.0
    # the on-demand plan is the fixed-price plan of the same job
    od = make_plan(_models(pricing={"kind": "fixed", "price_per_node_hour": 3 * 3600.0}), "cost")
    assert dear.on_demand.cost == pytest.approx(od.choice.cost)
    # from an on-demand spec the comparison plans spot
    m = _models(
        pricing={
            "kind": "fixed",
            "price_per_node_hour": 3 * 3600.0,
            "spot_price_per_node_hour": 3600.0,
            "preemption_rate_per_node_hour": 36.0,
            "checkpoint_interval_s": 0.1,
            "restart_s": 0.05,
        }
    )
    from_on_demand = make_plan(m, "cost", compare_spot=True).spot_comparison
    assert from_on_demand is not None and from_on_demand.spot == cheap.spot
    with pytest.raises(SpecError, match="spot_price_per_node_hour"):
        make_plan(_models(), "cost", compare_spot=True)


def test_spot_pricing_needs_its_price_and_rate():
    with pytest.raises(SpecError, match="spot pricing needs spot_price_per_node_hour"):
        spec_from_dict({"pricing": {"kind": "spot", "preemption_rate_per_node_hour": 0.1}})
    p = spec_from_dict(
        {
            "pricing": {
                "kind": "spot",
                "spot_price_per_node_hour": 0.9,
                "preemption_rate_per_node_hour": 0.1,
                "checkpoint_interval_s": "10min",
                "restart_s": "2min",
            }
        }
    ).pricing
    assert (p.checkpoint_interval_s, p.restart_s) == (600, 120)


# --------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def models_json(tmp_path_factory):
    """A models record fitted (by Tula's fit) to step times made from PERF."""
    spec = tiny_spec(profile=False)
    path = tmp_path_factory.mktemp("models") / "models.json"
    save_record(fit_models(validate_record(profile_record(spec), "test")), path)
    return path


def test_cli_plan_under_a_deadline_and_its_bad_inputs(models_json, tmp_path):
    r = run_tula(
        "plan", models_json, "--objective", "cost", "--deadline", "1h", "--budget", "100", "--out", tmp_path / "p.json",
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["constraints"]["deadline_s"] == 3600 and plan["constraints"]["budget"] == 100
    for args, words in (
        (("--deadline", "1ms"), "no configuration finishes within the 1 ms deadline"),
        (("--budget", "0"), "no configuration stays within the 0 $ budget"),
        (("--deadline", "soon"), "--deadline: 'soon' is not a duration"),
        (("--budget", "-1"), "--budget must be a non-negative amount"),
        (("--compare-spot",), "needs pricing.spot_price_per_node_hour"),
        (("--pricing", "kind=spot"), "spot pricing needs"),
        (("--pricing", "color=red"), "unknown field 'pricing.color'"),
    ):
        r = tula_in_process("plan", models_json, "--out", tmp_path / "q.json", *args)  # through tula.cli.main
        assert r.returncode == 2, (args, r.stderr)
        err = " ".join(r.stderr.split())
        assert words in err and "Traceback" not in err, (args, err)
        assert_refused(r, words)
        assert not (tmp_path / "q.json").exists()
    r = run_tula("plan", models_json, "--out", tmp_path / "q.json", "--budget", "-1", timeout=120)  # the real command
    assert_refused(r, "--budget must be a non-negative amount")
    assert not (tmp_path / "q.json").exists()
    r = run_tula(
        "plan",
        models_json,
        "--objective",
        "cost",
        "--out",
        tmp_path / "s.json",
        "--compare-spot",
        "--pricing",
        "spot_price_per_node_hour=0.8",
        "--pricing",
        "preemption_rate_per_node_hour=0.05",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "spot vs on-demand" in r.stdout and "spot is cheaper" in " ".join(r.stdout.split())
