"""dsa_prefill candidate rendered from templates/dsa_prefill/head_tiled.py.j2.

(packed token, head tile) programs, each the token's heads against the latents it selected, cached or new, with tl.dot
params: BH=16, BN=16, num_warps=4
launch on gfx950: num_warps=8
launch on sm_100a: num_warps=8
launch on sm_80: num_stages=1, num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_prefill"
TEMPLATE = "head_tiled"
BH = 16
BN = 16
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'gfx950': {'num_warps': 8}, 'sm_100a': {'num_warps': 8}, 'sm_80': {'num_stages': 1, 'num_warps': 8}, 'sm_90a': {'num_warps': 8}}


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
# Warps per target, as mla_decode's head_tiled: R-wide tiles over 8 NVIDIA warps; AMD's 64-lane wavefronts hold
# twice the lanes. `workbench targets` shows each launch's registers.
LAUNCH_SETTINGS = {"default": {"num_warps": 4, "num_stages": None}}


@triton.jit
def dsa_prefill_head_tiled_kernel(Q, CKV, KR, CACHE, TABLE, LENS, CU, IDX, O, scale, S, H, R, DR, PAGE, MAXP, TOPK,
                                  R_PAD: tl.constexpr, DR_PAD: tl.constexpr, BS: tl.constexpr, BH: tl.constexpr,
                                  BN: tl.constexpr):
    """Program (packed token i, tile of BH heads): the heads' absorbed queries against the token's selected latents,
    BN entries of its selection a step (cached ones through the block table, new ones from the inputs; one key tile
    serves every head: MQA), an online softmax that starts empty; the first head tile writes the token's latent into
    its row. Q [TOTAL, H, R + DR], CKV [TOTAL, R], KR [TOTAL, DR], CACHE [PAGES, PAGE, R + DR], TABLE [S, MAXP],
    LENS [S], CU [S + 1], IDX [TOTAL, TOPK], O [TOTAL, H, R]; contiguous."""
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
    for e0 in range(0, TOPK, BN):
        e = e0 + tl.arange(0, BN)
        pos = tl.load(IDX + i * TOPK + e, mask=e < TOPK, other=-1).to(tl.int64)
        ok = (pos >= 0) & (pos <= position)
        cached = ok & (pos < length)
        fresh = ok & (pos >= length)
        page = tl.load(TABLE + n * MAXP + pos // PAGE, mask=cached, other=0).to(tl.int64)
        row = (page * PAGE + pos % PAGE) * (R + DR)
        inp = start + pos - length  # a new key's packed row
        c = tl.where(cached[:, None],
                     tl.load(CACHE + row[:, None] + rr[None, :], mask=cached[:, None] & (rr[None, :] < R), other=0.0),
                     tl.load(CKV + inp[:, None] * R + rr[None, :], mask=fresh[:, None] & (rr[None, :] < R),
                             other=0.0).to(cache_ty))
        kr = tl.where(cached[:, None],
                      tl.load(CACHE + row[:, None] + R + rdr[None, :], mask=cached[:, None] & (rdr[None, :] < DR),
                              other=0.0),
                      tl.load(KR + inp[:, None] * DR + rdr[None, :], mask=fresh[:, None] & (rdr[None, :] < DR),
                              other=0.0).to(cache_ty))
        s = (tl.dot(ql, tl.trans(c), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee"))
        s = tl.where(ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing selected yet: every term stays 0
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision="ieee")
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty selection: 0
    tl.store(O + (i * H + hs)[:, None] * R + rr[None, :], out.to(O.dtype.element_ty),
             mask=h_ok[:, None] & (rr[None, :] < R))
    if tl.program_id(1) == 0:
        page_new = tl.load(TABLE + n * MAXP + position // PAGE).to(tl.int64)
        row_new = (page_new * PAGE + position % PAGE) * (R + DR)
        tl.store(CACHE + row_new + rr, c_new, mask=rr < R)
        tl.store(CACHE + row_new + R + rdr, kr_new, mask=rdr < DR)


def _launch_options(settings, warps):
    """num_warps, and num_stages where the target sets it (else Triton's default for the backend)."""
    options = {"num_warps": settings[warps]}
    if settings["num_stages"] is not None:
        options["num_stages"] = settings["num_stages"]
    return options


def run(q, c_kv, k_rope, latent_cache, block_table, seq_lens, cu_seqlens, indices, scale):
    """q [TOTAL, H, R + DR]; c_kv [TOTAL, R]; k_rope [TOTAL, DR] (float32/float16/bfloat16); latent_cache
    [PAGES, PAGE, R + DR] in q's dtype, contiguous, updated in place; block_table [S, MAXP] int32; seq_lens [S] int32
    (tokens cached before the step); cu_seqlens [S + 1] int32; indices [TOTAL, TOPK] int32 (positions of each
    token's sequence, -1 padding) -> (o [TOTAL, H, R] in q.dtype, latent_cache)."""
    if not latent_cache.is_contiguous():
        raise ValueError("dsa_prefill: the latent cache is updated in place and must be contiguous")
    total, h, width = q.shape
    r, dr = c_kv.shape[-1], k_rope.shape[-1]
    if width != r + dr or latent_cache.shape[-1] != r + dr:
        raise ValueError(f"dsa_prefill: q and the cache rows must be R + DR = {r + dr} wide")
    o = torch.empty(total, h, r, dtype=q.dtype, device=q.device)
    if total and h:
        s = cu_seqlens.shape[0] - 1
        settings = target_settings(q.device)
        dsa_prefill_head_tiled_kernel[(total, triton.cdiv(h, BH))](
            q.contiguous(), c_kv.contiguous(), k_rope.contiguous(), latent_cache, block_table.contiguous(),
            seq_lens.contiguous(), cu_seqlens.contiguous(), indices.contiguous(), o, scale, s, h, r, dr,
            latent_cache.shape[1], block_table.shape[1], indices.shape[1], R_PAD=max(16, triton.next_power_of_2(r)),
            DR_PAD=max(16, triton.next_power_of_2(dr)), BS=triton.next_power_of_2(s), BH=BH, BN=BN,
            **_launch_options(settings, "num_warps"))
    return o, latent_cache
