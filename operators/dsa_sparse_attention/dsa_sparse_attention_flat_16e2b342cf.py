"""dsa_sparse_attention candidate rendered from templates/dsa_sparse_attention/flat.py.j2.

one program per (query block, query head), float32 products summed over D, no tl.dot; atomic dk/dv
params: BLOCK_M=16, BLOCK_K=32, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "dsa_sparse_attention"
TEMPLATE = "flat"
BLOCK_M = 16
BLOCK_K = 32
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
# Per target: warps of the forward and the backward, pipelining stages, and the largest gathered [rows, BLOCK_K, D]
# register tile (elements) of each. On NVIDIA 16384-element tiles spill (sm_90a at the model suite, 4 warps: forward
# 248, backward 7272 B/thread; K, V and the backward's two atomic products are 128 float32 per thread each): one row
# per program (4096) without pipelining leaves the forward spill-free on 4 warps (128 registers) and the backward on
# 8 (4 warps still spill 48 B/thread).
LAUNCH_SETTINGS = {
    "default": {"fwd_warps": 4, "bwd_warps": 4, "num_stages": None, "fwd_tile": 16384,
                "bwd_tile": 16384},
    "cuda": {"bwd_warps": 8, "num_stages": 1, "fwd_tile": 4096, "bwd_tile": 4096},
}


@triton.jit
def sparse_attn_fwd_kernel(Q, K, V, IDX, GATE, OUT, O_PRE, LSE, n_rows, T, H, HKV, D, G, TOPK, scale,
                           BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, D_PAD: tl.constexpr,
                           HAS_GATE: tl.constexpr):
    """BLOCK_M query rows (flat b*T + t) of one query head h: gather BLOCK_K selected keys and values per row at a
    time and form the scores as float32 products summed over D (no tl.dot), online softmax over the valid keys.
    Writes OUT [B,T,H,D] (gated when HAS_GATE), the float32 pre-gate O_PRE and LSE [B,T,H]; no valid key: O_PRE = 0."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # b * T + t
    h = tl.program_id(1)
    g = h // G
    row_ok = rows < n_rows
    b = rows // T
    rd = tl.arange(0, D_PAD)
    qmask = row_ok[:, None] & (rd[None, :] < D)
    q_off = (rows[:, None] * H + h) * D + rd[None, :]
    q = tl.load(Q + q_off, mask=qmask, other=0.0).to(tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    denom = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    for i0 in range(0, TOPK, BLOCK_K):
        ri = i0 + tl.arange(0, BLOCK_K)
        idx = tl.load(IDX + rows[:, None] * TOPK + ri[None, :], mask=row_ok[:, None] & (ri[None, :] < TOPK), other=-1)
        valid = idx >= 0
        kv_off = ((b[:, None, None] * T + idx[:, :, None]) * HKV + g) * D + rd[None, None, :]
        kv_mask = valid[:, :, None] & (rd[None, None, :] < D)
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_K, D_PAD]
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
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
    tl.store(O_PRE + q_off, o, mask=qmask)
    tl.store(LSE + rows * H + h, lse, mask=row_ok)
    if HAS_GATE:
        o = o * tl.sigmoid(tl.load(GATE + q_off, mask=qmask, other=0.0).to(tl.float32))
    tl.store(OUT + q_off, o.to(OUT.dtype.element_ty), mask=qmask)


@triton.jit
def sparse_attn_bwd_kernel(Q, K, V, IDX, GATE, O_PRE, LSE, DOUT, DQ, DGATE, DK_ACC, DV_ACC, n_rows, T, H, HKV, D, G,
                           TOPK, scale, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, D_PAD: tl.constexpr,
                           HAS_GATE: tl.constexpr):
    """BLOCK_M query rows of head h, all in float32: P = exp(scale q.k - LSE) from the saved LSE,
    dO_pre = dOUT * sigmoid(gate), dgate = dOUT * O * sigmoid'(gate), dS = P (dO_pre.v - dO_pre.O);
    dq = scale sum dS k is the rows' own; dk += scale dS q and dv += P dO_pre are added with float32 atomics into
    DK_ACC/DV_ACC [B*T*HKV*D] (H/HKV heads and many rows hit one key: not bitwise deterministic on a GPU)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    h = tl.program_id(1)
    g = h // G
    row_ok = rows < n_rows
    b = rows // T
    rd = tl.arange(0, D_PAD)
    qmask = row_ok[:, None] & (rd[None, :] < D)
    q_off = (rows[:, None] * H + h) * D + rd[None, :]
    q = tl.load(Q + q_off, mask=qmask, other=0.0).to(tl.float32)
    o = tl.load(O_PRE + q_off, mask=qmask, other=0.0)
    do = tl.load(DOUT + q_off, mask=qmask, other=0.0).to(tl.float32)
    if HAS_GATE:
        sg = tl.sigmoid(tl.load(GATE + q_off, mask=qmask, other=0.0).to(tl.float32))
        tl.store(DGATE + q_off, (do * o * sg * (1.0 - sg)).to(DGATE.dtype.element_ty), mask=qmask)
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
        k = tl.load(K + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(V + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k, axis=2) * scale
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.sum(do[:, None, :] * v, axis=2)
        ds = p * (dp - delta[:, None])
        dq += tl.sum(ds[:, :, None] * k, axis=1)
        tl.atomic_add(DK_ACC + kv_off, ds[:, :, None] * q[:, None, :] * scale, mask=kv_mask)
        tl.atomic_add(DV_ACC + kv_off, p[:, :, None] * do[:, None, :], mask=kv_mask)
    tl.store(DQ + q_off, (dq * scale).to(DQ.dtype.element_ty), mask=qmask)


@triton.jit
def sparse_attn_cast_kernel(SRC, DST, n, BLOCK_N: tl.constexpr):
    """DST = SRC cast to DST's dtype (a float32 dk/dv accumulator to the input dtype)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(DST + offs, tl.load(SRC + offs, mask=offs < n).to(DST.dtype.element_ty), mask=offs < n)


def _dims(q, k, max_tile):
    B, T, H, D = q.shape
    HKV = k.shape[2]
    d_pad = triton.next_power_of_2(D)
    # rows per program: at most BLOCK_M, fewer where the gathered [rows, BLOCK_K, D] tiles would outgrow max_tile
    block_m = max(1, min(BLOCK_M, max_tile // (BLOCK_K * d_pad)))
    return B, T, H, HKV, D, H // HKV, block_m, d_pad


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
        B, T, H, HKV, D, G, block_m, d_pad = _dims(q, k, settings["fwd_tile"])
        out = torch.empty_like(q)
        o = torch.empty(B, T, H, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
        if out.numel():
            sparse_attn_fwd_kernel[(triton.cdiv(B * T, block_m), H)](
                q, k, v, indices, gate if gate is not None else q, out, o, lse, B * T, T, H, HKV, D, G,
                indices.shape[-1], scale, BLOCK_M=block_m, BLOCK_K=BLOCK_K, D_PAD=d_pad, HAS_GATE=gate is not None,
                **_launch_options(settings, "fwd_warps"))
        ctx.save_for_backward(q, k, v, indices, gate, o, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, indices, gate, o, lse = ctx.saved_tensors
        settings = target_settings(q.device)
        B, T, H, HKV, D, G, block_m, d_pad = _dims(q, k, settings["bwd_tile"])
        dout = dout.contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dgate = torch.empty_like(gate) if gate is not None else None
        dk_acc = torch.zeros(B, T, HKV, D, dtype=torch.float32, device=q.device)
        dv_acc = torch.zeros(B, T, HKV, D, dtype=torch.float32, device=q.device)
        if q.numel():
            sparse_attn_bwd_kernel[(triton.cdiv(B * T, block_m), H)](
                q, k, v, indices, gate if gate is not None else q, o, lse, dout, dq,
                dgate if dgate is not None else dq, dk_acc, dv_acc, B * T, T, H, HKV, D, G, indices.shape[-1],
                ctx.scale, BLOCK_M=block_m, BLOCK_K=BLOCK_K, D_PAD=d_pad, HAS_GATE=gate is not None,
                **_launch_options(settings, "bwd_warps"))
        n = dk.numel()
        if n:
            for acc, dst in ((dk_acc, dk), (dv_acc, dv)):
                sparse_attn_cast_kernel[(triton.cdiv(n, 1024),)](acc, dst, n, BLOCK_N=1024)
        return dq, dk, dv, None, dgate, None


def run(q, k, v, indices, gate, scale):
    """q [B,T,H,D], k, v [B,T,HKV,D] (float32/float16/bfloat16), indices [B,T,topk] int64 (-1 = none),
    gate [B,T,H,D] or None, scale float -> out [B,T,H,D] in q.dtype."""
    return SparseAttentionFunction.apply(q, k, v, indices, gate, scale)
