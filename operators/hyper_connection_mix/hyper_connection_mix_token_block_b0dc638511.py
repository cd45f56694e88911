"""hyper_connection_mix candidate rendered from templates/hyper_connection_mix/token_block.py.j2.

a program per BLOCK_T tokens walking the whole row in BLOCK_D tiles; post's and comb's gradients finish in registers
params: BLOCK_T=4, BLOCK_D=128, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "hyper_connection_mix"
TEMPLATE = "token_block"
BLOCK_T = 4
BLOCK_D = 128
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
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


def d_span(d):
    """The whole row: one program column, post's and comb's gradients complete in each program."""
    return max(triton.cdiv(d, BLOCK_D), 1) * BLOCK_D


@triton.jit
def _weights(POST, COMB, toks, tmask, N, NP: tl.constexpr):
    """post [BT, NP] and comb [BT, NP (m), NP (n)] of tokens toks, float32, zero off the N streams."""
    m = tl.arange(0, NP)
    mmask = m < N
    post = tl.load(POST + toks[:, None] * N + m[None, :], mask=tmask[:, None] & mmask[None, :], other=0.0)
    comb = tl.load(COMB + toks[:, None, None] * (N * N) + m[None, :, None] * N + m[None, None, :],
                   mask=tmask[:, None, None] & mmask[None, :, None] & mmask[None, None, :], other=0.0)
    return post.to(tl.float32), comb.to(tl.float32)


@triton.jit
def _streams(toks, tmask, d, N, D, NP: tl.constexpr):
    """Offsets and mask of the residual's [BT, NP, BD] tile (X [T, N, D]), and of y's [BT, BD] one."""
    m = tl.arange(0, NP)
    dmask = d < D
    offs = toks[:, None, None] * (N * D) + m[None, :, None] * D + d[None, None, :]
    mask = tmask[:, None, None] & (m < N)[None, :, None] & dmask[None, None, :]
    return offs, mask, toks[:, None] * D + d[None, :], tmask[:, None] & dmask[None, :]


@triton.jit
def hyper_connection_mix_fwd_kernel(Y, RES, POST, COMB, OUT, T, N, D, span, BLOCK_T: tl.constexpr,
                                    BLOCK_D: tl.constexpr, NP: tl.constexpr):
    """OUT [T, N, D][:, n] = post[:, n] y + sum_m comb[:, m, n] RES[:, m], in float32, one rounding to OUT's
    dtype. Program (i, j): tokens i * BLOCK_T on, columns j * span on."""
    toks = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = toks < T
    m = tl.arange(0, NP)
    post, comb = _weights(POST, COMB, toks, tmask, N, NP)
    start = tl.program_id(1) * span
    for d0 in range(start, tl.minimum(start + span, D), BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        offs, mask, y_offs, y_mask = _streams(toks, tmask, d, N, D, NP)
        y = tl.load(Y + y_offs, mask=y_mask, other=0.0).to(tl.float32)
        res = tl.load(RES + offs, mask=mask, other=0.0).to(tl.float32)
        for n in range(0, N):
            into_n = tl.sum(tl.where(m[None, None, :] == n, comb, 0.0), axis=2)  # comb[:, m, n]: [BT, NP]
            p = tl.sum(tl.where(m[None, :] == n, post, 0.0), axis=1)
            out = p[:, None] * y + tl.sum(into_n[:, :, None] * res, axis=1)
            tl.store(OUT + toks[:, None] * (N * D) + n * D + d[None, :], out.to(OUT.dtype.element_ty), mask=y_mask)


@triton.jit
def hyper_connection_mix_bwd_kernel(DOUT, Y, RES, POST, COMB, DY, DRES, DPOST, DCOMB, T, N, D, span,
                                    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, NP: tl.constexpr):
    """dy = sum_n post_n dout_n, dres_m = sum_n comb[m, n] dout_n (stored in Y's and RES's dtypes); post's and
    comb's gradients (sums over D of dout_n . y and res_m . dout_n) over this program's span, float32: DPOST
    [P, T, N] and DCOMB [P, T, N, N] at part program_id(1) (P = 1 when a span is the whole row)."""
    toks = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = toks < T
    m = tl.arange(0, NP)
    post, comb = _weights(POST, COMB, toks, tmask, N, NP)
    dpost = tl.zeros((BLOCK_T, NP), dtype=tl.float32)
    dcomb = tl.zeros((BLOCK_T, NP, NP), dtype=tl.float32)
    part = tl.program_id(1)
    start = part * span
    for d0 in range(start, tl.minimum(start + span, D), BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        offs, mask, y_offs, y_mask = _streams(toks, tmask, d, N, D, NP)
        y = tl.load(Y + y_offs, mask=y_mask, other=0.0).to(tl.float32)
        res = tl.load(RES + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        dres = tl.zeros((BLOCK_T, NP, BLOCK_D), dtype=tl.float32)
        for n in range(0, N):
            g = tl.load(DOUT + toks[:, None] * (N * D) + n * D + d[None, :], mask=y_mask, other=0.0).to(tl.float32)
            into_n = tl.sum(tl.where(m[None, None, :] == n, comb, 0.0), axis=2)
            p = tl.sum(tl.where(m[None, :] == n, post, 0.0), axis=1)
            dy += p[:, None] * g
            dres += into_n[:, :, None] * g[:, None, :]
            dpost += tl.where(m[None, :] == n, tl.sum(g * y, axis=1)[:, None], 0.0)
            dcomb += tl.where(m[None, None, :] == n, tl.sum(res * g[:, None, :], axis=2)[:, :, None], 0.0)
        tl.store(DY + y_offs, dy.to(DY.dtype.element_ty), mask=y_mask)
        tl.store(DRES + offs, dres.to(DRES.dtype.element_ty), mask=mask)
    lanes = tmask[:, None] & (m < N)[None, :]
    tl.store(DPOST + part * T * N + toks[:, None] * N + m[None, :], dpost, mask=lanes)
    tl.store(DCOMB + part * T * N * N + toks[:, None, None] * (N * N) + m[None, :, None] * N + m[None, None, :],
             dcomb, mask=lanes[:, :, None] & (m < N)[None, None, :])


@triton.jit
def hyper_connection_mix_sum_kernel(PARTS, OUT, P, N, BLOCK: tl.constexpr):
    """PARTS [P, M] float32 -> OUT [M] = the sum over P in a fixed order (deterministic, no atomics), stored in OUT's
    dtype: post's and comb's gradients from the spans' partials."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, P):
        acc += tl.load(PARTS + p * N + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


class HyperConnectionMixFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, residual, post, comb):
        t, n, d = residual.shape
        y, residual, post, comb = y.contiguous(), residual.contiguous(), post.contiguous(), comb.contiguous()
        out = torch.empty_like(residual)
        span, lanes = d_span(d), triton.next_power_of_2(n)
        warps = target_settings(residual.device)["num_warps"]
        if t > 0 and d > 0:
            hyper_connection_mix_fwd_kernel[(triton.cdiv(t, 4), triton.cdiv(d, span))](
                y, residual, post, comb, out, t, n, d, span, BLOCK_T=4, BLOCK_D=128, NP=lanes,
                num_warps=warps)
        ctx.save_for_backward(y, residual, post, comb)
        return out

    @staticmethod
    def backward(ctx, dout):
        y, residual, post, comb = ctx.saved_tensors
        t, n, d = residual.shape
        span, lanes = d_span(d), triton.next_power_of_2(n)
        parts = triton.cdiv(d, span) if d > 0 else 0
        dy, dres = torch.empty_like(y), torch.empty_like(residual)
        whole = parts == 1  # one span a row: the kernel's sums are the gradients
        if whole:
            dpost, dcomb = torch.empty_like(post), torch.empty_like(comb)
        else:
            dpost = torch.empty(parts, t, n, dtype=torch.float32, device=y.device)
            dcomb = torch.empty(parts, t, n, n, dtype=torch.float32, device=y.device)
        warps = target_settings(residual.device)["num_warps"]
        if t > 0 and d > 0:
            hyper_connection_mix_bwd_kernel[(triton.cdiv(t, 4), parts)](
                dout.contiguous(), y, residual, post, comb, dy, dres, dpost, dcomb, t, n, d, span,
                BLOCK_T=4, BLOCK_D=128, NP=lanes, num_warps=warps)
        if whole:
            return dy, dres, dpost, dcomb
        dpost_sum, dcomb_sum = torch.empty_like(post), torch.empty_like(comb)
        for parts_of, total in ((dpost, dpost_sum), (dcomb, dcomb_sum)):
            hyper_connection_mix_sum_kernel[(triton.cdiv(max(total.numel(), 1), 1024),)](
                parts_of, total, parts, total.numel(), BLOCK=1024)
        return dy, dres, dpost_sum, dcomb_sum


def run(y, residual, post, comb):
    """y [T, D], residual [T, N, D] float32/float16/bfloat16; post [T, N], comb [T, N, N] (any float dtype) ->
    out [T, N, D] in residual's dtype."""
    return HyperConnectionMixFunction.apply(y, residual, post, comb)
