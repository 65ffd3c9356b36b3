"""The store's model cache: fitted models records kept under their model key
(:func:`tula.service.model_key.model_key`), so a later job with the same key reuses them
instead of profiling and fitting again.
"""

from __future__ import annotations

import sqlalchemy as sa

from tula.core.errors import RecordError
from tula.core.records import MODELS_KIND, ModelsRecord, parse_record, validate_record
from tula.service.model_key import model_key
from tula.service.store.database import Database, StoreError, now_utc
from tula.service.store.schema import jobs, models_t, plain_json


class ModelCache(Database):
    """Models records by model key: put one, find the newest."""

    def put_models(self, job_id: str, key: str, key_parts: dict, models: dict | ModelsRecord) -> None:
        """Store the models record ``job_id`` fitted under ``key`` (= ``model_key(key_parts)``)."""
        if model_key(key_parts) != key:
            raise ValueError("key is not model_key(key_parts)")
        body = plain_json(models)
        validate_record(body, f"the models record given for job {job_id!r}", (MODELS_KIND,))
        with self._write() as conn:
            self._need_job(conn, job_id)
            self._upsert(
                conn,
                models_t,
                {"key": key, "job_id": job_id},
                {"key_parts": plain_json(key_parts), "models": body, "created_at": now_utc()},
            )

    def find_models(self, key: str, submitted_before: str | None = None) -> tuple[ModelsRecord, str] | None:
        """The newest models record stored under ``key`` (read as the typed record) and the job
        that fitted it, or None.
        ``submitted_before``: a job's id; then only the models of jobs submitted before it
        (the queue's order: created, then id) count, so that whether a job profiles does not
        depend on how far the runners of jobs submitted after it got first."""
        query = sa.select(models_t.c.models, models_t.c.job_id).where(models_t.c.key == key)
        if submitted_before is not None:
            mine = jobs.alias("mine")
            at = sa.select(mine.c.created_at).where(mine.c.id == submitted_before).scalar_subquery()
            query = query.join(jobs, jobs.c.id == models_t.c.job_id).where(
                sa.or_(jobs.c.created_at < at, sa.and_(jobs.c.created_at == at, jobs.c.id < submitted_before))
            )
        with self._read() as conn:
            row = conn.execute(query.order_by(models_t.c.created_at.desc(), models_t.c.job_id).limit(1)).first()
        if row is None:
            return None
        try:
            models = parse_record(row.models, ModelsRecord, f"the models record of job {row.job_id!r} stored for reuse")
        except RecordError as err:
            raise StoreError(str(err)) from None
        return models, row.job_id
