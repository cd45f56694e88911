"""The architecture of a replay model, read from a model card: which attention runs in each layer of the preset and
how the card's model is assembled (the replay model is Kimi K3's text model, workbench.kimi_k3, at the preset's
sizes: workbench.replay.model).

    layers        the preset's schedule (K = linear attention, F = full attention) resolved against the card:
                  K -> KDA ("K") when the card has kda, F -> the card's full-attention kinds in turn, gated DSA ("D")
                  before MLA ("M") (Kimi K3.1 Pro puts DSA in some of K3's MLA layers); a card without KDA runs every
                  layer as full attention. KDA runs its short convolution and its decay gate (kda_short_conv and
                  kda_gate: a card with kda has both)
    gate          KDA's decay gate in the card's form: "bounded" (lower bound -5) or "softplus"
    route_scale   the routed experts' weight scale: the card's route_scale (its config's routed_scaling_factor),
                  1.0 when the card does not say
    experts       the MLPs' activation, the routed experts' (moe_grouped_gemm's ``act`` in the card: swiglu or situ),
                  also the shared expert's and the dense layer's
    latent        latent MoE (the card's expert_width differs from its hidden size): routed experts at half the
                  hidden width, between a down projection and, after the combined output's RMSNorm, an up projection
    attnres       Block AttnRes (the card has attnres), else the plain pre-norm residual
    dense_first   the first layer's FFN a dense MLP (the card has fewer MoE layers than layers:
                  first_k_dense_replace), the others routed MoE

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
    gate: str
    route_scale: float
    experts: str
    latent: bool
    attnres: bool
    dense_first: bool

    @property
    def blocks(self) -> tuple[str, ...]:
        """Every block the model calls, in catalog order (the K3 model's training forms: tests hold the two
        equal)."""
        used = set(ALWAYS) | set(MOE_BLOCKS) | {self.experts}
        if not self.attnres:
            used.discard("attnres")
        if "K" in self.layers:
            used |= set(_called_in("K"))
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
    if linear and not {"kda_short_conv", "kda_gate"} <= has:
        raise WorkbenchError(f"model {model}: its KDA layers need kda_short_conv and kda_gate in the card (Kimi's KDA "
                             f"layer runs both)")
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
    if linear:
        gate = "softplus" if (card.blocks["kda_gate"].get("shapes") or [{}])[0].get("form") == 1 else "bounded"
    scale = card.facts.get("route_scale", {}).get("value")
    moe_layers, all_layers = (card.facts.get(f, {}).get("value") for f in ("moe_layers", "num_layers"))
    return Architecture(layers="".join(layers), gate=gate, route_scale=1.0 if scale is None else float(scale),
                        experts=ACTIVATIONS[act], latent=_is_latent(card), attnres="attnres" in has,
                        dense_first=bool(moe_layers and all_layers and moe_layers < all_layers))


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
