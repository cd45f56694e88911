"""rmsnorm_gated candidate rendered from templates/rmsnorm_gated/row_tile.py.j2.

several whole rows per program (a [rows, block] tile in registers); x read once forward, once backward
params: BLOCK_N=8192, ROWS_TILE=2048, BWD_ROWS_TILE=512, num_warps=16, BWD_PROGRAMS=512
"""
import torch
import triton
import triton.language as tl

BLOCK = "rmsnorm_gated"
TEMPLATE = "row_tile"
BLOCK_N = 8192  # the widest row this operator takes; each call's block is its own width's power of two
NUM_WARPS = 16  # the most warps a program gets (at the widest blocks)
ROWS_TILE = 2048  # elements of x a forward program holds: ROWS_TILE // block rows (at least one)
BWD_ROWS_TILE = 512  # elements of x a backward program holds per step (it keeps more tiles live)
BWD_PROGRAMS = 512


def row_launch(n: int) -> tuple[int, int]:
    """(block, num_warps) for rows of width n <= BLOCK_N, chosen per call: the block is n's next power of two (at
    least 64); the warps follow Liger's calculate_settings (4; 8 from 2048 columns, 16 from 8192, 32 from 32768),
    at most NUM_WARPS."""
    if n > BLOCK_N:
        raise ValueError(f"rows of {n} columns: this operator takes rows of at most {BLOCK_N}")
    block = max(64, triton.next_power_of_2(n))
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, min(warps, NUM_WARPS)


def tile_launch(n: int, elements: int) -> tuple[int, int, int]:
    """(rows per program step, block, num_warps) for rows of width n: the block and warps of row_launch, and as many
    rows as fit ``elements`` (ROWS_TILE forward, BWD_ROWS_TILE backward; a power of two, at least one)."""
    block, warps = row_launch(n)
    return max(1, elements // block), block, warps


@triton.jit
def rmsnorm_gated_fwd_kernel(X, W, G, Y, RSTD, stride_x, stride_g, stride_y, n_rows, N, eps,
                             ACTIVATION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """BLOCK_R whole rows per program: y = x * rstd * w * act(g), rstd = 1 / sqrt(mean(x^2) + eps) (kept for the
    backward pass); float32 math, stored in Y's dtype."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    in_rows = rows < n_rows
    mask = in_rows[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
    sig = 1.0 / (1.0 + tl.exp(-g))  # exp(-g) reaches inf for g < -88: sig is then exactly 0, never NaN
    if ACTIVATION == "sigmoid":
        s = sig
    else:  # silu
        s = g * sig
    y = x * rstd[:, None] * w * s
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=in_rows)


@triton.jit
def rmsnorm_gated_bwd_kernel(DY, X, W, G, RSTD, DX, DG, DW_PART, stride_dy, stride_x, stride_g, stride_dx, stride_dg,
                             n_rows, N, tiles_per_program, ACTIVATION: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    """Each program takes a contiguous range of tiles of BLOCK_R whole rows: dx, d gate, and its share of
    dw = sum_rows(dy * act(g) * xhat), kept in registers and written to its own row of DW_PART at the end."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    in_cols = cols < N
    w = tl.load(W + cols, mask=in_cols, other=0.0).to(tl.float32)[None, :]
    dw = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    first = pid * tiles_per_program
    for tile in range(first, first + tiles_per_program):
        rows = tl.cast(tile, tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        in_rows = rows < n_rows
        mask = in_rows[:, None] & in_cols[None, :]
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=in_rows, other=0.0)[:, None]
        xhat = x * rstd
        sig = 1.0 / (1.0 + tl.exp(-g))  # exp(-g) reaches inf for g < -88: sig is then exactly 0, never NaN
        if ACTIVATION == "sigmoid":
            s = sig
            ds = sig * (1.0 - sig)
        else:  # silu
            s = g * sig
            ds = sig * (1.0 + g * (1.0 - sig))
        d_gate = dy * xhat * w * ds
        tl.store(DG + rows[:, None] * stride_dg + cols[None, :], d_gate.to(DG.dtype.element_ty), mask=mask)
        c = tl.sum(xhat * w * dy * s, axis=1)[:, None] / N
        dx = (w * dy * s - xhat * c) * rstd
        dw_share = dy * s * xhat
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += dw_share
    tl.store(DW_PART + pid.to(tl.int64) * N + cols, tl.sum(dw, axis=0), mask=in_cols)


@triton.jit
def rmsnorm_gated_dw_kernel(PARTS, DW, P, N, BLOCK: tl.constexpr):
    """PARTS [P, N] float32, one row of weight-gradient partials per backward program -> DW [N], their sum over P in
    a fixed order (deterministic, no atomics), stored in DW's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, P):
        acc += tl.load(PARTS + p * N + offs, mask=mask, other=0.0)
    tl.store(DW + offs, acc.to(DW.dtype.element_ty), mask=mask)


def _forward(x2, weight, g2, y, rstd, eps, activation):
    rows, n = x2.shape
    block_r, block, warps = tile_launch(n, ROWS_TILE)
    rmsnorm_gated_fwd_kernel[(triton.cdiv(rows, block_r),)](
        x2, weight, g2, y, rstd, x2.stride(0), g2.stride(0), y.stride(0), rows, n, eps, ACTIVATION=activation,
        BLOCK_R=block_r, BLOCK_N=block, num_warps=warps)


def _backward(dy2, x2, weight, g2, rstd, dx, dgate, activation):
    rows, n = x2.shape
    block_r, block, warps = tile_launch(n, BWD_ROWS_TILE)
    tiles = triton.cdiv(rows, block_r)
    programs = max(1, min(tiles, BWD_PROGRAMS))
    parts = torch.empty(programs, n, dtype=torch.float32, device=x2.device)  # every row written by its program
    rmsnorm_gated_bwd_kernel[(programs,)](
        dy2, x2, weight, g2, rstd, dx, dgate, parts, dy2.stride(0), x2.stride(0), g2.stride(0), dx.stride(0),
        dgate.stride(0), rows, n, triton.cdiv(tiles, programs), ACTIVATION=activation, BLOCK_R=block_r,
        BLOCK_N=block, num_warps=warps)
    return parts


ACTIVATIONS = ("sigmoid", "silu")
DW_BLOCK = 1024  # weight-gradient columns per program of the reduction


def _rows(t):
    """[..., N] -> [rows, N]; a view whenever reshape can keep the strides, copied only if the last dim is strided."""
    t2 = t.reshape(t.shape[:-1].numel(), t.shape[-1])  # not -1: that is ambiguous when N == 0
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class RMSNormGatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, gate, eps, activation):
        x2, g2, w = _rows(x), _rows(gate), weight.contiguous()
        y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        rstd = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        if y.numel() > 0:
            _forward(x2, w, g2, y, rstd, eps, activation)
        ctx.save_for_backward(x2, w, g2, rstd)
        ctx.shapes, ctx.activation = (x.shape, gate.shape), activation
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, g2, rstd = ctx.saved_tensors
        dx, dgate, dw = torch.empty_like(x2), torch.empty_like(g2), torch.empty_like(w)
        n = x2.shape[1]
        if n > 0:
            parts = _backward(_rows(dy), x2, w, g2, rstd, dx, dgate, ctx.activation)
            rmsnorm_gated_dw_kernel[(triton.cdiv(n, DW_BLOCK),)](parts, dw, parts.shape[0], n, BLOCK=DW_BLOCK,
                                                                 num_warps=4)
        return dx.view(ctx.shapes[0]), dw, dgate.view(ctx.shapes[1]), None, None


def run(x, weight, gate, eps, activation):
    """x, gate [..., N] float32/float16/bfloat16 (the last dim contiguous), weight [N], activation "sigmoid" or
    "silu" -> y = rmsnorm(x) * weight * activation(gate) [..., N] in x.dtype."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{activation}' (one of {', '.join(ACTIVATIONS)})")
    return RMSNormGatedFunction.apply(x, weight, gate, eps, activation)
