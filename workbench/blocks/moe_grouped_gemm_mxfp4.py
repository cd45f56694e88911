"""moe_grouped_gemm_mxfp4: moe_grouped_gemm over the routed experts' weights as published in MXFP4 (the OCP
microscaling format: 4-bit e2m1 values, one e8m0 power-of-two scale per 32 values along the reduction axis), read in
compressed-tensors' ``mxfp4-pack-quantized`` layout (Kimi K3's checkpoint) and dequantized inside the kernel. The
activations stay in their own dtype (weight-only quantization, W4A16).

A weight W [OUT, IN] (IN a multiple of 32) is stored as

    packed [OUT, IN / 2] uint8:   packed[o, i] = code(W[o, 2 i]) | code(W[o, 2 i + 1]) << 4     (low nibble first)
    scale  [OUT, IN / 32] uint8:  e8m0, the group's scale 2^(scale - 127)
    code: bit 3 the sign, bits 0-2 the magnitude's index into E2M1 = (0, 0.5, 1, 1.5, 2, 3, 4, 6)
    W[o, i] = (-1)^sign E2M1[magnitude] * 2^(scale[o, i // 32] - 127)

and the block computes moe_grouped_gemm's math (its docstring) with w1, w3 and w2 the dequantized weights: gate and
up packed along D, down along F. Every dequantized weight is exact in bfloat16 (two significant bits, exponents within
its range), so the truth is the float64 product of the dequantized weights and a kernel loses nothing by
dequantizing to its dot's operand dtype.

Shapes: x [M, D] (M = N*k expert-major rows), offsets [E + 1] int64, w1 and w3 [E, F, D / 2] uint8 with w1_scale and
w3_scale [E, F, D / 32] uint8, w2 [E, D, F / 2] uint8 with w2_scale [E, D, F / 32] uint8, D and F multiples of 32;
activation, beta, linear_beta, limit, alpha, up_offset as moe_grouped_gemm's. Output y [M, D] in x.dtype. Forward
only: the published weights are frozen (serving, and LoRA's base weights), and the gradient to x is not built yet.
Inputs (make_inputs): moe_grouped_gemm's draws, with its weights quantized by ``quantize`` (scales from 2^-5 to 2^1).
"""

from __future__ import annotations

import random
from dataclasses import replace

import torch

from workbench.blocks import moe_grouped_gemm
from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype

GROUP = 32
"""Values sharing one e8m0 scale, along the reduction axis."""
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""The e2m1 magnitudes by their 3-bit index."""
FORMAT = "mxfp4-pack-quantized"
"""compressed-tensors' name for this layout (a config's quantization_config.format)."""
PACKED_BYTES = 0.5 + 1 / GROUP
"""Bytes per weight: half a byte of e2m1 and a 32nd of the scale byte (4.25 bits)."""


def dequantize(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[..., OUT, IN / 2] uint8 e2m1 pairs and [..., OUT, IN / 32] uint8 e8m0 scales -> [..., OUT, IN] in ``dtype``."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()  # [..., OUT, IN], low nibble first
    magnitudes = torch.tensor(E2M1, dtype=dtype, device=packed.device)[codes & 7]
    values = torch.where(codes >= 8, -magnitudes, magnitudes)
    powers = torch.exp2(scale.to(dtype) - 127).repeat_interleave(GROUP, dim=-1)
    return values * powers


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., OUT, IN] float -> (packed, scale), as compressed-tensors quantizes MXFP4: each group's largest magnitude
    rounded to a power of two (up from 1.75 times one), over 4 (e2m1's largest power) is its scale; the values over
    the scale are clipped to +-6 and rounded to the nearest e2m1 value, ties to the even code. Scales outside e8m0's
    range are clamped to it. Exact in float32 (every step is a power-of-two scaling or a comparison), a million
    groups at a time, so model-sized weights quantize in bounded memory."""
    rows = w.reshape(-1, w.shape[-1])
    parts = [_quantize_rows(chunk.float()) for chunk in rows.split(max(1, (1 << 25) // max(1, w.shape[-1])))]
    packed = torch.cat([p for p, _ in parts]) if parts else rows.new_empty(0, w.shape[-1] // 2, dtype=torch.uint8)
    scale = torch.cat([s for _, s in parts]) if parts else rows.new_empty(0, w.shape[-1] // GROUP, dtype=torch.uint8)
    return packed.reshape(*w.shape[:-1], -1), scale.reshape(*w.shape[:-1], -1)


def _quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize for [ROWS, IN] float32."""
    groups = w.unflatten(-1, (-1, GROUP))  # [ROWS, IN / 32, 32]
    amax = groups.abs().amax(dim=-1)
    exponent = torch.floor(torch.log2(amax.clamp_min(2.0 ** -125)))
    exponent = exponent + (amax >= 1.75 * torch.exp2(exponent)).float() - 2
    exponent = torch.where(amax > 0, exponent, 0.0).clamp(-126, 127)  # an all-zero group: scale 1
    scaled = (groups / torch.exp2(exponent)[..., None]).clamp(-6, 6)
    grid = torch.tensor(E2M1, dtype=torch.float32, device=w.device)
    distance = (scaled.abs()[..., None] - grid).abs()  # [ROWS, IN / 32, 32, 8]
    nearest = distance.argmin(dim=-1, keepdim=True)  # the smaller magnitude on a tie
    above = (nearest + 1).clamp(max=len(E2M1) - 1)
    tie = (distance.gather(-1, above) == distance.gather(-1, nearest)) & (nearest % 2 == 1)
    magnitude = torch.where(tie, above, nearest)[..., 0]  # a tie goes to the even code
    codes = (magnitude | (scaled < 0).long() << 3).flatten(-2).to(torch.uint8)
    return codes[..., 0::2] | codes[..., 1::2] << 4, (exponent + 127).to(torch.uint8)


def reference(x: torch.Tensor, offsets: torch.Tensor, w1: torch.Tensor, w1_scale: torch.Tensor, w3: torch.Tensor,
              w3_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, activation: str, beta: float,
              linear_beta: float, limit: float | None = None, alpha: float = 1.0,
              up_offset: float = 0.0) -> torch.Tensor:
    ct = compute_dtype(x)
    return moe_grouped_gemm.reference(x, offsets, dequantize(w1, w1_scale, ct), dequantize(w3, w3_scale, ct),
                                      dequantize(w2, w2_scale, ct), activation, beta, linear_beta, limit, alpha,
                                      up_offset)


def _packed(inputs: dict) -> dict:
    """moe_grouped_gemm's inputs with w1, w3 and w2 replaced by their packing and scales."""
    out = {"x": inputs["x"], "offsets": inputs["offsets"]}
    for name in ("w1", "w3", "w2"):
        out[name], out[f"{name}_scale"] = inputs[name]
    return {**out, **{k: inputs[k] for k in ("activation", "beta", "linear_beta", "limit", "alpha", "up_offset")}}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """moe_grouped_gemm's inputs (its routing, x and activation) with its float32 weights quantized (on ``device``)."""
    inputs = moe_grouped_gemm.make_inputs(shape, torch.float32, seed, device)
    for name in ("w1", "w3", "w2"):
        inputs[name] = quantize(inputs[name])
    inputs["x"] = inputs["x"].to(dtype)
    return _packed(inputs)


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device."""
    inputs = moe_grouped_gemm.abstract_inputs(shape, dtype)
    for name in ("w1", "w3", "w2"):
        w = inputs[name]
        inputs[name] = (torch.empty(*w.shape[:-1], w.shape[-1] // 2, dtype=torch.uint8, device="meta"),
                        torch.empty(*w.shape[:-1], w.shape[-1] // GROUP, dtype=torch.uint8, device="meta"))
    return _packed(inputs)


def abstract_outputs(x, offsets, w1, w1_scale, w3, w3_scale, w2, w2_scale, activation, beta, linear_beta, limit=None,
                     alpha=1.0, up_offset=0.0):
    """y [M, D] in x's dtype (the library op's fake implementation)."""
    return x.new_empty(x.shape[0], w2.shape[1])


def _multiples(shapes: list[Shape]) -> list[Shape]:
    return [{**s, "D": -(-s["D"] // GROUP) * GROUP, "F": -(-s["F"] // GROUP) * GROUP} for s in shapes]


SHAPES = {suite: _multiples(shapes) for suite, shapes in moe_grouped_gemm.SHAPES.items()}
"""moe_grouped_gemm's suites with D and F rounded up to whole groups of 32 (its routing cases: no rows, one row, one
hot expert, drops, mostly empty experts; SwiGLU and SiTU)."""


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """moe_grouped_gemm's three draws, D and F rounded up to whole groups."""
    return _multiples(moe_grouped_gemm.hidden_shapes(rng))


def work(s: Shape) -> tuple[Work, Work]:
    """moe_grouped_gemm's forward with its weights read at 4.25 bits each. No backward."""
    fwd, _ = moe_grouped_gemm.work(s)
    weights = 3 * s["E"] * s["F"] * s["D"]
    return replace(fwd, bytes=fwd.bytes - weights * (BF16 - PACKED_BYTES)), Work(0.0)


def onboard(model: ModelConfig) -> list[Found]:
    """The routed experts of a config whose quantization_config is compressed-tensors' MXFP4 packing, at
    moe_grouped_gemm's shapes. The config does not say which modules are quantized: the routed experts are
    assumed (Kimi's low-bit checkpoints quantize those alone), the rest served in bfloat16."""
    quant, q_field = model.field("quantization_config")
    if not (isinstance(quant, dict) and quant.get("format") == FORMAT):
        return []
    return [Found(f"routed experts' grouped GEMM over the published {FORMAT} weights (assumed: the routed experts "
                  f"alone are quantized)", found.layers, found.shapes, [*found.fields, q_field])
            for found in moe_grouped_gemm.onboard(model) if not found.differs]


SPEC = BlockSpec(
    name="moe_grouped_gemm_mxfp4",
    family="moe",
    summary="moe_grouped_gemm over MXFP4 weights as published (e2m1 pairs, an e8m0 scale per 32), dequantized in "
            "the kernel",
    reference=reference,
    make_inputs=make_inputs,
    abstract_inputs=abstract_inputs,
    grad_inputs=(),
    outputs=("y",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    abstract_outputs=abstract_outputs,
    onboard=onboard,
)
