"""The what-if simulator (issue #11, part 2): alpha-beta collectives computed by hand, the
fitted model reproduced at the profiled N, schedules' update counts, and the CLI's bad input."""

import dataclasses
import json

import numpy as np
import pytest
from helpers import epoch, memory_model, models_record, profile_record, run_python, run_tula, tula_in_process

from tula.core.errors import OptionError, TulaError
from tula.core.fit import fit_models
from tula.core.perfmodel import PerfModel
from tula.core.records import save_record, validate_record
from tula.core.schedules import Caps, FinishedEpoch, next_config, schedule_info
from tula.core.simulate import (
    DEFAULT_WORKERS,
    Simulator,
    check_history,
    parse_collectives,
    parse_schedule,
    parse_workers,
    schedule_caps,
    simulator_from_models,
    what_if,
)
from tula.core.spec import parse_bandwidth, spec_from_dict


def _record(perf: PerfModel, dataset_size=8000, epochs=2, trials=(), spec=None, placement=None) -> dict:
    """A models record around a given performance model (priced at 1 $ per node-second)."""
    s = {"name": "hand", "epochs": epochs, "pricing": {"kind": "fixed", "price_per_node_hour": 3600.0}, **(spec or {})}
    budget = spec_from_dict(s).search.memory_budget_bytes
    rec = models_record(
        perf, budget=budget, full=True, spec=s, dataset_size=dataset_size, trials=trials, placement=placement
    )
    return validate_record(rec, "test")


# --------------------------------------------------------------------------- by hand
# compute: t = 0.01 + 0.001 b seconds; gradients 10^8 bytes; no co-location slowdown, no overlap
HAND = PerfModel("ring", grad_bytes=10**8, c0=0.01, c1=0.001, alpha=1.0, beta=1.0)  # network replaced below


def test_ring_parameter_server_and_tree_by_hand():
    # 8 Gbit/s = 10^9 bytes/s, 10 us per hop; B = 800 on N = 8: b = 100, compute 0.01 + 0.1 = 0.11 s
    sim = simulator_from_models(_record(HAND), bandwidth="8Gbit/s", latency="10us")
    assert sim.bandwidth_bytes_per_s == 1e9 and sim.latency_s == pytest.approx(1e-5)
    ring = 2 * 7 * 1e-5 + 2 * 7 / 8 * 1e8 / 1e9  # 0.17514 s: 2(N-1) hops, 2(N-1)/N of the bytes
    ps = 2 * 1e-5 + 2 * 8 * 1e8 / 1e9  # 1.60002 s: the server's link carries 2 N gradients
    tree = 2 * 3 * 1e-5 + 2 * 1e8 / 1e9  # 0.20006 s: 2 log2(8) hops, the bytes twice (pipelined)
    rows = {(r.collective, r.n_workers): r for r in sim.constant(800, [1, 8])}
    for c, sync in (("ring", ring), ("parameter_server", ps), ("tree", tree)):
        r = rows[(c, 8)]
        assert r.t_sync_s == pytest.approx(sync, rel=1e-12)
        assert r.t_step_s == pytest.approx(0.11 + sync, rel=1e-12)
        # D = 8000, B = 800: 10 updates per epoch, 2 epochs
        assert r.updates == 20
        assert r.total_time_s == pytest.approx(20 * (0.11 + sync), rel=1e-12)
        assert r.cost == pytest.approx(20 * (0.11 + sync) * 8, rel=1e-12)  # 1 $ per node-second
        assert rows[(c, 1)].t_step_s == pytest.approx(0.01 + 0.8)  # one worker: no sync
    assert rows[("ring", 8)].t_step_s < rows[("tree", 8)].t_step_s < rows[("parameter_server", 8)].t_step_s
    # at N = 1024, b = 1 (B = 1024): latency dominates the ring, bytes the server, neither the tree
    big = {r.collective: r for r in sim.constant(1024, [1024])}
    assert big["ring"].t_sync_s == pytest.approx(2 * 1023 * 1e-5 + 2 * 1023 / 1024 * 0.1, rel=1e-12)
    assert big["parameter_server"].t_sync_s == pytest.approx(2e-5 + 2 * 1024 * 0.1, rel=1e-12)
    assert big["tree"].t_sync_s == pytest.approx(2 * 10 * 1e-5 + 0.2, rel=1e-12)


def test_compute_speed_and_bandwidth_are_what_ifs():
    sim = simulator_from_models(_record(HAND), bandwidth="10GB/s", latency="0s", compute_speed=2.0)
    r = sim.constant(800, [4], ["ring"])[0]
    assert r.t_step_s == pytest.approx(0.21 / 2 + 2 * 3 / 4 * 1e8 / 1e10, rel=1e-12)


def test_n_above_the_batch_and_memory_are_marked_not_simulated():
    sim = simulator_from_models(_record(HAND), bandwidth="1GB/s", latency="1us")
    rows = sim.constant(64, [32, 64, 128], ["tree"])
    assert [r.note for r in rows[:2]] == ["", ""]
    assert rows[2].note.startswith("N > B") and rows[2].total_time_s is None
    capped = simulator_from_models(
        _record(HAND, spec={"search": {"memory_budget_bytes": 4000}}), bandwidth="1GB/s", latency="1us"
    )
    assert capped.max_local_batch == 16  # (0.9 * 4000 - 2000) / 100
    r = {x.n_workers: x for x in capped.constant(64, [2, 4], ["ring"])}
    assert not r[2].fits_memory and "exceeds memory" in r[2].note and r[4].fits_memory


# --------------------------------------------------------------------------- reproducing the fit
def _profile(truth: PerfModel, sizes=(1, 2, 4), noise=0.05, seed=3) -> dict:
    """A profile whose step times come from ``truth`` with multiplicative noise (so the fit does not
    simply return ``truth``); all ranks of a trial on one host."""
    rng = np.random.default_rng(seed)
    trials = []
    for n in sizes:
        for big in (32, 64, 128, 256, 512):
            b = big // n
            tc = float(truth.t_compute_s(b, n)) * (1 + noise * rng.standard_normal())
            ts = float(truth.t_step_s(b, n)) * (1 + noise * rng.standard_normal())
            trials.append(
                {
                    "n_workers": n,
                    "local_batch": b,
                    "global_batch": big,
                    "status": "ok",
                    "t_step_s": ts,
                    "t_compute_s": tc,
                    "t_sync_s": max(ts - tc, 0.0),
                    "peak_mem_bytes": 2000 + 100 * b,
                    "timed_steps": 3,
                    "hosts": ["h0"] * n,
                    "devices": ["cpu"] * n,
                }
            )
    spec = spec_from_dict(
        {
            "name": "synth",
            "epochs": 3,
            "data": {"name": "digits"},
            "search": {"cluster_sizes": list(sizes), "min_batch": 32, "max_batch": 512},
        }
    ).to_dict()
    model = {"name": "small_cnn", "param_count": 1000, "grad_bytes": 2_000_000}
    return profile_record(spec, trials, memory=memory_model().to_dict(), model=model)


TRUTH = PerfModel(
    "ring", grad_bytes=2_000_000, c0=2e-3, c1=1e-4, kappa=0.08, kappa0=3e-4, alpha=40e-6, beta=1 / 2e9, rho=0.05
)


@pytest.mark.parametrize("collective", ["ring", "parameter_server", "tree"])
def test_with_no_override_the_simulator_gives_the_fitted_predictions_at_the_profiled_n(collective):
    prof = _profile(TRUTH)
    prof["spec"]["collective"] = collective
    models = fit_models(prof).to_json_dict()
    fitted = PerfModel.from_dict(models["perf"])
    assert fitted.beta > 0 and fitted.alpha > 0 and fitted.kappa > 0  # every term is there to reproduce
    sim = simulator_from_models(models)
    assert sim.ranks_per_node == 4 and sim.bandwidth_bytes_per_s == pytest.approx(1 / fitted.beta)
    assert sim.latency_s == fitted.alpha
    b = np.array([t["local_batch"] for t in models["trials"]], float)
    n = np.array([t["n_workers"] for t in models["trials"]], float)
    np.testing.assert_allclose(sim.t_step_s(collective, b, n), fitted.t_step_s(b, n), rtol=1e-12)
    # and through the table's rows: step time and E * floor(D / B) * t_step
    for t in models["trials"]:
        row = sim.constant(t["global_batch"], [t["n_workers"]], [collective])[0]
        pred = float(fitted.t_step_s(t["local_batch"], t["n_workers"]))
        assert row.t_step_s == pytest.approx(pred, rel=1e-12)
        assert row.total_time_s == pytest.approx(3 * (1438 // t["global_batch"]) * pred, rel=1e-12)
    # beyond the profiled N the co-location slowdown stays at its value for 4 ranks
    assert float(sim.t_compute_s(8, 1024)) == pytest.approx(float(fitted.t_compute_s(8, 4)))
    one = simulator_from_models(models, ranks_per_node=1)
    assert float(one.t_compute_s(8, 4)) == pytest.approx(float(fitted.t_compute_s(8, 1)))


def test_an_overlapped_model_is_reproduced_too():
    over = PerfModel(
        "tree", grad_bytes=10**6, c0=1e-3, c1=2e-4, kappa=0.1, kappa0=1e-4, alpha=2e-5, beta=1e-9, rho=0.2, gamma=2.5
    )
    sim = simulator_from_models(
        _record(
            over,
            trials=[
                {
                    "n_workers": 2,
                    "local_batch": 8,
                    "global_batch": 16,
                    "status": "ok",
                    "t_step_s": 0.01,
                    "t_compute_s": 0.01,
                    "peak_mem_bytes": 2800,
                }
            ],
        )
    )
    b, n = np.array([8.0, 64, 3]), np.array([1.0, 2, 2])
    np.testing.assert_allclose(sim.t_step_s("tree", b, n), over.t_step_s(b, n), rtol=1e-12)


def test_what_the_profile_cannot_identify_is_said():
    prof = _profile(TRUTH, sizes=(1, 2))  # one size above 1: alpha frozen
    models = fit_models(prof).to_json_dict()
    assert "alpha" in models["perf"]["frozen"]
    notes = " ".join(simulator_from_models(models).notes)
    assert "latency taken as 0" in notes and "sharing one host" in notes
    assert "latency" not in " ".join(simulator_from_models(models, latency="5us").notes)


# --------------------------------------------------------------------------- schedules
def test_a_geometric_schedule_counts_updates_and_grows_the_workers():
    # D = 1438, 10 epochs from B0 = 32 doubling every 2 epochs, N = ceil(B / 32) up to 64:
    # 2 x (44 + 22 + 11 + 5 + 2) = 168 updates at B = 32, 64, 128, 256, 512 on N = 1, 2, 4, 8, 16
    sim = simulator_from_models(_record(HAND, dataset_size=1438, epochs=10), bandwidth="100Gbit/s", latency="5us")
    caps = Caps(1438, None, 1, 64, 32)
    res = sim.schedule("geometric", 32, caps, {"factor": 2, "delay": 2}, ["ring", "tree"])
    ring = res[0]
    assert [e.global_batch for e in ring.epochs] == [32, 32, 64, 64, 128, 128, 256, 256, 512, 512]
    assert [e.n_workers for e in ring.epochs] == [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]
    assert [e.steps for e in ring.epochs] == [44, 44, 22, 22, 11, 11, 5, 5, 2, 2]
    assert ring.updates == 168 and ring.max_workers == 16 and ring.resizes == 4
    want = sum(e.steps * float(sim.t_step_s("ring", e.global_batch / e.n_workers, e.n_workers)) for e in ring.epochs)
    assert ring.total_time_s == pytest.approx(want, rel=1e-12)
    assert ring.cost == pytest.approx(sum(e.epoch_time_s * e.n_workers for e in ring.epochs))
    assert res[1].collective == "tree" and res[1].updates == 168
    # a constant schedule is the constant-batch simulation
    const = sim.schedule("constant", 128, Caps(1438, None, 4, 4, None), {}, ["ring"])[0]
    row = sim.constant(128, [4], ["ring"])[0]
    assert const.updates == row.updates == 10 * 11
    assert const.total_time_s == pytest.approx(row.total_time_s, rel=1e-12)


def test_increase_instead_of_decay_follows_the_milestones():
    sim = simulator_from_models(_record(HAND, dataset_size=1000, epochs=6), bandwidth="1GB/s", latency="1us")
    res = sim.schedule(
        "increase_instead_of_decay", 50, Caps(1000, None, 1, 8, 50), {}, ["ring"], lr_milestones=[2, 4], lr_gamma=0.5
    )[0]
    assert [e.global_batch for e in res.epochs] == [50, 50, 100, 100, 200, 200]
    assert res.updates == 2 * (20 + 10 + 5)


def test_loss_ratio_replays_a_training_runs_losses():
    sim = simulator_from_models(_record(HAND, dataset_size=1000, epochs=4), bandwidth="1GB/s", latency="1us")
    caps = Caps(1000, None, 1, 8, 25)
    with pytest.raises(TulaError, match="follows the train_loss measured while training"):
        sim.schedule("loss_ratio", 25, caps, {}, ["ring"])
    history = [epoch(1, train_loss=2.0), epoch(2, train_loss=1.0), epoch(3, train_loss=0.5)]
    res = sim.schedule("loss_ratio", 25, caps, {}, ["ring"], history=history)[0]
    # B0 x F(w0) / F(wk), F(w0) the first epoch's loss: 25, 25, 50, 100
    assert [e.global_batch for e in res.epochs] == [25, 25, 50, 100]
    assert [e.n_workers for e in res.epochs] == [1, 1, 2, 4]
    assert res.updates == 40 + 40 + 20 + 10


def test_schedule_caps_come_from_the_spec_or_the_options():
    rec = _record(HAND, spec={"train": {"workers": {"min": 2, "max": 32, "batch_per_worker": 64}}})
    sim = simulator_from_models(rec, bandwidth="1GB/s", latency="1us")
    c = schedule_caps(rec, sim, 128, DEFAULT_WORKERS)
    assert (c.min_workers, c.max_workers, c.batch_per_worker) == (2, 32, 64)
    c = schedule_caps(rec, sim, 128, DEFAULT_WORKERS, max_workers=512, batch_per_worker=16)
    assert (c.min_workers, c.max_workers, c.batch_per_worker) == (2, 512, 16)
    bare = _record(HAND)
    c = schedule_caps(bare, sim, 128, (1, 2, 1024))
    assert (c.min_workers, c.max_workers, c.batch_per_worker) == (1, 1024, 128)
    with pytest.raises(TulaError, match="above max workers"):
        schedule_caps(bare, sim, 128, (1, 2), min_workers=8)


# --------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "text, bytes_per_s",
    [
        ("100Gbit/s", 12.5e9),
        ("100 Gb/s", 12.5e9),
        ("100Gbps", 12.5e9),
        ("10GB/s", 1e10),
        ("1 GiB/s", 2**30),
        ("54Gb/s", 6.75e9),
        (1e9, 1e9),
    ],
)
def test_bandwidths(text, bytes_per_s):
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s)


def test_bad_simulation_inputs_are_one_sentence():
    for call, words in (
        (lambda: parse_collectives("ring,allgather"), "unknown collective 'allgather'"),
        (lambda: parse_workers("1,0"), "worker count 0 is below 1"),
        (lambda: parse_workers("1,two"), "'two' is not a whole number"),
        (lambda: parse_schedule("zigzag"), "unknown batch schedule 'zigzag'"),
        (lambda: parse_schedule("geometric:factor"), "is not KEY=VALUE"),
        (lambda: simulator_from_models(_record(HAND), bandwidth="fast"), "'fast' is not a bandwidth"),
        (lambda: simulator_from_models(_record(HAND), latency="soon"), "'soon' is not a latency"),
        (lambda: simulator_from_models(_record(HAND), compute_speed=0), "positive factor"),
        (lambda: simulator_from_models({"kind": "tula.plan", "version": 1}), "a models record is needed"),
    ):
        with pytest.raises(TulaError) as e:
            call()
        assert words in str(e.value) and len(str(e.value).splitlines()) == 1
    assert parse_schedule("geometric:factor=3,delay=2,max_batch=512") == (
        "geometric",
        {"factor": 3.0, "delay": 2, "max_batch": 512},
    )
    assert parse_workers(None) == tuple(2**k for k in range(11))


# --------------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def models_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("sim") / "models.json"
    save_record(fit_models(_profile(TRUTH)), path)
    return path


def test_cli_simulate_prints_the_tables_and_writes_the_png(models_json, tmp_path):
    out = tmp_path / "sim.png"
    r = run_tula(
        "simulate",
        models_json,
        "--workers",
        "1,2,4,64,1024",
        "--batch",
        "512",
        "--bandwidth",
        "100Gbit/s",
        "--latency",
        "5us",
        "--out",
        out,
        timeout=120,
        columns=200,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for words in (
        "Simulated ring",
        "Simulated parameter_server",
        "Simulated tree",
        "1024",
        "N > B",
        "Simulated training time per cluster size",
    ):
        assert words in r.stdout, words
    r = run_tula(
        "simulate",
        models_json,
        "--schedule",
        "geometric:factor=2,delay=1",
        "--schedule",
        "constant",
        "--collective",
        "ring",
        "--out",
        tmp_path / "sched.png",
        timeout=120,
        columns=200,
    )
    assert r.returncode == 0, r.stderr
    assert "geometric:factor=2,delay=1" in r.stdout and "per schedule" in r.stdout


@pytest.mark.parametrize(
    "args, words",
    [
        (("--collective", "mesh"), "unknown collective 'mesh'"),
        (("--workers", "0,4"), "worker count 0 is below 1"),
        (("--bandwidth", "lots"), "'lots' is not a bandwidth"),
        (("--latency", "5 parsecs"), "is not a latency"),
        (("--schedule", "adaptive"), "follows the b_simple"),
        (("--schedule", "constant", "--workers-rule", "plan", "--threshold", "2"), "--threshold must be at least 0"),
        (("--compute-speed", "-1"), "positive factor"),
        (("--accumulation", "4"), "--accumulation applies to batch schedules only"),
        (("--min-workers", "2", "--max-workers", "8"), "--min-workers, --max-workers apply to batch schedules only"),
    ],
)
def test_cli_simulate_bad_input_exits_2_with_one_sentence(models_json, tmp_path, args, words):
    # in this process (the command's own entry point); the next test runs the real command
    r = tula_in_process("simulate", models_json, "--out", tmp_path / "x.png", *args)
    assert r.returncode == 2, r.stderr
    err = " ".join(r.stderr.split())
    assert err.startswith("error:") and words in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_the_options_the_core_refuses_by_name_are_the_flags_of_tula_simulate():
    """The core names an option by what_if's parameter (a JSON field's name); the command line
    spells each with cli_options.flag, and each spelling is an option of ``tula simulate``."""
    import inspect

    import typer

    from tula.cli import app
    from tula.cli_options import flag
    from tula.core.simulate import what_if

    refused = ("min_workers", "max_workers", "batch_per_worker", "max_accumulation_steps", "history")
    refused += ("workers_rule", "threshold", "schedules")
    assert set(refused) <= set(inspect.signature(what_if).parameters)
    simulate = typer.main.get_command(app).commands["simulate"]
    flags = {name for p in simulate.params for name in p.opts}
    assert {o: flag(o) for o in refused if flag(o) not in flags} == {}
    with pytest.raises(TulaError) as refusal:  # core: the option's name, quoted
        raise_schedule_only(min_workers=2, threshold=0.1)
    assert str(refusal.value).startswith("'min_workers', 'threshold' apply to batch schedules only; add a 'schedules'")
    assert refusal.value.spelled(flag).startswith(
        "--min-workers, --threshold apply to batch schedules only; add a --schedule"
    )


def raise_schedule_only(**options):
    from tula.core.simulate import what_if

    models = fit_models(_profile(TRUTH))
    what_if(models, simulator_from_models(models), [1, 2], ["ring"], 32, **options)


def test_cli_simulate_refuses_a_record_that_is_not_a_models_record(models_json, tmp_path):
    plan = tmp_path / "plan.json"
    from tula.core.plan import make_plan

    save_record(make_plan(json.loads(models_json.read_text()), "time"), plan)
    r = run_tula("simulate", plan, "--out", tmp_path / "x.png", timeout=120, columns=200)
    assert r.returncode == 2 and "is a plan record, but a models record is needed here" in " ".join(r.stderr.split())
    r = run_tula("simulate", tmp_path / "missing.json", "--out", tmp_path / "x.png", timeout=120, columns=200)
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_simulating_imports_no_torch(models_json, tmp_path):
    code = f"""
import sys
from tula.core.records import load_record
from tula.report import plot_simulation, simulation_tables
from tula.core.schedules import Caps
from tula.core.simulate import simulator_from_models
models = load_record({str(models_json)!r})
sim = simulator_from_models(models, bandwidth="100Gbit/s", latency="5us")
rows = sim.constant(512, [1, 64, 1024])
simulation_tables(sim, rows)
plot_simulation(sim, rows, {str(tmp_path / "sim.png")!r})
sim.schedule("geometric", 32, Caps(1438, None, 1, 64, 32), {{"factor": 2, "delay": 1}})
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded[:5]
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sim.png").read_bytes()[:4] == b"\x89PNG"


def test_a_schedule_grows_through_accumulation_where_the_memory_caps_the_workers_batch():
    """Issue #17, item 3 in the simulator: memory caps the local batch at 64 (the memory
    model's), the workers at 2; with up to 4 accumulation steps (search.max_accumulation_steps,
    or the what-if) a geometric schedule reaches 512 as 4 micro-batches of 64 on 2 workers,
    each such step k - 1 computes of the micro-batch plus one ordinary step."""
    # memory_model(): 2000 static bytes + 100 per sample; 90 % of 9334 bytes holds 64 samples
    search = {"max_accumulation_steps": 4, "memory_budget_bytes": 9334}
    rec = _record(HAND, dataset_size=4096, epochs=4, spec={"search": search})
    sim = simulator_from_models(rec, bandwidth="10Gbit/s", latency="5us")
    assert sim.max_local_batch == 64
    caps = schedule_caps(rec, sim, 64, [1, 2], max_workers=2, batch_per_worker=64)
    assert caps.max_accumulation_steps == 4
    ring = sim.schedule("geometric", 64, caps, {"factor": 2, "delay": 1}, ["ring"])[0]
    got = [(e.global_batch, e.n_workers, e.accumulation_steps, e.micro_batch) for e in ring.epochs]
    assert got == [(64, 1, 1, 64), (128, 2, 1, 64), (256, 2, 2, 64), (512, 2, 4, 64)]
    assert ring.max_accumulation_steps == 4
    last = ring.epochs[-1]
    compute, sync = float(sim.t_compute_s(64, 2)), float(sim.t_sync_s("ring", 2))
    assert last.t_step_s == pytest.approx(3 * compute + float(HAND.combine_s(compute, sync, 2)), rel=1e-12)
    # the what-if option replaces the spec's: without accumulation the batch stops at 2 x 64
    flat = sim.schedule("geometric", 64, schedule_caps(rec, sim, 64, [1, 2], max_workers=2, max_accumulation_steps=1),
                        {"factor": 2, "delay": 1}, ["ring"])[0]  # fmt: skip
    assert [e.global_batch for e in flat.epochs] == [64, 128, 128, 128]
    with pytest.raises(TulaError, match="max accumulation must be at least 1"):
        schedule_caps(rec, sim, 64, [1, 2], max_accumulation_steps=0)


def test_check_history_refuses_a_schedule_it_cannot_replay():
    check_history("geometric", schedule_info("geometric"), None, 5)  # reads nothing measured
    with pytest.raises(OptionError, match="follows the b_simple measured while training") as refused:
        check_history("adaptive", schedule_info("adaptive"), None, 5)
    # the core names its option; the command line spells it (tests/test_cli_paths.py: `tula simulate --history`)
    assert str(refused.value).endswith("give a training run's record to replay ('history')")
    assert "tula simulate" not in str(refused.value) and refused.value.options == {"history": "history"}
    with pytest.raises(TulaError, match="has 3 epochs, but 'loss_ratio' needs the first 4 to simulate 5"):
        check_history("loss_ratio", schedule_info("loss_ratio"), [{}] * 3, 5)
    check_history("loss_ratio", schedule_info("loss_ratio"), [{}] * 4, 5)  # the last epoch's is not read


def test_each_epochs_configuration_is_decided_in_one_place_from_the_epochs_before():
    """Simulator.decide is the seam a planner that decides while training replaces: the
    simulated run asks it once per epoch, with the epochs done so far (a replayed history's
    train_loss and b_simple in them)."""
    seen: list[list[FinishedEpoch]] = []

    @dataclasses.dataclass(frozen=True)
    class Watched(Simulator):
        def decide(self, state, epoch, done, caps):
            seen.append(list(done))
            return next_config(state, epoch, done, caps)

    base = simulator_from_models(_record(HAND, dataset_size=1000, epochs=3), bandwidth="1GB/s", latency="1us")
    sim = Watched(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    history = [epoch(1, train_loss=2.0, b_simple=10.0), epoch(2, train_loss=1.0, b_simple=20.0)]
    res = sim.schedule("loss_ratio", 25, Caps(1000, None, 1, 8, 25), {}, ["ring"], history=history)[0]
    assert [len(d) for d in seen] == [0, 1, 2]
    assert [(d.train_loss, d.b_simple) for d in seen[2]] == [(2.0, 10.0), (1.0, 20.0)]
    assert [d.global_batch for d in seen[2]] == [e.global_batch for e in res.epochs[:2]]
    assert res == base.schedule("loss_ratio", 25, Caps(1000, None, 1, 8, 25), {}, ["ring"], history=history)[0]


def test_the_rows_are_typed_and_their_json_holds_the_keys_it_held():
    """A simulated row is a frozen object; its JSON (``to_json_dict``) holds what the rows held
    as dicts: a row without times no failure-free time, a row without a noise scale no figures
    to accuracy, a schedule's epochs as a list."""
    models = _record(HAND, dataset_size=1000, epochs=2)
    sim = simulator_from_models(models, bandwidth="1GB/s", latency="1us")
    one, above = sim.constant(64, [2, 128], ["ring"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.note = "changed"  # type: ignore[misc]
    config = ["collective", "n_workers", "global_batch", "local_batch", "updates", "note", "t_step_s", "t_compute_s"]
    times = ["t_sync_s", "epoch_time_s", "total_time_s"]
    assert list(above.to_json_dict()) == config + times + ["cost", "fits_memory"]
    assert above.to_json_dict()["t_step_s"] is None and above.note.startswith("N > B")
    assert list(one.to_json_dict()) == config + times + ["failure_free_time_s", "cost", "fits_memory"]
    w = what_if(models, sim, [2, 128], ["ring"], 64, noise_scale=500.0)
    accuracy = ["epochs_to_accuracy", "time_to_accuracy_s", "cost_to_accuracy"]
    assert list(w.rows[0].to_json_dict()) == list(one.to_json_dict()) + accuracy
    assert w.rows[0].epochs_to_accuracy == pytest.approx(2 * (500 + 64) / (500 + 128))  # B0: train.base_batch
    assert w.rows[1] == above  # no times: nothing to accuracy
    row = sim.schedule("geometric", 32, Caps(1000, None, 1, 4, 32), {"factor": 2, "delay": 1}, ["ring"])[0]
    data = json.loads(json.dumps(row.to_json_dict()))
    assert data["schedule"] == "geometric" and data["max_batch"] == 64 and len(data["epochs"]) == 2
    assert list(data["epochs"][1]) == [
        "epoch", "global_batch", "n_workers", "local_batch", "accumulation_steps", "micro_batch", "steps", "reason",
        "t_step_s", "epoch_time_s", "expected_time_s", "cost",
    ]  # fmt: skip
    assert data["epochs"][1]["global_batch"] == row.epochs[1].global_batch == 64
