"""Verification checks carry their verdict: what a failed check stands for (fail for the numerics, the error of a
trial that raised, a target's compile error, an integrity verdict), typed where the check is made instead of read
back out of its direction or its reason; rows from before keep null.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("verification_check") as batch:
        batch.add_column(sa.Column("verdict", sqlmodel.sql.sqltypes.AutoString(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verification_check") as batch:
        batch.drop_column("verdict")
