"""The architecture of a replay model, read from a model card: which attention runs in each layer of the preset and
which of the card's blocks the layers run through.

    layers        the preset's schedule (K = linear attention, F = full attention) resolved against the card:
                  K -> KDA ("K") when the card has kda, F -> the card's full-attention kinds in turn, gated DSA ("D")
                  before MLA ("M") (Kimi K3.1 Pro puts DSA in some of K3's MLA layers); a card without KDA runs every
                  layer as full attention
    short_conv    KDA's q, k and v through kda_short_conv (the card has it)
    gate          KDA's log decay from kda_gate in the card's form: "bounded" (lower bound -5) or "softplus"; ""
                  (no kda_gate in the card): logsigmoid(x W) / 16
    route_scale   the routed experts' weight scale: the card's route_scale (its config's routed_scaling_factor),
                  1.0 when the card does not say
    experts       the routed experts' activation (moe_grouped_gemm's ``act`` in the card: swiglu or situ)
    shared        the shared expert's activation block: situ when the card has it, else swiglu
    latent        latent MoE (the card's expert_width differs from its hidden size): routed experts at half the
                  hidden width, between a down projection with its RMSNorm and an up projection

The replay's MLA applies no rotary embedding (Kimi's ``mla_use_nope``: position comes from the KDA layers).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from workbench.blocks import REGISTRY
from workbench.blocks.moe_grouped_gemm import ACTIVATIONS
from workbench.errors import WorkbenchError
from workbench.models import get_model, list_models


def _called_in(part: str) -> tuple[str, ...]:
    """The catalog's blocks the replay model calls in ``part`` (their ``BlockSpec.replay``)."""
    return tuple(name for name, spec in REGISTRY.items() if spec.replay == part)


FULL_ATTENTION = tuple((letter, _called_in(letter)) for letter in "DM")
"""Full-attention kinds in the order a schedule's full layers take them, with the blocks each needs."""
MOE_BLOCKS = _called_in("moe")
LOSS_BLOCKS = _called_in("loss")
"""Either loss block is the model's loss head (DEFAULT_LOSS unless the other is named)."""
DEFAULT_LOSS = "vocab_blockwise_ce"
ALWAYS = (*_called_in("layer"), DEFAULT_LOSS)
"""Blocks every replay model calls: AttnRes and its norm, the LoRA adapters (LoRA mode), the default loss head."""
CALLABLE = tuple(sorted(name for name, spec in REGISTRY.items() if spec.replay))
"""Every block some replay architecture calls: the blocks whose references the reference curves depend on."""


@dataclass(frozen=True)
class Architecture:
    layers: str
    short_conv: bool
    gate: str
    route_scale: float
    experts: str
    shared: str
    latent: bool

    @property
    def blocks(self) -> tuple[str, ...]:
        """Every block the model calls, in catalog order."""
        used = set(ALWAYS) | set(MOE_BLOCKS) | {self.shared}
        if "K" in self.layers:
            used |= {"kda"} | ({"kda_short_conv"} if self.short_conv else set()) | \
                    ({"kda_gate"} if self.gate else set())
        for letter, blocks in FULL_ATTENTION:
            if letter in self.layers:
                used |= set(blocks)
        return tuple(name for name in REGISTRY if name in used)

    def to_dict(self) -> dict:
        return asdict(self)


def architecture(model: str, schedule: str) -> Architecture:
    """The replay architecture of card ``model`` for a preset's ``schedule`` (K/F letters); WorkbenchError (one
    line) when the card lacks what a replay model needs: routed experts, and an attention the catalog has."""
    card = get_model(model)
    has = {name for name in card.blocks if name in REGISTRY}
    missing = [b for b in MOE_BLOCKS if b not in has]
    if missing:
        raise WorkbenchError(f"model {model}: the replay model has routed MoE layers, the card has no {missing[0]}")
    full = [letter for letter, blocks in FULL_ATTENTION if set(blocks) <= has]
    linear = "K" if "kda" in has else None
    if not full and not linear:
        raise WorkbenchError(f"model {model}: the replay model needs an attention the catalog has (kda, mla or "
                             f"dsa_sparse_attention); the card has none")
    layers, next_full = [], 0
    for letter in schedule:
        if letter == "K" and linear or not full:
            layers.append(linear)
        else:
            layers.append(full[next_full % len(full)])
            next_full += 1
    act = (card.blocks["moe_grouped_gemm"].get("shapes") or [{}])[0].get("act", 0)
    gate = ""
    if "kda_gate" in has:
        gate = "softplus" if (card.blocks["kda_gate"].get("shapes") or [{}])[0].get("form") == 1 else "bounded"
    scale = card.facts.get("route_scale", {}).get("value")
    return Architecture(layers="".join(layers), short_conv="kda_short_conv" in has, gate=gate,
                        route_scale=1.0 if scale is None else float(scale), experts=ACTIVATIONS[act],
                        shared="situ" if "situ" in has else "swiglu", latent=_is_latent(card))


def _is_latent(card) -> bool:
    """Latent MoE: the routed experts' width differs from the hidden size."""
    width, hidden = (card.facts.get(name, {}).get("value") for name in ("expert_width", "hidden_size"))
    return bool(width and hidden and width != hidden)


def replay_model_for(block: str, preferred: str, schedule: str) -> str | None:
    """The card whose replay exercises ``block``: ``preferred`` when its architecture calls the block, else the first
    other card's (by name) that does (mla runs in kimi-k3's tiny replay, not in kimi-k3.1-pro's); None if none."""
    for name in [preferred] + sorted(c.name for c in list_models() if c.name != preferred):
        try:
            blocks = architecture(name, schedule).blocks
        except WorkbenchError:  # a card the replay model cannot be built from
            continue
        if block in blocks or block in LOSS_BLOCKS:
            return name
    return None
