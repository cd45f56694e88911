"""Softmax attention through transformers' attention registry (workbench.integrations.attention): tiny models of the
families transformers ships, run with the "workbench" implementation through the attention block's reference in
float64, compute what their eager attention computes (logits, gradients, greedy generate() over the cache), with the
op called once per layer; the variants it cannot compute exactly are clear errors; the probe proves the attention
kind on a family's code and the registered families swap or name it."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from workbench.errors import WorkbenchError
from workbench.integrations import tiny
from workbench.integrations.attention import NAME, attention_forward, register, unsupported
from workbench.integrations.ops import computing_with, references
from workbench.integrations.references import Float64Casts


def _tiny(model_type: str):
    """A float64 tiny instance of ``model_type``'s default config (two layers: sliding and full where it has both),
    eager attention and experts."""
    cfg, _ = tiny.tiny_config(tiny.language_config(AutoConfig.for_model(model_type)))
    cfg._attn_implementation, cfg._experts_implementation = "eager", "eager"
    torch.manual_seed(0)
    return tiny.model_class(cfg)._from_config(cfg, dtype=torch.float64).eval()


def _counting():
    table = references()
    calls = []

    def attention(q, k, v, sinks, scale, window, softcap, rel=None):
        calls.append((q.shape[1], k.shape[1], window, sinks is not None, softcap))
        assert rel is None  # the registry's families have no relative logits
        return table["attention"](q, k, v, sinks, scale, window, softcap)
    return {**table, "attention": attention}, calls


@pytest.mark.parametrize("model_type, variant", [
    ("llama", (0, False, 0.0)), ("mistral", (8, False, 0.0)), ("gemma2", (8, False, 50.0)),
    ("gpt_oss", (8, True, 0.0))])
def test_a_family_through_the_workbench_attention_computes_its_eager_model(model_type, variant):
    model = _tiny(model_type)
    ids = torch.randint(0, model.config.vocab_size, (1, 14), generator=torch.Generator().manual_seed(1))
    with Float64Casts():
        shipped = model(ids).logits
        grads = torch.autograd.grad(shipped.square().sum(), list(model.parameters()), allow_unused=True)
    register()
    model.set_attn_implementation(NAME)
    table, calls = _counting()
    with computing_with(table), Float64Casts():
        ours = model(ids).logits
        our_grads = torch.autograd.grad(ours.square().sum(), list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(ours, shipped, rtol=1e-12, atol=1e-12)
    for a, b in zip(our_grads, grads, strict=True):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    layers = model.config.num_hidden_layers
    assert len(calls) == layers and all(c[:2] == (14, 14) for c in calls)
    window, sinks, softcap = variant
    assert {c[2] for c in calls} == ({0, window} if window and model_type != "mistral" else {window})
    assert all(c[3] == sinks and c[4] == softcap for c in calls)


def test_generate_over_the_cache_runs_the_queries_as_the_last_keys():
    """Greedy decoding: the prompt at once, then one query a step over the cached keys (TQ 1, TK growing in the full
    layer, held at the window in the sliding layer, whose cache keeps the last 8 keys); the tokens equal the eager
    model's."""
    model = _tiny("gemma2")
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    with Float64Casts():
        shipped = model.generate(prompt, max_new_tokens=6, do_sample=False)
    register()
    model.set_attn_implementation(NAME)
    table, calls = _counting()
    with computing_with(table), Float64Casts():
        ours = model.generate(prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(ours, shipped)
    sliding, full = ([(tq, tk) for tq, tk, *_ in calls[i::2]] for i in (0, 1))  # layer_types: sliding, full
    assert full == [(5, 5)] + [(1, 5 + i) for i in range(1, 6)]
    assert sliding == [(5, 5)] + [(1, min(5 + i, 8)) for i in range(1, 6)]


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_runs_row_by_row_over_its_tokens(side):
    """Two prompts of 9 and 5 tokens padded to 9 (left, as generation pads, or right, as training batches do): every
    real token's logits equal the eager model's, and greedy generate() from the left-padded batch gives its
    tokens."""
    model = _tiny("gemma2")  # a sliding layer (window 8) and a full one
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, model.config.vocab_size, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    if side == "left":
        mask[1, :4] = 0
    else:
        mask[1, 5:] = 0
    with Float64Casts():
        shipped = model(ids, attention_mask=mask).logits
    register()
    model.set_attn_implementation(NAME)
    with computing_with(references()), Float64Casts():
        ours = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], shipped[real], rtol=1e-12, atol=1e-12)
    if side == "left":
        model.set_attn_implementation("eager")
        with Float64Casts():
            want = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        model.set_attn_implementation(NAME)
        with computing_with(references()), Float64Casts():
            got = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        assert torch.equal(got, want)


def test_what_the_block_does_not_compute_is_a_clear_error():
    module = torch.nn.Module()
    q, kv = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    holes = torch.tensor([[True, False, True]])
    with pytest.raises(WorkbenchError, match="holes"):
        attention_forward(module, q, kv, kv, holes)
    with pytest.raises(WorkbenchError, match="position bias"):
        attention_forward(module, q, kv, kv, None, position_bias=torch.zeros(1, 2, 3, 3))
    with pytest.raises(WorkbenchError, match="per token"):
        attention_forward(module, q, kv, kv, None, sinks=torch.zeros(1, 2, 3, 1))
    not_causal = torch.zeros(1, 1, 3, 3)  # every key seen: not the causal pattern
    with pytest.raises(WorkbenchError, match="not the causal"):
        attention_forward(module, q, kv, kv, not_causal)
    module.train()
    with pytest.raises(WorkbenchError, match="dropout"):
        attention_forward(module, q, kv, kv, None, dropout=0.1)


def test_inkling2s_attention_through_the_registry_is_named_as_another_variant():
    """Per-token sinks and a dense bias have no form through the registry (attention_forward): Inkling2's own forward
    hands the block its per-token sinks and per-distance relative logits (families/inkling2.py)."""
    from transformers.models.inkling2 import modeling_inkling2 as ink

    from workbench.integrations.families import inkling2
    from workbench.integrations.parity import schedules

    full = ink.Inkling2TextConfig()
    attention, mlp = schedules(full)
    model = ink.Inkling2ForCausalLM(ink.Inkling2TextConfig(**inkling2.tiny(full, attention[:2], mlp[:2], 16, 2)))
    found = {unsupported(m) for m in model.modules() if isinstance(m, (ink.Inkling2SlidingAttention,
                                                                         ink.Inkling2FullAttention))}
    assert len(found) == 1 and "per-token sinks" in found.pop()


def test_a_look_alike_window_sink_or_relative_logit_is_told_apart(monkeypatch):
    """The comparisons can fail: a reference with a window one key wider and no sinks differs from the families'
    eager attention by far more than the float64 bound, and one whose relative logits are one distance off from
    Inkling2's."""
    import dataclasses

    from workbench.integrations import references as R

    assert all(max(r.output_rel, r.grad_rel) < 1e-12 for r in R.attention())
    spec = R.get_block("attention")

    def look_alike(q, k, v, sinks, scale, window, softcap, rel=None):
        return spec.reference(q, k, v, None, scale, window + 1 if window else 0, softcap, rel)
    monkeypatch.setattr(R, "get_block", lambda name: dataclasses.replace(spec, reference=look_alike))
    off = {r.counterpart.split(":")[0]: r.output_rel for r in R.attention()}
    assert off["mistral eager_attention_forward"] > 1e-3 and off["gpt_oss eager_attention_forward"] > 1e-3
    assert off["qwen3_next eager_attention_forward"] == 0.0  # no window, no sinks: the same

    def shifted(q, k, v, sinks, scale, window, softcap, rel=None):
        return spec.reference(q, k, v, sinks, scale, window, softcap, None if rel is None else rel.roll(1, -1))
    monkeypatch.setattr(R, "get_block", lambda name: dataclasses.replace(spec, reference=shifted))
    assert all(r.output_rel > 1e-3 for r in R.inkling2_attention())
