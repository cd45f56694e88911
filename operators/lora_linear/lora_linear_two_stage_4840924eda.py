"""lora_linear candidate rendered from templates/lora_linear/two_stage.py.j2.

two kernels per product; the low-rank intermediate (x A^T, dy B) first, then one GEMM that adds it in its epilogue
params: BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, XA_DTYPE=float16, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "lora_linear"
TEMPLATE = "two_stage"
BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 32
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {}


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
# Warps of every launch per target; the adapter gradients' dots take float32 operands when XA_DTYPE is float32:
# float32-accurate on the tensor cores through split operands (3xTF32 on NVIDIA, 6xBF16 on AMD; the interpreter
# multiplies in float32 itself). EPILOGUE_DOT: the same for the main GEMM's rank-r epilogue dot (float32 low-rank
# intermediate). On NVIDIA an IEEE float32 dot there runs off the tensor cores and overflows a thread's registers,
# 3xTF32 does not; AMD keeps the IEEE dot, which fits its registers, where 6xBF16 would nearly triple them. The GEMMs
# take 8 warps on NVIDIA: their tiles do not fit 4. `workbench targets` shows each launch's registers and spills per
# target.
LAUNCH_SETTINGS = {
    "default": {"num_warps": 4, "EPILOGUE_DOT": "ieee"},
    "interpreter": {"DOT": "ieee"},
    "cuda": {"DOT": "tf32x3", "EPILOGUE_DOT": "tf32x3"},
    "hip": {"DOT": "bf16x6"},
}


@triton.jit
def lora_linear_lowrank_kernel(X, A, OUT_LR, N, K, R, stride_x, stride_a_r, stride_a_k, stride_o,
                               BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    """Stage 1: OUT_LR [N, R] = X [N, K] M^T with M read as M[r, k] = A + r * stride_a_r + k * stride_a_k, i.e.
    xa = x A^T (A [R, IN]: strides (IN, 1)) forward and dyb = dy B (B [OUT, R]: strides (1, R)) backward. One program
    per BLOCK_M rows, looping over K once; float32 accumulation and result."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = tl.cast(k0, tl.int64) + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=(rows[:, None] < N) & kmask[None, :], other=0.0)
        m_t = tl.load(A + rk[None, :] * stride_a_r + ks[:, None] * stride_a_k, mask=kmask[:, None] & (rk[None, :] < R),
                      other=0.0)  # [BLOCK_K, BLOCK_R]
        acc = tl.dot(x, m_t, acc, input_precision="ieee")
    tl.store(OUT_LR + rows[:, None] * stride_o + rk[None, :], acc, mask=(rows[:, None] < N) & (rk[None, :] < R))


@triton.jit
def lora_linear_gemm_kernel(X, W, LR, U, Y, N, K, M_OUT, R, scaling, stride_x, stride_w_k, stride_w_n, stride_lr,
                            stride_u_r, stride_u_n, stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, EPILOGUE_DOT: tl.constexpr):
    """Stage 2: Y [N, M_OUT] = X [N, K] W' + scaling * LR [N, R] U' in one GEMM with the low-rank term in its
    epilogue; W'[k, n] = W + k * stride_w_k + n * stride_w_n, U'[r, n] = U + r * stride_u_r + n * stride_u_n.
    Forward: y = x W^T + scaling * xa B^T (W [OUT, IN], B [OUT, R]); backward: dx = dy W + scaling * dyb A.
    Program (i, j) owns a [BLOCK_M, BLOCK_N] tile; float32 accumulation, stored in Y's dtype."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = tl.cast(k0, tl.int64) + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=(rows[:, None] < N) & kmask[None, :], other=0.0)
        w = tl.load(W + ks[:, None] * stride_w_k + cols[None, :] * stride_w_n,
                    mask=kmask[:, None] & (cols[None, :] < M_OUT), other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(x, w, acc, input_precision="ieee")
    lr = tl.load(LR + rows[:, None] * stride_lr + rk[None, :], mask=(rows[:, None] < N) & (rk[None, :] < R),
                 other=0.0)  # [BLOCK_M, BLOCK_R] float32
    u = tl.load(U + rk[:, None] * stride_u_r + cols[None, :] * stride_u_n,
                mask=(rk[:, None] < R) & (cols[None, :] < M_OUT), other=0.0)  # [BLOCK_R, BLOCK_N]
    acc += tl.dot(lr.to(U.dtype.element_ty), u, input_precision="ieee") * scaling
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], acc.to(Y.dtype.element_ty),
             mask=(rows[:, None] < N) & (cols[None, :] < M_OUT))


@triton.jit
def lora_linear_bwd_da_kernel(DYB, X, DA, N, IN, R, scaling, stride_dyb, stride_x, stride_da,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                              DOT: tl.constexpr):
    """dA [R, IN] = scaling * dyb^T x, dyb = dy B [N, R] float32. One program per BLOCK_N columns of IN, looping over
    the N rows in BLOCK_K steps (a fixed order: deterministic); stored in DA's dtype."""
    cols = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_K):
        ns = tl.cast(n0, tl.int64) + tl.arange(0, BLOCK_K)
        dyb_t = tl.load(DYB + ns[None, :] * stride_dyb + rk[:, None], mask=(ns[None, :] < N) & (rk[:, None] < R),
                        other=0.0)  # [BLOCK_R, BLOCK_K]
        x = tl.load(X + ns[:, None] * stride_x + cols[None, :], mask=(ns[:, None] < N) & (cols[None, :] < IN),
                    other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(dyb_t.to(X.dtype.element_ty), x, acc, input_precision=DOT)
    tl.store(DA + rk[:, None] * stride_da + cols[None, :], (acc * scaling).to(DA.dtype.element_ty),
             mask=(rk[:, None] < R) & (cols[None, :] < IN))


@triton.jit
def lora_linear_bwd_db_kernel(DY, XA, DB, N, OUT, R, scaling, stride_dy, stride_xa, stride_db,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
                              DOT: tl.constexpr):
    """dB [OUT, R] = scaling * dy^T xa, xa = x A^T [N, R] float32 (kept by the forward pass). One program per BLOCK_N
    rows of OUT, looping over the N rows in BLOCK_K steps (a fixed order: deterministic); stored in DB's dtype."""
    outs = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_N, BLOCK_R), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_K):
        ns = tl.cast(n0, tl.int64) + tl.arange(0, BLOCK_K)
        dy_t = tl.load(DY + ns[None, :] * stride_dy + outs[:, None], mask=(ns[None, :] < N) & (outs[:, None] < OUT),
                       other=0.0)  # [BLOCK_N, BLOCK_K]
        xa = tl.load(XA + ns[:, None] * stride_xa + rk[None, :], mask=(ns[:, None] < N) & (rk[None, :] < R),
                     other=0.0)  # [BLOCK_K, BLOCK_R]
        acc = tl.dot(dy_t, xa.to(DY.dtype.element_ty), acc, input_precision=DOT)
    tl.store(DB + outs[:, None] * stride_db + rk[None, :], (acc * scaling).to(DB.dtype.element_ty),
             mask=(outs[:, None] < OUT) & (rk[None, :] < R))


def _lowrank(x, m, m_strides, rank, block_r):
    """x [N, K] times M^T with M [rank, K] given by (pointer, strides) -> [N, rank] float32."""
    n, k = x.shape
    out = torch.empty(n, rank, dtype=torch.float32, device=x.device)
    warps = target_settings(x.device)["num_warps"]
    if out.numel() > 0:
        lora_linear_lowrank_kernel[(triton.cdiv(n, BLOCK_M),)](x, m, out, n, k, rank, x.stride(0), *m_strides,
                                                               out.stride(0), BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K,
                                                               BLOCK_R=block_r, num_warps=warps)
    return out


def _gemm(x, w, w_strides, lr, u, u_strides, scaling, m_out, block_r):
    """x [N, K] W' + scaling * lr [N, rank] U' -> [N, m_out] in x.dtype (W', U' given by pointer and strides)."""
    n, k = x.shape
    rank = lr.shape[1]
    y = torch.empty(n, m_out, dtype=x.dtype, device=x.device)
    settings = target_settings(x.device)
    if y.numel() > 0:
        grid = (triton.cdiv(n, BLOCK_M), triton.cdiv(m_out, BLOCK_N))
        lora_linear_gemm_kernel[grid](x, w, lr, u, y, n, k, m_out, rank, scaling, x.stride(0), *w_strides,
                                     lr.stride(0), *u_strides, y.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                     BLOCK_K=BLOCK_K, BLOCK_R=block_r, EPILOGUE_DOT=settings["EPILOGUE_DOT"],
                                     num_warps=settings["num_warps"])
    return y


class LoRALinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, W, A, B, scaling):
        n, n_in = x.shape
        n_out, rank = B.shape
        x, W, A, B = x.contiguous(), W.contiguous(), A.contiguous(), B.contiguous()
        block_r = max(16, triton.next_power_of_2(rank))
        xa = _lowrank(x, A, (A.stride(0), A.stride(1)), rank, block_r)                 # x A^T  [N, r]
        # W'[k, n] = W[n, k], U'[r, n] = B[n, r]
        y = _gemm(x, W, (W.stride(1), W.stride(0)), xa, B, (B.stride(1), B.stride(0)), scaling, n_out, block_r)
        ctx.save_for_backward(x, W, A, B, xa)
        ctx.scaling, ctx.block_r = scaling, block_r
        return y

    @staticmethod
    def backward(ctx, dy):
        x, W, A, B, xa = ctx.saved_tensors
        n, n_in = x.shape
        n_out, rank = B.shape
        dy = dy.contiguous()
        dyb = _lowrank(dy, B, (B.stride(1), B.stride(0)), rank, ctx.block_r)       # dy B  [N, r]
        # W'[k, n] = W[k, n] over k in OUT, U'[r, n] = A[r, n]
        dx = _gemm(dy, W, (W.stride(0), W.stride(1)), dyb, A, (A.stride(0), A.stride(1)), ctx.scaling, n_in,
                   ctx.block_r)
        dA = torch.empty_like(A)
        dB = torch.empty_like(B)
        settings = target_settings(x.device)
        common = dict(BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, BLOCK_R=ctx.block_r, DOT=settings["DOT"],
                      num_warps=settings["num_warps"])
        if dA.numel() > 0:
            lora_linear_bwd_da_kernel[(triton.cdiv(n_in, BLOCK_N),)](dyb, x, dA, n, n_in, rank, ctx.scaling,
                                                                     dyb.stride(0), x.stride(0), dA.stride(0),
                                                                     **common)
        if dB.numel() > 0:
            lora_linear_bwd_db_kernel[(triton.cdiv(n_out, BLOCK_N),)](dy, xa, dB, n, n_out, rank, ctx.scaling,
                                                                      dy.stride(0), xa.stride(0), dB.stride(0),
                                                                      **common)
        return dx, None, dA, dB, None


def run(x, W, A, B, scaling):
    """x [N, IN], W [OUT, IN] (frozen: no gradient), A [r, IN], B [OUT, r], all float32/float16/bfloat16, same dtype
    -> y [N, OUT] in x.dtype."""
    return LoRALinearFunction.apply(x, W, A, B, scaling)
