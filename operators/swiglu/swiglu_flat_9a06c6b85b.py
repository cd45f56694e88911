"""swiglu candidate rendered from templates/swiglu/flat.py.j2.

elementwise over the flattened contiguous tensors, a 1-D grid of cdiv(numel, BLOCK_SIZE) programs
params: BLOCK_SIZE=1024, COMPUTE_DTYPE=float32, num_warps=4
"""
import math

import torch
import triton
import triton.language as tl

BLOCK = "swiglu"
TEMPLATE = "flat"
BLOCK_SIZE = 1024


@triton.jit
def swiglu_fwd_kernel(A, B, Y, numel, limit, alpha, up_offset, BLOCK_SIZE: tl.constexpr):
    """A, B, Y flat contiguous [numel]: y = g * sigmoid(alpha * g) * u, g = min(a, limit),
    u = clamp(b, -limit, limit) + up_offset; math in float32, stored in Y's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    lim = tl.cast(limit, tl.float32)
    g = tl.minimum(a, lim)
    u = tl.minimum(tl.maximum(b, -lim), lim) + tl.cast(up_offset, tl.float32)
    ag = tl.cast(alpha, tl.float32) * g
    s = (1.0 / (1.0 + tl.exp(-ag.to(tl.float32)))).to(tl.float32)  # sigmoid(alpha * g); Triton's exp is float32-only
    y = g * s * u
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(DY, A, B, DA, DB, numel, limit, alpha, up_offset, BLOCK_SIZE: tl.constexpr):
    """DY, A, B, DA, DB flat contiguous [numel], s = sigmoid(alpha * g): da = dy * u * s * (1 + alpha * g * (1 - s))
    where a <= limit, db = dy * g * s where |b| <= limit (0 elsewhere); math in float32, stored in DA's /
    DB's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < numel
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    lim = tl.cast(limit, tl.float32)
    g = tl.minimum(a, lim)
    u = tl.minimum(tl.maximum(b, -lim), lim) + tl.cast(up_offset, tl.float32)
    ag = tl.cast(alpha, tl.float32) * g
    s = (1.0 / (1.0 + tl.exp(-ag.to(tl.float32)))).to(tl.float32)  # sigmoid(alpha * g); Triton's exp is float32-only
    # a clamp passes the gradient where its input is within the bounds, bounds included (torch.clamp's rule)
    da = tl.where(a <= lim, dy * u * s * (1.0 + ag * (1.0 - s)), 0.0)
    db = tl.where((b >= -lim) & (b <= lim), dy * g * s, 0.0)
    tl.store(DA + offs, da.to(DA.dtype.element_ty), mask=mask)
    tl.store(DB + offs, db.to(DB.dtype.element_ty), mask=mask)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, limit, alpha, up_offset):
        ctx.variant = (math.inf if limit is None else float(limit), float(alpha), float(up_offset))
        a_c = a.contiguous()
        b_c = b.contiguous()
        y = torch.empty_like(a_c)
        numel = a_c.numel()
        if numel > 0:
            swiglu_fwd_kernel[(triton.cdiv(numel, BLOCK_SIZE),)](a_c, b_c, y, numel, *ctx.variant,
                                                                  BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
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
            swiglu_bwd_kernel[(triton.cdiv(numel, BLOCK_SIZE),)](dy_c, a_c, b_c, da, db, numel, *ctx.variant,
                                                                  BLOCK_SIZE=BLOCK_SIZE, num_warps=4)
        return da, db, None, None, None


def run(a, b, limit=None, alpha=1.0, up_offset=0.0):
    """a, b [..., N] float32/float16/bfloat16 (same shape) -> y [..., N] in a.dtype; limit (None: no clamp), alpha,
    up_offset: the variant's floats."""
    return SwiGLUFunction.apply(a, b, limit, alpha, up_offset)
