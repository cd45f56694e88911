"""Attention over vLLM's paged caches through the serving operators: attention backends vLLM selects by name
(``vllm_plugin`` registers them), imported by vLLM from this path only.

Softmax attention (``WorkbenchAttentionBackend``): attention_prefill and attention_decode.

vLLM keeps one cache tensor a layer, [blocks, KV heads, block rows, 2 * D] as its layer sees it (keys the first D of
a row, values the last; the rows token-major or head-major in memory as the resolved layout says). The backend reads
it as FlashAttention's does: ``kv_cache.transpose(1, 2).split(D, -1)``, two [blocks, rows, KV heads, D] views that
share their strides, which the operators take as they are (no copy of a cache). vLLM's metadata goes in unchanged
but for one difference of convention: its ``seq_lens`` count a sequence's keys after the step, the operators' the
keys cached before it (seq_lens less the step's query length).

A step of decodes only (every query one token) runs attention_decode; any other step attention_prefill, which
covers a decode in a mixed batch as a prompt of one token. Each writes the step's keys and values into their rows
(``forward_includes_kv_cache_update``). What the operators do not compute (ALiBi, encoder or non-causal attention,
a quantized cache, a layer reading another's cache, fused output quantization) is refused when vLLM builds or calls
the layer, one line naming it.

MLA on vLLM's CPU platform (``WorkbenchMLABackend``): vLLM's CPU_MLA with its prefill through mla_prefill and its
decode through mla_decode, over the latent cache as vLLM keeps it ([blocks, 16, R + DR], FlashMLA's layout, the
operators'). vLLM's MLA layer writes each token's latent into its row before attending (``do_kv_cache_update``):
the operators take the tokens cached before the step and write the same values there again. Its decode queries come
absorbed (W_UK applied by vLLM), its output latent goes through W_UV in vLLM. vLLM prefills in the expanded form
(keys and values through kv_b_proj); here the prefill is the absorbed form too, what mla_prefill computes: the new
tokens' queries absorbed through kv_b_proj's W_UK rows, the latent output through its W_UV rows (two batched
products a layer, as vLLM's decode does), equal to the expanded form but for rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend, CPUMLAImpl
from vllm.v1.kv_cache_layout import KVCacheLayout

import workbench.kernels as wk
from workbench.integrations.vllm_plugin import BUILT, attention_replaced


@dataclass
class WorkbenchAttentionMetadata:
    """One step's sequences: query_start_loc [S + 1] int32 (the packed queries' offsets), cached_lens [S] int32 (keys
    in the cache before the step), block_table [S, MAXP] int32."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    cached_lens: torch.Tensor
    block_table: torch.Tensor


class WorkbenchAttentionMetadataBuilder(AttentionMetadataBuilder[WorkbenchAttentionMetadata]):
    """vLLM's common metadata as the operators take it."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> WorkbenchAttentionMetadata:
        meta = common_attn_metadata
        if meta.causal is not True:
            raise NotImplementedError("workbench attention: causal decoder attention only (attention_prefill)")
        n = meta.num_reqs
        starts = meta.query_start_loc[:n + 1].to(torch.int32)
        return WorkbenchAttentionMetadata(
            num_actual_tokens=meta.num_actual_tokens, max_query_len=meta.max_query_len, query_start_loc=starts,
            cached_lens=(meta.seq_lens[:n] - starts.diff()).to(torch.int32),
            block_table=meta.block_table_tensor[:n].to(torch.int32))


class WorkbenchAttentionImpl(AttentionImpl[WorkbenchAttentionMetadata]):
    """One vLLM attention layer: query [T, H, D], key and value [T, HKV, D], kv_cache [blocks, HKV, rows, 2 D] ->
    output [T, H * D] (written in place), the step's keys and values written into the cache."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        refused = [what for what, present in (
            ("ALiBi", alibi_slopes is not None), (f"attention type {attn_type}", attn_type != AttentionType.DECODER),
            (f"a {kv_cache_dtype} KV cache", kv_cache_dtype != "auto"),
            ("a KV cache shared with another layer", kv_sharing_target_layer_name is not None)) if present]
        if refused:
            raise NotImplementedError(f"workbench attention: {', '.join(refused)} not ported (attention_prefill); "
                                      f"serve without WORKBENCH_VLLM=1")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.window = sliding_window or 0  # vLLM's window counts the token itself, as the operators' does
        self.softcap = float(logits_soft_cap or 0.0)
        self.kv_cache_dtype, self.attn_type, self.sinks = kv_cache_dtype, attn_type, sinks
        self.kv_sharing_target_layer_name = None
        BUILT[attention_replaced()] += 1

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: WorkbenchAttentionMetadata | None, output: torch.Tensor,
                output_scale: torch.Tensor | None = None, output_block_scale: torch.Tensor | None = None
                ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("workbench attention: fused output quantization not ported")
        if attn_metadata is None:  # vLLM's profiling run: no cache yet
            return output
        meta, t = attn_metadata, attn_metadata.num_actual_tokens
        k_cache, v_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        q, k, v = (x[:t].view(t, -1, self.head_size) for x in (query, key, value))
        if meta.max_query_len == 1:
            out, _, _ = wk.attention_decode(q, k, v, k_cache, v_cache, meta.block_table, meta.cached_lens,
                                            self.sinks, self.scale, self.window, self.softcap)
        else:
            out, _, _ = wk.attention_prefill(q, k, v, k_cache, v_cache, meta.block_table, meta.cached_lens,
                                             meta.query_start_loc, self.sinks, self.scale, self.window, self.softcap)
        output[:t].copy_(out.reshape(output[:t].shape))
        return output


class WorkbenchAttentionBackend(AttentionBackend):
    """Causal softmax attention (grouped KV heads, a window, sinks, a soft cap) over vLLM's paged KV cache."""

    forward_includes_kv_cache_update: bool = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto"]

    @staticmethod
    def get_name() -> str:
        """The registry's name it is registered under (vLLM looks the backend up by it)."""
        return attention_replaced()

    @staticmethod
    def get_impl_cls() -> type[WorkbenchAttentionImpl]:
        return WorkbenchAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[WorkbenchAttentionMetadataBuilder]:
        return WorkbenchAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        """Token-major pages first (FlashAttention's NHD), head-major (HND) as well: the operators take strides."""
        return (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC)

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


class WorkbenchMLAImpl(CPUMLAImpl):
    """vLLM's CPU MLA with the prefill through mla_prefill and the decode through mla_decode, over the latent cache
    [blocks, PAGE, R + DR]."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        BUILT["CPU_MLA"] += 1

    def absorption(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj's weight [H * (DN + DV), R] as W_UK [H, DN, R] and W_UV [H, DV, R]."""
        weight = getattr(self.kv_b_proj, "weight", None)
        if type(self.kv_b_proj.quant_method).__name__ != "UnquantizedLinearMethod" or weight is None:
            raise NotImplementedError("workbench MLA: a quantized kv_b_proj is not ported (mla_prefill absorbs "
                                      "its plain weight)")
        return weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, -1).split(
            [self.qk_nope_head_dim, self.v_head_dim], dim=1)

    def forward_mha(self, q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor,
                    kv_c_and_k_pe_cache: torch.Tensor, attn_metadata, k_scale: torch.Tensor, output: torch.Tensor,
                    output_scale: torch.Tensor | None = None) -> None:
        """The prefill tokens' q [T, H, DN + DR], latents kv_c_normed [T, R] and k_pe [T, 1, DR] -> output
        [T, H * DV] (written in place), through the absorbed form."""
        prefill = attn_metadata.prefill
        if output_scale is not None or prefill.q_data_type not in (None, q.dtype):
            raise NotImplementedError("workbench MLA: a quantized prefill is not ported (mla_prefill)")
        w_uk, w_uv = self.absorption()
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        absorbed = torch.cat([torch.einsum("thn,hnr->thr", q_nope, w_uk), q_pe], dim=-1)
        starts = prefill.query_start_loc.to(torch.int32)
        cached = (prefill.chunked_context.context_lens.to(torch.int32) if prefill.chunked_context is not None
                  else torch.zeros(len(starts) - 1, dtype=torch.int32, device=q.device))
        latent, _ = wk.mla_prefill(absorbed, kv_c_normed, k_pe.reshape(len(k_pe), -1), kv_c_and_k_pe_cache,
                                   prefill.block_table.to(torch.int32), cached, starts, self.scale)
        output.copy_(torch.einsum("thr,hvr->thv", latent, w_uv).flatten(start_dim=1))

    def forward_mqa(self, q, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata, layer
                    ) -> tuple[torch.Tensor, None]:
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        block_table = attn_metadata.decode.block_table.to(torch.int32)
        cached = attn_metadata.decode.seq_lens.to(torch.int32) - 1  # before the step's token, which vLLM wrote
        if q.shape[0] != cached.shape[0]:
            raise NotImplementedError(f"workbench MLA: one query token a decode (mla_decode), got {q.shape[0]} "
                                      f"for {cached.shape[0]} sequences")
        page = kv_c_and_k_pe_cache.shape[1]
        rows = cached.long()
        latents = kv_c_and_k_pe_cache[block_table[torch.arange(len(rows)), rows // page].long(), rows % page]
        o, _ = wk.mla_decode(q, latents[:, :self.kv_lora_rank], latents[:, self.kv_lora_rank:], kv_c_and_k_pe_cache,
                             block_table, cached, self.scale)
        return o, None


class WorkbenchMLABackend(CPUMLABackend):
    """vLLM's CPU_MLA backend with WorkbenchMLAImpl."""

    @staticmethod
    def get_impl_cls() -> type[WorkbenchMLAImpl]:
        return WorkbenchMLAImpl
