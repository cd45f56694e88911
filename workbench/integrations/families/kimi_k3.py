"""Kimi K3 (model_type ``kimi_k3``): the project's K3 text model (workbench.kimi_k3), written to K3's published serving
code in vLLM (transformers has no K3 class: its ``kimi_linear`` class computes neither Block AttnRes, the latent MoE,
SiTU nor K3's gates). The model computes every catalog block through its modules' ``ops``, the blocks' references by
default: that is the model "as shipped", in torch. This family swaps the promoted operators in, module by module.

    module                            computed by
    KimiK3RMSNorm                     rmsnorm
    KimiK3GatedRMSNorm (o_norm)       rmsnorm_gated (sigmoid gate)
    KimiK3MLP                         situ (or swiglu), projections in torch
    KimiK3Gate                        moe_router (sigmoid, correction bias, renormalised, routed_scaling_factor)
    KimiK3Experts                     moe_permute, moe_grouped_gemm (moe_grouped_gemm_mxfp4 for MXFP4 experts),
                                      moe_combine
    KimiK3DeltaAttention              kda_short_conv, kda_gate, kda_prologue, kda; serving: kda_short_conv_prefill,
                                      kda_prefill, kda_short_conv_decode, kda_decode (each where promoted)
    KimiK3MLAAttention                mla; serving: mla_prefill, mla_decode (W_uk, W_uv and the gate in torch)
    KimiK3DSAAttention, KimiK3Indexer dsa_sparse_attention, dsa_indexer; serving: dsa_prefill, dsa_decode,
                                      dsa_indexer_prefill, dsa_indexer_decode (Kimi K3.1 Pro's layers)
    KimiK3DecoderLayer, KimiK3TextModel  attnres (Block AttnRes with the pre-norm fused; the final one)
    embed_tokens, lm_head             left alone (an embedding lookup; the logits are the model's output)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.integrations.transformers import Patcher
from workbench.kimi_k3 import modeling as shipped
from workbench.kimi_k3.config import KimiK3Config

MODEL_CLASS = "KimiK3ForCausalLM"
CODE = "workbench.kimi_k3: Kimi K3's published serving code (vLLM 0.32 vllm/models/kimi_k3) in torch"
ROUTER = shipped.KimiK3Gate  # its output (None, weights, ids): the router choices
WHOLE_CONFIG = True
"""The model reads the whole published config (its text_config and K3's fields), not the text config's model_type."""
LORA_TARGETS = shipped.LORA_TARGETS
"""The projections a parity run's LoRA adapts (the model's own LoRA targets, workbench.kimi_k3.modeling)."""
LAYER_WORDS = {"K": "kda", "M": "mla", "D": "dsa"}


config_class = KimiK3Config.from_fields
"""The config of a json's fields: a published config.json's, KimiK3Config's own, or none (the published K3)."""


def schedule(full: KimiK3Config) -> list[str]:
    """The attention of every layer, in words."""
    return [LAYER_WORDS[k] for k in full.layer_kinds]


def tiny_config(full: KimiK3Config, layers: int) -> tuple[dict[str, Any], list[str]]:
    """The fields of a tiny K3 of ``full``'s architecture (the first ``layers`` of its schedule with every kind it
    has, layer 0 dense where K3's is, Block AttnRes in blocks of two so that several blocks and a partial sum
    occur, experts at most 16 with top-k scaled, 16 index heads where DSA layers select: ties at the k-th place
    are then unlikely), and its schedule in words."""
    from workbench.integrations.parity import MAX_EXPERTS, pick_layers

    kinds = pick_layers(list(full.layer_kinds), layers)
    experts = min(full.num_experts, MAX_EXPERTS)
    top_k = max(min(2, experts), round(full.num_experts_per_token * experts / full.num_experts) or 1)
    fields = full.to_dict() | {
        "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": len(kinds), "layer_kinds": "".join(kinds),
        "kda_num_heads": 4, "kda_head_dim": 16, "num_attention_heads": 4,
        "q_lora_rank": None if full.q_lora_rank is None else 24, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8, "v_head_dim": 16, "index_topk": 8, "index_n_heads": 16, "index_head_dim": 8,
        "intermediate_size": 96, "first_k_dense_replace": min(full.first_k_dense_replace, len(kinds) - 1),
        "num_experts": experts, "num_experts_per_token": top_k, "moe_intermediate_size": 32,
        "routed_expert_hidden_size": None if full.routed_expert_hidden_size is None else 32,
        "num_expert_group": 1, "topk_group": 1, "attn_res_block_size": None if full.attn_res_block_size is None else 2,
        "quantization_format": None}
    return fields, [LAYER_WORDS[k] for k in kinds]


def apply(patcher: Patcher) -> None:
    """Swap the promoted operators into every module of the K3 model that computes a catalog block (its training
    blocks all promoted and requested; each serving form where promoted); report each module."""
    report = patcher.report
    for path, module in patcher.model.named_modules():
        if isinstance(module, shipped.KimiK3ForCausalLM):
            continue  # its loss block serves the replays' loss(); its forward ends at the logits
        if isinstance(module, shipped.OpsModule) and module.TRAINING:
            if patcher.wants(path, module, *module.TRAINING):
                patcher.set_ops(path, module, *module.TRAINING, *(b for b in module.SERVING if patcher.may(b)))
        elif isinstance(module, nn.Embedding):
            report.leave(path, module, "embedding lookup: no block")
        elif path == "lm_head" or path.endswith("shared_head.head"):
            report.leave(path, module, "the logits are the model's output: the fused linear cross-entropy blocks "
                                       "never build them, so they are not swapped in here")
    report.notes.append("plain projections (nn.Linear) and MLA's absorbed products in serving run in torch")
