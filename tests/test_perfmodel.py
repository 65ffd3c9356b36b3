import numpy as np
import pytest
from helpers import noisy_trials, typed_trials

from tula.core.perfmodel import PerfModel, fit_perf_model, link_bytes, relative_errors
from tula.core.trial import Trial


def _trials(model: PerfModel, sizes, batches, noise=0.01, seed=0):
    """helpers.noisy_trials on one host: ``sizes`` worker counts, typed."""
    return typed_trials(noisy_trials(model, sizes, batches, noise, seed))


GRAD = 50_000_000


@pytest.mark.parametrize("collective", ["ring", "parameter_server", "tree"])
def test_fit_recovers_known_parameters(collective):
    true = PerfModel(collective, GRAD, c0=0.004, c1=0.0008, kappa=0.0, alpha=2e-4, beta=1e-9)
    trials = _trials(true, [1, 2, 4, 8], [8, 16, 32, 64, 128], noise=0.005)
    fit = fit_perf_model(trials, collective, GRAD, overlap="never")
    assert fit.c1 == pytest.approx(true.c1, rel=0.05)
    assert fit.c0 == pytest.approx(true.c0, rel=0.15)
    assert fit.beta == pytest.approx(true.beta, rel=0.15)
    # prediction at an unprofiled configuration
    assert float(fit.t_step_s(256, 16)) == pytest.approx(float(true.t_step_s(256, 16)), rel=0.05)


def test_fit_recovers_overlap_and_colocation():
    true = PerfModel("ring", GRAD, c0=0.002, c1=0.001, kappa=0.2, beta=2e-9, rho=0.1, gamma=2.0)
    trials = _trials(true, [1, 2, 4], [4, 8, 16, 32, 64, 128], noise=0.003)
    fit = fit_perf_model(trials, "ring", GRAD, overlap="auto")
    assert fit.gamma == pytest.approx(2.0, rel=0.15)
    assert fit.kappa == pytest.approx(0.2, rel=0.15)
    assert np.median(relative_errors(fit, trials)) < 0.01


def test_fit_separates_a_fixed_colocation_cost_from_latency():
    """kappa0 (fixed compute seconds per extra co-located worker) appears in t_compute, which
    is measured without sync, so it is not confused with the all-reduce latency alpha."""
    true = PerfModel("ring", GRAD, c0=0.001, c1=0.0002, kappa=0.05, kappa0=0.002, alpha=3e-4, beta=1e-9)
    trials = _trials(true, [1, 2, 4], [8, 16, 32, 64, 128], noise=0.003)
    fit = fit_perf_model(trials, "ring", GRAD, overlap="never")
    assert fit.kappa0 == pytest.approx(0.002, rel=0.15)
    assert fit.alpha == pytest.approx(3e-4, rel=0.3)
    assert "kappa0" not in fit.frozen
    # a design with one batch per cluster size cannot tell kappa0 from kappa: frozen at 0
    one_batch = fit_perf_model(_trials(true, [1, 2], [8, 128])[:3], "ring", GRAD)
    assert "kappa0" in one_batch.frozen and one_batch.kappa0 == 0.0


def test_unidentifiable_parameters_are_frozen():
    true = PerfModel("ring", GRAD, c0=0.003, c1=0.001)
    fit = fit_perf_model(_trials(true, [1], [8, 32, 128]), "ring", GRAD)
    assert {"kappa", "alpha", "beta", "rho", "gamma"} <= set(fit.frozen)
    assert fit.beta == 0.0 and fit.t_sync_s(4) == 0.0
    assert any("sync time cannot be measured" in n for n in fit.notes)
    fit2 = fit_perf_model(_trials(true, [1, 2], [8, 128]), "ring", GRAD)
    assert "alpha" in fit2.frozen  # one cluster size above 1: latency and bandwidth are collinear


def test_partial_search_points_predict_the_grid():
    true = PerfModel("ring", GRAD, c0=0.003, c1=0.0005, alpha=1e-4, beta=5e-10, kappa=0.05)
    grid = _trials(true, [1, 2, 4], [8, 16, 32, 64, 128, 256], noise=0.01)
    corners = [t for t in grid if t.n_workers in (1, 4) and t.local_batch in (8, 256)]
    fit = fit_perf_model(corners, "ring", GRAD)
    assert np.median(relative_errors(fit, grid)) < 0.05


def test_bandwidth_terms():
    assert link_bytes("ring", 1, 100) == 0
    assert link_bytes("ring", 4, 100) == pytest.approx(150)
    assert link_bytes("parameter_server", 4, 100) == pytest.approx(800)
    # pipelined tree: the busiest link carries the bytes up and down once, at any depth
    assert link_bytes("tree", 8, 100) == pytest.approx(200)
    assert link_bytes("tree", 1, 100) == 0


def test_round_trip_and_total_time():
    m = PerfModel("ring", GRAD, c0=0.01, c1=0.001, beta=1e-9)
    assert PerfModel.from_dict(m.to_dict()) == m
    # Eq. 4a: T = E * D / B * t_step
    assert float(m.total_time_s(64, 2, 6400, 3)) == pytest.approx(3 * 100 * float(m.t_step_s(32, 2)))


def test_no_trials_is_an_error():
    with pytest.raises(ValueError, match="no successful trial"):
        fit_perf_model([Trial(n_workers=1, local_batch=8, global_batch=8, status="oom")], "ring", GRAD)


def test_fit_finds_the_host_bound_floor_from_three_batches():
    """A GPU's small steps sit on the host's kernel-launch floor: with three batches at one
    cluster size the fit recovers floor and line, and predicts between them on the line
    (with two, the floor stays 0 and is listed as frozen)."""
    true = PerfModel("ring", GRAD, c0=0.004, c1=0.00044, t_floor_s=0.022, alpha=2e-4, beta=1e-9)
    trials = _trials(true, [1, 2], [32, 91, 256], noise=0.005)
    fit = fit_perf_model(trials, "ring", GRAD, overlap="never")
    assert fit.t_floor_s == pytest.approx(0.022, rel=0.05)
    assert "t_floor_s" not in fit.frozen and any("floor of" in n for n in fit.notes)
    for b in (16, 64, 128):  # below the floor's knee (b ~ 41), and on the line
        assert float(fit.t_step_s(b, 1)) == pytest.approx(float(true.t_step_s(b, 1)), rel=0.04)
    two = fit_perf_model(_trials(true, [1, 2], [32, 256], noise=0.005), "ring", GRAD, overlap="never")
    assert two.t_floor_s == 0.0 and "t_floor_s" in two.frozen
    assert float(two.t_step_s(64, 1)) > 1.08 * float(true.t_step_s(64, 1))  # the line through the floor: high


def test_a_line_through_three_batches_gets_no_floor():
    true = PerfModel("ring", GRAD, c0=0.002, c1=0.0003, beta=1e-9)
    fit = fit_perf_model(_trials(true, [1, 2], [16, 64, 256], noise=0.003), "ring", GRAD, overlap="never")
    assert fit.t_floor_s == 0.0 and not any("floor of" in n for n in fit.notes)
    assert fit.c1 == pytest.approx(true.c1, rel=0.05)
