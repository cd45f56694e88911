"""Shared fixtures: every test gets its own database file, operators folder and scratch folder."""

from __future__ import annotations

import pytest

from workbench.config import Settings


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    """Settings on a fresh SQLite file, operators, scratch and replays folders under tmp_path; also exported through
    the environment for the CLI."""
    db_url = f"sqlite:///{tmp_path / 'workbench.db'}"
    monkeypatch.setenv("WORKBENCH_DB", db_url)
    monkeypatch.setenv("WORKBENCH_OPERATORS", str(tmp_path / "operators"))
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WORKBENCH_REPLAYS", str(tmp_path / "replays"))
    monkeypatch.setenv("WORKBENCH_REPLAY_STEPS", "0")  # no replay gate unless a test asks for one (tests/replay)
    return Settings.load()
