"""Jobs' artefacts in the store: files (checkpoints, PNGs) under the store's data directory,
rows holding their paths relative to it.
"""

from __future__ import annotations

import re
from pathlib import Path

import sqlalchemy as sa

from tula.service.store.database import Database, StoreError, now_utc
from tula.service.store.schema import artifacts_t


class Artifacts(Database):
    """A job's directory and its named artefact files."""

    def job_dir(self, job_id: str) -> Path:
        """The directory under the data directory where ``job_id``'s files go (created)."""
        if not re.fullmatch(r"[A-Za-z0-9_-]+", job_id):
            raise ValueError(f"{job_id!r} is not a job id")
        d = self.data_dir / "jobs" / job_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    def add_artifact(self, job_id: str, name: str, path: str | Path) -> None:
        """Record that ``job_id``'s artefact ``name`` (e.g. ``plan.png``) is the file ``path``,
        which must lie under the data directory (absolute, or relative to it)."""
        if not name or len(name) > 200:
            raise ValueError("an artefact's name must have 1 to 200 characters")
        p = Path(path)
        p = (p if p.is_absolute() else self.data_dir / p).resolve()
        try:
            rel = p.relative_to(self.data_dir)
        except ValueError:
            raise StoreError(
                f"artefact {name!r} of job {job_id!r} is {str(p)!r}, outside the store's data directory "
                f"{str(self.data_dir)!r}"
            ) from None
        if not p.is_file():
            raise StoreError(f"artefact {name!r} of job {job_id!r} is {str(p)!r}, which is not a file")
        with self._write() as conn:
            self._need_job(conn, job_id)
            self._upsert(
                conn, artifacts_t, {"job_id": job_id, "name": name}, {"path": rel.as_posix(), "updated_at": now_utc()}
            )

    def artifact_path(self, job_id: str, name: str) -> Path | None:
        """The file of ``job_id``'s artefact ``name``; None when there is none (or it is gone)."""
        with self._read() as conn:
            rel = conn.execute(
                sa.select(artifacts_t.c.path).where(artifacts_t.c.job_id == job_id, artifacts_t.c.name == name)
            ).scalar_one_or_none()
        if rel is None:
            return None
        p = self.data_dir / rel
        return p if p.is_file() else None

    def artifacts(self, job_id: str) -> dict[str, Path]:
        """Every artefact of ``job_id`` whose file is there: name -> path."""
        with self._read() as conn:
            rows = conn.execute(
                sa.select(artifacts_t.c.name, artifacts_t.c.path)
                .where(artifacts_t.c.job_id == job_id)
                .order_by(artifacts_t.c.name)
            ).all()
        return {r.name: self.data_dir / r.path for r in rows if (self.data_dir / r.path).is_file()}
