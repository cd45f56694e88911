"""The onboarding probe: what a family's published modeling code computes, measured module by module against the
catalog's references, for any model_type the installed transformers knows, registered here or not.

    result = probe(config)                  # a transformers config (the class's, filled with the json's fields)
    result.rows                             # one Row per module class of the full model
    result.proven                           # {class: the kind and variant proven}: what the generic family swaps

1. The full model is built on the meta device (no memory, every layer at its real size): every module class it has
   gets a row, so nothing it computes is missing from the card.
2. A tiny instance (workbench.integrations.tiny: the same classes in the same layer pattern, every variant field
   kept) is built in float64 with random weights (norm weights and selection biases drawn too, so that no variant
   hides behind an initial value) and run once on random tokens with forward pre-hooks on every module: each
   module's first call's inputs are kept.
3. The modules are patched as ``apply_workbench_kernels`` would patch them (a registered family's own patch, else
   the generic kinds of workbench.integrations.kinds) with every block taken as promoted, and each patched module is
   run on its recorded inputs (an MLP's or experts' also on them scaled by INPUT_SCALE, so that clamps act),
   through the catalog's references (``computing_with(references())``), beside its shipped forward; outputs and the
   gradients of its inputs and parameters (one random upstream gradient) are compared in float64 (transformers'
   casts to float32 turned into float64). A kind's variants are tried in order until one reproduces the module
   within PROBE_REL_MAX; none does: the nearest one and its error.
4. Each class's row: covered (the blocks, the variant and its parameters with their sources, the error), differs
   (the nearest block and variant, what differs, the error), no spec (what it computes), or framework (embedding,
   plain projections, containers, the rotary table); an activation or convolution its parent calls, and a module a
   family's patched parent computes without calling it, take the parent's status ("within").
"""

from __future__ import annotations

import functools
import importlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.errors import WorkbenchError, one_line
from workbench.integrations import kinds as K
from workbench.integrations import tiny as T

PROBE_REL_MAX = 1e-10
"""A module is reproduced when every output and gradient is within this relative error (max |a - b| / max |a|) in
float64: a faithful computation differs by summation order only (1e-16 per operation, about 1e-13 through a chunked
recurrence); another variant differs by 1e-3 or more."""
INPUT_SCALE = 100.0
"""An MLP's or experts' second probe runs its recorded inputs times this, outputs compared: hidden states of a
trained model reach such sizes, and a SwiGLU clamp (7 to 10) acts there where small random inputs never reach it.
Only there: a router's scores saturate at such inputs (sigmoid scores of 1e-20, where DeepSeek's renormalization
epsilon and MiniMax's none part), and gradients through a saturated gate are differences of nearly equal numbers."""
SCALED = ("swiglu", "moe_grouped_gemm", "situ")
"""The blocks whose modules get the scaled probe (the SwiGLU variants: clamps, alpha, softcaps)."""
UNSCALED = ("position_embeddings", "attention_mask", "cos", "sin", "position_ids", "cache_position")
"""Inputs that are tables or masks, not activations: never scaled (a scaled rotary table no longer rotates)."""
CONSTANT = ("attention_mask",)
"""Inputs no gradient is compared for: a mask is a pattern, not a value the model learns or passes on (an attention
function that applies its causal pattern itself, as flash-attention does, takes no gradient into it)."""
COVERED, DIFFERS = "covered", "differs"
STATUSES = (COVERED, DIFFERS, K.NO_SPEC, K.FRAMEWORK)
WORST = {K.FRAMEWORK: 0, COVERED: 1, DIFFERS: 2, K.NO_SPEC: 3}


@dataclass
class Row:
    """One module class of the model and how the catalog computes it."""

    cls: str
    status: str
    role: str
    count: int = 0                                   # instances in the full model
    example: str = ""                                # the path of one instance
    kind: str | None = None
    blocks: list[str] = field(default_factory=list)
    variant: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    error: dict[str, float] | None = None            # {"output": rel, "grad": rel} measured by the probe
    differs: str = ""
    within: list[str] = field(default_factory=list)  # the parent classes whose rows compute it

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "", [], {})}


@dataclass
class ProbeResult:
    model_type: str
    model_class: str
    code: str
    family: str                                      # "registered" (a hand-written patch) or "generic"
    rows: list[Row]
    tiny: dict[str, Any]
    notes: list[str]
    seconds: float
    proven: dict[str, dict[str, Any]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """Rows by status, and the covered rows a measurement proves."""
        out = {s: sum(r.status == s for r in self.rows) for s in STATUSES}
        out["probed"] = sum(r.status == COVERED and r.error is not None and not r.within for r in self.rows)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "class": self.model_class, "code": self.code, "family": self.family,
                "seconds": round(self.seconds, 1), "counts": self.counts(), "notes": self.notes,
                "modules": [r.as_dict() for r in self.rows]}


# --- inputs ------------------------------------------------------------------------------------------------------


def _map_tensors(value: Any, fn) -> Any:
    """``value`` with every tensor inside (tuples, lists, dicts) replaced by fn(tensor)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(v, fn) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _tensors(value: Any) -> list[torch.Tensor | None]:
    """The tensors of a module's output in order (tuples, lists, dicts, ModelOutputs); None kept as a position."""
    if isinstance(value, torch.Tensor) or value is None:
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors(item)]
    return []


class InputRecorder:
    """Forward pre-hooks on every module of a model: each module's first call's (args, kwargs), detached copies."""

    def __init__(self, model: nn.Module):
        self.calls: dict[nn.Module, tuple[tuple, dict]] = {}
        self.handles = [m.register_forward_pre_hook(self._hook, with_kwargs=True) for m in model.modules()]

    def _hook(self, module, args, kwargs):
        if module not in self.calls:
            copy = functools.partial(_map_tensors, fn=lambda t: t.detach().clone())
            self.calls[module] = (copy(args), copy(kwargs))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


# --- the comparison ----------------------------------------------------------------------------------------------


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a| in float64 (the absolute difference where a vanishes)."""
    a, b = a.detach().double(), b.detach().double()
    if a.numel() == 0:
        return 0.0
    scale = a.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale else diff


def _canonical(outputs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Outputs with every integer tensor (a router's top-k ids) sorted along its last dim and the float tensors of
    its shape (the matching weights) gathered in the same order: two routers that choose the same experts in another
    order compare equal."""
    out = list(outputs)
    for i, ids in enumerate(outputs):
        if ids is None or ids.is_floating_point() or ids.dim() == 0:
            continue
        order = ids.argsort(dim=-1)
        out[i] = ids.gather(-1, order)
        for j, other in enumerate(outputs):
            if other is not None and other.is_floating_point() and other.shape == ids.shape:
                out[j] = other.gather(-1, order)
    return out


def _grads(outputs: list[torch.Tensor], ups: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    """d(sum <output, up>)/d(leaf) for every leaf (zeros where none flows)."""
    pairs = [(o, u) for o, u in zip(outputs, ups, strict=True) if o.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [u for _, u in pairs], allow_unused=True) \
        if pairs and leaves else [None] * len(leaves)
    return [g if g is not None else torch.zeros_like(leaf) for g, leaf in zip(grads, leaves, strict=True)]


def measure(module: nn.Module, args: tuple, kwargs: dict, original, patched, exact_ids: bool = True,
            scaled: bool = False, called: tuple[set[str], set[str]] | None = None) -> dict[str, float]:
    """The worst relative error of ``patched`` against ``original`` (two calls computing ``module``): {"output",
    "grad"}, the outputs on the recorded inputs (and, ``scaled``, on them times INPUT_SCALE), the gradients (of the
    float inputs and of the module's parameters, under one random upstream gradient per float output both calls
    return) on the recorded inputs. With ``exact_ids``
    (a router: its choice is its output) integer outputs must be equal sets per row, else "output" is inf; without
    (a sparse attention handing its selection on, padded with masked positions in any order) they are judged by the
    float outputs they select. ``called``: two sets that collect the classes of the module's descendants whose forward
    each call runs. Raises what either call raises."""
    from workbench.integrations.references import Float64Casts

    worst = {"output": 0.0, "grad": 0.0}
    params = [p for p in module.parameters() if p.is_floating_point() and p.requires_grad]
    for scale in (1.0, INPUT_SCALE) if scaled else (1.0,):
        runs = []
        for side, call in enumerate((original, patched)):
            inputs = (_map_tensors(args, functools.partial(_leaf, scale=scale)),
                      {k: _map_tensors(v, torch.clone if k in CONSTANT else
                                       functools.partial(_leaf, scale=1.0 if k in UNSCALED else scale))
                       for k, v in kwargs.items()})
            with Float64Casts(), _descendants_called(module, called[side] if called else set()):
                outputs = _canonical(_tensors(call(*inputs[0], **inputs[1])))
            runs.append((outputs, [t for t in _tensors(inputs) if t is not None and t.requires_grad] + params))
        (out_a, leaves_a), (out_b, leaves_b) = runs
        if len(out_a) != len(out_b):
            raise WorkbenchError(f"{len(out_b)} outputs where the module returns {len(out_a)}")
        both = [(a, b) for a, b in zip(out_a, out_b, strict=True) if a is not None and b is not None]
        for a, b in both:  # (an output one side computes only when asked, a router's logits, is left out)
            if a.shape != b.shape:
                raise WorkbenchError(f"an output of shape {tuple(b.shape)} where the module's is {tuple(a.shape)}")
            if a.is_floating_point():
                worst["output"] = max(worst["output"], rel(a, b))
            elif exact_ids and not torch.equal(a, b):
                worst["output"] = float("inf")
        floats = [(a, b) for a, b in both if a.is_floating_point()]
        if scale != 1.0:  # outputs only: a saturated gate's gradient is a cancellation no float64 compares
            continue
        g = torch.Generator().manual_seed(7)
        ups = [torch.randn(a.shape, generator=g, dtype=a.dtype) for a, _ in floats]
        grads = zip(_grads([a for a, _ in floats], ups, leaves_a), _grads([b for _, b in floats], ups, leaves_b),
                    strict=True)
        worst["grad"] = max([worst["grad"], *(rel(a, b) for a, b in grads)])
    return worst


@contextmanager
def _counting(blocks: tuple[str, ...]) -> Iterator[dict[str, int]]:
    """Within the block, the ops in use with the calls of each of ``blocks`` counted into the dict it yields."""
    from workbench.integrations.ops import computing_with, current_table

    ran = dict.fromkeys(blocks, 0)

    def counted(block: str, op):
        def call(*args, **kwargs):
            ran[block] += 1
            return op(*args, **kwargs)
        return call

    table = current_table()
    with computing_with({**table, **{block: counted(block, table[block]) for block in blocks}}):
        yield ran


@contextmanager
def _descendants_called(module: nn.Module, seen: set[str]):
    """Adds to ``seen`` the class of each descendant of ``module`` whose forward runs inside the block."""
    hooks = [m.register_forward_pre_hook(lambda m, _: seen.add(type(m).__name__))
             for m in module.modules() if m is not module]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def _leaf(t: torch.Tensor, scale: float) -> torch.Tensor:
    """A probe input: a float tensor times ``scale``, requiring grad; anything else copied."""
    return (t * scale).requires_grad_(True) if t.is_floating_point() else t.clone()


def within_bound(error: dict[str, float] | None) -> bool:
    return error is not None and error["output"] <= PROBE_REL_MAX and error["grad"] <= PROBE_REL_MAX


# --- the model ---------------------------------------------------------------------------------------------------


def kernel_bound(modeling) -> list[str]:
    """The names of the modeling module's functions transformers bound to an installed package's kernels (fla,
    causal-conv1d): closures with ``is_new_implementation`` that wrap their torch path."""
    found = []
    for name, fn in list(vars(modeling).items()):
        code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
        if code is None or not closure or getattr(fn, "__wrapped__", None) is None:
            continue
        if dict(zip(code.co_freevars, (c.cell_contents for c in closure), strict=True)).get("is_new_implementation"):
            found.append(name)
    return found


def torch_paths(modeling) -> dict[str, Any]:
    """Point the ``kernel_bound`` functions of the modeling module at their torch path; return {name: the bound
    function} to restore."""
    rebound = {name: getattr(modeling, name) for name in kernel_bound(modeling)}
    for name, fn in rebound.items():
        setattr(modeling, name, fn.__wrapped__)
    return rebound


@contextmanager
def torch_paths_restored(modeling) -> Iterator[list[str]]:
    """``torch_paths`` of the modeling module within the block (the names rebound), its bound functions back
    after."""
    rebound = torch_paths(modeling)
    try:
        yield sorted(rebound)
    finally:
        for name, fn in rebound.items():
            setattr(modeling, name, fn)


def randomize(model: nn.Module, seed: int) -> None:
    """Draw what initialisation leaves constant, so that no variant hides behind it: 1-D parameters (norm weights,
    gates' biases) get noise of 0.1 around their value, selection-bias buffers noise of 0.1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            is_bias_buffer = name.endswith("correction_bias")
            if tensor.is_floating_point() and (tensor.dim() == 1 and isinstance(tensor, nn.Parameter)
                                               or is_bias_buffer):
                tensor.add_(0.1 * torch.randn(tensor.shape, generator=g, dtype=tensor.dtype))


def _family(model_type: str):
    """The registered family module of ``model_type``, None when it has none."""
    from workbench.integrations.transformers import FAMILIES, family

    return family(model_type) if model_type in FAMILIES and not getattr(family(model_type), "WHOLE_CONFIG", False) \
        else None


def probe(config, seed: int = 0) -> ProbeResult:
    """The probe of ``config`` (a transformers config instance; see the module docstring)."""
    import transformers

    started = time.monotonic()
    whole = T.build(config, "meta", whole=True)
    text = T.language_config(config)
    text_model = whole if type(text) is type(config) else T.build(text, "meta")
    tiny, notes = T.tiny_config(text, text_model)
    tiny._experts_implementation = "eager"  # the shipped loop: grouped_mm takes no float64
    fam = _family(config.model_type) or _family(text.model_type)
    torch.manual_seed(seed)
    model = T.build(tiny, "cpu").double().eval()
    randomize(model, seed)
    modeling = importlib.import_module(type(model).__module__)
    with torch_paths_restored(modeling) as rebound:
        calls = _record(model, tiny, seed)
        measured, proven, left = _patch_and_measure(model, tiny, fam, calls)
    if rebound:
        notes.append(f"no GPU driver: {', '.join(rebound)} ran their torch path in the shipped modules")
    rows = _rows(whole, model, config, measured, left)
    return ProbeResult(model_type=text.model_type, model_class=type(whole).__name__,
                       code=f"transformers {transformers.__version__}",
                       family="registered" if fam is not None else "generic", rows=rows,
                       tiny={k: v for k, v in tiny.to_dict().items() if not k.startswith("_")}, notes=notes,
                       seconds=time.monotonic() - started, proven=proven)


def _record(model: nn.Module, config, seed: int) -> dict[nn.Module, tuple[tuple, dict]]:
    """Every module's first call's inputs in one forward of the tiny model on random tokens (2 x TOKENS)."""
    from workbench.integrations.references import Float64Casts

    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, (2, T.TOKENS), generator=g)
    recorder = InputRecorder(model)
    try:
        with torch.no_grad(), Float64Casts():
            model(input_ids=ids, use_cache=False)
    except Exception as exc:  # noqa: BLE001 - the family's own code: whatever it raises is the answer
        raise WorkbenchError(f"the tiny {type(model).__name__} does not run: {one_line(exc)}") from None
    finally:
        recorder.remove()
    return recorder.calls


def _patch_and_measure(model, config, fam, calls):
    """Patch ``model`` (the family's patch, or the kinds') and measure every patched module that ran. Returns
    ({class: measurement}, {class: the proven kind and variant}, {class: a registered family's reason for leaving
    it alone})."""
    from workbench.integrations.ops import computing_with, references
    from workbench.integrations.transformers import Patcher, PatchReport

    measured: dict[str, dict[str, Any]] = {}
    proven: dict[str, dict[str, Any]] = {}
    left: dict[str, str] = {}
    with computing_with(references()):
        if fam is not None:
            report = PatchReport(model_type=config.model_type, model_class=type(model).__name__)
            shipped_attention = model.config._attn_implementation  # a patch may make the model's the workbench's
            fam.apply(Patcher(model, None, report, assume_promoted=True))
            by_path = dict(model.named_modules())
            for row in report.rows:
                module = by_path.get(row.path)
                if not row.replaced:
                    left.setdefault(row.cls, row.reason)
                elif module in calls and row.cls not in measured:
                    measured[row.cls] = _measure_registered(model, module, calls[module], row.blocks,
                                                            shipped_attention)
            for module in model.modules():  # what the family leaves alone and a kind reads: how far it is
                cls, kind = type(module).__name__, K.kind_of(module)
                if cls in left and cls not in measured and kind is not None and module in calls:
                    measured[cls] = _prove(module, kind, config, calls, [module])
                    measured[cls]["differs"] = measured[cls]["differs"] or f"the family's patch: {left[cls]}"
                    K.uninstall(module)
            return measured, proven, left
        for module in model.modules():
            kind = K.kind_of(module)
            if kind is None or module not in calls or type(module).__name__ in measured:
                continue
            cls = type(module).__name__
            measured[cls] = _prove(module, kind, config, calls,
                                   [m for m in model.modules() if type(m) is type(module) and m in calls])
            if within_bound(measured[cls].get("error")) and not measured[cls]["differs"]:
                proven[cls] = {"kind": kind.name, "index": measured[cls]["index"],
                               "variant": measured[cls]["variant"]}
    return measured, proven, left


@contextmanager
def _attention_implementation(model: nn.Module, name: str):
    """Every config of ``model`` (its own and its modules') with attention implementation ``name`` within the
    block: the shipped forward of a module whose family made the model's the workbench's runs as recorded."""
    configs = {id(c): c for c in [model.config, *(getattr(m, "config", None) for m in model.modules())]
               if hasattr(c, "_attn_implementation")}
    before = {key: c._attn_implementation for key, c in configs.items()}
    for c in configs.values():
        c._attn_implementation = name
    try:
        yield
    finally:
        for key, c in configs.items():
            c._attn_implementation = before[key]


def _measure_registered(model, module, call, blocks, shipped_attention: str) -> dict[str, Any]:
    """A registered family's patched module against its shipped forward (experts swapped through transformers'
    experts implementation: the eager loop against the workbench's), the shipped one under the model's attention
    implementation as it was before the patch (``shipped_attention``; a patch that makes it the workbench's would
    otherwise hold the block to itself)."""
    args, kwargs = call
    entry = {"kind": None, "blocks": list(blocks), "variant": "the family's patch", "params": {}, "differs": ""}
    if hasattr(module, "original_forward"):
        def original(*a, **k):
            with _attention_implementation(model, shipped_attention):
                return module.original_forward(*a, **k)
        patched = module.forward
    else:
        config = module.config

        def with_implementation(name):
            def call(*a, **k):
                before, config._experts_implementation = config._experts_implementation, name
                try:
                    return module(*a, **k)
                finally:
                    config._experts_implementation = before
            return call

        def original(*a, **k):
            with _attention_implementation(model, shipped_attention):
                return with_implementation("eager")(*a, **k)
        patched = with_implementation(config._experts_implementation)
    shipped, ours = set(), set()
    try:
        entry["error"] = measure(module, args, kwargs, original, patched, exact_ids="moe_router" in blocks,
                                 scaled=bool(set(SCALED) & set(blocks)), called=(shipped, ours))
        # what the patch computes itself (GLM-5-Next's indexer inside its attention) takes the module's status
        entry["bypassed"] = sorted(shipped - ours)
    except Exception as exc:  # noqa: BLE001 - a family forward that fails on its module's inputs is a finding
        entry["failure"] = f"the patched forward raised {type(exc).__name__}: {one_line(exc)}"
    return entry


def _prove(module: nn.Module, kind: K.Kind, config, calls, instances: list[nn.Module]) -> dict[str, Any]:
    """Try ``kind``'s variants on ``module`` in order, each with its optional blocks; the first that reproduces it
    and runs each of them (then held on every instance of its class that ran), else the nearest. Leaves the
    instances patched with the chosen variant."""
    args, kwargs = calls[module]
    tried = []
    for index, variant in enumerate(kind.variants(module, config)):
        K.install(module, variant, kind.blocks + variant.optional)
        try:
            with _counting(variant.optional) as ran:
                error = measure(module, args, kwargs, module.original_forward, module.forward, kind.name == "router",
                                bool(set(SCALED) & set(kind.blocks)))
        except Exception as exc:  # noqa: BLE001 - an adapter that cannot map the module's inputs is a finding
            tried.append((index, variant, None, f"{type(exc).__name__}: {one_line(exc)}"))
            continue
        idle = [block for block in variant.optional if not ran[block]]
        if idle:  # a block claimed that the module never reached (no rotation where the modeling file has one)
            tried.append((index, variant, None, f"{', '.join(idle)} never ran in the module's forward"))
            continue
        tried.append((index, variant, error, ""))
        if within_bound(error):
            break
    scored = [t for t in tried if t[2] is not None]
    index, variant, error, failure = min(scored, key=lambda t: (t[2]["output"], t[2]["grad"])) if scored \
        else tried[0]
    blocks = kind.blocks + variant.optional
    entry = {"kind": kind.name, "blocks": list(blocks), "variant": variant.label, "index": index,
             "params": variant.params, "differs": variant.differs, "error": error, "tried": len(tried)}
    if failure:
        entry["failure"] = failure
    for other in instances:  # every instance that ran, with the same variant read from its own attributes
        mine = kind.variants(other, config)[index]
        K.install(other, mine, blocks)
        if other is not module and error is not None:
            try:
                more = measure(other, *calls[other], other.original_forward, other.forward, kind.name == "router",
                               bool(set(SCALED) & set(kind.blocks)))
                entry["error"] = {k: max(entry["error"][k], more[k]) for k in more}
            except Exception as exc:  # noqa: BLE001
                entry["failure"] = f"{type(exc).__name__}: {one_line(exc)}"
    return entry


# --- rows --------------------------------------------------------------------------------------------------------


def _rows(whole: nn.Module, tiny_model: nn.Module, config, measured, left) -> list[Row]:
    """One Row per module class of the full model (and of the tiny one), in the order the full model holds them."""
    instances: dict[str, list[tuple[str, nn.Module]]] = {}
    for path, module in whole.named_modules():
        instances.setdefault(type(module).__name__, []).append((path, module))
    tiny_classes = {type(m).__name__: m for m in tiny_model.modules()}
    for cls in tiny_classes:
        instances.setdefault(cls, [])
    parents: dict[str, set[str]] = {}
    for module in whole.modules():
        for child in module.children():
            parents.setdefault(type(child).__name__, set()).add(type(module).__name__)
    rows: dict[str, Row] = {}
    for cls, found in instances.items():
        count = len(found)
        example = found[0][0] if found else ""
        module = found[0][1] if found else tiny_classes[cls]
        rows[cls] = _row(cls, module, [m for _, m in found], count, example or "(the tiny model)", config,
                         measured.get(cls), left.get(cls), cls in tiny_classes)
    for cls, entry in measured.items():  # computed by a patched parent that no longer calls their forward
        for part in entry.get("bypassed", ()):
            if part in rows and rows[part].status == K.NO_SPEC:
                rows[part].status = K.WITHIN
                rows[part].role = f"{rows[part].role}: computed by the patched {cls} (which does not call it)"
    for row in rows.values():  # parts of their parents: the parents' worst status
        if row.status == K.WITHIN:
            row.within = sorted(parents.get(row.cls, set()))
            statuses = [rows[p].status for p in row.within if p in rows and rows[p].status != K.WITHIN]
            row.status = max(statuses, key=WORST.get) if statuses else K.FRAMEWORK
    return list(rows.values())


def _row(cls, module, instances, count, example, config, entry, reason, in_tiny) -> Row:
    row = Row(cls=cls, status=K.NO_SPEC, role="", count=count, example=example)
    if entry is not None:
        kind = next((k for k in K.KINDS if k.name == entry["kind"]), None)
        row.kind, row.blocks, row.variant = entry["kind"], entry["blocks"], entry["variant"]
        row.params, row.error = entry["params"], entry.get("error")
        row.role = kind.role if kind else f"computed by {', '.join(entry['blocks'])} (the family's patch)"
        why = "; ".join(filter(None, [entry["differs"], entry.get("failure")]))
        if within_bound(row.error) and not entry["differs"]:
            row.status = COVERED
        elif row.error is None:  # the adapter could not map the module's inputs or weights: no measurement
            row.status, row.differs = K.NO_SPEC, why
            row.role = f"{row.role} of a form the {row.kind} kind cannot map"
        else:
            row.status = DIFFERS
            out, grad = row.error["output"], row.error["grad"]
            row.differs = why or (f"the nearest variant ({row.variant}) " + (
                "chooses other experts than the module (probe)" if out == float("inf") else
                f"differs from the module by {out:.2g} in its outputs, {grad:.2g} in its gradients (probe)"))
        return row
    status, role = K.describe(module)
    if not in_tiny and status != K.FRAMEWORK:
        status, role = K.NO_SPEC, f"{role}; in a tower of the full model, outside the language model the probe " \
                                  "builds: not probed"
    elif role == "attention" and status == K.NO_SPEC:
        role = K.attention_summary(instances or [module], config)
    if reason:
        role = f"{role}; the family's patch: {reason}" if status != K.FRAMEWORK else role
    row.status, row.role = status, role
    return row


def probe_json(result: ProbeResult) -> str:
    return json.dumps(result.as_dict(), indent=1, default=str)
