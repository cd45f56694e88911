"""moe_grouped_gemm candidate rendered from templates/moe_grouped_gemm/tile_map.py.j2.

one program per (row tile, column tile) of every group, from a tile map built on the device; saves a, b, h for the backward
params: BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4, ACT_DTYPE=input
"""
import torch
import triton
import triton.language as tl

BLOCK = "moe_grouped_gemm"
TEMPLATE = "tile_map"
BLOCK_M = 32
BLOCK_N = 32
BLOCK_K = 32
ACT_DTYPE = "input"
BLOCK_SLOTS = 16  # slots of the tile map per step: a [BLOCK_SLOTS, E_PAD] comparison lives in registers
TILE_MAP_WARPS = 4  # BLOCK_SLOTS x E_PAD int32 compares fit 4 warps' registers (int64 slots would not)
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
# Warps of the GEMM kernels per target: at 64 x 64 x 64 tiles the accumulators, operands and epilogue fit a thread's
# registers over 8 warps on NVIDIA, not over 4. `workbench targets` shows each launch's registers and spills per
# target.
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def moe_grouped_gemm_tiles_fwd_kernel(OFFSETS, TILE_EXPERT, TILE_ROW, M, E, n_slots, BLOCK_M: tl.constexpr,
                                      E_PAD: tl.constexpr, BLOCK_SLOTS: tl.constexpr):
    """The tile map: row tiles of BLOCK_M rows, group after group (group E is the tail [OFFSETS[E], M) of rows in
    no group); slot s gets TILE_EXPERT[s] (group, -1 past the last tile) and TILE_ROW[s] (its first row). n_slots =
    cdiv(M, BLOCK_M) + E + 1 bounds the tile count, so the host never reads OFFSETS."""
    c = tl.arange(0, E_PAD)
    lo = tl.load(OFFSETS + c, mask=c <= E, other=0)
    hi = tl.load(OFFSETS + c + 1, mask=c < E, other=0)
    hi = tl.where(c == E, M, hi)
    ntiles = tl.where(c <= E, (hi - lo + BLOCK_M - 1) // BLOCK_M, 0).to(tl.int32)  # tile counts fit 32 bits
    end = tl.cumsum(ntiles, axis=0)  # tiles of groups 0..c
    for s0 in range(0, n_slots, BLOCK_SLOTS):
        s = s0 + tl.arange(0, BLOCK_SLOTS)
        before = end[None, :] <= s[:, None]  # groups whose tiles all come before slot s
        group = tl.sum(before.to(tl.int32), axis=1)
        first_tile = tl.sum(tl.where(before, ntiles[None, :], 0), axis=1)
        group_lo = tl.load(OFFSETS + group, mask=group <= E, other=0)
        valid = group <= E
        tl.store(TILE_EXPERT + s, tl.where(valid, group, -1), mask=s < n_slots)
        tl.store(TILE_ROW + s, tl.where(valid, group_lo + (s - first_tile) * BLOCK_M, 0), mask=s < n_slots)


@triton.jit
def moe_grouped_gemm_up_fwd_kernel(X, W1, W3, TILE_EXPERT, TILE_ROW, OFFSETS, A, B, H, D, F, E,
                                   stride_x, stride_we, stride_wf, stride_act,
                                   beta, linear_beta, limit, alpha, up_offset, DOT: tl.constexpr,
                                   PREC: tl.constexpr, ACT: tl.constexpr,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (slot, F tile): for the slot's expert e and rows, a = x W1[e]^T and b = x W3[e]^T over D in BLOCK_K
    steps (operands in DOT, float32 accumulators), h = act(a, b) (SwiGLU or SiTU by ACT); stores a, b (for the backward pass) and h in
    the activation buffers' dtype. Slots of the tail group or past the last tile do nothing."""
    slot = tl.program_id(0)
    ex = tl.load(TILE_EXPERT + slot)
    if (ex >= 0) & (ex < E):
        ex64 = ex.to(tl.int64)
        rows = tl.load(TILE_ROW + slot) + tl.arange(0, BLOCK_M)
        rmask = rows < tl.load(OFFSETS + ex64 + 1)
        f = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc_a = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
        acc_b = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
        for k0 in range(0, D, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(X + rows[:, None] * stride_x + kk[None, :], mask=rmask[:, None] & (kk[None, :] < D),
                         other=0.0)
            wmask = (f[None, :] < F) & (kk[:, None] < D)
            w1 = tl.load(W1 + ex64 * stride_we + f[None, :] * stride_wf + kk[:, None], mask=wmask, other=0.0)
            w3 = tl.load(W3 + ex64 * stride_we + f[None, :] * stride_wf + kk[:, None], mask=wmask, other=0.0)
            acc_a = tl.dot(xt.to(DOT), w1.to(DOT), acc_a, input_precision=PREC)
            acc_b = tl.dot(xt.to(DOT), w3.to(DOT), acc_b, input_precision=PREC)
        if ACT == 1:  # SiTU: beta tanh(a / beta) sigmoid(a) * linear_beta tanh(b / linear_beta)
            # h_tg = tanh(acc_a / beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
            # series where |x| < 1/8 (there 1 - e cancels)
            h_tg_x = acc_a / beta
            h_tg_a = tl.abs(h_tg_x)
            h_tg_e = tl.exp(-2.0 * h_tg_a)
            h_tg_a2 = h_tg_a * h_tg_a
            h_tg = tl.where(h_tg_a < 0.125,
                          h_tg_a * (1.0 + h_tg_a2 * (-1.0 / 3.0 + h_tg_a2 * (2.0 / 15.0 - h_tg_a2 * 17.0 / 315.0))),
                          (1.0 - h_tg_e) / (1.0 + h_tg_e))
            h_tg = tl.where(h_tg_x < 0.0, -h_tg, h_tg)
            # h_tu = tanh(acc_b / linear_beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
            # series where |x| < 1/8 (there 1 - e cancels)
            h_tu_x = acc_b / linear_beta
            h_tu_a = tl.abs(h_tu_x)
            h_tu_e = tl.exp(-2.0 * h_tu_a)
            h_tu_a2 = h_tu_a * h_tu_a
            h_tu = tl.where(h_tu_a < 0.125,
                          h_tu_a * (1.0 + h_tu_a2 * (-1.0 / 3.0 + h_tu_a2 * (2.0 / 15.0 - h_tu_a2 * 17.0 / 315.0))),
                          (1.0 - h_tu_e) / (1.0 + h_tu_e))
            h_tu = tl.where(h_tu_x < 0.0, -h_tu, h_tu)
            h = beta * h_tg / (1.0 + tl.exp(-acc_a)) * (linear_beta * h_tu)
        else:  # SwiGLU: g sigmoid(alpha g) u, g = min(a, limit), u = clamp(b, -limit, limit) + up_offset
            h_g = tl.minimum(acc_a, limit)
            h = h_g / (1.0 + tl.exp(-alpha * h_g)) * (
                tl.minimum(tl.maximum(acc_b, -limit), limit) + up_offset)
        ptr = rows[:, None] * stride_act + f[None, :]
        omask = rmask[:, None] & (f[None, :] < F)
        tl.store(A + ptr, acc_a.to(A.dtype.element_ty), mask=omask)
        tl.store(B + ptr, acc_b.to(B.dtype.element_ty), mask=omask)
        tl.store(H + ptr, h.to(H.dtype.element_ty), mask=omask)


@triton.jit
def moe_grouped_gemm_down_fwd_kernel(H, W2, TILE_EXPERT, TILE_ROW, OFFSETS, Y, M, D, F, E,
                                     stride_act, stride_we, stride_wd, stride_y,
                                     DOT: tl.constexpr, PREC: tl.constexpr,
                                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (slot, D tile): y = h W2[e]^T over F in BLOCK_K steps; tail-group slots write zeros."""
    slot = tl.program_id(0)
    ex = tl.load(TILE_EXPERT + slot)
    if ex >= 0:
        ex64 = ex.to(tl.int64)
        rows = tl.load(TILE_ROW + slot) + tl.arange(0, BLOCK_M)
        row_end = tl.load(OFFSETS + ex64 + 1, mask=ex < E, other=M)
        rmask = rows < row_end
        n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
        if ex < E:
            for k0 in range(0, F, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                h = tl.load(H + rows[:, None] * stride_act + kk[None, :], mask=rmask[:, None] & (kk[None, :] < F),
                            other=0.0)
                w2 = tl.load(W2 + ex64 * stride_we + n[None, :] * stride_wd + kk[:, None],
                             mask=(n[None, :] < D) & (kk[:, None] < F), other=0.0)
                acc = tl.dot(h.to(DOT), w2.to(DOT), acc, input_precision=PREC)
        tl.store(Y + rows[:, None] * stride_y + n[None, :], acc.to(Y.dtype.element_ty),
                 mask=rmask[:, None] & (n[None, :] < D))


@triton.jit
def moe_grouped_gemm_dh_bwd_kernel(DY, W2, A, B, TILE_EXPERT, TILE_ROW, OFFSETS, DA, DB, D, F, E,
                                   stride_dy, stride_we, stride_wd, stride_act,
                                   beta, linear_beta, limit, alpha, up_offset, DOT: tl.constexpr,
                                   PREC: tl.constexpr, ACT: tl.constexpr,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (slot, F tile): dh = dy W2[e] over D; da = dh d act/da and db = dh d act/db (SwiGLU or SiTU by
    ACT), from the saved a and b; stored in the activation dtype."""
    slot = tl.program_id(0)
    ex = tl.load(TILE_EXPERT + slot)
    if (ex >= 0) & (ex < E):
        ex64 = ex.to(tl.int64)
        rows = tl.load(TILE_ROW + slot) + tl.arange(0, BLOCK_M)
        rmask = rows < tl.load(OFFSETS + ex64 + 1)
        f = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        dh = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
        for k0 in range(0, D, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            dy = tl.load(DY + rows[:, None] * stride_dy + kk[None, :], mask=rmask[:, None] & (kk[None, :] < D),
                         other=0.0)
            w2 = tl.load(W2 + ex64 * stride_we + kk[:, None] * stride_wd + f[None, :],
                         mask=(kk[:, None] < D) & (f[None, :] < F), other=0.0)
            dh = tl.dot(dy.to(DOT), w2.to(DOT), dh, input_precision=PREC)
        ptr = rows[:, None] * stride_act + f[None, :]
        omask = rmask[:, None] & (f[None, :] < F)
        a = tl.load(A + ptr, mask=omask, other=0.0).to(tl.float32)
        b = tl.load(B + ptr, mask=omask, other=0.0).to(tl.float32)
        if ACT == 1:  # d/da = u ((1 - tg^2) s + beta tg s (1 - s)), d/db = g (1 - tu^2), s = sigmoid(a)
            da_s = 1.0 / (1.0 + tl.exp(-a))
            # da_tg = tanh(a / beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
            # series where |x| < 1/8 (there 1 - e cancels)
            da_tg_x = a / beta
            da_tg_a = tl.abs(da_tg_x)
            da_tg_e = tl.exp(-2.0 * da_tg_a)
            da_tg_a2 = da_tg_a * da_tg_a
            da_tg = tl.where(da_tg_a < 0.125,
                          da_tg_a * (1.0 + da_tg_a2 * (-1.0 / 3.0 + da_tg_a2 * (2.0 / 15.0 - da_tg_a2 * 17.0 / 315.0))),
                          (1.0 - da_tg_e) / (1.0 + da_tg_e))
            da_tg = tl.where(da_tg_x < 0.0, -da_tg, da_tg)
            # da_tu = tanh(b / linear_beta) without overflow: sign * (1 - e) / (1 + e), e = exp(-2|x|), and the odd Taylor
            # series where |x| < 1/8 (there 1 - e cancels)
            da_tu_x = b / linear_beta
            da_tu_a = tl.abs(da_tu_x)
            da_tu_e = tl.exp(-2.0 * da_tu_a)
            da_tu_a2 = da_tu_a * da_tu_a
            da_tu = tl.where(da_tu_a < 0.125,
                          da_tu_a * (1.0 + da_tu_a2 * (-1.0 / 3.0 + da_tu_a2 * (2.0 / 15.0 - da_tu_a2 * 17.0 / 315.0))),
                          (1.0 - da_tu_e) / (1.0 + da_tu_e))
            da_tu = tl.where(da_tu_x < 0.0, -da_tu, da_tu)
            da = dh * (linear_beta * da_tu) * ((1.0 - da_tg * da_tg) * da_s +
                       beta * da_tg * da_s * (1.0 - da_s))
            db = dh * (beta * da_tg * da_s) * (1.0 - da_tu * da_tu)
        else:  # SwiGLU: d/da = u s (1 + alpha g (1 - s)) where a <= limit, d/db = g s where |b| <= limit, else 0
            da_g = tl.minimum(a, limit)
            da_s = 1.0 / (1.0 + tl.exp(-alpha * da_g))  # sigmoid(alpha g)
            da_u = tl.minimum(tl.maximum(b, -limit), limit) + up_offset
            da = tl.where(a <= limit, dh * da_u * da_s * (
                1.0 + alpha * da_g * (1.0 - da_s)), 0.0)
            db = tl.where((b >= -limit) & (b <= limit), dh * da_g * da_s, 0.0)
        tl.store(DA + ptr, da.to(DA.dtype.element_ty), mask=omask)
        tl.store(DB + ptr, db.to(DB.dtype.element_ty), mask=omask)


@triton.jit
def moe_grouped_gemm_dx_bwd_kernel(DA, DB, W1, W3, TILE_EXPERT, TILE_ROW, OFFSETS, DX, M, D, F, E,
                                   stride_act, stride_we, stride_wf, stride_dx,
                                   DOT: tl.constexpr, PREC: tl.constexpr,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (slot, D tile): dx = da W1[e] + db W3[e] over F; tail-group slots write zeros."""
    slot = tl.program_id(0)
    ex = tl.load(TILE_EXPERT + slot)
    if ex >= 0:
        ex64 = ex.to(tl.int64)
        rows = tl.load(TILE_ROW + slot) + tl.arange(0, BLOCK_M)
        row_end = tl.load(OFFSETS + ex64 + 1, mask=ex < E, other=M)
        rmask = rows < row_end
        n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
        if ex < E:
            for k0 in range(0, F, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                amask = rmask[:, None] & (kk[None, :] < F)
                da = tl.load(DA + rows[:, None] * stride_act + kk[None, :], mask=amask, other=0.0)
                db = tl.load(DB + rows[:, None] * stride_act + kk[None, :], mask=amask, other=0.0)
                wmask = (kk[:, None] < F) & (n[None, :] < D)
                w1 = tl.load(W1 + ex64 * stride_we + kk[:, None] * stride_wf + n[None, :], mask=wmask, other=0.0)
                w3 = tl.load(W3 + ex64 * stride_we + kk[:, None] * stride_wf + n[None, :], mask=wmask, other=0.0)
                acc = tl.dot(da.to(DOT), w1.to(DOT), acc, input_precision=PREC)
                acc = tl.dot(db.to(DOT), w3.to(DOT), acc, input_precision=PREC)
        tl.store(DX + rows[:, None] * stride_dx + n[None, :], acc.to(DX.dtype.element_ty),
                 mask=rmask[:, None] & (n[None, :] < D))


@triton.jit
def moe_grouped_gemm_dw_bwd_kernel(DA, DB, X, DY, H, OFFSETS, DW1, DW3, DW2, D, F, stride_act, stride_x, stride_dy,
                                   stride_w13e, stride_w13f, stride_w2e, stride_w2d,
                                   DOT: tl.constexpr, PREC: tl.constexpr,
                                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (expert e, F tile, D tile) walks the expert's rows in order (deterministic, no atomics) and
    accumulates all three weight gradients of that (F, D) tile: dW1[e] = da^T x, dW3[e] = db^T x and
    dW2[e]^T = h^T dy; zeros for an empty expert."""
    ex = tl.program_id(0).to(tl.int64)
    f = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.program_id(2).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    lo = tl.load(OFFSETS + ex)
    hi = tl.load(OFFSETS + ex + 1)
    acc1 = tl.full((BLOCK_N, BLOCK_K), 0, tl.float32)
    acc3 = tl.full((BLOCK_N, BLOCK_K), 0, tl.float32)
    acc2 = tl.full((BLOCK_N, BLOCK_K), 0, tl.float32)  # dW2[e] transposed: [F tile, D tile]
    for r0 in range(lo, hi, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        rmask = rows < hi
        tmask = rmask[None, :] & (f[:, None] < F)
        da = tl.load(DA + rows[None, :] * stride_act + f[:, None], mask=tmask, other=0.0)
        db = tl.load(DB + rows[None, :] * stride_act + f[:, None], mask=tmask, other=0.0)
        ht = tl.load(H + rows[None, :] * stride_act + f[:, None], mask=tmask, other=0.0)
        dmask = rmask[:, None] & (d[None, :] < D)
        x = tl.load(X + rows[:, None] * stride_x + d[None, :], mask=dmask, other=0.0)
        dy = tl.load(DY + rows[:, None] * stride_dy + d[None, :], mask=dmask, other=0.0)
        acc1 = tl.dot(da.to(DOT), x.to(DOT), acc1, input_precision=PREC)
        acc3 = tl.dot(db.to(DOT), x.to(DOT), acc3, input_precision=PREC)
        acc2 = tl.dot(ht.to(DOT), dy.to(DOT), acc2, input_precision=PREC)
    omask = (f[:, None] < F) & (d[None, :] < D)
    ptr = ex * stride_w13e + f[:, None] * stride_w13f + d[None, :]
    tl.store(DW1 + ptr, acc1.to(DW1.dtype.element_ty), mask=omask)
    tl.store(DW3 + ptr, acc3.to(DW3.dtype.element_ty), mask=omask)
    tl.store(DW2 + ex * stride_w2e + d[None, :] * stride_w2d + f[:, None], acc2.to(DW2.dtype.element_ty), mask=omask)


def _dot_config(dtype):
    """Operand dtype and precision of every tl.dot: IEEE float32 for float32 inputs or float32 activations,
    else the input's half type with float32 accumulation."""
    if dtype == torch.float32 or ACT_DTYPE == "float32":
        return {"DOT": tl.float32, "PREC": "ieee"}
    # half operands are exact products on the tensor cores whatever input_precision says; gfx950 accepts no "tf32"
    return {"DOT": tl.float16 if dtype == torch.float16 else tl.bfloat16, "PREC": "ieee"}


ACTIVATIONS = {"swiglu": 0, "situ": 1}


def _activation_args(activation, beta, linear_beta, limit, alpha, up_offset):
    """The activation kernels' ACT (constexpr), beta and linear_beta, limit (inf for None), alpha and up_offset;
    ValueError for an unknown activation, or SiTU with a SwiGLU variant's constants."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation '{activation}' (one of {', '.join(ACTIVATIONS)})")
    if activation == "situ" and (limit, alpha, up_offset) != (None, 1.0, 0.0):
        raise ValueError("limit, alpha and up_offset are SwiGLU's variants: SiTU takes none")
    return {"ACT": ACTIVATIONS[activation], "beta": float(beta), "linear_beta": float(linear_beta),
            "limit": float("inf") if limit is None else float(limit), "alpha": float(alpha),
            "up_offset": float(up_offset)}


class MoEGroupedGemmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, offsets, w1, w3, w2, activation, beta, linear_beta, limit, alpha, up_offset):
        act_args = _activation_args(activation, beta, linear_beta, limit, alpha, up_offset)
        m, d = x.shape
        e, f, _ = w1.shape
        x_c, w1_c, w3_c, w2_c = (t.contiguous() for t in (x, w1, w3, w2))
        offsets_c = offsets.contiguous()
        # a clamp's gradient turns on a <= limit and |b| <= limit: kept a and b are float32 where a limit is set (a
        # half a, rounded across the limit, would flip an element's gradient between its value and 0)
        act = torch.float32 if ACT_DTYPE == "float32" or act_args["limit"] < float("inf") else x.dtype
        n_slots = triton.cdiv(m, BLOCK_M) + e + 1
        tile_expert = torch.empty(n_slots, dtype=torch.int64, device=x.device)
        tile_row = torch.empty(n_slots, dtype=torch.int64, device=x.device)
        a = torch.empty(m, f, dtype=act, device=x.device)
        b = torch.empty(m, f, dtype=act, device=x.device)
        h = torch.empty(m, f, dtype=act, device=x.device)
        y = torch.empty(m, d, dtype=x.dtype, device=x.device)
        dot = _dot_config(x.dtype)
        warps = target_settings(x.device)["num_warps"]
        moe_grouped_gemm_tiles_fwd_kernel[(1,)](offsets_c, tile_expert, tile_row, m, e, n_slots, BLOCK_M=BLOCK_M,
                                                E_PAD=triton.next_power_of_2(e + 1), BLOCK_SLOTS=BLOCK_SLOTS,
                                                num_warps=TILE_MAP_WARPS)
        if m * f > 0:
            moe_grouped_gemm_up_fwd_kernel[(n_slots, triton.cdiv(f, BLOCK_N))](
                x_c, w1_c, w3_c, tile_expert, tile_row, offsets_c, a, b, h, d, f, e, x_c.stride(0), w1_c.stride(0),
                w1_c.stride(1), a.stride(0), **dot, **act_args, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                num_warps=warps)
        if m * d > 0:
            moe_grouped_gemm_down_fwd_kernel[(n_slots, triton.cdiv(d, BLOCK_N))](
                h, w2_c, tile_expert, tile_row, offsets_c, y, m, d, f, e, h.stride(0), w2_c.stride(0),
                w2_c.stride(1), y.stride(0), **dot, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                num_warps=warps)
        ctx.save_for_backward(x_c, offsets_c, w1_c, w3_c, w2_c, tile_expert, tile_row, a, b, h)
        ctx.mark_non_differentiable(offsets)
        ctx.act_args = act_args
        return y

    @staticmethod
    def backward(ctx, dy):
        x_c, offsets_c, w1_c, w3_c, w2_c, tile_expert, tile_row, a, b, h = ctx.saved_tensors
        m, d = x_c.shape
        e, f, _ = w1_c.shape
        n_slots = tile_expert.shape[0]
        dot = _dot_config(x_c.dtype)
        warps = target_settings(x_c.device)["num_warps"]
        dy_c = dy.contiguous()
        da = torch.empty_like(a)
        db = torch.empty_like(b)
        dx = torch.empty(m, d, dtype=x_c.dtype, device=x_c.device)
        dw1 = torch.empty_like(w1_c)
        dw3 = torch.empty_like(w3_c)
        dw2 = torch.empty_like(w2_c)
        if m * f > 0:
            moe_grouped_gemm_dh_bwd_kernel[(n_slots, triton.cdiv(f, BLOCK_N))](
                dy_c, w2_c, a, b, tile_expert, tile_row, offsets_c, da, db, d, f, e, dy_c.stride(0), w2_c.stride(0),
                w2_c.stride(1), a.stride(0), **dot, **ctx.act_args, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                num_warps=warps)
        if m * d > 0:
            moe_grouped_gemm_dx_bwd_kernel[(n_slots, triton.cdiv(d, BLOCK_N))](
                da, db, w1_c, w3_c, tile_expert, tile_row, offsets_c, dx, m, d, f, e, da.stride(0), w1_c.stride(0),
                w1_c.stride(1), dx.stride(0), **dot, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                num_warps=warps)
        if e * f * d > 0:
            moe_grouped_gemm_dw_bwd_kernel[(e, triton.cdiv(f, BLOCK_N), triton.cdiv(d, BLOCK_K))](
                da, db, x_c, dy_c, h, offsets_c, dw1, dw3, dw2, d, f, da.stride(0), x_c.stride(0), dy_c.stride(0),
                dw1.stride(0), dw1.stride(1), dw2.stride(0), dw2.stride(1), **dot, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                BLOCK_K=BLOCK_K, num_warps=warps)
        return dx, None, dw1, dw3, dw2, None, None, None, None, None, None


def run(x, offsets, w1, w3, w2, activation, beta, linear_beta, limit=None, alpha=1.0, up_offset=0.0):
    """x [M, D] float32/float16/bfloat16 (expert-major rows), offsets [E + 1] int64, w1 / w3 [E, F, D] and
    w2 [E, D, F] in x's dtype, activation "swiglu" or "situ" (beta, linear_beta: SiTU's caps; limit (None: no
    clamp), alpha, up_offset: SwiGLU's variants, as the swiglu block's) -> y [M, D] in x's dtype (zeros for the rows
    past offsets[E])."""
    return MoEGroupedGemmFunction.apply(x, offsets, w1, w3, w2, activation, beta, linear_beta, limit, alpha,
                                        up_offset)
