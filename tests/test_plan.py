import math

import numpy as np
import pytest
from helpers import MODELS_D, models_record
from hypothesis import given, settings
from hypothesis import strategies as st

from tula.core.errors import InfeasibleError
from tula.core.perfmodel import PerfModel
from tula.core.plan import find_knee, make_plan, pareto_frontier

D = MODELS_D


def _models(perf: PerfModel, sizes=(1, 2), budget=None, oom=None, pricing=None, epochs=1):
    return models_record(perf, sizes=sizes, budget=budget, oom=oom, pricing=pricing, epochs=epochs)


# t_step = 0.01 + 0.001 b (+ 0.01 sync when N = 2), so with D = 1000 and E = 1:
#   N = 1: T = 10 / B + 1          N = 2: T = 20 / B + 0.5
# and at 1 $/node-second the cost is T * N:  N = 1: 10 / B + 1,  N = 2: 40 / B + 1
PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)


def _row(plan):
    c = plan["choice"]
    return c["n_workers"], c["global_batch"]


def test_min_time_and_min_cost_on_hand_checked_curves():
    time_plan = make_plan(_models(PERF), "time")
    assert _row(time_plan) == (2, 1000)
    assert time_plan["choice"]["total_time_s"] == pytest.approx(20 / 1000 + 0.5)
    cost_plan = make_plan(_models(PERF), "cost")
    assert _row(cost_plan) == (1, 1000)
    assert cost_plan["choice"]["cost"] == pytest.approx(10 / 1000 + 1)
    assert "least predicted cost" in cost_plan["reason"]


def test_knee_of_a_hyperbola_is_at_the_geometric_mean():
    # for T = a / B + c on [10, 1000], Kneedle's knee is at sqrt(10 * 1000) = 100
    plan = make_plan(_models(PERF), "knee")
    for n in ("1", "2"):
        assert plan["knees"][n]["method"] == "kneedle"
        assert 90 <= plan["knees"][n]["global_batch"] <= 112
    assert plan["choice"]["n_workers"] == 2  # the faster of the two knees
    assert "knee" in plan["reason"]


def test_flat_curve_has_no_knee_and_falls_back():
    flat = PerfModel("ring", grad_bytes=10**6, c0=0.0, c1=0.001)  # T = D * c1: the same for every batch
    plan = make_plan(_models(flat, sizes=(1,)), "knee")
    assert plan["knees"]["1"]["method"] == "fallback"
    assert _row(plan) == (1, 10)  # smallest batch within 5 % of the fastest
    assert "no knee found" in plan["reason"]
    idx, how = find_knee(np.array([1.0, 2.0, 3.0]), np.array([5.0, 5.0, 5.0]))
    assert (idx, how) == (0, "fallback")


def test_memory_bound_and_oom_make_configurations_infeasible():
    # static 2000 B + 100 B per sample, budget 24000 B with 10 % margin -> local batch <= 196
    plan = make_plan(_models(PERF, budget=24000), "time")
    assert plan["max_local_batch"] == 196
    assert plan["choice"]["local_batch"] <= 196
    assert _row(plan) == (2, 392)
    rows = plan["configurations"]
    assert all(not r["feasible"] for r in rows if r["local_batch"] > 196)
    assert all(r["feasible"] for r in rows if r["local_batch"] <= 196)
    plan2 = make_plan(_models(PERF, oom=150), "time")
    assert plan2["choice"]["local_batch"] < 150
    assert any("ran out of memory" in r["reason"] for r in plan2["configurations"])
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
    assert all(need <= set(r) for r in plan["configurations"])
    assert sum(r["chosen"] for r in plan["configurations"]) == 1
    feasible = [(r["total_time_s"], r["cost"]) for r in plan["configurations"] if r["feasible"]]
    front = plan["frontier"]
    assert {(r["total_time_s"], r["cost"]) for r in front} == _non_dominated(feasible)
    assert len(front) == len(_non_dominated(feasible))
    assert front[0]["n_workers"] == 2 and front[-1]["n_workers"] == 1  # fastest uses 2 nodes, cheapest 1


def test_memory_pricing_changes_the_cheapest_batch():
    plan = make_plan(_models(PERF, pricing={"kind": "memory", "price_per_gb_hour": 3600.0 * 1e9}), "cost")
    # cost = T * N * (2000 + 100 b) bytes in GB-seconds; for N = 1: (10/B + 1)(2000 + 100 B) is least near B = 14
    assert plan["choice"]["n_workers"] == 1
    assert 10 <= plan["choice"]["global_batch"] <= 20


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
    choice = plan["choice"]
    got = choice["total_time_s"] if objective == "time" else choice["cost"]
    mine = next(r for r in rows if (r["n"], r["b"]) == (choice["n_workers"], choice["local_batch"]))
    assert mine["feasible"] and choice["feasible"]
    assert got == pytest.approx(mine[key], rel=1e-9)  # the plan's figures are the equations'
    if objective == "time" or pricing["kind"] == "fixed":
        assert got == pytest.approx(best, rel=1e-9)  # optimal over every integer local batch
    else:  # memory pricing has an interior optimum between the plan's 16 points per octave
        assert best * (1 - 1e-9) <= got <= best * 1.01
    # every evaluated row agrees with the equations, and feasibility with the memory bound
    for r in plan["configurations"]:
        m = next(x for x in rows if (x["n"], x["b"]) == (r["n_workers"], r["local_batch"]))
        assert r["feasible"] == m["feasible"]
        assert r["total_time_s"] == pytest.approx(m["total"], rel=1e-9)
        assert r["cost"] == pytest.approx(m["cost"], rel=1e-9)
    # the frontier is the brute-force frontier of the feasible rows
    evaluated = [(r["total_time_s"], r["cost"]) for r in plan["configurations"] if r["feasible"]]
    assert {(r["total_time_s"], r["cost"]) for r in plan["frontier"]} == _non_dominated(evaluated)


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
