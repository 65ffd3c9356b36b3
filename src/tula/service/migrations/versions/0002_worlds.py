"""A running job's world on the operator's cluster: the workers it asks for or holds now.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tula_jobs", sa.Column("world_workers", sa.Integer(), nullable=True))
    op.add_column("tula_jobs", sa.Column("world_granted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tula_jobs") as batch:
        batch.drop_column("world_granted_at")
        batch.drop_column("world_workers")
