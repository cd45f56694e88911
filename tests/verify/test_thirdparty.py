"""Real third-party kernels, used exactly as their package ships them, pass full verification on the interpreter
(through the interpreter shims: float scalar arguments, libdevice) and compile for GPU targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.backends import get_backend
from workbench.verify.compile_worker import jit_function
from workbench.verify.harness import verify_candidate

THIRD_PARTY = Path(__file__).with_name("thirdparty")


@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["liger_rmsnorm", "liger_swiglu"])
def test_liger_kernels_as_shipped_pass_verification_and_compile_for_targets(name, swiglu_card):
    """Liger's RMSNorm passes everything; its SiLU-mul computes plain SwiGLU only, so it passes every plain shape and
    fails exactly the clamped and alpha ones (swiglu's variants), never passed off as computing them."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is a dev dependency (pip install -e '.[dev]')")
    result = verify_candidate(THIRD_PARTY / f"{name}.py", backend=get_backend("interpreter"), seeds=1, base_seed=3,
                              targets=["sm_90a", "gfx942"])
    if name == "liger_swiglu":
        failed = {c.shape for c in result.checks if not c.passed}
        assert result.verdict == "fail" and failed and all("limit=" in shape for shape in failed), result.message
        assert all(c.passed for c in result.checks if "limit=" not in c.shape and c.suite != "integrity")
    else:
        assert result.verdict == "pass", result.message
    assert result.target_report()["compiles_on"] == ["sm_90a", "gfx942"]
    assert {b["kernel"] for b in result.builds if b["suite"] == "model"}, "the model suite's launches were captured"


@pytest.mark.interpreter
def test_fla_fused_recurrent_kda_as_shipped_passes_forward_only_verification_and_compiles_for_targets():
    """fla's decode kernel (forward only) on every smoke, edge and hidden kda shape, GVA included. Importing fla
    brings torch's lazy modules in: importlib.metadata scans sys.path (the editable install's path-hook placeholder
    among it) and torch.compile makes its cache folder; neither is a read of the workbench nor a write outside
    scratch. Its kernel is a @triton.heuristics over a @triton.jit, which the compile child unwraps."""
    pytest.importorskip("fla", reason="fla-core is a dev dependency (pip install -e '.[dev]')")
    result = verify_candidate(THIRD_PARTY / "fla_fused_recurrent_kda.py", backend=get_backend("interpreter"), seeds=1,
                              base_seed=3, targets=["sm_90a", "gfx942"], forward_only=True)
    assert result.verdict == "pass", result.message
    assert result.forward_only
    assert {c.suite for c in result.checks} >= {"smoke", "edge", "hidden"}
    assert any(c.shape.startswith("B=1,T=1,H=2,HV=4") for c in result.checks), "a GVA shape was verified"
    assert result.target_report()["compiles_on"] == ["sm_90a", "gfx942"]
    assert {b["kernel"] for b in result.builds if b["suite"] == "model"} == {"fused_recurrent_kda_fwd_kernel"}


def test_the_compile_child_finds_the_jit_function_under_heuristics_and_autotune():
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    @triton.jit
    def plain(x, BLOCK: tl.constexpr):
        pass

    wrapped = triton.autotune(configs=[triton.Config({})], key=[])(
        triton.heuristics({"BLOCK": lambda args: 16})(plain))
    assert jit_function(plain) is plain and isinstance(plain, JITFunction)
    assert jit_function(wrapped) is plain
    assert jit_function(plain.fn) is None and jit_function(None) is None and jit_function(3) is None
