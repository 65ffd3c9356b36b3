import time

import pytest

from tula.fit import fit_models
from tula.launch import LocalLauncher
from tula.profile import _merge_ranks, profile, profile_world
from tula.spec import spec_from_dict

TRIAL_FIELDS = {"n_workers", "local_batch", "global_batch", "t_step_s", "t_compute_s", "t_sync_s",
                "peak_mem_bytes", "status"}


def test_two_rank_ddp_trials(tiny_spec_dict):
    spec = spec_from_dict(tiny_spec_dict)
    launcher = LocalLauncher(device="cpu", threads_per_worker=1)
    res = launcher.run(profile_world, 2, spec.to_dict(), [(2, 16), (2, 512)], None, "full", None, timeout_s=300)
    trials = _merge_ranks(res)
    assert [t["status"] for t in trials] == ["ok", "ok"]
    for t in trials:
        assert TRIAL_FIELDS <= set(t)
        assert t["t_step_s"] > 0 and t["t_compute_s"] > 0 and t["t_sync_s"] >= 0
        assert t["t_sync_s"] == pytest.approx(max(t["t_step_s"] - t["t_compute_s"], 0.0))
        assert t["timed_steps"] >= 3
    small, big = trials
    assert (small["local_batch"], big["local_batch"]) == (8, 256)
    assert big["peak_mem_bytes"] > small["peak_mem_bytes"]
    assert big["t_compute_s"] > small["t_compute_s"]


def test_oom_trial_under_a_real_memory_cap_is_recorded_and_the_search_moves_on(tiny_spec_dict):
    """Each rank's address space is capped (RLIMIT_AS): a local batch of 16384 digits samples
    cannot fit in 48 MiB, so the CPU allocator fails for real; every rank must agree and
    return, none may hang, and larger batches are skipped."""
    spec = spec_from_dict(tiny_spec_dict)
    launcher = LocalLauncher(device="cpu", threads_per_worker=1)
    t0 = time.monotonic()
    res = launcher.run(profile_world, 2, spec.to_dict(), [(2, 32), (2, 32768), (2, 65536)], 48 * 2**20, "full",
                       None, timeout_s=300)
    assert time.monotonic() - t0 < 120
    assert all("address_space_cap_bytes" in r for r in res)
    trials = _merge_ranks(res)
    assert [t["status"] for t in trials] == ["ok", "oom", "skipped"]
    assert "out of memory on rank" in trials[1]["note"]
    assert "can't allocate memory" in trials[1]["note"]  # the CPU allocator's real error
    assert trials[0]["t_step_s"] > 0  # what was measured before the OOM is kept


def test_partial_profile_end_to_end_and_fit(tiny_spec_dict):
    spec = spec_from_dict(tiny_spec_dict)
    events = []
    rec = profile(spec, "partial", on_event=events.append)
    assert rec["kind"] == "tula.profile" and rec["search"] == "partial"
    # partial search: extreme cluster sizes x extreme global batches
    assert sorted((t["n_workers"], t["global_batch"]) for t in rec["trials"]) == \
        [(1, 16), (1, 256), (2, 16), (2, 256)]
    assert all(t["status"] == "ok" for t in rec["trials"])
    assert events[0]["type"] == "plan" and sum(e["type"] == "trial" for e in events) == 4
    models = fit_models(rec)
    assert models["kind"] == "tula.models"
    assert models["perf"]["c1"] > 0
    # the memory model, fitted from two probe steps, predicts the trials' measured peaks
    assert models["fit_error"]["peak_mem_median_rel"] < 0.05
