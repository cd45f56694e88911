"""moe_grouped_gemm_mxfp4 candidate rendered from templates/moe_grouped_gemm_mxfp4/dequant.py.j2.

tile_map's grouped GEMM with each weight tile unpacked from MXFP4 in registers (shifts, a select and a power-of-two multiply) and multiplied on the tensor cores in the activations' dtype
params: BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, ACT_DTYPE=input
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "moe_grouped_gemm_mxfp4"
TEMPLATE = "dequant"
BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 64
ACT_DTYPE = "input"
BLOCK_SLOTS = 16  # slots of the tile map per step: a [BLOCK_SLOTS, E_PAD] comparison lives in registers
TILE_MAP_WARPS = 4  # BLOCK_SLOTS x E_PAD int32 compares fit 4 warps' registers (int64 slots would not)
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'num_warps': 8}, 'sm_80': {'num_warps': 8}, 'sm_90a': {'num_warps': 8}}


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
# Warps of the GEMM kernels per target: the up kernel holds two accumulators and an unpacked weight tile; over 4
# warps that spills on the NVIDIA targets (48 B/thread on sm_80 at 16 x 64 x 64), over 8 it does not. `workbench
# targets` shows each launch's registers and spills per target.
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def moe_grouped_gemm_mxfp4_tiles_fwd_kernel(OFFSETS, TILE_EXPERT, TILE_ROW, M, E, n_slots, BLOCK_M: tl.constexpr,
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
def moe_grouped_gemm_mxfp4_up_kernel(X, W1, W1S, W3, W3S, TILE_EXPERT, TILE_ROW, OFFSETS, H, D, F, E,
                                     stride_x, stride_pe, stride_pf, stride_se, stride_sf, stride_h,
                                     beta, linear_beta, limit, alpha, up_offset, DOT: tl.constexpr,
                                     PREC: tl.constexpr, ACT: tl.constexpr,
                                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (slot, F tile): for the slot's expert e and rows, a = x W1[e]^T and b = x W3[e]^T over D in BLOCK_K
    steps (x in DOT, the weights dequantized from MXFP4, float32 accumulators), h = act(a, b) stored in H's dtype.
    Slots of the tail group or past the last tile do nothing."""
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
            kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            xt = tl.load(X + rows[:, None] * stride_x + kk[None, :], mask=rmask[:, None] & (kk[None, :] < D),
                         other=0.0).to(DOT)
            w_scale = tl.load(W1S + ex64 * stride_se + f[:, None] * stride_sf + ks[None, :],
                              mask=(f[:, None] < F) & (ks[None, :] < D // 32), other=127)
            w_packed = tl.load(W1 + ex64 * stride_pe + f[:, None] * stride_pf + kp[None, :],
                               mask=(f[:, None] < F) & (kp[None, :] < D // 2), other=0)
            w_codes = tl.interleave(w_packed & 15, w_packed >> 4).to(tl.int32)
            w_exponent = (w_codes & 7) >> 1
            w_units = tl.where(w_exponent == 0, w_codes & 1, (2 + (w_codes & 1)) << w_exponent)  # of 0.5 or 0.25
            w_value = tl.where(w_exponent == 0, 0.5, 0.25) * w_units.to(tl.float32)
            w_value = tl.where(w_codes >= 8, -w_value, w_value)
            w_power = (w_scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2^(scale - 127): 1 <= scale <= 254
            w_value = tl.reshape(w_value, (BLOCK_N, BLOCK_K // 32, 32)) * w_power[:, :, None]
            w = tl.reshape(w_value, (BLOCK_N, BLOCK_K))
            acc_a = tl.dot(xt, tl.trans(w.to(DOT)), acc_a, input_precision=PREC)
            w_scale = tl.load(W3S + ex64 * stride_se + f[:, None] * stride_sf + ks[None, :],
                              mask=(f[:, None] < F) & (ks[None, :] < D // 32), other=127)
            w_packed = tl.load(W3 + ex64 * stride_pe + f[:, None] * stride_pf + kp[None, :],
                               mask=(f[:, None] < F) & (kp[None, :] < D // 2), other=0)
            w_codes = tl.interleave(w_packed & 15, w_packed >> 4).to(tl.int32)
            w_exponent = (w_codes & 7) >> 1
            w_units = tl.where(w_exponent == 0, w_codes & 1, (2 + (w_codes & 1)) << w_exponent)  # of 0.5 or 0.25
            w_value = tl.where(w_exponent == 0, 0.5, 0.25) * w_units.to(tl.float32)
            w_value = tl.where(w_codes >= 8, -w_value, w_value)
            w_power = (w_scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2^(scale - 127): 1 <= scale <= 254
            w_value = tl.reshape(w_value, (BLOCK_N, BLOCK_K // 32, 32)) * w_power[:, :, None]
            w = tl.reshape(w_value, (BLOCK_N, BLOCK_K))
            acc_b = tl.dot(xt, tl.trans(w.to(DOT)), acc_b, input_precision=PREC)
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
        tl.store(H + rows[:, None] * stride_h + f[None, :], h.to(H.dtype.element_ty),
                 mask=rmask[:, None] & (f[None, :] < F))


@triton.jit
def moe_grouped_gemm_mxfp4_down_kernel(H, W2, W2S, TILE_EXPERT, TILE_ROW, OFFSETS, Y, M, D, F, E,
                                       stride_h, stride_pe, stride_pd, stride_se, stride_sd, stride_y,
                                       DOT: tl.constexpr, PREC: tl.constexpr,
                                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (slot, D tile): y = h W2[e]^T over F in BLOCK_K steps, W2 dequantized from MXFP4; tail-group slots
    write zeros."""
    slot = tl.program_id(0)
    ex = tl.load(TILE_EXPERT + slot)
    if ex >= 0:
        ex64 = ex.to(tl.int64)
        rows = tl.load(TILE_ROW + slot) + tl.arange(0, BLOCK_M)
        rmask = rows < tl.load(OFFSETS + ex64 + 1, mask=ex < E, other=M)
        n = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
        if ex < E:
            for k0 in range(0, F, BLOCK_K):
                kk = k0 + tl.arange(0, BLOCK_K)
                kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
                ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
                ht = tl.load(H + rows[:, None] * stride_h + kk[None, :], mask=rmask[:, None] & (kk[None, :] < F),
                             other=0.0).to(DOT)
                w_scale = tl.load(W2S + ex64 * stride_se + n[:, None] * stride_sd + ks[None, :],
                                  mask=(n[:, None] < D) & (ks[None, :] < F // 32), other=127)
                w_packed = tl.load(W2 + ex64 * stride_pe + n[:, None] * stride_pd + kp[None, :],
                                   mask=(n[:, None] < D) & (kp[None, :] < F // 2), other=0)
                w_codes = tl.interleave(w_packed & 15, w_packed >> 4).to(tl.int32)
                w_exponent = (w_codes & 7) >> 1
                w_units = tl.where(w_exponent == 0, w_codes & 1, (2 + (w_codes & 1)) << w_exponent)  # of 0.5 or 0.25
                w_value = tl.where(w_exponent == 0, 0.5, 0.25) * w_units.to(tl.float32)
                w_value = tl.where(w_codes >= 8, -w_value, w_value)
                w_power = (w_scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2^(scale - 127): 1 <= scale <= 254
                w_value = tl.reshape(w_value, (BLOCK_N, BLOCK_K // 32, 32)) * w_power[:, :, None]
                w = tl.reshape(w_value, (BLOCK_N, BLOCK_K))
                acc = tl.dot(ht, tl.trans(w.to(DOT)), acc, input_precision=PREC)
        tl.store(Y + rows[:, None] * stride_y + n[None, :], acc.to(Y.dtype.element_ty),
                 mask=rmask[:, None] & (n[None, :] < D))


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


def run(x, offsets, w1, w1_scale, w3, w3_scale, w2, w2_scale, activation, beta, linear_beta, limit=None, alpha=1.0,
        up_offset=0.0):
    """x [M, D] float32/float16/bfloat16 (expert-major rows), offsets [E + 1] int64, w1 / w3 [E, F, D / 2] uint8
    with w1_scale / w3_scale [E, F, D / 32] uint8, w2 [E, D, F / 2] uint8 with w2_scale [E, D, F / 32] uint8
    (compressed-tensors' MXFP4 packing), activation "swiglu" or "situ" (beta, linear_beta: SiTU's caps; limit,
    alpha, up_offset: SwiGLU's variants, as moe_grouped_gemm's) -> y [M, D]
    in x's dtype (zeros for the rows past offsets[E]). Forward only."""
    act_args = _activation_args(activation, beta, linear_beta, limit, alpha, up_offset)
    m, d = x.shape
    e, f, _ = w1.shape
    if d % 32 or f % 32:
        raise ValueError(f"MXFP4 groups 32 values along the reduction axis: D ({d}) and F ({f}) must be multiples")
    x_c, offsets_c = x.contiguous(), offsets.contiguous()
    w1, w1_scale, w3, w3_scale, w2, w2_scale = (t.contiguous() for t in (w1, w1_scale, w3, w3_scale, w2, w2_scale))
    n_slots = triton.cdiv(m, BLOCK_M) + e + 1
    tile_expert = torch.empty(n_slots, dtype=torch.int64, device=x.device)
    tile_row = torch.empty(n_slots, dtype=torch.int64, device=x.device)
    h = torch.empty(m, f, dtype=torch.float32 if ACT_DTYPE == "float32" else x.dtype, device=x.device)
    y = torch.empty(m, d, dtype=x.dtype, device=x.device)
    dot = _dot_config(x.dtype)
    warps = target_settings(x.device)["num_warps"]
    moe_grouped_gemm_mxfp4_tiles_fwd_kernel[(1,)](offsets_c, tile_expert, tile_row, m, e, n_slots, BLOCK_M=BLOCK_M,
                                                  E_PAD=triton.next_power_of_2(e + 1), BLOCK_SLOTS=BLOCK_SLOTS,
                                                  num_warps=TILE_MAP_WARPS)
    if m * f > 0:
        moe_grouped_gemm_mxfp4_up_kernel[(n_slots, triton.cdiv(f, BLOCK_N))](
            x_c, w1, w1_scale, w3, w3_scale, tile_expert, tile_row, offsets_c, h, d, f, e, x_c.stride(0),
            w1.stride(0), w1.stride(1), w1_scale.stride(0), w1_scale.stride(1), h.stride(0), **dot, **act_args,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=warps)
    if m * d > 0:
        moe_grouped_gemm_mxfp4_down_kernel[(n_slots, triton.cdiv(d, BLOCK_N))](
            h, w2, w2_scale, tile_expert, tile_row, offsets_c, y, m, d, f, e, h.stride(0), w2.stride(0),
            w2.stride(1), w2_scale.stride(0), w2_scale.stride(1), y.stride(0), **dot, BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=warps)
    return y
