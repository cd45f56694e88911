"""situ candidate rendered from templates/situ/flat.py.j2.

elementwise over the flattened outputs, a 1-D grid of cdiv(rows * N, BLOCK_SIZE) programs
params: BLOCK_SIZE=1024, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "situ"
TEMPLATE = "flat"
BLOCK_SIZE = 1024


@triton.jit
def situ_fwd_kernel(GU, Y, numel, N, beta, linear_beta, BLOCK_SIZE: tl.constexpr):
    """GU contiguous [rows, 2N] (gate | up), Y contiguous [rows, N]; program p writes the BLOCK_SIZE outputs from
    p * BLOCK_SIZE on, each finding its row and column by one division. Math in float32, stored in Y's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    row = offs // N
    g_offs = offs + row * N  # row * 2N + col
    gate = tl.load(GU + g_offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GU + g_offs + N, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-gate))  # sigmoid(gate)
    # tg = tanh(gate / beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
    # series where |x| < 1/8 (there 1 - e cancels)
    tg_x = gate / beta
    tg_a = tl.abs(tg_x)
    tg_e = tl.exp(-2.0 * tg_a)
    tg_a2 = tg_a * tg_a
    tg = tl.where(tg_a < 0.125,
                  tg_a * (1.0 + tg_a2 * (-1.0 / 3.0 + tg_a2 * (2.0 / 15.0 - tg_a2 * 17.0 / 315.0))),
                  (1.0 - tg_e) / (1.0 + tg_e))
    tg = tl.where(tg_x < 0.0, -tg, tg)
    # tu = tanh(up / linear_beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
    # series where |x| < 1/8 (there 1 - e cancels)
    tu_x = up / linear_beta
    tu_a = tl.abs(tu_x)
    tu_e = tl.exp(-2.0 * tu_a)
    tu_a2 = tu_a * tu_a
    tu = tl.where(tu_a < 0.125,
                  tu_a * (1.0 + tu_a2 * (-1.0 / 3.0 + tu_a2 * (2.0 / 15.0 - tu_a2 * 17.0 / 315.0))),
                  (1.0 - tu_e) / (1.0 + tu_e))
    tu = tl.where(tu_x < 0.0, -tu, tu)
    g = beta * tg * s
    u = linear_beta * tu
    y = g * u
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def situ_bwd_kernel(DY, GU, DGU, numel, N, beta, linear_beta, BLOCK_SIZE: tl.constexpr):
    """DY contiguous [rows, N]; GU, DGU contiguous [rows, 2N]: both halves of d gate_up for BLOCK_SIZE outputs;
    math in float32, stored in DGU's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    row = offs // N
    g_offs = offs + row * N
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(GU + g_offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GU + g_offs + N, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-gate))  # sigmoid(gate)
    # tg = tanh(gate / beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
    # series where |x| < 1/8 (there 1 - e cancels)
    tg_x = gate / beta
    tg_a = tl.abs(tg_x)
    tg_e = tl.exp(-2.0 * tg_a)
    tg_a2 = tg_a * tg_a
    tg = tl.where(tg_a < 0.125,
                  tg_a * (1.0 + tg_a2 * (-1.0 / 3.0 + tg_a2 * (2.0 / 15.0 - tg_a2 * 17.0 / 315.0))),
                  (1.0 - tg_e) / (1.0 + tg_e))
    tg = tl.where(tg_x < 0.0, -tg, tg)
    # tu = tanh(up / linear_beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
    # series where |x| < 1/8 (there 1 - e cancels)
    tu_x = up / linear_beta
    tu_a = tl.abs(tu_x)
    tu_e = tl.exp(-2.0 * tu_a)
    tu_a2 = tu_a * tu_a
    tu = tl.where(tu_a < 0.125,
                  tu_a * (1.0 + tu_a2 * (-1.0 / 3.0 + tu_a2 * (2.0 / 15.0 - tu_a2 * 17.0 / 315.0))),
                  (1.0 - tu_e) / (1.0 + tu_e))
    tu = tl.where(tu_x < 0.0, -tu, tu)
    g = beta * tg * s
    u = linear_beta * tu
    d_gate = dy * u * ((1.0 - tg * tg) * s + beta * tg * s * (1.0 - s))
    d_up = dy * g * (1.0 - tu * tu)
    tl.store(DGU + g_offs, d_gate.to(DGU.dtype.element_ty), mask=mask)
    tl.store(DGU + g_offs + N, d_up.to(DGU.dtype.element_ty), mask=mask)


class SiTUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up, beta, linear_beta):
        n = gate_up.shape[-1] // 2
        gu = gate_up.contiguous()
        y = torch.empty(*gate_up.shape[:-1], n, dtype=gate_up.dtype, device=gate_up.device)
        numel = y.numel()
        if numel > 0:
            situ_fwd_kernel[(triton.cdiv(numel, BLOCK_SIZE),)](gu, y, numel, n, beta, linear_beta,
                                                               BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
        ctx.save_for_backward(gu)
        ctx.betas = (beta, linear_beta)
        return y

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        beta, linear_beta = ctx.betas
        dy_c = dy.contiguous()
        dgu = torch.empty_like(gu)
        numel = dy_c.numel()
        if numel > 0:
            situ_bwd_kernel[(triton.cdiv(numel, BLOCK_SIZE),)](dy_c, gu, dgu, numel, gu.shape[-1] // 2, beta,
                                                               linear_beta, BLOCK_SIZE=BLOCK_SIZE,
                                                               num_warps=4)
        return dgu, None, None


def run(gate_up, beta, linear_beta):
    """gate_up [..., 2N] float32/float16/bfloat16 (gate first) -> y [..., N] in its dtype."""
    return SiTUFunction.apply(gate_up, beta, linear_beta)
