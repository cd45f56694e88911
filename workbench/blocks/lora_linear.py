"""lora_linear: a frozen linear layer with a low-rank adapter (LoRA, Hu et al. 2021; PEFT lora/layer.py).

    y = x W^T + (x A^T B^T) * scaling,        scaling = alpha / r

computed in float32 (float64 for float64 inputs) and cast to x.dtype once, at the end. Merging the adapter,
W' = W + scaling * B A, gives the same output.

Shapes: x [N, IN], W [OUT, IN] (frozen), A [r, IN], B [OUT, r] -> y [N, OUT]. Gradients: x, A and B; W takes none.
Inputs: x ~ N(0, 1) (a normed hidden state); W ~ N(0, 1/IN) (unit-variance outputs); A kaiming-uniform as PEFT
initializes it (bound 1/sqrt(IN)); B small random, as after some fine-tuning steps (PEFT starts it at zero, which
would leave the path through B untested), sized so the update is about a fifth of the base output;
alpha = 2r (scaling 2, not 1, so a kernel that drops the scaling fails).
"""

from __future__ import annotations

import math

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks.base import BF16, BlockSpec, Shape, Work
from workbench.numerics import compute_dtype


def reference(x: torch.Tensor, W: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scaling: float) -> torch.Tensor:
    ct = compute_dtype(x)
    xf = x.to(ct)
    base = xf @ W.to(ct).T                      # [N, OUT]
    update = (xf @ A.to(ct).T) @ B.to(ct).T     # [N, r] -> [N, OUT]
    return (base + update * scaling).to(x.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """x [N, IN] ~ N(0, 1); W [OUT, IN] ~ N(0, 1/IN); A [r, IN] ~ U(-1/sqrt(IN), 1/sqrt(IN)) (PEFT's
    kaiming_uniform_(a=sqrt(5))); B [OUT, r] ~ N(0, 0.04 / r); scaling = alpha / r = 2."""
    g = torch.Generator().manual_seed(seed)
    n, n_in, n_out, rank = shape["N"], shape["IN"], shape["OUT"], shape["r"]
    x = torch.randn(n, n_in, generator=g)
    W = torch.randn(n_out, n_in, generator=g) / math.sqrt(n_in)
    A = (2 * torch.rand(rank, n_in, generator=g) - 1) / math.sqrt(n_in)
    B = 0.2 * torch.randn(n_out, rank, generator=g) / math.sqrt(rank)
    return {"x": x.to(device, dtype), "W": W.to(device, dtype), "A": A.to(device, dtype), "B": B.to(device, dtype),
            "scaling": 2.0}


SHAPES = {
    "smoke": [{"N": 16, "IN": 64, "OUT": 48, "r": 8}, {"N": 40, "IN": 128, "OUT": 96, "r": 16}],
    # one row and rank 1 at widths of 123 (not a multiple of any tile); more rows than a 64-row tile with a narrow
    # input; a narrow output with r = 16; odd ranks
    "edge": [
        {"N": 1, "IN": 123, "OUT": 123, "r": 1},
        {"N": 70, "IN": 17, "OUT": 33, "r": 4},
        {"N": 7, "IN": 200, "OUT": 5, "r": 16},
        {"N": 19, "IN": 64, "OUT": 123, "r": 3},
    ],
}


# --- work (the cost model) ---------------------------------------------------------------------------------

def work(s: Shape) -> tuple[Work, Work]:
    """X [N, IN], W [OUT, IN], A [r, IN], B [OUT, r] -> y = x W^T + scaling x A^T B^T."""
    n, i, o, r = s["N"], s["IN"], s["OUT"], s["r"]
    params = o * i + r * (i + o)
    fwd = Work(BF16 * (n * i + params + n * o), 2 * n * o * i + 2 * n * r * (i + o))
    # dx = dy W + (dy B) A, dA, dB: the frozen W gets no gradient
    bwd = Work(BF16 * (n * o + n * i + params + n * i + r * (i + o)), 2 * n * o * i + 6 * n * r * (i + o))
    return fwd, bwd


def onboard(model: ModelConfig) -> list[Found]:
    """Every model is fine-tuned through adapters at the recipe's rank (not in a config)."""
    return [Found("LoRA adapters on the attention and expert projections for fine-tuning", None,
                  [{"N": model.tokens, "IN": model.hidden, "OUT": model.hidden, "r": model.lora_rank}],
                  [model.hidden_field])]


SPEC = BlockSpec(
    name="lora_linear",
    family="linear",
    summary="frozen linear + low-rank adapter x W^T + scaling * (x A^T) B^T; gradients for x, A, B",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("x", "A", "B"),
    outputs=("y",),
    shapes=SHAPES,
    work=work,
    onboard=onboard,
    replay="layer",
)
