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
