"""Replay presets: the sizes of the small model, its training schedule and the band its curve is held to.

``tiny`` runs on a CPU with interpreter kernels in a few minutes (CI); ``small`` and ``medium`` are for a GPU.
Every preset keeps the target's structure: linear attention in about 3 of 4 layers and full attention in the rest
(which kinds, the model card decides: workbench/replay/arch.py), Block AttnRes over blocks of a few layers, a dense
first layer, routed MoE layers with one shared expert, and a vocabulary much larger than the hidden size.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from workbench.errors import WorkbenchError

MODES = ("scratch", "lora")


@dataclass(frozen=True)
class Preset:
    name: str
    vocab: int                 # tokenizer vocabulary (reserved ids fill what the corpus does not use)
    hidden: int                # D
    layers: str                # one letter per layer: K = linear attention, F = full attention
    heads: int                 # attention heads (KDA q/k and value heads; DSA query heads, one shared kv head)
    head_dim: int              # K = V for KDA, D for DSA, the nope part and the values of MLA (its rope part: half)
    mla_rank: int              # MLA's kv latent rank (its q latent is the hidden size)
    index_heads: int           # DSA lightning-indexer heads
    index_dim: int
    dsa_topk: int              # keys each query attends to in a DSA layer
    experts: int               # routed experts
    active: int                # experts per token
    expert_ffn: int            # F of each routed expert (and of the shared expert)
    dense_ffn: int             # F of the dense MLP of the first layer (Kimi K3's 33792 is 11 expert widths)
    attnres_block: int         # layers per AttnRes block (Kimi K3's 12 of 93 give 8 blocks; a few layers here)
    seq_len: int               # tokens per sequence
    batch: int                 # sequences per step
    steps: int                 # default steps of a scratch replay
    lora_steps: int            # default steps of a LoRA replay
    base_steps: int            # steps of the scratch run that makes the LoRA base checkpoint
    lr: float
    lora_lr: float
    weight_decay: float
    lora_rank: int
    lora_alpha: float
    dtype: str                 # parameter and activation dtype
    band_rtol: float           # per-step band: |loss - reference| <= band_atol + band_rtol * |reference|
    band_atol: float
    final_rtol: float          # final loss within final_rtol of the reference's
    param_rtol: float          # final parameter fingerprints within param_rtol (relative to the tensor's norm)
    topk_atol: float           # eval top-k log-probs within topk_atol
    eval_topk: int = 5

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.batch

    @property
    def initial_loss(self) -> float:
        """ln(vocab): the loss of a uniform prediction, where a scratch run starts."""
        return math.log(self.vocab)

    def default_steps(self, mode: str) -> int:
        return self.steps if mode == "scratch" else self.lora_steps

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {p.name: p for p in (
    Preset(name="tiny", vocab=512, hidden=32, layers="KF", heads=2, head_dim=16, mla_rank=16, index_heads=2,
           index_dim=16, dsa_topk=4, experts=8, active=2, expert_ffn=32, dense_ffn=64, attnres_block=1, seq_len=16,
           batch=2, steps=20,
           lora_steps=12, base_steps=300, lr=1e-2, lora_lr=1e-2, weight_decay=0.01, lora_rank=4, lora_alpha=8.0,
           dtype="float32", band_rtol=2e-3, band_atol=1e-4, final_rtol=2e-3, param_rtol=1e-3, topk_atol=5e-3),
    Preset(name="small", vocab=32768, hidden=256, layers="KKKFKKKF", heads=4, head_dim=64, mla_rank=128, index_heads=4,
           index_dim=64, dsa_topk=128, experts=32, active=4, expert_ffn=256, dense_ffn=1024, attnres_block=2,
           seq_len=512, batch=4,
           steps=300, lora_steps=200, base_steps=600, lr=3e-3, lora_lr=2e-3, weight_decay=0.01, lora_rank=16,
           lora_alpha=32.0, dtype="bfloat16", band_rtol=2e-2, band_atol=1e-3, final_rtol=2e-2, param_rtol=5e-2,
           topk_atol=0.1),
    Preset(name="medium", vocab=65536, hidden=1024, layers="KKKFKKKFKKKF", heads=8, head_dim=128, mla_rank=256,
           index_heads=8,
           index_dim=128, dsa_topk=512, experts=64, active=8, expert_ffn=512, dense_ffn=2048, attnres_block=3,
           seq_len=2048,
           batch=4, steps=400, lora_steps=300, base_steps=800, lr=1.5e-3, lora_lr=1e-3, weight_decay=0.01,
           lora_rank=32, lora_alpha=64.0, dtype="bfloat16", band_rtol=2e-2, band_atol=1e-3, final_rtol=2e-2,
           param_rtol=5e-2, topk_atol=0.1),
)}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise WorkbenchError(f"unknown replay preset '{name}' (known: {', '.join(PRESETS)})")
    return PRESETS[name]


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise WorkbenchError(f"unknown replay mode '{mode}' (known: {', '.join(MODES)})")
    return mode
