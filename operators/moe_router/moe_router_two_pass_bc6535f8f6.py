"""moe_router candidate rendered from templates/moe_router/two_pass.py.j2.

two passes - a tiled float32 logits GEMM, then one routing program per ROUTE_T tokens doing k rounds of argmax
params: BLOCK_T=32, BLOCK_E=32, BLOCK_D=32, ROUTE_T=8, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "moe_router"
TEMPLATE = "two_pass"
BLOCK_T = 32
BLOCK_E = 32
BLOCK_D = 32
ROUTE_T = 8
RENORM_EPS = tl.constexpr(1e-20)  # read inside the kernels: a GPU compile accepts only constexpr globals
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'num_warps': 8}, 'sm_90a': {'num_warps': 8}}


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
# The router's products are float32 (its logits decide which experts run): float32-accurate on the tensor cores
# through split operands, 3xTF32 on NVIDIA and 6xBF16 on AMD; the interpreter multiplies in float32 itself.
LAUNCH_SETTINGS = {
    "default": {"num_warps": 4},
    "interpreter": {"DOT": "ieee"},
    "cuda": {"DOT": "tf32x3"},
    "hip": {"DOT": "bf16x6"},
}


SCORES = ("sigmoid", "softmax", "sqrtsoftplus")  # the SCORE constexpr of the kernels: an index into these


@triton.jit
def _log1p(w):
    """log(1 + w) for float32 w >= 0, accurate where 1 + w rounds (Goldberg's form)."""
    u = 1.0 + w
    return tl.where(u == 1.0, w, tl.log(u) * w / (u - 1.0))


@triton.jit
def _elementwise_score(z, SCORE: tl.constexpr):
    """The score of float32 logits z, elementwise: sigmoid (SCORE 0) or DeepSeek-V4's sqrt(softplus(z)) (SCORE 2,
    softplus as max(z, 0) + log1p(exp(-|z|)))."""
    if SCORE == 2:
        return tl.sqrt(tl.maximum(z, 0.0) + _log1p(tl.exp(-tl.abs(z))))
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _elementwise_score_grad(z, s, SCORE: tl.constexpr):
    """ds/dz of an elementwise score s = _elementwise_score(z): s (1 - s) for sigmoid; sigmoid(z) / (2 s) for
    sqrt(softplus), 0 where s underflowed to 0."""
    if SCORE == 2:
        return tl.where(s > 0, 1.0 / (1.0 + tl.exp(-z)) / (2.0 * tl.where(s > 0, s, 1.0)), 0.0)
    return s * (1.0 - s)


@triton.jit
def _kept_groups(sel, e, emask, E, n_group, topk_group, ROUTE_T: tl.constexpr, E_PAD: tl.constexpr):
    """sel [ROUTE_T, E_PAD] float32 selection scores (columns past E masked out by emask) -> [ROUTE_T, E_PAD] bool:
    the experts of the topk_group groups (of n_group contiguous ones) whose two best sel sum highest (DeepSeek-V3's
    noaux_tc; the lowest group wins a tie). Each expert column first holds its group's score, then topk_group rounds
    of an int64 max over packed keys (float bits high, E_PAD - group low) keep one group each."""
    group = e[None, :] // (E // n_group)
    packed = tl.where(emask, (_order_key(sel) << 32) | (E_PAD - 1 - e[None, :]).to(tl.int64), -(2**62))
    group_score = tl.full((ROUTE_T, E_PAD), 0, tl.float32)
    for gi in range(0, n_group):
        member = emask & (group == gi)
        best = tl.max(tl.where(member, packed, -(2**62)), axis=1)
        first = (E_PAD - 1) - (best & 0xFFFFFFFF)
        top1 = tl.max(tl.where(member, sel, float("-inf")), axis=1)
        top2 = tl.max(tl.where(member & (e[None, :] != first[:, None]), sel, float("-inf")), axis=1)
        group_score = tl.where(group == gi, (top1 + top2)[:, None], group_score)
    gpacked = tl.where(emask, (_order_key(group_score) << 32) | (E_PAD - group).to(tl.int64), -(2**62))
    kept = tl.full((ROUTE_T, E_PAD), 0, tl.int1)
    for _ in range(0, topk_group):
        best = tl.max(gpacked, axis=1)
        hit = group == (E_PAD - (best & 0xFFFFFFFF))[:, None]
        kept = kept | hit
        gpacked = tl.where(hit, -(2**62), gpacked)
    return kept & emask


@triton.jit
def _order_key(v):
    """float32 -> int64 whose signed order is the float's (its bits, the negative ones flipped)."""
    bits = v.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def moe_router_logits_fwd_kernel(X, W, L, N, E, D, stride_x, stride_w,
                                 BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                                 DOT: tl.constexpr):
    """X [N, D], W [E, D] (any float dtype, last dim contiguous) -> L [N, E] float32 logits for one
    BLOCK_T x BLOCK_E tile; both operands are upcast and multiplied in IEEE float32 (no TF32: routing needs it)."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    e = tl.program_id(1).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    acc = tl.full((BLOCK_T, BLOCK_E), 0, tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        xt = tl.load(X + t[:, None] * stride_x + d[None, :], mask=(t[:, None] < N) & (d[None, :] < D), other=0.0)
        wt = tl.load(W + e[None, :] * stride_w + d[:, None], mask=(e[None, :] < E) & (d[:, None] < D), other=0.0)
        acc = tl.dot(xt.to(tl.float32), wt.to(tl.float32), acc, input_precision=DOT)
    tl.store(L + t[:, None] * E + e[None, :], acc, mask=(t[:, None] < N) & (e[None, :] < E))


@triton.jit
def _route_scores(z, emask, E, norm_lambda, SCORE: tl.constexpr, NORM: tl.constexpr):
    """z [R, E_PAD] float32 logits (columns past E masked out by emask) -> (s, u, std, shift, denom): the scores s;
    for the Skywork normalization the standardized logits u = (z - mean) / std and the unbiased std per row; for
    softmax the row max and the sum of exponentials, so that any single score can be recomputed from its logit."""
    u = z
    std = tl.full((z.shape[0],), 1.0, tl.float32)
    mean = tl.full((z.shape[0],), 0, tl.float32)
    if NORM:
        mean = tl.sum(tl.where(emask, z, 0.0), axis=1) / E
        c = tl.where(emask, z - mean[:, None], 0.0)
        std = tl.sqrt(tl.sum(c * c, axis=1) / (E - 1))
        std = tl.where(std > 0, std, 1.0)  # only padding rows (all zero) get here; keeps them finite
        u = c / std[:, None]
        z = u * norm_lambda
    shift = tl.full((z.shape[0],), 0, tl.float32)
    denom = tl.full((z.shape[0],), 1.0, tl.float32)
    if SCORE == 1:
        zz = tl.where(emask, z, float("-inf"))
        shift = tl.max(zz, axis=1)
        p = tl.exp(zz - shift[:, None])
        denom = tl.sum(p, axis=1)
        s = p / denom[:, None]
    else:
        s = _elementwise_score(z, SCORE)
    return s, u, mean, std, shift, denom


@triton.jit
def moe_router_route_fwd_kernel(L, BIAS, WOUT, IDS, COUNTS, N, E, k, norm_lambda, route_scale, n_group, topk_group,
                                SCORE: tl.constexpr, NORM: tl.constexpr, RENORM: tl.constexpr,
                                GROUPED: tl.constexpr, ROUTE_T: tl.constexpr, E_PAD: tl.constexpr,
                                K_PAD: tl.constexpr):
    """ROUTE_T tokens per program, the whole expert row in registers: scores from the float32 logits L [N, E],
    then k rounds of argmax over s + bias, each one int64 max over packed keys (order-preserving bits of the
    float32 score in the high word, E_PAD - 1 - e in the low word: the lowest index wins a tie) that then masks its
    winner; GROUPED: only among the experts of the kept groups. The winner's score is recomputed from its logit in
    L. Writes WOUT [N, k] (renormalized, scaled), IDS [N, k] int64 in selection order, and adds the winners to
    COUNTS [E] (integer atomics: the order of the adds cannot change a count)."""
    t = tl.program_id(0).to(tl.int64) * ROUTE_T + tl.arange(0, ROUTE_T)
    e = tl.arange(0, E_PAD)
    tmask = t < N
    emask = e[None, :] < E
    z = tl.load(L + t[:, None] * E + e[None, :], mask=tmask[:, None] & emask, other=0.0)
    s, u, mean, std, shift, denom = _route_scores(z, emask, E, norm_lambda, SCORE, NORM)
    b = tl.load(BIAS + e, mask=e < E, other=0.0).to(tl.float32)
    sel = s + b[None, :]
    allowed = emask
    if GROUPED:
        allowed = _kept_groups(sel, e, emask, E, n_group, topk_group, ROUTE_T, E_PAD)
    packed = tl.where(allowed, (_order_key(sel) << 32) | (E_PAD - 1 - e[None, :]).to(tl.int64), -(2**62))
    kcol = tl.arange(0, K_PAD)[None, :]
    picked = tl.full((ROUTE_T, K_PAD), 0, tl.float32)
    ids = tl.full((ROUTE_T, K_PAD), 0, tl.int64)
    for j in range(0, k):
        best = tl.max(packed, axis=1)
        idx = (E_PAD - 1) - (best & 0xFFFFFFFF)
        packed = tl.where(e[None, :] == idx[:, None], -(2**62), packed)
        zj = tl.load(L + t * E + idx, mask=tmask, other=0.0)
        if NORM:
            zj = (zj - mean) / std * norm_lambda
        if SCORE == 1:
            sj = tl.exp(zj - shift) / denom
        else:
            sj = _elementwise_score(zj, SCORE)
        picked = tl.where(kcol == j, sj[:, None], picked)
        ids = tl.where(kcol == j, idx[:, None], ids)
        tl.atomic_add(COUNTS + idx, 1, mask=tmask)
    if RENORM:
        picked = picked / (tl.sum(picked, axis=1)[:, None] + RENORM_EPS)
    out_mask = tmask[:, None] & (kcol < k)
    tl.store(WOUT + t[:, None] * k + kcol, picked * route_scale, mask=out_mask)
    tl.store(IDS + t[:, None] * k + kcol, ids, mask=out_mask)


@triton.jit
def moe_router_route_bwd_kernel(L, IDS, DW, DL, N, E, k, norm_lambda, route_scale,
                                SCORE: tl.constexpr, NORM: tl.constexpr, RENORM: tl.constexpr,
                                ROUTE_T: tl.constexpr, E_PAD: tl.constexpr):
    """Gradient of the logits DL [N, E] float32 from DW [N, k] (gradient of the routing weights): through the
    renormalization (g_j = c * (dw_j - sum_i dw_i s_i / S) / S, S = sum_i s_i + eps), the score function
    (sigmoid: g s (1 - s); softmax: s (g - sum g s); sqrt(softplus): g sigmoid(z) / (2 s)) and the Skywork
    normalization
    (lambda / std * (dz - mean dz - u sum(dz u) / (E - 1)))."""
    t = tl.program_id(0).to(tl.int64) * ROUTE_T + tl.arange(0, ROUTE_T)
    e = tl.arange(0, E_PAD)
    tmask = t < N
    emask = e[None, :] < E
    z = tl.load(L + t[:, None] * E + e[None, :], mask=tmask[:, None] & emask, other=0.0)
    s, u, mean, std, shift, denom = _route_scores(z, emask, E, norm_lambda, SCORE, NORM)
    chosen = tl.full((ROUTE_T, E_PAD), 0, tl.int1)
    dw_dense = tl.full((ROUTE_T, E_PAD), 0, tl.float32)  # dw scattered to the chosen experts
    for j in range(0, k):
        idx = tl.load(IDS + t * k + j, mask=tmask, other=0)
        dw = tl.load(DW + t * k + j, mask=tmask, other=0.0).to(tl.float32)
        hit = e[None, :] == idx[:, None]
        chosen = chosen | hit
        dw_dense = tl.where(hit, dw[:, None], dw_dense)
    if RENORM:
        den = tl.sum(tl.where(chosen, s, 0.0), axis=1) + RENORM_EPS
        dot = tl.sum(dw_dense * s, axis=1)
        g = tl.where(chosen, route_scale * (dw_dense / den[:, None] - (dot / (den * den))[:, None]), 0.0)
    else:
        g = route_scale * dw_dense
    if SCORE == 1:
        dz = s * (g - tl.sum(g * s, axis=1)[:, None])
    else:  # the score's own input: the logits, standardized and scaled where NORM
        dz = g * _elementwise_score_grad(u * norm_lambda if NORM else z, s, SCORE)
    if NORM:
        dz = tl.where(emask, dz, 0.0)
        mean_dz = tl.sum(dz, axis=1) / E
        proj = tl.sum(dz * u, axis=1) / (E - 1)
        dz = (norm_lambda / std)[:, None] * (dz - mean_dz[:, None] - u * proj[:, None])
    tl.store(DL + t[:, None] * E + e[None, :], dz, mask=tmask[:, None] & emask)


@triton.jit
def moe_router_dx_bwd_kernel(DL, W, DX, N, E, D, stride_w, stride_dx,
                             BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr):
    """DX [N, D] = DL [N, E] (float32) @ W [E, D], IEEE float32 dot, stored in DX's dtype."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.full((BLOCK_T, BLOCK_D), 0, tl.float32)
    for e0 in range(0, E, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        dl = tl.load(DL + t[:, None] * E + e[None, :], mask=(t[:, None] < N) & (e[None, :] < E), other=0.0)
        w = tl.load(W + e[:, None] * stride_w + d[None, :], mask=(e[:, None] < E) & (d[None, :] < D), other=0.0)
        acc = tl.dot(dl, w.to(tl.float32), acc, input_precision=DOT)
    tl.store(DX + t[:, None] * stride_dx + d[None, :], acc.to(DX.dtype.element_ty),
             mask=(t[:, None] < N) & (d[None, :] < D))


@triton.jit
def moe_router_dw_bwd_kernel(DL, X, DWT, N, E, D, stride_x, stride_dw,
                             BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr):
    """DWT [E, D] = DL^T [E, N] @ X [N, D]: one program per (expert tile, column tile) walks all tokens in order,
    so the sum is deterministic; zeros when N == 0."""
    e = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.full((BLOCK_E, BLOCK_D), 0, tl.float32)
    for t0 in range(0, N, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        dl = tl.load(DL + t[None, :] * E + e[:, None], mask=(t[None, :] < N) & (e[:, None] < E), other=0.0)
        x = tl.load(X + t[:, None] * stride_x + d[None, :], mask=(t[:, None] < N) & (d[None, :] < D), other=0.0)
        acc = tl.dot(dl, x.to(tl.float32), acc, input_precision=DOT)
    tl.store(DWT + e[:, None] * stride_dw + d[None, :], acc.to(DWT.dtype.element_ty),
             mask=(e[:, None] < E) & (d[None, :] < D))


def _mode(score_func, norm_lambda, renormalize):
    if score_func not in SCORES:
        raise ValueError(f"score_func must be 'sigmoid', 'softmax' or 'sqrtsoftplus', got {score_func!r}")
    return {"SCORE": SCORES.index(score_func), "NORM": norm_lambda is not None, "RENORM": bool(renormalize)}


def _check_groups(experts, topk, n_group, topk_group):
    if n_group != 1 and (n_group < 1 or experts % n_group or experts // n_group < 2
                         or not 1 <= topk_group <= n_group or topk > topk_group * (experts // n_group)):
        raise ValueError(f"group-limited routing needs E % n_group == 0, E / n_group >= 2, 1 <= topk_group <= "
                         f"n_group and k <= topk_group * E / n_group; got E={experts}, k={topk}, n_group={n_group}, "
                         f"topk_group={topk_group}")


class MoERouterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, topk, score_func, norm_lambda, renormalize, route_scale, n_group, topk_group):
        n, d = x.shape
        e = weight.shape[0]
        _check_groups(e, topk, n_group, topk_group)
        groups = {"n_group": n_group, "topk_group": topk_group, "GROUPED": n_group > 1}
        x_c = x if x.stride(-1) == 1 else x.contiguous()
        w_c = weight if weight.stride(-1) == 1 else weight.contiguous()
        b_c = bias.contiguous()
        mode = _mode(score_func, norm_lambda, renormalize)
        lam = 1.0 if norm_lambda is None else float(norm_lambda)
        out_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        logits = torch.empty(n, e, dtype=torch.float32, device=x.device)
        weights = torch.empty(n, topk, dtype=out_dtype, device=x.device)
        ids = torch.empty(n, topk, dtype=torch.int64, device=x.device)
        counts = torch.zeros(e, dtype=torch.int64, device=x.device)
        e_pad = triton.next_power_of_2(e)
        settings = target_settings(x.device)
        if n > 0:
            moe_router_logits_fwd_kernel[(triton.cdiv(n, BLOCK_T), triton.cdiv(e, BLOCK_E))](
                x_c, w_c, logits, n, e, d, x_c.stride(0), w_c.stride(0),
                BLOCK_T=BLOCK_T, BLOCK_E=BLOCK_E, BLOCK_D=BLOCK_D, DOT=settings["DOT"],
                num_warps=settings["num_warps"])
        # at least one program, so that counts are produced by a kernel even without tokens (they stay zero)
        moe_router_route_fwd_kernel[(max(1, triton.cdiv(n, ROUTE_T)),)](
            logits, b_c, weights, ids, counts, n, e, topk, lam, float(route_scale), **groups, **mode,
            ROUTE_T=ROUTE_T, E_PAD=e_pad, K_PAD=triton.next_power_of_2(topk), num_warps=settings["num_warps"])
        ctx.save_for_backward(x_c, w_c, logits, ids)
        ctx.cfg = (topk, mode, lam, float(route_scale), x.shape, weight.shape)
        ctx.mark_non_differentiable(ids, counts)
        return weights, ids, counts

    @staticmethod
    def backward(ctx, dweights, _dids, _dcounts):
        x_c, w_c, logits, ids = ctx.saved_tensors
        topk, mode, lam, route_scale, x_shape, w_shape = ctx.cfg
        n, d = x_c.shape
        e = w_c.shape[0]
        dx = torch.empty(n, d, dtype=x_c.dtype, device=x_c.device)
        dweight = torch.empty(e, d, dtype=w_c.dtype, device=w_c.device)
        dl = torch.empty(n, e, dtype=torch.float32, device=x_c.device)
        settings = target_settings(x_c.device)
        if n > 0:
            dw_c = dweights.contiguous() if dweights is not None else torch.zeros(n, topk, device=x_c.device)
            moe_router_route_bwd_kernel[(triton.cdiv(n, ROUTE_T),)](
                logits, ids, dw_c, dl, n, e, topk, lam, route_scale, **mode,
                ROUTE_T=ROUTE_T, E_PAD=triton.next_power_of_2(e), num_warps=settings["num_warps"])
            moe_router_dx_bwd_kernel[(triton.cdiv(n, BLOCK_T), triton.cdiv(d, BLOCK_D))](
                dl, w_c, dx, n, e, d, w_c.stride(0), dx.stride(0),
                BLOCK_T=BLOCK_T, BLOCK_E=BLOCK_E, BLOCK_D=BLOCK_D, DOT=settings["DOT"],
                num_warps=settings["num_warps"])
        if e * d > 0:
            moe_router_dw_bwd_kernel[(triton.cdiv(e, BLOCK_E), triton.cdiv(d, BLOCK_D))](
                dl, x_c, dweight, n, e, d, x_c.stride(0), dweight.stride(0),
                BLOCK_T=BLOCK_T, BLOCK_E=BLOCK_E, BLOCK_D=BLOCK_D, DOT=settings["DOT"],
                num_warps=settings["num_warps"])
        return dx.view(x_shape), dweight.view(w_shape), None, None, None, None, None, None, None, None


def run(x, weight, bias, topk, score_func, norm_lambda, renormalize, route_scale, n_group=1, topk_group=1):
    """x [N, D] float32/float16/bfloat16, weight [E, D] same dtype, bias [E] float32; topk <= E; n_group groups of
    experts, topk_group kept (1, 1: no groups) -> (weights [N, topk] float32, ids [N, topk] int64 in descending
    s + bias order, counts [E] int64)."""
    return MoERouterFunction.apply(x, weight, bias, topk, score_func, norm_lambda, renormalize, route_scale,
                                   n_group, topk_group)
