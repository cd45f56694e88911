"""DeepSeek Sparse Attention as transformers computes it (``deepseek_v32``, ``glm_moe_dsa``): MLA whose queries each
attend only to the top-k keys a lightning indexer picks, with the indexer as workbench::dsa_indexer and the sparse
attention over the decompressed heads as workbench::dsa_sparse_attention.

    indexer (no grad)   q_i = wq_b(q_resid) [B,T,HI,DI], k_i = k_norm(wk(x)) [B,T,DI], both rope'd on their first
                        DR channels; w = weights_proj(x) * HI^-0.5 * DI^-0.5 (the softmax scale folded into the head
                        weights: relu(s * a) = s * relu(a) for s > 0)
    selection           dsa_indexer(q_i, k_i, w, min(index_topk, T)) -> the causal top-k, -1 padded
    attention           dsa_sparse_attention(q, k, v, indices, None, scaling): q, k = [nope | rope] (DN + DR wide),
                        v DV wide, one kv head per query head (MLA decompressed: kv_b_proj in torch), no gate

transformers' own top-k returns int32 indices whose rows t < k - 1 run on into masked future positions; the forms
convert both ways (``to_shipped``, ``from_shipped``) where a layer hands its selection to the next (GLM's shared
indexer layers).
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.kernels import dsa_indexer, dsa_sparse_attention


def index_inputs(indexer: nn.Module, hidden_states: torch.Tensor, q_resid: torch.Tensor, rotate
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The indexer's q [B,T,HI,DI], k [B,T,DI] (the model's dtype) and head weights [B,T,HI] (float32, scaled as
    ``dsa_indexer`` takes them);
    ``rotate(q_rope [B,T,HI,DR], k_rope [B,T,1,DR])`` is the family's rotary embedding of the rope channels."""
    b, t = hidden_states.shape[:2]
    dr = indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(b, t, indexer.n_heads, indexer.head_dim)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    q_rope, k_rope = rotate(q[..., :dr], k[..., :dr])
    q = torch.cat([q_rope, q[..., dr:]], dim=-1)
    k = torch.cat([k_rope, k[..., dr:]], dim=-1).squeeze(2)
    weights = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float()
    return q, k, weights * (indexer.n_heads ** -0.5 * indexer.softmax_scale)


def select(indexer: nn.Module, hidden_states: torch.Tensor, q_resid: torch.Tensor, rotate, cache=None
           ) -> torch.Tensor:
    """The indexer's causal top-k [B,T,k] int64, -1 padded (no gradients, as the shipped indexer); ``cache`` (empty
    for this layer): the index keys written to it, as the shipped indexer does."""
    with torch.no_grad():
        q, k, w = index_inputs(indexer, hidden_states, q_resid, rotate)
        if cache is not None:
            cache.update_indexer(k, indexer.layer_idx)
        return dsa_indexer(q.float(), k.float(), w, min(indexer.index_topk, hidden_states.shape[1]))[1]


def to_shipped(indices: torch.Tensor) -> torch.Tensor:
    """-1 padded indices as transformers' top-k gives them: int32, the padding of row t (slots i > t) filled with
    the distinct future positions i, which the causal mask hides."""
    slots = torch.arange(indices.shape[-1], device=indices.device)
    return torch.where(indices < 0, slots, indices).to(torch.int32)


def from_shipped(indices: torch.Tensor) -> torch.Tensor:
    """transformers' top-k indices [B,T,k] with every future position (s > t) as -1 padding, int64."""
    rows = torch.arange(indices.shape[1], device=indices.device)[None, :, None]
    indices = indices.long()
    return torch.where(indices > rows, torch.full_like(indices, -1), indices)


def dsa_attention(self: nn.Module, hidden_states: torch.Tensor, rotate, rotate_index,
                  indices: torch.Tensor | None = None, cache=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The DSA layer's output [B,T,D] and its selection [B,T,k] (-1 padded): the indexer's (``rotate_index`` its
    rotary embedding) or ``indices`` given (a shared layer's). ``rotate(q_rope [B,H,T,DR], k_rope [B,1,T,DR])`` is
    the main attention's rotary embedding. ``cache`` (empty for this layer): the latents and the index keys written
    to it, as the shipped forward does."""
    b, t = hidden_states.shape[:2]
    q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
    q = self.q_b_proj(q_resid).view(b, t, self.num_heads, self.qk_head_dim).transpose(1, 2)
    q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
    c_kv, k_rope = self.kv_a_proj_with_mqa(hidden_states).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
    c_kv = self.kv_a_layernorm(c_kv)
    q_rope, k_rope = rotate(q_rope, k_rope.view(b, 1, t, self.qk_rope_head_dim))
    if cache is not None:
        cache.update(c_kv.view(b, 1, t, self.kv_lora_rank), k_rope, self.layer_idx)
    kv = self.kv_b_proj(c_kv).view(b, t, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
    k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
    q = torch.cat([q_nope, q_rope], dim=-1).transpose(1, 2)  # [B, T, H, DN + DR]
    k = torch.cat([k_nope, k_rope.transpose(1, 2).expand(b, t, self.num_heads, self.qk_rope_head_dim)], dim=-1)
    if indices is None:
        indices = select(self.indexer, hidden_states, q_resid, rotate_index, cache)
    out = dsa_sparse_attention(q.contiguous(), k.contiguous(), v.contiguous(), indices, None, self.scaling)
    return self.o_proj(out.reshape(b, t, -1)), indices
