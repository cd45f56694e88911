"""Parity with the published code: a tiny random-weight instance of the transformers class a config names, run as
shipped and with ``apply_workbench_kernels`` on the same batch, compared as TorchTitan's checkpoint-conversion tests
compare (logits KL, cosine, top-1/top-5 agreement, router choices) plus the loss, every parameter's gradient and
the first module whose output leaves the dtype's bound.

    source (a model card, a config.json, or a model_type)
      -> load_config: the family's config class reads the json (defaults filled as the class fills them)
      -> tiny_config: widths shrunk; the layer-type schedule, expert counts, top-k and routing groups kept in
         pattern (every layer kind of the full schedule appears; experts at most 16)
      -> a child process (python -m workbench.integrations.parity_child, sandboxed as the replay's training child;
         TRITON_INTERPRET=1 on CPU) builds the
         model from a seed, deep-copies it, patches the copy, runs both forward and backward on one batch
      -> ParityResult: metrics, verdict against THRESHOLDS, the report of modules replaced and left alone

A config field the class cannot compute (``hidden_act`` with no transformers activation, such as Kimi K3's
``situ``) is set to the class's default in the tiny instance and named in ``notes``: parity then covers what the
class implements, and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError, one_line
from workbench.verify.sandbox import child_command, child_env
from workbench.verify.warm import warm_popen
from workbench.vocabulary import ParityStatus

THRESHOLDS: dict[str, dict[str, float]] = {
    # float32: a correct port differs from the shipped model only by summation order (relative 1e-6 per op), which
    # gives a logits KL near 1e-12 (TorchTitan: 1e-13 when right; 5e-6 with one RoPE permutation missing); the
    # loss within Liger's float32 convergence rtol (1e-5); a token's top-1 flips only at a near-tie, so at most 2%
    # of the tokens; gradients within 1e-3 of their norm (the float32 kernels' backward accumulates in other orders).
    # A gradient past that is held to the shipped model's float64 gradient instead, where the shipped float32
    # itself is further than 1e-3 from it (an ill-conditioned sum: Qwen3-Next's decay parameters): the patched
    # float32 may be as far from float64 as the shipped float32 is, no further (grad_truth_ratio <= 1).
    # generate_min: the share of a greedy generate()'s sequences (--generate) whose new tokens are all the shipped
    # model's; in float32 a port changes no token. logprob_abs_max: a served step's log-probability of its token
    # (workbench/integrations/vllm_parity.py) within 1e-4 (the logits' float32 summation order, about 1e-6 relative).
    "float32": {"kl_max": 1e-8, "cosine_min": 1 - 1e-7, "top1_min": 0.98, "top5_min": 0.97, "router_min": 0.98,
                "loss_rel_max": 1e-5, "grad_rel_max": 1e-3, "module_rel_max": 1e-4, "curve_rel_max": 1e-4,
                "generate_min": 1.0, "logprob_abs_max": 1e-4},
    # bfloat16 (GPU only): every op rounds to 8 bits of mantissa (relative 4e-3), errors compound over layers;
    # MoE routing flips at near-ties (BLOCKS.md: bf16 runs diverge sooner); Liger's bf16 MoE loss rtol is 2e-1,
    # taken tighter here because one batch, not a training curve, is compared.
    # curve_rel_max: a LoRA fine-tune's losses (--lora), within Liger's MoE convergence rtol (1e-3 float32, 2e-1
    # bfloat16) tightened tenfold and fourfold for a handful of steps.
    # generate_min: in bfloat16 greedy decoding may take the other token of a near-tie, and every later token then
    # differs; one of the two sequences may.
    "bfloat16": {"kl_max": 1e-2, "cosine_min": 0.99, "top1_min": 0.90, "top5_min": 0.85, "router_min": 0.85,
                 "loss_rel_max": 2e-2, "grad_rel_max": 0.15, "module_rel_max": 5e-2, "curve_rel_max": 5e-2,
                 "generate_min": 0.5, "logprob_abs_max": 0.1},
}
"""The bounds a patched model must meet per dtype: KL and loss relative difference at most, cosine and agreement
rates at least, the worst parameter gradient's relative error at most; module_rel_max is the bound past which a
module's output counts as the first divergence."""

CHECKS = (("kl", "kl_max", "<="), ("cosine", "cosine_min", ">="), ("top1", "top1_min", ">="),
          ("top5", "top5_min", ">="), ("router_match", "router_min", ">="), ("loss_rel", "loss_rel_max", "<="),
          ("grad_rel_worst", "grad_rel_max", "<="), ("curve_rel", "curve_rel_max", "<="),
          ("decode_kl", "kl_max", "<="), ("decode_top1", "top1_min", ">="), ("generate_match", "generate_min", ">="),
          ("generate_kl", "kl_max", "<="), ("logprob_dev", "logprob_abs_max", "<="))
"""(metric, threshold, comparison): every check a parity run passes or fails on. The decode steps after the patched
prefill (generation through the cache it wrote) are held to the full forward's logits bounds; so are the logits of
a greedy generate() (--generate) up to its first differing token."""

MAX_EXPERTS = 16


@dataclass
class ParityJob:
    """What the child process runs: the family, the tiny config's fields, the batch, the blocks, the dtype."""

    model_type: str
    model_class: str
    config: dict[str, Any]
    tokens: int = 32
    batch: int = 2
    seed: int = 0
    dtype: str = "float32"
    blocks: list[str] | None = None
    operators_dir: str = ""
    lora: int = 0                 # LoRA rank through PEFT (0: none), then ``steps`` fine-tuning steps
    steps: int = 4
    generate: int = 0             # new tokens of a greedy generate() on a left-padded batch (0: none)


@dataclass
class ParityResult:
    """One parity run: the metrics, each check's outcome, the patch report and what the run could not cover."""

    source: str
    model_type: str
    model_class: str
    dtype: str
    backend: str
    layers: list[str]
    tokens: int
    config: dict[str, Any] = field(default_factory=dict)  # the tiny instance's config fields
    status: str = ParityStatus.ERROR
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    patch: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    message: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _families():
    from workbench.integrations.transformers import FAMILIES

    return FAMILIES


def _transformers_knows(model_type: str) -> bool:
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def family_module(model_type: str):
    from workbench.integrations.transformers import family

    return family(model_type)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise WorkbenchError(f"cannot read config {path}: {one_line(exc)}") from None
    if not isinstance(data, dict):
        raise WorkbenchError(f"config {path} is not a JSON object")
    return data


def config_fields(source: str) -> tuple[dict[str, Any], str, list[str]]:
    """The config fields a parity source names, the label of the source, and notes: a config.json (the whole of it
    where its model_type's family reads the whole config (kimi_k3), else its nested ``text_config`` where that is a
    registered family or the top level is not), a model card (the config it, or the card it is derived from, was
    onboarded from), or a bare model_type (the class's defaults; a multimodal class's text model where that is
    registered)."""
    from workbench.models import get_model

    notes: list[str] = []
    path = Path(source)
    if source.endswith(".json") or path.is_file():
        if not path.is_file():
            raise WorkbenchError(f"no config file {source}")
        data, label = _read_json(path), str(path)
    elif source in _families() or _transformers_knows(source):
        from workbench.integrations.transformers import config_class

        if getattr(family_module(source), "WHOLE_CONFIG", False):
            return {"model_type": source}, source, ["the published config (the family's defaults)"]
        text = getattr(config_class(source)(), "text_config", None)  # a multimodal class: its text model's
        if text is not None and text.model_type in _families() and text.model_type != source:
            return {"model_type": text.model_type}, source, [f"the class's default config, its text model "
                                                             f"({text.model_type})"]
        return {"model_type": source}, source, ["the class's default config"]
    else:
        card = get_model(source)
        while not (card.onboarded_from or {}).get("file") and card.derived_from:
            notes.append(f"{card.name} is derived from {card.derived_from}: this parity covers {card.derived_from}'s "
                         f"model; what {card.name} changes ({' '.join(card.differs.split())[:120]}) is in no "
                         "published code")
            card = get_model(card.derived_from)
        onboarded = card.onboarded_from or {}
        if not onboarded.get("file") and onboarded.get("model_type"):  # onboarded from a bare model_type
            return config_fields(onboarded["model_type"])
        if not onboarded.get("file"):
            raise WorkbenchError(f"model card {source} names no config (onboarded_from.file): parity needs one")
        config_path = Path(onboarded["file"])
        if not config_path.is_absolute() and config_path.parts[0] == "workbench":
            from workbench.resources import package_dir

            config_path = package_dir(*config_path.parts[1:])  # the package's own configs, installed or not
        data, label = _read_json(config_path), f"{source} ({onboarded['file']})"
    text = data.get("text_config")
    whole = data.get("model_type") in _families() and getattr(family_module(data["model_type"]), "WHOLE_CONFIG", False)
    if isinstance(text, dict) and not whole and (text.get("model_type") in _families()
                                                 or data.get("model_type") not in _families()):
        notes.append(f"the text model of {data.get('model_type')} (text_config, model_type "
                     f"{data['text_config'].get('model_type')})")
        data = data["text_config"]
    return data, label, notes


def card_parity_sources() -> list[str]:
    """The model cards that name a registered family's model (a transformers class, or workbench.kimi_k3's): those
    onboarded from a config whose model_type (at its top or in its text_config) is a registered family. A derived
    card (kimi-k3.1-pro) is left out: its parity is its base card's (what it changes is in no published code)."""
    from workbench.models import list_models

    found, seen = [], set()
    for card in list_models():
        if card.derived_from or not (card.onboarded_from or {}).get("file"):
            continue
        fields, label, _ = config_fields(card.name)
        if fields.get("model_type") in _families() and label not in seen:
            seen.add(label)
            found.append(card.name)
    return found


def load_config(fields: dict[str, Any]) -> tuple[Any, list[str]]:
    """The family's config class instance of ``fields`` (defaults filled by the class) and notes on the fields the
    class cannot compute (which the tiny instance replaces by the class's default)."""
    from workbench.integrations.transformers import config_class, own_model

    model_type = fields.get("model_type")
    if not model_type:
        raise WorkbenchError("the config has no model_type")
    cls = config_class(model_type)
    fields, notes = dict(fields), []
    act = fields.get("hidden_act")
    own = own_model(model_type) is not None  # the project's own model: it computes what it reads
    if act is not None and not own and act not in _activations():
        default = cls().hidden_act
        notes.append(f"hidden_act '{act}' has no transformers implementation (ACT2FN): the class cannot compute it; "
                     f"the tiny model uses the class's default '{default}', and this parity does not cover '{act}'")
        fields["hidden_act"] = default
    from workbench.integrations.class_view import read_names, unread_fields

    reader = getattr(cls, "__self__", cls)  # a bound classmethod's class
    unread = unread_fields({k: v for k, v in fields.items() if k != "model_type"}, read_names(reader))
    if unread:
        notes.append(f"{reader.__name__} does not read {', '.join(unread)}: this parity does not cover them")
    try:
        return cls(**{k: v for k, v in fields.items() if k != "model_type"}), notes
    except (TypeError, ValueError) as exc:
        raise WorkbenchError(f"{cls.__name__} cannot read this config: {one_line(exc)}") from None


def _activations():
    from transformers.activations import ACT2FN

    return ACT2FN


def pick_layers(full: list[str], count: int) -> list[str]:
    """The first ``count`` entries of a layer schedule, with its last entries replaced by the kinds the full
    schedule has and the prefix lacks (each kind appears once at least, in the schedule's order)."""
    if count < len(set(full)):
        raise WorkbenchError(f"--layers {count}: the schedule has {len(set(full))} layer kinds "
                             f"({', '.join(sorted(set(full)))}); ask for at least that many")
    picked = list(full[:count])
    missing = [kind for kind in dict.fromkeys(full) if kind not in picked]
    if missing:
        picked[len(picked) - len(missing):] = missing
    return picked


def schedules(full) -> tuple[list[str], list[str]]:
    """The config's attention schedule (``layer_types``, else full attention everywhere) and its MLP schedule
    (``mlp_layer_types``; else Qwen's ``mlp_only_layers`` and ``decoder_sparse_step``; else
    ``first_k_dense_replace`` dense layers, then sparse ones)."""
    full = full.get_text_config()  # a multimodal class's text model
    count = full.num_hidden_layers
    attention = list(getattr(full, "layer_types", None) or ["full_attention"] * count)
    mlp = getattr(full, "mlp_layer_types", None)
    if not mlp and getattr(full, "mlp_only_layers", None) is not None:  # Qwen's: dense where listed or off-step
        step = getattr(full, "decoder_sparse_step", 1) or 1
        mlp = ["dense" if i in full.mlp_only_layers or (i + 1) % step else "sparse" for i in range(count)]
    if not mlp:
        dense = getattr(full, "first_k_dense_replace", None) or 0
        mlp = ["dense"] * min(dense, count) + ["sparse"] * max(count - dense, 0)
    return attention, list(mlp)


def attention_schedule(full) -> list[str]:
    """The attention of every layer of ``full`` (the family's own schedule, else ``schedules``')."""
    from workbench.integrations.transformers import family

    own = getattr(family(full.model_type), "schedule", None)
    return own(full) if own is not None else schedules(full)[0]


def tiny_config(full, layers: int) -> tuple[dict[str, Any], list[str]]:
    """The tiny instance's config fields (the family's ``tiny``) and its attention schedule: ``layers`` layers,
    expert count min(E, 16) (a multiple of the routing groups), top-k scaled to keep k/E about as it is (at least 2
    where E allows)."""
    from workbench.integrations.transformers import family

    fam = family(full.model_type)
    if hasattr(fam, "tiny_config"):  # a family whose model is not a transformers class
        return fam.tiny_config(full, layers)
    text = full.get_text_config()  # a multimodal class's text model (the family's tiny adds a tiny vision tower)
    attention_full, mlp_full = schedules(text)
    attention = pick_layers(attention_full, layers)
    mlp = pick_layers(mlp_full, layers) if layers > 1 else mlp_full[:1]
    total = getattr(text, "num_local_experts", None) or text.num_experts  # (Qwen names it num_experts)
    experts = min(total, MAX_EXPERTS)
    top_k = max(min(2, experts), min(text.num_experts_per_tok, round(text.num_experts_per_tok * experts / total) or 1))
    return fam.tiny(text, attention, mlp, experts, top_k), attention


def run_parity(source: str, layers: int = 4, tokens: int = 32, blocks: list[str] | None = None,
               dtype: str = "float32", seed: int = 0, backend=None, operators_dir: Path | None = None,
               timeout_s: float = 1800.0, lora: int = 0, steps: int = 4, generate: int = 0) -> ParityResult:
    """Parity of the ported kernels in the published modeling code of ``source`` (see the module docstring); with
    ``lora`` (a rank), both models wrapped by PEFT's LoRA, then fine-tuned ``steps`` steps: the curves compared; with
    ``generate``, both models' greedy generate() of that many new tokens on a left-padded batch of two prompts of
    different lengths: the tokens and logits compared."""
    from workbench.backends import get_backend
    from workbench.config import Settings
    from workbench.integrations.transformers import family

    backend = backend or get_backend("auto")
    if dtype not in THRESHOLDS:
        raise WorkbenchError(f"unknown dtype '{dtype}' (one of {', '.join(THRESHOLDS)})")
    if dtype not in backend.dtypes:
        raise WorkbenchError(f"the {backend.name} backend cannot compute {dtype} (it runs "
                             f"{', '.join(backend.dtypes)}): parity in {dtype} needs a GPU")
    fields, label, notes = config_fields(source)
    full, more = load_config(fields)
    config, schedule = tiny_config(full, layers)
    fam = family(full.model_type)
    job = ParityJob(model_type=getattr(fam, "MODEL_TYPE", full.model_type), model_class=fam.MODEL_CLASS,
                    config=config, tokens=tokens, seed=seed, dtype=dtype, blocks=blocks, lora=lora, steps=steps,
                    generate=generate,
                    operators_dir=str(Path(operators_dir or Settings.load().operators_dir).resolve()))
    result = ParityResult(source=label, model_type=full.model_type, model_class=fam.MODEL_CLASS, dtype=dtype,
                          backend=backend.name, layers=schedule, tokens=tokens, config=config,
                          notes=[*notes, *more])
    started = time.monotonic()
    # the operators are candidates too: the child runs as the replay's training child does (the sandbox's
    # isolation and environment, its own scratch folder for temporary files, Triton's and transformers' caches)
    with tempfile.TemporaryDirectory(prefix="parity-") as scratch:
        env = {**child_env(backend.env), "TMPDIR": scratch, "TRITON_CACHE_DIR": str(Path(scratch) / "triton-cache"),
               "HF_HOME": str(Path(scratch) / "hf")}
        entry, given = "workbench.integrations.parity_child", json.dumps({**asdict(job), "scratch": scratch})
        try:
            # a fork of the warm worker where it runs, else a cold child
            proc = warm_popen(entry, env, Path.cwd(), timeout_s, [Path(scratch)], [Path(job.operators_dir)])
            if proc is not None:
                stdout, stderr = proc.communicate(given, timeout_s)
            else:
                command = child_command([sys.executable, "-m", entry], memory_bytes=None, timeout_s=timeout_s,
                                        writable=[Path(scratch)], readable=[Path(job.operators_dir)], cwd=Path.cwd())
                cold = subprocess.run(command, input=given, capture_output=True, text=True, timeout=timeout_s,
                                      env=env)
                stdout, stderr = cold.stdout, cold.stderr
        except subprocess.TimeoutExpired:
            result.message = f"the parity child ran past {timeout_s:.0f} s"
            result.seconds = time.monotonic() - started
            return result
    result.seconds = time.monotonic() - started
    answer = next((json.loads(line[len(MARK):]) for line in reversed(stdout.splitlines())
                   if line.startswith(MARK)), None)
    if answer is None or "error" in answer:
        tail = (answer or {}).get("error") or (stderr.strip().splitlines() or ["no output"])[-1]
        result.message = f"the parity child failed: {tail}"[:500]
        return result
    result.metrics, result.patch = answer["metrics"], answer["patch"]
    result.notes += answer["patch"].get("notes", [])
    judge(result)
    return result


MARK = "@@parity "


def judge(result: ParityResult) -> None:
    """Fill ``checks`` and ``status`` from the metrics and the dtype's THRESHOLDS (a missing metric, such as the
    router match of a model without routed experts, is not a check), and from ``idle_blocks``: a block swapped in
    that never ran (its module fell back to the shipped forward) fails the run. Where the gradients past their bound
    were held to float64 (``grad_truth_ratio``), that check replaces the worst gradient's."""
    bounds = THRESHOLDS[result.dtype]
    result.checks = []
    truth = result.metrics.get("grad_truth_ratio")  # the gradients past the bound, held to float64 instead
    for metric, bound, op in CHECKS:
        value = result.metrics.get(metric)
        if value is None or (metric == "grad_rel_worst" and truth is not None):
            continue
        ok = value <= bounds[bound] if op == "<=" else value >= bounds[bound]
        result.checks.append({"metric": metric, "value": value, "bound": bounds[bound], "op": op, "ok": ok})
    if truth is not None:
        result.checks.append({"metric": "grad_truth_ratio", "value": truth, "bound": 1.0, "op": "<=",
                              "ok": truth <= 1.0})
    idle = result.metrics.get("idle_blocks") or []
    result.checks.append({"metric": "idle_blocks", "value": len(idle), "bound": 0, "op": "<=", "ok": not idle})
    failed = [c["metric"] for c in result.checks if not c["ok"]]
    result.status = ParityStatus.FAIL if failed else ParityStatus.PASS
    first = result.metrics.get("first_divergence")
    numbers = [m for m in failed if m != "idle_blocks"]
    result.message = "; ".join(
        ([f"swapped in but never ran (their modules ran the shipped forward): {', '.join(idle)}"] if idle else [])
        + ([f"outside the {result.dtype} bounds: {', '.join(numbers)}"] if numbers else [])) or \
        f"every check within the {result.dtype} bounds"
    if first:
        result.message += f"; first module past {bounds['module_rel_max']:.0e}: {first['module']} ({first['rel']:.2e})"
    generated = result.metrics.get("generate_divergence")
    if generated:
        result.message += f"; generate() tokens differ from step {generated['step']}: " + (
            f"first module there past {bounds['module_rel_max']:.0e}: {generated['module']} ({generated['rel']:.2e})"
            if generated["module"] else "every module there within the bound (a near-tie flipped)")
