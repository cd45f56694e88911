"""Real third-party kernels, used exactly as their package ships them, pass full verification on the interpreter
(through the interpreter shims: float scalar arguments, libdevice) and compile for GPU targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.backends import get_backend
from workbench.verify.harness import verify_candidate

pytest.importorskip("liger_kernel", reason="liger-kernel is a dev dependency (pip install -e '.[dev]')")
pytestmark = pytest.mark.interpreter

THIRD_PARTY = Path(__file__).with_name("thirdparty")


@pytest.mark.parametrize("name", ["liger_rmsnorm", "liger_swiglu"])
def test_liger_kernels_as_shipped_pass_verification_and_compile_for_targets(name, swiglu_card):
    result = verify_candidate(THIRD_PARTY / f"{name}.py", backend=get_backend("interpreter"), seeds=1, base_seed=3,
                              targets=["sm_90a", "gfx942"])
    assert result.verdict == "pass", result.message
    assert result.evidence()["compiles_on"] == ["sm_90a", "gfx942"]
    assert {b["kernel"] for b in result.builds if b["suite"] == "model"}, "the model suite's launches were captured"
