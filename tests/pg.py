"""A throwaway PostgreSQL server for the tests: initdb in a temporary directory, listening
only on a unix socket there (named by a free port number), trusted local connections, no
fsync; stopped and deleted at the end.

PostgreSQL refuses to run as root: when the tests run as root, the server runs as the
``postgres`` OS user (Debian's package creates it) and the directory is handed to it.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from helpers import free_port

#: the environment variable that turns "PostgreSQL is not installed" from a skip into a failure (CI sets it)
REQUIRE_ENV = "TULA_REQUIRE_POSTGRES"


def find_pg_bin() -> Path | None:
    """The directory holding PostgreSQL's ``initdb`` and ``pg_ctl``: on PATH, else Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest version first); None when there is none."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    found = []
    for d in glob.glob("/usr/lib/postgresql/*/bin"):
        m = re.search(r"/postgresql/(\d+)(?:\.(\d+))?/bin$", d)
        if m and (Path(d) / "initdb").is_file() and (Path(d) / "pg_ctl").is_file():
            found.append(((int(m.group(1)), int(m.group(2) or 0)), Path(d)))
    return max(found)[1] if found else None


class PostgresServer:
    """Start with :meth:`start`, make a fresh database with :meth:`new_database`, end with :meth:`stop`."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = Path(bin_dir)
        self.root = Path(tempfile.mkdtemp(prefix="tula-pg-"))  # under /tmp: the postgres user can reach it
        self.data = self.root / "data"
        self.port = free_port()
        self.as_user: str | None = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "the tests run as root, and PostgreSQL refuses root, but there is no 'postgres' "
                    "OS user to run it as"
                ) from None
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self.as_user = "postgres"
        self.user = "postgres"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        cmd = [str(a) for a in args]
        if self.as_user:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if r.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-800:]}")
        return r

    def start(self) -> PostgresServer:
        self._run(self.bin_dir / "initdb", "-D", self.data, "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        opts = (
            f"-k {self.root} -p {self.port} -c listen_addresses='' -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=50"
        )
        self._run(
            self.bin_dir / "pg_ctl", "-D", self.data, "-l", self.root / "log", "-o", opts, "-w", "-t", "60", "start"
        )
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@/{database}?host={self.root}&port={self.port}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            host=str(self.root), port=self.port, user=self.user, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log(self) -> str:
        try:
            return (self.root / "log").read_text()[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run(self.bin_dir / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.root, ignore_errors=True)
