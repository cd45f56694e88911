"""Seconds per training step of the replay model: every block on its reference, each promoted operator alone in its
block's place (the others on their references), and every promoted operator at once. On a CPU the operators run in
the Triton interpreter, which executes each program instance of a grid in Python: the table says which operators a
CPU replay spends its time in.

    python bench/replay_speed.py                       # tiny preset, scratch, 3 steps per row
    python bench/replay_speed.py --mode lora --steps 2
    python bench/replay_speed.py --preset small        # on a GPU

What the figures are. Each row is one training process (workbench.replay.child, the backend's environment) that
trains --steps steps from the same seed; "s/step" is its wall time over the steps (the first step included: the
interpreter has no compile cache to warm), not counting process start and imports. "x ref" is the ratio to the
all-reference row; "final loss" lets the rows be compared (equal to the reference's within the replay's band).
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--mode", default="scratch", choices=("scratch", "lora"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", default="kimi-k3.1-pro")
    parser.add_argument("--operators", default=str(ROOT / "operators"))
    args = parser.parse_args()

    from workbench.backends import get_backend
    from workbench.config import Settings
    from workbench.replay.arch import architecture
    from workbench.replay.ops import REFERENCE, reference_ops, resolve_ops
    from workbench.replay.presets import get_preset
    from workbench.replay.references import ensure_base
    from workbench.replay.supervise import launch, training_job

    settings = Settings(db_url="sqlite://", operators_dir=Path(args.operators), work_dir=ROOT / ".workbench",
                        replays_dir=ROOT / "replays")
    preset, backend = get_preset(args.preset), get_backend()
    arch = architecture(args.model, preset.layers)
    base = ensure_base(settings, args.model, preset, arch, backend, 3600.0) if args.mode == "lora" else None
    reference = reference_ops(arch.blocks)
    promoted = resolve_ops(["promoted"], settings.operators_dir, arch.blocks)
    rows = [("every block on its reference", reference)]
    rows += [(f"{block}: {Path(path).name}", {**reference, block: path})
             for block, path in promoted.items() if path != REFERENCE]
    rows.append(("every promoted operator", promoted))

    print(f"$ python {' '.join(shlex.quote(a) for a in sys.argv)}")
    print(f"{args.model}, preset {preset.name} ({arch.layers}, D {preset.hidden}, V {preset.vocab}, "
          f"{preset.tokens_per_step} tokens a step), mode {args.mode}, {args.steps} steps a row, "
          f"backend {backend.name}, {platform.processor() or platform.machine()}")
    print(f"{'ops':72s} {'s/step':>8s} {'x ref':>8s} {'final loss':>11s}")
    ref_seconds = None
    for label, ops in rows:
        job = training_job("train", preset, arch, args.mode, args.steps, 0, ops, backend, base)
        result = launch(job, backend, 3600.0)
        ref_seconds = ref_seconds or result.seconds_per_step
        print(f"{label:72s} {result.seconds_per_step:8.3f} {result.seconds_per_step / ref_seconds:8.1f} "
              f"{result.curve[-1]:11.5f}", flush=True)


if __name__ == "__main__":
    main()
