"""mla_decode candidate rendered from templates/mla_decode/head_tiled.py.j2.

a 2-D grid of (sequence, head tile) programs; each gathers BN cached latents a step through the block table and scores them against its BH heads with tl.dot (MQA, FlashMLA's tiling)
params: BH=16, BN=16, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "mla_decode"
TEMPLATE = "head_tiled"
BH = 16
BN = 16
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
# Warps per target: a program holds R-wide tiles (BH x R float32 accumulators, BN x R latents, BH x R queries: at
# R = 512, 16 x 512 each), which 4 NVIDIA warps cannot keep in registers; 8 warps halve a thread's share. AMD's
# 64-lane wavefronts already hold twice the lanes a warp does. `workbench targets` shows each launch's registers.
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def mla_decode_head_tiled_kernel(Q, CKV, KR, CACHE, TABLE, LENS, O, scale, H, R, DR, PAGE, MAXP,
                                 R_PAD: tl.constexpr, DR_PAD: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr):
    """Program (sequence n, tile of BH heads): the heads' absorbed queries against the sequence's cached latents, BN
    tokens a step gathered through its block table (one key tile serves every head of the tile: MQA), an online
    softmax, this step's key last; the first head tile writes this step's latent into its row. Q [N, H, R + DR],
    CKV [N, R], KR [N, DR], CACHE [PAGES, PAGE, R + DR], TABLE [N, MAXP], LENS [N], O [N, H, R]; contiguous."""
    n = tl.program_id(0).to(tl.int64)
    hs = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = hs < H
    rr = tl.arange(0, R_PAD)
    rdr = tl.arange(0, DR_PAD)
    cache_ty = CACHE.dtype.element_ty
    length = tl.load(LENS + n).to(tl.int64)
    c_new = tl.load(CKV + n * R + rr, mask=rr < R, other=0.0).to(cache_ty)
    kr_new = tl.load(KR + n * DR + rdr, mask=rdr < DR, other=0.0).to(cache_ty)
    q_row = (n * H + hs) * (R + DR)
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
        s = (tl.dot(ql, tl.trans(c), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee"))
        s = tl.where(ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the step's first token is cached
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision="ieee")
        m_i = m_new
    # this step's key, from the inputs (its row is being written): every head's score, then the last softmax term
    s_new = (tl.sum(ql.to(tl.float32) * c_new.to(tl.float32)[None, :], axis=1)
             + tl.sum(qr.to(tl.float32) * kr_new.to(tl.float32)[None, :], axis=1)) * scale
    m_new = tl.maximum(m_i, s_new)
    alpha = tl.exp(m_i - m_new)
    p_new = tl.exp(s_new - m_new)
    l_i = l_i * alpha + p_new
    acc = acc * alpha[:, None] + p_new[:, None] * c_new.to(tl.float32)[None, :]
    tl.store(O + (n * H + hs)[:, None] * R + rr[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=h_ok[:, None] & (rr[None, :] < R))
    if tl.program_id(1) == 0:
        page_new = tl.load(TABLE + n * MAXP + length // PAGE).to(tl.int64)
        row_new = (page_new * PAGE + length % PAGE) * (R + DR)
        tl.store(CACHE + row_new + rr, c_new, mask=rr < R)
        tl.store(CACHE + row_new + R + rdr, kr_new, mask=rdr < DR)


def run(q, c_kv, k_rope, latent_cache, block_table, seq_lens, scale):
    """q [N, H, R + DR]; c_kv [N, R]; k_rope [N, DR] (float32/float16/bfloat16); latent_cache [PAGES, PAGE, R + DR]
    in q's dtype, contiguous, updated in place; block_table [N, MAXP] int32; seq_lens [N] int32 (tokens cached
    before this step) -> (o [N, H, R] in q.dtype, latent_cache)."""
    if not latent_cache.is_contiguous():
        raise ValueError("mla_decode: the latent cache is updated in place and must be contiguous")
    n, h, width = q.shape
    r, dr = c_kv.shape[-1], k_rope.shape[-1]
    if width != r + dr or latent_cache.shape[-1] != r + dr:
        raise ValueError(f"mla_decode: q and the cache rows must be R + DR = {r + dr} wide")
    o = torch.empty(n, h, r, dtype=q.dtype, device=q.device)
    if n and h:
        warps = target_settings(q.device)["num_warps"]
        mla_decode_head_tiled_kernel[(n, triton.cdiv(h, BH))](
            q.contiguous(), c_kv.contiguous(), k_rope.contiguous(), latent_cache, block_table.contiguous(),
            seq_lens.contiguous(), o, scale, h, r, dr, latent_cache.shape[1], block_table.shape[1],
            R_PAD=max(16, triton.next_power_of_2(r)), DR_PAD=max(16, triton.next_power_of_2(dr)), BH=BH, BN=BN,
            num_warps=warps)
    return o, latent_cache
