"""dsa_indexer_decode candidate rendered from templates/dsa_indexer_decode/paged.py.j2.

one program per sequence scores every index head against its keys, BN positions a step gathered through the block table with tl.dot, then selects the top-k of its stored row without a sort
params: BN=64, SEL_BLOCK=64, num_warps=4
launch on sm_80: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_indexer_decode"
TEMPLATE = "paged"
BN = 64
SEL_BLOCK = 64
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_80': {'num_warps': 8}}


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
# Per target: warps and the tl.dot operand precision (index keys on the FP8 grid are exact in any of them). At the
# model suite's 64 index heads of 128 channels a program holds the heads' queries, a key tile, their [64, BN] float32
# dots and the selection's [SEL_BLOCK, SEL_BLOCK] comparison tile, which spill over 4 warps on sm_80: NVIDIA targets
# take 8 warps. AMD's 64-lane wavefronts already hold twice the lanes. `workbench targets` shows registers and spills.
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
def _block_scores(q, wt, k_new, CACHE, TABLE, n, length, pos, rd, DI, PAGE, MAXP, DOT_PRECISION: tl.constexpr):
    """Scores [BN] float32 of sequence n's positions pos (-inf past L = length): the cached keys gathered through the
    block table, this step's key k_new at position L (its row is being written), against every index head at once
    (one key tile serves them all: MQA): sum_j wt[j] * relu(q[j] . key)."""
    ok = pos < length
    page = tl.load(TABLE + n * MAXP + pos // PAGE, mask=ok, other=0).to(tl.int64)
    row = (page * PAGE + pos % PAGE) * DI
    key = tl.load(CACHE + row[:, None] + rd[None, :], mask=ok[:, None] & (rd[None, :] < DI), other=0.0)
    key = tl.where((pos == length)[:, None], k_new[None, :], key)
    d = tl.dot(q, tl.trans(key), input_precision=DOT_PRECISION)  # [HI_PAD, BN]
    score = tl.sum(wt[:, None] * tl.maximum(d, 0.0), axis=0)
    return tl.where(pos <= length, score, float("-inf"))


@triton.jit
def dsa_indexer_decode_paged_kernel(Q, KI, W, CACHE, TABLE, LENS, S, IDX, HI, DI, PAGE, MAXP, TOPK,
                                    HI_PAD: tl.constexpr, DI_PAD: tl.constexpr, BN: tl.constexpr,
                                    SEL_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Program (sequence n): every index head against the sequence's keys, BN positions a step gathered through its
    block table (_block_scores), the scores stored (-inf past L), the block holding L writing this step's key into
    its row; then, after a barrier, the top-k of the stored row (_select_rows, one row). Q [N, HI, DI], KI [N, DI],
    W [N, HI], CACHE [PAGES, PAGE, DI], TABLE [N, MAXP], LENS [N]; S [N, MAXP * PAGE] float32, IDX [N, TOPK] int32;
    contiguous."""
    n = tl.program_id(0).to(tl.int64)
    rh = tl.arange(0, HI_PAD)
    rd = tl.arange(0, DI_PAD)
    cache_ty = CACHE.dtype.element_ty
    length = tl.load(LENS + n).to(tl.int64)
    k_new = tl.load(KI + n * DI + rd, mask=rd < DI, other=0.0).to(cache_ty)
    q = tl.load(Q + (n * HI + rh[:, None]) * DI + rd[None, :], mask=(rh[:, None] < HI) & (rd[None, :] < DI),
                other=0.0).to(cache_ty)
    wt = tl.load(W + n * HI + rh, mask=rh < HI, other=0.0).to(tl.float32)
    width = MAXP * PAGE
    for s0 in range(0, width, BN):
        pos = s0 + tl.arange(0, BN)
        score = tl.full([BN], float("-inf"), dtype=tl.float32)
        if s0 <= length:
            score = _block_scores(q, wt, k_new, CACHE, TABLE, n, length, pos, rd, DI, PAGE, MAXP, DOT_PRECISION)
            if length < s0 + BN:
                page_new = tl.load(TABLE + n * MAXP + length // PAGE).to(tl.int64)
                row_new = (page_new * PAGE + length % PAGE) * DI
                tl.store(CACHE + row_new + rd, k_new, mask=rd < DI)
        tl.store(S + n * width + pos, score, mask=pos < width)
    tl.debug_barrier()  # the scores stored above are read back below by other threads of this program
    _select_rows(S, IDX, n + tl.zeros([1], dtype=tl.int64), length + tl.zeros([1], dtype=tl.int64), width, TOPK, 1,
                 SEL_N)


def run(q_idx, k_idx, w, index_cache, block_table, seq_lens, topk):
    """q_idx [N, HI, DI]; k_idx [N, DI]; w [N, HI] (float32/float16/bfloat16); index_cache [PAGES, PAGE, DI] in
    q_idx's dtype, contiguous, updated in place; block_table [N, MAXP] int32; seq_lens [N] int32 (tokens cached
    before this step); topk int -> (scores [N, MAXP * PAGE] float32, -inf past each length; indices [N, topk] int32,
    best first, -1 padded; index_cache)."""
    if not index_cache.is_contiguous():
        raise ValueError("dsa_indexer_decode: the index cache is updated in place and must be contiguous")
    n, hi, di = q_idx.shape
    if k_idx.shape[-1] != di or index_cache.shape[-1] != di:
        raise ValueError(f"dsa_indexer_decode: k_idx and the cache rows must be DI = {di} wide")
    width = block_table.shape[1] * index_cache.shape[1]
    scores = torch.empty(n, width, dtype=torch.float32, device=q_idx.device)
    indices = torch.empty(n, topk, dtype=torch.int32, device=q_idx.device)
    if n:
        settings = target_settings(q_idx.device)
        inputs = (q_idx.contiguous(), k_idx.contiguous(), w.contiguous(), index_cache, block_table.contiguous(),
                  seq_lens.contiguous())
        pads = {"HI_PAD": max(16, triton.next_power_of_2(hi)), "DI_PAD": max(16, triton.next_power_of_2(di))}
        dsa_indexer_decode_paged_kernel[(n,)](*inputs, scores, indices, hi, di, index_cache.shape[1],
                                              block_table.shape[1], topk, BN=BN, SEL_N=SEL_BLOCK,
                                              DOT_PRECISION=settings["DOT"], num_warps=settings["num_warps"], **pads)
    return scores, indices, index_cache
