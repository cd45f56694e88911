"""kda candidate rendered from templates/kda/chunked.py.j2.

chunked WY form, forward and backward; tl.dot within and across chunks, the state carried chunk to chunk
params: BT=16, BC=16, BV=16, KC=16, num_warps=4
launch on sm_100a: KB=16, num_warps=8
launch on sm_80: KB=32, state_bwd_warps=8
launch on sm_90a: KB=16, state_bwd_warps=8
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
BT = 16  # chunk length: the WY transform runs within a chunk, the state is carried from chunk to chunk
BC = 16  # sub-chunk: pairs in different sub-chunks use tl.dot, pairs within one use exact per-pair decays
BV = 16  # value columns per program of the state passes
KC = 16  # key columns per tile of the intra-chunk kernels (capped at K rounded up to a power of two)
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'KB': 16, 'num_warps': 8}, 'sm_80': {'KB': 32, 'state_bwd_warps': 8}, 'sm_90a': {'KB': 16, 'state_bwd_warps': 8}}


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
# tl.dot operand precision per target: float32-accurate everywhere (the delta rule's inverse and the state carried
# over thousands of chunks amplify operand rounding; plain tf32 or bf16 operands lose ~1e-3 per product). On GPUs that
# accuracy comes from the tensor cores through split operands: 3xTF32 on NVIDIA, 6xBF16 on AMD (CDNA has no TF32
# split); the interpreter multiplies in float32 itself.
# KB: key columns per tile of the kernels that span all K (prep, solve, the state passes, the output kernel, dh_local,
# dqkw). A [K, V] state held in registers, or whole [BT, BT] products with split operands, do not fit a thread's
# registers at the model suite (K = V = 128); so the state passes keep the state in memory, loop over key blocks and
# do only what feeds the next state, the rest runs parallel over chunks, the inverse is solved in 16-row blocks, dL is
# made 16 columns at a time and wy_bwd takes K 16 columns at a time. `workbench targets` shows each launch's registers
# and spills per target. The interpreter takes KB 8 so that the small verification shapes (K <= 32) run several key
# blocks.
LAUNCH_SETTINGS = {
    "default": {"num_warps": 4, "state_fwd_warps": 4,
                "state_bwd_warps": 4,
                "state_stages": 1, "KB": 64},
    "interpreter": {"DOT": "ieee", "KB": 8},
    "cuda": {"DOT": "tf32x3"},
    "hip": {"DOT": "bf16x6"},
}


# Layouts. Inputs: q, k [B, T, H, K]; v, o [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]. Everything the kernels
# exchange is float32, head-major and padded: TP = T rounded up to BT rows (rows past T are zero, or carry the
# chunk's last value for the gate cumsum) and BK = K rounded up to a power of two, at least 16 (extra columns are
# zero), so only the kernels that touch the inputs and outputs need masks.
#   qs, ks [B*H, TP, BK] (qs = scale q);  gc, w [B*HV, TP, BK];  aa, aqk, mm [B*HV, TP, BT];  u, vn [B*HV, TP, V];
#   hs [B*HV, NT + 1, BK, V] (the state before each chunk, then the final one; zero past K).


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
                           BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr, DOT: tl.constexpr):
    """Per chunk: M = (I + L)^-1 with L = diag(beta) aa (strictly lower), then with Tm = M diag(beta):
    w = Tm (exp(G) k) and u = Tm v; M is kept for the backward (mm).
    M is solved in blocks of 16 rows, first to last. The diagonal block M_ii = (I + L_ii)^-1 doubles its own
    diagonal blocks: X starts as I (1 x 1 blocks); with blocks of s rows inverted, each pair [[A, 0], [C, B]] of them
    becomes [[A^-1, 0], [-B^-1 C A^-1, B^-1]], i.e. X <- X - X P X with P the C blocks of L_ii (four rounds of two
    16 x 16 tl.dot). The blocks left of it are M_ij = -M_ii sum_{j <= k < i} L_ik M_kj, from the blocks of M already
    in mm (a barrier after each block row makes them visible to every thread of the program). 16 x 16 tiles keep
    few registers live, where whole [BT, BT] products with float32-accurate operands overflowed them."""
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    NB: tl.constexpr = BT // 16
    o16 = tl.arange(0, 16)
    o_ss = o16[:, None] * BT + o16[None, :]             # a 16 x 16 block of a chunk's [BT, BT]
    p_a = aa + (i_bh * TP + i_t * BT) * BT
    p_m = mm + (i_bh * TP + i_t * BT) * BT
    for i in range(NB):
        oi = i_t * BT + i * 16 + o16
        b_bi = tl.load(beta + (i_b * T + oi) * HV + i_hv, mask=oi < T, other=0.0).to(tl.float32)
        b_l = tl.load(p_a + i * 16 * (BT + 1) + o_ss) * b_bi[:, None]
        b_x = tl.where(o16[:, None] == o16[None, :], 1.0, 0.0)
        for lvl in range(4):  # a loop, not unrolled (unrolled rounds cost ptxas minutes)
            pair = (o16 // (2 << lvl))[:, None] == (o16 // (2 << lvl))[None, :]
            below = (o16 // (1 << lvl))[:, None] > (o16 // (1 << lvl))[None, :]
            b_p = tl.where(pair & below, b_l, 0.0)
            b_x -= tl.dot(b_x, tl.dot(b_p, b_x, input_precision=DOT), input_precision=DOT)
        for j in range(i):
            b_s = tl.full([16, 16], 0.0, tl.float32)
            for kk in range(j, i):
                b_lik = tl.load(p_a + i * 16 * BT + kk * 16 + o_ss) * b_bi[:, None]
                b_s += tl.dot(b_lik, tl.load(p_m + kk * 16 * BT + j * 16 + o_ss), input_precision=DOT)
            tl.store(p_m + i * 16 * BT + j * 16 + o_ss, -tl.dot(b_x, b_s, input_precision=DOT))
        tl.store(p_m + i * 16 * (BT + 1) + o_ss, b_x)
        for j in range(i + 1, NB):
            tl.store(p_m + i * 16 * BT + j * 16 + o_ss, tl.full([16, 16], 0.0, tl.float32))
        tl.debug_barrier()  # this block row of M, written by every thread of the program
    ot = i_t * BT + tl.arange(0, BT)
    oc = tl.arange(0, BT)
    mt = ot < T
    b_beta = tl.load(beta + (i_b * T + ot) * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
    b_tm = tl.load(p_m + oc[:, None] * BT + oc[None, :]) * b_beta[None, :]
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


# The state passes carry the state (or its gradient) from chunk to chunk through memory: hs [B*HV, NT + 1, BK, V]
# holds the state before every chunk and, at NT, the final one (dhs likewise the gradients), float32, zero past K.
# Each chunk reads the state KB key rows at a time in a loop over key blocks and writes the next state block by
# block, so one block's tiles are live at a time (several register-resident blocks with their float32-accurate dot
# operands would overflow the registers). A barrier makes each chunk's writes by every thread of the program visible to
# the next chunk's reads; the state block (KB x BV floats) stays in the cache. Every product that does not feed the
# next state is left to kernels parallel over chunks that read the stored states, as fla's chunk_fwd_o and
# chunk_bwd_dqkwg.


@triton.jit
def kda_chunk_state_fwd_kernel(ks, gc, w, u, hs, vn, H, HV, V, TP, NT, BT: tl.constexpr, BK: tl.constexpr,
                               BV: tl.constexpr, KB: tl.constexpr, DOT: tl.constexpr):
    """One (V tile, batch x value head) per program, chunk after chunk, with S = hs[chunk] ([BK, BV] of it):
        U = u - w S;  hs[chunk + 1] = exp(G_last) S + (exp(G_last - G) k)^T U
    hs[:, 0] is the initial state (zero past K); U (vn) goes on to the output kernel and the backward."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # V tile offsets stay int32 (fewer registers)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    okb = tl.arange(0, KB)
    ov = i_v * BV + tl.arange(0, BV)
    oc = tl.arange(0, BT)
    mv = ov < V
    o_ck = oc[:, None] * BK + okb[None, :]
    o_cv = oc[:, None] * V + ov[None, :]
    o_kv = okb[:, None] * V + ov[None, :]
    for i_t in range(NT):
        r0 = i_t * BT
        p_s = hs + (i_bh * (NT + 1) + i_t) * BK * V
        p_k = ks + (i_b * H + i_h) * TP * BK + r0 * BK
        p_g = gc + (i_bh * TP + r0) * BK
        p_w = w + (i_bh * TP + r0) * BK
        p_gl = p_g + (BT - 1) * BK
        p_hv = (i_bh * TP + r0) * V
        tl.debug_barrier()  # the state before this chunk, written by every thread of the program
        b_vn = tl.load(u + p_hv + o_cv, mask=mv[None, :], other=0.0)
        for c0 in range(0, BK, KB):
            b_s = tl.load(p_s + c0 * V + o_kv, mask=mv[None, :], other=0.0)
            b_vn -= tl.dot(tl.load(p_w + c0 + o_ck), b_s, input_precision=DOT)
        tl.store(vn + p_hv + o_cv, b_vn, mask=mv[None, :])
        for c0 in range(0, BK, KB):
            b_gl = tl.load(p_gl + c0 + okb)
            b_kb = tl.load(p_k + c0 + o_ck) * tl.exp(b_gl[None, :] - tl.load(p_g + c0 + o_ck))
            b_s = tl.load(p_s + c0 * V + o_kv, mask=mv[None, :], other=0.0) * tl.exp(b_gl)[:, None]
            b_s += tl.dot(tl.trans(b_kb), b_vn, input_precision=DOT)
            tl.store(p_s + (BK + c0) * V + o_kv, b_s, mask=mv[None, :])


@triton.jit
def kda_chunk_o_kernel(qs, gc, aqk, hs, vn, o, T, H, HV, V, TP, NT, BT: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, KB: tl.constexpr, DOT: tl.constexpr):
    """Per (V tile, chunk, batch x value head), with S the state before the chunk (hs) and U its corrected values
    (vn): o = (q~ exp(G)) S + aqk U, KB key columns at a time."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    r0 = i_t * BT
    oc = tl.arange(0, BT)
    okb = tl.arange(0, KB)
    ov = i_v * BV + tl.arange(0, BV)
    mv = ov < V
    o_ck = oc[:, None] * BK + okb[None, :]
    o_kv = okb[:, None] * V + ov[None, :]
    p_q = qs + ((i_b * H + i_h) * TP + r0) * BK
    p_g = gc + (i_bh * TP + r0) * BK
    p_s = hs + (i_bh * (NT + 1) + i_t) * BK * V
    b_o = tl.dot(tl.load(aqk + (i_bh * TP + r0 + oc[:, None]) * BT + oc[None, :]),
                 tl.load(vn + (i_bh * TP + r0 + oc[:, None]) * V + ov[None, :], mask=mv[None, :], other=0.0),
                 input_precision=DOT)
    for c0 in range(0, BK, KB):
        b_qh = tl.load(p_q + c0 + o_ck) * tl.exp(tl.load(p_g + c0 + o_ck))
        b_o += tl.dot(b_qh, tl.load(p_s + c0 * V + o_kv, mask=mv[None, :], other=0.0), input_precision=DOT)
    tl.store(o + ((i_b * T + r0) * HV + i_hv) * V + oc[:, None] * (HV * V) + ov[None, :],
             b_o.to(o.dtype.element_ty), mask=(r0 + oc < T)[:, None] & mv[None, :])


@triton.jit
def kda_chunk_dh_local_kernel(qs, gc, do, dhs, T, H, HV, V, TP, NT, BT: tl.constexpr, BK: tl.constexpr,
                              BV: tl.constexpr, KB: tl.constexpr, DOT: tl.constexpr):
    """Per (V tile, chunk, batch x value head), the chunk's own share of the gradient of the state before it,
    dhs[chunk] = (q~ exp(G))^T do, KB key rows at a time; the backward state pass adds the rest in place."""
    i_v, i_t, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    r0 = i_t * BT
    oc = tl.arange(0, BT)
    okb = tl.arange(0, KB)
    ov = i_v * BV + tl.arange(0, BV)
    mv = ov < V
    o_kc = okb[:, None] + oc[None, :] * BK  # [KB, BT]: key columns of the chunk, read transposed
    o_kv = okb[:, None] * V + ov[None, :]
    p_q = qs + ((i_b * H + i_h) * TP + r0) * BK
    p_g = gc + (i_bh * TP + r0) * BK
    p_ds = dhs + (i_bh * (NT + 1) + i_t) * BK * V
    b_do = tl.load(do + ((i_b * T + r0) * HV + i_hv) * V + oc[:, None] * (HV * V) + ov[None, :],
                   mask=(r0 + oc < T)[:, None] & mv[None, :], other=0.0).to(tl.float32)
    for c0 in range(0, BK, KB):
        b_qht = tl.load(p_q + c0 + o_kc) * tl.exp(tl.load(p_g + c0 + o_kc))
        tl.store(p_ds + c0 * V + o_kv, tl.dot(b_qht, b_do, input_precision=DOT), mask=mv[None, :])


@triton.jit
def kda_chunk_state_bwd_kernel(ks, gc, w, aqk, do, du, dhs, T, H, HV, V, TP, NT, BT: tl.constexpr,
                               BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr, DOT: tl.constexpr):
    """Chunks last to first, with dS = dhs[chunk + 1] ([BK, BV] of it) the gradient of the state after the chunk:
        dU = aqk^T do + (exp(G_last - G) k) dS;  dhs[chunk] += exp(G_last) dS - w^T dU
    dhs[:, NT] is the final state's gradient (zero past K) and dhs[chunk] starts as the chunk's own share
    (dh_local); du [B*HV, TP, V] goes on to the kernels parallel over chunks."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1).to(tl.int64)  # V tile offsets stay int32 (fewer registers)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    okb = tl.arange(0, KB)
    ov = i_v * BV + tl.arange(0, BV)
    oc = tl.arange(0, BT)
    mv = ov < V
    o_ck = oc[:, None] * BK + okb[None, :]
    o_cv = oc[:, None] * V + ov[None, :]
    o_kv = okb[:, None] * V + ov[None, :]
    for ic in range(NT):
        i_t = NT - 1 - ic
        r0 = i_t * BT
        p_k = ks + (i_b * H + i_h) * TP * BK + r0 * BK
        p_g = gc + (i_bh * TP + r0) * BK
        p_w = w + (i_bh * TP + r0) * BK
        p_gl = p_g + (BT - 1) * BK
        p_ds0 = dhs + (i_bh * (NT + 1) + i_t) * BK * V  # before the chunk
        p_ds = p_ds0 + BK * V                           # after it
        b_do = tl.load(do + ((i_b * T + r0) * HV + i_hv) * V + oc[:, None] * (HV * V) + ov[None, :],
                       mask=(r0 + oc < T)[:, None] & mv[None, :], other=0.0).to(tl.float32)
        tl.debug_barrier()  # the gradient after this chunk, written by every thread of the program
        b_du = tl.dot(tl.trans(tl.load(aqk + (i_bh * TP + r0 + oc[:, None]) * BT + oc[None, :])), b_do,
                      input_precision=DOT)
        for c0 in range(0, BK, KB):
            b_gl = tl.load(p_gl + c0 + okb)
            b_kb = tl.load(p_k + c0 + o_ck) * tl.exp(b_gl[None, :] - tl.load(p_g + c0 + o_ck))
            b_du += tl.dot(b_kb, tl.load(p_ds + c0 * V + o_kv, mask=mv[None, :], other=0.0), input_precision=DOT)
        tl.store(du + (i_bh * TP + r0) * V + o_cv, b_du, mask=mv[None, :])
        for c0 in range(0, BK, KB):
            b_egl = tl.exp(tl.load(p_gl + c0 + okb))
            b_ds = tl.load(p_ds + c0 * V + o_kv, mask=mv[None, :], other=0.0) * b_egl[:, None]
            b_ds += tl.load(p_ds0 + c0 * V + o_kv, mask=mv[None, :], other=0.0)
            b_ds -= tl.dot(tl.trans(tl.load(p_w + c0 + o_ck)), b_du, input_precision=DOT)
            tl.store(p_ds0 + c0 * V + o_kv, b_ds, mask=mv[None, :])


@triton.jit
def kda_chunk_dqkw_kernel(gc, vn, hs, dhs, do, du, dqh, dw, dkb, dgl, daqk, T, HV, V, TP, NT, BT: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr, DOT: tl.constexpr):
    """Per (chunk, batch x value head, block of KB key columns), summed over V in tiles of BV columns, with S0 the
    state before the chunk (hs) and dS the gradient of the state after it (dhs, one chunk on):
        dQh = do S0^T;  dw = -dU S0^T;  dKb = U dS^T          [B*HV, TP, BK]
        dgl = exp(G_last) rowsum(dS * S0)                     [B*HV, NT, BK]
    One more program per chunk (key block index BK / KB) writes daqk = do U^T on and below the diagonal
    [B*HV, TP, BT]."""
    i_t, i_bh, i_k = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    r0 = i_t * BT
    oc = tl.arange(0, BT)
    ovb = tl.arange(0, BV)
    mt = (r0 + oc < T)[:, None]
    p_do = do + ((i_b * T + r0) * HV + i_hv) * V + oc[:, None] * (HV * V)
    o_hv = (i_bh * TP + r0 + oc[:, None]) * V
    if i_k < BK // KB:
        ok = i_k * KB + tl.arange(0, KB)
        o_vk = (i_bh * (NT + 1) + i_t) * BK * V + ok[None, :] * V  # [BV, KB] tiles of S0^T and dS^T
        b_dqh = tl.full([BT, KB], 0.0, tl.float32)
        b_dw = tl.full([BT, KB], 0.0, tl.float32)
        b_dkb = tl.full([BT, KB], 0.0, tl.float32)
        b_dgl = tl.full([KB], 0.0, tl.float32)
        for v0 in range(0, V, BV):
            ov = v0 + ovb
            mv = ov < V
            b_s0t = tl.load(hs + o_vk + ov[:, None], mask=mv[:, None], other=0.0)
            b_dst = tl.load(dhs + BK * V + o_vk + ov[:, None], mask=mv[:, None], other=0.0)
            b_do = tl.load(p_do + ov[None, :], mask=mt & mv[None, :], other=0.0).to(tl.float32)
            b_dqh += tl.dot(b_do, b_s0t, input_precision=DOT)
            b_dw -= tl.dot(tl.load(du + o_hv + ov[None, :], mask=mv[None, :], other=0.0), b_s0t,
                           input_precision=DOT)
            b_dkb += tl.dot(tl.load(vn + o_hv + ov[None, :], mask=mv[None, :], other=0.0), b_dst,
                            input_precision=DOT)
            b_dgl += tl.reduce(b_dst * b_s0t, 0, add)
        o_tk = (i_bh * TP + r0 + oc[:, None]) * BK + ok[None, :]
        tl.store(dqh + o_tk, b_dqh)
        tl.store(dw + o_tk, b_dw)
        tl.store(dkb + o_tk, b_dkb)
        b_egl = tl.exp(tl.load(gc + (i_bh * TP + r0 + BT - 1) * BK + ok))
        tl.store(dgl + (i_bh * NT + i_t) * BK + ok, b_dgl * b_egl)
    else:
        b_da = tl.full([BT, BT], 0.0, tl.float32)
        for v0 in range(0, V, BV):
            ov = v0 + ovb
            mv = ov < V
            b_do = tl.load(p_do + ov[None, :], mask=mt & mv[None, :], other=0.0).to(tl.float32)
            b_vnt = tl.load(vn + (i_bh * TP + r0 + oc[None, :]) * V + ov[:, None], mask=mv[:, None], other=0.0)
            b_da += tl.dot(b_do, b_vnt, input_precision=DOT)
        b_da = tl.where(oc[:, None] >= oc[None, :], b_da, 0.0)
        tl.store(daqk + (i_bh * TP + r0 + oc[:, None]) * BT + oc[None, :], b_da)


@triton.jit
def kda_chunk_wy_bwd_kernel(v, beta, ks, gc, mm, du, dw, dv, dkh, dtm, T, H, HV, V, TP, NV, BT: tl.constexpr,
                            BK: tl.constexpr, BV: tl.constexpr, DOT: tl.constexpr):
    """Per chunk, back through u = Tm v and w = Tm (exp(G) k), Tm = M diag(beta):
        dv = Tm^T dU;  dKh = Tm^T dw;  dTm = dU v^T + dw (exp(G) k)^T
    dv [B, T, HV, V] is final; dKh [B*HV, TP, BK] and dTm (dtm [B*HV, TP, BT]) go on. Tm^T is read transposed from
    memory (no transpose in registers) and is dead before dTm accumulates. K is taken 16 columns at a time (wider
    tiles spilled on sm_80, whose mma operands both sit in registers)."""
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    ot = i_t * BT + tl.arange(0, BT)
    oc = tl.arange(0, BT)
    mt = ot < T
    b_beta = tl.load(beta + (i_b * T + ot) * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
    b_tmt = tl.load(mm + (i_bh * TP + ot[None, :]) * BT + oc[:, None]) * b_beta[:, None]
    p_kh = (i_b * H + i_h) * TP * BK  # this chunk's head in ks
    p_hk = i_bh * TP * BK             # ... in gc, dw, dkh
    for c0 in range(0, BK, 16):
        o_tk = ot[:, None] * BK + c0 + tl.arange(0, 16)[None, :]
        tl.store(dkh + p_hk + o_tk, tl.dot(b_tmt, tl.load(dw + p_hk + o_tk), input_precision=DOT))
    for i_v in range(NV):
        ov = i_v * BV + tl.arange(0, BV)
        b_du = tl.load(du + (i_bh * TP + ot[:, None]) * V + ov[None, :], mask=(ov < V)[None, :], other=0.0)
        tl.store(dv + ((i_b * T + ot[:, None]) * HV + i_hv) * V + ov[None, :],
                 tl.dot(b_tmt, b_du, input_precision=DOT).to(dv.dtype.element_ty), mask=mt[:, None] & (ov < V)[None, :])
    b_dt = tl.full([BT, BT], 0.0, tl.float32)
    for c0 in range(0, BK, 16):
        o_tk = ot[:, None] * BK + c0 + tl.arange(0, 16)[None, :]
        b_kh = tl.load(ks + p_kh + o_tk) * tl.exp(tl.load(gc + p_hk + o_tk))
        b_dt += tl.dot(tl.load(dw + p_hk + o_tk), tl.trans(b_kh), input_precision=DOT)
    for i_v in range(NV):
        ov = i_v * BV + tl.arange(0, BV)
        m_tv = mt[:, None] & (ov < V)[None, :]
        b_du = tl.load(du + (i_bh * TP + ot[:, None]) * V + ov[None, :], mask=(ov < V)[None, :], other=0.0)
        b_v = tl.load(v + ((i_b * T + ot[:, None]) * HV + i_hv) * V + ov[None, :], mask=m_tv, other=0.0)
        b_dt += tl.dot(b_du, tl.trans(b_v.to(tl.float32)), input_precision=DOT)
    tl.store(dtm + (i_bh * TP + ot[:, None]) * BT + oc[None, :], b_dt)


@triton.jit
def kda_chunk_solve_bwd_kernel(beta, aa, mm, dtm, dbeta, da, T, HV, TP, BT: tl.constexpr, DOT: tl.constexpr):
    """Per chunk, back through Tm = M diag(beta), M = (I + L)^-1, L = diag(beta) aa, from dTm (dtm):
        dM = dTm diag(beta);  dL = -(M^T dM M^T) below the diagonal;  da = diag(beta) dL
        dbeta_j = sum_i dTm[i, j] M[i, j] + sum_j' dL[j, j'] aa[j, j']
    dbeta [B, T, HV] is final; da [B*HV, TP, BT] goes on. dL is made 16 columns at a time (M^T's columns read from
    memory), apart from wy_bwd, so that no two whole [BT, BT] float32-accurate products are live together."""
    i_t, i_bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    ot = i_t * BT + tl.arange(0, BT)
    oc = tl.arange(0, BT)
    o16 = tl.arange(0, 16)
    mt = ot < T
    o_tt = (i_bh * TP + ot[:, None]) * BT + oc[None, :]
    b_beta = tl.load(beta + (i_b * T + ot) * HV + i_hv, mask=mt, other=0.0).to(tl.float32)
    b_dt = tl.load(dtm + o_tt)
    b_dbeta = tl.reduce(b_dt * tl.load(mm + o_tt), 0, add)
    b_dm = b_dt * b_beta[None, :]
    b_mt = tl.load(mm + (i_bh * TP + ot[None, :]) * BT + oc[:, None])  # M^T, read transposed
    for n0 in range(0, BT, 16):
        b_mtn = tl.load(mm + (i_bh * TP + i_t * BT + n0 + o16[None, :]) * BT + oc[:, None])  # columns n0.. of M^T
        b_dl = -tl.dot(b_mt, tl.dot(b_dm, b_mtn, input_precision=DOT), input_precision=DOT)
        b_dl = tl.where(oc[:, None] > n0 + o16[None, :], b_dl, 0.0)
        o_tn = (i_bh * TP + ot[:, None]) * BT + n0 + o16[None, :]
        b_dbeta += tl.reduce(b_dl * tl.load(aa + o_tn), 1, add)
        tl.store(da + o_tn, b_dl * b_beta[:, None])
    tl.store(dbeta + (i_b * T + ot) * HV + i_hv, b_dbeta.to(dbeta.dtype.element_ty), mask=mt)


@triton.jit
def kda_chunk_intra_bwd_kernel(qs, ks, gc, dqh, dkb, dgl, daqk, dkh, da, dq_part, dk_part, dg, scale, T, H, HV,
                               K, TP, NT, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                               KC: tl.constexpr, DOT: tl.constexpr):
    """Per (chunk, batch x value head, tile of KC key columns; every term is separate per key column), sub-chunk
    blocks last to first: gradients of q, k and of the gate g. With x = q~ (dA = daqk) or k (dA = da), y = k and
    A[i, j] = sum_d x_i y_j exp(G_i - G_j):
        dx_i += sum_j dA[i, j] y_j e_ij;  dy_j += sum_i dA[i, j] x_i e_ij
    (split decays through tl.dot off the diagonal, per-pair decays on it), plus the elementwise terms of
    Qh = q~ exp(G), Kh = k exp(G) and Kb = k exp(G_last - G).
    dg_t is summed from the terms whose decay spans t, never as a difference: a pair j < i spans t where j < t <= i
    (its term dA[i, j] x_i y_j e_ij), Qh_i and Kh_i where t <= i, Kb_j where j < t, the state's decay exp(G_last)
    (dgl) at every t. A suffix sum of per-row differences dG_i (the pair's term added at i, taken off at j) is the
    same sum in exact arithmetic, but where the decay is steep (Qwen3-Next's) those terms round far above dg itself.
    dq, dk are per value head (float32 [B, T, HV, K], summed over GVA groups afterwards); dg [B, T, HV, K] is final."""
    i_t, i_bh, i_k = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    NC: tl.constexpr = BT // BC
    oc = tl.arange(0, BC)
    on = tl.arange(0, NC)
    ok = i_k * KC + tl.arange(0, KC)
    o_ck = oc[:, None] * BK + ok[None, :]
    o_cc = oc[:, None] * BT + oc[None, :]
    o_tk = tl.arange(0, BT)[:, None] * BK + ok[None, :]
    earlier = oc[None, :, None] < oc[:, None, None]  # [t or i, j, 1]: j before the row
    lower = earlier | (oc[None, :, None] == oc[:, None, None])
    p_q = qs + ((i_b * H + i_h) * TP + i_t * BT) * BK
    p_k = ks + ((i_b * H + i_h) * TP + i_t * BT) * BK
    o_hk = (i_bh * TP + i_t * BT) * BK               # this chunk in gc, dkh, dqh, dkb
    o_a = (i_bh * TP + i_t * BT) * BT + o_cc         # ... in da, daqk
    b_gl = tl.load(gc + o_hk + (BT - 1) * BK + ok)
    # each block's sum of Kb_j dKb_j, and the state's decay: every t
    b_kbt = tl.load(dkb + o_hk + o_tk) * tl.load(p_k + o_tk) * tl.exp(b_gl[None, :] - tl.load(gc + o_hk + o_tk))
    b_kb_blocks = tl.sum(tl.reshape(b_kbt, [NC, BC, KC]), 1)
    b_dgl = tl.load(dgl + (i_bh * NT + i_t) * BK + ok)
    b_after = tl.full([KC], 0.0, tl.float32)      # Qh, Kh terms of the blocks after this one
    b_span = tl.full([NC, KC], 0.0, tl.float32)   # [J]: pairs of the blocks after this one with block J
    for ic in range(NC):
        i = NC - 1 - ic
        o_i = i * BC * BK + o_ck
        b_qi = tl.load(p_q + o_i)
        b_ki = tl.load(p_k + o_i)
        b_gi = tl.load(gc + o_hk + o_i)
        b_gr = tl.load(gc + o_hk + i * BC * BK + ok)
        b_dqh = tl.load(dqh + o_hk + o_i)
        b_dkb = tl.load(dkb + o_hk + o_i)
        b_dkh = tl.load(dkh + o_hk + o_i)
        b_eg = tl.exp(b_gi)
        b_egl = tl.exp(b_gl[None, :] - b_gi)
        # elementwise terms of Qh, Kh, Kb
        b_dq = b_dqh * b_eg
        b_dk = b_dkh * b_eg + b_dkb * b_egl
        b_own = (b_dqh * b_qi + b_dkh * b_ki) * b_eg
        b_dg = tl.associative_scan(b_own, 0, add, reverse=True) + b_after[None, :] + b_dgl[None, :]
        b_dg += tl.sum(tl.where(on[:, None] < i, b_kb_blocks, 0.0), 0)[None, :]
        b_dg += tl.sum(tl.where(earlier, (b_dkb * b_ki * b_egl)[None, :, :], 0.0), 1)
        # pairs of a block after this one with a block before it span every row here
        b_dg += tl.sum(tl.where(on[:, None] < i, b_span, 0.0), 0)[None, :]
        # rows i as x against blocks j < i: tl.dot, decays split at r (first row of block i)
        b_eir = tl.exp(b_gi - b_gr[None, :])
        b_dqx = tl.full([BC, KC], 0.0, tl.float32)
        b_dkx = tl.full([BC, KC], 0.0, tl.float32)
        for j in range(i):
            o_j = j * BC * BK + o_ck
            b_kj = tl.load(p_k + o_j) * tl.exp(b_gr[None, :] - tl.load(gc + o_hk + o_j))
            o_ij = o_a + i * BC * BT + j * BC
            b_xq = tl.dot(tl.load(daqk + o_ij), b_kj, input_precision=DOT) * b_eir
            b_xk = tl.dot(tl.load(da + o_ij), b_kj, input_precision=DOT) * b_eir
            b_dqx += b_xq
            b_dkx += b_xk
            b_span += tl.where(on[:, None] == j, tl.sum(b_qi * b_xq + b_ki * b_xk, 0)[None, :], 0.0)
        # ... whose pairs span the rows from their own i up
        b_dg += tl.associative_scan(b_qi * b_dqx + b_ki * b_dkx, 0, add, reverse=True)
        # rows i as y against blocks j > i: tl.dot, decays split at r_j (first row of block j)
        b_dky = tl.full([BC, KC], 0.0, tl.float32)
        for j in range(i + 1, NC):
            o_j = j * BC * BK + o_ck
            b_grj = tl.load(gc + o_hk + j * BC * BK + ok)
            b_ejr = tl.exp(tl.load(gc + o_hk + o_j) - b_grj[None, :])
            o_ji = o_a + j * BC * BT + i * BC
            b_y = tl.dot(tl.trans(tl.load(daqk + o_ji)), tl.load(p_q + o_j) * b_ejr, input_precision=DOT)
            b_y += tl.dot(tl.trans(tl.load(da + o_ji)), tl.load(p_k + o_j) * b_ejr, input_precision=DOT)
            b_dky += b_y * tl.exp(b_grj[None, :] - b_gi)
        # ... whose pairs span the rows after their own j
        b_dg += tl.sum(tl.where(earlier, (b_ki * b_dky)[None, :, :], 0.0), 1)
        # the diagonal block, exact decay per pair ([BC, BC, KC] in registers): pair (i, j) spans j < t <= i
        o_ii = o_a + i * BC * (BT + 1)
        b_daqk = tl.load(daqk + o_ii)
        b_da = tl.load(da + o_ii)
        b_e = tl.exp(tl.where(lower, b_gi[:, None, :] - b_gi[None, :, :], 0.0))
        b_e = tl.where(lower, b_e, 0.0)
        b_ye = b_ki[None, :, :] * b_e
        b_dqx += tl.reduce(b_daqk[:, :, None] * b_ye, 1, add)
        b_dkx += tl.reduce(b_da[:, :, None] * b_ye, 1, add)
        b_xe = (b_daqk[:, :, None] * b_qi[:, None, :] + b_da[:, :, None] * b_ki[:, None, :]) * b_e
        b_dky += tl.reduce(b_xe, 0, add)
        b_pair = tl.associative_scan(tl.where(earlier, b_xe * b_ki[None, :, :], 0.0), 0, add, reverse=True)
        b_dg += tl.sum(tl.where(earlier, b_pair, 0.0), 1)
        b_dq += b_dqx
        b_dk += b_dkx + b_dky
        b_after += tl.sum(b_own, 0)
        oi = i_t * BT + i * BC + oc
        p_out = ((i_b * T + oi[:, None]) * HV + i_hv) * K + ok[None, :]
        m_out = (oi < T)[:, None] & (ok < K)[None, :]
        tl.store(dq_part + p_out, b_dq * scale, mask=m_out)
        tl.store(dk_part + p_out, b_dk, mask=m_out)
        tl.store(dg + p_out, b_dg.to(dg.dtype.element_ty), mask=m_out)


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


REDUCE_TILE = 1024
"""kda_reduce_kernel's sums a program (8 a thread at its 4 warps): stack-free on the five targets at every width
from 16 to 512, where 4 a thread keeps an 8-byte stack frame on sm_100a and 16 a thread one at 256 wide on sm_80."""


def _reduce(parts: torch.Tensor, out: torch.Tensor, n: int, s: int, m: int) -> torch.Tensor:
    """Sum parts [R, n, s, m] (float32) over R and s into out [n, m] (out's dtype) with kda_reduce_kernel."""
    if n > 0 and m > 0:
        bm = max(16, triton.next_power_of_2(m))
        bn = max(1, REDUCE_TILE // bm)
        kda_reduce_kernel[(triton.cdiv(n, bn),)](parts, out, parts.shape[0], n, s, m, BN=bn, BM=bm)
    return out


class KDAChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, initial_state):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        b, t_len, h, dk = q.shape
        hv, dv = v.shape[2], v.shape[3]
        has_h0 = initial_state is not None
        # the state's dtype: initial_state's, else float32 (float64 for float64 inputs)
        state_dtype = initial_state.dtype if has_h0 else torch.float64 if v.dtype == torch.float64 else torch.float32
        settings = target_settings(v.device)
        dot, warps = settings["DOT"], settings["num_warps"]
        bk = max(16, triton.next_power_of_2(dk))
        kb = min(settings["KB"], bk)
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
        hs = torch.empty(b * hv, nt + 1, bk, dv, **f32)  # the state before each chunk, then the final state
        hs[:, 0] = 0.0
        if has_h0:
            hs[:, 0, :dk] = initial_state.reshape(b * hv, dk, dv)
        o = torch.empty_like(v)
        if b * hv > 0:
            grid = (nt, b * hv)
            kda_chunk_prep_kernel[grid](q, k, g, qs, ks, gc, scale, t_len, h, hv, dk, tp, BT=BT, BK=bk,
                                        KB=kb, num_warps=warps)
            kda_chunk_intra_fwd_kernel[grid](qs, ks, gc, aa, aqk, h, hv, tp, BT=BT, BC=BC, BK=bk, KC=min(KC, bk),
                                             DOT=dot, num_warps=warps)
            kda_chunk_solve_kernel[grid](v, beta, ks, gc, aa, mm, w, u, t_len, h, hv, dv, tp, triton.cdiv(dv, BV),
                                         BT=BT, BK=bk, BV=BV, KB=kb, DOT=dot, num_warps=warps)
            kda_chunk_state_fwd_kernel[(triton.cdiv(dv, BV), b * hv)](
                ks, gc, w, u, hs, vn, h, hv, dv, tp, nt, BT=BT, BK=bk, BV=BV, KB=kb, DOT=dot,
                num_warps=settings["state_fwd_warps"], num_stages=settings["state_stages"])
            kda_chunk_o_kernel[(triton.cdiv(dv, BV), nt, b * hv)](qs, gc, aqk, hs, vn, o, t_len, h, hv, dv, tp, nt,
                                                                  BT=BT, BK=bk, BV=BV, KB=kb, DOT=dot,
                                                                  num_warps=warps)
        ht = hs[:, nt, :dk].reshape(b, hv, dk, dv).to(state_dtype, copy=True)
        ctx.save_for_backward(qs, ks, v, beta, gc, aa, aqk, mm, w, vn, hs)
        ctx.scale, ctx.has_h0, ctx.state_dtype, ctx.dims = scale, has_h0, state_dtype, (b, t_len, h, dk, q.dtype)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        qs, ks, v, beta, gc, aa, aqk, mm, w, vn, hs = ctx.saved_tensors
        do, dht = do.contiguous(), dht.contiguous()
        b, t_len, h, dk, qk_dtype = ctx.dims
        hv, dv_ = v.shape[2], v.shape[3]
        nt, tp, bk = hs.shape[1] - 1, gc.shape[1], gc.shape[2]
        settings = target_settings(v.device)
        dot, warps = settings["DOT"], settings["num_warps"]
        kb = min(settings["KB"], bk)
        nv = triton.cdiv(dv_, BV)
        f32 = dict(dtype=torch.float32, device=v.device)
        du = torch.empty(b * hv, tp, dv_, **f32)
        dhs = torch.empty(b * hv, nt + 1, bk, dv_, **f32)  # the gradient of the state before each chunk, then final
        dhs[:, nt] = 0.0
        dhs[:, nt, :dk] = dht.reshape(b * hv, dk, dv_)
        dqh = torch.empty(b * hv, tp, bk, **f32)
        dw = torch.empty(b * hv, tp, bk, **f32)
        dkb = torch.empty(b * hv, tp, bk, **f32)
        dgl = torch.empty(b * hv, nt, bk, **f32)
        daqk = torch.empty(b * hv, tp, BT, **f32)
        dkh = torch.empty(b * hv, tp, bk, **f32)
        dtm = torch.empty(b * hv, tp, BT, **f32)
        da = torch.empty(b * hv, tp, BT, **f32)
        dq_part = torch.empty(1, b, t_len, hv, dk, **f32)  # per value head, summed over GVA groups below
        dk_part = torch.empty(1, b, t_len, hv, dk, **f32)
        dv = torch.empty_like(v)
        dg = torch.empty(b, t_len, hv, dk, dtype=qk_dtype, device=v.device)
        dbeta = torch.empty_like(beta)
        if b * hv > 0:
            kda_chunk_dh_local_kernel[(nv, nt, b * hv)](qs, gc, do, dhs, t_len, h, hv, dv_, tp, nt, BT=BT, BK=bk, BV=BV,
                                                         KB=kb, DOT=dot, num_warps=warps)
            kda_chunk_state_bwd_kernel[(nv, b * hv)](
                ks, gc, w, aqk, do, du, dhs, t_len, h, hv, dv_, tp, nt, BT=BT, BK=bk, BV=BV, KB=kb, DOT=dot,
                num_warps=settings["state_bwd_warps"], num_stages=settings["state_stages"])
            kda_chunk_dqkw_kernel[(nt, b * hv, bk // kb + 1)](gc, vn, hs, dhs, do, du, dqh, dw, dkb, dgl, daqk, t_len,
                                                               hv, dv_, tp, nt, BT=BT, BK=bk, BV=BV, KB=kb, DOT=dot,
                                                               num_warps=warps)
            kda_chunk_wy_bwd_kernel[(nt, b * hv)](v, beta, ks, gc, mm, du, dw, dv, dkh, dtm, t_len, h, hv, dv_, tp, nv,
                                                  BT=BT, BK=bk, BV=BV, DOT=dot, num_warps=warps)
            kda_chunk_solve_bwd_kernel[(nt, b * hv)](beta, aa, mm, dtm, dbeta, da, t_len, hv, tp, BT=BT, DOT=dot,
                                                     num_warps=warps)
            kc = min(KC, bk)
            kda_chunk_intra_bwd_kernel[(nt, b * hv, bk // kc)](qs, ks, gc, dqh, dkb, dgl, daqk, dkh, da, dq_part,
                                                               dk_part, dg, ctx.scale, t_len, h, hv, dk, tp, nt,
                                                               BT=BT, BC=BC, BK=bk, KC=kc, DOT=dot, num_warps=warps)
        group = hv // h
        dq = _reduce(dq_part, torch.empty(b, t_len, h, dk, dtype=qk_dtype, device=v.device), b * t_len * h, group, dk)
        dk_ = _reduce(dk_part, torch.empty(b, t_len, h, dk, dtype=qk_dtype, device=v.device), b * t_len * h, group, dk)
        dh0 = dhs[:, 0, :dk].reshape(b, hv, dk, dv_).to(ctx.state_dtype, copy=True) if ctx.has_h0 else None
        return dq, dk_, dv, dg, dbeta, None, dh0


def run(q, k, v, g, beta, scale, initial_state):
    """q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (log decay <= 0); beta [B, T, HV]; initial_state
    [B, HV, K, V] float32 or None -> (o [B, T, HV, V] in v.dtype, final_state [B, HV, K, V] float32)."""
    return KDAChunkFunction.apply(q, k, v, g, beta, scale, initial_state)
