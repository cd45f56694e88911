"""Multi-token prediction (DeepSeek-V3 section 2.2, depth 1) as an option of a scratch replay (``--mtp``): besides
the next token, the token after it is predicted from the main model's final hidden state and the next token's
embedding, through one more transformer layer, with the shared embedding and output head:

    h'_i   = M [RMSNorm(h_i); RMSNorm(embed(t_{i+1}))]          M [D, 2D]; i < T - 1
    h''    = layer(h')                                        pre-norm attention (the schedule's last kind) and MoE,
                                                              each with a residual
    L_mtp  = CE(RMSNorm(h'') W_lm^T, t_{i+2})                  the loss block of the main head
    loss   = L_main + MTP_WEIGHT * L_mtp                       the weight of DeepSeek-V3's first 10T tokens

The main model is the replay model unchanged (workbench.replay.model), its parameters drawn first from the seed, so
it starts where a replay without MTP starts; the curve recorded is L_main, the MTP loss beside it, each held against
its own reference (a reference run with MTP). The training loop is workbench.replay.train's ``fit``, with the MTP
loss recorded beside the main one and the MTP layer's router bias balanced like the others'; the default replays
never come here.
Shapes: tokens, targets [B, T] int64; hidden states [B*T, D].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.replay.arch import Architecture
from workbench.replay.model import EPS, GatedDSA, KDAAttention, LatentAttention, MoE, ReplayModel, _param
from workbench.replay.presets import Preset
from workbench.replay.train import Hooks, RunResult, _cast_parameters, _deterministic_and_seeded, fit

MTP_WEIGHT = 0.3


class MTPModule(nn.Module):
    """One MTP depth: the projection M of the two normed inputs, one pre-norm layer (attention of ``kind``, MoE),
    the final norm before the shared head."""

    def __init__(self, p: Preset, arch: Architecture, kind: str):
        super().__init__()
        d = p.hidden
        self.hidden_norm, self.embed_norm = _param(d, fill=1.0), _param(d, fill=1.0)
        self.proj = _param(d, 2 * d, std=1 / math.sqrt(2 * d))
        attention = {"K": lambda: KDAAttention(p, arch), "D": lambda: GatedDSA(p), "M": lambda: LatentAttention(p)}
        self.attention, self.moe = attention[kind](), MoE(p, arch)
        self.attention_norm, self.moe_norm, self.out_norm = (_param(d, fill=1.0) for _ in range(3))

    def forward(self, h: torch.Tensor, next_embed: torch.Tensor, batch: int, ops: dict[str, Callable]
                ) -> torch.Tensor:
        """h, next_embed [B*(T-1), D] -> the normed hidden state that predicts t_{i+2}, [B*(T-1), D]."""
        joined = torch.cat([ops["rmsnorm"](h, self.hidden_norm, EPS), ops["rmsnorm"](next_embed, self.embed_norm, EPS)],
                           dim=-1)
        x = joined @ self.proj.T
        x = x + self.attention(ops["rmsnorm"](x, self.attention_norm, EPS), batch, ops)
        x = x + self.moe(ops["rmsnorm"](x, self.moe_norm, EPS), ops)
        return ops["rmsnorm"](x, self.out_norm, EPS)


class MTPReplayModel(ReplayModel):
    """The replay model with one MTP depth; ``loss`` is L_main + MTP_WEIGHT * L_mtp, its two parts kept in
    ``last_losses`` (floats) after each call."""

    def __init__(self, p: Preset, arch: Architecture):
        super().__init__(p, arch)
        self.mtp = MTPModule(p, arch, arch.layers[-1])
        self.last_losses: tuple[float, float] | None = None

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, ops: dict[str, Callable]) -> torch.Tensor:
        head = ops.get("seq_chunked_ce") or ops["vocab_blockwise_ce"]
        batch, t = tokens.shape
        h = self.hidden(tokens, ops)
        main = head(h, self.lm_head, targets.reshape(-1), -100, "mean")
        h_prev = h.view(batch, t, -1)[:, :-1].reshape(batch * (t - 1), -1)
        next_embed = self.embed[tokens[:, 1:].reshape(-1)]
        mtp = head(self.mtp(h_prev, next_embed, batch, ops), self.lm_head, targets[:, 1:].reshape(-1), -100, "mean")
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
    result, more = fit(model, dict(model.named_parameters()), preset.lr, "pretrain", preset, steps, seed, ops, device,
                       on_step, Hooks(parts=lambda m, loss: list(m.last_losses),
                                      balanced=lambda m: [*m.moe, m.mtp.moe]))
    return MTPRun(result, more[0] if more else [])  # (no MTP curve when the first step is not finite)


def source_digest_parts() -> list[str]:
    """What a reference run with MTP depends on besides the replay's own code: this module's source and weight."""
    import inspect
    import sys

    return [inspect.getsource(sys.modules[__name__]), repr(MTP_WEIGHT)]

