"""kda_short_conv candidate rendered from templates/kda_short_conv/tiled.py.j2.

a 2-D grid of (batch x time tile, channel tile) programs; the backward keeps dy * silu'(pre) in a float32 buffer
params: BT=32, BD=64, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: bwd_maxnreg=128, num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "kda_short_conv"
TEMPLATE = "tiled"
BT = 32
BD = 64
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'num_warps': 8}, 'sm_80': {'num_warps': 8}, 'sm_90a': {'bwd_maxnreg': 128, 'num_warps': 8}}


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
# A [BT, BD] tile and its W shifted copies take most of a thread's registers: the warps, and a register cap on the
# backward (bwd_maxnreg, NVIDIA's maxnreg: two CTAs an SM where it fits without spilling), are the port's choice per
# target (kda_short_conv/tiled.yaml declares them). The residual variants' backward holds x's tile too: its cap is
# its own (bwd_residual_maxnreg), so that a cap that fits KDA's form does not make Inkling2's spill.
# `workbench targets` shows each launch's registers and spills.
LAUNCH_SETTINGS = {"default": {"num_warps": 4, "bwd_maxnreg": None,
                               "bwd_residual_maxnreg": None}}


@triton.jit
def kda_short_conv_fwd_kernel(X, WT, TAPS, Y, T, D, G, P, residual_scale, W: tl.constexpr, BT: tl.constexpr,
                              BD: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, DYN: tl.constexpr):
    """X, Y contiguous [B, T, D], WT [D, W], TAPS [B, T, G, W] (read with DYN); program (b * cdiv(T, BT) + time
    tile, channel tile) writes BT x BD outputs y (the variant's: silu(pre), then (. + x) * residual_scale); math in
    float32, stored in Y's dtype."""
    tiles = tl.cdiv(T, BT)
    b = (tl.program_id(0) // tiles).to(tl.int64)
    ts = (tl.program_id(0) % tiles).to(tl.int64) * BT + tl.arange(0, BT)
    ds = tl.program_id(1).to(tl.int64) * BD + tl.arange(0, BD)
    dmask = ds < D
    xbase = X + b * T * D
    # pre [BT, BD] = the convolution before SiLU at time rows ts (zero before t = 0)
    pre = tl.zeros((BT, BD), dtype=tl.float32)
    for i in tl.static_range(W):
        pre_src = ts - (W - 1) + i
        pre_x = tl.load(xbase + pre_src[:, None] * D + ds[None, :],
                      mask=((pre_src >= 0) & (pre_src < T))[:, None] & dmask[None, :], other=0.0)
        pre_w = tl.load(WT + ds * W + i, mask=dmask, other=0.0)
        pre += pre_w.to(tl.float32)[None, :] * pre_x.to(tl.float32)
        if DYN:
            pre += tl.load(TAPS + ((b * T + ts)[:, None] * G + (ds // P)[None, :]) * W + i, mask=(ts < T)[:, None] & dmask[None, :], other=0.0).to(tl.float32) * pre_x.to(tl.float32)
    # y [BT, BD] = the variant's output at time rows ts: silu(pre) (or pre), then (. + x) * scale
    if SILU:
        y = pre / (1.0 + tl.exp(-pre))
    else:
        y = pre
    if RESIDUAL:
        y_x = tl.load(xbase + ts[:, None] * D + ds[None, :],
                      mask=(ts < T)[:, None] & dmask[None, :], other=0.0)
        y = (y + y_x.to(tl.float32)) * residual_scale
    tl.store(Y + b * T * D + ts[:, None] * D + ds[None, :], y.to(Y.dtype.element_ty),
             mask=(ts < T)[:, None] & dmask[None, :])


@triton.jit
def kda_short_conv_dpre_kernel(X, WT, TAPS, DY, DPRE, T, D, G, P, residual_scale, W: tl.constexpr, BT: tl.constexpr,
                               BD: tl.constexpr, SILU: tl.constexpr, RESIDUAL: tl.constexpr, DYN: tl.constexpr):
    """DPRE [B, T, D] float32 = dy' * silu'(pre) (dy' = dy * residual_scale with a residual; no silu' without SiLU),
    pre recomputed from X; tiles as the forward's."""
    tiles = tl.cdiv(T, BT)
    b = (tl.program_id(0) // tiles).to(tl.int64)
    ts = (tl.program_id(0) % tiles).to(tl.int64) * BT + tl.arange(0, BT)
    ds = tl.program_id(1).to(tl.int64) * BD + tl.arange(0, BD)
    dmask = ds < D
    xbase = X + b * T * D
    mask = (ts < T)[:, None] & dmask[None, :]
    # pre [BT, BD] = the convolution before SiLU at time rows ts (zero before t = 0)
    pre = tl.zeros((BT, BD), dtype=tl.float32)
    for i in tl.static_range(W):
        pre_src = ts - (W - 1) + i
        pre_x = tl.load(xbase + pre_src[:, None] * D + ds[None, :],
                      mask=((pre_src >= 0) & (pre_src < T))[:, None] & dmask[None, :], other=0.0)
        pre_w = tl.load(WT + ds * W + i, mask=dmask, other=0.0)
        pre += pre_w.to(tl.float32)[None, :] * pre_x.to(tl.float32)
        if DYN:
            pre += tl.load(TAPS + ((b * T + ts)[:, None] * G + (ds // P)[None, :]) * W + i, mask=(ts < T)[:, None] & dmask[None, :], other=0.0).to(tl.float32) * pre_x.to(tl.float32)
    dy = tl.load(DY + b * T * D + ts[:, None] * D + ds[None, :], mask=mask, other=0.0).to(tl.float32)
    # dpre = dy' * silu'(pre), silu'(p) = s (1 + p (1 - s)), s = sigmoid(p), dy' = dy * residual_scale with a
    # residual; dy' without SiLU
    if RESIDUAL:
        dpre_dy = dy * residual_scale
    else:
        dpre_dy = dy
    if SILU:
        dpre_s = 1.0 / (1.0 + tl.exp(-pre))
        dpre = dpre_dy * dpre_s * (1.0 + pre * (1.0 - dpre_s))
    else:
        dpre = dpre_dy
    tl.store(DPRE + b * T * D + ts[:, None] * D + ds[None, :], dpre, mask=mask)


@triton.jit
def kda_short_conv_bwd_kernel(X, WT, TAPS, DY, DPRE, DX, DWP, T, D, G, P, residual_scale, W: tl.constexpr,
                              BT: tl.constexpr, BD: tl.constexpr, RESIDUAL: tl.constexpr, DYN: tl.constexpr):
    """From DPRE: dx for the tile (stored in DX's dtype; dy * residual_scale added with a residual; each later
    output's own taps added to weight's with DYN) and the tile's partial weight gradient, DWP[program 0 index] [D, W]
    float32 (summed over the tile's rows)."""
    tiles = tl.cdiv(T, BT)
    b = (tl.program_id(0) // tiles).to(tl.int64)
    ts = (tl.program_id(0) % tiles).to(tl.int64) * BT + tl.arange(0, BT)
    ds = tl.program_id(1).to(tl.int64) * BD + tl.arange(0, BD)
    dmask = ds < D
    xbase = X + b * T * D
    dbase = DPRE + b * T * D
    rows = (ts < T)[:, None] & dmask[None, :]
    dpre = tl.load(dbase + ts[:, None] * D + ds[None, :], mask=rows, other=0.0)
    dx = tl.zeros((BT, BD), dtype=tl.float32)
    for i in tl.static_range(W):
        w = tl.load(WT + ds * W + i, mask=dmask, other=0.0).to(tl.float32)
        later = ts + (W - 1) - i  # the outputs that read this token through tap i
        dpre_l = tl.load(dbase + later[:, None] * D + ds[None, :], mask=(later < T)[:, None] & dmask[None, :],
                         other=0.0)
        dx += w[None, :] * dpre_l
        if DYN:
            dx += tl.load(TAPS + ((b * T + later)[:, None] * G + (ds // P)[None, :]) * W + i, mask=(later < T)[:, None] & dmask[None, :], other=0.0).to(tl.float32) * dpre_l
        src = ts - (W - 1) + i  # the token tap i reads for each output of the tile
        xs = tl.load(xbase + src[:, None] * D + ds[None, :], mask=((src >= 0) & (src < T))[:, None] & dmask[None, :],
                     other=0.0).to(tl.float32)
        tl.store(DWP + tl.program_id(0).to(tl.int64) * D * W + ds * W + i, tl.sum(dpre * xs, axis=0), mask=dmask)
    if RESIDUAL:
        dx += residual_scale * tl.load(DY + b * T * D + ts[:, None] * D + ds[None, :], mask=rows, other=0.0).to(
            tl.float32)
    tl.store(DX + b * T * D + ts[:, None] * D + ds[None, :], dx.to(DX.dtype.element_ty), mask=rows)


@triton.jit
def kda_short_conv_dtaps_kernel(X, WT, TAPS, DY, DTAPS, T, D, G, P, residual_scale, W: tl.constexpr,
                                BT: tl.constexpr, BD: tl.constexpr, BW: tl.constexpr, SILU: tl.constexpr,
                                RESIDUAL: tl.constexpr, DYN: tl.constexpr):
    """DTAPS [B, T, G, W] (taps' dtype): program (b * cdiv(T, BT) + time tile, group) recomputes dpre over the
    group's P channels, BD at a time, and sums its products with each tap's inputs over them (float32, in a fixed
    order: no atomics)."""
    tiles = tl.cdiv(T, BT)
    b = (tl.program_id(0) // tiles).to(tl.int64)
    ts = (tl.program_id(0) % tiles).to(tl.int64) * BT + tl.arange(0, BT)
    group = tl.program_id(1).to(tl.int64)
    xbase = X + b * T * D
    taps = tl.arange(0, BW)
    acc = tl.zeros((BT, BW), dtype=tl.float32)
    for c0 in range(0, P, BD):
        ds = group * P + c0 + tl.arange(0, BD)
        dmask = c0 + tl.arange(0, BD) < P
        # pre [BT, BD] = the convolution before SiLU at time rows ts (zero before t = 0)
        pre = tl.zeros((BT, BD), dtype=tl.float32)
        for i in tl.static_range(W):
            pre_src = ts - (W - 1) + i
            pre_x = tl.load(xbase + pre_src[:, None] * D + ds[None, :],
                          mask=((pre_src >= 0) & (pre_src < T))[:, None] & dmask[None, :], other=0.0)
            pre_w = tl.load(WT + ds * W + i, mask=dmask, other=0.0)
            pre += pre_w.to(tl.float32)[None, :] * pre_x.to(tl.float32)
            if DYN:
                pre += tl.load(TAPS + ((b * T + ts)[:, None] * G + (ds // P)[None, :]) * W + i, mask=(ts < T)[:, None] & dmask[None, :], other=0.0).to(tl.float32) * pre_x.to(tl.float32)
        dy = tl.load(DY + b * T * D + ts[:, None] * D + ds[None, :], mask=(ts < T)[:, None] & dmask[None, :],
                     other=0.0).to(tl.float32)
        # dpre = dy' * silu'(pre), silu'(p) = s (1 + p (1 - s)), s = sigmoid(p), dy' = dy * residual_scale with a
        # residual; dy' without SiLU
        if RESIDUAL:
            dpre_dy = dy * residual_scale
        else:
            dpre_dy = dy
        if SILU:
            dpre_s = 1.0 / (1.0 + tl.exp(-pre))
            dpre = dpre_dy * dpre_s * (1.0 + pre * (1.0 - dpre_s))
        else:
            dpre = dpre_dy
        for i in tl.static_range(W):
            src = ts - (W - 1) + i
            xs = tl.load(xbase + src[:, None] * D + ds[None, :],
                         mask=((src >= 0) & (src < T))[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            acc += tl.where(taps[None, :] == i, tl.sum(dpre * xs, axis=1)[:, None], 0.0)
    tl.store(DTAPS + ((b * T + ts)[:, None] * G + group) * W + taps[None, :], acc.to(DTAPS.dtype.element_ty),
             mask=(ts < T)[:, None] & (taps < W)[None, :])


@triton.jit
def kda_short_conv_dw_reduce_kernel(DWP, DW, P, N, BLOCK: tl.constexpr):
    """DWP [P, N] float32 partial weight gradients (N = D * W) -> DW [N] = their sum, in a fixed order (no atomics:
    deterministic), stored in DW's dtype."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, P):
        acc += tl.load(DWP + p * N + offs, mask=mask, other=0.0)
    tl.store(DW + offs, acc.to(DW.dtype.element_ty), mask=mask)


class ShortConvFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, silu, residual_scale, taps):
        x_c, w_c = x.contiguous(), weight.contiguous()
        taps_c = None if taps is None else taps.contiguous()
        b, t, d = x_c.shape
        warps = target_settings(x_c.device)["num_warps"]
        ctx.variant = _variant(silu, residual_scale)
        y = torch.empty_like(x_c)
        if y.numel() > 0:
            kda_short_conv_fwd_kernel[(b * triton.cdiv(t, BT), triton.cdiv(d, BD))](
                x_c, w_c, Y=y, T=t, D=d, W=w_c.shape[1], BT=BT, BD=BD, num_warps=warps, **_dynamic(x_c, taps_c),
                **ctx.variant)
        ctx.save_for_backward(x_c, w_c, taps_c)
        return y

    @staticmethod
    def backward(ctx, dy):
        x_c, w_c, taps_c = ctx.saved_tensors
        b, t, d = x_c.shape
        settings = target_settings(x_c.device)
        warps = settings["num_warps"]
        dy_c = dy.contiguous()
        grid = (b * triton.cdiv(t, BT), triton.cdiv(d, BD))
        dx = torch.empty_like(x_c)
        dwp = torch.zeros(grid[0], d, w_c.shape[1], dtype=torch.float32, device=x_c.device)
        if dx.numel() > 0:
            dpre = torch.empty(b, t, d, dtype=torch.float32, device=x_c.device)
            kda_short_conv_dpre_kernel[grid](x_c, w_c, DY=dy_c, DPRE=dpre, T=t, D=d, W=w_c.shape[1], BT=BT, BD=BD,
                                             num_warps=warps, **_dynamic(x_c, taps_c), **ctx.variant)
            cap = settings["bwd_residual_maxnreg" if ctx.variant["RESIDUAL"] else "bwd_maxnreg"]
            kda_short_conv_bwd_kernel[grid](x_c, w_c, DY=dy_c, DPRE=dpre, DX=dx, DWP=dwp, T=t, D=d,
                                            residual_scale=ctx.variant["residual_scale"], W=w_c.shape[1], BT=BT,
                                            BD=BD, RESIDUAL=ctx.variant["RESIDUAL"], num_warps=warps,
                                            **_dynamic(x_c, taps_c), **({"maxnreg": cap} if cap else {}))
        dtaps = None if taps_c is None else _dtaps(x_c, w_c, taps_c, dy_c, ctx.variant, warps)
        return dx, _reduce_weight_grads(dwp, w_c), None, None, dtaps


REDUCE_BLOCK = 1024


def _reduce_weight_grads(dwp, weight):
    """dwp [P, D, W] float32 partials -> the weight gradient [D, W] in weight.dtype."""
    dw = torch.empty_like(weight)
    n = weight.numel()
    if n > 0:
        kda_short_conv_dw_reduce_kernel[(triton.cdiv(n, REDUCE_BLOCK),)](dwp, dw, dwp.shape[0], n,
                                                                          BLOCK=REDUCE_BLOCK, num_warps=4)
    return dw


def _variant(silu, residual_scale):
    """The kernels' variant arguments: SILU, RESIDUAL (constexprs) and residual_scale (1.0 where none)."""
    return {"SILU": bool(silu), "RESIDUAL": residual_scale is not None,
            "residual_scale": 1.0 if residual_scale is None else float(residual_scale)}


def _dynamic(x, taps):
    """The kernels' per-token tap arguments for x [B, T, D]: TAPS [B, T, G, W] (x where there are none: never
    read), G, P (channels a group) and DYN (constexpr)."""
    if taps is None:
        return {"TAPS": x, "G": 1, "P": 1, "DYN": False}
    return {"TAPS": taps, "G": taps.shape[2], "P": x.shape[2] // taps.shape[2], "DYN": True}


def _dtaps(x_c, w_c, taps_c, dy_c, variant, warps):
    """The per-token taps' gradient [B, T, G, W] in taps' dtype (kda_short_conv_dtaps_kernel)."""
    b, t, d = x_c.shape
    groups, w = taps_c.shape[2], w_c.shape[1]
    dtaps = torch.empty_like(taps_c)
    if dtaps.numel() > 0:
        kda_short_conv_dtaps_kernel[(b * triton.cdiv(t, BT), groups)](
            x_c, w_c, taps_c, dy_c, dtaps, t, d, groups, d // groups, W=w, BT=BT, BD=BD, BW=triton.next_power_of_2(w),
            DYN=True, num_warps=warps, **variant)
    return dtaps


def run(x, weight, silu=True, residual_scale=None, taps=None):
    """x [B, T, D] float32/float16/bfloat16, weight [D, W] -> silu(causal depthwise conv1d(x)) [B, T, D] in x.dtype
    (no SiLU where silu is False; then (. + x) * residual_scale where one is given); taps [B, T, G, W] (G dividing
    D): per-token taps added to weight's, each shared by the D / G channels of its group."""
    if taps is not None and (taps.dim() != 4 or tuple(taps.shape[:2]) != tuple(x.shape[:2]) or not taps.shape[2]
                             or taps.shape[3] != weight.shape[1] or x.shape[2] % taps.shape[2]):
        raise ValueError(f"kda_short_conv: taps {tuple(taps.shape)} is not [B, T, G, W] = [{x.shape[0]}, "
                         f"{x.shape[1]}, G, {weight.shape[1]}] with G dividing D = {x.shape[2]}")
    return ShortConvFunction.apply(x, weight, silu, residual_scale, taps)
