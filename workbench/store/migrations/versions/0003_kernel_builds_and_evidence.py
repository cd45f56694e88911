"""What the GPU targets' compilers said about each kernel of a candidate (kernel_build) and the candidate's evidence
(commit 81c074f).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

STRING = sqlmodel.sql.sqltypes.AutoString


def upgrade() -> None:
    op.create_table("kernel_build",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("candidate_id", sa.Integer(), nullable=False),
                    sa.Column("kernel", STRING(), nullable=False),
                    sa.Column("target", STRING(), nullable=False),
                    sa.Column("suite", STRING(), nullable=False),
                    sa.Column("specialization", sa.JSON(), nullable=True),
                    sa.Column("ok", sa.Boolean(), nullable=False),
                    sa.Column("error", STRING(), nullable=False),
                    sa.Column("registers", sa.Integer(), nullable=True),
                    sa.Column("spilled_bytes", sa.Integer(), nullable=True),
                    sa.Column("shared_bytes", sa.Integer(), nullable=True),
                    sa.Column("num_warps", sa.Integer(), nullable=True),
                    sa.Column("num_stages", sa.Integer(), nullable=True),
                    sa.Column("ctas_per_sm", sa.Integer(), nullable=True),
                    sa.Column("uses_dot", sa.Boolean(), nullable=True),
                    sa.Column("tensor_cores", sa.Boolean(), nullable=True),
                    sa.Column("seconds", sa.Float(), nullable=False),
                    sa.ForeignKeyConstraint(["candidate_id"], ["candidate.id"]),
                    sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_kernel_build_candidate_id", "kernel_build", ["candidate_id"])
    op.create_index("ix_kernel_build_target", "kernel_build", ["target"])
    with op.batch_alter_table("candidate") as batch:
        batch.add_column(sa.Column("evidence", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_table("kernel_build")
    with op.batch_alter_table("candidate") as batch:
        batch.drop_column("evidence")
