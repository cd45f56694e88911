"""Alembic's environment for the store: run by workbench.store.db.migrate on the connection it passes in
``config.attributes["connection"]`` (inside the transaction that holds the schema lock), against the tables of
workbench.store.models. SQLite alters tables in batch mode (copy and rename), since its ALTER TABLE cannot drop
columns or constraints."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from workbench.store import models  # noqa: F401 - registers the tables on SQLModel.metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=SQLModel.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
