"""KDA's serving forms (kda_decode, kda_prefill) over vLLM's state cache. vLLM keeps a KDA layer's recurrent state as
[slot, H, V, K] (``vllm/models/kimi_k3``: fused_recurrent_kda's state), fla and our kda's final state as K x V. The
operators take the state in any strides, so vLLM's cache is read and written in place through its transposed view;
the alternative is a transpose at the boundary: copy every slot's state to K x V before the call and back after it.

    python bench/kda_state_layout.py            # modelled on the five targets (CPU is enough)
    python bench/kda_state_layout.py --measure  # and measured on this machine's CUDA GPU

At Kimi K3's sizes (96 heads of 128, a decode batch of 128 sequences in 128 slots; a prefill of 8192 tokens in 16
prompts), per layer and call: the promoted operator compiled for each target at each layout (registers, spilled bytes
per thread), its modelled time (workbench.perf.cost: the roofline floor of the block's bytes and flops, times the
penalties the compiled kernels earn), and for the transpose the same call plus the copies' traffic (the state read and
written twice more) at the target's HBM bandwidth. Modelled figures count bytes, not access patterns: that a V x K
tile is loaded with a stride is not in them; --measure times both layouts on a GPU (CUDA events, each output
checked).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGETS = ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950")
K3 = {"H": 96, "HV": 96, "K": 128, "V": 128}
SHAPES = {"kda_decode": {"N": 128, "SLOTS": 128, **K3}, "kda_prefill": {"TOTAL": 8192, "S": 16, "SLOTS": 128, **K3}}
STATE_BYTES = 4  # float32


def builds_at(block: str, path: Path, shape: dict) -> list[dict]:
    """The operator's kernels compiled for the five targets at ``shape`` alone."""
    from workbench.verify.harness import target_report

    return [b for b in target_report(path, block=block, targets=list(TARGETS), shapes=[shape]).builds
            if b["suite"] == "model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="also time both layouts on this machine's CUDA GPU")
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()

    from workbench.backends import TARGETS as SPECS
    from workbench.blocks import get_block
    from workbench.operators import newest_promoted
    from workbench.perf import bench as perf
    from workbench.perf import cost

    promoted = newest_promoted(ROOT / "operators")
    print("KDA's state cache: vLLM's V x K in place, K x V, or a transpose at the boundary (python "
          f"bench/kda_state_layout.py{' --measure' if args.measure else ''}); Kimi K3's sizes, one layer, modelled")
    print(f"{'block':<12} {'target':<8} {'layout':<22} {'regs':>5} {'spill B':>8} {'ms':>9}  note")
    for block, base in SHAPES.items():
        if block not in promoted:
            print(f"{block}: no promoted operator, skipped")
            continue
        path = Path(promoted[block]["path"])
        state = base["SLOTS"] * base["HV"] * base["K"] * base["V"] * STATE_BYTES
        per_layout = {vk: builds_at(block, path, {**base, "vk": vk}) for vk in (1, 0)}
        for target in TARGETS:
            for vk, name in ((1, "V x K in place (vLLM)"), (0, "K x V")):
                shape = {**base, "vk": vk}
                builds = [b for b in per_layout[vk] if b["target"] == target]
                estimate = cost.estimate(block, shape, target, builds, backward=False)
                regs = max((b.get("registers") or 0 for b in builds), default=0)
                spills = max((b.get("spilled_bytes") or 0 for b in builds), default=0)
                ms = "-" if estimate.time_s is None else f"{estimate.time_s * 1e3:9.3f}"
                print(f"{block:<12} {target:<8} {name:<22} {regs:>5} {spills:>8} {ms:>9}  "
                      f"{'; '.join(estimate.penalties)}")
            kxv = cost.estimate(block, {**base, "vk": 0}, target, per_layout[0], backward=False)
            copies = 4 * state / SPECS[target].peaks.hbm_bytes_s  # to K x V and back: read and write twice
            if kxv.time_s is not None:
                print(f"{block:<12} {target:<8} {'transpose at boundary':<22} {'':>5} {'':>8} "
                      f"{(kxv.time_s + copies) * 1e3:9.3f}  K x V plus {4 * state / 1e9:.2f} GB of copies")
        if args.measure:
            import torch

            if not torch.cuda.is_available():
                print("no GPU: torch sees no CUDA device, so nothing is measured")
                continue
            shapes = [{**base, "vk": vk} for vk in (1, 0)]
            for row in perf.measured_rows(get_block(block), perf.load_operator(path), shapes, trials=args.trials,
                                          subjects=["operator"]):
                print(f"{block:<12} {'cuda':<8} {row.shape:<40} measured {row.time_ms:.3f} ms")


if __name__ == "__main__":
    main()
