"""dsa_decode: the sparse serving step held to dsa_sparse_attention (sequences decoded token by token with each
token's selection, their latents kept in pages of the cache, equal the absorbed sparse attention over each whole
sequence with the same selections; ragged lengths in one batch, empty selections, selections naming this step's
token or not), the reference leaving its input alone, the input factory, the card, the templates; both templates
verified through the sandbox on the Triton interpreter."""

from __future__ import annotations

import pytest
import torch
from template_checks import UNPROMOTED, assert_templates_render_each_choice, numeric_directions, verify_first_point

from workbench.blocks import get_block
from workbench.blocks._dsa import causal_topk
from workbench.blocks.mla_decode import UNWRITTEN

SPEC = get_block("dsa_decode")
SPARSE = get_block("dsa_sparse_attention")


@pytest.mark.parametrize("page", [4, 1])
def test_sequences_decoded_token_by_token_equal_their_sparse_prefill(page):
    """Two sequences of 12 tokens (the second joining 3 steps later), each token selecting the top 5 of random
    scores over the causal positions (itself included or not), three rows emptied: every step's output is the
    absorbed dsa_sparse_attention's output of that token, and every latent lands in its row."""
    g = torch.Generator().manual_seed(4)
    t, h, r, dr, topk = 12, 3, 16, 4, 5
    q = torch.randn(2, t, h, r + dr, generator=g, dtype=torch.float64)
    latents = torch.randn(2, t, r + dr, generator=g, dtype=torch.float64)
    indices = causal_topk(torch.randn(2, t, t, generator=g, dtype=torch.float64), topk)  # [2, t, topk], -1 padded
    indices[0, 7], indices[1, 0], indices[1, 9] = -1, -1, -1
    scale = 0.3
    prefill = SPARSE.reference(q, latents[:, :, None], latents[:, :, None, :r], indices, None, scale)
    maxp = -(-t // page)
    table = torch.randperm(2 * maxp + 1, generator=g)[:2 * maxp].view(2, maxp).int()
    cache = torch.full((2 * maxp + 1, page, r + dr), UNWRITTEN, dtype=torch.float64)
    late = 3
    for step in range(t + late):
        batch = [b for b, pos in ((0, step), (1, step - late)) if 0 <= pos < t]
        ts = [step if b == 0 else step - late for b in batch]
        o, cache = SPEC.reference(q[batch, ts], latents[batch, ts, :r], latents[batch, ts, r:], cache, table[batch],
                                  torch.tensor(ts, dtype=torch.int32), indices[batch, ts].int(), scale)
        torch.testing.assert_close(o, prefill[batch, ts], rtol=1e-12, atol=1e-12)
    for b in range(2):
        rows = cache[table[b, torch.arange(t) // page].long(), torch.arange(t) % page]
        torch.testing.assert_close(rows, latents[b], rtol=0, atol=0)
    assert (indices == torch.arange(t)[None, :, None]).any(-1).any() and \
        not (indices == torch.arange(t)[None, :, None]).any(-1).all()  # some steps pick their own token, some not


def test_make_inputs_and_the_input_cache_left_alone():
    shape = {"N": 9, "H": 2, "R": 16, "DR": 4, "PAGE": 4, "MAXP": 3, "TOPK": 6}
    inputs = SPEC.make_inputs(shape, torch.float32, 1)
    rows, lengths = inputs["indices"].tolist(), inputs["seq_lens"].tolist()
    assert inputs["indices"].dtype == torch.int32 and sum(row == [-1] * 6 for row in rows) >= 1  # an empty row
    for row, length in zip(rows, lengths, strict=True):
        chosen = [s for s in row if s >= 0]
        assert len(set(chosen)) == len(chosen) and all(s <= length for s in chosen)
    before = inputs["latent_cache"].clone()
    SPEC.reference(**inputs)
    assert torch.equal(inputs["latent_cache"], before)
    abstract = SPEC.meta_inputs(shape, torch.float32)
    assert {k: v.shape for k, v in abstract.items() if torch.is_tensor(v)} == \
        {k: v.shape for k, v in inputs.items() if torch.is_tensor(v)}


def test_the_card_serves_k31_pro_dsa_layers_from_pages_of_64():
    from workbench.models import get_model

    entry = get_model("kimi-k3.1-pro").blocks["dsa_decode"]
    assert entry["layers"] == 24
    assert entry["shapes"] == [{"N": 128, "H": 96, "R": 512, "DR": 64, "PAGE": 64, "MAXP": 65, "TOPK": 2048}]


def test_templates_render_each_choice_to_a_candidate():
    assert_templates_render_each_choice("dsa_decode")


@pytest.mark.interpreter
@pytest.mark.parametrize("template", ["head_tiled", "head_loop"])
def test_each_template_verifies_on_the_interpreter(tmp_path, template):
    """The promoted head_tiled at the smoke and edge suites; head_loop, which the port does not promote, in float32."""
    result = verify_first_point(tmp_path, "dsa_decode", template, base_seed=5,
                                dtypes=None if template == "head_tiled" else UNPROMOTED)
    assert result.passed, result.message
    assert numeric_directions(result) == {"forward:o", "forward:latent_cache"}
    assert result.forward_only
