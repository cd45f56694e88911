"""attention_prefill and attention_decode: held to the training form token by token (a sequence prefilled in
chunks, or prefilled then decoded one token at a time, equals attention over the whole sequence, with each variant),
the caches written in place where the table says and nowhere else, attention never crossing a sequence, the input
factories and suites, the onboarding rules, the templates; each template verified through the sandbox on the Triton
interpreter."""

from __future__ import annotations

import pytest
import torch
from template_checks import UNPROMOTED, assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.mla_decode import UNWRITTEN

ATTENTION, PREFILL, DECODE = (get_block(n) for n in ("attention", "attention_prefill", "attention_decode"))
F64 = torch.float64


def _empty_cache(pages: int, page: int, hkv: int, d: int) -> torch.Tensor:
    return torch.full((pages, page, hkv, d), UNWRITTEN, dtype=F64)


@pytest.mark.parametrize("variant", [{}, {"window": 5}, {"sinks": 1, "softcap": 2}, {"window": 3, "sinks": 1}],
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "plain")
def test_chunks_and_decode_steps_equal_the_training_form(variant):
    """One sequence of 13 tokens: prefilled as 4 + 6 tokens, then decoded 3 tokens one at a time, through a shuffled
    block table of pages of 4 rows; every output row equals attention over the whole sequence."""
    g = torch.Generator().manual_seed(0)
    h, hkv, d, total, page = 4, 2, 8, 13, 4
    whole = ATTENTION.make_inputs({"B": 1, "TQ": total, "TK": total, "H": h, "HKV": hkv, "D": d, "window": 0,
                                   "sinks": 0, "softcap": 0, **variant}, F64, 1)
    truth = ATTENTION.reference(**whole)[0]
    q, k, v = whole["q"][0], whole["k"][0], whole["v"][0]
    extra = {n: whole[n] for n in ("sinks", "scale", "window", "softcap")}
    table = torch.randperm(6, generator=g)[:4].to(torch.int32)[None]  # 4 pages of 6 for 16 rows
    k_cache, v_cache = _empty_cache(6, page, hkv, d), _empty_cache(6, page, hkv, d)
    done = 0
    for chunk in (4, 6):
        rows = slice(done, done + chunk)
        out, k_cache, v_cache = PREFILL.reference(q[rows], k[rows], v[rows], k_cache, v_cache, table,
                                                  torch.tensor([done], dtype=torch.int32),
                                                  torch.tensor([0, chunk], dtype=torch.int32), **extra)
        torch.testing.assert_close(out, truth[rows], rtol=1e-12, atol=1e-12)
        done += chunk
    for t in range(done, total):
        out, k_cache, v_cache = DECODE.reference(q[t:t + 1], k[t:t + 1], v[t:t + 1], k_cache, v_cache, table,
                                                 torch.tensor([t], dtype=torch.int32), **extra)
        torch.testing.assert_close(out[0], truth[t], rtol=1e-12, atol=1e-12)
    positions = torch.arange(total)
    where = (table[0, positions // page].long(), positions % page)
    torch.testing.assert_close(k_cache[where], k)  # every token's key in its row
    written = torch.zeros(6, page, dtype=torch.bool)
    written[where] = True
    assert bool((k_cache[~written] == UNWRITTEN).all()) and bool((v_cache[~written] == UNWRITTEN).all())


def test_attention_never_crosses_a_sequence():
    shape = PREFILL.shapes["smoke"][0]
    inputs = PREFILL.make_inputs(shape, F64, 0)
    out = PREFILL.reference(**inputs)[0]
    first = int(inputs["cu_seqlens"][1])
    other = {**inputs, "k": inputs["k"].clone(), "v": inputs["v"].clone()}
    other["k"][first:] += 3.0  # the other sequences' new keys and values change: the first sequence's rows cannot
    other["v"][first:] -= 3.0
    torch.testing.assert_close(PREFILL.reference(**other)[0][:first], out[:first])


def test_the_input_factories_lay_out_pages_and_traps():
    inputs = DECODE.make_inputs(DECODE.shapes["smoke"][1], torch.float16, 0)
    assert inputs["q"].shape == (3, 8, 16) and inputs["k"].shape == (3, 2, 16)
    assert inputs["k_cache"].shape == (3 * 4 + 1, 8, 2, 16) and inputs["sinks"].shape == (8,)
    assert inputs["k_cache"].stride() == (8 * 2 * 16, 16, 8 * 16, 1)  # heads_outer: each page head-major (HND)
    assert inputs["v_cache"].stride() == inputs["k_cache"].stride()
    assert inputs["window"] == 11 and bool((inputs["k_cache"][-1] == UNWRITTEN).all())  # the spare page
    assert int(inputs["seq_lens"].min()) == 0 and int(inputs["seq_lens"].max()) == 4 * 8 - 1  # seed 0's edges
    packed = PREFILL.make_inputs(PREFILL.shapes["smoke"][0], F64, 0)
    assert int(packed["cu_seqlens"][-1]) == 20 and int(packed["seq_lens"][0]) == 0  # seed 0: a prompt from token 0
    for spec in (PREFILL, DECODE):
        meta = spec.meta_inputs(spec.shapes["smoke"][1], torch.bfloat16)
        assert meta["k_cache"].is_meta and meta["sinks"] is not None


def test_onboarding_follows_the_training_forms_layers():
    from workbench.blocks._config import Config, ModelConfig

    data = {"model_type": "gpt_oss", "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 2}
    model = ModelConfig(cfg=Config(data), hidden=2880, hidden_field="hidden_size", layers=4, vocab=None,
                        vocab_field=None, heads=64, heads_field="num_attention_heads", head_dim=64, kda_layers=0,
                        full_layers=4, linear={}, linear_field=None)
    decode = DECODE.onboard(model)
    assert [(f.layers, f.shapes[0]["window"], f.shapes[0]["N"], f.shapes[0]["PAGE"]) for f in decode] == \
        [(2, 0, 128, 16), (2, 128, 128, 16)]
    prefill = PREFILL.onboard(model)
    assert prefill[1].shapes[0]["TOTAL"] == 8192 and prefill[1].shapes[0]["sinks"] == 1
    window, _ = DECODE.work(decode[1].shapes[0])
    full, _ = DECODE.work(decode[0].shapes[0])
    assert window.bytes < full.bytes / 20  # a sliding layer reads its window's keys, not the context's


@pytest.mark.parametrize("block", ["attention_prefill", "attention_decode"])
def test_templates_render_each_choice(block):
    assert_templates_render_each_choice(block)


@pytest.mark.parametrize("block, template", [("attention_prefill", "group_tiled"), ("attention_prefill", "head_loop"),
                                             ("attention_decode", "group_tiled"), ("attention_decode", "head_loop")])
def test_the_templates_verify(tmp_path, block, template):
    """The promoted group_tiled at the block's dtypes; head_loop, which the port does not promote, in float32."""
    result = verify_first_point(tmp_path, block, template, base_seed=5, forward_only=True,
                                dtypes=None if template == "group_tiled" else UNPROMOTED)
    assert result.passed, result.summary()
    assert numeric_directions(result) == {"forward:out", "forward:k_cache", "forward:v_cache"}
