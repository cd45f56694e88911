"""seq_chunked_ce: the linear + cross-entropy loss head, sequence-chunked (Liger-Kernel's fused linear cross entropy,
src/liger_kernel/ops/fused_linear_cross_entropy.py).

    loss = cross_entropy(h @ W^T, y, ignore_index, reduction)     logits in float32 (float64 for float64 inputs)

(the math, the shapes and the conventions are those of workbench/blocks/_linear_ce.py, shared with
vocab_blockwise_ce). h [N, D], W [V, D], y [N] int64; loss 0-dim in float32; gradients for h and W.

The algorithm a kernel implements: the tokens are processed in chunks of c rows. For each chunk the logits
[c, V] are computed in float32, then the chunk's loss terms and, in the same forward pass, its gradients:
dlogits = (softmax - onehot) * scale, dh[chunk] = dlogits @ W, dW += dlogits^T @ h[chunk]. The [N, V] logits never
exist; the peak extra memory is the chunk's c x V buffer (Liger sizes c so that c x V is about N x D) plus the
float32 gradient accumulators. The backward pass only multiplies the stored gradients by the upstream gradient
(in place where the dtypes allow, as Liger does: the graph can be walked backward once).
Cost: one logits matmul and two gradient matmuls, the gradients computed even when no backward follows.

``chunked_loss`` is that algorithm in plain PyTorch, an exact second path to the reference (tested against it) that
bench/loss_memory.py measures on CPU.
"""

from __future__ import annotations

import torch

from workbench.blocks._linear_ce import REDUCTIONS, linear_ce_spec, loss_scale
from workbench.numerics import compute_dtype


def liger_chunk_rows(n: int, v: int, d: int, mem_ratio: int = 1) -> int:
    """Liger's chunk size: a power of two such that the chunk's logits hold about mem_ratio x N x D elements."""
    per = -(-v // (mem_ratio * d))  # how many times larger than N x D the full logits are
    return min(n, 1 << (max(1, -(-n // per)) - 1).bit_length())


class _SeqChunkedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, y, ignore_index, reduction, chunk):
        ct = compute_dtype(h)
        n = h.shape[0]
        scale = loss_scale(y, ignore_index, reduction)
        w = W.to(ct)  # a no-op for float32 weights
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.empty(h.shape, dtype=ct, device=h.device) if need_dh else None
        dw = torch.zeros(W.shape, dtype=ct, device=W.device) if need_dw else None
        total = torch.zeros((), dtype=ct, device=h.device)
        for start in range(0, n, chunk):
            hc, yc = h[start:start + chunk].to(ct), y[start:start + chunk]
            valid = yc != ignore_index
            logits = hc @ w.T  # [c, V]: the only buffer that grows with V; every step below works in place
            target = logits.gather(1, torch.where(valid, yc, 0)[:, None]).squeeze(1)
            top = logits.amax(dim=1)
            exps = logits.sub_(top[:, None]).exp_()
            norm = exps.sum(dim=1)
            total += torch.where(valid, top + torch.log(norm) - target, 0).sum()
            if need_dh or need_dw:
                grad = exps.div_(norm[:, None])  # softmax
                rows = valid.nonzero().squeeze(1)
                grad[rows, yc[rows]] -= 1
                grad[~valid] = 0
                grad *= scale
                if need_dh:
                    torch.mm(grad, w, out=dh[start:start + chunk])
                if need_dw:
                    dw.addmm_(grad.T, hc)
                del grad
            del logits, exps  # before the next chunk's logits exist
        ctx.save_for_backward(dh, dw)
        ctx.dtypes, ctx.consumed = (h.dtype, W.dtype), False
        return total * scale

    @staticmethod
    def backward(ctx, grad_loss):
        # The stored gradients are scaled in place when they already have the input's dtype (as Liger does): no
        # second [V, D] buffer. The graph can therefore be walked backward once only.
        if ctx.consumed:
            raise RuntimeError("chunked_loss: backward through the same graph twice (its gradients are consumed)")
        ctx.consumed = True
        dh, dw = ctx.saved_tensors
        return (_times(dh, grad_loss, ctx.dtypes[0]), _times(dw, grad_loss, ctx.dtypes[1]),
                None, None, None, None)


def _times(grad: torch.Tensor | None, factor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    if grad is None:
        return None
    return grad.mul_(factor) if grad.dtype == dtype else (grad * factor).to(dtype)


def chunked_loss(h: torch.Tensor, W: torch.Tensor, y: torch.Tensor, ignore_index: int = -100,
                 reduction: str = "mean", chunk: int | None = None) -> torch.Tensor:
    """The reference's loss and gradients, sequence-chunked in PyTorch: never holds more than chunk x V logits.
    chunk: tokens per chunk (default: Liger's rule, chunk x V about N x D)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    chunk = chunk or liger_chunk_rows(h.shape[0], W.shape[0], h.shape[1])
    return _SeqChunkedLoss.apply(h, W, y, ignore_index, reduction, chunk)


SPEC = linear_ce_spec(
    "seq_chunked_ce",
    "linear + cross-entropy over token chunks, gradients computed in the forward pass (Liger FLCE)",
    "sequence-chunked linear + cross-entropy head",
)
