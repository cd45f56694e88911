"""Kimi K3 checkpoints in the published layout: safetensors files of the names vLLM's loader reads (``vllm/models/
kimi_k3/amd/linear.py`` KimiLinearModel.load_weights, ``amd/mtp.py``), the routed experts in MXFP4 as
compressed-tensors' ``mxfp4-pack-quantized`` writes them.

    published name (text weights; a multimodal checkpoint prefixes them language_model.)    this model's
    model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight      [F, Dx]                   ...experts.w1[e]
    model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight_packed [F, Dx / 2] uint8       ...experts.w1[e] (MXFP4)
    model.layers.{l}.block_sparse_moe.experts.{e}.w1.weight_scale  [F, Dx / 32] uint8      ...experts.w1_scale[e]
    (w3 the up projection, w2 the down projection [Dx, F] alike)
    model.layers.{L + i}.{enorm, hnorm, eh_proj, shared_head}.*  (MTP depth i)             mtp.{i}.*
    model.layers.{L + i}.<any other>                                                        mtp.{i}.mtp_block.<it>
    model.layers.{l}.self_attn.A_log  [H] (or the older [1, 1, H, 1])                        [H]
    model.layers.{l}.self_attn.{q,k,v}_conv1d.weight  [C, W] or [C, 1, W]                    [C, 1, W]
    every other name                                                                        the same name

What the text model does not hold (the vision tower, the multimodal projector, an MTP layer's copy of the embedding)
is listed as skipped, never silently dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.blocks.moe_grouped_gemm_mxfp4 import FORMAT as MXFP4_FORMAT
from workbench.blocks.moe_grouped_gemm_mxfp4 import quantize
from workbench.errors import WorkbenchError
from workbench.kimi_k3.config import KimiK3Config
from workbench.kimi_k3.modeling import KimiK3ForCausalLM

EXPERT = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.experts)\.(\d+)\.(w[123])\.(weight|weight_packed|"
                    r"weight_scale)$")
MTP_OWN = ("enorm", "hnorm", "eh_proj", "shared_head")
"""The MTP layer's own parts (vLLM's _rewrite_spec_layer_name); the rest of model.layers.{L + i} is its block."""
SUFFIX = {"weight": "", "weight_packed": "", "weight_scale": "_scale"}


@dataclass
class LoadReport:
    """What a load did: every parameter filled (count), the names skipped (not text-model weights) and whether the
    experts were kept in MXFP4."""

    loaded: int = 0
    skipped: list[str] = field(default_factory=list)
    mxfp4: bool = False


def text_name(name: str) -> str:
    """A checkpoint name without the multimodal prefix: language_model.layers.* and language_model.model.* both map
    to model.* (vLLM's hf_to_vllm_mapper)."""
    if name.startswith("language_model."):
        name = name.removeprefix("language_model.")
        if name.startswith("layers."):
            name = "model." + name
    return name


def model_name(name: str, config: KimiK3Config) -> str | None:
    """The parameter name of this model for a text checkpoint name (module docstring); None: not a weight it
    holds (an MTP layer's embedding copy)."""
    match = re.match(r"^model\.layers\.(\d+)\.(.*)$", name)
    if match and int(match[1]) >= config.num_hidden_layers:
        depth, rest = int(match[1]) - config.num_hidden_layers, match[2]
        if rest.startswith("embed_tokens"):
            return None
        own = rest.split(".", 1)[0] in MTP_OWN
        return f"mtp.{depth}.{rest}" if own else f"mtp.{depth}.mtp_block.{rest}"
    return name


def load(model: KimiK3ForCausalLM, folder: str | Path) -> LoadReport:
    """Fill ``model`` from the safetensors files of ``folder`` (K3's published layout); experts published in MXFP4
    stay packed (forward only). Every parameter and buffer of the model must be filled: a missing one, or a weight
    of the wrong shape, is one WorkbenchError naming it."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WorkbenchError(f"no *.safetensors in {folder}")
    config, report = model.config, LoadReport()
    state = model.state_dict()
    experts: dict[tuple[str, str, str], dict[int, torch.Tensor]] = {}
    filled: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for raw in reader.keys():  # noqa: SIM118 (safe_open has no __iter__)
                name = text_name(raw)
                match = EXPERT.match(name)
                if match:
                    key = (model_name(match[1], config), match[3], match[4])
                    experts.setdefault(key, {})[int(match[2])] = reader.get_tensor(raw)
                    continue
                target = model_name(name, config)
                if target is None or target not in state:
                    report.skipped.append(raw)
                    continue
                filled.add(target)
                state[target].copy_(_shaped(reader.get_tensor(raw), state[target], raw))
    report.mxfp4 = any(kind == "weight_packed" for _, _, kind in experts)
    _load_experts(model, experts, state, filled, report.mxfp4)
    missing = sorted(set(model.state_dict()) - filled)
    if missing:
        raise WorkbenchError(f"{folder}: no weight for {missing[0]}" + (f" and {len(missing) - 1} more"
                                                                        if len(missing) > 1 else ""))
    report.loaded = len(filled)
    return report


def _shaped(tensor: torch.Tensor, into: torch.Tensor, name: str) -> torch.Tensor:
    """``tensor`` in the shape of ``into`` where the published layouts differ only by unit axes (A_log [1, 1, H, 1],
    conv taps [C, W]); anything else of another shape is an error naming it."""
    if tensor.shape != into.shape:
        if tensor.numel() != into.numel() or [s for s in tensor.shape if s != 1] != [s for s in into.shape if s != 1]:
            raise WorkbenchError(f"checkpoint weight {name} is {tuple(tensor.shape)}, the model's "
                                 f"{tuple(into.shape)}")
        tensor = tensor.reshape(into.shape)
    return tensor


def _load_experts(model: KimiK3ForCausalLM, experts: dict, state: dict, filled: set[str], mxfp4: bool) -> None:
    """Stack each layer's per-expert tensors; MXFP4 ones become the experts' packed buffers."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for (prefix, proj, kind), by_expert in experts.items():
        count = model.config.num_experts
        if sorted(by_expert) != list(range(count)):
            raise WorkbenchError(f"{prefix}.*.{proj}.{kind}: {len(by_expert)} experts, the config says {count}")
        layers.setdefault(prefix, {})[proj + SUFFIX[kind]] = torch.stack([by_expert[e] for e in range(count)])
    for prefix, tensors in layers.items():
        module = model.get_submodule(prefix)
        if mxfp4:
            module.use_mxfp4(tensors)
            filled.update(f"{prefix}.{name}" for name in tensors)
            continue
        for name, tensor in tensors.items():
            state[f"{prefix}.{name}"].copy_(_shaped(tensor, state[f"{prefix}.{name}"], f"{prefix}.*.{name}"))
            filled.add(f"{prefix}.{name}")


def save(model: KimiK3ForCausalLM, folder: str | Path, mxfp4: bool = False, prefix: str = "") -> Path:
    """Write ``model`` as a checkpoint in K3's published layout (``model.safetensors`` and a ``config.json`` that
    ``KimiK3Config.from_published`` reads); ``mxfp4``: the routed experts quantized as compressed-tensors packs
    them; ``prefix``: "language_model." for the multimodal naming."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config, tensors, state = model.config, {}, model.state_dict()
    for name, tensor in state.items():
        published = _published_name(name, config)
        expert = re.match(r"^(.*\.experts)\.(w[123])(_scale)?$", published)
        if expert:
            if expert[3]:
                continue  # the scales travel with their packed weights below
            for e in range(config.num_experts):
                base = f"{prefix}{expert[1]}.{e}.{expert[2]}"
                if mxfp4 or tensor.dtype == torch.uint8:
                    packed, scale = (tensor[e], state[name + "_scale"][e]) if tensor.dtype == torch.uint8 \
                        else quantize(tensor[e])
                    tensors[f"{base}.weight_packed"], tensors[f"{base}.weight_scale"] = packed, scale
                else:
                    tensors[f"{base}.weight"] = tensor[e]
            continue
        tensors[prefix + published] = tensor
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(published_config(config, mxfp4), indent=1))
    return folder


def _published_name(name: str, config: KimiK3Config) -> str:
    """The published name of a parameter of this model (the inverse of ``model_name``)."""
    match = re.match(r"^mtp\.(\d+)\.(mtp_block\.)?(.*)$", name)
    return f"model.layers.{config.num_hidden_layers + int(match[1])}.{match[3]}" if match else name


def published_config(config: KimiK3Config, mxfp4: bool) -> dict:
    """A config.json in K3's text_config layout (the layer lists 1-indexed, as the published config has them)."""
    fields = config.to_dict()
    kinds = fields.pop("layer_kinds")
    for name in ("kda_num_heads", "kda_head_dim", "short_conv_kernel_size", "gate_lower_bound", "use_full_rank_gate",
                 "quantization_format", "sources", "model_type"):
        fields.pop(name)
    fields["linear_attn_config"] = {
        "kda_layers": [i + 1 for i, k in enumerate(kinds) if k == "K"],
        "full_attn_layers": [i + 1 for i, k in enumerate(kinds) if k != "K"],
        "num_heads": config.kda_num_heads, "head_dim": config.kda_head_dim,
        "short_conv_kernel_size": config.short_conv_kernel_size, "gate_lower_bound": config.gate_lower_bound,
        "use_full_rank_gate": config.use_full_rank_gate}
    if "D" in kinds:  # not a published field: K3.1 Pro's DSA layers (release notes), 1-indexed like the lists
        fields["dsa_layers"] = [i + 1 for i, k in enumerate(kinds) if k == "D"]
    fields["model_type"] = "kimi_linear"
    if mxfp4:
        fields["quantization_config"] = {"quant_method": "compressed-tensors", "format": MXFP4_FORMAT}
    return {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"], "text_config": fields}
