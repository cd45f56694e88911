"""attention candidate rendered from templates/attention/split.py.j2.

FlashAttention-2 forward (online softmax, log-sum-exp kept) and a two-kernel backward (dK and dV per key block over the KV head's query group, then dQ per query block)
params: BLOCK_M=16, BLOCK_N=16, DOT_DTYPE=input, num_warps=4
launch on sm_80: bwd_num_stages=1
launch on sm_90a: bwd_num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "attention"
TEMPLATE = "split"
BLOCK_M = 16
BLOCK_N = 16
DOT_DTYPE = "input"  # "input": tl.dot operands in the input dtype (tensor cores), float32 accumulation
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_80': {'bwd_num_stages': 1}, 'sm_90a': {'bwd_num_warps': 8}}


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
# Warps per target of the forward and of the dkdv kernel, and that kernel's pipeline stages: at Qwen3-Next's 256-wide
# heads the forward's accumulator, query block and float32 output copy, and the dkdv kernel's dK and dV (two BLOCK_N x
# D float32 accumulators) with the key block's K and V, are more than a thread's registers over 4 NVIDIA warps (the
# forward spilled 8 bytes per thread on sm_90a, the dkdv kernel 8 and 16 on sm_80 and sm_90a); 8 warps hold them.
# The dkdv kernel's loop over the group's queries, software-pipelined in Triton's 3 stages, still spilled at 80 to
# 128-wide heads: 32 bytes on sm_90a (16 at 2 stages, none unpipelined), with a window and sinks 8 on sm_80 (none at
# 2 stages; unpipelined, 16 at 64-wide heads), with a soft cap 40 on sm_100a (none at 2 stages). Measured over 64 to
# 256-wide heads, plain, with a window and sinks, with a soft cap: `workbench targets` shows each launch's registers
# and spills per target.
LAUNCH_SETTINGS = {"default": {"num_warps": 4, "fwd_num_warps": 4,
                               "bwd_num_warps": 4, "bwd_num_stages": None}}

@triton.jit
def attention_fwd_kernel(Q, K, V, SINKS, REL, OUT, O32, LSE, TQ, TK, H, HKV, D, scale, window, softcap, sink_rows,
                         rel_extent, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                         HAS_SINKS: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                         HAS_REL: tl.constexpr, OPERAND_F32: tl.constexpr):
    """BLOCK_M queries of head h in batch b over the keys they see, BLOCK_N at a time (FlashAttention-2's online
    softmax; a sink starts the running max and sum at its logit and 1). Writes OUT in Q's dtype, its float32 copy O32
    (the backward's DELTA reads it) and LSE."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    rt = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    t_ok = rt < TQ
    pos = rt + (TK - TQ)
    rd = tl.arange(0, D_PAD)
    d_ok = rd[None, :] < D
    row = (b * TQ + rt) * H + h
    q = tl.load(Q + row[:, None] * D + rd[None, :], mask=t_ok[:, None] & d_ok, other=0.0)
    if OPERAND_F32:
        q = q.to(tl.float32)
    if HAS_SINKS:
        m_i = tl.load(SINKS + row % sink_rows, mask=t_ok, other=0.0).to(tl.float32)
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    # the keys rows first_row .. last_row - 1 may see: causal up to the last row's position, and from the first row's
    # window start (rounded down to a key block)
    hi = tl.minimum(TK, (pid + 1) * BLOCK_M + TK - TQ)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(0, pid * BLOCK_M + TK - TQ - window + 1) // BLOCK_N * BLOCK_N
    for s0 in range(lo, hi, BLOCK_N):
        rs = s0 + tl.arange(0, BLOCK_N)
        kv_off = ((b * TK + rs) * HKV + hk)[:, None] * D + rd[None, :]
        kv_mask = (rs[:, None] < TK) & d_ok
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        if HAS_SOFTCAP:
            capped = 2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0  # tanh(s / softcap)
            s = softcap * capped
        if HAS_REL:  # the relative logit of each pair's backward distance, where it has one
            distance = pos[:, None] - rs[None, :]
            near = (distance >= 0) & (distance < rel_extent) & t_ok[:, None]
            s += tl.load(REL + row[:, None] * rel_extent + distance, mask=near, other=0.0).to(tl.float32)
        valid = (rs[None, :] <= pos[:, None]) & (rs[None, :] < TK)
        if HAS_WINDOW:
            valid = valid & (rs[None, :] > pos[:, None] - window)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key seen yet (a window's start)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(OUT + row[:, None] * D + rd[None, :], o.to(OUT.dtype.element_ty), mask=t_ok[:, None] & d_ok)
    tl.store(O32 + row[:, None] * D + rd[None, :], o, mask=t_ok[:, None] & d_ok)
    tl.store(LSE + row, m_i + tl.log(l_i), mask=t_ok)


@triton.jit
def attention_bwd_prep_kernel(DOUT, O32, LSE, SINKS, DELTA, DSINK_ROWS, n_rows, sink_rows, D, BLOCK_R: tl.constexpr,
                              D_PAD: tl.constexpr, HAS_SINKS: tl.constexpr):
    """BLOCK_R rows (b, t, h): DELTA = rowsum(dO . O) from dO as the backward's dots see it (its own dtype, exact in
    float32) and the float32 output, not its rounded copy (dO.V - DELTA cancels where a query's probability mass sits
    on few keys, and O's rounding would be all that is left), and each row's sink gradient -exp(sink - LSE) DELTA
    (float32)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rd = tl.arange(0, D_PAD)
    mask = (rows[:, None] < n_rows) & (rd[None, :] < D)
    do = tl.load(DOUT + rows[:, None] * D + rd[None, :], mask=mask, other=0.0)
    o = tl.load(O32 + rows[:, None] * D + rd[None, :], mask=mask, other=0.0)
    delta = tl.sum(do.to(tl.float32) * o, axis=1)
    tl.store(DELTA + rows, delta, mask=rows < n_rows)
    if HAS_SINKS:
        sink = tl.load(SINKS + rows % sink_rows, mask=rows < n_rows, other=0.0).to(tl.float32)
        lse = tl.load(LSE + rows, mask=rows < n_rows, other=0.0)
        tl.store(DSINK_ROWS + rows, -tl.exp(sink - lse) * delta, mask=rows < n_rows)


@triton.jit
def attention_sink_sum_kernel(DSINK_ROWS, DSINKS, n_rows, H, BLOCK_R: tl.constexpr, H_PAD: tl.constexpr):
    """DSINKS [H] = the sum over rows of DSINK_ROWS [n_rows, H] (float32, in row order: deterministic)."""
    rh = tl.arange(0, H_PAD)
    acc = tl.zeros([BLOCK_R, H_PAD], dtype=tl.float32)
    for r0 in range(0, n_rows, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        acc += tl.load(DSINK_ROWS + rows[:, None] * H + rh[None, :], mask=(rows[:, None] < n_rows) & (rh[None, :] < H),
                       other=0.0)
    tl.store(DSINKS + rh, tl.sum(acc, axis=0).to(DSINKS.dtype.element_ty), mask=rh < H)


@triton.jit
def attention_dkdv_kernel(Q, K, V, REL, DO, LSE, DELTA, DK, DV, TQ, TK, H, HKV, D, scale, window, softcap,
                          rel_extent, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                          HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_REL: tl.constexpr,
                          OPERAND_F32: tl.constexpr):
    """BLOCK_N keys of KV head hk in batch b against every query of its group that sees them, BLOCK_M at a time:
    P = exp(S - LSE), dV += P^T dO, dS = P (dO V^T - DELTA) (times tanh' under a soft cap), dK += scale dS^T Q,
    summed over the group's heads in registers (no atomics); DK, DV in K's dtype."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // HKV
    hk = bh % HKV
    group = H // HKV
    rs = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D_PAD)
    d_ok = rd[None, :] < D
    kv_off = ((b * TK + rs) * HKV + hk)[:, None] * D + rd[None, :]
    kv_mask = (rs[:, None] < TK) & d_ok
    k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(V + kv_off, mask=kv_mask, other=0.0)
    if OPERAND_F32:
        k, v = k.to(tl.float32), v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D_PAD], dtype=tl.float32)
    # the query rows that may see keys s0 .. s0 + BLOCK_N - 1: from the first whose position reaches s0 (rounded
    # down to a query block), to the last whose window still holds the block's last key
    t_lo = tl.maximum(0, pid * BLOCK_N - (TK - TQ)) // BLOCK_M * BLOCK_M
    t_hi = TQ
    if HAS_WINDOW:
        t_hi = tl.minimum(TQ, pid * BLOCK_N + BLOCK_N - 1 + window - (TK - TQ))
    for g in range(0, group):
        h = hk * group + g
        for t0 in range(t_lo, t_hi, BLOCK_M):
            rt = t0 + tl.arange(0, BLOCK_M)
            t_ok = rt < TQ
            pos = rt + (TK - TQ)
            row = (b * TQ + rt) * H + h
            q = tl.load(Q + row[:, None] * D + rd[None, :], mask=t_ok[:, None] & d_ok, other=0.0).to(k.dtype)
            do = tl.load(DO + row[:, None] * D + rd[None, :], mask=t_ok[:, None] & d_ok, other=0.0).to(k.dtype)
            lse = tl.load(LSE + row, mask=t_ok, other=0.0)
            delta = tl.load(DELTA + row, mask=t_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            if HAS_SOFTCAP:
                capped = 2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0  # tanh(s / softcap)
                s = softcap * capped
            if HAS_REL:  # the relative logit of each pair's backward distance, where it has one
                distance = pos[:, None] - rs[None, :]
                near = (distance >= 0) & (distance < rel_extent) & t_ok[:, None]
                s += tl.load(REL + row[:, None] * rel_extent + distance, mask=near, other=0.0).to(tl.float32)
            valid = (rs[None, :] <= pos[:, None]) & (rs[None, :] < TK)
            if HAS_WINDOW:
                valid = valid & (rs[None, :] > pos[:, None] - window)
            p = tl.where(valid & t_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
            dv += tl.dot(tl.trans(p.to(k.dtype)), do, input_precision="ieee")
            ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])
            if HAS_SOFTCAP:
                ds = ds * (1.0 - capped * capped)
            ds = ds.to(k.dtype)
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
    tl.store(DK + kv_off, (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def attention_dq_kernel(Q, K, V, REL, DO, LSE, DELTA, DQ, DREL, TQ, TK, H, HKV, D, scale, window, softcap,
                        rel_extent, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                        HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_REL: tl.constexpr,
                        OPERAND_F32: tl.constexpr):
    """BLOCK_M queries of head h in batch b over the keys they see: dQ = scale dS K, in Q's dtype; each pair's
    relative-logit gradient (its dS) stored into DREL [B, TQ, H, E] float32."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    hk = h // (H // HKV)
    rt = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    t_ok = rt < TQ
    pos = rt + (TK - TQ)
    rd = tl.arange(0, D_PAD)
    d_ok = rd[None, :] < D
    row = (b * TQ + rt) * H + h
    q = tl.load(Q + row[:, None] * D + rd[None, :], mask=t_ok[:, None] & d_ok, other=0.0)
    if OPERAND_F32:
        q = q.to(tl.float32)
    do = tl.load(DO + row[:, None] * D + rd[None, :], mask=t_ok[:, None] & d_ok, other=0.0).to(q.dtype)
    lse = tl.load(LSE + row, mask=t_ok, other=0.0)
    delta = tl.load(DELTA + row, mask=t_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    # the keys rows first_row .. last_row - 1 may see: causal up to the last row's position, and from the first row's
    # window start (rounded down to a key block)
    hi = tl.minimum(TK, (pid + 1) * BLOCK_M + TK - TQ)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(0, pid * BLOCK_M + TK - TQ - window + 1) // BLOCK_N * BLOCK_N
    for s0 in range(lo, hi, BLOCK_N):
        rs = s0 + tl.arange(0, BLOCK_N)
        kv_off = ((b * TK + rs) * HKV + hk)[:, None] * D + rd[None, :]
        kv_mask = (rs[:, None] < TK) & d_ok
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        if HAS_SOFTCAP:
            capped = 2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0  # tanh(s / softcap)
            s = softcap * capped
        if HAS_REL:  # the relative logit of each pair's backward distance, where it has one
            distance = pos[:, None] - rs[None, :]
            near = (distance >= 0) & (distance < rel_extent) & t_ok[:, None]
            s += tl.load(REL + row[:, None] * rel_extent + distance, mask=near, other=0.0).to(tl.float32)
        valid = (rs[None, :] <= pos[:, None]) & (rs[None, :] < TK)
        if HAS_WINDOW:
            valid = valid & (rs[None, :] > pos[:, None] - window)
        p = tl.where(valid & t_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])
        if HAS_REL:
            tl.store(DREL + row[:, None] * rel_extent + distance, ds, mask=near & valid)
        if HAS_SOFTCAP:
            ds = ds * (1.0 - capped * capped)
        dq += tl.dot(ds.to(q.dtype), k, input_precision="ieee")
    tl.store(DQ + row[:, None] * D + rd[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=t_ok[:, None] & d_ok)


def _backward(q, k, v, rel, dout, lse, delta, dq, dk, dv, drel, scale, window, softcap, flags):
    """dK and dV per key block (a KV head's group summed in registers), then dQ per query block: deterministic."""
    B, TQ, H, D = q.shape
    TK, HKV = k.shape[1], k.shape[2]
    settings = target_settings(q.device)
    options = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "D_PAD": flags["D_PAD"], "HAS_WINDOW": flags["HAS_WINDOW"],
               "HAS_SOFTCAP": flags["HAS_SOFTCAP"], "HAS_REL": flags["HAS_REL"], "OPERAND_F32": flags["OPERAND_F32"]}
    args = (q, k, v, rel if rel is not None else q, dout, lse, delta)
    sizes = (TQ, TK, H, HKV, D, scale, window, softcap, rel.shape[-1] if rel is not None else 1)
    stages = {"num_stages": settings["bwd_num_stages"]} if settings["bwd_num_stages"] else {}
    attention_dkdv_kernel[(triton.cdiv(TK, BLOCK_N), B * HKV)](*args, dk, dv, *sizes, **options,
                                                               num_warps=settings["bwd_num_warps"], **stages)
    attention_dq_kernel[(triton.cdiv(TQ, BLOCK_M), B * H)](*args, dq, drel if rel is not None else dq, *sizes,
                                                           **options, num_warps=settings["num_warps"])


def _flags(sinks, window, softcap, rel, q):
    """The constexpr switches and D_PAD (tl.dot needs 16 or more; head sizes padded to a power of two)."""
    return {"D_PAD": max(16, triton.next_power_of_2(q.shape[-1])), "HAS_SINKS": sinks is not None,
            "HAS_WINDOW": window > 0, "HAS_SOFTCAP": softcap > 0, "HAS_REL": rel is not None,
            "OPERAND_F32": DOT_DTYPE == "float32"}


def _check(q, k, sinks, rel):
    """ValueError unless TQ <= TK, H is a multiple of HKV, sinks are [H] or [B, TQ, H] and rel [B, TQ, H, E >= 1]."""
    B, TQ, H, _ = q.shape
    TK, HKV = k.shape[1], k.shape[2]
    if TQ > TK or H % max(HKV, 1):
        raise ValueError(f"attention: TQ={TQ} must not exceed TK={TK}, and H={H} must be a multiple of HKV={HKV}")
    if sinks is not None and tuple(sinks.shape) not in ((H,), (B, TQ, H)):
        raise ValueError(f"attention: sinks {tuple(sinks.shape)} must be [H] or [B, TQ, H] = {[B, TQ, H]}")
    if rel is not None and (rel.dim() != 4 or tuple(rel.shape[:3]) != (B, TQ, H) or not rel.shape[3]):
        raise ValueError(f"attention: rel {tuple(rel.shape)} must be [B, TQ, H, E] with B, TQ, H = {B, TQ, H}, E >= 1")


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, scale, window, softcap, rel):
        _check(q, k, sinks, rel)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        sinks = sinks.contiguous() if sinks is not None else None
        rel = rel.contiguous() if rel is not None else None
        B, TQ, H, D = q.shape
        TK, HKV = k.shape[1], k.shape[2]
        out = torch.empty_like(q)
        o32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)  # the backward's DELTA reads it
        lse = torch.empty(B, TQ, H, dtype=torch.float32, device=q.device)
        if out.numel():
            attention_fwd_kernel[(triton.cdiv(TQ, BLOCK_M), B * H)](
                q, k, v, sinks if sinks is not None else q, rel if rel is not None else q, out, o32, lse, TQ, TK, H,
                HKV, D, scale, window, softcap, sinks.numel() if sinks is not None else 1,
                rel.shape[-1] if rel is not None else 1, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                **_flags(sinks, window, softcap, rel, q), num_warps=target_settings(q.device)["fwd_num_warps"])
        ctx.save_for_backward(q, k, v, sinks, rel, o32, lse)
        ctx.args = (scale, window, softcap)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, sinks, rel, o32, lse = ctx.saved_tensors
        scale, window, softcap = ctx.args
        B, TQ, H, D = q.shape
        flags = _flags(sinks, window, softcap, rel, q)
        n_rows = B * TQ * H
        delta = torch.empty(B, TQ, H, dtype=torch.float32, device=q.device)
        dsink_rows = torch.empty(n_rows if sinks is not None else 0, dtype=torch.float32, device=q.device)
        per_head = sinks is not None and sinks.dim() == 1
        dsinks = torch.empty_like(sinks) if per_head else None
        if not n_rows:  # no query: nothing flows back
            return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v),
                    torch.zeros_like(sinks) if sinks is not None else None, None, None, None,
                    torch.zeros_like(rel) if rel is not None else None)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        drel = torch.zeros(rel.shape, dtype=torch.float32, device=q.device) if rel is not None else None
        dout = dout.contiguous()
        warps = target_settings(q.device)["num_warps"]
        attention_bwd_prep_kernel[(triton.cdiv(n_rows, BLOCK_M),)](
            dout, o32, lse, sinks if sinks is not None else q, delta, dsink_rows, n_rows,
            sinks.numel() if sinks is not None else 1, D, BLOCK_R=BLOCK_M, D_PAD=flags["D_PAD"],
            HAS_SINKS=flags["HAS_SINKS"], num_warps=warps)
        if per_head:
            attention_sink_sum_kernel[(1,)](dsink_rows, dsinks, B * TQ, H, BLOCK_R=16,
                                            H_PAD=triton.next_power_of_2(H), num_warps=warps)
        elif sinks is not None:  # a sink per row: its gradient is the row's
            dsinks = dsink_rows.view(sinks.shape).to(sinks.dtype)
        _backward(q, k, v, rel, dout, lse, delta, dq, dk, dv, drel, scale, window, softcap, flags)
        return dq, dk, dv, dsinks, None, None, None, drel.to(rel.dtype) if rel is not None else None


def run(q, k, v, sinks, scale, window, softcap, rel=None):
    """q [B,TQ,H,D], k and v [B,TK,HKV,D] (float32/float16/bfloat16; TQ <= TK, H a multiple of HKV), sinks [H] or
    [B,TQ,H] or None, scale float, window int (0: none), softcap float (0: none), rel [B,TQ,H,E] or None -> out
    [B,TQ,H,D] in q.dtype."""
    return AttentionFunction.apply(q, k, v, sinks, scale, window, softcap, rel)
