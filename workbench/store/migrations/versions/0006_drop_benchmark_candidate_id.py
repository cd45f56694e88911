"""benchmark.candidate_id goes: nothing ever set it (workbench bench records figures of promoted operators and
references, by block), so every row holds null.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("benchmark") as batch:
        batch.drop_column("candidate_id")


def downgrade() -> None:
    with op.batch_alter_table("benchmark") as batch:
        batch.add_column(sa.Column("candidate_id", sa.Integer(), nullable=True))
        batch.create_foreign_key("benchmark_candidate_id_fkey", "candidate", ["candidate_id"], ["id"])
