"""Kimi K3's text configuration as its published serving code reads it (vLLM 0.32 ``vllm/models/kimi_k3``: the text
model is ``KimiLinearForCausalLM`` over ``text_config``, vLLM's ``KimiLinearConfig``).

Every field keeps the published name. The layer schedule comes from ``linear_attn_config``'s two lists, which are
1-indexed (``(idx + 1) in kda_layers``: 0-indexed layers 3, 7, ..., 91 and 92 of K3 are MLA). ``dsa_layers`` and the
indexer's sizes are not in K3's code: Kimi K3.1 Pro's gated DSA layers come from its release notes (see
``workbench/models/kimi-k3.1-pro.yaml``), so a config that has them says so in ``sources``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from workbench.errors import WorkbenchError

KINDS = {"K": "KDA (linear attention)", "M": "MLA (full attention)", "D": "gated DSA over MLA's latents"}
"""The attention of a layer, one letter each in ``layer_kinds``."""


@dataclass
class KimiK3Config:
    """The fields K3's text model reads (defaults: the published Kimi K3 config, revision f831ab6)."""

    vocab_size: int = 163840
    hidden_size: int = 7168
    num_hidden_layers: int = 93
    layer_kinds: str = ("KKKM" * 23) + "M"
    rms_norm_eps: float = 1e-5
    # KDA (linear_attn_config)
    kda_num_heads: int = 96
    kda_head_dim: int = 128
    short_conv_kernel_size: int = 4
    gate_lower_bound: float | None = -5.0     # None: Kimi Linear's softplus forget gate
    use_full_rank_gate: bool = True           # the output gate g_proj full rank (else g_b_proj(g_a_proj(x)))
    # MLA
    num_attention_heads: int = 96
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    mla_use_output_gate: bool = True
    # gated DSA in "D" layers (Kimi K3.1 Pro's release notes, not K3's code)
    index_topk: int = 2048
    index_n_heads: int = 64
    index_head_dim: int = 128
    # FFN: a dense MLP in the first layers, then latent MoE
    hidden_act: str = "situ"
    activation_situ_beta: float = 4.0
    activation_situ_linear_beta: float = 25.0
    intermediate_size: int = 33792
    first_k_dense_replace: int = 1
    moe_layer_freq: int = 1
    num_experts: int = 896
    num_experts_per_token: int = 16
    moe_intermediate_size: int = 3072
    num_shared_experts: int = 2
    routed_expert_hidden_size: int | None = 3584  # None: the experts run at the hidden size
    latent_moe_use_norm: bool = True
    moe_router_activation_func: str = "sigmoid"
    moe_renormalize: bool = True
    routed_scaling_factor: float = 1.0
    num_expert_group: int = 1
    topk_group: int = 1
    # residuals and heads
    attn_res_block_size: int | None = 12      # None: the plain pre-norm residual
    num_nextn_predict_layers: int = 0
    tie_word_embeddings: bool = False
    quantization_format: str | None = None    # "mxfp4-pack-quantized": the routed experts as published
    sources: dict[str, str] = field(default_factory=dict)  # where a value comes from, for those not in K3's code
    model_type: str = "kimi_k3"

    def __post_init__(self) -> None:
        if len(self.layer_kinds) != self.num_hidden_layers or set(self.layer_kinds) - set(KINDS):
            raise WorkbenchError(f"layer_kinds {self.layer_kinds!r}: one of {', '.join(KINDS)} per layer "
                                 f"({self.num_hidden_layers})")
        if self.moe_router_activation_func != "sigmoid":
            raise WorkbenchError(f"moe_router_activation_func {self.moe_router_activation_func!r}: K3 routes with "
                                 "sigmoid scores")
        if self.hidden_act not in ("situ", "silu"):
            raise WorkbenchError(f"hidden_act {self.hidden_act!r}: K3's MLPs take situ or silu")

    def is_moe_layer(self, idx: int) -> bool:
        """vLLM's KimiDecoderLayer: routed experts from first_k_dense_replace on, every moe_layer_freq-th layer."""
        return bool(self.num_experts) and idx >= self.first_k_dense_replace and idx % self.moe_layer_freq == 0

    @property
    def expert_width(self) -> int:
        """The routed experts' width: routed_expert_hidden_size (latent MoE) or the hidden size."""
        return self.routed_expert_hidden_size or self.hidden_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> KimiK3Config:
        """A config from ``to_dict``'s fields (unknown fields: one line)."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise WorkbenchError(f"unknown Kimi K3 config fields: {', '.join(sorted(unknown))}")
        return cls(**values)

    @classmethod
    def from_fields(cls, **values: Any) -> KimiK3Config:
        """A config from json fields: ``to_dict``'s (they name ``layer_kinds``), a published config's (they name
        ``num_hidden_layers``, at the top or in ``text_config``), or none but model_type (the published K3)."""
        values = {k: v for k, v in values.items() if k != "model_type"}
        if "layer_kinds" in values:
            return cls.from_dict(values)
        return cls.from_published(values) if values else cls()

    @classmethod
    def from_published(cls, data: dict[str, Any]) -> KimiK3Config:
        """The config of a published ``config.json`` (its ``text_config``, K3's nesting, or the top level), read as
        vLLM's KimiLinearConfig reads it; a missing required field is one line naming it."""
        text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
        linear = text.get("linear_attn_config") or {}
        try:
            layers = int(text["num_hidden_layers"])
            kda, dsa = set(linear.get("kda_layers") or []), set(text.get("dsa_layers") or [])
            kinds = "".join("K" if (i + 1) in kda else "D" if (i + 1) in dsa else "M" for i in range(layers))
            full = linear.get("full_attn_layers")
            if full is not None and sorted(full) != [i + 1 for i, k in enumerate(kinds) if k != "K"]:
                raise WorkbenchError("linear_attn_config: kda_layers and full_attn_layers (1-indexed) do not split "
                                     f"the {layers} layers between them")
            if text.get("mla_use_nope") is False:
                raise WorkbenchError("mla_use_nope false: K3's MLA runs without rotary embedding; this model has none")
            grouped = text.get("use_grouped_topk", False)
            quant = text.get("quantization_config") or data.get("quantization_config") or {}
            picked = {
                "vocab_size": text["vocab_size"], "hidden_size": text["hidden_size"], "num_hidden_layers": layers,
                "layer_kinds": kinds, "kda_num_heads": linear.get("num_heads", text.get("num_attention_heads")),
                "kda_head_dim": linear.get("head_dim", 128),
                "short_conv_kernel_size": linear.get("short_conv_kernel_size", 4),
                "gate_lower_bound": linear.get("gate_lower_bound"),
                "use_full_rank_gate": bool(linear.get("use_full_rank_gate", False)),
                "quantization_format": quant.get("format") if isinstance(quant, dict) else None,
            }
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkbenchError(f"not a Kimi K3 config: {exc!r} missing or malformed") from None
        picked.update({name: text.get(name, off) for name, off in OFF_WHEN_ABSENT.items()})
        if not grouped:  # vLLM's FusedMoE groups the top-k only with use_grouped_topk
            picked.update(num_expert_group=1, topk_group=1)
        if dsa:
            picked["sources"] = {"dsa_layers": "not in K3's code: Kimi K3.1 Pro's release notes"}
        names = {f.name for f in fields(cls)} - set(picked) - {"sources", "model_type"}
        picked.update({name: text[name] for name in names if text.get(name) is not None})
        return cls(**picked)


OFF_WHEN_ABSENT = {"attn_res_block_size": None, "routed_expert_hidden_size": None, "q_lora_rank": None,
                   "mla_use_output_gate": False, "latent_moe_use_norm": False, "num_nextn_predict_layers": 0}
"""Features a config turns on by having the field (Kimi Linear's config has none of them)."""
