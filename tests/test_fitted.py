"""One prediction (#43): the planner, the simulator, the live ranker and the run-cost comparisons
predict a configuration as :meth:`tula.core.fitted.FittedModels.predict` does, from the models a
real profile fitted (the session's finished tiny pipeline); predicting many configurations at
once gives what predicting them one by one gives; a record without a model, or with a damaged
one, is one sentence."""

import copy

import numpy as np
import pytest

from tula.core.config import Config
from tula.core.errors import RecordError, SpecError
from tula.core.fitted import FittedModels
from tula.core.live_plan import Ranker
from tula.core.plan import make_plan
from tula.core.pricing import SpotPricing, make_pricing
from tula.core.records import ModelsRecord
from tula.core.run_costs import fitted_step_s, predicted_epoch_s, predicted_step_s
from tula.core.schedules import Caps
from tula.core.simulate import fitted_step_s as simulated_fitted_step_s
from tula.core.simulate import simulator_from_models
from tula.core.spec import spec_from_dict

#: the same number computed as one element of an array or as a scalar may differ in its last bit
#: (numpy's vectorised power, where the fitted overlap gamma is not 1)
REL = 1e-12

#: (N, B, k) within the tiny spec's space (cluster sizes 1 and 2, batches 16 to 256)
CONFIGS = [Config(1, 16), Config(1, 64), Config(2, 64), Config(2, 64, 2), Config(2, 256), Config(1, 250, 2)]


@pytest.fixture(scope="module")
def models(tiny_pipeline) -> dict:
    return tiny_pipeline.record("models.json")


def _arrays(configs: list[Config]) -> dict:
    return {
        "n_workers": [c.n_workers for c in configs],
        "global_batch": [c.global_batch for c in configs],
        "accumulation_steps": [c.accumulation_steps for c in configs],
    }


def test_the_fitted_models_are_read_from_the_record(models):
    fitted = FittedModels.from_record(models)
    spec = spec_from_dict(models["spec"])
    assert fitted.dataset_size == models["dataset_size"] and fitted.epochs == spec.epochs
    assert fitted.method == spec.train.method and fitted.run_costs is not None  # the pipeline's run trials
    assert fitted.network.collective == models["perf"]["collective"]
    assert fitted.ranks_per_node is None  # one host: the flat model
    assert fitted.noise_scale == (models.get("noise_scale") or {}).get("b_noise")
    # the pydantic record gives the same models
    assert FittedModels.from_record(ModelsRecord.model_validate(models)) == fitted
    # another method: its step is the plain one, the epoch's end is kept
    other = FittedModels.from_record(models, method="lars")
    assert other.method == "lars" and other.run_costs is not None and other.run_costs.step_extra_s == ()
    assert "'lars''s step was not measured" in other.run_costs_note


def test_the_plan_writes_what_the_fitted_models_predict(models):
    """Every row of a plan (on demand, then on spot) is FittedModels.predict over the rows'
    configurations: Eq. 4a's D / B steps, the spec's epochs priced as one run."""
    spec = spec_from_dict(models["spec"])
    spot = {"kind": "spot", "spot_price_per_node_hour": 1.0, "preemption_rate_per_node_hour": 2.0}
    # and under a memory budget that fits a local batch of about 40: micro-batches, and rows that do not fit
    budgeted = copy.deepcopy(models)
    memory = FittedModels.from_record(models).memory_model()
    budgeted["memory_budget_bytes"] = int(memory.predict_budget_bytes(40) / (1 - spec.search.memory_safety)) + 1
    budgeted["spec"]["search"]["max_accumulation_steps"] = 2
    for record, pricing in ((models, None), (models, spot), (budgeted, None)):
        plan = make_plan(record, "time", pricing=pricing)
        rows = plan.configurations
        pm = make_pricing(spec_from_dict({**models["spec"], "pricing": pricing or models["spec"]["pricing"]}).pricing)
        p = FittedModels.from_record(record).predict(
            [r.config for r in rows],
            pricing=pm,
            epochs=spec.epochs,
            whole_steps=False,
        )
        assert len(p) == len(rows) > 10
        for key in ("t_step_s", "epoch_time_s", "epoch_fixed_s", "total_time_s", "cost"):
            assert [getattr(r, key) for r in rows] == pytest.approx(getattr(p, key).tolist(), rel=REL), key
        assert [r.peak_mem_bytes for r in rows] == p.peak_mem_bytes.tolist()
        assert [r.micro_batch for r in rows] == p.micro_batch.tolist()
        assert [r.feasible for r in rows] == p.feasible.tolist()  # both cluster sizes were measured
        if record is budgeted:
            assert plan.max_local_batch == 40 and 0 < sum(p.feasible) < len(p)
            assert any(r.accumulation_steps == 2 and r.feasible for r in rows)
        if isinstance(pm, SpotPricing):
            assert p.expected_preemptions is not None and p.expected_preemptions.max() > 0
            assert [r.expected_preemptions for r in rows] == pytest.approx(p.expected_preemptions.tolist(), rel=REL)
            assert [r.failure_free_time_s for r in rows] == pytest.approx(p.failure_free_time_s.tolist(), rel=REL)


def test_the_simulator_the_ranker_and_run_costs_predict_what_the_fitted_models_do(models):
    fitted = FittedModels.from_record(models)
    method = fitted.method
    p = fitted.predict(CONFIGS)  # the runner's floor(D / B) steps, on the network the ranks ran on
    assert not np.allclose(p.epoch_time_s, p.t_step_s * fitted.dataset_size / p.global_batch)  # the run costs count
    sim = simulator_from_models(models)  # no what-if: at the profiled N its network is the fitted one
    ranker = Ranker(models, method)
    for i, c in enumerate(CONFIGS):
        one = p.at(i)
        n, big_b, k = c.n_workers, c.global_batch, c.accumulation_steps
        # run_costs: the plan's prediction of a training run's epochs and steps
        assert predicted_epoch_s(models, method, big_b, n, k) == pytest.approx(one["epoch_time_s"], rel=REL)
        assert predicted_step_s(models, method, big_b, n, k) == pytest.approx(one["method_step_s"], rel=REL)
        assert fitted_step_s(models, big_b, n, k) == pytest.approx(one["t_step_s"], rel=REL)
        if k == 1:
            assert simulated_fitted_step_s(models, big_b / n, n) == pytest.approx(one["t_step_s"], rel=REL)
        # the simulator
        assert sim.epoch_s(big_b, n, k) == pytest.approx(one["epoch_time_s"], rel=REL)
        assert sim.t_step_s(sim.perf.collective, big_b / n, n, k) == pytest.approx(one["t_step_s"], rel=REL)
        # the live ranker, where the options of that batch include (N, k)
        options = ranker.options(big_b, Caps(fitted.dataset_size, c.micro_batch, n, n, None, k))
        assert [(o.global_batch, o.accumulation_steps) for o in options] == [(big_b, k)]
        assert options[0].epoch_s == pytest.approx(one["epoch_time_s"], rel=REL)
    # a constant batch simulated: its rows are the prediction on the simulator's network, each epoch priced alone
    rows = [r for r in sim.constant(64, [1, 2, 4, 64, 128]) if r.collective == sim.perf.collective]
    q = fitted.predict(n_workers=[1, 2, 4, 64], global_batch=64, network=sim.network(), pricing=sim.pricing, epochs=1)
    assert [r.t_step_s for r in rows[:4]] == pytest.approx(q.t_step_s.tolist(), rel=REL)
    assert [r.t_sync_s for r in rows[:4]] == pytest.approx(q.t_sync_s.tolist(), rel=REL)
    assert [r.epoch_time_s for r in rows[:4]] == pytest.approx(q.epoch_time_s.tolist(), rel=REL)
    assert [r.total_time_s for r in rows[:4]] == pytest.approx((sim.epochs * q.total_time_s).tolist(), rel=REL)
    assert [r.cost for r in rows[:4]] == pytest.approx((sim.epochs * q.cost).tolist(), rel=REL)
    assert rows[4].t_step_s is None  # N = 128 > B: no prediction
    assert rows[1].t_step_s == pytest.approx(p.at(2)["t_step_s"], rel=REL)  # N = 2 was profiled: the fitted step


def test_a_what_if_network_is_an_argument_of_the_prediction(models):
    """The simulator's network (a slower link, faster workers, R ranks per node) is ``network``."""
    fitted = FittedModels.from_record(models)
    sim = simulator_from_models(models, bandwidth="100Mbit/s", latency="50us", compute_speed=2.0, ranks_per_node=1)
    net = sim.network("tree")
    assert (net.collective, net.ranks_per_node, net.compute_speed) == ("tree", 1, 2.0)
    assert (net.alpha_s, net.beta_s_per_byte) == pytest.approx((50e-6, 8 / 100e6), rel=REL)  # s/hop, s/byte
    p = fitted.predict(n_workers=[1, 2, 8], global_batch=64, network=net)
    assert sim.t_step_s("tree", np.array([64, 32, 8]), np.array([1, 2, 8])).tolist() == pytest.approx(
        p.t_step_s.tolist(), rel=REL
    )
    assert p.t_sync_s[0] == 0 and p.t_sync_s[2] > p.t_sync_s[1] > 0
    fitted_net = fitted.predict(n_workers=[1, 2, 8], global_batch=64)
    assert p.t_compute_s[0] == pytest.approx(fitted_net.t_compute_s[0] / 2, rel=REL)  # twice as fast
    grad_bytes = fitted.perf.grad_bytes  # the tree at N = 2 on one link: 2 hops and the gradient twice
    assert p.t_sync_s[1] == pytest.approx(2 * 50e-6 + 2 * grad_bytes * 8 / 100e6, rel=1e-9)


def test_predicting_many_configurations_at_once_is_predicting_them_one_by_one(models):
    fitted = FittedModels.from_record(models)
    spot = SpotPricing(2.0, 1.0)
    together = fitted.predict(CONFIGS, pricing=spot, epochs=3, measured_ratio=1.2)
    arrays = fitted.predict(**_arrays(CONFIGS), pricing=spot, epochs=3, measured_ratio=1.2)
    for i, c in enumerate(CONFIGS):
        alone = fitted.predict([c], pricing=spot, epochs=3, measured_ratio=1.2).at(0)
        scalars = fitted.predict(
            n_workers=c.n_workers, global_batch=c.global_batch, accumulation_steps=c.accumulation_steps,
            pricing=spot, epochs=3, measured_ratio=1.2,
        ).at(0)  # fmt: skip
        for one in (alone, scalars, arrays.at(i)):
            got = together.at(i)
            assert set(one) == set(got)
            for key, value in got.items():
                if isinstance(value, float):
                    assert one[key] == pytest.approx(value, rel=REL), (c, key)
                else:
                    assert one[key] == value, (c, key)
    # what the fields say, by hand for one configuration: 2 workers, 64 samples as 2 micro-batches of 16
    one = together.at(3)
    assert (one["local_batch"], one["micro_batch"], one["peak_mem_bytes"]) == (
        32.0,
        16.0,
        fitted.memory_model().predict_accumulated_peak_bytes(32, 16, 2),
    )
    assert one["steps_per_epoch"] == fitted.dataset_size // 64
    assert one["failure_free_time_s"] == pytest.approx(3 * one["epoch_time_s"], rel=REL)
    assert one["total_time_s"] > one["failure_free_time_s"] and one["expected_preemptions"] > 0  # spot
    assert fitted.predict(CONFIGS).cost is None  # no pricing, no cost


def test_a_missing_or_damaged_model_is_one_sentence(models):
    def refused(record: dict, match: str, error: type = RecordError) -> None:
        with pytest.raises(error, match=match) as err:
            FittedModels.from_record(record)
        assert "\n" not in str(err.value)

    refused({k: v for k, v in models.items() if k != "perf"}, r"has no performance model \('perf'\)")
    refused({**models, "dataset_size": None}, "has no training-set size")
    damaged = copy.deepcopy(models)
    damaged["memory"]["param_bytes"] = "lots"
    refused(damaged, r"memory model is damaged \(field 'param_bytes'")
    damaged = copy.deepcopy(models)
    del damaged["perf"]["c0"]
    refused(damaged, r"performance model is damaged \(field 'c0' is missing\)")
    refused({**models, "perf": [1, 2]}, "performance model is damaged")
    refused({**models, "run_costs": {"method": "ags", "speed": 3}}, "run costs are damaged")
    refused({**models, "spec": {"epochs": 0}}, "epochs", SpecError)
    with pytest.raises(RecordError, match="a models record, not list"):
        FittedModels.from_record([models])
    # the planner says it in the same sentence; the live ranker keeps its own
    with pytest.raises(RecordError, match=r"has no memory model \('memory'\)"):
        make_plan({k: v for k, v in models.items() if k != "memory"}, "time")
    with pytest.raises(SpecError, match="the models record has no 'perf': planning while training needs"):
        Ranker({k: v for k, v in models.items() if k != "perf"}, "ags")
