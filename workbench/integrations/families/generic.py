"""Any family the installed transformers ships and no hand-written integration covers: each module whose class the
onboarding probe (workbench.integrations.probe) proved a generic kind computes (workbench.integrations.kinds: norms,
gated norms, gated MLPs, routers, experts, KDA gates and layers, MLA) is swapped for that kind's forward with the
variant the probe proved, read from the module's own attributes; every module the probe found another variant of,
or no block for, is named with the probe's reason.

    family = generic_family("glm4_moe")          # what workbench.integrations.transformers.family returns for it
    family.apply(patcher)                        # apply_workbench_kernels' walk

The probe runs once per config (cached), on a tiny float64 instance of the model's config: a swap is made only where
the references reproduced the class's modules there.
"""

from __future__ import annotations

import functools
import importlib
import json
from typing import Any

from workbench.integrations import kinds as K
from workbench.integrations import tiny as T
from workbench.integrations.attention import use_workbench_attention
from workbench.integrations.probe import COVERED, ProbeResult, kernel_bound, probe


@functools.cache
def _probe_of(config_json: str, model_type: str) -> ProbeResult:
    from workbench.integrations.transformers import config_class

    return probe(config_class(model_type)(**json.loads(config_json)))


def probe_of(config) -> ProbeResult:
    """The probe of ``config`` (a transformers config), run once per distinct config in a process."""
    fields = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k != "model_type"}
    return _probe_of(json.dumps(fields, sort_keys=True, default=str), config.model_type)


class GenericFamily:
    """A family module's interface (workbench.integrations.families) for a model_type with no hand-written one."""

    def __init__(self, model_type: str):
        from transformers import CONFIG_MAPPING

        self.model_type = model_type
        config = CONFIG_MAPPING[model_type]()
        cls = T.model_class(T.language_config(config))
        self.MODEL_CLASS = cls.__name__
        self.shipped = importlib.import_module(cls.__module__)
        self.CODE = f"transformers' modeling_{model_type} (no hand-written integration: the generic kinds)"

    @property
    def HUB_BOUND(self) -> tuple[str, ...]:  # noqa: N802 - the family modules' attribute name
        """The modeling module's functions transformers bound to an installed package's kernels."""
        return tuple(kernel_bound(self.shipped))

    @property
    def LORA_TARGETS(self) -> tuple[str, ...]:  # noqa: N802
        """The projections a parity run's LoRA adapts: the attention's and the MLPs' usual names."""
        return ("q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj",
                "gate_proj", "up_proj", "down_proj")

    def router_classes(self, config) -> tuple[type, ...]:
        """The router classes the probe proved (their output's ids are the router choices parity compares)."""
        proven = probe_of(config).proven
        return tuple(getattr(self.shipped, cls) for cls, entry in proven.items()
                     if entry["kind"] == "router" and hasattr(self.shipped, cls))

    def tiny_config(self, full, layers: int) -> tuple[dict[str, Any], list[str]]:
        """A parity run's tiny config (workbench.integrations.tiny: every distinct layer once; ``layers`` is the
        floor) and its attention schedule."""
        config, _ = T.tiny_config(T.language_config(full))
        fields = {k: v for k, v in config.to_dict().items() if not k.startswith("_")}
        count = T.layer_count(config, T.build(config))[0]
        schedule = list(getattr(config, "layer_types", None) or ["full_attention"] * count)
        return fields, schedule

    def apply(self, patcher) -> None:
        """Swap each module of a class the probe proved; name the rest with the probe's reason."""
        result = probe_of(patcher.model.config)
        rows = {r.cls: r for r in result.rows}
        kinds = {k.name: k for k in K.KINDS}
        config = patcher.model.config.get_text_config()
        for path, module in patcher.model.named_modules():
            cls = type(module).__name__
            entry, row = result.proven.get(cls), rows.get(cls)
            if entry is not None:
                kind = kinds[entry["kind"]]
                variant = kind.variants(module, config)[entry["index"]]
                blocks = kind.blocks + tuple(b for b in variant.optional if patcher.may(b))
                if patcher.wants(path, module, *blocks):
                    K.install(module, variant, blocks)
                    patcher.report.replace(path, module, *blocks)
            elif row is not None and row.status != COVERED and (row.blocks or row.status == K.NO_SPEC) \
                    and not row.within:
                patcher.report.leave(path, module, row.differs or f"{row.status}: {row.role}")
        attention = [m for m in patcher.model.modules() if getattr(K.kind_of(m), "name", None) == "attention"]
        if attention and all(hasattr(m, "original_forward") for m in attention):
            use_workbench_attention(patcher.model)  # every attention layer ours: the masks flash-attention's (2D)
        patcher.report.notes.append(f"generic kinds, as the probe of {result.model_class} proved them "
                                    f"({result.seconds:.1f} s); plain projections (nn.Linear) run in torch")


@functools.cache
def generic_family(model_type: str) -> GenericFamily:
    return GenericFamily(model_type)
