"""TorchDynamo in the verification worker: imported only when a candidate compiles.

Importing torch._dynamo costs a child about as much CPU as importing torch itself, and torch's own wrapper around a
dispatch mode imports it at the first op. The worker's mode disables Dynamo inside itself only once Dynamo is loaded
(nothing compiles before), and it does before its snapshot what importing Dynamo does to the watched namespaces (it
rewraps torch.manual_seed). So a candidate that compiles passes like any other, and one that does not runs without
Dynamo. Each candidate below is the rmsnorm row_block base with one addition, verified in the real sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from cheats import BASES

from workbench.backends import get_backend
from workbench.verify.harness import verify_candidate

FAST = {"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "base_seed": 0, "targets": []}

COMPILES = '''

_run_kernel = run


@torch.compile(backend="eager")
def _flat(x):
    return x.view(-1).view(x.shape)  # host code under Dynamo: views only, every op through the worker's mode


def run(x, weight, eps):
    return _flat(_run_kernel(x, weight, eps))
'''

NOTES_DYNAMO = '''

import sys

_run_kernel = run


def run(x, weight, eps):
    out = _run_kernel(x, weight, eps)
    return out + 1 if "torch._dynamo" in sys.modules else out  # wrong exactly when Dynamo was loaded
'''


def verify(tmp_path: Path, addition: str):
    path = tmp_path / "cand.py"
    path.write_text(BASES["rmsnorm"]() + addition)
    return verify_candidate(path, backend=get_backend("interpreter"), **FAST)


@pytest.mark.interpreter
def test_a_candidate_that_compiles_its_host_code_passes(tmp_path):
    result = verify(tmp_path, COMPILES)
    assert result.verdict == "pass", f"{result.verdict}: {result.message}"


@pytest.mark.interpreter
def test_a_candidate_that_never_compiles_runs_without_dynamo(tmp_path):
    result = verify(tmp_path, NOTES_DYNAMO)
    assert result.verdict == "pass", f"{result.verdict}: {result.message}"
