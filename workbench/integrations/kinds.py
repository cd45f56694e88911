"""Module kinds: how a transformers module of any family is computed by the catalog's blocks, read from the module
itself (its parameters, attributes and children), never from its class's name alone.

A ``Kind`` recognises the modules it can read (``match``) and lists the variants a module may compute
(``variants``: the reading first, the block's other modes after); each ``Variant`` is a forward that computes the
module through ``workbench.integrations.ops`` (the promoted operators, or the references in a probe) with the
variant's parameters, each with its source. The onboarding probe (workbench.integrations.probe) runs every variant on
the module's recorded inputs in float64 until one reproduces its outputs and gradients; ``apply_workbench_kernels``
swaps the proven one in (workbench.integrations.families.generic). A module no kind reads is described
(``describe``): framework glue, a part of its parent, or what it computes without a block ("no spec").

    kind                module                                   blocks
    rmsnorm             x / rms(x) * w (or 1 + w, or no weight)  rmsnorm
    layernorm           nn.LayerNorm over the last dim, w and b  layernorm
    rmsnorm_gated       rmsnorm(x) * w * act(gate)               rmsnorm_gated
    gated_mlp           down(act(gate(x)) * up(x)), clamped or not swiglu
    router              top-k routing: (logits, weights, ids)    moe_router
    experts             transformers' experts interface          moe_permute, moe_grouped_gemm, moe_combine
    kda_gate            KDA's forget gate (A_log, dt_bias)       kda_gate
    kda_layer           a KDA layer (Kimi Linear's layout)       kda_short_conv, kda (and kda_prologue)
    short_conv          a causal depthwise conv1d, SiLU or none, kda_short_conv
                        with or without a scaled residual
    hyper_connection    mHC's weights and collapse (fn, base,     hyper_connection
                        scale; Sinkhorn-normalised comb)
    hyper_connected_    a decoder layer of mHC streams: each     hyper_connection_mix
    layer               sub-layer's expand and mix (post * y +
                        comb^T @ residual), DeepSeek-V4's layout
    mla                 MLA attention (DeepSeek's layout)        mla (and rotary)
    attention           softmax attention (the attention registry) attention (and rotary)

A block in parentheses is a variant's optional one (``Variant.optional``): the probe holds the variant with it, a
patch uses it where it is promoted and requested, and the forward computes that part as shipped otherwise.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.blocks.moe_router import SCORE_FUNCS
from workbench.integrations.families import _common
from workbench.integrations.ops import ops


@dataclass(frozen=True)
class Variant:
    """One way the blocks may compute a module: the ``forward(self, *args, **kwargs)`` that computes it with the
    module's ``workbench_variant`` (this variant's ``params``), the parameters' values and sources, and what the
    reading already says the blocks do not compute (``differs``: the probe then measures by how much). ``optional``:
    blocks beyond the kind's that the forward computes where the module's ``workbench_blocks`` names them
    (``install``), else as the module does (a rotary embedding, q/k l2norm)."""

    label: str
    forward: Callable[..., Any]
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    differs: str = ""
    optional: tuple[str, ...] = ()

    def value(self, name: str) -> Any:
        return self.params[name]["value"]


def param(value: Any, source: str) -> dict[str, Any]:
    """A variant parameter: its value and where it was read (``module <Class>.<attr>``, ``config <field>``, or
    ``probe: ...`` for a value only the measurement decides)."""
    return {"value": value, "source": source}


@dataclass(frozen=True)
class Kind:
    name: str
    role: str
    blocks: tuple[str, ...]
    match: Callable[[nn.Module], bool]
    variants: Callable[[nn.Module, Any], list[Variant]]


def _attr(module: nn.Module, *names: str) -> tuple[Any, str | None]:
    """(the first of ``names`` the module sets (not None), ``module <Class>.<name>``)."""
    for name in names:
        value = getattr(module, name, None)
        if value is not None and not isinstance(value, nn.Module | torch.Tensor):
            return value, f"module {type(module).__name__}.{name}"
    return None, None


def _config(config: Any, *names: str) -> tuple[Any, str | None]:
    """(the first of ``names`` the config sets, ``config <name>``)."""
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value, f"config {name}"
    return None, None


def _eps(module: nn.Module) -> tuple[float | None, str | None]:
    return _attr(module, "variance_epsilon", "eps", "epsilon")


def _own(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's own parameters and buffers (not its children's)."""
    return {**dict(module.named_parameters(recurse=False)), **dict(module.named_buffers(recurse=False))}


def activation_name(fn: Any) -> str | None:
    """The ACT2FN name of an activation module or function ("silu", "gelu", ...); None when unknown."""
    from transformers.activations import ACT2CLS

    kind = fn if isinstance(fn, type) else type(fn)
    if kind in (nn.SiLU,) or getattr(fn, "__name__", "") == "silu":
        return "silu"
    for name, cls in ACT2CLS.items():
        target = cls[0] if isinstance(cls, tuple) else cls
        if kind is target:
            return name
    return None


# --- norms -----------------------------------------------------------------------------------------------------


def rmsnorm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """An RMSNorm [..., D] as workbench::rmsnorm with the variant's eps and weight: w, 1 + w (a zero-centred norm) or
    ones (a norm without weight)."""
    form = self.workbench_variant["weight"]["value"]
    weight = hidden_states.new_ones(hidden_states.shape[-1]) if form == "none" else \
        self.weight + 1.0 if form == "1 + w" else self.weight
    return ops.rmsnorm(hidden_states, weight, self.workbench_variant["eps"]["value"])


def _is_rmsnorm(module: nn.Module) -> bool:
    own = _own(module)
    name = type(module).__name__.lower()
    return "rmsnorm" in name and "gated" not in name and not list(module.children()) \
        and set(own) <= {"weight"} and (not own or own["weight"].dim() == 1) and _eps(module)[0] is not None


def _rmsnorm_variants(module: nn.Module, config: Any) -> list[Variant]:
    eps, eps_source = _eps(module)
    forms = ("w", "1 + w") if hasattr(module, "weight") else ("none",)
    return [Variant(f"weight {form}", rmsnorm_forward,
                    {"eps": param(eps, eps_source), "weight": param(form, "probe: the weight form that reproduces "
                                                                           "the module" if len(forms) > 1 else
                                                    f"module {type(module).__name__}: no weight")})
            for form in forms]


def layernorm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """An nn.LayerNorm [..., D] (weight and bias) as workbench::layernorm with the module's eps."""
    return ops.layernorm(hidden_states, self.weight, self.bias, self.workbench_variant["eps"]["value"])


def _is_layernorm(module: nn.Module) -> bool:
    """torch's nn.LayerNorm over the last dim with a weight and a bias (a subclass may compute otherwise: not read)."""
    return type(module) is nn.LayerNorm and len(module.normalized_shape) == 1 and module.weight is not None \
        and module.bias is not None


def _layernorm_variants(module: nn.Module, config: Any) -> list[Variant]:
    return [Variant("weight and bias", layernorm_forward, {"eps": param(module.eps, "module LayerNorm.eps")})]


def gated_rmsnorm_forward(self: nn.Module, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """A gated output norm as workbench::rmsnorm_gated over rows of the last dim, with the variant's activation."""
    n = hidden_states.shape[-1]
    variant = self.workbench_variant
    weight = self.weight + 1.0 if variant["weight"]["value"] == "1 + w" else self.weight
    y = ops.rmsnorm_gated(hidden_states.reshape(-1, n), weight, gate.reshape(-1, n), variant["eps"]["value"],
                          variant["activation"]["value"])
    return y.view(hidden_states.shape)


def _is_gated_rmsnorm(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return "gated" in name and "norm" in name and set(_own(module)) == {"weight"} and _eps(module)[0] is not None


def _gated_rmsnorm_variants(module: nn.Module, config: Any) -> list[Variant]:
    from workbench.blocks.rmsnorm_gated import ACTIVATIONS

    eps, eps_source = _eps(module)
    act, act_source = _attr(module, "activation")
    acts = [(act, act_source)] if act in ACTIVATIONS else [(a, "probe: the gate activation that reproduces the module")
                                                           for a in ACTIVATIONS]
    differs = f"gate activation '{act}': rmsnorm_gated gates by {' or '.join(ACTIVATIONS)}" \
        if act is not None and act not in ACTIVATIONS else ""
    return [Variant(f"{a} gate, weight {form}", gated_rmsnorm_forward,
                    {"eps": param(eps, eps_source), "activation": param(a, source),
                     "weight": param(form, "probe: the weight form that reproduces the module")}, differs)
            for (a, source), form in itertools.product(acts, ("w", "1 + w"))]


# --- MLPs, routers, experts --------------------------------------------------------------------------------------

def _clamps(module: nn.Module, config: Any) -> dict[str, tuple[Any, str]]:
    """{"limit" / "alpha": (value, source)} of the SwiGLU clamp (DeepSeek-V4's, HY-V4's, GLM-5-Next's swiglu_limit)
    and GPT-OSS's alpha a module (``swiglu_<key>`` or ``<key>``) or its config (``swiglu_<key>``) sets."""
    found = {}
    for key in ("limit", "alpha"):  # the module's own attribute (what its forward reads) before the config's field
        value, source = _attr(module, f"swiglu_{key}", key)
        if value is None:
            value, source = _config(config, f"swiglu_{key}")
        if isinstance(value, int | float) and not isinstance(value, bool) and value:
            found[key] = (value, source)
    return found


def _limit_choices(clamps: dict[str, tuple[Any, str]]) -> list[tuple[float | None, str]]:
    """The limits a SwiGLU module's variants try, with their sources: the one it or its config sets (if any), then
    none (the probe keeps the one that reproduces the module)."""
    found = [(float(clamps["limit"][0]), clamps["limit"][1])] if "limit" in clamps else []
    return [*found, (None, "probe: no clamp" if found else "no clamp set")]


def _phrase(clamps: dict[str, tuple[Any, str]]) -> str:
    return ", ".join(f"{key} {value} ({source})" for key, (value, source) in clamps.items())


def mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down_proj(silu(min(gate_proj(x), L)) * clamp(up_proj(x), -L, L)) with the activation as workbench::swiglu
    (L: the variant's limit; None: no clamp)."""
    return self.down_proj(ops.swiglu(self.gate_proj(x), self.up_proj(x), self.workbench_variant["limit"]["value"]))


def _is_gated_mlp(module: nn.Module) -> bool:
    return all(isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")) \
        and hasattr(module, "act_fn") and not _own(module)


def _mlp_variants(module: nn.Module, config: Any) -> list[Variant]:
    """silu(gate) * up with its inputs clamped where the module or its config sets a limit (swiglu's limit), then
    unclamped (HY-V4's config sets swiglu_limit for its experts, its MLP does not clamp): the probe keeps the one
    that reproduces the module. An alpha (GPT-OSS's form, whose up + 1 a gate_proj/up_proj module may or may not
    add) is named, not claimed."""
    act = activation_name(module.act_fn)
    clamps = _clamps(module, config)
    differs = "; ".join(filter(None, [
        f"activation {act or type(module.act_fn).__name__}: swiglu computes silu(a) * b" if act != "silu" else "",
        f"alpha SwiGLU ({_phrase(clamps)}): swiglu's alpha form is not read from a gate_proj/up_proj MLP"
        if "alpha" in clamps else ""]))
    activation = param(act, f"module {type(module).__name__}.act_fn")
    limits = _limit_choices(clamps)
    return [Variant("silu(gate) * up" + (f" clamped at {limit}" if limit else ""), mlp_forward,
                    {"activation": activation, "limit": param(limit, source)}, differs) for limit, source in limits]


def router_forward(self: nn.Module, hidden_states: torch.Tensor, *args) -> tuple:
    """A top-k router (weight [E, D]) as workbench::moe_router with the variant's score function, selection bias,
    renormalization, route scale and groups: returns (router_logits, top_k_weights [N, k], top_k_index [N, k]),
    as transformers' routers do; the logits (x W^T in float32) only when the model asks for them. A bias passed as
    an argument (MiniMax-M2's block passes its e_score_correction_bias) is the call's."""
    v = self.workbench_variant
    x = hidden_states.reshape(-1, self.weight.shape[1])
    bias = _router_bias(self, args)
    weights, ids, _ = ops.moe_router(x, self.weight, bias, int(v["top_k"]["value"]), v["score"]["value"], None,
                                     bool(v["renormalize"]["value"]), float(v["scale"]["value"]),
                                     int(v["groups"]["value"]), int(v["kept_groups"]["value"]))
    return _common.requested_logits(self, x), weights, ids


def _router_bias(self: nn.Module, args: tuple) -> torch.Tensor:
    """The selection bias [E] float32 the variant names: the module's, a child's, the call's argument, or zeros."""
    where = self.workbench_variant["bias"]["value"]
    experts = self.weight.shape[0]
    if where == "argument" and args:
        return args[0].float()
    if where.startswith("child "):
        return getattr(self, where.split()[1]).e_score_correction_bias.float()
    if where == "module":
        return self.e_score_correction_bias.float()
    return torch.zeros(experts, dtype=torch.float32, device=self.weight.device)


def _is_router(module: nn.Module) -> bool:
    weight = _own(module).get("weight")
    takes_k = any(hasattr(module, n) for n in ("top_k", "num_experts_per_tok"))
    return weight is not None and weight.dim() == 2 and takes_k and set(_own(module)) <= {
        "weight", "bias", "e_score_correction_bias"}


def _router_variants(module: nn.Module, config: Any) -> list[Variant]:
    """The score functions and renormalizations moe_router computes, the reading first: the score function the
    module (else the config) names where moe_router computes it (sigmoid, softmax, DeepSeek-V4's sqrtsoftplus), else
    sigmoid where the router carries a selection bias (its own, a child's, or an argument of its forward), softmax
    otherwise, and one other; renormalization and scale as the module (else the config) sets them."""
    import inspect

    cls = type(module).__name__
    k, k_source = _attr(module, "top_k", "num_experts_per_tok")
    child = next((n for n, c in module.named_children() if hasattr(c, "e_score_correction_bias")), None)
    takes_bias = "e_score_correction_bias" in inspect.signature(type(module).forward).parameters
    if hasattr(module, "e_score_correction_bias"):
        bias = param("module", f"module {cls}.e_score_correction_bias")
    elif child:
        bias = param(f"child {child}", f"module {cls}.{child}.e_score_correction_bias")
    elif takes_bias:
        bias = param("argument", f"module {cls}.forward(e_score_correction_bias)")
    else:
        bias = param("none", f"module {cls}: no selection bias")
    renorm, renorm_source = _attr(module, "norm_topk_prob")
    if renorm is None:
        renorm, renorm_source = _config(config, "norm_topk_prob", "moe_renormalize")
    scale, scale_source = _attr(module, "routed_scaling_factor", "route_scale")
    if scale is None:
        scale, scale_source = _config(config, "routed_scaling_factor", "router_scaling_factor", "route_scale")
    groups, groups_source = _attr(module, "num_group", "n_group")
    kept, kept_source = _attr(module, "topk_group")
    func, func_source = _attr(module, "score_func", "scoring_func")
    if func is None:
        func, func_source = _config(config, "scoring_func", "moe_router_activation_func")
    logit_bias = isinstance(getattr(module, "bias", None), torch.Tensor)
    differs = "; ".join(filter(None, [
        f"logits with a bias (module {cls}.bias): moe_router computes x W^T" if logit_bias else "",
        f"score function {func} ({func_source}): moe_router scores with sigmoid, softmax or sqrtsoftplus"
        if func is not None and str(func).lower() not in SCORE_FUNCS else ""]))
    reading = str(func).lower() if str(func).lower() in SCORE_FUNCS else \
        "sigmoid" if bias["value"] != "none" else "softmax"
    scores = (reading, "softmax" if reading != "softmax" else "sigmoid")
    renorms = (bool(renorm), not renorm) if renorm is not None else (True, False)
    scales = [(float(scale), scale_source)] if scale is not None else []
    scales += [(1.0, "probe: no route scale")] if scale != 1.0 else []
    variants = []
    for score, norm, (value, value_source) in itertools.product(scores, renorms, scales):
        variants.append(Variant(
            f"{score}{', renormalized' if norm else ''}, scale {value:g}", router_forward,
            {"score": param(score, (func_source or "reading: sigmoid where a selection bias is carried, else softmax")
                            if score == scores[0] else "probe: the other score function"),
             "renormalize": param(norm, renorm_source if norm == renorms[0] and renorm is not None
                                  else "probe: the other renormalization"),
             "scale": param(value, value_source), "bias": bias, "top_k": param(k, k_source),
             "groups": param(int(groups or 1), groups_source or "module: no groups"),
             "kept_groups": param(int(kept or 1), kept_source or "module: no groups")}, differs))
    return variants


def experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts module through moe_permute, moe_grouped_gemm (SwiGLU, its inputs clamped at the
    variant's limit; None: unclamped) and moe_combine."""
    return _common.grouped_experts(self, hidden_states, top_k_index, top_k_weights,
                                   (*_common.SWIGLU, self.workbench_variant["limit"]["value"]))


def _is_experts(module: nn.Module) -> bool:
    own = _own(module)
    return all(n in own and own[n].dim() == 3 for n in ("gate_up_proj", "down_proj"))


def _experts_variants(module: nn.Module, config: Any) -> list[Variant]:
    """SwiGLU experts, clamped at the module's or config's limit where one is set, then unclamped (the probe keeps
    the one that reproduces the module); an alpha (GPT-OSS's form) is named, not claimed."""
    act = activation_name(getattr(module, "act_fn", None)) if hasattr(module, "act_fn") else None
    act = act or getattr(config, "hidden_act", None)
    layout = _common.experts_supported(module, act or "unknown")
    clamps = _clamps(module, config)
    missing = [n for n in ("intermediate_dim", "num_experts") if not hasattr(module, n)]
    differs = "; ".join(filter(None, [
        layout, f"alpha SwiGLU ({_phrase(clamps)}): the experts' alpha form is not read from the module"
        if "alpha" in clamps else "",
        f"no {', '.join(missing)}: the adapter cannot map its weights" if missing else ""]))
    activation = param(act, "module act_fn / config hidden_act")
    limits = _limit_choices(clamps)
    return [Variant("SwiGLU experts" + (f" clamped at {limit}" if limit else ""), experts_forward,
                    {"activation": activation, "limit": param(limit, source)}, differs) for limit, source in limits]


# --- linear attention --------------------------------------------------------------------------------------------


def forget_gate_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """KDA's forget gate as workbench::kda_gate: f from the low-rank (f_b_proj(f_a_proj(x))) or full-rank (f_proj(x))
    projection [B, T, H, K]; the softplus form, or the bounded one with the variant's lower bound; g float32."""
    heads, dim = self.num_heads, self.head_dim
    proj = self.f_b_proj(self.f_a_proj(hidden_states)) if hasattr(self, "f_a_proj") else self.f_proj(hidden_states)
    f = proj.view(*hidden_states.shape[:2], heads, dim)
    return ops.kda_gate(f, self.A_log.reshape(heads), self.dt_bias.view(heads, dim),
                        self.workbench_variant["lower_bound"]["value"])


def _is_forget_gate(module: nn.Module) -> bool:
    return {"A_log", "dt_bias"} <= set(_own(module)) and (hasattr(module, "f_proj") or hasattr(module, "f_a_proj")) \
        and all(hasattr(module, n) for n in ("num_heads", "head_dim"))


def _forget_gate_variants(module: nn.Module, config: Any) -> list[Variant]:
    bound, source = _attr(module, "safe_gate_lower_bound")
    if bound is None and getattr(module, "safe_gate", False):
        bound, source = _attr(module, "lower_bound")
    rank = "low rank (f_b_proj(f_a_proj(x)))" if hasattr(module, "f_a_proj") else "full rank (f_proj(x))"
    form = f"bounded, lower bound {bound}" if bound is not None else "softplus"
    return [Variant(f"{form}, {rank}", forget_gate_forward,
                    {"lower_bound": param(bound, source or f"module {type(module).__name__}: no lower bound"),
                     "projection": param(rank, f"module {type(module).__name__}")})]


def kda_layer_forward(self: nn.Module, *args, **kwargs) -> torch.Tensor:
    """A KDA layer through kda_short_conv and kda, and kda_prologue where installed with it
    (``_common.kda_layer_forward``)."""
    return _common.kda_layer_forward(self, *args, **kwargs)


def _is_kda_layer(module: nn.Module) -> bool:
    return hasattr(module, "forget_gate") and isinstance(getattr(module, "conv1d", None), nn.Conv1d) \
        and all(hasattr(module, n) for n in ("head_dim", "qkv_dim", "layer_idx", "conv_kernel_size"))


def _kda_layer_variants(module: nn.Module, config: Any) -> list[Variant]:
    why = _common.kda_layer_supported(module)
    gate = "full rank (g_proj)" if hasattr(module, "g_proj") else "low rank (g_b_proj(g_a_proj(x)))"
    return [Variant(f"KDA, output gate {gate}", kda_layer_forward,
                    {"output_gate": param(gate, f"module {type(module).__name__}"),
                     "conv_activation": param(getattr(module, "activation", None),
                                              f"module {type(module).__name__}.activation")}, why,
                    optional=("kda_prologue",))]


SHORT_CONV_FORMS = (("silu", None), ("none", None), ("none", "1 / sqrt(W + 1)"), ("none", "1"), ("silu", "1"),
                    ("silu", "1 / sqrt(W + 1)"))
"""kda_short_conv's forms a short convolution module may compute, (activation, residual scale): KDA's and fla's
silu(conv(x)), a plain conv(x), Inkling2's (conv(x) + x) / sqrt(W + 1), Inkling's conv(x) + x, and SiLU with either
residual."""
SHORT_CONV_RESIDUALS = {"none": 0, "1": 1, "1 / sqrt(W + 1)": 2}
"""Each residual's kda_short_conv ``residual`` dim (``kda_short_conv.variant`` turns it into the scale)."""


def short_conv_forward(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """A causal depthwise short convolution over [B, T, D] (its conv1d's taps) as workbench::kda_short_conv with the
    variant's activation and residual scale. A call given anything but x (a cache, a padding mask) runs the shipped
    forward."""
    if args or any(value is not None for value in kwargs.values()):
        return self.original_forward(hidden_states, *args, **kwargs)
    from workbench.blocks.kda_short_conv import variant

    form = variant({"W": self.conv1d.kernel_size[0], "linear": self.workbench_variant["activation"]["value"] != "silu",
                    "residual": SHORT_CONV_RESIDUALS[self.workbench_variant["residual"]["value"]]})
    return ops.kda_short_conv(hidden_states, self.conv1d.weight.squeeze(1), **form)


def _is_short_conv(module: nn.Module) -> bool:
    """A module that is its depthwise, bias-free, causally padded conv1d and nothing else (Inkling's, Inkling2's
    residual short convolutions; a KDA or Mamba layer holds projections beside its conv1d)."""
    conv = getattr(module, "conv1d", None)
    return isinstance(conv, nn.Conv1d) and conv.bias is None and conv.groups == conv.in_channels == conv.out_channels \
        and conv.padding == (conv.kernel_size[0] - 1,) and [n for n, _ in module.named_children()] == ["conv1d"] \
        and not _own(module)


def _short_conv_variants(module: nn.Module, config: Any) -> list[Variant]:
    act, act_source = _attr(module, "activation")
    name = type(module).__name__
    forms = [(a, r) for a, r in SHORT_CONV_FORMS if act is None or a == ("silu" if act in ("silu", "swish") else act)]
    differs = "" if forms else f"activation '{act}': kda_short_conv applies SiLU or nothing"
    return [Variant(f"{a} activation, residual {r or 'none'}", short_conv_forward,
                    {"activation": param(a, act_source or "probe: the activation that reproduces the module"),
                     "residual": param(r or "none", "probe: the residual that reproduces the module"),
                     "width": param(module.conv1d.kernel_size[0], f"module {name}.conv1d.kernel_size")}, differs)
            for a, r in forms or SHORT_CONV_FORMS[:1]]


# --- hyper-connections -------------------------------------------------------------------------------------------


def _is_hyper_connection(module: nn.Module) -> bool:
    """A module with mHC's projection of hc_mult streams to pre, post and comb logits (fn [(2 + N) N, N D], base
    [(2 + N) N], scale [3]), Sinkhorn rounds and an unweighted input norm (GLM-5-Next's, DeepSeek-V4's; HY-V4's
    pre/post-only form has 2 N logits and is not read)."""
    own = _own(module)
    fn, base, scale = own.get("fn"), own.get("base"), own.get("scale")
    streams = getattr(module, "hc_mult", None)
    norm = getattr(module, "input_norm", None)
    return isinstance(streams, int) and fn is not None and base is not None and scale is not None \
        and tuple(fn.shape[:1]) == tuple(base.shape) == ((2 + streams) * streams,) and tuple(scale.shape) == (3,) \
        and isinstance(getattr(module, "hc_sinkhorn_iters", None), int) and norm is not None \
        and isinstance(getattr(norm, "eps", None), float) and not _own(norm)


def _hyper_connection_variants(module: nn.Module, config: Any) -> list[Variant]:
    name = type(module).__name__
    return [Variant("Sinkhorn-normalised mHC", _common.hyper_connection_forward,
                    {"streams": param(module.hc_mult, f"module {name}.hc_mult"),
                     "sinkhorn_iters": param(module.hc_sinkhorn_iters, f"module {name}.hc_sinkhorn_iters"),
                     "hc_eps": param(module.hc_eps, f"module {name}.hc_eps"),
                     "norm_eps": param(module.input_norm.eps, f"module {name}.input_norm.eps")})]


def hyper_connected_layer_forward(self: nn.Module, hidden_states: torch.Tensor, input_ids=None, **kwargs):
    """A decoder layer of hc_mult residual streams in DeepSeek-V4's layout (``DeepseekV4DecoderLayer.forward``,
    transformers 5.23) with each sub-layer's expand and mix as workbench::hyper_connection_mix: hidden_states
    [B, S, N, D] -> [B, S, N, D]. The rest is the shipped layer's, step for step: attn_hc, the input norm, the
    attention (the call's keywords), ffn_hc, the post-attention norm and the MLP (given the token ids where its
    forward takes them: hash routing) are called as they are (each patched where a kind computes it)."""
    post, comb, collapsed = self.attn_hc(hidden_states)
    attn_output = self.self_attn(self.input_layernorm(collapsed), **kwargs)[0]
    hidden_states = _common.hyper_connection_mix(attn_output, hidden_states, post, comb)
    post, comb, collapsed = self.ffn_hc(hidden_states)
    by_token = {"input_ids": input_ids} if self.workbench_variant["mlp_input_ids"]["value"] else {}
    return _common.hyper_connection_mix(self.mlp(self.post_attention_layernorm(collapsed), **by_token), hidden_states,
                                        post, comb)


LAYER_PARTS = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")


def _is_hyper_connected_layer(module: nn.Module) -> bool:
    """A decoder layer whose attention and MLP each sit between an mHC module the hyper_connection kind reads
    (attn_hc, ffn_hc) and its norm, with no parameters of its own (DeepSeek-V4's; GLM-5-Next's family patches its
    own layer)."""
    hcs = [getattr(module, name, None) for name in ("attn_hc", "ffn_hc")]
    return all(isinstance(hc, nn.Module) and _is_hyper_connection(hc) for hc in hcs) and \
        all(hasattr(module, name) for name in LAYER_PARTS) and not _own(module)


def _hyper_connected_layer_variants(module: nn.Module, config: Any) -> list[Variant]:
    name = type(module).__name__
    takes_ids = "input_ids" in inspect.signature(module.mlp.forward).parameters
    return [Variant("each sub-layer's output expanded into the streams and the streams mixed",
                    hyper_connected_layer_forward,
                    {"streams": param(module.attn_hc.hc_mult, f"module {name}.attn_hc.hc_mult"),
                     "mlp_input_ids": param(takes_ids, f"module {name}.mlp.forward's signature")})]


# --- MLA ---------------------------------------------------------------------------------------------------------


def mla_forward(self: nn.Module, hidden_states: torch.Tensor, position_embeddings=None,
                attention_mask: torch.Tensor | None = None, past_key_values=None, **kwargs):
    """An MLA module (DeepSeek's layout) with the attention as workbench::mla; q's and k's rope parts rotated in the
    variant's form (half or interleaved) on the position embeddings it is given, by workbench::rotary where
    installed with it, else by the module's own modeling function (apply_rotary_pos_emb, or its _interleave form);
    none where the variant has no rotary embedding. What ``_common.mla_runs_shipped`` names runs the shipped
    forward."""
    rope = self.workbench_variant["rope"]["value"]
    if (rope != "none" and position_embeddings is None) or \
            _common.mla_runs_shipped(self, hidden_states, attention_mask, past_key_values):
        return self.original_forward(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                     attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)
    rotate = None
    if rope != "none":
        modeling = sys.modules[type(self).__module__]
        apply = getattr(modeling, "apply_rotary_pos_emb_interleave" if rope == "interleaved" else
                        "apply_rotary_pos_emb")
        rotate = _common.rotation(self, position_embeddings, apply, rope == "interleaved")
    return _common.mla_attention(self, hidden_states, rotate, past_key_values), None


MLA_PARTS = ("kv_a_proj_with_mqa", "kv_b_proj", "kv_a_layernorm", "o_proj")
MLA_SIZES = ("num_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "q_lora_rank",
             "scaling", "qk_head_dim", "layer_idx")


def _is_mla(module: nn.Module) -> bool:
    return all(hasattr(module, n) for n in MLA_PARTS + MLA_SIZES) and not hasattr(module, "indexer")


def _mla_variants(module: nn.Module, config: Any) -> list[Variant]:
    modeling = sys.modules[type(module).__module__]
    interleave, source = _config(config, "rope_interleave")
    forms = ["interleaved" if interleave else "half", "half" if interleave else "interleaved", "none"]
    forms = [f for f in forms if f == "none" or hasattr(modeling, "apply_rotary_pos_emb" + (
        "_interleave" if f == "interleaved" else ""))]
    return [Variant(f"MLA, rotary embedding {form}", mla_forward,
                    {"rope": param(form, source if (form == forms[0] and source) else
                                   "probe: the rotary form that reproduces the module")},
                    optional=() if form == "none" else ("rotary",)) for form in forms]


# --- softmax attention ---------------------------------------------------------------------------------------------


def attention_forward(self: nn.Module, *args, **kwargs):
    """The module's own forward with its attention function the workbench's (``workbench.integrations.attention``,
    through ``ops.attention``) and, where installed with rotary, its modeling file's rotate-half
    apply_rotary_pos_emb as workbench::rotary (``_common.rotary_as_op``): the projections, norms and gates stay the
    module's."""
    from workbench.integrations.attention import NAME, register

    register()
    config = self.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        with _common.rotary_as_op(self, self.workbench_variant["rotary_table"]["value"]) \
                if _common.computes(self, "rotary") else contextlib.nullcontext():
            return self.original_forward(*args, **kwargs)
    finally:
        config._attn_implementation = before


ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _is_attention(module: nn.Module) -> bool:
    """A module that calls transformers' attention registry (its modeling module imports ALL_ATTENTION_FUNCTIONS)
    with q/k/v/o projections: softmax attention of any family (MLA and sparse attention have their own kinds)."""
    modeling = sys.modules.get(type(module).__module__)
    return all(hasattr(module, n) for n in ATTENTION_PARTS) and hasattr(module, "config") and \
        hasattr(modeling, "ALL_ATTENTION_FUNCTIONS") and not _is_mla(module) and not hasattr(module, "indexer")


def _attention_variants(module: nn.Module, config: Any) -> list[Variant]:
    from workbench.integrations.attention import unsupported

    name = type(module).__name__
    window = getattr(module, "sliding_window", None)
    sinks = isinstance(getattr(module, "sinks", None), torch.Tensor)
    softcap = getattr(module, "attn_logit_softcapping", None)
    params = {"window": param(window or 0, f"module {name}.sliding_window"),
              "sinks": param("per head" if sinks else "none", f"module {name}.sinks"),
              "softcap": param(softcap or 0, f"module {name}.attn_logit_softcapping")}
    rotated = [Variant(f"softmax attention through the attention registry, rotate-half rotary embedding (angle "
                       f"table {table})", attention_forward,
                       {**params, "rotary_table": param(table, "probe: the angle table that reproduces the module")},
                       unsupported(module), optional=("rotary",)) for table in _common.ROTARY_TABLES]
    # the module's own rotation (another form under that name, or none) where no table's rotate-half one holds
    return (rotated if _common.takes_rotary_as_op(module) else []) + [
        Variant("softmax attention through the attention registry", attention_forward, params, unsupported(module))]


KINDS: tuple[Kind, ...] = (
    Kind("rmsnorm", "RMSNorm", ("rmsnorm",), _is_rmsnorm, _rmsnorm_variants),
    Kind("layernorm", "LayerNorm", ("layernorm",), _is_layernorm, _layernorm_variants),
    Kind("rmsnorm_gated", "gated output norm", ("rmsnorm_gated",), _is_gated_rmsnorm, _gated_rmsnorm_variants),
    Kind("gated_mlp", "gated MLP (projections in torch)", ("swiglu",), _is_gated_mlp, _mlp_variants),
    Kind("router", "top-k expert router", ("moe_router",), _is_router, _router_variants),
    Kind("experts", "routed experts", ("moe_permute", "moe_grouped_gemm", "moe_combine"), _is_experts,
         _experts_variants),
    Kind("kda_gate", "KDA forget gate (projections in torch)", ("kda_gate",), _is_forget_gate,
         _forget_gate_variants),
    Kind("kda_layer", "KDA linear attention (projections in torch)", ("kda_short_conv", "kda"),
         _is_kda_layer, _kda_layer_variants),
    Kind("short_conv", "short convolution", ("kda_short_conv",), _is_short_conv, _short_conv_variants),
    Kind("hyper_connection", "hyper-connections (the weights and the collapse)", ("hyper_connection",),
         _is_hyper_connection, _hyper_connection_variants),
    Kind("hyper_connected_layer", "hyper-connected decoder layer (its expand and mix; the sub-layers by their kinds)",
         ("hyper_connection_mix",), _is_hyper_connected_layer, _hyper_connected_layer_variants),
    Kind("mla", "MLA attention (projections in torch)", ("mla",), _is_mla, _mla_variants),
    Kind("attention", "softmax attention (projections, q/k norms and gates in torch)",
         ("attention",), _is_attention, _attention_variants),
)


def kind_of(module: nn.Module) -> Kind | None:
    """The kind that reads ``module``; None when none does."""
    return next((kind for kind in KINDS if kind.match(module)), None)


def install(module: nn.Module, variant: Variant, blocks: tuple[str, ...]) -> None:
    """Make ``module`` compute ``variant`` (its forward through the ops, its parameters on the module) with
    ``blocks``: its kind's and those of the variant's optional ones it may use."""
    if not hasattr(module, "original_forward"):
        module.original_forward = module.forward
    module.workbench_variant = variant.params
    module.workbench_blocks = frozenset(blocks)
    module.forward = variant.forward.__get__(module)


def uninstall(module: nn.Module) -> None:
    """Give ``module`` its shipped forward back."""
    if hasattr(module, "original_forward"):
        module.forward = module.original_forward
        del module.original_forward
    module.__dict__.pop("workbench_variant", None)
    module.__dict__.pop("workbench_blocks", None)


# --- what no kind reads ------------------------------------------------------------------------------------------

FRAMEWORK = "framework"
NO_SPEC = "no spec"
WITHIN = "within"
HINTS = (
    (("hyperconnection", "hyperhead"), "hyper-connections: mixes the hc_mult residual streams (Sinkhorn-normalised "
                                       "mixing matrices)"),
    (("hashrouter", "hash"), "hash routing: experts chosen by the token id"),
    (("compressor",), "KV compressor (pools keys and values along the sequence)"),
    (("indexer", "scorer"), "sparse-attention indexer (scores keys and selects the top k)"),
    (("router", "topk", "gate"), "expert router of a form the router kind does not read"),
    (("mamba", "mixer", "ssm"), "state-space mixer"),
    (("deltanet", "delta", "linearattention", "lightning"), "linear attention of a form the kda_layer kind does "
                                                            "not read"),
    (("attention", "attn", "mla"), "attention"),
    (("conv",), "convolution"),
    (("mtp", "nextn"), "multi-token prediction"),
    (("vision", "visual", "audio", "patch", "merger", "tower"), "a multimodal tower's module"),
    (("layernorm",), "layer norm (mean-centred, with weight and bias)"),
)
"""Class-name words and the role of a module no kind reads (the first that the lower-cased class name contains)."""


def class_words(cls: str) -> set[str]:
    """The lower-cased words of a CamelCase class name and every run of consecutive ones ("GptOssTopKRouter" ->
    gpt, oss, top, k, router, topk, ...): what HINTS match, so that "ssm" is not found in "GptOssModel"."""
    words = [w.lower() for w in re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", cls)]
    return {"".join(words[i:j]) for i in range(len(words)) for j in range(i + 1, len(words) + 1)}


def hint(module: nn.Module) -> str | None:
    words = class_words(type(module).__name__)
    return next((role for keys, role in HINTS if any(k in words for k in keys)), None)


def describe(module: nn.Module) -> tuple[str, str]:
    """(status, role) of a module no kind reads: FRAMEWORK (embedding, plain projection, dropout, containers whose
    forward composes their children, the rotary position table), WITHIN (an activation or convolution its parent's
    forward calls: its parent's row says how it is computed), or NO_SPEC (what it computes)."""
    if isinstance(module, nn.ModuleList | nn.ModuleDict | nn.Sequential):
        return FRAMEWORK, "container"
    if isinstance(module, nn.Embedding):
        return FRAMEWORK, "embedding lookup"
    if type(module) is nn.Linear:
        return FRAMEWORK, "plain projection (a GEMM)"
    if isinstance(module, nn.Dropout | nn.Identity):
        return FRAMEWORK, "dropout / identity"
    if "rotary" in type(module).__name__.lower() and not any(p.requires_grad for p in module.parameters()):
        return FRAMEWORK, "rotary position table (cos, sin per position); the rotation is applied inside the attention"
    own = dict(module.named_parameters(recurse=False))
    children = list(module.children())
    if own and all(name.endswith("correction_bias") for name in own) and not children:
        return WITHIN, "the selection bias its parent router reads"
    if isinstance(module, nn.Conv1d) or (not own and not children and activation_name(module) is not None) or \
            (not own and not children and type(module).__name__.endswith("Activation")):
        return WITHIN, "called by its parent's forward"
    role = hint(module)
    if role is not None:
        return NO_SPEC, role
    if own:
        return NO_SPEC, f"a module with its own parameters ({', '.join(sorted(own))}) that no kind reads"
    if children:
        return FRAMEWORK, "container: its forward composes its children (residual adds, routing and shared-expert " \
                          "sums in torch)"
    return WITHIN, "called by its parent's forward"


def attention_summary(instances: list[nn.Module], config: Any) -> str:
    """What an attention class no kind reads computes across its instances (the layers of the full model): softmax
    or MLA attention, heads, KV heads, head size, sinks, sliding windows per layer, q/k norms, an output gate, an
    indexer."""
    first = instances[0]
    form = "MLA attention" if hasattr(first, "kv_b_proj") else "softmax attention"
    heads, _ = _attr(first, "num_heads", "num_attention_heads")
    heads = heads or getattr(config, "num_attention_heads", None)
    kv, _ = _attr(first, "num_key_value_heads")
    groups, _ = _attr(first, "num_key_value_groups")
    kv = kv or (heads // groups if heads and groups else getattr(config, "num_key_value_heads", None))
    dim, _ = _attr(first, "head_dim")
    parts = [f"{heads} heads" + (f", {kv} KV heads" if kv and kv != heads else "") + (f", head size {dim}" if dim
                                                                                        else "")]
    if "sinks" in _own(first):
        parts.append("attention sinks")
    windows = [getattr(m, "sliding_window", None) for m in instances]
    sliding = [w for w in windows if isinstance(w, int) and w > 0]
    if sliding:
        parts.append(f"sliding window {max(sliding)} in {len(sliding)} of {len(instances)} layers")
    names = {n for n, _ in first.named_children()}
    if {"q_norm", "k_norm"} & names:
        parts.append("q/k RMSNorm")
    if any("gate" in n for n in names):
        parts.append("output gate")
    if hasattr(first, "indexer"):
        parts.append("a sparse indexer")
    return f"{form}: {', '.join(parts)}"

