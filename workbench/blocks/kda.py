"""kda: Kimi Delta Attention (Kimi Linear; the recurrence of fla/ops/kda/naive.py), a gated delta rule whose decay is
per key channel.

Per batch and value head, a state S [K, V] (float32) is carried over time; with g_t <= 0 (log decay, one per key
channel), beta_t in (0, 1) and scale = K**-0.5:

    S_t = S_{t-1} * exp(g_t)[:, None]                 decay each key channel
    S_t = S_t + beta_t * k_t (v_t - S_t^T k_t)^T      delta-rule correction
    o_t = S_t^T (q_t * scale)                         read after the write

Shapes: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K]; beta [B, T, HV]; initial_state [B, HV, K, V] or None
(zeros); outputs o [B, T, HV, V] (in v.dtype) and final_state [B, HV, K, V] (the state dtype: float32, float64 for
float64 inputs). Grouped value heads (GVA): HV % H == 0, and q/k head h serves value heads h*HV/H ... (h+1)*HV/H - 1.
Gradients: q, k, v, g, beta and initial_state (when it is given).

Two exact references: ``reference``, the recurrence above step by step (the ground truth, written for clarity), and
``chunked_reference``, the chunked (WY / UT transform) form of the training kernels (chunks of 64 there), fast enough
for CPU replays (chunks of 16 by default, any length is exact). Within a chunk of C tokens with the inclusive
cumulative gate G (G_i = g_1 + ... + g_i, so G_i - G_j <= 0 for j <= i):

    a[i, j]   = sum_d k_i[d] k_j[d] exp(G_i[d] - G_j[d])              for j < i (0 otherwise)
    T         = (I + diag(beta) a)^-1 diag(beta)                        a unit lower-triangular solve
    w = T (exp(G) * k),  u = T v                                        the WY representation of the chunk's updates
    U = u - w S                                                         the corrected values v_t - S'_t^T k_t, * beta
    o = (q * scale * exp(G)) S + Aqk U,  Aqk[i, j] = sum_d q_i[d] scale k_j[d] exp(G_i[d] - G_j[d])   for j <= i
    S <- exp(G_C)[:, None] * S + (exp(G_C - G) * k)^T U

Only relative gate offsets (G_i - G_j with j <= i, G_C - G_j, G_i) are exponentiated, all <= 0: the raw cumsum or a
factorisation exp(G_i) exp(-G_j) overflows (a 16-token stretch of strong decay reaches -80 in log space). A sequence
whose length is not a multiple of the chunk is padded with k = v = q = g = beta = 0, which leaves the state unchanged.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, F32, BlockSpec, Peer, Shape, Work
from workbench.numerics import compute_dtype

CHUNK = 64
"""The chunk length of the training kernels (fla's chunk_kda)."""

REFERENCE_CHUNK = 16
"""chunked_reference's default chunk: every chunk length is exact, and in PyTorch on a CPU the pairwise decays
(C x C x K per chunk) make short chunks the fastest: 16 is 3x faster than 64 and 3-5x faster than the recurrence
for T = 512-2048 (bench/attention.py)."""


def _expand_heads(q: torch.Tensor, k: torch.Tensor, hv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [B, T, H, K] -> [B, T, HV, K]: each q/k head serves HV // H consecutive value heads."""
    group = hv // q.shape[2]
    return q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: float,
              initial_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence, one token at a time. Returns (o [B, T, HV, V] in v.dtype, final_state [B, HV, K, V])."""
    ct = compute_dtype(v)
    b, t_len, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    assert hv % q.shape[2] == 0, "GVA: the value heads must be a multiple of the q/k heads"
    qf, kf = _expand_heads(q.to(ct), k.to(ct), hv)
    qf = qf * scale
    vf, bf, decay = v.to(ct), beta.to(ct), g.to(ct).exp()
    state = torch.zeros(b, hv, dk, dv, dtype=ct, device=v.device) if initial_state is None else initial_state.to(ct)
    outputs = []
    for t in range(t_len):                                  # state [B, HV, K, V]; k_t, q_t as [B, HV, K, 1]
        k_t, q_t = kf[:, t, :, :, None], qf[:, t, :, :, None]
        state = state * decay[:, t, :, :, None]             # decay each key channel
        predicted = (k_t * state).sum(-2)                   # S^T k                 [B, HV, V]
        update = bf[:, t, :, None] * (vf[:, t] - predicted)  # beta (v - S^T k)
        state = state + k_t * update[:, :, None, :]         # + k update^T
        outputs.append((q_t * state).sum(-2))               # read after the write: S^T q
    o = torch.stack(outputs, dim=1) if outputs else vf.new_zeros(b, 0, hv, dv)
    return o.to(v.dtype), state


def chunked_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                      scale: float, initial_state: torch.Tensor | None,
                      chunk_size: int = REFERENCE_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The same function by the chunked WY form (module docstring): exact, differentiable, vectorised over batch,
    heads and chunks; only the carry of the state from chunk to chunk is sequential."""
    ct = compute_dtype(v)
    b, t_len, _, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    c = chunk_size
    n = -(-t_len // c)
    pad = n * c - t_len

    def chunks(x: torch.Tensor) -> torch.Tensor:
        """[B, T, HV, ...] -> [B, HV, N, C, ...], zero-padded to N * C tokens."""
        x = x.to(ct)
        if pad:
            x = torch.cat([x, x.new_zeros(b, pad, *x.shape[2:])], dim=1)
        x = x.reshape(b, n, c, *x.shape[2:]).transpose(1, 3)  # [B, HV, C, N, ...]
        return x.transpose(2, 3)

    qe, ke = _expand_heads(q, k, hv)
    qc, kc, vc, gc, bc = (chunks(x) for x in (qe * scale, ke, v, g, beta))
    gcum = gc.cumsum(dim=3)                                                   # [B, HV, N, C, K], inclusive
    lower = torch.ones(c, c, dtype=torch.bool, device=v.device).tril()        # j <= i
    strict = lower.tril(-1)                                                   # j < i
    # exp(G_i - G_j) for j <= i only; the masked pairs are zeroed before exp so nothing overflows
    offsets = (gcum[..., :, None, :] - gcum[..., None, :, :]).masked_fill(~lower[..., None], 0.0)
    decay = offsets.exp() * lower[..., None]                                  # [B, HV, N, C(i), C(j), K]
    a = torch.einsum("...ik,...jk,...ijk->...ij", kc, kc, decay) * strict
    aqk = torch.einsum("...ik,...jk,...ijk->...ij", qc, kc, decay)
    eye = torch.eye(c, dtype=ct, device=v.device)
    # T = (I + diag(beta) a)^-1 diag(beta)
    tmat = torch.linalg.solve_triangular(eye + bc[..., :, None] * a, torch.diag_embed(bc), upper=False,
                                         unitriangular=True)
    w = tmat @ (gcum.exp() * kc)
    u = tmat @ vc

    state = torch.zeros(b, hv, dk, dv, dtype=ct, device=v.device) if initial_state is None else initial_state.to(ct)
    outs = []
    for i in range(n):
        g_i, g_last = gcum[:, :, i], gcum[:, :, i, -1]                        # [B, HV, C, K], [B, HV, K]
        corrected = u[:, :, i] - w[:, :, i] @ state                           # U = u - w S
        outs.append((qc[:, :, i] * g_i.exp()) @ state + aqk[:, :, i] @ corrected)
        k_to_end = (g_last[..., None, :] - g_i).exp() * kc[:, :, i]           # exp(G_C - G_j) k_j
        state = g_last.exp()[..., None] * state + k_to_end.transpose(-1, -2) @ corrected
    o = torch.stack(outs, dim=2).reshape(b, hv, n * c, dv)[:, :, :t_len].transpose(1, 2)
    return o.to(v.dtype), state


# --- inputs ----------------------------------------------------------------------------------------------------------

GATE_NORMALIZERS = (1.0, 10.0, 0.1)
"""g = logsigmoid(randn) / normalizer, by seed: typical decay, slow decay (long memory), and strong decay (about -7
per token, so a 16-token stretch reaches -110 in log space: the case that breaks a naive chunked kernel)."""


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of initial_state and final_state: float32, float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """As in fla's tests/ops/test_kda.py: q, k ~ U(0, 1) then L2-normalised over K; v ~ U(0, 1);
    g = logsigmoid(N(0, 1)) / normalizer (GATE_NORMALIZERS[seed % 3]); beta = sigmoid(N(0, 1));
    initial_state ~ N(0, 1) in the state dtype when the shape's h0 is 1, else None."""
    gen = torch.Generator().manual_seed(seed)
    b, t, h, hv, dk, dv = (shape[d] for d in ("B", "T", "H", "HV", "K", "V"))
    if hv % h:
        raise ValueError(f"kda: HV={hv} is not a multiple of H={h}")
    q = F.normalize(torch.rand(b, t, h, dk, generator=gen), p=2, dim=-1)
    k = F.normalize(torch.rand(b, t, h, dk, generator=gen), p=2, dim=-1)
    v = torch.rand(b, t, hv, dv, generator=gen)
    g = F.logsigmoid(torch.randn(b, t, hv, dk, generator=gen)) / GATE_NORMALIZERS[seed % len(GATE_NORMALIZERS)]
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen))
    h0 = torch.randn(b, hv, dk, dv, generator=gen)
    return {
        "q": q.to(device, dtype), "k": k.to(device, dtype), "v": v.to(device, dtype), "g": g.to(device, dtype),
        "beta": beta.to(device, dtype), "scale": dk ** -0.5,
        "initial_state": h0.to(device, state_dtype(dtype)) if shape.get("h0", 1) else None,
    }


# --- shapes ----------------------------------------------------------------------------------------------------------

SHAPES = {
    "smoke": [
        {"B": 1, "T": 32, "H": 1, "HV": 1, "K": 16, "V": 16, "h0": 1},
        {"B": 2, "T": 16, "H": 2, "HV": 2, "K": 32, "V": 32, "h0": 0},
    ],
    # one token with two q/k heads of two value heads each; a tail past one 64-token chunk; GVA 1:4 with
    # non-power-of-two head dims; V over several V tiles (V > K). Interpreter cost grows with B*HV*T (recurrent) and
    # B*HV*cdiv(T, chunk) (chunked), so each shape exercises a few things at small size.
    "edge": [
        {"B": 1, "T": 1, "H": 2, "HV": 4, "K": 16, "V": 16, "h0": 1},
        {"B": 1, "T": 70, "H": 1, "HV": 1, "K": 16, "V": 16, "h0": 1},
        {"B": 1, "T": 13, "H": 1, "HV": 4, "K": 24, "V": 20, "h0": 0},
        {"B": 1, "T": 11, "H": 2, "HV": 2, "K": 16, "V": 48, "h0": 1},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time, meeting HV % H == 0 and as cheap as the edge suite: any T up to 40
    (tails past chunks of 16 and 32), head dims 1-32 (odd ones included), GVA ratios 1-2, with or without h0."""
    shapes = []
    for _ in range(2):
        h = rng.randint(1, 2)
        shapes.append({"B": 1, "T": rng.randint(1, 40), "H": h, "HV": h * rng.randint(1, 2), "K": rng.randint(1, 32),
                       "V": rng.randint(1, 32), "h0": rng.randint(0, 1)})
    return shapes


# --- work (the cost model) ---------------------------------------------------------------------------------

KDA_CHUNK = 64  # the chunk length of the chunked form the FLOPs are counted for (fla's chunk_kda)


def work(s: Shape) -> tuple[Work, Work]:
    """Per token and value head, the chunked form with chunk C: the intra-chunk products k k^T and q k^T (2CK
    each), w = T (k e^g) (2CK), u = T v and the chunk's attention output (2CV each), and the state passes
    u - w S, q S, S + k^T u (2KV each). The backward does two products per forward product."""
    tokens_heads = s["B"] * s["T"] * s["HV"]
    k, v, c = s["K"], s["V"], KDA_CHUNK
    flops = tokens_heads * (6 * k * v + 6 * c * k + 4 * c * v)
    qk = 2 * s["B"] * s["T"] * s["H"] * k
    vg = s["B"] * s["T"] * s["HV"] * (v + k + 1)
    state = F32 * s["B"] * s["HV"] * k * v
    inputs = BF16 * (qk + vg) + state * s.get("h0", 1)
    outputs = BF16 * s["B"] * s["T"] * s["HV"] * v + state
    return Work(inputs + outputs, flops), Work(2 * inputs + outputs, 2 * flops)


def fla_chunk_kda(q, k, v, g, beta, scale, initial_state):
    """fla's chunk_kda, with the reference's signature."""
    from fla.ops.kda import chunk_kda

    return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True)


def onboard(model: ModelConfig) -> list[Found]:
    """Every KDA layer (linear_attn_config.kda_layers), at the linear attention's heads and head size."""
    if not model.kda_layers:
        return []
    heads, dim = model.kda_heads, model.kda_head_dim
    return [Found("Kimi Delta Attention (chunked linear attention)", model.kda_layers,
                  [{"B": 1, "T": model.tokens, "H": heads, "HV": heads, "K": dim, "V": dim, "h0": 1}],
                  model.kda_fields)]


SPEC = BlockSpec(
    name="kda",
    family="linear_attention",
    summary="Kimi Delta Attention: per-channel gated delta rule, recurrent ground truth, GVA, optional initial state",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("q", "k", "v", "g", "beta", "initial_state"),
    outputs=("o", "final_state"),
    shapes=SHAPES,
    hidden_shapes=hidden_shapes,
    training_reference=chunked_reference,
    work=work,
    peers=(Peer("fla chunk_kda", "fla", fla_chunk_kda),),
    not_compiled="its reference steps the recurrence token by token: dynamo would unroll every step",
    onboard=onboard,
    replay="K",
)
