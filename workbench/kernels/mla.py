"""workbench::mla(q, c_kv, k_rope, w_uk, w_uv, gate, scale) -> out: multi-head latent attention from the kv latent
(per-head up-projections, shared rope key, causal), optional sigmoid output gate, as workbench/blocks/mla.py defines
it, backed by the newest promoted mla operator; gradients for q, c_kv, k_rope, w_uk, w_uv, gate."""

from workbench.kernels._ops import BlockOp

mla = BlockOp("mla")
