"""Model cards: the kimi-k3.1-pro card's blocks and facts, lookups, the model shape suite, malformed cards."""

from __future__ import annotations

import pytest

import workbench.models as models
from workbench.blocks import REGISTRY
from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models import get_model, list_models, model_shapes

KIMI = "kimi-k3.1-pro"
KIMI_BLOCKS = {
    "kda", "dsa_indexer", "dsa_sparse_attention", "attnres", "moe_router", "moe_permute", "moe_grouped_gemm",
    "moe_combine", "seq_chunked_ce", "vocab_blockwise_ce", "lora_linear", "rmsnorm", "swiglu",
}
PUBLIC_FACTS = {
    "routed_experts": 896,
    "active_experts": 16,
    "dsa_topk": 2048,
    "vocab_size": 163840,
    "context_length": 1048576,
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
    assert card.name == KIMI
    assert "Kimi" in card.title
    assert set(card.blocks) == KIMI_BLOCKS
    assert len(card.blocks) == 13
    for name, block in card.blocks.items():
        assert block.get("role"), name
        assert card.block_shapes(name), f"{name} has model shapes"


def test_kimi_card_is_listed():
    assert KIMI in [card.name for card in list_models()]


@pytest.mark.parametrize("fact, value", sorted(PUBLIC_FACTS.items()))
def test_kimi_public_facts(fact, value):
    entry = get_model(KIMI).facts[fact]
    assert entry["value"] == value
    assert entry["source"] == "public"


def test_kimi_hidden_size_is_an_assumption():
    entry = get_model(KIMI).facts["hidden_size"]
    assert entry["source"] == "assumption"
    assert entry["value"] == 7168


def test_every_fact_says_where_it_comes_from():
    for name, entry in get_model(KIMI).facts.items():
        assert entry.get("source") in ("public", "assumption"), name
        assert "value" in entry, name


def test_get_model_unknown_lists_known_models():
    with pytest.raises(UnknownModelError) as info:
        get_model("no-such-model")
    assert isinstance(info.value, WorkbenchError)
    assert "no-such-model" in str(info.value)
    assert KIMI in str(info.value)


def test_model_shapes_rmsnorm_are_the_cards_shapes():
    assert model_shapes("rmsnorm") == [{"rows": 8192, "N": 7168}, {"rows": 8192, "N": 128}]
    assert model_shapes("swiglu") == [{"rows": 8192, "N": 2048}, {"rows": 8192, "N": 18432}]
    assert model_shapes("not_a_block") == []


def test_block_shapes_returns_copies():
    card = get_model(KIMI)
    shapes = card.block_shapes("rmsnorm")
    shapes[0]["rows"] = 1
    shapes.append({"rows": 2, "N": 2})
    assert card.block_shapes("rmsnorm") == [{"rows": 8192, "N": 7168}, {"rows": 8192, "N": 128}]


def test_card_shapes_of_catalogued_blocks_use_the_spec_dims():
    """A model shape must name the same dimensions as the block's own suites, or make_inputs cannot use it."""
    for card in list_models():
        for block in set(card.blocks) & set(REGISTRY):
            dims = set(REGISTRY[block].shapes["smoke"][0])
            for shape in card.block_shapes(block):
                assert set(shape) == dims, (card.name, block, shape)


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
