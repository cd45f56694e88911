"""dsa_sparse_attention candidate rendered from templates/dsa_sparse_attention/kv_shared.py.j2.

one program per (query block, kv head) for all its query heads; each gathered K/V block serves every head
params: BLOCK_M=16, BLOCK_K=32, DKV_ACCUM=atomic, BWD_PROGRAMS=64, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_sparse_attention"
TEMPLATE = "kv_shared"
BLOCK_M = 16
BLOCK_K = 32
DKV_ACCUM = "atomic"
BWD_PROGRAMS = 64
NUM_WARPS = 4
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides


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
    """LAUNCH_SETTINGS merged for the launch's target: default, then its backend, then the target itself."""
    target = launch_target(device)
    backend = target if target == "interpreter" else "cuda" if target.startswith("sm_") else "hip"
    return {**LAUNCH_SETTINGS.get("default", {}), **LAUNCH_SETTINGS.get(backend, {}),
            **LAUNCH_SETTINGS.get(target, {})}
# Per target: warps of the forward and the backward, pipelining stages, the most query heads per program in each (the
# M side of the dots; a larger group is split over programs, each gathering the keys again) and the largest register
# tile (elements). All the model suite's MLA heads in one program (128 padded x 128 dims float32) overflow a thread's
# registers on every GPU; 32 heads forward, 16 backward and one row per program fit (on AMD at 4 warps: 8 would cap
# its registers below what the backward holds). `workbench targets` shows each launch's registers and spills per
# target.
LAUNCH_SETTINGS = {
    "default": {"fwd_warps": 4, "bwd_warps": 4, "num_stages": None, "fwd_heads": 128,
                "bwd_heads": 128, "max_tile": 16384},
    "cuda": {"fwd_warps": 8, "bwd_warps": 8, "num_stages": 1, "fwd_heads": 32, "bwd_heads": 16,
             "max_tile": 4096},
    "hip": {"fwd_heads": 32, "bwd_heads": 16, "max_tile": 4096},
}


@triton.jit
def sparse_attn_fwd_kernel(Q, K, V, IDX, GATE, OUT, O_PRE, LSE, n_rows, T, H, HKV, D, DV, G, TOPK, scale,
                           BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                           D_PAD: tl.constexpr, DV_PAD: tl.constexpr, SAME_WIDTH: tl.constexpr,
                           HAS_GATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """BLOCK_M query rows (flat b*T + t), kv head g, the BLOCK_H query heads hb*BLOCK_H.. of g's group: gather
    BLOCK_K selected keys and values per row at a time, once for all those heads ([BLOCK_M, BLOCK_H, BLOCK_K] batched
    tl.dot, heads on the M side), online softmax over the valid ones (index >= 0).
    Keys are D wide, values DV. Writes OUT [B,T,H,DV] (gated when HAS_GATE), the float32 pre-gate O_PRE and LSE
    [B,T,H] for the backward pass; a row without valid keys gets O_PRE = 0."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # b * T + t
    g = tl.program_id(1)
    rh = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)  # head within the group
    row_ok = rows < n_rows
    b = rows // T
    heads = g * G + rh
    rd = tl.arange(0, D_PAD)
    hmask = row_ok[:, None] & (rh[None, :] < G)
    qmask = hmask[:, :, None] & (rd[None, None, :] < D)
    q_off = (rows[:, None, None] * H + heads[None, :, None]) * D + rd[None, None, :]
    if SAME_WIDTH:  # values as wide as keys: one set of offsets (no extra registers)
        omask, o_off = qmask, q_off
    else:
        rv = tl.arange(0, DV_PAD)
        omask = hmask[:, :, None] & (rv[None, None, :] < DV)
        o_off = (rows[:, None, None] * H + heads[None, :, None]) * DV + rv[None, None, :]
    q = tl.load(Q + q_off, mask=qmask, other=0.0)
    m = tl.full([BLOCK_M, BLOCK_H], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_H, DV_PAD], dtype=tl.float32)
    for i0 in range(0, TOPK, BLOCK_K):
        ri = i0 + tl.arange(0, BLOCK_K)
        idx = tl.load(IDX + rows[:, None] * TOPK + ri[None, :], mask=row_ok[:, None] & (ri[None, :] < TOPK), other=-1)
        valid = idx >= 0
        kv_off = ((b[:, None, None] * T + idx[:, :, None]) * HKV + g) * D + rd[None, None, :]
        kv_mask = valid[:, :, None] & (rd[None, None, :] < D)
        if SAME_WIDTH:
            v_off, v_mask = kv_off, kv_mask
        else:
            rv = tl.arange(0, DV_PAD)
            v_off = ((b[:, None, None] * T + idx[:, :, None]) * HKV + g) * DV + rv[None, None, :]
            v_mask = valid[:, :, None] & (rv[None, None, :] < DV)
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(V + v_off, mask=v_mask, other=0.0)
        s = tl.dot(q, tl.trans(k, 0, 2, 1), input_precision=DOT_PRECISION) * scale  # [BLOCK_M, BLOCK_H, BLOCK_K]
        s = tl.where(valid[:, None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=2))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: any finite reference
        alpha = tl.exp(m - m_ref)
        p = tl.exp(s - m_ref[:, :, None])
        denom = denom * alpha + tl.sum(p, axis=2)
        acc = acc * alpha[:, :, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
    has_key = denom > 0.0
    o = acc / tl.where(has_key, denom, 1.0)[:, :, None]
    lse = tl.where(has_key, m + tl.log(tl.where(has_key, denom, 1.0)), 0.0)
    tl.store(O_PRE + o_off, o, mask=omask)
    tl.store(LSE + rows[:, None] * H + heads[None, :], lse, mask=hmask)
    if HAS_GATE:
        gate = tl.load(GATE + o_off, mask=omask, other=0.0).to(tl.float32)
        o = o * tl.sigmoid(gate)
    tl.store(OUT + o_off, o.to(OUT.dtype.element_ty), mask=omask)


@triton.jit
def sparse_attn_bwd_kernel(Q, K, V, IDX, GATE, O_PRE, LSE, DOUT, DQ, DGATE, DK_ACC, DV_ACC, n_rows, rows_per_program,
                           T, H, HKV, D, DV, G, TOPK, scale, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
                           BLOCK_K: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                           SAME_WIDTH: tl.constexpr, HAS_GATE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The query rows [pid0 * rows_per_program, ...) in blocks of BLOCK_M, for kv head g and one block of its heads,
    FlashAttention style: P = exp(scale q k^T - LSE) recomputed from the saved LSE, dO_pre = dOUT * sigmoid(gate),
    dgate = dOUT * O * sigmoid'(gate), dS = P (dO_pre v^T - rowsum(dO_pre * O)); dq = scale dS k is the rows' own;
    dk += scale dS^T q and dv += P^T dO_pre go to the float32 DK_ACC [B*T*HKV*D] / DV_ACC [B*T*HKV*DV] with atomics
    (fast; the order of the additions is not fixed on a GPU, so not bitwise deterministic)."""
    g = tl.program_id(1)
    rh = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    heads = g * G + rh
    rd = tl.arange(0, D_PAD)
    start = tl.program_id(0) * rows_per_program
    stop = tl.minimum(start + rows_per_program, n_rows)
    for r0 in range(start, stop, BLOCK_M):
        rows = tl.cast(r0, tl.int64) + tl.arange(0, BLOCK_M)
        row_ok = rows < stop
        b = rows // T
        hmask = row_ok[:, None] & (rh[None, :] < G)
        qmask = hmask[:, :, None] & (rd[None, None, :] < D)
        q_off = (rows[:, None, None] * H + heads[None, :, None]) * D + rd[None, None, :]
        if SAME_WIDTH:  # values as wide as keys: one set of offsets (no extra registers)
            omask, o_off = qmask, q_off
        else:
            rv = tl.arange(0, DV_PAD)
            omask = hmask[:, :, None] & (rv[None, None, :] < DV)
            o_off = (rows[:, None, None] * H + heads[None, :, None]) * DV + rv[None, None, :]
        q = tl.load(Q + q_off, mask=qmask, other=0.0)
        o = tl.load(O_PRE + o_off, mask=omask, other=0.0)
        do = tl.load(DOUT + o_off, mask=omask, other=0.0).to(tl.float32)
        if HAS_GATE:
            sg = tl.sigmoid(tl.load(GATE + o_off, mask=omask, other=0.0).to(tl.float32))
            tl.store(DGATE + o_off, (do * o * sg * (1.0 - sg)).to(DGATE.dtype.element_ty), mask=omask)
            do = do * sg
        do_in = do.to(q.dtype)  # the dots take dO_pre in the input dtype: delta must see the same rounded values,
        delta = tl.sum(do_in.to(tl.float32) * o, axis=2)  # or dP - delta stops cancelling where P is one-hot
        lse = tl.load(LSE + rows[:, None] * H + heads[None, :], mask=hmask, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_H, D_PAD], dtype=tl.float32)
        for i0 in range(0, TOPK, BLOCK_K):
            ri = i0 + tl.arange(0, BLOCK_K)
            idx = tl.load(IDX + rows[:, None] * TOPK + ri[None, :], mask=row_ok[:, None] & (ri[None, :] < TOPK),
                          other=-1)
            valid = idx >= 0
            kv_off = ((b[:, None, None] * T + idx[:, :, None]) * HKV + g) * D + rd[None, None, :]
            kv_mask = valid[:, :, None] & (rd[None, None, :] < D)
            if SAME_WIDTH:
                v_off, v_mask = kv_off, kv_mask
            else:
                rv = tl.arange(0, DV_PAD)
                v_off = ((b[:, None, None] * T + idx[:, :, None]) * HKV + g) * DV + rv[None, None, :]
                v_mask = valid[:, :, None] & (rv[None, None, :] < DV)
            k = tl.load(K + kv_off, mask=kv_mask, other=0.0)
            v = tl.load(V + v_off, mask=v_mask, other=0.0)
            s = tl.dot(q, tl.trans(k, 0, 2, 1), input_precision=DOT_PRECISION) * scale
            p = tl.where(valid[:, None, :], tl.exp(s - lse[:, :, None]), 0.0)
            dp = tl.dot(do_in, tl.trans(v, 0, 2, 1), input_precision=DOT_PRECISION)
            ds = p * (dp - delta[:, :, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT_PRECISION)
            dk = tl.dot(tl.trans(ds.to(q.dtype), 0, 2, 1), q, input_precision=DOT_PRECISION) * scale
            dv = tl.dot(tl.trans(p.to(q.dtype), 0, 2, 1), do_in, input_precision=DOT_PRECISION)
            tl.atomic_add(DK_ACC + kv_off, dk, mask=kv_mask)  # rows of a block may share keys: atomics add both
            tl.atomic_add(DV_ACC + v_off, dv, mask=v_mask)
        tl.store(DQ + q_off, (dq * scale).to(DQ.dtype.element_ty), mask=qmask)


@triton.jit
def sparse_attn_reduce_kernel(ACC, DST, n, n_parts, BLOCK_N: tl.constexpr):
    """DST = sum over the n_parts float32 slices of ACC [n_parts, n], in slice order, cast to DST's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p in range(0, n_parts):
        total += tl.load(ACC + tl.cast(p, tl.int64) * n + offs, mask=offs < n, other=0.0)
    tl.store(DST + offs, total.to(DST.dtype.element_ty), mask=offs < n)


def _dims(q, k, v, heads):
    B, T, H, D = q.shape
    HKV, DV = k.shape[2], v.shape[-1]
    G = H // HKV
    settings = target_settings(q.device)
    max_tile = settings["max_tile"]
    block_h = max(16, min(triton.next_power_of_2(G), settings[heads]))  # heads of a kv group per program
    d_pad, dv_pad = max(16, triton.next_power_of_2(D)), max(16, triton.next_power_of_2(DV))
    widest = max(d_pad, dv_pad)
    # rows per program: at most BLOCK_M, fewer where the [rows, heads, D or DV] or [rows, BLOCK_K, D or DV] tiles
    # would outgrow max_tile elements (MLA's 96-128 heads x 128 dims leave one row per program)
    block_m = max(1, min(BLOCK_M, max_tile // (block_h * widest), max_tile // (BLOCK_K * widest)))
    # IEEE everywhere: no TF32 rounding of float32 inputs; half inputs are exact products on the tensor cores with
    # either setting, and gfx950's compiler accepts no "tf32"
    precision = "ieee"
    return B, T, H, HKV, D, DV, G, block_m, block_h, triton.cdiv(G, block_h), d_pad, dv_pad, precision, settings


def _launch_options(settings, warps):
    """num_warps, and num_stages where the target sets it (else Triton's default for the backend)."""
    options = {"num_warps": settings[warps]}
    if settings["num_stages"] is not None:
        options["num_stages"] = settings["num_stages"]
    return options


class SparseAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, indices, gate, scale):
        q, k, v, indices = q.contiguous(), k.contiguous(), v.contiguous(), indices.contiguous()
        gate = gate.contiguous() if gate is not None else None
        B, T, H, HKV, D, DV, G, block_m, block_h, n_hb, d_pad, dv_pad, precision, settings = _dims(q, k, v,
                                                                                                   "fwd_heads")
        topk = indices.shape[-1]
        out = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
        o = torch.empty(B, T, H, DV, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
        if out.numel():
            sparse_attn_fwd_kernel[(triton.cdiv(B * T, block_m), HKV, n_hb)](
                q, k, v, indices, gate if gate is not None else q, out, o, lse, B * T, T, H, HKV, D, DV, G, topk,
                scale, BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_K=BLOCK_K, D_PAD=d_pad, DV_PAD=dv_pad,
                SAME_WIDTH=D == DV, HAS_GATE=gate is not None, DOT_PRECISION=precision,
                **_launch_options(settings, "fwd_warps"))
        ctx.save_for_backward(q, k, v, indices, gate, o, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, indices, gate, o, lse = ctx.saved_tensors
        B, T, H, HKV, D, DV, G, block_m, block_h, n_hb, d_pad, dv_pad, precision, settings = _dims(q, k, v,
                                                                                                   "bwd_heads")
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dgate = torch.empty_like(gate) if gate is not None else None
        rows = B * T
        programs, rows_per_program, n_parts, bwd_rows = triton.cdiv(rows, block_m), block_m, 1, block_m
        dk_acc = torch.zeros(n_parts, rows * HKV * D, dtype=torch.float32, device=q.device)
        dv_acc = torch.zeros(n_parts, rows * HKV * DV, dtype=torch.float32, device=q.device)
        if q.numel():
            sparse_attn_bwd_kernel[(programs, HKV, n_hb)](
                q, k, v, indices, gate if gate is not None else q, o, lse, dout, dq,
                dgate if dgate is not None else dq, dk_acc, dv_acc, rows, rows_per_program, T, H, HKV, D, DV, G,
                indices.shape[-1], ctx.scale, BLOCK_M=bwd_rows, BLOCK_H=block_h, BLOCK_K=BLOCK_K, D_PAD=d_pad,
                DV_PAD=dv_pad, SAME_WIDTH=D == DV, HAS_GATE=gate is not None, DOT_PRECISION=precision,
                **_launch_options(settings, "bwd_warps"))
        for acc, dst in ((dk_acc, dk), (dv_acc, dv)):
            if dst.numel():
                sparse_attn_reduce_kernel[(triton.cdiv(dst.numel(), 1024),)](acc, dst, dst.numel(), n_parts,
                                                                              BLOCK_N=1024)
        return dq, dk, dv, None, dgate, None


def run(q, k, v, indices, gate, scale):
    """q [B,T,H,D], k [B,T,HKV,D], v [B,T,HKV,DV] (float32/float16/bfloat16), indices [B,T,topk] int64 (-1 = none),
    gate [B,T,H,DV] or None, scale float -> out [B,T,H,DV] in q.dtype."""
    return SparseAttentionFunction.apply(q, k, v, indices, gate, scale)
