"""seq_chunked_ce candidate rendered from templates/seq_chunked_ce/chunk_logits.py.j2.

Liger FLCE; per token chunk, float32 logits in a [chunk, V] buffer, softmax-grad in place, dh and dW matmuls
params: MEM_RATIO=2, BLOCK_M=64, BLOCK_V=128, BLOCK_D=64, num_warps=4, DLOGITS_DTYPE=input
launch on sm_100a: dh_block_v=64, num_warps=8, softmax_cols=64
launch on sm_80: dh_block_v=64, num_warps=8, softmax_cols=64
launch on sm_90a: dh_block_v=64, num_warps=8, softmax_cols=64
"""
import torch
import triton
import triton.language as tl

BLOCK = "seq_chunked_ce"
TEMPLATE = "chunk_logits"
MEM_RATIO = 2  # the chunk's float32 logits hold about MEM_RATIO x N x D elements
BLOCK_M = 64
BLOCK_V = 128
BLOCK_D = 64
LOSS_BLOCK = 1024
SCALE_BLOCK = 4096
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'dh_block_v': 64, 'num_warps': 8, 'softmax_cols': 64}, 'sm_80': {'dh_block_v': 64, 'num_warps': 8, 'softmax_cols': 64}, 'sm_90a': {'dh_block_v': 64, 'num_warps': 8, 'softmax_cols': 64}}


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
# Launch settings of the chunk kernels per target. Warps: the logits, dh and dw GEMMs' 64 x 128 float32 tiles fit a
# thread's registers over 8 warps on NVIDIA, not over 4. softmax_rows x softmax_cols: the row softmax's own tile. Over
# the GEMMs' 64 x 128 tile the compiler spreads the warps over the columns and gives each thread 32 rows of per-row
# statistics, more than its registers hold; 8 rows x 1024 columns give it 8. dh_block_v: the dh GEMM's reduction step
# over the vocabulary (64 where 128 would not fit sm_80's registers). `workbench targets` shows each launch's
# registers and spills per target.
LAUNCH_SETTINGS = {"default": {"num_warps": 4, "softmax_rows": 64,
                               "softmax_cols": 128, "dh_block_v": 128}}


@triton.jit
def seq_chunked_ce_logits_fwd_kernel(H, W, Z, rows, V, D, stride_h, stride_w, stride_z,
                                     BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """One [BLOCK_M, BLOCK_V] tile of the chunk's logits: Z[m, v] = sum_d H[m, d] W[v, d], float32 accumulation.
    H [rows, D] and W [V, D] in the input dtype, Z [rows, V] float32."""
    pid_m = tl.program_id(0).to(tl.int64)
    pid_v = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_m = offs_m < rows
    mask_v = offs_v < V
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        h = tl.load(H + offs_m[:, None] * stride_h + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :],
                    other=0.0)
        w = tl.load(W + offs_v[None, :] * stride_w + offs_d[:, None], mask=mask_v[None, :] & mask_d[:, None],
                    other=0.0)
        acc = tl.dot(h, w, acc, input_precision="ieee")
    tl.store(Z + offs_m[:, None] * stride_z + offs_v[None, :], acc, mask=mask_m[:, None] & mask_v[None, :])


@triton.jit
def seq_chunked_ce_softmax_fwd_kernel(Z, Y, LOSS_TOK, rows, V, stride_z, ignore_index, WRITE_GRAD: tl.constexpr,
                                      BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    """BLOCK_M rows of the chunk's logits Z [rows, V] float32. First pass: online logsumexp over the vocabulary
    tiles and the target logit; LOSS_TOK[m] = lse - z[m, y_m], 0 where y_m is ignored. Second pass (WRITE_GRAD):
    Z is overwritten in place by the unscaled logits gradient softmax(z) - onehot(y), zero rows where ignored."""
    pid = tl.program_id(0).to(tl.int64)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < rows
    y = tl.load(Y + offs_m, mask=mask_m, other=ignore_index)
    valid = mask_m & (y != ignore_index)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    s_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    z_y = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs_v = tl.cast(v0, tl.int64) + tl.arange(0, BLOCK_V)
        in_v = offs_v[None, :] < V
        z = tl.load(Z + offs_m[:, None] * stride_z + offs_v[None, :], mask=mask_m[:, None] & in_v, other=0.0)
        z = tl.where(in_v, z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        s_i = s_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
        m_i = m_new
        z_y += tl.sum(tl.where(offs_v[None, :] == y[:, None], z, 0.0), axis=1)
    lse = m_i + tl.log(s_i)
    tl.store(LOSS_TOK + offs_m, tl.where(valid, lse - z_y, 0.0), mask=mask_m)
    if WRITE_GRAD:
        for v0 in range(0, V, BLOCK_V):
            offs_v = tl.cast(v0, tl.int64) + tl.arange(0, BLOCK_V)
            mask = mask_m[:, None] & (offs_v[None, :] < V)
            ptrs = Z + offs_m[:, None] * stride_z + offs_v[None, :]
            z = tl.load(ptrs, mask=mask, other=0.0)
            grad = tl.exp(z - lse[:, None]) - tl.where(offs_v[None, :] == y[:, None], 1.0, 0.0)
            tl.store(ptrs, tl.where(valid[:, None], grad, 0.0), mask=mask)


@triton.jit
def seq_chunked_ce_dh_fwd_kernel(G, W, DH, rows, V, D, stride_g, stride_w, stride_dh,
                                 BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """One [BLOCK_M, BLOCK_D] tile of DH = G @ W: G [rows, V] the chunk's unscaled logits gradient (float32),
    W [V, D] input dtype, DH [rows, D] float32."""
    pid_m = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_m = offs_m < rows
    mask_d = offs_d < D
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs_v = tl.cast(v0, tl.int64) + tl.arange(0, BLOCK_V)
        mask_v = offs_v < V
        g = tl.load(G + offs_m[:, None] * stride_g + offs_v[None, :], mask=mask_m[:, None] & mask_v[None, :],
                    other=0.0)
        w = tl.load(W + offs_v[:, None] * stride_w + offs_d[None, :], mask=mask_v[:, None] & mask_d[None, :],
                    other=0.0)
        acc = tl.dot(g.to(w.dtype), w, acc, input_precision="ieee")
    tl.store(DH + offs_m[:, None] * stride_dh + offs_d[None, :], acc, mask=mask_m[:, None] & mask_d[None, :])


@triton.jit
def seq_chunked_ce_dw_fwd_kernel(G, H, DW, rows, V, D, stride_g, stride_h, stride_dw,
                                 BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """One [BLOCK_V, BLOCK_D] tile of DW += G^T @ H over the chunk's rows: G [rows, V] float32, H [rows, D] input
    dtype, DW [V, D] the float32 accumulator of all chunks (launches run in order: no two programs share a tile)."""
    pid_v = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1).to(tl.int64)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_v = offs_v < V
    mask_d = offs_d < D
    acc = tl.zeros((BLOCK_V, BLOCK_D), dtype=tl.float32)
    for m0 in range(0, rows, BLOCK_M):
        offs_m = tl.cast(m0, tl.int64) + tl.arange(0, BLOCK_M)
        mask_m = offs_m < rows
        gt = tl.load(G + offs_m[None, :] * stride_g + offs_v[:, None], mask=mask_m[None, :] & mask_v[:, None],
                     other=0.0)
        h = tl.load(H + offs_m[:, None] * stride_h + offs_d[None, :], mask=mask_m[:, None] & mask_d[None, :],
                    other=0.0)
        acc = tl.dot(gt.to(h.dtype), h, acc, input_precision="ieee")
    ptrs = DW + offs_v[:, None] * stride_dw + offs_d[None, :]
    mask = mask_v[:, None] & mask_d[None, :]
    tl.store(ptrs, tl.load(ptrs, mask=mask, other=0.0) + acc, mask=mask)


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


def chunk_rows(n, v, d):
    """Liger's chunk size, a power of two such that chunk x V is about MEM_RATIO x N x D, but at least one token
    tile (a shorter chunk would leave rows of every tile masked) and at most N."""
    per = triton.cdiv(v, MEM_RATIO * d)
    return min(n, max(BLOCK_M, triton.next_power_of_2(triton.cdiv(n, per))))


class SeqChunkedCEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, y, ignore_index, reduction):
        h, W, y = _check(h, W, y, reduction)
        n, d = h.shape
        v = W.shape[0]
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        chunk = chunk_rows(n, v, d)
        logits = torch.empty((chunk, v), dtype=torch.float32, device=h.device)  # reused by every chunk
        loss_tok = torch.empty(n, dtype=torch.float32, device=h.device)
        dh_acc = torch.empty((n, d), dtype=torch.float32, device=h.device) if need_dh else None
        dw_acc = torch.zeros((v, d), dtype=torch.float32, device=h.device) if need_dw else None
        settings = target_settings(h.device)
        warps, soft_rows, soft_cols = settings["num_warps"], settings["softmax_rows"], settings["softmax_cols"]
        dh_block_v = settings["dh_block_v"]
        for start in range(0, n, chunk):
            rows = min(chunk, n - start)
            hc, yc, z = h[start:start + rows], y[start:start + rows], logits[:rows]
            seq_chunked_ce_logits_fwd_kernel[(triton.cdiv(rows, BLOCK_M), triton.cdiv(v, BLOCK_V))](
                hc, W, z, rows, v, d, hc.stride(0), W.stride(0), z.stride(0),
                BLOCK_M=BLOCK_M, BLOCK_V=BLOCK_V, BLOCK_D=BLOCK_D, num_warps=warps)
            seq_chunked_ce_softmax_fwd_kernel[(triton.cdiv(rows, soft_rows),)](
                z, yc, loss_tok[start:start + rows], rows, v, z.stride(0), ignore_index,
                WRITE_GRAD=need_dh or need_dw, BLOCK_M=soft_rows, BLOCK_V=soft_cols, num_warps=warps)
            if need_dh:
                dhc = dh_acc[start:start + rows]
                seq_chunked_ce_dh_fwd_kernel[(triton.cdiv(rows, BLOCK_M), triton.cdiv(d, BLOCK_D))](
                    z, W, dhc, rows, v, d, z.stride(0), W.stride(0), dhc.stride(0),
                    BLOCK_M=BLOCK_M, BLOCK_V=dh_block_v, BLOCK_D=BLOCK_D, num_warps=warps)
            if need_dw:
                seq_chunked_ce_dw_fwd_kernel[(triton.cdiv(v, BLOCK_V), triton.cdiv(d, BLOCK_D))](
                    z, hc, dw_acc, rows, v, d, z.stride(0), hc.stride(0), dw_acc.stride(0),
                    BLOCK_M=BLOCK_M, BLOCK_V=BLOCK_V, BLOCK_D=BLOCK_D, num_warps=warps)
        return _finish_forward(ctx, loss_tok, y, ignore_index, reduction, dh_acc, dw_acc, h, W)

    @staticmethod
    def backward(ctx, grad_loss):
        dh_acc, dw_acc, scale = ctx.saved_tensors
        grad_loss = grad_loss.contiguous()
        return (_scaled(dh_acc, ctx.dtypes[0], grad_loss, scale), _scaled(dw_acc, ctx.dtypes[1], grad_loss, scale),
                None, None, None)


def run(h, W, y, ignore_index, reduction):
    """h [N, D], W [V, D] float32/float16/bfloat16, y [N] int64 -> loss, a 0-dim float32 tensor; the gradients of
    h and W are computed here, chunk by chunk, and only scaled by the backward pass."""
    return SeqChunkedCEFunction.apply(h, W, y, ignore_index, reduction)
