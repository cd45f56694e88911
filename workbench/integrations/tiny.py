"""A tiny instance of any transformers config: the same module classes in the same layer pattern, at widths a CPU
runs in a second, for the onboarding probe (workbench.integrations.probe) and for parity on a family the workbench
has no hand-written integration for.

    full = build_config({"model_type": "glm4_moe"})     # the class's defaults, or a config.json's fields
    text = language_config(full)                         # a multimodal config's language model
    tiny, notes = tiny_config(text)                      # every switch and variant kept

The layers kept are the full model's first ones, as many as it takes for every distinct layer (its module classes
and their per-layer attributes, read from the full model built on the meta device) to appear once; fields that hold
one entry per layer are cut to those layers. Widths shrink to fixed small sizes (heads and head sizes kept in
proportion: GQA stays GQA, MQA stays MQA), experts to at most 16 (the routing groups and top-k kept feasible),
windows and top-k selections below the probe's tokens so that they select; every other field (activations,
switches, norms, scales, rotary settings) is the full config's. ``notes`` names every field changed beyond widths.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from workbench.errors import WorkbenchError, one_line

TOKENS = 32
"""Tokens per sequence a tiny instance runs (the probe's batch: 2 sequences)."""
MAX_LAYERS = 16
MAX_EXPERTS = 16
WIDTHS = {
    "hidden_size": 64, "d_model": 64, "intermediate_size": 96, "ffn_hidden_size": 96, "moe_intermediate_size": 32,
    "expert_ffn_hidden_size": 32, "shared_expert_intermediate_size": 32, "routed_expert_hidden_size": 48,
    "num_attention_heads": 4, "head_dim": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "kv_lora_rank": 32, "q_lora_rank": 24, "o_lora_rank": 16, "index_head_dim": 16, "index_n_heads": 16,
    "vocab_size": 256, "linear_num_heads": 4, "linear_head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "mamba_n_heads": 4,
    "mamba_d_head": 16, "mamba_d_state": 16, "ssm_state_size": 16, "o_groups": 2,
}
"""Width fields and their tiny values (a field the config lacks is not added; a smaller value is kept)."""
LINKED = (("head_dim", "qk_rope_head_dim"),)
"""(field, other): where the full config has them equal, the tiny one does too (MLA configs whose head_dim is the
rotary embedding's width)."""
SELECTIONS = {"sliding_window": 8, "index_topk": 8}
"""Fields that select among the tokens: below TOKENS, so that the tiny instance's window and top-k select."""
EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
TOP_KS = ("num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk")
GROUPS = ("n_group", "num_expert_group")
LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "eod_token_id")
SCHEDULE_FIELDS = (*WIDTHS, *EXPERT_COUNTS, *TOP_KS, *GROUPS, *LAYER_COUNTS, "layer_types", "mlp_layer_types",
                   "n_shared_experts", "num_shared_experts", "first_k_dense_replace", "topk_group")
"""The sizes and schedules a model's modules are built from: named when a config leaves them unset and the class
cannot build it."""
LAYER_ATTRS = ("sliding_window", "is_sliding", "layer_type", "attention_type", "compress_ratio", "use_rope",
               "indexer_type", "is_causal")
"""Attributes of a layer's modules that tell two layers of the same classes apart (per-layer attention kinds)."""


def language_config(full):
    """The language model's config of ``full`` (its text config where ``full`` is multimodal)."""
    return full.get_text_config()


def model_class(config, whole: bool = False):
    """The class transformers builds ``config`` with: its causal LM, else (``whole``: a multimodal model with its
    towers) its image/multimodal-to-text model, else its base model; WorkbenchError (one line) where it has none."""
    import transformers as t

    mappings = [t.MODEL_FOR_CAUSAL_LM_MAPPING]
    if whole:
        mappings += [t.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING, t.MODEL_FOR_MULTIMODAL_LM_MAPPING]
    for mapping in (*mappings, t.MODEL_MAPPING):
        try:
            return mapping[type(config)]
        except KeyError:
            continue
    raise WorkbenchError(f"transformers has no model class for {type(config).__name__} "
                         f"(model_type {config.model_type})")


def build(config, device: str = "meta", whole: bool = False) -> nn.Module:
    """``config``'s model (``model_class``) on ``device`` (meta: no memory, the full sizes); WorkbenchError naming
    the class and the error where the class cannot build it."""
    import torch

    cls = model_class(config, whole)
    try:
        with torch.device(device):
            return cls(config)
    except Exception as exc:  # noqa: BLE001 - the class's own validation: any error it raises is the answer
        unset = [name for name in SCHEDULE_FIELDS if name in config.to_dict() and getattr(config, name, 0) is None]
        raise WorkbenchError(f"{cls.__name__} cannot be built from this config: {one_line(exc)}"
                             + (f" (the config leaves {', '.join(unset)} unset)" if unset else "")) from None


def decoder_layers(model: nn.Module, count: int) -> nn.ModuleList | None:
    """The ModuleList of ``model``'s decoder layers: the first one holding ``count`` modules."""
    return next((m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == count), None)


def layer_signature(layer: nn.Module) -> tuple:
    """What a decoder layer computes, widths aside: its modules' paths and classes, and the per-layer attributes
    (LAYER_ATTRS) they set."""
    items = []
    for path, module in layer.named_modules():
        attrs = tuple((a, "set" if a in SELECTIONS else getattr(module, a)) for a in LAYER_ATTRS
                      if isinstance(getattr(module, a, None), bool | int | str))
        items.append((path, type(module).__name__, attrs))
    return tuple(items)


def layer_count(config, model: nn.Module) -> tuple[int, str, nn.ModuleList | None]:
    """(the number of decoder layers, the config field that holds it, the ModuleList of the layers in ``model``):
    the first layer-count field whose number of layers ``model`` holds in one list (Longcat's num_hidden_layers
    counts two sub-layers a layer; its num_layers is the list's length)."""
    counts = [(getattr(config, n), n) for n in LAYER_COUNTS if isinstance(getattr(config, n, None), int)]
    if not counts:
        raise WorkbenchError(f"{type(config).__name__} has no layer count ({', '.join(LAYER_COUNTS)})")
    for count, name in counts:
        layers = decoder_layers(model, count)
        if layers is not None:
            return count, name, layers
    return *counts[0], None


def kept_layers(config, model: nn.Module) -> tuple[int, list[tuple]]:
    """How many first layers the tiny instance keeps (every distinct layer once, at least 2) and their
    signatures."""
    count, _, layers = layer_count(config, model)
    if layers is None:
        return min(count, 4), []
    signatures = [layer_signature(layer) for layer in layers]
    keep = next(n for n in range(1, count + 1) if len(set(signatures[:n])) == len(set(signatures)))
    keep = min(max(keep, min(2, count)), MAX_LAYERS)
    return keep, signatures[:keep]


def tiny_config(full, model: nn.Module | None = None):
    """(the tiny config of ``full``, a language model's config (see language_config), notes on what was changed
    beyond widths). ``model``: ``full``'s model on the meta device (built here when not given). A change the config
    class refuses (GLM-5-Next's index_topk must divide by its index_kpool) is undone and named in the notes."""
    fields, notes, changed = tiny_fields(full, model)
    for _ in range(len(changed) + 1):
        try:
            return type(full)(**fields), notes
        except Exception as exc:  # noqa: BLE001 - the class's validation, whatever it raises
            message = one_line(exc)
            undo = [name for name in changed if name in message and fields[name] != changed[name]]
            if not undo:
                raise WorkbenchError(f"{type(full).__name__} refuses the tiny config: {message}") from None
            for name in undo:
                fields[name] = changed[name]
                notes.append(f"{name} kept at {changed[name]}: {message}")
    raise WorkbenchError(f"{type(full).__name__} refuses the tiny config")


def tiny_fields(full, model: nn.Module | None = None) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The fields of a tiny config of ``full`` (see ``tiny_config``), notes on what was changed beyond widths, and
    every changed field's full value."""
    model = model if model is not None else build(full)
    fields = {k: v for k, v in full.to_dict().items() if not k.startswith("_")}
    original = dict(fields)
    notes: list[str] = []
    count, count_field, _ = layer_count(full, model)
    keep, _ = kept_layers(full, model)
    for name in LAYER_COUNTS:  # the other counts in proportion (Longcat's num_hidden_layers: two per layer)
        value = fields.get(name)
        if isinstance(value, int) and value % count == 0:
            fields[name] = value // count * keep
    if keep < count:
        for name, value in list(fields.items()):
            if isinstance(value, list) and len(value) == count:
                fields[name] = value[:keep]
    for name, tiny in WIDTHS.items():
        value = fields.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > tiny:
            fields[name] = tiny
        elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):  # a width per layer
            fields[name] = [min(v, tiny) for v in value]
    for name, other in LINKED:
        if name in fields and other in fields and original[name] == original[other]:
            fields[name] = fields[other]
    if "qk_head_dim" in fields and "qk_nope_head_dim" in fields:
        fields["qk_head_dim"] = fields["qk_nope_head_dim"] + fields["qk_rope_head_dim"]
    heads, kv = getattr(full, "num_attention_heads", None), getattr(full, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv, int) and "num_key_value_heads" in fields:
        fields["num_key_value_heads"] = fields["num_attention_heads"] if kv == heads else 1 if kv == 1 else 2
    for name, tiny in SELECTIONS.items():
        value = fields.get(name)
        if isinstance(value, int) and value > tiny:
            fields[name] = tiny
            notes.append(f"{name} {value} -> {tiny}: the tiny inputs ({TOKENS} tokens) reach past it")
    _experts(fields, notes)
    for name in TOKEN_IDS:
        value = fields.get(name)
        if isinstance(value, int) and value >= fields.get("vocab_size", 1 << 62):
            fields[name] = None if name != "pad_token_id" else 0
    return fields, notes, {k: original[k] for k in fields if k in original and fields[k] != original[k]}


def _experts(fields: dict[str, Any], notes: list[str]) -> None:
    """At most MAX_EXPERTS experts, the routing groups kept where they still hold two experts each, top-k scaled to
    keep k / E about as it is (at least 2 where E allows) and within the kept groups."""
    name = next((n for n in EXPERT_COUNTS if isinstance(fields.get(n), int)), None)
    if name is None or fields[name] <= MAX_EXPERTS:
        return
    total, experts = fields[name], MAX_EXPERTS
    fields[name] = experts
    group_name = next((n for n in GROUPS if isinstance(fields.get(n), int)), None)
    groups = fields[group_name] if group_name else 1
    if group_name and (experts % groups or experts // groups < 2):
        fields[group_name] = groups = 1
        if isinstance(fields.get("topk_group"), int):
            fields["topk_group"] = 1
    kept = min(fields.get("topk_group") or groups, groups)
    k_name = next((n for n in TOP_KS if isinstance(fields.get(n), int)), None)
    if k_name:
        k = fields[k_name]
        fields[k_name] = min(max(min(2, experts), min(k, round(k * experts / total) or 1)),
                             kept * experts // groups)
    if isinstance(fields.get("zero_expert_num"), int) and fields["zero_expert_num"] > 0:
        fields["zero_expert_num"] = max(1, fields["zero_expert_num"] * experts // total)
    notes.append(f"{name} {total} -> {experts}" + (f", {k_name} {k} -> {fields[k_name]}" if k_name else ""))
