"""The candidate's column of what its verification showed, and where (the targets it compiled on and was spill-free
on, the static findings, the backward, the isolation), is named for what it holds: target_report (it was
"evidence", a word four different records used).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


# RENAME COLUMN in place, on SQLite (3.25 on) as on PostgreSQL: a batch rebuild of candidate would drop the table that
# verification_check and kernel_build reference.


def upgrade() -> None:
    op.execute("ALTER TABLE candidate RENAME COLUMN evidence TO target_report")


def downgrade() -> None:
    op.execute("ALTER TABLE candidate RENAME COLUMN target_report TO evidence")
