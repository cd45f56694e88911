"""fla's recurrent Kimi Delta Attention (fla-core 0.6.0, fla.ops.kda.fused_recurrent_kda), used exactly as the package
ships it: the decode kernel (from vLLM's gdn/kda decode), forward only (no autograd.Function, no backward), so it is
verified with ``--forward-only``.

Its layouts are this block's: q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (log decay, already activated:
use_gate_in_kernel=False); beta [B, T, HV] (post-sigmoid: use_beta_sigmoid_in_kernel=False); initial_state and the
final state [B, HV, K, V] (state_v_first=False), the final state always float32. GVA is supported as this block
defines it (value head hv reads q/k head hv // (HV // H)), so every smoke, edge and hidden shape is verified, the
1:2 and 1:4 groups included. q and k arrive L2-normalised (use_qk_l2norm_in_kernel=False), and scale is passed
through.
"""

from fla.ops.kda import fused_recurrent_kda

BLOCK = "kda"


def run(q, k, v, g, beta, scale, initial_state):
    return fused_recurrent_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state, output_final_state=True,
                               use_qk_l2norm_in_kernel=False)
