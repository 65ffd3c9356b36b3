import numpy as np
import pytest

from tula.errors import InfeasibleError
from tula.memory import MemoryModel
from tula.perfmodel import PerfModel
from tula.plan import find_knee, make_plan, pareto_frontier
from tula.spec import spec_from_dict

D = 1000


def _models(perf: PerfModel, sizes=(1, 2), budget=None, oom=None, pricing=None):
    spec = spec_from_dict({"epochs": 1, "search": {"cluster_sizes": list(sizes), "min_batch": 10, "max_batch": 1000},
                           "pricing": pricing or {"kind": "fixed", "price_per_node_hour": 3600.0}})
    mem = MemoryModel(param_bytes=1000, grad_bytes=1000, optimizer_state_bytes=0, buffer_bytes=0,
                      other_static_bytes=0, activation_bytes_per_sample=90, batch_bytes_per_sample=10,
                      probe_local_batches=(1, 2), probe_peak_bytes=(2100, 2200), device="cpu")
    return {"kind": "tula.models", "spec": spec.to_dict(), "dataset_size": D, "memory_budget_bytes": budget,
            "memory": mem.to_dict(), "perf": perf.to_dict(), "oom_local_batch": oom, "trials": []}


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
    need = {"n_workers", "global_batch", "local_batch", "t_step_s", "epoch_time_s", "total_time_s", "cost",
            "peak_mem_bytes", "feasible"}
    assert all(need <= set(r) for r in plan["configurations"])
    assert sum(r["chosen"] for r in plan["configurations"]) == 1
    front = plan["frontier"]
    times = [r["total_time_s"] for r in front]
    costs = [r["cost"] for r in front]
    assert times == sorted(times) and costs == sorted(costs, reverse=True)
    assert front[0]["n_workers"] == 2 and front[-1]["n_workers"] == 1  # fastest uses 2 nodes, cheapest 1


def test_memory_pricing_changes_the_cheapest_batch():
    plan = make_plan(_models(PERF, pricing={"kind": "memory", "price_per_gb_hour": 3600.0 * 1e9}), "cost")
    # cost = T * N * (2000 + 100 b) bytes in GB-seconds; for N = 1: (10/B + 1)(2000 + 100 B) is least near B = 14
    assert plan["choice"]["n_workers"] == 1
    assert 10 <= plan["choice"]["global_batch"] <= 20


def test_pareto_frontier():
    assert pareto_frontier(np.array([1.0, 2.0, 3.0, 4.0]), np.array([4.0, 3.0, 3.5, 1.0])) == [0, 1, 3]
