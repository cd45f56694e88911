"""The replay tests' shared store: one per test module, for the modules whose distributed replays reuse the layout
reference an earlier test in the module recorded."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workbench.config import Settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Settings:
    """One store for the module, the shipped single-process references (replays/) in its replays folder."""
    root = tmp_path_factory.mktemp("shared")
    shutil.copytree(REPO / "replays", root / "replays")
    return Settings(db_url=f"sqlite:///{root / 'workbench.db'}", operators_dir=root / "operators",
                    work_dir=root / "home", replays_dir=root / "replays")
