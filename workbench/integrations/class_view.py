"""A config as its transformers class reads it, for onboarding (``workbench onboard``) and parity: which class it
names, the values the class fills in where the json is silent, the fields the class never reads, and every module
of the class with the catalog blocks that compute it (or why none does).

    view = class_view(config_dict)        # None when no registered family names the config (or no transformers)
    view.model_class                      # "KimiLinearForCausalLM"
    view.value("linear_conv_kernel_dim")  # (4, "linear_conv_kernel_dim (KimiLinearConfig default)")
    view.unread                           # ["text_config.activation_situ_beta", ...]
    view.modules                          # [{"class": "KimiLinearForgetGate", "blocks": ["kda_gate"], ...}, ...]

A field is read when the config class declares it (its annotations, an ``attribute_map`` name) or the config class
or the modeling module names it in their source (``linear_attn_config`` is read in ``__post_init__``, its
``short_conv_kernel_size`` there too); the nested fields of a dict field count one by one. The module map comes
from the family's own patch (``apply_workbench_kernels``) run on a tiny instance built on the meta device, with
every block taken as promoted: what the family would swap in, and what it leaves alone and why.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

from workbench import syntax

GENERIC_MODULES = ("Embedding", "Linear")
"""Module classes every model has (the embedding, the logits head): not parts of the architecture to port."""


@dataclass
class ClassView:
    model_type: str
    model_class: str
    config_class: str
    prefix: str                                   # "text_config." when the family reads the nested text config
    resolved: Any                                 # the config class's instance
    given: dict[str, Any]                         # the json fields the class was given
    code: str = ""                                # whose modeling code: transformers', or the project's own
    unread: list[str] = field(default_factory=list)
    modules: list[dict[str, Any]] = field(default_factory=list)

    def value(self, attr: str) -> tuple[Any, str | None]:
        """(the class's value of ``attr``, where it comes from): the json field when given, else the class's
        default; (None, None) when the class has no such attribute."""
        if attr in self.given:
            return self.given[attr], self.prefix + attr
        value = getattr(self.resolved, attr, None)
        return (value, f"{attr} ({self.config_class} default)") if value is not None else (None, None)

    def as_dict(self) -> dict[str, Any]:
        return {"model_type": self.model_type, "class": self.model_class, "config_class": self.config_class,
                "code": self.code, "modules": self.modules, "unread_fields": self.unread}


def source_names(source: str) -> set[str]:
    """The names a Python source uses: identifiers, attributes, keyword arguments and identifier-like string
    constants (``kwargs.get("short_conv_kernel_size")``), docstrings and bare strings left out."""
    names: set[str] = set()
    docstrings = set()
    tree = syntax.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docstrings.add(id(node.value))
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and node.value.isidentifier():
            names.add(node.value)
    return names


@functools.cache
def read_names(config_cls) -> frozenset[str]:
    """The names the config class declares or reads: annotations up its bases, attribute_map keys, and the names
    its source and its modeling module's source use (parsed once per class: onboarding and parity both ask)."""
    names = {n for klass in config_cls.__mro__ for n in getattr(klass, "__annotations__", {})}
    names |= set(getattr(config_cls, "attribute_map", {}))
    names |= source_names(inspect.getsource(config_cls))
    modeling = sys.modules.get(config_cls.__module__.replace("configuration_", "modeling_"))
    if modeling is not None:
        names |= source_names(inspect.getsource(modeling))
    return frozenset(names)


def unread_fields(fields: dict[str, Any], names: frozenset[str], prefix: str = "") -> list[str]:
    """The json fields (nested dict fields one by one) whose names the class never reads."""
    out = []
    for key, value in fields.items():
        if key not in names:
            out.append(prefix + key)
        elif isinstance(value, dict) and key not in ("rope_parameters", "rope_scaling", "quantization_config"):
            out += unread_fields(value, names, f"{prefix}{key}.")
    return sorted(out)


def class_view(data: dict[str, Any]) -> ClassView | None:
    """The config ``data`` as the transformers class of its model_type (or its text_config's) reads it; None when
    no registered family names it or transformers is not installed."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    from workbench.integrations.parity import attention_schedule, load_config, tiny_config
    from workbench.integrations.transformers import Patcher, PatchReport, config_class, family, family_fields

    found = family_fields(data)
    if found is None:
        return None
    fields, prefix = found
    fam = family(fields["model_type"])
    config_cls = config_class(fields["model_type"])
    reader = getattr(config_cls, "__self__", config_cls)  # a bound classmethod's class
    resolved, _notes = load_config(fields)
    view = ClassView(model_type=fields["model_type"], model_class=fam.MODEL_CLASS, config_class=reader.__name__,
                     prefix=prefix, resolved=resolved, given={k: v for k, v in fields.items() if k != "model_type"},
                     code=getattr(fam, "CODE", f"transformers {transformers.__version__}"))
    view.unread = unread_fields(view.given, read_names(reader), prefix)
    tiny, _ = tiny_config(resolved, max(4, len(set(attention_schedule(resolved)))))
    with torch.device("meta"):
        model = getattr(fam.shipped, fam.MODEL_CLASS)(config_cls(**tiny))
    report = PatchReport(model_type=view.model_type, model_class=fam.MODEL_CLASS)
    fam.apply(Patcher(model, None, report, assume_promoted=True))
    view.modules = [{k: row[k] for k in ("class", "blocks", "reason")} for row in report.by_class()
                    if row["class"] not in GENERIC_MODULES]
    return view
