"""The initial schema: jobs, their records, trials, per-epoch metrics, fitted models, artefacts.

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _ts(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _job_fk() -> sa.Column:
    return sa.Column("job_id", sa.String(32), sa.ForeignKey("tula_jobs.id", ondelete="CASCADE"), nullable=False)


def upgrade() -> None:
    op.create_table(
        "tula_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("search", sa.String(16), nullable=False),
        sa.Column("objective", sa.String(16), nullable=True),
        sa.Column("train", sa.Boolean(), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        _ts("created_at", nullable=False), _ts("started_at"), _ts("updated_at", nullable=False), _ts("finished_at"),
        _ts("heartbeat_at"),
        sa.Column("runner", sa.String(200), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("reused_models_from", sa.String(32), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_tula_jobs_state_created", "tula_jobs", ["state", "created_at"])
    op.create_index("ix_tula_jobs_created", "tula_jobs", ["created_at"])
    op.create_table(
        "tula_records",
        _job_fk(),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        _ts("updated_at", nullable=False),
        sa.PrimaryKeyConstraint("job_id", "kind"),
    )
    op.create_table(
        "tula_trials",
        _job_fk(),
        sa.Column("n_workers", sa.Integer(), nullable=False),
        sa.Column("global_batch", sa.Integer(), nullable=False),
        sa.Column("local_batch", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("t_step_s", sa.Float(), nullable=True),
        sa.Column("t_compute_s", sa.Float(), nullable=True),
        sa.Column("t_sync_s", sa.Float(), nullable=True),
        sa.Column("peak_mem_bytes", sa.BigInteger(), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "n_workers", "global_batch"),
    )
    op.create_table(
        "tula_metrics",
        _job_fk(),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("global_batch", sa.Integer(), nullable=False),
        sa.Column("n_workers", sa.Integer(), nullable=False),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("test_loss", sa.Float(), nullable=True),
        sa.Column("test_top1", sa.Float(), nullable=True),
        sa.Column("epoch_time_s", sa.Float(), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "epoch"),
    )
    op.create_table(
        "tula_models",
        sa.Column("key", sa.String(64), nullable=False),
        _job_fk(),
        sa.Column("key_parts", sa.JSON(), nullable=False),
        sa.Column("models", sa.JSON(), nullable=False),
        _ts("created_at", nullable=False),
        sa.PrimaryKeyConstraint("key", "job_id"),
    )
    op.create_index("ix_tula_models_key_created", "tula_models", ["key", "created_at"])
    op.create_table(
        "tula_artifacts",
        _job_fk(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        _ts("updated_at", nullable=False),
        sa.PrimaryKeyConstraint("job_id", "name"),
    )


def downgrade() -> None:
    for table in ("tula_artifacts", "tula_models", "tula_metrics", "tula_trials", "tula_records"):
        op.drop_table(table)
    op.drop_index("ix_tula_jobs_created", "tula_jobs")
    op.drop_index("ix_tula_jobs_state_created", "tula_jobs")
    op.drop_table("tula_jobs")
