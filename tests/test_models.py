"""Model cards: the kimi-k3 card (onboarded from the published config) and kimi-k3.1-pro derived from it, their
blocks and facts, lookups, derived cards, the model shape suite, malformed cards."""

from __future__ import annotations

import pytest

import workbench.models as models
from workbench.blocks import REGISTRY
from workbench.blocks.base import CARD_DIMS
from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models import get_model, list_models, model_shapes

KIMI = "kimi-k3.1-pro"
K3 = "kimi-k3"
K3_BLOCKS = {
    "kda", "kda_short_conv", "kda_gate", "kda_prologue", "kda_decode", "kda_prefill", "kda_short_conv_decode",
    "kda_short_conv_prefill",
    "mla",
    "mla_decode", "mla_prefill", "attnres",
    "moe_router", "moe_topk",
    "moe_permute", "moe_grouped_gemm", "moe_combine", "situ", "seq_chunked_ce", "vocab_blockwise_ce", "lora_linear",
    "rmsnorm", "rmsnorm_gated",  # KDA's gated output norm
    "moe_grouped_gemm_mxfp4", "vision_tower",
}
KIMI_BLOCKS = K3_BLOCKS | {"dsa_indexer", "dsa_sparse_attention", "dsa_decode", "dsa_indexer_decode",
                           "dsa_prefill", "dsa_indexer_prefill"}
CONFIG_FACTS = {  # the published Kimi K3 config, through the kimi-k3 card
    "routed_experts": 896,
    "active_experts": 16,
    "vocab_size": 163840,
    "context_length": 1048576,
    "num_layers": 93,
    "kda_layers": 69,
    "full_attention_layers": 24,
    "expert_width": 3584,  # latent MoE: a fact (its norm is rmsnorm's, its projections dense GEMMs), not a block
    "latent_moe_norm": True,
    "expert_ffn_size": 3072,
    "hidden_size": 7168,
}

GOOD_CARD = """\
name: {name}
title: {name} title
facts:
  width: {{value: 8, source: assumption}}
blocks:
  rmsnorm:
    role: norms
    shapes: {shapes}
"""


def write_card(folder, filename: str, text: str) -> None:
    (folder / filename).write_text(text)


def test_kimi_card_loads_with_all_blocks():
    card = get_model(KIMI)
    assert card.name == KIMI and card.derived_from == K3 and "DSA" in card.title and "sparse attention" in card.differs
    assert set(card.blocks) == KIMI_BLOCKS and set(get_model(K3).blocks) == K3_BLOCKS
    for name, block in card.blocks.items():
        assert block.get("role"), name
        assert card.block_shapes(name) or "gap" in block, f"{name} has model shapes"
        assert ("gap" in block) == (name not in REGISTRY), name
    # what K3.1 Pro adds is marked; what it takes from K3 is not
    assert {b for b, info in card.blocks.items() if info.get("differs_from")} == {"dsa_indexer", "dsa_sparse_attention",
                                                                                  "dsa_decode", "dsa_indexer_decode",
                                                                                  "dsa_prefill", "dsa_indexer_prefill"}


def test_kimi_card_is_listed():
    assert KIMI in [card.name for card in list_models()]


@pytest.mark.parametrize("fact, value", sorted(CONFIG_FACTS.items()))
def test_kimi_facts_come_from_the_published_config(fact, value):
    for model in (K3, KIMI):
        entry = get_model(model).facts[fact]
        assert entry["value"] == value and entry["source"] == "config" and entry["field"].startswith("text_config.")


def test_the_k3_card_is_what_onboarding_the_published_config_gives():
    """kimi-k3.yaml is `workbench onboard` of the shared config: regenerating it changes nothing but the path."""
    from pathlib import Path

    from workbench.onboard import onboard

    card = onboard(Path(models.__file__).parent / "configs" / "kimi-k3.config.json")
    assert card["blocks"] == get_model(K3).blocks and card["facts"] == get_model(K3).facts


def test_every_fact_says_where_it_comes_from():
    for model in (K3, KIMI):
        for name, entry in get_model(model).facts.items():
            assert entry.get("source") in ("public", "config", "assumption"), name
            assert "value" in entry, name
    assert get_model(KIMI).facts["dsa_topk"]["source"] == "public"  # K3.1 Pro's release notes, not K3's code
    assert "release notes" in get_model(KIMI).facts["dsa_topk"]["note"] and "release notes" in get_model(KIMI).differs
    assert get_model(KIMI).facts["dsa_layers"]["source"] == "assumption"


def test_get_model_unknown_lists_known_models():
    with pytest.raises(UnknownModelError) as info:
        get_model("no-such-model")
    assert isinstance(info.value, WorkbenchError)
    assert "no-such-model" in str(info.value)
    assert KIMI in str(info.value)


RMSNORM_WIDTHS = [7168, 1536, 512, 3584]  # hidden, q and kv latents, the combined routed output (KDA's: gated)


def test_model_shapes_rmsnorm_are_the_cards_shapes():
    assert model_shapes("rmsnorm") == [{"rows": 8192, "N": n} for n in RMSNORM_WIDTHS]
    assert model_shapes("situ") == [{"rows": 8192, "N": 6144}, {"rows": 8192, "N": 33792}]
    assert model_shapes("swiglu") == []  # SiTU replaces SwiGLU in Kimi K3
    assert model_shapes("not_a_block") == []


def test_block_shapes_returns_copies():
    card = get_model(KIMI)
    shapes = card.block_shapes("rmsnorm")
    shapes[0]["rows"] = 1
    shapes.append({"rows": 2, "N": 2})
    assert card.block_shapes("rmsnorm") == [{"rows": 8192, "N": n} for n in RMSNORM_WIDTHS]


def test_card_shapes_of_catalogued_blocks_use_the_spec_dims():
    """A model shape must name every dimension of the block's first smoke shape, and only dimensions its suites
    use (optional ones such as moe_router's scale or kda_gate's form) or a card's own (CARD_DIMS: AttnRes's calls),
    or make_inputs cannot use it."""
    for card in list_models():
        for block in set(card.blocks) & set(REGISTRY):
            suites = REGISTRY[block].shapes
            required = set(suites["smoke"][0])
            known = {dim for suite in suites.values() for shape in suite for dim in shape} | set(CARD_DIMS)
            for shape in card.block_shapes(block):
                assert required <= set(shape) <= known, (card.name, block, shape)


def test_model_shapes_merges_cards_without_repeats(tmp_path, monkeypatch):
    write_card(tmp_path, "a.yaml", GOOD_CARD.format(name="a", shapes='[{rows: 2, N: 8}, {rows: 4, N: 16}]'))
    write_card(tmp_path, "b.yaml", GOOD_CARD.format(name="b", shapes='[{rows: 4, N: 16}, {rows: 1, N: 3}]'))
    monkeypatch.setattr(models, "CARDS_DIR", tmp_path)
    assert [c.name for c in list_models()] == ["a", "b"]
    assert model_shapes("rmsnorm") == [{"rows": 2, "N": 8}, {"rows": 4, "N": 16}, {"rows": 1, "N": 3}]
    assert get_model("b").facts == {"width": {"value": 8, "source": "assumption"}}


def test_title_defaults_to_name(tmp_path, monkeypatch):
    write_card(tmp_path, "c.yaml", "name: c\nblocks: {}\n")
    monkeypatch.setattr(models, "CARDS_DIR", tmp_path)
    card = get_model("c")
    assert card.title == "c"
    assert card.facts == {} and card.blocks == {}


MALFORMED = {
    "bad yaml": "name: x\nblocks: [unclosed\n",
    "no name": "title: t\nblocks: {}\n",
    "no blocks": "name: x\n",
    "a list": "- name: x\n",
    "empty file": "",
    "blocks is a list": "name: x\nblocks: [rmsnorm, swiglu]\n",
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_card_raises_workbench_error(tmp_path, monkeypatch, case):
    write_card(tmp_path, "bad.yaml", MALFORMED[case])
    monkeypatch.setattr(models, "CARDS_DIR", tmp_path)
    with pytest.raises(WorkbenchError) as info:
        list_models()
    assert "bad.yaml" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(WorkbenchError):
        get_model("x")


DERIVED = """\
name: d
derived_from: {base}
differs: adds swiglu, drops rmsnorm's second width
facts:
  width: {{value: 16, source: public}}
blocks:
  swiglu: {{role: act, shapes: [{{rows: 2, N: 8}}]}}
  rmsnorm: {rmsnorm}
"""


def test_a_derived_card_is_its_base_with_its_own_facts_and_blocks_laid_over(tmp_path, monkeypatch):
    write_card(tmp_path, "a.yaml", GOOD_CARD.format(name="a", shapes="[{rows: 2, N: 8}]"))
    write_card(tmp_path, "d.yaml", DERIVED.format(base="a", rmsnorm="{role: norms, shapes: [{rows: 4, N: 4}]}"))
    monkeypatch.setattr(models, "CARDS_DIR", tmp_path)
    card = get_model("d")
    assert card.derived_from == "a" and card.differs.startswith("adds swiglu")
    assert card.facts == {"width": {"value": 16, "source": "public"}}
    assert card.block_shapes("rmsnorm") == [{"rows": 4, "N": 4}] and card.blocks["swiglu"]["differs_from"] == "a"
    assert get_model("a").block_shapes("rmsnorm") == [{"rows": 2, "N": 8}]  # the base is unchanged
    write_card(tmp_path, "d.yaml", DERIVED.format(base="a", rmsnorm="null"))
    assert set(get_model("d").blocks) == {"swiglu"}  # null drops the base's block


@pytest.mark.parametrize("base, message", [("nowhere", "unknown card 'nowhere'"), ("d", "cycle")])
def test_a_derived_card_with_a_missing_or_circular_base_is_one_line(tmp_path, monkeypatch, base, message):
    write_card(tmp_path, "d.yaml", DERIVED.format(base=base, rmsnorm="null"))
    monkeypatch.setattr(models, "CARDS_DIR", tmp_path)
    with pytest.raises(WorkbenchError, match=message):
        list_models()


def test_cards_in_workbench_models_folders_are_found_and_replace_by_name(tmp_path, monkeypatch):
    write_card(tmp_path, "k.yaml", GOOD_CARD.format(name=K3, shapes="[{rows: 2, N: 8}]"))
    monkeypatch.setenv("WORKBENCH_MODELS", str(tmp_path))
    assert get_model(K3).block_shapes("rmsnorm") == [{"rows": 2, "N": 8}]
    assert set(get_model(KIMI).blocks) == {"rmsnorm", "dsa_indexer", "dsa_sparse_attention", "dsa_decode",
                                           "dsa_indexer_decode", "dsa_prefill", "dsa_indexer_prefill"}  # laid over
