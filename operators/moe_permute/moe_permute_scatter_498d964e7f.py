"""moe_permute candidate rendered from templates/moe_permute/scatter.py.j2.

tile histograms + a prefix scan over tiles (a parallel counting sort), then each slot tile scatters its x rows to their rows
params: BLOCK_S=64, BLOCK_E=256, BLOCK_D=64, num_warps=4
launch on sm_100a: num_warps=8
launch on sm_80: num_warps=8
launch on sm_90a: num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "moe_permute"
TEMPLATE = "scatter"
BLOCK_S = 64
BLOCK_E = 256
BLOCK_D = 64
BLOCK_R = 16
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
# Warps per target: the scatter's BLOCK_S x E_PAD counts (896 experts at the model suite) fit a thread's registers
# over 8 warps on NVIDIA, not over 4. `workbench targets` shows each launch's registers and spills per target.
LAUNCH_SETTINGS = {"default": {"num_warps": 4}}


@triton.jit
def moe_permute_hist_fwd_kernel(IDS, HIST, NK, E, BLOCK_S: tl.constexpr, E_PAD: tl.constexpr):
    """HIST [n_tiles, E + 1] int64: per tile of BLOCK_S flat slots, how many go to each expert (column E: dropped,
    ids < 0), by a [BLOCK_S, E_PAD] comparison."""
    tile = tl.program_id(0).to(tl.int64)
    s = tile * BLOCK_S + tl.arange(0, BLOCK_S)
    ids = tl.load(IDS + s, mask=s < NK, other=0)
    col = tl.where(ids < 0, E, ids)
    c = tl.arange(0, E_PAD)
    hit = (col[:, None] == c[None, :]) & (s[:, None] < NK)
    tl.store(HIST + tile * (E + 1) + c, tl.sum(hit.to(tl.int64), axis=0), mask=c < E + 1)


@triton.jit
def moe_permute_scan_fwd_kernel(HIST, TOTALS, n_tiles, E, BLOCK_E: tl.constexpr):
    """In place over HIST [n_tiles, E + 1]: each column becomes its exclusive prefix over the tiles (the rank of a
    tile's first slot within its expert); TOTALS [E + 1] gets the column sums. One program per BLOCK_E columns,
    walking the tiles in order."""
    c = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    cmask = c < E + 1
    running = tl.full((BLOCK_E,), 0, tl.int64)
    for tile in range(0, n_tiles):
        ptr = HIST + tl.cast(tile, tl.int64) * (E + 1) + c
        h = tl.load(ptr, mask=cmask, other=0)
        tl.store(ptr, running, mask=cmask)
        running += h
    tl.store(TOTALS + c, running, mask=cmask)


@triton.jit
def moe_permute_offsets_fwd_kernel(TOTALS, COUNTS, OFFSETS, E, E_PAD: tl.constexpr):
    """COUNTS [E] = TOTALS[:E]; OFFSETS [E + 1] = exclusive prefix of TOTALS (OFFSETS[E] = routed slots, where the
    dropped slots' tail rows start)."""
    c = tl.arange(0, E_PAD)
    tot = tl.load(TOTALS + c, mask=c < E + 1, other=0)
    tl.store(OFFSETS + c, tl.cumsum(tot, axis=0) - tot, mask=c < E + 1)
    tl.store(COUNTS + c, tot, mask=c < E)


@triton.jit
def moe_permute_scatter_fwd_kernel(IDS, HIST, OFFSETS, X, XP, TOKEN_OF_ROW, ROW_OF_SLOT, NK, E, D, k, stride_x,
                                   stride_xp, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """Per tile of BLOCK_S flat slots: row = OFFSETS[e] + HIST[tile, e] (prefix) + rank among the tile's earlier
    slots of the same expert (a [BLOCK_S, BLOCK_S] comparison), dropped slots counted as expert E (the tail rows).
    Writes ROW_OF_SLOT (-1 if dropped), TOKEN_OF_ROW (-1 for tail rows) and scatters x rows into XP, zeros into the
    tail rows: every row is written exactly once."""
    tile = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_S)
    s = tile * BLOCK_S + i
    smask = s < NK
    ids = tl.load(IDS + s, mask=smask, other=0)
    col = tl.where(ids < 0, E, ids)
    same_before = (col[:, None] == col[None, :]) & (i[None, :] < i[:, None]) & smask[None, :]
    rank = tl.sum(same_before.to(tl.int64), axis=1)
    base = tl.load(OFFSETS + col, mask=smask, other=0) + tl.load(HIST + tile * (E + 1) + col, mask=smask, other=0)
    row = base + rank
    routed = ids >= 0
    tok = s // k
    tl.store(ROW_OF_SLOT + s, tl.where(routed, row, -1), mask=smask)
    tl.store(TOKEN_OF_ROW + row, tl.where(routed, tok, -1), mask=smask)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        v = tl.load(X + tok[:, None] * stride_x + d[None, :], mask=(smask & routed)[:, None] & (d[None, :] < D),
                    other=0.0)
        tl.store(XP + row[:, None] * stride_xp + d[None, :], v, mask=smask[:, None] & (d[None, :] < D))


@triton.jit
def moe_permute_bwd_kernel(DXP, ROW_OF_SLOT, DX, N, D, k, stride_dxp, stride_dx,
                           BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """DX [N, D] row t = sum over j of DXP [M, D] row ROW_OF_SLOT[t, j] (skipping -1), summed in float32 in slot
    order: a per-token gather, deterministic, no atomics."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.full((BLOCK_R, BLOCK_D), 0, tl.float32)
    for j in range(0, k):
        row = tl.load(ROW_OF_SLOT + t * k + j, mask=t < N, other=-1)
        acc += tl.load(DXP + row[:, None] * stride_dxp + d[None, :], mask=(row[:, None] >= 0) & (d[None, :] < D),
                       other=0.0).to(tl.float32)
    tl.store(DX + t[:, None] * stride_dx + d[None, :], acc.to(DX.dtype.element_ty),
             mask=(t[:, None] < N) & (d[None, :] < D))


class MoEPermuteFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, expert_ids, num_experts):
        n, d = x.shape
        k = expert_ids.shape[1]
        m = n * k
        e = num_experts
        x_c = x if x.stride(-1) == 1 else x.contiguous()
        ids = expert_ids.contiguous()
        n_tiles = triton.cdiv(m, BLOCK_S)
        e_pad = triton.next_power_of_2(e + 1)
        x_perm = torch.empty(m, d, dtype=x.dtype, device=x.device)
        token_of_row = torch.empty(m, dtype=torch.int64, device=x.device)
        row_of_slot = torch.empty(n, k, dtype=torch.int64, device=x.device)
        counts = torch.empty(e, dtype=torch.int64, device=x.device)
        offsets = torch.empty(e + 1, dtype=torch.int64, device=x.device)
        hist = torch.empty(n_tiles, e + 1, dtype=torch.int64, device=x.device)
        warps = target_settings(x.device)["num_warps"]
        totals = torch.empty(e + 1, dtype=torch.int64, device=x.device)
        if n_tiles > 0:
            moe_permute_hist_fwd_kernel[(n_tiles,)](ids, hist, m, e, BLOCK_S=BLOCK_S, E_PAD=e_pad,
                                                    num_warps=warps)
        moe_permute_scan_fwd_kernel[(triton.cdiv(e + 1, BLOCK_E),)](hist, totals, n_tiles, e, BLOCK_E=BLOCK_E,
                                                                    num_warps=warps)
        moe_permute_offsets_fwd_kernel[(1,)](totals, counts, offsets, e, E_PAD=e_pad, num_warps=warps)
        if n_tiles > 0:
            moe_permute_scatter_fwd_kernel[(n_tiles,)](ids, hist, offsets, x_c, x_perm, token_of_row, row_of_slot, m,
                                                       e, d, k, x_c.stride(0), x_perm.stride(0), BLOCK_S=BLOCK_S,
                                                       BLOCK_D=BLOCK_D, num_warps=warps)
        ctx.save_for_backward(row_of_slot)
        ctx.x_shape = x.shape
        ctx.mark_non_differentiable(token_of_row, row_of_slot, counts, offsets)
        return x_perm, token_of_row, row_of_slot, counts, offsets

    @staticmethod
    def backward(ctx, dx_perm, *_):
        (row_of_slot,) = ctx.saved_tensors
        n, k = row_of_slot.shape
        d = ctx.x_shape[1]
        dx = torch.empty(n, d, dtype=dx_perm.dtype, device=dx_perm.device)
        warps = target_settings(dx_perm.device)["num_warps"]
        if n * d > 0:
            dxp = dx_perm if dx_perm.stride(-1) == 1 else dx_perm.contiguous()
            moe_permute_bwd_kernel[(triton.cdiv(n, BLOCK_R), triton.cdiv(d, BLOCK_D))](
                dxp, row_of_slot, dx, n, d, k, dxp.stride(0), dx.stride(0), BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D,
                num_warps=warps)
        return dx, None, None


def run(x, expert_ids, num_experts):
    """x [N, D] float32/float16/bfloat16, expert_ids [N, k] int64 (-1 = dropped) -> (x_perm [N*k, D],
    token_of_row [N*k] int64, row_of_slot [N, k] int64, counts [E] int64, offsets [E + 1] int64)."""
    return MoEPermuteFunction.apply(x, expert_ids, num_experts)
