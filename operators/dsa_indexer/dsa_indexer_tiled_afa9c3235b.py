"""dsa_indexer candidate rendered from templates/dsa_indexer/tiled.py.j2.

tiled scores (tl.dot per index head), a separate sort-free top-k pass, deterministic two-pass backward
params: BLOCK_T=64, BLOCK_S=64, SEL_ROWS=16, SEL_BLOCK=32, num_warps=4
launch on sm_100a: bwd_block_s=16, bwd_block_t=16, fwd_warps=8, num_stages=2, sel_rows=1
launch on sm_80: bwd_block_s=16, bwd_block_t=16, fwd_warps=8, num_stages=2, sel_rows=1
launch on sm_90a: bwd_block_s=16, bwd_block_t=16, fwd_warps=8, num_stages=2, sel_rows=1
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_indexer"
TEMPLATE = "tiled"
BLOCK_T = 64
BLOCK_S = 64
SEL_BLOCK = 32
SEL_ROWS = 16
NUM_WARPS = 4
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'bwd_block_s': 16, 'bwd_block_t': 16, 'fwd_warps': 8, 'num_stages': 2, 'sel_rows': 1}, 'sm_80': {'bwd_block_s': 16, 'bwd_block_t': 16, 'fwd_warps': 8, 'num_stages': 2, 'sel_rows': 1}, 'sm_90a': {'bwd_block_s': 16, 'bwd_block_t': 16, 'fwd_warps': 8, 'num_stages': 2, 'sel_rows': 1}}


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
# Per target: warps of the scores, top-k and backward launches, pipelining stages, rows per top-k program, the
# backward's tiles and the tl.dot operand precision. On NVIDIA the model suite's score tiles, top-k rows and dq / dk
# tiles exceed a thread's registers over 4 warps: 8 warps, no pipelining, 32 x 32 backward tiles and 4 top-k rows per
# program keep them in registers. `workbench targets` shows each launch's registers and spills per target.
# DOT: float32 inputs stay float32-accurate on the tensor cores through split operands (3xTF32 on NVIDIA, 6xBF16 on
# AMD, whose gfx950 compiler accepts no "tf32"); half inputs are exact products either way; the interpreter multiplies
# in float32 itself.
LAUNCH_SETTINGS = {
    "default": {"fwd_warps": 4, "topk_warps": 4, "bwd_warps": 4,
                "num_stages": None, "sel_rows": 16, "bwd_block_t": 64, "bwd_block_s": 64},
    "interpreter": {"DOT": "ieee"},
    "cuda": {"DOT": "tf32x3"},
    "hip": {"DOT": "bf16x6"},
}
SCORE_DTYPES = {torch.float64: torch.float64}  # float32 scores for every other input dtype


@triton.jit
def indexer_fwd_kernel(Q, K, W, S, T, HI, DI, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                       DI_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One [BLOCK_T queries x BLOCK_S keys] tile of batch b: S = sum_j w[:, j] * relu(q_j k^T), -inf above the
    diagonal. Q [B,T,HI,DI], K [B,T,DI], W [B,T,HI] in the input dtype; S [B,T,T] float32."""
    b = tl.program_id(0).to(tl.int64)
    t0 = tl.program_id(1) * BLOCK_T
    s0 = tl.program_id(2) * BLOCK_S
    rt = t0 + tl.arange(0, BLOCK_T)
    rs = s0 + tl.arange(0, BLOCK_S)
    rd = tl.arange(0, DI_PAD)
    acc = tl.zeros([BLOCK_T, BLOCK_S], dtype=tl.float32)
    if s0 < t0 + BLOCK_T:  # the tile reaches the causal part
        k = tl.load(K + (b * T + rs[:, None]) * DI + rd[None, :], mask=(rs[:, None] < T) & (rd[None, :] < DI),
                    other=0.0)
        for j in range(HI):
            q = tl.load(Q + ((b * T + rt[:, None]) * HI + j) * DI + rd[None, :],
                        mask=(rt[:, None] < T) & (rd[None, :] < DI), other=0.0)
            wj = tl.load(W + (b * T + rt) * HI + j, mask=rt < T, other=0.0).to(tl.float32)
            d = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            acc += wj[:, None] * tl.maximum(d, 0.0)
    out = tl.where(rs[None, :] <= rt[:, None], acc, float("-inf"))
    tl.store(S + (b * T + rt[:, None]) * T + rs[None, :], out.to(S.dtype.element_ty),
             mask=(rt[:, None] < T) & (rs[None, :] < T))


@triton.jit
def _pack_keys(score, pos, valid):
    """int64 keys ordered like (score, -pos), all distinct: the high half holds the float32 score's bits made
    monotone (-0 read as +0), the low half 2^31 - 1 - pos so that equal scores favour the smaller position;
    invalid slots get int64 min."""
    score = tl.where(score == 0.0, 0.0, score)
    bits = score.to(tl.int32, bitcast=True)
    mono = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = (mono.to(tl.int64) << 32) | (0x7FFFFFFF - pos).to(tl.int64)
    return tl.where(valid, key, -9223372036854775807 - 1)


@triton.jit
def _row_keys(S, rows, t, s0, T, BLOCK_R: tl.constexpr, SEL_N: tl.constexpr):
    """Packed keys of one [BLOCK_R rows x SEL_N keys] chunk of the scores; keys past the diagonal are invalid."""
    rs = s0 + tl.arange(0, SEL_N)
    valid = (rs[None, :] <= t[:, None]) & (rs[None, :] < T)
    score = tl.load(S + rows[:, None] * T + rs[None, :], mask=valid, other=0.0).to(tl.float32)
    return _pack_keys(score, rs[None, :], valid)


@triton.jit
def _select_rows(S, IDX, rows, t, T, TOPK, BLOCK_R: tl.constexpr, SEL_N: tl.constexpr):
    """Top-k of BLOCK_R query rows (rows: flat b*T + t; t = -1 for rows past the end) without a sort: the output
    slot of a causal key is the number of causal keys of its row with a larger packed key (all distinct), counted
    over [BLOCK_R, SEL_N, SEL_N] blocks of key pairs, O(t^2) comparisons for row t; a key whose slot is below TOPK
    is written there, and the slots past the row's causal keys get -1."""
    last = tl.max(t, axis=0)
    for a0 in range(0, last + 1, SEL_N):
        ra = a0 + tl.arange(0, SEL_N)
        key = _row_keys(S, rows, t, a0, T, BLOCK_R, SEL_N)
        rank = tl.zeros([BLOCK_R, SEL_N], dtype=tl.int32)
        for b0 in range(0, last + 1, SEL_N):
            other = _row_keys(S, rows, t, b0, T, BLOCK_R, SEL_N)
            rank += tl.sum((other[:, None, :] > key[:, :, None]).to(tl.int32), axis=2)
        chosen = (ra[None, :] <= t[:, None]) & (rank < TOPK)
        tl.store(IDX + rows[:, None] * TOPK + rank, tl.broadcast_to(ra[None, :], [BLOCK_R, SEL_N]).to(tl.int64),
                 mask=chosen)
    n_keep = tl.minimum(t + 1, TOPK)
    for p0 in range(0, TOPK, SEL_N):
        slot = p0 + tl.arange(0, SEL_N)
        pad = (slot[None, :] >= n_keep[:, None]) & (slot[None, :] < TOPK) & (t[:, None] >= 0)
        tl.store(IDX + rows[:, None] * TOPK + slot[None, :], tl.full([BLOCK_R, SEL_N], -1, tl.int64), mask=pad)


@triton.jit
def indexer_topk_kernel(S, IDX, n_rows, T, TOPK, BLOCK_R: tl.constexpr, SEL_N: tl.constexpr):
    """Top-k of BLOCK_R consecutive query rows of the float32 scores S [B,T,T] (B*T rows) into IDX [B,T,TOPK]
    int64, best first, -1 padded (see _select_rows)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = tl.where(rows < n_rows, rows % T, -1)  # a row past the end has no valid key
    _select_rows(S, IDX, rows, t, T, TOPK, BLOCK_R, SEL_N)


@triton.jit
def indexer_bwd_dq_kernel(Q, K, W, DS, DQ, DW, T, HI, DI, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                          DI_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dq and dw of one query tile, head by head over the causal key tiles (relu mask recomputed):
    g = dS * w_j * [q_j.k > 0];  dq_j = g k;  dw_j = sum_s dS * relu(q_j.k). DS [B,T,T] float32."""
    b = tl.program_id(0).to(tl.int64)
    t0 = tl.program_id(1) * BLOCK_T
    rt = t0 + tl.arange(0, BLOCK_T)
    rd = tl.arange(0, DI_PAD)
    row_ok = rt < T
    qmask = row_ok[:, None] & (rd[None, :] < DI)
    for j in range(HI):
        q = tl.load(Q + ((b * T + rt[:, None]) * HI + j) * DI + rd[None, :], mask=qmask, other=0.0)
        wj = tl.load(W + (b * T + rt) * HI + j, mask=row_ok, other=0.0).to(tl.float32)
        dq = tl.zeros([BLOCK_T, DI_PAD], dtype=tl.float32)
        dw = tl.zeros([BLOCK_T], dtype=tl.float32)
        for s0 in range(0, tl.minimum(t0 + BLOCK_T, T), BLOCK_S):
            rs = s0 + tl.arange(0, BLOCK_S)
            k = tl.load(K + (b * T + rs[:, None]) * DI + rd[None, :], mask=(rs[:, None] < T) & (rd[None, :] < DI),
                        other=0.0)
            causal = (rs[None, :] <= rt[:, None]) & row_ok[:, None]
            ds = tl.load(DS + (b * T + rt[:, None]) * T + rs[None, :], mask=causal, other=0.0)
            d = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            dw += tl.sum(ds * tl.maximum(d, 0.0), axis=1)
            g = tl.where(d > 0.0, ds * wj[:, None], 0.0)
            dq += tl.dot(g.to(k.dtype), k, input_precision=DOT_PRECISION)
        tl.store(DQ + ((b * T + rt[:, None]) * HI + j) * DI + rd[None, :], dq.to(DQ.dtype.element_ty), mask=qmask)
        tl.store(DW + (b * T + rt) * HI + j, dw.to(DW.dtype.element_ty), mask=row_ok)


@triton.jit
def indexer_bwd_dk_kernel(Q, K, W, DS, DK, T, HI, DI, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                          DI_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dk of one key tile: sum over the query tiles at or below it and over heads of g^T q_j, g = dS * w_j *
    [q_j.k > 0]. Each key tile is owned by one program: deterministic, no atomics."""
    b = tl.program_id(0).to(tl.int64)
    s0 = tl.program_id(1) * BLOCK_S
    rs = s0 + tl.arange(0, BLOCK_S)
    rd = tl.arange(0, DI_PAD)
    kmask = (rs[:, None] < T) & (rd[None, :] < DI)
    k = tl.load(K + (b * T + rs[:, None]) * DI + rd[None, :], mask=kmask, other=0.0)
    dk = tl.zeros([BLOCK_S, DI_PAD], dtype=tl.float32)
    for t0 in range((s0 // BLOCK_T) * BLOCK_T, T, BLOCK_T):
        rt = t0 + tl.arange(0, BLOCK_T)
        row_ok = rt < T
        causal = (rs[None, :] <= rt[:, None]) & row_ok[:, None] & (rs[None, :] < T)
        ds = tl.load(DS + (b * T + rt[:, None]) * T + rs[None, :], mask=causal, other=0.0)
        for j in range(HI):
            q = tl.load(Q + ((b * T + rt[:, None]) * HI + j) * DI + rd[None, :],
                        mask=row_ok[:, None] & (rd[None, :] < DI), other=0.0)
            wj = tl.load(W + (b * T + rt) * HI + j, mask=row_ok, other=0.0).to(tl.float32)
            d = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            g = tl.where(d > 0.0, ds * wj[:, None], 0.0)
            dk += tl.dot(tl.trans(g.to(q.dtype)), q, input_precision=DOT_PRECISION)
    tl.store(DK + (b * T + rs[:, None]) * DI + rd[None, :], dk.to(DK.dtype.element_ty), mask=kmask)


def _dims(q_idx):
    B, T, HI, DI = q_idx.shape
    di_pad = max(16, triton.next_power_of_2(DI))
    return B, T, HI, DI, di_pad, target_settings(q_idx.device)


def _launch_options(settings, warps):
    """num_warps, and num_stages where the target sets it (else Triton's default for the backend)."""
    options = {"num_warps": settings[warps]}
    if settings["num_stages"] is not None:
        options["num_stages"] = settings["num_stages"]
    return options


class IndexerFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_idx, k_idx, w, topk):
        q, k, wc = q_idx.contiguous(), k_idx.contiguous(), w.contiguous()
        B, T, HI, DI, di_pad, settings = _dims(q)
        sel_rows = settings["sel_rows"]
        scores = torch.empty(B, T, T, dtype=SCORE_DTYPES.get(q.dtype, torch.float32), device=q.device)
        indices = torch.empty(B, T, topk, dtype=torch.int64, device=q.device)
        if B * T > 0:
            grid = (B, triton.cdiv(T, BLOCK_T), triton.cdiv(T, BLOCK_S))
            indexer_fwd_kernel[grid](q, k, wc, scores, T, HI, DI, BLOCK_T=BLOCK_T, BLOCK_S=BLOCK_S, DI_PAD=di_pad,
                                     DOT_PRECISION=settings["DOT"], **_launch_options(settings, "fwd_warps"))
            if topk > 0:
                indexer_topk_kernel[(triton.cdiv(B * T, sel_rows),)](scores, indices, B * T, T, topk,
                                                                     BLOCK_R=sel_rows, SEL_N=SEL_BLOCK,
                                                                     **_launch_options(settings, "topk_warps"))
        ctx.save_for_backward(q, k, wc)
        ctx.mark_non_differentiable(indices)
        return scores, indices

    @staticmethod
    def backward(ctx, dscores, dindices):
        q, k, wc = ctx.saved_tensors
        B, T, HI, DI, di_pad, settings = _dims(q)
        ds = dscores.contiguous()
        dq, dk, dw = torch.empty_like(q), torch.empty_like(k), torch.empty_like(wc)
        if B * T > 0:
            block_t, block_s = settings["bwd_block_t"], settings["bwd_block_s"]
            indexer_bwd_dq_kernel[(B, triton.cdiv(T, block_t))](
                q, k, wc, ds, dq, dw, T, HI, DI, BLOCK_T=block_t, BLOCK_S=block_s, DI_PAD=di_pad,
                DOT_PRECISION=settings["DOT"], **_launch_options(settings, "bwd_warps"))
            indexer_bwd_dk_kernel[(B, triton.cdiv(T, block_s))](
                q, k, wc, ds, dk, T, HI, DI, BLOCK_T=block_t, BLOCK_S=block_s, DI_PAD=di_pad,
                DOT_PRECISION=settings["DOT"], **_launch_options(settings, "bwd_warps"))
        return dq, dk, dw, None


def run(q_idx, k_idx, w, topk):
    """q_idx [B,T,HI,DI], k_idx [B,T,DI], w [B,T,HI] (float32/float16/bfloat16), topk int ->
    (scores [B,T,T] float32, -inf where s > t; indices [B,T,topk] int64, best first, -1 padded)."""
    return IndexerFunction.apply(q_idx, k_idx, w, topk)
