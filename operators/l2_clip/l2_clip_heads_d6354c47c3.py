"""l2_clip candidate rendered from templates/l2_clip/heads.py.j2.

a 2-D grid of (token tile, head) programs, a [BT, D] tile of one head each; the scale's gradient summed per program before a fixed-order sum
params: BT=8, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "l2_clip"
TEMPLATE = "heads"
BT = 8
EPS = tl.constexpr(1e-6)  # what Inkling2's clips add to the norm (a constexpr: kernels read it)
REDUCE_BLOCK = 1024
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


@triton.jit
def _clip_rows(X, S, rows, ds, mask, H, D, threshold, SCALED: tl.constexpr):
    """x [R, DP] of the rows (float32), u = x * scale[row % H] (x without SCALED), its norm [R] and the clip factor
    min(1, threshold / (norm + EPS)) [R]."""
    x = tl.load(X + rows[:, None] * D + ds[None, :], mask=mask, other=0.0).to(tl.float32)
    if SCALED:
        u = x * tl.load(S + (rows % H)[:, None] * D + ds[None, :], mask=mask, other=0.0).to(tl.float32)
    else:
        u = x
    norm = tl.sqrt(tl.sum(u * u, axis=1))
    return x, u, norm, tl.minimum(threshold / (norm + EPS), 1.0)


@triton.jit
def l2_clip_fwd_kernel(X, S, TAU, Y, N, H, D, threshold, BT: tl.constexpr, DP: tl.constexpr, SCALED: tl.constexpr,
                       TAUED: tl.constexpr):
    """X, Y [N * H, D] rows (N = B * T tokens), S [H, D], TAU [N]; y = u * min(1, threshold / (||u|| + EPS)) of the
    program's rows, times tau[row // H] with TAUED; float32 math, stored in Y's dtype."""
    # program (token tile, head): BT tokens of one head
    tile = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    rows = (tile * BT + tl.arange(0, BT)) * H + head
    rows = tl.where(tile * BT + tl.arange(0, BT) < N, rows, N * H)  # past the last token: no row
    ds = tl.arange(0, DP)
    live = rows < N * H
    mask = live[:, None] & (ds < D)[None, :]
    _, u, _, clip = _clip_rows(X, S, rows, ds, mask, H, D, threshold, SCALED)
    y = u * clip[:, None]
    if TAUED:
        y = y * tl.load(TAU + rows // H, mask=live, other=0.0).to(tl.float32)[:, None]
    tl.store(Y + rows[:, None] * D + ds[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def l2_clip_bwd_kernel(X, S, TAU, DY, DX, DSP, DTP, N, H, D, threshold, BT: tl.constexpr, DP: tl.constexpr,
                       SCALED: tl.constexpr, TAUED: tl.constexpr):
    """dx of the forward's rows, the norm recomputed from X: du = g (kept) or c g - c^2 / threshold (u . g) / ||u|| u
    (clipped: c = threshold / (||u|| + EPS) < 1), g = dy * tau, dx = du * scale; with SCALED the scale's partial
    gradient du * x (the program's rows summed: DSP[program, h],
    float32); with TAUED tau's, sum over D of dy * u * min(1, c), at DTP[row % H, row // H] (float32)."""
    # program (token tile, head): BT tokens of one head
    tile = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    rows = (tile * BT + tl.arange(0, BT)) * H + head
    rows = tl.where(tile * BT + tl.arange(0, BT) < N, rows, N * H)  # past the last token: no row
    ds = tl.arange(0, DP)
    live = rows < N * H
    mask = live[:, None] & (ds < D)[None, :]
    x, u, norm, clip = _clip_rows(X, S, rows, ds, mask, H, D, threshold, SCALED)
    dy = tl.load(DY + rows[:, None] * D + ds[None, :], mask=mask, other=0.0).to(tl.float32)
    if TAUED:
        g = dy * tl.load(TAU + rows // H, mask=live, other=0.0).to(tl.float32)[:, None]
        tl.store(DTP + (rows % H) * N + rows // H, tl.sum(dy * u, axis=1) * clip, mask=live)
    else:
        g = dy
    bend = clip * clip / threshold * tl.sum(u * g, axis=1) / tl.maximum(norm, 1e-30)  # c^2 / threshold, clipped
    du = tl.where((clip < 1.0)[:, None], clip[:, None] * g - bend[:, None] * u, g)
    if SCALED:
        dx = du * tl.load(S + (rows % H)[:, None] * D + ds[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DSP + (tile * H + head) * D + ds, tl.sum(du * x, axis=0), mask=ds < D)
    else:
        dx = du
    tl.store(DX + rows[:, None] * D + ds[None, :], dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def l2_clip_reduce_kernel(PARTS, OUT, P, N, BLOCK: tl.constexpr):
    """PARTS [P, N] float32 partial gradients -> OUT [N] = their sum over P, in a fixed order (no atomics:
    deterministic), stored in OUT's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, P):
        acc += tl.load(PARTS + p * N + offs, mask=mask, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)


def _reduced(parts, like):
    """parts [P, *like.shape] float32 -> their sum over P in like's dtype."""
    out = torch.empty_like(like)
    if out.numel() > 0:
        l2_clip_reduce_kernel[(triton.cdiv(out.numel(), REDUCE_BLOCK),)](parts, out, parts.shape[0], out.numel(),
                                                                          BLOCK=REDUCE_BLOCK, num_warps=4)
    return out


class ClipFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, tau, threshold):
        x_c = x.contiguous()
        s_c = None if scale is None else scale.contiguous()
        tau_c = None if tau is None else tau.contiguous()
        b, t, h, d = x_c.shape
        n = b * t
        y = torch.empty_like(x_c)
        if y.numel() > 0:
            l2_clip_fwd_kernel[(triton.cdiv(n, BT), h)](
                x_c, x_c if s_c is None else s_c, x_c if tau_c is None else tau_c, y, n, h, d, float(threshold),
                BT=BT, DP=triton.next_power_of_2(d), SCALED=s_c is not None, TAUED=tau_c is not None,
                num_warps=target_settings(x_c.device)["num_warps"])
        ctx.save_for_backward(x_c, s_c, tau_c)
        ctx.threshold = float(threshold)
        return y

    @staticmethod
    def backward(ctx, dy):
        x_c, s_c, tau_c = ctx.saved_tensors
        b, t, h, d = x_c.shape
        n = b * t
        dx = torch.empty_like(x_c)
        scale_parts = torch.zeros(triton.cdiv(n, BT), h, d, dtype=torch.float32, device=x_c.device) if s_c is not None \
            else None
        tau_parts = torch.zeros(h, b, t, dtype=torch.float32, device=x_c.device) if tau_c is not None else None
        if dx.numel() > 0:
            l2_clip_bwd_kernel[(triton.cdiv(n, BT), h)](
                x_c, x_c if s_c is None else s_c, x_c if tau_c is None else tau_c, dy.contiguous(), dx,
                x_c if scale_parts is None else scale_parts, x_c if tau_parts is None else tau_parts, n, h, d,
                ctx.threshold, BT=BT, DP=triton.next_power_of_2(d), SCALED=s_c is not None, TAUED=tau_c is not None,
                num_warps=target_settings(x_c.device)["num_warps"])
        dscale = None if s_c is None else _reduced(scale_parts, s_c)
        dtau = None if tau_c is None else _reduced(tau_parts, tau_c)
        return dx, dscale, dtau, None


def run(x, scale, tau, threshold):
    """x [B, T, H, D] float32/float16/bfloat16, scale [H, D] or None, tau [B, T] or None, threshold float -> each
    head vector (times scale) clipped to the threshold's L2 norm, times tau [B, T, H, D] in x.dtype; float32 math."""
    if scale is not None and tuple(scale.shape) != tuple(x.shape[2:]):
        raise ValueError(f"l2_clip: scale {tuple(scale.shape)} is not [H, D] = {list(x.shape[2:])}")
    if tau is not None and tuple(tau.shape) != tuple(x.shape[:2]):
        raise ValueError(f"l2_clip: tau {tuple(tau.shape)} is not [B, T] = {list(x.shape[:2])}")
    return ClipFunction.apply(x, scale, tau, threshold)
