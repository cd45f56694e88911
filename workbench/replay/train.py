"""One training run of the replay model: scratch (random init) or LoRA (frozen base checkpoint + adapters), AdamW,
a fixed data order, the loss of every step, and at the end what the comparison needs besides the curve: fingerprints
of the trained parameters and the top-k log-probs of a held-out batch (as Liger's convergence tests compare).

Runs in the process that holds the ops (a child process whose environment selects the Triton backend).
"""

from __future__ import annotations

import contextlib
import math
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.blocks.moe_router import update_bias
from workbench.kimi_k3.modeling import KimiK3ForCausalLM
from workbench.replay.arch import LOSS_BLOCKS, Architecture
from workbench.replay.data import batches
from workbench.replay.model import replay_model, routers
from workbench.replay.presets import Preset

WARMUP_STEPS = 10
BETAS = (0.9, 0.95)
CLIP_NORM = 1.0
BIAS_UPDATE = 1e-3  # aux-loss-free balancing step (DeepSeek-V3's gamma)
EVAL_SEED_OFFSET = 10_000


@dataclass
class RunResult:
    """curve: loss per step (a non-finite loss ends the run: the curve stops there, nonfinite_step says where);
    fingerprints: {parameter: [norm, <param, fixed random signs>]} of the trained parameters; topk: the eval batch's
    top-k next-token log-probs and ids; seconds: wall time of the steps."""

    curve: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    nonfinite_step: int | None = None
    fingerprints: dict[str, list[float]] = field(default_factory=dict)
    topk_values: list[list[float]] = field(default_factory=list)
    topk_ids: list[list[int]] = field(default_factory=list)
    eval_loss: float | None = None
    seconds: float = 0.0

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(len(self.curve), 1)


def _cast_parameters(model: KimiK3ForCausalLM, dtype: torch.dtype) -> None:
    """Parameters to the preset's dtype; buffers (the float32 router bias) stay as they are."""
    for param in model.parameters():
        param.data = param.data.to(dtype)


def build_model(preset: Preset, arch: Architecture, seed: int, device: str, base: Path | None = None,
                mtp: int = 0) -> KimiK3ForCausalLM:
    """The model of ``arch`` initialized from ``seed`` (scratch) or loaded from the base checkpoint ``base``; ``mtp``
    MTP depths."""
    torch.manual_seed(seed)
    model = replay_model(preset, arch, mtp)
    if base is not None:
        model.load_state_dict(torch.load(base, map_location="cpu", weights_only=True))
    _cast_parameters(model, getattr(torch, preset.dtype))
    return model.to(device)


def use_ops(model: KimiK3ForCausalLM, ops: dict[str, Callable]) -> None:
    """The model computes every block with ``ops`` (an adapter added later too), its loss head the loss block among
    them."""
    model.loss_block = next(b for b in LOSS_BLOCKS if b in ops)
    model.use_ops(ops)


def fingerprint(name: str, param: torch.Tensor) -> list[float]:
    """[norm, <param, s>] with s a fixed pseudo-random sign vector per parameter name: two numbers that move with any
    element of the tensor, so trained weights can be compared without shipping them."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    signs = torch.randint(0, 2, (param.numel(),), generator=g).to(torch.float64) * 2 - 1
    flat = param.detach().reshape(-1).double().cpu()
    return [float(flat.norm()), float(flat @ signs)]


def train(preset: Preset, arch: Architecture, mode: str, steps: int, seed: int, ops: dict[str, Callable],
          device: str = "cpu", base: Path | None = None, on_step: Callable[[int, float, float], None] | None = None
          ) -> RunResult:
    """Train ``steps`` steps; on_step(step, loss, seconds) after each. mode "lora" needs ``base``."""
    return _fit(preset, arch, mode, steps, seed, ops, device, base, on_step)[1]


@contextlib.contextmanager
def _deterministic_and_seeded() -> Iterator[None]:
    """Deterministic algorithms on for the run; on the way out torch's global state is as it was (the
    deterministic-algorithms flag and the CPU and CUDA RNG states), so a run in-process changes nothing after it."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _fit(preset: Preset, arch: Architecture, mode: str, steps: int, seed: int, ops: dict[str, Callable],
         device: str, base: Path | None, on_step: Callable[[int, float, float], None] | None
         ) -> tuple[KimiK3ForCausalLM, RunResult]:
    with _deterministic_and_seeded():
        return _fit_steps(preset, arch, mode, steps, seed, ops, device, base, on_step)


def _fit_steps(preset: Preset, arch: Architecture, mode: str, steps: int, seed: int, ops: dict[str, Callable],
               device: str, base: Path | None, on_step: Callable[[int, float, float], None] | None
               ) -> tuple[KimiK3ForCausalLM, RunResult]:
    model = build_model(preset, arch, seed, device, base if mode == "lora" else None)
    if mode == "lora":
        trainable = model.add_lora(preset.lora_rank, preset.lora_alpha, seed)
        lr, corpus = preset.lora_lr, "finetune"
    else:
        trainable = {n: p for n, p in model.named_parameters()}
        lr, corpus = preset.lr, "pretrain"
    use_ops(model, ops)
    hooks = Hooks(balanced=routers if mode == "scratch" else None)
    result, _ = fit(model, trainable, lr, corpus, preset, steps, seed, device, on_step, hooks)
    return model, result


def loss_value(model: KimiK3ForCausalLM, loss: torch.Tensor) -> list[float]:
    """The parts of a step's loss that a run records: the loss itself."""
    return [float(loss.detach())]


def clip_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """torch's clip_grad_norm_ over ``params``; the norm before clipping."""
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))


@dataclass
class Hooks:
    """What a run changes in the one training loop (``fit``); the defaults are the single-process run's.

    parts(model, loss): the values a step records; the first is the curve, the rest come back as further curves
        (the MTP loss; each rank's local loss); a non-finite one ends the run.
    balanced(model): the routers whose correction bias is balanced after each step (aux-loss-free), from
        ``counts(gate.last_counts)`` (the counts summed over ranks); None: no balancing (LoRA).
    rows: the rows of each batch this process trains on (a rank's share).
    after_backward(trainable): a change to the gradients before clipping (expert gradients scaled by 1 / ranks).
    clip(params, max_norm) -> the norm: the gradient clipping (over every rank's shards).
    full(name, param): the whole parameter for its fingerprint (a shard or an expert slice gathered).
    evaluate(model, preset, corpus, seed, device, result): the held-out batch (split over the ranks).
    forward(): the context each step's forward runs in (the saved-tensor accounting of a measured run).
    after_step(optimizer, trainable): after each optimizer step, before the gradients are dropped (measuring).
    """

    parts: Callable[[KimiK3ForCausalLM, torch.Tensor], list[float]] = loss_value
    balanced: Callable[[KimiK3ForCausalLM], list] | None = None
    counts: Callable[[torch.Tensor], torch.Tensor] = lambda counts: counts
    rows: slice = field(default_factory=lambda: slice(None))
    after_backward: Callable[[dict[str, torch.Tensor]], None] | None = None
    clip: Callable[[list[torch.Tensor], float], float] = clip_norm
    full: Callable[[str, torch.Tensor], torch.Tensor] = lambda name, param: param
    evaluate: Callable[..., None] | None = None
    forward: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    after_step: Callable[[torch.optim.Optimizer, dict[str, torch.Tensor]], None] | None = None


def fit(model: KimiK3ForCausalLM, trainable: dict[str, torch.Tensor], lr: float, corpus: str, preset: Preset,
        steps: int, seed: int, device: str, on_step: Callable[[int, float, float], None] | None,
        hooks: Hooks | None = None) -> tuple[RunResult, list[list[float]]]:
    """The training loop every replay runs (single process, MTP, and each rank of a parallel layout): AdamW on
    ``trainable`` with warmup, the corpus in its fixed order, the gradient clipped, the router biases balanced, then
    the evaluation; what a run changes comes through ``hooks``. on_step(step, curve value, seconds) after each step.
    Returns the result and the further curves (``Hooks.parts``)."""
    hooks = hooks or Hooks()
    optimizer = torch.optim.AdamW(trainable.values(), lr=lr, betas=BETAS, weight_decay=preset.weight_decay,
                                  foreach=False)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / WARMUP_STEPS))
    data = batches(preset.vocab, corpus, preset.seq_len, preset.batch, steps, seed)
    result, more = RunResult(), []
    start = time.perf_counter()
    for step, (tokens, targets) in enumerate(data):
        with hooks.forward():
            loss = model.loss(tokens[hooks.rows].to(device), targets[hooks.rows].to(device))
        values = hooks.parts(model, loss)
        if not all(math.isfinite(v) for v in values):
            result.nonfinite_step = step
            break
        loss.backward()
        if hooks.after_backward is not None:
            hooks.after_backward(trainable)
        grad_norm = hooks.clip(list(trainable.values()), CLIP_NORM)
        optimizer.step()
        schedule.step()
        if hooks.after_step is not None:
            hooks.after_step(optimizer, trainable)
        optimizer.zero_grad(set_to_none=True)
        if hooks.balanced is not None:
            with torch.no_grad():
                for gate in hooks.balanced(model):
                    bias = gate.e_score_correction_bias
                    bias.copy_(update_bias(bias, hooks.counts(gate.last_counts), BIAS_UPDATE))
        result.curve.append(values[0])
        result.grad_norms.append(grad_norm)
        more = more or [[] for _ in values[1:]]
        for curve, value in zip(more, values[1:], strict=True):
            curve.append(value)
        if on_step:
            on_step(step, values[0], time.perf_counter() - start)
    result.seconds = time.perf_counter() - start
    result.fingerprints = {n: fingerprint(n, hooks.full(n, p)) for n, p in trainable.items()}
    if result.nonfinite_step is None:
        (hooks.evaluate or _evaluate)(model, preset, corpus, seed, device, result)
    return result, more


@torch.no_grad()
def _evaluate(model: KimiK3ForCausalLM, preset: Preset, corpus: str, seed: int, device: str, result: RunResult
              ) -> None:
    """Held-out batch (the same corpus, another seed): its loss and the top-k next-token log-probs of every token."""
    tokens, targets = batches(preset.vocab, corpus, preset.seq_len, preset.batch, 1, seed + EVAL_SEED_OFFSET)[0]
    logprobs = model.logprobs(tokens.to(device))
    result.eval_loss = float(-logprobs.gather(1, targets.to(device).reshape(-1, 1)).mean())
    values, ids = logprobs.topk(preset.eval_topk, dim=-1)
    result.topk_values, result.topk_ids = values.cpu().tolist(), ids.cpu().tolist()


def make_base(preset: Preset, arch: Architecture, seed: int, ops: dict[str, Callable], path: Path, device: str = "cpu",
              on_step: Callable[[int, float, float], None] | None = None) -> RunResult:
    """Train the scratch run that LoRA replays start from (``preset.base_steps`` steps) and save its state dict."""
    model, result = _fit(preset, arch, "scratch", preset.base_steps, seed, ops, device, None, on_step)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().cpu() if v.is_floating_point() else v.cpu() for k, v in model.state_dict().items()}
    torch.save(state, path)
    return result
