"""A model's config as the blocks' onboarding rules read it (``BlockSpec.onboard``; workbench.onboard builds it).

``Config`` reads the json's fields (``text_config`` first) and remembers which it read. ``ModelConfig`` adds the
model-level reading every rule shares: the sizes, the layer counts by kind and the class view; each block's rule
turns that into the block's entries of the card (``Found``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import WorkbenchError

TOKENS = 8192  # tokens per step of the model suite: not in a config
LORA_RANK = 64  # the fine-tuning adapters' rank: not in a config
DECODE_BATCH = 128  # sequences decoded at once by the model suite's serving forms: not in a config
DECODE_CONTEXT = 4096  # tokens each of those sequences holds in its cache (the attention decode forms): not in one
PREFILL_SEQUENCES = 16  # prompts packed into the model suite's tokens per step by the packed prefill forms
READ_ELSEWHERE = {"architectures", "model_type", "torch_dtype", "transformers_version", "bos_token_id",
                  "eos_token_id", "pad_token_id", "initializer_range", "use_cache", "tie_word_embeddings",
                  "max_position_embeddings", "rope_theta", "rope_scaling", "attention_dropout", "attention_bias"}


class Config:
    """The config's fields, ``text_config`` first; remembers which fields were read (for ``unread``).

    ``measured``: values the onboarding probe proved from the family's code ({name: (value, source)}), which take
    precedence over the json (the code is what runs); ``resolve(name)``: (value, source) of a field the json does
    not set, as the family's config class reads it (its default, or another field under an alias), else (None,
    None)."""

    def __init__(self, data: dict, measured: dict[str, tuple[Any, str]] | None = None,
                 resolve: Callable[[str], tuple[Any, str | None]] | None = None):
        self.top = data
        self.text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
        self.read: set[str] = set()
        self.measured = measured or {}
        self.resolve = resolve

    def field(self, *names: str) -> tuple[Any, str | None]:
        """(value, where it came from) of the first of ``names`` that is set: the probe's measurement, the json
        ("text_config.<name>" or "<name>"), or the config class's reading; (None, None)."""
        for name in names:
            if name in self.measured:
                return self.measured[name]
            for where, prefix in ((self.text, "text_config."), (self.top, "")):
                if name in where:
                    self.read.add(prefix + name)
                if where.get(name) is not None:
                    return where[name], prefix + name
        for name in names if self.resolve is not None else ():
            value, source = self.resolve(name)
            if value is not None:
                return value, source
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


@dataclass(frozen=True)
class Found:
    """One entry a block's rule adds to the card: its role in the model, the layers it runs in (None: outside the
    decoder layers, or in all of them by construction), its shapes at the model's sizes, the config fields those
    came from, and ``differs``: how the config's variant differs from what the block computes ("" when it does not)."""

    role: str
    layers: int | None
    shapes: list[dict]
    fields: list[str | None]
    differs: str = ""


@dataclass
class ModelConfig:
    """The model-level reading of a config that every block's rule shares. Sizes with the field they came from
    (``*_field``: None when derived); layer counts by kind; ``linear``: linear_attn_config (or {}); ``view``: the
    config as its transformers class reads it (workbench.integrations.class_view), None, or that class's error."""

    cfg: Config
    hidden: int
    hidden_field: str | None
    layers: int
    vocab: int | None
    vocab_field: str | None
    heads: int | None
    heads_field: str | None
    head_dim: int | None
    kda_layers: int
    full_layers: int
    linear: dict
    linear_field: str | None
    kda_heads: int | None = None
    kda_head_dim: int | None = None
    kda_fields: list[str | None] = field(default_factory=list)  # where the KDA layers, heads, head size come from
    experts: int | None = None
    experts_field: str | None = None
    active: int | None = None
    active_field: str | None = None
    moe_layers: int = 0
    expert_ffn: int | None = None
    expert_ffn_field: str | None = None
    expert_width: int | None = None  # latent MoE: the routed experts' width (None: the hidden size)
    expert_width_field: str | None = None
    view: Any = None
    tokens: int = TOKENS
    lora_rank: int = LORA_RANK
    decode_batch: int = DECODE_BATCH

    @property
    def step_tokens(self) -> tuple[int, int]:
        """The tokens of a training step and of a decode step (one per sequence of the decode batch): the sizes of a
        block every token of both passes through (the MoE path)."""
        return self.tokens, self.decode_batch

    @property
    def routed(self) -> bool:
        """Whether the routed experts can be sized: the config names both their count and how many a token runs
        (the routed-expert blocks' rules read nothing otherwise; onboarding names the missing count as a gap)."""
        return bool(self.experts and self.active)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def field(self, *names: str) -> tuple[Any, str | None]:
        return self.cfg.field(*names)

    def integer(self, *names: str) -> tuple[int | None, str | None]:
        return self.cfg.integer(*names)

    def activation(self) -> tuple[str, str | None]:
        """(hidden_act lower-cased, its field): "silu" (assumed) when the config is silent."""
        act, act_field = self.field("hidden_act")
        return str(act or "silu").lower(), act_field

    def gated_ffns(self) -> list[tuple[str, int, dict, list[str | None]]]:
        """The gated FFNs outside the routed experts, as (where, layers, activation shape, fields): the shared
        experts of the MoE layers, then the dense FFN layers."""
        ffns = []
        shared, shared_field = self.integer("num_shared_experts", "n_shared_experts") if self.experts else (0, None)
        if shared and self.expert_ffn:
            ffns.append(("shared experts", self.moe_layers, {"rows": self.tokens, "N": shared * self.expert_ffn},
                         [shared_field, self.expert_ffn_field]))
        width, width_field = self.integer("intermediate_size")
        if self.dense_layers and width:
            ffns.append(("dense FFN layers", self.dense_layers, {"rows": self.tokens, "N": width}, [width_field]))
        return ffns

    def class_value(self, attr: str, block: str) -> tuple[Any, str | None]:
        """The transformers class's value of ``attr`` (the json field, else the class default) when that class has a
        module that calls ``block``; (None, None) otherwise."""
        view = self.view
        if view is None or isinstance(view, str) or not any(block in m["blocks"] for m in view.modules):
            return None, None
        return view.value(attr)
