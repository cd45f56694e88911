"""The kernels library on the repository's promoted operators, through the Triton interpreter: each check runs in a
child process (tests/kernels/kernels_child.py) that selects the interpreter before triton is imported and prints its
figures as one JSON line; the assertions are here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.blocks import get_block
from workbench.kernels import OPS

pytestmark = pytest.mark.interpreter

CHILD = Path(__file__).with_name("kernels_child.py")


def run_child(check: str) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(CHILD), check], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_fake_implementation_gives_the_real_ops_shapes_and_dtypes():
    """Forward and backward op of every block at its first smoke shape: the fake (meta) implementation, which
    torch.compile traces with, agrees with the promoted operator's outputs and gradients."""
    found = run_child("fake")
    assert set(found) == set(OPS)
    for block, figures in found.items():
        assert figures["fake"] == figures["real"], block
        assert len(figures["real"]) == len(get_block(block).outputs), block
        assert figures["fake_grads"] == figures["real_grads"], block
        assert len(figures["real_grads"]) == len(get_block(block).grad_inputs), block


def test_ops_equal_the_promoted_operators_run_bitwise():
    """Forward and every gradient through the custom ops equal the operator's own run (same kernels; the backward op
    recomputes the forward and runs the operator's backward), bitwise."""
    found = run_child("equal")
    assert set(found) == {"rmsnorm", "situ", "vocab_blockwise_ce", "seq_chunked_ce", "kda"}
    for block, figures in found.items():
        assert figures["bitwise"], (block, figures)
        assert set(figures["grads"]) == set(get_block(block).grad_inputs), block


def test_ops_pass_torch_library_opcheck():
    """torch's own checks of a custom op: schema, autograd registration, fake tensors and AOT dispatch with dynamic
    shapes (forward and backward traced, run and compared with eager)."""
    found = run_child("opcheck")
    assert set(found) == {"rmsnorm", "situ", "vocab_blockwise_ce", "moe_router", "kda"}
    for block, results in found.items():
        assert set(results) == {"test_schema", "test_autograd_registration", "test_faketensor",
                                "test_aot_dispatch_dynamic"}, block
        assert set(results.values()) == {"SUCCESS"}, (block, results)


def test_compiled_layers_with_fullgraph_match_eager():
    """torch.compile(layer, fullgraph=True) with inductor (C++ on CPU) around the opaque ops: no graph break, and
    output and gradients bitwise equal to eager."""
    found = run_child("compile")
    assert found.pop("graph_breaks") == 0
    assert set(found) == {"RMSNorm", "SiTUMLP", "LinearCrossEntropyLoss"}
    for layer, figures in found.items():
        assert figures["bitwise"], (layer, figures["diffs"])
