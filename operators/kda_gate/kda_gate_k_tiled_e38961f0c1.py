"""kda_gate candidate rendered from templates/kda_gate/k_tiled.py.j2.

a 3-D grid of (token tile, head, channel tile) programs; parameter gradients through per-tile partial sums
params: BT=32, BK=128, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "kda_gate"
TEMPLATE = "k_tiled"
BT = 32
BK = 128
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # softplus(x) = x above it (a constexpr global: kernels read it)
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'num_warps': 8}, 'sm_80': {'num_warps': 8}, 'sm_90a': {'num_warps': 8}}


def launch_target(device) -> str:
    """The target a launch on ``device`` runs on: "interpreter" for CPU tensors, else the GPU's architecture in
    the workbench's names (sm_80, sm_90a, sm_100a, gfx942, gfx950)."""
    if LAUNCH_TARGET is not None:
        return LAUNCH_TARGET
    if device.type == "cpu":
        return "interpreter"
    target = triton.runtime.driver.active.get_current_target()
    if target.backend == "cuda":
        return f"sm_{target.arch}{'a' if target.arch >= 90 else ''}"
    return str(target.arch)


def target_settings(device) -> dict:
    """LAUNCH_SETTINGS merged for the launch's target: default, then its backend, then the target itself, then
    what the port chose for the target (TUNED_SETTINGS)."""
    target = launch_target(device)
    backend = target if target == "interpreter" else "cuda" if target.startswith("sm_") else "hip"
    return {**LAUNCH_SETTINGS.get("default", {}), **LAUNCH_SETTINGS.get(backend, {}),
            **LAUNCH_SETTINGS.get(target, {}), **TUNED_SETTINGS.get(target, {})}
# Warps per target: over 4 warps the [BT, BK] tiles take so many registers a thread that an NVIDIA SM holds too few
# warps to keep HBM busy; 8 warps halve the registers a thread. `workbench targets` shows each launch's registers.
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def kda_gate_fwd_kernel(F, A_LOG, DT, G, rows, H, K, lower_bound, BOUNDED: tl.constexpr, BT: tl.constexpr,
                        BK: tl.constexpr):
    """F contiguous [rows = B * T, H, K], A_LOG [H], DT [H, K]; program (row tile, head, channel tile) writes the
    gates of BT x BK elements (BOUNDED: lower_bound * sigmoid(exp(A_log) (f + dt)), else -exp(A_log) softplus(f +
    dt)); float32 math and output."""
    r = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    h = tl.program_id(1).to(tl.int64)
    k = tl.program_id(2).to(tl.int64) * BK + tl.arange(0, BK)
    mask = (r < rows)[:, None] & (k < K)[None, :]
    offs = r[:, None] * H * K + h * K + k[None, :]
    f = tl.load(F + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.exp(tl.load(A_LOG + h).to(tl.float32))
    dt = tl.load(DT + h * K + k, mask=k < K, other=0.0).to(tl.float32)[None, :]
    x = f + dt
    if BOUNDED:  # lower_bound * sigmoid(a x)
        s = 1.0 / (1.0 + tl.exp(-(a * x)))
        g = lower_bound * s
    else:  # -a * softplus(x), x itself above the threshold (transformers' form)
        g = -a * tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(tl.minimum(x, SOFTPLUS_THRESHOLD))))
    tl.store(G + offs, g.to(G.dtype.element_ty), mask=mask)


@triton.jit
def kda_gate_bwd_kernel(DG, F, A_LOG, DT, DF, DTP, DAP, rows, H, K, lower_bound, BOUNDED: tl.constexpr,
                        BT: tl.constexpr, BK: tl.constexpr):
    """df for the tile (in DF's dtype), and the tile's float32 partial sums: DTP[row tile, h, k] of d dt_bias and
    DAP[row tile * channel tiles + channel tile, h] of d A_log."""
    r = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    h = tl.program_id(1).to(tl.int64)
    k = tl.program_id(2).to(tl.int64) * BK + tl.arange(0, BK)
    mask = (r < rows)[:, None] & (k < K)[None, :]
    offs = r[:, None] * H * K + h * K + k[None, :]
    dg = tl.load(DG + offs, mask=mask, other=0.0).to(tl.float32)
    f = tl.load(F + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.exp(tl.load(A_LOG + h).to(tl.float32))
    dt = tl.load(DT + h * K + k, mask=k < K, other=0.0).to(tl.float32)[None, :]
    x = f + dt
    if BOUNDED:  # lower_bound * sigmoid(a x)
        s = 1.0 / (1.0 + tl.exp(-(a * x)))
        g = lower_bound * s
    else:  # -a * softplus(x), x itself above the threshold (transformers' form)
        g = -a * tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(tl.minimum(x, SOFTPLUS_THRESHOLD))))
    if BOUNDED:
        u = dg * lower_bound * s * (1.0 - s)  # dg * d g / d (a x)
        df = u * a
        da = u * a * x
    else:
        df = -dg * a * tl.where(x > SOFTPLUS_THRESHOLD, 1.0, 1.0 / (1.0 + tl.exp(-x)))
        da = dg * g
    tl.store(DF + offs, df.to(DF.dtype.element_ty), mask=mask)
    tl.store(DTP + tl.program_id(0).to(tl.int64) * H * K + h * K + k, tl.sum(df, axis=0), mask=k < K)
    part = tl.program_id(0).to(tl.int64) * tl.num_programs(2) + tl.program_id(2)
    tl.store(DAP + part * H + h, tl.sum(tl.sum(da, axis=1), axis=0))


@triton.jit
def kda_gate_reduce_kernel(PARTS, OUT, P, N, BLOCK: tl.constexpr):
    """PARTS [P, N] float32 -> OUT [N] = the sum over P in a fixed order (deterministic, no atomics), stored in OUT's
    dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, P):
        acc += tl.load(PARTS + p * N + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


class KDAGateFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, f, A_log, dt_bias, lower_bound):
        f_c, a_c, dt_c = f.contiguous(), A_log.contiguous(), dt_bias.contiguous()
        b, t, h, k = f_c.shape
        form = _form(lower_bound)
        warps = target_settings(f_c.device)["num_warps"]
        g = torch.empty(b, t, h, k, dtype=_gate_dtype(f), device=f.device)
        if g.numel() > 0:
            kda_gate_fwd_kernel[(triton.cdiv(b * t, BT), h, triton.cdiv(k, BK))](
                f_c, a_c, dt_c, g, b * t, h, k, *form, BT=BT, BK=BK, num_warps=warps)
        ctx.save_for_backward(f_c, a_c, dt_c)
        ctx.form = form
        return g

    @staticmethod
    def backward(ctx, dg):
        f_c, a_c, dt_c = ctx.saved_tensors
        b, t, h, k = f_c.shape
        warps = target_settings(f_c.device)["num_warps"]
        grid = (triton.cdiv(b * t, BT), h, triton.cdiv(k, BK))
        df = torch.empty_like(f_c)
        dtp = torch.zeros(grid[0], h * k, dtype=torch.float32, device=f_c.device)
        dap = torch.zeros(grid[0] * grid[2], h, dtype=torch.float32, device=f_c.device)
        if df.numel() > 0:
            kda_gate_bwd_kernel[grid](dg.contiguous(), f_c, a_c, dt_c, df, dtp, dap, b * t, h, k, *ctx.form,
                                      BT=BT, BK=BK, num_warps=warps)
        return df, _reduced(dap, a_c), _reduced(dtp, dt_c), None


REDUCE_BLOCK = 1024


def _reduced(parts, like):
    """parts [P, N] float32 -> their sum over P, shaped and typed like ``like`` (N = like.numel())."""
    out = torch.empty_like(like)
    n = like.numel()
    if n > 0:
        kda_gate_reduce_kernel[(triton.cdiv(n, REDUCE_BLOCK),)](parts, out, parts.shape[0], n, BLOCK=REDUCE_BLOCK,
                                                                num_warps=4)
    return out


def _gate_dtype(f):
    return torch.float64 if f.dtype == torch.float64 else torch.float32


def _form(lower_bound):
    """The kernels' (lower_bound, BOUNDED): None is the unbounded softplus gate."""
    return (0.0, False) if lower_bound is None else (float(lower_bound), True)


def run(f, A_log, dt_bias, lower_bound):
    """f [B, T, H, K], A_log [H], dt_bias [H, K] float32/float16/bfloat16, lower_bound a number (bounded gate) or
    None (softplus gate) -> g [B, T, H, K] float32."""
    return KDAGateFunction.apply(f, A_log, dt_bias, lower_bound)
