"""kda_prefill candidate rendered from templates/kda_prefill/v_tiled.py.j2.

(sequence, value head, V tile) programs, each stepping one [K, BV] tile of a state through its sequence's tokens in registers
params: BV=32, num_warps=4
"""
import torch
import triton
import triton.language as tl

BLOCK = "kda_prefill"
TEMPLATE = "v_tiled"
BV = 32
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
def kda_prefill_recurrent_kernel(Q, K, V, G, BETA, CACHE, CU, SLOTS, HAS, O, scale, H, HV, KD, VD, S_SLOT, S_HEAD,
                                 S_K, S_V, BK: tl.constexpr, BV: tl.constexpr):
    """Program (sequence n, value head hv, V tile): the [BK, BV] tile of the sequence's state (from its slot, or
    zeros) stepped through its tokens in registers, each token's o columns stored, the final tile written back.
    Q, K [TOTAL, H, KD]; V, O [TOTAL, HV, VD]; G [TOTAL, HV, KD]; BETA [TOTAL, HV]; CACHE [SLOTS, HV, KD, VD]
    with strides S_SLOT, S_HEAD, S_K, S_V; CU [S + 1]; SLOTS, HAS [S]; every other tensor contiguous."""
    n = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1).to(tl.int64)
    ok = tl.arange(0, BK)
    h = hv // (HV // H)
    mk = ok < KD
    ct = CACHE.dtype.element_ty
    start = tl.load(CU + n).to(tl.int64)
    end = tl.load(CU + n + 1).to(tl.int64)
    keep = tl.load(HAS + n).to(tl.int32) != 0
    slot = tl.load(SLOTS + n).to(tl.int64)
    rows = slot * S_SLOT + hv * S_HEAD + ok.to(tl.int64) * S_K  # each key row of the state (any layout)
    ov = tl.program_id(2) * BV + tl.arange(0, BV)
    mv = ov < VD
    mask = mk[:, None] & mv[None, :]
    p_s = CACHE + rows[:, None] + ov[None, :] * S_V
    s = tl.where(keep, tl.load(p_s, mask=mask, other=0.0), 0.0)  # without a state: zeros
    for r in range(start, end):
        q = tl.load(Q + (r * H + h) * KD + ok, mask=mk, other=0.0).to(ct) * scale
        k = tl.load(K + (r * H + h) * KD + ok, mask=mk, other=0.0).to(ct)
        decay = tl.exp(tl.load(G + (r * HV + hv) * KD + ok, mask=mk, other=0.0).to(ct))
        beta = tl.load(BETA + r * HV + hv).to(ct)
        v = tl.load(V + (r * HV + hv) * VD + ov, mask=mv, other=0.0).to(ct)
        s = s * decay[:, None]
        s = s + k[:, None] * (beta * (v - tl.sum(s * k[:, None], axis=0)))[None, :]  # + k beta (v - S^T k)^T
        tl.store(O + (r * HV + hv) * VD + ov, tl.sum(s * q[:, None], axis=0).to(O.dtype.element_ty), mask=mv)
    tl.store(p_s, s, mask=mask)


def run(q, k, v, g, beta, scale, state_cache, cu_seqlens, slots, has_state):
    """q, k [TOTAL, H, K]; v [TOTAL, HV, V]; g [TOTAL, HV, K]; beta [TOTAL, HV] (float32/float16/bfloat16);
    state_cache [SLOTS, HV, K, V] float32 (float64 for float64 inputs) in any strides (K x V, or vLLM's V x K as a
    transposed view), updated in place; cu_seqlens [S + 1] int32; slots [S] int (distinct); has_state [S] bool ->
    (o [TOTAL, HV, V] in v.dtype, state_cache)."""
    total, h, kd = q.shape
    hv, vd = v.shape[1], v.shape[2]
    if hv % h:
        raise ValueError(f"kda_prefill: HV={hv} is not a multiple of H={h}")
    s = slots.shape[0]
    o = torch.empty(total, hv, vd, dtype=v.dtype, device=v.device)
    if s and hv and vd:
        warps = target_settings(v.device)["num_warps"]
        kda_prefill_recurrent_kernel[(s, hv, triton.cdiv(vd, BV))](
            q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), state_cache,
            cu_seqlens.contiguous(), slots.contiguous(), has_state.contiguous(), o, scale, h, hv, kd, vd,
            *state_cache.stride(), BK=triton.next_power_of_2(kd), BV=BV, num_warps=warps)
    return o, state_cache
