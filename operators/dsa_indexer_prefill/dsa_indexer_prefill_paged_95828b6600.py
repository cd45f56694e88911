"""dsa_indexer_prefill candidate rendered from templates/dsa_indexer_prefill/paged.py.j2.

one program per packed token scores every index head against its sequence's keys BN positions a step with tl.dot, then selects the top-k of its stored row
params: BN=64, SEL_BLOCK=64, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_indexer_prefill"
TEMPLATE = "paged"
BN = 64
SEL_BLOCK = 64
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'num_warps': 8}, 'sm_80': {'num_warps': 8}}


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
# Per target: warps and the tl.dot operand precision (index keys on the FP8 grid are exact in any of them); NVIDIA
# targets take 8 warps, as dsa_indexer_decode's paged (64 heads of 128 channels and a [64, BN] tile of dots).
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
def _token_scores(q, wt, CACHE, KI, TABLE, n, start, length, position, pos, rd, DI, PAGE, MAXP,
                  DOT_PRECISION: tl.constexpr):
    """Scores [BN] float32 of a token's positions pos (-inf past its own, ``position``): the cached keys (pos < L)
    gathered through the block table, the new ones (L <= pos) from the inputs, against every index head at once
    (one key tile serves them all: MQA): sum_j wt[j] * relu(q[j] . key)."""
    cached = pos < length
    fresh = (pos >= length) & (pos <= position)
    page = tl.load(TABLE + n * MAXP + pos // PAGE, mask=cached, other=0).to(tl.int64)
    row = (page * PAGE + pos % PAGE) * DI
    key = tl.where(cached[:, None],
                   tl.load(CACHE + row[:, None] + rd[None, :], mask=cached[:, None] & (rd[None, :] < DI), other=0.0),
                   tl.load(KI + (start + pos - length)[:, None] * DI + rd[None, :],
                           mask=fresh[:, None] & (rd[None, :] < DI), other=0.0).to(q.dtype))
    d = tl.dot(q, tl.trans(key), input_precision=DOT_PRECISION)  # [HI_PAD, BN]
    score = tl.sum(wt[:, None] * tl.maximum(d, 0.0), axis=0)
    return tl.where(pos <= position, score, float("-inf"))


@triton.jit
def dsa_indexer_prefill_paged_kernel(Q, KI, W, CACHE, TABLE, LENS, CU, SC, IDX, S, HI, DI, PAGE, MAXP, TOPK,
                                     HI_PAD: tl.constexpr, DI_PAD: tl.constexpr, BS: tl.constexpr, BN: tl.constexpr,
                                     SEL_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Program (packed token i): every index head against the token's sequence, BN positions a step
    (_token_scores), the scores stored (-inf past the token); the token's key written into its row; then, after a
    barrier, the top-k of the stored row (_select_rows, one row). Q [TOTAL, HI, DI], KI [TOTAL, DI], W [TOTAL, HI],
    CACHE [PAGES, PAGE, DI], TABLE [S, MAXP], LENS [S], CU [S + 1]; SC [TOTAL, MAXP * PAGE] float32, IDX [TOTAL,
    TOPK] int32; contiguous."""
    i = tl.program_id(0).to(tl.int64)
    rh = tl.arange(0, HI_PAD)
    rd = tl.arange(0, DI_PAD)
    seqs = tl.arange(0, BS)
    ends = tl.load(CU + 1 + seqs, mask=seqs < S, other=2147483647).to(tl.int64)  # each sequence's last row + 1
    n = tl.sum((ends <= i).to(tl.int32), axis=0).to(tl.int64)
    start = tl.load(CU + n).to(tl.int64)
    cache_ty = CACHE.dtype.element_ty
    length = tl.load(LENS + n).to(tl.int64)
    position = length + i - start
    k_new = tl.load(KI + i * DI + rd, mask=rd < DI, other=0.0).to(cache_ty)
    q = tl.load(Q + (i * HI + rh[:, None]) * DI + rd[None, :], mask=(rh[:, None] < HI) & (rd[None, :] < DI),
                other=0.0).to(cache_ty)
    wt = tl.load(W + i * HI + rh, mask=rh < HI, other=0.0).to(tl.float32)
    width = MAXP * PAGE
    for s0 in range(0, width, BN):
        pos = s0 + tl.arange(0, BN)
        score = tl.full([BN], float("-inf"), dtype=tl.float32)
        if s0 <= position:
            score = _token_scores(q, wt, CACHE, KI, TABLE, n, start, length, position, pos, rd, DI, PAGE, MAXP,
                                  DOT_PRECISION)
        tl.store(SC + i * width + pos, score, mask=pos < width)
    if position >= length:
        page_new = tl.load(TABLE + n * MAXP + position // PAGE).to(tl.int64)
        row_new = (page_new * PAGE + position % PAGE) * DI
        tl.store(CACHE + row_new + rd, k_new, mask=rd < DI)
    tl.debug_barrier()  # the scores stored above are read back below by other threads of this program
    _select_rows(SC, IDX, i + tl.zeros([1], dtype=tl.int64), position + tl.zeros([1], dtype=tl.int64), width, TOPK,
                 1, SEL_N)


def run(q_idx, k_idx, w, index_cache, block_table, seq_lens, cu_seqlens, topk):
    """q_idx [TOTAL, HI, DI]; k_idx [TOTAL, DI]; w [TOTAL, HI] (float32/float16/bfloat16); index_cache [PAGES, PAGE,
    DI] in q_idx's dtype, contiguous, updated in place; block_table [S, MAXP] int32; seq_lens [S] int32; cu_seqlens
    [S + 1] int32; topk int -> (scores [TOTAL, MAXP * PAGE] float32, -inf past each token; indices [TOTAL, topk]
    int32, best first, -1 padded; index_cache)."""
    if not index_cache.is_contiguous():
        raise ValueError("dsa_indexer_prefill: the index cache is updated in place and must be contiguous")
    total, hi, di = q_idx.shape
    if k_idx.shape[-1] != di or index_cache.shape[-1] != di:
        raise ValueError(f"dsa_indexer_prefill: k_idx and the cache rows must be DI = {di} wide")
    width = block_table.shape[1] * index_cache.shape[1]
    scores = torch.empty(total, width, dtype=torch.float32, device=q_idx.device)
    indices = torch.empty(total, topk, dtype=torch.int32, device=q_idx.device)
    if total:
        s = cu_seqlens.shape[0] - 1
        settings = target_settings(q_idx.device)
        inputs = (q_idx.contiguous(), k_idx.contiguous(), w.contiguous(), index_cache, block_table.contiguous(),
                  seq_lens.contiguous(), cu_seqlens.contiguous())
        pads = {"HI_PAD": max(16, triton.next_power_of_2(hi)), "DI_PAD": max(16, triton.next_power_of_2(di)),
                "BS": triton.next_power_of_2(s)}
        dsa_indexer_prefill_paged_kernel[(total,)](*inputs, scores, indices, s, hi, di, index_cache.shape[1],
                                                   block_table.shape[1], topk, BN=BN, SEL_N=SEL_BLOCK,
                                                   DOT_PRECISION=settings["DOT"], num_warps=settings["num_warps"],
                                                   **pads)
    return scores, indices, index_cache
