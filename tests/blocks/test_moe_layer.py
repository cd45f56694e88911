"""The four MoE blocks composed into one routed-expert layer: router -> permute -> grouped GEMM -> combine, each
from a candidate rendered from its templates and run on the Triton interpreter, equals a plain per-expert loop in
float64, forward and backward (x, the router weight and every expert weight). The layer runs in a child process
(tests/blocks/moe_layer_child.py holds it and its assertions): interpreted kernels never enter the test process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.interpreter

CHILD = Path(__file__).with_name("moe_layer_child.py")


@pytest.mark.parametrize("which", [0, 1], ids=["rank1-templates", "rank2-templates"])
def test_composed_layer_equals_per_expert_loop(tmp_path, which):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(CHILD), str(tmp_path), str(which)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "layer ok" in done.stdout
