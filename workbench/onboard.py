"""Onboarding: a model card from a Hugging Face-style ``config.json``.

The architecture is recognised by its fields, not its name: experts by their counts, MLA by ``kv_lora_rank``, DSA by
``index_topk``, KDA by ``linear_attn_config``, latent experts by ``routed_expert_hidden_size``, the activation by
``hidden_act``, the layer schedule by the layer lists and ``first_k_dense_replace``. Each part maps to catalog blocks
at the model's sizes, with the number of layers it runs in. Every value in the card says where it came from
(``source: config`` and the field) or that the workbench assumed it (``source: assumption`` and why). A part the
catalog has no spec for is still a block of the card, named for what it is, with ``gap`` (``no spec: <what>``) and
the config fields that revealed it: ``workbench plan`` shows it as "no spec" until a block of that name exists.

A nested ``text_config`` (multimodal configs) is read first, the top level second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from workbench.blocks import REGISTRY
from workbench.blocks.moe_grouped_gemm import ACTIVATIONS as EXPERT_ACTIVATIONS
from workbench.errors import WorkbenchError

TOKENS = 8192  # tokens per step of the model suite: not in a config
LORA_RANK = 64  # the fine-tuning adapters' rank: not in a config
ROUTER_MODES = {("sigmoid", True): 0, ("softmax", True): 1, ("softmax", False): 3}  # workbench.blocks.moe_router
LATENT_MOE = ("latent MoE: the routed experts run at this width, between a down projection from the hidden size with "
              "its RMSNorm and an up projection back; the norm is the rmsnorm block at this width, the projections "
              "dense GEMMs like every projection of the model: no block of its own")
GATED_ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "situ": "situ"}
READ_ELSEWHERE = {"architectures", "model_type", "torch_dtype", "transformers_version", "bos_token_id",
                  "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "tie_word_embeddings",
                  "max_position_embeddings", "rope_theta", "rope_scaling", "attention_dropout", "attention_bias"}


class Config:
    """The config's fields, ``text_config`` first; remembers which fields were read (for ``unread``)."""

    def __init__(self, data: dict):
        self.top = data
        self.text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
        self.read: set[str] = set()

    def field(self, *names: str) -> tuple[Any, str | None]:
        """(value, "text_config.<name>" or "<name>") of the first of ``names`` that is set; (None, None)."""
        for name in names:
            for where, prefix in ((self.text, "text_config."), (self.top, "")):
                if name in where:
                    self.read.add(prefix + name)
                if where.get(name) is not None:
                    return where[name], prefix + name
        return None, None

    def integer(self, *names: str) -> tuple[int | None, str | None]:
        value, field = self.field(*names)
        if value is None:
            return None, None
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < 0:
            raise WorkbenchError(f"config field {field} is {value!r}: expected a non-negative integer")
        return int(value), field

    def unread(self) -> list[str]:
        fields = [f"text_config.{k}" for k in self.text] + [k for k in self.top if k != "text_config"]
        return sorted(f for f in fields if f not in self.read and f.split(".")[-1] not in READ_ELSEWHERE
                      and not f.endswith("_config"))


def read_config(path: str | Path) -> tuple[dict, Path]:
    """The config dict of a config.json or of a folder holding one; WorkbenchError for anything unreadable."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise WorkbenchError(f"no config at {file}")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"{file} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WorkbenchError(f"{file} is not a model config: a JSON {type(data).__name__}, not an object")
    probe = Config(data)
    if probe.field("hidden_size", "d_model")[0] is None or probe.field("num_hidden_layers", "n_layer")[0] is None:
        raise WorkbenchError(f"{file} is not a model config: no hidden_size and num_hidden_layers "
                             "(at the top or in text_config)")
    return data, file


def default_name(file: Path, data: dict) -> str:
    """The card's name: the folder of a config.json, else the file's stem without ".config"."""
    stem = file.parent.name if file.name == "config.json" else file.name.removesuffix(".json").removesuffix(".config")
    return re.sub(r"[^a-z0-9.]+", "-", (stem or str(data.get("model_type", "model"))).lower()).strip("-")


def _fact(value, field: str | None, note: str = "") -> dict:
    fact = {"value": value, "source": "config", "field": field} if field else \
        {"value": value, "source": "assumption"}
    return {**fact, "note": note} if note else fact


class _Card:
    """The card being built: facts, blocks (with their layer counts and sources), gaps."""

    def __init__(self) -> None:
        self.facts: dict[str, dict] = {}
        self.blocks: dict[str, dict] = {}

    def fact(self, name: str, value, field: str | None, note: str = "") -> None:
        if value is not None:
            self.facts[name] = _fact(value, field, note)

    def block(self, name: str, role: str, layers: int | None, shapes: list[dict], fields: list[str | None],
              gap: str = "", differs: str = "") -> None:
        """A catalog block (or, with ``gap``, a part without a spec) at ``shapes``, run in ``layers`` layers;
        ``fields``: the config fields its sizes came from. A block added again for another role (the activation of
        the dense layers and of the shared experts) runs in the layers of both."""
        entry = self.blocks.setdefault(name, {"role": role, "shapes": []})
        if entry["role"] != role:
            entry["role"] = f"{entry['role']}; {role}"
            entry["layers"] = entry.get("layers", 0) + (layers or 0)
        elif layers is not None:
            entry["layers"] = max(entry.get("layers", 0), layers)
        entry["shapes"] += [s for s in shapes if s not in entry["shapes"]]
        entry["fields"] = sorted(set(entry.get("fields", [])) | {f for f in fields if f})
        if gap and name not in REGISTRY:  # as the catalog grows, the same config leaves fewer gaps
            entry["gap"] = f"no spec: {gap}"
        if differs:
            entry["differs"] = differs


def onboard(path: str | Path, name: str | None = None) -> dict:
    """The model card (a dict in the YAML layout of workbench/models) for the config at ``path``."""
    data, file = read_config(path)
    cfg = Config(data)
    card = _Card()
    view = _class_view(data)
    d, d_field = cfg.integer("hidden_size", "d_model")
    layers, layers_field = cfg.integer("num_hidden_layers", "n_layer")
    vocab, vocab_field = cfg.integer("vocab_size")
    heads, heads_field = cfg.integer("num_attention_heads", "n_head")
    kv_heads, kv_field = cfg.integer("num_key_value_heads")
    head_dim, head_dim_field = cfg.integer("head_dim")
    if head_dim is None and heads and cfg.field("kv_lora_rank")[0] is None:  # MLA has its own head sizes
        head_dim, head_dim_field = d // heads, None
    for fact, value, field in (("hidden_size", d, d_field), ("num_layers", layers, layers_field),
                               ("vocab_size", vocab, vocab_field), ("attention_heads", heads, heads_field),
                               ("kv_heads", kv_heads, kv_field)):
        card.fact(fact, value, field)
    card.fact("head_dim", head_dim, head_dim_field, "" if head_dim_field else "hidden_size / num_attention_heads")
    card.fact("context_length", *cfg.integer("max_position_embeddings"))
    card.fact("tokens_per_step", TOKENS, None, "the model suite's tokens per step (batch x sequence)")
    t = TOKENS

    attention_layers = _attention(cfg, card, d, layers, heads, kv_heads, head_dim, t, view)
    ffn_layers = _experts(cfg, card, d, layers, t)
    _dense_ffn(cfg, card, layers, ffn_layers, t)
    _norms_and_residuals(cfg, card, d, layers, attention_layers, t)
    if vocab:
        for block, role in (("seq_chunked_ce", "sequence-chunked linear + cross-entropy head"),
                            ("vocab_blockwise_ce", "vocabulary-blockwise (CCE) linear + cross-entropy head")):
            card.block(block, role, None, [{"N": t, "V": vocab, "D": d}], [vocab_field, d_field])
    card.block("lora_linear", "LoRA adapters on the attention and expert projections for fine-tuning", None,
               [{"N": t, "IN": d, "OUT": d, "r": LORA_RANK}], [d_field])
    card.fact("lora_rank", LORA_RANK, None, "not in a config: the fine-tuning recipe's choice")
    _other_parts(cfg, card)

    name = name or default_name(file, data)
    arch = ", ".join(data.get("architectures") or []) or str(data.get("model_type", "unknown family"))
    result = {"name": name, "title": f"{name} ({arch}, onboarded from {file.name})",
              "onboarded_from": {"file": str(file), "model_type": data.get("model_type")},
              "facts": card.facts, "blocks": card.blocks, "unread_fields": cfg.unread()}
    if isinstance(view, str):
        result["transformers"] = {"error": view}
    elif view is not None:
        result["onboarded_from"]["class"] = view.model_class
        result["transformers"] = view.as_dict()
        for module in view.modules:
            if not module["blocks"] and "no block" in module["reason"]:
                card.block(module["class"], f"transformers module {module['class']} of {view.model_class}", None,
                           [], [view.prefix + "model_type"], gap=module["reason"].replace(": no block", ""))
    return result


def _class_view(data: dict):
    """The config as its transformers class reads it (workbench.integrations.class_view), None when no registered
    family names it or transformers is not installed, or the class's one-line error when it cannot read it."""
    try:
        from workbench.integrations.class_view import class_view
    except ImportError:
        return None
    try:
        return class_view(data)
    except WorkbenchError as exc:
        return str(exc)


def _layer_list(cfg: Config, group: str, key: str) -> tuple[list[int] | None, str | None]:
    container, field = cfg.field(group)
    if not isinstance(container, dict) or container.get(key) is None:
        return None, None
    value = container[key]
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise WorkbenchError(f"config field {field}.{key} is {value!r}: expected a list of layer numbers")
    return value, f"{field}.{key}"


def _attention(cfg: Config, card: _Card, d: int, layers: int, heads: int | None, kv_heads: int | None,
               head_dim: int | None, t: int, view=None) -> dict[str, int]:
    """The attention blocks by layer kind; {kind: layer count}. ``view`` (a ClassView): values the config's class
    fills in where the json is silent (Kimi Linear's short convolution, kernel 4 by default)."""
    heads_at = cfg.field("num_attention_heads", "n_head")[1]
    kda_layers, kda_field = _layer_list(cfg, "linear_attn_config", "kda_layers")
    full_layers, full_field = _layer_list(cfg, "linear_attn_config", "full_attn_layers")
    linear, linear_field = cfg.field("linear_attn_config")
    counts = {"kda": len(kda_layers or []), "full": len(full_layers) if full_layers is not None else
              layers - len(kda_layers or [])}
    card.fact("kda_layers", counts["kda"], kda_field)
    card.fact("full_attention_layers", counts["full"], full_field or None,
              "" if full_field else "the layers that are not KDA")
    if counts["kda"]:
        linear = linear if isinstance(linear, dict) else {}
        kh, kd = linear.get("num_heads") or heads, linear.get("head_dim") or head_dim
        fields = [kda_field, f"{linear_field}.num_heads" if linear.get("num_heads") else "num_attention_heads",
                  f"{linear_field}.head_dim" if linear.get("head_dim") else "head_dim"]
        card.block("kda", "Kimi Delta Attention (chunked linear attention)", counts["kda"],
                   [{"B": 1, "T": t, "H": kh, "HV": kh, "K": kd, "V": kd, "h0": 1}], fields)
        conv, conv_field = linear.get("short_conv_kernel_size"), f"{linear_field}.short_conv_kernel_size"
        if not conv and view is not None and not isinstance(view, str) and any(
                "kda_short_conv" in m["blocks"] for m in view.modules):
            conv, conv_field = view.value("linear_conv_kernel_dim")
        if conv:
            card.block("kda_short_conv", "KDA's causal depthwise short convolution (with SiLU) on q, k and v",
                       counts["kda"], [{"B": 1, "T": t, "D": kh * kd, "W": conv}], [conv_field],
                       gap="KDA short convolution")
        bound = linear.get("gate_lower_bound")
        given = {"gate_lower_bound": bound is not None, "use_full_rank_gate": "use_full_rank_gate" in linear}
        gate_fields = [f"{linear_field}.{key}" for key, present in given.items() if present]
        if bound is None:  # every KDA layer has a forget gate: without a bound, Kimi Linear's softplus form
            card.block("kda_gate", "KDA's decay gate, -exp(A_log) softplus(f + dt_bias) (no lower bound)",
                       counts["kda"], [{"B": 1, "T": t, "H": kh, "K": kd, "form": 1}], gate_fields or [kda_field],
                       gap="KDA softplus decay gate")
        else:
            card.block("kda_gate", f"KDA's decay gate, lower bound {bound}", counts["kda"],
                       [{"B": 1, "T": t, "H": kh, "K": kd}], gate_fields,
                       gap=f"KDA bounded decay gate (lower bound {bound})")
    elif isinstance(linear, dict) or cfg.field("layer_types")[0] is not None:
        _, lt_field = cfg.field("layer_types")
        card.block("linear_attention", "a linear-attention layer kind the workbench does not recognise", None, [],
                   [linear_field, lt_field], gap="linear attention of an unrecognised kind")

    if not counts["full"]:
        return counts
    kv_rank, kv_rank_field = cfg.integer("kv_lora_rank")
    topk, topk_field = cfg.integer("index_topk")
    if kv_rank:
        q_rank, q_field = cfg.integer("q_lora_rank")
        rope, rope_field = cfg.integer("qk_rope_head_dim")
        nope, nope_field = cfg.integer("qk_nope_head_dim")
        v_dim, v_field = cfg.integer("v_head_dim")
        gate, gate_field = cfg.field("mla_use_output_gate")
        no_rope, no_rope_field = cfg.field("mla_use_nope")
        # the block is the attention from the latent; the q/kv down-projections' norms are rmsnorm's shapes
        shape = {"B": 1, "T": t, "H": heads, "R": kv_rank, "DN": nope or head_dim, "DR": rope or 0,
                 "DV": v_dim or nope or head_dim, "gated": int(bool(gate))}
        role = ("multi-head latent attention" + (" with an output gate" if gate else "") +
                (", no rotary embedding (mla_use_nope)" if no_rope else ""))
        card.block("mla", role, counts["full"], [shape],
                   [kv_rank_field, q_field, rope_field, nope_field, v_field, gate_field, no_rope_field, heads_at],
                   gap="multi-head latent attention (MLA)")
        card.fact("kv_lora_rank", kv_rank, kv_rank_field)
        card.fact("q_lora_rank", q_rank, q_field)
    if topk:
        index_heads, ih_field = cfg.integer("index_n_heads")
        index_dim, id_field = cfg.integer("index_head_dim")
        card.fact("dsa_topk", topk, topk_field)
        card.block("dsa_indexer", "lightning indexer scoring and top-k selection", counts["full"],
                   [{"B": 1, "T": t, "HI": index_heads, "DI": index_dim, "topk": topk, "tie_free": 0}],
                   [topk_field, ih_field, id_field])
        latent = (kv_rank or 0) + (cfg.integer("qk_rope_head_dim")[0] or 0)  # MQA over the MLA latent
        shape = {"B": 1, "T": t, "H": heads, "HKV": 1, "D": latent or head_dim, "topk": topk, "gated": 0}
        if kv_rank:
            shape["DV"] = kv_rank  # keys [c_kv | k_rope], values c_kv (MLA's absorbed MQA form)
        card.block("dsa_sparse_attention", "sparse attention over the selected keys", counts["full"], [shape],
                   [topk_field, kv_rank_field, heads_at])
    if not kv_rank and not topk and not heads:
        card.block("attention", "the full-attention layers", counts["full"], [], [],
                   gap="attention of an unrecognised kind (no num_attention_heads)")
    elif not kv_rank and not topk:
        card.block("softmax_attention", "softmax attention" + (f" (GQA, {kv_heads} KV heads)" if kv_heads and
                                                               kv_heads != heads else ""), counts["full"],
                   [{"B": 1, "T": t, "H": heads, "HKV": kv_heads or heads, "D": head_dim}],
                   [heads_at, "num_key_value_heads" if kv_heads else None],
                   gap="softmax attention (FlashAttention-style, causal)")
    return counts


def _experts(cfg: Config, card: _Card, d: int, layers: int, t: int) -> dict[str, int]:
    """The MoE blocks; {"moe": MoE layers, "dense": dense FFN layers}."""
    experts, e_field = cfg.integer("num_experts", "n_routed_experts", "num_local_experts")
    if not experts:
        return {"moe": 0, "dense": layers}
    k, k_field = cfg.integer("num_experts_per_token", "num_experts_per_tok", "moe_topk")
    first_dense, fd_field = cfg.integer("first_k_dense_replace")
    freq, freq_field = cfg.integer("moe_layer_freq")
    moe_layers = len([i for i in range(first_dense or 0, layers) if (i - (first_dense or 0)) % (freq or 1) == 0])
    width, width_field = cfg.integer("moe_intermediate_size")
    if width is None:  # Mixtral: the experts' width is intermediate_size
        width, width_field = cfg.integer("intermediate_size")
    latent, latent_field = cfg.integer("routed_expert_hidden_size")
    dx = latent or d
    act, act_field = cfg.field("hidden_act")
    func, func_field = cfg.field("moe_router_activation_func", "scoring_func")
    func = str(func or "softmax").lower()
    renorm, renorm_field = cfg.field("moe_renormalize", "norm_topk_prob")
    renorm = True if renorm is None else bool(renorm)  # Mixtral and the sigmoid routers renormalize the top k
    scale, scale_field = cfg.field("routed_scaling_factor")
    for fact, value, field in (("routed_experts", experts, e_field), ("active_experts", k, k_field),
                               ("moe_layers", moe_layers, fd_field or None), ("expert_ffn_size", width, width_field),
                               ("expert_width", latent, latent_field), ("route_scale", scale, scale_field)):
        note = {"moe_layers": "the layers from first_k_dense_replace on" if field else "every layer",
                "expert_width": LATENT_MOE}
        card.fact(fact, value, field, note.get(fact, ""))
    groups, groups_field = cfg.integer("n_group", "num_expert_group")
    kept, kept_field = cfg.integer("topk_group")
    mode = ROUTER_MODES.get((func, renorm))
    router_fields = [e_field, k_field, func_field, renorm_field, scale_field, groups_field, kept_field]
    if mode is None:
        card.block("moe_router", f"{func} routing, {k} of {experts} experts", moe_layers, [], router_fields,
                   gap=f"a router with {func} scores (renormalize={renorm})")
    else:
        shape = {"N": t, "D": d, "E": experts, "k": k, "mode": mode}
        if scale is not None:
            shape["scale"] = float(scale)
        role = f"{func} routing, {k} of {experts} experts"
        if groups and groups > 1:
            shape.update(G=groups, kg=kept or 1)
            role += f" in the best {kept or 1} of {groups} groups"
        card.block("moe_router", role, moe_layers, [shape], router_fields)
    for block, role in (("moe_permute", "tokens to expert-major order"),
                        ("moe_combine", "weighted unpermute back to token order")):
        card.block(block, role, moe_layers, [{"N": t, "D": dx, "E": experts, "k": k, "hot": 0, "drop": 0}],
                   [e_field, k_field, latent_field])
    activation = GATED_ACTIVATIONS.get(str(act).lower()) if act else "swiglu"
    known = activation in EXPERT_ACTIVATIONS
    differs = "" if known else f"the catalog's grouped GEMM computes {' or '.join(EXPERT_ACTIVATIONS)}; the " \
                               f"config's experts use {act} ({act_field})"
    card.block("moe_grouped_gemm", f"per-expert gated FFN ({act or 'silu'}) over contiguous row groups", moe_layers,
               [{"N": t, "k": k, "D": dx, "F": width, "E": experts, "hot": 0, "drop": 0,
                 "act": EXPERT_ACTIVATIONS.index(activation) if known else 0}],
               [e_field, k_field, width_field, latent_field, act_field], differs=differs)
    if latent:
        norm, norm_field = cfg.field("latent_moe_use_norm")
        card.fact("latent_moe_norm", bool(norm), norm_field, "the RMSNorm after the down projection (rmsnorm's shape)")
    shared, shared_field = cfg.integer("num_shared_experts", "n_shared_experts")
    card.fact("shared_experts", shared, shared_field)
    if shared and width:
        _activation(cfg, card, "shared experts", moe_layers, {"rows": t, "N": shared * width},
                    [shared_field, width_field])
    return {"moe": moe_layers, "dense": layers - moe_layers}


def _activation(cfg: Config, card: _Card, where: str, layers: int, shape: dict, fields: list[str | None]) -> None:
    act, act_field = cfg.field("hidden_act")
    act = str(act or "silu").lower()
    block = GATED_ACTIVATIONS.get(act)
    if block == "situ":
        beta, beta_field = cfg.field("activation_situ_beta")
        linear_beta, lb_field = cfg.field("activation_situ_linear_beta")
        card.block("situ", f"SiTU activation (beta {beta}, linear beta {linear_beta}) of the {where}", layers,
                   [shape], [act_field, beta_field, lb_field, *fields], gap="SiTU activation")
    elif block:
        card.block(block, f"gated {act} activation of the {where}", layers, [shape], [act_field, *fields])
    else:
        card.block(f"{act}_activation", f"{act} activation of the {where}", layers, [shape], [act_field, *fields],
                   gap=f"{act} activation")


def _dense_ffn(cfg: Config, card: _Card, layers: int, ffn: dict[str, int], t: int) -> None:
    width, field = cfg.integer("intermediate_size")
    if ffn["dense"] and width:
        _activation(cfg, card, "dense FFN layers", ffn["dense"], {"rows": t, "N": width}, [field])


def _norms_and_residuals(cfg: Config, card: _Card, d: int, layers: int, attention: dict[str, int], t: int) -> None:
    d_field = cfg.field("hidden_size", "d_model")[1]
    widths: list[tuple[int, str | None]] = [(d, d_field)]
    for name in ("q_lora_rank", "kv_lora_rank", "routed_expert_hidden_size"):
        value, field = cfg.integer(name)
        if value and (name != "routed_expert_hidden_size" or cfg.field("latent_moe_use_norm")[0]):
            widths.append((value, field))
    if attention["kda"]:  # the per-head output norm
        kda = card.blocks["kda"]
        widths.append((kda["shapes"][0]["K"], next(f for f in kda["fields"] if f.endswith("head_dim"))))
    eps, eps_field = cfg.field("rms_norm_eps")
    card.fact("rms_norm_eps", eps, eps_field)
    card.block("rmsnorm", "pre-norms, final norm, the latent and per-head norms", layers,
               [{"rows": t, "N": w} for w, _ in dict.fromkeys(widths)], [f for _, f in widths])
    block_size, bs_field = cfg.integer("attn_res_block_size")
    if block_size:
        card.fact("attnres_block_size", block_size, bs_field)
        card.block("attnres", "softmax-over-depth residual mixing before each sub-layer", layers,
                   [{"L": block_size, "N": t, "D": d, "norm": 1}, {"L": block_size, "N": t, "D": d, "norm": 0}],
                   [bs_field, d_field])


def _other_parts(cfg: Config, card: _Card) -> None:
    """Parts outside the decoder's blocks that a port still has to cover."""
    quant, q_field = cfg.field("quantization_config")
    if isinstance(quant, dict):
        fmt = quant.get("format") or quant.get("quant_method") or "quantized"
        card.block("quantized_weights", f"weights shipped as {fmt}", None, [], [q_field],
                   gap=f"{fmt} weight dequantization / quantized GEMM")
    mtp, mtp_field = cfg.integer("num_nextn_predict_layers")
    if mtp:
        card.block("mtp_head", f"{mtp} multi-token-prediction layer(s)", mtp, [], [mtp_field],
                   gap="multi-token prediction head")
    vision, v_field = cfg.field("vision_config")
    if isinstance(vision, dict):
        card.block("vision_tower", "the vision encoder", None, [], [v_field], gap="vision tower")


def write_card(card: dict, out_dir: str | Path) -> Path:
    """``card`` as ``<out_dir>/<name>.yaml``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{card['name']}.yaml"
    header = f"# Onboarded from {card['onboarded_from']['file']} by `workbench onboard`: every value says its " \
             "source (config: the field; assumption: why).\n"
    path.write_text(header + yaml.safe_dump(card, sort_keys=False, width=118))
    return path
