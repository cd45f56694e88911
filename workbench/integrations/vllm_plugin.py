"""The promoted operators inside vLLM's own model code: the ``vllm.general_plugins`` entry point ``workbench``
(pyproject.toml), which vLLM loads in every process it starts (the engine's and each worker's). It is off unless
``WORKBENCH_VLLM=1`` is in the environment; the operators come from ``$WORKBENCH_OPERATORS`` (else ./operators).

Each replacement is vLLM's own class, subclassed and registered by its name through vLLM's plug point
(``CustomOp.register_oot``): vLLM then builds ours wherever its model code builds the class, its weights load as
before, and only the forward changes, taking vLLM's tensors as they are. vLLM calls ``forward_cpu`` on CPU,
``forward_cuda`` on NVIDIA and ``forward_hip`` on AMD (which calls ``forward_cuda``); all are the operator.

    vLLM class    plug point                   block     what runs
    RMSNorm       CustomOp.register_oot        rmsnorm   the norm; with a residual, vLLM's fused add first (float32
                                                         sum, cast to x's dtype, as vllm.ir's fused_add_rms_norm)
    SiluAndMul    CustomOp.register_oot        swiglu    silu(x[..., :d]) * x[..., d:]

A call the operator does not cover (RMSNorm's ``var_hidden_size``, no weight) runs vLLM's own forward and is counted
as such (``FALLBACKS``), so a parity run can say what did not run the operator. vLLM only logs a plugin that fails to
import and goes on: ``REPLACED`` (filled at registration) and the ops' run counts are what proves the swap happened.
"""

from __future__ import annotations

import collections
import os

ENABLE = "WORKBENCH_VLLM"
REPLACED: dict[str, str] = {}
"""vLLM class -> block, for each replacement registered in this process."""
FALLBACKS: collections.Counter[str] = collections.Counter()
"""vLLM class -> calls its replacement handed back to vLLM's own forward (a case the operator does not cover)."""


def enabled() -> bool:
    return os.environ.get(ENABLE, "0") == "1"


def register() -> None:
    """The entry point: vLLM calls it once per process, before any model is built."""
    if not enabled() or REPLACED:
        return
    import torch
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm

    import workbench.kernels as wk

    class WorkbenchRMSNorm(RMSNorm):
        """vLLM's RMSNorm through the rmsnorm operator: x [T, H] (and residual [T, H]) -> y [T, H] (and x +
        residual, the next residual)."""

        def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None):
            if self.variance_size_override is not None or not self.has_weight:
                FALLBACKS["RMSNorm"] += 1
                return self.forward_native(x, residual)
            if residual is None:
                return wk.rmsnorm(x, self.weight, self.variance_epsilon)
            summed = (x.float() + residual.float()).to(x.dtype)
            return wk.rmsnorm(summed, self.weight, self.variance_epsilon), summed

        forward_cuda = forward_cpu

    class WorkbenchSiluAndMul(SiluAndMul):
        """vLLM's SiluAndMul through the swiglu operator: x [T, 2d] -> [T, d]."""

        def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
            d = x.shape[-1] // 2
            return wk.swiglu(x[..., :d].contiguous(), x[..., d:].contiguous())

        forward_cuda = forward_cpu

    for vllm_class, ours, block in ((RMSNorm, WorkbenchRMSNorm, "rmsnorm"),
                                    (SiluAndMul, WorkbenchSiluAndMul, "swiglu")):
        vllm_class.register_oot(ours)
        REPLACED[vllm_class.__name__] = block
