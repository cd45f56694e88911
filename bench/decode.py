"""The serving forms' decode step at batch 1, 32 and 128, at Kimi K3.1 Pro's sizes (its card's entries, the batch
replaced): the time of one step (one token for each of the batch's sequences) and per token, for each promoted decode
operator.

    python bench/decode.py                 # modelled on the five targets (CPU is enough)
    python bench/decode.py --measure       # and measured on this machine's CUDA GPU, bfloat16: the operator, the
                                           # eager reference and the installed peers (fla's fused_recurrent_kda)

What the figures are. "modelled": workbench.perf.cost, the roofline floor of the block's work at that shape times the
penalties of the operator's kernels as compiled for the target at the model suite (spills, occupancy); the model
does not count how many programs a launch has, so at batch 1 (mla_decode's head_tiled launches cdiv(96, 16) = 6
programs; kda_decode's v_tiled 96 x 4) it is a floor the kernel cannot reach on a GPU of 132 SMs. "measured": the
median of timed calls with CUDA events (workbench.perf.timing), each call's outputs checked against the float64
truth. mla_decode's, dsa_indexer_decode's and dsa_decode's sequences hold the card's decode context (4096 tokens, in
pages of 64); the indexer scores all of them and selects 2048, which dsa_decode attends to (a DSA layer's step is the
two).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BLOCKS = ("kda_decode", "kda_short_conv_decode", "mla_decode", "dsa_indexer_decode", "dsa_decode")
BATCHES = (1, 32, 128)
TARGETS = ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950")


def shapes_at(block: str, card) -> list[dict]:
    """The card's shape of ``block`` with the batch (N, and the cache's slots where it has them) at each of
    BATCHES."""
    (shape,) = card.blocks[block]["shapes"]
    return [{**shape, "N": n, **({"SLOTS": n} if "SLOTS" in shape else {})} for n in BATCHES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="also time the operators on this machine's CUDA GPU")
    parser.add_argument("--model", default="kimi-k3.1-pro")
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()

    import torch

    from workbench.blocks import get_block
    from workbench.models import get_model
    from workbench.operators import newest_promoted
    from workbench.perf import bench as perf
    from workbench.verify.harness import target_report

    card, promoted = get_model(args.model), newest_promoted(ROOT / "operators")
    rows = []
    for block in BLOCKS:
        if block not in promoted:
            print(f"{block}: no promoted operator, skipped")
            continue
        path, shapes = Path(promoted[block]["path"]), shapes_at(block, card)
        report = target_report(path, block=block, targets=list(TARGETS), forward_only=True)
        rows += [r for r in perf.modelled_rows(block, shapes, list(TARGETS), report.builds) if r.passes == "fwd"]
        if args.measure:
            rows += [r for r in perf.measured_rows(get_block(block), perf.load_operator(path), shapes,
                                                   trials=args.trials) if r.passes == "fwd"]
    if args.measure and not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device, so nothing is measured")
    print(f"decode step at batch {', '.join(map(str, BATCHES))} ({args.model}'s sizes; python bench/decode.py"
          f"{' --measure' if args.measure else ''})")
    print(f"{'block':<22} {'subject':<28} {'target':<8} {'label':<9} {'N':>4} {'step us':>9} {'us/token':>9} "
          f"{'floor us':>9}  note")
    for r in rows:
        n = int(dict(kv.split("=") for kv in r.shape.split(","))["N"])
        step = "-" if r.time_ms is None else f"{r.time_ms * 1e3:9.2f}"
        per_token = "-" if r.time_ms is None else f"{r.time_ms * 1e3 / n:9.3f}"
        print(f"{r.block:<22} {r.subject:<28} {r.target:<8} {r.label:<9} {n:>4} {step:>9} {per_token:>9} "
              f"{r.floor_ms * 1e3:9.2f}  {r.note}")


if __name__ == "__main__":
    main()
