"""kda candidate rendered from templates/kda/chunked.py.j2.

chunked WY form, forward and backward; tl.dot within and across chunks, the state carried chunk to chunk
params: BT=64, BC=16, BV=16, KC=32, num_warps=4
"""
import torch
import triton
import triton.language as tl
from triton.language.standard import _sum_combine as add

# Sums are written tl.reduce(x, axis, add): the same reduction as tl.sum, which on a GPU compiles identically, but
# the Triton interpreter runs it directly in numpy; tl.sum is itself a jit function and each nested jit call costs
# the interpreter about 10 ms of re-patching triton.language.

BLOCK = "kda"
TEMPLATE = "chunked"
BT = 64  # chunk length: the WY transform runs within a chunk, the state is carried from chunk to chunk
BC = 16  # sub-chunk: pairs in different sub-chunks use tl.dot, pairs within one use exact per-pair decays
BV = 16  # value columns per program of the state passes
KC = 32  # key columns per tile of the intra-chunk kernels (capped at K rounded up to a power of two)
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides


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
    """LAUNCH_SETTINGS merged for the launch's target: default, then its backend, then the target itself."""
    target = launch_target(device)
    backend = target if target == "interpreter" else "cuda" if target.startswith("sm_") else "hip"
    return {**LAUNCH_SETTINGS.get("default", {}), **LAUNCH_SETTINGS.get(backend, {}),
            **LAUNCH_SETTINGS.get(target, {})}
# tl.dot operand precision per target: float32-accurate everywhere (the delta rule's inverse and the state carried
# over thousands of chunks amplify operand rounding; plain tf32 or bf16 operands lose ~1e-3 per product). On GPUs
# that accuracy comes from the tensor cores through split operands: 3xTF32 on NVIDIA, 6xBF16 on AMD (CDNA has no
# TF32 split); the interpreter multiplies in float32 itself.
# KB: key columns per register tile of the kernels that span all K (prep, solve, the state passes, wy_bwd). Whole
# [BT, K] and [K, BV] float32 tiles at K = 128 overflowed the 255 registers of sm_90a (B/thread spilled with one
# [K, BV] state on 8 warps, BV 32, the rest on 4 warps: state_bwd 2552, state_fwd 1936, wy_bwd 1024, prep 704,
# solve 104, intra_fwd 80). The state passes hold K / KB accumulators (at most 4: KB grows past 64 for K > 256), as
# fla's b_h1..b_h4. Measured on sm_90a at the model suite with BV 16: KB 32 spills least (state_fwd 376 on 4 warps,
# 504 on 8; state_bwd 1928 on 8 warps, 2384 on 4; KB 64: 1128 and 2528), and 8 warps for the kernels parallel over
# chunks take prep, intra_fwd to 0, solve to 80 and wy_bwd to 608 (776 on 4). AMD keeps 64 columns (gfx942:
# state_fwd 44, state_bwd 292, the rest 0). The interpreter takes 8 so that the small verification shapes (K <= 32)
# run every one of the four state accumulators. What still spills on sm_90a is mostly the 3xTF32 split (state_bwd
# with plain tf32 operands would spill 512), kept for the accuracy above.
LAUNCH_SETTINGS = {
    "default": {"num_warps": 4, "state_fwd_warps": 8, "state_bwd_warps": 8, "state_stages": 1, "KB": 64},
    "interpreter": {"DOT": "ieee", "KB": 8},
    "cuda": {"DOT": "tf32x3", "KB": 32, "num_warps": 8, "state_fwd_warps": 4},
    "hip": {"DOT": "bf16x6"},
}


# Layouts. Inputs: q, k [B, T, H, K]; v, o [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]. Everything the kernels
# exchange is float32, head-major and padded: TP = T rounded up to BT rows (rows past T are zero, or carry the
# chunk's last value for the gate cumsum) and BK = K rounded up to a power of two, at least 16 (extra columns are
# zero), so only the kernels that touch the inputs and outputs need masks.
#   qs, ks [B*H, TP, BK] (qs = scale q);  gc, w [B*HV, TP, BK];  aa, aqk, mm [B*HV, TP, BT];  u, vn [B*HV, TP, V];
#   hs [B*HV, NT, BK, V] (the state before each chunk).


@triton.jit
def kda_chunk_prep_kernel(q, k, g, qs, ks, gc, scale, T, H, HV, K, TP, BT: tl.constexpr, BK: tl.constexpr,
                          KB: tl.constexpr):
    """Per (chunk, batch x value head): gc = g cumulated within the chunk (inclusive); the first value head of each
    GVA group also copies its q/k head into qs = scale q and ks = k. KB key columns at a time."""
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    ot = i_t * BT + tl.arange(0, BT)
    for c0 in range(0, BK, KB):
        ok = c0 + tl.arange(0, KB)
        m_tk = (ot < T)[:, None] & (ok < K)[None, :]
        o_tk = ot[:, None] * BK + ok[None, :]
        b_g = tl.load(g + ((i_b * T + ot[:, None]) * HV + i_hv) * K + ok[None, :], mask=m_tk, other=0.0)
        tl.store(gc + i_bh * TP * BK + o_tk, tl.associative_scan(b_g.to(tl.float32), 0, add))
        if i_hv % (HV // H) == 0:
            p_in = ((i_b * T + ot[:, None]) * H + i_h) * K + ok[None, :]
            p_out = (i_b * H + i_h) * TP * BK + o_tk
            tl.store(qs + p_out, tl.load(q + p_in, mask=m_tk, other=0.0).to(tl.float32) * scale)
            tl.store(ks + p_out, tl.load(k + p_in, mask=m_tk, other=0.0).to(tl.float32))


@triton.jit
def kda_chunk_intra_fwd_kernel(qs, ks, gc, aa, aqk, H, HV, TP, BT: tl.constexpr, BC: tl.constexpr,
                               BK: tl.constexpr, KC: tl.constexpr, DOT: tl.constexpr):
    """Per chunk, the gated key-key and query-key products, written below the diagonal (aa and aqk start zeroed):
        aa[i, j]  = sum_d k_i k_j exp(G_i - G_j)          j < i
        aqk[i, j] = sum_d q~_i k_j exp(G_i - G_j)         j <= i
    summed over K in tiles of KC columns. Sub-chunk blocks I > J use tl.dot with the decay split at r, the first row
    of I: exp(G_i - G_r) exp(G_r - G_j), both exponents <= 0. Diagonal blocks take exp(G_i - G_j) per pair, a
    [BC, BC, KC] register tile."""
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    NC: tl.constexpr = BT // BC
    NK: tl.constexpr = BK // KC
    oc = tl.arange(0, BC)
    ok = tl.arange(0, KC)
    o_ck = oc[:, None] * BK + ok[None, :]
    o_cc = oc[:, None] * BT + oc[None, :]
    lower = oc[:, None, None] >= oc[None, :, None]
    p_q = qs + ((i_b * H + i_h) * TP + i_t * BT) * BK
    p_k = ks + ((i_b * H + i_h) * TP + i_t * BT) * BK
    p_g = gc + (i_bh * TP + i_t * BT) * BK
    p_a = (i_bh * TP + i_t * BT) * BT + o_cc
    for i in range(NC):
        for j in range(i):
            b_aa = tl.full([BC, BC], 0.0, tl.float32)
            b_aqk = tl.full([BC, BC], 0.0, tl.float32)
            for kc in range(NK):
                o_i = i * BC * BK + kc * KC + o_ck
                b_gr = tl.load(p_g + i * BC * BK + kc * KC + ok)
                b_eir = tl.exp(tl.load(p_g + o_i) - b_gr[None, :])
                o_j = j * BC * BK + kc * KC + o_ck
                b_kj = tl.trans(tl.load(p_k + o_j) * tl.exp(b_gr[None, :] - tl.load(p_g + o_j)))
                b_aa += tl.dot(tl.load(p_k + o_i) * b_eir, b_kj, input_precision=DOT)
                b_aqk += tl.dot(tl.load(p_q + o_i) * b_eir, b_kj, input_precision=DOT)
            tl.store(aa + p_a + i * BC * BT + j * BC, b_aa)
            tl.store(aqk + p_a + i * BC * BT + j * BC, b_aqk)
        # the diagonal block: exact decay per pair, masked to j <= i before the exponential
        b_aa = tl.full([BC, BC], 0.0, tl.float32)
        b_aqk = tl.full([BC, BC], 0.0, tl.float32)
        for kc in range(NK):
            o_i = i * BC * BK + kc * KC + o_ck
            b_ki = tl.load(p_k + o_i)
            b_gi = tl.load(p_g + o_i)
            b_e = tl.exp(tl.where(lower, b_gi[:, None, :] - b_gi[None, :, :], 0.0))
            b_e = tl.where(lower, b_e, 0.0) * b_ki[None, :, :]
            b_aa += tl.reduce(b_ki[:, None, :] * b_e, 2, add)
            b_aqk += tl.reduce(tl.load(p_q + o_i)[:, None, :] * b_e, 2, add)
        tl.store(aa + p_a + i * BC * (BT + 1), tl.where(oc[:, None] > oc[None, :], b_aa, 0.0))
        tl.store(aqk + p_a + i * BC * (BT + 1), b_aqk)


@triton.jit
def kda_chunk_solve_kernel(v, beta, ks, gc, aa, mm, w, u, T, H, HV, V, TP, NV, BT: tl.constexpr,
                           LOG_BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
                           DOT: tl.constexpr):
    """Per chunk: M = (I + L)^-1 with L = diag(beta) aa (strictly lower), then with Tm = M diag(beta):
    w = Tm (exp(G) k) and u = Tm v; M is kept for the backward.
    The inverse doubles its diagonal blocks: X starts as I (1 x 1 blocks); with blocks of s rows inverted, each pair
    [[A, 0], [C, B]] of them becomes [[A^-1, 0], [-B^-1 C A^-1, B^-1]], i.e. X <- X - X P X with P the C blocks of L:
    log2(BT) rounds of two tl.dot instead of BT - 1 sequential row updates."""
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    ot = i_t * BT + tl.arange(0, BT)
    oc = tl.arange(0, BT)
    mt = ot < T
    o_tt = (i_bh * TP + ot[:, None]) * BT + oc[None, :]
    b_beta = tl.load(beta + (i_b * T + ot) * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
    b_l = tl.load(aa + o_tt) * b_beta[:, None]
    b_m = tl.where(oc[:, None] == oc[None, :], 1.0, 0.0)
    for lvl in range(LOG_BT):  # a loop, not unrolled: six unrolled rounds took ptxas minutes
        pair = (oc // (2 << lvl))[:, None] == (oc // (2 << lvl))[None, :]
        below = (oc // (1 << lvl))[:, None] > (oc // (1 << lvl))[None, :]
        b_p = tl.where(pair & below, b_l, 0.0)
        b_m -= tl.dot(b_m, tl.dot(b_p, b_m, input_precision=DOT), input_precision=DOT)
    tl.store(mm + o_tt, b_m)
    b_tm = b_m * b_beta[None, :]
    for c0 in range(0, BK, KB):
        o_tk = ot[:, None] * BK + c0 + tl.arange(0, KB)[None, :]
        b_kh = tl.load(ks + (i_b * H + i_h) * TP * BK + o_tk) * tl.exp(tl.load(gc + i_bh * TP * BK + o_tk))
        tl.store(w + i_bh * TP * BK + o_tk, tl.dot(b_tm, b_kh, input_precision=DOT))
    for i_v in range(NV):
        ov = i_v * BV + tl.arange(0, BV)
        b_v = tl.load(v + ((i_b * T + ot[:, None]) * HV + i_hv) * V + ov[None, :], mask=mt[:, None] & (ov < V)[None, :],
                      other=0.0).to(tl.float32)
        tl.store(u + (i_bh * TP + ot[:, None]) * V + ov[None, :], tl.dot(b_tm, b_v, input_precision=DOT),
                 mask=(ov < V)[None, :])


# The state passes keep the state (or its gradient) as up to four [KB, BV] accumulators, key columns c0..c0+KB of
# [BK, BV], and read the chunk's [BT, BK] operands KB columns at a time, each block loaded where it is used: fewer
# live float32 tiles than one [BK, BV] state with whole [BT, BK] operands. The helpers below do one block's share.


@triton.jit
def _kda_state_load(p, c0, okb, ov, K, V):
    """Key rows c0..c0+KB of a [K, V] state in memory (zero past K and V), as float32."""
    ok = c0 + okb
    return tl.load(p + ok[:, None] * V + ov[None, :], mask=(ok < K)[:, None] & (ov < V)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _kda_state_store(p, s, c0, okb, ov, K, V):
    ok = c0 + okb
    tl.store(p + ok[:, None] * V + ov[None, :], s.to(p.dtype.element_ty), mask=(ok < K)[:, None] & (ov < V)[None, :])


@triton.jit
def _kda_fwd_read(s, c0, b_vn, b_o, p_w, p_q, p_g, o_ck, DOT: tl.constexpr):
    """One key block's share of U = u - w S and of o = (q~ exp(G)) S."""
    b_vn -= tl.dot(tl.load(p_w + c0 + o_ck), s, input_precision=DOT)
    b_o += tl.dot(tl.load(p_q + c0 + o_ck) * tl.exp(tl.load(p_g + c0 + o_ck)), s, input_precision=DOT)
    return b_vn, b_o


@triton.jit
def _kda_fwd_step(s, c0, b_vn, p_k, p_g, p_gl, o_ck, okb, DOT: tl.constexpr):
    """One key block of S = exp(G_last) S + (exp(G_last - G) k)^T U."""
    b_gl = tl.load(p_gl + c0 + okb)
    b_kb = tl.load(p_k + c0 + o_ck) * tl.exp(b_gl[None, :] - tl.load(p_g + c0 + o_ck))
    return s * tl.exp(b_gl)[:, None] + tl.dot(tl.trans(b_kb), b_vn, input_precision=DOT)


@triton.jit
def kda_chunk_state_fwd_kernel(qs, ks, gc, w, u, aqk, h0, o, ht, hs, vn, T, H, HV, K, V, TP, NT,
                               HAS_H0: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                               KB: tl.constexpr, DOT: tl.constexpr):
    """One (V tile, batch x value head) per program, chunk after chunk, the state S [BK, BV] (float32) in registers
    as BK / KB blocks s1..s4 of KB key rows:
        U = u - w S;  o = (q~ exp(G)) S + aqk U;  S = exp(G_last) S + (exp(G_last - G) k)^T U
    Keeps the state before each chunk (hs) and U (vn) for the backward."""
    NKB: tl.constexpr = BK // KB
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # V tile offsets stay int32 (fewer registers)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    okb = tl.arange(0, KB)
    ov = i_v * BV + tl.arange(0, BV)
    oc = tl.arange(0, BT)
    mv = ov < V
    o_ck = oc[:, None] * BK + okb[None, :]
    o_cv = oc[:, None] * V + ov[None, :]
    p_h0 = h0 + i_bh * K * V
    s1 = tl.full([KB, BV], 0.0, tl.float32)
    if HAS_H0:
        s1 = _kda_state_load(p_h0, 0, okb, ov, K, V)
    if NKB >= 2:
        s2 = tl.full([KB, BV], 0.0, tl.float32)
        if HAS_H0:
            s2 = _kda_state_load(p_h0, KB, okb, ov, K, V)
    if NKB >= 4:
        s3 = tl.full([KB, BV], 0.0, tl.float32)
        s4 = tl.full([KB, BV], 0.0, tl.float32)
        if HAS_H0:
            s3 = _kda_state_load(p_h0, 2 * KB, okb, ov, K, V)
            s4 = _kda_state_load(p_h0, 3 * KB, okb, ov, K, V)
    for i_t in range(NT):
        r0 = i_t * BT
        p_hs = hs + (i_bh * NT + i_t) * BK * V
        p_q = qs + (i_b * H + i_h) * TP * BK + r0 * BK
        p_k = ks + (i_b * H + i_h) * TP * BK + r0 * BK
        p_g = gc + (i_bh * TP + r0) * BK
        p_w = w + (i_bh * TP + r0) * BK
        p_gl = p_g + (BT - 1) * BK
        p_hv = (i_bh * TP + r0) * V
        b_vn = tl.load(u + p_hv + o_cv, mask=mv[None, :], other=0.0)
        b_o = tl.full([BT, BV], 0.0, tl.float32)
        _kda_state_store(p_hs, s1, 0, okb, ov, BK, V)
        b_vn, b_o = _kda_fwd_read(s1, 0, b_vn, b_o, p_w, p_q, p_g, o_ck, DOT)
        if NKB >= 2:
            _kda_state_store(p_hs, s2, KB, okb, ov, BK, V)
            b_vn, b_o = _kda_fwd_read(s2, KB, b_vn, b_o, p_w, p_q, p_g, o_ck, DOT)
        if NKB >= 4:
            _kda_state_store(p_hs, s3, 2 * KB, okb, ov, BK, V)
            _kda_state_store(p_hs, s4, 3 * KB, okb, ov, BK, V)
            b_vn, b_o = _kda_fwd_read(s3, 2 * KB, b_vn, b_o, p_w, p_q, p_g, o_ck, DOT)
            b_vn, b_o = _kda_fwd_read(s4, 3 * KB, b_vn, b_o, p_w, p_q, p_g, o_ck, DOT)
        tl.store(vn + p_hv + o_cv, b_vn, mask=mv[None, :])
        b_o += tl.dot(tl.load(aqk + (i_bh * TP + r0 + oc[:, None]) * BT + oc[None, :]), b_vn, input_precision=DOT)
        tl.store(o + ((i_b * T + r0) * HV + i_hv) * V + oc[:, None] * (HV * V) + ov[None, :],
                 b_o.to(o.dtype.element_ty), mask=(r0 + oc < T)[:, None] & mv[None, :])
        s1 = _kda_fwd_step(s1, 0, b_vn, p_k, p_g, p_gl, o_ck, okb, DOT)
        if NKB >= 2:
            s2 = _kda_fwd_step(s2, KB, b_vn, p_k, p_g, p_gl, o_ck, okb, DOT)
        if NKB >= 4:
            s3 = _kda_fwd_step(s3, 2 * KB, b_vn, p_k, p_g, p_gl, o_ck, okb, DOT)
            s4 = _kda_fwd_step(s4, 3 * KB, b_vn, p_k, p_g, p_gl, o_ck, okb, DOT)
    p_ht = ht + i_bh * K * V
    _kda_state_store(p_ht, s1, 0, okb, ov, K, V)
    if NKB >= 2:
        _kda_state_store(p_ht, s2, KB, okb, ov, K, V)
    if NKB >= 4:
        _kda_state_store(p_ht, s3, 2 * KB, okb, ov, K, V)
        _kda_state_store(p_ht, s4, 3 * KB, okb, ov, K, V)


@triton.jit
def _kda_bwd_du(d_s, c0, b_du, p_k, p_g, p_gl, o_ck, okb, DOT: tl.constexpr):
    """One key block's share of dU: (exp(G_last - G) k) dS."""
    b_gl = tl.load(p_gl + c0 + okb)
    b_kb = tl.load(p_k + c0 + o_ck) * tl.exp(b_gl[None, :] - tl.load(p_g + c0 + o_ck))
    return b_du + tl.dot(b_kb, d_s, input_precision=DOT)


@triton.jit
def _kda_bwd_step(d_s, c0, b_do, b_du, b_vn, p_q, p_w, p_g, p_gl, p_s0, p_dqh, p_dw, p_dkb, p_dgl, o_ck, okb, ov,
                  BK, V, DOT: tl.constexpr):
    """One key block: its shares of dQh, dw, dKb and dgl, then dS = exp(G_last) dS + (q~ exp(G))^T do - w^T dU."""
    b_s0 = _kda_state_load(p_s0, c0, okb, ov, BK, V)
    b_s0t = tl.trans(b_s0)
    tl.store(p_dqh + c0 + o_ck, tl.dot(b_do, b_s0t, input_precision=DOT))
    tl.store(p_dw + c0 + o_ck, -tl.dot(b_du, b_s0t, input_precision=DOT))
    tl.store(p_dkb + c0 + o_ck, tl.dot(b_vn, tl.trans(d_s), input_precision=DOT))
    b_egl = tl.exp(tl.load(p_gl + c0 + okb))
    tl.store(p_dgl + c0 + okb, tl.reduce(d_s * b_s0, 1, add) * b_egl)
    b_qh = tl.load(p_q + c0 + o_ck) * tl.exp(tl.load(p_g + c0 + o_ck))
    d_s = d_s * b_egl[:, None] + tl.dot(tl.trans(b_qh), b_do, input_precision=DOT)
    return d_s - tl.dot(tl.trans(tl.load(p_w + c0 + o_ck)), b_du, input_precision=DOT)


@triton.jit
def kda_chunk_state_bwd_kernel(qs, ks, gc, w, vn, aqk, hs, do, dht, du, dqh, dw, dkb, dgl, daqk, dh0, B, T, H, HV,
                               K, V, TP, NT, STORE_DH0: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                               BV: tl.constexpr, KB: tl.constexpr, DOT: tl.constexpr):
    """Chunks last to first, the state gradient dS [BK, BV] (float32) in registers as BK / KB blocks d1..d4 of KB
    key rows. With S0 the chunk's initial state:
        dU = aqk^T do + (exp(G_last - G) k) dS;  dS = exp(G_last) dS + (q~ exp(G))^T do - w^T dU
    du [B*HV, TP, V] is exact per V tile; this tile's shares of dQh = do S0^T, dw = -dU S0^T, dKb = U dS^T
    ([NV, B*HV, TP, BK]), dgl = exp(G_last) rowsum(dS * S0) ([NV, B*HV, NT, BK]) and daqk = do U^T ([NV, B*HV, TP, BT])
    are summed over V tiles by the kernels that read them."""
    NKB: tl.constexpr = BK // KB
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # V tile offsets stay int32 (fewer registers)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    okb = tl.arange(0, KB)
    ov = i_v * BV + tl.arange(0, BV)
    oc = tl.arange(0, BT)
    mv = ov < V
    o_ck = oc[:, None] * BK + okb[None, :]
    o_cv = oc[:, None] * V + ov[None, :]
    o_cc = oc[:, None] * BT + oc[None, :]
    part = i_v * B * HV + i_bh
    p_dht = dht + i_bh * K * V
    d1 = _kda_state_load(p_dht, 0, okb, ov, K, V)
    if NKB >= 2:
        d2 = _kda_state_load(p_dht, KB, okb, ov, K, V)
    if NKB >= 4:
        d3 = _kda_state_load(p_dht, 2 * KB, okb, ov, K, V)
        d4 = _kda_state_load(p_dht, 3 * KB, okb, ov, K, V)
    for ic in range(NT):
        i_t = NT - 1 - ic
        r0 = i_t * BT
        p_q = qs + (i_b * H + i_h) * TP * BK + r0 * BK
        p_k = ks + (i_b * H + i_h) * TP * BK + r0 * BK
        p_g = gc + (i_bh * TP + r0) * BK
        p_w = w + (i_bh * TP + r0) * BK
        p_gl = p_g + (BT - 1) * BK
        p_s0 = hs + (i_bh * NT + i_t) * BK * V
        p_dqh = dqh + (part * TP + r0) * BK
        p_dw = dw + (part * TP + r0) * BK
        p_dkb = dkb + (part * TP + r0) * BK
        p_dgl = dgl + (part * NT + i_t) * BK
        p_hv = (i_bh * TP + r0) * V
        b_do = tl.load(do + ((i_b * T + r0) * HV + i_hv) * V + oc[:, None] * (HV * V) + ov[None, :],
                       mask=(r0 + oc < T)[:, None] & mv[None, :], other=0.0).to(tl.float32)
        b_du = tl.dot(tl.trans(tl.load(aqk + (i_bh * TP + r0) * BT + o_cc)), b_do, input_precision=DOT)
        b_du = _kda_bwd_du(d1, 0, b_du, p_k, p_g, p_gl, o_ck, okb, DOT)
        if NKB >= 2:
            b_du = _kda_bwd_du(d2, KB, b_du, p_k, p_g, p_gl, o_ck, okb, DOT)
        if NKB >= 4:
            b_du = _kda_bwd_du(d3, 2 * KB, b_du, p_k, p_g, p_gl, o_ck, okb, DOT)
            b_du = _kda_bwd_du(d4, 3 * KB, b_du, p_k, p_g, p_gl, o_ck, okb, DOT)
        tl.store(du + p_hv + o_cv, b_du, mask=mv[None, :])
        b_vn = tl.load(vn + p_hv + o_cv, mask=mv[None, :], other=0.0)
        b_da = tl.dot(b_do, tl.trans(b_vn), input_precision=DOT)
        tl.store(daqk + (part * TP + r0) * BT + o_cc, tl.where(oc[:, None] >= oc[None, :], b_da, 0.0))
        d1 = _kda_bwd_step(d1, 0, b_do, b_du, b_vn, p_q, p_w, p_g, p_gl, p_s0, p_dqh, p_dw, p_dkb, p_dgl, o_ck,
                           okb, ov, BK, V, DOT)
        if NKB >= 2:
            d2 = _kda_bwd_step(d2, KB, b_do, b_du, b_vn, p_q, p_w, p_g, p_gl, p_s0, p_dqh, p_dw, p_dkb, p_dgl, o_ck,
                               okb, ov, BK, V, DOT)
        if NKB >= 4:
            d3 = _kda_bwd_step(d3, 2 * KB, b_do, b_du, b_vn, p_q, p_w, p_g, p_gl, p_s0, p_dqh, p_dw, p_dkb, p_dgl,
                               o_ck, okb, ov, BK, V, DOT)
            d4 = _kda_bwd_step(d4, 3 * KB, b_do, b_du, b_vn, p_q, p_w, p_g, p_gl, p_s0, p_dqh, p_dw, p_dkb, p_dgl,
                               o_ck, okb, ov, BK, V, DOT)
    if STORE_DH0:
        p_dh0 = dh0 + i_bh * K * V
        _kda_state_store(p_dh0, d1, 0, okb, ov, K, V)
        if NKB >= 2:
            _kda_state_store(p_dh0, d2, KB, okb, ov, K, V)
        if NKB >= 4:
            _kda_state_store(p_dh0, d3, 2 * KB, okb, ov, K, V)
            _kda_state_store(p_dh0, d4, 3 * KB, okb, ov, K, V)


@triton.jit
def kda_chunk_wy_bwd_kernel(v, beta, ks, gc, aa, mm, du, dw, dv, dbeta, dkh, da, B, T, H, HV, V, TP, NV,
                            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
                            DOT: tl.constexpr):
    """Per chunk, back through u = Tm v, w = Tm (exp(G) k), Tm = M diag(beta), M = (I + diag(beta) aa)^-1:
        dTm = dU v^T + dw (exp(G) k)^T;  dv = Tm^T dU;  dKh = Tm^T dw;  dM = dTm diag(beta)
        dL = -(M^T dM M^T) below the diagonal;  dbeta_j = sum_i dTm[i, j] M[i, j] + sum_j' dL[j, j'] aa[j, j']
        da = diag(beta) dL
    dv [B, T, HV, V] and dbeta [B, T, HV] are final; dKh [B*HV, TP, BK] and da [B*HV, TP, BT] go on."""
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    ot = i_t * BT + tl.arange(0, BT)
    oc = tl.arange(0, BT)
    mt = ot < T
    o_tt = (i_bh * TP + ot[:, None]) * BT + oc[None, :]
    b_beta = tl.load(beta + (i_b * T + ot) * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
    b_m = tl.load(mm + o_tt)
    b_tm = b_m * b_beta[None, :]
    b_dt = tl.full([BT, BT], 0.0, tl.float32)
    for c0 in range(0, BK, KB):  # KB key columns at a time
        o_tk = ot[:, None] * BK + c0 + tl.arange(0, KB)[None, :]
        b_kh = tl.load(ks + (i_b * H + i_h) * TP * BK + o_tk) * tl.exp(tl.load(gc + i_bh * TP * BK + o_tk))
        p_dw = dw + i_bh * TP * BK + o_tk
        b_dw = tl.load(p_dw)
        for i_v in range(1, NV):
            b_dw += tl.load(p_dw + i_v * B * HV * TP * BK)
        b_dt += tl.dot(b_dw, tl.trans(b_kh), input_precision=DOT)
        tl.store(dkh + i_bh * TP * BK + o_tk, tl.dot(tl.trans(b_tm), b_dw, input_precision=DOT))
    for i_v in range(NV):
        ov = i_v * BV + tl.arange(0, BV)
        m_tv = mt[:, None] & (ov < V)[None, :]
        p_v = ((i_b * T + ot[:, None]) * HV + i_hv) * V + ov[None, :]
        b_du = tl.load(du + (i_bh * TP + ot[:, None]) * V + ov[None, :], mask=(ov < V)[None, :], other=0.0)
        b_dt += tl.dot(b_du, tl.trans(tl.load(v + p_v, mask=m_tv, other=0.0).to(tl.float32)), input_precision=DOT)
        tl.store(dv + p_v, tl.dot(tl.trans(b_tm), b_du, input_precision=DOT).to(dv.dtype.element_ty), mask=m_tv)
    b_dbeta = tl.reduce(b_dt * b_m, 0, add)
    b_dl = -tl.dot(tl.trans(b_m), tl.dot(b_dt * b_beta[None, :], tl.trans(b_m), input_precision=DOT),
                   input_precision=DOT)
    b_dl = tl.where(oc[:, None] > oc[None, :], b_dl, 0.0)
    b_dbeta += tl.reduce(b_dl * tl.load(aa + o_tt), 1, add)
    tl.store(dbeta + (i_b * T + ot) * HV + i_hv, b_dbeta.to(dbeta.dtype.element_ty), mask=mt)
    tl.store(da + o_tt, b_dl * b_beta[:, None])


@triton.jit
def kda_chunk_intra_bwd_kernel(qs, ks, gc, dqh, dkb, dgl, daqk, dkh, da, dq_part, dk_part, dg, scale, B, T, H, HV,
                               K, TP, NT, NV, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                               KC: tl.constexpr, DOT: tl.constexpr):
    """Per (chunk, batch x value head, tile of KC key columns; every term is separate per key column), sub-chunk
    blocks last to first: gradients of q, k and the gate cumsum G, then dg = the suffix sum of dG within the chunk.
    With x = q~ (dA = daqk) or k (dA = da), y = k and A[i, j] = sum_d x_i y_j exp(G_i - G_j):
        dx_i += sum_j dA[i, j] y_j e_ij;  dy_j += sum_i dA[i, j] x_i e_ij;  dG_i += x_i dx_i;  dG_j -= y_j dy_j
    (split decays through tl.dot off the diagonal, per-pair decays on it), plus the elementwise terms of
    Qh = q~ exp(G), Kh = k exp(G) and Kb = k exp(G_last - G), and dG_last += dgl + sum_i Kb_i dKb_i.
    dq, dk are per value head (float32 [B, T, HV, K], summed over GVA groups afterwards); dg [B, T, HV, K] is final."""
    i_t, i_bh, i_k = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    NC: tl.constexpr = BT // BC
    oc = tl.arange(0, BC)
    ok = i_k * KC + tl.arange(0, KC)
    o_ck = oc[:, None] * BK + ok[None, :]
    o_cc = oc[:, None] * BT + oc[None, :]
    o_tk = tl.arange(0, BT)[:, None] * BK + ok[None, :]
    lower = oc[:, None, None] >= oc[None, :, None]
    s_part = B * HV * TP * BK                        # stride of one V tile in dqh, dkb
    s_part_a = B * HV * TP * BT                      # ... in daqk
    p_q = qs + ((i_b * H + i_h) * TP + i_t * BT) * BK
    p_k = ks + ((i_b * H + i_h) * TP + i_t * BT) * BK
    o_hk = (i_bh * TP + i_t * BT) * BK               # this chunk in gc, dkh, dqh, dkb
    o_a = (i_bh * TP + i_t * BT) * BT + o_cc         # ... in da, daqk
    b_gl = tl.load(gc + o_hk + (BT - 1) * BK + ok)
    # dG_last (dgl + sum_i Kb_i dKb_i) reaches every row of the chunk through the suffix sum: it starts the carry
    b_dkb_t = tl.load(dkb + o_hk + o_tk)
    b_carry = tl.load(dgl + (i_bh * NT + i_t) * BK + ok)
    for i_v in range(1, NV):
        b_dkb_t += tl.load(dkb + i_v * s_part + o_hk + o_tk)
        b_carry += tl.load(dgl + ((i_v * B * HV + i_bh) * NT + i_t) * BK + ok)
    b_kb = tl.load(p_k + o_tk) * tl.exp(b_gl[None, :] - tl.load(gc + o_hk + o_tk))
    b_carry += tl.reduce(b_dkb_t * b_kb, 0, add)
    for ic in range(NC):
        i = NC - 1 - ic
        o_i = i * BC * BK + o_ck
        b_qi = tl.load(p_q + o_i)
        b_ki = tl.load(p_k + o_i)
        b_gi = tl.load(gc + o_hk + o_i)
        b_gr = tl.load(gc + o_hk + i * BC * BK + ok)
        b_dqh = tl.load(dqh + o_hk + o_i)
        b_dkb = tl.load(dkb + o_hk + o_i)
        for i_v in range(1, NV):
            b_dqh += tl.load(dqh + i_v * s_part + o_hk + o_i)
            b_dkb += tl.load(dkb + i_v * s_part + o_hk + o_i)
        b_dkh = tl.load(dkh + o_hk + o_i)
        b_eg = tl.exp(b_gi)
        b_egl = tl.exp(b_gl[None, :] - b_gi)
        # elementwise terms of Qh, Kh, Kb
        b_dq = b_dqh * b_eg
        b_dk = b_dkh * b_eg + b_dkb * b_egl
        b_dg = (b_dqh * b_qi + b_dkh * b_ki) * b_eg - b_dkb * b_ki * b_egl
        # rows i as x against blocks j < i: tl.dot, decays split at r (first row of block i)
        b_dqx = tl.full([BC, KC], 0.0, tl.float32)
        b_dkx = tl.full([BC, KC], 0.0, tl.float32)
        for j in range(i):
            o_j = j * BC * BK + o_ck
            b_kj = tl.load(p_k + o_j) * tl.exp(b_gr[None, :] - tl.load(gc + o_hk + o_j))
            o_ij = o_a + i * BC * BT + j * BC
            b_daqk = tl.load(daqk + o_ij)
            for i_v in range(1, NV):
                b_daqk += tl.load(daqk + i_v * s_part_a + o_ij)
            b_dqx += tl.dot(b_daqk, b_kj, input_precision=DOT)
            b_dkx += tl.dot(tl.load(da + o_ij), b_kj, input_precision=DOT)
        b_eir = tl.exp(b_gi - b_gr[None, :])
        b_dqx *= b_eir
        b_dkx *= b_eir
        # rows i as y against blocks j > i: tl.dot, decays split at r_j (first row of block j)
        b_dky = tl.full([BC, KC], 0.0, tl.float32)
        for j in range(i + 1, NC):
            o_j = j * BC * BK + o_ck
            b_grj = tl.load(gc + o_hk + j * BC * BK + ok)
            b_ejr = tl.exp(tl.load(gc + o_hk + o_j) - b_grj[None, :])
            o_ji = o_a + j * BC * BT + i * BC
            b_daqk = tl.load(daqk + o_ji)
            for i_v in range(1, NV):
                b_daqk += tl.load(daqk + i_v * s_part_a + o_ji)
            b_y = tl.dot(tl.trans(b_daqk), tl.load(p_q + o_j) * b_ejr, input_precision=DOT)
            b_y += tl.dot(tl.trans(tl.load(da + o_ji)), tl.load(p_k + o_j) * b_ejr, input_precision=DOT)
            b_dky += b_y * tl.exp(b_grj[None, :] - b_gi)
        # the diagonal block, exact decay per pair ([BC, BC, KC] in registers)
        o_ii = o_a + i * BC * (BT + 1)
        b_daqk = tl.load(daqk + o_ii)
        for i_v in range(1, NV):
            b_daqk += tl.load(daqk + i_v * s_part_a + o_ii)
        b_da = tl.load(da + o_ii)
        b_e = tl.exp(tl.where(lower, b_gi[:, None, :] - b_gi[None, :, :], 0.0))
        b_e = tl.where(lower, b_e, 0.0)
        b_ye = b_ki[None, :, :] * b_e
        b_dqx += tl.reduce(b_daqk[:, :, None] * b_ye, 1, add)
        b_dkx += tl.reduce(b_da[:, :, None] * b_ye, 1, add)
        b_dky += tl.reduce((b_daqk[:, :, None] * b_qi[:, None, :] + b_da[:, :, None] * b_ki[:, None, :]) * b_e, 0, add)
        b_dq += b_dqx
        b_dk += b_dkx + b_dky
        b_dg += b_qi * b_dqx + b_ki * (b_dkx - b_dky)
        # dg = suffix sum of dG within the chunk: within the block, plus everything after it (the carry)
        b_dgs = tl.associative_scan(b_dg, 0, add, reverse=True) + b_carry[None, :]
        b_carry += tl.reduce(b_dg, 0, add)
        oi = i_t * BT + i * BC + oc
        p_out = ((i_b * T + oi[:, None]) * HV + i_hv) * K + ok[None, :]
        m_out = (oi < T)[:, None] & (ok < K)[None, :]
        tl.store(dq_part + p_out, b_dq * scale, mask=m_out)
        tl.store(dk_part + p_out, b_dk, mask=m_out)
        tl.store(dg + p_out, b_dgs.to(dg.dtype.element_ty), mask=m_out)


@triton.jit
def kda_reduce_kernel(x, y, R, N, S, M, BN: tl.constexpr, BM: tl.constexpr):
    """y[n, m] = sum over r < R and s < S of x[r, n, s, m]: x float32 [R, N, S, M] contiguous (shares of V tiles
    and of the value heads of a GVA group), y [N, M] in the gradient's dtype. A fixed order: deterministic."""
    i_n = tl.program_id(0).to(tl.int64)
    on = i_n * BN + tl.arange(0, BN)
    om = tl.arange(0, BM)
    mask = (on < N)[:, None] & (om < M)[None, :]
    acc = tl.full([BN, BM], 0.0, tl.float32)
    for r in range(R):
        for s in range(S):
            base = (tl.cast(r, tl.int64) * N * S + tl.cast(s, tl.int64)) * M
            acc += tl.load(x + base + on[:, None] * (S * M) + om[None, :], mask=mask, other=0.0)
    tl.store(y + on[:, None] * M + om[None, :], acc.to(y.dtype.element_ty), mask=mask)


def _reduce(parts: torch.Tensor, out: torch.Tensor, n: int, s: int, m: int) -> torch.Tensor:
    """Sum parts [R, n, s, m] (float32) over R and s into out [n, m] (out's dtype) with kda_reduce_kernel."""
    if n > 0 and m > 0:
        kda_reduce_kernel[(triton.cdiv(n, 32),)](parts, out, parts.shape[0], n, s, m, BN=32,
                                                 BM=max(16, triton.next_power_of_2(m)))
    return out


class KDAChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        b, t_len, h, dk = q.shape
        hv, dv = v.shape[2], v.shape[3]
        has_h0 = initial_state is not None
        h0 = initial_state.contiguous() if has_h0 else v
        # the state's dtype: initial_state's, else float32 (float64 for float64 inputs)
        state_dtype = initial_state.dtype if has_h0 else torch.float64 if v.dtype == torch.float64 else torch.float32
        settings = target_settings(v.device)
        dot, warps = settings["DOT"], settings["num_warps"]
        bk = max(16, triton.next_power_of_2(dk))
        kb = max(min(settings["KB"], bk), bk // 4)         # at most four key blocks in the state passes
        nt = triton.cdiv(t_len, BT)
        tp = nt * BT
        f32 = dict(dtype=torch.float32, device=v.device)
        qs = torch.empty(b * h, tp, bk, **f32)
        ks = torch.empty(b * h, tp, bk, **f32)
        gc = torch.empty(b * hv, tp, bk, **f32)
        aa = torch.zeros(b * hv, tp, BT, **f32)           # only the blocks on and below the diagonal are written
        aqk = torch.zeros(b * hv, tp, BT, **f32)
        mm = torch.empty(b * hv, tp, BT, **f32)
        w = torch.empty(b * hv, tp, bk, **f32)
        u = torch.empty(b * hv, tp, dv, **f32)
        vn = torch.empty(b * hv, tp, dv, **f32)
        hs = torch.empty(b * hv, nt, bk, dv, **f32)
        o = torch.empty_like(v)
        ht = torch.empty(b, hv, dk, dv, dtype=state_dtype, device=v.device)
        if b * hv > 0:
            grid = (nt, b * hv)
            kda_chunk_prep_kernel[grid](q, k, g, qs, ks, gc, scale, t_len, h, hv, dk, tp, BT=BT, BK=bk,
                                        KB=kb, num_warps=warps)
            kda_chunk_intra_fwd_kernel[grid](qs, ks, gc, aa, aqk, h, hv, tp, BT=BT, BC=BC, BK=bk, KC=min(KC, bk),
                                             DOT=dot, num_warps=warps)
            kda_chunk_solve_kernel[grid](v, beta, ks, gc, aa, mm, w, u, t_len, h, hv, dv, tp, triton.cdiv(dv, BV),
                                         BT=BT, LOG_BT=BT.bit_length() - 1, BK=bk, BV=BV, KB=kb, DOT=dot,
                                         num_warps=warps)
            kda_chunk_state_fwd_kernel[(triton.cdiv(dv, BV), b * hv)](
                qs, ks, gc, w, u, aqk, h0, o, ht, hs, vn, t_len, h, hv, dk, dv, tp, nt, HAS_H0=has_h0, BT=BT, BK=bk,
                BV=BV, KB=kb, DOT=dot, num_warps=settings["state_fwd_warps"], num_stages=settings["state_stages"])
        ctx.save_for_backward(qs, ks, v, beta, gc, aa, aqk, mm, w, vn, hs)
        ctx.scale, ctx.has_h0, ctx.state_dtype, ctx.dims = scale, has_h0, state_dtype, (b, t_len, h, dk, q.dtype)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        qs, ks, v, beta, gc, aa, aqk, mm, w, vn, hs = ctx.saved_tensors
        do, dht = do.contiguous(), dht.contiguous()
        b, t_len, h, dk, qk_dtype = ctx.dims
        hv, dv_ = v.shape[2], v.shape[3]
        nt, tp, bk = hs.shape[1], gc.shape[1], gc.shape[2]
        settings = target_settings(v.device)
        dot, warps = settings["DOT"], settings["num_warps"]
        kb = max(min(settings["KB"], bk), bk // 4)
        nv = triton.cdiv(dv_, BV)
        f32 = dict(dtype=torch.float32, device=v.device)
        du = torch.empty(b * hv, tp, dv_, **f32)
        dqh = torch.empty(nv, b * hv, tp, bk, **f32)       # shares of each V tile
        dw = torch.empty(nv, b * hv, tp, bk, **f32)
        dkb = torch.empty(nv, b * hv, tp, bk, **f32)
        dgl = torch.empty(nv, b * hv, nt, bk, **f32)
        daqk = torch.empty(nv, b * hv, tp, BT, **f32)
        dkh = torch.empty(b * hv, tp, bk, **f32)
        da = torch.empty(b * hv, tp, BT, **f32)
        dq_part = torch.empty(1, b, t_len, hv, dk, **f32)  # per value head, summed over GVA groups below
        dk_part = torch.empty(1, b, t_len, hv, dk, **f32)
        dv = torch.empty_like(v)
        dg = torch.empty(b, t_len, hv, dk, dtype=qk_dtype, device=v.device)
        dbeta = torch.empty_like(beta)
        dh0 = torch.empty(b, hv, dk, dv_, dtype=ctx.state_dtype, device=v.device) if ctx.has_h0 else dv
        if b * hv > 0:
            kda_chunk_state_bwd_kernel[(nv, b * hv)](
                qs, ks, gc, w, vn, aqk, hs, do, dht, du, dqh, dw, dkb, dgl, daqk, dh0, b, t_len, h, hv, dk, dv_, tp,
                nt, STORE_DH0=ctx.has_h0, BT=BT, BK=bk, BV=BV, KB=kb, DOT=dot, num_warps=settings["state_bwd_warps"],
                num_stages=settings["state_stages"])
            kda_chunk_wy_bwd_kernel[(nt, b * hv)](v, beta, ks, gc, aa, mm, du, dw, dv, dbeta, dkh, da, b, t_len, h, hv,
                                                  dv_, tp, nv, BT=BT, BK=bk, BV=BV, KB=kb, DOT=dot,
                                                  num_warps=warps)
            kc = min(KC, bk)
            kda_chunk_intra_bwd_kernel[(nt, b * hv, bk // kc)](qs, ks, gc, dqh, dkb, dgl, daqk, dkh, da, dq_part,
                                                               dk_part, dg, ctx.scale, b, t_len, h, hv, dk, tp, nt, nv,
                                                               BT=BT, BC=BC, BK=bk, KC=kc, DOT=dot, num_warps=warps)
        group = hv // h
        dq = _reduce(dq_part, torch.empty(b, t_len, h, dk, dtype=qk_dtype, device=v.device), b * t_len * h, group, dk)
        dk_ = _reduce(dk_part, torch.empty(b, t_len, h, dk, dtype=qk_dtype, device=v.device), b * t_len * h, group, dk)
        return dq, dk_, dv, dg, dbeta, None, (dh0 if ctx.has_h0 else None)


def run(q, k, v, g, beta, scale, initial_state):
    """q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (log decay <= 0); beta [B, T, HV]; initial_state
    [B, HV, K, V] float32 or None -> (o [B, T, HV, V] in v.dtype, final_state [B, HV, K, V] float32)."""
    return KDAChunkFunction.apply(q, k, v, g, beta, scale, initial_state)
