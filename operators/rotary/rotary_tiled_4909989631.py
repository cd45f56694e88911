"""rotary candidate rendered from templates/rotary/tiled.py.j2.

a 2-D grid of (batch x token tile, head tile) programs, each rotating BT tokens x BH heads; one kernel for both passes
params: BT=16, BH=4, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "rotary"
TEMPLATE = "tiled"
BT = 16
BH = 4
TILE = {"BT": BT, "BH": BH}
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
def rotary_pairs_kernel(X, COS, SIN, Y, B, T, H, D, R, ROT0, P0, sxb, sxt, sxh, scb, sct, ssb, sst,
                        BT: tl.constexpr, BH: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
                        INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr):
    """Program (b * cdiv(T, BT) + token tile, head tile) rotates BT tokens x BH heads. X [B, T, H, D] with strides
    (sxb, sxt, sxh, 1); COS, SIN [B, T, R] (strides (scb, sct, 1), (ssb, sst, 1); scb = ssb = 0 to broadcast one
    row of positions); Y contiguous [B, T, H, D]. Forward: the pair (x1, x2) read at (2i, 2i + 1) (INTERLEAVED) or
    (i, i + R/2), y[i] = x1 c1 - x2 s1, y[i + R/2] = x2 c2 + x1 s2 (c1 = cos[i], c2 = cos[i + R/2]; INTERLEAVED:
    c2 = c1, s2 = s1). BACKWARD: the
    transpose, dy read at (i, i + R/2) and dx1 = dy1 c1 + dy2 s2, dx2 = dy2 c2 - dy1 s1 written at the pair's
    channels. The pairs are read and written from channel ROT0 (0, or D - R with the rope part last), and the other
    D - R channels, from P0, are copied. Math in float32, stored in Y's dtype."""
    tiles = tl.cdiv(T, BT)
    b = (tl.program_id(0) // tiles).to(tl.int64)
    ts = (tl.program_id(0) % tiles).to(tl.int64) * BT + tl.arange(0, BT)
    hs = tl.program_id(1).to(tl.int64) * BH + tl.arange(0, BH)
    half = R // 2
    i = tl.arange(0, BR)
    angle_mask = (ts < T)[:, None] & (i < half)[None, :]
    c1 = tl.load(COS + b * scb + ts[:, None] * sct + i[None, :], mask=angle_mask, other=0.0).to(tl.float32)[:, None, :]
    s1 = tl.load(SIN + b * ssb + ts[:, None] * sst + i[None, :], mask=angle_mask, other=0.0).to(tl.float32)[:, None, :]
    if INTERLEAVED:  # one angle a pair: the first half's
        c2 = c1
        s2 = s1
    else:
        c2 = tl.load(COS + b * scb + ts[:, None] * sct + half + i[None, :], mask=angle_mask, other=0.0).to(
            tl.float32)[:, None, :]
        s2 = tl.load(SIN + b * ssb + ts[:, None] * sst + half + i[None, :], mask=angle_mask, other=0.0).to(
            tl.float32)[:, None, :]
    rows = (ts < T)[:, None, None] & (hs < H)[None, :, None]
    mask = rows & (i < half)[None, None, :]
    xbase = X + b * sxb + ts[:, None, None] * sxt + hs[None, :, None] * sxh
    ybase = Y + ((b * T + ts[:, None, None]) * H + hs[None, :, None]) * D
    rbase = xbase + ROT0  # the rotated channels' first, in X and in Y
    wbase = ybase + ROT0
    if INTERLEAVED:
        first = 2 * i[None, None, :]
        second = first + 1
    else:
        first = i[None, None, :]
        second = first + half
    if BACKWARD:  # the transposed rotation: dy read in the half layout, dx written at the pair's channels
        a1 = tl.load(rbase + i[None, None, :], mask=mask, other=0.0).to(tl.float32)
        a2 = tl.load(rbase + half + i[None, None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(wbase + first, (a1 * c1 + a2 * s2).to(Y.dtype.element_ty), mask=mask)
        tl.store(wbase + second, (a2 * c2 - a1 * s1).to(Y.dtype.element_ty), mask=mask)
    else:
        a1 = tl.load(rbase + first, mask=mask, other=0.0).to(tl.float32)
        a2 = tl.load(rbase + second, mask=mask, other=0.0).to(tl.float32)
        tl.store(wbase + i[None, None, :], (a1 * c1 - a2 * s1).to(Y.dtype.element_ty), mask=mask)
        tl.store(wbase + half + i[None, None, :], (a2 * c2 + a1 * s2).to(Y.dtype.element_ty), mask=mask)
    for p0 in range(0, D - R, BP):  # the channels outside the rotary width, unchanged
        ps = p0 + tl.arange(0, BP)[None, None, :]
        kept = rows & (ps < D - R)
        tl.store(ybase + P0 + ps, tl.load(xbase + P0 + ps, mask=kept, other=0.0).to(Y.dtype.element_ty), mask=kept)


def _rotate(x, cos, sin, interleaved, rope_last, backward):
    """One launch of rotary_pairs_kernel over x [B, T, H, D] (channels contiguous) -> a contiguous [B, T, H, D] in
    x.dtype."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    b, t, h, d = x.shape
    r = cos.shape[-1]
    y = torch.empty(b, t, h, d, dtype=x.dtype, device=x.device)
    if y.numel() > 0:
        rotary_pairs_kernel[(b * triton.cdiv(t, BT), triton.cdiv(h, BH))](
            x, cos, sin, y, b, t, h, d, r, d - r if rope_last else 0, 0 if rope_last else r,
            x.stride(0), x.stride(1), x.stride(2),
            cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1), sin.stride(0) if sin.shape[0] > 1 else 0,
            sin.stride(1), BR=triton.next_power_of_2(max(r // 2, 1)),
            BP=triton.next_power_of_2(min(max(d - r, 1), 128)), INTERLEAVED=bool(interleaved), BACKWARD=backward,
            **TILE, num_warps=target_settings(x.device)["num_warps"])
    return y


class RotaryFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, rope_last):
        ctx.interleaved, ctx.rope_last = interleaved, rope_last
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, interleaved, rope_last, False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _rotate(dy, cos, sin, ctx.interleaved, ctx.rope_last, True), None, None, None, None


def run(x, cos, sin, interleaved=False, rope_last=False):
    """x [B, T, H, D] float32/float16/bfloat16 (any strides, channels contiguous or copied), cos, sin [B, T, R] (or
    [1, T, R]) -> y [B, T, H, D] in x.dtype: the first R channels (rope_last: the last R) rotated (interleaved pairs
    read as transformers' _interleave form reads them, output in the half layout), the rest unchanged."""
    return RotaryFunction.apply(x, cos, sin, interleaved, rope_last)
