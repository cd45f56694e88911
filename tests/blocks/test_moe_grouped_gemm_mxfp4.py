"""moe_grouped_gemm_mxfp4: the packing read as compressed-tensors writes it (its MXFP4 compressor, on a tiny
checkpoint of experts saved with safetensors and read back), the quantizer byte for byte against compressed-tensors',
the reference against moe_grouped_gemm on the dequantized weights, the input factory, the card; both templates
verified through the sandbox on the Triton interpreter, and the kernels run on a checkpoint compressed-tensors wrote."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mxfp4_checkpoint_child import PROJECTIONS, compressed_tensors_experts, stacked
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.moe_grouped_gemm_mxfp4 import E2M1, dequantize, quantize

SPEC = get_block("moe_grouped_gemm_mxfp4")
DENSE = get_block("moe_grouped_gemm")
CHILD = Path(__file__).with_name("mxfp4_checkpoint_child.py")


def test_dequantize_reads_compressed_tensors_packing(tmp_path):
    """Every weight dequantizes to what compressed-tensors' own decompress gives, bit for bit, and the packing is
    what our quantizer writes from the bfloat16 originals, byte for byte."""
    ckpt = compressed_tensors_experts(tmp_path, experts=2, d=64, f=96, seed=0)
    packed, scales = stacked(ckpt, 2, "weight_packed"), stacked(ckpt, 2, "weight_scale")
    truth, originals = stacked(ckpt, 2, "decompressed"), stacked(ckpt, 2, "weight")
    for name in PROJECTIONS:
        assert packed[name].dtype == scales[name].dtype == torch.uint8
        torch.testing.assert_close(dequantize(packed[name], scales[name]), truth[name].float(), rtol=0, atol=0)
        ours_packed, ours_scale = quantize(originals[name].float())
        assert torch.equal(ours_packed, packed[name]) and torch.equal(ours_scale, scales[name])


def test_packing_by_hand():
    """Low nibble first, bit 3 the sign, the e2m1 magnitudes by index, 2^(scale - 127) per 32 values."""
    codes = torch.tensor([0x1, 0x9, 0x7, 0xF, 0x2, 0x0] + [0x0] * 26, dtype=torch.uint8)
    packed = (codes[0::2] | codes[1::2] << 4)[None]  # [1, 16]
    assert packed[0, :3].tolist() == [0x91, 0xF7, 0x02]
    w = dequantize(packed, torch.tensor([[125]], dtype=torch.uint8))
    assert w[0, :6].tolist() == [0.125, -0.125, 1.5, -1.5, 0.25, 0.0]
    assert sorted(dequantize(torch.arange(8, dtype=torch.uint8)[None].repeat(1, 2) * 0x11,
                             torch.tensor([[127]], dtype=torch.uint8))[0, :16:2].tolist()) == list(E2M1)


def test_quantize_round_trip_and_rounding():
    """Dequantized values quantize to themselves (the scales byte for byte; a negative value rounded to 0 keeps its
    sign bit, which its dequantized -0.0 does not carry); ties go to the even code (3.5 -> 4, 0.75 -> 1, 1.25 -> 1);
    a group reaching 1.75 times a power of two takes the next scale (no clipping at 7)."""
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    packed, scale = quantize(w)
    values = dequantize(packed, scale, torch.float64)
    again = quantize(values)
    assert torch.equal(again[1], scale) and torch.equal(dequantize(*again, torch.float64), values)
    row = torch.tensor([[3.5, 0.75, 1.25, 6.0] + [0.0] * 28])
    assert dequantize(*quantize(row))[0, :4].tolist() == [4.0, 1.0, 1.0, 6.0]
    assert quantize(torch.tensor([[7.0] + [0.0] * 31]))[1].item() == 127 + 1  # amax 7: scale 2, 7 / 2 -> 4 (8)


@pytest.mark.parametrize("shape", SPEC.shapes["smoke"] + SPEC.shapes["edge"], ids=str)
def test_reference_is_the_grouped_gemm_of_the_dequantized_weights(shape):
    inputs = SPEC.make_inputs(shape, torch.float64, 3)
    dense = {k: v for k, v in inputs.items() if not k.startswith("w")}
    dense.update({name: dequantize(inputs[name], inputs[f"{name}_scale"], torch.float64) for name in PROJECTIONS})
    torch.testing.assert_close(SPEC.reference(**inputs), DENSE.reference(**dense), rtol=0, atol=0)


def test_make_inputs_shapes_and_whole_groups():
    for shape in SPEC.shapes["smoke"] + SPEC.shapes["edge"] + SPEC.hidden_shapes(__import__("random").Random(2)):
        assert shape["D"] % 32 == 0 and shape["F"] % 32 == 0
    shape = SPEC.shapes["smoke"][1]
    inputs = SPEC.make_inputs(shape, torch.float16, 1)
    e, d, f = shape["E"], shape["D"], shape["F"]
    assert inputs["x"].dtype == torch.float16 and inputs["activation"] == "situ"
    assert inputs["w1"].shape == (e, f, d // 2) and inputs["w1_scale"].shape == (e, f, d // 32)
    assert inputs["w2"].shape == (e, d, f // 2) and inputs["w2_scale"].shape == (e, d, f // 32)
    abstract = SPEC.meta_inputs(shape, torch.float16)
    assert {k: (v.shape, v.dtype) for k, v in abstract.items() if torch.is_tensor(v)} == \
        {k: (v.shape, v.dtype) for k, v in inputs.items() if torch.is_tensor(v)}


def test_the_card_covers_k3_published_weights():
    from workbench.models import get_model

    blocks = get_model("kimi-k3.1-pro").blocks
    assert "quantized_weights" not in blocks
    entry = blocks["moe_grouped_gemm_mxfp4"]
    assert entry["shapes"] == blocks["moe_grouped_gemm"]["shapes"]
    assert "text_config.quantization_config" in entry["fields"]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("moe_grouped_gemm_mxfp4")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["dequant", "dot_scaled"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    result = verify_first_point(tmp_path, "moe_grouped_gemm_mxfp4", template, base_seed=7)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:y"}
    assert result.forward_only


def test_native_microscaling_only_where_both_operands_are_microscaled():
    """The compile matrix of tl.dot_scaled against e2m1 weights (bench/mxfp4.py --lowering, compiled for each target
    without a GPU): bfloat16 activations (the published W4A16 scheme, the dot_scaled template's call) take an
    ordinary bfloat16 MMA on every target, Triton upcasting the weights; e4m3 activations take the block-scaled MMA
    on sm_100a and gfx950, an upcast on sm_90a and gfx942, and sm_80 has no e4m3."""
    done = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "bench" / "mxfp4.py"), "--lowering"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {tuple(line.split()[:4:3]): line for line in done.stdout.splitlines() if " x e2m1 " in line}
    for target in ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950"):  # a half-type MMA (sm_100a: kind::f16)
        assert re.search(r"bf16|kind::f16", rows["bf16", target]) and "scale" not in rows["bf16", target]
    assert "kind::mxf8f6f4.block_scale" in rows["e4m3", "sm_100a"] and "v_mfma_scale" in rows["e4m3", "gfx950"]
    assert "bf16.bf16" in rows["e4m3", "sm_90a"] and "_bf16" in rows["e4m3", "gfx942"]
    assert "does not compile" in rows["e4m3", "sm_80"]


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["dequant", "dot_scaled"])
def test_kernels_on_a_compressed_tensors_checkpoint(tmp_path, template):
    """The experts of a checkpoint compressed-tensors wrote, through the kernel as loaded, in a child process on the
    interpreter (mxfp4_checkpoint_child.py holds the run and its bounds)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(CHILD), str(tmp_path), template], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checkpoint ok" in done.stdout
