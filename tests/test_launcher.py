import subprocess
import sys
import textwrap
import time

import pytest
import workers
from helpers import local_launcher

from tula.core.errors import WorkerError


@pytest.mark.slow  # a real DDP world
def test_two_rank_gloo_world_returns_results_in_rank_order():
    events = []
    res = local_launcher().run(
        workers.allreduce_rank, 2, 10.0, on_event=lambda r, ev: events.append((r, ev)), timeout_s=120
    )
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["sum"] == 30.0 and r["world"] == 2 and r["backend"] == "gloo" for r in res)
    assert sorted(r for r, _ in events) == [0, 1]


@pytest.mark.slow  # a real DDP world
def test_failing_rank_is_named_and_nothing_hangs():
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 of 2 failed: ValueError: boom on purpose") as e:
        local_launcher(grace_s=2).run(workers.fail_on_rank_one, 2, timeout_s=120)
    assert e.value.rank == 1
    assert time.monotonic() - t0 < 60


@pytest.mark.slow  # a real DDP world
def test_dead_rank_is_reported():
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 of 2 died"):
        local_launcher().run(workers.die_on_rank_one, 2, timeout_s=120)
    assert time.monotonic() - t0 < 60


@pytest.mark.slow  # a real DDP world
def test_a_rank_that_crashes_while_its_process_group_is_destroyed_has_already_delivered_its_result():
    """A rank sends its result before it leaves its world: a crash in that teardown (a native abort,
    as test_fsdp's 2-rank run once died of 'double free or corruption' after its last epoch) costs the
    finished world nothing. Before, rank 0 'died (was killed by SIGABRT) before returning a result'."""
    assert local_launcher().run(workers.abort_on_rank_zero_in_teardown, 2, timeout_s=120) == [0, 1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_a_fresh_rank_serves_blocks_under_32_mib_from_its_heap():
    """The local launcher's ranks start with a steady heap (tula.engine.memory.steady_heap):
    a 24 MiB block comes from the heap, where glibc's first threshold (128 KiB) maps it alone."""
    served = local_launcher().run(workers.heap_serves_block, 1, 24 * 2**20, timeout_s=120)
    assert served == [True]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS")
def test_a_rank_starts_and_ends_with_the_processs_own_address_space_limit_whatever_cap_is_in_force():
    """A process that runs rank after rank (a Dask worker; here in-process worlds of one): a cap
    another rank left in force (a cancelled rank still running under it) neither caps the next
    rank nor outlives it. Before, the next rank took the cap for the limit and put it back at
    its end, and every later world on that worker failed."""
    code = textwrap.dedent("""
        import resource
        from tula.engine.launch.local import LocalLauncher

        own = resource.getrlimit(resource.RLIMIT_AS)
        launcher = LocalLauncher(device="cpu", threads_per_worker=1, in_process=True)

        def limit_seen(ctx):
            return resource.getrlimit(resource.RLIMIT_AS)

        assert launcher.run(limit_seen, 1) == [own]
        resource.setrlimit(resource.RLIMIT_AS, (64 << 30, own[1]))  # another rank's cap, in force
        seen = launcher.run(limit_seen, 1)
        print(seen == [own], resource.getrlimit(resource.RLIMIT_AS) == own)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"], r.stdout


# --------------------------------------------------------------------------- the steps, without a world
def test_rank_setups_give_each_rank_its_place_in_one_rendezvous():
    from tula.engine.launch.local import rank_setups

    setups = rank_setups(3, 29500, "cpu", 2, 45.0)
    assert [(s.rank, s.local_rank, s.world_size, s.local_world_size) for s in setups] == [
        (0, 0, 3, 3),
        (1, 1, 3, 3),
        (2, 2, 3, 3),
    ]
    assert {s.init_method for s in setups} == {"tcp://127.0.0.1:29500"}
    assert {(s.device_kind, s.threads, s.pg_timeout_s) for s in setups} == {("cpu", 2, 45.0)}


def test_lost_failures_name_the_silent_dead_before_the_ranks_a_stop_kills():
    from tula.engine.launch.local import lost_failures

    # rank 1 died by SIGKILL, rank 2 is still running after a stop: the dead one is the story
    (dead,) = lost_failures([1], [None, -9, None], [1, 2], True, 60.0)
    assert (dead.rank, dead.cause) == (1, "lost_worker")
    assert dead.message == "died (was killed by SIGKILL) before returning a result"
    assert lost_failures([1], [None, 3, None], [], False, 60.0)[0].message == (
        "died (exited with code 3) before returning a result"
    )
    # nobody died: after a stop the ranks still running are killed, each said so
    stopped = lost_failures([], [None, None, None], [0, 2], True, 60.0)
    assert [(f.rank, f.cause) for f in stopped] == [(0, "interrupted"), (2, "interrupted")]
    assert stopped[0].message == "killed: it did not stop within 60 s of the signal"
    # no stop, nobody silent, or everyone answered: nothing lost
    assert lost_failures([], [None, None], [0, 1], False, 60.0) == []
    assert lost_failures([], [0, 0], [], True, 60.0) == []


def test_host_facts_are_typed_once_and_a_record_writes_them_as_they_were_read():
    """``host_facts`` builds the typed :class:`HostFacts` where they are read; what a Dask worker
    sends (``host_facts_json``) is plain JSON values that type back to the same facts; a profile
    record writes them back key for key (in the order host_facts writes them), with a fact it does
    not know kept and a null kept null."""
    import json
    from pathlib import Path

    import torch

    from tula.core.records import HostFacts, ProfileRecord
    from tula.engine.launch.base import host_facts, host_facts_json

    facts = host_facts("cpu")
    assert isinstance(facts, HostFacts) and facts.device == "cpu" and facts.torch == torch.__version__
    sent = json.loads(json.dumps(host_facts_json("cpu")))  # what crosses the wire: plain values only
    assert HostFacts.model_validate(sent).to_json_dict() == sent == facts.to_json_dict()
    order = ("device", "cpu", "cores", "torch", "cuda_available", "gpu", "gpu_memory_bytes", "gpus", "memory_bytes")
    assert list(sent) == [k for k in order if k in sent]
    assert ("gpu" in sent) == ("gpu_memory_bytes" in sent) == torch.cuda.is_available() == sent["cuda_available"]
    stored = json.loads((Path(__file__).parent / "data" / "records" / "profile.json").read_text())
    for written in (
        stored["facts"],
        {"device": "cuda", "cores": 8, "torch": "2.14.1", "gpu": None, "a_later_fact": [1]},
        {"device": "cpu"},
    ):
        rec = ProfileRecord.from_dict({**stored, "facts": written})
        assert isinstance(rec.facts, HostFacts)
        assert json.dumps(rec.to_json_dict()["facts"]) == json.dumps(written)
    with pytest.raises(Exception, match="facts.device"):
        ProfileRecord.from_dict({**stored, "facts": {"cpu": "no device"}})
