"""moe_topk candidate rendered from templates/moe_topk/rounds.py.j2.

one program per ROUTE_T tokens holds their expert rows in registers and takes the top k by k rounds of argmax
params: ROUTE_T=4, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "moe_topk"
TEMPLATE = "rounds"
ROUTE_T = 4
RENORM_EPS = tl.constexpr(1e-20)  # read inside the kernels: a GPU compile accepts only constexpr globals
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
def _scores(z, emask, SCORE: tl.constexpr):
    """z [R, E_PAD] float32 logits (columns past E masked out by emask) -> (s, shift, denom): the scores, and for
    softmax (SCORE 1) the row max and the sum of exponentials (one score is exp(z - shift) / denom)."""
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
    return s, shift, denom


@triton.jit
def _score_of(z, shift, denom, SCORE: tl.constexpr):
    """One score per row from its float32 logit z [R] and the row's (shift, denom) from _scores."""
    if SCORE == 1:
        return tl.exp(z - shift) / denom
    return _elementwise_score(z, SCORE)


@triton.jit
def moe_topk_rounds_fwd_kernel(L, BIAS, WOUT, IDS, COUNTS, N, E, k, stride_l, route_scale, n_group, topk_group,
                               SCORE: tl.constexpr, RENORM: tl.constexpr, GROUPED: tl.constexpr,
                               ROUTE_T: tl.constexpr, E_PAD: tl.constexpr, K_PAD: tl.constexpr):
    """ROUTE_T tokens per program, the whole expert row in registers: scores from the logits L [N, E] (upcast to
    float32), then k rounds of argmax over s + bias, each one int64 max over packed keys (order-preserving bits of
    the float32 score high, E_PAD - 1 - e low: the lowest index wins a tie) that then masks its winner; GROUPED:
    only among the experts of the kept groups. Writes WOUT [N, k] (renormalized, scaled), IDS [N, k] int64 in
    selection order, and adds the winners to COUNTS [E] (integer atomics: exact in any order)."""
    t = tl.program_id(0).to(tl.int64) * ROUTE_T + tl.arange(0, ROUTE_T)
    e = tl.arange(0, E_PAD)
    tmask = t < N
    emask = e[None, :] < E
    z = tl.load(L + t[:, None] * stride_l + e[None, :], mask=tmask[:, None] & emask, other=0.0).to(tl.float32)
    s, shift, denom = _scores(z, emask, SCORE)
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
        hit = e[None, :] == idx[:, None]
        picked = tl.where(kcol == j, tl.sum(tl.where(hit, s, 0.0), axis=1)[:, None], picked)
        ids = tl.where(kcol == j, idx[:, None], ids)
        packed = tl.where(hit, -(2**62), packed)
        tl.atomic_add(COUNTS + idx, 1, mask=tmask)
    if RENORM:
        picked = picked / (tl.sum(picked, axis=1)[:, None] + RENORM_EPS)
    out_mask = tmask[:, None] & (kcol < k)
    tl.store(WOUT + t[:, None] * k + kcol, picked * route_scale, mask=out_mask)
    tl.store(IDS + t[:, None] * k + kcol, ids, mask=out_mask)


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


def run(logits, bias, topk, score_func, renormalize, route_scale, n_group=1, topk_group=1):
    """logits [N, E] float32/float16/bfloat16 (rows may be strided, E contiguous), bias [E] float32 -> (weights
    [N, topk] float32 (float64 for float64 logits), ids [N, topk] int64 in descending s + bias order, counts [E]
    int64)."""
    n, e = logits.shape
    if not 1 <= topk <= e:
        raise ValueError(f"topk must be in [1, E]; got topk={topk}, E={e}")
    _check_groups(e, topk, n_group, topk_group)
    mode = _mode(score_func, None, renormalize)
    l_c = logits if logits.stride(-1) == 1 else logits.contiguous()
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    weights = torch.empty(n, topk, dtype=out_dtype, device=logits.device)
    ids = torch.empty(n, topk, dtype=torch.int64, device=logits.device)
    counts = torch.zeros(e, dtype=torch.int64, device=logits.device)
    settings = target_settings(logits.device)
    # at least one program, so that counts are produced by a kernel even without tokens (they stay zero)
    moe_topk_rounds_fwd_kernel[(max(1, triton.cdiv(n, ROUTE_T)),)](
        l_c, bias.contiguous(), weights, ids, counts, n, e, topk, l_c.stride(0), float(route_scale), n_group,
        topk_group, SCORE=mode["SCORE"], RENORM=mode["RENORM"], GROUPED=n_group > 1,
        ROUTE_T=ROUTE_T, E_PAD=triton.next_power_of_2(e), K_PAD=triton.next_power_of_2(topk),
        num_warps=settings["num_warps"])
    return weights, ids, counts
