"""Forward-only verification: an inference kernel without a backward (fla's fused_recurrent_kda is one) is verified
on its outputs, and the result says that the backward was not verified; the same file fails full verification."""

from __future__ import annotations

import pytest

from workbench.backends import get_backend
from workbench.templating import load_template
from workbench.verify.harness import verify_candidate

pytestmark = pytest.mark.interpreter
FAST = {"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "base_seed": 0, "targets": ["sm_90a"]}


@pytest.fixture
def inference_swiglu(tmp_path):
    """swiglu flat with its run wrapped in no_grad: right outputs, no autograd graph."""
    template = load_template("swiglu", "flat")
    source = template.render(next(template.points())) + (
        "\n\n_training_run = run\n\n\ndef run(a, b):\n    with torch.no_grad():\n        return _training_run(a, b)\n")
    path = tmp_path / "swiglu_inference.py"
    path.write_text(source)
    return path


def test_forward_only_verifies_the_outputs_and_records_the_backward_as_not_verified(inference_swiglu):
    interp = get_backend("interpreter")
    result = verify_candidate(inference_swiglu, backend=interp, forward_only=True, **FAST)
    assert result.verdict == "pass", result.message
    assert result.checks and all(c.direction.startswith(("forward:", "integrity:")) for c in result.checks)
    assert result.forward_only and result.evidence()["backward"] == "not verified"
    assert {b["kernel"] for b in result.builds if b["suite"] == "model"} == {"swiglu_fwd_kernel"}

    full = verify_candidate(inference_swiglu, backend=interp, **FAST)
    assert full.verdict == "fail" and any(c.direction.startswith("grad:") and not c.passed for c in full.checks)
    assert full.evidence()["backward"] == "verified"
