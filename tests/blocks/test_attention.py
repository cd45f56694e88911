"""attention: the reference against the formula one query at a time (each variant), the sink as a zero-valued logit,
the window and the cache alignment, float64 gradients (the sinks' included), the cost model's pair count, the
onboarding rule on public configs, the input factory and suites, the templates; both templates verified with their
backward through the sandbox on the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from template_checks import assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks._config import ModelConfig
from workbench.blocks.attention import seen_keys, seen_pairs

SPEC = get_block("attention")
ref = SPEC.reference
SHAPE = {"B": 2, "TQ": 6, "TK": 9, "H": 4, "HKV": 2, "D": 5, "window": 0, "sinks": 0, "softcap": 0}


def loop_reference(q, k, v, sinks, scale, window, softcap, rel):
    """The docstring's formula one (b, t, h) at a time, in float64."""
    b_, tq, h_, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    out = torch.zeros(b_, tq, h_, d, dtype=torch.float64)
    for b in range(b_):
        for h in range(h_):
            kv = h // (h_ // hkv)
            for t in range(tq):
                pos = t + tk - tq
                keys = [j for j in range(tk) if j <= pos and (window == 0 or j > pos - window)]
                s = torch.stack([scale * q[b, t, h] @ k[b, j, kv] for j in keys])
                if softcap:
                    s = softcap * torch.tanh(s / softcap)
                if rel is not None:
                    s = s + torch.stack([rel[b, t, h, pos - j] if pos - j < rel.shape[-1] else rel.new_zeros(())
                                         for j in keys])
                e = torch.exp(s)
                sink = None if sinks is None else sinks[h] if sinks.dim() == 1 else sinks[b, t, h]
                denominator = e.sum() + (torch.exp(sink) if sink is not None else 0.0)
                out[b, t, h] = sum(e[i] * v[b, j, kv] for i, j in enumerate(keys)) / denominator
    return out


VARIANTS = [
    {},
    {"window": 3},
    {"sinks": 1},
    {"softcap": 2},
    {"window": 4, "sinks": 1, "softcap": 3, "TQ": 9},
    {"HKV": 1, "TQ": 1},
    {"HKV": 4, "window": 1},
    {"sinks": 2},  # Inkling2's: per token
    {"rel": 4},  # relative logits over the nearest 4 distances
    {"rel": 3, "sinks": 2, "window": 3, "TQ": 9},  # Inkling2's sliding layers: the logits span the window
    {"rel": 20, "softcap": 2},  # past every distance, after the cap
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "plain")
def test_reference_equals_the_formula(variant):
    inputs = SPEC.make_inputs({**SHAPE, **variant}, torch.float64, 1)
    torch.testing.assert_close(ref(**inputs), loop_reference(**inputs), rtol=1e-12, atol=1e-12)


def test_a_sink_is_a_zero_valued_key():
    """Sinks equal one more key per head whose score is the sink (scale 1 against a unit query part) and whose value
    is zero; a sink at -inf is no sink."""
    inputs = SPEC.make_inputs({**SHAPE, "sinks": 1, "TQ": 9, "TK": 9}, torch.float64, 2)
    q, k, v, sinks = (inputs[n] for n in ("q", "k", "v", "sinks"))
    b, t, h, d = q.shape
    extra = torch.zeros(b, t, h, 1, dtype=torch.float64)
    q2 = torch.cat([q, extra + 1.0], dim=-1)  # a last channel of 1 meets the sink key's last channel
    sink_key = torch.zeros(b, 1, h, d + 1, dtype=torch.float64)
    sink_key[..., -1] = sinks / inputs["scale"]
    k2 = torch.cat([sink_key, torch.cat([k.repeat_interleave(2, 2), torch.zeros(b, t, h, 1, dtype=torch.float64)],
                                        dim=-1)], dim=1)
    v2 = torch.cat([torch.zeros(b, 1, h, d, dtype=torch.float64), v.repeat_interleave(2, 2)], dim=1)
    widened = ref(q2, k2, torch.cat([v2, torch.zeros(b, t + 1, h, 1, dtype=torch.float64)], -1), None,
                  inputs["scale"], 0, 0.0)[..., :d]
    torch.testing.assert_close(ref(**inputs), widened)
    torch.testing.assert_close(ref(**{**inputs, "sinks": torch.full_like(sinks, float("-inf"))}),
                               ref(**{**inputs, "sinks": None}))


def test_window_and_cache_alignment():
    """A query chunk over a cache computes the last rows of the whole sequence's attention; keys outside every
    window change nothing; the seen-pair count matches the mask."""
    inputs = SPEC.make_inputs({**SHAPE, "TQ": 9, "window": 3}, torch.float64, 3)
    whole = ref(**inputs)
    chunk = ref(**{**inputs, "q": inputs["q"][:, 5:]})
    torch.testing.assert_close(chunk, whole[:, 5:])
    far = {**inputs, "k": inputs["k"].clone(), "v": inputs["v"].clone()}
    far["k"][:, :3] += 7.0  # keys 0..2 are outside the windows of queries 5..8
    far["v"][:, :3] -= 7.0
    torch.testing.assert_close(ref(**far)[:, 5:], whole[:, 5:])
    for tq, tk, window in [(9, 9, 0), (3, 12, 0), (9, 9, 3), (1, 1, 1), (5, 40, 7), (40, 40, 100)]:
        assert seen_pairs(tq, tk, window) == int(seen_keys(tq, tk, window).sum())


@pytest.mark.parametrize("variant", [{"sinks": 1, "softcap": 2}, {"sinks": 2, "rel": 3}], ids=["sinks,softcap",
                                                                                           "token-sinks,rel"])
def test_gradients_in_float64(variant):
    inputs = SPEC.make_inputs({"B": 1, "TQ": 4, "TK": 5, "H": 2, "HKV": 1, "D": 3, "window": 3, **variant},
                              torch.float64, 4)
    names = [n for n in SPEC.grad_inputs if inputs[n] is not None]
    leaves = tuple(inputs[n].requires_grad_() for n in names)

    def f(*tensors):
        return ref(**{**inputs, **dict(zip(names, tensors, strict=True))})
    assert torch.autograd.gradcheck(f, leaves)


def test_work_counts_the_seen_pairs():
    plain = {**SHAPE, "B": 1, "TQ": 8192, "TK": 8192, "H": 16, "HKV": 2, "D": 256}
    forward, backward = SPEC.work(plain)
    assert forward.tensor_flops == 4 * 16 * (8192 * 8193 // 2) * 256
    assert backward.tensor_flops == int(2.5 * forward.tensor_flops)
    windowed, _ = SPEC.work({**plain, "window": 128})
    assert windowed.tensor_flops < forward.tensor_flops / 30  # 128 keys a query, against 4096 on average


def test_onboarding_reads_heads_windows_sinks_and_soft_caps():
    def model(data):
        from workbench.blocks._config import Config

        return ModelConfig(cfg=Config(data), hidden=data["hidden_size"], hidden_field="hidden_size", layers=4,
                           vocab=None, vocab_field=None, heads=data["num_attention_heads"],
                           heads_field="num_attention_heads", head_dim=data.get("head_dim"), kda_layers=0,
                           full_layers=4, linear={}, linear_field=None)
    gpt_oss = model({"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64,
                     "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
                     "layer_types": ["sliding_attention", "full_attention"] * 2})
    found = SPEC.onboard(gpt_oss)
    assert [(f.layers, f.shapes[0]["window"], f.shapes[0]["sinks"]) for f in found] == [(2, 0, 1), (2, 128, 1)]
    assert found[0].shapes[0]["HKV"] == 8 and found[0].shapes[0]["D"] == 64
    gemma = model({"model_type": "gemma2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 16, "attn_logit_softcapping": 50.0})
    assert SPEC.onboard(gemma)[0].shapes[0]["softcap"] == 50
    mla = model({"model_type": "deepseek_v3", "hidden_size": 64, "num_attention_heads": 4, "kv_lora_rank": 16})
    assert SPEC.onboard(mla) == []
    # Inkling2: hybrid / hybrid_sliding layers, the sliding ones with their own heads, per-token sinks, relative
    # logits over rel_extent (full) and over the window (sliding); the serving forms take no size of it
    inkling2 = model({"model_type": "inkling2_text", "hidden_size": 64, "num_attention_heads": 8,
                      "num_key_value_heads": 2, "head_dim": 16, "swa_num_attention_heads": 4,
                      "swa_num_key_value_heads": 1, "swa_head_dim": 32, "sliding_window_size": 6, "rel_extent": 12,
                      "layer_types": ["hybrid_sliding"] * 3 + ["hybrid"]})
    full, sliding = SPEC.onboard(inkling2)
    assert (full.layers, sliding.layers) == (1, 3)
    assert {k: full.shapes[0][k] for k in ("H", "HKV", "D", "window", "sinks", "rel")} == \
        {"H": 8, "HKV": 2, "D": 16, "window": 0, "sinks": 2, "rel": 12}
    assert {k: sliding.shapes[0][k] for k in ("H", "HKV", "D", "window", "sinks", "rel")} == \
        {"H": 4, "HKV": 1, "D": 32, "window": 6, "sinks": 2, "rel": 6}
    for form in ("attention_prefill", "attention_decode"):
        served = get_block(form).onboard(inkling2)
        assert all(f.shapes == [] and "per-token sinks" in f.differs for f in served)


def test_make_inputs_and_suites():
    inputs = SPEC.make_inputs({**SHAPE, "sinks": 1}, torch.float16, 3)
    assert inputs["q"].shape == (2, 6, 4, 5) and inputs["k"].shape == inputs["v"].shape == (2, 9, 2, 5)
    assert inputs["sinks"].shape == (4,) and inputs["scale"] == pytest.approx(5 ** -0.5)
    assert SPEC.make_inputs(SHAPE, torch.float32, 0)["sinks"] is None
    assert SPEC.make_inputs(SHAPE, torch.float32, 0)["rel"] is None
    inkling2 = SPEC.make_inputs({**SHAPE, "sinks": 2, "rel": 7}, torch.float32, 3)
    assert inkling2["sinks"].shape == (2, 6, 4) and inkling2["rel"].shape == (2, 6, 4, 7)
    shapes = SPEC.shapes["smoke"] + SPEC.shapes["edge"]
    assert any(s["TQ"] < s["TK"] for s in shapes) and any(s["D"] & (s["D"] - 1) for s in shapes)
    assert {"window", "sinks", "softcap", "rel"} <= {k for s in shapes for k, v in s.items() if v and k in
                                                     ("window", "sinks", "softcap", "rel")}
    assert {s.get("sinks") for s in SPEC.shapes["smoke"]} == {0, 1, 2}


def test_templates_render_each_choice():
    assert_templates_render_each_choice("attention")


@pytest.mark.parametrize("template", ["split", "fused"])
def test_the_templates_verify_with_their_backward(tmp_path, template):
    result = verify_first_point(tmp_path, "attention", template, base_seed=11)
    assert result.passed, result.summary()
    assert numeric_directions(result) == {"forward:out", *(f"grad:{n}" for n in SPEC.grad_inputs)}


def test_the_peers_that_run_here_compute_the_block():
    """torch SDPA (plain and windowed; no sinks, soft cap or relative logits: a NotImplementedError names it) and
    FlexAttention (every variant, eager on CPU) against the reference in float32."""
    from workbench.blocks.attention import flex, sdpa

    for shape in SPEC.shapes["smoke"] + SPEC.shapes["edge"]:
        inputs = SPEC.make_inputs(shape, torch.float32, 0)
        want = ref(**inputs)
        torch.testing.assert_close(flex(**inputs), want, rtol=1e-5, atol=1e-5)
        if shape["sinks"] or shape["softcap"] or shape.get("rel"):
            with pytest.raises(NotImplementedError, match="sinks"):
                sdpa(**inputs)
        else:
            torch.testing.assert_close(sdpa(**inputs), want, rtol=1e-5, atol=1e-5)
    assert [p.name for p in SPEC.peers] == ["torch sdpa", "flex_attention", "flash-attn", "fla parallel_attn"]


def test_the_promoted_operator_compiles_at_every_head_size_the_families_use_and_is_spill_free_where_it_was_tuned():
    """80, 96, 128 and 192-wide heads at a training step's size (the widest plain, with a window and sinks, and with
    a soft cap; each narrower one in one of these), compiled for the five targets: every kernel compiles. The port
    tuned its launch settings per target at the model suites' head sizes (64, 128 and 256: bench/cards) and the smoke
    shapes, where nothing spills (sm_80's dK/dV kernel at 1 stage); at the others the dK/dV kernel's NVIDIA settings
    are not tuned, and may spill (tens of bytes a thread: a family's own card, onboarded and ported, tunes them
    there)."""
    from pathlib import Path

    from workbench.operators import newest_promoted
    from workbench.verify.harness import target_report

    operator = newest_promoted(Path(__file__).parents[2] / "operators")["attention"]
    variants = ((0, 0, 0), (128, 1, 0), (50, 0, 3))  # (window, sinks, softcap): plain, GPT-OSS's, Gemma 2's
    shapes = [{"B": 1, "TQ": 4096, "TK": 4096, "H": 32, "HKV": 8, "D": d, "window": window, "sinks": sinks,
               "softcap": softcap} for d, (window, sinks, softcap) in
              [(80, variants[0]), (96, variants[1]), (128, variants[2]), *((192, v) for v in variants)]]
    targets = ["sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950"]
    report = target_report(operator["path"], block="attention", shapes=shapes, targets=targets)
    assert report.verdict == "pass", report.message
    model = [b for b in report.builds if b["suite"] == "model"]
    assert {b["target"] for b in model} == set(targets) and all(b["ok"] for b in model)
    spilled = {(b["kernel"], b["target"]) for b in model if b["spilled_bytes"]}
    assert {kernel for kernel, _ in spilled} <= {"attention_dkdv_kernel"}, spilled  # the forward and dQ never
    assert not {target for _, target in spilled} & {"gfx942", "gfx950"}, spilled
    # at the model and smoke suites, where the port tuned: none
    assert operator["target_report"]["spill_free_on"] == targets and operator["target_report"]["findings"] == []
    assert operator["launch_settings"]["tuned"]["sm_80"] == {"bwd_num_stages": 1}
