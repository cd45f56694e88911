"""kda_short_conv_decode candidate rendered from templates/kda_short_conv_decode/channel_tiled.py.j2.

a 2-D grid of (sequence, channel tile) programs, each updating one tile of one sequence's state in place
params: BD=256, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "kda_short_conv_decode"
TEMPLATE = "channel_tiled"
BD = 256
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
def kda_short_conv_decode_step_kernel(X, WT, TAPS, CACHE, SLOTS, Y, N, D, L, G, P, residual_scale, W: tl.constexpr,
                                      BD: tl.constexpr, BW: tl.constexpr, BL: tl.constexpr, CT: tl.constexpr,
                                      SILU: tl.constexpr, RESIDUAL: tl.constexpr, DYN: tl.constexpr):
    """Program (sequence n, channel tile): y for BD channels from the sequence's state in slot SLOTS[n] and its new
    input, the state shifted in place. X, Y [N, D]; WT [D, W]; CACHE [SLOTS, D, L]; TAPS [N, G, W] (read with DYN);
    all contiguous."""
    n = tl.program_id(0).to(tl.int64)
    ds = tl.program_id(1).to(tl.int64) * BD + tl.arange(0, BD)
    dmask = ds < D
    wc = tl.arange(0, BW)
    taps = tl.load(WT + ds[:, None] * W + wc[None, :], mask=dmask[:, None] & (wc < W)[None, :], other=0.0).to(CT)
    slot = tl.load(SLOTS + n).to(tl.int64)
    row = CACHE + (slot * D + ds) * L  # each channel's state in the slot, oldest input first
    x = tl.load(X + n * D + ds, mask=dmask, other=0.0)
    past = tl.load(row[:, None] + (L - (W - 1) + wc)[None, :], mask=dmask[:, None] & (wc < W - 1)[None, :],
                   other=0.0)
    window = tl.where((wc == W - 1)[None, :], x[:, None], past).to(CT)  # the last W - 1 inputs, then x
    if DYN:
        own = tl.load(TAPS + (n * G + ds // P)[:, None] * W + wc[None, :], mask=dmask[:, None] & (wc < W)[None, :],
                      other=0.0).to(CT)
        pre = tl.sum(window * (taps + own), axis=1)
    else:
        pre = tl.sum(window * taps, axis=1)
    if SILU:
        y = pre / (1.0 + tl.exp(-pre))
    else:
        y = pre
    if RESIDUAL:
        y = (y + x.to(CT)) * residual_scale
    tl.store(Y + n * D + ds, y.to(Y.dtype.element_ty), mask=dmask)
    cols = tl.arange(0, BL)
    shifted = tl.load(row[:, None] + 1 + cols[None, :], mask=dmask[:, None] & (cols < L - 1)[None, :], other=0.0)
    tl.store(row[:, None] + cols[None, :], tl.where((cols == L - 1)[None, :], x[:, None], shifted),
             mask=dmask[:, None] & (cols < L)[None, :])


def run(x, weight, conv_cache, slots, silu=True, residual_scale=None, taps=None):
    """x [N, D], weight [D, W] (float32/float16/bfloat16); conv_cache [SLOTS, D, L] in x's dtype, L >= W - 1,
    contiguous, updated in place; slots [N] int -> (y [N, D] in x.dtype, conv_cache). silu False: no activation;
    residual_scale: y = (y + x) * residual_scale; taps [N, G, W] (G dividing D): each sequence's own taps, added to
    weight's, shared by the D / G channels of a group."""
    if not conv_cache.is_contiguous():
        raise ValueError("kda_short_conv_decode: the conv cache is updated in place and must be contiguous")
    n, d = x.shape
    w, length = weight.shape[1], conv_cache.shape[2]
    if length < w - 1:
        raise ValueError(f"kda_short_conv_decode: a state of {length} inputs is shorter than W - 1 = {w - 1}")
    if taps is not None and (taps.dim() != 3 or taps.shape[0] != n or taps.shape[2] != w or not taps.shape[1]
                             or d % taps.shape[1]):
        raise ValueError(f"kda_short_conv_decode: taps {tuple(taps.shape)} is not [N, G, W] = [{n}, G, {w}] with G "
                         f"dividing D = {d}")
    groups = 1 if taps is None else taps.shape[1]
    y = torch.empty(n, d, dtype=x.dtype, device=x.device)
    if n and d:
        warps = target_settings(x.device)["num_warps"]
        kda_short_conv_decode_step_kernel[(n, triton.cdiv(d, BD))](
            x.contiguous(), weight.contiguous(), x if taps is None else taps.contiguous(), conv_cache,
            slots.contiguous(), y, n, d, length, groups, d // groups,
            1.0 if residual_scale is None else float(residual_scale), W=w, BD=BD, BW=triton.next_power_of_2(w),
            BL=triton.next_power_of_2(max(length, 1)), CT=tl.float64 if x.dtype == torch.float64 else tl.float32,
            SILU=bool(silu), RESIDUAL=residual_scale is not None, DYN=taps is not None, num_warps=warps)
    return y, conv_cache
