"""Onboarding: a model card from a Hugging Face-style ``config.json``.

The architecture is recognised by its fields, not its name: experts by their counts, MLA by ``kv_lora_rank``, DSA by
``index_topk``, KDA by ``linear_attn_config``, latent experts by ``routed_expert_hidden_size``, the activation by
``hidden_act``, the layer schedule by the layer lists and ``first_k_dense_replace``. Each part maps to catalog blocks
at the model's sizes, with the number of layers it runs in. Every value in the card says where it came from
(``source: config`` and the field) or that the workbench assumed it (``source: assumption`` and why). A part the
catalog has no spec for is still a block of the card, named for what it is, with ``gap`` (``no spec: <what>``) and
the config fields that revealed it: ``workbench plan`` shows it as "no spec" until a block of that name exists.

A nested ``text_config`` (multimodal configs) is read first, the top level second.

Where the installed transformers knows the config's model_type (registered here or not), the config is read
through its class (its defaults and aliases fill what the json omits: ``source: class``) and the family's code is
probed (workbench.integrations.probe): every module class of the model gets a row (``modules``: covered, differs,
no spec or framework, with the probe's measured error), the variants the probe proved (the router's score function,
renormalization, scale and groups) replace the config's reading (``source: probe``), every block entry says what
proves it (``evidence``) or how it differs, and the gaps are the modules no block computes. Where transformers has
no class for it, the card comes from the field rules alone and every block entry says it was not checked against
code.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import yaml

from workbench import weights
from workbench.blocks import REGISTRY
from workbench.blocks._config import (
    DECODE_BATCH,
    DECODE_CONTEXT,
    LORA_RANK,
    PREFILL_SEQUENCES,
    TOKENS,
    Config,
    Found,
    ModelConfig,
)
from workbench.blocks.base import FAMILIES
from workbench.errors import WorkbenchError
from workbench.integrations.class_view import ClassView, class_view
from workbench.integrations.kinds import NO_SPEC
from workbench.integrations.probe import COVERED, ProbeResult, Row, probe

LATENT_MOE = ("latent MoE: the routed experts run at this width, between a down projection from the hidden size (no "
              "norm) and an up projection back; the combined routed output is RMS-normalised before the up "
              "projection (latent_moe_use_norm; vLLM kimi_k3 KimiRoutedOutputTransform): the rmsnorm block at this "
              "width, the projections dense GEMMs like every projection of the model")


def read_config(path: str | Path) -> tuple[dict, Path]:
    """The config dict of a config.json, of a folder holding one, or of a bare model_type transformers knows (its
    class's defaults: ``{"model_type": ...}``, file ``<model_type>``); WorkbenchError for anything unreadable."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        if _known_model_type(str(path)):
            return {"model_type": str(path)}, Path(str(path))
        raise WorkbenchError(f"no config at {file} (and transformers knows no model_type '{path}')")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"{file} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WorkbenchError(f"{file} is not a model config: a JSON {type(data).__name__}, not an object")
    probe = Config(data)
    known = _known_model_type(data.get("model_type")) or _known_model_type((probe.text or {}).get("model_type"))
    if not known and (probe.field("hidden_size", "d_model")[0] is None
                      or probe.field("num_hidden_layers", "n_layer", "num_layers")[0] is None):
        raise WorkbenchError(f"{file} is not a model config: no hidden_size and num_hidden_layers "
                             "(at the top or in text_config), and transformers knows no model_type in it")
    return data, file


def _known_model_type(model_type) -> bool:
    """Whether the installed transformers (or a family registered here) has a config class for ``model_type``."""
    if not isinstance(model_type, str):
        return False
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return False
    from workbench.integrations.transformers import own_model

    return model_type in CONFIG_MAPPING or own_model(model_type) is not None


def default_name(file: Path, data: dict) -> str:
    """The card's name: the folder of a config.json, else the file's stem without ".config"."""
    stem = file.parent.name if file.name == "config.json" else file.name.removesuffix(".json").removesuffix(".config")
    return re.sub(r"[^a-z0-9.]+", "-", (stem or str(data.get("model_type", "model"))).lower()).strip("-")


def _fact(value, field: str | None, note: str = "") -> dict:
    """A fact and its source: config (the json ``field``), class (the config class's reading: "<name> (<Class>
    default)"), probe (measured from the family's code: "probe: ..."), or assumption (``note`` says why)."""
    if not field:
        fact = {"value": value, "source": "assumption"}
    elif field.startswith("probe:"):
        fact = {"value": value, "source": "probe", "field": field.removeprefix("probe:").strip()}
    elif field.endswith(" default)"):
        fact = {"value": value, "source": "class", "field": field}
    else:
        fact = {"value": value, "source": "config", "field": field}
    return {**fact, "note": note} if note else fact


class _Card:
    """The card being built: facts, blocks (with their layer counts and sources), gaps."""

    def __init__(self) -> None:
        self.facts: dict[str, dict] = {}
        self.blocks: dict[str, dict] = {}

    def fact(self, name: str, value, field: str | None, note: str = "") -> None:
        if value is not None:
            self.facts[name] = _fact(value, field, note)

    def block(self, name: str, found: Found, gap: str = "") -> None:
        """A catalog block (or, with ``gap``, a part without a spec) as ``found``. A block added again for another
        role (the activation of the dense layers and of the shared experts) runs in the layers of both."""
        entry = self.blocks.setdefault(name, {"role": found.role, "shapes": []})
        if entry["role"] != found.role:
            entry["role"] = f"{entry['role']}; {found.role}"
            entry["layers"] = entry.get("layers", 0) + (found.layers or 0)
        elif found.layers is not None:
            entry["layers"] = max(entry.get("layers", 0), found.layers)
        entry["shapes"] += [s for s in found.shapes if s not in entry["shapes"]]
        entry["fields"] = sorted(set(entry.get("fields", [])) | {f for f in found.fields if f})
        if gap and name not in REGISTRY:  # as the catalog grows, the same config leaves fewer gaps
            entry["gap"] = f"no spec: {gap}"
        if found.differs:
            entry["differs"] = found.differs


def onboard(path: str | Path, name: str | None = None) -> dict:
    """The model card (a dict in the YAML layout of workbench/models) for the config at ``path`` (or a bare
    model_type transformers knows)."""
    started = time.monotonic()
    data, file = read_config(path)
    view = _class_view(data)
    found = _probe(view)
    rows = found.rows if isinstance(found, ProbeResult) else None
    card = _Card()
    cfg = Config(data, measured=measured_fields(rows or []),  # the project's own model reads its json as given
                 resolve=view.value if isinstance(view, ClassView) and not view.own_model else None)
    if isinstance(view, ClassView) and rows is not None:
        view.modules = [{"class": r.cls, "blocks": r.blocks, "status": r.status} for r in rows]
    model = _model_config(cfg, card, view)
    for family in FAMILIES:  # each block's own rule
        for spec in REGISTRY.values():
            if spec.family == family and spec.onboard is not None:
                for entry in spec.onboard(model):
                    card.block(spec.name, entry)
    for block in list(card.blocks):  # a variant's entries replace its base's (BlockSpec.supersedes)
        for base in REGISTRY[block].supersedes if block in REGISTRY else ():
            card.blocks.pop(base, None)
    if isinstance(found, ProbeResult):
        _evidence(card, found)
    covered = {REGISTRY[b].family for b in card.blocks if b in REGISTRY}
    for family, rule in UNCOVERED.items():  # the parts of a family no block (found by a rule or the probe) covers
        if family not in covered:
            rule(model, card)
    if isinstance(found, ProbeResult):
        _probe_gaps(card, found)
    _other_parts(model, card)

    name = name or default_name(file, data)
    arch = ", ".join(data.get("architectures") or []) or str(data.get("model_type", "unknown family"))
    source = file.name if file.is_file() else f"the {arch} class's defaults"
    result = {"name": name, "title": f"{name} ({arch}, onboarded from {source})",
              "onboarded_from": {"file": str(file) if file.is_file() else None, "model_type": data.get("model_type")},
              "facts": card.facts, "blocks": card.blocks, "weights": weights.summary(model),
              "unread_fields": model.cfg.unread()}
    if isinstance(view, str):
        result["transformers"] = {"error": view}
    elif view is not None:
        result["onboarded_from"]["class"] = view.model_class
        result["transformers"] = view.as_dict()
    if isinstance(found, ProbeResult):
        result["probe"] = found.as_dict()
        result["transformers"]["modules"] = result["probe"].pop("modules")
    elif view is not None and not isinstance(view, str) and view.own_model:
        _own_model_evidence(card, view)
    else:
        if isinstance(found, str):
            result["probe"] = {"error": found}
        why = found if isinstance(found, str) else (view if isinstance(view, str) else
                                                    f"transformers has no class for model_type "
                                                    f"'{data.get('model_type')}'")
        for info in card.blocks.values():
            if "gap" not in info:
                info["evidence"] = f"config fields only, not checked against code: {why}"
    result["onboard_seconds"] = round(time.monotonic() - started, 1)
    return result


def _probe(view) -> ProbeResult | str | None:
    """The probe of the view's config (a ProbeResult), its one-line failure, or None where there is no transformers
    code to probe (no view, or a family whose model is the project's own)."""
    if not isinstance(view, ClassView) or view.own_model:
        return None
    try:
        return probe(view.config)
    except WorkbenchError as exc:
        return f"the probe could not run the family's code: {exc}"


def measured_fields(rows: list[Row]) -> dict[str, tuple]:
    """The config fields the probe measured, as (value, "probe: ...") for the blocks' rules: a covered router's
    score function, renormalization, route scale and groups, whatever the config calls them; a covered gated MLP's
    SwiGLU limit as ``mlp_swiglu_limit`` (None where it does not clamp, whatever the config's swiglu_limit says:
    HY-V4's is its experts')."""
    out: dict[str, tuple] = {}
    for row in rows:
        if row.kind not in ("router", "gated_mlp") or row.status != COVERED:
            continue
        source = f"probe: {row.cls} reproduced as {row.variant} (error {max(row.error.values()):.1e})"
        value = {name: info["value"] for name, info in row.params.items()}
        fields = (("mlp_swiglu_limit", "limit"),) if row.kind == "gated_mlp" else (
            ("scoring_func", "score"), ("norm_topk_prob", "renormalize"), ("moe_renormalize", "renormalize"),
            ("routed_scaling_factor", "scale"), ("n_group", "groups"), ("num_expert_group", "groups"),
            ("topk_group", "kept_groups"))
        for field_name, key in fields:
            out[field_name] = (value[key], source)
    return out


SERVING_FORMS = {"kda_decode": "kda", "kda_prefill": "kda", "kda_short_conv_decode": "kda_short_conv",
                 "kda_short_conv_prefill": "kda_short_conv", "mla_decode": "mla", "mla_prefill": "mla",
                 "dsa_decode": "dsa_sparse_attention", "dsa_prefill": "dsa_sparse_attention",
                 "dsa_indexer_decode": "dsa_indexer", "dsa_indexer_prefill": "dsa_indexer",
                 "dsa_kpool_indexer_decode": "dsa_kpool_indexer",
                 "attention_decode": "attention", "attention_prefill": "attention",
                 "moe_grouped_gemm_mxfp4": "moe_grouped_gemm", "moe_topk": "moe_router"}
"""The serving and quantized forms of a block: proven where the block they serve is (the probe runs a training
forward; moe_topk is moe_router's routing on the logits the serving engine's gate computed)."""
NOT_MODULES = {"seq_chunked_ce": "the loss (the logits head and cross-entropy): not a module the probe runs",
               "vocab_blockwise_ce": "the loss (the logits head and cross-entropy): not a module the probe runs",
               "lora_linear": "the fine-tuning recipe's adapters: not a module of the published model",
               "hyper_connection_mix": "a step of the decoder layer's forward (post * y + comb^T @ residual), not a "
                                       "module: the probe proves it where the layer is replaced (GLM-5-Next's "
                                       "family patch; the hyper_connected_layer kind, DeepSeek-V4's layout); not "
                                       "checked against this code"}


def _evidence(card: _Card, result: ProbeResult) -> None:
    """Hold every block entry of ``card`` to the probe's rows: the rows that prove it (``evidence``), the rows that
    compute another variant (``differs``), none (``differs``: no module computes it); add the blocks rows prove that
    no rule found."""
    rows = [r for r in result.rows if r.blocks and not r.within]  # covered, differs, or an adapter that failed
    for block, info in list(card.blocks.items()):
        if "gap" in info:
            continue
        base = SERVING_FORMS.get(block, block)
        mine = [r for r in rows if base in r.blocks]
        proven = [r for r in mine if r.status == COVERED]
        other = [r for r in mine if r.status != COVERED]
        if proven:
            worst = max(max(r.error.values()) for r in proven)
            info["evidence"] = f"probe: {', '.join(f'{r.cls} ({r.variant})' for r in proven)} reproduced by the " \
                               f"references within {worst:.1e}" + (" (the block it serves)" if base != block else "")
        if other:
            info["differs"] = "; ".join(f"{r.cls}: {r.differs}" for r in other)
        if not mine:
            if base in NOT_MODULES:
                info["evidence"] = NOT_MODULES[base]
            else:
                info["differs"] = f"no module of {result.model_class} computes {base} (probe)" + \
                    (f"; the config's fields named it: {', '.join(info.get('fields', []))}" if info.get("fields")
                     else "") + (f"; {info['differs']}" if info.get("differs") else "")  # the rule's reading kept
    for row in rows:  # a block the code proves and no field rule found
        for block in row.blocks:
            if block not in card.blocks and row.status == COVERED:
                card.block(block, Found(f"{row.role} ({row.cls}, found by the probe; no config field gave its "
                                        "sizes)", row.count, [], [f"probe: {row.cls}"]))
                card.blocks[block]["evidence"] = f"probe: {row.cls} ({row.variant})"


def _probe_gaps(card: _Card, result: ProbeResult) -> None:
    """A gap for every module class the probe found no block for (the evidence of a rule's gap where one names
    it)."""
    for row in result.rows:
        if row.status == NO_SPEC and not row.within and not row.blocks and "outside the language model" not in row.role:
            name = gap_name(row.cls, result.model_class, row.role)
            if name in card.blocks:  # a rule's gap for it (with the sizes the block will need): the probe's evidence
                card.blocks[name]["evidence"] = f"probe: {row.cls}: {row.role}"
                continue
            card.block(name, Found(f"{row.role} ({row.cls})", row.count, [], [f"probe: {row.cls}"]),
                       gap=f"{row.role} ({row.cls})")


def _own_model_evidence(card: _Card, view: ClassView) -> None:
    """A family whose model is the project's own (workbench.kimi_k3): its modules compute through the catalog's
    references, so no probe of them against themselves proves anything; every block says whose code it follows."""
    blocks = {b for m in view.modules for b in m["blocks"]}
    for block, info in card.blocks.items():
        if "gap" not in info:
            info["evidence"] = (f"{view.model_class} ({view.code.split(':')[0]}) calls it; not probed: that model "
                                "computes through the blocks' references") if SERVING_FORMS.get(block, block) \
                in blocks or block in blocks else NOT_MODULES.get(block, f"no module of {view.model_class} calls it")


def gap_name(cls: str, model_class: str, role: str) -> str:
    """A gap's name from a module class: snake case, the family's prefix dropped ("DeepseekV4HyperConnection" ->
    "hyper_connection"); "softmax_attention" for every softmax-attention class no kind reads as the attention
    block; a name a catalog block has gets "_variant" (the module computes another variant of that block)."""
    if role.startswith("softmax attention"):
        return "softmax_attention"
    prefix = 0
    while prefix < min(len(cls), len(model_class)) and cls[prefix] == model_class[prefix]:
        prefix += 1
    while prefix and not cls[prefix].isupper():  # back to the start of a word
        prefix -= 1
    stem = cls[prefix:] or cls
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", stem).lower()
    return f"{name}_variant" if name in REGISTRY else name


def _model_config(cfg: Config, card: _Card, view) -> ModelConfig:
    """The model-level reading every block's rule shares (the sizes, the layer counts by kind), and the model's
    facts in the card."""
    d, d_field = cfg.integer("hidden_size", "d_model")
    layers, layers_field = cfg.integer("num_hidden_layers", "n_layer")
    vocab, vocab_field = cfg.integer("vocab_size")
    heads, heads_field = cfg.integer("num_attention_heads", "n_head")
    kv_heads, kv_field = cfg.integer("num_key_value_heads")
    mla = cfg.field("kv_lora_rank")[0] is not None  # MLA has its own head sizes
    head_dim, head_dim_field = (None, None) if mla else cfg.integer("head_dim")
    if head_dim is None and heads and not mla:
        head_dim, head_dim_field = d // heads, None
    for fact, value, field in (("hidden_size", d, d_field), ("num_layers", layers, layers_field),
                               ("vocab_size", vocab, vocab_field), ("attention_heads", heads, heads_field),
                               ("kv_heads", kv_heads, kv_field)):
        card.fact(fact, value, field)
    card.fact("head_dim", head_dim, head_dim_field, "" if head_dim_field else "hidden_size / num_attention_heads")
    card.fact("context_length", *cfg.integer("max_position_embeddings"))
    card.fact("tokens_per_step", TOKENS, None, "the model suite's tokens per step (batch x sequence)")
    card.fact("decode_batch", DECODE_BATCH, None, "the model suite's sequences decoded at once (the serving forms)")
    card.fact("decode_context", DECODE_CONTEXT, None, "tokens each decoded sequence holds in its cache (the "
              "attention decode forms)")
    card.fact("prefill_sequences", PREFILL_SEQUENCES, None, "prompts packed into the tokens per step (the packed "
              "prefill forms)")

    kda_layers, kda_field = _layer_list(cfg, "linear_attn_config", "kda_layers")
    full_layers, full_field = _layer_list(cfg, "linear_attn_config", "full_attn_layers")
    linear, linear_field = cfg.field("linear_attn_config")
    kda = len(kda_layers or [])
    full = len(full_layers) if full_layers is not None else layers - kda
    card.fact("kda_layers", kda, kda_field)
    if kda_layers is not None:
        kinds = "".join("K" if i + 1 in kda_layers else "F" for i in range(layers))
        card.fact("layer_kinds", kinds, kda_field, "one letter per layer, K KDA, F full attention: the layer lists "
                  "are 1-indexed ((l + 1) in kda_layers)")
    card.fact("full_attention_layers", full, full_field or None, "" if full_field else "the layers that are not KDA")
    model = ModelConfig(cfg=cfg, hidden=d, hidden_field=d_field, layers=layers, vocab=vocab, vocab_field=vocab_field,
                        heads=heads, heads_field=heads_field, head_dim=head_dim, kda_layers=kda, full_layers=full,
                        linear=linear if isinstance(linear, dict) else {}, linear_field=linear_field, view=view)
    if kda:
        model.kda_heads, heads_from = _kda_size(model, "num_heads", "linear_num_heads", heads, heads_field)
        model.kda_head_dim, dim_from = _kda_size(model, "head_dim", "linear_head_dim", head_dim, head_dim_field)
        model.kda_fields = [kda_field, heads_from, dim_from]
    if full:
        kv_rank, kv_rank_field = cfg.integer("kv_lora_rank")
        if kv_rank:
            card.fact("kv_lora_rank", kv_rank, kv_rank_field)
            card.fact("q_lora_rank", *cfg.integer("q_lora_rank"))
        card.fact("dsa_topk", *cfg.integer("index_topk"))
    _experts(cfg, card, model)
    card.fact("rms_norm_eps", *cfg.field("rms_norm_eps"))
    card.fact("attnres_block_size", *cfg.integer("attn_res_block_size"))
    card.fact("lora_rank", LORA_RANK, None, "not in a config: the fine-tuning recipe's choice")
    return model


def _kda_size(model: ModelConfig, key: str, class_attr: str, fallback: int | None, fallback_field: str | None
              ) -> tuple[int | None, str | None]:
    """A KDA size and where it comes from: linear_attn_config's ``key``, else the transformers class's value (its
    default where the config is silent: Kimi Linear's KDA heads are 128 wide whatever head_dim says), else the
    attention's."""
    if model.linear.get(key):
        return model.linear[key], f"{model.linear_field}.{key}"
    value, field = model.class_value(class_attr, "kda")
    return (value, field) if value is not None else (fallback, fallback_field)


def _class_view(data: dict) -> ClassView | str | None:
    """The config as its transformers class reads it (workbench.integrations.class_view), None when transformers
    knows neither its model_type nor its text's (or is not installed), or the class's one-line refusal."""
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


ACTIVE = ("num_experts_per_token", "num_experts_per_tok", "moe_topk")
"""The config fields that name how many routed experts each token runs, in the order they are read."""


def _experts(cfg: Config, card: _Card, model: ModelConfig) -> None:
    """The MoE part of ``model`` (experts, active experts, MoE layers, the experts' sizes) and its facts."""
    experts, e_field = cfg.integer("num_experts", "n_routed_experts", "num_local_experts")
    if not experts:
        return
    k, k_field = cfg.integer(*ACTIVE)
    first_dense, fd_field = cfg.integer("first_k_dense_replace")
    freq, _ = cfg.integer("moe_layer_freq")
    moe_layers = len([i for i in range(first_dense or 0, model.layers)
                      if (i - (first_dense or 0)) % (freq or 1) == 0])
    width, width_field = cfg.integer("moe_intermediate_size")
    if width is None:  # Mixtral: the experts' width is intermediate_size
        width, width_field = cfg.integer("intermediate_size")
    latent, latent_field = cfg.integer("routed_expert_hidden_size")
    scale, scale_field = cfg.field("routed_scaling_factor")
    for fact, value, field in (("routed_experts", experts, e_field), ("active_experts", k, k_field),
                               ("moe_layers", moe_layers, fd_field or None), ("expert_ffn_size", width, width_field),
                               ("expert_width", latent, latent_field), ("route_scale", scale, scale_field)):
        note = {"moe_layers": "the layers from first_k_dense_replace on" if field else "every layer",
                "expert_width": LATENT_MOE}
        card.fact(fact, value, field, note.get(fact, ""))
    if latent:
        norm, norm_field = cfg.field("latent_moe_use_norm")
        card.fact("latent_moe_norm", bool(norm), norm_field, "the RMSNorm of the combined routed output, before the "
                  "up projection (rmsnorm's shape at the expert width)")
    card.fact("shared_experts", *cfg.integer("num_shared_experts", "n_shared_experts"))
    if k is None:  # the routed experts cannot be sized (ModelConfig.routed): a gap
        card.block("routed_experts", Found(f"routing over {experts} experts", moe_layers, [], [e_field]),
                   gap=f"routed experts with no active-expert count (the config sets none of {', '.join(ACTIVE)})")
    model.experts, model.experts_field, model.active, model.active_field = experts, e_field, k, k_field
    model.moe_layers, model.expert_ffn, model.expert_ffn_field = moe_layers, width, width_field
    model.expert_width, model.expert_width_field = latent, latent_field


def _unrecognised_linear_attention(model: ModelConfig, card: _Card) -> None:
    """A linear_attn_config, or layer_types naming linear-attention layers, that no block's rule recognised."""
    linear, linear_field = model.field("linear_attn_config")
    layer_types, lt_field = model.field("layer_types")
    linear_kinds = isinstance(layer_types, list) and any(any(w in str(k) for w in weights.LINEAR_KINDS)
                                                         for k in layer_types)
    if isinstance(linear, dict) or linear_kinds:
        card.block("linear_attention", Found("a linear-attention layer kind the workbench does not recognise", None,
                                             [], [linear_field, lt_field]),
                   gap="linear attention of an unrecognised kind")


def _unrecognised_attention(model: ModelConfig, card: _Card) -> None:
    """Full-attention layers that no block's rule recognised (the attention and mla rules read every config with
    heads): a gap named for them."""
    if model.full_layers:
        card.block("unrecognised_attention", Found("the full-attention layers", model.full_layers, [], []),
                   gap="attention of an unrecognised kind (no num_attention_heads)")


def _ungated_activation(model: ModelConfig, card: _Card) -> None:
    """An FFN activation no block's rule computes, named for the config's hidden_act."""
    act, act_field = model.activation()
    for where, layers, shape, fields in model.gated_ffns():
        card.block(f"{act}_activation", Found(f"{act} activation of the {where}", layers, [shape],
                                              [act_field, *fields]), gap=f"{act} activation")


UNCOVERED = {"linear_attention": _unrecognised_linear_attention, "attention": _unrecognised_attention,
             "activation": _ungated_activation}
"""For a family whose blocks' rules found nothing: the part of the model the config still shows, as a gap."""


def _other_parts(model: ModelConfig, card: _Card) -> None:
    """Parts outside the decoder's blocks that a port still has to cover."""
    quant, q_field = model.field("quantization_config")
    covered = any(q_field in entry.get("fields", []) for entry in card.blocks.values())  # a block reads the format
    if isinstance(quant, dict) and not covered:
        fmt = quant.get("format") or quant.get("quant_method") or "quantized"
        card.block("quantized_weights", Found(f"weights shipped as {fmt}", None, [], [q_field]),
                   gap=f"{fmt} weight dequantization / quantized GEMM")
    mtp, mtp_field = model.integer("num_nextn_predict_layers")
    if mtp:
        card.block("mtp_head", Found(f"{mtp} multi-token-prediction layer(s)", mtp, [], [mtp_field]),
                   gap="multi-token prediction head")
    vision, v_field = model.field("vision_config")
    if isinstance(vision, dict):
        card.block("vision_tower", Found("the vision encoder", None, [], [v_field]), gap="vision tower")


def write_card(card: dict, out_dir: str | Path) -> Path:
    """``card`` as ``<out_dir>/<name>.yaml``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{card['name']}.yaml"
    source = card["onboarded_from"]["file"] or f"the {card['onboarded_from']['model_type']} class's defaults"
    header = f"# Onboarded from {source} by `workbench onboard`: every value says its source (config: the field; " \
             "class: the config class's reading; probe: measured from the family's code; assumption: why).\n"
    timeless = {k: v for k, v in card.items() if k != "onboard_seconds"}  # a card is the same however fast it came
    if "probe" in timeless:
        timeless["probe"] = {k: v for k, v in timeless["probe"].items() if k != "seconds"}
    path.write_text(header + yaml.safe_dump(timeless, sort_keys=False, width=118))
    return path
