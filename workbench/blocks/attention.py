"""attention: causal softmax attention with grouped KV heads, the block every transformer family has (Llama, Qwen,
Mistral, Gemma, GPT-OSS; the full-attention layers of Qwen3-Next and the other hybrids), with the variants the
published code passes to its attention function (transformers' ``eager_attention_forward`` and the
``AttentionInterface`` functions): a sliding window, learnt per-head sinks, a logit soft cap, an explicit scale, and
Inkling2's per-token sinks and relative-position logits.

For query t (at position t + TK - TQ: the queries are the last TQ of the TK keys, FlashAttention's bottom-right
alignment, which is how a query chunk attends over a cache) of head h, whose KV head is h // (H / HKV):

    s_j  = scale * q[b, t, h] . k[b, j, h // G]                       j = 0 .. TK - 1
    s_j  = softcap * tanh(s_j / softcap)                              when softcap > 0 (Gemma 2)
    s_j += rel[b, t, h, t + TK - TQ - j]                              when 0 <= t + TK - TQ - j < E (Inkling2's
                                                                        relative logits: a bias per backward distance)
    seen = j <= t + TK - TQ   and   j > t + TK - TQ - window           (window > 0: the last ``window`` keys, itself
                                                                        included: transformers' sliding_window)
    out[b, t, h] = sum_{j seen} exp(s_j) v[b, j, h // G] / (sum_{j seen} exp(s_j) + exp(sink))
                  sink = sinks[h] (GPT-OSS) or sinks[b, t, h] (Inkling2's sink_proj); no sink term without sinks

computed in float32 (float64 for float64 inputs), cast to q.dtype once. A sink is a logit with a zero value: it only
takes probability mass, and its gradient is -exp(sink - lse) (dO . O) (summed over the batch and the queries for a
head's sink). A relative logit's gradient is its score's, dS = P (dO . V - dO . O), at the one key it reaches.

Shapes: q [B, TQ, H, D], k and v [B, TK, HKV, D] with TQ <= TK and H a multiple of HKV (MHA: HKV = H; MQA: 1);
sinks [H] or [B, TQ, H] float, or None; scale a float; window an int (0: none); softcap a float (0: none); rel
[B, TQ, H, E] float or None (E: the distances it covers). out [B, TQ, H, D].
Gradients: q, k, v, sinks, rel (a KV head's dk and dv summed over its query group).
Real sizes: Qwen3-Next-80B-A3B 16 heads, 2 KV heads, head_dim 256 (12 of 48 layers); GPT-OSS-120B 64 heads, 8 KV,
64 wide, window 128 on every other layer, sinks; Gemma 2 soft cap 50; Inkling2 per-token sinks and relative logits
over the window on its sliding layers (E = window) and over rel_extent distances on its full layers.
Inputs (make_inputs): q, k, v ~ N(0, 1); scale D^-0.5; sinks ~ N(1, 1) (a sink near the scores' range, so it takes a
share worth checking); rel ~ N(0, 1); with a soft cap, q ~ N(0, 4) so that the cap bends the scores.
"""

from __future__ import annotations

import random

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Peer, Shape, Work
from workbench.numerics import compute_dtype


def seen_keys(tq: int, tk: int, window: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[TQ, TK] bool: the keys each query sees (causal, bottom-right aligned; the last ``window`` when window > 0)."""
    t = torch.arange(tq, device=device)[:, None] + (tk - tq)
    j = torch.arange(tk, device=device)[None, :]
    seen = j <= t
    return seen & (j > t - window) if window > 0 else seen


def relative_bias(rel: torch.Tensor, tk: int) -> torch.Tensor:
    """[B, H, TQ, TK]: rel [B, TQ, H, E] at each (query, key) pair's backward distance t + TK - TQ - j, 0 outside
    0 <= distance < E (Inkling2RelativeLogits' dense bias)."""
    b, tq, h, extent = rel.shape
    distance = torch.arange(tq, device=rel.device)[:, None] + (tk - tq) - torch.arange(tk, device=rel.device)[None, :]
    near = (distance >= 0) & (distance < extent)
    bias = rel.transpose(1, 2).gather(-1, distance.clamp(0, extent - 1).expand(b, h, tq, tk))
    return bias.masked_fill(~near, 0.0)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, scale: float,
              window: int, softcap: float, rel: torch.Tensor | None = None) -> torch.Tensor:
    """The formula above with every KV head repeated over its query group (transformers' ``repeat_kv``)."""
    ct = compute_dtype(q)
    b, tq, h, _ = q.shape
    tk, group = k.shape[1], h // k.shape[2]
    keys, values = (x.to(ct).repeat_interleave(group, dim=2) for x in (k, v))
    s = torch.einsum("bthd,bshd->bhts", q.to(ct), keys) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if rel is not None:
        s = s + relative_bias(rel.to(ct), tk)
    s = s.masked_fill(~seen_keys(tq, tk, window, q.device), float("-inf"))
    if sinks is not None:
        sink = sinks.to(ct).view(1, h, 1, 1).expand(b, h, tq, 1) if sinks.dim() == 1 else \
            sinks.to(ct).permute(0, 2, 1).unsqueeze(-1)
        s = torch.cat([s, sink], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :tk]
    return torch.einsum("bhts,bshd->bthd", p, values).to(q.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """q [B,TQ,H,D], k and v [B,TK,HKV,D] ~ N(0, 1) (q ~ N(0, 4) under a soft cap); sinks ~ N(1, 1), [H] where the
    shape's ``sinks`` is 1, [B,TQ,H] where 2, else None; rel [B,TQ,H,E] ~ N(0, 1) where the shape's ``rel`` is E > 0,
    else None."""
    g = torch.Generator().manual_seed(seed)
    b, tq, tk, h, hkv, d = (shape[n] for n in ("B", "TQ", "TK", "H", "HKV", "D"))
    softcap, kind, extent = float(shape.get("softcap", 0)), int(shape.get("sinks", 0)), int(shape.get("rel", 0))
    q = torch.randn(b, tq, h, d, generator=g) * (2.0 if softcap else 1.0)
    k = torch.randn(b, tk, hkv, d, generator=g)
    v = torch.randn(b, tk, hkv, d, generator=g)
    sinks = torch.randn(*((b, tq, h) if kind == 2 else (h,)), generator=g) + 1.0
    rel = torch.randn(b, tq, h, extent, generator=g) if extent else None
    cast = {"device": device, "dtype": dtype}
    return {"q": q.to(**cast), "k": k.to(**cast), "v": v.to(**cast), "sinks": sinks.to(**cast) if kind else None,
            "scale": d ** -0.5, "window": int(shape.get("window", 0)), "softcap": softcap,
            "rel": rel.to(**cast) if rel is not None else None}


SHAPES = {
    "smoke": [
        {"B": 1, "TQ": 40, "TK": 40, "H": 4, "HKV": 2, "D": 32, "window": 0, "sinks": 0, "softcap": 0},
        {"B": 2, "TQ": 24, "TK": 24, "H": 2, "HKV": 1, "D": 16, "window": 9, "sinks": 1, "softcap": 0},
        # Inkling2's sliding layers: per-token sinks, relative logits over the window
        {"B": 2, "TQ": 20, "TK": 20, "H": 4, "HKV": 2, "D": 16, "window": 8, "sinks": 2, "rel": 8, "softcap": 0},
    ],
    # one token; a query chunk over a longer cache (generate) with a head size no power of two; MHA with a soft cap
    # and a window wider than the sequence; a window of one (each query sees itself) with sinks over 80-wide heads;
    # Inkling2's full layers as a query chunk over a cache, relative logits reaching part of the keys; and relative
    # logits past the sequence under a soft cap
    "edge": [
        {"B": 1, "TQ": 1, "TK": 1, "H": 2, "HKV": 2, "D": 16, "window": 0, "sinks": 1, "softcap": 0},
        {"B": 2, "TQ": 5, "TK": 70, "H": 6, "HKV": 2, "D": 24, "window": 0, "sinks": 0, "softcap": 0},
        {"B": 1, "TQ": 33, "TK": 33, "H": 3, "HKV": 3, "D": 16, "window": 50, "sinks": 0, "softcap": 3},
        {"B": 1, "TQ": 20, "TK": 20, "H": 2, "HKV": 1, "D": 80, "window": 1, "sinks": 1, "softcap": 0},
        {"B": 2, "TQ": 7, "TK": 45, "H": 4, "HKV": 1, "D": 32, "window": 0, "sinks": 2, "rel": 12, "softcap": 0},
        {"B": 1, "TQ": 17, "TK": 17, "H": 2, "HKV": 2, "D": 16, "window": 0, "sinks": 0, "rel": 40, "softcap": 4},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """A plain and a variant shape (window, sinks per head or per token, relative logits and soft cap drawn) within
    the suites' ranges."""
    shapes = []
    for variant in (0, 1):
        hkv = rng.randint(1, 3)
        tk = rng.randint(1, 72)
        shapes.append({"B": rng.randint(1, 2), "TQ": rng.randint(1, tk), "TK": tk, "H": hkv * rng.randint(1, 3),
                       "HKV": hkv, "D": rng.choice([16, 24, 32, 40, 48]),
                       "window": rng.randint(1, 40) * variant, "sinks": variant * rng.randint(0, 2),
                       "rel": variant * rng.choice([0, rng.randint(1, 48)]),
                       "softcap": variant * rng.choice([0, 2, 5])})
    return shapes


# --- peers (what users would run instead; timed beside the operator on a GPU: workbench.perf.bench) -------------

def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, scale: float, window: int,
         softcap: float, rel: torch.Tensor | None = None) -> torch.Tensor:
    """torch's scaled_dot_product_attention (its FlashAttention, cuDNN or memory-efficient backend), causal, GQA; a
    window or a query chunk over a cache as a boolean mask (which the flash backend does not take). No sinks, no soft
    cap, no relative logits: NotImplementedError."""
    if sinks is not None or softcap > 0 or rel is not None:
        raise NotImplementedError("torch SDPA has no attention sinks, logit soft cap or relative logits")
    tq, tk = q.shape[1], k.shape[1]
    mask = seen_keys(tq, tk, window, q.device) if window or tq != tk else None
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=mask is None, scale=scale,
        enable_gqa=True)
    return out.transpose(1, 2)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, scale: float, window: int,
         softcap: float, rel: torch.Tensor | None = None) -> torch.Tensor:
    """FlexAttention (torch.nn.attention.flex_attention, compiled on a GPU): the causal window as a block mask, the
    soft cap and the relative logits as a score_mod (FA4's form of Inkling2's bias), GQA; sinks, per head or per
    token, by its log-sum-exp (out * sigmoid(lse - sink): the sink's share of the denominator taken out)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    tq, tk = q.shape[1], k.shape[1]
    offset = tk - tq

    def seen(b, h, t, j):
        causal = j <= t + offset
        return causal & (j > t + offset - window) if window > 0 else causal

    def modified(score, b, h, t, j):
        if softcap > 0:
            score = softcap * torch.tanh(score / softcap)
        if rel is not None:
            distance = t + offset - j
            near = (distance >= 0) & (distance < rel.shape[-1])
            score = score + torch.where(near, rel[b, t, h, distance.clamp(0, rel.shape[-1] - 1)], 0.0)
        return score

    run = torch.compile(flex_attention) if q.is_cuda else flex_attention
    mask = create_block_mask(seen, None, None, tq, tk, device=q.device.type)
    out, lse = run(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                   score_mod=modified if softcap > 0 or rel is not None else None, block_mask=mask, scale=scale,
                   enable_gqa=True, return_lse=True)
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1) if sinks.dim() == 1 else sinks.float().transpose(1, 2)
        out = out * torch.sigmoid(lse - sink).unsqueeze(-1).to(out.dtype)
    return out.transpose(1, 2)


def flash_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, scale: float,
               window: int, softcap: float, rel: torch.Tensor | None = None) -> torch.Tensor:
    """flash-attn's flash_attn_func (FlashAttention-2/3): causal (bottom-right aligned), GQA, window_size=(window -
    1, 0), softcap. No sinks, no relative logits: NotImplementedError."""
    if sinks is not None or rel is not None:
        raise NotImplementedError("flash_attn_func has no attention sinks or relative logits")
    from flash_attn import flash_attn_func

    return flash_attn_func(q, k, v, softmax_scale=scale, causal=True,
                           window_size=(window - 1, 0) if window > 0 else (-1, -1), softcap=softcap)


def fla_parallel_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None, scale: float,
                      window: int, softcap: float, rel: torch.Tensor | None = None) -> torch.Tensor:
    """fla's parallel_attn (Triton): causal, GQA, window_size, GPT-OSS's sinks (sink_bias). No soft cap, no
    per-token sinks, no relative logits and no query chunk over a longer cache: NotImplementedError."""
    if softcap > 0 or q.shape[1] != k.shape[1] or rel is not None or (sinks is not None and sinks.dim() != 1):
        raise NotImplementedError("fla parallel_attn has no logit soft cap, per-token sinks or relative logits, and "
                                  "its queries are its keys")
    from fla.ops.attn.parallel import parallel_attn

    return parallel_attn(q, k, v, scale=scale, window_size=window or None, sink_bias=sinks)


# --- work (the cost model) ---------------------------------------------------------------------------------

def seen_pairs(tq: int, tk: int, window: int) -> int:
    """How many (query, key) pairs ``seen_keys`` admits, in closed form: query rows see a = TK - TQ + 1 .. TK keys,
    each capped at the window."""
    first, last = tk - tq + 1, tk
    cap = window if window > 0 else last
    below = min(last, cap)  # rows that see all their causal keys
    uncapped = (below * (below + 1) - (first - 1) * first) // 2 if below >= first else 0
    return uncapped + cap * max(0, last - max(first, cap + 1) + 1)


def work(s: Shape) -> tuple[Work, Work]:
    """QK^T and PV over the pairs the queries see (2 D flops each per head, twice); the backward recomputes the
    scores and forms dV, dP, dQ and dK (2.5 times the forward's products, FlashAttention-2's count); exp per pair."""
    b, tq, tk, h, hkv, d = (s[n] for n in ("B", "TQ", "TK", "H", "HKV", "D"))
    pairs = b * h * seen_pairs(tq, tk, s.get("window", 0))
    flops = 4 * pairs * d
    q_out = BF16 * b * tq * h * d
    kv = BF16 * 2 * b * tk * hkv * d
    per_row = BF16 * b * tq * h * (s.get("rel", 0) + (s.get("sinks", 0) == 2))  # relative logits, per-token sinks
    forward = Work(2 * q_out + kv + per_row, flops, 2 * pairs)
    backward = Work(3 * q_out + 2 * kv + 2 * q_out + 2 * per_row, int(2.5 * flops), 3 * pairs)
    return forward, backward


def serving_variant(shape: Shape) -> str:
    """How a training shape's variant differs from what the serving forms (attention_prefill, attention_decode)
    compute, "" when it does not: they have per-head sinks and no relative logits. A shape that differs gives them
    no size: they do not run that model's attention."""
    if shape.get("rel") or shape.get("sinks") == 2:
        return ("per-token sinks and relative logits (Inkling2): the serving forms have per-head sinks and no "
                "relative logits")
    return ""


SLIDING_KINDS = ("sliding_attention", "hybrid_sliding")
"""layer_types entries of a sliding-window softmax-attention layer (Inkling2's: hybrid_sliding)."""
FULL_KINDS = ("full_attention", "hybrid")
"""layer_types entries of a full softmax-attention layer (Inkling2's: hybrid)."""


def onboard(model: ModelConfig) -> list[Found]:
    """The softmax-attention layers of a config without an MLA latent (kv_lora_rank): heads, KV heads and head size
    (a sliding layer's own where the config gives them: swa_*), a sliding window (sliding_window, or Inkling2's
    sliding_window_size, on the layers layer_types marks sliding), sinks (GPT-OSS's per head; per token where the
    config has relative logits), a logit soft cap (attn_logit_softcapping) and Inkling2's relative logits
    (rel_extent distances on its full layers, the window on its sliding ones), one shape per kind of layer."""
    if not model.full_layers or model.integer("kv_lora_rank")[0] or not model.heads:
        return []
    kv_heads, kv_field = model.integer("num_key_value_heads")
    head_dim, dim_field = model.integer("head_dim")
    window, window_field = model.integer("sliding_window", "sliding_window_size")
    softcap, softcap_field = model.field("attn_logit_softcapping")
    types, types_field = model.field("layer_types")
    extent, extent_field = model.integer("rel_extent")
    sinks = 2 if extent else int(model.field("model_type")[0] == "gpt_oss")
    kinds: dict[int, int] = {}
    for kind in (types if isinstance(types, list) else []):
        if kind in SLIDING_KINDS + FULL_KINDS:
            w = window or 0 if kind in SLIDING_KINDS else 0
            kinds[w] = kinds.get(w, 0) + 1
    if not kinds:
        kinds = {window or 0: model.full_layers}
    base = {"B": 1, "TQ": model.tokens, "TK": model.tokens, "H": model.heads, "HKV": kv_heads or model.heads,
            "D": head_dim or model.head_dim or model.hidden // model.heads, "sinks": sinks,
            "softcap": int(softcap or 0)}
    swa = {"H": model.integer("swa_num_attention_heads"), "HKV": model.integer("swa_num_key_value_heads"),
           "D": model.integer("swa_head_dim")}
    fields = [model.heads_field, kv_field, dim_field, window_field, softcap_field, types_field, extent_field]
    found = []
    for w, layers in sorted(kinds.items()):
        shape = {**base, "window": w, **({n: v for n, (v, _) in swa.items() if v} if w else {})}
        if extent:
            shape["rel"] = w or extent
        sink_kind = ", per-token sinks" if sinks == 2 else ", learnt sinks" if sinks else ""
        found.append(Found(f"causal softmax attention{f', a {w}-token sliding window' if w else ''}{sink_kind}"
                           f"{', logit soft cap' if softcap else ''}{', relative logits' if extent else ''}", layers,
                           [shape], fields + ([f for _, f in swa.values() if f] if w else [])))
    return found


SPEC = BlockSpec(
    name="attention",
    family="attention",
    summary="causal softmax attention over grouped KV heads (MHA, GQA, MQA) with the published variants: a sliding "
            "window, learnt per-head or per-token sinks, a logit soft cap, relative-position logits, an explicit "
            "scale; queries may be the last of the keys",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("q", "k", "v", "sinks", "rel"),
    outputs=("out",),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    work=work,
    peers=(Peer("torch sdpa", "torch", sdpa), Peer("flex_attention", "torch", flex),
           Peer("flash-attn", "flash_attn", flash_attn), Peer("fla parallel_attn", "fla", fla_parallel_attn)),
    onboard=onboard,
)
