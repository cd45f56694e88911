"""vocab_blockwise_ce: the linear + cross-entropy loss head, vocabulary-blockwise (Cut Cross-Entropy, Wijmans et al.
2024, apple/ml-cross-entropy: cce_lse_forward.py, indexed_dot.py, cce_backward.py).

    loss = cross_entropy(h @ W^T, y, ignore_index, reduction)     logits in float32 (float64 for float64 inputs)

(the math, the shapes and the conventions are those of workbench/blocks/_linear_ce.py, shared with seq_chunked_ce).
h [N, D], W [V, D], y [N] int64; loss 0-dim in float32; gradients for h and W.

The algorithm a kernel implements: forward, for each token block an online logsumexp over vocabulary blocks
(m = running max, s = running sum of exp(z - m), rescaled when m grows), and the target logit by an indexed dot
h_i . W[y_i]; only lse [N] is kept. Backward recomputes each (token block, vocabulary block) tile of logits,
dlogits = (exp(z - lse) - onehot) * valid * scale * grad_loss, and accumulates dh = dlogits @ W and
dW = dlogits^T @ h. No buffer grows with N x V; the extra memory is lse plus the gradient accumulators.
Cost: the logits matmul runs once forward and at least once more backward (twice for a deterministic split of
the dh and dW reductions). CCE's gradient filtering (skipping tiles whose softmax is below float precision) is an
approximation and is left out.

``blockwise_loss`` is that algorithm in plain PyTorch, an exact second path to the reference (tested against it)
that bench/loss_memory.py measures on CPU.
"""

from __future__ import annotations

import torch

from workbench.blocks._linear_ce import REDUCTIONS, linear_ce_spec, loss_scale
from workbench.numerics import compute_dtype


class _VocabBlockwiseLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, y, ignore_index, reduction, block):
        ct = compute_dtype(h)
        hc, w = h.to(ct), W.to(ct)
        m = torch.full((h.shape[0],), float("-inf"), dtype=ct, device=h.device)
        s = torch.zeros_like(m)
        for start in range(0, W.shape[0], block):
            z = hc @ w[start:start + block].T  # [N, block]
            m_new = torch.maximum(m, z.amax(dim=1))
            s = s * torch.exp(m - m_new) + z.sub_(m_new[:, None]).exp_().sum(dim=1)
            m = m_new
            del z  # before the next block's logits exist
        lse = m + torch.log(s)
        valid = y != ignore_index
        target = (hc * w[torch.where(valid, y, 0)]).sum(dim=1)  # the indexed dot h_i . W[y_i]
        scale = loss_scale(y, ignore_index, reduction)
        ctx.save_for_backward(h, W, y, lse)
        ctx.ignore_index, ctx.scale, ctx.block = ignore_index, scale, block
        return torch.where(valid, lse - target, 0).sum() * scale

    @staticmethod
    def backward(ctx, grad_loss):
        h, W, y, lse = ctx.saved_tensors
        ct = lse.dtype
        hc, w = h.to(ct), W.to(ct)
        valid = y != ctx.ignore_index
        factor = grad_loss * ctx.scale
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.zeros_like(hc) if need_dh else None
        dw = torch.empty_like(w) if need_dw else None
        for start in range(0, W.shape[0], ctx.block):
            wb = w[start:start + ctx.block]
            grad = (hc @ wb.T).sub_(lse[:, None]).exp_()  # softmax of this vocabulary block, recomputed
            rows = (valid & (y >= start) & (y < start + wb.shape[0])).nonzero().squeeze(1)
            grad[rows, y[rows] - start] -= 1
            grad[~valid] = 0
            grad *= factor
            if need_dh:
                dh.addmm_(grad, wb)
            if need_dw:
                torch.mm(grad.T, hc, out=dw[start:start + ctx.block])
            del grad  # before the next block's logits exist
        return (dh.to(h.dtype) if need_dh else None, dw.to(W.dtype) if need_dw else None, None, None, None, None)


def blockwise_loss(h: torch.Tensor, W: torch.Tensor, y: torch.Tensor, ignore_index: int = -100,
                   reduction: str = "mean", block: int = 4096) -> torch.Tensor:
    """The reference's loss and gradients, vocabulary-blockwise in PyTorch: never holds more than N x block logits.
    block: vocabulary rows per block."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return _VocabBlockwiseLoss.apply(h, W, y, ignore_index, reduction, block)


SPEC = linear_ce_spec(
    "vocab_blockwise_ce",
    "linear + cross-entropy with an online logsumexp over vocabulary blocks, recomputed backward (CCE)",
    "vocabulary-blockwise (CCE) linear + cross-entropy head",
)
