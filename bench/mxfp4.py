"""The routed experts' grouped GEMM over MXFP4 weights (moe_grouped_gemm_mxfp4) beside the same GEMM over bfloat16
weights (moe_grouped_gemm), at Kimi K3's expert sizes with prefill and decode densities of rows per expert, and what
tl.dot_scaled lowers to on each target.

    python bench/mxfp4.py              # modelled on the five targets, and the tl.dot_scaled lowering (CPU is enough)
    python bench/mxfp4.py --measure    # and measured on this machine's CUDA GPU, bfloat16 activations
    python bench/mxfp4.py --lowering   # the tl.dot_scaled lowering alone

What the figures are. The shapes keep K3's expert width (D 3584), FFN size (F 3072), top 16 and the rows per expert
of a training step (8192 tokens: 146 per expert) and of a decode step (128 sequences: 2.3 per expert), over 64
experts instead of 896 so the eager reference's dequantized weights fit one GPU. "modelled": workbench.perf.cost
(the roofline floor of the block's work times the penalties of the promoted operator's kernels as compiled for the
target at the model suite); TFLOP/s = the GEMMs' flops / that time. "measured": the median of timed calls with
CUDA events, each call's output checked against the float64 truth. The lowering table compiles one tl.dot_scaled
(bfloat16 activations times e2m1 weights, as the dot_scaled template calls it; and e4m3 activations, as a W4A8 form
would) for each target and names the matrix instruction in its PTX / AMDGCN: a block-scaled MMA is native
microscaling, anything else is Triton's upcast to the half type in front of an ordinary MMA.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGETS = ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950")
EXPERTS = 64
SHAPES = {"prefill": {"N": 8192 * EXPERTS // 896, "k": 16, "D": 3584, "F": 3072, "E": EXPERTS, "hot": 0, "drop": 0,
                      "act": 1},
          "decode": {"N": 128 * EXPERTS // 896, "k": 16, "D": 3584, "F": 3072, "E": EXPERTS, "hot": 0, "drop": 0,
                     "act": 1}}
BLOCKS = ("moe_grouped_gemm_mxfp4", "moe_grouped_gemm")
MMA = r"(tcgen05\.mma[\w.:]*|wgmma\.mma_async[\w.:]*|mma\.sync[\w.:]*|v_mfma\w*|v_wmma\w*)"


def lowering() -> list[tuple[str, str, str]]:
    """(activations' format, target, the matrix instructions of one tl.dot_scaled against e2m1 weights, or the
    compiler's error) for bf16 and e4m3 activations on every target."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from workbench.backends import TARGETS as SPECS

    @triton.jit
    def scaled_dot(A, B, S, C, LHS: tl.constexpr):
        m, n, k = tl.arange(0, 128), tl.arange(0, 128), tl.arange(0, 128)
        a = tl.load(A + m[:, None] * 128 + k[None, :])
        if LHS == "e4m3":  # activations in MXFP8: e4m3 values, one e8m0 scale (here 1) per 32
            a_scale = tl.full((128, 4), 127, tl.uint8)
            a = a.to(tl.float8e4nv)
        else:
            a_scale = None
            a = a.to(tl.bfloat16)
        b = tl.load(B + tl.arange(0, 64)[:, None] * 128 + n[None, :])  # e2m1 pairs packed along K
        s = tl.load(S + n[:, None] * 4 + tl.arange(0, 4)[None, :])
        tl.store(C + m[:, None] * 128 + n[None, :], tl.dot_scaled(a, a_scale, LHS, b, s, "e2m1"))

    rows = []
    for lhs in ("bf16", "e4m3"):
        for name in TARGETS:
            spec = SPECS[name]
            source = ASTSource(scaled_dot, {"A": "*fp32", "B": "*u8", "S": "*u8", "C": "*fp32"}, {"LHS": lhs})
            try:
                compiled = triton.compile(source, target=GPUTarget(spec.backend, spec.arch, spec.warp_size),
                                          options={"num_warps": 4})
                code = compiled.asm.get("ptx") or compiled.asm.get("amdgcn") or ""
                found = sorted(set(re.findall(MMA, code)))
                rows.append((lhs, name, ", ".join(found) or "no matrix instruction"))
            except Exception as exc:  # noqa: BLE001 - a target without the format is a row saying so
                rows.append((lhs, name, f"does not compile: {str(exc).splitlines()[0][:80]}"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="also time the operators on this machine's CUDA GPU")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--lowering", action="store_true", help="only the tl.dot_scaled lowering table")
    args = parser.parse_args()
    if args.lowering:
        return print_lowering()

    import torch

    from workbench.blocks import get_block
    from workbench.operators import newest_promoted
    from workbench.perf import bench as perf
    from workbench.perf import cost
    from workbench.verify.harness import target_report

    promoted = newest_promoted(ROOT / "operators")
    rows = []
    for block in BLOCKS:
        if block not in promoted:
            print(f"{block}: no promoted operator, skipped")
            continue
        path = Path(promoted[block]["path"])
        report = target_report(path, block=block, targets=list(TARGETS), forward_only=True)
        rows += [r for r in perf.modelled_rows(block, list(SHAPES.values()), list(TARGETS), report.builds)
                 if r.passes == "fwd"]
        if args.measure:
            rows += [r for r in perf.measured_rows(get_block(block), perf.load_operator(path), list(SHAPES.values()),
                                                   trials=args.trials, subjects=["operator", "eager"])
                     if r.passes == "fwd"]
    if args.measure and not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device, so nothing is measured")
    print(f"routed experts' grouped GEMM, MXFP4 and bfloat16 weights (python bench/mxfp4.py"
          f"{' --measure' if args.measure else ''}); K3's expert sizes over {EXPERTS} experts")
    print(f"{'block':<24} {'subject':<9} {'target':<8} {'label':<9} {'step':<8} {'ms':>8} {'TFLOP/s':>8} "
          f"{'GB/s':>7}  note")
    label = {perf.shape_label(shape): step for step, shape in SHAPES.items()}
    for r in rows:
        work = cost.work(r.block, SHAPES[label[r.shape]], backward=False)
        ms = "-" if r.time_ms is None else f"{r.time_ms:8.3f}"
        tflops = "-" if r.time_ms is None else f"{work.tensor_flops / (r.time_ms * 1e-3) / 1e12:8.1f}"
        gbs = "-" if r.time_ms is None else f"{work.bytes / (r.time_ms * 1e-3) / 1e9:7.0f}"
        print(f"{r.block:<24} {r.subject:<9} {r.target:<8} {r.label:<9} {label[r.shape]:<8} {ms:>8} {tflops:>8} "
              f"{gbs:>7}  {r.note}")
    print()
    print_lowering()


def print_lowering() -> None:
    print("tl.dot_scaled against e2m1 weights, compiled for each target (no GPU): the matrix instructions")
    for lhs, target, found in lowering():
        print(f"  {lhs:<5} x e2m1  {target:<8} {found}")


if __name__ == "__main__":
    main()
