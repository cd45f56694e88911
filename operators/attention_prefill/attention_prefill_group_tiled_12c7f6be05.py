"""attention_prefill candidate rendered from templates/attention_prefill/group_tiled.py.j2.

one program per (packed token, KV head): the head's query group as one tl.dot tile against BN keys a step, its cached keys through the block table, then its new ones from the inputs
params: BN=16, num_warps=4
launch on sm_80: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "attention_prefill"
TEMPLATE = "group_tiled"
BN = 16
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
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def _attend(m_i, l_i, acc, q, k, v, ok, scale, softcap, HAS_SOFTCAP: tl.constexpr, ROWS: tl.constexpr):
    """One online-softmax step of the query rows over BN keys k and values v (where ``ok``): with ROWS, q [R, D]
    against k [BN, D] through tl.dot; without, one query q [D] (m_i, l_i scalars, acc [D])."""
    if ROWS:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        s = tl.sum(q[None, :].to(tl.float32) * k.to(tl.float32), axis=1) * scale
    if HAS_SOFTCAP:
        s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)  # softcap * tanh(s / softcap)
    if ROWS:  # (one return after both branches: Triton compiles the code after a constexpr branch's return too)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_new = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), v, input_precision="ieee")
    else:
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe)
        l_new = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
    return m_new, l_new, acc


@triton.jit
def attention_prefill_group_tiled_kernel(Q, K, V, KC, VC, TABLE, LENS, CU, SINKS, OUT, scale, window, softcap, S, H, HKV, D, PAGE, MAXP,
        PAGE_STRIDE, ROW_STRIDE, HEAD_STRIDE, D_PAD: tl.constexpr, GP: tl.constexpr, BS: tl.constexpr,
        BN: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr):
    """Program (packed token i, KV head hk, its query group as GP rows) over the keys the token sees: the cached ones BN
    a step through the block table, then the new ones up to itself from the inputs; the token's key and value
    written into its row by its KV head's program. Q and OUT [rows, H, D], K and V [rows, HKV, D], TABLE [S, MAXP], LENS [S], CU [S + 1] (the
    prefill's), SINKS [H], contiguous; KC and VC [PAGES, PAGE, HKV, D] at the strides given (each row's D
    contiguous: vLLM's key and value halves of one cache, either page layout). GP: the group's rows padded for
    tl.dot; BS: S's next power of two."""
    i = tl.program_id(0).to(tl.int64)
    group = H // HKV
    hk = tl.program_id(1).to(tl.int64)
    rg = tl.arange(0, GP)
    h_ok = rg < group
    hs = hk * group + rg
    seqs = tl.arange(0, BS)
    ends = tl.load(CU + 1 + seqs, mask=seqs < S, other=2147483647).to(tl.int64)  # each sequence's last row + 1
    n = tl.sum((ends <= i).to(tl.int32), axis=0).to(tl.int64)
    start = tl.load(CU + n).to(tl.int64)
    t = i - start
    cache_ty = KC.dtype.element_ty
    length = tl.load(LENS + n).to(tl.int64)
    position = length + t
    rd = tl.arange(0, D_PAD)
    d_ok = rd < D
    q = tl.load(Q + (i * H + hs)[:, None] * D + rd[None, :], mask=h_ok[:, None] & d_ok[None, :],
                other=0.0).to(cache_ty)
    if HAS_SINKS:
        m_i = tl.load(SINKS + hs, mask=h_ok, other=0.0).to(tl.float32)
        l_i = tl.full([GP], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([GP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, D_PAD], dtype=tl.float32)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(0, position - window + 1)
    kv_mask = d_ok[None, :]
    for j0 in range(lo, length, BN):
        pos = j0 + tl.arange(0, BN)
        ok = pos < length
        page = tl.load(TABLE + n * MAXP + pos // PAGE, mask=ok, other=0).to(tl.int64)
        row = page * PAGE_STRIDE + (pos % PAGE) * ROW_STRIDE + hk * HEAD_STRIDE
        k = tl.load(KC + row[:, None] + rd[None, :], mask=ok[:, None] & kv_mask, other=0.0)
        v = tl.load(VC + row[:, None] + rd[None, :], mask=ok[:, None] & kv_mask, other=0.0)
        m_i, l_i, acc = _attend(m_i, l_i, acc, q, k, v, ok, scale, softcap, HAS_SOFTCAP, True)
    for u0 in range(tl.maximum(lo, length) - length, t + 1, BN):
        u = u0 + tl.arange(0, BN)
        ok = u <= t
        row = ((start + u) * HKV + hk) * D
        k = tl.load(K + row[:, None] + rd[None, :], mask=ok[:, None] & kv_mask, other=0.0).to(cache_ty)
        v = tl.load(V + row[:, None] + rd[None, :], mask=ok[:, None] & kv_mask, other=0.0).to(cache_ty)
        m_i, l_i, acc = _attend(m_i, l_i, acc, q, k, v, ok, scale, softcap, HAS_SOFTCAP, True)
    tl.store(OUT + (i * H + hs)[:, None] * D + rd[None, :], (acc / l_i[:, None]).to(OUT.dtype.element_ty),
             mask=h_ok[:, None] & d_ok[None, :])
    page_new = tl.load(TABLE + n * MAXP + position // PAGE).to(tl.int64)
    row_new = page_new * PAGE_STRIDE + (position % PAGE) * ROW_STRIDE + hk * HEAD_STRIDE
    tl.store(KC + row_new + rd, tl.load(K + (i * HKV + hk) * D + rd, mask=d_ok, other=0.0).to(cache_ty),
             mask=d_ok)
    tl.store(VC + row_new + rd, tl.load(V + (i * HKV + hk) * D + rd, mask=d_ok, other=0.0).to(cache_ty),
             mask=d_ok)



def run(q, k, v, k_cache, v_cache, block_table, seq_lens, cu_seqlens, sinks, scale, window, softcap):
    """q [TOTAL, H, D]; k, v [TOTAL, HKV, D] (float32/float16/bfloat16); k_cache, v_cache [PAGES, PAGE, HKV, D]
    in q's dtype, updated in place, at any strides both share with each row's D contiguous (vLLM's key and value
    halves of one cache); block_table [S, MAXP] int32; seq_lens [S] int32 (tokens cached before the step); cu_seqlens [S + 1] int32; sinks [H] or None; scale; window (0: none); softcap (0: none) ->
    (out like q, k_cache, v_cache)."""
    tokens, h, d = q.shape
    hkv = k.shape[1]
    if h % hkv or k_cache.shape[2:] != (hkv, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"{BLOCK}: H={h} must be a multiple of HKV={hkv}, and the caches [PAGES, PAGE, {hkv}, {d}]")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError(f"{BLOCK}: the KV caches must share strides, each row's D contiguous "
                         f"(k_cache {k_cache.stride()}, v_cache {v_cache.stride()})")
    out = torch.empty_like(q)
    if tokens and h:
        s = cu_seqlens.shape[0] - 1
        attention_prefill_group_tiled_kernel[(tokens, hkv)](
            q.contiguous(), k.contiguous(), v.contiguous(), k_cache, v_cache, block_table.contiguous(),
            seq_lens.contiguous(), cu_seqlens.contiguous(), sinks if sinks is not None else q, out, scale, window, softcap,
            s, h, hkv, d, k_cache.shape[1], block_table.shape[1], *k_cache.stride()[:3],
            D_PAD=max(16, triton.next_power_of_2(d)),
            GP=max(16, triton.next_power_of_2(h // hkv)), BS=triton.next_power_of_2(s), BN=BN,
            HAS_SINKS=sinks is not None, HAS_WINDOW=window > 0, HAS_SOFTCAP=softcap > 0,
            num_warps=target_settings(q.device)["num_warps"])
    return out, k_cache, v_cache
