"""dsa_sparse_attention candidate rendered from templates/dsa_sparse_attention/flat.py.j2.

one program per (query block, query head), float32 products summed over D, no tl.dot; atomic dk/dv
params: BLOCK_M=4, BLOCK_K=16, num_warps=4
launch on sm_100a: bwd_tile=4096, bwd_warps=16, fwd_tile=4096, fwd_warps=16, num_stages=2
launch on sm_80: bwd_tile=4096, bwd_warps=16, fwd_tile=4096, fwd_warps=16, num_stages=2
launch on sm_90a: bwd_tile=4096, bwd_warps=16, fwd_tile=4096, fwd_warps=8, num_stages=2
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_sparse_attention"
TEMPLATE = "flat"
BLOCK_M = 4
BLOCK_K = 16
NUM_WARPS = 4
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'bwd_tile': 4096, 'bwd_warps': 16, 'fwd_tile': 4096, 'fwd_warps': 16, 'num_stages': 2}, 'sm_80': {'bwd_tile': 4096, 'bwd_warps': 16, 'fwd_tile': 4096, 'fwd_warps': 16, 'num_stages': 2}, 'sm_90a': {'bwd_tile': 4096, 'bwd_warps': 16, 'fwd_tile': 4096, 'fwd_warps': 8, 'num_stages': 2}}


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
# Per target: warps of the forward and the backward, pipelining stages, and the largest gathered [rows, BLOCK_K, D]
# register tile (elements) of each. K, V and the backward's two atomic products take 128 float32 a thread each at a
# 16384-element tile; on NVIDIA one row per program (4096) without pipelining fits the forward's registers on 4 warps
# and the backward's on 8, but for sm_80, which spills 8 bytes a thread of the backward at MLA's decompressed heads
# (keys 192, values 128) on 8 warps and none on 16. `workbench targets` shows each launch's registers and spills.
LAUNCH_SETTINGS = {
    "default": {"fwd_warps": 4, "bwd_warps": 4, "num_stages": None,
                "fwd_tile": 16384, "bwd_tile": 16384},
}


@triton.jit
def sparse_attn_fwd_kernel(Q, K, V, IDX, GATE, OUT, O_PRE, LSE, n_rows, T, H, HKV, D, DV, G, TOPK, scale,
                           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, D_PAD: tl.constexpr,
                           DV_PAD: tl.constexpr, SAME_WIDTH: tl.constexpr, HAS_GATE: tl.constexpr):
    """BLOCK_M query rows (flat b*T + t) of one query head h: gather BLOCK_K selected keys and values per row at a
    time and form the scores as float32 products summed over D (no tl.dot), online softmax over the valid keys.
    Keys are D wide, values DV. Writes OUT [B,T,H,DV] (gated when HAS_GATE), the float32 pre-gate O_PRE and LSE
    [B,T,H]; no valid key: O_PRE = 0."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # b * T + t
    h = tl.program_id(1)
    g = h // G
    row_ok = rows < n_rows
    b = rows // T
    rd = tl.arange(0, D_PAD)
    qmask = row_ok[:, None] & (rd[None, :] < D)
    q_off = (rows[:, None] * H + h) * D + rd[None, :]
    if SAME_WIDTH:  # values as wide as keys: one set of offsets (no extra registers)
        omask, o_off = qmask, q_off
    else:
        rv = tl.arange(0, DV_PAD)
        omask = row_ok[:, None] & (rv[None, :] < DV)
        o_off = (rows[:, None] * H + h) * DV + rv[None, :]
    q = tl.load(Q + q_off, mask=qmask, other=0.0).to(tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], dtype=tl.float32)
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
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_K, D_PAD]
        v = tl.load(V + v_off, mask=v_mask, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_K, DV_PAD]
        s = tl.sum(q[:, None, :] * k, axis=2) * scale
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: any finite reference
        alpha = tl.exp(m - m_ref)
        p = tl.exp(s - m_ref[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v, axis=1)
        m = m_new
    has_key = denom > 0.0
    o = acc / tl.where(has_key, denom, 1.0)[:, None]
    lse = tl.where(has_key, m + tl.log(tl.where(has_key, denom, 1.0)), 0.0)
    tl.store(O_PRE + o_off, o, mask=omask)
    tl.store(LSE + rows * H + h, lse, mask=row_ok)
    if HAS_GATE:
        o = o * tl.sigmoid(tl.load(GATE + o_off, mask=omask, other=0.0).to(tl.float32))
    tl.store(OUT + o_off, o.to(OUT.dtype.element_ty), mask=omask)


@triton.jit
def sparse_attn_bwd_kernel(Q, K, V, IDX, GATE, O_PRE, LSE, DOUT, DQ, DGATE, DK_ACC, DV_ACC, n_rows, T, H, HKV, D, DV,
                           G, TOPK, scale, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, D_PAD: tl.constexpr,
                           DV_PAD: tl.constexpr, SAME_WIDTH: tl.constexpr, HAS_GATE: tl.constexpr):
    """BLOCK_M query rows of head h, all in float32: P = exp(scale q.k - LSE) from the saved LSE,
    dO_pre = dOUT * sigmoid(gate), dgate = dOUT * O * sigmoid'(gate), dS = P (dO_pre.v - dO_pre.O);
    dq = scale sum dS k is the rows' own; dk += scale dS q and dv += P dO_pre are added with float32 atomics into
    DK_ACC [B*T*HKV*D] / DV_ACC [B*T*HKV*DV] (H/HKV heads and many rows hit one key: not bitwise deterministic on a
    GPU)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1)
    g = h // G
    row_ok = rows < n_rows
    b = rows // T
    rd = tl.arange(0, D_PAD)
    qmask = row_ok[:, None] & (rd[None, :] < D)
    q_off = (rows[:, None] * H + h) * D + rd[None, :]
    if SAME_WIDTH:  # values as wide as keys: one set of offsets (no extra registers)
        omask, o_off = qmask, q_off
    else:
        rv = tl.arange(0, DV_PAD)
        omask = row_ok[:, None] & (rv[None, :] < DV)
        o_off = (rows[:, None] * H + h) * DV + rv[None, :]
    q = tl.load(Q + q_off, mask=qmask, other=0.0).to(tl.float32)
    o = tl.load(O_PRE + o_off, mask=omask, other=0.0)
    do = tl.load(DOUT + o_off, mask=omask, other=0.0).to(tl.float32)
    if HAS_GATE:
        sg = tl.sigmoid(tl.load(GATE + o_off, mask=omask, other=0.0).to(tl.float32))
        tl.store(DGATE + o_off, (do * o * sg * (1.0 - sg)).to(DGATE.dtype.element_ty), mask=omask)
        do = do * sg
    delta = tl.sum(do * o, axis=1)
    lse = tl.load(LSE + rows * H + h, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
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
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(V + v_off, mask=v_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k, axis=2) * scale
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.sum(do[:, None, :] * v, axis=2)
        ds = p * (dp - delta[:, None])
        dq += tl.sum(ds[:, :, None] * k, axis=1)
        tl.atomic_add(DK_ACC + kv_off, ds[:, :, None] * q[:, None, :] * scale, mask=kv_mask)
        tl.atomic_add(DV_ACC + v_off, p[:, :, None] * do[:, None, :], mask=v_mask)
    tl.store(DQ + q_off, (dq * scale).to(DQ.dtype.element_ty), mask=qmask)


@triton.jit
def sparse_attn_cast_kernel(SRC, DST, n, BLOCK_N: tl.constexpr):
    """DST = SRC cast to DST's dtype (a float32 dk/dv accumulator to the input dtype)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(DST + offs, tl.load(SRC + offs, mask=offs < n).to(DST.dtype.element_ty), mask=offs < n)


def _dims(q, k, v, max_tile):
    B, T, H, D = q.shape
    HKV, DV = k.shape[2], v.shape[-1]
    d_pad, dv_pad = triton.next_power_of_2(D), triton.next_power_of_2(DV)
    # rows per program: at most BLOCK_M, fewer where the gathered [rows, BLOCK_K, D or DV] tiles would outgrow
    # max_tile
    block_m = max(1, min(BLOCK_M, max_tile // (BLOCK_K * max(d_pad, dv_pad))))
    return B, T, H, HKV, D, DV, H // HKV, block_m, d_pad, dv_pad


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
        settings = target_settings(q.device)
        B, T, H, HKV, D, DV, G, block_m, d_pad, dv_pad = _dims(q, k, v, settings["fwd_tile"])
        out = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
        o = torch.empty(B, T, H, DV, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
        if out.numel():
            sparse_attn_fwd_kernel[(triton.cdiv(B * T, block_m), H)](
                q, k, v, indices, gate if gate is not None else q, out, o, lse, B * T, T, H, HKV, D, DV, G,
                indices.shape[-1], scale, BLOCK_M=block_m, BLOCK_K=BLOCK_K, D_PAD=d_pad, DV_PAD=dv_pad,
                SAME_WIDTH=D == DV, HAS_GATE=gate is not None, **_launch_options(settings, "fwd_warps"))
        ctx.save_for_backward(q, k, v, indices, gate, o, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, indices, gate, o, lse = ctx.saved_tensors
        settings = target_settings(q.device)
        B, T, H, HKV, D, DV, G, block_m, d_pad, dv_pad = _dims(q, k, v, settings["bwd_tile"])
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dgate = torch.empty_like(gate) if gate is not None else None
        dk_acc = torch.zeros(B, T, HKV, D, dtype=torch.float32, device=q.device)
        dv_acc = torch.zeros(B, T, HKV, DV, dtype=torch.float32, device=q.device)
        if q.numel():
            sparse_attn_bwd_kernel[(triton.cdiv(B * T, block_m), H)](
                q, k, v, indices, gate if gate is not None else q, o, lse, dout, dq,
                dgate if dgate is not None else dq, dk_acc, dv_acc, B * T, T, H, HKV, D, DV, G, indices.shape[-1],
                ctx.scale, BLOCK_M=block_m, BLOCK_K=BLOCK_K, D_PAD=d_pad, DV_PAD=dv_pad, SAME_WIDTH=D == DV,
                HAS_GATE=gate is not None, **_launch_options(settings, "bwd_warps"))
        for acc, dst in ((dk_acc, dk), (dv_acc, dv)):
            if dst.numel():
                sparse_attn_cast_kernel[(triton.cdiv(dst.numel(), 1024),)](acc, dst, dst.numel(), BLOCK_N=1024)
        return dq, dk, dv, None, dgate, None


def run(q, k, v, indices, gate, scale):
    """q [B,T,H,D], k [B,T,HKV,D], v [B,T,HKV,DV] (float32/float16/bfloat16), indices [B,T,topk] int64 (-1 = none),
    gate [B,T,H,DV] or None, scale float -> out [B,T,H,DV] in q.dtype."""
    return SparseAttentionFunction.apply(q, k, v, indices, gate, scale)
