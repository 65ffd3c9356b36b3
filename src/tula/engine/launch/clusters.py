"""Which launcher runs a job's worlds: opening one from the spec's ``cluster`` section (or
``--cluster``), by the kind :data:`tula.core.registry.CLUSTERS` gives its ``where``.

============================  ===============================================================
``cluster.where``             launcher
============================  ===============================================================
``local``                     :class:`~tula.engine.launch.local.LocalLauncher`: processes on this machine
``dask``                      :class:`~tula.engine.launch.dask.DaskLauncher` on a LocalCluster started here
``tcp://HOST:PORT``           :class:`~tula.engine.launch.dask.DaskLauncher` on an existing scheduler
``path/to/jobqueue.yaml``     :class:`~tula.engine.launch.dask.DaskLauncher` on a dask-jobqueue cluster
``env``                       :class:`~tula.engine.launch.env.EnvLauncher`: the ranks of a world
                              started by torchrun, srun or mpirun, each running the same command
============================  ===============================================================
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tula.core.errors import SpecError, TulaError
from tula.core.registry import cluster_kind
from tula.core.spec import JobSpec, largest_world, parse_bytes
from tula.engine.launch.base import Launcher, pick_device
from tula.engine.launch.main_module import without_main_module

#: Dask settings for workers that run ranks: not daemonic (a rank may start DataLoader
#: processes), no retries of a rank, and none of the workers' sampling of the task's stack
#: (every 10 ms under the GIL: measured 5-14 % slower training steps on 2 cores)
WORKER_CONFIG = {
    "distributed.worker.daemon": False,
    "distributed.scheduler.allowed-failures": 0,
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.gil.enabled": False,
    # a LocalCluster's worker restarted after a failed world gets this long to come back before its
    # nanny is closed for good (Dask's 15 s default: on 2 loaded cores a restart took just over it,
    # and the cluster had no workers left, 2026-11-29)
    "distributed.deploy.lost-worker-timeout": "300s",
}


def worker_config_env() -> list[str]:
    """:data:`WORKER_CONFIG` as the environment variables a job script exports."""
    return [
        f"export DASK_{k.upper().replace('.', '__').replace('-', '_')}={v}"
        for k, v in WORKER_CONFIG.items()
        if k.startswith("distributed.worker") or k.startswith("distributed.admin")
    ]


def env_settings(spec: JobSpec) -> dict[str, Any]:
    """How every rank of a launched world (``--cluster env``) joins it: the same on each."""
    c = spec.cluster
    return dict(
        device=spec.profile.device,
        threads_per_worker=spec.profile.threads_per_worker,
        pg_timeout_s=c.pg_timeout_s,
        backend=c.backend,
        interface=c.interface,
    )


def serve_if_env_worker(spec: JobSpec) -> None:
    """Under ``cluster.where: env``, join the launched world; a rank other than 0 then serves
    rank 0's worlds and exits with its exit code (it never returns).  Rank 0 returns and
    runs the command (:mod:`tula.engine.launch.env`)."""
    if spec.cluster.where != "env":
        return
    from tula.engine.launch.env import join, serve_and_exit

    launcher = join(**env_settings(spec))
    if launcher.world.rank != 0:
        serve_and_exit(launcher)


class JobqueueConfig(BaseModel):
    """A dask-jobqueue cluster: each job is one node running ``processes`` Dask workers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheduler: str = Field(pattern="^(slurm|pbs)$", description="the batch system: slurm or pbs")
    cores: int = Field(ge=1, description="cores per job")
    memory: str = Field(description="memory per job, e.g. '32GiB'")
    walltime: str = Field(default="01:00:00", description="HH:MM:SS")
    queue: str | None = None
    account: str | None = None
    processes: int = Field(default=1, ge=1, description="Dask workers (ranks) per job")
    job_extra_directives: list[str] = Field(default_factory=list, description="extra #SBATCH / #PBS lines")
    job_script_prologue: list[str] = Field(
        default_factory=list,
        description="shell lines run before the worker starts, e.g. activating the environment Tula is installed in",
    )
    interface: str | None = Field(default=None, description="network interface of the workers, e.g. ib0")
    local_directory: str | None = None
    python: str | None = Field(default=None, description="the Python (with Tula installed) on the nodes")


def load_jobqueue_config(path: str | Path) -> JobqueueConfig:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"dask-jobqueue config {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
        cfg = JobqueueConfig.model_validate(data if isinstance(data, dict) else {})
        parse_bytes(cfg.memory)
    except yaml.YAMLError as err:
        raise SpecError(f"dask-jobqueue config {str(p)!r} is not valid YAML ({str(err).splitlines()[0]})") from None
    except ValidationError as err:
        e = err.errors()[0]
        raise SpecError(
            f"dask-jobqueue config {str(p)!r}: field '{'.'.join(map(str, e['loc']))}' "
            f"{e['msg'].removeprefix('Value error, ').lower()}"
        ) from None
    except ValueError as err:
        raise SpecError(f"dask-jobqueue config {str(p)!r}: memory {err}") from None
    return cfg


def jobqueue_cluster(cfg: JobqueueConfig) -> Any:
    """A ``SLURMCluster`` / ``PBSCluster`` for ``cfg`` (no job is submitted until it is scaled)."""
    import dask_jobqueue

    cls = dask_jobqueue.SLURMCluster if cfg.scheduler == "slurm" else dask_jobqueue.PBSCluster
    kwargs: dict[str, Any] = dict(
        cores=cfg.cores,
        memory=cfg.memory,
        walltime=cfg.walltime,
        processes=cfg.processes,
        job_extra_directives=list(cfg.job_extra_directives),
        # ranks may start DataLoader processes: workers must not be daemonic
        job_script_prologue=[*cfg.job_script_prologue, *worker_config_env()],
        queue=cfg.queue,
        account=cfg.account,
        interface=cfg.interface,
        local_directory=cfg.local_directory,
        scheduler_options={"dashboard_address": ":0"},
    )
    if cfg.python:
        kwargs["python"] = cfg.python
    return cls(**{k: v for k, v in kwargs.items() if v is not None})


@contextlib.contextmanager
def open_launcher(
    spec: JobSpec, where: str | None = None, n_workers: int | None = None, in_process: bool = False
) -> Iterator[Launcher]:
    """The launcher for ``spec`` (``where`` overrides ``spec.cluster.where``), started for
    the block and shut down after it (a LocalCluster or jobqueue cluster started here is
    closed; an existing scheduler is left as it was).  ``in_process``: on the local
    launcher, a world of one rank runs in this process (``LocalLauncher(in_process=True)``)."""
    c = spec.cluster
    where = where or c.where
    kind = cluster_kind(where)  # tula.core.registry.CLUSTERS: one not there is refused, not taken for Dask
    device = pick_device(spec.profile.device)
    if kind.launcher == "local":
        from tula.engine.launch.local import LocalLauncher

        yield LocalLauncher(
            device=device, threads_per_worker=default_threads(spec), pg_timeout_s=None, in_process=in_process
        )
        return
    if kind.launcher == "env":  # joined once per process; left when the command ends (env.finish)
        from tula.engine.launch.env import join

        launcher = join(**env_settings(spec))
        if launcher.world.rank != 0:
            raise TulaError("under --cluster env only rank 0 runs the command; the other ranks serve it")
        yield launcher
        return
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError as err:  # pragma: no cover - distributed is a dependency
        raise TulaError(f"cluster {where!r} needs the 'distributed' package ({err})") from None

    dask.config.set(WORKER_CONFIG)
    plain_library_logs("distributed")
    n = n_workers or c.dask_workers or largest_world(spec)
    with contextlib.ExitStack() as stack:
        if kind.name == "dask":
            # its workers start (and restart) while it is open: none runs a script's main module again
            stack.enter_context(without_main_module())
            cluster = stack.enter_context(
                LocalCluster(
                    n_workers=n,
                    threads_per_worker=c.dask_threads_per_worker,
                    processes=True,
                    dashboard_address=None,
                    silence_logs=logging.ERROR,
                )
            )
            client = stack.enter_context(Client(cluster))
        elif kind.name == "scheduler":
            client = stack.enter_context(_connect(where, c.connect_timeout_s))
        else:  # jobqueue
            cfg = load_jobqueue_config(where)
            cluster = stack.enter_context(jobqueue_cluster(cfg))
            cluster.scale(jobs=-(-n // cfg.processes))
            client = stack.enter_context(Client(cluster))
        yield launcher_for_client(client, spec, n)


class _OneLine(logging.Filter):
    """A library's log record as one line of plain text: no traceback, and none at all when
    its message is empty (distributed logs an empty ERROR with the traceback of a reconnect
    cancelled while the client closes after its scheduler was lost)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return bool(record.getMessage().strip())


def plain_library_logs(name: str) -> None:
    """Every handler of the logger ``name`` (and of its children, which propagate to it)
    writes one plain line per record: the user sees the library's words, never its traceback."""
    for handler in logging.getLogger(name).handlers:
        if not any(isinstance(f, _OneLine) for f in handler.filters):
            handler.addFilter(_OneLine())


def launcher_for_client(client: Any, spec: JobSpec, n_workers: int | None = None, threads: int | None = None) -> Any:
    """A :class:`~tula.engine.launch.dask.DaskLauncher` on the open ``distributed.Client``
    ``client`` with the spec's cluster settings; the client stays the caller's to close.
    ``threads`` per rank (default: ``profile.threads_per_worker``, else the workers' cores
    shared by the ranks of a world of ``n_workers`` on each host, as ``--cluster tcp://``)."""
    from tula.engine.launch.dask import DaskLauncher

    c = spec.cluster

    def launcher(threads_per_worker: int | None) -> DaskLauncher:
        return DaskLauncher(
            client,
            device=spec.profile.device,
            threads_per_worker=threads_per_worker,
            pg_timeout_s=c.pg_timeout_s,
            worker_wait_s=c.worker_wait_s,
            backend=c.backend,
            interface=c.interface,
            silent_after_s=c.heartbeat_timeout_s,
        )

    threads = threads or spec.profile.threads_per_worker
    if threads is None:
        threads = launcher(None).default_threads(n_workers or largest_world(spec))
    return launcher(threads)


def _connect(address: str, timeout_s: float) -> Any:
    """A ``distributed.Client`` of the scheduler at ``address``, or one sentence when none
    answers within ``timeout_s`` (``cluster.connect_timeout_s``)."""
    from distributed import Client

    try:
        return Client(address, timeout=timeout_s)
    except (OSError, TimeoutError) as err:
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise TulaError(
            f"no Dask scheduler answers at {address} within {timeout_s:.0f} s (cluster.connect_timeout_s): {why}"
        ) from None


def default_threads(spec: JobSpec) -> int:
    """Same torch thread count in every rank of every world, so per-worker compute does not
    depend on N (as on a real cluster, where each node has its own cores)."""
    return spec.profile.threads_per_worker or max(1, (os.cpu_count() or 1) // max(spec.search.cluster_sizes))
