"""Fixtures of the store's tests."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

OPEN_AND_COUNT_RUNS = ("import sys, time; from workbench.store import get_engine, queries; "
                       "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); "
                       "print(len(queries.list_runs(get_engine(sys.argv[1]))))")


@pytest.fixture
def open_together():
    """open_together(url, n=4) -> [(exit code, runs counted, stderr tail)] of n processes that open the store at
    ``url`` at the same moment (3 s from now) and count its runs."""
    def run(url: str, n: int = 4) -> list[tuple[int, str, str]]:
        at = str(time.time() + 3.0)
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_AND_COUNT_RUNS, url, at], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(n)]
        return [(p.wait(timeout=120), p.stdout.read().strip(), p.stderr.read()[-500:]) for p in procs]
    return run
