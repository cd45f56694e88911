"""The replay model: Kimi K3's text model as its published serving code computes it (workbench.kimi_k3.modeling),
at a preset's sizes and in the card's architecture (workbench.replay.arch): the model ``workbench parity kimi-k3``
holds to its kernels, trained, not a look-alike of it.

    preset                 K3 config field
    hidden, vocab          hidden_size, vocab_size
    heads, head_dim        KDA heads and head size; MLA heads, nope and value dims (rope: half), q latent = hidden
    mla_rank               kv_lora_rank
    index_heads/dim, topk  the DSA layers' lightning indexer (Kimi K3.1 Pro)
    experts, active        num_experts, num_experts_per_token; one shared expert of expert_ffn
    expert_ffn, dense_ffn  moe_intermediate_size; intermediate_size of the dense first layer
    attnres_block          attn_res_block_size

Every catalog block runs through the model's ``ops`` (its reference, a promoted operator or a candidate file:
workbench.replay.ops), the glue in torch; LoRA mode adapts every projection through the lora_linear block
(``KimiK3ForCausalLM.add_lora``). Shapes: tokens, targets [B, T] int64; hidden states [B*T, D].
"""

from __future__ import annotations

from workbench.blocks.kda_gate import LOWER_BOUND
from workbench.kimi_k3.config import KimiK3Config
from workbench.kimi_k3.modeling import KimiK3ForCausalLM, KimiK3Gate, KimiK3MoE
from workbench.replay.arch import DEFAULT_LOSS, Architecture
from workbench.replay.presets import Preset

EPS = 1e-5  # Kimi K3's rms_norm_eps
CONV_WIDTH = 4  # KDA's short_conv_kernel_size


def replay_config(p: Preset, arch: Architecture, mtp: int = 0) -> KimiK3Config:
    """The K3 config of the replay model of ``arch`` at preset ``p`` (module docstring); ``mtp`` MTP depths."""
    return KimiK3Config(
        vocab_size=p.vocab, hidden_size=p.hidden, num_hidden_layers=len(arch.layers), layer_kinds=arch.layers,
        rms_norm_eps=EPS, kda_num_heads=p.heads, kda_head_dim=p.head_dim, short_conv_kernel_size=CONV_WIDTH,
        gate_lower_bound=LOWER_BOUND if arch.gate == "bounded" else None, use_full_rank_gate=True,
        num_attention_heads=p.heads, q_lora_rank=p.hidden, kv_lora_rank=p.mla_rank, qk_nope_head_dim=p.head_dim,
        qk_rope_head_dim=p.head_dim // 2, v_head_dim=p.head_dim, mla_use_output_gate=True, index_topk=p.dsa_topk,
        index_n_heads=p.index_heads, index_head_dim=p.index_dim, hidden_act=arch.experts,
        intermediate_size=p.dense_ffn, first_k_dense_replace=1 if arch.dense_first else 0, num_experts=p.experts,
        num_experts_per_token=p.active, moe_intermediate_size=p.expert_ffn, num_shared_experts=1,
        routed_expert_hidden_size=p.hidden // 2 if arch.latent else None, latent_moe_use_norm=arch.latent,
        routed_scaling_factor=arch.route_scale, attn_res_block_size=p.attnres_block if arch.attnres else None,
        num_nextn_predict_layers=mtp)


def replay_model(p: Preset, arch: Architecture, mtp: int = 0, loss_block: str = DEFAULT_LOSS) -> KimiK3ForCausalLM:
    """The replay model of ``arch`` at preset ``p``, initialised from torch's global RNG."""
    return KimiK3ForCausalLM(replay_config(p, arch, mtp), loss_block)


def moe_layers(model: KimiK3ForCausalLM) -> list[KimiK3MoE]:
    """Every routed MoE layer of the model (the MTP depths' included), in order."""
    return [m for m in model.modules() if isinstance(m, KimiK3MoE)]


def routers(model: KimiK3ForCausalLM) -> list[KimiK3Gate]:
    """The routers whose correction bias the aux-loss-free balancing updates."""
    return [moe.gate for moe in moe_layers(model)]
