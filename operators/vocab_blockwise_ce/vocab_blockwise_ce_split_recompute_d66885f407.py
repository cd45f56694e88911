"""vocab_blockwise_ce candidate rendered from templates/vocab_blockwise_ce/split_recompute.py.j2.

CCE; online logsumexp forward; backward recomputes logits twice, dh by token tile and dW by vocabulary tile
params: BLOCK_M=64, BLOCK_V=128, BLOCK_D=64, num_warps=4, DLOGITS_DTYPE=input
launch on sm_100a: block_d=32, num_warps=8
launch on sm_80: block_d=32, block_v=64, num_warps=8
launch on sm_90a: block_d=32, block_v=64
"""
import torch
import triton
import triton.language as tl

BLOCK = "vocab_blockwise_ce"
TEMPLATE = "split_recompute"
BLOCK_M = 64
BLOCK_V = 128
BLOCK_D = 64
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'block_d': 32, 'num_warps': 8}, 'sm_80': {'block_d': 32, 'block_v': 64, 'num_warps': 8}, 'sm_90a': {'block_d': 32, 'block_v': 64}}


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
# Warps and the vocabulary / hidden tiles (block_v, block_d; the token tile is BLOCK_M everywhere) per target: the
# float32 logits tiles must fit a thread's registers; on NVIDIA that takes 8 warps with 64-column vocabulary and
# 32-column hidden tiles (4 warps, or 128 x 64 tiles, do not fit). `workbench targets` shows each launch's registers
# and spills per target.
LAUNCH_SETTINGS = {"default": {"num_warps": 4, "block_v": 128,
                               "block_d": 64}}
LOSS_BLOCK = 1024


@triton.jit
def vocab_blockwise_ce_logits_tile(H, W, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
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
def vocab_blockwise_ce_logits_grad(H, W, Y, LSE, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                                   ignore_index, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                                   BLOCK_D: tl.constexpr):
    """The recomputed [BLOCK_M, BLOCK_V] tile of the unscaled logits gradient exp(z - lse) - onehot(y), float32,
    zero in rows whose target is ignored and outside the matrix."""
    y = tl.load(Y + offs_m, mask=mask_m, other=ignore_index)
    lse = tl.load(LSE + offs_m, mask=mask_m, other=0.0)
    z = vocab_blockwise_ce_logits_tile(H, W, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                                       BLOCK_M, BLOCK_V, BLOCK_D)
    g = tl.exp(z - lse[:, None]) - tl.where(offs_v[None, :] == y[:, None], 1.0, 0.0)
    return tl.where((mask_m & (y != ignore_index))[:, None] & mask_v[None, :], g, 0.0)


@triton.jit
def vocab_blockwise_ce_fwd_kernel(H, W, Y, LSE, LOSS_TOK, N, V, D, stride_h, stride_w, ignore_index,
                                  BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """BLOCK_M tokens: lse by an online logsumexp over vocabulary tiles (running max m, running sum s of exp(z - m),
    rescaled when m grows), the target logit by the indexed dot H[i] . W[y_i]; LSE[i] = lse_i (kept for backward),
    LOSS_TOK[i] = lse_i - z[i, y_i], 0 where y_i is ignored."""
    pid = tl.program_id(0).to(tl.int64)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < N
    y = tl.load(Y + offs_m, mask=mask_m, other=ignore_index)
    valid = mask_m & (y != ignore_index)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    s_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs_v = tl.cast(v0, tl.int64) + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        z = vocab_blockwise_ce_logits_tile(H, W, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                                           BLOCK_M, BLOCK_V, BLOCK_D)
        z = tl.where(mask_v[None, :], z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        s_i = s_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m_i = m_new
    lse = m_i + tl.log(s_i)
    target = tl.where(valid, y, 0)
    z_y = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask = valid[:, None] & (offs_d[None, :] < D)
        h = tl.load(H + offs_m[:, None] * stride_h + offs_d[None, :], mask=mask, other=0.0)
        w = tl.load(W + target[:, None] * stride_w + offs_d[None, :], mask=mask, other=0.0)
        z_y += tl.sum(h.to(tl.float32) * w.to(tl.float32), axis=1)
    tl.store(LSE + offs_m, lse, mask=mask_m)
    tl.store(LOSS_TOK + offs_m, tl.where(valid, lse - z_y, 0.0), mask=mask_m)


@triton.jit
def vocab_blockwise_ce_loss_fwd_kernel(LOSS_TOK, Y, LOSS, SCALE, N, ignore_index, MEAN: tl.constexpr,
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


def _check(h, W, y, reduction):
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if h.dim() != 2 or W.dim() != 2 or h.shape[1] != W.shape[1] or y.shape != (h.shape[0],):
        raise ValueError(f"expected h [N, D], W [V, D], y [N]; got {tuple(h.shape)}, {tuple(W.shape)}, "
                         f"{tuple(y.shape)}")
    return (h if h.stride(-1) == 1 else h.contiguous(), W if W.stride(-1) == 1 else W.contiguous(),
            y.contiguous())


def _forward(ctx, h, W, y, ignore_index, reduction):
    """The loss; saves h, W, y, lse and the loss scale for the backward pass, which recomputes the logits."""
    h, W, y = _check(h, W, y, reduction)
    n, d = h.shape
    v = W.shape[0]
    lse = torch.empty(n, dtype=torch.float32, device=h.device)
    loss_tok = torch.empty(n, dtype=torch.float32, device=h.device)
    settings = target_settings(h.device)
    vocab_blockwise_ce_fwd_kernel[(triton.cdiv(n, BLOCK_M),)](
        h, W, y, lse, loss_tok, n, v, d, h.stride(0), W.stride(0), ignore_index,
        BLOCK_M=BLOCK_M, BLOCK_V=settings["block_v"], BLOCK_D=settings["block_d"], num_warps=settings["num_warps"])
    loss = torch.empty((), dtype=torch.float32, device=h.device)
    scale = torch.empty(1, dtype=torch.float32, device=h.device)
    vocab_blockwise_ce_loss_fwd_kernel[(1,)](loss_tok, y, loss, scale, n, ignore_index, MEAN=reduction == "mean",
                                             BLOCK=LOSS_BLOCK)
    ctx.save_for_backward(h, W, y, lse, scale)
    ctx.ignore_index = ignore_index
    return loss


@triton.jit
def vocab_blockwise_ce_dh_bwd_kernel(H, W, Y, LSE, GRAD_LOSS, SCALE, DH_ACC, DH, N, V, D, stride_h, stride_w,
                                     stride_dh, ignore_index, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                                     BLOCK_D: tl.constexpr):
    """BLOCK_M token rows of dh = dlogits @ W, looping over the vocabulary tiles: each logits tile is recomputed,
    G = exp(z - lse) - onehot, and DH_ACC[rows] += (G @ W[tile]) * grad_loss * scale in float32 (this program owns
    the rows: deterministic); then DH[rows] = DH_ACC[rows] in the input dtype."""
    pid = tl.program_id(0).to(tl.int64)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < N
    factor = tl.load(GRAD_LOSS).to(tl.float32) * tl.load(SCALE)
    for v0 in range(0, V, BLOCK_V):
        offs_v = tl.cast(v0, tl.int64) + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        g = vocab_blockwise_ce_logits_grad(H, W, Y, LSE, offs_m, offs_v, mask_m, mask_v, D, stride_h, stride_w,
                                           ignore_index, BLOCK_M, BLOCK_V, BLOCK_D)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            mask_d = offs_d < D
            w = tl.load(W + offs_v[:, None] * stride_w + offs_d[None, :], mask=mask_v[:, None] & mask_d[None, :],
                        other=0.0)
            ptrs = DH_ACC + offs_m[:, None] * stride_dh + offs_d[None, :]
            mask = mask_m[:, None] & mask_d[None, :]
            part = tl.dot(g.to(w.dtype), w, input_precision="ieee") * factor
            tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + part, mask=mask)
        tl.debug_barrier()  # the next vocabulary tile reads back what this one stored, maybe from other threads
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask = mask_m[:, None] & (offs_d[None, :] < D)
        acc = tl.load(DH_ACC + offs_m[:, None] * stride_dh + offs_d[None, :], mask=mask, other=0.0)
        tl.store(DH + offs_m[:, None] * stride_dh + offs_d[None, :], acc.to(DH.dtype.element_ty), mask=mask)


@triton.jit
def vocab_blockwise_ce_dw_bwd_kernel(H, W, Y, LSE, GRAD_LOSS, SCALE, DW_ACC, DW, N, V, D, stride_h, stride_w,
                                     stride_dw, ignore_index, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                                     BLOCK_D: tl.constexpr):
    """BLOCK_V vocabulary rows of dW = dlogits^T @ h, looping over the token tiles (a loop over token blocks per
    vocabulary block): each logits tile is recomputed, DW_ACC[tile] += (G^T @ H[tokens]) * grad_loss * scale in
    float32 (this program owns the rows: deterministic); then DW[tile] = DW_ACC[tile] in the input dtype."""
    pid = tl.program_id(0).to(tl.int64)
    offs_v = pid * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < V
    factor = tl.load(GRAD_LOSS).to(tl.float32) * tl.load(SCALE)
    for m0 in range(0, N, BLOCK_M):
        offs_m = tl.cast(m0, tl.int64) + tl.arange(0, BLOCK_M)
        mask_m = offs_m < N
        gt = tl.trans(vocab_blockwise_ce_logits_grad(H, W, Y, LSE, offs_m, offs_v, mask_m, mask_v, D, stride_h,
                                                     stride_w, ignore_index, BLOCK_M, BLOCK_V, BLOCK_D))
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            mask_d = offs_d < D
            h = tl.load(H + offs_m[:, None] * stride_h + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :],
                        other=0.0)
            ptrs = DW_ACC + offs_v[:, None] * stride_dw + offs_d[None, :]
            mask = mask_v[:, None] & mask_d[None, :]
            part = tl.dot(gt.to(h.dtype), h, input_precision="ieee") * factor
            tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + part, mask=mask)
        tl.debug_barrier()  # the next token tile reads back what this one stored, maybe from other threads
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask = mask_v[:, None] & (offs_d[None, :] < D)
        acc = tl.load(DW_ACC + offs_v[:, None] * stride_dw + offs_d[None, :], mask=mask, other=0.0)
        tl.store(DW + offs_v[:, None] * stride_dw + offs_d[None, :], acc.to(DW.dtype.element_ty), mask=mask)


class VocabBlockwiseCEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, y, ignore_index, reduction):
        return _forward(ctx, h, W, y, ignore_index, reduction)

    @staticmethod
    def backward(ctx, grad_loss):
        h, W, y, lse, scale = ctx.saved_tensors
        n, d = h.shape
        v = W.shape[0]
        grad_loss = grad_loss.contiguous()
        dh = dw = None
        settings = target_settings(h.device)
        warps, block_v, block_d = settings["num_warps"], settings["block_v"], settings["block_d"]
        if ctx.needs_input_grad[0]:
            dh_acc = torch.zeros((n, d), dtype=torch.float32, device=h.device)
            dh = torch.empty((n, d), dtype=h.dtype, device=h.device)
            vocab_blockwise_ce_dh_bwd_kernel[(triton.cdiv(n, BLOCK_M),)](
                h, W, y, lse, grad_loss, scale, dh_acc, dh, n, v, d, h.stride(0), W.stride(0), dh.stride(0),
                ctx.ignore_index, BLOCK_M=BLOCK_M, BLOCK_V=block_v, BLOCK_D=block_d, num_warps=warps)
        if ctx.needs_input_grad[1]:
            dw_acc = torch.zeros((v, d), dtype=torch.float32, device=h.device)
            dw = torch.empty((v, d), dtype=W.dtype, device=h.device)
            vocab_blockwise_ce_dw_bwd_kernel[(triton.cdiv(v, block_v),)](
                h, W, y, lse, grad_loss, scale, dw_acc, dw, n, v, d, h.stride(0), W.stride(0), dw.stride(0),
                ctx.ignore_index, BLOCK_M=BLOCK_M, BLOCK_V=block_v, BLOCK_D=block_d, num_warps=warps)
        return dh, dw, None, None, None


def run(h, W, y, ignore_index, reduction):
    """h [N, D], W [V, D] float32/float16/bfloat16, y [N] int64 -> loss, a 0-dim float32 tensor; the backward pass
    recomputes the logits, once for dh and once for dW."""
    return VocabBlockwiseCEFunction.apply(h, W, y, ignore_index, reduction)
