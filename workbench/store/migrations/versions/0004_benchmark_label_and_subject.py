"""Benchmark figures say whether they were measured or modelled (label) and what was timed (subject: the operator,
eager, compile or a peer) (commit c3adeae). Existing rows were measured figures of the operator.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("benchmark") as batch:
        batch.add_column(sa.Column("label", sqlmodel.sql.sqltypes.AutoString(), nullable=False,
                                   server_default="measured"))
        batch.add_column(sa.Column("subject", sqlmodel.sql.sqltypes.AutoString(), nullable=False,
                                   server_default="operator"))


def downgrade() -> None:
    with op.batch_alter_table("benchmark") as batch:
        batch.drop_column("subject")
        batch.drop_column("label")
