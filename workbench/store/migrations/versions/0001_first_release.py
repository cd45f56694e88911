"""The tables of the first release (commit 2f599b0), including the model and block tables it never wrote.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STRING = sqlmodel.sql.sqltypes.AutoString
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table("block",
                    sa.Column("name", STRING(), nullable=False),
                    sa.Column("family", STRING(), nullable=False),
                    sa.Column("summary", STRING(), nullable=False),
                    sa.Column("synced_at", WHEN, nullable=False),
                    sa.PrimaryKeyConstraint("name"))
    op.create_table("model",
                    sa.Column("name", STRING(), nullable=False),
                    sa.Column("title", STRING(), nullable=False),
                    sa.Column("card", sa.JSON(), nullable=True),
                    sa.Column("synced_at", WHEN, nullable=False),
                    sa.PrimaryKeyConstraint("name"))
    op.create_table("ci_job",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("commit", STRING(), nullable=False),
                    sa.Column("status", STRING(), nullable=False),
                    sa.Column("summary", sa.JSON(), nullable=True),
                    sa.Column("junit_path", STRING(), nullable=True),
                    sa.Column("started_at", WHEN, nullable=False),
                    sa.Column("finished_at", WHEN, nullable=True),
                    sa.PrimaryKeyConstraint("id"))
    op.create_table("loss_replay",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("model", STRING(), nullable=False),
                    sa.Column("mode", STRING(), nullable=False),
                    sa.Column("preset", STRING(), nullable=False),
                    sa.Column("seed", sa.Integer(), nullable=False),
                    sa.Column("ops", sa.JSON(), nullable=True),
                    sa.Column("curve", sa.JSON(), nullable=True),
                    sa.Column("reference_curve", sa.JSON(), nullable=True),
                    sa.Column("status", STRING(), nullable=False),
                    sa.Column("reason", STRING(), nullable=False),
                    sa.Column("created_at", WHEN, nullable=False),
                    sa.PrimaryKeyConstraint("id"))
    op.create_table("port_run",
                    sa.Column("id", STRING(), nullable=False),
                    sa.Column("block", STRING(), nullable=False),
                    sa.Column("model", STRING(), nullable=True),
                    sa.Column("proposer", STRING(), nullable=False),
                    sa.Column("backend", STRING(), nullable=False),
                    sa.Column("budget", sa.Integer(), nullable=False),
                    sa.Column("status", STRING(), nullable=False),
                    sa.Column("reason", STRING(), nullable=False),
                    sa.Column("config", sa.JSON(), nullable=True),
                    sa.Column("operator_path", STRING(), nullable=True),
                    sa.Column("best_candidate_id", sa.Integer(), nullable=True),
                    sa.Column("host", STRING(), nullable=False),
                    sa.Column("pid", sa.Integer(), nullable=True),
                    sa.Column("started_at", WHEN, nullable=False),
                    sa.Column("finished_at", WHEN, nullable=True),
                    sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_port_run_block", "port_run", ["block"])
    op.create_index("ix_port_run_status", "port_run", ["status"])
    op.create_table("candidate",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("run_id", STRING(), nullable=True),
                    sa.Column("block", STRING(), nullable=False),
                    sa.Column("iteration", sa.Integer(), nullable=False),
                    sa.Column("template", STRING(), nullable=True),
                    sa.Column("params", sa.JSON(), nullable=True),
                    sa.Column("source", sa.Text(), nullable=True),
                    sa.Column("source_hash", STRING(), nullable=False),
                    sa.Column("path", STRING(), nullable=False),
                    sa.Column("status", STRING(), nullable=False),
                    sa.Column("message", STRING(), nullable=False),
                    sa.Column("worst_ratio", sa.Float(), nullable=True),
                    sa.Column("verify_seconds", sa.Float(), nullable=True),
                    sa.Column("created_at", WHEN, nullable=False),
                    sa.ForeignKeyConstraint(["run_id"], ["port_run.id"]),
                    sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_candidate_block", "candidate", ["block"])
    op.create_index("ix_candidate_run_id", "candidate", ["run_id"])
    op.create_index("ix_candidate_source_hash", "candidate", ["source_hash"])
    op.create_table("run_step",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("run_id", STRING(), nullable=False),
                    sa.Column("seq", sa.Integer(), nullable=False),
                    sa.Column("node", STRING(), nullable=False),
                    sa.Column("message", STRING(), nullable=False),
                    sa.Column("data", sa.JSON(), nullable=True),
                    sa.Column("at", WHEN, nullable=False),
                    sa.ForeignKeyConstraint(["run_id"], ["port_run.id"]),
                    sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_run_step_run_id", "run_step", ["run_id"])
    op.create_table("benchmark",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("block", STRING(), nullable=False),
                    sa.Column("candidate_id", sa.Integer(), nullable=True),
                    sa.Column("backend", STRING(), nullable=False),
                    sa.Column("shape", STRING(), nullable=False),
                    sa.Column("dtype", STRING(), nullable=False),
                    sa.Column("metric", STRING(), nullable=False),
                    sa.Column("value", sa.Float(), nullable=False),
                    sa.Column("unit", STRING(), nullable=False),
                    sa.Column("created_at", WHEN, nullable=False),
                    sa.ForeignKeyConstraint(["candidate_id"], ["candidate.id"]),
                    sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_benchmark_block", "benchmark", ["block"])
    op.create_table("verification_check",
                    sa.Column("id", sa.Integer(), nullable=False),
                    sa.Column("candidate_id", sa.Integer(), nullable=False),
                    sa.Column("backend", STRING(), nullable=False),
                    sa.Column("suite", STRING(), nullable=False),
                    sa.Column("shape", STRING(), nullable=False),
                    sa.Column("dtype", STRING(), nullable=False),
                    sa.Column("seed", sa.Integer(), nullable=False),
                    sa.Column("direction", STRING(), nullable=False),
                    sa.Column("passed", sa.Boolean(), nullable=False),
                    sa.Column("reason", STRING(), nullable=False),
                    sa.Column("max_abs", sa.Float(), nullable=True),
                    sa.Column("max_rel", sa.Float(), nullable=True),
                    sa.Column("err_ratio", sa.Float(), nullable=True),
                    sa.Column("ref_err", sa.Float(), nullable=True),
                    sa.Column("bound", sa.Float(), nullable=True),
                    sa.Column("nonfinite", sa.Integer(), nullable=False),
                    sa.ForeignKeyConstraint(["candidate_id"], ["candidate.id"]),
                    sa.PrimaryKeyConstraint("id"))
    op.create_index("ix_verification_check_candidate_id", "verification_check", ["candidate_id"])


def downgrade() -> None:
    for table in ("verification_check", "benchmark", "run_step", "candidate", "port_run", "loss_replay", "ci_job",
                  "model", "block"):
        op.drop_table(table)
