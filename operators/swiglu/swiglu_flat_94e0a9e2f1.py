"""swiglu candidate rendered from templates/swiglu/flat.py.j2.

elementwise over the flattened contiguous tensors, a 1-D grid of cdiv(numel, BLOCK_SIZE) programs
params: BLOCK_SIZE=1024, COMPUTE_DTYPE=float32, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "swiglu"
TEMPLATE = "flat"
BLOCK_SIZE = 1024


@triton.jit
def swiglu_fwd_kernel(A, B, Y, numel, BLOCK_SIZE: tl.constexpr):
    """A, B, Y flat contiguous [numel]: y = a * sigmoid(a) * b, math in float32, stored in Y's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-a.to(tl.float32)))).to(tl.float32)  # Triton's exp is float32-only
    tl.store(Y + offs, (a * s * b).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(DY, A, B, DA, DB, numel, BLOCK_SIZE: tl.constexpr):
    """DY, A, B, DA, DB flat contiguous [numel], s = sigmoid(a): da = dy * b * s * (1 + a * (1 - s)),
    db = dy * a * s; math in float32, stored in DA's / DB's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    s = (1.0 / (1.0 + tl.exp(-a.to(tl.float32)))).to(tl.float32)
    tl.store(DA + offs, (dy * b * s * (1.0 + a * (1.0 - s))).to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, (dy * a * s).to(DB.dtype.element_ty), mask=mask)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        a_c = a.contiguous()
        b_c = b.contiguous()
        y = torch.empty_like(a_c)
        numel = a_c.numel()
        if numel > 0:
            swiglu_fwd_kernel[(triton.cdiv(numel, BLOCK_SIZE),)](a_c, b_c, y, numel, BLOCK_SIZE=BLOCK_SIZE,
                                                                  num_warps=4)
        ctx.save_for_backward(a_c, b_c)
        return y.view(a.shape)

    @staticmethod
    def backward(ctx, dy):
        a_c, b_c = ctx.saved_tensors
        dy_c = dy.contiguous()
        da = torch.empty_like(a_c)
        db = torch.empty_like(b_c)
        numel = a_c.numel()
        if numel > 0:
            swiglu_bwd_kernel[(triton.cdiv(numel, BLOCK_SIZE),)](dy_c, a_c, b_c, da, db, numel,
                                                                  BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
        return da, db


def run(a, b):
    """a, b [..., N] float32/float16/bfloat16 (same shape) -> y [..., N] in a.dtype."""
    return SwiGLUFunction.apply(a, b)
