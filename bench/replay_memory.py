"""Selective caching of the replay model's activations: peak device-tier bytes and the traffic between the tiers,
training with and without ``--cache <blocks>:host`` (workbench.replay.tiers), every block on its reference.

    python bench/replay_memory.py                                   # small preset, 2 steps, the default blocks
    python bench/replay_memory.py --preset tiny --steps 4 --cache moe_grouped_gemm,kda:host

What the figures are. Both runs train in this process from the same seed. Every catalog block's call runs under a
saved_tensors_hooks pair that counts what it saves for backward: "device peak" is the largest total of saved bytes
held in the device tier at once (each saved tensor counted once per save; parameters and views of them not
counted: they are not activations), "host peak" the same for the host tier, "to host" / "to device" the bytes
copied between them over the run (a saved tensor comes back only if its backward runs). On a CPU both tiers are
host memory, kept apart and accounted as two pools; on a GPU the device tier is HBM and the host tier pinned host
memory, and the table also gives torch.cuda.max_memory_allocated. "identical" says whether the curve, the trained
parameters' fingerprints and the eval top-k equal the uncached run's bit for bit. Glue between blocks (projections
written in plain torch) is outside every block and not counted.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = "moe_grouped_gemm,kda,attnres,mla,dsa_sparse_attention,vocab_blockwise_ce:host"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--model", default="kimi-k3.1-pro")
    parser.add_argument("--cache", default=DEFAULT_CACHE)
    args = parser.parse_args()

    import torch

    from workbench.backends import get_backend
    from workbench.replay.arch import architecture
    from workbench.replay.ops import load_ops, reference_ops
    from workbench.replay.presets import get_preset
    from workbench.replay.tiers import Tiers, cached_ops, parse_cache
    from workbench.replay.train import train

    preset, device = get_preset(args.preset), get_backend().device
    arch = architecture(args.model, preset.layers)
    blocks = tuple(b for b in args.cache.rpartition(":")[0].split(",") if b in arch.blocks)
    cache = parse_cache(",".join(blocks) + ":host", arch.blocks)
    print(f"# {shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])}")
    print(f"# {args.model} {preset.name} scratch, {args.steps} steps on {device}; torch {torch.__version__}; "
          f"{platform.machine()}; cached blocks: {', '.join(cache)}")
    rows, runs = [], {}
    for label, chosen in (("no caching", ()), ("cached to host", cache)):
        tiers = Tiers()
        ops = cached_ops(load_ops(reference_ops(arch.blocks)), chosen, tiers, account=True)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        runs[label] = train(preset, arch, "scratch", args.steps, 0, ops, device)
        seconds = time.perf_counter() - start
        cuda_peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
        rows.append((label, tiers.figures(), seconds, cuda_peak))
    plain = runs["no caching"]
    print(f"{'run':16} {'device peak':>14} {'host peak':>14} {'to host':>14} {'to device':>14} {'s':>7} "
          f"{'cuda peak':>14} identical")
    for label, f, seconds, cuda_peak in rows:
        run = runs[label]
        same = (run.curve, run.fingerprints, run.topk_values, run.topk_ids) == \
            (plain.curve, plain.fingerprints, plain.topk_values, plain.topk_ids)
        print(f"{label:16} {f['peak_device_bytes']:>14,} {f['peak_host_bytes']:>14,} {f['to_host_bytes']:>14,} "
              f"{f['to_device_bytes']:>14,} {seconds:>7.1f} {cuda_peak or '-':>14} {same}")
    print(f"# final loss {plain.curve[-1]:.6f}")


if __name__ == "__main__":
    main()
