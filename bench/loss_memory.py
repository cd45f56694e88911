"""Peak memory and time of the large-vocabulary loss head, forward plus backward: the plain loss (the [N, V] logits
materialized by PyTorch, i.e. the blocks' reference) against the sequence-chunked (Liger FLCE, seq_chunked_ce) and
vocabulary-blockwise (CCE, vocab_blockwise_ce) algorithms, written in plain PyTorch in the block modules; on a
CUDA GPU also the promoted Triton operators of both blocks.

    python bench/loss_memory.py                                   # the default sizes
    python bench/loss_memory.py --sizes 1024x32768x1024 --repeats 3

What the figures are. Every (size, method) runs in a fresh Python process. It builds h [N, D], W [V, D] (float32 on
CPU, bfloat16 on a GPU; both requiring gradients) and y [N] (20% ignored), warms the method up on a tiny problem,
then measures one forward + backward (the best of --repeats for the time):
- CPU, "peak": the growth of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over its
  resident set just before the call. It counts every page touched during the call, the gradients dh and dW included
  (they are outputs, the same for every method), and allocator slack; pages allocated but never written are not
  counted. It is the memory the loss costs beyond its inputs, as the operating system sees it.
- GPU, "peak": torch.cuda.max_memory_allocated during the call minus the memory allocated before it (the caching
  allocator's reserve is not counted).
- "time": wall-clock seconds of forward + backward (CUDA synchronized). Ratios are against the plain loss.
The issue's goal at the largest size: chunked peak at most 1/8 of the plain one, in at most 1.5x its time.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SIZES = "1024x32768x1024,4096x65536x1024,8192x131072x1024"
CPU_METHODS = ("plain", "seq_chunked", "vocab_blockwise")
GPU_METHODS = ("plain", "seq_chunked_ce:triton", "vocab_blockwise_ce:triton")
VOCAB_BLOCK = 4096  # vocabulary rows per block of the PyTorch vocab_blockwise path: N x 4096 float32 logits at once
CHUNK_MEM_RATIO = 8  # the PyTorch seq_chunked path's chunk: chunk x V about 8 x N x D (Liger's rule with 8 for 1):
# every chunk re-reads and rewrites the float32 dW accumulator [V, D], so chunks of N x D / V rows (64 tokens at the
# largest default size) spend their time on memory traffic; 8x that still keeps the chunk below the dW accumulator


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for item in filter(None, text.split(",")):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"bad size '{item}': expected NxVxD, e.g. 8192x131072x1024")
        sizes.append(tuple(int(p) for p in parts))
    return sizes


# --- one case, in its own process -----------------------------------------------------------------------------------


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _load_operator(block: str, operators: Path):
    """The run function of the newest promoted operator of ``block``, or None."""
    sys.path.insert(0, str(ROOT))
    from workbench.operators import list_promoted

    promoted = list_promoted(operators, block)
    if not promoted:
        return None
    spec = importlib.util.spec_from_file_location(f"operator_{block}", promoted[0]["path"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run


def _method(name: str, operators: Path):
    sys.path.insert(0, str(ROOT))
    from workbench.blocks._linear_ce import reference
    from workbench.blocks.seq_chunked_ce import chunked_loss, liger_chunk_rows
    from workbench.blocks.vocab_blockwise_ce import blockwise_loss

    if name == "plain":
        return reference
    if name == "seq_chunked":
        return lambda h, W, y, ignore_index, reduction: chunked_loss(
            h, W, y, ignore_index, reduction, liger_chunk_rows(h.shape[0], W.shape[0], h.shape[1], CHUNK_MEM_RATIO))
    if name == "vocab_blockwise":
        return lambda h, W, y, ignore_index, reduction: blockwise_loss(h, W, y, ignore_index, reduction, VOCAB_BLOCK)
    if name.endswith(":triton"):
        return _load_operator(name.removesuffix(":triton"), operators)
    raise SystemExit(f"unknown method {name}")


def _inputs(n: int, v: int, d: int, device: str, dtype, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(device, dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g) * (3 / d ** 0.5)).to(device, dtype).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[torch.randperm(n, generator=g)[: n // 5]] = -100
    return h, w, y.to(device)


def run_case(method: str, n: int, v: int, d: int, device: str, repeats: int, operators: Path) -> dict:
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fn = _method(method, operators)
    if fn is None:
        return {"skipped": "no promoted operator"}
    h, w, y = _inputs(min(n, 64), min(v, 512), min(d, 64), device, dtype, seed=1)  # warm-up: imports, kernels
    fn(h, w, y, -100, "mean").backward()
    h, w, y = _inputs(n, v, d, device, dtype)
    best, peak = float("inf"), 0.0
    for _ in range(repeats):
        h.grad = w.grad = None
        gc.collect()
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as refs:
                refs.write("5")  # reset VmHWM to the current resident set
            before = _status_mib("VmRSS")
        started = time.perf_counter()
        loss = fn(h, w, y, -100, "mean")
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
            grown = (torch.cuda.max_memory_allocated() - before) / 2**20
        else:
            grown = _status_mib("VmHWM") - before
        best = min(best, time.perf_counter() - started)
        peak = max(peak, grown)
        del loss
    return {"peak_mib": peak, "seconds": best}


# --- the table ------------------------------------------------------------------------------------------------------


def _available_mib() -> float:
    with open("/proc/meminfo") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def _plain_need_mib(n: int, v: int, d: int) -> float:
    """What the plain loss needs on CPU, roughly: three float32 [N, V] buffers at the backward's peak (the saved
    log-softmax, its incoming gradient, the logits gradient) plus the float32 inputs and their gradients."""
    return (3 * n * v + 2 * (n + v) * d) * 4 / 2**20


def measure(method: str, size: tuple[int, int, int], device: str, repeats: int, operators: Path,
            timeout: float) -> dict:
    n, v, d = size
    if device == "cpu" and method == "plain" and _plain_need_mib(n, v, d) > 0.9 * _available_mib():
        return {"skipped": f"needs ~{_plain_need_mib(n, v, d) / 1024:.1f} GiB, {_available_mib() / 1024:.1f} free"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", method, f"{n}x{v}x{d}", "--device", device,
           "--repeats", str(repeats), "--operators", str(operators)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"skipped": f"over {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["killed (out of memory?)"])[-1]
        return {"skipped": f"failed: {tail[:80]}"}
    return json.loads(lines[-1])


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated NxVxD (tokens x vocabulary x hidden)")
    parser.add_argument("--repeats", type=int, default=1, help="forward+backward runs per case (best time kept)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one case may take")
    parser.add_argument("--operators", type=Path, default=None, help="promoted operators (default: the workbench's)")
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--case", nargs=2, metavar=("METHOD", "NxVxD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.operators is None:
        sys.path.insert(0, str(ROOT))
        from workbench.config import Settings

        args.operators = Settings.load().operators_dir.resolve()
    if args.case:
        (size,) = parse_sizes(args.case[1])
        print(json.dumps(run_case(args.case[0], *size, args.device, max(1, args.repeats), args.operators)))
        return 0

    import torch

    sizes = parse_sizes(args.sizes)
    devices = [("cpu", CPU_METHODS)] + ([("cuda", GPU_METHODS)] if torch.cuda.is_available() else [])
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    print(f"# {command}")
    print(f"# {platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads)"
          + (f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no CUDA GPU: CPU only"))
    print("# peak: MiB beyond the inputs during forward+backward (CPU: growth of the peak resident set, gradients"
          " included; GPU: max_memory_allocated growth); time: seconds, forward+backward; x plain: ratio to the"
          " plain loss of the same size and device")
    header = f"{'N':>6} {'V':>7} {'D':>5}  {'device':<6} {'method':<26} {'peak MiB':>9} {'x plain':>8} " \
             f"{'time s':>8} {'x plain':>8}  note"
    print(header)
    print("-" * len(header))
    for size in sizes:
        for device, methods in devices:
            plain = None
            for method in methods:
                got = measure(method, size, device, args.repeats, args.operators, args.timeout)
                if method == "plain" and "skipped" not in got:
                    plain = got
                peak, secs = got.get("peak_mib"), got.get("seconds")
                mem_ratio = peak / plain["peak_mib"] if plain and peak is not None and plain["peak_mib"] > 0 else None
                time_ratio = secs / plain["seconds"] if plain and secs is not None else None
                print(f"{size[0]:>6} {size[1]:>7} {size[2]:>5}  {device:<6} {method:<26} {_fmt(peak, '9.0f')} "
                      f"{_fmt(mem_ratio, '8.3f')} {_fmt(secs, '8.2f')} {_fmt(time_ratio, '8.2f')}  "
                      f"{got.get('skipped', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
