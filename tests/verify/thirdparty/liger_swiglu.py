"""Liger-Kernel's SwiGLU (silu(a) * b), used exactly as the package ships it (liger_kernel.ops.swiglu). It computes
plain SwiGLU whatever limit, alpha and up_offset say: the verifier must fail it on swiglu's clamped and alpha shapes.

Liger's backward writes da and db over the a and b it saved, which are the inputs themselves when they are
contiguous: the verifier refuses that as input mutation, so run hands it clones (autograd carries the gradients
back through them). On the Triton interpreter it needs the float-argument shim
(workbench/verify/interpreter_shims.py): the kernels call gate_multiplier.to(tl.float32).
"""

from liger_kernel.ops.swiglu import LigerSiLUMulFunction

BLOCK = "swiglu"


def run(a, b, limit=None, alpha=1.0, up_offset=0.0):
    return LigerSiLUMulFunction.apply(a.clone(), b.clone())
