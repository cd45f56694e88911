"""swiglu: the gated activation of SwiGLU feed-forward layers (Shazeer 2020).

    y = silu(a) * b,    silu(a) = a * sigmoid(a)

computed in float32 (float64 for float64 inputs) and cast to a.dtype once.

Shapes: a, b [..., N] (a: gate projection, b: up projection), y [..., N]. Gradients: a and b.
Gate pre-activations are drawn wide (N(0, 4)) so the tails of sigmoid, where float16 exp overflows, are exercised.
"""

from __future__ import annotations

import torch

from workbench.blocks._config import Found, ModelConfig
from workbench.blocks._rows import ROW_SUITES, gated_activation_found, gated_activation_work
from workbench.blocks.base import BlockSpec, Peer, Shape
from workbench.numerics import compute_dtype


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ct = compute_dtype(a)
    af = a.to(ct)
    return (af * torch.sigmoid(af) * b.to(ct)).to(a.dtype)


def make_inputs(shape: Shape, dtype: torch.dtype, seed: int, device: str = "cpu") -> dict:
    """a [rows, N] ~ N(0, 4), b [rows, N] ~ N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    rows, n = shape["rows"], shape["N"]
    a = 2 * torch.randn(rows, n, generator=g)
    b = torch.randn(rows, n, generator=g)
    return {"a": a.to(device, dtype), "b": b.to(device, dtype)}


def liger_swiglu(a, b):
    """Liger-Kernel's SiLU-mul, with the reference's signature."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(a, b)


def onboard(model: ModelConfig) -> list[Found]:
    """The shared experts' and the dense layers' activation when hidden_act is silu (or swish)."""
    return gated_activation_found(model, "swiglu", "gated {act} activation of the {where}")


SPEC = BlockSpec(
    name="swiglu",
    family="activation",
    summary="silu(a) * b, float32 math",
    reference=reference,
    make_inputs=make_inputs,
    grad_inputs=("a", "b"),
    outputs=("y",),
    shapes=ROW_SUITES,
    work=gated_activation_work,
    peers=(Peer("liger", "liger_kernel", liger_swiglu),),
    onboard=onboard,
    replay="shared_expert",
)
