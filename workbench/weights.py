"""A model's weights by part, from its config: parameter counts and their bytes in bfloat16 and as the checkpoint is
published (the routed experts in MXFP4 where the config's quantization_config says so).

Modelled: the counts are formulas over the config's fields (below), held to the parameter count of the transformers
class built on the meta device wherever that class reads every field the formula uses (tests/test_weights.py:
Kimi Linear 48B, DeepSeek-V3 671B, DeepSeek-V3.2; Kimi K3 to the parameters of workbench.kimi_k3's model, K3's
published serving code, built on the meta device). Parts a transformers class does not build are counted from the
fields that name them and say so in their note.
Norm weights are counted; buffers (the routers' score-correction biases) are not, as transformers counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.blocks._config import ModelConfig
from workbench.blocks.moe_grouped_gemm_mxfp4 import FORMAT as MXFP4_FORMAT
from workbench.blocks.moe_grouped_gemm_mxfp4 import PACKED_BYTES

BYTES_PER_WEIGHT = {"bf16": 2.0, "mxfp4": PACKED_BYTES}
"""Bytes per weight by storage format (MXFP4: 4 bits and a 32nd of an e8m0 byte)."""


@dataclass(frozen=True)
class Part:
    """One part of the model: its parameters (all layers), the storage format of the published checkpoint and how
    the count was reached."""

    name: str
    params: int
    fmt: str = "bf16"
    note: str = ""

    @property
    def bytes(self) -> float:
        return self.params * BYTES_PER_WEIGHT[self.fmt]


def parts(model: ModelConfig) -> list[Part]:
    """The model's parts with their parameter counts (zero-sized parts left out)."""
    d = model.hidden
    tied = bool(model.field("tie_word_embeddings")[0])
    found = [Part("embedding", (model.vocab or 0) * d),
             Part("lm_head", 0 if tied else (model.vocab or 0) * d, note="tied to the embedding" if tied else ""),
             Part("norms", d * (2 * model.layers + 1), note="two per layer and the final norm")]
    found += _kda(model) + _attention(model) + _ffns(model)
    if model.integer("attn_res_block_size")[0]:
        found.append(Part("attnres", d * (4 * model.layers + 2), note="per layer two pseudo-queries and two key "
                          "norms, and the final AttnRes's pair (vLLM kimi_k3: *_res_proj, *_res_norm)"))
    return [part for part in found if part.params]


def uncounted(model: ModelConfig) -> list[str]:
    """Parts of the model the config names that the formulas do not count."""
    names = []
    mtp, mtp_field = model.integer("num_nextn_predict_layers")
    if mtp:
        names.append(f"{mtp} multi-token-prediction layer(s) ({mtp_field}; published totals leave them out too)")
    if isinstance(model.field("vision_config")[0], dict):
        names.append("the vision tower (vision_config)")
    linear = _linear_layers(model)
    if linear:
        names.append(f"{linear} linear-attention layers of a kind other than KDA (layer_types)")
    return names


LINEAR_KINDS = ("linear", "mamba", "delta", "conv", "recurrent", "rwkv")
"""Words of a layer_types entry that name a linear-attention (or state-space) layer; sliding, chunked or sparse
attention layers are attention."""


def _linear_layers(model: ModelConfig) -> int:
    """Layers layer_types names as linear attention, where no KDA layer list says which are KDA."""
    kinds = model.field("layer_types")[0]
    return 0 if model.kda_layers or not isinstance(kinds, list) else \
        sum(any(word in str(k) for word in LINEAR_KINDS) for k in kinds)


def _kda(model: ModelConfig) -> list[Part]:
    """Kimi Delta Attention layers: q, k, v and o projections; the short convolutions of q, k, v; the forget gate,
    low rank through the head size (f_a_proj, f_b_proj), with A_log per head and dt_bias per channel; beta; the
    output gate (g_proj full rank where linear_attn_config.use_full_rank_gate, Kimi K3's; else g_a_proj, g_b_proj
    through the head size) and its per-head norm (vLLM kimi_k3/amd/kda.py)."""
    if not model.kda_layers:
        return []
    d, h, k = model.hidden, model.kda_heads, model.kda_head_dim
    width = model.linear.get("short_conv_kernel_size") or model.class_value("linear_conv_kernel_dim", "kda")[0] or 4
    full_rank = bool(model.linear.get("use_full_rank_gate"))
    forget = k * d + h * k * k + h + h * k
    output_gate = d * h * k if full_rank else k * d + h * k * k
    per_layer = 4 * d * h * k + 3 * h * k * width + forget + h * d + output_gate + k
    note = "forget gate low rank (f_a_proj, f_b_proj); output gate g_proj full rank (use_full_rank_gate)" \
        if full_rank else ""
    return [Part("kda_attention", model.kda_layers * per_layer, note=note)]


def _attention(model: ModelConfig) -> list[Part]:
    """The full-attention layers. MLA where the config has kv_lora_rank: the query (through q_lora_rank or direct),
    the latent and its rotary key, the latent's up projection to keys and values, the output projection (with
    mla_use_output_gate a sigmoid gate of the same size), the latents' norms; DSA's lightning indexer where index_topk
    is set. Otherwise GQA: q and o at the heads, k and v at the KV heads, no biases."""
    layers = model.full_layers - _linear_layers(model)
    d, h = model.hidden, model.heads
    rank = model.integer("kv_lora_rank")[0]
    if not layers or not h:
        return []
    if not rank:
        kv_heads = model.integer("num_key_value_heads")[0] or h
        return [Part("attention", layers * 2 * d * model.head_dim * (h + kv_heads))]
    nope, rope, v = (model.integer(f)[0] or 0 for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    q_rank = model.integer("q_lora_rank")[0]
    query = d * q_rank + q_rank + q_rank * h * (nope + rope) if q_rank else d * h * (nope + rope)
    gate = bool(model.field("mla_use_output_gate")[0])
    per_layer = query + d * (rank + rope) + rank + rank * h * (nope + v) + h * v * d * (2 if gate else 1)
    gate_note = "with the output gate (mla_use_output_gate)" if gate else ""
    parts = [Part("mla_attention", layers * per_layer, note=gate_note)]
    if model.integer("index_topk")[0]:
        hi, di = model.integer("index_n_heads")[0], model.integer("index_head_dim")[0]
        indexer = (q_rank or d) * hi * di + d * di + 2 * di + d * hi  # wq_b, wk, k_norm (weight, bias), weights_proj
        parts.append(Part("dsa_indexer", layers * indexer))
    return parts


def _ffns(model: ModelConfig) -> list[Part]:
    """The routed experts (gate, up, down at the experts' width; MXFP4 where the config ships them so), the latent
    MoE's projections and norm, the routers, the shared experts and the dense FFN layers."""
    d, parts = model.hidden, []
    if model.experts:
        width, f = model.expert_width or d, model.expert_ffn
        quant = model.field("quantization_config")[0]
        fmt = "mxfp4" if isinstance(quant, dict) and quant.get("format") == MXFP4_FORMAT else "bf16"
        parts.append(Part("routed_experts", model.moe_layers * model.experts * 3 * width * f, fmt,
                          "the routed experts alone assumed quantized (the config does not say which)"
                          if fmt == "mxfp4" else ""))
        parts.append(Part("routers", model.moe_layers * model.experts * d))
        if model.expert_width:
            norm = model.expert_width if model.field("latent_moe_use_norm")[0] else 0
            parts.append(Part("latent_projections", model.moe_layers * (2 * d * model.expert_width + norm),
                              note="latent MoE down and up projections and the norm of the combined routed output"))
    for where, layers, shape, _ in model.gated_ffns():
        parts.append(Part("shared_experts" if where == "shared experts" else "dense_ffns", layers * 3 * d * shape["N"]))
    return parts


def summary(model: ModelConfig) -> dict:
    """The card's ``weights`` section: each part's parameters, format and note; the totals; the bytes in bfloat16
    and as published."""
    found = parts(model)
    return {"note": "modelled from the config's fields (workbench/weights.py); bytes at 2 per bfloat16 weight and "
                    f"{PACKED_BYTES} per MXFP4 weight",
            "parts": {p.name: {"params": p.params, "format": p.fmt, **({"note": p.note} if p.note else {})}
                      for p in found},
            "params": sum(p.params for p in found),
            "bytes_bf16": round(sum(p.params for p in found) * BYTES_PER_WEIGHT["bf16"]),
            "bytes_published": round(sum(p.bytes for p in found)),
            "uncounted": uncounted(model)}
