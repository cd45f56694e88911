"""The layout planner: what one card holds and sends per training step when a model trains on C cards under a
parallel layout. Every figure is modelled from the model card (its facts, block shapes and ``weights`` section,
workbench/weights.py) or from a replay preset's model; nothing here is measured.

    fsdp2+ep<E>   dense parameters sharded with FSDP2 over the cards of a pipeline stage; routed experts split
                  over groups of E cards (expert parallel: a token's rows go by All-to-All to its experts' cards),
                  the groups holding replicas (their expert gradients all-reduced across the replicas)
    fsdp2+edp     expert data parallelism: every card of a stage holds all of the stage's experts (no All-to-All;
                  the expert gradients all-reduced over the stage's cards)

Per card and step (a step: ``tokens`` tokens per card, in ``micro_batches`` with a pipeline):
    weights       full fine-tune: fp32 sharded masters (FSDP2 mixed precision, bf16 compute); LoRA: the frozen base
                  in the checkpoint's formats (bf16; MXFP4 experts where published so) and fp32 adapters
    gradients     fp32, of what trains (sharded like it)
    optimizer     AdamW: two fp32 moments per trained parameter
    fsdp buffers  the bf16 unsharded parameters of the largest FSDP unit and the prefetched next one (full
                  fine-tune: its unsharded bf16 gradient too)
    activations   what the blocks save for backward (``saved_per_token``) at the tokens in flight; with
                  ``recompute="layers"`` only each layer's input stays and one layer is recomputed at a time, but the
                  blocks named in ``cache`` keep their saved tensors in their tier (``hbm`` or ``host``), as
                  `workbench replay --cache` does
Communication per card and step (bytes sent; a ring collective sends what it receives):
    all_to_all    dispatch and combine of the rows leaving the card, forward and backward: 4 x tokens x k x
                  (E-1)/E x expert width x 2 B (uniform routing)
    all_gather    FSDP2's parameter gathers, forward and again in backward: 2 x (c-1)/c x bf16 dense parameters
    reduce_scatter  of the dense gradients (fp32): (c-1)/c x trained dense parameters x 4 B
    expert_all_reduce  of the expert gradients over their replicas (R = c/E): 2 (R-1)/R x the card's expert
                  gradients
    pipeline      activations and their gradients across each stage boundary: 2 x tokens x hidden x 2 B

With a pipeline of P stages (c = C / P cards each, 1F1B: stage s holds P - s micro-batches in flight), the first
stage holds the embedding and the last the LM head and loss; ``split="balanced"`` places the layers so that the
slowest stage's compute is as small as the memory of every stage allows (Skywork-MoE's non-uniform split),
``"uniform"`` gives every stage the same number of layers.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from workbench.errors import WorkbenchError
from workbench.weights import BYTES_PER_WEIGHT

GB = 1e9
FP32 = 4
BF16 = 2
ADAMW_STATES = 2
FSDP_UNITS_LIVE = 2
"""Unsharded FSDP units alive at once: the one computing and the prefetched next one."""
WEIGHT_BYTES = {**BYTES_PER_WEIGHT, "float32": 4.0}
RECOMPUTE = ("none", "layers")
TIERS = ("hbm", "host")
SPLITS = ("uniform", "balanced")
DEFAULT_HOST_GB = 256.0
"""Host memory per card where --host is not given: an 8-GPU node with 2 TB (an assumption, labelled so)."""
HBM_GB = {"sm_80": 80.0, "sm_90a": 141.0, "sm_100a": 180.0, "gfx942": 192.0, "gfx950": 288.0}
"""HBM per card of the SKU each target's peaks are of (workbench.backends: A100 80GB, H200, B200, MI300X, MI355X)."""


@dataclass(frozen=True)
class Layer:
    """One decoder layer as the planner sees it. dense_params: attention, norms, router, latent projections, shared
    experts or the dense FFN; expert_params: its routed experts (0: a dense layer); adapters: LoRA parameters per
    unit of rank on its projections; flops: forward FLOPs per token (matmuls and attention over the context);
    saved: bytes saved for backward per token, by block; routed_width: the width of an expert's rows (0: dense)."""

    kind: str
    dense_params: int
    expert_params: int
    adapters: int
    flops: float
    saved: dict[str, float]
    routed_width: int = 0

    @property
    def saved_total(self) -> float:
        return sum(self.saved.values())


@dataclass(frozen=True)
class Model:
    """A model as the planner reads it. head: the final norm, LM head and loss (its params, forward FLOPs and saved
    bytes per token); weight_format: the stored format of the dense weights and of the routed experts;
    tokens: per card per step; input_bytes: per token of a layer's input (what recomputation keeps)."""

    name: str
    hidden: int
    layers: tuple[Layer, ...]
    embed_params: int
    head_params: int
    head_flops: float
    head_saved: dict[str, float]
    experts: int
    active: int
    dense_format: str
    expert_format: str
    tokens: int
    act_bytes: int
    lora_rank: int
    source: str

    @property
    def params(self) -> int:
        return sum(layer.dense_params + layer.expert_params for layer in self.layers) + self.embed_params + \
            self.head_params

    def weight_bytes(self) -> dict[str, float]:
        """The whole model's weights: in bf16, in the stored formats (dense and routed experts), at 4 bits."""
        experts = sum(layer.expert_params for layer in self.layers)
        return {"bf16": BF16 * self.params,
                "stored": (self.params - experts) * WEIGHT_BYTES[self.dense_format]
                + experts * WEIGHT_BYTES[self.expert_format],
                "4bit": self.params / 2}

    @property
    def input_bytes(self) -> float:
        """A layer's input kept for recomputation: the AttnRes sources it adds (its two sub-layers' outputs)."""
        return 2 * self.hidden * self.act_bytes


@dataclass
class Stage:
    """One pipeline stage (the whole model without a pipeline): its layers [first, last) and, per card, bytes by
    kind (``memory``, host memory in ``host``) and bytes sent per step by kind (``sent``); flops: training FLOPs
    per card and step."""

    first: int
    last: int
    memory: dict[str, float] = field(default_factory=dict)
    host: float = 0.0
    sent: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0

    @property
    def hbm(self) -> float:
        return sum(self.memory.values())


@dataclass
class Plan:
    """A layout planned for a model: the stages (one without a pipeline), whether every card fits its HBM and
    host memory, the modelled step floor (the slowest stage's FLOPs at the target's bf16 peak, bubbles included)."""

    model: str
    cards: int
    layout: str
    expert_parallel: int
    mode: str
    lora_rank: int | None
    tokens: int
    micro_batches: int
    recompute: str
    cache: dict[str, str]
    pipeline: int
    split: str
    hbm_gb: float
    host_gb: float
    stages: list[Stage]
    step_floor_s: float
    bubble: float
    note: str

    @property
    def fits(self) -> bool:
        return all(s.hbm <= self.hbm_gb * GB and s.host <= self.host_gb * GB for s in self.stages)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fits"] = self.fits
        for stage, out in zip(self.stages, d["stages"], strict=True):
            out["hbm"] = stage.hbm
        return d


def parse_layout(layout: str, cards: int, pipeline: int, experts: int) -> int:
    """The expert-parallel degree E of ``layout`` ("fsdp2+ep<E>" or "fsdp2+edp": 1) on ``cards`` cards in
    ``pipeline`` stages; WorkbenchError for anything that does not split."""
    if cards < 1 or pipeline < 1:
        raise WorkbenchError("--cards and --pp must be at least 1")
    if cards % pipeline:
        raise WorkbenchError(f"{cards} cards do not split into {pipeline} pipeline stages")
    match = re.fullmatch(r"fsdp2\+(?:ep(\d+)|(edp))", layout)
    if not match:
        raise WorkbenchError(f"unknown layout '{layout}' (fsdp2+ep<E> or fsdp2+edp)")
    degree = 1 if match.group(2) else int(match.group(1))
    per_stage = cards // pipeline
    if degree < 1 or per_stage % degree:
        raise WorkbenchError(f"expert parallel {degree} does not divide the {per_stage} cards of a stage")
    if experts % degree:
        raise WorkbenchError(f"{experts} routed experts do not split over {degree} cards")
    return degree


def _saved_here(model: Model, layers: tuple[Layer, ...], recompute: str, cache: dict[str, str]
                ) -> tuple[float, float]:
    """(HBM, host) bytes per token in flight that ``layers`` keep for backward."""
    hbm = host = 0.0
    for layer in layers:
        for block, nbytes in layer.saved.items():
            tier = cache.get(block)
            if tier == "host":
                host += nbytes
            elif tier == "hbm" or recompute == "none":
                hbm += nbytes
        if recompute == "layers":
            hbm += model.input_bytes
    return hbm, host


def _stage(model: Model, first: int, last: int, index: int, pipeline: int, per_stage: int, degree: int,
           lora: int | None, tokens: int, micro_batches: int, recompute: str, cache: dict[str, str]) -> Stage:
    """Stage ``index`` holding layers [first, last) on each of its ``per_stage`` cards (module docstring)."""
    layers = model.layers[first:last]
    head = index == pipeline - 1
    dense = sum(layer.dense_params for layer in layers) + (model.embed_params if index == 0 else 0) + \
        (model.head_params if head else 0)
    routed = sum(layer.expert_params for layer in layers) / degree
    stage = Stage(first, last)
    units = [layer.dense_params for layer in layers] + ([model.embed_params] if index == 0 else []) + \
        ([model.head_params] if head else [])
    largest = max(units, default=0) * BF16
    if lora is None:
        trained = dense / per_stage + routed
        stage.memory = {"weights": FP32 * trained, "gradients": FP32 * trained,
                        "optimizer": ADAMW_STATES * FP32 * trained,
                        "fsdp_buffers": largest * (FSDP_UNITS_LIVE + 1)}
        trained_dense, expert_grads = dense, routed * FP32
    else:
        adapters = sum(layer.adapters for layer in layers) * lora / per_stage
        base = dense / per_stage * WEIGHT_BYTES[model.dense_format] + routed * WEIGHT_BYTES[model.expert_format]
        stage.memory = {"weights": base + FP32 * adapters, "gradients": FP32 * adapters,
                        "optimizer": ADAMW_STATES * FP32 * adapters, "fsdp_buffers": largest * FSDP_UNITS_LIVE}
        trained_dense, expert_grads = sum(layer.adapters for layer in layers) * lora, 0.0
    in_flight = (pipeline - index) * tokens / micro_batches if pipeline > 1 else tokens
    hbm, host = _saved_here(model, layers, recompute, cache)
    head_saved = sum(model.head_saved.values()) if head else 0.0
    recomputed = max((layer.saved_total for layer in layers), default=0.0) if recompute == "layers" else 0.0
    stage.memory["activations"] = (hbm + head_saved) * in_flight + recomputed * tokens / micro_batches
    stage.host = host * in_flight
    rows_out = (degree - 1) / degree
    spread = (per_stage - 1) / per_stage
    replicas = per_stage / degree
    stage.sent = {
        "all_to_all": sum(4 * tokens * model.active * rows_out * layer.routed_width * BF16 for layer in layers),
        "all_gather": 2 * spread * dense * BF16,
        "reduce_scatter": spread * trained_dense * FP32,
        "expert_all_reduce": 2 * (replicas - 1) / replicas * expert_grads,
        "pipeline": 2 * tokens * model.hidden * BF16 * (int(index > 0) + int(not head)) if pipeline > 1 else 0.0,
    }
    backward = 1 if lora is not None else 2  # LoRA: no weight gradients of the frozen base
    flops = sum(layer.flops for layer in layers) + (model.head_flops if head else 0.0)
    stage.flops = (1 + backward) * flops * tokens
    return stage


def _uniform(layers: int, pipeline: int) -> list[int]:
    """Stage boundaries giving every stage layers // pipeline layers, the first stages one more."""
    sizes = [layers // pipeline + (s < layers % pipeline) for s in range(pipeline)]
    return [sum(sizes[:s]) for s in range(pipeline + 1)]


def _balanced(model: Model, pipeline: int, build, hbm: float, host: float) -> list[int]:
    """Stage boundaries minimising the slowest stage's FLOPs among the splits where every stage fits (the FLOPs
    alone where none does); ``build(first, last, index)`` -> Stage."""
    n = len(model.layers)
    best: dict[tuple[int, int], tuple[float, list[int]]] = {(0, 0): (0.0, [0])}
    for s in range(pipeline):
        for j in range(s + 1, n - (pipeline - s - 1) + 1):
            for i in range(s, j):
                if (s, i) not in best:
                    continue
                stage = build(i, j, s)
                if stage.hbm > hbm or stage.host > host:
                    continue
                worst = max(best[(s, i)][0], stage.flops)
                if (s + 1, j) not in best or worst < best[(s + 1, j)][0]:
                    best[(s + 1, j)] = (worst, [*best[(s, i)][1], j])
    if (pipeline, n) in best:
        return best[(pipeline, n)][1]
    return _balanced(model, pipeline, build, math.inf, math.inf)


def plan_layout(model: Model, cards: int, layout: str, *, lora: int | None = None, cache: dict[str, str] | None = None,
                recompute: str = "layers", pipeline: int = 1, split: str = "balanced", micro_batches: int | None = None,
                hbm_gb: float = HBM_GB["sm_90a"], host_gb: float = DEFAULT_HOST_GB, peak_flops: float = 989e12,
                tokens: int | None = None) -> Plan:
    """Plan ``model`` on ``cards`` cards under ``layout`` (module docstring). lora: the adapters' rank (None: a
    full fine-tune); cache: {block: "hbm" | "host"}; micro_batches: per step with a pipeline (default 2 x stages);
    peak_flops: the card's bf16 peak, for the step floor."""
    cache = cache or {}
    if recompute not in RECOMPUTE:
        raise WorkbenchError(f"unknown --recompute '{recompute}' ({', '.join(RECOMPUTE)})")
    if split not in SPLITS:
        raise WorkbenchError(f"unknown --split '{split}' ({', '.join(SPLITS)})")
    blocks = {b for layer in model.layers for b in layer.saved} | set(model.head_saved)
    for block, tier in cache.items():
        if tier not in TIERS:
            raise WorkbenchError(f"--cache {block}:{tier}: the tier is hbm or host")
        if block not in blocks:
            raise WorkbenchError(f"--cache: {model.name} saves nothing in a block '{block}' "
                                 f"({', '.join(sorted(blocks))})")
    if pipeline > len(model.layers):
        raise WorkbenchError(f"--pp {pipeline}: {model.name} has {len(model.layers)} layers")
    degree = parse_layout(layout, cards, pipeline, model.experts)
    tokens = tokens or model.tokens
    micro_batches = micro_batches or (2 * pipeline if pipeline > 1 else 1)
    per_stage = cards // pipeline

    def build(first: int, last: int, index: int) -> Stage:
        return _stage(model, first, last, index, pipeline, per_stage, degree, lora, tokens, micro_batches,
                      recompute, cache)

    bounds = _uniform(len(model.layers), pipeline) if split == "uniform" or pipeline == 1 else \
        _balanced(model, pipeline, build, hbm_gb * GB, host_gb * GB)
    stages = [build(bounds[s], bounds[s + 1], s) for s in range(pipeline)]
    bubble = (pipeline - 1) / (micro_batches + pipeline - 1)
    floor = max(s.flops for s in stages) / peak_flops / (1 - bubble)
    return Plan(model.name, cards, layout, degree, "lora" if lora else "full", lora, tokens, micro_batches,
                recompute, dict(cache), pipeline, split if pipeline > 1 else "none", hbm_gb, host_gb, stages,
                floor, bubble, f"modelled from {model.source}")


def compare_experts(model: Model, plan: Plan, **options) -> list[Plan]:
    """``plan`` beside the same run with expert data parallelism (fsdp2+edp) and with the experts split over every
    card of a stage (fsdp2+ep<c>), where those differ from it."""
    per_stage = plan.cards // plan.pipeline
    others = []
    for layout in ("fsdp2+edp", f"fsdp2+ep{per_stage}"):
        if layout != plan.layout and (layout == "fsdp2+edp" or model.experts % per_stage == 0):
            others.append(plan_layout(model, plan.cards, layout, **options))
    return [plan, *others]


MEASURED = {"weights": ("params_trainable", "params_frozen"), "gradients": ("grads",), "optimizer": ("optimizer",),
            "activations": ("saved_device_peak",), "host": ("saved_host_peak",)}
"""The planner's kinds and the figures a distributed replay measures for them on each rank
(workbench.replay.distributed.RankMemory)."""


def held_to(plan: Plan, rank_memory: list[dict]) -> list[dict]:
    """Each kind the replay measures: the modelled bytes per card (the single stage) beside the largest measured on a
    rank, and modelled / measured."""
    stage = plan.stages[0]
    modelled = {**stage.memory, "host": stage.host}
    rows = []
    for kind, figures in MEASURED.items():
        measured = max(sum(rank[f] for f in figures) for rank in rank_memory)
        rows.append({"kind": kind, "modelled": modelled[kind], "measured": measured,
                     "ratio": modelled[kind] / measured if measured else None})
    return rows


def held_by_block(model: Model, plan: Plan, rank_memory: list[dict]) -> list[dict]:
    """The activations of a plan without recomputation or a pipeline, by block (``glue``: between the blocks): the
    modelled bytes per card beside the largest a rank's device tier held at its peak (RankMemory.saved_by_block)."""
    if plan.pipeline > 1 or plan.recompute != "none":
        raise WorkbenchError("activations by block are held for a plan without recomputation or a pipeline")
    modelled: dict[str, float] = {}
    for saved in [layer.saved for layer in model.layers] + [model.head_saved]:
        for block, nbytes in saved.items():
            if plan.cache.get(block) != "host":
                modelled[block] = modelled.get(block, 0.0) + nbytes * plan.tokens
    measured = {block: max(rank.get("saved_by_block", {}).get(block, 0) for rank in rank_memory)
                for block in {b for rank in rank_memory for b in rank.get("saved_by_block", {})}}
    return [{"block": block, "modelled": modelled.get(block, 0.0), "measured": measured.get(block, 0),
             "ratio": modelled.get(block, 0.0) / measured[block] if measured.get(block) else None}
            for block in sorted(set(modelled) | set(measured))]
