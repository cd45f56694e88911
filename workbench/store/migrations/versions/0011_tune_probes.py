"""A port's tuning: each target's points of its compile-only probes (tune_probe), and the launch settings per
target a candidate was rendered with (candidate.launch).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("candidate") as batch:
        batch.add_column(sa.Column("launch", sa.JSON(), nullable=True))
    op.create_table(
        "tune_probe",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("block", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("probe", sa.Integer(), nullable=False),
        sa.Column("target", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("template", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("settings", sa.JSON(), nullable=True),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("registers", sa.Integer(), nullable=False),
        sa.Column("spilled_bytes", sa.Integer(), nullable=False),
        sa.Column("time_ms", sa.Float(), nullable=True),
        sa.Column("label", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("moved", sa.Boolean(), nullable=False),
        sa.Column("why", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["port_run.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_tune_probe_run_id", "tune_probe", ["run_id"])
    op.create_index("ix_tune_probe_block", "tune_probe", ["block"])


def downgrade() -> None:
    op.drop_index("ix_tune_probe_block", "tune_probe")
    op.drop_index("ix_tune_probe_run_id", "tune_probe")
    op.drop_table("tune_probe")
    with op.batch_alter_table("candidate") as batch:
        batch.drop_column("launch")
