"""attnres candidate rendered from templates/attnres/d_tiled.py.j2.

one program per token walking D in [L, TILE_D] tiles; two or three passes over the sources forward, up to three backward
params: TILE_D=512, num_warps=4, BWD_PROGRAMS=256
"""
import torch
import triton
import triton.language as tl

BLOCK = "attnres"
TEMPLATE = "d_tiled"
TILE_D = 512
BWD_PROGRAMS = 256
MIN_TOKENS_PER_PROGRAM = 4  # a backward program's partial row is amortized over at least this many tokens


@triton.jit
def attnres_fwd_kernel(V, Q, KW, OW, H, P, P32, RSTD, ORSTD, L, N, D, stride_l, eps, scale,
                       BLOCK_L: tl.constexpr, TILE_D: tl.constexpr, HAS_OUT_NORM: tl.constexpr,
                       NORM_VALUES: tl.constexpr):
    """One token per program, the D axis walked in [BLOCK_L, TILE_D] tiles. Pass 1: sum(v^2) and v . (kw * q) per
    source -> rstd, logits, p. Pass 2: u = sum_i p_i v_i, stored as h (or, with the output norm, only sum(u^2);
    pass 3 then recomputes u and stores u * orstd * ow). V [L, N, D] (stride_l = N * D), Q, KW, OW [D];
    writes H [N, D], P [L, N] (input dtype) and P32, RSTD [L, N], ORSTD [N] (float32) for the backward pass.
    NORM_VALUES: u = sum_i p_i rstd_i v_i (the RMS-normalised sources)."""
    tok = tl.program_id(0).to(tl.int64)
    ls = tl.arange(0, BLOCK_L)
    lmask = ls < L
    base = ls[:, None].to(tl.int64) * stride_l + tok * D
    sumsq = tl.zeros((BLOCK_L,), dtype=tl.float32)
    vc = tl.zeros((BLOCK_L,), dtype=tl.float32)
    for start in range(0, D, TILE_D):
        cols = start + tl.arange(0, TILE_D)
        cmask = cols < D
        v = tl.load(V + base + cols[None, :], mask=lmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        c = tl.load(KW + cols, mask=cmask, other=0.0).to(tl.float32) * tl.load(Q + cols, mask=cmask, other=0.0).to(
            tl.float32)
        sumsq += tl.sum(v * v, axis=1)
        vc += tl.sum(v * c[None, :], axis=1)
    rstd = 1.0 / tl.sqrt(sumsq / D + eps)
    logits = tl.where(lmask, vc * rstd * scale, float("-inf"))
    e = tl.exp(logits - tl.max(logits, axis=0))
    p = e / tl.sum(e, axis=0)
    pv = p * rstd if NORM_VALUES else p  # the weight of each raw source in u
    usq = tl.zeros((TILE_D,), dtype=tl.float32)
    for start in range(0, D, TILE_D):
        cols = start + tl.arange(0, TILE_D)
        cmask = cols < D
        v = tl.load(V + base + cols[None, :], mask=lmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        u = tl.sum(v * pv[:, None], axis=0)
        if HAS_OUT_NORM:
            usq += u * u
        else:
            tl.store(H + tok * D + cols, u.to(H.dtype.element_ty), mask=cmask)
    if HAS_OUT_NORM:
        orstd = 1.0 / tl.sqrt(tl.sum(usq, axis=0) / D + eps)
        tl.store(ORSTD + tok, orstd)
        for start in range(0, D, TILE_D):
            cols = start + tl.arange(0, TILE_D)
            cmask = cols < D
            v = tl.load(V + base + cols[None, :], mask=lmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            ow = tl.load(OW + cols, mask=cmask, other=0.0).to(tl.float32)
            u = tl.sum(v * pv[:, None], axis=0)
            tl.store(H + tok * D + cols, (u * orstd * ow).to(H.dtype.element_ty), mask=cmask)
    poffs = ls.to(tl.int64) * N + tok
    tl.store(P + poffs, p.to(P.dtype.element_ty), mask=lmask)
    tl.store(P32 + poffs, p, mask=lmask)
    tl.store(RSTD + poffs, rstd, mask=lmask)


@triton.jit
def attnres_bwd_kernel(V, Q, KW, OW, P32, RSTD, ORSTD, DH, DP, DV, PART_B, PART_OW, L, N, D, stride_l, scale,
                       tokens_per_program, BLOCK_L: tl.constexpr, TILE_D: tl.constexpr, HAS_OUT_NORM: tl.constexpr,
                       NORM_VALUES: tl.constexpr):
    """Each program takes a contiguous token range; per token, D in TILE_D tiles:
    [with the output norm, pass A: m = sum(uhat * ow * dh), u recomputed from v and p]
    pass B: du = dh (or orstd * (ow * dh - uhat * m / D)), dp_i = v_i . du + dP_i, vc_i = v_i . (kw * q);
            d out_weight partial += dh * uhat;
    pass C: a_i = scale * p_i (dp_i - p . dp), dv_i = p_i du + a_i rstd_i (c - xhat_i rstd_i vc_i / D),
            partial B += sum_i a_i xhat_i (dq = kw * B, dkw = q * B).
    NORM_VALUES (values v_i rstd_i): u's weights are p_i rstd_i, dp_i = rstd_i w_i + dP_i with w_i = v_i . du, and
    dv_i gains - p_i rstd_i^3 w_i v_i / D.
    Partials accumulate in the program's own row of PART_B / PART_OW [programs, D] (float32, zero-initialized; reduced
    by attnres_bwd_reduce_kernel in a fixed order: deterministic)."""
    pid = tl.program_id(0)
    ls = tl.arange(0, BLOCK_L)
    lmask = ls < L
    part = pid.to(tl.int64) * D
    tok_start = pid * tokens_per_program
    tok_end = tl.minimum(tok_start + tokens_per_program, N)
    for t in range(tok_start, tok_end):
        tok = tl.cast(t, tl.int64)
        base = ls[:, None].to(tl.int64) * stride_l + tok * D
        poffs = ls.to(tl.int64) * N + tok
        p = tl.load(P32 + poffs, mask=lmask, other=0.0)
        rstd = tl.load(RSTD + poffs, mask=lmask, other=0.0)
        dpo = tl.load(DP + poffs, mask=lmask, other=0.0).to(tl.float32)
        pv = p * rstd if NORM_VALUES else p
        m = 0.0
        orstd = 1.0
        if HAS_OUT_NORM:
            orstd = tl.load(ORSTD + tok)
            macc = tl.zeros((TILE_D,), dtype=tl.float32)
            for start in range(0, D, TILE_D):
                cols = start + tl.arange(0, TILE_D)
                cmask = cols < D
                v = tl.load(V + base + cols[None, :], mask=lmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
                dh = tl.load(DH + tok * D + cols, mask=cmask, other=0.0).to(tl.float32)
                ow = tl.load(OW + cols, mask=cmask, other=0.0).to(tl.float32)
                macc += tl.sum(v * pv[:, None], axis=0) * orstd * ow * dh
            m = tl.sum(macc, axis=0) / D
        w = tl.zeros((BLOCK_L,), dtype=tl.float32)
        vc = tl.zeros((BLOCK_L,), dtype=tl.float32)
        for start in range(0, D, TILE_D):
            cols = start + tl.arange(0, TILE_D)
            cmask = cols < D
            v = tl.load(V + base + cols[None, :], mask=lmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            dh = tl.load(DH + tok * D + cols, mask=cmask, other=0.0).to(tl.float32)
            c = tl.load(KW + cols, mask=cmask, other=0.0).to(tl.float32) * tl.load(Q + cols, mask=cmask,
                                                                                   other=0.0).to(tl.float32)
            if HAS_OUT_NORM:
                ow = tl.load(OW + cols, mask=cmask, other=0.0).to(tl.float32)
                uhat = tl.sum(v * pv[:, None], axis=0) * orstd
                du = orstd * (ow * dh - uhat * m)
                tl.store(PART_OW + part + cols, tl.load(PART_OW + part + cols, mask=cmask, other=0.0) + dh * uhat,
                         mask=cmask)
            else:
                du = dh
            w += tl.sum(v * du[None, :], axis=1)
            vc += tl.sum(v * c[None, :], axis=1)
        dp = (rstd * w if NORM_VALUES else w) + dpo
        a = p * (dp - tl.sum(p * dp, axis=0)) * scale
        coef = a * rstd
        xc = rstd * rstd * vc / D
        for start in range(0, D, TILE_D):
            cols = start + tl.arange(0, TILE_D)
            cmask = cols < D
            m2 = lmask[:, None] & cmask[None, :]
            v = tl.load(V + base + cols[None, :], mask=m2, other=0.0).to(tl.float32)
            dh = tl.load(DH + tok * D + cols, mask=cmask, other=0.0).to(tl.float32)
            c = tl.load(KW + cols, mask=cmask, other=0.0).to(tl.float32) * tl.load(Q + cols, mask=cmask,
                                                                                   other=0.0).to(tl.float32)
            if HAS_OUT_NORM:
                ow = tl.load(OW + cols, mask=cmask, other=0.0).to(tl.float32)
                uhat = tl.sum(v * pv[:, None], axis=0) * orstd
                du = orstd * (ow * dh - uhat * m)
            else:
                du = dh
            dv = pv[:, None] * du[None, :] + coef[:, None] * (c[None, :] - v * xc[:, None])
            if NORM_VALUES:
                dv -= (pv * rstd * rstd * w / D)[:, None] * v
            tl.store(DV + base + cols[None, :], dv.to(DV.dtype.element_ty), mask=m2)
            b = tl.sum(coef[:, None] * v, axis=0)  # sum_i a_i xhat_i
            tl.store(PART_B + part + cols, tl.load(PART_B + part + cols, mask=cmask, other=0.0) + b, mask=cmask)


@triton.jit
def attnres_bwd_reduce_kernel(PART_B, PART_OW, Q, KW, DQ, DKW, DOW, n_parts, D, TILE_D: tl.constexpr,
                              HAS_OUT_NORM: tl.constexpr):
    """Sums the [n_parts, D] partials in a fixed order over TILE_D columns: dq = kw * B, dkw = q * B,
    dow = sum of the PART_OW rows; each stored in its parameter's dtype."""
    cols = tl.program_id(0).to(tl.int64) * TILE_D + tl.arange(0, TILE_D)
    cmask = cols < D
    acc_b = tl.zeros((TILE_D,), dtype=tl.float32)
    acc_ow = tl.zeros((TILE_D,), dtype=tl.float32)
    for i in range(0, n_parts):
        row = tl.cast(i, tl.int64) * D
        acc_b += tl.load(PART_B + row + cols, mask=cmask, other=0.0)
        if HAS_OUT_NORM:
            acc_ow += tl.load(PART_OW + row + cols, mask=cmask, other=0.0)
    q = tl.load(Q + cols, mask=cmask, other=0.0).to(tl.float32)
    kw = tl.load(KW + cols, mask=cmask, other=0.0).to(tl.float32)
    tl.store(DQ + cols, (kw * acc_b).to(DQ.dtype.element_ty), mask=cmask)
    tl.store(DKW + cols, (q * acc_b).to(DKW.dtype.element_ty), mask=cmask)
    if HAS_OUT_NORM:
        tl.store(DOW + cols, acc_ow.to(DOW.dtype.element_ty), mask=cmask)


class AttnResFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sources, query, key_weight, out_weight, eps, scale, normalized_values):
        n_src, n, d = sources.shape
        v = sources.contiguous()
        query, key_weight = query.contiguous(), key_weight.contiguous()
        has_norm = out_weight is not None
        ow = out_weight.contiguous() if has_norm else key_weight  # placeholder: never read without the norm
        h = torch.empty(n, d, dtype=sources.dtype, device=sources.device)
        p = torch.empty(n_src, n, dtype=sources.dtype, device=sources.device)
        p32 = torch.empty(n_src, n, dtype=torch.float32, device=sources.device)
        rstd = torch.empty(n_src, n, dtype=torch.float32, device=sources.device)
        orstd = torch.empty(n, dtype=torch.float32, device=sources.device)
        block_l = max(2, triton.next_power_of_2(n_src))
        if n > 0 and d > 0:
            attnres_fwd_kernel[(n,)](v, query, key_weight, ow, h, p, p32, rstd, orstd, n_src, n, d, n * d, eps, scale,
                                     BLOCK_L=block_l, TILE_D=TILE_D, HAS_OUT_NORM=has_norm,
                                     NORM_VALUES=bool(normalized_values), num_warps=4)
        ctx.save_for_backward(v, query, key_weight, ow, p32, rstd, orstd)
        ctx.has_norm, ctx.scale, ctx.block_l, ctx.norm_values = has_norm, scale, block_l, bool(normalized_values)
        return h, p

    @staticmethod
    def backward(ctx, dh, dp):
        v, query, key_weight, ow, p32, rstd, orstd = ctx.saved_tensors
        n_src, n, d = v.shape
        dh = dh.contiguous()
        dp = dp.contiguous()
        dv = torch.empty_like(v)
        dq = torch.empty_like(query)
        dkw = torch.empty_like(key_weight)
        dow = torch.empty_like(ow) if ctx.has_norm else None
        programs = max(1, min(triton.cdiv(n, MIN_TOKENS_PER_PROGRAM), BWD_PROGRAMS))
        tokens_per_program = triton.cdiv(n, programs)
        # zero-initialized: each program adds its tokens' contributions into its own row
        part_b = torch.zeros(programs, d, dtype=torch.float32, device=v.device)
        part_ow = torch.zeros(programs, d, dtype=torch.float32, device=v.device) if ctx.has_norm else part_b
        if n > 0 and d > 0:
            attnres_bwd_kernel[(programs,)](v, query, key_weight, ow, p32, rstd, orstd, dh, dp, dv, part_b, part_ow,
                                            n_src, n, d, n * d, ctx.scale, tokens_per_program,
                                            BLOCK_L=ctx.block_l, TILE_D=TILE_D, HAS_OUT_NORM=ctx.has_norm,
                                            NORM_VALUES=ctx.norm_values, num_warps=4)
        if d > 0:
            attnres_bwd_reduce_kernel[(triton.cdiv(d, TILE_D),)](
                part_b, part_ow, query, key_weight, dq, dkw, dow if ctx.has_norm else dkw, programs, d,
                TILE_D=TILE_D, HAS_OUT_NORM=ctx.has_norm, num_warps=4)
        return dv, dq, dkw, dow, None, None, None


def run(sources, query, key_weight, out_weight, eps, scale, normalized_values=False):
    """sources [L, N, D], query / key_weight [D], out_weight [D] or None, all float32/float16/bfloat16;
    normalized_values: mix the RMS-normalised sources -> (h [N, D], p [L, N]) in sources.dtype."""
    return AttnResFunction.apply(sources, query, key_weight, out_weight, eps, scale, normalized_values)
