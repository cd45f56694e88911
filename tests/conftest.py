"""Shared fixtures: every test gets its own database file, operators folder and scratch folder.

Candidates verified in the suite are not compiled for GPU targets unless a test names its targets
($WORKBENCH_TARGETS is empty): the ahead-of-time compile is tested where it is the subject (tests/verify/
test_targets.py, test_thirdparty.py, test_forward_only.py, the port test in tests/agent/test_port.py that names
sm_90a), every other test verifies the same numerics and integrity in a fraction of the time, and `workbench ci` in
.ci/run compiles every promoted operator for all five default targets. Compile results are cached per test process
(keyed by source, specialization and target, so sharing changes no verdict).

Commands verify in the test's own process ($WORKBENCH_WORKERS=1): the fan-out on Ray is tested in tests/scaleout,
on one local Ray instance for the whole test session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

from workbench.config import Settings

HEAVY_FILES = ("tests/integrations/test_vllm_parity.py", "tests/integrations/test_parity.py",
               "tests/kernels/test_kernels.py", "tests/blocks/test_attention.py")
"""The files over 70 s of the suite (a fresh `make test`'s junit.xml): pytest-xdist's --dist loadfile hands a file
to one worker whole, so one of these drawn last by the random order left the other worker idle for up to 2.5 min.
They are handed out first, in their drawn order; every other file and every test within a file keeps its random
order."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list) -> None:
    """The heavy files' tests first (after pytest-randomly's shuffle, which this keeps within each group)."""
    items.sort(key=lambda item: not item.nodeid.startswith(HEAVY_FILES))


os.environ.setdefault("WORKBENCH_TARGETS", "")
os.environ.setdefault("WORKBENCH_WORKERS", "1")  # commands verify in the test's process; tests/scaleout runs Ray
if "WORKBENCH_COMPILE_CACHE" not in os.environ:
    os.environ["WORKBENCH_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="workbench-compile-cache-")
    atexit.register(shutil.rmtree, os.environ["WORKBENCH_COMPILE_CACHE"], True)


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


@pytest.fixture
def copied_templates(tmp_path, monkeypatch):
    """copy(block) -> the block's folder in a templates root of this test's own ($WORKBENCH_TEMPLATES), with the
    host-code macros every template may import (templates/_*.j2), for a test that edits templates."""
    from workbench.templating import templates_dir

    source, root = templates_dir(), tmp_path / "templates"
    root.mkdir()
    for shared in source.glob("_*.j2"):
        shutil.copy(shared, root / shared.name)
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(root))

    def copy(block: str):
        shutil.copytree(source / block, root / block)
        return root / block

    return copy


@pytest.fixture
def swiglu_card(tmp_path, monkeypatch):
    """A model card of its own for swiglu, which no shipped card needs any more (Kimi K3 runs SiTU): it gives
    swiglu a model suite, at the width of a SwiGLU dense layer."""
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "swiglu-model.yaml").write_text(
        "name: swiglu-model\nblocks:\n  swiglu:\n    role: dense-layer activation\n"
        "    shapes: [{rows: 8192, N: 18432}]\n")
    monkeypatch.setenv("WORKBENCH_MODELS", str(cards))
    return cards


@pytest.fixture(scope="session")
def postgres():
    """A throwaway PostgreSQL server for this test process (tests/pgserver.py); skipped with the reason where none
    can be started."""
    from pgserver import PostgresServer, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(f"PostgreSQL: {reason}")
    server = PostgresServer().start()
    yield server
    server.stop()


# The PostgreSQL runs are whole-suite (`make test`) tests: `make test-fast` keeps the SQLite ones.
STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)]


@pytest.fixture(params=STORES)
def store_url(request, tmp_path) -> str:
    """The URL of a fresh, empty store: a SQLite file, then a database on the throwaway PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'wb.db'}"
    return request.getfixturevalue("postgres").new_database()
