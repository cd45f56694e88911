"""seq_chunked_ce candidate rendered from templates/seq_chunked_ce/stream_online.py.j2.

per token chunk (one program), online logsumexp over vocabulary tiles, no logits buffer; dW by vocabulary tile
params: BLOCK_M=64, BLOCK_V=128, BLOCK_D=64, num_warps=4, DLOGITS_DTYPE=float32
"""
import torch
import triton
import triton.language as tl

BLOCK = "seq_chunked_ce"
TEMPLATE = "stream_online"
BLOCK_M = 64  # the chunk: the tokens one program owns
BLOCK_V = 128
BLOCK_D = 64
NUM_WARPS = 4
LOSS_BLOCK = 1024
SCALE_BLOCK = 4096


@triton.jit
def seq_chunked_ce_logits_tile(H, W, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                               BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """The [BLOCK_M, BLOCK_V] float32 tile of logits H[offs_m] @ W[offs_v]^T, accumulated over D in BLOCK_D steps."""
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        h = tl.load(H + offs_m[:, None] * stride_h + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :],
                    other=0.0)
        w = tl.load(W + offs_v[None, :] * stride_w + offs_d[:, None], mask=mask_v[None, :] & mask_d[:, None],
                    other=0.0)
        acc = tl.dot(h, w, acc, input_precision="ieee")
    return acc


@triton.jit
def seq_chunked_ce_fwd_kernel(H, W, Y, LSE, LOSS_TOK, DH, N, V, D, stride_h, stride_w, stride_dh, ignore_index,
                              COMPUTE_DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                              BLOCK_D: tl.constexpr):
    """One token chunk of BLOCK_M rows, streaming over vocabulary tiles; no logits buffer.
    Pass 1: online logsumexp (running max m, running sum s of exp(z - m)) and the target logit;
    LSE[i] = lse_i, LOSS_TOK[i] = lse_i - z[i, y_i] (0 where y_i is ignored).
    Pass 2 (COMPUTE_DH): the logits tiles again, G = softmax - onehot (zero rows where ignored), and
    DH[rows] += G @ W[tile] into the float32 accumulator DH [N, D] (zero-initialized; this program owns its rows)."""
    pid = tl.program_id(0).to(tl.int64)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < N
    y = tl.load(Y + offs_m, mask=mask_m, other=ignore_index)
    valid = mask_m & (y != ignore_index)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    s_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    z_y = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs_v = tl.cast(v0, tl.int64) + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        z = seq_chunked_ce_logits_tile(H, W, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                                       BLOCK_M, BLOCK_V, BLOCK_D)
        z = tl.where(mask_v[None, :], z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        s_i = s_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m_i = m_new
        z_y += tl.sum(tl.where(offs_v[None, :] == y[:, None], z, 0.0), axis=1)
    lse = m_i + tl.log(s_i)
    tl.store(LSE + offs_m, lse, mask=mask_m)
    tl.store(LOSS_TOK + offs_m, tl.where(valid, lse - z_y, 0.0), mask=mask_m)
    if COMPUTE_DH:
        for v0 in range(0, V, BLOCK_V):
            offs_v = tl.cast(v0, tl.int64) + tl.arange(0, BLOCK_V)
            mask_v = offs_v < V
            z = seq_chunked_ce_logits_tile(H, W, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                                           BLOCK_M, BLOCK_V, BLOCK_D)
            g = tl.exp(z - lse[:, None]) - tl.where(offs_v[None, :] == y[:, None], 1.0, 0.0)
            g = tl.where(valid[:, None] & mask_v[None, :], g, 0.0)
            for d0 in range(0, D, BLOCK_D):
                offs_d = d0 + tl.arange(0, BLOCK_D)
                mask_d = offs_d < D
                w = tl.load(W + offs_v[:, None] * stride_w + offs_d[None, :], mask=mask_v[:, None] & mask_d[None, :],
                            other=0.0)
                ptrs = DH + offs_m[:, None] * stride_dh + offs_d[None, :]
                mask = mask_m[:, None] & mask_d[None, :]
                part = tl.dot(g, w.to(tl.float32), input_precision="ieee")
                tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + part, mask=mask)
            tl.debug_barrier()  # the next vocabulary tile reads back what this one stored, maybe from other threads


@triton.jit
def seq_chunked_ce_dw_fwd_kernel(H, W, Y, LSE, DW, N, V, D, stride_h, stride_w, stride_dw, ignore_index,
                                 BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """One vocabulary tile of BLOCK_V rows of DW [V, D] (float32, zero-initialized), looping over the token chunks:
    the logits tile is recomputed, G = exp(z - lse) - onehot (zero rows where ignored), DW[tile] += G^T @ H[chunk]."""
    pid = tl.program_id(0).to(tl.int64)
    offs_v = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < V
    for m0 in range(0, N, BLOCK_M):
        offs_m = tl.cast(m0, tl.int64) + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N
        y = tl.load(Y + offs_m, mask=mask_m, other=ignore_index)
        valid = mask_m & (y != ignore_index)
        lse = tl.load(LSE + offs_m, mask=mask_m, other=0.0)
        z = seq_chunked_ce_logits_tile(H, W, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                                       BLOCK_M, BLOCK_V, BLOCK_D)
        g = tl.exp(z - lse[:, None]) - tl.where(offs_v[None, :] == y[:, None], 1.0, 0.0)
        gt = tl.trans(tl.where(valid[:, None] & mask_v[None, :], g, 0.0))
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            mask_d = offs_d < D
            h = tl.load(H + offs_m[:, None] * stride_h + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :],
                        other=0.0)
            ptrs = DW + offs_v[:, None] * stride_dw + offs_d[None, :]
            mask = mask_v[:, None] & mask_d[None, :]
            part = tl.dot(gt, h.to(tl.float32), input_precision="ieee")
            tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + part, mask=mask)
        tl.debug_barrier()  # the next token chunk reads back what this one stored, maybe from other threads


@triton.jit
def seq_chunked_ce_loss_fwd_kernel(LOSS_TOK, Y, LOSS, SCALE, N, ignore_index, MEAN: tl.constexpr,
                                   BLOCK: tl.constexpr):
    """One program, a fixed summation order: LOSS = sum(LOSS_TOK) * SCALE with SCALE = 1 / max(#valid targets, 1)
    for "mean" (0 when every target is ignored) and 1 for "sum"; SCALE is kept for the backward pass."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    count = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < N
        acc += tl.load(LOSS_TOK + offs, mask=mask, other=0.0)
        y = tl.load(Y + offs, mask=mask, other=ignore_index)
        count += (y != ignore_index).to(tl.int32)
    n_valid = tl.sum(count, axis=0)
    if MEAN:
        denom = tl.maximum(n_valid, 1)
    else:
        denom = n_valid * 0 + 1
    scale = 1.0 / denom.to(tl.float32)
    tl.store(LOSS, tl.sum(acc, axis=0) * scale)
    tl.store(SCALE, scale)


@triton.jit
def seq_chunked_ce_bwd_kernel(SRC, DST, GRAD_LOSS, SCALE, numel, BLOCK: tl.constexpr):
    """DST = SRC * (grad_loss * SCALE) cast to DST's dtype: the gradient stored by the forward pass (float32,
    summed over tokens) times the upstream gradient of the loss. SRC, DST contiguous, numel elements."""
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    factor = tl.load(GRAD_LOSS).to(tl.float32) * tl.load(SCALE)
    x = tl.load(SRC + offs, mask=mask, other=0.0)
    tl.store(DST + offs, (x * factor).to(DST.dtype.element_ty), mask=mask)


def _finish_forward(ctx, loss_tok, y, ignore_index, reduction, dh_acc, dw_acc, h, W):
    """The loss from the per-token losses; saves the float32 gradient accumulators for backward."""
    loss = torch.empty((), dtype=torch.float32, device=h.device)
    scale = torch.empty(1, dtype=torch.float32, device=h.device)
    seq_chunked_ce_loss_fwd_kernel[(1,)](loss_tok, y, loss, scale, y.shape[0], ignore_index,
                                         MEAN=reduction == "mean", BLOCK=LOSS_BLOCK)
    ctx.save_for_backward(dh_acc, dw_acc, scale)
    ctx.dtypes = (h.dtype, W.dtype)
    return loss


def _scaled(acc, dtype, grad_loss, scale):
    """The stored gradient acc (float32) times grad_loss * scale, as a new tensor of ``dtype``."""
    if acc is None:
        return None
    out = torch.empty(acc.shape, dtype=dtype, device=acc.device)
    grid = (triton.cdiv(acc.numel(), SCALE_BLOCK),)
    seq_chunked_ce_bwd_kernel[grid](acc, out, grad_loss, scale, acc.numel(), BLOCK=SCALE_BLOCK)
    return out


def _check(h, W, y, reduction):
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if h.dim() != 2 or W.dim() != 2 or h.shape[1] != W.shape[1] or y.shape != (h.shape[0],):
        raise ValueError(f"expected h [N, D], W [V, D], y [N]; got {tuple(h.shape)}, {tuple(W.shape)}, "
                         f"{tuple(y.shape)}")
    return (h if h.stride(-1) == 1 else h.contiguous(), W if W.stride(-1) == 1 else W.contiguous(),
            y.contiguous())


class SeqChunkedCEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, y, ignore_index, reduction):
        h, W, y = _check(h, W, y, reduction)
        n, d = h.shape
        v = W.shape[0]
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        loss_tok = torch.empty(n, dtype=torch.float32, device=h.device)
        dh_acc = torch.zeros((n, d), dtype=torch.float32, device=h.device) if need_dh else None
        seq_chunked_ce_fwd_kernel[(triton.cdiv(n, BLOCK_M),)](
            h, W, y, lse, loss_tok, dh_acc if need_dh else lse, n, v, d, h.stride(0), W.stride(0),
            dh_acc.stride(0) if need_dh else 0, ignore_index, COMPUTE_DH=need_dh,
            BLOCK_M=BLOCK_M, BLOCK_V=BLOCK_V, BLOCK_D=BLOCK_D, num_warps=NUM_WARPS)
        dw_acc = None
        if need_dw:
            dw_acc = torch.zeros((v, d), dtype=torch.float32, device=h.device)
            seq_chunked_ce_dw_fwd_kernel[(triton.cdiv(v, BLOCK_V),)](
                h, W, y, lse, dw_acc, n, v, d, h.stride(0), W.stride(0), dw_acc.stride(0), ignore_index,
                BLOCK_M=BLOCK_M, BLOCK_V=BLOCK_V, BLOCK_D=BLOCK_D, num_warps=NUM_WARPS)
        return _finish_forward(ctx, loss_tok, y, ignore_index, reduction, dh_acc, dw_acc, h, W)

    @staticmethod
    def backward(ctx, grad_loss):
        dh_acc, dw_acc, scale = ctx.saved_tensors
        grad_loss = grad_loss.contiguous()
        return (_scaled(dh_acc, ctx.dtypes[0], grad_loss, scale), _scaled(dw_acc, ctx.dtypes[1], grad_loss, scale),
                None, None, None)


def run(h, W, y, ignore_index, reduction):
    """h [N, D], W [V, D] float32/float16/bfloat16, y [N] int64 -> loss, a 0-dim float32 tensor; the gradients of
    h and W are computed here, streaming over vocabulary tiles, and only scaled by the backward pass."""
    return SeqChunkedCEFunction.apply(h, W, y, ignore_index, reduction)
