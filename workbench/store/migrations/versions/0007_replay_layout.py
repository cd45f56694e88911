"""Loss replays gain their parallel layout (ranks, sharding of the dense parameters, placement of the routed
experts, the blocks cached in the host tier, the operators one rank runs instead); rows from before ran in one
process and keep null.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("loss_replay") as batch:
        batch.add_column(sa.Column("layout", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("loss_replay") as batch:
        batch.drop_column("layout")
