"""kda_short_conv_prefill candidate rendered from templates/kda_short_conv_prefill/seq_tiled.py.j2.

(sequence, channel tile) programs, each walking its sequence BT tokens a step and writing its state back
params: BD=64, BT=16, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "kda_short_conv_prefill"
TEMPLATE = "seq_tiled"
BD = 64
BT = 16
# Launch settings per target: LAUNCH_SETTINGS[key] for the launch's target name ("sm_90a", "gfx942"), else its
# backend ("cuda", "hip"), else "default"; "interpreter" is Triton's CPU interpreter (float32 dots only).
LAUNCH_TARGET = None  # the target whose launches are being recorded; None: the tensors' own device decides
# The launch settings the port chose for each target (its tuning searched the template's declared space): they
# override LAUNCH_SETTINGS for that target.
TUNED_SETTINGS = {'sm_100a': {'num_warps': 8}, 'sm_80': {'num_warps': 8}, 'sm_90a': {'num_warps': 8}}


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
def kda_short_conv_prefill_seq_kernel(X, WT, CACHE, CU, SLOTS, HAS, Y, D, L, W: tl.constexpr, BD: tl.constexpr,
                                      BT: tl.constexpr, BL: tl.constexpr, CT: tl.constexpr):
    """Program (sequence n, channel tile): the sequence's outputs BT tokens a step, the first W - 1 taps of its first
    tokens on its state, then its last L inputs written to its slot. X, Y [TOTAL, D]; WT [D, W]; CACHE [SLOTS, D, L];
    CU [S + 1]; SLOTS, HAS [S]; all contiguous."""
    n = tl.program_id(0).to(tl.int64)
    ds = tl.program_id(1).to(tl.int64) * BD + tl.arange(0, BD)
    dmask = ds < D
    start = tl.load(CU + n).to(tl.int64)
    T = tl.load(CU + n + 1).to(tl.int64) - start
    slot = tl.load(SLOTS + n).to(tl.int64)
    first = tl.where(tl.load(HAS + n).to(tl.int32) != 0, 0, L)  # the first state column it has: all, or none
    row = CACHE + (slot * D + ds) * L  # each channel's state in the slot, oldest input first
    for t0 in range(0, T, BT):
        ts = t0 + tl.arange(0, BT)
        acc = tl.zeros([BT, BD], dtype=CT)
        for i in tl.static_range(W):
            p = ts - (W - 1) + i  # the input position each output reads: before 0, the state's column L + p
            live = (ts < T)[:, None] & dmask[None, :]
            xs = tl.load(X + (start + p)[:, None] * D + ds[None, :], mask=live & (p >= 0)[:, None], other=0.0)
            from_state = (p < 0) & (L + p >= first)
            ss = tl.load(row[None, :] + (L + p)[:, None], mask=live & from_state[:, None], other=0.0)
            tap = tl.load(WT + ds * W + i, mask=dmask, other=0.0).to(CT)
            acc += tap[None, :] * (xs.to(CT) + ss.to(CT))
        tl.store(Y + (start + ts)[:, None] * D + ds[None, :], (acc / (1.0 + tl.exp(-acc))).to(Y.dtype.element_ty),
                 mask=(ts < T)[:, None] & dmask[None, :])
    cols = tl.arange(0, BL)
    q = T - L + cols  # the input each state column takes: x's token q, or (q < 0) the old state's column T + cols
    keep = dmask[:, None] & (cols < L)[None, :]
    xs = tl.load(X + (start + q)[None, :] * D + ds[:, None], mask=keep & (q >= 0)[None, :], other=0.0)
    from_state = (q < 0) & (T + cols >= first)
    ss = tl.load(row[:, None] + (T + cols)[None, :], mask=keep & from_state[None, :], other=0.0)
    tl.debug_barrier()  # every thread has read the old state before any overwrites it
    tl.store(row[:, None] + cols[None, :], (xs + ss).to(CACHE.dtype.element_ty), mask=keep)


def run(x, weight, conv_cache, cu_seqlens, slots, has_state):
    """x [TOTAL, D], weight [D, W] (float32/float16/bfloat16); conv_cache [SLOTS, D, L] in x's dtype, L >= W - 1,
    contiguous, updated in place; cu_seqlens [S + 1] int32; slots [S] int (distinct); has_state [S] bool
    -> (y [TOTAL, D] in x.dtype, conv_cache)."""
    if not conv_cache.is_contiguous():
        raise ValueError("kda_short_conv_prefill: the conv cache is updated in place and must be contiguous")
    total, d = x.shape
    s, w, length = slots.shape[0], weight.shape[1], conv_cache.shape[2]
    if length < w - 1:
        raise ValueError(f"kda_short_conv_prefill: a state of {length} inputs is shorter than W - 1 = {w - 1}")
    y = torch.empty(total, d, dtype=x.dtype, device=x.device)
    if s and d:
        x_c, cu, slots_c = x.contiguous(), cu_seqlens.contiguous(), slots.contiguous()
        has = has_state.contiguous()
        bl, warps = triton.next_power_of_2(max(length, 1)), target_settings(x.device)["num_warps"]
        ct = tl.float64 if x.dtype == torch.float64 else tl.float32
        kda_short_conv_prefill_seq_kernel[(s, triton.cdiv(d, BD))](
            x_c, weight.contiguous(), conv_cache, cu, slots_c, has, y, d, length, W=w, BD=BD, BT=BT, BL=bl, CT=ct,
            num_warps=warps)
    return y, conv_cache