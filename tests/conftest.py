import json
import os
import shutil
import signal
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import helpers
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # a pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment, which a
    # plain pytest run has not: the CLI (and every command a test starts) would then lay its
    # tables out at 80 columns and cut columns off.  Both ways of running lay out alike.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
# The tests set the signal dispositions they test, not inherit them: a suite started from a shell
# that runs it in the background has SIGINT ignored, which the commands and workers it starts
# (and the in-process commands) would inherit.  Python's own default for SIGINT, and SIG_DFL for
# SIGTERM, whatever the suite was started with; a child exec'd from here starts with both at SIG_DFL.
signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def _subnormal_floats_after_each_test():
    """IEEE floats again after each test: a test that runs a rank's set-up in this process
    (tula.engine.gpu_knobs.set_backend_knobs) flushes subnormals to zero in its thread, which
    Hypothesis's float strategies in a later test of the same worker refuse to run under."""
    yield
    torch = sys.modules.get("torch")  # not imported for a test that did not import it
    if torch is not None:
        torch.set_flush_denormal(False)


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory):
    """Generated data sets (MNIST-1D) kept in the session's temporary folder, not in the
    user's ~/.cache: the commands and ranks a test starts inherit TULA_CACHE_DIR."""
    before = os.environ.get("TULA_CACHE_DIR")
    os.environ["TULA_CACHE_DIR"] = str(tmp_path_factory.mktemp("data-cache"))
    yield
    if before is None:
        os.environ.pop("TULA_CACHE_DIR", None)
    else:
        os.environ["TULA_CACHE_DIR"] = before


@pytest.fixture
def tiny_spec_dict():
    """A job small enough for 2-rank trials in a few seconds (helpers.tiny_spec)."""
    return helpers.tiny_spec()


# --------------------------------------------------------------------------- shared finished runs
@dataclass(frozen=True)
class FinishedRun:
    """A finished ``tula`` run made once per session, shared by the tests that only read it.

    Its files are read-only (a test that writes into it fails at once): a test that writes
    copies it first with :meth:`copy_to`.

    Attributes
    ----------
    dir : the run's output directory (``--out``)
    spec : the job spec it ran, as a dict (a copy is returned by :meth:`spec_dict`)
    spec_path : that spec as a YAML file
    stdout : what the command printed on stdout
    """

    dir: Path
    spec: dict
    spec_path: Path
    stdout: str = ""

    def spec_dict(self, **over) -> dict:
        """A fresh copy of the spec, with top-level fields replaced by ``over``."""
        return {**json.loads(json.dumps(self.spec)), **over}

    def record(self, rel: str) -> dict:
        """The JSON record at ``rel`` under the run's directory, e.g. ``"train/train.json"``."""
        return json.loads((self.dir / rel).read_text())

    def copy_to(self, dest: Path) -> Path:
        """A writable copy of the run's directory at ``dest`` (returned)."""
        shutil.copytree(self.dir, dest, copy_function=shutil.copyfile)
        return dest


def _finish(out: Path, spec: dict, spec_path: Path, args: list) -> FinishedRun:
    """``tula ARGS`` (in this process), which writes ``out``: its files made read-only, or the test failed."""
    r = helpers.tula_in_process(*args)  # its ranks real processes, from this process's fork server
    if r.returncode != 0:
        pytest.fail(
            f"the shared run tula {' '.join(map(str, args))} failed with exit {r.returncode}:\n{r.stderr[-4000:]}"
        )
    for p in out.rglob("*"):
        if p.is_file():
            p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return FinishedRun(out, spec, spec_path, r.stdout)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory) -> FinishedRun:
    """``tula run`` of the tiny spec (``tiny_spec_dict``) once per session: profile, models,
    plan and a 2-epoch training run with its checkpoint and plots, as the CLI writes them.
    For the tests that need a finished pipeline's records, not the profiling itself."""
    root = tmp_path_factory.mktemp("tiny-pipeline")
    spec = helpers.tiny_spec()
    spec_path = root / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = root / "run"
    return _finish(out, spec, spec_path, ["run", spec_path, "--out", out])


#: the reference run's job: the tiny spec for 3 epochs with AGS measuring its factors twice per
#: epoch (several updates and scaled steps to compare) and SGD's momentum at 0.5, not the default
#: 0.9 (so that an optimiser factory that is ignored shows)
REFERENCE_B = 64
REFERENCE_N = 2


def _reference_spec() -> dict:
    return {
        **helpers.tiny_spec(),
        "epochs": 3,
        "optimizer": {"momentum": 0.5},
        "train": {"ags": {"b_small": 16, "update_every": 11}, "noise_scale": False},
    }


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> FinishedRun:
    """``tula train --method ags --workers 2 --batch 64`` of the reference spec on the local
    launcher, once per session: what the other ways of training the same job (torchrun, Dask,
    ``tula.Job``, a hand-written loop) must reach bit for bit.  Its ``train.json`` and
    ``checkpoint.pt`` are in ``dir``."""
    root = tmp_path_factory.mktemp("reference")
    spec = _reference_spec()
    spec_path = root / "reference.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    out = root / "run"
    args = ["train", spec_path, "--method", "ags", "--workers", REFERENCE_N, "--batch", REFERENCE_B, "--out", out]
    return _finish(out, spec, spec_path, args)


# --------------------------------------------------------------------------- one Dask cluster
@pytest.fixture(scope="module")
def dask_cluster():
    """One Dask LocalCluster of 2 worker processes (1 thread each, Tula's worker settings) for
    a test module.  Tests connect a Client of their own to it or use ``dask_client``; a test
    that kills or scales workers starts its own cluster instead.  Per module, not per session:
    an idle cluster costs 7.5 % of a core (its scheduler, nannies and workers ticking;
    measured over 60 s here), about 50 s of CPU over a 12-minute session beside the other
    tests, against 1.2 s of CPU to start and close one."""
    import logging

    import dask
    import distributed  # a hard dependency: a failure here is a failure, never a skip

    from tula.engine.launch.clusters import WORKER_CONFIG

    dask.config.set(WORKER_CONFIG)
    # a worker's lock lease times out after 8 s, not 30 s (the scheduler looking every 2 s, not
    # 10 s): a test whose caller was killed gets the workers back sooner.  The first process to
    # create a lock's name sets its timeout for every later holder (distributed's semaphore), so
    # this process, which creates them first in the suite, sets it for the service's runners too.
    dask.config.set(
        {
            "distributed.scheduler.locks.lease-validation-interval": "2s",
            "distributed.scheduler.locks.lease-timeout": "8s",
            # a worker restarted after a failed world (DaskLauncher._clean_up) that is not back
            # within this has its nanny closed by the cluster, for good: Dask's 15 s, outlasted on
            # loaded cores (kill 4 s + a new process), left the module's cluster with 0 workers
            "distributed.deploy.lost-worker-timeout": "300s",
        }
    )
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR
    )
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def dask_client(dask_cluster):
    """A Client of the module's LocalCluster (left open: tests never close it)."""
    import distributed

    client = distributed.Client(dask_cluster)
    yield client
    client.close()


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


@pytest.fixture
def tests_on_path(monkeypatch):
    """tests/ importable in this process and in every rank it starts (``factories:...``)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    monkeypatch.setenv("PYTHONPATH", helpers.env_with_tests()["PYTHONPATH"])
