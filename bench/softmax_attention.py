"""Softmax attention (the attention block and its serving forms) at Qwen3-Next-80B-A3B's and GPT-OSS-120B's sizes:
modelled on the five targets, and measured against PyTorch SDPA, FlexAttention and (where installed) FlashAttention on
this machine's GPU.

    python bench/softmax_attention.py              # modelled on the five targets (CPU is enough)
    python bench/softmax_attention.py --measure    # and measured on this machine's CUDA GPU, bfloat16

The sizes are the attention entries of bench/cards/ (`workbench onboard qwen3_next` and `workbench onboard gpt_oss`:
the class defaults, which are those models' published configs): the training form at 8192 tokens a step, the packed
prefill of 16 prompts, the decode step of 128 sequences with 4096 tokens cached. Those cards are not among the
workbench's own (workbench/models/), whose sizes every block's model suite takes: this script points
WORKBENCH_MODELS at bench/cards, as `workbench port`, `workbench targets` and `workbench bench` take them.

What the figures are. "modelled": workbench.perf.cost, the roofline floor of the block's work at that shape times
the penalties of the operator's kernels as compiled for the target at those sizes (registers, spills, occupancy); it
does not model how a kernel's tiles use the tensor cores, so a 16 x 16 tile and a 128 x 128 one model alike: the
measured column is the judge. "measured": the median of timed calls with CUDA events (workbench.perf.timing), each
call's outputs checked against the float64 truth; the training form's rows at 4096 tokens (its float64 truth at 8192
tokens and 64 heads would need 34 GB a tensor), forward and forward + backward. A peer without a variant (SDPA: no
sinks, no soft cap; flash-attn: no sinks) is a row naming it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["WORKBENCH_MODELS"] = str(ROOT / "bench" / "cards")

BLOCKS = ("attention", "attention_prefill", "attention_decode")
CARDS = ("qwen3-next-80b-a3b", "gpt-oss-120b")
TARGETS = ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950")
MEASURED_TOKENS = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="also time the operators on this machine's CUDA GPU")
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()

    import torch

    from workbench.blocks import get_block
    from workbench.models import get_model
    from workbench.operators import newest_promoted
    from workbench.perf import bench as perf
    from workbench.verify.harness import target_report

    promoted = newest_promoted(ROOT / "operators")
    rows = []
    for block in BLOCKS:
        if block not in promoted:
            print(f"{block}: no promoted operator, skipped")
            continue
        path = Path(promoted[block]["path"])
        shapes = [s for card in CARDS for s in get_model(card).block_shapes(block)]
        training = get_block(block).grad_inputs != ()
        report = target_report(path, block=block, targets=list(TARGETS), forward_only=not training)
        passes = ("fwd", "fwd+bwd") if training else ("fwd",)  # the serving forms have no backward
        rows += [r for r in perf.modelled_rows(block, shapes, list(TARGETS), report.builds) if r.passes in passes]
        if args.measure and torch.cuda.is_available():
            timed = [{**s, "TQ": MEASURED_TOKENS, "TK": MEASURED_TOKENS} if training else s for s in shapes]
            rows += [r for r in perf.measured_rows(get_block(block), perf.load_operator(path), timed,
                                                   trials=args.trials) if r.passes in passes]
    if args.measure and not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device, so nothing is measured")
    print(f"softmax attention at {' and '.join(CARDS)}'s sizes (python bench/softmax_attention.py"
          f"{' --measure' if args.measure else ''})")
    print(perf.text_table(rows))


if __name__ == "__main__":
    main()
