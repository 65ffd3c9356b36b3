"""The service's settings: where it listens, where it keeps its store and files, and its limits.

Every setting has a default, can be given as an environment variable ``TULA_<NAME>`` (lists
comma-separated) and is overridden by ``tula serve``'s options.  No torch here.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tula.core.errors import TulaError
from tula.core.registry import cluster_kind
from tula.core.validation import first_error, lowered


class SettingsError(TulaError):
    """A setting the service cannot start with (one sentence)."""


def default_home() -> Path:
    return Path(os.environ.get("TULA_HOME") or Path.home() / ".tula")


def host_memory_bytes() -> int:
    """This host's physical memory (bytes)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX host: a conservative 8 GiB
        return 8 << 30


class ServiceSettings(BaseModel):
    """What ``tula serve`` runs with (see ``tula serve --help``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="address to bind; beyond loopback a token is required")
    port: int = Field(default=8787, ge=0, le=65535, description="port to bind (0: a free one)")
    token: str | None = Field(default=None, description="the bearer token every request must carry")
    home: Path = Field(
        default_factory=default_home,
        description="the service's data directory (job records, "
        "checkpoints, plots; and the SQLite store unless db_url says otherwise)",
    )
    db_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the store (default: an SQLite file tula.db in home)"
    )
    max_concurrent_jobs: int = Field(default=1, ge=1, description="jobs running at once; the rest wait queued")
    max_request_bytes: int = Field(default=1 << 20, ge=1024, description="largest request body")
    max_configs: int = Field(
        default=256, ge=1, description="most (cluster size, batch) configurations in a job's search space"
    )
    max_epochs: int = Field(default=500, ge=1, description="most training epochs of a job")
    max_data_bytes: int = Field(
        default_factory=lambda: host_memory_bytes() // 4,
        ge=1,
        description="largest data set a job may hold in memory, as its spec says (synthetic, mnist1d, digits: "
        "samples x sample shape x bytes per element); default a quarter of this host's memory",
    )
    max_job_memory_bytes: int = Field(
        default_factory=lambda: host_memory_bytes() // 2,
        ge=0,
        description="most of this host's memory one job's processes (its runner, and the ranks, loaders and Dask "
        "workers it starts on this host) may hold together, as private resident memory; a job above it is stopped "
        "and fails with that sentence while the service goes on; 0: no limit; default half this host's memory",
    )
    import_allowlist: tuple[str, ...] = Field(
        default=(),
        description="top-level modules (or full module names) a spec's "
        "'package.module:attribute' model, data.factory, train.loss and optimizer.name may be imported "
        "from (importing runs code: empty by default)",
    )
    data_roots: tuple[Path, ...] = Field(
        default=(), description="directories a spec's data.root may be under (none by default: only built-in data sets)"
    )
    heartbeat_s: float = Field(default=2.0, gt=0, description="how often a running job writes its heartbeat")
    stale_after_s: float = Field(
        default=30.0,
        gt=0,
        description="a running job whose heartbeat is older is taken to be dead and queued again to resume",
    )
    poll_s: float = Field(default=0.5, gt=0, description="how often the dispatcher looks for queued jobs")
    run_jobs: bool = Field(
        default=True,
        description="start runners for queued jobs; false: this service only "
        "answers the API and queues jobs for another service sharing its store",
    )

    cluster: str = Field(
        default="local",
        description="where the service runs its jobs' ranks: local (processes on this host), dask (a Dask "
        "LocalCluster per job), tcp://HOST:PORT (the operator's Dask scheduler) or a dask-jobqueue YAML file "
        "(SLURM/PBS); a submission cannot name one",
    )

    @field_validator("home", mode="after")
    @classmethod
    def _absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v: str) -> str:
        try:
            kind = cluster_kind(v)  # tula.core.registry.CLUSTERS
        except TulaError as err:
            raise ValueError(str(err)) from None
        if kind.fixed_world:
            raise ValueError(f"{v!r} is a world that one command joins, not a cluster a service places jobs on")
        return v

    @property
    def store_url(self) -> str:
        return self.db_url or f"sqlite:///{self.home / 'tula.db'}"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def check_can_start(self) -> None:
        """Bound beyond loopback, the service needs a token."""
        if not self.loopback and not self.token:
            raise SettingsError(
                f"refusing to listen on {self.host}, which is not a loopback address, without a "
                "token: set --token or TULA_TOKEN (every request must then carry "
                "'Authorization: Bearer <token>')"
            )


_LISTS = ("import_allowlist", "data_roots")


def settings_from(env: Mapping[str, str] | None = None, **overrides: Any) -> ServiceSettings:
    """Settings from ``TULA_*`` environment variables, then ``overrides`` (``None`` values
    are ignored); a bad value is one sentence naming the setting."""
    source: Mapping[str, str] = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name in ServiceSettings.model_fields:
        raw = source.get(f"TULA_{name.upper()}")
        if raw is not None and raw != "":
            values[name] = [s.strip() for s in raw.split(",") if s.strip()] if name in _LISTS else raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ServiceSettings(**values)
    except ValidationError as err:
        e = first_error(err)
        field = e.where() or "settings"
        raise SettingsError(  # a validator's sentence without pydantic's "Value error, " before it
            f"service setting {field!r} (TULA_{field.split('.')[0].upper()}): {lowered(e.message)}"
        ) from None
