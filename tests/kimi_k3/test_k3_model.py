"""workbench.kimi_k3 as a model: its serving path (packed prefill, chunked prefill, decode steps, left padding) against
its training path in float64, vLLM's V x K state kept in place, greedy generate(), its LoRA, checkpoints in K3's
published layout (MXFP4 experts as compressed-tensors writes them, the multimodal prefix, older tensor shapes) and
configs that are not K3's."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.kimi_k3 import KimiK3Config, KimiK3ForCausalLM
from workbench.kimi_k3.checkpoint import load, save

TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, layer_kinds="KKMD", kda_num_heads=2, kda_head_dim=8,
            num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=8, intermediate_size=48, num_experts=4, num_experts_per_token=2, moe_intermediate_size=32,
            num_shared_experts=1, routed_expert_hidden_size=32, attn_res_block_size=2, index_topk=4,
            index_n_heads=16, index_head_dim=8)


def model_of(dtype=torch.float64, **changes) -> KimiK3ForCausalLM:
    torch.manual_seed(0)
    return KimiK3ForCausalLM(KimiK3Config(**{**TINY, **changes})).to(dtype)


def test_serving_computes_what_training_computes():
    """A prompt prefilled at once, prefilled in two chunks then decoded token by token, or left-padded in a batch:
    the logits of the training forward (KDA, MLA and K3.1 Pro's DSA layers; float64)."""
    model = model_of()
    ids = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        full = model(ids).logits
        assert (model(ids, use_cache=True).logits - full).abs().max() < 1e-12
        out = model(ids[:, :4], use_cache=True)
        cache, steps = out.past_key_values, [out.logits]
        out = model(ids[:, 4:7], past_key_values=cache, use_cache=True)  # a second prefill chunk
        steps.append(out.logits)
        for i in range(7, 11):
            steps.append(model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits)
        assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-12
        assert cache.seq_lens.tolist() == [11, 11]
        padded, mask = ids.clone(), torch.ones_like(ids)
        padded[1, :5], mask[1, :5] = 0, 0
        out = model(padded, attention_mask=mask)
        assert (out.logits[1, 5:] - model(ids[1:, 5:]).logits[0]).abs().max() < 1e-12
        assert (out.logits[1, :5] == 0).all() and (out.logits[0] - full[0]).abs().max() < 1e-12


def test_the_kda_state_is_kept_as_vllm_keeps_it():
    """Each KDA layer's recurrent state lives [slot, H, V, K] contiguous (vLLM's layout); the serving forms take its
    [slot, H, K, V] view and write it in place."""
    model = model_of()
    with torch.no_grad():
        cache = model(torch.randint(0, 64, (2, 6)), use_cache=True).past_key_values
    for layer in (0, 1):
        state = cache.vllm_state(layer)
        assert state.shape == (2, 2, 8, 8) and state.is_contiguous() and state.abs().sum() > 0
        assert cache.layers[layer]["state"].stride() == (128, 64, 1, 8)  # [S, H, K, V] over V x K storage


def test_greedy_generate_is_the_argmax_of_the_training_forward():
    model = model_of()
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, return_dict_in_generate=True, output_logits=True)
        sequence = ids
        for step in range(4):
            logits = model(sequence).logits[:, -1]
            assert (out.logits[step] - logits).abs().max() < 1e-12
            sequence = torch.cat([sequence, logits.argmax(-1)[:, None]], dim=1)
    assert torch.equal(out.sequences, sequence)
    with pytest.raises(ValueError, match="greedily"):
        model.generate(ids, do_sample=True)


def test_lora_adapts_the_projections_through_lora_linear():
    model = model_of()
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        before = model(ids).logits
    adapters = model.add_lora(rank=2, alpha=4.0, seed=0)
    assert {p for p in model.parameters() if p.requires_grad} == set(adapters.values())
    assert "model.layers.0.self_attn.g_proj.lora_a" in adapters and not any("kv_b_proj" in n for n in adapters)
    assert all(n.endswith((".lora_a", ".lora_b")) for n in adapters)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)  # B starts at zero
    model(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for n, p in adapters.items() if n.endswith("lora_b"))


def test_a_checkpoint_round_trips_in_the_published_layout(tmp_path):
    """Per-expert w1/w2/w3 tensors, K3's names, the MTP layer under model.layers.{L}, the config's 1-indexed lists
    (and K3.1 Pro's DSA layers, marked as not published)."""
    model = model_of(torch.float32, num_nextn_predict_layers=1)
    save(model, tmp_path, prefix="language_model.")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as reader:
        names = set(reader.keys())
    assert "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight" in names
    assert "language_model.model.layers.4.eh_proj.weight" in names  # MTP: model.layers.{num_hidden_layers}
    assert "language_model.model.layers.4.self_attn.kv_b_proj.weight" in names  # the MTP layer's block
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["text_config"]["linear_attn_config"]["kda_layers"] == [1, 2]
    assert config["text_config"]["dsa_layers"] == [4]
    loaded = KimiK3Config.from_published(config)
    assert loaded.layer_kinds == "KKMD" and "release notes" in loaded.sources["dsa_layers"]
    copy = KimiK3ForCausalLM(loaded)
    report = load(copy, tmp_path)
    assert report.skipped == [] and not report.mxfp4
    ids = torch.randint(0, 64, (2, 5))
    assert torch.equal(copy(ids).logits, model(ids).logits)


def test_older_tensor_layouts_load_and_a_missing_weight_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    model = model_of(torch.float32)
    save(model, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["model.layers.0.self_attn.A_log"] = tensors["model.layers.0.self_attn.A_log"].view(1, 1, 2, 1)
    tensors["model.layers.0.self_attn.q_conv1d.weight"] = tensors["model.layers.0.self_attn.q_conv1d.weight"][:, 0]
    tensors["vision_tower.patch_embed.weight"] = torch.zeros(2)
    save_file(tensors, tmp_path / "model.safetensors")
    copy = KimiK3ForCausalLM(KimiK3Config(**TINY))
    assert load(copy, tmp_path).skipped == ["vision_tower.patch_embed.weight"]
    assert torch.equal(copy.model.layers[0].self_attn.A_log, model.model.layers[0].self_attn.A_log)
    del tensors["model.layers.2.self_attn.kv_b_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(WorkbenchError, match="no weight for model.layers.2.self_attn.kv_b_proj.weight"):
        load(KimiK3ForCausalLM(KimiK3Config(**TINY)), tmp_path)


def test_mxfp4_experts_load_as_compressed_tensors_writes_them(tmp_path):
    """Each routed expert's projections quantized and packed by compressed-tensors' own MXFP4 compressor: the model
    keeps them packed (moe_grouped_gemm_mxfp4) and computes what a dense model with compressed-tensors' decompressed
    weights computes."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4A16
    from compressed_tensors.quantization.utils.mxfp_utils import generate_mx_scales
    from safetensors.torch import load_file, save_file

    model = model_of(torch.float32)
    save(model, tmp_path)
    tensors, dense = load_file(tmp_path / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    scheme = QuantizationScheme(targets=["Linear"], **MXFP4A16)
    for name in [n for n in tensors if ".experts." in n]:
        w = tensors.pop(name).to(torch.bfloat16)
        scale = torch.exp2(generate_mx_scales(w.unflatten(-1, (-1, 32)).abs().amax(-1)).float() - 127)
        packed = MXFP4PackedCompressor.compress({"weight": w, "weight_scale": scale.to(torch.bfloat16)}, scheme)
        tensors[name + "_packed"], tensors[name.removesuffix("weight") + "weight_scale"] = \
            packed["weight_packed"], packed["weight_scale"]
        dense[name] = MXFP4PackedCompressor.decompress(dict(packed), scheme)["weight"].float()
    save_file(tensors, tmp_path / "model.safetensors")
    quantized = KimiK3ForCausalLM(KimiK3Config(**TINY))
    assert load(quantized, tmp_path).mxfp4
    experts = quantized.model.layers[1].block_sparse_moe.experts
    assert experts.w1.dtype == torch.uint8 and experts.TRAINING[1] == "moe_grouped_gemm_mxfp4"
    save_file(dense, tmp_path / "model.safetensors")
    reference = KimiK3ForCausalLM(KimiK3Config(**TINY))
    load(reference, tmp_path)
    ids = torch.randint(0, 64, (2, 5))
    with torch.no_grad():
        got, want = quantized(ids).logits, reference(ids).logits
    assert (got - want).abs().max() < 1e-5 * want.abs().max()


@pytest.mark.parametrize("change, message", [
    ({"full_attn_layers": [1]}, "do not split"),
    ({"mla_use_nope": False}, "rotary"),
])
def test_configs_k3_cannot_compute_are_one_line(change, message):
    data = json.loads((__import__("workbench.models").models.CARDS_DIR / "configs" / "kimi-k3.config.json").read_text())
    linear = data["text_config"]["linear_attn_config"]
    if "full_attn_layers" in change:
        linear["full_attn_layers"] = change["full_attn_layers"]
    else:
        data["text_config"].update(change)
    with pytest.raises(WorkbenchError, match=message):
        KimiK3Config.from_published(data)
    with pytest.raises(WorkbenchError, match="layer_kinds"):
        KimiK3Config(num_hidden_layers=2, layer_kinds="KX")


def test_the_main_model_starts_alike_with_or_without_mtp_depths():
    """The MTP depths are drawn after the main model: a replay with --mtp starts where one without starts."""
    torch.manual_seed(0)
    plain = KimiK3ForCausalLM(KimiK3Config(**TINY)).state_dict()
    torch.manual_seed(0)
    with_mtp = KimiK3ForCausalLM(KimiK3Config(**TINY, num_nextn_predict_layers=1)).state_dict()
    assert all(torch.equal(tensor, with_mtp[name]) for name, tensor in plain.items())
    assert any(name.startswith("mtp.0.") for name in with_mtp)
