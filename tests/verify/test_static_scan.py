"""The static scan of a candidate's source for code that reaches into the verifier's instrumentation."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.verify.static_scan import instrumentation_access


@pytest.mark.parametrize(("source", "found"), [
    ("from torch.utils._python_dispatch import _disable_current_modes\n",
     "line 1: imports from torch.utils._python_dispatch"),
    ("import torch.utils._python_dispatch as d\n", "line 1: imports torch.utils._python_dispatch"),
    ("import torch\nwith torch._C._DisableTorchDispatch():\n    pass\n", "line 2: reads ._DisableTorchDispatch"),
    ("import torch\nkeys = torch._C._dispatch_keys\n", "line 2: uses torch._C._dispatch_keys"),
    ("def f():\n    pass\ncells = f.__closure__\n", "line 3: reads .__closure__"),
    ("import builtins\ng = getattr(builtins.print, '__globals__', None)\n", "line 2: names '__globals__'"),
    ("import importlib\nm = importlib.import_module('torch._C')\n", "line 2: names the module 'torch._C'"),
])
def test_code_reaching_into_the_instrumentation_is_found(source, found):
    assert instrumentation_access(source) == found


@pytest.mark.parametrize("source", [
    "import torch\nimport triton\nimport triton.language as tl\nx = torch.empty(3)\n",
    "import torch\nname = torch._C._get_accelerator()\n",  # allowed: what kernel code legitimately asks
    "def run(x:\n",  # does not parse: the contract check's compile_error speaks for it
])
def test_ordinary_kernel_code_is_not(source):
    assert instrumentation_access(source) is None


def test_no_promoted_operator_and_no_third_party_candidate_is_refused():
    root = Path(__file__).resolve().parents[2]
    files = sorted(root.glob("operators/*/*.py")) + sorted((root / "tests/verify/thirdparty").glob("*.py"))
    assert files
    assert {str(f): instrumentation_access(f.read_text()) for f in files} == {str(f): None for f in files}
