"""DeepSeek Sparse Attention as transformers computes it (``deepseek_v32``, ``glm_moe_dsa``): MLA whose queries each
attend only to the top-k keys a lightning indexer picks, with the indexer as workbench::dsa_indexer and the sparse
attention over the decompressed heads as workbench::dsa_sparse_attention.

    indexer (no grad)   q_i = wq_b(q_resid) [B,T,HI,DI], k_i = k_norm(wk(x)) [B,T,DI], both rope'd on their first
                        DR channels; w = weights_proj(x) * HI^-0.5 * DI^-0.5 (the softmax scale folded into the head
                        weights: relu(s * a) = s * relu(a) for s > 0)
    selection           dsa_indexer(q_i, k_i, w, min(index_topk, T)) -> the causal top-k, -1 padded
    attention           dsa_sparse_attention(q, k, v, indices, None, scaling): q, k = [nope | rope] (DN + DR wide),
                        v DV wide, one kv head per query head (MLA decompressed: kv_b_proj in torch), no gate

    decode step         the latents and index keys the mask lets the token see laid out in pages
                        (_common.decode_pages); dsa_indexer_decode(q_i, k_i, w, index pages) -> this step's top-k of
                        its L + 1 keys; dsa_decode over the latent pages at those positions, W_uk absorbed into the
                        query and W_uv applied to the latent output in torch

transformers' own top-k returns int32 indices whose rows t < k - 1 run on into masked future positions; the forms
convert both ways (``to_shipped``, ``from_shipped``) where a layer hands its selection to the next (GLM's shared
indexer layers).
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.integrations.families._common import absorbed, computes, decode_pages, decode_visible, mla_latents
from workbench.integrations.ops import ops

KEY_NORM_IN_TORCH = "inside each DSA layer the indexer's key LayerNorm stays in torch"


def optional_blocks(module: nn.Module) -> tuple[str, ...]:
    """The blocks a DSA attention module computes where they are promoted and requested: its rotary embeddings and,
    where the layer has an indexer, its key LayerNorm."""
    return ("rotary", "layernorm") if getattr(module, "indexer", None) is not None else ("rotary",)


def key_norm(self: nn.Module, k: torch.Tensor) -> torch.Tensor:
    """The DSA attention ``self``'s indexer key norm of k [B,T,DI]: workbench::layernorm where the attention computes
    that block (``computes``), else the indexer's nn.LayerNorm."""
    norm = self.indexer.k_norm
    if computes(self, "layernorm"):
        return ops.layernorm(k, norm.weight, norm.bias, norm.eps)
    return norm(k)


def index_inputs(self: nn.Module, hidden_states: torch.Tensor, q_resid: torch.Tensor, rotate
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DSA attention ``self``'s indexer q [B,T,HI,DI], k [B,T,DI] (the model's dtype) and head weights [B,T,HI]
    (float32, scaled as ``dsa_indexer`` takes them);
    ``rotate(q_rope [B,T,HI,DR], k_rope [B,T,1,DR])`` is the family's rotary embedding of the rope channels."""
    indexer = self.indexer
    b, t = hidden_states.shape[:2]
    dr = indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(b, t, indexer.n_heads, indexer.head_dim)
    k = key_norm(self, indexer.wk(hidden_states)).unsqueeze(2)
    if computes(self, "rotary"):  # workbench::rotary rotates the first DR channels and passes the rest: no split
        q, k = rotate(q, k)
        k = k.squeeze(2)
    else:
        q_rope, k_rope = rotate(q[..., :dr], k[..., :dr])
        q = torch.cat([q_rope, q[..., dr:]], dim=-1)
        k = torch.cat([k_rope, k[..., dr:]], dim=-1).squeeze(2)
    weights = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float()
    return q, k, weights * (indexer.n_heads ** -0.5 * indexer.softmax_scale)


def select(self: nn.Module, hidden_states: torch.Tensor, q_resid: torch.Tensor, rotate, cache=None
           ) -> torch.Tensor:
    """The DSA attention ``self``'s indexer's causal top-k [B,T,k] int64, -1 padded (no gradients, as the shipped
    indexer); ``cache`` (empty for this layer): the index keys written to it, as the shipped indexer does."""
    indexer = self.indexer
    with torch.no_grad():
        q, k, w = index_inputs(self, hidden_states, q_resid, rotate)
        if cache is not None:
            cache.update_indexer(k, indexer.layer_idx)
        return ops.dsa_indexer(q.float(), k.float(), w, min(indexer.index_topk, hidden_states.shape[1]))[1]


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
                  indices: torch.Tensor | None = None, cache=None, select_keys=None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The DSA layer's output [B,T,D] and its selection [B,T,k] (-1 padded): the indexer's (``rotate_index`` its
    rotary embedding; ``select_keys(q_resid)`` instead where the layer's indexer is not DeepSeek's: GLM-5-Next's
    k-pools) or ``indices`` given (a shared layer's). ``rotate`` is the main attention's rotary embedding, as
    ``mla_latents`` takes it. ``cache`` (empty for this layer): the latents and the index keys written to it,
    as the shipped forward does."""
    b, t = hidden_states.shape[:2]
    q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
    q, c_kv, k_rope = mla_latents(self, hidden_states, rotate, q_resid)  # q [B, T, H, DN + DR], k_rope [B, T, DR]
    if cache is not None:
        cache.update(c_kv.view(b, 1, t, self.kv_lora_rank), k_rope.view(b, 1, t, self.qk_rope_head_dim),
                     self.layer_idx)
    kv = self.kv_b_proj(c_kv).view(b, t, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
    k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
    k = torch.cat([k_nope, k_rope[:, :, None].expand(b, t, self.num_heads, self.qk_rope_head_dim)], dim=-1)
    if indices is None:
        indices = select(self, hidden_states, q_resid, rotate_index, cache) if select_keys is None \
            else select_keys(q_resid)
    out = ops.dsa_sparse_attention(q.contiguous(), k.contiguous(), v.contiguous(), indices, None, self.scaling)
    return self.o_proj(out.reshape(b, t, -1)), indices


def decode_latents(self: nn.Module, hidden_states: torch.Tensor, cache, rotate=None):
    """A DSA attention's decode step (hidden_states [B, 1, D]) up to its cache: q_resid [B, 1, q_lora_rank], q
    [B, 1, H, DN + DR], this step's latent c_kv [B, 1, R] and k_rope [B, 1, DR] (``rotate``: as ``mla_latents``
    takes it) written to ``cache`` as the shipped forward writes them, and the rows cached before this step, past
    [B, L_cache, R + DR]."""
    b = hidden_states.shape[0]
    q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
    q, c_kv, k_rope = mla_latents(self, hidden_states, rotate, q_resid)
    keys, values = cache.update(c_kv.view(b, 1, 1, self.kv_lora_rank), k_rope.view(b, 1, 1, self.qk_rope_head_dim),
                                self.layer_idx)
    return q_resid, q, c_kv, k_rope, torch.cat([keys[:, 0, :-1], values[:, 0, :-1]], dim=-1)


def dsa_decode_attention(self: nn.Module, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, cache,
                         rotate, rotate_index, given: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """A DSA decode step (``_common.mla_decodes``: one token per sequence over a cache holding the layer's past) as
    workbench::dsa_indexer_decode and workbench::dsa_decode: the latents (and, where the layer has an indexer, the
    index keys) written to the cache as shipped, the visible ones laid out in pages with one block table
    (``decode_pages``), the token's selection of its visible keys by the indexer (float32 scores, as shipped) or
    ``given`` (a shared layer's: the previous layer's, in cache positions), then the sparse MQA over the selected
    latents. ``rotate`` / ``rotate_index``: the attention's and the indexer's rotary embeddings.
    -> (out [B, 1, D], the selection in cache positions as transformers hands it on: ``to_cache_positions``)."""
    b = hidden_states.shape[0]
    q_resid, q, c_kv, k_rope, past = decode_latents(self, hidden_states, cache, rotate)
    visible = decode_visible(attention_mask, past.shape[1], b, past.device)
    pool, table, lengths = decode_pages(past, visible)
    if given is None:
        with torch.no_grad():
            q_i, k_i, w = index_inputs(self, hidden_states, q_resid, rotate_index)
            index_keys = cache.update_indexer(k_i, self.indexer.layer_idx)  # [B, L_cache + 1, DI]
            index_pool, _, _ = decode_pages(index_keys[:, :-1].float(), visible)
            _, indices, _ = ops.dsa_indexer_decode(q_i[:, 0].float().contiguous(), k_i[:, 0].float().contiguous(),
                                               w[:, 0].contiguous(), index_pool, table, lengths,
                                               self.indexer.index_topk)
        topk = self.indexer.index_topk
    else:
        indices, topk = from_cache_positions(given[:, 0], visible), given.shape[-1]
    q_abs, w_uv = absorbed(self, q)
    o_lat, _ = ops.dsa_decode(q_abs, c_kv[:, 0].contiguous(), k_rope[:, 0].contiguous(), pool, table, lengths, indices,
                          self.scaling)
    out = self.o_proj(torch.einsum("bhr,hdr->bhd", o_lat, w_uv).reshape(b, 1, -1))
    return out, to_cache_positions(indices, visible, topk)[:, None]


def to_cache_positions(indices: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """A decode step's selection [B, K] over its visible keys (0 .. L, -1 padded) as transformers' top-k gives it:
    [B, min(topk, L_cache + 1)] int32 positions of the cache (this step's token last), the padding filled with the
    positions the mask hides (a shipped top-k over masked scores picks those, and the mask drops them)."""
    rows = []
    for n in range(indices.shape[0]):
        seen = torch.cat([visible[n].nonzero()[:, 0], visible.new_tensor([visible.shape[1]], dtype=torch.long)])
        chosen = seen[indices[n][indices[n] >= 0].long()]
        hidden = (~visible[n]).nonzero()[:, 0]
        rows.append(torch.cat([chosen, hidden])[:min(topk, visible.shape[1] + 1)])
    return torch.stack(rows).to(torch.int32)


def from_cache_positions(positions: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """transformers' selection of a decode step [B, K] (cache positions, this step's token at L_cache) as positions
    over the visible keys (0 .. L), the hidden ones as -1 padding, int32."""
    rank = torch.cat([visible.long().cumsum(dim=1) - 1, visible.sum(dim=1, keepdim=True)], dim=1)  # [B, L_cache + 1]
    seen = torch.cat([visible, visible.new_ones(visible.shape[0], 1)], dim=1)
    where = positions.long()
    return torch.where(seen.gather(1, where), rank.gather(1, where), -1).to(torch.int32)
