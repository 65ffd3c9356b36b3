"""Topology in the performance model and the simulator (issue #19, item 4): N ranks on hosts
of R ranks each, an inter-node link (alpha, beta) and an intra-node one (alpha_intra,
beta_intra).  The three formulas by hand, their reduction to the flat ones, recovery of known
parameters from generated multi-host profiles (as AdaptDL checks its fit), what a design
cannot identify, and the plan, the simulator and ``tula simulate`` on such a fit."""

import math

import numpy as np
import pytest
from helpers import (
    memory_model,
    models_record,
    noisy_trials,
    profile_record,
    run_tula,
    tula_in_process,
    typed_trials,
)

from tula.core.errors import TulaError
from tula.core.fit import fit_models
from tula.core.perfmodel import (
    NOTE_INTRA_LATENCY,
    NOTE_NO_LONE_HOST,
    NOTE_NO_SHARED_HOST,
    PerfModel,
    fit_perf_model,
    hops,
    link_bytes,
    ranks_per_node_of,
    relative_errors,
    sync_time_s,
    trial_step_s,
)
from tula.core.plan import make_plan
from tula.core.records import save_record, validate_record
from tula.core.simulate import simulator_from_models
from tula.core.spec import spec_from_dict

S = 10**8  # gradient bytes
A, B = 1e-5, 1e-9  # inter-node: 10 us per hop, 1 GB/s
AI, BI = 1e-6, 1e-10  # intra-node: 1 us per hop, 10 GB/s


def _sync(c, n, r, ai=AI, bi=BI, **kw):
    return float(sync_time_s(c, n, S, A, B, ai, bi, r, **kw))


# --------------------------------------------------------------------------- the formulas by hand
def test_ring_by_hand():
    # one host of 4: 2 (N - 1) = 6 steps of the intra link, S / N = 2.5e7 bytes each
    assert _sync("ring", 4, 4) == pytest.approx(6 * (1e-6 + 2.5e7 * 1e-10), rel=1e-12)  # 0.015006 s
    # 8 ranks on 2 hosts of 4: 14 steps, each bound by the inter-node edges the ring crosses
    assert _sync("ring", 8, 4) == pytest.approx(14 * (1e-5 + 1.25e7 * 1e-9), rel=1e-12)  # 0.17514 s
    # a slower intra-node link binds instead (max of the two per step)
    assert _sync("ring", 8, 4, bi=2e-9) == pytest.approx(14 * (1e-5 + 1.25e7 * 2e-9), rel=1e-12)
    # 6 ranks on hosts of 4: 2 hosts (4 + 2), still bound by the inter-node link
    assert _sync("ring", 6, 4) == pytest.approx(10 * (1e-5 + S / 6 * 1e-9), rel=1e-12)
    assert _sync("ring", 1, 4) == 0.0


def test_tree_by_hand():
    # 8 on 2 hosts of 4: 2 ceil(log2 4) = 4 intra hops, 2 ceil(log2 2) = 2 inter hops, 2 S at the slower link
    assert _sync("tree", 8, 4) == pytest.approx(4 * 1e-6 + 2 * 1e-5 + 2 * S * 1e-9, rel=1e-12)  # 0.200024 s
    # one host of 4: intra only
    assert _sync("tree", 4, 4) == pytest.approx(4 * 1e-6 + 2 * S * 1e-10, rel=1e-12)  # 0.020004 s
    # 16 on 8 hosts of 2: 2 intra hops, 6 inter hops
    assert _sync("tree", 16, 2) == pytest.approx(2 * 1e-6 + 6 * 1e-5 + 2 * S * 1e-9, rel=1e-12)
    # one rank per host: no intra hop, the inter link's bytes
    assert _sync("tree", 8, 1) == pytest.approx(6 * 1e-5 + 2 * S * 1e-9, rel=1e-12)


def test_parameter_server_by_hand():
    # 8 on 2 hosts of 4, the server on one of them: 4 ranks reach it across hosts, 4 within
    assert _sync("parameter_server", 8, 4) == pytest.approx(2 * 1e-5 + 2 * S * (4 * 1e-9 + 4 * 1e-10), rel=1e-12)
    # one host of 4: 2 intra hops, 2 N S on the intra link
    assert _sync("parameter_server", 4, 4) == pytest.approx(2 * 1e-6 + 2 * 4 * S * 1e-10, rel=1e-12)
    # one rank per host: the server's own host's rank still reaches it within the host
    assert _sync("parameter_server", 8, 1) == pytest.approx(2 * 1e-5 + 2 * S * (7 * 1e-9 + 1e-10), rel=1e-12)
    # ... which is the flat 2 alpha + 2 N S beta when the intra-node link is the inter-node one
    assert _sync("parameter_server", 8, 1, ai=None, bi=None) == pytest.approx(2 * 1e-5 + 2 * 8 * S * 1e-9, rel=1e-12)


def test_an_explicit_number_of_hosts():
    # 4 ranks on hosts a, b, c, c (R = 2, H = 3, not ceil(4 / 2) = 2): tree of 3 hosts
    assert _sync("tree", 4, 2, n_hosts=3) == pytest.approx(2 * 1e-6 + 4 * 1e-5 + 2 * S * 1e-9, rel=1e-12)


# --------------------------------------------------------------------------- the flat formulas are kept
def _flat(c, n, a, b):
    n = np.asarray(n, float)
    if c == "ring":
        t = a * (2.0 * (n - 1)) + b * (2.0 * (n - 1) / n * S)
    elif c == "parameter_server":
        t = a * 2.0 + b * (2.0 * n * S)
    else:
        t = a * (2.0 * np.ceil(np.log2(n))) + b * (2.0 * S)
    return np.where(n > 1, t, 0.0)


@pytest.mark.parametrize("c", ["ring", "parameter_server", "tree"])
def test_one_rank_per_host_is_the_flat_model_exactly(c):
    n = np.arange(1, 1100)
    np.testing.assert_array_equal(sync_time_s(c, n, S, A, B), _flat(c, n, A, B))
    if c != "parameter_server":  # the ring and tree never use the intra link then; the server's host does
        np.testing.assert_array_equal(sync_time_s(c, n, S, A, B, AI, BI, 1), _flat(c, n, A, B))
    np.testing.assert_array_equal(hops(c, n) * A + link_bytes(c, n, S) * B, _flat(c, n, A, B))
    m = PerfModel(c, S, c0=0.01, c1=0.001, alpha=A, beta=B)
    np.testing.assert_array_equal(m.t_sync_s(n), _flat(c, n, A, B))
    np.testing.assert_array_equal(m.t_sync_s(n, 1), _flat(c, n, A, B))


@pytest.mark.parametrize("r", [2, 3, 4, 6, 8])
def test_with_the_intra_link_the_inter_one_the_hosts_do_not_matter(r):
    n = np.arange(1, 600)
    for c in ("ring", "parameter_server"):
        np.testing.assert_allclose(sync_time_s(c, n, S, A, B, None, None, r), _flat(c, n, A, B), rtol=1e-12)
    tree = sync_time_s("tree", n, S, A, B, None, None, r)
    if r & (r - 1) == 0:  # R a power of two: 2 (log2 R + ceil(log2 H)) = 2 ceil(log2 N)
        np.testing.assert_allclose(tree, _flat("tree", n, A, B), rtol=1e-12)
    else:  # the hierarchical tree's hop counts: up to two hops more than a flat binary tree
        extra = np.round((tree - _flat("tree", n, A, B)) / A, 6)
        assert set(extra.tolist()) <= {0.0, 2.0} and 2.0 in extra
    assert _sync("tree", 4, 3, ai=None, bi=None) == pytest.approx(6 * A + 2 * S * B)  # N = 4, R = 3: 6 hops, not 4


# --------------------------------------------------------------------------- recovering known parameters
GRAD = 50_000_000
TRUTH = PerfModel(
    "ring", GRAD, c0=0.004, c1=0.0008, kappa=0.1, alpha=1e-3, beta=1e-9, alpha_intra=1e-5, beta_intra=1e-10
)
TWO_BY_TWO = ([], ["h0", "h0"], ["h0", "h0", "h1", "h1"])  # N = 1, 2 on one host, 4 across two hosts
FOUR_BY_ONE = ([], ["h0", "h1"], ["h0", "h1", "h2"], ["h0", "h1", "h2", "h3"])  # N = 1 to 4, one rank per host


def _trials(truth, worlds, batches=(8, 16, 32, 64, 128), noise=0.005, seed=0):
    """helpers.noisy_trials of worlds given as the hosts of their ranks."""
    return noisy_trials(truth, worlds, batches, noise, seed)


@pytest.mark.parametrize("collective", ["ring", "parameter_server", "tree"])
def test_two_hosts_of_two_recover_both_bandwidths(collective):
    # a latency this design cannot identify is folded into the bandwidth: a small one, to recover the bandwidth
    truth = PerfModel(**{**TRUTH.to_dict(), "collective": collective, "alpha": 2e-4, "frozen": (), "notes": ()})
    trials = typed_trials(_trials(truth, TWO_BY_TWO))
    fit = fit_perf_model(trials, collective, GRAD, overlap="never")
    assert fit.beta == pytest.approx(truth.beta, rel=0.1)
    assert fit.beta_intra == pytest.approx(truth.beta_intra, rel=0.15)
    assert fit.kappa == pytest.approx(truth.kappa, rel=0.15)  # co-location: two ranks per host at N = 2 and 4
    # one world size across hosts and one on a host alone: latencies frozen at 0, folded into the bandwidths
    assert {"alpha", "alpha_intra"} <= set(fit.frozen) and fit.alpha == fit.alpha_intra == 0.0
    assert "beta_intra" not in fit.frozen and NOTE_INTRA_LATENCY in fit.notes
    assert np.median(relative_errors(fit, trials)) < 0.01
    # beyond the profile: 8 ranks on 4 hosts of 2
    assert float(fit.t_step_s(64, 8, 2)) == pytest.approx(float(truth.t_step_s(64, 8, 2)), rel=0.05)


def test_a_second_size_across_hosts_recovers_the_latency():
    worlds = TWO_BY_TWO + (["h0", "h1"],)  # and N = 2 across two hosts
    fit = fit_perf_model(typed_trials(_trials(TRUTH, worlds)), "ring", GRAD, overlap="never")
    assert "alpha" not in fit.frozen and fit.alpha == pytest.approx(TRUTH.alpha, rel=0.3)
    assert fit.beta == pytest.approx(TRUTH.beta, rel=0.05)
    assert fit.beta_intra == pytest.approx(TRUTH.beta_intra, rel=0.15)


def test_four_hosts_of_one_recover_the_inter_link_and_freeze_the_intra_one():
    fit = fit_perf_model(typed_trials(_trials(TRUTH, FOUR_BY_ONE)), "ring", GRAD, overlap="never")
    assert fit.beta == pytest.approx(TRUTH.beta, rel=0.05)
    assert fit.alpha == pytest.approx(TRUTH.alpha, rel=0.3)
    assert fit.alpha_intra is None and fit.beta_intra is None
    assert {"alpha_intra", "beta_intra", "kappa"} <= set(fit.frozen)  # no co-location measured either
    assert NOTE_NO_SHARED_HOST in fit.notes
    assert NOTE_NO_SHARED_HOST == "no two ranks shared a host: the intra-node link is taken to be the inter-node one"


def test_ranks_sharing_a_host_only_across_hosts_cannot_show_the_faster_link():
    # N = 1 and 4 on 2 hosts of 2: the ring's steps are bound by the slower (inter-node) link
    fit = fit_perf_model(typed_trials(_trials(TRUTH, ([], ["h0", "h0", "h1", "h1"]))), "ring", GRAD, overlap="never")
    assert fit.beta_intra is None and {"alpha_intra", "beta_intra"} <= set(fit.frozen)
    assert NOTE_NO_LONE_HOST in fit.notes
    assert fit.beta == pytest.approx(TRUTH.beta, rel=0.1)


def test_one_host_keeps_the_flat_fit():
    worlds = ([], ["h0", "h0"], ["h0"] * 4)
    given = _trials(TRUTH, worlds)
    fit = fit_perf_model(typed_trials(given), "ring", GRAD)
    for t in given:
        del t["hosts"], t["ranks_per_host"], t["local_ranks"]  # a record from before hosts were kept
    trials = typed_trials(given)
    assert fit == fit_perf_model(trials, "ring", GRAD)
    assert fit.alpha_intra is None and fit.beta_intra is None
    assert not {"alpha_intra", "beta_intra"} & set(fit.frozen) and not any("intra" in n for n in fit.notes)
    assert ranks_per_node_of(trials) is None
    np.testing.assert_array_equal(
        trial_step_s(fit, trials), fit.t_step_s([t.local_batch for t in trials], [t.n_workers for t in trials])
    )


def test_old_records_without_the_intra_link_load():
    d = PerfModel("ring", GRAD, c0=0.01, c1=0.001, beta=1e-9).to_dict()
    del d["alpha_intra"], d["beta_intra"]
    m = PerfModel.from_dict(d)
    assert m.alpha_intra is None and m.beta_intra is None and PerfModel.from_dict(m.to_dict()) == m
    full = PerfModel.from_dict(TRUTH.to_dict())
    assert full == TRUTH


# --------------------------------------------------------------------------- plan, simulator, CLI
def _profile(worlds, collective="ring") -> dict:
    truth = PerfModel(
        **{**TRUTH.to_dict(), "collective": collective, "grad_bytes": 2_000_000, "frozen": (), "notes": ()}
    )
    trials = _trials(truth, worlds, batches=(8, 16, 32, 64), noise=0.02, seed=5)
    for t in trials:
        t.update(peak_mem_bytes=2000 + 100 * t["local_batch"], timed_steps=3, devices=["cpu"] * t["n_workers"])
    spec = spec_from_dict(
        {
            "name": "hosts",
            "epochs": 2,
            "collective": collective,
            "data": {"name": "digits"},
            "search": {"cluster_sizes": [1, 2, 4], "min_batch": 8, "max_batch": 256},
        }
    ).to_dict()
    model = {"name": "small_cnn", "param_count": 1000, "grad_bytes": 2_000_000}
    prof = profile_record(spec, trials, memory=memory_model().to_dict(), model=model)
    return validate_record(prof, "test")


@pytest.fixture(scope="module")
def two_by_two():
    return fit_models(_profile(TWO_BY_TWO)).to_json_dict()


@pytest.mark.parametrize("collective", ["ring", "parameter_server", "tree"])
def test_the_simulator_reproduces_a_multi_host_fit_at_the_profiled_worlds(collective):
    models = fit_models(_profile(TWO_BY_TWO, collective))
    fitted = models.perf
    assert fitted.beta_intra is not None and models.placement is not None and models.placement.n_hosts == 2
    sim = simulator_from_models(models)
    assert sim.ranks_per_node == 2  # the most ranks one host held, not the largest N
    assert sim.intra_bandwidth_bytes_per_s == pytest.approx(1 / fitted.beta_intra)
    ok = models.trials
    b = np.array([t.local_batch for t in ok], float)
    n = np.array([t.n_workers for t in ok], float)
    np.testing.assert_allclose(sim.t_step_s(collective, b, n), trial_step_s(fitted, ok), rtol=1e-12)
    assert models.fit_error["t_step_median_rel"] == pytest.approx(float(np.median(relative_errors(fitted, ok))))
    assert models.fit_error["t_step_median_rel"] < 0.03
    # a node per worker: every sync crosses nodes
    one = simulator_from_models(models, ranks_per_node=1)
    assert float(one.t_sync_s(collective, 2)) == pytest.approx(float(fitted.t_sync_s(2, 1)), rel=1e-12)


def test_the_plan_predicts_on_the_hosts_it_was_fitted_for(two_by_two):
    plan = make_plan(two_by_two, "time")
    perf = PerfModel.from_dict(two_by_two["perf"])
    for row in plan.configurations:
        want = float(perf.t_step_s(row.local_batch, row.n_workers, 2))
        assert row.t_step_s == pytest.approx(want, rel=1e-12)
    # a profile of one host: the flat model, as before
    flat = fit_models(_profile(([], ["h0", "h0"], ["h0"] * 4)))
    assert ranks_per_node_of(flat.trials) is None
    perf = flat.perf
    for row in make_plan(flat, "time").configurations:
        assert row.t_step_s == pytest.approx(float(perf.t_step_s(row.local_batch, row.n_workers)), rel=1e-12)


def test_the_simulator_on_given_links_by_hand():
    perf = PerfModel("ring", grad_bytes=S, c0=0.01, c1=0.001, alpha=1.0, beta=1.0)
    rec = validate_record(models_record(perf, full=True, spec={"name": "hand", "epochs": 1}, dataset_size=8000), "test")
    sim = simulator_from_models(
        rec, bandwidth="8Gbit/s", latency="10us", ranks_per_node=4, intra_bandwidth="80Gbit/s", intra_latency="1us"
    )
    assert sim.intra_bandwidth_bytes_per_s == 1e10 and sim.intra_latency_s == pytest.approx(1e-6)
    rows = {(r.collective, r.n_workers): r.t_sync_s for r in sim.constant(800, [4, 8])}
    assert rows[("ring", 4)] == pytest.approx(6 * (1e-6 + 2.5e7 / 1e10), rel=1e-12)
    assert rows[("ring", 8)] == pytest.approx(14 * (1e-5 + 1.25e7 / 1e9), rel=1e-12)
    assert rows[("tree", 8)] == pytest.approx(4e-6 + 2e-5 + 2 * S / 1e9, rel=1e-12)
    assert rows[("parameter_server", 8)] == pytest.approx(2e-5 + 2 * S * (4 / 1e9 + 4 / 1e10), rel=1e-12)
    # no intra-node link given or fitted: the inter-node one, i.e. the flat formulas
    flat = simulator_from_models(rec, bandwidth="8Gbit/s", latency="10us", ranks_per_node=4)
    assert flat.intra_bandwidth_bytes_per_s is None and flat.intra_latency_s is None
    assert float(flat.t_sync_s("ring", 8)) == pytest.approx(14e-5 + 2 * 7 / 8 * S / 1e9, rel=1e-12)
    for kw, words in (
        ({"intra_bandwidth": "lots"}, "'lots' is not an intra-node bandwidth"),
        ({"intra_latency": "soon"}, "'soon' is not an intra-node latency"),
    ):
        with pytest.raises(TulaError) as e:
            simulator_from_models(rec, **kw)
        assert words in str(e.value) and len(str(e.value).splitlines()) == 1


def test_the_simulator_says_what_the_profile_could_not_give():
    models = fit_models(_profile(FOUR_BY_ONE)).to_json_dict()
    assert simulator_from_models(models).ranks_per_node == 1
    assert not any("intra-node" in x for x in simulator_from_models(models).notes)  # never used at R = 1
    notes = " ".join(simulator_from_models(models, ranks_per_node=8).notes)
    assert "no two ranks shared a host: the intra-node bandwidth and latency taken to be the inter-node ones" in notes
    notes = " ".join(simulator_from_models(models, ranks_per_node=8, intra_bandwidth="100GB/s").notes)
    assert "the intra-node latency taken to be the inter-node one; give an intra-node latency" in notes
    assert not any(
        "intra-node" in x
        for x in simulator_from_models(models, ranks_per_node=8, intra_bandwidth="100GB/s", intra_latency="1us").notes
    )
    # two hosts of two: the intra-node bandwidth is fitted, its latency frozen at 0
    notes = " ".join(simulator_from_models(fit_models(_profile(TWO_BY_TWO)).to_json_dict()).notes)
    assert "intra-node latency taken as 0" in notes and "loopback" not in notes


def test_cli_simulate_takes_the_intra_node_link(two_by_two, tmp_path):
    path = tmp_path / "models.json"
    save_record(two_by_two, path)
    r = run_tula(
        "simulate",
        path,
        "--workers",
        "1,2,8,64",
        "--batch",
        "256",
        "--collective",
        "ring",
        "--bandwidth",
        "25Gbit/s",
        "--latency",
        "20us",
        "--intra-bandwidth",
        "300GB/s",
        "--intra-latency",
        "2us",
        "--ranks-per-node",
        "8",
        "--out",
        tmp_path / "sim.png",
        timeout=120,
        columns=200,
    )
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "between nodes, 2.4e+03 Gbit/s (300 GB/s) and 2 us within" in out and "8 rank(s) per node" in out
    for args, words in (
        (("--intra-bandwidth", "lots"), "'lots' is not an intra-node bandwidth"),
        (("--intra-latency", "5 parsecs"), "is not an intra-node latency"),
    ):
        r = tula_in_process("simulate", path, "--out", tmp_path / "x.png", *args)
        assert r.returncode == 2, r.stderr
        err = " ".join(r.stderr.split())
        assert err.startswith("error:") and words in err and "Traceback" not in err
        assert not (tmp_path / "x.png").exists()
    assert math.isfinite(float(simulator_from_models(two_by_two).t_step_s("ring", 1, 1024)))
