"""dsa_kpool_indexer_decode candidate rendered from templates/dsa_kpool_indexer_decode/paged.py.j2.

one program per sequence pools its complete pools, BLOCK_S a step gathered through the block table, scores them with tl.dot for every index head, then selects and expands the top pools from its stored row without a sort
params: BLOCK_S=16, SEL_BLOCK=64, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_kpool_indexer_decode"
TEMPLATE = "paged"
BLOCK_S = 16
SEL_BLOCK = 64
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
# Per target: warps and the tl.dot operand precision (float32 pooled keys stay float32-accurate on the tensor cores
# through split operands: 3xTF32 on NVIDIA, 6xBF16 on AMD; the interpreter multiplies in float32 itself).
# `workbench targets` shows registers and spills.
LAUNCH_SETTINGS = {
    "default": {"num_warps": 4},
    "interpreter": {"DOT": "ieee"},
    "cuda": {"DOT": "tf32x3"},
    "hip": {"DOT": "bf16x6"},
}


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
def _paged_pool_tile(CACHE, TABLE, A, k_new, g_new, n, length, rp, DI, P, PAGE, MAXP, BLOCK_S: tl.constexpr,
                     DI_PAD: tl.constexpr):
    """Pooled keys [BLOCK_S, DI_PAD] float32 of sequence n's pools rp (zero past its (L + 1) // P complete ones):
    each key and gate score gathered through the block table from its cache row [key | gate], this step's (k_new,
    g_new [DI_PAD]) at position L, whose row is being written."""
    rd = tl.arange(0, DI_PAD)
    complete = rp < (length + 1) // P
    mask = complete[:, None] & (rd[None, :] < DI)
    peak = tl.full([BLOCK_S, DI_PAD], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_S, DI_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_S, DI_PAD], dtype=tl.float32)
    for j in range(P):
        pos = rp * P + j
        page = tl.load(TABLE + n * MAXP + pos // PAGE, mask=complete, other=0).to(tl.int64)
        rows = (page * PAGE + pos % PAGE)[:, None] * (2 * DI) + rd[None, :]
        now = (pos == length)[:, None]
        logit = tl.where(now, g_new[None, :], tl.load(CACHE + rows + DI, mask=mask, other=0.0)).to(tl.float32) + \
            tl.load(A + j * DI + rd[None, :], mask=rd[None, :] < DI, other=0.0).to(tl.float32)
        key = tl.where(now, k_new[None, :], tl.load(CACHE + rows, mask=mask, other=0.0)).to(tl.float32)
        top = tl.maximum(peak, logit)
        decay = tl.exp(peak - top)
        weight = tl.exp(logit - top)
        total = total * decay + weight
        acc = acc * decay + weight * key
        peak = top
    return tl.where(mask, acc / total, 0.0)


@triton.jit
def _pool_block_scores(q, wt, k_new, g_new, CACHE, TABLE, A, n, length, rp, DI, P, PAGE, MAXP,
                       BLOCK_S: tl.constexpr, DI_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Scores [BLOCK_S] float32 of sequence n's pools rp (-inf past its complete ones): every index head against
    the pooled keys at once (one tile serves them all: MQA), sum_h wt[h] * relu(q[h] . K[p])."""
    kp = _paged_pool_tile(CACHE, TABLE, A, k_new, g_new, n, length, rp, DI, P, PAGE, MAXP, BLOCK_S, DI_PAD)
    d = tl.dot(q, tl.trans(kp), input_precision=DOT_PRECISION)  # [HI_PAD, BLOCK_S]
    return tl.where(rp < (length + 1) // P, tl.sum(wt[:, None] * tl.maximum(d, 0.0), axis=0), float("-inf"))


@triton.jit
def dsa_kpool_indexer_decode_paged_kernel(Q, KI, W, G, A, CACHE, TABLE, LENS, S, POOLS, IDX, HI, DI, P, PAGE, MAXP,
                                          NP, SK, WIDTH, TAIL, HI_PAD: tl.constexpr, DI_PAD: tl.constexpr,
                                          BLOCK_S: tl.constexpr, SEL_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Program (sequence n): this step's row [key | gate] written at L; every index head against the sequence's
    complete pools, BLOCK_S a step (_pool_block_scores), the scores stored (-inf past them); then, after a
    barrier, the top pools of the stored row and their keys with the tail (_select_expand_rows, one row).
    Q [N,HI,DI], KI, G [N,DI], W [N,HI], A [P,DI], CACHE [PAGES,PAGE,2 DI], TABLE [N,MAXP], LENS [N]; S [N,NP]
    float32, POOLS [N,SK], IDX [N,WIDTH] int32; contiguous."""
    n = tl.program_id(0).to(tl.int64)
    rh = tl.arange(0, HI_PAD)
    rd = tl.arange(0, DI_PAD)
    cache_ty = CACHE.dtype.element_ty
    length = tl.load(LENS + n).to(tl.int64)
    k_new = tl.load(KI + n * DI + rd, mask=rd < DI, other=0.0).to(cache_ty)
    g_new = tl.load(G + n * DI + rd, mask=rd < DI, other=0.0).to(cache_ty)
    q = tl.load(Q + (n * HI + rh[:, None]) * DI + rd[None, :], mask=(rh[:, None] < HI) & (rd[None, :] < DI),
                other=0.0).to(tl.float32)
    wt = tl.load(W + n * HI + rh, mask=rh < HI, other=0.0).to(tl.float32)
    page_new = tl.load(TABLE + n * MAXP + length // PAGE).to(tl.int64)
    row_new = (page_new * PAGE + length % PAGE) * (2 * DI)
    tl.store(CACHE + row_new + rd, k_new, mask=rd < DI)
    tl.store(CACHE + row_new + DI + rd, g_new, mask=rd < DI)
    for p0 in range(0, NP, BLOCK_S):
        rp = p0 + tl.arange(0, BLOCK_S)
        score = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
        if p0 < (length + 1) // P:
            score = _pool_block_scores(q, wt, k_new, g_new, CACHE, TABLE, A, n, length, rp, DI, P, PAGE, MAXP,
                                       BLOCK_S, DI_PAD, DOT_PRECISION)
        tl.store(S + n * NP + rp, score, mask=rp < NP)
    tl.debug_barrier()  # the scores stored above are read back below by other threads of this program
    _select_expand_rows(S, POOLS, IDX, n + tl.zeros([1], dtype=tl.int64), length + tl.zeros([1], dtype=tl.int64),
                        0, P, NP, SK, WIDTH, TAIL, 1, SEL_N)


def run(q_idx, k_idx, w, gate, ape, index_cache, block_table, seq_lens, topk, tail):
    """q_idx [N,HI,DI]; k_idx, gate [N,DI]; w [N,HI]; ape [P,DI] (float32/float16/bfloat16); index_cache
    [PAGES,PAGE,2 DI] in q_idx's dtype, contiguous, updated in place; block_table [N,MAXP] int32; seq_lens [N] int32
    (tokens cached before this step); topk int; tail bool -> (scores [N,(MAXP * PAGE) // P] float32, -inf past each
    sequence's complete pools; pools [N,topk // P] int32, best first, -1 padded; indices [N,W] int32, the pools' keys
    then the tail, -1 padded, W = topk (+ P - 1 with the tail); index_cache)."""
    if not index_cache.is_contiguous():
        raise ValueError("dsa_kpool_indexer_decode: the index cache is updated in place and must be contiguous")
    n, hi, di = q_idx.shape
    if index_cache.shape[-1] != 2 * di or k_idx.shape[-1] != di or gate.shape[-1] != di or ape.shape[-1] != di:
        raise ValueError(f"dsa_kpool_indexer_decode: k_idx, gate and ape must be DI = {di} wide and the cache rows "
                         f"2 DI = {2 * di} ([key | gate])")
    pool = ape.shape[0]
    n_pools, selected = block_table.shape[1] * index_cache.shape[1] // pool, topk // pool
    width = topk + (pool - 1 if tail else 0)
    scores = torch.empty(n, n_pools, dtype=torch.float32, device=q_idx.device)
    pools = torch.empty(n, selected, dtype=torch.int32, device=q_idx.device)
    indices = torch.empty(n, width, dtype=torch.int32, device=q_idx.device)
    if n:
        settings = target_settings(q_idx.device)
        inputs = (q_idx.contiguous(), k_idx.contiguous(), w.contiguous(), gate.contiguous(), ape.contiguous(),
                  index_cache, block_table.contiguous(), seq_lens.contiguous())
        sizes = (hi, di, pool, index_cache.shape[1], block_table.shape[1], n_pools)
        pads = {"HI_PAD": max(16, triton.next_power_of_2(hi)), "DI_PAD": max(16, triton.next_power_of_2(di))}
        dsa_kpool_indexer_decode_paged_kernel[(n,)](
            *inputs, scores, pools, indices, *sizes, selected, width, int(bool(tail)), BLOCK_S=BLOCK_S,
            SEL_N=SEL_BLOCK, DOT_PRECISION=settings["DOT"], num_warps=settings["num_warps"], **pads)
    return scores, pools, indices, index_cache
