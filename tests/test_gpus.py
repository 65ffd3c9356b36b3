"""One rank per GPU (#25, item 2): the rank-to-GPU rule, the refusal of a world a host cannot
place, a profile that skips the cluster sizes it cannot place (and a plan that does not rank
them), and a world that fails to form for a reason other than a timeout reported as that
reason -- only a real timeout gets the network sentence, naming the timeout in force.

No GPU here: the rules are pure functions of the GPU count; the profile runs for real on CPU
ranks under a local launcher that states one GPU per host (only the count is stated; its
ranks, gloo and the profile are real), and the failure texts come from torch's own
exception types and from a real rendezvous that times out."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from helpers import free_port

from tula.core.errors import InfeasibleError, PlacementError
from tula.core.events import Note
from tula.core.fit import fit_models, oom_local_batch
from tula.core.gpus import (
    check_ranks_fit,
    crowded_hosts,
    gpu_for_rank,
    too_many_ranks_sentence,
    unplaceable_sizes,
)
from tula.core.plan import make_plan
from tula.core.spec import spec_from_dict
from tula.core.trial import Trial
from tula.engine.launch import LocalLauncher
from tula.engine.launch.local import failure_sentence
from tula.engine.launch.netif import InterfaceChoice
from tula.engine.launch.runtime import RankSetup, StopFlag, _failure, is_timeout, rank_device, run_rank
from tula.engine.profile import profile

NETWORK_WORDS = ("firewall", "could not connect", "interface")


# --------------------------------------------------------------------------- the rule
def test_rank_r_gets_gpu_r_of_the_visible_ones():
    assert [gpu_for_rank(r, 4, visible_gpus=4) for r in range(4)] == [0, 1, 2, 3]
    assert [gpu_for_rank(r, 2, visible_gpus=8) for r in range(2)] == [0, 1]  # fewer ranks than GPUs
    assert gpu_for_rank(0, 1, visible_gpus=1) == 0


def test_more_ranks_on_a_host_than_gpus_is_refused_naming_both_numbers():
    with pytest.raises(PlacementError) as e:
        gpu_for_rank(1, 2, visible_gpus=1)  # the H200 case: two ranks, one GPU
    msg = str(e.value)
    assert "2 ranks" in msg and "1 GPU visible" in msg and "CUDA_VISIBLE_DEVICES" in msg
    assert "\n" not in msg and isinstance(e.value, InfeasibleError)
    with pytest.raises(PlacementError, match="3 ranks on this host, which has 2 GPUs visible"):
        gpu_for_rank(0, 3, visible_gpus=2)  # refused on every rank, also the one that would fit
    assert "no GPU visible" in too_many_ranks_sentence(1, 0)
    with pytest.raises(ValueError):
        gpu_for_rank(2, 2, visible_gpus=4)  # not a local rank of that host


def test_on_cpu_there_is_no_gpu_limit():
    check_ranks_fit(64, None)
    assert unplaceable_sizes([1, 2, 64], None) == []
    assert rank_device("cpu", 5, 8).type == "cpu"


def test_the_sizes_one_host_cannot_place_and_the_crowded_hosts():
    assert unplaceable_sizes([1, 2, 4, 8], 2) == [4, 8]
    assert unplaceable_sizes([1, 2], 1) == [2]
    assert unplaceable_sizes([1, 2], 8) == []
    crowded = crowded_hosts({"10.0.0.1": 2, "10.0.0.2": 3}, {"10.0.0.1": 2, "10.0.0.2": 2})
    assert crowded == [too_many_ranks_sentence(3, 2, "host 10.0.0.2")]
    assert crowded_hosts({"a": 4}, {"a": None}) == []  # a CPU host


# --------------------------------------------------------------------------- the local launcher
class _OneGpuHost(LocalLauncher):
    """The local launcher on CPU ranks, stating that its host has one GPU: what it and the
    profile do with the count (refuse, skip) is theirs; nothing else is changed."""

    gpus_per_host = 1  # type: ignore[assignment]


def _marks(ctx, path: str) -> int:
    Path(path, f"rank{ctx.rank}").write_text("ran")
    return ctx.rank


def test_the_local_launcher_refuses_a_world_it_cannot_place_before_any_rank_starts(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match="2 ranks on this machine .*which has 1 GPU visible"):
        _OneGpuHost(device="cpu", threads_per_worker=1).run(_marks, 2, str(tmp_path), timeout_s=60)
    assert time.monotonic() - t0 < 2 and list(tmp_path.iterdir()) == []  # no rank ran
    assert LocalLauncher(device="cpu").gpus_per_host is None
    assert _OneGpuHost(device="cpu", threads_per_worker=1).run(_marks, 1, str(tmp_path), timeout_s=120) == [0]


@pytest.mark.slow  # a real DDP world
def test_a_profile_skips_the_sizes_it_cannot_place_and_the_plan_does_not_rank_them(tiny_spec_dict):
    spec = spec_from_dict(tiny_spec_dict)  # cluster sizes 1 and 2, as make demo's
    events: list[dict] = []
    rec = profile(spec, "partial", launcher=_OneGpuHost(device="cpu", threads_per_worker=1), on_event=events.append)
    by_n = {n: [t for t in rec.trials if t.n_workers == n] for n in (1, 2)}
    assert by_n[1] and all(t.status == "ok" for t in by_n[1])
    assert by_n[2] and all(t.status == "skipped" for t in by_n[2])
    assert all("N = 2" in t.note and "1 GPU" in t.note for t in by_n[2])
    assert set(rec.not_measured) == {"2"}
    notes = [e.message for e in events if isinstance(e, Note)]
    assert len(notes) == 1 and "not measured: N = 2" in notes[0] and "skipped" in notes[0]
    models = fit_models(rec)
    assert models.oom_local_batch is None  # a skipped size says nothing about memory
    plan = make_plan(models, "time")
    assert plan.choice.n_workers == 1
    rows2 = [r for r in plan.configurations if r.n_workers == 2]
    assert rows2 and not any(r.feasible for r in rows2) and all("not measured" in (r.reason or "") for r in rows2)
    assert "not measured: N = 2" in plan.reason and plan.not_measured == rec.not_measured


def test_a_profile_whose_every_size_is_unplaceable_is_refused_before_any_world(tiny_spec_dict):
    spec = spec_from_dict({**tiny_spec_dict, "search": {**tiny_spec_dict["search"], "cluster_sizes": [2, 4]}})
    with pytest.raises(PlacementError, match="2 ranks on this machine"):
        profile(spec, "partial", launcher=_OneGpuHost(device="cpu", threads_per_worker=1))


def test_oom_local_batch_counts_only_what_ran_out_of_memory():
    trials = [
        Trial(n_workers=2, local_batch=8, global_batch=16, status="skipped"),  # a size that was not placed
        Trial(n_workers=1, local_batch=64, global_batch=64, status="oom"),
        Trial(n_workers=1, local_batch=128, global_batch=128, status="skipped"),  # after the OOM
    ]
    assert oom_local_batch(trials) == 64


# --------------------------------------------------------------------------- why a world did not form
def _setup(**kw) -> RankSetup:
    return RankSetup(1, 2, "tcp://127.0.0.1:29999", "cuda", pg_timeout_s=2700.0, **kw)


def _raised(exc: BaseException) -> BaseException:
    try:  # raised for real, so that it has a traceback
        raise exc
    except BaseException as err:  # noqa: BLE001
        return err


def test_nccl_invalid_usage_is_reported_as_itself_not_as_the_network():
    text = (
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage (run with "
        "NCCL_DEBUG=WARN for details), NCCL version 2.27.3\nncclInvalidUsage: This usually reflects invalid "
        "usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"
    )
    err = _raised(dist.DistBackendError(text))
    assert not is_timeout(err)
    f = _failure(_setup(), err, StopFlag(), False, InterfaceChoice("", ""), 14.0)
    assert f.cause == "crash" and f.exc_type == "DistBackendError"
    said = failure_sentence(f, 2)
    assert "invalid usage" in said and "could not join its world of 2" in said
    assert not any(w in said for w in NETWORK_WORDS) and "2700" not in said


def test_a_cuda_error_is_not_a_timeout_even_when_it_says_timed_out():
    err = _raised(RuntimeError("CUDA error: the launch timed out and was terminated"))
    assert not is_timeout(err)
    said = failure_sentence(_failure(_setup(), err, StopFlag(), False, InterfaceChoice("", ""), 3.0), 2)
    assert "launch timed out" in said and not any(w in said for w in NETWORK_WORDS)


def test_timeouts_by_type_get_the_network_sentence_with_the_time_waited_and_the_timeout_in_force():
    for exc in (
        dist.DistStoreError("Timed out after 31 seconds waiting for clients. 1/2 clients joined."),
        dist.DistNetworkError("The client socket has failed to connect to [x]:29999"),
        TimeoutError("timed out"),
    ):
        err = _raised(exc)
        assert is_timeout(err), exc
        f = _failure(_setup(), err, StopFlag(), False, InterfaceChoice("", ""), 31.0)
        assert f.cause == "unreachable"
        assert "could not connect" in f.message and "gave up after 31 s" in f.message
        assert "timeout being 2700 s" in f.message and type(exc).__name__ in f.message
    wrapped = _raised(RuntimeError("the world did not form"))
    wrapped.__cause__ = TimeoutError("timed out")  # raised from a timeout
    assert is_timeout(wrapped)


def test_a_real_rendezvous_that_times_out_names_the_timeout_in_force():
    """Rank 0 of a world of 2 whose rank 1 never comes: torch's own store times out after the
    process group's 3 s, and the sentence says so (not any other number)."""
    setup = RankSetup(0, 2, f"tcp://127.0.0.1:{free_port()}", "cpu", threads=1, pg_timeout_s=3.0)
    t0 = time.monotonic()
    kind, f = run_rank(setup, _marks, ("/nonexistent",), emit=lambda ev: None, in_process=True)
    took = time.monotonic() - t0
    assert kind == "failure" and f.cause == "unreachable", f
    assert 2 < took < 30, took
    assert "could not connect" in f.message and "timeout being 3 s" in f.message, f.message
    waited = re.search(r"gave up after (\d+) s", f.message)
    assert waited and 3 <= int(waited.group(1)) <= took + 1, f.message
