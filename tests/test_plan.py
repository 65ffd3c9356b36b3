import math

import numpy as np
import pytest
from helpers import MODELS_D, models_record
from hypothesis import given, settings
from hypothesis import strategies as st

from tula.core.config import Config
from tula.core.errors import InfeasibleError
from tula.core.perfmodel import PerfModel
from tula.core.plan import GridPoint, Knee, Planner, find_knee, make_plan, pareto_frontier
from tula.core.records import PlanConstraints, PlanRecord, PlanRow

D = MODELS_D


def _models(perf: PerfModel, sizes=(1, 2), budget=None, oom=None, pricing=None, epochs=1):
    return models_record(perf, sizes=sizes, budget=budget, oom=oom, pricing=pricing, epochs=epochs)


# t_step = 0.01 + 0.001 b (+ 0.01 sync when N = 2), so with D = 1000 and E = 1:
#   N = 1: T = 10 / B + 1          N = 2: T = 20 / B + 0.5
# and at 1 $/node-second the cost is T * N:  N = 1: 10 / B + 1,  N = 2: 40 / B + 1
PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)


def _row(plan):
    c = plan.choice
    return c.n_workers, c.global_batch


def test_min_time_and_min_cost_on_hand_checked_curves():
    time_plan = make_plan(_models(PERF), "time")
    assert _row(time_plan) == (2, 1000)
    assert time_plan.choice.total_time_s == pytest.approx(20 / 1000 + 0.5)
    cost_plan = make_plan(_models(PERF), "cost")
    assert _row(cost_plan) == (1, 1000)
    assert cost_plan.choice.cost == pytest.approx(10 / 1000 + 1)
    assert "least predicted cost" in cost_plan.reason


def test_knee_of_a_hyperbola_is_at_the_geometric_mean():
    # for T = a / B + c on [10, 1000], Kneedle's knee is at sqrt(10 * 1000) = 100
    plan = make_plan(_models(PERF), "knee")
    for n in ("1", "2"):
        assert plan.knees[n].method == "kneedle"
        assert 90 <= plan.knees[n].global_batch <= 112
    assert plan.choice.n_workers == 2  # the faster of the two knees
    assert "knee" in plan.reason


def test_flat_curve_has_no_knee_and_falls_back():
    flat = PerfModel("ring", grad_bytes=10**6, c0=0.0, c1=0.001)  # T = D * c1: the same for every batch
    plan = make_plan(_models(flat, sizes=(1,)), "knee")
    assert plan.knees["1"].method == "fallback"
    assert _row(plan) == (1, 10)  # smallest batch within 5 % of the fastest
    assert "no knee found" in plan.reason
    idx, how = find_knee(np.array([1.0, 2.0, 3.0]), np.array([5.0, 5.0, 5.0]))
    assert (idx, how) == (0, "fallback")


def test_memory_bound_and_oom_make_configurations_infeasible():
    # static 2000 B + 100 B per sample, budget 24000 B with 10 % margin -> local batch <= 196
    plan = make_plan(_models(PERF, budget=24000), "time")
    assert plan.to_json_dict()["max_local_batch"] == 196
    assert plan.choice.local_batch <= 196
    assert _row(plan) == (2, 392)
    rows = plan.configurations
    assert all(not r.feasible for r in rows if r.local_batch > 196)
    assert all(r.feasible for r in rows if r.local_batch <= 196)
    plan2 = make_plan(_models(PERF, oom=150), "time")
    assert plan2.choice.local_batch < 150
    assert any("ran out of memory" in r.reason for r in plan2.configurations)
    with pytest.raises(InfeasibleError, match="no configuration is feasible"):
        make_plan(_models(PERF, budget=2500), "time")


def test_plan_rows_have_the_promised_fields_and_a_frontier():
    plan = make_plan(_models(PERF), "knee")
    need = {
        "n_workers",
        "global_batch",
        "local_batch",
        "t_step_s",
        "epoch_time_s",
        "total_time_s",
        "cost",
        "peak_mem_bytes",
        "feasible",
    }
    assert all(need <= set(r.to_json_dict()) for r in plan.configurations)
    assert sum(r.chosen for r in plan.configurations) == 1
    feasible = [(r.total_time_s, r.cost) for r in plan.configurations if r.feasible]
    front = plan.frontier
    assert {(r.total_time_s, r.cost) for r in front} == _non_dominated(feasible)
    assert len(front) == len(_non_dominated(feasible))
    assert front[0].n_workers == 2 and front[-1].n_workers == 1  # fastest uses 2 nodes, cheapest 1


def test_memory_pricing_changes_the_cheapest_batch():
    plan = make_plan(_models(PERF, pricing={"kind": "memory", "price_per_gb_hour": 3600.0 * 1e9}), "cost")
    # cost = T * N * (2000 + 100 b) bytes in GB-seconds; for N = 1: (10/B + 1)(2000 + 100 B) is least near B = 14
    assert plan.choice.n_workers == 1
    assert 10 <= plan.choice.global_batch <= 20


# --------------------------------------------------------------------------- against brute force
def _non_dominated(points) -> set:
    """The (time, cost) pairs no other pair beats in one and matches or beats in the other."""
    pts = set(points)
    return {p for p in pts if not any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in pts)}


def test_pareto_frontier():
    assert pareto_frontier(np.array([1.0, 2.0, 3.0, 4.0]), np.array([4.0, 3.0, 3.5, 1.0])) == [0, 1, 3]


_values = st.integers(0, 6).map(float) | st.floats(0, 100, allow_nan=False)  # small integers: many ties


@settings(max_examples=300, deadline=None)
@given(pts=st.lists(st.tuples(_values, _values), min_size=1, max_size=25))
def test_pareto_frontier_is_exactly_the_non_dominated_points(pts):
    t, c = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    front = pareto_frontier(t, c)
    assert len(set(front)) == len(front)
    assert [t[i] for i in front] == sorted(t[i] for i in front)  # by increasing time
    # one index per distinct non-dominated point, and nothing else
    assert {(t[i], c[i]) for i in front} == _non_dominated(pts)
    assert len(front) == len(_non_dominated(pts))
    # every point left out is matched or beaten in both by a frontier point
    for j in set(range(len(pts))) - set(front):
        assert any(t[i] <= t[j] and c[i] <= c[j] for i in front)


def _brute_force(perf: PerfModel, sizes, epochs, budget, oom, pricing):
    """Every (N, b) with b an integer local batch in the search space, with its feasibility,
    time and cost computed here from the equations (ring all-reduce, no overlap), not by Tula."""
    static, per_sample = 2000, 100  # the memory model of _models
    rows = []
    for n in sizes:
        for b in range(math.ceil(10 / n), 1000 // n + 1):
            feasible = (budget is None or static + per_sample * b <= 0.9 * budget) and (oom is None or b < oom)
            sync = 0.0 if n == 1 else perf.alpha * 2 * (n - 1) + perf.beta * 2 * (n - 1) / n * perf.grad_bytes
            t_step = perf.c0 + perf.c1 * b + sync
            total = epochs * D / (n * b) * t_step
            if pricing["kind"] == "fixed":
                cost = total / 3600 * n * pricing["price_per_node_hour"]
            else:
                cost = total / 3600 * n * (static + per_sample * b) / 1e9 * pricing["price_per_gb_hour"]
            rows.append({"n": n, "b": b, "feasible": feasible, "total": total, "cost": cost})
    return rows


@settings(max_examples=40, deadline=None)
@given(
    c0=st.floats(0, 0.05),
    c1=st.floats(1e-6, 1e-2),
    alpha=st.floats(0, 1e-3),
    beta=st.floats(0, 2e-8),
    sizes=st.sampled_from([(1,), (2,), (1, 2), (1, 2, 4), (2, 4)]),
    epochs=st.integers(1, 3),
    budget=st.none() | st.integers(3000, 150_000),
    oom=st.none() | st.integers(2, 600),
    pricing=st.sampled_from(
        [{"kind": "fixed", "price_per_node_hour": 3600.0}, {"kind": "memory", "price_per_gb_hour": 3600.0 * 1e9}]
    ),
    objective=st.sampled_from(["time", "cost"]),
)
def test_the_choice_is_the_brute_force_optimum(c0, c1, alpha, beta, sizes, epochs, budget, oom, pricing, objective):
    perf = PerfModel("ring", grad_bytes=10**6, c0=c0, c1=c1, alpha=alpha, beta=beta)
    rows = _brute_force(perf, sizes, epochs, budget, oom, pricing)
    feasible = [r for r in rows if r["feasible"]]
    models = _models(perf, sizes=sizes, budget=budget, oom=oom, pricing=pricing, epochs=epochs)
    if not feasible:
        with pytest.raises(InfeasibleError):
            make_plan(models, objective)
        return
    plan = make_plan(models, objective)
    key = "total" if objective == "time" else "cost"
    best = min(r[key] for r in feasible)
    choice = plan.choice
    got = choice.total_time_s if objective == "time" else choice.cost
    mine = next(r for r in rows if (r["n"], r["b"]) == (choice.n_workers, choice.local_batch))
    assert mine["feasible"] and choice.feasible
    assert got == pytest.approx(mine[key], rel=1e-9)  # the plan's figures are the equations'
    if objective == "time" or pricing["kind"] == "fixed":
        assert got == pytest.approx(best, rel=1e-9)  # optimal over every integer local batch
    else:  # memory pricing has an interior optimum between the plan's 16 points per octave
        assert best * (1 - 1e-9) <= got <= best * 1.01
    # every evaluated row agrees with the equations, and feasibility with the memory bound
    for r in plan.configurations:
        m = next(x for x in rows if (x["n"], x["b"]) == (r.n_workers, r.local_batch))
        assert r.feasible == m["feasible"]
        assert r.total_time_s == pytest.approx(m["total"], rel=1e-9)
        assert r.cost == pytest.approx(m["cost"], rel=1e-9)
    # the frontier is the brute-force frontier of the feasible rows
    evaluated = [(r.total_time_s, r.cost) for r in plan.configurations if r.feasible]
    assert {(r.total_time_s, r.cost) for r in plan.frontier} == _non_dominated(evaluated)


def test_knee_of_a_hand_made_elbow():
    """A steep straight drop to B = 128, then almost flat: the knee is the elbow."""
    x = np.array([16, 32, 64, 128, 256, 512, 1024], float)
    y = np.where(x <= 128, 100 - (x - 16) * 80 / 112, 20 - (x - 128) * 0.001)
    assert find_knee(x, y) == (3, "kneedle")
    # the same elbow moved to B = 64
    y2 = np.where(x <= 64, 100 - (x - 16) * 80 / 48, 20 - (x - 64) * 0.001)
    assert find_knee(x, y2) == (2, "kneedle")


def test_a_straight_line_has_no_knee_and_the_fallback_is_the_first_point_near_the_fastest():
    x = np.linspace(10, 1000, 50)
    y = 100 - 0.05 * x  # no curvature: Kneedle finds nothing
    idx, how = find_knee(x, y)
    assert how == "fallback"
    assert idx == next(i for i in range(len(y)) if y[i] <= 1.05 * y.min())  # 47: x = 959.4, y = 52.03 <= 52.5
    assert idx == 47
    # a curve within 5 % of its minimum everywhere: the smallest batch
    assert find_knee(np.array([10.0, 20, 30, 40, 50]), np.array([10.4, 10.3, 10.2, 10.0, 10.1])) == (0, "fallback")


# --------------------------------------------------------------------------- the planner's steps, one at a time
def _two_rows(planner: Planner) -> list[PlanRow]:
    """N = 2, B = 200 (T = 20 / B + 0.5 = 0.6 s, 1.2 $) and N = 1, B = 100 (T = 10 / B + 1 = 1.1 s, 1.1 $), predicted."""
    return planner.predict([planner.row(2, 100, True, None), planner.row(1, 100, True, None)])


def test_the_grid_has_each_cluster_sizes_local_batches_and_says_which_fit_in_memory():
    planner = Planner(_models(PERF, budget=24000))
    assert planner.b_mem == 196
    rows = planner.grid()
    for n, (lo, hi) in {1: (10, 1000), 2: (5, 500)}.items():
        local = [r.local_batch for r in rows if r.n_workers == n]
        assert (local[0], local[-1]) == (lo, hi) and local == sorted(local) and 196 in local
    assert all(r.feasible == (r.local_batch <= 196) for r in rows)
    assert all(r.global_batch == r.n_workers * r.local_batch for r in rows)
    too_big = {r.reason for r in rows if not r.feasible}
    assert too_big == {"predicted peak exceeds the memory budget (local batch > 196)"}


def test_a_row_splits_a_local_batch_into_micro_batches_that_fit_and_says_why_one_does_not():
    models = _models(PERF, budget=24000)
    models["spec"]["search"]["max_accumulation_steps"] = 4
    models["not_measured"] = {"2": "N=2 was not measured"}
    planner = Planner(models)
    point = planner.row(1, 300, True, 196)
    assert point == GridPoint(n_workers=1, local_batch=300, accumulation_steps=2, candidate=True, reason="")
    assert (point.global_batch, point.micro_batch, point.feasible) == (300, 150, True)
    assert point.config == Config(1, 300, 2)
    prime = planner.row(1, 997, False, 196)  # no k <= 4 divides 997
    assert (prime.accumulation_steps, prime.micro_batch, prime.feasible) == (1, 997, False)
    assert prime.reason == (
        "predicted peak exceeds the memory budget (local batch > 196), and no accumulation of up to 4 steps "
        "splits 997 into micro-batches that fit"
    )
    assert planner.row(2, 10, True, 196).reason == "N=2 was not measured"


def test_predict_gives_each_row_its_step_epoch_time_cost_and_peak():
    rows = _two_rows(Planner(_models(PERF)))
    # t_step = 0.01 + 0.001 b + 0.01 sync at N = 2; D / B steps an epoch; 1 $ per node-second
    for r, (t_step, epoch, cost) in zip(rows, ((0.12, 0.6, 1.2), (0.11, 1.1, 1.1))):
        assert r.t_step_s == pytest.approx(t_step)
        assert r.epoch_time_s == r.epoch_steps_s == r.total_time_s == pytest.approx(epoch)
        assert r.epoch_fixed_s == 0.0
        assert r.cost == pytest.approx(cost)
        assert r.peak_mem_bytes == 2000 + 100 * 100
        assert not r.given("time_to_accuracy_s") and not r.given("expected_preemptions")  # no noise scale, not spot
        assert "time_to_accuracy_s" not in r.to_json_dict() and r.config == Config(r.n_workers, r.global_batch)


def test_predict_to_accuracy_scales_the_epochs_by_the_noise_scale():
    planner = Planner(_models(PERF), noise_scale=72.0)
    assert planner.noise.reference_batch == 128
    rows = _two_rows(planner)
    # epochs * (B_noise + B) / (B_noise + B0): (72 + 200) / 200 = 1.36 at B = 200, 172 / 200 = 0.86 at B = 100
    assert [r.epochs_to_accuracy for r in rows] == pytest.approx([1.36, 0.86])
    assert [r.time_to_accuracy_s for r in rows] == pytest.approx([1.36 * 0.6, 0.86 * 1.1])
    assert [r.cost_to_accuracy for r in rows] == pytest.approx([1.36 * 1.2, 0.86 * 1.1])


def test_the_constraints_mark_the_rows_and_the_candidates_are_those_that_meet_them():
    planner = Planner(_models(PERF), "cost", {"deadline": 1.0})
    rows = _two_rows(planner)  # predict marks whether each row meets the constraints
    assert [r.meets_constraints for r in rows] == [True, False]  # 0.6 s and 1.1 s against 1 s
    assert planner.candidates(rows) == ([0, 1], [0])
    chosen, why = planner.choose(rows, [0], {})
    assert (chosen, why) == (0, f"least predicted cost within {planner.cons.describe('$')}")
    both = Planner(_models(PERF), "cost", {"deadline": 1.0, "budget": 1.0})
    rows = _two_rows(both)
    assert [r.meets_constraints for r in rows] == [False, False]
    with pytest.raises(InfeasibleError) as err:
        both.candidates(rows)
    assert (
        str(err.value)
        == "no configuration stays within the 1 $ budget: the cheapest costs 1.1 $ (N=1, B=100), 0.1 $ over it"
    )


def test_the_choice_by_the_objectives_rule_and_its_reason():
    for objective, expected in (("time", 0), ("cost", 1)):
        planner = Planner(_models(PERF), objective)
        rows = _two_rows(planner)
        assert planner.choose(rows, [0, 1], {})[0] == expected
    chosen, why = planner.choose(rows, [0, 1], {})
    assert planner.reason(rows, [0, 1], chosen, why) == (
        "least predicted cost: N=1, B=100 (b=100) trains 1 epochs in 1.1 s for 1.1 $ "
        "(1.83x the fastest, 1.00x the cheapest)"
    )


def test_curves_and_knees_per_cluster_size():
    planner = Planner(_models(PERF))
    rows = [*_two_rows(planner), *planner.predict([planner.row(1, 50, True, None)])]  # N = 1, B = 50: 1.2 s, 1.2 $
    assert planner.by_size(rows, [0, 1, 2]) == {1: [1, 2], 2: [0]}
    curves = planner.curves(rows, [0, 1, 2])
    assert list(curves) == ["1", "2"] and curves["1"]["global_batch"] == [100, 50]
    assert curves["1"]["total_time_s"] == pytest.approx([1.1, 1.2]) and curves["2"]["cost"] == pytest.approx([1.2])
    # fewer than 3 points: no Kneedle, the smallest batch within 5 % of the fastest
    assert planner.knees(rows, [0, 1, 2]) == {
        "1": Knee(row=1, global_batch=100, method="fallback"),
        "2": Knee(row=0, global_batch=200, method="fallback"),
    }
    rows = planner.predict(planner.grid())
    knees = planner.knees(rows, list(range(len(rows))))
    for n, k in knees.items():  # the hyperbola's knee (test_knee_of_a_hyperbola_is_at_the_geometric_mean)
        assert k.method == "kneedle" and 90 <= k.global_batch <= 112
        assert (rows[k.row].n_workers, rows[k.row].global_batch) == (int(n), k.global_batch)


def test_the_record_marks_the_choice_and_holds_the_frontier_and_the_counts():
    planner = Planner(_models(PERF), "time", {"budget": 1.15})
    rows = _two_rows(planner)
    feas, eligible = planner.candidates(rows)
    assert (feas, eligible) == ([0, 1], [1])  # 1.2 $ is over the budget
    rec = planner.record(rows, feas, eligible, {}, {}, 1, "why")
    assert isinstance(rec, PlanRecord) and [r.chosen for r in rec.configurations] == [False, True]
    assert [r.chosen for r in rows] == [False, False]  # the rows given are frozen: the record's are marked copies
    assert rec.choice == rec.configurations[1] and rec.choice.chosen
    assert [(r.n_workers, r.global_batch) for r in rec.frontier] == [(2, 200), (1, 100)]  # by time
    assert rec.constraints == PlanConstraints(deadline_s=None, budget=1.15, unit="$", n_feasible=2, n_meeting=1)
    assert (rec.objective, rec.reason, rec.spot_comparison, rec.to_json_dict()["measured_ratio"]) == (
        "time",
        "why",
        None,
        None,
    )


def test_a_free_price_plans_and_compares_without_dividing_by_zero():
    """A price of 0 (an owned cluster, a free spot tier) is valid: the plan's reason says the
    choice is 1.00x the cheapest, and a free spot tier is cheaper at any preemption rate."""
    free = make_plan(models_record(PERF, pricing={"kind": "fixed", "price_per_node_hour": 0.0}), objective="cost")
    assert free.choice.cost == 0.0 and "1.00x the cheapest" in free.reason
    spot = {"kind": "spot", "price_per_node_hour": 1.0, "spot_price_per_node_hour": 0.0}
    spot["preemption_rate_per_node_hour"] = 0.1
    p = make_plan(models_record(PERF, pricing=spot), objective="time", compare_spot=True)
    assert p.spot_comparison is not None and p.spot_comparison.cheaper == "spot"
    assert "spot is free, so cheaper at any preemption rate" in p.spot_comparison.sentence
