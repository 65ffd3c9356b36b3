import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def tiny_spec_dict():
    """A job small enough for 2-rank trials in a few seconds."""
    return {
        "name": "tiny",
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
        "data": {"name": "digits"},
        "epochs": 2,
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 256},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0},
    }


@pytest.fixture
def tula_cmd():
    exe = Path(sys.executable).parent / "tula"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tula.cli"]


@pytest.fixture(scope="session")
def pg_server():
    """A throwaway PostgreSQL server for the session (tests/pg.py), or a skip saying why
    there is none -- a failure instead when TULA_REQUIRE_POSTGRES=1 (CI)."""
    from pg import REQUIRE_ENV, PostgresServer, find_pg_bin

    bin_dir = find_pg_bin()
    if bin_dir is None:
        reason = "PostgreSQL is not installed (no initdb on PATH or under /usr/lib/postgresql/*/bin)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 requires it")
        pytest.skip(reason)
    server = PostgresServer(bin_dir)
    try:
        server.start()
    except Exception as err:  # noqa: BLE001 - installed but not starting is a failure, never a skip
        log = server.log()
        server.stop()
        pytest.fail(f"the PostgreSQL server in {server.root} did not start: {err}\n{log}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def netns_ok():
    """Whether emulated hosts (network namespaces, tests/emulated_hosts.py) can be made here;
    a skip saying why not -- a failure instead when TULA_REQUIRE_NETNS=1 (CI)."""
    from emulated_hosts import REQUIRE_ENV, why_unavailable

    why = why_unavailable()
    if why:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"emulated hosts cannot be made: {why}, and {REQUIRE_ENV}=1 requires them")
        pytest.skip(f"emulated hosts cannot be made: {why}")
    return True
