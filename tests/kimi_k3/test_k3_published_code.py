"""Kimi K3's text model held to K3's published serving code (vLLM 0.32 ``vllm/models/kimi_k3``), one test per fact
the workbench assembled otherwise before. Each test transcribes, in plain torch and in float64, the lines of K3's code
the fact comes from (named in the test) and compares the model's module with it; each also shows the old assembly
computing something else on the same weights.

    latent MoE      amd/linear.py KimiMoE + KimiRoutedOutputTransform; amd/latent_moe_runner.py
    Block AttnRes   amd/linear.py KimiDecoderLayer.forward_attn_residual, KimiLinearModel.forward; amd/ops/attn_res.py
    KDA gates       amd/kda.py KimiK3DeltaAttention (in_proj_qkvgfab: q, k, v, g, f_a, b; f_b_proj; o_norm)
    MTP             common/mtp.py fused_mtp_input; amd/mtp.py KimiK3MultiTokenPredictorLayer
    numbers         every RMSNorm eps 1e-5; layer 0 a dense SiTU MLP; the layer lists 1-indexed
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import workbench.models
from workbench.blocks.attnres import block_sources
from workbench.kimi_k3 import KimiK3Config, KimiK3ForCausalLM
from workbench.kimi_k3.modeling import Rows

SHARED = workbench.models.CARDS_DIR / "configs"


def tiny(**changes) -> KimiK3Config:
    """A K3 of K3's structure at tiny widths (float64 in the tests)."""
    fields = dict(vocab_size=64, hidden_size=32, num_hidden_layers=6, layer_kinds="KKKMKM", kda_num_heads=2,
                  kda_head_dim=8, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                  qk_rope_head_dim=4, v_head_dim=8, intermediate_size=48, num_experts=8, num_experts_per_token=2,
                  moe_intermediate_size=16, num_shared_experts=2, routed_expert_hidden_size=16,
                  attn_res_block_size=2)
    return KimiK3Config(**{**fields, **changes})


def model_of(config: KimiK3Config, seed: int = 0) -> KimiK3ForCausalLM:
    torch.manual_seed(seed)
    model = KimiK3ForCausalLM(config).double()
    with torch.no_grad():  # trained-looking weights: non-zero pseudo-queries, norm weights away from one
        for name, p in model.named_parameters():
            if name.endswith(("_res_proj.weight", "norm.weight")):
                p.copy_(torch.randn_like(p) * (2.0 if "res_proj" in name else 0.2) + ("norm" in name))
    return model


def rms(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """vLLM's RMSNorm: x * rsqrt(mean(x^2) + eps) * weight."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def situ_mlp(mlp, x: torch.Tensor, beta: float = 4.0, linear_beta: float = 25.0) -> torch.Tensor:
    """vLLM's KimiMLP with SituAndMul (layers/activation.py forward_native)."""
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    return mlp.down_proj(beta * torch.tanh(gate / beta) * torch.sigmoid(gate) * linear_beta * torch.tanh(up /
                                                                                                          linear_beta))


def k3_moe(moe, x: torch.Tensor, norm_first: bool = False) -> torch.Tensor:
    """KimiMoE.forward: the router on x (fp32 logits, sigmoid, the correction bias for the choice, renormalised top-k,
    routed_scaling_factor), x_lat = routed_expert_down_proj(x) with no norm, the experts on x_lat, their weighted
    sum, routed_expert_up_proj(routed_expert_norm(sum)) (KimiRoutedOutputTransform), plus the shared experts on x.
    ``norm_first``: the old assembly, the norm on the experts' input instead."""
    scores = torch.sigmoid(x @ moe.gate.weight.T)
    ids = (scores + moe.gate.e_score_correction_bias).topk(moe.gate.top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    weights = weights / weights.sum(-1, keepdim=True) * moe.gate.scale
    lat = moe.routed_expert_down_proj(x)
    if norm_first:
        lat = rms(lat, moe.routed_expert_norm.weight)
    experts = moe.experts
    out = torch.zeros_like(lat)
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[token, slot])
            gate, up = lat[token] @ experts.w1[e].T, lat[token] @ experts.w3[e].T
            act = 4.0 * torch.tanh(gate / 4.0) * torch.sigmoid(gate) * 25.0 * torch.tanh(up / 25.0)
            out[token] += weights[token, slot] * (act @ experts.w2[e].T)
    if not norm_first:
        out = rms(out, moe.routed_expert_norm.weight)
    return moe.routed_expert_up_proj(out) + situ_mlp(moe.shared_experts, x)


def test_latent_moe_normalises_the_combined_routed_output():
    """amd/linear.py: ``routed_input_transform=self.routed_expert_down_proj`` (no norm on the way in) and
    ``KimiRoutedOutputTransform(norm, up_proj)`` on the fused (combined) output."""
    moe = model_of(tiny()).model.layers[1].block_sparse_moe
    x = torch.randn(12, 32, dtype=torch.float64)
    with torch.no_grad():
        ours, published, old = moe(x), k3_moe(moe, x), k3_moe(moe, x, norm_first=True)
    assert (ours - published).abs().max() < 1e-12
    assert (old - published).abs().max() > 1e-2 * published.abs().max()  # the old assembly computes another MoE


def k3_attn_res(sources: list[torch.Tensor], proj, key, out_norm, eps: float = 1e-5) -> torch.Tensor:
    """amd/ops/attn_res.py ``_attn_res_kernel``: logits = sum(v * norm_weight * qk_weight) * rsqrt(mean(v^2) + eps),
    no scale factor; softmax over the sources; the raw sources mixed; the output norm fused (when given)."""
    v = torch.stack(sources)
    logits = (v * key.weight * proj.weight[0]).sum(-1) * torch.rsqrt(v.pow(2).mean(-1) + eps)
    mixed = (torch.softmax(logits, dim=0)[..., None] * v).sum(0)
    return mixed if out_norm is None else rms(mixed, out_norm.weight, eps)


def k3_residual_stream(model: KimiK3ForCausalLM, ids: torch.Tensor, rows: Rows, calls: list[int] | None = None
                       ) -> torch.Tensor:
    """KimiLinearModel.forward with attn-res, as vLLM runs it: a bank of blocks [N, nblocks, D], a prefix sum and a
    delta; layer l writes the updated prefix into block l // S when l % S == 0 (then restarts the prefix from the
    attention's output), its attention mixes the first cdiv(l, S) blocks and the prefix, its MLP those and one more
    at a write layer; the final AttnRes mixes cdiv(L, S) blocks and prefix + delta. ``calls`` collects the number of
    sources of each call."""
    size, layers = model.config.attn_res_block_size, model.model.layers
    hidden = model.model.embed_tokens(ids)
    blocks = hidden.new_empty(hidden.shape[0], math.ceil(len(layers) / size), hidden.shape[1])
    delta = None
    for index, layer in enumerate(layers):
        prefix = hidden if delta is None else hidden + delta  # the kernel's updated_prefix (stored in place)
        write = index % size == 0
        if write:
            blocks[:, index // size] = prefix
        valid = math.ceil(index / size)
        sources = [blocks[:, j] for j in range(valid)] + [prefix]
        h = k3_attn_res(sources, layer.self_attention_res_proj, layer.self_attention_res_norm, layer.input_layernorm)
        attended = layer.self_attn(h, rows)
        prefix, delta = (attended, None) if write else (prefix, attended)
        mlp_sources = [blocks[:, j] for j in range(valid + (1 if write else 0))] + \
            [prefix if delta is None else prefix + delta]
        h = k3_attn_res(mlp_sources, layer.mlp_res_proj, layer.mlp_res_norm, layer.post_attention_layernorm)
        if calls is not None:
            calls += [len(sources), len(mlp_sources)]
        hidden, delta = (prefix if delta is None else prefix + delta), layer.ffn(h)
    final = [blocks[:, j] for j in range(math.ceil(len(layers) / size))] + [hidden + delta]
    if calls is not None:
        calls.append(len(final))
    return k3_attn_res(final, model.model.output_attn_res_proj, model.model.output_attn_res_norm, None)


@pytest.mark.parametrize("layers, size", [(6, 2), (7, 3), (5, 12)])
def test_block_attnres_mixes_the_blocks_and_the_partial_sum(layers, size):
    """Layer l's attention reads the embedding, ceil(l / S) - 1 block sums and the current partial sum (the
    partial is the block just completed at a block's first layer); no scale on the logits; raw values."""
    config = tiny(num_hidden_layers=layers, layer_kinds=("KKKM" * 2)[:layers], attn_res_block_size=size)
    model = model_of(config)
    ids = torch.randint(0, 64, (2, 5))
    calls: list[int] = []
    with torch.no_grad():
        ours = model.model(ids.reshape(-1), Rows(2, 5))
        published = k3_residual_stream(model, ids.reshape(-1), Rows(2, 5), calls)
    assert (ours - published).abs().max() < 1e-10 * published.abs().max()
    counts, final = block_sources(layers, size)  # what the card's attnres shapes count
    assert sorted(calls[:-1]) == sorted(n for n, c in counts.items() for _ in range(c)) and calls[-1] == final


def test_the_old_attnres_assembly_computes_another_stream():
    """Every sub-layer output as its own source with scale 1/sqrt(D) (the replay before): not K3's stream."""
    model = model_of(tiny())
    ids = torch.randint(0, 64, (2, 5)).reshape(-1)
    with torch.no_grad():
        ours = model.model(ids, Rows(2, 5))
        sources, d = [model.model.embed_tokens(ids)], 32
        for layer in model.model.layers:
            for proj, key, norm, sublayer in (
                    (layer.self_attention_res_proj, layer.self_attention_res_norm, layer.input_layernorm,
                     lambda h, layer=layer: layer.self_attn(h, Rows(2, 5))),
                    (layer.mlp_res_proj, layer.mlp_res_norm, layer.post_attention_layernorm, layer.ffn)):
                v = torch.stack(sources)
                p = torch.softmax((rms(v, key.weight) * proj.weight[0]).sum(-1) / math.sqrt(d), dim=0)
                sources.append(sublayer(rms((p[..., None] * v).sum(0), norm.weight)))
    assert (ours - sources[-1]).abs().max() > 1e-2


def test_the_sources_of_kimi_k3():
    """K3's 93 layers in blocks of 12: 1 to 9 sources a call, 5.4 on average over 186 sub-layer calls and the final
    one (the card's attnres shapes)."""
    counts, final = block_sources(93, 12)
    assert (min(counts), max(counts), final) == (1, 9, 9) and sum(counts.values()) == 186
    assert round((sum(n * c for n, c in counts.items()) + final) / 187, 1) == 5.4


def test_kda_gates_low_rank_forget_and_full_rank_output():
    """amd/kda.py: in_proj_qkvgfab = [q, k, v, g (H*K), f_a (K), b (H)]; g1 = f_b_proj(f_a): the forget gate, low
    rank; g2 = the full-rank g_proj: the output gate of o_norm = FusedRMSNormGated(activation="sigmoid"), eps
    1e-5; the gate lower_bound * sigmoid(exp(A_log) * (g1 + dt_bias)); q, k conv + SiLU, l2-normalised (eps 1e-6),
    q scaled by K^-0.5; beta = sigmoid(b). Transcribed with the recurrence token by token."""
    config = tiny()
    attn = model_of(config).model.layers[0].self_attn
    h, k, t = 2, 8, 7
    x = torch.randn(t, 32, dtype=torch.float64)
    with torch.no_grad():
        ours = attn(x, Rows(1, t))

        def conv(proj, taps):  # causal depthwise conv of kernel W with SiLU
            y = proj(x).T[None]
            return F.silu(F.conv1d(F.pad(y, (taps.shape[-1] - 1, 0)), taps, groups=taps.shape[0]))[0].T

        q = conv(attn.q_proj, attn.q_conv1d.weight).view(t, h, k)
        kk = conv(attn.k_proj, attn.k_conv1d.weight).view(t, h, k)
        v = conv(attn.v_proj, attn.v_conv1d.weight).view(t, h, k)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * k ** -0.5
        kk = kk * torch.rsqrt(kk.pow(2).sum(-1, keepdim=True) + 1e-6)
        g1 = attn.f_b_proj(attn.f_a_proj(x)).view(t, h, k)
        gate = -5.0 * torch.sigmoid(attn.A_log.exp()[:, None] * (g1 + attn.dt_bias.view(h, k)))
        beta = torch.sigmoid(attn.b_proj(x))
        state, o = torch.zeros(h, k, k, dtype=torch.float64), torch.zeros(t, h, k, dtype=torch.float64)
        for i in range(t):  # vLLM's fused_recurrent_kda: S *= exp(g); v -= S k; S += beta v k; o = S q ([V, K])
            state = state * gate[i].exp()[:, None, :]
            correction = v[i] - (state * kk[i][:, None, :]).sum(-1)
            state = state + (beta[i][:, None] * correction)[:, :, None] * kk[i][:, None, :]
            o[i] = (state * q[i][:, None, :]).sum(-1)
        g2 = attn.g_proj(x).view(t, h, k)
        published = attn.o_proj((rms(o, attn.o_norm.weight, 1e-5) * torch.sigmoid(g2)).reshape(t, h * k))
    assert (ours - published).abs().max() < 1e-12
    assert attn.o_norm.eps == 1e-5
    assert (attn.f_a_proj.weight.shape, attn.f_b_proj.weight.shape, attn.g_proj.weight.shape) == \
        ((k, 32), (h * k, k), (h * k, 32))
    with torch.no_grad():  # the old assembly: the full-rank projection as the forget gate, the low rank as the output's
        swapped = attn.o_proj((rms(o, attn.o_norm.weight) * torch.sigmoid(g1)).reshape(t, h * k))
    assert (swapped - published).abs().max() > 1e-3


def test_mtp_takes_the_embedding_half_first_zeroed_at_position_0_and_h_before_the_final_norm():
    """common/mtp.py fused_mtp_input: output[:, :D] = RMSNorm(inputs_embeds masked where position == 0, enorm),
    output[:, D:] = RMSNorm(previous hidden states, hnorm); amd/mtp.py: eh_proj of that, a decoder layer without
    attn-res, shared_head.norm, its own shared_head.head. The main model's hidden state is taken before its final
    norm (compute_logits applies it)."""
    model = model_of(tiny(num_nextn_predict_layers=1))
    ids = torch.randint(0, 64, (2, 5))
    seen = {}
    mtp = model.mtp[0]
    mtp.eh_proj.register_forward_hook(lambda module, args, out: seen.update(x=args[0]))
    with torch.no_grad():
        h = model.model(ids.reshape(-1), Rows(2, 5))
        out = model.mtp_hidden(ids, h)
    x, d = seen["x"].view(2, 4, -1), 32
    embeds = model.model.embed_tokens(ids[:, 1:])
    assert (x[:, 0, :d] == 0).all()  # position 0's embedding zeroed
    assert (x[:, 1:, :d] - rms(embeds[:, 1:], mtp.enorm.weight)).abs().max() < 1e-12
    assert (x[..., d:] - rms(h.view(2, 5, -1)[:, :-1], mtp.hnorm.weight)).abs().max() < 1e-12
    with torch.no_grad():
        after = model.model.norm(h).view(2, 5, -1)[:, :-1]  # the old assembly: h after the final norm, second
        assert (x[..., d:] - rms(after, mtp.hnorm.weight)).abs().max() > 1e-3
        block = mtp.mtp_block
        y = mtp.eh_proj(seen["x"])
        y = y + block.self_attn(block.input_layernorm(y), Rows(2, 4))
        y = y + block.ffn(block.post_attention_layernorm(y))
    assert (out - rms(y, mtp.shared_head.norm.weight)).abs().max() < 1e-12
    assert mtp.shared_head.head is not model.lm_head and not block.attn_res and block.kind == "M"


def test_published_numbers():
    """Every RMSNorm eps 1e-5 (rms_norm_eps); layer 0 a dense SiTU MLP of 33792 (first_k_dense_replace 1), the others
    MoE; the layer lists 1-indexed: 0-indexed layers 3, 7, ..., 91 and 92 are MLA."""
    config = KimiK3Config.from_published(json.loads((SHARED / "kimi-k3.config.json").read_text()))
    assert config.rms_norm_eps == 1e-5 and config == KimiK3Config(quantization_format="mxfp4-pack-quantized")
    assert [i for i, kind in enumerate(config.layer_kinds) if kind == "M"] == [*range(3, 92, 4), 92]
    with torch.device("meta"):
        model = KimiK3ForCausalLM(config)
    first = model.model.layers[0]
    assert not hasattr(first, "block_sparse_moe") and first.mlp.gate_proj.weight.shape == (33792, 7168)
    assert first.mlp.act == "situ" and all(hasattr(layer, "block_sparse_moe") for layer in model.model.layers[1:])
    eps = {m.variance_epsilon for m in model.modules() if hasattr(m, "variance_epsilon")}
    assert eps == {1e-5}
