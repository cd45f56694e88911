"""mla candidate rendered from templates/mla/decompressed.py.j2.

the training form; per-head keys and values expanded from the latent into float32 buffers, then a FlashAttention-2 forward and a two-kernel backward (dk/dv per key block, dq per query block)
params: BLOCK_M=16, BLOCK_N=16, MM_BLOCK_M=32, MM_BLOCK_N=32, MM_BLOCK_K=32, DOT_DTYPE=input, num_warps=4
launch on sm_80: dkdv_num_warps=8
launch on sm_90a: dkdv_num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "mla"
TEMPLATE = "decompressed"
BLOCK_M = 16
BLOCK_N = 16
MM_BLOCK_M = 32
MM_BLOCK_N = 32
MM_BLOCK_K = 32
DOT_DTYPE = "input"  # "input": tl.dot operands in the input dtype (tensor cores), float32 accumulation
NUM_WARPS = 4
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_80': {'dkdv_num_warps': 8}, 'sm_90a': {'dkdv_num_warps': 8}}


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
# Warps of the dk/dv kernel per target: it holds three float32 accumulators (dk_nope, dk_rope, dv: BLOCK_N x 320
# values at Kimi K3's head dims) and the key block's k_nope, k_rope and v across its loop, more than a thread's
# registers over 4 warps on NVIDIA; 8 warps hold them. `workbench targets` shows each launch's registers and spills
# per target.
LAUNCH_SETTINGS = {"default": {"dkdv_num_warps": 4}}

@triton.jit
def mla_matmul_kernel(A, B, C, ADD, GATE, M, N, K, sam, sak, sbk, sbn, scm, scn, sab, sbb, scb,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_ADD: tl.constexpr,
                      HAS_GATE: tl.constexpr, INPUT_OPERANDS: tl.constexpr):
    """C[z] = A[z] @ B[z] (+ ADD[z]) (* sigmoid(GATE[z])) for batch z = program_id(2), summed in float32 from
    operands in B's dtype (INPUT_OPERANDS: B is always an input, so bfloat16/float16 run on tensor cores) or in
    float32, stored in C's dtype. A [M, K], B [K, N], C, ADD (float32) and GATE [M, N], each addressed by its
    strides (s<tensor><dim>) and a batch stride (s<tensor>b; ADD and GATE share C's)."""
    z = tl.program_id(2).to(tl.int64)
    rm = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_base = A + z * sab
    b_base = B + z * sbb
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        a = tl.load(a_base + rm[:, None] * sam + ks[None, :] * sak, mask=(rm[:, None] < M) & (ks[None, :] < K),
                    other=0.0)
        b = tl.load(b_base + ks[:, None] * sbk + rn[None, :] * sbn, mask=(ks[:, None] < K) & (rn[None, :] < N),
                    other=0.0)
        if INPUT_OPERANDS:
            a = a.to(b.dtype)
        else:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc += tl.dot(a, b, input_precision="ieee")
    c_off = z * scb + rm[:, None] * scm + rn[None, :] * scn
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_ADD:
        acc += tl.load(ADD + c_off, mask=c_mask, other=0.0)
    if HAS_GATE:
        acc = acc * tl.sigmoid(tl.load(GATE + c_off, mask=c_mask, other=0.0).to(tl.float32))
    tl.store(C + c_off, acc.to(C.dtype.element_ty), mask=c_mask)


def _matmul(a, a_strides, b, b_strides, c, c_strides, m, n, k, batch, add=None, gate=None):
    """Launch mla_matmul_kernel: a/b/c_strides are (row, column, batch) strides in elements; float32 operands are
    IEEE products (no TF32 rounding; gfx950 accepts no "tf32")."""
    if m == 0 or n == 0 or batch == 0:
        return
    grid = (triton.cdiv(m, MM_BLOCK_M), triton.cdiv(n, MM_BLOCK_N), batch)
    mla_matmul_kernel[grid](a, b, c, add if add is not None else c, gate if gate is not None else c, m, n, k,
                            a_strides[0], a_strides[1], b_strides[0], b_strides[1], c_strides[0], c_strides[1],
                            a_strides[2], b_strides[2], c_strides[2], BLOCK_M=MM_BLOCK_M, BLOCK_N=MM_BLOCK_N,
                            BLOCK_K=MM_BLOCK_K, HAS_ADD=add is not None, HAS_GATE=gate is not None,
                            INPUT_OPERANDS=DOT_DTYPE == "input", num_warps=NUM_WARPS)


@triton.jit
def mla_attn_fwd_kernel(Q, KN, KR, V, GATE, OUT, O_PRE, LSE, T, H, DN, DR, DV, scale, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, DN_PAD: tl.constexpr, DR_PAD: tl.constexpr, DV_PAD: tl.constexpr,
                        HAS_GATE: tl.constexpr):
    """BLOCK_M queries of head h in batch b over the causal keys, BLOCK_N at a time (FlashAttention-2 online
    softmax): scores = scale (q_nope . k_nope + q_rope . k_rope). Q [B,T,H,DN+DR] and KR [B,T,DR] in the input
    dtype, KN [B,T,H,DN] and V [B,T,H,DV] expanded from the latent in the dots' operand dtype (the input dtype, or
    float32); products accumulate in float32. Writes OUT (gated when HAS_GATE), the float32 pre-gate O_PRE
    [B,T,H,DV] and LSE [B,T,H]."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rt = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    t_ok = rt < T
    rdn = tl.arange(0, DN_PAD)
    rdr = tl.arange(0, DR_PAD)
    rdv = tl.arange(0, DV_PAD)
    q_row = ((b * T + rt) * H + h) * (DN + DR)
    qn = tl.load(Q + q_row[:, None] + rdn[None, :], mask=t_ok[:, None] & (rdn[None, :] < DN),
                 other=0.0).to(KN.dtype.element_ty)
    qr = tl.load(Q + q_row[:, None] + DN + rdr[None, :], mask=t_ok[:, None] & (rdr[None, :] < DR),
                 other=0.0).to(KN.dtype.element_ty)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], dtype=tl.float32)
    for s0 in range(0, tl.minimum((pid + 1) * BLOCK_M, T), BLOCK_N):
        rs = s0 + tl.arange(0, BLOCK_N)
        s_ok = rs < T
        kv_row = (b * T + rs) * H + h
        kn = tl.load(KN + kv_row[:, None] * DN + rdn[None, :], mask=s_ok[:, None] & (rdn[None, :] < DN), other=0.0)
        kr = tl.load(KR + (b * T + rs)[:, None] * DR + rdr[None, :], mask=s_ok[:, None] & (rdr[None, :] < DR),
                     other=0.0).to(KN.dtype.element_ty)
        v = tl.load(V + kv_row[:, None] * DV + rdv[None, :], mask=s_ok[:, None] & (rdv[None, :] < DV), other=0.0)
        s = (tl.dot(qn, tl.trans(kn), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee")) * scale
        s = tl.where((rs[None, :] <= rt[:, None]) & s_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is causal for every row
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(V.dtype.element_ty), v, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    o_off = ((b * T + rt) * H + h)[:, None] * DV + rdv[None, :]
    o_mask = t_ok[:, None] & (rdv[None, :] < DV)
    tl.store(O_PRE + o_off, o, mask=o_mask)
    tl.store(LSE + (b * T + rt) * H + h, m_i + tl.log(l_i), mask=t_ok)
    if HAS_GATE:
        o = o * tl.sigmoid(tl.load(GATE + o_off, mask=o_mask, other=0.0).to(tl.float32))
    tl.store(OUT + o_off, o.to(OUT.dtype.element_ty), mask=o_mask)


@triton.jit
def mla_bwd_prep_kernel(DOUT, O_PRE, GATE, DO, DGATE, DELTA, n_rows, DV, BLOCK_R: tl.constexpr,
                        DV_PAD: tl.constexpr, HAS_GATE: tl.constexpr):
    """BLOCK_R rows (b, t, h) of the output: dgate = dOUT * O * sigmoid'(gate) and DO = dOUT * sigmoid(gate)
    (dOUT without a gate) in the dots' operand dtype, DELTA = rowsum(DO * O) (float32 [B,T,H]) from that rounded DO:
    the same DO as the backward's dots see, so dS = P (dO.V - DELTA) is exactly 0 where a query has one key."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rdv = tl.arange(0, DV_PAD)
    mask = (rows[:, None] < n_rows) & (rdv[None, :] < DV)
    off = rows[:, None] * DV + rdv[None, :]
    do = tl.load(DOUT + off, mask=mask, other=0.0).to(tl.float32)
    o = tl.load(O_PRE + off, mask=mask, other=0.0)
    if HAS_GATE:
        sg = tl.sigmoid(tl.load(GATE + off, mask=mask, other=0.0).to(tl.float32))
        tl.store(DGATE + off, (do * o * sg * (1.0 - sg)).to(DGATE.dtype.element_ty), mask=mask)
        do = do * sg
    do = do.to(DO.dtype.element_ty)
    tl.store(DO + off, do, mask=mask)
    tl.store(DELTA + rows, tl.sum(do.to(tl.float32) * o, axis=1), mask=rows < n_rows)


@triton.jit
def mla_attn_dkdv_kernel(Q, KN, KR, V, DO, LSE, DELTA, DKN, DKR_H, DVV, T, H, DN, DR, DV, scale,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DN_PAD: tl.constexpr, DR_PAD: tl.constexpr,
                         DV_PAD: tl.constexpr):
    """BLOCK_N keys of head h in batch b against every later query, BLOCK_M at a time: P = exp(S - LSE),
    dV = P^T dO, dS = P (dO V^T - DELTA), dK_nope = scale dS^T q_nope and this head's share of dk_rope,
    scale dS^T q_rope, accumulated in float32 from operands in KN's dtype: DKN [B,T,H,DN] and DVV [B,T,H,DV] in
    KN's dtype, DKR_H [B,T,H,DR] float32 (summed over heads next)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rs = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    s_ok = rs < T
    rdn = tl.arange(0, DN_PAD)
    rdr = tl.arange(0, DR_PAD)
    rdv = tl.arange(0, DV_PAD)
    kv_row = (b * T + rs) * H + h
    kn = tl.load(KN + kv_row[:, None] * DN + rdn[None, :], mask=s_ok[:, None] & (rdn[None, :] < DN), other=0.0)
    kr = tl.load(KR + (b * T + rs)[:, None] * DR + rdr[None, :], mask=s_ok[:, None] & (rdr[None, :] < DR),
                 other=0.0).to(KN.dtype.element_ty)
    v = tl.load(V + kv_row[:, None] * DV + rdv[None, :], mask=s_ok[:, None] & (rdv[None, :] < DV), other=0.0)
    dkn = tl.zeros([BLOCK_N, DN_PAD], dtype=tl.float32)
    dkr = tl.zeros([BLOCK_N, DR_PAD], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, DV_PAD], dtype=tl.float32)
    for t0 in range((pid * BLOCK_N // BLOCK_M) * BLOCK_M, T, BLOCK_M):
        rt = t0 + tl.arange(0, BLOCK_M)
        t_ok = rt < T
        row = (b * T + rt) * H + h
        qn = tl.load(Q + row[:, None] * (DN + DR) + rdn[None, :], mask=t_ok[:, None] & (rdn[None, :] < DN),
                     other=0.0).to(KN.dtype.element_ty)
        qr = tl.load(Q + row[:, None] * (DN + DR) + DN + rdr[None, :], mask=t_ok[:, None] & (rdr[None, :] < DR),
                     other=0.0).to(KN.dtype.element_ty)
        do = tl.load(DO + row[:, None] * DV + rdv[None, :], mask=t_ok[:, None] & (rdv[None, :] < DV),
                     other=0.0).to(KN.dtype.element_ty)
        lse = tl.load(LSE + row, mask=t_ok, other=0.0)
        delta = tl.load(DELTA + row, mask=t_ok, other=0.0)
        s = (tl.dot(qn, tl.trans(kn), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee")) * scale
        valid = (rs[None, :] <= rt[:, None]) & s_ok[None, :] & t_ok[:, None]
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision="ieee")
        ds = (p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])).to(qn.dtype)
        dkn += tl.dot(tl.trans(ds), qn, input_precision="ieee")
        dkr += tl.dot(tl.trans(ds), qr, input_precision="ieee")
    tl.store(DKN + kv_row[:, None] * DN + rdn[None, :], (dkn * scale).to(DKN.dtype.element_ty),
             mask=s_ok[:, None] & (rdn[None, :] < DN))
    tl.store(DKR_H + kv_row[:, None] * DR + rdr[None, :], dkr * scale, mask=s_ok[:, None] & (rdr[None, :] < DR))
    tl.store(DVV + kv_row[:, None] * DV + rdv[None, :], dv.to(DVV.dtype.element_ty),
             mask=s_ok[:, None] & (rdv[None, :] < DV))


@triton.jit
def mla_attn_dq_kernel(Q, KN, KR, V, DO, LSE, DELTA, DQ, T, H, DN, DR, DV, scale, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, DN_PAD: tl.constexpr, DR_PAD: tl.constexpr, DV_PAD: tl.constexpr):
    """BLOCK_M queries of head h in batch b over their causal keys: dq = scale dS [k_nope | k_rope], stored in
    DQ [B,T,H,DN+DR] (the input dtype)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rt = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    t_ok = rt < T
    rdn = tl.arange(0, DN_PAD)
    rdr = tl.arange(0, DR_PAD)
    rdv = tl.arange(0, DV_PAD)
    row = (b * T + rt) * H + h
    qn_mask = t_ok[:, None] & (rdn[None, :] < DN)
    qr_mask = t_ok[:, None] & (rdr[None, :] < DR)
    qn = tl.load(Q + row[:, None] * (DN + DR) + rdn[None, :], mask=qn_mask, other=0.0).to(KN.dtype.element_ty)
    qr = tl.load(Q + row[:, None] * (DN + DR) + DN + rdr[None, :], mask=qr_mask, other=0.0).to(KN.dtype.element_ty)
    do = tl.load(DO + row[:, None] * DV + rdv[None, :], mask=t_ok[:, None] & (rdv[None, :] < DV),
                 other=0.0).to(KN.dtype.element_ty)
    lse = tl.load(LSE + row, mask=t_ok, other=0.0)
    delta = tl.load(DELTA + row, mask=t_ok, other=0.0)
    dqn = tl.zeros([BLOCK_M, DN_PAD], dtype=tl.float32)
    dqr = tl.zeros([BLOCK_M, DR_PAD], dtype=tl.float32)
    for s0 in range(0, tl.minimum((pid + 1) * BLOCK_M, T), BLOCK_N):
        rs = s0 + tl.arange(0, BLOCK_N)
        s_ok = rs < T
        kv_row = (b * T + rs) * H + h
        kn = tl.load(KN + kv_row[:, None] * DN + rdn[None, :], mask=s_ok[:, None] & (rdn[None, :] < DN), other=0.0)
        kr = tl.load(KR + (b * T + rs)[:, None] * DR + rdr[None, :], mask=s_ok[:, None] & (rdr[None, :] < DR),
                     other=0.0).to(KN.dtype.element_ty)
        v = tl.load(V + kv_row[:, None] * DV + rdv[None, :], mask=s_ok[:, None] & (rdv[None, :] < DV), other=0.0)
        s = (tl.dot(qn, tl.trans(kn), input_precision="ieee") + tl.dot(qr, tl.trans(kr), input_precision="ieee")) * scale
        valid = (rs[None, :] <= rt[:, None]) & s_ok[None, :] & t_ok[:, None]
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        ds = (p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])).to(kn.dtype)
        dqn += tl.dot(ds, kn, input_precision="ieee")
        dqr += tl.dot(ds, kr, input_precision="ieee")
    tl.store(DQ + row[:, None] * (DN + DR) + rdn[None, :], (dqn * scale).to(DQ.dtype.element_ty), mask=qn_mask)
    tl.store(DQ + row[:, None] * (DN + DR) + DN + rdr[None, :], (dqr * scale).to(DQ.dtype.element_ty), mask=qr_mask)


@triton.jit
def mla_head_sum_kernel(SRC, DST, n_rows, H, D, BLOCK_R: tl.constexpr, D_PAD: tl.constexpr):
    """DST [n_rows, D] = sum over h of SRC [n_rows, H, D] (float32, in head order: deterministic), in DST's dtype:
    the rope key is every head's, so its gradient is the sum of the heads' shares."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    rd = tl.arange(0, D_PAD)
    mask = (rows[:, None] < n_rows) & (rd[None, :] < D)
    acc = tl.zeros([BLOCK_R, D_PAD], dtype=tl.float32)
    for h in range(0, H):
        acc += tl.load(SRC + (rows[:, None] * H + h) * D + rd[None, :], mask=mask, other=0.0)
    tl.store(DST + rows[:, None] * D + rd[None, :], acc.to(DST.dtype.element_ty), mask=mask)


def _pads(dn, dr, dv):
    """tl.dot needs every dimension of 16 or more: head dims padded to a power of two, at least 16."""
    return tuple(max(16, triton.next_power_of_2(d)) for d in (dn, dr, dv))


def _operand_dtype(x):
    """The dots' operand dtype: the input's (bfloat16/float16 run on tensor cores) or float32 (IEEE products)."""
    return x.dtype if DOT_DTYPE == "input" else torch.float32


def _expand(c_kv, w, m, h, r):
    """[B*T, H, D] in the operand dtype = c_kv [B*T, R] @ w[h]^T per head (w [H, D, R]), float32 accumulation."""
    d = w.shape[1]
    out = torch.empty(m, h, d, dtype=_operand_dtype(c_kv), device=c_kv.device)
    _matmul(c_kv, (r, 1, 0), w, (1, r, d * r), out, (h * d, 1, d), m, d, r, h)
    return out


class MLAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, c_kv, k_rope, w_uk, w_uv, gate, scale):
        q, c_kv, k_rope, w_uk, w_uv = (t.contiguous() for t in (q, c_kv, k_rope, w_uk, w_uv))
        gate = gate.contiguous() if gate is not None else None
        B, T, H, _ = q.shape
        R, DN, DV, DR = c_kv.shape[-1], w_uk.shape[1], w_uv.shape[1], k_rope.shape[-1]
        m = B * T
        k_nope, v = _expand(c_kv, w_uk, m, H, R), _expand(c_kv, w_uv, m, H, R)
        out = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
        o = torch.empty(B, T, H, DV, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
        if out.numel():
            mla_attn_fwd_kernel[(triton.cdiv(T, BLOCK_M), B * H)](
                q, k_nope, k_rope, v, gate if gate is not None else q, out, o, lse, T, H, DN, DR, DV, scale,
                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **dict(zip(("DN_PAD", "DR_PAD", "DV_PAD"), _pads(DN, DR, DV))),
                HAS_GATE=gate is not None, num_warps=NUM_WARPS)
        ctx.save_for_backward(q, c_kv, k_rope, w_uk, w_uv, gate, k_nope, v, o, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, c_kv, k_rope, w_uk, w_uv, gate, k_nope, v, o, lse = ctx.saved_tensors
        B, T, H, _ = q.shape
        R, DN, DV, DR = c_kv.shape[-1], w_uk.shape[1], w_uv.shape[1], k_rope.shape[-1]
        m = B * T
        pads = dict(zip(("DN_PAD", "DR_PAD", "DV_PAD"), _pads(DN, DR, DV)))
        f32 = {"dtype": torch.float32, "device": q.device}
        dq, dc_kv, dk_rope = torch.empty_like(q), torch.empty_like(c_kv), torch.empty_like(k_rope)
        dw_uk, dw_uv = torch.empty_like(w_uk), torch.empty_like(w_uv)
        dgate = torch.empty_like(gate) if gate is not None else None
        op = {"dtype": k_nope.dtype, "device": q.device}
        do, delta = torch.empty(B, T, H, DV, **op), torch.empty(B, T, H, **f32)
        dkn, dkr_h, dvv = torch.empty(m, H, DN, **op), torch.empty(m, H, DR, **f32), torch.empty(m, H, DV, **op)
        if q.numel():
            mla_bwd_prep_kernel[(triton.cdiv(m * H, BLOCK_M),)](
                dout.contiguous(), o, gate if gate is not None else o, do, dgate if dgate is not None else do,
                delta, m * H, DV, BLOCK_R=BLOCK_M, DV_PAD=pads["DV_PAD"], HAS_GATE=gate is not None,
                num_warps=NUM_WARPS)
            args = (q, k_nope, k_rope, v, do, lse, delta)
            mla_attn_dkdv_kernel[(triton.cdiv(T, BLOCK_N), B * H)](
                *args, dkn, dkr_h, dvv, T, H, DN, DR, DV, ctx.scale, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **pads,
                num_warps=target_settings(q.device)["dkdv_num_warps"])
            mla_attn_dq_kernel[(triton.cdiv(T, BLOCK_M), B * H)](
                *args, dq, T, H, DN, DR, DV, ctx.scale, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **pads,
                num_warps=NUM_WARPS)
            mla_head_sum_kernel[(triton.cdiv(m, BLOCK_M),)](dkr_h, dk_rope, m, H, DR, BLOCK_R=BLOCK_M,
                                                            D_PAD=pads["DR_PAD"], num_warps=NUM_WARPS)
        # the latent's gradient through both up-projections, then each projection's own: every head at once
        dc_part = torch.empty(m, R, **f32)
        _matmul(dkn, (H * DN, 1, 0), w_uk, (R, 1, 0), dc_part, (R, 1, 0), m, R, H * DN, 1)
        _matmul(dvv, (H * DV, 1, 0), w_uv, (R, 1, 0), dc_kv, (R, 1, 0), m, R, H * DV, 1, add=dc_part)
        _matmul(dkn, (1, H * DN, DN), c_kv, (R, 1, 0), dw_uk, (R, 1, DN * R), DN, R, m, H)
        _matmul(dvv, (1, H * DV, DV), c_kv, (R, 1, 0), dw_uv, (R, 1, DV * R), DV, R, m, H)
        return dq, dc_kv, dk_rope, dw_uk, dw_uv, dgate, None


def run(q, c_kv, k_rope, w_uk, w_uv, gate, scale):
    """q [B,T,H,DN+DR], c_kv [B,T,R], k_rope [B,T,DR], w_uk [H,DN,R], w_uv [H,DV,R] (float32/float16/bfloat16),
    gate [B,T,H,DV] or None, scale float -> out [B,T,H,DV] in q.dtype."""
    return MLAFunction.apply(q, c_kv, k_rope, w_uk, w_uv, gate, scale)
