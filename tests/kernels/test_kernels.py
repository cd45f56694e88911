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
    """Forward and every gradient through the custom ops equal the operator's own run (same kernels: the eager
    backward runs the operator's backward on the graph its forward kept), bitwise."""
    found = run_child("equal")
    assert set(found) == {"rmsnorm", "situ", "vocab_blockwise_ce", "seq_chunked_ce", "kda"}
    for block, figures in found.items():
        assert figures["bitwise"], (block, figures)
        assert set(figures["grads"]) == set(get_block(block).grad_inputs), block


def test_ops_pass_torch_library_opcheck():
    """torch's own checks of a custom op: schema, autograd registration, fake tensors and AOT dispatch with dynamic
    shapes (forward and backward traced, run and compared with eager)."""
    found = run_child("opcheck")
    assert set(found) == {"rmsnorm", "situ", "vocab_blockwise_ce", "moe_router", "kda", "kda_decode"}
    for block, results in found.items():
        assert set(results) == {"test_schema", "test_autograd_registration", "test_faketensor",
                                "test_aot_dispatch_dynamic"}, block
        assert set(results.values()) == {"SUCCESS"}, (block, results)


def test_a_cache_updated_in_place_comes_back_as_the_argument_itself():
    """kda_decode's op mutates its state_cache argument (Tensor(a!) in its schema) and returns o alone; the BlockOp
    gives the argument back in its place among the outputs, updated as the reference updates its copy."""
    found = run_child("in_place")
    assert found["is_argument"] and found["op_returns"] == 1
    assert found["o"] <= 1e-5 and found["cache"] <= 1e-5, found


def test_compiled_layers_with_fullgraph_match_eager():
    """torch.compile(layer, fullgraph=True) with inductor (C++ on CPU) around the opaque ops: no graph break, and
    output and gradients bitwise equal to eager."""
    found = run_child("compile")
    assert found.pop("graph_breaks") == 0
    assert set(found) == {"RMSNorm", "SiTUMLP", "LinearCrossEntropyLoss"}
    for layer, figures in found.items():
        assert figures["bitwise"], (layer, figures["diffs"])


def test_forward_and_backward_through_an_op_launch_what_the_operator_launches():
    """Eager, with grad: the op's forward keeps the operator's graph and its backward runs only the operator's
    backward kernels, so forward + backward launch exactly what the operator's own autograd.Function launches (no
    second forward), with bitwise the same results; the backward op called directly (torch.compile's path)
    recomputes the forward first."""
    found = run_child("launches")
    assert set(found) == {"rmsnorm", "kda", "mla"}
    for block, figures in found.items():
        assert figures["op"] == figures["run"], (block, figures)
        assert figures["bitwise"], block
        assert figures["backward_op"] == sum(figures["run"]), (block, figures)


def test_what_the_forward_keeps_for_its_backward_is_let_go():
    """No graph is kept by a call that makes no autograd node (no_grad, inference_mode), none is left in the
    hand-over slots, and the kept graph is let go after the backward that used it; a second backward through the
    same graph (retain_graph) and one after an output was modified in place recompute, with the same gradients, as
    does activation checkpointing around the op."""
    found = run_child("kept")
    for block, figures in found.items():
        assert figures["no_grad_keeps"] == 0 and figures["slots_clear"], (block, figures)
        assert figures["released_after_backward"], block
        launches = figures["launches"]
        assert launches["second"] == launches["in_place"] == launches["backward_op"] > launches["first"], \
            (block, launches)
        assert all(figures["equal"].values()), (block, figures["equal"])


def test_bfloat16_the_interpreter_cannot_compute_is_refused_in_one_line():
    """On the interpreter a kernel's tl.dot on bfloat16 operands is wrong by ~1e8 (triton issue #11584): such an op
    refuses with one line naming it, the dtype, the reason and what to do; float32 there, and bfloat16 where the
    kernels upcast before their dots (kda) or only load and store it (rmsnorm), pass the verifier's checks against
    the float64 reference. A kernel outside the library is not the library's to refuse."""
    found = run_child("bf16")
    assert set(found["refused"]) == {"mla", "vocab_blockwise_ce"}
    for block, message in found["refused"].items():
        assert message is not None, f"{block} in bfloat16 was not refused"
        assert "\n" not in message and message.startswith(f"workbench::{block} refused in bfloat16"), message
        for part in ("Triton interpreter", "tl.dot on bfloat16 operands", "triton issue #11584",
                     "float32 or float16", "GPU"):
            assert part in message, (part, message)
    assert found["right"] == {"mla@float32": [], "kda@bfloat16": [], "rmsnorm@bfloat16": []}, found["right"]
    assert found["guard_after"] is False and found["others_untouched"]


def test_softmax_attention_at_every_head_size_the_families_use():
    """64 (GPT-OSS), 80, 96, 128 (Llama, Mistral), 192, 256 (Qwen3-Next, Gemma): padded to a power of two in the
    kernels; the output and every gradient within float32's reach of the float64 truth."""
    found = run_child("heads")
    assert set(found) == {"64", "80", "96", "128", "192", "256"}
    for d, errors in found.items():
        assert max(errors.values()) < 2e-5, (d, errors)
        assert ("sinks" in errors) == (int(d) in (80, 128, 256)), d


def test_kdas_decay_rate_gradient_is_accurate_at_qwen3_nexts_steep_decays():
    """Qwen3-Next's decay rates (A up to 16: g down to about -35 a token) make its A_log gradient a sum of dg's
    terms that are tiny where the decay is steep: kda's backward sums dg_t from the terms whose decay spans t (never
    as a difference of per-row terms, which round far above dg there), so that gradient stays within the parity's
    gradient bound (1e-3) of float64; the backward that took dg as a suffix sum of differences was 4.5e-2 off here."""
    found = run_child("steep")
    assert max(found["rates"]) > 15 and min(found["rates"]) < 1  # steep heads and a mild one
    assert found["error"] < 1e-4


def test_glm5_nexts_clamped_mlp_patched_computes_the_shipped_module_where_the_clamp_acts():
    """swiglu's clamped variant in GLM-5-Next's MLP (the family's patch) against the shipped forward, on inputs where
    a quarter of the gate and up values lie past swiglu_limit: float32 rounding, not the 0.2 the unclamped form is off
    (tests/integrations/test_references.py)."""
    found = run_child("clamped")
    assert found["past"] > 0.2
    assert found["output"] < 1e-5 and found["grad"] < 1e-5


def test_glm5_next_text_model_loaded_alone_gets_its_familys_kernels():
    """``Glm5NextTextModel`` (model_type glm5_next_text: the text model without the vision tower or an LM head) is
    patched by GLM-5-Next's family: the hyper-connections, their expand and mix, the KDA layers and the MoE through
    the promoted operators; hidden states and every parameter's gradient within float32 rounding of the shipped
    model."""
    found = run_child("glm5_text")
    assert found["model_type"] == "glm5_next_text"
    blocks = found["blocks"]
    assert blocks["Glm5NextTextHyperConnection"] == ["hyper_connection"]
    assert blocks["Glm5NextTextDecoderLayer"] == ["hyper_connection_mix"]
    assert blocks["Glm5NextTextLinearAttention"][:3] == ["kda_short_conv", "kda_prologue", "kda"]
    assert blocks["Glm5NextTextExperts"] == ["moe_permute", "moe_grouped_gemm", "moe_combine"]
    assert found["output"] < 1e-5 and found["grad_worst"] < 1e-3 and found["grads"] > 40


def test_paged_attention_reads_and_writes_vllms_kv_cache_as_its_layer_holds_it():
    """attention_prefill and attention_decode on keys and values that are the halves of one cache tensor (vLLM's, per
    layer), token-major and head-major: within float32 rounding of the reference, the writes in that tensor."""
    found = run_child("kv_halves")
    assert len(found) == 4
    for figures in found.values():
        assert not figures["contiguous"] and figures["written_in_place"], figures
        out, k_cache, v_cache = figures["errors"]
        assert out < 1e-5 and k_cache == 0.0 and v_cache == 0.0, figures


def test_rotary_rotates_a_strided_view_of_the_rope_part():
    """rotary as the MLA and DSA forwards call it: q's rope part is a [B, H, T, R] tensor seen as [B, T, H, R], read
    through its strides; forward and input gradient within float32 rounding of float64, in both layouts."""
    found = run_child("strided")
    for layout in found.values():
        assert not layout["contiguous"] and layout["output"] < 1e-6 and layout["grad"] < 1e-6
