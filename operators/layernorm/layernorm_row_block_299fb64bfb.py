"""layernorm candidate rendered from templates/layernorm/row_block.py.j2.

one program per row, the whole row in one block of registers; one pass forward, one pass backward
params: BLOCK_N=8192, ACC_DTYPE=float32, num_warps=16, BWD_PROGRAMS=128
"""
import torch
import triton
import triton.language as tl

BLOCK = "layernorm"
TEMPLATE = "row_block"
BLOCK_N = 8192  # the widest row this operator takes; each call's block is its own width's power of two
NUM_WARPS = 16  # the most warps a program gets (at the widest blocks)
BWD_PROGRAMS = 128


def row_launch(n: int) -> tuple[int, int]:
    """(block, num_warps) for rows of width n <= BLOCK_N, chosen per call: the block is n's next power of two (at
    least 64); the warps follow Liger's calculate_settings (4; 8 from 2048 columns, 16 from 8192, 32 from 32768),
    at most NUM_WARPS."""
    if n > BLOCK_N:
        raise ValueError(f"rows of {n} columns: this operator takes rows of at most {BLOCK_N}")
    block = max(64, triton.next_power_of_2(n))
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, min(warps, NUM_WARPS)


@triton.jit
def layernorm_fwd_kernel(X, W, B, Y, MEAN, RSTD, stride_x, stride_y, N, eps, BLOCK_N: tl.constexpr):
    """One row per program: y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps); mean and rstd kept for the
    backward pass. The variance is taken of the centred row (no E[x^2] - mean^2 cancellation)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    centred = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / N + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (centred * rstd * w + b).to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean.to(tl.float32))
    tl.store(RSTD + row, rstd.to(tl.float32))


@triton.jit
def layernorm_bwd_kernel(DY, X, W, MEAN, RSTD, DX, DW_PART, DB_PART, stride_dy, stride_x, stride_dx, n_rows, N,
                         rows_per_program, BLOCK_N: tl.constexpr):
    """Each program takes a contiguous row range: dx = rstd * (w*dy - mean(w*dy) - xhat * mean(xhat*w*dy)); its
    shares of dw = sum_rows(dy * xhat) and db = sum_rows(dy) go to its own rows of DW_PART and DB_PART (summed on the
    host, deterministic)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for row in range(row_start, row_end):
        r = tl.cast(row, tl.int64)
        x = tl.load(X + r * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + r * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + r).to(tl.float32)
        rstd = tl.load(RSTD + r).to(tl.float32)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(wdy, axis=0) / N
        c2 = tl.sum(xhat * wdy, axis=0) / N
        tl.store(DX + r * stride_dx + cols, ((wdy - c1 - xhat * c2) * rstd).to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    part = pid.to(tl.int64) * N + cols
    tl.store(DW_PART + part, dw.to(tl.float32), mask=mask)
    tl.store(DB_PART + part, db.to(tl.float32), mask=mask)


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        rows, n = x2.shape
        y = torch.empty_like(x2)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        block, warps = row_launch(n)
        if rows > 0:
            layernorm_fwd_kernel[(rows,)](x2, weight, bias, y, mean, rstd, x2.stride(0), y.stride(0), n, eps,
                                          BLOCK_N=block, num_warps=warps)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.shape = shape
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        rows, n = x2.shape
        dy2 = dy.reshape(-1, n).contiguous()
        dx = torch.empty_like(x2)
        programs = max(1, min(rows, BWD_PROGRAMS))
        rows_per_program = triton.cdiv(rows, programs)
        dw_part = torch.zeros(programs, n, dtype=torch.float32, device=x2.device)
        db_part = torch.zeros(programs, n, dtype=torch.float32, device=x2.device)
        block, warps = row_launch(n)
        if rows > 0:
            layernorm_bwd_kernel[(programs,)](dy2, x2, weight, mean, rstd, dx, dw_part, db_part, dy2.stride(0),
                                              x2.stride(0), dx.stride(0), rows, n, rows_per_program, BLOCK_N=block,
                                              num_warps=warps)
        return dx.view(ctx.shape), dw_part.sum(0).to(weight.dtype), db_part.sum(0).to(weight.dtype), None


def run(x, weight, bias, eps):
    """x [..., N] float32/float16/bfloat16, weight and bias [N] same dtype -> y [..., N] in x.dtype."""
    return LayerNormFunction.apply(x, weight, bias, eps)
