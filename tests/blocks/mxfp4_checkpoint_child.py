"""Child process of tests/blocks/test_moe_grouped_gemm_mxfp4.py, and the tiny compressed-tensors checkpoint its tests
share. ``python mxfp4_checkpoint_child.py DIR TEMPLATE`` with TRITON_INTERPRET=1 renders the template's first point
(small tiles, so groups span several), runs it on the experts of a checkpoint compressed-tensors wrote, and holds y
to x times compressed-tensors' own dequantized weights in float64, for float32 and float16 activations; it fails by
raising (exit code 1, the assertion in its output)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import torch

PROJECTIONS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
"""The block's weights by the projection names of a checkpoint's experts."""


def compressed_tensors_experts(tmp_path, experts: int, d: int, f: int, seed: int) -> dict[str, torch.Tensor]:
    """A tiny MoE checkpoint as compressed-tensors writes an mxfp4-pack-quantized one: each expert's gate, up and
    down projection (bfloat16 weights N(0, 1/in)) quantized with the MXFP4 scheme's scales (generate_mx_scales) and
    compressed by its MXFP4 compressor, saved with safetensors and loaded back; plus the bfloat16 originals."""
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4A16
    from compressed_tensors.quantization.utils.mxfp_utils import generate_mx_scales
    from safetensors.torch import load_file, save_file

    scheme = QuantizationScheme(targets=["Linear"], **MXFP4A16)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for e in range(experts):
        for proj, (out, inp) in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f))):
            w = (torch.randn(out, inp, generator=g) / inp ** 0.5).to(torch.bfloat16)
            amax = w.unflatten(-1, (-1, 32)).abs().amax(-1)
            scale = torch.exp2(generate_mx_scales(amax).float() - 127).to(torch.bfloat16)
            packed = MXFP4PackedCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
            name = f"model.layers.0.mlp.experts.{e}.{proj}"
            tensors[f"{name}.weight_packed"] = packed["weight_packed"]
            tensors[f"{name}.weight_scale"] = packed["weight_scale"]
            tensors[f"{name}.weight"] = w
            tensors[f"{name}.decompressed"] = MXFP4PackedCompressor.decompress(dict(packed), scheme)["weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    return load_file(tmp_path / "model.safetensors")


def stacked(checkpoint: dict, experts: int, suffix: str) -> dict[str, torch.Tensor]:
    """The block's weights [E, ...] from a checkpoint's per-expert tensors named ``<proj>.<suffix>``."""
    return {ours: torch.stack([checkpoint[f"model.layers.0.mlp.experts.{e}.{proj}.{suffix}"] for e in range(experts)])
            for ours, proj in PROJECTIONS.items()}


def main(work_dir: Path, template: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    from workbench.blocks import get_block
    from workbench.templating import load_template

    t = load_template("moe_grouped_gemm_mxfp4", template)
    source = work_dir / "candidate.py"
    source.write_text(t.render({**next(iter(t.points())), "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}))
    spec = importlib.util.spec_from_file_location("candidate", source)
    kernel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel)

    experts, d, f = 3, 64, 96
    ckpt = compressed_tensors_experts(work_dir, experts, d, f, seed=2)
    packed, scales = stacked(ckpt, experts, "weight_packed"), stacked(ckpt, experts, "weight_scale")
    weights = {k: v.double() for k, v in stacked(ckpt, experts, "decompressed").items()}
    offsets = torch.tensor([0, 5, 5, 19])  # an empty expert, a tail row
    for dtype, bound in ((torch.float32, 1e-5), (torch.float16, 4e-3)):
        x = torch.randn(20, d, generator=torch.Generator().manual_seed(3)).to(dtype)
        y = kernel.run(x, offsets, packed["w1"], scales["w1"], packed["w3"], scales["w3"], packed["w2"], scales["w2"],
                       "swiglu", 4.0, 25.0)
        truth = get_block("moe_grouped_gemm").reference(x.double(), offsets, weights["w1"], weights["w3"],
                                                         weights["w2"], "swiglu", 4.0, 25.0)
        err = float((y.double() - truth).abs().max() / truth.abs().max())
        assert y.dtype == dtype and float(y[19].abs().max()) == 0.0 and err < bound, (dtype, err)
        print(f"{template} {dtype}: max error / max |y| = {err:.2e}")
    print("checkpoint ok")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
