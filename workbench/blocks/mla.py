"""mla: the attention of multi-head latent attention (DeepSeek-V2/V3; Kimi K3's full-attention layers) from the
compressed kv latent, with Kimi's optional output gate.

The layer around it (``layer_reference``): c_q = RMSNorm(W_dq x), q = W_uq c_q split per head into a nope part
(DN) and a rope part (DR); c_kv = RMSNorm(W_dkv x) (rank R), k_rope = W_kr x (DR, one key shared by every head);
RoPE on q's rope part and k_rope (interleaved pairs, DeepSeek) unless the model runs without it (Kimi's
``mla_use_nope``: position comes from the KDA layers). The norms are the ``rmsnorm`` block and the projections are
plain GEMMs; this block is what is left, the part every MLA kernel (FlashMLA) fuses:

    k_nope[b, s, h] = W_uk[h] c_kv[b, s]            [DN]      v[b, s, h] = W_uv[h] c_kv[b, s]      [DV]
    score[b, h, t, s] = scale * (q[b, t, h, :DN] . k_nope[b, s, h] + q[b, t, h, DN:] . k_rope[b, s])   (s <= t)
    o[b, t, h] = sum_s softmax_s(score) v[b, s, h]
    out = o * sigmoid(gate)  (gate given: Kimi's ``mla_use_output_gate``, gate = g_proj(x) per head)   or   out = o

computed in float32 (float64 for float64 inputs), cast to q.dtype once. ``absorbed`` is the decode form (FlashMLA):
W_uk folded into the query and W_uv into the output, an MQA over keys [c_kv | k_rope] (R + DR) and values c_kv (R);
it equals ``reference`` (tests/blocks/test_mla.py).

Shapes: q [B, T, H, DN + DR], c_kv [B, T, R], k_rope [B, T, DR], w_uk [H, DN, R], w_uv [H, DV, R],
gate [B, T, H, DV] or None, scale a float; out [B, T, H, DV]. Gradients: q, c_kv, k_rope, w_uk, w_uv and gate.
Real sizes (Kimi K3): H 96, R 512, DN 128, DR 64, DV 128, scale 192^-0.5.
Inputs (make_inputs): q, c_kv, k_rope ~ N(0, 1) (c_kv is an RMSNorm output: unit RMS), w_uk, w_uv ~ N(0, 1/R) so
that k_nope and v are O(1) like the scores; gate pre-activations ~ N(0, 1.5^2) (both sigmoid tails).
"""

from __future__ import annotations

import math
import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._dsa import causal_mask
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.blocks.rmsnorm import reference as rmsnorm
from workbench.numerics import compute_dtype


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax attention per head: q [B,T,H,Dk], k [B,T,H or 1,Dk], v [B,T,H or 1,Dv] -> [B,T,H,Dv]."""
    logits = torch.einsum("bthd,bshd->bhts", q, k.expand(-1, -1, q.shape[2], -1)) * scale
    logits = logits.masked_fill(~causal_mask(q.shape[1], q.device), float("-inf"))
    return torch.einsum("bhts,bshd->bthd", torch.softmax(logits, dim=-1), v.expand(-1, -1, q.shape[2], -1))


def reference(q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor,
              gate: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The decompressed (training) form: per-head keys and values expanded from the latent."""
    ct = compute_dtype(q)
    c = c_kv.to(ct)
    k_nope = torch.einsum("btr,hdr->bthd", c, w_uk.to(ct))
    v = torch.einsum("btr,hdr->bthd", c, w_uv.to(ct))
    k = torch.cat([k_nope, k_rope.to(ct)[:, :, None, :].expand(-1, -1, q.shape[2], -1)], dim=-1)
    out = _attend(q.to(ct), k, v, scale)
    if gate is not None:
        out = out * torch.sigmoid(gate.to(ct))
    return out.to(q.dtype)


def absorbed(q: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor,
             gate: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The absorbed (decode) form: q_lat = q_nope W_uk per head, an MQA over [c_kv | k_rope] with values c_kv, then
    o = o_lat W_uv^T per head; equal to ``reference`` in exact arithmetic."""
    ct = compute_dtype(q)
    dn = w_uk.shape[1]
    qc = q.to(ct)
    q_lat = torch.einsum("bthd,hdr->bthr", qc[..., :dn], w_uk.to(ct))
    keys = torch.cat([c_kv.to(ct), k_rope.to(ct)], dim=-1)[:, :, None, :]  # one key per token for every head
    o_lat = _attend(torch.cat([q_lat, qc[..., dn:]], dim=-1), keys, c_kv.to(ct)[:, :, None, :], scale)
    out = torch.einsum("bthr,hdr->bthd", o_lat, w_uv.to(ct))
    if gate is not None:
        out = out * torch.sigmoid(gate.to(ct))
    return out.to(q.dtype)


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE on interleaved pairs (DeepSeek/Kimi MLA): x [B, T, ..., D] (D even), positions [T] -> same shape."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angle = positions.to(torch.float64)[:, None] * inv[None, :]  # [T, D/2]
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 3) + (d // 2,)
    cos, sin = angle.cos().to(x.dtype).view(shape), angle.sin().to(x.dtype).view(shape)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def layer_reference(x: torch.Tensor, weights: dict[str, torch.Tensor], heads: int, dn: int, dr: int, *,
                    rope: bool, eps: float = 1e-5, attention=reference) -> torch.Tensor:
    """A whole MLA layer before its output projection: x [B, T, D] -> [B, T, H, DV], with ``attention`` (this
    block's reference, or an operator's ``run``) for the part this block covers.

    weights: w_dq [QL, D], q_norm [QL], w_uq [H * (DN + DR), QL], w_dkv [R, D], kv_norm [R], w_kr [DR, D],
    w_uk [H, DN, R], w_uv [H, DV, R], and w_g [H * DV, D] for the output gate (absent: no gate)."""
    b, t, _ = x.shape
    c_q = rmsnorm(x @ weights["w_dq"].T, weights["q_norm"], eps)
    q = (c_q @ weights["w_uq"].T).view(b, t, heads, dn + dr)
    c_kv = rmsnorm(x @ weights["w_dkv"].T, weights["kv_norm"], eps)
    k_rope = x @ weights["w_kr"].T
    if rope:
        positions = torch.arange(t, device=x.device)
        q = torch.cat([q[..., :dn], rope_interleaved(q[..., dn:], positions)], dim=-1)
        k_rope = rope_interleaved(k_rope, positions)
    gate = (x @ weights["w_g"].T).view(b, t, heads, -1) if "w_g" in weights else None
    return attention(q, c_kv, k_rope, weights["w_uk"], weights["w_uv"], gate, (dn + dr) ** -0.5)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q [B,T,H,DN+DR], c_kv [B,T,R], k_rope [B,T,DR] ~ N(0, 1); w_uk [H,DN,R], w_uv [H,DV,R] ~ N(0, 1/R);
    gate [B,T,H,DV] ~ N(0, 1.5^2) (None when ``gated`` is 0); scale = (DN + DR)^-0.5."""
    g = torch.Generator().manual_seed(seed)
    B, T, H, R, DN, DR, DV = (shape[n] for n in ("B", "T", "H", "R", "DN", "DR", "DV"))
    q = torch.randn(B, T, H, DN + DR, generator=g)
    c_kv = torch.randn(B, T, R, generator=g)
    k_rope = torch.randn(B, T, DR, generator=g)
    w_uk = torch.randn(H, DN, R, generator=g) / math.sqrt(R)
    w_uv = torch.randn(H, DV, R, generator=g) / math.sqrt(R)
    gate = 1.5 * torch.randn(B, T, H, DV, generator=g)
    cast = {"device": device, "dtype": dtype}
    return {"q": q.to(**cast), "c_kv": c_kv.to(**cast), "k_rope": k_rope.to(**cast), "w_uk": w_uk.to(**cast),
            "w_uv": w_uv.to(**cast), "gate": gate.to(**cast) if shape.get("gated", 1) else None,
            "scale": (DN + DR) ** -0.5}


SHAPES = {
    "smoke": [
        {"B": 1, "T": 32, "H": 2, "R": 32, "DN": 16, "DR": 16, "DV": 16, "gated": 1},
        {"B": 2, "T": 40, "H": 3, "R": 64, "DN": 32, "DR": 16, "DV": 32, "gated": 0},
    ],
    # one token; a tail past a 64-token block with head dims that are no power of two; one head with a latent
    # narrower than its heads and a small rope part; values wider than the keys' nope part
    "edge": [
        {"B": 1, "T": 1, "H": 2, "R": 16, "DN": 16, "DR": 8, "DV": 16, "gated": 1},
        {"B": 2, "T": 77, "H": 2, "R": 48, "DN": 24, "DR": 8, "DV": 20, "gated": 1},
        {"B": 1, "T": 33, "H": 1, "R": 16, "DN": 32, "DR": 4, "DV": 16, "gated": 0},
        {"B": 1, "T": 19, "H": 3, "R": 40, "DN": 16, "DR": 16, "DV": 48, "gated": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """A gated and an ungated shape within the suites' ranges."""
    return [{"B": rng.randint(1, 2), "T": rng.randint(1, 80), "H": rng.randint(1, 3), "R": rng.randint(16, 64),
             "DN": rng.randint(8, 32), "DR": rng.randint(4, 16), "DV": rng.randint(8, 48), "gated": gated}
            for gated in (1, 0)]


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """Causal attention from the kv latent: k_nope and v from c_kv by the per-head up-projections (2 T R (DN+DV)
    per head), then attention over half the T^2 pairs of (DN+DR)-wide keys and DV-wide values."""
    b, t, h, r = s["B"], s["T"], s["H"], s["R"]
    dn, dr, dv = s["DN"], s["DR"], s["DV"]
    up = 2 * b * t * h * r * (dn + dv)
    attn = 2 * b * h * t * t // 2 * (dn + dr + dv)
    inputs = BF16 * (b * t * h * (dn + dr) + b * t * (r + dr) + h * r * (dn + dv) + s.get("gated", 0) * b * t * h * dv)
    outputs = BF16 * b * t * h * dv
    return Work(inputs + outputs, up + attn), Work(2 * inputs + outputs, 2 * up + int(2.5 * attn))


def onboard(model: ModelConfig) -> list[Found]:
    """The full-attention layers of a config with kv_lora_rank: the attention from the latent (the q and kv
    down-projections' norms are rmsnorm's shapes)."""
    if not model.full_layers:
        return []
    rank, rank_field = model.integer("kv_lora_rank")
    if not rank:
        return []
    q_field = model.integer("q_lora_rank")[1]
    rope, rope_field = model.integer("qk_rope_head_dim")
    nope, nope_field = model.integer("qk_nope_head_dim")
    v_dim, v_field = model.integer("v_head_dim")
    gate, gate_field = model.field("mla_use_output_gate")
    no_rope, no_rope_field = model.field("mla_use_nope")
    shape = {"B": 1, "T": model.tokens, "H": model.heads, "R": rank, "DN": nope or model.head_dim, "DR": rope or 0,
             "DV": v_dim or nope or model.head_dim, "gated": int(bool(gate))}
    role = ("multi-head latent attention" + (" with an output gate" if gate else "") +
            (", no rotary embedding (mla_use_nope)" if no_rope else ""))
    return [Found(role, model.full_layers, [shape], [rank_field, q_field, rope_field, nope_field, v_field, gate_field,
                                                     no_rope_field, model.heads_field])]


SPEC = BlockSpec(
    name="mla",
    family="attention",
    summary="multi-head latent attention from the kv latent (per-head up-projections, shared rope key, causal), "
            "optional sigmoid output gate",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("q", "c_kv", "k_rope", "w_uk", "w_uv", "gate"),
    outputs=("out",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    onboard=onboard,
    replay="M",
)
