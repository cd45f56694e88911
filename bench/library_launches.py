"""Triton launches of one training step of each block through the kernels library (workbench.kernels): forward, and
backward before and after the eager backward kept the forward's graph (no second forward).

    TRITON_INTERPRET=1 python bench/library_launches.py                   # every promoted block, on the interpreter
    TRITON_INTERPRET=1 python bench/library_launches.py --blocks rmsnorm,kda
    python bench/library_launches.py                                      # on a GPU (compiled kernels)

What the figures are, per block, on its first smoke shape (workbench.blocks.get_block(name).make_inputs, float32
on the interpreter, bfloat16 on a GPU), every grad input requiring grad, a fixed random upstream gradient per
floating output, after one untimed warm-up step (compiles, autotuning):
"forward": launches of the op's forward with grad; "bwd before": the backward as the library ran it before, the
opaque ``workbench::<block>_backward`` op called directly (it runs the operator's forward again, then its backward:
still torch.compile's path); "bwd after": the eager autograd backward now; "step before" / "step after": forward plus
backward; "operator": forward plus backward through the operator's own autograd.Function (its ``run``), what the
library should launch; "same": the gradients of the two backward paths bitwise equal.
Launches are counted by wrapping the launch entry of Triton's JIT and interpreter kernels (``cls.run``), as the
verifier's Launches.watch does (workbench/verify/worker.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def watch_launches() -> list[int]:
    """A counter of every Triton launch from now on (``count[0]``)."""
    from triton.runtime import jit

    count = [0]
    classes = [jit.JITFunction]
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime import interpreter

        classes.append(interpreter.InterpretedFunction)
    for cls in classes:
        original = cls.run

        def run(kernel, *args, _original=original, **kwargs):
            count[0] += 1
            return _original(kernel, *args, **kwargs)

        cls.run = run
    return count


def measure(block: str, device: str, count: list[int]) -> dict:
    import torch

    import workbench.kernels as wk
    from workbench.blocks import get_block

    op, spec = wk.OPS[block], get_block(block)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    inputs = spec.make_inputs(spec.shapes["smoke"][0], dtype, 0, device)

    def args() -> list:
        return [v.detach().clone().requires_grad_(k in spec.grad_inputs and v.is_floating_point())
                if isinstance(v, torch.Tensor) else v for k, v in inputs.items()]

    def upstream(outputs) -> list:
        g = torch.Generator().manual_seed(1)
        return [torch.randn(o.shape, generator=g).to(o.device, o.dtype) if o.is_floating_point() else None
                for o in outputs]

    def step(fn) -> tuple[int, int, dict]:
        xs = args()
        count[0] = 0
        outputs = fn(*xs)
        outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        forward = count[0]
        pairs = [(o, g) for o, g in zip(outputs, upstream(outputs), strict=True) if g is not None and o.requires_grad]
        leaves = {name: x for name, x in zip(spec.arg_names, xs, strict=True)
                  if isinstance(x, torch.Tensor) and x.requires_grad}
        count[0] = 0
        grads = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs],
                                    allow_unused=True)
        return forward, count[0], dict(zip(leaves, grads, strict=True))

    step(op)  # warm-up
    forward, after, grads_after = step(op)
    run_forward, run_backward, _ = step(op.operator().run)
    xs = args()
    with torch.no_grad():
        outputs = op(*xs)
    outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
    needs = [xs[spec.arg_names.index(name)] is not None for name in spec.grad_inputs]
    count[0] = 0
    grads_before = op.backward_op(upstream(outputs), needs, *xs)
    before = count[0]
    before_by_name = dict(zip(spec.grad_inputs, grads_before, strict=True))
    same = all(torch.equal(grad if grad is not None else torch.zeros_like(before_by_name[name]), before_by_name[name])
               for name, grad in grads_after.items())
    return {"block": block, "forward": forward, "bwd before": before, "bwd after": after,
            "step before": forward + before, "step after": forward + after, "operator": run_forward + run_backward,
            "same": "yes" if same else "NO"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="", help="comma-separated blocks (default: every promoted one)")
    parser.add_argument("--operators", default=str(ROOT / "operators"), help="the operators folder")
    opts = parser.parse_args()

    import torch

    import workbench.kernels as wk
    from workbench.operators import newest_promoted

    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpreting and not torch.cuda.is_available():
        sys.exit("no GPU: run with TRITON_INTERPRET=1 (the Triton interpreter) before anything imports triton")
    device = "cpu" if interpreting else "cuda"
    wk.set_operators_dir(opts.operators)
    promoted = sorted(key for key in newest_promoted(Path(opts.operators)) if ":" not in key and key in wk.OPS)
    blocks = [b.strip() for b in opts.blocks.split(",") if b.strip()] or promoted
    count = watch_launches()
    rows = [measure(block, device, count) for block in blocks]
    columns = list(rows[0])
    print(f"Triton launches per training step through workbench.kernels ({'interpreter' if interpreting else device}"
          f", first smoke shape)\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" if c == "block" else "---:" for c in columns) + "|")
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    total = {c: sum(row[c] for row in rows) for c in columns if isinstance(rows[0][c], int)}
    print("| total | " + " | ".join(str(total.get(c, "")) for c in columns[1:]) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
