"""The model and block tables go: nothing ever wrote them (commit b2dd5e2 removed their classes; databases made
before it kept the empty tables). This is the schema of the last release without migrations (commit e470ffc).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_table("model")
    op.drop_table("block")


def downgrade() -> None:
    op.create_table("block",
                    sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
                    sa.Column("family", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
                    sa.Column("summary", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
                    sa.Column("synced_at", sa.DateTime(timezone=True), nullable=False),
                    sa.PrimaryKeyConstraint("name"))
    op.create_table("model",
                    sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
                    sa.Column("title", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
                    sa.Column("card", sa.JSON(), nullable=True),
                    sa.Column("synced_at", sa.DateTime(timezone=True), nullable=False),
                    sa.PrimaryKeyConstraint("name"))
