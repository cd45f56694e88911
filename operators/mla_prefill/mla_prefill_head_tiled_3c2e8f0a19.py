"""mla_prefill candidate rendered from templates/mla_prefill/head_tiled.py.j2.

(packed token, head tile) programs, each the token's heads against its sequence's cached latents through the block table and its new ones up to itself, with tl.dot
params: BH=16, BN=16, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "mla_prefill"
TEMPLATE = "head_tiled"
BH = 16
BN = 16
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
# Warps per target, as mla_decode's head_tiled: R-wide tiles (BH x R accumulators, BN x R latents) over 8 NVIDIA
# warps; AMD's 64-lane wavefronts hold twice the lanes. `workbench targets` shows each launch's registers.
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def _attend(m_i, l_i, acc, ql, qr, c, kr, ok, scale):
    """One online-softmax step of BH heads over BN keys [c | kr] (values c), the keys where ``ok``; every step has at
    least one (the first cached or new key of its block), so the running maximum is finite after the first."""
    s = (tl.dot(ql, tl.trans(c), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee"))
    s = tl.where(ok[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), acc * alpha[:, None] + tl.dot(p.to(c.dtype), c,
                                                                                  input_precision="ieee")


@triton.jit
def mla_prefill_head_tiled_kernel(Q, CKV, KR, CACHE, TABLE, LENS, CU, O, scale, S, H, R, DR, PAGE, MAXP,
                                  R_PAD: tl.constexpr, DR_PAD: tl.constexpr, BS: tl.constexpr, BH: tl.constexpr,
                                  BN: tl.constexpr):
    """Program (packed token i, tile of BH heads): the heads' absorbed queries against the token's sequence, its
    cached latents BN a step through the block table, then its new ones up to the token (from the inputs: their rows
    are being written), an online softmax; the first head tile writes the token's latent into its row. Q [TOTAL, H,
    R + DR], CKV [TOTAL, R], KR [TOTAL, DR], CACHE [PAGES, PAGE, R + DR], TABLE [S, MAXP], LENS [S], CU [S + 1],
    O [TOTAL, H, R]; contiguous."""
    i = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = hs < H
    seqs = tl.arange(0, BS)
    ends = tl.load(CU + 1 + seqs, mask=seqs < S, other=2147483647).to(tl.int64)  # each sequence's last row + 1
    n = tl.sum((ends <= i).to(tl.int32), axis=0).to(tl.int64)
    start = tl.load(CU + n).to(tl.int64)
    t = i - start
    rr = tl.arange(0, R_PAD)
    rdr = tl.arange(0, DR_PAD)
    cache_ty = CACHE.dtype.element_ty
    length = tl.load(LENS + n).to(tl.int64)
    position = length + t
    c_new = tl.load(CKV + i * R + rr, mask=rr < R, other=0.0).to(cache_ty)
    kr_new = tl.load(KR + i * DR + rdr, mask=rdr < DR, other=0.0).to(cache_ty)
    q_row = (i * H + hs) * (R + DR)
    ql = tl.load(Q + q_row[:, None] + rr[None, :], mask=h_ok[:, None] & (rr[None, :] < R), other=0.0).to(cache_ty)
    qr = tl.load(Q + q_row[:, None] + R + rdr[None, :], mask=h_ok[:, None] & (rdr[None, :] < DR),
                 other=0.0).to(cache_ty)
    m_i = tl.full([BH], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BH], dtype=tl.float32)
    acc = tl.zeros([BH, R_PAD], dtype=tl.float32)
    for j0 in range(0, length, BN):
        pos = j0 + tl.arange(0, BN)
        ok = pos < length
        page = tl.load(TABLE + n * MAXP + pos // PAGE, mask=ok, other=0).to(tl.int64)
        row = (page * PAGE + pos % PAGE) * (R + DR)
        c = tl.load(CACHE + row[:, None] + rr[None, :], mask=ok[:, None] & (rr[None, :] < R), other=0.0)
        kr = tl.load(CACHE + row[:, None] + R + rdr[None, :], mask=ok[:, None] & (rdr[None, :] < DR), other=0.0)
        m_i, l_i, acc = _attend(m_i, l_i, acc, ql, qr, c, kr, ok, scale)
    for u0 in range(0, t + 1, BN):
        u = u0 + tl.arange(0, BN)
        ok = u <= t
        c = tl.load(CKV + (start + u)[:, None] * R + rr[None, :], mask=ok[:, None] & (rr[None, :] < R),
                    other=0.0).to(cache_ty)
        kr = tl.load(KR + (start + u)[:, None] * DR + rdr[None, :], mask=ok[:, None] & (rdr[None, :] < DR),
                     other=0.0).to(cache_ty)
        m_i, l_i, acc = _attend(m_i, l_i, acc, ql, qr, c, kr, ok, scale)
    tl.store(O + (i * H + hs)[:, None] * R + rr[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=h_ok[:, None] & (rr[None, :] < R))
    if tl.program_id(1) == 0:
        page_new = tl.load(TABLE + n * MAXP + position // PAGE).to(tl.int64)
        row_new = (page_new * PAGE + position % PAGE) * (R + DR)
        tl.store(CACHE + row_new + rr, c_new, mask=rr < R)
        tl.store(CACHE + row_new + R + rdr, kr_new, mask=rdr < DR)


def run(q, c_kv, k_rope, latent_cache, block_table, seq_lens, cu_seqlens, scale):
    """q [TOTAL, H, R + DR]; c_kv [TOTAL, R]; k_rope [TOTAL, DR] (float32/float16/bfloat16); latent_cache
    [PAGES, PAGE, R + DR] in q's dtype, contiguous, updated in place; block_table [S, MAXP] int32; seq_lens [S] int32
    (tokens cached before the step); cu_seqlens [S + 1] int32 -> (o [TOTAL, H, R] in q.dtype, latent_cache)."""
    if not latent_cache.is_contiguous():
        raise ValueError("mla_prefill: the latent cache is updated in place and must be contiguous")
    total, h, width = q.shape
    r, dr = c_kv.shape[-1], k_rope.shape[-1]
    if width != r + dr or latent_cache.shape[-1] != r + dr:
        raise ValueError(f"mla_prefill: q and the cache rows must be R + DR = {r + dr} wide")
    o = torch.empty(total, h, r, dtype=q.dtype, device=q.device)
    if total and h:
        s = cu_seqlens.shape[0] - 1
        warps = target_settings(q.device)["num_warps"]
        mla_prefill_head_tiled_kernel[(total, triton.cdiv(h, BH))](
            q.contiguous(), c_kv.contiguous(), k_rope.contiguous(), latent_cache, block_table.contiguous(),
            seq_lens.contiguous(), cu_seqlens.contiguous(), o, scale, s, h, r, dr, latent_cache.shape[1],
            block_table.shape[1], R_PAD=max(16, triton.next_power_of_2(r)), DR_PAD=max(16, triton.next_power_of_2(dr)),
            BS=triton.next_power_of_2(s), BH=BH, BN=BN,
            num_warps=warps)
    return o, latent_cache
