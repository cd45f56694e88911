"""kda_prologue candidate rendered from templates/kda_prologue/rows.py.j2.

flat rows, BLOCK_R rows of q and of k and as many beta elements per program, one launch each way
params: BLOCK_R=16, num_warps=8
"""
import torch
import triton
import triton.language as tl

BLOCK = "kda_prologue"
TEMPLATE = "rows"
BLOCK_R = 16
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
LAUNCH_SETTINGS = {"default": {"num_warps": 8}}


@triton.jit
def _l2norm_rows(X, Y, rows, n_rows, K, eps, K_PAD: tl.constexpr):
    """Rows [R] (flat indices of [*, K] rows) of X normalised into Y: x / sqrt(sum x^2 + eps), float32 math."""
    rk = tl.arange(0, K_PAD)
    mask = (rows[:, None] < n_rows) & (rk[None, :] < K)
    x = tl.load(X + rows[:, None] * K + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) + eps)
    tl.store(Y + rows[:, None] * K + rk[None, :], (x * r[:, None]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _l2norm_rows_bwd(X, DY, DX, rows, n_rows, K, eps, K_PAD: tl.constexpr):
    """dx = r (dy - y (y . dy)) of rows [R], with r and y = x r recomputed from X (float32 math)."""
    rk = tl.arange(0, K_PAD)
    mask = (rows[:, None] < n_rows) & (rk[None, :] < K)
    x = tl.load(X + rows[:, None] * K + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * K + rk[None, :], mask=mask, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=1) + eps)
    y = x * r[:, None]
    dx = r[:, None] * (dy - y * tl.sum(y * dy, axis=1)[:, None])
    tl.store(DX + rows[:, None] * K + rk[None, :], dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _sigmoid(B, S, offs, mask):
    """S[offs] = sigmoid(B[offs]), float32 math."""
    b = tl.load(B + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(S + offs, tl.sigmoid(b).to(S.dtype.element_ty), mask=mask)


@triton.jit
def _sigmoid_bwd(B, DS, DB, offs, mask):
    """DB[offs] = DS * s (1 - s), s = sigmoid(B) recomputed (float32 math)."""
    s = tl.sigmoid(tl.load(B + offs, mask=mask, other=0.0).to(tl.float32))
    ds = tl.load(DS + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DB + offs, (ds * s * (1.0 - s)).to(DB.dtype.element_ty), mask=mask)


@triton.jit
def kda_prologue_fwd_kernel(Q, K_IN, B, QN, KN, S, n_rows, n_beta, K, eps, BLOCK_R: tl.constexpr,
                            K_PAD: tl.constexpr):
    """Program p: rows p*BLOCK_R .. of q and of k ([B*T*H, K] seen flat) and the same span of beta's B*T*HV
    elements: the grid covers whichever of the two is longer."""
    p = tl.program_id(0).to(tl.int64)
    rows = p * BLOCK_R + tl.arange(0, BLOCK_R)
    _l2norm_rows(Q, QN, rows, n_rows, K, eps, K_PAD)
    _l2norm_rows(K_IN, KN, rows, n_rows, K, eps, K_PAD)
    _sigmoid(B, S, rows, rows < n_beta)


@triton.jit
def kda_prologue_bwd_kernel(Q, K_IN, B, DQN, DKN, DS, DQ, DK, DB, n_rows, n_beta, K, eps, BLOCK_R: tl.constexpr,
                            K_PAD: tl.constexpr):
    """The forward's spans: dq, dk (rows) and d beta_logits (elements), inputs recomputed from."""
    p = tl.program_id(0).to(tl.int64)
    rows = p * BLOCK_R + tl.arange(0, BLOCK_R)
    _l2norm_rows_bwd(Q, DQN, DQ, rows, n_rows, K, eps, K_PAD)
    _l2norm_rows_bwd(K_IN, DKN, DK, rows, n_rows, K, eps, K_PAD)
    _sigmoid_bwd(B, DS, DB, rows, rows < n_beta)


def _launch(kernel, q, k, b, *tensors, eps):
    """One launch over max(rows of q, elements of beta) / BLOCK_R programs; tensors: the kernel's others."""
    n_rows, width = q.numel() // q.shape[-1], q.shape[-1]
    grid = (triton.cdiv(max(n_rows, b.numel()), BLOCK_R),)
    warps = target_settings(q.device)["num_warps"]
    kernel[grid](q, k, b, *tensors, n_rows, b.numel(), width, eps, BLOCK_R=BLOCK_R,
                 K_PAD=max(16, triton.next_power_of_2(width)), num_warps=warps)


class PrologueFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, beta_logits, eps):
        q, k, b = q.contiguous(), k.contiguous(), beta_logits.contiguous()
        q_n, k_n, beta = torch.empty_like(q), torch.empty_like(k), torch.empty_like(b)
        if q.numel() + b.numel() > 0:
            _launch(kda_prologue_fwd_kernel, q, k, b, q_n, k_n, beta, eps=eps)
        ctx.save_for_backward(q, k, b)
        ctx.eps = eps
        return q_n, k_n, beta

    @staticmethod
    def backward(ctx, dq_n, dk_n, dbeta):
        q, k, b = ctx.saved_tensors
        dq, dk, db = torch.empty_like(q), torch.empty_like(k), torch.empty_like(b)
        grads = [torch.zeros_like(x) if g is None else g.contiguous() for g, x in ((dq_n, q), (dk_n, k), (dbeta, b))]
        if q.numel() + b.numel() > 0:
            _launch(kda_prologue_bwd_kernel, q, k, b, *grads, dq, dk, db, eps=ctx.eps)
        return dq, dk, db, None


def run(q, k, beta_logits, eps):
    """q, k [B,T,H,K], beta_logits [B,T,HV] (float32/float16/bfloat16), eps float -> (q / ||q||, k / ||k|| per
    head, sigmoid(beta_logits)) in the inputs' dtypes, float32 math."""
    return PrologueFunction.apply(q, k, beta_logits, eps)
