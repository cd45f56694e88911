"""hyper_connection candidate rendered from templates/hyper_connection/dot_tiled.py.j2.

BLOCK_T tokens per program, the logits, fn's gradient and the streams' gradient as tensor-core dots over D tiles
params: BLOCK_T=16, BLOCK_D=64, num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "hyper_connection"
TEMPLATE = "dot_tiled"
BLOCK_T = 16
BLOCK_D = 64
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {}


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
# Warps per target; the products take float32 operands (the module computes in float32): float32-accurate on the
# tensor cores through split operands (3xTF32 on NVIDIA, 6xBF16 on AMD; the interpreter multiplies in float32).
LAUNCH_SETTINGS = {
    "default": {"num_warps": 8},
    "interpreter": {"DOT": "ieee"},
    "cuda": {"DOT": "tf32x3"},
    "hip": {"DOT": "bf16x6"},
}


@triton.jit
def _project(x, f, DOT: tl.constexpr):
    """x [BT, BD] f^T -> [BT, P] on the tensor cores."""
    return tl.dot(x, tl.trans(f), input_precision=DOT)


@triton.jit
def _project_back(dm, f, DOT: tl.constexpr):
    """dm [BT, P] f [P, BD] -> [BT, BD] on the tensor cores."""
    return tl.dot(dm, f, input_precision=DOT)


@triton.jit
def _outer(dm, nx, DOT: tl.constexpr):
    """dm^T [P, BT] nx [BT, BD] -> [P, BD] on the tensor cores."""
    return tl.dot(tl.trans(dm), nx, input_precision=DOT)


@triton.jit
def _layout(N, G: tl.constexpr, NP: tl.constexpr):
    """(group [G, 1], lane [1, NP], the logit's row of fn and base [G, NP], valid [G, NP])."""
    g = tl.arange(0, G)[:, None]
    i = tl.arange(0, NP)[None, :]
    index = tl.where(g < 2, g * N + i, 2 * N + (g - 2) * N + i)
    return g, i, index, (i < N) & (g < N + 2)


@triton.jit
def _logits(mix, BASE, SCALE, N, hc_eps, G: tl.constexpr, NP: tl.constexpr):
    """mix [BT, G, NP] float32 (fn @ normalised streams) -> (sig = sigmoid(mix * s + b), c0 = comb's row softmax
    + hc_eps, zero off comb), both [BT, G, NP] float32."""
    g, i, index, valid = _layout(N, G, NP)
    b = tl.load(BASE + index, mask=valid, other=0.0).to(tl.float32)
    s = tl.load(SCALE + tl.minimum(g, 2)).to(tl.float32)
    u = mix * s[None, :, :] + b[None, :, :]
    is_comb = (valid & (g >= 2))[None, :, :]
    logits = tl.where(is_comb, u, float("-inf"))
    top = tl.max(logits, axis=2)
    top = tl.where(top == float("-inf"), 0.0, top)
    e = tl.where(is_comb, tl.exp(logits - top[:, :, None]), 0.0)
    total = tl.sum(e, axis=2)
    total = tl.where(total > 0, total, 1.0)
    c0 = tl.where(is_comb, e / total[:, :, None] + hc_eps, 0.0)
    return tl.sigmoid(u), c0


@triton.jit
def _normalize(c, step, hc_eps):
    """Sinkhorn-Knopp step ``step`` on c [BT, G, NP] (zero off comb): even steps divide each column by its sum
    + hc_eps, odd ones each row -> (c', the divisor)."""
    cols = tl.sum(c, axis=1)[:, None, :] + hc_eps
    rows = tl.sum(c, axis=2)[:, :, None] + hc_eps
    divisor = tl.where(step % 2 == 0, cols, rows)
    return c / divisor, divisor


@triton.jit
def _normalize_back(grad, c, step, hc_eps):
    """The gradient of step ``step``'s input c from that of its output: (grad - sum(grad * c')) / divisor, the sum
    along the normalised axis."""
    out, divisor = _normalize(c, step, hc_eps)
    weighted = grad * out
    along = tl.where(step % 2 == 0, tl.sum(weighted, axis=1)[:, None, :], tl.sum(weighted, axis=2)[:, :, None])
    return (grad - along) / divisor


@triton.jit
def _streams(toks, tmask, n, d, N, D):
    """The offsets and mask of stream n's columns d of tokens toks in X [T, N * D]."""
    dmask = d < D
    return toks[:, None] * (N * D) + n * D + d[None, :], tmask[:, None] & dmask[None, :]


@triton.jit
def _fn_rows(FN, n, d, N, D, G: tl.constexpr, NP: tl.constexpr):
    """fn's rows in the flat logit order, stream n's columns d: [P, BD] float32 (zero rows off the layout)."""
    cols = tl.arange(0, G * NP)
    g = cols // NP
    i = cols % NP
    rows = tl.where(g < 2, g * N + i, 2 * N + (g - 2) * N + i)
    mask = ((i < N) & (g < N + 2))[:, None] & (d < D)[None, :]
    return tl.load(FN + rows[:, None].to(tl.int64) * (N * D) + n * D + d[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def hyper_connection_fwd_kernel(X, FN, BASE, SCALE, POST, COMB, COLLAPSED, MIX, RSTD, T, N, D, norm_eps, hc_eps,
                                iters, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, G: tl.constexpr,
                                NP: tl.constexpr, DOT: tl.constexpr):
    """BLOCK_T tokens per program. X [T, N * D]; writes POST [T, N], COMB [T, N, N] (float32), COLLAPSED [T, D]
    (X's dtype) and, for the backward pass, MIX [T, G * NP] (the logits before scale and base) and RSTD [T]."""
    toks = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = toks < T
    P: tl.constexpr = G * NP
    acc = tl.zeros((BLOCK_T, P), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for n in range(0, N):
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            offs, mask = _streams(toks, tmask, n, d, N, D)
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            sumsq += tl.sum(x * x, axis=1)
            acc += _project(x, _fn_rows(FN, n, d, N, D, G, NP), DOT)
    rstd = 1.0 / tl.sqrt(sumsq / (N * D) + norm_eps)
    mix = acc * rstd[:, None]
    flat = tl.arange(0, P)
    tl.store(MIX + toks[:, None] * P + flat[None, :], mix, mask=tmask[:, None])
    tl.store(RSTD + toks, rstd, mask=tmask)

    sig, comb = _logits(tl.reshape(mix, (BLOCK_T, G, NP)), BASE, SCALE, N, hc_eps, G, NP)
    for step in range(0, 2 * iters - 1):
        comb, _ = _normalize(comb, step, hc_eps)
    g, i, index, valid = _layout(N, G, NP)
    lanes = tl.arange(0, NP)
    pre = tl.sum(tl.where(g[None, :, :] == 0, sig + hc_eps, 0.0), axis=1)
    post = tl.sum(tl.where(g[None, :, :] == 1, 2.0 * sig, 0.0), axis=1)
    tl.store(POST + toks[:, None] * N + lanes[None, :], post, mask=tmask[:, None] & (lanes < N)[None, :])
    is_comb = (valid & (g >= 2))[None, :, :]
    tl.store(COMB + toks[:, None, None] * (N * N) + ((g - 2) * N + i)[None, :, :], comb,
             mask=tmask[:, None, None] & is_comb)

    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        out = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        for n in range(0, N):
            offs, mask = _streams(toks, tmask, n, d, N, D)
            weight = tl.sum(tl.where(lanes[None, :] == n, pre, 0.0), axis=1)
            out += weight[:, None] * tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(COLLAPSED + toks[:, None] * D + d[None, :], out.to(COLLAPSED.dtype.element_ty),
                 mask=tmask[:, None] & (d < D)[None, :])


@triton.jit
def hyper_connection_bwd_kernel(X, FN, BASE, SCALE, MIX, RSTD, DPOST, DCOMB, DCOLLAPSED, DX, DMIX, PART_BASE,
                                PART_SCALE, SCRATCH, T, N, D, hc_eps, iters, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                                G: tl.constexpr, NP: tl.constexpr, DOT: tl.constexpr):
    """BLOCK_T tokens per program: pre's gradient from the collapse, the logits' through the Sinkhorn rounds (the
    rounds recomputed from the softmax once, each step's input kept in SCRATCH [T, 2 iters - 1, G * NP] float32,
    then walked back), the softmax and the sigmoids; then dx through fn and the RMS norm, plus the collapse's
    pre_n * dcollapsed. Writes DX, DMIX [T, G * NP] (the gradient of fn @ normalised streams, for fn's gradient)
    and the program's rows of PART_BASE [programs, (2 + N) N] and PART_SCALE [programs, 3] (summed in a fixed order
    afterwards)."""
    pid = tl.program_id(0)
    toks = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = toks < T
    P: tl.constexpr = G * NP
    lanes = tl.arange(0, NP)
    dpre = tl.zeros((BLOCK_T, NP), dtype=tl.float32)
    for n in range(0, N):
        acc = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            offs, mask = _streams(toks, tmask, n, d, N, D)
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            dc = tl.load(DCOLLAPSED + toks[:, None] * D + d[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += tl.sum(x * dc, axis=1)
        dpre += tl.where(lanes[None, :] == n, acc[:, None], 0.0)

    g, i, index, valid = _layout(N, G, NP)
    g3 = g[None, :, :]
    is_comb = (valid & (g >= 2))[None, :, :]
    rows = tmask[:, None, None]
    mix = tl.load(MIX + toks[:, None, None] * P + (g * NP + i)[None, :, :], mask=rows, other=0.0)
    dpost = tl.load(DPOST + toks[:, None, None] * N + i[None, :, :], mask=rows & (g3 == 1) & (i < N)[None, :, :],
                    other=0.0).to(tl.float32)
    grad = tl.load(DCOMB + toks[:, None, None] * (N * N) + ((g - 2) * N + i)[None, :, :], mask=rows & is_comb,
                   other=0.0).to(tl.float32)
    sig, c0 = _logits(mix, BASE, SCALE, N, hc_eps, G, NP)
    steps = 2 * iters - 1
    rounds = SCRATCH + toks[:, None, None] * (steps * P) + (g * NP + i)[None, :, :]  # step 0's tile of each token
    c = c0
    for step in range(0, steps):  # each step's input kept in the token's own scratch rows
        tl.store(rounds + step * P, c, mask=rows)
        c, _ = _normalize(c, step, hc_eps)
    tl.debug_barrier()
    for back in range(0, steps):
        step = steps - 1 - back
        c = tl.load(rounds + step * P, mask=rows, other=0.0)
        grad = tl.where(is_comb, _normalize_back(grad, c, step, hc_eps), 0.0)
    p = tl.where(is_comb, c0 - hc_eps, 0.0)
    dsoftmax = p * (grad - tl.sum(grad * p, axis=2)[:, :, None])
    dsig = sig * (1.0 - sig)
    du = tl.where(g3 == 0, dpre[:, None, :] * dsig, tl.where(g3 == 1, 2.0 * dpost * dsig, dsoftmax))
    du = tl.where(rows & valid[None, :, :], du, 0.0)

    tl.store(PART_BASE + pid * ((N + 2) * N) + index, tl.sum(du, axis=0), mask=valid)
    by_group = tl.sum(tl.sum(du * mix, axis=0), axis=1)
    groups = tl.arange(0, G)
    ds_comb = tl.sum(tl.where(groups >= 2, by_group, 0.0), axis=0)
    tl.store(PART_SCALE + pid * 3 + groups, by_group, mask=groups < 2)
    tl.store(PART_SCALE + pid * 3 + 2, ds_comb)
    s = tl.load(SCALE + tl.minimum(g, 2)).to(tl.float32)
    dmix = tl.reshape(du * s[None, :, :], (BLOCK_T, P))
    flat = tl.arange(0, P)
    tl.store(DMIX + toks[:, None] * P + flat[None, :], dmix, mask=tmask[:, None])

    pre = tl.sum(tl.where(g3 == 0, sig + hc_eps, 0.0), axis=1)
    rstd = tl.load(RSTD + toks, mask=tmask, other=0.0)
    along = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for n in range(0, N):
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            offs, mask = _streams(toks, tmask, n, d, N, D)
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            dn = _project_back(dmix, _fn_rows(FN, n, d, N, D, G, NP), DOT)
            along += tl.sum(dn * x, axis=1)
    along = along * rstd * rstd / (N * D)
    for n in range(0, N):
        weight = tl.sum(tl.where(lanes[None, :] == n, pre, 0.0), axis=1)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            offs, mask = _streams(toks, tmask, n, d, N, D)
            x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
            dc = tl.load(DCOLLAPSED + toks[:, None] * D + d[None, :], mask=mask, other=0.0).to(tl.float32)
            dn = _project_back(dmix, _fn_rows(FN, n, d, N, D, G, NP), DOT)
            dx = rstd[:, None] * (dn - x * along[:, None]) + weight[:, None] * dc
            tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def hyper_connection_dfn_kernel(X, RSTD, DMIX, DFN, T, N, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                                G: tl.constexpr, NP: tl.constexpr, DOT: tl.constexpr):
    """fn's gradient, stream program_id(0)'s columns of block program_id(1): sum over every token (in a fixed
    order) of DMIX [T, G * NP] outer the normalised streams x * rstd. DFN [(2 + N) N, N * D] in fn's dtype."""
    n = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    P: tl.constexpr = G * NP
    flat = tl.arange(0, P)
    acc = tl.zeros((P, BLOCK_D), dtype=tl.float32)
    for t0 in range(0, T, BLOCK_T):
        toks = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        tmask = toks < T
        offs, mask = _streams(toks, tmask, n, d, N, D)
        nx = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32) * tl.load(RSTD + toks, mask=tmask,
                                                                                other=0.0)[:, None]
        dm = tl.load(DMIX + toks[:, None] * P + flat[None, :], mask=tmask[:, None], other=0.0)
        acc += _outer(dm, nx, DOT)
    g = flat // NP
    i = flat % NP
    rows = tl.where(g < 2, g * N + i, 2 * N + (g - 2) * N + i)
    mask = ((i < N) & (g < N + 2))[:, None] & (d < D)[None, :]
    tl.store(DFN + rows[:, None].to(tl.int64) * (N * D) + n * D + d[None, :], acc.to(DFN.dtype.element_ty),
             mask=mask)


@triton.jit
def hyper_connection_sum_kernel(PARTS, OUT, P, N, BLOCK: tl.constexpr):
    """PARTS [P, M] float32 -> OUT [M] = the sum over P in a fixed order (deterministic, no atomics), stored in OUT's
    dtype: base's and scale's gradients from the backward programs' rows."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, P):
        acc += tl.load(PARTS + p * N + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


def tile_of(streams):
    """(G, NP): the logits' [G, NP] tile for ``streams`` (at least 16 entries: the least a dot's dimension takes)."""
    groups = triton.next_power_of_2(streams + 2)
    return groups, max(triton.next_power_of_2(streams), 16 // groups)


class HyperConnectionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters):
        t, n, d = x.shape
        x, fn, base, scale = x.contiguous(), fn.contiguous(), base.contiguous(), scale.contiguous()
        groups, lanes = tile_of(n)
        post = torch.empty(t, n, dtype=torch.float32, device=x.device)
        comb = torch.empty(t, n, n, dtype=torch.float32, device=x.device)
        collapsed = torch.empty(t, d, dtype=x.dtype, device=x.device)
        mix = torch.empty(t, groups * lanes, dtype=torch.float32, device=x.device)
        rstd = torch.empty(t, dtype=torch.float32, device=x.device)
        settings = target_settings(x.device)
        if t > 0:
            hyper_connection_fwd_kernel[(triton.cdiv(t, 16),)](
                x, fn, base, scale, post, comb, collapsed, mix, rstd, t, n, d, norm_eps, hc_eps, sinkhorn_iters,
                BLOCK_T=16, BLOCK_D=64, G=groups, NP=lanes, DOT=settings["DOT"],
                num_warps=settings["num_warps"])
        ctx.save_for_backward(x, fn, base, scale, mix, rstd)
        ctx.hc = (hc_eps, sinkhorn_iters, groups, lanes)
        return post, comb, collapsed

    @staticmethod
    def backward(ctx, dpost, dcomb, dcollapsed):
        x, fn, base, scale, mix, rstd = ctx.saved_tensors
        hc_eps, sinkhorn_iters, groups, lanes = ctx.hc
        t, n, d = x.shape
        programs = triton.cdiv(t, 16)
        dx = torch.empty_like(x)
        dmix = torch.empty_like(mix)
        part_base = torch.empty(programs, base.numel(), dtype=torch.float32, device=x.device)
        part_scale = torch.empty(programs, 3, dtype=torch.float32, device=x.device)
        scratch = torch.empty(t, 2 * sinkhorn_iters - 1, groups * lanes, dtype=torch.float32, device=x.device)
        settings = target_settings(x.device)
        if t > 0:
            hyper_connection_bwd_kernel[(programs,)](
                x, fn, base, scale, mix, rstd, dpost.contiguous(), dcomb.contiguous(), dcollapsed.contiguous(), dx,
                dmix, part_base, part_scale, scratch, t, n, d, hc_eps, sinkhorn_iters, BLOCK_T=16,
                BLOCK_D=64, G=groups, NP=lanes, DOT=settings["DOT"], num_warps=settings["num_warps"])
        dfn = torch.empty_like(fn)
        hyper_connection_dfn_kernel[(n, triton.cdiv(d, 64))](
            x, rstd, dmix, dfn, t, n, d, BLOCK_T=16, BLOCK_D=64, G=groups, NP=lanes, DOT=settings["DOT"],
            num_warps=settings["num_warps"])
        dbase, dscale = torch.empty_like(base), torch.empty_like(scale)
        hyper_connection_sum_kernel[(triton.cdiv(base.numel(), 64),)](part_base, dbase, programs, base.numel(),
                                                                     BLOCK=64)
        hyper_connection_sum_kernel[(1,)](part_scale, dscale, programs, 3, BLOCK=4)
        return dx, dfn, dbase, dscale, None, None, None


def run(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters):
    """x [T, N, D] float32/float16/bfloat16; fn [(2 + N) N, N D], base [(2 + N) N], scale [3], each of any of those
    dtypes (every product runs in float32) -> (post [T, N] float32, comb [T, N, N] float32, collapsed [T, D] in
    x's dtype)."""
    return HyperConnectionFunction.apply(x, fn, base, scale, norm_eps, hc_eps, sinkhorn_iters)
