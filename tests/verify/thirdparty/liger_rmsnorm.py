"""Liger-Kernel's RMSNorm, used exactly as the package ships it (liger_kernel.ops.rms_norm).

Casting mode "gemma" with offset 0.0 is this block's convention: everything in float32, one cast back to x.dtype.
in_place=False: Liger's default (True) writes dx over the upstream gradient, which the verifier refuses as input
mutation. On the Triton interpreter it needs the float-argument and libdevice shims
(workbench/verify/interpreter_shims.py): the kernels call eps.to(tl.float32) and libdevice.rsqrt.
"""

from liger_kernel.ops.rms_norm import LigerRMSNormFunction

BLOCK = "rmsnorm"


def run(x, weight, eps):
    return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "gemma", False)
