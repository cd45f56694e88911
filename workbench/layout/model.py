"""The planner's view of a model (workbench.layout.plan.Model), from a model card or from a replay preset's model.

From a card: the layer schedule from its facts (layer_kinds, the config's layer lists; without it kda_layers
linear-attention layers with the full-attention ones spread evenly among them; dsa_layers of those gated DSA; the
first num_layers - moe_layers layers dense FFNs), the sizes from its blocks' shapes, the parameters from its
``weights`` section (each part spread evenly over the layers that hold it), at the card's tokens_per_step per card
and its lora_rank.
From a replay preset: the replay model itself (workbench.replay.model) built on the meta device: parameters counted
from its modules as FSDP2 holds them over the ranks (dim 0 padded to a multiple of the ranks), float32 throughout,
at the preset's tokens per step over the ranks.

What a block saves for backward, per token (``saved`` of each layer; b: bytes of an activation, 4 for a float32
statistic, i: of an index): the tensors an implementation that keeps inputs and outputs, not intermediates, needs:
    kda               q, k, v (b), g (fp32), beta (fp32), o (b)          kda_short_conv   its three inputs
    kda_gate          its input                                          rmsnorm          input and 1/rms
    kda_prologue      its inputs: q, k and beta's logits
    mla               q, c_kv, k_rope, o, the log-sum-exp per head       dsa_sparse_attention  q, k, v, o, the
    selected indices, the log-sum-exp                                    moe_router       scores (fp32), weights, ids
    moe_permute       the row maps                                       moe_grouped_gemm  its rows, gate and up,
    the activation                                                      moe_combine      the expert outputs
    situ              its input                                          attnres          the sub-layer's sources
    rmsnorm_gated     its input, its gate and 1/rms
    glue              the projections' inputs and the output gates (plain torch between the blocks)
"""

from __future__ import annotations

from workbench.errors import WorkbenchError
from workbench.layout.plan import Layer, Model
from workbench.models import ModelCard, get_model

FP32 = 4
KDA_CHUNK = 64
"""Tokens per chunk of chunked KDA, for its intra-chunk FLOPs."""


def _kda(d: int, h: int, k: int, v: int, b: int, conv: bool, gate: bool, prologue: bool
         ) -> tuple[int, float, dict[str, float]]:
    """(adapters per unit rank, attention FLOPs per token beyond the projections, saved bytes per token by block)."""
    saved = {"glue": (d + h * v) * b, "kda": (2 * h * k + 2 * h * v) * b + (h * k + h) * FP32,
             "rmsnorm_gated": 2 * h * v * b + h * FP32}
    if conv:
        saved["kda_short_conv"] = (2 * h * k + h * v) * b
    if gate:
        saved["kda_gate"] = h * k * b
    if prologue:
        saved["kda_prologue"] = (2 * h * k + h) * b
    flops = 4 * h * k * v + 2 * h * KDA_CHUNK * (k + v)
    return 3 * (d + h * k) + h * v + d, flops, saved


def _mla(d: int, h: int, r: int, dn: int, dr: int, dv: int, qr: int, b: int, context: float
         ) -> tuple[int, float, dict[str, float]]:
    """MLA with a low-rank query and Kimi's output gate (same tuple as _kda)."""
    saved = {"glue": (d + qr + 2 * h * dv) * b, "rmsnorm": (qr + r) * b + 2 * FP32,
             "mla": (h * (dn + dr) + r + dr + h * dv) * b + h * FP32}
    adapters = (d + qr) + (qr + h * (dn + dr)) + (d + r) + (d + dr) + (h * dv + d)
    return adapters, 2 * h * context * (dn + dr + dv), saved


def _gated_mla_dsa(d: int, h: int, r: int, dn: int, dr: int, dv: int, qr: int, b: int, i: int, topk: int,
                   index_heads: int, index_dim: int, context: float) -> tuple[int, float, dict[str, float]]:
    """Kimi K3.1 Pro's gated DSA: MLA's projections, attention over the top-k keys in the latent space (absorbed)."""
    adapters, _, saved = _mla(d, h, r, dn, dr, dv, qr, b, context)
    saved["dsa_sparse_attention"] = saved.pop("mla") + topk * i
    selected = min(topk, context)
    return adapters, 2 * h * selected * (2 * r + dr) + 2 * index_heads * index_dim * context, saved


def _moe(d: int, dx: int, f: int, shared: int, experts: int, active: int, b: int, i: int, latent: bool
         ) -> tuple[int, dict[str, float]]:
    """(adapters per unit rank on the latent and shared projections, saved bytes per token by block)."""
    saved = {"glue": (d + shared + (dx if latent else 0)) * b,
             "moe_router": experts * FP32 + active * (FP32 + i), "moe_permute": 2 * active * i,
             "moe_grouped_gemm": active * (dx + 3 * f) * b, "moe_combine": active * dx * b,
             "situ": 2 * shared * b}
    if latent:
        saved["rmsnorm"] = dx * b + FP32
    adapters = 3 * (d + shared) + (2 * (d + dx) if latent else 0)
    return adapters, saved


def _ffn(d: int, f: int, b: int) -> tuple[int, dict[str, float]]:
    """A dense gated FFN layer (same tuple as _moe)."""
    return 3 * (d + f), {"glue": (d + f) * b, "situ": 2 * f * b}


def _mixing(d: int, b: int) -> dict[str, float]:
    """AttnRes and the pre-norm before each of a layer's two sub-layers."""
    return {"attnres": 2 * d * b, "rmsnorm": 2 * (d * b + FP32)}


def _merge(*parts: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in parts:
        for block, nbytes in part.items():
            out[block] = out.get(block, 0.0) + nbytes
    return out


def _head(d: int, b: int) -> dict[str, float]:
    """The final AttnRes and norm, and the loss block's saved hidden states and log-sum-exp."""
    return {"attnres": d * b, "rmsnorm": d * b + FP32, "vocab_blockwise_ce": d * b + FP32}


def _fact(card: ModelCard, name: str) -> int:
    value = card.facts.get(name, {}).get("value")
    if not isinstance(value, int | float):
        raise WorkbenchError(f"model {card.name}: the layout planner needs the fact '{name}', the card has none")
    return int(value)


def _shape(card: ModelCard, block: str) -> dict:
    shapes = card.block_shapes(block)
    if not shapes:
        raise WorkbenchError(f"model {card.name}: the layout planner needs the sizes of '{block}', the card has "
                             f"none")
    return shapes[0]


def from_card(name: str) -> Model:
    """The planner's model of card ``name`` (module docstring); WorkbenchError (one line) for what it lacks."""
    card = get_model(name)
    if not card.weights:
        raise WorkbenchError(f"model {name}: the card has no weights section (re-onboard it from its config)")
    parts = {part: info["params"] for part, info in card.weights["parts"].items()}
    fmt = {part: info.get("format", "bf16") for part, info in card.weights["parts"].items()}
    d, layers = _fact(card, "hidden_size"), _fact(card, "num_layers")
    n_kda = int(card.facts.get("kda_layers", {}).get("value") or 0)
    n_full = layers - n_kda
    n_dsa = min(int(card.facts.get("dsa_layers", {}).get("value") or 0), n_full)
    n_moe = _fact(card, "moe_layers")
    if "routed_experts" not in parts:
        raise WorkbenchError(f"model {name}: no routed experts in its weights; the planner plans MoE layouts")
    gemm = _shape(card, "moe_grouped_gemm")
    dx, f, active, experts = gemm["D"], gemm["F"], gemm["k"], gemm["E"]
    tokens, b, i = _fact(card, "tokens_per_step"), 2, 4
    kda = _shape(card, "kda") if n_kda else {}
    context = (kda.get("T") or tokens) / 2
    kinds = card.facts.get("layer_kinds", {}).get("value")
    if isinstance(kinds, str) and len(kinds) == layers:  # the config's layer lists
        full_at = {i for i, kind in enumerate(kinds) if kind != "K"}
    else:  # spread evenly among the linear-attention layers
        full_at = {round((j + 1) * layers / n_full) - 1 for j in range(n_full)} if n_full else set()
    dsa_at = set(sorted(full_at)[:n_dsa])
    per_moe = (parts.get("routers", 0) + parts.get("latent_projections", 0) + parts.get("shared_experts", 0)) / n_moe
    shared = parts.get("shared_experts", 0) // (3 * d * n_moe)
    dense_layers = layers - n_moe
    ffn = parts.get("dense_ffns", 0) // (3 * d * dense_layers) if dense_layers else 0
    norms = (parts.get("norms", 0) + parts.get("attnres", 0)) / layers  # the small per-layer vectors
    built = []
    for index in range(layers):
        if index in full_at:
            mla, q_rank = _shape(card, "mla"), _fact(card, "q_lora_rank")
            dims = (d, mla["H"], mla["R"], mla["DN"], mla["DR"], mla["DV"], q_rank, b)
            attention_params = parts.get("mla_attention", 0) / n_full
            if index in dsa_at:
                dsa, indexer = _shape(card, "dsa_sparse_attention"), _shape(card, "dsa_indexer")
                kind, (adapters, flops, saved) = "D", _gated_mla_dsa(*dims, i, dsa["topk"], indexer["HI"],
                                                                    indexer["DI"], context)
            else:
                kind, (adapters, flops, saved) = "M", _mla(*dims, context)
        else:
            kind, attention_params = "K", parts.get("kda_attention", 0) / n_kda
            adapters, flops, saved = _kda(d, kda["H"], kda["K"], kda["V"], b, "kda_short_conv" in card.blocks,
                                          "kda_gate" in card.blocks, "kda_prologue" in card.blocks)
        moe = index >= dense_layers
        ffn_adapters, ffn_saved = _moe(d, dx, f, shared, experts, active, b, i, dx != d) if moe else _ffn(d, ffn, b)
        dense = attention_params + norms + (per_moe if moe else 3 * d * ffn)
        routed = parts["routed_experts"] / n_moe if moe else 0
        flops += 2 * dense + (2 * active * 3 * dx * f if moe else 0)
        built.append(Layer(kind, round(dense), round(routed), adapters + ffn_adapters, flops,
                           _merge(_mixing(d, b), saved, ffn_saved), dx if moe else 0))
    vocab = _fact(card, "vocab_size")
    head_params = parts.get("lm_head", 0) or parts.get("embedding", 0)
    return Model(name, d, tuple(built), parts.get("embedding", 0), head_params, 2 * d * vocab, _head(d, b),
                 experts, active, "bf16", fmt["routed_experts"], tokens, b,
                 int(card.facts.get("lora_rank", {}).get("value") or 0),
                 f"card {name} (facts, block shapes, weights)")


def from_replay(name: str, preset_name: str, ranks: int) -> Model:
    """The planner's model of the replay model of card ``name`` at ``preset_name`` with its tokens per step split
    over ``ranks`` (module docstring)."""
    import torch

    from workbench.kimi_k3.modeling import LORA_TARGETS
    from workbench.replay.arch import architecture
    from workbench.replay.model import replay_model
    from workbench.replay.presets import get_preset

    p = get_preset(preset_name)
    arch = architecture(name, p.layers)
    with torch.device("meta"):
        replay = replay_model(p, arch)
    b = torch.empty((), dtype=getattr(torch, p.dtype)).element_size()
    i = 8  # int64 indices
    d, dx = p.hidden, p.hidden // 2 if arch.latent else p.hidden
    context = p.seq_len / 2
    experts = ("w1", "w3", "w2")

    def sharded(t: torch.Tensor) -> int:
        """Elements of a parameter FSDP2 shards over the ranks: dim 0 padded to a multiple of them (a [1, D]
        AttnRes pseudo-query takes a row on every rank)."""
        return -(-t.shape[0] // ranks) * ranks * t[0].numel() if t.dim() else t.numel()

    def count(module: torch.nn.Module) -> int:
        """Its parameters but the routed experts', as FSDP2 holds them."""
        return sum(sharded(t) for n, t in module.named_parameters() if n.rsplit(".", 1)[-1] not in experts)

    built = []
    for layer in replay.model.layers:
        kind, moe = layer.kind, getattr(layer, "block_sparse_moe", None)
        mla = (d, p.heads, p.mla_rank, p.head_dim, p.head_dim // 2, p.head_dim, d, b)
        if kind == "K":
            _, flops, saved = _kda(d, p.heads, p.head_dim, p.head_dim, b, True, True, True)
        elif kind == "D":
            _, flops, saved = _gated_mla_dsa(*mla, i, p.dsa_topk, p.index_heads, p.index_dim, context)
        else:
            _, flops, saved = _mla(*mla, context)
        _, ffn_saved = _moe(d, dx, p.expert_ffn, p.expert_ffn, p.experts, p.active, b, i, arch.latent) if moe \
            else _ffn(d, p.dense_ffn, b)
        adapters = sum(m.weight.shape[0] + m.weight.shape[1] for n, m in layer.named_modules()
                       if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in LORA_TARGETS)
        routed = sum(getattr(moe.experts, n).numel() for n in experts) if moe else 0
        flops += 2 * count(layer) + (2 * p.active * 3 * dx * p.expert_ffn if moe else 0)
        built.append(Layer(kind, count(layer), routed, adapters, flops, _merge(_mixing(d, b), saved, ffn_saved),
                           dx if moe else 0))
    fmt = {4: "float32", 2: "bf16"}[b]
    head = sharded(replay.lm_head.weight) + sum(sharded(t) for n, t in replay.model.named_parameters()
                                                if not n.startswith(("layers.", "embed_tokens.")))
    return Model(f"{name} replay ({p.name})", d, tuple(built), sharded(replay.model.embed_tokens.weight), head,
                 2 * d * p.vocab, _head(d, b), p.experts, p.active,
                 fmt, fmt, p.tokens_per_step // ranks, b, p.lora_rank,
                 f"the replay model of {name} at preset {p.name} ({p.tokens_per_step // ranks} tokens a rank)")
