"""mla_decode: the serving step held to mla (sequences decoded token by token through the step, their latents kept in
pages of the cache, equal mla's prefill of each whole sequence; two sequences of different lengths in one batch),
the step writing only its own rows, the reference leaving its input alone, the input factory's layout (unused rows
and table entries that a careless kernel would read are far off), the card, the templates; both templates verified
through the sandbox on the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from template_checks import UNPROMOTED, assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks.mla_decode import UNWRITTEN, layout

SPEC = get_block("mla_decode")
MLA = get_block("mla")


def absorbed_query(q: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """[q_nope W_uk | q_rope] per head: q [..., H, DN + DR], w_uk [H, DN, R] -> [..., H, R + DR]."""
    dn = w_uk.shape[1]
    return torch.cat([torch.einsum("...hd,hdr->...hr", q[..., :dn], w_uk), q[..., dn:]], dim=-1)


@pytest.mark.parametrize("page", [4, 1, 16])
def test_sequences_decoded_token_by_token_equal_their_prefill(page):
    """Two sequences of 11 tokens, the second joining the batch 3 steps later (lengths differ within each call), their
    pages scattered through the pool: every step's output, mapped by W_uv, is mla's prefill output of that token."""
    shape = {"B": 2, "T": 11, "H": 3, "R": 16, "DN": 8, "DR": 4, "DV": 6, "gated": 0}
    x = MLA.make_inputs(shape, torch.float64, 3)
    prefill = MLA.reference(**x)  # [2, T, H, DV]
    maxp = -(-shape["T"] // page)
    table = torch.randperm(2 * maxp + 1, generator=torch.Generator().manual_seed(1))[:2 * maxp].view(2, maxp).int()
    cache = torch.full((2 * maxp + 1, page, 20), UNWRITTEN, dtype=torch.float64)
    q = absorbed_query(x["q"], x["w_uk"])
    late = 3
    for step in range(shape["T"] + late):
        batch = [b for b, t in ((0, step), (1, step - late)) if 0 <= t < shape["T"]]
        ts = [step if b == 0 else step - late for b in batch]
        o, cache = SPEC.reference(q[batch, ts], x["c_kv"][batch, ts], x["k_rope"][batch, ts], cache, table[batch],
                                  torch.tensor(ts, dtype=torch.int32), x["scale"])
        out = torch.einsum("nhr,hdr->nhd", o, x["w_uv"])
        torch.testing.assert_close(out, prefill[batch, ts], rtol=1e-12, atol=1e-12)
    for b in range(2):  # every token's latent in its row
        rows = cache[table[b, torch.arange(shape["T"]) // page].long(), torch.arange(shape["T"]) % page]
        torch.testing.assert_close(rows, torch.cat([x["c_kv"][b], x["k_rope"][b]], dim=-1), rtol=0, atol=0)


def test_the_step_writes_only_its_rows_and_the_input_cache_is_left_alone():
    inputs = SPEC.make_inputs({"N": 3, "H": 2, "R": 16, "DR": 4, "PAGE": 4, "MAXP": 3}, torch.float32, 2)
    before = inputs["latent_cache"].clone()
    o, cache = SPEC.reference(**inputs)
    assert torch.equal(inputs["latent_cache"], before)  # the reference updates a copy
    changed = (cache != before).any(-1).nonzero().tolist()
    lengths, table = inputs["seq_lens"].tolist(), inputs["block_table"].tolist()
    assert sorted(changed) == sorted([table[n][length // 4], length % 4] for n, length in enumerate(lengths))
    assert o.shape == (3, 2, 16) and o.dtype == torch.float32


def test_the_layout_leaves_traps_where_no_sequence_wrote():
    shape = {"N": 3, "H": 2, "R": 8, "DR": 4, "PAGE": 4, "MAXP": 3}
    inputs = SPEC.make_inputs(shape, torch.float16, 0)
    lengths, table, pages = layout(shape, 0)
    assert lengths[0] == 0 and lengths[-1] == 11 and pages == 10  # an empty sequence; one at its last row
    assert inputs["seq_lens"].tolist() == lengths and inputs["block_table"].dtype == torch.int32
    spare = pages - 1
    assert (inputs["latent_cache"][spare] == UNWRITTEN).all()
    assert table[0] == [table[0][0], spare, spare]  # past a sequence's pages: the spare page
    used = {p for row in table for p in row if p != spare}
    assert len(used) == sum(length // 4 + 1 for length in lengths)  # no page shared
    abstract = SPEC.meta_inputs(shape, torch.float16)
    assert {k: v.shape for k, v in abstract.items() if torch.is_tensor(v)} == \
        {k: v.shape for k, v in inputs.items() if torch.is_tensor(v)}
    assert SPEC.updated_in_place == ("latent_cache",) and not SPEC.grad_inputs


def test_the_card_serves_every_mla_layer_from_pages_of_64():
    from workbench.models import get_model

    card = get_model("kimi-k3")
    entry = card.blocks["mla_decode"]
    assert entry["layers"] == card.blocks["mla"]["layers"]
    assert entry["shapes"] == [{"N": 128, "H": 96, "R": 512, "DR": 64, "PAGE": 64, "MAXP": 65}]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("mla_decode")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["head_tiled", "head_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    """The promoted head_tiled at the smoke and edge suites; head_loop, which the port does not promote, in float32."""
    result = verify_first_point(tmp_path, "mla_decode", template, base_seed=5,
                                dtypes=None if template == "head_tiled" else UNPROMOTED)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:o", "forward:latent_cache"}
    assert result.forward_only
