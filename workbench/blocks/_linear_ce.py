"""The large-vocabulary loss head shared by seq_chunked_ce and vocab_blockwise_ce: both blocks compute the same
quantity and differ only in how a kernel avoids holding the [N, V] logits.

    logits = h @ W^T                                   [N, V], float32 (float64 for float64 inputs)
    loss_i = logsumexp(logits_i) - logits_i[y_i]       0 where y_i == ignore_index
    loss   = sum_i loss_i / max(n_valid, 1)            reduction "mean";  sum_i loss_i  for "sum"

    dlogits = (softmax(logits) - onehot(y)) * valid * scale,   scale = 1 / max(n_valid, 1) (mean) or 1 (sum)
    dh = dlogits @ W                                   [N, D]
    dW = dlogits^T @ h                                 [V, D]

Shapes: h [N, D] (the final hidden states), W [V, D] (the unembedding), y [N] int64 targets in [0, V) or
ignore_index. Gradients: h and W. ignore_index and reduction are plain Python values.

Conventions, decided once for both blocks:
- The loss is returned in the compute dtype (float32; float64 for float64 inputs), not in the input dtype: a trainer
  logs and sums losses in float32, and a bfloat16 loss of ~2 carries only 2-3 significant digits (CCE returns float32
  as well; Liger casts back to the input dtype). The gradients come back in the dtypes of h and W, as autograd requires.
- All targets ignored under "mean": torch's cross_entropy returns NaN (0 / 0) and NaN gradients; here the loss is 0
  with zero gradients (sum over no tokens divided by max(0, 1)), which is what a trainer wants from a micro-batch that
  is entirely prompt or padding: it contributes nothing instead of poisoning the step (Liger's kernel skips
  ignored rows and gives 0 as well).
- Targets outside [0, V) other than ignore_index are a caller error: the reference raises (a device assert on a
  GPU); what a kernel does with them is undefined.
"""

from __future__ import annotations

import functools
import math
import random

import torch
import torch.nn.functional as F

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, I64, BlockSpec, Peer, Shape, Work
from workbench.numerics import compute_dtype

IGNORE_INDEX = -100
REDUCTIONS = ("mean", "sum")
IGNORED_PCT = 20
"""Share of ignored targets in make_inputs unless a shape says otherwise (its ``ignored`` key, in percent)."""
LOGIT_STD = 3.0
"""Spread of the logits of the drawn inputs: trained LM heads give logits of std 2-4 with maxima of 15-25."""
TARGET_MARGIN = 12.0
"""Largest boost of a target's logit over what h and W drew: about the top logit of V = 1e5 draws of std 3."""


def reference(h: torch.Tensor, W: torch.Tensor, y: torch.Tensor, ignore_index: int, reduction: str) -> torch.Tensor:
    """Cross-entropy of the logits h @ W^T against y, computed in float32 (float64 for float64 inputs)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    ct = compute_dtype(h)
    logits = h.to(ct) @ W.to(ct).T
    total = F.cross_entropy(logits, y, ignore_index=ignore_index, reduction="sum")
    if reduction == "sum":
        return total
    return total / max(int((y != ignore_index).sum()), 1)


def loss_scale(y: torch.Tensor, ignore_index: int, reduction: str) -> float:
    """The factor that turns the summed per-token losses into the loss: 1 / max(n_valid, 1) for mean, 1 for sum."""
    return 1.0 / max(int((y != ignore_index).sum()), 1) if reduction == "mean" else 1.0


# --- inputs --------------------------------------------------------------------------------------------------------


def abstract_inputs(shape: Shape, dtype: torch.dtype) -> dict:
    """make_inputs' shapes and dtypes on the meta device (its target draw is data-dependent)."""
    n, v, d = shape["N"], shape["V"], shape["D"]
    meta = {"device": "meta"}
    return {"h": torch.empty(n, d, dtype=dtype, **meta), "W": torch.empty(v, d, dtype=dtype, **meta),
            "y": torch.empty(n, dtype=torch.int64, **meta), "ignore_index": IGNORE_INDEX, "reduction": REDUCTIONS[0]}


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """h [N, D]: normed final hidden states, N(0, 1) times a per-channel norm weight 1 + N(0, 0.1);
    W [V, D] ~ N(0, LOGIT_STD^2 / D), so the logits have std about LOGIT_STD;
    y [N]: Zipf-distributed targets (token frequencies of text: a few tokens repeat, so dW rows collect several
    one-hot terms) over a random ranking of the vocabulary; shape["ignored"] percent (default 20) of them set to
    -100, half as one contiguous span (a prompt or padding run, which empties whole token blocks) and the rest
    scattered. Like a trained model's, each valid token's hidden state leans toward its target's row of W, raising
    the target logit by a margin drawn in [0, TARGET_MARGIN): easy tokens (softmax of the target near 1, where
    1 - p cancels) and hard ones both occur, and the loss lands near a trained model's instead of log V + 4.5.
    reduction alternates with the seed (even: mean, odd: sum), so two seeds check both.
    The values are drawn in float32 and rounded to ``dtype``: every dtype sees the same problem."""
    g = torch.Generator().manual_seed(seed)
    n, v, d = shape["N"], shape["V"], shape["D"]
    h = torch.randn(n, d, generator=g) * (1 + 0.1 * torch.randn(d, generator=g))
    w = torch.randn(v, d, generator=g) * (LOGIT_STD / math.sqrt(d))
    ranking = torch.randperm(v, generator=g)
    zipf = 1.0 / torch.arange(1, v + 1, dtype=torch.float64)
    y = ranking[torch.multinomial(zipf, n, replacement=True, generator=g)]
    n_ignored = round(n * shape.get("ignored", IGNORED_PCT) / 100)
    span = n_ignored // 2
    start = int(torch.randint(0, n - span + 1, (1,), generator=g))
    y[start:start + span] = IGNORE_INDEX
    rest = torch.cat([torch.arange(0, start), torch.arange(start + span, n)])
    y[rest[torch.randperm(len(rest), generator=g)[: n_ignored - span]]] = IGNORE_INDEX
    valid = y != IGNORE_INDEX
    w_target = w[torch.where(valid, y, 0)]
    margin = TARGET_MARGIN * torch.rand(n, generator=g) * valid
    h += margin[:, None] * w_target / (w_target * w_target).sum(1, keepdim=True).clamp_min(1.0)
    return {"h": h.to(device, dtype), "W": w.to(device, dtype), "y": y.to(device), "ignore_index": IGNORE_INDEX,
            "reduction": REDUCTIONS[seed % 2]}


# --- shapes --------------------------------------------------------------------------------------------------------

SUITES = {
    # several token, vocabulary and hidden tiles at the smallest tile sizes the templates offer (16 x 64 x 32)
    "smoke": [{"N": 16, "V": 64, "D": 32}, {"N": 64, "V": 256, "D": 64}],
    # one token; odd sizes like BLOCKS.md's (252, 507, 123) at half the size the interpreter can afford: several
    # token, vocabulary and hidden tiles, none full, several chunks with a short last one; a vocabulary smaller
    # than one tile with D below the smallest D tile; every target ignored (the mean of nothing is 0)
    "edge": [
        {"N": 1, "V": 100, "D": 16},
        {"N": 133, "V": 381, "D": 77},
        {"N": 7, "V": 33, "D": 5},
        {"N": 24, "V": 64, "D": 16, "ignored": 100},
    ],
}


def hidden_shapes(rng: random.Random) -> list[Shape]:
    """Two shapes drawn at verification time: every dim independently between 1 (2 for V) and its largest size in
    the suites, so that tiny vocabularies and single tokens come up along with odd multi-tile sizes."""
    return [{"N": rng.randint(1, 133), "V": rng.randint(2, 381), "D": rng.randint(1, 77)} for _ in range(2)]


def linear_ce_work(s: Shape) -> tuple[Work, Work]:
    """H [N, D], W [V, D], labels -> a scalar loss; the logits are never written."""
    n, v, d = s["N"], s["V"], s["D"]
    fwd = Work(BF16 * (n * d + v * d) + I64 * n, 2 * n * v * d)
    return fwd, Work(BF16 * 2 * (n * d + v * d) + I64 * n, 4 * n * v * d)


def linear_ce_abstract_outputs(h: torch.Tensor, W: torch.Tensor, y: torch.Tensor, ignore_index: int, reduction: str
                               ) -> torch.Tensor:
    """The loss: 0-dim in the compute dtype (the reference divides by a count of the targets, a data-dependent
    value): the library op's fake implementation."""
    return h.new_empty((), dtype=compute_dtype(h))


def liger_linear_ce(h, W, y, ignore_index, reduction):
    """Liger-Kernel's fused linear cross-entropy, with the reference's signature."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    return LigerFusedLinearCrossEntropyFunction.apply(h, W, y, None, None, ignore_index, 0.0, 0.0, reduction)[0]


def cce_linear_ce(h, W, y, ignore_index, reduction):
    """Cut Cross-Entropy's linear_cross_entropy, with the reference's signature."""
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(h, W, y, ignore_index=ignore_index, reduction=reduction)


LINEAR_CE_PEERS = (Peer("liger", "liger_kernel", liger_linear_ce),
                   Peer("cut-cross-entropy", "cut_cross_entropy", cce_linear_ce))


def linear_ce_found(model: ModelConfig, role: str) -> list[Found]:
    """A loss head's entry: the model's tokens of a step against its whole vocabulary."""
    if not model.vocab:
        return []
    return [Found(role, None, [{"N": model.tokens, "V": model.vocab, "D": model.hidden}],
                  [model.vocab_field, model.hidden_field])]


def linear_ce_spec(name: str, summary: str, role: str) -> BlockSpec:
    """The BlockSpec of a linear + cross-entropy loss head: every form shares this module's reference, inputs,
    suites, work, peers and onboarding (``role``: its words in a model card); a form's module adds its own way of
    computing it."""
    return BlockSpec(name=name, family="loss", summary=summary, reference=reference, make_inputs=make_inputs,
                     abstract_inputs=abstract_inputs, grad_inputs=("h", "W"), outputs=("loss",), shapes=SUITES,
                     hidden_shapes=hidden_shapes, work=linear_ce_work, abstract_outputs=linear_ce_abstract_outputs,
                     peers=LINEAR_CE_PEERS, onboard=functools.partial(linear_ce_found, role=role), replay="loss")
