"""rotary: the rotary position embedding (RoPE, Su et al. 2021) applied to queries or keys, in transformers' two
layouts and with partial rotary, as ``apply_rotary_pos_emb`` (rotate-half: NeoX, Llama, Qwen3-Next, the DSA indexer of
DeepSeek-V3.2) and ``apply_rotary_pos_emb_interleave`` (interleaved pairs: DeepSeek-V3's and GLM-MoE-DSA's MLA) apply
it to one tensor. For i < R / 2, with the pair

    half:         (x1, x2) = (x[i], x[i + R/2]),    (c1, s1, c2, s2) = (cos[i], sin[i], cos[i + R/2], sin[i + R/2])
    interleaved:  (x1, x2) = (x[2i], x[2i + 1]),    (c1, s1, c2, s2) = (cos[i], sin[i], cos[i], sin[i])

    y[i]         = x1 * c1 - x2 * s1
    y[i + R/2]   = x2 * c2 + x1 * s2
    y[R:]        = x[R:]                                  (partial rotary: the channels past cos's width pass)

With ``rope_last`` the rotated channels are the last R, x[D - R:], and the first D - R pass: an MLA query
[nope | rope] rotated whole, where transformers splits it, rotates the rope part and concatenates (DeepSeek-V3's,
DeepSeek-V3.2's and GLM-5's attention; vLLM's rotary op rotates that view of q in place).

so the interleaved form's output is in the half layout, as transformers returns it (q and k both: their dot products
are those of the interleaved rotation), and it reads the first half of cos and sin only, as transformers' does (they
are cat(freqs, freqs)). Math in float32 (float64 for float64 inputs), cast to x.dtype once.

Shapes: x [B, T, H, D] (H heads, or 1 for MLA's shared rope key), cos and sin [B, T, R] (R even, R <= D; the rotary
embedding module's output, in any float dtype), y [B, T, H, D]. Gradient: x only (cos and sin come from a
position-only module under no_grad):
    dx1 = dy[i] * c1 + dy[i + R/2] * s2,  dx2 = dy[i + R/2] * c2 - dy[i] * s1
written back at the pair's channels; dx[R:] = dy[R:]. Shape dims: B, T, H, D, R, ``interleaved`` and ``last``
(rope_last), each 0 or 1.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
              rope_last: bool = False) -> torch.Tensor:
    ct = compute_dtype(x)
    r = cos.shape[-1]
    if rope_last:
        passed, rope = x.split([x.shape[-1] - r, r], dim=-1)
        return torch.cat([passed, reference(rope, cos, sin, interleaved)], dim=-1)
    rot, passed = x[..., :r].to(ct), x[..., r:]
    if interleaved:  # pairs (2i, 2i + 1) -> (i, R/2 + i)
        rot = rot.unflatten(-1, (r // 2, 2)).transpose(-1, -2).flatten(-2)
    c, s = cos.to(ct)[:, :, None], sin.to(ct)[:, :, None]
    if interleaved:  # one angle a pair: the first half's
        c, s = (torch.cat([v[..., :r // 2], v[..., :r // 2]], dim=-1) for v in (c, s))
    x1, x2 = rot[..., :r // 2], rot[..., r // 2:]
    rotated = rot * c + torch.cat([-x2, x1], dim=-1) * s
    return torch.cat([rotated.to(x.dtype), passed], dim=-1)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [B, T, H, D] ~ N(0, 1); cos, sin [B, T, R] of a real rotary embedding (base 10000, the frequencies repeated
    over both halves as transformers builds them) at positions drawn per sequence (an offset up to 4096: a decode
    step's); interleaved and rope_last from the shape."""
    g = torch.Generator().manual_seed(seed)
    b, t, h, d, r = (shape[k] for k in ("B", "T", "H", "D", "R"))
    if r % 2 or r > d:
        raise ValueError(f"rotary: R={r} must be even and at most D={d}")
    x = torch.randn(b, t, h, d, generator=g)
    positions = torch.randint(0, 4096, (b, 1), generator=g) + torch.arange(t)
    inv_freq = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    angles = positions[..., None].double() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return {"x": x.to(device, dtype), "cos": angles.cos().to(device, dtype), "sin": angles.sin().to(device, dtype),
            "interleaved": bool(shape.get("interleaved", 0)), "rope_last": bool(shape.get("last", 0))}


SHAPES = {
    "smoke": [{"B": 1, "T": 8, "H": 4, "D": 16, "R": 16}, {"B": 2, "T": 9, "H": 3, "D": 64, "R": 64, "interleaved": 1},
              {"B": 2, "T": 5, "H": 2, "D": 40, "R": 16},
              {"B": 2, "T": 5, "H": 3, "D": 48, "R": 16, "interleaved": 1, "last": 1}],  # an MLA query's layout
    # one token; MLA's one shared rope key; partial rotary at Qwen3-Next's quarter; odd heads and a wide head; a
    # rotary width that is no power of two
    "edge": [
        {"B": 1, "T": 1, "H": 1, "D": 8, "R": 8},
        {"B": 3, "T": 7, "H": 1, "D": 64, "R": 64, "interleaved": 1},
        {"B": 1, "T": 6, "H": 5, "D": 256, "R": 64},
        {"B": 2, "T": 3, "H": 7, "D": 192, "R": 64, "interleaved": 1},
        {"B": 1, "T": 4, "H": 2, "D": 24, "R": 12},
        {"B": 1, "T": 3, "H": 3, "D": 2, "R": 2, "interleaved": 1},
        {"B": 1, "T": 5, "H": 3, "D": 192, "R": 64, "interleaved": 1, "last": 1},  # DeepSeek-V3's query
        {"B": 2, "T": 3, "H": 2, "D": 40, "R": 12, "last": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes: a full rotary in either layout, and a partial one (R a multiple of 2 up to D, first or last)."""
    def size(d: int) -> dict:
        return {"B": rng.randint(1, 3), "T": rng.randint(1, 20), "H": rng.randint(1, 9), "D": d}
    d = 2 * rng.randint(1, 64)
    partial = 2 * rng.randint(2, 96)
    return [{**size(d), "R": d, "interleaved": rng.randint(0, 1)},
            {**size(partial), "R": 2 * rng.randint(1, partial // 2), "interleaved": rng.randint(0, 1),
             "last": rng.randint(0, 1)}]


def work(s: Shape) -> tuple[Work, Work]:
    """x read, y written (bf16); cos and sin read once per token (float32 in the models' rotary modules' dtype: bf16
    here); 3 flops per rotated element (two products and a sum)."""
    e, rotated = s["B"] * s["T"] * s["H"] * s["D"], s["B"] * s["T"] * s["H"] * s["R"]
    angles = BF16 * 2 * s["B"] * s["T"] * s["R"]
    return Work(BF16 * 2 * e + angles, vector_flops=3 * rotated), Work(BF16 * 2 * e + angles, vector_flops=3 * rotated)


def onboard(model: ModelConfig) -> list[Found]:
    """The rotations of the attention layers where the family's class rotates them through this block (the class
    view): MLA's rope parts, else softmax attention's queries and keys."""
    return _mla(model) or _softmax(model)


def _mla(model: ModelConfig) -> list[Found]:
    """The MLA layers' queries [nope | rope], rotated whole (rope_last), and shared rope key (qk_rope_head_dim
    wide): DeepSeek-V3's, DeepSeek-V3.2's and GLM-5's attention, never Kimi's NoPE MLA; interleaved pairs where the
    class reads rope_interleave, else both layouts (DeepSeek-V3.2 rotates its attention by pairs and its indexer by
    halves)."""
    rope, rope_field = model.class_value("qk_rope_head_dim", "rotary")
    if not model.full_layers or not rope:
        return []
    nope, nope_field = model.class_value("qk_nope_head_dim", "rotary")
    interleave, interleave_field = model.class_value("rope_interleave", "rotary")
    layouts = [int(bool(interleave))] if interleave is not None else [1, 0]
    query = {"B": 1, "T": model.tokens, "H": model.heads, "D": (nope or 0) + rope, "R": rope, "last": 1}
    key = {**query, "H": 1, "D": rope}
    return [Found("the rotary embedding of the MLA layers' queries (their rope part last) and shared rope key ("
                  + ("interleaved pairs" if layouts == [1] else "rotate-half" if layouts == [0] else "both layouts")
                  + ")", model.full_layers,
                  [{**shape, "interleaved": layout} for layout in layouts for shape in (query, key)],
                  [rope_field, nope_field, interleave_field, model.heads_field])]


def _softmax(model: ModelConfig) -> list[Found]:
    """The queries and keys of softmax-attention layers (no MLA latent) rotated by halves (transformers'
    apply_rotary_pos_emb), on the first head_dim x partial_rotary_factor channels (the rotary module's width, a
    whole head unless the config's rope parameters or partial_rotary_factor say less)."""
    rope_parameters, rope_field = model.class_value("rope_parameters", "rotary")
    if not model.full_layers or not model.heads or model.integer("kv_lora_rank")[0] or rope_parameters is None:
        return []
    kv_heads, kv_field = model.integer("num_key_value_heads")
    head_dim, dim_field = model.integer("head_dim")
    d = head_dim or model.head_dim or model.hidden // model.heads
    factor = (rope_parameters or {}).get("partial_rotary_factor") or model.field("partial_rotary_factor")[0] or 1.0
    r = int(d * factor) // 2 * 2
    return [Found(f"the rotary embedding of the softmax-attention layers' queries and keys (rotate-half"
                  f"{f', {r} of {d} channels' if r < d else ''})", model.full_layers,
                  [{"B": 1, "T": model.tokens, "H": heads, "D": d, "R": r, "interleaved": 0}
                   for heads in dict.fromkeys((model.heads, kv_heads or model.heads))],
                  [rope_field, model.heads_field, kv_field, dim_field])]


SPEC = BlockSpec(
    name="rotary",
    family="attention",
    summary="rotary position embedding on q or k: rotate-half or interleaved pairs (as transformers' "
            "apply_rotary_pos_emb and its _interleave form), partial rotary, the rope part first or last; float32 math",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x",),
    outputs=("y",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
)
