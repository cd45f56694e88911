"""Loss replays gain their kind (operators or a recorded reference), step count, backend, the first step outside
the band, their detail and finish time (commit 772df71). Existing rows are replays with operators.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("loss_replay") as batch:
        batch.add_column(sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(), nullable=False,
                                   server_default="operators"))
        batch.add_column(sa.Column("steps", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("backend", sqlmodel.sql.sqltypes.AutoString(), nullable=False, server_default=""))
        batch.add_column(sa.Column("left_band_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("detail", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("loss_replay") as batch:
        for column in ("finished_at", "detail", "left_band_step", "backend", "steps", "kind"):
            batch.drop_column(column)
