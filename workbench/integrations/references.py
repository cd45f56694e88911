"""The catalog's references held to the published code, in float64: each block's reference and the transformers
(or PEFT) module or function that computes the same math, on the same random inputs, outputs and gradients.

transformers casts to float32 by name (``.float()``, ``.to(torch.float32)``, ``dtype=torch.float32``), so a float64
module still computes parts in float32; ``Float64Casts`` (a torch function mode) turns those casts into float64 for
the comparison. Each comparison returns a ``Comparison``: the block, the published counterpart, whether the block
computes the same variant, and the worst relative error of the outputs and of the gradients. A "differs" row is a
variant the catalog does not compute (the error says by how much): the family integration leaves such a module
alone (workbench.integrations.families).

    python bench/reference_parity.py      # the table
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from workbench.blocks import get_block

F64 = torch.float64


class Float64Casts(TorchFunctionMode):
    """Casts to float32 become casts to float64 (``.float()``, ``.to(torch.float32)``, ``.type(torch.float32)``,
    ``dtype=torch.float32`` keywords), so published code given float64 tensors computes in float64 throughout."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.float:
            func, args = torch.Tensor.to, (args[0], F64)
        args = tuple(F64 if a is torch.float32 else a for a in args)
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = F64
        return func(*args, **kwargs)


@dataclass
class Comparison:
    """One block against its published counterpart: ``same`` the variant, and the worst relative errors."""

    block: str
    counterpart: str
    same: bool
    output_rel: float
    grad_rel: float
    note: str = ""


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a| (0 when both vanish)."""
    scale = a.abs().max().item()
    return (a - b).abs().max().item() / scale if scale else (a - b).abs().max().item()


def _compare(block: str, counterpart: str, ours: Callable, theirs: Callable, leaves: list[torch.Tensor],
             same: bool = True, note: str = "") -> Comparison:
    """Run both on ``leaves`` (float64, requiring grad) with one random upstream gradient per output; compare."""
    out_a = ours()
    with Float64Casts():
        out_b = theirs()
    out_a = out_a if isinstance(out_a, tuple) else (out_a,)
    out_b = out_b if isinstance(out_b, tuple) else (out_b,)
    g = torch.Generator().manual_seed(7)
    ups = [torch.randn(o.shape, generator=g, dtype=F64) for o in out_a]
    differentiable = [i for i, o in enumerate(out_a) if o.requires_grad]  # discrete outputs (ids) take none
    grads_a = torch.autograd.grad([out_a[i] for i in differentiable], leaves, [ups[i] for i in differentiable],
                                  allow_unused=True)
    grads_b = torch.autograd.grad([out_b[i] for i in differentiable], leaves, [ups[i] for i in differentiable],
                                  allow_unused=True)
    output_rel = max(rel(a, b) for a, b in zip(out_a, out_b, strict=True))
    grad_rel = max(rel(a if a is not None else torch.zeros_like(x), b if b is not None else torch.zeros_like(x))
                   for a, b, x in zip(grads_a, grads_b, leaves, strict=True))
    return Comparison(block, counterpart, same, output_rel, grad_rel, note)


def _leaf(*shape: int, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=g, dtype=F64)).requires_grad_(True)


def rmsnorm() -> Comparison:
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNorm

    g = torch.Generator().manual_seed(0)
    x = _leaf(2, 5, 24, g=g)
    norm = KimiLinearRMSNorm(24, eps=1e-5).to(F64)
    w = norm.weight
    w.data = 1 + 0.1 * torch.randn(24, generator=g, dtype=F64)
    return _compare("rmsnorm", "KimiLinearRMSNorm", lambda: get_block("rmsnorm").reference(x, w, 1e-5),
                    lambda: norm(x), [x, w])


def layernorm() -> list[Comparison]:
    """layernorm against the DSA indexers' key norms (nn.LayerNorm over the index head, eps 1e-6, with weight and
    bias) of DeepSeek-V3.2 and GLM-5-Next, on rows offset from zero."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as ds
    from transformers.models.glm5_next import modeling_glm5_next as glm

    g = torch.Generator().manual_seed(23)
    rows = []
    for label, indexer in (("DeepseekV32Indexer.k_norm", ds.DeepseekV32Indexer(ds.DeepseekV32Config(
            index_head_dim=32), 0)), ("Glm5NextTextIndexer.k_norm", glm.Glm5NextTextIndexer(glm.Glm5NextTextConfig(
            index_head_dim=32), 0))):
        norm = indexer.k_norm.to(F64)
        norm.weight.data = 1 + 0.1 * torch.randn(32, generator=g, dtype=F64)
        norm.bias.data = 0.1 * torch.randn(32, generator=g, dtype=F64)
        x = (torch.randn(2, 5, 32, generator=g, dtype=F64) + 3).requires_grad_(True)
        rows.append(_compare("layernorm", f"{label} (nn.LayerNorm, eps {norm.eps:g})",
                             lambda x=x, norm=norm: get_block("layernorm").reference(x, norm.weight, norm.bias,
                                                                                     norm.eps),
                             lambda x=x, norm=norm: norm(x), [x, norm.weight, norm.bias]))
    return rows


def zero_centred_rmsnorm() -> Comparison:
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

    g = torch.Generator().manual_seed(11)
    x = _leaf(2, 5, 24, g=g)
    norm = Qwen3NextRMSNorm(24, eps=1e-6).to(F64)
    w = norm.weight
    w.data = 0.1 * torch.randn(24, generator=g, dtype=F64)
    return _compare("rmsnorm", "Qwen3NextRMSNorm (zero-centred: weight 1 + w)",
                    lambda: get_block("rmsnorm").reference(x, 1.0 + w, 1e-6), lambda: norm(x), [x, w])


def rmsnorm_gated() -> list[Comparison]:
    """The gated output norm of the linear-attention layers: Kimi Linear's and GLM-5-Next's (sigmoid gate) and
    Qwen3-Next's (silu gate), on per-head rows [B, T, H, D] with gates wide enough to saturate the sigmoid."""
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextRMSNormGated
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearRMSNormGated
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNormGated

    rows = []
    for seed, cls in enumerate((KimiLinearRMSNormGated, Glm5NextTextRMSNormGated, Qwen3NextRMSNormGated), start=19):
        g = torch.Generator().manual_seed(seed)
        x, gate = _leaf(2, 5, 3, 16, g=g), _leaf(2, 5, 3, 16, g=g, scale=6.0)
        norm = cls(16, eps=1e-5).to(F64)
        w = norm.weight
        w.data = 1 + 0.1 * torch.randn(16, generator=g, dtype=F64)
        rows.append(_compare("rmsnorm_gated", f"{cls.__name__} ({norm.activation} gate)",
                             lambda x=x, w=w, gate=gate, act=norm.activation: get_block("rmsnorm_gated").reference(
                                 x, w, gate, 1e-5, act),
                             lambda x=x, gate=gate, norm=norm: norm(x, gate), [x, w, gate]))
    return rows


def swiglu() -> list[Comparison]:
    """Plain SwiGLU against Kimi Linear's MLP activation; the clamped variant against GLM-5-Next's MLP (its own
    forward, the projections set to pass a and b through) and DeepSeek-V4's experts' gate; the clamped alpha variant
    against GPT-OSS's experts' gate (gate and up interleaved) and MiniMax-M3's (halves). The limits and alphas are
    the config classes' defaults, the inputs wide enough (N(0, 36)) that the limits act (7 cuts about one up value in
    4, 10 one in 10): held to the unclamped and the silu forms, the same modules are far off."""
    from types import SimpleNamespace

    from transformers.activations import ACT2FN
    from transformers.models.deepseek_v4 import configuration_deepseek_v4, modeling_deepseek_v4
    from transformers.models.glm5_next import configuration_glm5_next, modeling_glm5_next
    from transformers.models.gpt_oss import configuration_gpt_oss, modeling_gpt_oss
    from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl, modeling_minimax_m3_vl

    ref = get_block("swiglu").reference
    g = torch.Generator().manual_seed(1)
    n = 20
    a, b = _leaf(6, n, g=g, scale=3.0), _leaf(6, n, g=g)
    rows = [_compare("swiglu", "KimiLinearMLP: act_fn(gate) * up (silu)", lambda: ref(a, b),
                     lambda: ACT2FN["silu"](a) * b, [a, b])]
    wa, wb = _leaf(6, n, g=g, scale=6.0), _leaf(6, n, g=g, scale=6.0)

    def halves():  # gate and up concatenated, as the fused projections give them
        return torch.cat([wa, wb], -1)

    def interleaved():  # gate and up interleaved, GPT-OSS's layout
        return torch.stack([wa, wb], -1).flatten(-2)

    glm = configuration_glm5_next.Glm5NextTextConfig()
    mlp = modeling_glm5_next.Glm5NextTextMLP(SimpleNamespace(hidden_size=2 * n, intermediate_size=n, hidden_act="silu",
                                                             swiglu_limit=glm.swiglu_limit)).to(F64)
    eye, zero = torch.eye(n, dtype=F64), torch.zeros(n, n, dtype=F64)
    mlp.gate_proj.weight.data, mlp.up_proj.weight.data = torch.cat([eye, zero], 1), torch.cat([zero, eye], 1)
    mlp.down_proj.weight.data = torch.cat([eye, zero], 0)  # y in the first n outputs
    rows.append(_compare("swiglu", f"Glm5NextTextMLP: clamped, swiglu_limit {glm.swiglu_limit}",
                         lambda: ref(wa, wb, glm.swiglu_limit),
                         lambda: mlp(halves())[..., :n], [wa, wb]))

    def one_expert(cls, config):  # the experts module of one 1 x 1 expert, for its _apply_gate
        return cls(SimpleNamespace(num_local_experts=1, hidden_size=1, intermediate_size=1, moe_intermediate_size=1,
                                   hidden_act="silu", swiglu_limit=config.swiglu_limit,
                                   swiglu_alpha=getattr(config, "swiglu_alpha", None)))

    v4 = configuration_deepseek_v4.DeepseekV4Config()
    v4_experts = one_expert(modeling_deepseek_v4.DeepseekV4Experts, v4)
    rows.append(_compare("swiglu", f"DeepseekV4Experts._apply_gate: clamped, swiglu_limit {v4.swiglu_limit}",
                         lambda: ref(wa, wb, v4.swiglu_limit), lambda: v4_experts._apply_gate(halves()), [wa, wb]))
    oss = configuration_gpt_oss.GptOssConfig()
    oss_experts = one_expert(modeling_gpt_oss.GptOssExperts, oss)
    rows.append(_compare("swiglu", f"GptOssExperts._apply_gate: alpha {oss.swiglu_alpha}, up + 1, swiglu_limit "
                         f"{oss.swiglu_limit}, interleaved",
                         lambda: ref(wa, wb, oss.swiglu_limit, oss.swiglu_alpha, 1.0),
                         lambda: oss_experts._apply_gate(interleaved()), [wa, wb]))
    m3 = configuration_minimax_m3_vl.MiniMaxM3VLTextConfig()
    m3_experts = one_expert(modeling_minimax_m3_vl.MiniMaxM3VLExperts, m3)
    rows.append(_compare("swiglu", f"MiniMaxM3VLExperts._apply_gate: alpha {m3.swiglu_alpha}, up + 1, swiglu_limit "
                         f"{m3.swiglu_limit}", lambda: ref(wa, wb, m3.swiglu_limit, m3.swiglu_alpha, 1.0),
                         lambda: m3_experts._apply_gate(halves()), [wa, wb]))
    rows.append(_compare("swiglu", "Glm5NextTextMLP held to plain SwiGLU", lambda: ref(wa, wb),
                         lambda: mlp(halves())[..., :n], [wa, wb], same=False, note="unclamped: another variant"))
    rows.append(_compare("swiglu", "GptOssExperts._apply_gate held to the clamped variant without alpha",
                         lambda: ref(wa, wb, oss.swiglu_limit), lambda: oss_experts._apply_gate(interleaved()),
                         [wa, wb], same=False, note="the alpha form (alpha 1.702, up + 1) is another variant"))
    return rows


def _inkling2_dynamic_conv(g: torch.Generator, channels: int = 12, heads: int = 2, inputs: int = 16):
    """An Inkling2DynamicShortConvolution (float64, 4 taps, layer 0) with random static taps and tap projection."""
    from transformers.models.inkling2 import modeling_inkling2 as shipped

    module = shipped.Inkling2DynamicShortConvolution(channels, inputs, heads, 4, layer_idx=0, conv_idx=0).to(F64)
    module.static_weight.data = torch.randn(4, channels, generator=g, dtype=F64) / 2
    module.weight_proj.weight.data = torch.randn(heads * 4, inputs, generator=g, dtype=F64) / 4
    return module


def kda_short_conv() -> list[Comparison]:
    """KDA's silu(conv(x)) against Kimi Linear's causal_conv1d_fn; the residual variants against Inkling2's
    ((conv(x) + x) / sqrt(W + 1)) and Inkling's (conv(x) + x) ShortConvolution modules, and Inkling2's held to KDA's
    form; the dynamic variant against Inkling2's DynamicShortConvolution (per-token taps, (conv(x) + x) /
    sqrt(2 W + 1)), and that module held to the static residual form."""
    import importlib

    from transformers.models.kimi_linear import modeling_kimi_linear as kl

    from workbench.integrations.families.inkling2 import dynamic_taps

    ref = get_block("kda_short_conv").reference
    g = torch.Generator().manual_seed(2)
    x, w = _leaf(2, 9, 12, g=g), _leaf(12, 4, g=g, scale=0.5)
    conv = kl.causal_conv1d_fn.__wrapped__  # the torch path (fla's and causal-conv1d's need a GPU driver)
    rows = [_compare("kda_short_conv", "causal_conv1d_fn (KimiLinearDeltaAttention, silu)", lambda: ref(x, w),
                     lambda: conv(x.transpose(1, 2), w, None, "silu").transpose(1, 2), [x, w])]
    modules = {}
    for family, scale in (("inkling2", 5 ** -0.5), ("inkling", 1.0)):
        shipped = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        module = getattr(shipped, f"{family.capitalize()}ShortConvolution")(12, 4, layer_idx=0, conv_idx=0).to(F64)
        module.conv1d.weight.data = torch.randn(12, 1, 4, generator=g, dtype=F64) / 2
        modules[family] = module
        label = f"{family.capitalize()}ShortConvolution (conv(x) + x){' / sqrt(W + 1)' if scale != 1 else ''}"
        rows.append(_compare("kda_short_conv", label + ", no activation",
                             lambda module=module, scale=scale: ref(x, module.conv1d.weight.squeeze(1), False, scale),
                             lambda module=module: module(x), [x, module.conv1d.weight]))
    inkling2 = modules["inkling2"]
    rows.append(_compare("kda_short_conv", "Inkling2ShortConvolution held to KDA's silu(conv(x))",
                         lambda: ref(x, inkling2.conv1d.weight.squeeze(1)), lambda: inkling2(x),
                         [x, inkling2.conv1d.weight], same=False, note="Inkling2's residual form is another variant"))
    dynamic, dynamic_input = _inkling2_dynamic_conv(g), _leaf(2, 9, 16, g=g)
    leaves = [x, dynamic_input, dynamic.static_weight, dynamic.weight_proj.weight]
    rows.append(_compare("kda_short_conv", "Inkling2DynamicShortConvolution (per-token taps, (conv(x) + x) / "
                         "sqrt(2 W + 1))", lambda: ref(x, *dynamic_taps(dynamic, dynamic_input)[:1], False,
                                                       9 ** -0.5, dynamic_taps(dynamic, dynamic_input)[1]),
                         lambda: dynamic(x, dynamic_input), leaves))
    rows.append(_compare("kda_short_conv", "Inkling2DynamicShortConvolution held to the static residual form",
                         lambda: ref(x, dynamic_taps(dynamic, dynamic_input)[0], False, 5 ** -0.5),
                         lambda: dynamic(x, dynamic_input), leaves, same=False,
                         note="the per-token taps and the 1 / sqrt(2 W + 1) scale are the dynamic variant"))
    return rows


def kda_short_conv_decode() -> list[Comparison]:
    """Inkling2's short convolutions decoding with a cache: each module (the static residual one, the dynamic one)
    prefilled with 5 tokens through a DynamicCache, then fed one token a step, against kda_short_conv_decode's
    update of the cache's conv state (W inputs a sequence, float32 in the model, float64 here); output_rel: the worst
    over the steps of y and of the shifted state. No grad: the decode form has no backward."""
    from transformers.cache_utils import DynamicCache
    from transformers.models.inkling2 import modeling_inkling2 as shipped
    from transformers.models.inkling2.configuration_inkling2 import Inkling2TextConfig

    from workbench.integrations.families.inkling2 import dynamic_taps

    ref = get_block("kda_short_conv_decode").reference
    g = torch.Generator().manual_seed(41)
    config = Inkling2TextConfig(num_hidden_layers=1, layer_types=["hybrid"], hidden_size=16, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=6)
    static = shipped.Inkling2ShortConvolution(12, 4, layer_idx=0, conv_idx=1).to(F64)
    static.conv1d.weight.data = torch.randn(12, 1, 4, generator=g, dtype=F64) / 2
    dynamic = _inkling2_dynamic_conv(g)
    x, dynamic_input = torch.randn(2, 8, 12, generator=g, dtype=F64), torch.randn(2, 8, 16, generator=g, dtype=F64)
    cache, slots = DynamicCache(config=config), torch.arange(2)
    rows = []
    with torch.no_grad(), Float64Casts():
        dynamic(x[:, :5], dynamic_input[:, :5], past_key_values=cache)
        static(x[:, :5], past_key_values=cache)
        worst = {"static": 0.0, "dynamic": 0.0}
        for step in range(5, 8):
            token, given = x[:, step], dynamic_input[:, step:step + 1]
            weight, taps = dynamic_taps(dynamic, given)
            for name, module, inputs, variant in (
                    ("dynamic", dynamic, (given,), {"weight": weight, "residual_scale": 9 ** -0.5,
                                                    "taps": taps[:, 0]}),
                    ("static", static, (), {"weight": static.conv1d.weight.squeeze(1), "residual_scale": 5 ** -0.5})):
                state = cache.get_conv_state(0, state_idx=module.conv_idx).clone()
                y, updated = ref(token, conv_cache=state, slots=slots, silu=False, **variant)
                theirs = module(token[:, None], *inputs, past_key_values=cache)[:, 0]
                worst[name] = max(worst[name], rel(theirs, y), rel(cache.get_conv_state(0, state_idx=module.conv_idx),
                                                                   updated))
    for name, label in (("static", "Inkling2ShortConvolution"), ("dynamic", "Inkling2DynamicShortConvolution")):
        rows.append(Comparison("kda_short_conv_decode", f"{label} with a DynamicCache (3 decode steps after 5 "
                                                        f"tokens; no grad)", True, worst[name], 0.0,
                               "y and the shifted state compared; the decode form has no backward"))
    return rows


def l2_clip() -> list[Comparison]:
    """The clips against Inkling2's modules: Inkling2L2Clip (the keys), Inkling2ScaledL2Clip (the queries and the
    relative states) and the scaled clip followed by the full layers' log scaling as Inkling2FullAttention applies it
    (``(x.float() * tau).to(x.dtype)``); rows spread around the threshold, so some are clipped and some kept; the
    unscaled clip held to the scaled module."""
    from transformers.models.inkling2 import modeling_inkling2 as ink

    ref = get_block("l2_clip").reference
    g = torch.Generator().manual_seed(43)
    x = (_leaf(2, 5, 3, 16, g=g).detach() * torch.linspace(0.3, 3.0, 30, dtype=F64).view(2, 5, 3, 1)).requires_grad_()
    plain, scaled = ink.Inkling2L2Clip(6.0), ink.Inkling2ScaledL2Clip(3, 16, 6.0).to(F64)
    scaled.scale.data = 0.5 + torch.rand(3, 16, generator=g, dtype=F64)
    tau = (1.0 + 0.5 * torch.rand(2, 5, generator=g, dtype=F64)).requires_grad_()
    return [
        _compare("l2_clip", "Inkling2L2Clip (the keys)", lambda: ref(x, None, None, 6.0), lambda: plain(x), [x]),
        _compare("l2_clip", "Inkling2ScaledL2Clip (the queries, the relative states)",
                 lambda: ref(x, scaled.scale, None, 6.0), lambda: scaled(x), [x, scaled.scale]),
        _compare("l2_clip", "Inkling2ScaledL2Clip, then Inkling2FullAttention's log scaling",
                 lambda: ref(x, scaled.scale, tau, 6.0), lambda: (scaled(x).float() * tau[..., None, None]).to(x.dtype),
                 [x, scaled.scale, tau]),
        _compare("l2_clip", "Inkling2ScaledL2Clip held to the unscaled clip", lambda: ref(x, None, None, 6.0),
                 lambda: scaled(x), [x, scaled.scale], same=False, note="the learnt scale is part of the variant"),
    ]


def kda_prologue() -> list[Comparison]:
    """The KDA layers' q/k l2norm and beta sigmoid against Kimi Linear's l2norm (x / sqrt(sum x^2 + eps)) and
    Qwen3-Next's (x * rsqrt(sum x^2 + eps)), each with torch.sigmoid of the beta logits; a tiny row (the eps acts)
    included."""
    from transformers.models.kimi_linear import modeling_kimi_linear as kl
    from transformers.models.qwen3_next import modeling_qwen3_next as qn

    ref = get_block("kda_prologue").reference
    g = torch.Generator().manual_seed(37)
    q, k, b = _leaf(2, 5, 3, 16, g=g), _leaf(2, 5, 3, 16, g=g), _leaf(2, 5, 6, g=g, scale=2.0)
    with torch.no_grad():
        q[0, 0, 0] *= 1e-3
    return [_compare("kda_prologue", f"{label} l2norm (eps 1e-6) and torch.sigmoid", lambda: ref(q, k, b, 1e-6),
                     lambda l2norm=l2norm: (l2norm(q, dim=-1, eps=1e-6), l2norm(k, dim=-1, eps=1e-6),
                                            torch.sigmoid(b)), [q, k, b])
            for label, l2norm in (("KimiLinearDeltaAttention's", kl.l2norm), ("Qwen3NextGatedDeltaNet's", qn.l2norm))]


def rotary() -> list[Comparison]:
    """rotary against transformers' rotations on each family's own rotary embedding (cos, sin at positions 0 to
    T - 1 with an offset): DeepSeek-V3's interleaved pairs (its yarn-scaled embedding) on the rope part and on the whole
    query (rope_last, as its attention splits and concatenates it), the DSA indexer's rotate-half
    on [B, T, H, R] (DeepSeek-V3.2, unsqueeze_dim 2), Qwen3-Next's partial rotary (a quarter of the head), GPT-OSS's
    half-width table doubled (the attention kind's "doubled" angle table); and
    DeepSeek-V3's interleaved form held to rotate-half."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as ds32
    from transformers.models.qwen3_next import modeling_qwen3_next as qn

    ref = get_block("rotary").reference
    g = torch.Generator().manual_seed(19)
    positions = torch.arange(7)[None].expand(2, 7) + torch.tensor([[0], [300]])

    def angles(module_class, config):
        x = torch.zeros(1, dtype=F64)
        with Float64Casts():
            return module_class(config)(x, positions)

    cos, sin = angles(ds.DeepseekV3RotaryEmbedding, ds.DeepseekV3Config(qk_rope_head_dim=16))
    q = _leaf(2, 3, 7, 16, g=g)  # [B, H, T, R] as the MLA forward rotates it
    rows = [_compare("rotary", "DeepSeek-V3 apply_rotary_pos_emb_interleave (MLA's rope part, yarn)",
                     lambda: ref(q.transpose(1, 2), cos, sin, True).transpose(1, 2),
                     lambda: ds.apply_rotary_pos_emb_interleave(q, q, cos, sin)[0], [q])]
    qm = _leaf(2, 7, 3, 24 + 16, g=g)  # an MLA query [B, T, H, DN + DR], the rope part last

    def deepseek_query():  # DeepseekV3Attention.forward: split, rotate the rope part, concatenate
        q_nope, q_rope = qm.split([24, 16], dim=-1)
        return torch.cat([q_nope, ds.apply_rotary_pos_emb_interleave(q_rope.transpose(1, 2), q_rope.transpose(1, 2),
                                                                     cos, sin)[0].transpose(1, 2)], dim=-1)

    rows.append(_compare("rotary", "DeepSeek-V3's MLA query as its attention rotates it (split, rope part, "
                         "concatenation), rope_last", lambda: ref(qm, cos, sin, True, True), deepseek_query, [qm]))
    cos32, sin32 = angles(ds32.DeepseekV32RotaryEmbedding, ds32.DeepseekV32Config(qk_rope_head_dim=16))
    qi = _leaf(2, 7, 4, 16, g=g)  # [B, T, H, R] as the indexer rotates it
    rows.append(_compare("rotary", "DeepSeek-V3.2 apply_rotary_pos_emb (the indexer's rotate-half, unsqueeze_dim 2)",
                         lambda: ref(qi, cos32, sin32),
                         lambda: ds32.apply_rotary_pos_emb(qi, qi, cos32, sin32, unsqueeze_dim=2)[0], [qi]))
    config = qn.Qwen3NextConfig(head_dim=32, partial_rotary_factor=0.25)
    cosq, sinq = angles(qn.Qwen3NextRotaryEmbedding, config)
    qq = _leaf(2, 4, 7, 32, g=g)
    rows.append(_compare("rotary", "Qwen3-Next apply_rotary_pos_emb (partial rotary: 8 of 32 channels)",
                         lambda: ref(qq.transpose(1, 2), cosq, sinq).transpose(1, 2),
                         lambda: qn.apply_rotary_pos_emb(qq, qq, cosq, sinq)[0], [qq]))
    from transformers.models.gpt_oss import modeling_gpt_oss as oss

    coso, sino = angles(oss.GptOssRotaryEmbedding, oss.GptOssConfig(head_dim=32))  # half a head: one angle a pair
    qo = _leaf(2, 4, 7, 32, g=g)
    rows.append(_compare("rotary", "GPT-OSS apply_rotary_pos_emb (its half-width table, doubled)",
                         lambda: ref(qo.transpose(1, 2), torch.cat([coso, coso], -1),
                                     torch.cat([sino, sino], -1)).transpose(1, 2),
                         lambda: oss.apply_rotary_pos_emb(qo, qo, coso, sino)[0], [qo]))
    rows.append(_compare("rotary", "DeepSeek-V3 apply_rotary_pos_emb_interleave held to rotate-half",
                         lambda: ref(q.transpose(1, 2), cos, sin).transpose(1, 2),
                         lambda: ds.apply_rotary_pos_emb_interleave(q, q, cos, sin)[0], [q], same=False,
                         note="interleaved pairs are another variant"))
    return rows


def _kda_inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    b, t, h, d = 2, 19, 2, 8
    q = torch.nn.functional.normalize(torch.randn(b, t, h, d, generator=g, dtype=F64), dim=-1).requires_grad_(True)
    k = torch.nn.functional.normalize(torch.randn(b, t, h, d, generator=g, dtype=F64), dim=-1).requires_grad_(True)
    v = _leaf(b, t, h, d, g=g)
    gate = torch.nn.functional.logsigmoid(torch.randn(b, t, h, d, generator=g, dtype=F64)).requires_grad_(True)
    beta = torch.sigmoid(torch.randn(b, t, h, generator=g, dtype=F64)).requires_grad_(True)
    h0 = _leaf(b, h, d, d, g=g)
    return q, k, v, gate, beta, h0


def kda() -> list[Comparison]:
    from transformers.models.kimi_linear import modeling_kimi_linear as kl

    rows = []
    for name, fn in (("chunk_kimi_delta_attention", kl.chunk_kimi_delta_attention.__wrapped__),
                     ("recurrent_kimi_delta_attention", kl.recurrent_kimi_delta_attention.__wrapped__)):
        q, k, v, gate, beta, h0 = _kda_inputs(3)
        rows.append(_compare(
            "kda", f"{name} (torch path)",
            lambda q=q, k=k, v=v, gate=gate, beta=beta, h0=h0: get_block("kda").reference(
                q, k, v, gate, beta, q.shape[-1] ** -0.5, h0),
            lambda q=q, k=k, v=v, gate=gate, beta=beta, h0=h0, fn=fn: fn(
                q, k, v, g=gate, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=False),
            [q, k, v, gate, beta, h0]))
    return rows


def gated_delta_rule() -> list[Comparison]:
    """Qwen3-Next's gated delta rule (one decay per value head, two value heads per q/k head) as kda with the decay
    on every key channel, and its decay -exp(A_log) softplus(a + dt_bias) as kda_gate (softplus form, K = 1)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as qn

    rows = []
    b, t, h, hv, d = 2, 19, 2, 4, 8
    for name, fn in (("torch_chunk_gated_delta_rule", qn.torch_chunk_gated_delta_rule.__wrapped__),
                     ("torch_recurrent_gated_delta_rule", qn.torch_recurrent_gated_delta_rule.__wrapped__)):
        g = torch.Generator().manual_seed(12)
        q, k = (torch.nn.functional.normalize(torch.randn(b, t, h, d, generator=g, dtype=F64), dim=-1)
                .requires_grad_(True) for _ in range(2))
        v, h0 = _leaf(b, t, hv, d, g=g), _leaf(b, hv, d, d, g=g)
        decay = torch.nn.functional.logsigmoid(torch.randn(b, t, hv, generator=g, dtype=F64)).requires_grad_(True)
        beta = torch.sigmoid(torch.randn(b, t, hv, generator=g, dtype=F64)).requires_grad_(True)

        def ours(q=q, k=k, v=v, decay=decay, beta=beta, h0=h0):
            every_channel = decay[..., None].expand(b, t, hv, d)
            return get_block("kda").reference(q, k, v, every_channel, beta, d ** -0.5, h0)

        def theirs(q=q, k=k, v=v, decay=decay, beta=beta, h0=h0, fn=fn):
            return fn(q, k, v, g=decay, beta=beta, initial_state=h0, output_final_state=True,
                      use_qk_l2norm_in_kernel=False)

        rows.append(_compare("kda", f"{name} (Qwen3-Next, torch path)", ours, theirs, [q, k, v, decay, beta, h0]))
    g = torch.Generator().manual_seed(13)
    a, a_log, dt_bias = _leaf(2, 7, 4, g=g, scale=3.0), _leaf(4, g=g), _leaf(4, g=g)
    rows.append(_compare("kda_gate", "Qwen3NextGatedDeltaNet decay (softplus, one channel per head)",
                         lambda: get_block("kda_gate").reference(a[..., None], a_log, dt_bias[:, None], None)[..., 0],
                         lambda: -a_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias),
                         [a, a_log, dt_bias]))
    return rows


def _gate_inputs(config_cls, gate_cls, seed: int, **config):
    g = torch.Generator().manual_seed(seed)
    cfg = config_cls(hidden_size=16, linear_num_heads=2, linear_head_dim=4, **config)
    gate = gate_cls(cfg).to(F64)
    for p in gate.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=F64)
    x = _leaf(2, 5, 16, g=g, scale=2.0)
    return gate, x


def kda_gate() -> list[Comparison]:
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextForgetGate
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearForgetGate

    block = get_block("kda_gate")
    gate, x = _gate_inputs(Glm5NextTextConfig, Glm5NextTextForgetGate, 4, linear_lower_bound=-5.0)
    f = lambda: gate.f_b_proj(gate.f_a_proj(x)).view(2, 5, 2, 4)  # noqa: E731
    bounded = _compare("kda_gate", "Glm5NextTextForgetGate (linear_lower_bound -5)",
                       lambda: block.reference(f(), gate.A_log, gate.dt_bias.view(2, 4), -5.0), lambda: gate(x),
                       [x, gate.A_log, gate.dt_bias])
    gate, x = _gate_inputs(KimiLinearConfig, KimiLinearForgetGate, 5)
    softplus = _compare("kda_gate", "KimiLinearForgetGate (softplus, lower_bound None)", lambda: block.reference(
        gate.f_b_proj(gate.f_a_proj(x)).view(2, 5, 2, 4), gate.A_log.view(2), gate.dt_bias.view(2, 4), None),
        lambda: gate(x), [x, gate.A_log, gate.dt_bias])
    return [bounded, softplus]


def mla() -> Comparison:
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearAttention

    g = torch.Generator().manual_seed(6)
    cfg = KimiLinearConfig(hidden_size=32, num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=16,
                           qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=None)
    cfg._attn_implementation = "eager"
    attn = KimiLinearAttention(cfg, 0).to(F64)
    for p in attn.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=F64) * p.shape[-1] ** -0.5
    x, t = _leaf(2, 7, 32, g=g), 7
    mask = torch.full((t, t), float("-inf"), dtype=F64).triu(1)[None, None]
    block = get_block("mla")

    def ours():
        q = attn.q_proj(x).view(2, t, 3, 12)
        c_kv, k_rope = attn.kv_a_proj_with_mqa(x).split([16, 4], dim=-1)
        w = attn.kv_b_proj.weight.view(3, 14, 16)
        norm = attn.kv_a_layernorm
        c_kv = get_block("rmsnorm").reference(c_kv, norm.weight, norm.variance_epsilon)
        out = block.reference(q, c_kv, k_rope, w[:, :8], w[:, 8:], None, attn.scaling)
        return attn.o_proj(out.reshape(2, t, -1))

    return _compare("mla", "KimiLinearAttention (decompressed, no rope)", ours, lambda: attn(x, mask)[0],
                    [x, attn.kv_b_proj.weight, attn.q_proj.weight])


def mla_rope() -> Comparison:
    """DeepSeek-V3's MLA: the rope parts rotated (transformers' interleaved rotary embedding) before the block."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    g = torch.Generator().manual_seed(15)
    cfg = ds.DeepseekV3Config(hidden_size=32, num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=16,
                              q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    cfg._attn_implementation = "eager"
    attn = ds.DeepseekV3Attention(cfg, 0).to(F64)
    for p in attn.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=F64) * p.shape[-1] ** -0.5
    t = 7
    x = _leaf(2, t, 32, g=g)
    with Float64Casts():
        cos, sin = ds.DeepseekV3RotaryEmbedding(cfg)(x, torch.arange(t)[None].expand(2, t))
    mask = torch.full((t, t), float("-inf"), dtype=F64).triu(1)[None, None]

    def ours():
        q = attn.q_proj(x).view(2, t, 3, 12)
        c_kv, k_rope = attn.kv_a_proj_with_mqa(x).split([16, 4], dim=-1)
        q_rope, k_rope = ds.apply_rotary_pos_emb_interleave(q[..., 8:].transpose(1, 2), k_rope.view(2, 1, t, 4),
                                                            cos, sin)
        q = torch.cat([q[..., :8], q_rope.transpose(1, 2)], dim=-1)
        w = attn.kv_b_proj.weight.view(3, 14, 16)
        norm = attn.kv_a_layernorm
        c_kv = get_block("rmsnorm").reference(c_kv, norm.weight, norm.variance_epsilon)
        out = get_block("mla").reference(q, c_kv, k_rope.view(2, t, 4), w[:, :8], w[:, 8:], None, attn.scaling)
        return attn.o_proj(out.reshape(2, t, -1))

    return _compare("mla", "DeepseekV3Attention (rope on interleaved pairs)", ours,
                    lambda: attn(x, (cos, sin), mask)[0], [x, attn.kv_b_proj.weight, attn.q_proj.weight])


def attnres() -> Comparison:
    """Inkling2's block attention residual: keys and values the unweighted RMS-normalised sources, one zero-init
    query (here a trained one), scale 1 / sqrt(D); attnres with normalized_values, key weight 1, no output norm."""
    from transformers.models.inkling2 import modeling_inkling2 as ink

    g = torch.Generator().manual_seed(16)
    cfg = ink.Inkling2TextConfig(hidden_size=24)
    mix = ink.Inkling2BlockAttentionResidual(cfg).to(F64)
    mix.query.data = torch.randn(24, generator=g, dtype=F64)
    blocks, partial = _leaf(2, 5, 3, 24, g=g, scale=2.0), _leaf(2, 5, 24, g=g)
    ones = torch.ones(24, dtype=F64)

    def ours():
        sources = torch.cat([blocks, partial.unsqueeze(-2)], dim=-2).permute(2, 0, 1, 3).reshape(4, 10, 24)
        h, _ = get_block("attnres").reference(sources, mix.query, ones, None, mix.norm.eps, 24 ** -0.5, True)
        return h.view(2, 5, 24)

    return _compare("attnres", "Inkling2BlockAttentionResidual (normalised values, unweighted norm)", ours,
                    lambda: mix(blocks, partial)[0], [blocks, partial, mix.query])


def hyper_connection() -> list[Comparison]:
    """GLM-5-Next's and DeepSeek-V4's mHC modules (the same forward: 4 streams, 20 Sinkhorn rounds) with trained-
    looking parameters: fn ~ N(0, 4 / ND), base and scale off their zero and one init."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as ds4
    from transformers.models.glm5_next import modeling_glm5_next as glm

    ref = get_block("hyper_connection").reference
    g = torch.Generator().manual_seed(23)
    rows = []
    for label, module_class, config in (
            ("Glm5NextTextHyperConnection", glm.Glm5NextTextHyperConnection, glm.Glm5NextTextConfig(hidden_size=24)),
            ("DeepseekV4HyperConnection", ds4.DeepseekV4HyperConnection, ds4.DeepseekV4Config(hidden_size=24))):
        module = module_class(config).to(F64)
        n = module.hc_mult
        module.fn.data = torch.randn(module.fn.shape, generator=g, dtype=F64) * 2 / (n * 24) ** 0.5
        module.base.data = torch.randn(module.base.shape, generator=g, dtype=F64) / 2
        module.scale.data = 0.5 + torch.rand(3, generator=g, dtype=F64)
        x = _leaf(2, 5, n, 24, g=g)

        def ours(module=module, x=x, n=n):
            post, comb, collapsed = ref(x.reshape(10, n, 24), module.fn, module.base, module.scale,
                                        module.input_norm.eps, module.hc_eps, module.hc_sinkhorn_iters)
            return post.view(2, 5, n), comb.view(2, 5, n, n), collapsed.view(2, 5, 24)

        rows.append(_compare("hyper_connection", f"{label} ({n} streams, {module.hc_sinkhorn_iters} Sinkhorn "
                                                 "rounds)", ours, lambda module=module, x=x: module(x),
                             [x, module.fn, module.base, module.scale]))
    rows.append(_compare("hyper_connection", f"{label} held to one Sinkhorn round",
                         lambda: ref(x.reshape(10, n, 24), module.fn, module.base, module.scale,
                                     module.input_norm.eps, module.hc_eps, 1)[1].view(2, 5, n, n),
                         lambda: module(x)[1], [x, module.fn, module.base, module.scale], same=False,
                         note="the rounds are part of the variant"))
    return rows


def hyper_connection_mix() -> Comparison:
    """GLM-5-Next's decoder layer (a KDA layer and its MLP) as the family's patch computes it, every op through the
    references (hyper_connection_mix after both sub-layers), against the shipped layer: the expand and mix are a
    step of the layer's forward, not a module."""
    from transformers.models.glm5_next import modeling_glm5_next as glm

    from workbench.integrations.families import glm5_next
    from workbench.integrations.ops import computing_with, references
    from workbench.integrations.probe import torch_paths_restored

    g = torch.Generator().manual_seed(29)
    config = glm.Glm5NextTextConfig(hidden_size=32, intermediate_size=48, layer_types=["linear_attention"],
                                    mlp_layer_types=["dense"], num_hidden_layers=1, linear_num_heads=2,
                                    linear_head_dim=16)
    layer = glm.Glm5NextTextDecoderLayer(config, 0).to(F64)
    for param in layer.parameters():
        param.data = torch.randn(param.shape, generator=g, dtype=F64) * (0.5 if param.dim() < 2 else 0.1)
    x = _leaf(2, 5, config.hc_mult, 32, g=g)

    def ours():  # the shipped sub-layers (hyper-connections, KDA, MLP); the expand and mix through the reference
        with computing_with(references()), Float64Casts():
            return glm5_next.decoder_layer_forward(layer, x)[0]

    with torch_paths_restored(glm):  # fla's kernels need a GPU driver: the KDA layer's torch path, as without fla
        return _compare("hyper_connection_mix", "Glm5NextTextDecoderLayer (a KDA layer and a dense MLP, each "
                        "followed by post * y + comb^T @ residual)", ours, lambda: layer(x)[0],
                        [x, *layer.parameters()])


def _dsa_layer(seed: int):
    """A float64 DeepseekV32Attention (eager: the index mask folded into the attention mask) with random weights,
    its input [2, 12, 32] and its rotary embedding: 2 heads, the top 5 of 12 keys; 16 index heads, so that a score
    is exactly 0 (every head's dot clipped by the relu) with odds 2^-16: no exact ties at the k-th place, which the
    block settles by the smaller position and torch.topk by its own order."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as ds

    g = torch.Generator().manual_seed(seed)
    cfg = ds.DeepseekV32Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=12,
                               kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                               index_n_heads=16, index_head_dim=8, index_topk=5)
    cfg._attn_implementation = "eager"
    attn = ds.DeepseekV32Attention(cfg, 0).to(F64)
    for p in attn.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=F64) * p.shape[-1] ** -0.5
    t = 12
    x = _leaf(2, t, 32, g=g)
    with Float64Casts():
        cos, sin = ds.DeepseekV32RotaryEmbedding(cfg)(x, torch.arange(t)[None].expand(2, t))
    mask = torch.full((t, t), float("-inf"), dtype=F64).triu(1)[None, None].expand(2, 1, t, t)
    return ds, attn, x, (cos, sin), mask


def _dsa_selection(ds, attn, x, q_resid, position_embeddings) -> torch.Tensor:
    """The indexer's selection by the dsa_indexer reference (the integration's inputs: its head weights carry the
    softmax scale and n_heads^-0.5), -1 padded."""
    from workbench.integrations.families._dsa import index_inputs

    cos, sin = position_embeddings
    with torch.no_grad(), Float64Casts():
        q, k, w = index_inputs(attn, x, q_resid,
                               lambda a, b: ds.apply_rotary_pos_emb(a, b, cos, sin, unsqueeze_dim=2))
        return get_block("dsa_indexer").reference(q, k, w, attn.indexer.index_topk)[1]


def dsa_indexer() -> Comparison:
    """DeepSeek-V3.2's lightning indexer: the selection, as causal key sets per query (output_rel: the fraction of
    rows that differ); no gradients (the shipped indexer runs under no_grad)."""
    ds, attn, x, position_embeddings, mask = _dsa_layer(17)
    q_resid = attn.q_a_layernorm(attn.q_a_proj(x)).detach()
    ours = _dsa_selection(ds, attn, x, q_resid, position_embeddings)
    with torch.no_grad(), Float64Casts():
        theirs = attn.indexer(x, q_resid, position_embeddings, mask[:, 0], None)
    t = x.shape[1]
    causal = [[sorted(i for i in row if 0 <= i <= r % t) for r, row in enumerate(ix.reshape(-1, ix.shape[-1]).tolist())]
              for ix in (ours, theirs)]
    differ = sum(a != b for a, b in zip(*causal, strict=True)) / len(causal[0])
    return Comparison("dsa_indexer", "DeepseekV32Indexer (the selection; no grad)", True, differ, 0.0,
                      "selection sets compared; the shipped indexer has no backward")


def dsa_sparse_attention() -> Comparison:
    """DeepSeek-V3.2's DSA layer (eager): MLA decompressed (192/128-style: keys nope + rope, narrower values) over
    the indexer's top-k, as dsa_sparse_attention with one kv head per query head and no gate."""
    ds, attn, x, position_embeddings, mask = _dsa_layer(18)
    cos, sin = position_embeddings
    b, t, h = 2, x.shape[1], attn.num_heads

    def norm(module, value):  # the latents' RMSNorms as the rmsnorm block (the module casts to float32 by name)
        return get_block("rmsnorm").reference(value, module.weight, module.variance_epsilon)

    def ours():
        q_resid = norm(attn.q_a_layernorm, attn.q_a_proj(x))
        q = attn.q_b_proj(q_resid).view(b, t, h, attn.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
        c_kv, k_rope = attn.kv_a_proj_with_mqa(x).split([attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1)
        q_rope, k_rope = ds.apply_rotary_pos_emb_interleave(q_rope, k_rope.view(b, 1, t, -1), cos, sin)
        k_nope, v = attn.kv_b_proj(norm(attn.kv_a_layernorm, c_kv)).view(b, t, h, -1).split(
            [attn.qk_nope_head_dim, attn.v_head_dim], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_rope.transpose(1, 2).expand(b, t, h, -1)], dim=-1)
        indices = _dsa_selection(ds, attn, x, q_resid.detach(), position_embeddings)
        out = get_block("dsa_sparse_attention").reference(q, k, v, indices, None, attn.scaling)
        return attn.o_proj(out.reshape(b, t, -1))

    return _compare("dsa_sparse_attention", "DeepseekV32Attention (eager, keys 12 / values 6 wide, top 5 of 12)",
                    ours, lambda: attn(x, position_embeddings, mask)[0],
                    [x, attn.kv_b_proj.weight, attn.q_b_proj.weight])


def _glm5_next_dsa_layers(seed: int):
    """Two float64 Glm5NextTextAttention layers (eager) with random weights, a full one and a shared one (it attends
    over the full layer's selection), and their unpadded input [2, 19, 32]: 2 heads, no rotary embedding, an indexer
    of 16 heads (exact zero ties rare: see _dsa_layer) over pools of 4 keys, the top 8 keys (two pools) and the
    tail."""
    from transformers.models.glm5_next import modeling_glm5_next as glm

    g = torch.Generator().manual_seed(seed)
    cfg = glm.Glm5NextTextConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=12,
                                 kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=0, v_head_dim=6,
                                 index_n_heads=16, index_head_dim=8, index_topk=8, index_kpool=4,
                                 layer_types=["indexed_attention"] * 2, indexer_types=["full", "shared"],
                                 num_hidden_layers=2)
    cfg._attn_implementation = "eager"
    layers = [glm.Glm5NextTextAttention(cfg, i).to(F64) for i in range(2)]
    for layer in layers:
        for p in layer.parameters():
            p.data = torch.randn(p.shape, generator=g, dtype=F64) * p.shape[-1] ** -0.5
        layer.original_forward = layer.forward
    return layers, _leaf(2, 19, 32, g=g), torch.ones(2, 19, dtype=torch.bool)


def dsa_kpool_indexer() -> list[Comparison]:
    """GLM-5-Next's k-pool indexer: the selection (key sets per query, the tail included; output_rel: the fraction of
    rows that differ; no gradients, the shipped indexer runs under no_grad), and its DSA layers as the family's
    patch computes them: the full layer (dsa_kpool_indexer, then dsa_sparse_attention over the decompressed heads)
    and the shared one after it (dsa_sparse_attention over the selection handed down)."""
    from workbench.integrations.families import glm5_next
    from workbench.integrations.ops import computing_with, references

    (full, shared), x, mask = _glm5_next_dsa_layers(31)
    q_resid = full.q_a_layernorm(full.q_a_proj(x)).detach()
    with computing_with(references()), Float64Casts():
        ours = glm5_next.select_pools(full, x.detach(), q_resid)
    with torch.no_grad(), Float64Casts():
        theirs = full.indexer(x.detach(), q_resid, mask, None)
    sets = [[sorted(row) for row in ix.reshape(-1, ix.shape[-1]).tolist()] for ix in (ours, theirs)]
    differ = sum(a != b for a, b in zip(*sets, strict=True)) / len(sets[0])

    def patched(layer):
        with computing_with(references()), Float64Casts():
            out, _, selection = glm5_next.attention_forward(full, x, mask)
            return out if layer is full else glm5_next.attention_forward(shared, x, mask, None, selection)[0]

    def shipped(layer):
        out, _, selection = full(x, mask)
        return out if layer is full else shared(x, mask, None, selection)[0]

    leaves = [x, full.kv_b_proj.weight, full.q_b_proj.weight, shared.kv_b_proj.weight]
    return [Comparison("dsa_kpool_indexer", "Glm5NextTextIndexer (pools of 4, top 8 keys and the tail; the "
                                            "selection; no grad)", True, differ, 0.0,
                       "selection sets compared; the shipped indexer has no backward"),
            *(_compare("dsa_kpool_indexer", f"Glm5NextTextAttention, {label} (eager, no rotary)",
                       lambda layer=layer: patched(layer), lambda layer=layer: shipped(layer), leaves)
              for layer, label in ((full, "a full layer: dsa_kpool_indexer, then dsa_sparse_attention"),
                                   (shared, "a shared layer after it: dsa_sparse_attention over its selection")))]


def dsa_kpool_indexer_decode() -> Comparison:
    """GLM-5-Next's k-pool indexer decoding with a cache: the full layer's Glm5NextTextIndexer fed one token per step
    through a DynamicCache (the layer's key cache grown as its attention grows it), against dsa_kpool_indexer_decode
    over a paged cache of 4-row pages; output_rel: the fraction of (sequence, step) rows whose key sets differ. The
    sets, not the rows: the shipped decode puts the tail right after the pools the cache can fill (at min(topk // P,
    complete pools) * P), the block at (topk // P) * P, as both do in a prefill; the -1 padding moves, not a key."""
    from transformers.cache_utils import DynamicCache

    (full, _), x, mask = _glm5_next_dsa_layers(31)
    indexer, (b, t) = full.indexer, x.shape[:2]
    pool, page, width = indexer.index_kpool, 4, 2 * indexer.head_dim
    cache, table = DynamicCache(config=full.config), torch.arange(b * -(-t // page)).view(b, -1).int()
    pages = torch.zeros(table.numel() + 1, page, width, dtype=F64)
    rows_differ = 0
    with torch.no_grad(), Float64Casts():
        q_resid = full.q_a_layernorm(full.q_a_proj(x))
        for step in range(t):
            token, resid = x[:, step:step + 1], q_resid[:, step:step + 1]
            cache.layers[full.layer_idx].update(token.new_zeros(b, 1, 1, 1), token.new_zeros(b, 1, 1, 1))
            theirs = indexer(token, resid, mask[:, step:step + 1], cache)[:, 0]
            q = indexer.wq_b(resid[:, 0]).view(b, indexer.n_heads, indexer.head_dim)
            w = indexer.weights_proj(token[:, 0]) * (indexer.n_heads ** -0.5 * indexer.softmax_scale)
            _, _, ours, pages = get_block("dsa_kpool_indexer_decode").reference(
                q, indexer.k_norm(indexer.wk(token[:, 0])), w,
                F.linear(token[:, 0], indexer.index_kpool_compress_gate), indexer.index_kpool_compress_ape, pages,
                table, torch.full((b,), step, dtype=torch.int32), indexer.index_topk,
                bool(indexer.index_kpool_always_select_tail))
            rows_differ += int((ours.sort(dim=-1).values != theirs.sort(dim=-1).values).any(dim=-1).sum())
    return Comparison("dsa_kpool_indexer_decode", f"Glm5NextTextIndexer with a DynamicCache ({t} decode steps, "
                                                  f"pools of {pool}, top 8 keys and the tail; no grad)", True,
                      rows_differ / (b * t), 0.0, "selection sets compared; the shipped indexer has no backward")


def _router(config_cls, router_cls, seed: int, **config):
    g = torch.Generator().manual_seed(seed)
    cfg = config_cls(hidden_size=16, num_local_experts=16, num_experts_per_tok=4, **config)
    router = router_cls(cfg).to(F64)
    router.weight.data = torch.randn(16, 16, generator=g, dtype=F64)
    router.e_score_correction_bias = torch.randn(16, generator=g, dtype=F64) * 0.1
    return router, _leaf(48, 16, g=g)


def _routed(router, x):
    """The router's weights in ascending expert order and the chosen expert sets (order-free)."""
    def run():
        _, weights, ids = router(x)
        order = ids.argsort(-1)
        return weights.gather(-1, order), ids.gather(-1, order).to(F64)
    return run


def moe_router() -> list[Comparison]:
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearTopkRouter

    block = get_block("moe_router")
    rows = []
    for cls, config_cls, name, config in (
            (KimiLinearTopkRouter, KimiLinearConfig, "KimiLinearTopkRouter (n_group 1)",
             {"n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.446}),
            (DeepseekV3TopkRouter, DeepseekV3Config, "DeepseekV3TopkRouter (n_group 4, topk_group 2)",
             {"n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5})):
        router, x = _router(config_cls, cls, 8, **config)

        def ours(router=router, x=x):
            weights, ids, _ = block.reference(x, router.weight, router.e_score_correction_bias, router.top_k,
                                              "sigmoid", None, router.norm_topk_prob, router.routed_scaling_factor,
                                              router.num_group, router.topk_group)
            order = ids.argsort(-1)
            return weights.gather(-1, order), ids.gather(-1, order).to(F64)

        rows.append(_compare("moe_router", name, ours, _routed(router, x), [x, router.weight]))
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextTopKRouter

    g = torch.Generator().manual_seed(14)
    router = Qwen3NextTopKRouter(Qwen3NextConfig(hidden_size=16, num_experts=16, num_experts_per_tok=4)).to(F64)
    router.weight.data = torch.randn(16, 16, generator=g, dtype=F64)
    x = _leaf(48, 16, g=g)

    def softmax_ours():
        weights, ids, _ = block.reference(x, router.weight, torch.zeros(16, dtype=F64), 4, "softmax", None, True, 1.0)
        order = ids.argsort(-1)
        return weights.gather(-1, order), ids.gather(-1, order).to(F64)

    rows.append(_compare("moe_router", "Qwen3NextTopKRouter (softmax, renormalized)", softmax_ours,
                         _routed(router, x), [x, router.weight]))
    from transformers.models.inkling2 import modeling_inkling2 as ink

    router, x = _router(ink.Inkling2TextConfig, ink.Inkling2TopKRouter, 17, route_scale=8.0)

    def inkling2_ours():
        weights, ids, _ = block.reference(x, router.weight, router.e_score_correction_bias, router.top_k, "sigmoid",
                                          None, True, router.routed_scaling_factor)
        order = ids.argsort(-1)
        return weights.gather(-1, order), ids.gather(-1, order).to(F64)

    rows.append(_compare("moe_router", "Inkling2TopKRouter (sigmoid, renormalized, route_scale 8)", inkling2_ours,
                         _routed(router, x), [x, router.weight]))
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

    router, x = _router(DeepseekV4Config, DeepseekV4TopKRouter, 19)

    def deepseek_v4_ours():
        weights, ids, _ = block.reference(x, router.weight, router.e_score_correction_bias, router.top_k,
                                          "sqrtsoftplus", None, True, router.routed_scaling_factor)
        order = ids.argsort(-1)
        return weights.gather(-1, order), ids.gather(-1, order).to(F64)

    rows.append(_compare("moe_router", "DeepseekV4TopKRouter (sqrt(softplus), renormalized, scale 1.5)",
                         deepseek_v4_ours, _routed(router, x), [x, router.weight]))
    return rows


def situ() -> Comparison:
    """Inkling2's softcapped SwiGLU: the sigmoid sees the raw gate, the caps bound the gate factor and up."""
    from transformers.models.inkling2 import modeling_inkling2 as ink

    g = torch.Generator().manual_seed(18)
    act = ink.Inkling2SoftcappedSwiGLU(ink.Inkling2TextConfig(mlp_gate_softcap=3.0, mlp_up_softcap=20.0))
    gate_up = _leaf(6, 40, g=g, scale=12.0)  # past both caps
    return _compare("situ", "Inkling2SoftcappedSwiGLU (caps 3 and 20)",
                    lambda: get_block("situ").reference(gate_up, 3.0, 20.0), lambda: act(*gate_up.chunk(2, dim=-1)),
                    [gate_up])


def moe_experts() -> list[Comparison]:
    """The three MoE blocks against the eager experts: Kimi Linear's (SwiGLU), Inkling2's (SiTU, its caps) and
    GLM-5-Next's (SwiGLU clamped at swiglu_limit 10, which the gates' scale reaches: about 5% of a and 10% of b lie
    past it); GLM-5-Next's also held to the unclamped form, which it is not."""
    from transformers.models.glm5_next import modeling_glm5_next as glm
    from transformers.models.inkling2 import modeling_inkling2 as ink
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearExperts

    rows = []
    glm_experts = glm.Glm5NextTextExperts(glm.Glm5NextTextConfig(hidden_size=16, moe_intermediate_size=12,
                                                                 n_routed_experts=6, swiglu_limit=10.0))
    for name, experts, activation in (
            ("KimiLinearExperts (eager)", KimiLinearExperts(KimiLinearConfig(
                hidden_size=16, moe_intermediate_size=12, num_local_experts=6)), ("swiglu", 4.0, 25.0)),
            ("Inkling2Experts (eager, softcapped SwiGLU 3 / 20)", ink.Inkling2Experts(ink.Inkling2TextConfig(
                hidden_size=16, moe_intermediate_size=12, n_routed_experts=6, mlp_gate_softcap=3.0,
                mlp_up_softcap=20.0)), ("situ", 3.0, 20.0)),
            ("Glm5NextTextExperts (eager, SwiGLU clamped at 10)", glm_experts, ("swiglu", 4.0, 25.0, 10.0)),
            ("Glm5NextTextExperts held to unclamped SwiGLU", glm_experts, ("swiglu", 4.0, 25.0))):
        g = torch.Generator().manual_seed(9)
        experts = experts.to(F64)
        experts.gate_up_proj.data = torch.randn(6, 24, 16, generator=g, dtype=F64) * 1.5  # gates past the cap
        experts.down_proj.data = torch.randn(6, 16, 12, generator=g, dtype=F64) * 0.3
        x = _leaf(20, 16, g=g)
        ids = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(20)])
        weights = torch.rand(20, 2, generator=g, dtype=F64).requires_grad_(True)

        def ours(experts=experts, x=x, ids=ids, weights=weights, activation=activation):
            x_perm, _, row_of_slot, _, offsets = get_block("moe_permute").reference(x, ids, 6)
            y = get_block("moe_grouped_gemm").reference(x_perm, offsets, experts.gate_up_proj[:, :12],
                                                        experts.gate_up_proj[:, 12:], experts.down_proj, *activation)
            return get_block("moe_combine").reference(y, weights, row_of_slot)

        rows.append(_compare("moe_permute + moe_grouped_gemm + moe_combine", name, ours,
                             lambda experts=experts, x=x, ids=ids, weights=weights: experts(x, ids, weights),
                             [x, weights, experts.gate_up_proj, experts.down_proj], same="held to" not in name,
                             note="unclamped: another variant" if "held to" in name else ""))
    return rows


def lora_linear() -> Comparison:
    import peft

    g = torch.Generator().manual_seed(10)
    base = torch.nn.Sequential(torch.nn.Linear(12, 10, bias=False)).to(F64)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["0"], lora_dropout=0.0))
    layer = model.base_model.model[0]
    layer.lora_B["default"].weight.data = torch.randn(10, 4, generator=g, dtype=F64)
    x = _leaf(7, 12, g=g)
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    return _compare("lora_linear", "peft LoraLayer Linear (alpha / r, no dropout)",
                    lambda: get_block("lora_linear").reference(x, layer.base_layer.weight, a, b, 8 / 4),
                    lambda: layer(x), [x, a, b])


def _attention_module(heads: int, kv_heads: int, dim: int, sinks: torch.Tensor | None = None) -> torch.nn.Module:
    """What transformers' eager attention functions read from their module: the KV groups, the head size, training
    off, and (GPT-OSS) its learnt sinks."""
    module = torch.nn.Module()
    module.num_key_value_groups, module.head_dim = heads // kv_heads, dim
    if sinks is not None:
        module.sinks = sinks
    return module.eval()


ATTENTION_VARIANTS = (
    # (family, its variant: TQ, TK, H, HKV, D, window, sinks, softcap, scale)
    ("qwen3_next", "GQA, causal (Qwen3-Next's gated full attention, head size 256 there)", 9, 9, 4, 2, 24, 0, 0, 0,
     None),
    ("mistral", "GQA, a sliding window (Mistral, Qwen2's sliding layers)", 13, 13, 4, 1, 16, 5, 0, 0, None),
    ("gpt_oss", "GQA, learnt per-head sinks (s_aux), a sliding window on alternate layers", 11, 11, 4, 2, 16, 4, 1,
     0, None),
    ("gemma2", "GQA, a logit soft cap and a sliding window, scale query_pre_attn_scalar^-0.5", 10, 10, 4, 2, 16, 6,
     0, 3.0, 0.2),
    ("llama", "MHA, a query chunk over a longer cache (generate: the queries are the last keys)", 3, 12, 3, 3, 20, 0,
     0, 0, None),
)
"""The attention variants transformers' families pass to their attention functions, each held to that family's own
eager_attention_forward with the mask transformers builds for it."""


def attention() -> list[Comparison]:
    """The attention block against each family's eager_attention_forward (queries [B, H, TQ, D], the 4D mask from
    masking_utils.eager_mask with the causal or sliding-window function, offset for a cache), per variant."""
    import importlib

    from transformers import masking_utils

    rows = []
    for i, (family, label, tq, tk, h, hkv, d, window, with_sinks, softcap, scale) in enumerate(ATTENTION_VARIANTS):
        modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        g = torch.Generator().manual_seed(30 + i)
        q, k, v = _leaf(1, h, tq, d, g=g), _leaf(1, hkv, tk, d, g=g), _leaf(1, hkv, tk, d, g=g)
        sinks = (torch.randn(h, generator=g, dtype=F64) + 1).requires_grad_(True) if with_sinks else None
        scale = scale or d ** -0.5
        rule = masking_utils.sliding_window_causal_mask_function(window) if window else \
            masking_utils.causal_mask_function
        mask = masking_utils.eager_mask(1, tq, tk, q_offset=tk - tq, mask_function=rule, dtype=F64)
        module = _attention_module(h, hkv, d, sinks)
        extra = {"softcap": softcap} if softcap else {}

        def ours(q=q, k=k, v=v, sinks=sinks, scale=scale, window=window, softcap=softcap):
            return get_block("attention").reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks,
                                                     scale, window, float(softcap))

        def theirs(modeling=modeling, module=module, q=q, k=k, v=v, mask=mask, scale=scale, extra=extra):
            return modeling.eager_attention_forward(module, q, k, v, mask, scaling=scale, dropout=0.0, **extra)[0]

        rows.append(_compare("attention", f"{family} eager_attention_forward: {label}", ours, theirs,
                             [q, k, v] + ([sinks] if sinks is not None else [])))
    return rows + inkling2_attention()


INKLING2_VARIANTS = (
    # (its layer: TQ, TK, window, rel_extent)
    ("sliding: a 5-token window, the relative logits over it, a query chunk over a cache", 7, 13, 5, 5),
    ("full: relative logits over the nearest 6 distances of 12 keys", 12, 12, 0, 6),
)
"""Inkling2's attention as its layers call it: per-token sinks, relative logits per backward distance."""


def inkling2_attention() -> list[Comparison]:
    """The attention block with per-token sinks and relative logits (rel = relative_states @ proj [B, TQ, H, E])
    against Inkling2's eager_attention_forward with the dense bias its Inkling2RelativeLogits gathers from the same
    states, and its sinks [B, H, TQ, 1], under the mask transformers builds; gradients of q, k, v, the relative
    states, the profile bank and the sinks."""
    from transformers import masking_utils
    from transformers.models.inkling2 import modeling_inkling2 as ink

    rows = []
    h, hkv, d, d_rel = 4, 2, 16, 3
    scale = d ** -0.5
    for i, (label, tq, tk, window, extent) in enumerate(INKLING2_VARIANTS):
        g = torch.Generator().manual_seed(50 + i)
        q, k, v = _leaf(1, h, tq, d, g=g), _leaf(1, hkv, tk, d, g=g), _leaf(1, hkv, tk, d, g=g)
        states, sinks = _leaf(1, tq, h, d_rel, g=g), _leaf(1, tq, h, g=g)
        relative = ink.Inkling2RelativeLogits(d_rel, extent).to(F64)
        relative.proj.data = torch.randn(d_rel, extent, generator=g, dtype=F64)
        rule = masking_utils.sliding_window_causal_mask_function(window) if window else \
            masking_utils.causal_mask_function
        mask = masking_utils.eager_mask(1, tq, tk, q_offset=tk - tq, mask_function=rule, dtype=F64)
        module = _attention_module(h, hkv, d)

        def ours(q=q, k=k, v=v, states=states, sinks=sinks, relative=relative, window=window):
            return get_block("attention").reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks,
                                                     scale, window, 0.0, states @ relative.proj)

        def theirs(q=q, k=k, v=v, states=states, sinks=sinks, relative=relative, mask=mask, module=module, tq=tq,
                   tk=tk):
            bias = relative(states, torch.arange(tq) + tk - tq, torch.arange(tk))
            return ink.eager_attention_forward(module, q, k, v, mask, scaling=scale, position_bias=bias,
                                               sinks=sinks.transpose(1, 2).unsqueeze(-1))[0]

        rows.append(_compare("attention", f"inkling2 eager_attention_forward: {label}", ours, theirs,
                             [q, k, v, states, relative.proj, sinks]))
    return rows


COMPARISONS: tuple[Callable[[], Comparison | list[Comparison]], ...] = (
    rmsnorm, layernorm, zero_centred_rmsnorm, rmsnorm_gated, swiglu, situ, kda_short_conv, kda_short_conv_decode,
    l2_clip, kda_prologue, kda,
    gated_delta_rule, kda_gate, mla, mla_rope, rotary, attention, attnres, hyper_connection, hyper_connection_mix,
    dsa_indexer, dsa_kpool_indexer, dsa_kpool_indexer_decode, dsa_sparse_attention, moe_router, moe_experts,
    lora_linear)
"""Every block with a published counterpart (transformers 5.23, PEFT 0.21)."""


def compare_all() -> list[Comparison]:
    rows: list[Comparison] = []
    for comparison in COMPARISONS:
        found = comparison()
        rows += found if isinstance(found, list) else [found]
    return rows
