"""What a replay catches: operators with a known defect (workbench.replay.faults) replayed one at a time, every other
block on its reference, against the reference curve; the table gives each one's verdict, the step where its curve
left the band, its largest deviation and what the parameter and top-k checks saw.

    python bench/replay_sensitivity.py                         # tiny preset, scratch, the preset's steps
    python bench/replay_sensitivity.py --preset small          # on a GPU

Replays run as `workbench replay` runs them (a training process each, the reference recorded once in a scratch
store). A gradient scaled uniformly for a parameter that no other path feeds (e.g. the AttnRes pseudo-query) leaves
AdamW's update unchanged, so the replay cannot see it, and training does not care: that row is expected to pass.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from workbench.config import Settings
from workbench.replay.faults import FLOAT64, GRAD_SCALED, ROUNDED_UP, write_op
from workbench.replay.runner import run_replay

ROOT = Path(__file__).resolve().parent.parent
CASES = [  # (block, what, template, fields)
    ("attnres", "d sources x 0.98", GRAD_SCALED, {"index": 0, "factor": 0.98}),
    ("attnres", "d query x 0.98", GRAD_SCALED, {"index": 1, "factor": 0.98}),
    ("rmsnorm", "d x x 0.98", GRAD_SCALED, {"index": 0, "factor": 0.98}),
    ("kda", "d v x 0.98", GRAD_SCALED, {"index": 2, "factor": 0.98}),
    ("kda", "d g x 0.98", GRAD_SCALED, {"index": 3, "factor": 0.98}),
    ("moe_grouped_gemm", "d x x 0.98", GRAD_SCALED, {"index": 0, "factor": 0.98}),
    ("moe_combine", "d y x 0.98", GRAD_SCALED, {"index": 0, "factor": 0.98}),
    ("moe_combine", "d weights x 0.98", GRAD_SCALED, {"index": 1, "factor": 0.98}),
    ("vocab_blockwise_ce", "d h x 0.98", GRAD_SCALED, {"index": 0, "factor": 0.98}),
    ("attnres", "output rounded up to 8 bits", ROUNDED_UP, {"bits": 8}),
    ("kda", "output rounded up to 8 bits", ROUNDED_UP, {"bits": 8}),
    ("situ", "output rounded up to 8 bits", ROUNDED_UP, {"bits": 8}),
    ("attnres", "exact, float64 inside", FLOAT64, {}),
    ("kda", "exact, float64 inside", FLOAT64, {}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--mode", default="scratch", choices=("scratch", "lora"))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--model", default="kimi-k3.1-pro")
    args = parser.parse_args()
    print(f"$ python {' '.join(shlex.quote(a) for a in sys.argv)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        settings = Settings(db_url=f"sqlite:///{folder / 'bench.db'}", operators_dir=folder / "operators",
                            work_dir=folder / "home", replays_dir=ROOT / "replays")
        print(f"{'block':20s} {'defect':30s} {'verdict':8s} {'left at':>8s} {'max dev':>9s} {'params':>9s} "
              f"{'top-k':>9s}")
        for block, what, template, fields in CASES:
            path = write_op(folder, f"{block}_{len(list(folder.glob('*.py')))}", template, block=block, **fields)
            outcome = run_replay(args.model, args.mode, settings, preset=args.preset, steps=args.steps,
                                 ops=["reference", f"{block}={path}"])
            c = outcome.checks
            left = "-" if outcome.left_band_step is None else str(outcome.left_band_step)
            print(f"{block:20s} {what:30s} {outcome.status:8s} {left:>8s} "
                  f"{c['band']['max_relative_deviation']:9.1e} {c['parameters']['worst_error']:9.1e} "
                  f"{c['eval_topk']['worst_logprob_error']:9.1e}", flush=True)


if __name__ == "__main__":
    main()
