"""The cost model: what a block must move and compute at a shape, what each target can do, the roofline floor, and
the penalties of what the compiler reported for an operator. It needs no GPU and measures nothing: every time it
gives is modelled, and is labelled so wherever it is shown (``MODELLED``).

Work per block (``WORK``), written from the block's math in ``workbench/blocks/``:
    bytes: compulsory HBM traffic, each input read once and each output written once (the backward reads the
        inputs and upstream gradients, writes the input gradients); bf16 tensors unless the block keeps float32
        (gates, states, scores) or int64 (indices);
    tensor_flops: matrix products, 2 per multiply-add (the tensor cores' work);
    vector_flops: elementwise work large enough to matter against the target's vector peak.
The forward+backward figures are the sum of both passes.

Penalties, from the model-suite builds of an operator on a target (``workbench.verify.aot.KernelBuild``):
    a build that fails or cannot be resident: the operator does not run there (no time);
    a dot kernel without tensor-core instructions: its matrix work at the vector (FMA) peak;
    spilled bytes per thread: time x (1 + spilled / register bytes per thread), at most x5;
    occupancy: fewer resident warps per SM than the roof needs to hide memory latency (a quarter of the SM's
        warps for a memory-bound block, an eighth for a compute-bound one, which hides latency in its tiles) slow
        the kernel by need / resident, at most x4; a dot kernel's warps count once per pipelined load in flight
        (num_stages - 1);
    the two multiply, per kernel, and the dominant kernel's product applies.
Not modelled: idle SMs of a grid smaller than the machine, wave quantization, and L2 reuse (the floor assumes
every input is read from HBM once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from workbench.backends import TARGETS

MODELLED = "modelled"  # the label every figure of this module carries where it is shown
BF16, F32, I64 = 2, 4, 8  # bytes per element
SPILL_PENALTY_CAP = 5.0
OCCUPANCY_NEED = {"memory": 1 / 4, "compute": 1 / 8}  # share of the SM's resident warps the roof needs
OCCUPANCY_PENALTY_CAP = 4.0


@dataclass(frozen=True)
class Work:
    """What one pass of a block must do at one shape."""

    bytes: float
    tensor_flops: float = 0.0
    vector_flops: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.bytes + other.bytes, self.tensor_flops + other.tensor_flops,
                    self.vector_flops + other.vector_flops)


@dataclass(frozen=True)
class Peaks:
    """A target's public peak figures (one GPU, dense, no sparsity): HBM bytes/s, bf16 tensor FLOP/s, fp32 vector
    FLOP/s, SMs (CUs on AMD), and where each number comes from."""

    device: str
    hbm_bytes_s: float
    bf16_flops: float
    fp32_flops: float
    sms: int
    source: str


PEAKS: dict[str, Peaks] = {
    "sm_80": Peaks("A100 SXM 80GB", 2.039e12, 312e12, 19.5e12, 108,
                   "NVIDIA A100 Tensor Core GPU data sheet (2.039 TB/s HBM2e, BF16 312 TFLOPS, FP32 19.5); "
                   "A100 architecture whitepaper (108 SMs)"),
    "sm_90a": Peaks("H200 SXM", 4.8e12, 989e12, 67e12, 132,
                    "NVIDIA H200 Tensor Core GPU data sheet (4.8 TB/s HBM3e, BF16 989 TFLOPS dense, TF32 494, "
                    "FP32 67); H100 whitepaper (132 SMs)"),
    "sm_100a": Peaks("B200", 8.0e12, 2250e12, 80e12, 148,
                     "NVIDIA DGX B200 / HGX B200 data sheet, per GPU (8 TB/s HBM3e, BF16 2.25 PFLOPS dense, "
                     "FP32 80 TFLOPS); Blackwell architecture brief (148 SMs)"),
    "gfx942": Peaks("MI300X", 5.3e12, 1307.4e12, 163.4e12, 304,
                    "AMD Instinct MI300X data sheet (5.3 TB/s HBM3, BF16 1307.4 TFLOPS dense, TF32 653.7, "
                    "FP32 vector 163.4, 304 CUs)"),
    "gfx950": Peaks("MI355X", 8.0e12, 2516.6e12, 157.3e12, 256,
                    "AMD Instinct MI355X data sheet (8 TB/s HBM3E, BF16 2.5 PFLOPS dense, FP32 vector 157.3 "
                    "TFLOPS, 256 CUs)"),
}


# --- work per block: (forward, backward) at a shape ---------------------------------------------------------------

def _rmsnorm(s):
    rows, n = s["rows"], s["N"]
    return Work(BF16 * (2 * rows * n + n) + F32 * rows), Work(BF16 * (3 * rows * n + 2 * n) + F32 * rows)


def _gated_activation(s):  # swiglu's a, b [rows, N] or situ's gate_up [rows, 2N] -> y [rows, N]
    e = s["rows"] * s["N"]
    return Work(BF16 * 3 * e), Work(BF16 * 5 * e)


def _attnres(s):  # sources [L, N, D] -> h [N, D], p [N, L]: a softmax over L of the sources' scores, their mix
    lnd, nd, nl = s["L"] * s["N"] * s["D"], s["N"] * s["D"], s["N"] * s["L"]
    return Work(BF16 * (lnd + nd + nl), vector_flops=4 * lnd), \
        Work(BF16 * (2 * lnd + nd + nl), vector_flops=8 * lnd)


def _kda_gate(s):  # f [B, T, H, K] bf16 -> g float32
    e = s["B"] * s["T"] * s["H"] * s["K"]
    return Work((BF16 + F32) * e), Work((2 * BF16 + F32) * e)


def _kda_short_conv(s):  # x [B, T, D], weight [D, W] -> y [B, T, D]
    e, dw = s["B"] * s["T"] * s["D"], s["D"] * s["W"]
    return Work(BF16 * (2 * e + dw), vector_flops=2 * e * s["W"]), \
        Work(BF16 * (3 * e + 2 * dw), vector_flops=4 * e * s["W"])


KDA_CHUNK = 64  # the chunk length of the chunked form the FLOPs are counted for (fla's chunk_kda)


def _kda(s):
    """Per token and value head, the chunked form with chunk C: the intra-chunk products k k^T and q k^T (2CK
    each), w = T (k e^g) (2CK), u = T v and the chunk's attention output (2CV each), and the state passes
    u - w S, q S, S + k^T u (2KV each). The backward does two products per forward product."""
    tokens_heads = s["B"] * s["T"] * s["HV"]
    k, v, c = s["K"], s["V"], KDA_CHUNK
    flops = tokens_heads * (6 * k * v + 6 * c * k + 4 * c * v)
    qk = 2 * s["B"] * s["T"] * s["H"] * k
    vg = s["B"] * s["T"] * s["HV"] * (v + k + 1)
    state = F32 * s["B"] * s["HV"] * k * v
    inputs = BF16 * (qk + vg) + state * s.get("h0", 1)
    outputs = BF16 * s["B"] * s["T"] * s["HV"] * v + state
    return Work(inputs + outputs, flops), Work(2 * inputs + outputs, 2 * flops)


def _lora_linear(s):  # x [N, IN], W [OUT, IN], A [r, IN], B [OUT, r] -> y = x W^T + scaling x A^T B^T
    n, i, o, r = s["N"], s["IN"], s["OUT"], s["r"]
    params = o * i + r * (i + o)
    fwd = Work(BF16 * (n * i + params + n * o), 2 * n * o * i + 2 * n * r * (i + o))
    # dx = dy W + (dy B) A, dA, dB: the frozen W gets no gradient
    bwd = Work(BF16 * (n * o + n * i + params + n * i + r * (i + o)), 2 * n * o * i + 6 * n * r * (i + o))
    return fwd, bwd


def _mla(s):
    """Causal attention from the kv latent: k_nope and v from c_kv by the per-head up-projections (2 T R (DN+DV)
    per head), then attention over half the T^2 pairs of (DN+DR)-wide keys and DV-wide values."""
    b, t, h, r = s["B"], s["T"], s["H"], s["R"]
    dn, dr, dv = s["DN"], s["DR"], s["DV"]
    up = 2 * b * t * h * r * (dn + dv)
    attn = 2 * b * h * t * t // 2 * (dn + dr + dv)
    inputs = BF16 * (b * t * h * (dn + dr) + b * t * (r + dr) + h * r * (dn + dv) + s.get("gated", 0) * b * t * h * dv)
    outputs = BF16 * b * t * h * dv
    return Work(inputs + outputs, up + attn), Work(2 * inputs + outputs, 2 * up + int(2.5 * attn))


def _dsa_indexer(s):  # q_idx [B, T, HI, DI], k_idx [B, T, DI], w [B, T, HI] -> scores [B, T, T] f32, top-k int64
    b, t, hi, di = s["B"], s["T"], s["HI"], s["DI"]
    inputs = BF16 * (b * t * hi * di + b * t * di + b * t * hi)
    fwd = Work(inputs + F32 * b * t * t + I64 * b * t * s["topk"], 2 * b * t * t * hi * di)
    return fwd, Work(F32 * b * t * t + inputs * 2, 4 * b * t * t * hi * di)


def _dsa_sparse_attention(s):  # each query attends to its topk selected keys (keys D wide, values DV)
    b, t, h, hkv, d, k = s["B"], s["T"], s["H"], s["HKV"], s["D"], s["topk"]
    dv = s.get("DV", d)
    inputs = BF16 * (b * t * h * (d + dv * s.get("gated", 0)) + b * t * hkv * (d + dv)) + I64 * b * t * k
    outputs = BF16 * b * t * h * dv
    flops = 2 * b * t * k * h * (d + dv)
    return Work(inputs + outputs, flops), Work(2 * inputs + outputs, int(2.5 * flops))


def _moe_permute(s):  # x [N, D] -> x_perm [N k, D] and the index maps
    nk = s["N"] * s["k"]
    return Work(BF16 * (s["N"] * s["D"] + nk * s["D"]) + I64 * 3 * nk), \
        Work(BF16 * (nk * s["D"] + s["N"] * s["D"]) + I64 * nk)


def _moe_combine(s):  # y [N k, D], weights [N, k] -> out [N, D]
    nk = s["N"] * s["k"]
    return Work(BF16 * (nk * s["D"] + s["N"] * s["D"]) + (F32 + I64) * nk, vector_flops=2 * nk * s["D"]), \
        Work(BF16 * (s["N"] * s["D"] + 2 * nk * s["D"]) + (2 * F32 + I64) * nk, vector_flops=4 * nk * s["D"])


def _moe_grouped_gemm(s):  # rows x [N k, D]; per expert w1, w3 [F, D], w2 [D, F]; the experts all routed to
    rows, d, f, e = s["N"] * s["k"], s["D"], s["F"], s["E"]
    weights = 3 * e * f * d
    flops = 6 * rows * d * f
    return Work(BF16 * (2 * rows * d + weights), flops), Work(BF16 * (3 * rows * d + 2 * weights), 2 * flops)


def _moe_router(s):  # x [N, D], weight [E, D] -> scores, top-k
    n, d, e = s["N"], s["D"], s["E"]
    fwd = Work(BF16 * (n * d + e * d) + (F32 + I64) * n * s["k"], 2 * n * d * e)
    return fwd, Work(BF16 * (n * d + e * d) * 2 + F32 * n * e, 4 * n * d * e)


def _linear_ce(s):  # h [N, D], W [V, D], labels -> a scalar loss; the logits are never written
    n, v, d = s["N"], s["V"], s["D"]
    fwd = Work(BF16 * (n * d + v * d) + I64 * n, 2 * n * v * d)
    return fwd, Work(BF16 * 2 * (n * d + v * d) + I64 * n, 4 * n * v * d)


WORK: dict[str, Callable[[Mapping[str, int]], tuple[Work, Work]]] = {
    "attnres": _attnres, "dsa_indexer": _dsa_indexer, "dsa_sparse_attention": _dsa_sparse_attention, "kda": _kda,
    "kda_gate": _kda_gate, "kda_short_conv": _kda_short_conv, "lora_linear": _lora_linear, "mla": _mla,
    "moe_combine": _moe_combine, "moe_grouped_gemm": _moe_grouped_gemm, "moe_permute": _moe_permute,
    "moe_router": _moe_router, "rmsnorm": _rmsnorm, "seq_chunked_ce": _linear_ce, "situ": _gated_activation,
    "swiglu": _gated_activation, "vocab_blockwise_ce": _linear_ce,
}


def work(block: str, shape: Mapping[str, int], *, backward: bool = True) -> Work:
    """The block's work at ``shape``: the forward, plus the backward unless ``backward`` is False."""
    if block not in WORK:
        raise KeyError(f"no cost model for block '{block}' (has: {', '.join(sorted(WORK))})")
    fwd, bwd = WORK[block](shape)
    return fwd + bwd if backward else fwd


def floor_s(w: Work, peaks: Peaks, *, tensor_cores: bool = True) -> float:
    """The roofline floor in seconds: the slowest of moving the bytes at HBM bandwidth, the matrix work at the
    bf16 tensor peak (the fp32 vector peak without tensor cores) and the vector work at the fp32 peak."""
    matrix_peak = peaks.bf16_flops if tensor_cores else peaks.fp32_flops
    return max(w.bytes / peaks.hbm_bytes_s, w.tensor_flops / matrix_peak, w.vector_flops / peaks.fp32_flops)


@dataclass(frozen=True)
class Estimate:
    """One operator at one shape on one target. time_s None: it does not run there (``penalties`` says why).
    fraction: floor / time, the share of the target's roofline the model expects it to reach."""

    target: str
    floor_s: float
    time_s: float | None
    bound: str  # "memory" or "compute": which roof the floor sits on
    penalties: tuple[str, ...]
    label: str = MODELLED

    @property
    def fraction(self) -> float | None:
        return self.floor_s / self.time_s if self.time_s else None


def _kernel_penalty(build: dict, target: str, bound: str) -> tuple[float, list[str]]:
    """(slow-down factor, reasons) of one compiled kernel: its spills and its occupancy (module docstring)."""
    factor, reasons = 1.0, []
    if build.get("spilled_bytes"):
        spill = min(SPILL_PENALTY_CAP, 1 + build["spilled_bytes"] / (4 * max(build.get("registers") or 1, 1)))
        factor *= spill
        reasons.append(f"spills {build['spilled_bytes']} B/thread")
    ctas, warps = build.get("ctas_per_sm"), build.get("num_warps")
    if ctas and warps and target in TARGETS:
        most = TARGETS[target].max_warps_per_sm
        need = OCCUPANCY_NEED[bound] * most
        # a dot kernel's loop is software-pipelined: each stage past the first keeps one more tile load in flight
        depth = max(1, (build.get("num_stages") or 1) - 1) if build.get("uses_dot") else 1
        if ctas * warps * depth < need:
            factor *= min(OCCUPANCY_PENALTY_CAP, need / (ctas * warps * depth))
            piped = f" x {depth} pipelined loads" if depth > 1 else ""
            reasons.append(f"{ctas * warps} of {most} warps resident per SM{piped} (needs {need:g})")
    return factor, reasons


def estimate(block: str, shape: Mapping[str, int], target: str, builds: list[dict] | None = None, *,
             backward: bool = True) -> Estimate:
    """The modelled time of an operator for ``block`` at ``shape`` on ``target``, with the penalties its
    model-suite ``builds`` on that target earn (KernelBuild dicts; None: the ideal kernel, at the floor)."""
    peaks = PEAKS[target]
    w = work(block, shape, backward=backward)
    floor = floor_s(w, peaks)
    bound = "memory" if w.bytes / peaks.hbm_bytes_s >= floor else "compute"
    mine = [b for b in builds or [] if b["target"] == target and b["suite"] == "model"]
    if not backward:
        mine = [b for b in mine if "bwd" not in b["kernel"]]
    reasons = [f"{b['kernel']}: does not compile" for b in mine if not b["ok"]]
    reasons += [f"{b['kernel']}: cannot be resident" for b in mine if b["ok"] and b.get("ctas_per_sm") == 0]
    if reasons:
        return Estimate(target, floor, None, bound, tuple(reasons))
    penalties, time_s = [], floor
    no_tc = [b["kernel"] for b in mine if b.get("uses_dot") and not b.get("tensor_cores")]
    if no_tc and w.tensor_flops:
        time_s = max(time_s, floor_s(w, peaks, tensor_cores=False))
        penalties.append(f"no tensor cores: {', '.join(sorted(set(no_tc)))}")
    worst = max(((_kernel_penalty(b, target, bound), b) for b in mine), key=lambda x: x[0][0], default=None)
    if worst and worst[0][0] > 1:
        (factor, reasons), b = worst
        time_s *= factor
        penalties.append(f"{b['kernel']}: {', '.join(reasons)} (x{factor:.2f})")
    return Estimate(target, floor, time_s, bound, tuple(penalties))


def modelled_summary(block: str, shapes: list[Mapping[str, int]], builds: list[dict], targets: list[str], *,
                     backward: bool = True) -> dict[str, dict]:
    """Per target (those with peaks): the operator's modelled time and floor over ``shapes`` summed, in ms, the
    fraction of the roofline and the penalties; time_ms None where it does not run. Plain data, for manifests."""
    summary = {}
    for target in (t for t in targets if t in PEAKS):
        estimates = [estimate(block, shape, target, builds, backward=backward) for shape in shapes]
        if not estimates:
            continue
        floor = sum(e.floor_s for e in estimates) * 1e3
        runs = all(e.time_s is not None for e in estimates)
        time_ms = sum(e.time_s for e in estimates) * 1e3 if runs else None
        summary[target] = {"label": MODELLED, "time_ms": round(time_ms, 6) if runs else None,
                           "floor_ms": round(floor, 6), "fraction": round(floor / time_ms, 4) if runs else None,
                           "penalties": list(dict.fromkeys(p for e in estimates for p in e.penalties))}
    return summary
