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
        "\n\n_training_run = run\n\n\ndef run(a, b, limit=None, alpha=1.0, up_offset=0.0):\n    with torch.no_grad():\n"
        "        return _training_run(a, b, limit, alpha, up_offset)\n")
    path = tmp_path / "swiglu_inference.py"
    path.write_text(source)
    return path


def test_forward_only_verifies_the_outputs_and_records_the_backward_as_not_verified(inference_swiglu, swiglu_card):
    interp = get_backend("interpreter")
    result = verify_candidate(inference_swiglu, backend=interp, forward_only=True, **FAST)
    assert result.verdict == "pass", result.message
    assert result.checks and all(c.direction.startswith(("forward:", "integrity:")) for c in result.checks)
    assert result.forward_only and result.target_report()["backward"] == "not verified"
    assert {b["kernel"] for b in result.builds if b["suite"] == "model"} == {"swiglu_fwd_kernel"}

    full = verify_candidate(inference_swiglu, backend=interp, **FAST)
    assert full.verdict == "fail" and any(c.direction.startswith("grad:") and not c.passed for c in full.checks)
    assert full.target_report()["backward"] == "verified"


def test_a_forward_only_port_promotes_without_the_backward_and_says_so(settings):
    """port --forward-only: the outputs verified, no backward, no replay gate (training needs the backward); the
    manifest and the evidence line say the backward was not verified."""
    import json
    from pathlib import Path

    from workbench.agent.run import port_block
    from workbench.operators import evidence_line, list_promoted
    from workbench.store import get_engine
    from workbench.store.queries import run_steps

    outcome = port_block("swiglu", settings, seeds=1, dtypes=["float32"], suites=["smoke"], budget=2,
                         forward_only=True, replay_steps=2, targets=[])
    assert outcome.status == "promoted", outcome.reason
    manifest = json.loads(Path(outcome.operator_path).with_suffix(".json").read_text())
    assert manifest["verification"]["forward_only"] is True
    assert "(forward only)" in evidence_line(list_promoted(settings.operators_dir, "swiglu")[0])
    steps = run_steps(get_engine(settings.db_url), outcome.run_id)
    assert any(s.node == "replay" and "forward-only port" in s.message for s in steps)
    assert not any(s.node == "verify" and "grad:" in json.dumps(s.data) for s in steps)
