"""Attention-family blocks on CPU: per shape, the time of the PyTorch references and of a candidate on the Triton
interpreter (the cost of verifying it), forward plus backward.

    python bench/attention.py                                   # every section, smoke + edge shapes
    python bench/attention.py --block kda --shapes 2,512,2,4,32,32,1 --no-interpreter   # replay-sized references
    python bench/attention.py --block kda --candidate /path/to/kda_chunked_0123456789.py

What the figures are. Inputs come from the block's make_inputs in float32 (seed 0), every floating input requiring
its gradient; one call is the function plus a backward pass of the sum of its outputs; the time is the best of
--repeats (wall clock, seconds) with --threads torch threads. "interp" runs the candidate in a child process with
TRITON_INTERPRET=1 (the interpreter must be chosen before triton is imported): that is what one trial of
`workbench verify` costs the sandbox, per dtype and seed. Without --candidate each template of the block is
rendered at its first point.

Sections (one function per block family; add yours to SECTIONS):
- kda: `reference` (the recurrence, token by token) and `chunked_reference` (the chunked WY form used for replays).
- dsa_indexer, dsa_sparse_attention, attnres: the block's reference (--shapes takes kda's dims only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def best_time(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def forward_backward(fn: Callable, inputs: dict) -> Callable[[], None]:
    """A closure running fn(**inputs) and the backward pass of the sum of its outputs, on fresh leaves each call."""
    import torch

    def call() -> None:
        args = {k: (v.detach().clone().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v)
                for k, v in inputs.items()}
        out = fn(**args)
        outs = out if isinstance(out, tuple) else (out,)
        sum(o.float().sum() for o in outs if o.requires_grad).backward()

    return call


def interpreter_time(candidate: Path, block: str, shape: dict, repeats: int) -> float:
    """Seconds of one forward + backward of the candidate on the interpreter, measured in a child process."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, __file__, "--child", str(candidate), "--block", block, "--shape", json.dumps(shape),
           "--repeats", str(repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"candidate {candidate.name} failed on {shape}: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout.strip().splitlines()[-1])


def child(candidate: str, block: str, shape: dict, repeats: int) -> None:
    import importlib.util

    import torch

    from workbench.blocks import get_block

    spec = importlib.util.spec_from_file_location("candidate", candidate)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    inputs = get_block(block).make_inputs(shape, torch.float32, 0, "cpu")
    call = forward_backward(module.run, inputs)
    call()  # warm-up: the interpreter rewrites each kernel once
    print(best_time(call, repeats))


def rendered_candidates(block: str, folder: Path) -> list[Path]:
    """Each template of the block rendered at its first point, as files in folder."""
    from workbench.blocks import get_block
    from workbench.templating import list_templates

    spec = get_block(block)
    shown = [shape for suite in ("smoke", "edge") for shape in spec.shapes.get(suite, [])]
    paths = []
    for template in list_templates(block):
        point = next((p for p in template.points() if not any(template.unmet(p, s) for s in shown)), None)
        if point is None:
            continue
        path = folder / f"{block}_{template.name}.py"
        path.write_text(template.render(point))
        paths.append(path)
    return paths


def kda_section(shapes: list[dict] | None, candidates: list[Path], repeats: int) -> None:
    import torch

    from workbench.blocks import kda
    from workbench.blocks.base import shape_label

    shapes = shapes or kda.SHAPES["smoke"] + kda.SHAPES["edge"]
    names = [p.stem.removeprefix("kda_") for p in candidates]
    header = f"{'shape':44} {'reference':>10} {'chunked':>10}" + "".join(f" {'interp ' + n:>24}" for n in names)
    print(f"kda: forward + backward, float32, seconds (best of {repeats})")
    print(header)
    for shape in shapes:
        inputs = kda.make_inputs(shape, torch.float32, 0)
        ref = best_time(forward_backward(kda.reference, inputs), repeats)
        chunked = best_time(forward_backward(kda.chunked_reference, inputs), repeats)
        row = f"{shape_label(shape):44} {ref:10.4f} {chunked:10.4f}"
        for path in candidates:
            row += f" {interpreter_time(path, 'kda', shape, repeats):24.3f}"
        print(row, flush=True)


def reference_section(block: str) -> Callable[[list[dict] | None, list[Path], int], None]:
    """A section for a block with one reference: its time per shape, and each candidate's on the interpreter."""

    def section(shapes: list[dict] | None, candidates: list[Path], repeats: int) -> None:
        import torch

        from workbench.blocks import get_block
        from workbench.blocks.base import shape_label

        spec = get_block(block)
        shapes = shapes or spec.shapes["smoke"] + spec.shapes["edge"]
        names = [p.stem.removeprefix(f"{block}_") for p in candidates]
        print(f"{block}: forward + backward, float32, seconds (best of {repeats})")
        print(f"{'shape':44} {'reference':>10}" + "".join(f" {'interp ' + n:>24}" for n in names))
        for shape in shapes:
            inputs = spec.make_inputs(shape, torch.float32, 0, "cpu")
            row = f"{shape_label(shape):44} {best_time(forward_backward(spec.reference, inputs), repeats):10.4f}"
            for path in candidates:
                row += f" {interpreter_time(path, block, shape, repeats):24.3f}"
            print(row, flush=True)

    return section


SECTIONS: dict[str, Callable[[list[dict] | None, list[Path], int], None]] = {
    "kda": kda_section,
    **{block: reference_section(block) for block in ("dsa_indexer", "dsa_sparse_attention", "attnres")},
}
DIMS = {"kda": ("B", "T", "H", "HV", "K", "V", "h0")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", choices=sorted(SECTIONS), action="append", help="sections to run (default: all)")
    parser.add_argument("--shapes", help="';'-separated shapes, each the block's dims comma-separated (kda: "
                        "B,T,H,HV,K,V,h0); default: the smoke and edge suites")
    parser.add_argument("--candidate", action="append", type=Path, help="candidate file(s) to time on the interpreter")
    parser.add_argument("--no-interpreter", action="store_true", help="time the references only")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: the references are "
                        "long chains of small ops, and on a shared machine OpenMP workers oversubscribe the cores)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child, args.block[0], json.loads(args.shape), args.repeats)
        return
    for block in args.block or sorted(SECTIONS):
        shapes = None
        if args.shapes:
            dims = DIMS[block]
            shapes = []
            for text in args.shapes.split(";"):
                values = [int(x) for x in text.split(",")]
                if len(values) != len(dims):
                    raise SystemExit(f"bad shape '{text}' for {block}: expected {','.join(dims)}")
                shapes.append(dict(zip(dims, values, strict=True)))
        with tempfile.TemporaryDirectory() as tmp:
            candidates = [] if args.no_interpreter else (args.candidate or rendered_candidates(block, Path(tmp)))
            SECTIONS[block](shapes, candidates, args.repeats)


if __name__ == "__main__":
    main()
