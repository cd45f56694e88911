"""The replay model (Kimi K3's text model, workbench.kimi_k3, at a preset's sizes) and its training loop, on
reference blocks (in process, fast): the architecture each card gives, structure, LoRA, determinism, learning, and the
judgement of a curve against its reference."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.kimi_k3.modeling import (
    KimiK3DeltaAttention,
    KimiK3DSAAttention,
    KimiK3ForCausalLM,
    KimiK3MLAAttention,
    LoRALinear,
    OpsModule,
)
from workbench.replay.arch import architecture, replay_model_for
from workbench.replay.compare import judge
from workbench.replay.model import replay_model
from workbench.replay.ops import load_ops, reference_ops
from workbench.replay.presets import PRESETS, get_preset
from workbench.replay.train import make_base, train, use_ops

TINY = get_preset("tiny")
K3 = architecture("kimi-k3", TINY.layers)
PRO = architecture("kimi-k3.1-pro", TINY.layers)
REFERENCE_OPS = load_ops(reference_ops(PRO.blocks))


@pytest.fixture(scope="module")
def scratch():
    torch.set_num_threads(1)
    return train(TINY, PRO, "scratch", TINY.steps, 0, REFERENCE_OPS)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "base.pt"
    make_base(dataclasses.replace(TINY, base_steps=60), PRO, 0, REFERENCE_OPS, path)
    return path


def test_every_preset_keeps_the_target_structure():
    for preset in PRESETS.values():
        kda = preset.layers.count("K") / len(preset.layers)
        assert set(preset.layers) == {"K", "F"}
        assert preset.vocab >= 8 * preset.hidden  # a vocabulary much larger than the hidden size
        assert 0.5 <= kda <= 0.75
    model = replay_model(TINY, PRO)
    assert isinstance(model, KimiK3ForCausalLM)  # the model `workbench parity kimi-k3` holds, not a look-alike
    assert [type(layer.self_attn) for layer in model.model.layers] == [KimiK3DeltaAttention, KimiK3DSAAttention]
    assert [type(layer.self_attn) for layer in replay_model(TINY, K3).model.layers] == \
        [KimiK3DeltaAttention, KimiK3MLAAttention]
    first, second = model.model.layers
    assert hasattr(first, "mlp") and hasattr(second, "block_sparse_moe")  # K3's dense first layer, then MoE
    assert model.config.attn_res_block_size == TINY.attnres_block and model.config.rms_norm_eps == 1e-5


def test_each_card_gives_its_architecture():
    """kimi-k3 (from its published config): KDA with its short convolution and bounded gate, MLA, latent MoE with
    SiTU MLPs, Block AttnRes and a dense first layer; kimi-k3.1-pro the same with gated DSA in the full-attention
    layer (MLA in the second one of a longer schedule)."""
    assert (K3.layers, PRO.layers) == ("KM", "KD")
    assert K3.gate == "bounded" and K3.latent and K3.experts == "situ" and K3.attnres and K3.dense_first
    assert K3.route_scale == 1.0  # the config's routed_scaling_factor
    assert {"kda_short_conv", "kda_gate", "mla", "situ"} <= set(K3.blocks) and "swiglu" not in K3.blocks
    assert {"dsa_indexer", "dsa_sparse_attention"} <= set(PRO.blocks) and "mla" not in PRO.blocks
    assert architecture("kimi-k3.1-pro", "KKKFKKKF").layers == "KKKDKKKM"
    assert replay_model_for("mla", "kimi-k3.1-pro", TINY.layers) == "kimi-k3"  # not in K3.1 Pro's tiny replay
    assert replay_model_for("dsa_indexer", "kimi-k3.1-pro", TINY.layers) == "kimi-k3.1-pro"


def test_a_card_the_replay_cannot_be_built_from_is_one_clear_error(tmp_path, monkeypatch):
    (tmp_path / "dense.yaml").write_text("name: dense\ntitle: dense\nfacts: {}\nblocks:\n  rmsnorm: {shapes: []}\n")
    monkeypatch.setenv("WORKBENCH_MODELS", str(tmp_path))
    with pytest.raises(WorkbenchError, match="model dense: the replay model has routed MoE layers"):
        architecture("dense", TINY.layers)
    assert replay_model_for("rmsnorm", "dense", TINY.layers) == "kimi-k3"  # skipped, the next card serves


def _recording(name: str, fn, called: set):
    def run(*args):
        called.add(name)
        return fn(*args)
    return run


@pytest.mark.parametrize("arch", [K3, PRO], ids=["kimi-k3", "kimi-k3.1-pro"])
def test_every_catalog_block_of_the_model_is_called(arch):
    """The architecture's blocks are exactly those the K3 model's modules compute in training."""
    called = set()
    ops = {name: _recording(name, fn, called) for name, fn in load_ops(reference_ops(arch.blocks)).items()}
    model = replay_model(TINY, arch)
    use_ops(model, ops)
    trained = {b for m in model.modules() if isinstance(m, OpsModule) for b in m.TRAINING}
    assert trained == set(arch.blocks) - {"lora_linear"}
    tokens = torch.randint(0, TINY.vocab, (TINY.batch, TINY.seq_len))
    loss = model.loss(tokens, tokens)
    loss.backward()
    assert called == set(arch.blocks) - {"lora_linear"}
    model.add_lora(TINY.lora_rank, TINY.lora_alpha, seed=0)
    called.clear()
    model.loss(tokens, tokens)
    assert "lora_linear" in called


def test_lora_freezes_the_base_and_starts_from_its_outputs():
    torch.manual_seed(0)
    model = replay_model(TINY, PRO)
    use_ops(model, REFERENCE_OPS)
    tokens = torch.randint(0, TINY.vocab, (TINY.batch, TINY.seq_len))
    with torch.no_grad():
        before = model.loss(tokens, tokens)
    adapters = model.add_lora(TINY.lora_rank, TINY.lora_alpha, seed=0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in adapters.values()}
    projections = [m for m in model.modules() if isinstance(m, LoRALinear)]
    assert len(adapters) == 2 * len(projections) and all(m.lora_b.abs().sum() == 0 for m in projections)
    with torch.no_grad():
        after = model.loss(tokens, tokens)
    assert torch.allclose(before, after, rtol=1e-6, atol=1e-6)  # B = 0: the adapted model is the base model


def test_a_scratch_run_learns_from_about_ln_vocab(scratch):
    assert len(scratch.curve) == TINY.steps and scratch.nonfinite_step is None
    assert abs(scratch.curve[0] - math.log(TINY.vocab)) < 1.0
    assert scratch.curve[-1] < scratch.curve[0] - 2.0
    assert scratch.eval_loss is not None and scratch.eval_loss < scratch.curve[0] - 1.5
    assert len(scratch.topk_ids) == TINY.tokens_per_step and len(scratch.topk_ids[0]) == TINY.eval_topk


def test_the_reference_run_repeated_is_bit_identical(scratch):
    again = train(TINY, PRO, "scratch", TINY.steps, 0, REFERENCE_OPS)
    assert again.curve == scratch.curve
    assert again.fingerprints == scratch.fingerprints and again.topk_values == scratch.topk_values
    other_seed = train(TINY, PRO, "scratch", 3, 1, REFERENCE_OPS)
    assert other_seed.curve != scratch.curve[:3]


def test_a_lora_run_starts_from_the_base_and_trains_only_adapters(base):
    run = train(TINY, PRO, "lora", 8, 0, REFERENCE_OPS, base=base)
    assert all(name.endswith(("lora_a", "lora_b")) for name in run.fingerprints)
    assert run.curve[-1] < run.curve[0]
    again = train(TINY, PRO, "lora", 8, 0, REFERENCE_OPS, base=base)
    assert again.curve == run.curve


def test_judge_passes_the_same_run_and_names_where_a_curve_leaves_the_band(scratch):
    assert judge(scratch, scratch, TINY).passed
    shifted = dataclasses.replace(scratch, curve=[c * (1 + (0.01 if i >= 7 else 0)) for i, c in
                                                  enumerate(scratch.curve)])
    verdict = judge(shifted, scratch, TINY)
    assert not verdict.passed and verdict.left_band_step == 7
    assert "left the band at step 7" in verdict.reason


def test_judge_fails_nan_short_curves_and_drifted_parameters_or_topk(scratch):
    nan = dataclasses.replace(scratch, curve=scratch.curve[:5], nonfinite_step=5)
    assert "non-finite loss at step 5" in judge(nan, scratch, TINY).reason
    name = next(iter(scratch.fingerprints))
    norm, dot = scratch.fingerprints[name]
    drifted = dataclasses.replace(scratch, fingerprints={**scratch.fingerprints, name: [norm, dot + 0.01 * norm]})
    verdict = judge(drifted, scratch, TINY)
    assert not verdict.passed and verdict.checks["parameters"]["worst"] == name
    moved = dataclasses.replace(scratch, topk_values=[[v + 0.05 for v in row] for row in scratch.topk_values])
    assert not judge(moved, scratch, TINY).checks["eval_topk"]["passed"]


def test_ops_words_choose_each_blocks_implementation(tmp_path):
    from workbench.operators import promote_file
    from workbench.replay.ops import REFERENCE, resolve_ops

    source = tmp_path / "rmsnorm_candidate.py"
    source.write_text("BLOCK = 'rmsnorm'\n")
    promoted = promote_file(source, tmp_path / "operators", "rmsnorm", {"block": "rmsnorm", "promoted_at": "1"})
    chosen = resolve_ops(None, tmp_path / "operators", PRO.blocks)  # default: promoted where there is one
    assert chosen["rmsnorm"] == str(promoted) and chosen["kda"] == REFERENCE
    assert set(resolve_ops(["reference"], tmp_path / "operators", PRO.blocks).values()) == {REFERENCE}
    loss = tmp_path / "loss.py"
    loss.write_text("")
    chosen = resolve_ops(["promoted", f"seq_chunked_ce={loss}", "rmsnorm=reference"], tmp_path / "operators",
                         PRO.blocks)
    assert chosen["seq_chunked_ce"] == str(loss) and "vocab_blockwise_ce" not in chosen  # one loss head
    assert chosen["rmsnorm"] == REFERENCE  # later words win
    with pytest.raises(WorkbenchError, match="block 'mla' is not part of the replay model"):
        resolve_ops([f"mla={loss}"], tmp_path / "operators", PRO.blocks)


def test_training_never_picks_an_operator_promoted_by_a_forward_only_port(tmp_path):
    """A decode kernel promoted after the training one is the block's newest, but its backward raises: the replay
    keeps the training operator, and the listing of the newest keeps both apart."""
    from workbench.operators import FORWARD_ONLY_SUFFIX, newest_promoted, promote_file
    from workbench.replay.ops import resolve_ops

    ops = tmp_path / "operators"
    for name, stamp, forward_only in (("rmsnorm_train.py", "1", False), ("rmsnorm_decode.py", "2", True)):
        (tmp_path / name).write_text("BLOCK = 'rmsnorm'\n")
        promote_file(tmp_path / name, ops, "rmsnorm", {"block": "rmsnorm", "promoted_at": stamp,
                                                      "verification": {"forward_only": forward_only}})
    assert resolve_ops(None, ops, PRO.blocks)["rmsnorm"] == str(ops / "rmsnorm" / "rmsnorm_train.py")
    newest = newest_promoted(ops)
    assert list(newest) == ["rmsnorm", "rmsnorm" + FORWARD_ONLY_SUFFIX]
    assert newest["rmsnorm" + FORWARD_ONLY_SUFFIX]["path"].endswith("rmsnorm_decode.py")


def test_training_in_process_leaves_torch_global_state_as_it_was():
    """A replay trained in the test process (or any in-process caller) must not leave deterministic-algorithms mode
    on or the global RNG reseeded for whatever runs after it."""
    torch.use_deterministic_algorithms(False)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    train(TINY, PRO, "scratch", 2, 0, REFERENCE_OPS)
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.equal(torch.get_rng_state(), before)
