"""Kimi K3's text model as its published serving code computes it (workbench.kimi_k3.modeling), its configuration
(config), its serving caches (serving) and its checkpoints in the published layout (checkpoint)."""

from workbench.kimi_k3.config import KimiK3Config
from workbench.kimi_k3.modeling import KimiK3ForCausalLM

__all__ = ["KimiK3Config", "KimiK3ForCausalLM"]
