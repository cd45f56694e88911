"""The promoted operators in a Hugging Face transformers model, in one call, as Liger-Kernel's
``apply_liger_kernel_to_<family>`` does:

    from workbench.integrations.transformers import apply_workbench_kernels

    model = AutoModelForCausalLM.from_config(config)          # or from_pretrained
    report = apply_workbench_kernels(model)                    # every module a catalog block computes
    print(report.table())                                      # what was replaced, by which op; what not, and why

The family is chosen by ``model.config.model_type`` (``FAMILIES``: model_type -> its patch function, the registry of
``workbench/integrations/families/``; any other model_type transformers ships gets the generic family, which swaps what
the onboarding probe proves: ``families/generic.py``). Each family swaps the ops of ``workbench.kernels`` in through
transformers' own plug points where they fit (the experts-implementation registry ``ALL_EXPERTS_FUNCTIONS`` with
``set_experts_implementation``) and by replacing a module instance's ``forward`` where they do not (the module keeps its
parameters, names and state dict; ``original_forward`` gives the shipped one back). A module whose math no catalog block
computes, or computes in another variant, is left alone and named in the report with the reason; it is never replaced by
a look-alike. PEFT's LoRA layers (``peft.get_peft_model``) are swapped for ``lora_linear`` in any family
(``apply_to_lora``). ``blocks`` restricts the swap to those blocks (the rest are left alone, "not requested").

The kernels run where the operators run: on a GPU they compile; on CPU only through the Triton interpreter
(``TRITON_INTERPRET=1`` before anything imports triton), in float32 or float16.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from workbench.blocks import get_block
from workbench.errors import WorkbenchError
from workbench.kernels import operators_dir
from workbench.operators import newest_promoted


@dataclass
class ModuleRow:
    """One module of the model: replaced by ``blocks`` (the ops of workbench.kernels), or left alone (``reason``)."""

    path: str
    cls: str
    blocks: tuple[str, ...] = ()
    reason: str = ""

    @property
    def replaced(self) -> bool:
        return bool(self.blocks)


@dataclass
class PatchReport:
    """What ``apply_workbench_kernels`` did to one model: every module it looked at, replaced or left alone."""

    model_type: str
    model_class: str
    rows: list[ModuleRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def replace(self, path: str, module: nn.Module, *blocks: str) -> None:
        self.rows.append(ModuleRow(path, type(module).__name__, tuple(blocks)))

    def leave(self, path: str, module: nn.Module, reason: str) -> None:
        self.rows.append(ModuleRow(path, type(module).__name__, reason=reason))

    @property
    def replaced(self) -> list[ModuleRow]:
        return [r for r in self.rows if r.replaced]

    @property
    def left_alone(self) -> list[ModuleRow]:
        return [r for r in self.rows if not r.replaced]

    @property
    def blocks(self) -> list[str]:
        """The catalog blocks the patched model runs, sorted."""
        return sorted({b for r in self.rows for b in r.blocks})

    def by_class(self) -> list[dict[str, Any]]:
        """One row per (module class, outcome): how many modules, by which blocks or why not, one example path."""
        grouped: dict[tuple, dict[str, Any]] = {}
        for r in self.rows:
            key = (r.cls, r.blocks, r.reason)
            entry = grouped.setdefault(key, {"class": r.cls, "blocks": list(r.blocks), "reason": r.reason,
                                             "count": 0, "example": r.path})
            entry["count"] += 1
        return list(grouped.values())

    def as_dict(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "model_class": self.model_class, "blocks": self.blocks,
                "modules": self.by_class(), "notes": self.notes}


class Patcher:
    """What a family's patch function works with: the model, the blocks it may use and the report it fills."""

    def __init__(self, model: nn.Module, blocks: Iterable[str] | None, report: PatchReport,
                 assume_promoted: bool = False):
        """``assume_promoted``: take every catalog block as promoted (what the family would swap in, for
        onboarding's module map) instead of reading the operators folder."""
        from workbench.blocks import REGISTRY

        self.model = model
        self.allowed = None if blocks is None else set(blocks)
        self.report = report
        self.folder = operators_dir()
        self.promoted = set(REGISTRY) if assume_promoted else set(newest_promoted(self.folder))

    def wants(self, path: str, module: nn.Module, *blocks: str) -> bool:
        """Whether every block in ``blocks`` may be used (requested, and promoted in the operators folder); if not,
        the module is reported as left alone."""
        missing = [b for b in blocks if self.allowed is not None and b not in self.allowed]
        if missing:
            self.report.leave(path, module, f"not requested ({', '.join(missing)} not in --blocks)")
            return False
        unported = [b for b in blocks if b not in self.promoted]
        if unported:
            self.report.leave(path, module, f"no promoted operator for {', '.join(unported)} in {self.folder}")
        return not unported

    def may(self, *blocks: str) -> bool:
        """Whether every block in ``blocks`` may be used (requested and promoted), reporting nothing: for an optional
        form of a module's computation (a decode step beside its prefill)."""
        return all((self.allowed is None or b in self.allowed) and b in self.promoted for b in blocks)

    def set_forward(self, path: str, module: nn.Module, forward: Callable[..., Any], *blocks: str) -> None:
        """Replace ``module``'s forward by ``forward(module, *args, **kwargs)`` and report it replaced by ``blocks``,
        which the forward reads (``module.workbench_blocks``: an optional block it computes only where named)."""
        if not hasattr(module, "original_forward"):
            module.original_forward = module.forward
        module.forward = forward.__get__(module)
        module.workbench_blocks = frozenset(blocks)
        self.report.replace(path, module, *blocks)

    def set_ops(self, path: str, module: nn.Module, *blocks: str) -> None:
        """Have ``module`` (a model that computes its blocks through its ``ops`` table, workbench.kimi_k3) compute
        ``blocks`` with the kernels library's ops, and report it replaced by them."""
        import workbench.kernels as wk

        module.ops = {**module.ops, **{block: wk.OPS[block] for block in blocks}}
        self.report.replace(path, module, *blocks)


FAMILIES: dict[str, str] = {
    "deepseek_v3": "workbench.integrations.families.deepseek_v3",
    "deepseek_v32": "workbench.integrations.families.deepseek_v32",
    "glm5_next": "workbench.integrations.families.glm5_next",
    "glm5_next_text": "workbench.integrations.families.glm5_next",
    "glm_moe_dsa": "workbench.integrations.families.glm_moe_dsa",
    "inkling2": "workbench.integrations.families.inkling2",
    "inkling2_text": "workbench.integrations.families.inkling2",
    "kimi_k3": "workbench.integrations.families.kimi_k3",
    "kimi_linear": "workbench.integrations.families.kimi_linear",
    "qwen3_next": "workbench.integrations.families.qwen3_next",
}
"""model_type -> the module of its family patch (a function ``apply(patcher)`` and the ``MODEL_CLASS`` name of its
causal LM, with ``MODEL_TYPE`` the model_type of that class's config where it is another's: GLM-5-Next's text model
has no causal LM of its own); a family is listed only where the catalog computes some of its modules. A family whose
model is not a transformers class (kimi_k3) also names ``config_class`` (its config from the json's fields) and
``tiny_config``, and with ``WHOLE_CONFIG`` reads the whole published config rather than its text_config's
model_type."""


def family_fields(data: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The config fields a registered family reads from a config.json and their prefix: the top level where its
    model_type's family reads the whole config (WHOLE_CONFIG), else the nested text_config where that names a
    family, else the top level; None when no family is registered for either."""
    top = data.get("model_type")
    if top in FAMILIES and getattr(family(top), "WHOLE_CONFIG", False):
        return data, ""
    text = data.get("text_config")
    if isinstance(text, dict) and text.get("model_type") in FAMILIES:
        return text, "text_config."
    return (data, "") if top in FAMILIES else None


def config_class(model_type: str):
    """The config class (a callable of the json's fields) of ``model_type``: a registered family's own
    ``config_class`` (Kimi K3's), else transformers' CONFIG_MAPPING entry; WorkbenchError when neither knows it."""
    own = own_model(model_type)
    if own:
        return own.config_class
    from transformers import CONFIG_MAPPING

    try:
        return CONFIG_MAPPING[model_type]
    except KeyError:
        raise WorkbenchError(f"transformers {_version()} has no config class for model_type '{model_type}'") from None


def own_model(model_type: str):
    """The family module of ``model_type`` where its model is the project's own (it names a ``config_class``: Kimi
    K3's), else None."""
    if model_type not in FAMILIES:
        return None
    fam = family(model_type)
    return fam if getattr(fam, "config_class", None) is not None else None


def _version() -> str:
    import transformers

    return transformers.__version__


def family(model_type: str):
    """The family module of ``model_type``: its hand-written integration where one is registered, else (a
    model_type the installed transformers ships) the generic family (workbench.integrations.families.generic: the
    kinds the onboarding probe proves); WorkbenchError (one line, with the registered ones) when neither."""
    if model_type in FAMILIES:
        return importlib.import_module(FAMILIES[model_type])
    from transformers import CONFIG_MAPPING

    if model_type in CONFIG_MAPPING:
        from workbench.integrations.families.generic import generic_family

        return generic_family(model_type)
    raise WorkbenchError(f"no workbench kernels for model_type '{model_type}': no family is registered for it "
                         f"({', '.join(sorted(FAMILIES))}) and transformers {_version()} does not know it")


def apply_workbench_kernels(model: nn.Module, blocks: Iterable[str] | None = None) -> PatchReport:
    """Swap the promoted operators into ``model`` (a transformers PreTrainedModel) for every module whose math a
    catalog block computes, chosen by ``model.config.model_type``; ``blocks``: only these catalog blocks. Returns the
    report of every module replaced and left alone. Applying it twice changes nothing more."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type is None:
        raise WorkbenchError(f"{type(model).__name__} has no config.model_type: not a transformers model")
    for name in blocks or ():
        get_block(name)
    report = PatchReport(model_type, type(model).__name__)
    patcher = Patcher(model, blocks, report)
    family(model_type).apply(patcher)
    apply_to_lora(patcher)
    return report


def apply_to_lora(patcher: Patcher) -> None:
    """PEFT's LoRA Linear layers (a model wrapped by peft.get_peft_model), whatever the family, as lora_linear where
    it computes them; each reported."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return
    from workbench.integrations.families._common import lora_forward, lora_supported

    for path, module in patcher.model.named_modules():
        if not isinstance(module, LoraLinear):
            continue
        why = lora_supported(module)
        if why:
            patcher.report.leave(path, module, why)
        elif patcher.wants(path, module, "lora_linear"):
            module.workbench_adapter = module.active_adapters[0]
            patcher.set_forward(path, module, lora_forward, "lora_linear")
