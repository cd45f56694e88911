"""Multi-token prediction as Kimi K3's published code has it (vLLM ``kimi_k3/common/mtp.py``, ``amd/mtp.py``: one
depth), as an option of a scratch replay (``--mtp``): besides the next token, the token after it is predicted from the
main model's hidden state and the next token's embedding, through K3's MTP layer (workbench.kimi_k3.modeling
KimiK3MTPLayer):

    h'_i   = eh_proj [enorm(embed(t_{i+1})) ; hnorm(h_i)]         the embedding half first, zeroed at position 0;
                                                                  h_i before the final norm; i < T - 1
    h''    = shared_head.norm(layer(h'))                          a pre-norm decoder layer (MLA, MoE), no AttnRes
    L_mtp  = CE(h'' shared_head.head^T, t_{i+2})                  its own head, through the model's loss block
    loss   = L_main + MTP_WEIGHT * L_mtp                          the weight of DeepSeek-V3's first 10T tokens

The main model is the replay model unchanged (its parameters drawn first from the seed, so it starts where a replay
without MTP starts); the curve recorded is L_main, the MTP loss beside it, each held against its own reference (a
reference run with MTP). The training loop is workbench.replay.train's ``fit``, with the MTP loss recorded beside the
main one and the MTP layer's router balanced like the others'; the default replays never come here.
Shapes: tokens, targets [B, T] int64; hidden states [B*T, D].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workbench.kimi_k3.modeling import KimiK3ForCausalLM, Rows
from workbench.replay.arch import DEFAULT_LOSS, Architecture
from workbench.replay.model import replay_config, routers
from workbench.replay.presets import Preset
from workbench.replay.train import Hooks, RunResult, _cast_parameters, _deterministic_and_seeded, fit, use_ops

MTP_WEIGHT = 0.3


class MTPReplayModel(KimiK3ForCausalLM):
    """The replay model with one MTP depth; ``loss`` is L_main + MTP_WEIGHT * L_mtp, its two parts kept in
    ``last_losses`` (floats) after each call."""

    def __init__(self, p: Preset, arch: Architecture):
        super().__init__(replay_config(p, arch, mtp=1), DEFAULT_LOSS)
        self.last_losses: tuple[float, float] | None = None

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, t = tokens.shape
        head = self.ops[self.loss_block]
        h = self.model(tokens.reshape(-1), Rows(b, t))  # before the final norm: MTP reads it there
        main = head(self.model.norm(h), self.lm_head.weight, targets.reshape(-1), -100, "mean")
        mtp = head(self.mtp_hidden(tokens, h), self.mtp[0].shared_head.head.weight, targets[:, 1:].reshape(-1),
                   -100, "mean")
        self.last_losses = (float(main.detach()), float(mtp.detach()))
        return main + MTP_WEIGHT * mtp


@dataclass
class MTPRun:
    """The run (its curve: the main loss) and the MTP loss per step."""

    result: RunResult
    mtp_curve: list[float] = field(default_factory=list)


def train_mtp(preset: Preset, arch: Architecture, steps: int, seed: int, ops: dict[str, Callable],
              device: str = "cpu", on_step: Callable[[int, float, float], None] | None = None) -> MTPRun:
    """A scratch run with one MTP depth (workbench.replay.train's loop; on_step(step, main loss, seconds))."""
    with _deterministic_and_seeded():
        return _train(preset, arch, steps, seed, ops, device, on_step)


def _train(preset: Preset, arch: Architecture, steps: int, seed: int, ops: dict[str, Callable], device: str,
           on_step: Callable[[int, float, float], None] | None) -> MTPRun:
    torch.manual_seed(seed)
    model = MTPReplayModel(preset, arch)
    _cast_parameters(model, getattr(torch, preset.dtype))
    model = model.to(device)
    use_ops(model, ops)
    result, more = fit(model, dict(model.named_parameters()), preset.lr, "pretrain", preset, steps, seed, device,
                       on_step, Hooks(parts=lambda m, loss: list(m.last_losses), balanced=routers))
    return MTPRun(result, more[0] if more else [])  # (no MTP curve when the first step is not finite)


def source_digest_parts() -> list[str]:
    """What a reference run with MTP depends on besides the replay's own code: this module's source and weight."""
    import inspect
    import sys

    return [inspect.getsource(sys.modules[__name__]), repr(MTP_WEIGHT)]

