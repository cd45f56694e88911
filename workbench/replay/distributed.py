"""One rank of a replay under the target's parallel layout: ``python -m workbench.replay.distributed`` with the job
(JSON) on stdin and RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its environment (workbench.replay.launcher starts
the ranks; nobody runs torchrun).

Layout "fsdp2+ep" over N ranks (gloo on CPU, NCCL on a GPU):
    data      each rank trains on its B/N sequences of the step's batch (the global batch is the single-process one);
              the loss recorded is the mean of the ranks' means, i.e. the global mean
    dense     every parameter but the routed experts' sharded with FSDP2 (fully_shard on a 1-D device mesh);
              gradients reduce-scattered as the average over ranks (= the gradient of the global mean)
    experts   expert parallel over the same ranks: rank r keeps experts [r E/N, (r+1) E/N) (w1, w3, w2 sliced on
              dim 0); their gradients are local (scaled by 1/N: each rank's loss is a mean over its own tokens)
    MoE       router -> moe_permute over all E experts (expert-major rows; its counts give the split sizes) ->
              all_to_all_single (rows to their expert's rank) -> moe_permute again over the local experts (rows of
              one expert from every source contiguous) -> moe_grouped_gemm (local experts) -> back to source-major
              order -> all_to_all_single (rows home) -> moe_combine with the routing weights on the token's rank
    clipping  the global gradient norm (sum of squares of every shard and every local expert, all-reduced)
    balancing the aux-loss-free bias updated from the expert counts summed over ranks (identical on every rank)

Profiled (the job's "profile": a folder): every block call inside a profiler span ``block:<name>``, one
``ProfilerStep#<step>`` span per training step, CPU activity; each rank writes its Chrome trace there,
``rank-<rank>.trace.json`` (read by workbench.replay.trace).

Events (stdout, ``@@replay <json>``, rank 0 only but for errors): {"event": "step", "step", "loss", "seconds",
"rank_losses": [local loss of each rank]}, {"event": "done", "result": RunResult, "rank_curves", "rank_memory"};
every rank: {"event": "error", "rank", "message"}.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from workbench.errors import WorkbenchError
from workbench.kimi_k3.modeling import KimiK3ForCausalLM, KimiK3MoE
from workbench.replay.arch import Architecture
from workbench.replay.child import send_event
from workbench.replay.data import batches
from workbench.replay.model import moe_layers, routers
from workbench.replay.presets import Preset
from workbench.replay.tiers import Tiers, accounted, local_bytes
from workbench.replay.train import (
    EVAL_SEED_OFFSET,
    Hooks,
    RunResult,
    _deterministic_and_seeded,
    build_model,
    fit,
    use_ops,
)

LAYOUTS = ("fsdp2+ep",)
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Layout:
    """How a replay is spread: ``ranks`` processes; sharding of the dense parameters ("fsdp2"); placement of the
    routed experts ("ep": split across the same ranks); ``cache``: blocks whose saved tensors go to the host tier."""

    ranks: int = 1
    sharding: str = "none"
    experts: str = "local"
    cache: tuple[str, ...] = ()
    chunks: int = 1
    """token chunks of the expert dispatch (> 1: chunk c+1's dispatch overlaps chunk c's experts)"""

    @classmethod
    def parse(cls, ranks: int, layout: str | None, cache: tuple[str, ...] = (), chunks: int = 1) -> Layout:
        if ranks < 1:
            raise WorkbenchError("--ranks must be at least 1")
        if chunks < 1:
            raise WorkbenchError("--dispatch-chunks must be at least 1")
        if ranks == 1:
            if layout is not None or chunks > 1:
                raise WorkbenchError(f"--{'layout' if layout else 'dispatch-chunks'} needs --ranks 2 or more")
            return cls(cache=cache)
        layout = layout or LAYOUTS[0]
        if layout not in LAYOUTS:
            raise WorkbenchError(f"unknown layout '{layout}' (known: {', '.join(LAYOUTS)})")
        return cls(ranks, "fsdp2", "ep", cache, chunks)

    @property
    def distributed(self) -> bool:
        return self.ranks > 1

    def check(self, preset: Preset) -> None:
        """WorkbenchError when the preset cannot be split this way."""
        if not self.distributed:
            return
        if preset.experts % self.ranks:
            raise WorkbenchError(f"{preset.experts} experts do not split evenly over {self.ranks} ranks")
        if preset.batch % self.ranks:
            raise WorkbenchError(f"the batch of {preset.batch} sequences does not split evenly over {self.ranks} "
                                 f"ranks")
        if self.chunks > preset.tokens_per_step // self.ranks:
            raise WorkbenchError(f"--dispatch-chunks {self.chunks}: a rank has only "
                                 f"{preset.tokens_per_step // self.ranks} tokens")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cache"] = list(self.cache)
        return d


class ExpertParallelMoE(KimiK3MoE):
    """The replay model's MoE with its routed experts spread over the ranks of ``group`` (see the module docstring):
    routing, the latent projections and the shared expert are the MoE's; only the routed step (``routed``) is its
    own. experts.w1, w3 [E/N, F, Dx], w2 [E/N, Dx, F] hold this rank's experts. Shapes: x [n, D] (this rank's tokens)
    -> [n, D].

    With ``chunks`` > 1 the tokens go in that many chunks: every chunk's dispatch is issued at once (asynchronous
    collectives: a chunk's rows are waited for when its experts first read them), so the dispatch of chunk c+1 is in
    flight while the experts of chunk c compute, and each chunk's return starts as soon as its experts are done."""

    group: dist.ProcessGroup
    world: int
    local_experts: int
    chunks: int

    @classmethod
    def adopt(cls, moe: KimiK3MoE, group: dist.ProcessGroup, chunks: int = 1) -> None:
        """Turn ``moe`` (built with every expert) into its expert-parallel form, in place: parameter names stay."""
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        experts = moe.experts
        local = experts.num_experts // world
        for name in ("w1", "w3", "w2"):
            full = getattr(experts, name)
            setattr(experts, name, nn.Parameter(full.data[rank * local:(rank + 1) * local].clone(),
                                                requires_grad=full.requires_grad))
        moe.__class__ = cls
        moe.group, moe.world, moe.local_experts, moe.chunks = group, world, local, chunks

    def routed(self, xe: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """KimiK3MoE.routed with this rank's tokens dispatched to the experts' ranks and back, chunk by chunk."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ops = self.experts.ops
        n = xe.shape[0]
        spans = [(n * c // self.chunks, n * (c + 1) // self.chunks) for c in range(self.chunks)]
        # per chunk: x_perm, token_of_row, row_of_slot, counts, offsets over all E experts (expert-major rows)
        perms = [ops["moe_permute"](xe[a:b], ids[a:b], self.experts.num_experts) for a, b in spans]
        counts = torch.stack([p[3] for p in perms])  # [chunks, E]
        # counts per (destination rank, chunk, its local expert); what every source sends to this rank's experts
        send_counts = counts.view(self.chunks, self.world, self.local_experts).transpose(0, 1).contiguous()
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        splits = [(send_counts[:, c].sum(1).tolist(), recv_counts[:, c].sum(1).tolist()) for c in range(self.chunks)]
        received = [all_to_all_single_autograd(p[0][:int(p[4][-1])], recv, send, self.group)
                    for p, (send, recv) in zip(perms, splits, strict=True)]
        parts = []
        for c, (perm, (send, recv)) in enumerate(zip(perms, splits, strict=True)):
            y_recv = self._local_experts(received[c], recv_counts[:, c])
            y_home = all_to_all_single_autograd(y_recv, send, recv, self.group)
            y = torch.cat([y_home, y_home.new_zeros(perm[0].shape[0] - y_home.shape[0], y_home.shape[1])])
            a, b = spans[c]
            parts.append(ops["moe_combine"](y, weights[a:b], perm[2]))
        return torch.cat(parts)

    def _local_experts(self, x_recv: torch.Tensor, recv_counts: torch.Tensor) -> torch.Tensor:
        """Rows received from every source [sum(recv_counts), Dx] (source-major, by local expert within a source;
        recv_counts [world, E/N]) through this rank's experts, returned in the same order."""
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        if isinstance(x_recv, AsyncCollectiveTensor):
            # the rows as a plain tensor (waited for here): operators hand storage pointers to their kernels
            x_recv = x_recv.clone()
        local_ids = torch.arange(self.local_experts, device=x_recv.device).repeat(self.world) \
            .repeat_interleave(recv_counts.reshape(-1))
        # source-major -> expert-major over the local experts (stable: source order kept within an expert)
        x_local, _rows, row_of_received, _local_counts, local_offsets = self.experts.ops["moe_permute"](
            x_recv, local_ids[:, None], self.local_experts)
        y_local = self.experts(x_local, local_offsets)
        return y_local.index_select(0, row_of_received[:, 0])  # back to source-major order


def expert_parameters(model: KimiK3ForCausalLM) -> dict[str, nn.Parameter]:
    """The routed experts' weights by name (expert parallel: each rank holds its slice)."""
    return {name: param for name, param in model.named_parameters()
            if ".experts." in name and name.rsplit(".", 1)[-1] in ("w1", "w3", "w2")}


def shard(model: KimiK3ForCausalLM, device: str, chunks: int = 1) -> None:
    """Experts split over the ranks, every other parameter sharded with FSDP2 on a 1-D mesh of the ranks: one FSDP
    unit per attention and feed-forward module, the root holding the embedding, the norms, AttnRes and the LM head."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    for moe in moe_layers(model):
        ExpertParallelMoE.adopt(moe, dist.group.WORLD, chunks)
    mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
    ignored = set(expert_parameters(model).values())
    for layer in model.model.layers:
        for module in (layer.self_attn, layer.ffn):
            fully_shard(module, mesh=mesh, ignored_params=ignored & set(module.parameters()))
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    for method in ("loss", "logprobs"):  # the model is called through these, not forward
        register_fsdp_forward_method(model, method)


def _clip_global_norm(params: list[nn.Parameter], max_norm: float) -> float:
    """clip_grad_norm_ over every rank's shards and experts: the norm of all gradients of the model."""
    squares = torch.zeros((), dtype=torch.float64, device=params[0].device if params else "cpu")
    grads = [p.grad for p in params if p.grad is not None]
    for g in grads:
        local = g.to_local() if hasattr(g, "to_local") else g
        squares += local.double().pow(2).sum()
    dist.all_reduce(squares)
    total = float(squares.sqrt())
    coef = min(1.0, max_norm / (total + 1e-6))
    for g in grads:
        (g.to_local() if hasattr(g, "to_local") else g).mul_(coef)
    return total


def _full(name: str, param: torch.Tensor, experts: set[str]) -> torch.Tensor:
    """The whole tensor on every rank: a sharded parameter gathered, an expert slice gathered along dim 0."""
    if name in experts:
        parts = [torch.empty_like(param) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, param.detach().contiguous())
        return torch.cat(parts)
    return param.full_tensor() if hasattr(param, "full_tensor") else param


def _gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Rank-ordered concatenation along dim 0 of equally shaped tensors."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


@dataclass
class RankRun:
    """The run as the single-process replay reports it, each rank's local loss per step and what each rank held
    (RankMemory as a dict, by rank)."""

    result: RunResult
    rank_curves: list[list[float]]
    rank_memory: list[dict] = field(default_factory=list)


@dataclass
class RankMemory:
    """What one rank held, measured in bytes: parameters (local FSDP shards and this rank's experts; trainable and
    frozen), gradients and optimizer state (after the last step, before the gradients are dropped), the peak of
    the tensors saved for backward, blocks and glue, per tier, and the device tier's bytes by block at its peak
    (workbench.replay.tiers)."""

    params_trainable: int = 0
    params_frozen: int = 0
    grads: int = 0
    optimizer: int = 0
    saved_device_peak: int = 0
    saved_host_peak: int = 0
    saved_by_block: dict[str, int] = field(default_factory=dict)

    def measure_step(self, optimizer: torch.optim.Optimizer, trainable: dict[str, torch.Tensor]) -> None:
        self.grads = local_bytes(p.grad for p in trainable.values())
        self.optimizer = local_bytes(t for state in optimizer.state.values() for t in state.values()
                                     if isinstance(t, torch.Tensor))


def profiled_ops(ops: dict[str, Callable]) -> dict[str, Callable]:
    """``ops`` with every call inside a profiler span named ``block:<name>``."""
    def spanned(name: str, op: Callable) -> Callable:
        def run(*args, **kwargs):
            with torch.profiler.record_function(f"block:{name}"):
                return op(*args, **kwargs)
        return run

    return {name: spanned(name, op) for name, op in ops.items()}


def trace_profiler(path: Path, steps: int) -> torch.profiler.profile:
    """A CPU profiler recording ``steps`` training steps (one ``ProfilerStep#<n>`` span each, stepped after each
    optimizer step), then writing their Chrome trace to ``path``."""
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  schedule=torch.profiler.schedule(wait=0, warmup=0, active=steps, repeat=1),
                                  on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)))


def train_distributed(preset: Preset, arch: Architecture, mode: str, steps: int, seed: int,
                      ops: dict[str, Callable], device: str, base: str | None,
                      on_step: Callable[[int, float, list[float], float], None] | None = None, chunks: int = 1,
                      tiers: Tiers | None = None, profiler: torch.profiler.profile | None = None) -> RankRun:
    """The training of workbench.replay.train (its ``fit``, with this layout's hooks: a rank's rows, the global
    mean and each rank's loss, expert gradients scaled, the global norm clipped, counts summed over the ranks,
    parameters gathered for their fingerprints, the held-out batch split) under the layout (module docstring); every
    rank returns the same RankRun; on_step(step, loss, rank_losses, seconds) after each step; chunks: of the expert
    dispatch (ExpertParallelMoE); tiers: where ``ops`` account their saved tensors (cached_ops with account), the
    glue's are added, for RankRun.rank_memory; profiler: started with the first step and stepped after each
    (trace_profiler)."""
    with _deterministic_and_seeded():
        return _train(preset, arch, mode, steps, seed, ops, device, base, on_step, chunks, tiers or Tiers(),
                      profiler)


def _train(preset: Preset, arch: Architecture, mode: str, steps: int, seed: int, ops: dict[str, Callable],
           device: str, base: str | None, on_step: Callable[[int, float, list[float], float], None] | None,
           chunks: int, tiers: Tiers, profiler: torch.profiler.profile | None) -> RankRun:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(preset, arch, seed, device, Path(base) if mode == "lora" and base else None)
    if mode == "lora":
        names = list(model.add_lora(preset.lora_rank, preset.lora_alpha, seed))
        lr, corpus = preset.lora_lr, "finetune"
    else:
        names = [n for n, _ in model.named_parameters()]
        lr, corpus = preset.lr, "pretrain"
    use_ops(model, ops)
    shard(model, device, chunks)
    params = dict(model.named_parameters())
    trainable = {n: params[n] for n in names}
    experts = set(expert_parameters(model))
    rows = slice(rank * (preset.batch // world), (rank + 1) * (preset.batch // world))
    local: list[float] = []

    def parts(model: KimiK3ForCausalLM, loss: torch.Tensor) -> list[float]:
        """The global mean (the mean of the ranks' means), then each rank's local loss."""
        local[:] = _gather_rows(loss.detach().float().reshape(1).cpu().to(device)).cpu().tolist()
        return [sum(local) / world, *local]

    def scale_experts(trainable: dict[str, torch.Tensor]) -> None:
        for name in experts & set(trainable):  # each rank's loss is a mean over its own tokens
            if trainable[name].grad is not None:
                trainable[name].grad.div_(world)

    def summed(counts: torch.Tensor) -> torch.Tensor:
        counts = counts.clone()
        dist.all_reduce(counts)
        return counts

    memory = RankMemory(params_trainable=local_bytes(trainable.values()),
                        params_frozen=local_bytes(p for n, p in params.items() if n not in trainable))

    def after_step(optimizer: torch.optim.Optimizer, trainable: dict[str, torch.Tensor]) -> None:
        memory.measure_step(optimizer, trainable)
        if profiler is not None:
            profiler.step()

    hooks = Hooks(parts=parts, balanced=routers if mode == "scratch" else None, counts=summed,
                  rows=rows, after_backward=scale_experts, clip=_clip_global_norm,
                  full=lambda name, param: _full(name, param, experts),
                  evaluate=functools.partial(_evaluate, rows=rows), forward=lambda: accounted(tiers),
                  after_step=after_step)
    step_event = None if on_step is None else lambda step, value, seconds: on_step(step, value, list(local), seconds)
    if profiler is not None:
        profiler.start()
    result, rank_curves = fit(model, trainable, lr, corpus, preset, steps, seed, device, step_event, hooks)
    if profiler is not None:
        profiler.stop()
    memory.saved_device_peak, memory.saved_host_peak = tiers.peak["device"], tiers.peak["host"]
    memory.saved_by_block = dict(tiers.device_peak_by_block)
    rank_memory = [None] * world
    dist.all_gather_object(rank_memory, asdict(memory))
    return RankRun(result, rank_curves or [[] for _ in range(world)], rank_memory)


@torch.no_grad()
def _evaluate(model: KimiK3ForCausalLM, preset: Preset, corpus: str, seed: int, device: str, result: RunResult, *,
              rows: slice) -> None:
    """The held-out batch split like a training batch; log-probs gathered in rank order (workbench.replay.train's
    _evaluate over the whole batch)."""
    tokens, targets = batches(preset.vocab, corpus, preset.seq_len, preset.batch, 1, seed + EVAL_SEED_OFFSET)[0]
    logprobs = model.logprobs(tokens[rows].to(device))
    target_logprobs = _gather_rows(logprobs.gather(1, targets[rows].to(device).reshape(-1, 1)))
    result.eval_loss = float(-target_logprobs.mean())
    values, ids = logprobs.topk(preset.eval_topk, dim=-1)
    result.topk_values, result.topk_ids = _gather_rows(values).cpu().tolist(), _gather_rows(ids).cpu().tolist()


def main() -> None:
    from workbench.replay.ops import absolute_target, load_ops, operator_file
    from workbench.replay.presets import get_preset
    from workbench.replay.tiers import cached_ops
    from workbench.verify.worker import install_write_guard

    torch.set_num_threads(1)
    job = json.loads(sys.stdin.read())
    rank = int(os.environ["RANK"])
    chosen = {block: absolute_target(target) for block, target in job["ops"].items()}
    chosen.update({block: absolute_target(target)
                   for block, target in job.get("rank_ops", {}).get(str(rank), {}).items()})
    install_write_guard([f for f in map(operator_file, chosen.values()) if f is not None], job.get("writable", []),
                        "the replay sandbox")
    device = job["device"]
    try:
        if device.startswith("cuda"):
            world = int(os.environ["WORLD_SIZE"])
            if torch.cuda.device_count() < world:
                raise WorkbenchError(f"{world} ranks need a GPU each, {torch.cuda.device_count()} visible")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
            device = f"cuda:{torch.cuda.current_device()}"
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                                timeout=timedelta(seconds=job.get("collective_timeout_s",
                                                                  DEFAULT_COLLECTIVE_TIMEOUT_S)))
        preset, arch = get_preset(job["preset"]), Architecture(**job["arch"])
        tiers = Tiers()
        ops = cached_ops(load_ops(chosen), job.get("layout", {}).get("cache", []), tiers, account=True)
        profiler = None
        if job.get("profile"):
            ops = profiled_ops(ops)
            profiler = trace_profiler(Path(job["profile"]) / f"rank-{rank}.trace.json", job["steps"])

        def on_step(step: int, loss: float, rank_losses: list[float], seconds: float) -> None:
            if rank == 0:
                send_event({"event": "step", "step": step, "loss": loss, "rank_losses": rank_losses,
                            "seconds": seconds})

        run = train_distributed(preset, arch, job["mode"], job["steps"], job["seed"], ops, device, job.get("base"),
                                on_step, job["layout"].get("chunks", 1), tiers, profiler)
        if rank == 0:
            send_event({"event": "done", "result": asdict(run.result), "rank_curves": run.rank_curves,
                        "rank_memory": run.rank_memory})
        dist.destroy_process_group()
    except Exception as exc:  # one line to the launcher; the traceback to stderr
        traceback.print_exc()
        send_event({"event": "error", "rank": rank, "message": f"{type(exc).__name__}: {exc}"})
        sys.stdout.flush()
        os._exit(1)  # a process group may hold threads that keep the interpreter alive
    # Done and reported: leave without the interpreter's teardown, where the functional collectives' C++ threads
    # (the chunked dispatch's) were seen to abort the process ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
