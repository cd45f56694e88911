"""A timing protocol that cannot flatter: warm-up calls first; before each timed call fresh clones of the inputs
(no result reused from a previous call's buffers) and a flushed L2 (a write of a buffer larger than any target's
L2); the call alone between two events of the device's clock; every timed call's outputs checked against the
reference; the median and spread of the trials reported, never the best.

The clock is an interface (``Clock``): CUDA events on a GPU (``CudaClock``); a faithful CPU stand-in
(``WallClock``, perf_counter and no cache to flush) for the protocol's own tests."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

L2_FLUSH_BYTES = 256 * 2**20  # more than the L2 of every target (H200 50 MB, B200 126 MB, MI300X 256 MB of MALL)


class Clock:
    """start(); stop() -> milliseconds since start; flush(): evict the caches; peak_bytes() since reset()."""

    def reset(self) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> float: ...

    def flush(self) -> None: ...

    def peak_bytes(self) -> int | None:
        return None


class CudaClock(Clock):
    """CUDA events around the call (the device's own clock), the L2 flushed by zeroing a 256 MB buffer."""

    def __init__(self, device: torch.device):
        self.device = device
        self.scratch = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def start(self) -> None:
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end)

    def flush(self) -> None:
        self.scratch.zero_()

    def peak_bytes(self) -> int | None:
        return torch.cuda.max_memory_allocated(self.device)


class WallClock(Clock):
    """perf_counter on the host: the CPU stand-in (no caches it could flush, so flush only counts its calls)."""

    def __init__(self):
        self.flushes = 0
        self.began = 0.0

    def start(self) -> None:
        self.began = time.perf_counter()

    def stop(self) -> float:
        return (time.perf_counter() - self.began) * 1e3

    def flush(self) -> None:
        self.flushes += 1


@dataclass
class Timing:
    """Milliseconds of every timed trial; median and spread (the interquartile range) of them."""

    trials_ms: list[float] = field(default_factory=list)
    peak_bytes: int | None = None

    @property
    def median_ms(self) -> float:
        return statistics.median(self.trials_ms)

    @property
    def spread_ms(self) -> float:
        if len(self.trials_ms) < 4:
            return max(self.trials_ms) - min(self.trials_ms)
        q = statistics.quantiles(self.trials_ms, n=4)
        return q[2] - q[0]


def _fresh(inputs: dict, grad_names: tuple[str, ...], backward: bool) -> dict:
    fresh = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if backward and name in grad_names and value.is_floating_point():
                value.requires_grad_(True)
        fresh[name] = value
    return fresh


def time_calls(fn: Callable[..., object], inputs: dict, arg_names: tuple[str, ...], clock: Clock, *,
               check: Callable[[object, dict], None], grad_names: tuple[str, ...] = (), backward: bool = False,
               warmup: int = 3, trials: int = 20) -> Timing:
    """Time ``fn(*inputs[arg_names])`` (and its backward when ``backward``, with ones as upstream gradients)
    ``trials`` times after ``warmup`` calls. check(outputs, fresh_inputs) raises when a timed call's result is
    wrong (its gradients are on the fresh inputs' .grad); nothing of a wrong call is reported."""
    if trials < 1:
        raise ValueError("trials must be at least 1")

    def call(fresh: dict):
        out = fn(*[fresh[n] for n in arg_names])
        if backward:
            outs = [o for o in (out if isinstance(out, tuple | list) else (out,))
                    if isinstance(o, torch.Tensor) and o.requires_grad]
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        return out

    for _ in range(warmup):
        call(_fresh(inputs, grad_names, backward))
    timing = Timing()
    clock.reset()
    for _ in range(trials):
        fresh = _fresh(inputs, grad_names, backward)
        clock.flush()
        clock.start()
        out = call(fresh)
        timing.trials_ms.append(clock.stop())
        check(out, fresh)
    timing.peak_bytes = clock.peak_bytes()
    return timing
