"""dsa_kpool_indexer candidate rendered from templates/dsa_kpool_indexer/pooled.py.j2.

pooled keys once into a float32 scratch, tiled pool scores (tl.dot per index head), a sort-free selection pass that expands the pools
params: BLOCK_T=32, BLOCK_S=16, SEL_ROWS=4, SEL_BLOCK=32, num_warps=4
launch on sm_100a: num_stages=3, pool_warps=8, sel_rows=1
launch on sm_80: num_stages=3, pool_warps=8, sel_rows=1
launch on sm_90a: num_stages=3, pool_warps=8, sel_rows=1
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_kpool_indexer"
TEMPLATE = "pooled"
BLOCK_T = 32
BLOCK_S = 16
SEL_BLOCK = 32
NUM_WARPS = 4
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'num_stages': 3, 'pool_warps': 8, 'sel_rows': 1}, 'sm_80': {'num_stages': 3, 'pool_warps': 8, 'sel_rows': 1}, 'sm_90a': {'num_stages': 3, 'pool_warps': 8, 'sel_rows': 1}}


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
# Per target: warps of the pooling, scores and selection launches, pipelining stages and rows per selection
# program (16 rows' [16, SEL_BLOCK, SEL_BLOCK] comparison tile of int64 keys spills on NVIDIA: 4 rows over 8 warps
# do not, the defaults); DOT: float32 pooled keys stay float32-accurate on the tensor cores through split operands (3xTF32 on
# NVIDIA, 6xBF16 on AMD); the interpreter multiplies in float32 itself.
LAUNCH_SETTINGS = {
    "default": {"pool_warps": 4, "fwd_warps": 4, "topk_warps": 8,
                "num_stages": None, "sel_rows": 4},
    "interpreter": {"DOT": "ieee"},
    "cuda": {"DOT": "tf32x3"},
    "hip": {"DOT": "bf16x6"},
}


@triton.jit
def _pool_tile(K, G, A, b, rp, T, DI, P, BLOCK_S: tl.constexpr, DI_PAD: tl.constexpr):
    """Pooled keys [BLOCK_S, DI_PAD] float32 of the pools rp of batch b: per channel, an online softmax of gate + ape
    over the pool's P keys weights the keys; zero for pools past the complete ones. K, G [B,T,DI], A [P,DI]."""
    rd = tl.arange(0, DI_PAD)
    mask = (rp[:, None] < T // P) & (rd[None, :] < DI)
    peak = tl.full([BLOCK_S, DI_PAD], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_S, DI_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_S, DI_PAD], dtype=tl.float32)
    for j in range(P):
        rows = (b * T + rp[:, None] * P + j) * DI + rd[None, :]
        logit = tl.load(G + rows, mask=mask, other=0.0).to(tl.float32) + \
            tl.load(A + j * DI + rd[None, :], mask=rd[None, :] < DI, other=0.0).to(tl.float32)
        key = tl.load(K + rows, mask=mask, other=0.0).to(tl.float32)
        top = tl.maximum(peak, logit)
        decay = tl.exp(peak - top)
        weight = tl.exp(logit - top)
        total = total * decay + weight
        acc = acc * decay + weight * key
        peak = top
    return tl.where(mask, acc / total, 0.0)


@triton.jit
def _pool_scores(Q, W, kp, b, rt, rp, T, HI, DI, P, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                 DI_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Scores [BLOCK_T, BLOCK_S] float32 of queries rt against pooled keys kp [BLOCK_S, DI_PAD] (pools rp):
    sum_h w[:, h] * relu(q_h kp^T), -inf where the pool's last key (p + 1) P - 1 is past the query."""
    rd = tl.arange(0, DI_PAD)
    acc = tl.zeros([BLOCK_T, BLOCK_S], dtype=tl.float32)
    qmask = (rt[:, None] < T) & (rd[None, :] < DI)
    for h in range(HI):
        q = tl.load(Q + ((b * T + rt[:, None]) * HI + h) * DI + rd[None, :], mask=qmask, other=0.0)
        wh = tl.load(W + (b * T + rt) * HI + h, mask=rt < T, other=0.0).to(tl.float32)
        d = tl.dot(q.to(tl.float32), tl.trans(kp), input_precision=DOT_PRECISION)
        acc += wh[:, None] * tl.maximum(d, 0.0)
    return tl.where((rp[None, :] + 1) * P - 1 <= rt[:, None], acc, float("-inf"))


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
def _select_expand_rows(S, POOLS, IDX, rows, t, T, P, NP, SK, WIDTH, TAIL, SEL_ROWS: tl.constexpr,
                        SEL_N: tl.constexpr):
    """The rows (flat b*T + t; t = -1 past the end) of POOLS [B,T,SK] (the top SK complete pools of the scores S
    [B,T,NP], best first, -1 padded: _select_rows on pools) and of IDX [B,T,WIDTH] (each pool's P keys, then the
    tail keys t + 1 - (t + 1) % P .. t where TAIL, then -1)."""
    last_pool = tl.where(t >= 0, (t + 1) // P - 1, -1)
    if SK > 0:
        _select_rows(S, POOLS, rows, last_pool, NP, SK, SEL_ROWS, SEL_N)
    n_keep = tl.minimum(last_pool + 1, SK)
    for c0 in range(0, SK, SEL_N):  # rows with no complete pool: _select_rows writes none of their slots
        slot = c0 + tl.arange(0, SEL_N)
        tl.store(POOLS + rows[:, None] * SK + slot[None, :], tl.full([SEL_ROWS, SEL_N], -1, tl.int64),
                 mask=(slot[None, :] >= n_keep[:, None]) & (slot[None, :] < SK) & (t[:, None] >= 0))
    tl.debug_barrier()  # the pools stored above are read back below by other threads of this program
    n = t + 1
    count = n % P
    for c0 in range(0, WIDTH, SEL_N):
        i = c0 + tl.arange(0, SEL_N)
        slot = i // P
        chosen = (i[None, :] < SK * P) & (slot[None, :] < n_keep[:, None])
        pool = tl.load(POOLS + rows[:, None] * SK + slot[None, :], mask=chosen, other=-1)
        key = tl.where(pool >= 0, pool * P + i[None, :] % P, -1)
        j = i[None, :] - SK * P
        in_tail = (TAIL != 0) & (j >= 0) & (j < P - 1) & (j < count[:, None])
        key = tl.where(in_tail, (n - count)[:, None] + j, key)
        tl.store(IDX + rows[:, None] * WIDTH + i[None, :], key.to(tl.int64),
                 mask=(t[:, None] >= 0) & (i[None, :] < WIDTH))


@triton.jit
def dsa_kpool_indexer_pool_kernel(K, G, A, KP, T, DI, P, NP, BLOCK_S: tl.constexpr, DI_PAD: tl.constexpr):
    """Pooled keys KP [B,NP,DI_PAD] float32 of BLOCK_S pools of batch b (_pool_tile)."""
    b = tl.program_id(0).to(tl.int64)
    rp = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    rd = tl.arange(0, DI_PAD)
    kp = _pool_tile(K, G, A, b, rp, T, DI, P, BLOCK_S, DI_PAD)
    tl.store(KP + (b * NP + rp[:, None]) * DI_PAD + rd[None, :], kp, mask=rp[:, None] < NP)


@triton.jit
def dsa_kpool_indexer_score_kernel(Q, KP, W, S, T, HI, DI, P, NP, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
                                   DI_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One [BLOCK_T queries x BLOCK_S pools] tile of the scores S [B,T,NP] float32 (_pool_scores); tiles wholly
    past the queries' complete pools store -inf without loading."""
    b = tl.program_id(0).to(tl.int64)
    rt = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    rp = tl.program_id(2) * BLOCK_S + tl.arange(0, BLOCK_S)
    rd = tl.arange(0, DI_PAD)
    out = tl.full([BLOCK_T, BLOCK_S], float("-inf"), tl.float32)
    if (tl.program_id(2) * BLOCK_S + 1) * P - 1 <= tl.program_id(1) * BLOCK_T + BLOCK_T - 1:
        kp = tl.load(KP + (b * NP + rp[:, None]) * DI_PAD + rd[None, :], mask=rp[:, None] < NP, other=0.0)
        out = _pool_scores(Q, W, kp, b, rt, rp, T, HI, DI, P, BLOCK_T, BLOCK_S, DI_PAD, DOT_PRECISION)
    tl.store(S + (b * T + rt[:, None]) * NP + rp[None, :], out, mask=(rt[:, None] < T) & (rp[None, :] < NP))


@triton.jit
def dsa_kpool_indexer_select_kernel(S, POOLS, IDX, n_rows, T, P, NP, SK, WIDTH, TAIL, SEL_ROWS: tl.constexpr,
                                    SEL_N: tl.constexpr):
    """The top pools and expanded keys of SEL_ROWS consecutive query rows (_select_expand_rows)."""
    rows = tl.program_id(0).to(tl.int64) * SEL_ROWS + tl.arange(0, SEL_ROWS)
    t = tl.where(rows < n_rows, rows % T, -1)
    _select_expand_rows(S, POOLS, IDX, rows, t, T, P, NP, SK, WIDTH, TAIL, SEL_ROWS, SEL_N)


def _launch_options(settings, warps):
    """num_warps, and num_stages where the target sets it (else Triton's default for the backend)."""
    options = {"num_warps": settings[warps]}
    if settings["num_stages"] is not None:
        options["num_stages"] = settings["num_stages"]
    return options


def _forward(q, k, w, gate, ape, scores, pools, indices, topk, tail, settings):
    """The three launches: pooled keys (a [B, NP, DI_PAD] float32 scratch), score tiles, selection."""
    B, T, HI, DI, P, NP, SK, width, di_pad = _sizes(q, ape, topk, tail)
    if NP > 0:
        pooled = torch.empty(B, NP, di_pad, dtype=torch.float32, device=q.device)
        dsa_kpool_indexer_pool_kernel[(B, triton.cdiv(NP, BLOCK_S))](
            k, gate, ape, pooled, T, DI, P, NP, BLOCK_S=BLOCK_S, DI_PAD=di_pad,
            **_launch_options(settings, "pool_warps"))
        dsa_kpool_indexer_score_kernel[(B, triton.cdiv(T, BLOCK_T), triton.cdiv(NP, BLOCK_S))](
            q, pooled, w, scores, T, HI, DI, P, NP, BLOCK_T=BLOCK_T, BLOCK_S=BLOCK_S, DI_PAD=di_pad,
            DOT_PRECISION=settings["DOT"], **_launch_options(settings, "fwd_warps"))
    sel_rows = settings["sel_rows"]
    dsa_kpool_indexer_select_kernel[(triton.cdiv(B * T, sel_rows),)](
        scores, pools, indices, B * T, T, P, NP, SK, width, tail, SEL_ROWS=sel_rows, SEL_N=SEL_BLOCK,
        **_launch_options(settings, "topk_warps"))


def _sizes(q_idx, ape, topk, tail):
    """(B, T, HI, DI, P, complete pools NP, selected pools SK, width of the indices, DI padded)."""
    B, T, HI, DI = q_idx.shape
    P = ape.shape[0]
    NP = T // P
    return B, T, HI, DI, P, NP, min(topk // P, NP), topk + (P - 1 if tail else 0), max(16, triton.next_power_of_2(DI))


def run(q_idx, k_idx, w, gate, ape, topk, tail):
    """q_idx [B,T,HI,DI], k_idx [B,T,DI], w [B,T,HI], gate [B,T,DI], ape [P,DI] (float32/float16/bfloat16), topk
    int, tail bool -> (scores [B,T,T // P] float32, -inf for pools not yet complete; pools [B,T,SK] int64, best
    first, -1 padded; indices [B,T,W] int64: the pools' keys, the tail, -1). Forward only."""
    q, k, wc, g, a = (x.contiguous() for x in (q_idx, k_idx, w, gate, ape))
    B, T, HI, DI, P, NP, SK, width, di_pad = _sizes(q, a, topk, tail)
    scores = torch.empty(B, T, NP, dtype=torch.float32, device=q.device)
    pools = torch.empty(B, T, SK, dtype=torch.int64, device=q.device)
    indices = torch.empty(B, T, width, dtype=torch.int64, device=q.device)
    if B * T * width > 0:
        _forward(q, k, wc, g, a, scores, pools, indices, topk, int(bool(tail)), target_settings(q.device))
    return scores, pools, indices
