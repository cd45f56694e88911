"""One local Ray instance (2 CPUs) for every test of the fan-out in a test session: the executors these tests make
join it instead of starting their own."""

from __future__ import annotations

import pytest

from workbench.executor import SYSTEM_TEMP, remove_dead_scratch


@pytest.fixture(scope="session")
def ray_instance():
    """ray.init(num_cpus=2) once for the session; shut down at its end, its workers' scratch folders removed."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    remove_dead_scratch(SYSTEM_TEMP)


@pytest.fixture
def two_block_card(tmp_path, monkeypatch) -> str:
    """A model card of two cheap blocks (rmsnorm, situ) at Kimi K3's sizes, in a card folder of this test's own."""
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "two-blocks.yaml").write_text(
        "name: two-blocks\nblocks:\n"
        "  rmsnorm:\n    role: pre-norms\n    shapes: [{rows: 8192, N: 7168}]\n"
        "  situ:\n    role: SiTU activation of the shared experts\n    shapes: [{rows: 8192, N: 6144}]\n")
    monkeypatch.setenv("WORKBENCH_MODELS", str(cards))
    return "two-blocks"
