"""moe_combine candidate rendered from templates/moe_combine/token_tile.py.j2.

2-D tiles of BLOCK_T tokens x BLOCK_D columns gather their k rows; the backward scatters dy and reduces dw per token tile
params: BLOCK_T=16, BLOCK_D=64, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "moe_combine"
TEMPLATE = "token_tile"
BLOCK_T = 16
BLOCK_D = 64
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
# Warps per target: over 4 warps the backward's tiles take so many registers a thread that an NVIDIA SM holds too few
# warps to keep HBM busy; 8 warps halve the registers a thread. `workbench targets` shows each launch's registers.
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def moe_combine_fwd_kernel(Y, W, ROWS, OUT, N, D, k, stride_y, stride_out,
                           BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (token tile, column tile): out[t] = sum_j w[t, j] * y[rows[t, j]] over the k slots in order
    (skipping rows < 0), accumulated in float32 in registers and stored once in OUT's dtype: a per-token gather,
    deterministic, no atomics. Y [M, D], W [N, k] float32, ROWS [N, k] int64, OUT [N, D]."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    tmask = t < N
    dmask = d[None, :] < D
    acc = tl.full((BLOCK_T, BLOCK_D), 0, tl.float32)
    for j in range(0, k):
        row = tl.load(ROWS + t * k + j, mask=tmask, other=-1)
        w = tl.load(W + t * k + j, mask=tmask, other=0.0).to(tl.float32)
        v = tl.load(Y + row[:, None] * stride_y + d[None, :], mask=(row[:, None] >= 0) & dmask, other=0.0)
        acc += w[:, None] * v.to(tl.float32)
    tl.store(OUT + t[:, None] * stride_out + d[None, :], acc.to(OUT.dtype.element_ty), mask=tmask[:, None] & dmask)


@triton.jit
def moe_combine_bwd_kernel(DOUT, Y, W, ROWS, DY, DW, N, D, k, stride_dout, stride_y, stride_dy,
                           BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (token tile) over all columns: for each slot j, dy[rows[t, j]] = w[t, j] * dout[t] (each row has
    one slot, so the scatter never collides) and dw[t, j] = <dout[t], y[rows[t, j]]> summed over D in float32
    (0 for a dropped slot). Rows no slot points at keep DY's zero fill."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < N
    for j in range(0, k):
        row = tl.load(ROWS + t * k + j, mask=tmask, other=-1)
        w = tl.load(W + t * k + j, mask=tmask, other=0.0).to(tl.float32)
        live = row[:, None] >= 0
        acc = tl.full((BLOCK_T, BLOCK_D), 0, tl.float32)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            dmask = d[None, :] < D
            dout = tl.load(DOUT + t[:, None] * stride_dout + d[None, :], mask=tmask[:, None] & dmask,
                           other=0.0).to(tl.float32)
            y = tl.load(Y + row[:, None] * stride_y + d[None, :], mask=live & dmask, other=0.0).to(tl.float32)
            acc += dout * y
            tl.store(DY + row[:, None] * stride_dy + d[None, :], (w[:, None] * dout).to(DY.dtype.element_ty),
                     mask=live & dmask)
        tl.store(DW + t * k + j, tl.sum(acc, axis=1).to(DW.dtype.element_ty), mask=tmask)


class MoECombineFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, weights, row_of_slot):
        n, k = row_of_slot.shape
        d = y.shape[1]
        warps = target_settings(y.device)["num_warps"]
        y_c = y if y.stride(-1) == 1 else y.contiguous()
        w_c = weights.contiguous()
        rows = row_of_slot.contiguous()
        out = torch.empty(n, d, dtype=y.dtype, device=y.device)
        if n * d > 0:
            moe_combine_fwd_kernel[(triton.cdiv(n, BLOCK_T), triton.cdiv(d, BLOCK_D))](
                y_c, w_c, rows, out, n, d, k, y_c.stride(0), out.stride(0), BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D,
                num_warps=warps)
        ctx.save_for_backward(y_c, w_c, rows)
        ctx.mark_non_differentiable(row_of_slot)
        return out

    @staticmethod
    def backward(ctx, dout):
        y_c, w_c, rows = ctx.saved_tensors
        n, k = rows.shape
        d = y_c.shape[1]
        warps = target_settings(y_c.device)["num_warps"]
        dy = torch.zeros(y_c.shape[0], d, dtype=y_c.dtype, device=y_c.device)
        dw = torch.empty(n, k, dtype=w_c.dtype, device=w_c.device)
        if n * k > 0:
            dout_c = dout if dout.stride(-1) == 1 else dout.contiguous()
            moe_combine_bwd_kernel[(triton.cdiv(n, BLOCK_T),)](
                dout_c, y_c, w_c, rows, dy, dw, n, d, k, dout_c.stride(0), y_c.stride(0), dy.stride(0),
                BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D, num_warps=warps)
        return dy, dw, None


def run(y, weights, row_of_slot):
    """y [M, D] float32/float16/bfloat16 (expert-major rows), weights [N, k] float32, row_of_slot [N, k] int64
    (-1 = dropped) -> out [N, D] in y's dtype."""
    return MoECombineFunction.apply(y, weights, row_of_slot)
