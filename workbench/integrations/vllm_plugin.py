"""The promoted operators inside vLLM's own model code: the ``vllm.general_plugins`` entry point ``workbench``
(pyproject.toml), which vLLM loads in every process it starts (the engine's and each worker's). It is off unless
``WORKBENCH_VLLM=1`` is in the environment; the operators come from ``$WORKBENCH_OPERATORS`` (else ./operators).

Each replacement is vLLM's own class, subclassed and registered by its name through vLLM's plug point
(``CustomOp.register_oot``): vLLM then builds ours wherever its model code builds the class, its weights load as
before, and only the forward changes, taking vLLM's tensors as they are. vLLM calls ``forward_cpu`` on CPU,
``forward_cuda`` on NVIDIA and ``forward_hip`` on AMD (which calls ``forward_cuda``); all are the operator. Softmax
attention is an attention backend (``vllm_attention``), registered under a name of vLLM's backend registry.

    vLLM class    plug point                   block     what runs
    RMSNorm       CustomOp.register_oot        rmsnorm   the norm; with a residual, vLLM's fused add first (float32
                                                         sum, cast to x's dtype, as vllm.ir's fused_add_rms_norm)
    SiluAndMul    CustomOp.register_oot        swiglu    silu(x[..., :d]) * x[..., d:]
    SituAndMul    CustomOp.register_oot        situ      K3's SiTU: beta tanh(gate / beta) sigmoid(gate) * the up half
                                                         soft-clipped at linear_beta
    UnquantizedFusedMoEMethod                  moe_topk (routing from vLLM's gate logits: the method declares
                  CustomOp.register_oot                  itself monolithic, vLLM's plug point for experts that
                                                         route), moe_permute, moe_grouped_gemm (SwiGLU experts),
                                                         moe_combine; vLLM's w13 split into w1, w3 once at load
    CompressedTensorsW4A4Mxfp4MoEMethod        moe_topk, moe_permute, moe_grouped_gemm_mxfp4, moe_combine: the same
                  register_quantization_config  over a compressed-tensors MXFP4 checkpoint's packed codes and
                  ("compressed-tensors")         scales
    CPU_ATTN      register_backend             attention_prefill, attention_decode: softmax attention over
    (CUSTOM off CPU, an attention backend)     vLLM's paged KV cache as vLLM lays it out (vllm_attention)
    CPU_MLA       register_backend (CPU only)  mla_prefill, mla_decode: MLA's absorbed prefill and decode over
                                               vLLM's paged latent cache (vLLM writes the latents)

A call the operator does not cover (RMSNorm's ``var_hidden_size``, no weight; SiTU without linear_beta; experts
with biases, another activation, an expert map or the router weight on the input; routing by a custom function, a
token hash, expert load balancing, or expert groups scored by their best alone, which stays vLLM's router's) runs
vLLM's own forward and is counted as such (``FALLBACKS``), so a parity run can say what did not run the operator.
The attention backends have no such way back (vLLM's cache is laid out for them): what they do not compute is
refused when vLLM builds the layer. With moe_topk routing, vLLM's routed-experts capture refuses the layer (it
captures only its own monolithic kernels). vLLM only logs a plugin that fails to import and goes on: ``REPLACED``
(filled at registration) and the ops' run counts are what proves the swap happened.
"""

from __future__ import annotations

import collections
import os

ENABLE = "WORKBENCH_VLLM"
REPLACED: dict[str, list[str]] = {}
"""vLLM class -> the blocks its replacement runs, for each replacement registered in this process."""
BUILT: collections.Counter[str] = collections.Counter()
"""vLLM class -> the instances of its replacement vLLM's model code built (a model without MoE builds no experts)."""
FALLBACKS: collections.Counter[str] = collections.Counter()
"""vLLM class -> calls its replacement handed back to vLLM's own forward (a case the operator does not cover)."""


def enabled() -> bool:
    return os.environ.get(ENABLE, "0") == "1"


def attention_replaced() -> str:
    """The vLLM attention backend whose name the workbench's takes (``vllm_attention``): CPU_ATTN on CPU, the one
    vLLM's CPU platform selects for softmax attention; elsewhere CUSTOM, chosen with ``--attention-backend CUSTOM``
    (``attention_config={"backend": "CUSTOM"}``)."""
    from vllm.platforms import current_platform

    return "CPU_ATTN" if current_platform.is_cpu() else "CUSTOM"


def routes_in_groups(layer) -> bool:
    """Whether vLLM routes ``layer`` group-limited: its grouped top-k over more than one group."""
    return layer.use_grouped_topk and (layer.num_expert_group or 1) > 1


def topk_like_vllm(layer, router_logits):
    """moe_topk routing the gate's logits [T, E] as vLLM's router routes them for ``layer`` (its top_k, scoring_func,
    renormalize, use_grouped_topk, num_expert_group, topk_group, routed_scaling_factor, e_score_correction_bias):
    the route scale only where vLLM's grouped or biased routers apply it (its plain top-k leaves it to the model).
    Returns (weights [T, k] float32, ids [T, k] int64)."""
    import torch

    import workbench.kernels as wk

    grouped = routes_in_groups(layer)
    bias = layer.e_score_correction_bias
    scaled = layer.use_grouped_topk or bias is not None
    bias = bias.float() if bias is not None else torch.zeros(router_logits.shape[-1], device=router_logits.device)
    weights, ids, _ = wk.moe_topk(router_logits, bias, layer.top_k, layer.scoring_func, layer.renormalize,
                                  float(layer.routed_scaling_factor) if scaled else 1.0,
                                  layer.num_expert_group if grouped else 1, layer.topk_group if grouped else 1)
    return weights, ids


def register() -> None:
    """The entry point: vLLM calls it once per process, before any model is built."""
    if not enabled() or REPLACED:
        return
    import torch
    import vllm.envs as vllm_envs
    from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.runner.shared_experts import SharedExpertsOrder
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.quantization import register_quantization_config
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a4_mxfp4 as mxfp4_moe,
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    import workbench.kernels as wk
    from workbench.blocks.moe_router import SCORE_FUNCS

    class Built:
        """Counts the instances vLLM builds of a replacement (BUILT, by the vLLM class it replaces)."""

        replaces = ""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            BUILT[self.replaces] += 1

    class WorkbenchRMSNorm(Built, RMSNorm):
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

    class WorkbenchSiluAndMul(Built, SiluAndMul):
        """vLLM's SiluAndMul through the swiglu operator: x [T, 2d] -> [T, d]."""

        def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
            d = x.shape[-1] // 2
            return wk.swiglu(x[..., :d].contiguous(), x[..., d:].contiguous())

        forward_cuda = forward_cpu

    class WorkbenchSituAndMul(Built, SituAndMul):
        """vLLM's SituAndMul (Kimi K3's MLPs) through the situ operator: x [T, 2d] -> [T, d],
        beta tanh(gate / beta) sigmoid(gate) * linear_beta tanh(up / linear_beta). Without linear_beta (up not
        clipped) vLLM's own forward runs."""

        def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
            if self.linear_beta is None:
                FALLBACKS["SituAndMul"] += 1
                return self.forward_native(x)
            return wk.situ(x.contiguous(), self.beta, self.linear_beta)

        forward_cuda = forward_cpu

    class RoutedExperts:
        """The routed experts: vLLM's gate logits routed by moe_topk (the method then is monolithic: vLLM hands it
        the logits, not its router's choice), rows permuted by expert (moe_permute), the experts' SwiGLU MLPs as a
        grouped GEMM (``experts``), the weighted combine (moe_combine). Routing moe_topk does not compute stays
        vLLM's router's, whose top-k ids and weights ``apply`` takes."""

        workbench_routes = False

        def covers(self, layer) -> bool:
            return (layer.activation == MoEActivation.SILU and not self.moe.has_bias and layer.expert_map is None
                    and not layer.apply_router_weight_on_input)

        def routes(self, layer) -> bool:
            """vLLM's router computes moe_topk's math: sigmoid, softmax or DeepSeek-V4's sqrt(softplus) scores, no
            custom function, token hash, expert load balancing or simulated routing; expert groups scored by their
            two best (vLLM's grouped top-k with a correction bias; without one it takes their best)."""
            return (layer.custom_routing_function is None and layer.scoring_func in SCORE_FUNCS
                    and not self.moe.moe_parallel_config.enable_eplb and not self.moe.has_hash_routing
                    and not vllm_envs.VLLM_MOE_ROUTING_SIMULATION_STRATEGY
                    and (layer.e_score_correction_bias is not None or not routes_in_groups(layer)))

        def take_routing(self, layer) -> None:
            """At load, for experts this covers: route with moe_topk where ``routes``, else count vLLM's router."""
            self.workbench_routes = self.routes(layer)
            if not self.workbench_routes:
                FALLBACKS["FusedMoERouter"] += 1

        @property
        def is_monolithic(self) -> bool:
            return self.workbench_routes or super().is_monolithic

        @property
        def mk_can_overlap_shared_experts(self) -> bool:  # routing itself, the method never sees the shared experts
            return not self.workbench_routes and super().mk_can_overlap_shared_experts

        def apply_monolithic(self, layer, x, router_logits, input_ids=None):
            """x [T, D], vLLM's gate logits [T, E] -> [T, D]: routed by moe_topk (``topk_like_vllm``), then the
            experts."""
            if not self.workbench_routes:
                return super().apply_monolithic(layer, x, router_logits, input_ids)
            weights, ids = topk_like_vllm(layer, router_logits)
            return self.routed(layer, x, weights, ids, None, None)

        def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
            if not self.experts_loaded(layer):
                return super().apply(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)
            return self.routed(layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input)

        def routed(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
            rows, _, row_of_slot, _, offsets = wk.moe_permute(x, topk_ids.long(), layer.global_num_experts)
            y = self.experts(layer, rows, offsets)
            if shared_experts is not None:  # as vLLM's modular kernel runs them (their output is the runner's)
                shared_experts(shared_experts_input, SharedExpertsOrder.MK_INTERNAL_OVERLAPPED)
            return wk.moe_combine(y, topk_weights, row_of_slot)

    class WorkbenchFusedMoEMethod(Built, RoutedExperts, UnquantizedFusedMoEMethod):
        """vLLM's unquantized experts through moe_topk, moe_permute, moe_grouped_gemm and moe_combine: x [T, D],
        the gate's logits [T, E] (or vLLM's top-k ids and weights) -> [T, D]. w13 [E, 2F, D] (gate rows, then up
        rows) is split once at load into w1, w3 [E, F, D]; w2 [E, D, F] is read as loaded."""

        def process_weights_after_loading(self, layer) -> None:
            if not self.covers(layer):  # vLLM's own kernel (it lays the weights out for itself)
                FALLBACKS["UnquantizedFusedMoEMethod"] += 1
                super().process_weights_after_loading(layer)
                return
            half = layer.w13_weight.shape[1] // 2
            layer.workbench_w1 = layer.w13_weight.data[:, :half].contiguous()
            layer.workbench_w3 = layer.w13_weight.data[:, half:].contiguous()
            self.take_routing(layer)

        def experts_loaded(self, layer) -> bool:
            return hasattr(layer, "workbench_w1")

        def experts(self, layer, rows, offsets):
            """rows [M, D] grouped by expert (offsets [E + 1]) -> [M, D]: the SwiGLU MLPs."""
            return wk.moe_grouped_gemm(rows, offsets, layer.workbench_w1, layer.workbench_w3, layer.w2_weight,
                                       "swiglu", 4.0, 25.0)

    class WorkbenchMxfp4MoEMethod(Built, RoutedExperts, mxfp4_moe.CompressedTensorsW4A4Mxfp4MoEMethod):
        """compressed-tensors' MXFP4 experts (weight-only, Kimi K3's published format) through moe_topk,
        moe_permute, moe_grouped_gemm_mxfp4 and moe_combine, on the packed codes and e8m0 scales as loaded: w13
        [E, 2F, D / 2] uint8 and its scales [E, 2F, D / 32] split once at load into w1, w3 (gate rows, then up
        rows); w2 [E, D, F / 2] and its scales [E, D, F / 32] read as loaded. A case this does not cover runs vLLM's
        own kernel (Marlin, CUTLASS: a GPU's)."""

        def process_weights_after_loading(self, layer) -> None:
            if not self.covers(layer):
                FALLBACKS["CompressedTensorsW4A4Mxfp4MoEMethod"] += 1
                super().process_weights_after_loading(layer)
                return
            half = layer.w13_weight_packed.shape[1] // 2
            packed, scale = layer.w13_weight_packed.data, layer.w13_weight_scale.data
            layer.workbench_mxfp4 = tuple(t.contiguous() for t in (
                packed[:, :half], scale[:, :half], packed[:, half:], scale[:, half:], layer.w2_weight_packed.data,
                layer.w2_weight_scale.data))
            self.take_routing(layer)

        def experts_loaded(self, layer) -> bool:
            return hasattr(layer, "workbench_mxfp4")

        def experts(self, layer, rows, offsets):
            return wk.moe_grouped_gemm_mxfp4(rows, offsets, *layer.workbench_mxfp4, "swiglu", 4.0, 25.0)

    class WorkbenchCompressedTensorsConfig(CompressedTensorsConfig):
        """compressed-tensors' quantization config, its MXFP4 experts through WorkbenchMxfp4MoEMethod."""

        def get_quant_method(self, layer, prefix: str):
            method = super().get_quant_method(layer, prefix)
            if type(method) is mxfp4_moe.CompressedTensorsW4A4Mxfp4MoEMethod:
                return WorkbenchMxfp4MoEMethod(layer.moe_config)
            return method

    for vllm_class, ours, blocks in ((RMSNorm, WorkbenchRMSNorm, ["rmsnorm"]),
                                     (SiluAndMul, WorkbenchSiluAndMul, ["swiglu"]),
                                     (SituAndMul, WorkbenchSituAndMul, ["situ"]),
                                     (UnquantizedFusedMoEMethod, WorkbenchFusedMoEMethod,
                                      ["moe_topk", "moe_permute", "moe_grouped_gemm", "moe_combine"])):
        ours.replaces = vllm_class.__name__
        vllm_class.register_oot(ours)
        REPLACED[vllm_class.__name__] = blocks
    WorkbenchMxfp4MoEMethod.replaces = "CompressedTensorsW4A4Mxfp4MoEMethod"
    register_quantization_config("compressed-tensors")(WorkbenchCompressedTensorsConfig)
    REPLACED["CompressedTensorsW4A4Mxfp4MoEMethod"] = ["moe_topk", "moe_permute", "moe_grouped_gemm_mxfp4",
                                                       "moe_combine"]
    backend = attention_replaced()
    register_backend(AttentionBackendEnum[backend], "workbench.integrations.vllm_attention.WorkbenchAttentionBackend")
    REPLACED[backend] = ["attention_prefill", "attention_decode"]
    if backend == "CPU_ATTN":  # vLLM's CPU MLA through mla_prefill and mla_decode (GPU MLA backends stay vLLM's)
        register_backend(AttentionBackendEnum.CPU_MLA, "workbench.integrations.vllm_attention.WorkbenchMLABackend")
        REPLACED["CPU_MLA"] = ["mla_prefill", "mla_decode"]
