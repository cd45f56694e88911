"""A config as its transformers class reads it, for onboarding (``workbench onboard``) and parity: which class it
names, the values the class fills in where the json is silent, the fields the class never reads, and (filled by
onboarding's probe, workbench.integrations.probe) every module class of the model with how the catalog computes it.

    view = class_view(config_dict)        # None when transformers knows neither its model_type nor its text's
    view.model_class                      # "KimiLinearForCausalLM"
    view.value("linear_conv_kernel_dim")  # (4, "linear_conv_kernel_dim (KimiLinearConfig default)")
    view.unread                           # ["text_config.activation_situ_beta", ...]
    view.config                           # the class's instance: what the probe builds the model from

Any model_type the installed transformers ships gets a view, registered here or not (a registered family's own
config class where it has one: Kimi K3's). A field is read when the config class declares it (its annotations, an
``attribute_map`` name) or the config class or the modeling module names it in their source
(``linear_attn_config`` is read in ``__post_init__``, its ``short_conv_kernel_size`` there too); the nested fields
of a dict field count one by one. A family whose model is the project's own (Kimi K3: no probe of transformers code
applies) gets its module map from its own patch run on a tiny instance on the meta device, every block taken as
promoted.
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
    resolved: Any                                 # the config class's instance (the language model's)
    given: dict[str, Any]                         # the json fields the class was given
    code: str = ""                                # whose modeling code: transformers', or the project's own
    unread: list[str] = field(default_factory=list)
    modules: list[dict[str, Any]] = field(default_factory=list)
    config: Any = None                            # the whole config instance (a multimodal class's, towers and all)
    own_model: bool = False                       # the family's model is the project's own (workbench.kimi_k3)

    def value(self, attr: str) -> tuple[Any, str | None]:
        """(the class's value of ``attr``, where it comes from): the json field when given, else the class's
        reading (its default, or another field under an alias); (None, None) when the class has no such
        attribute."""
        if attr in self.given:
            return self.given[attr], self.prefix + attr
        try:
            value = getattr(self.resolved, attr, None)
        except Exception:  # noqa: BLE001 - a property the class cannot compute for this config
            value = None
        if value is None or isinstance(value, type) or callable(value):
            return None, None
        return value, f"{attr} ({self.config_class} default)"

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
    """The config ``data`` as the transformers class of its model_type (or its text_config's, where that is the
    registered family) reads it; None when transformers is not installed or knows neither model_type. WorkbenchError
    (one line, naming the field where the class does) when the class refuses the config."""
    try:
        import transformers
    except ImportError:
        return None
    from workbench.integrations import tiny
    from workbench.integrations.parity import load_config
    from workbench.integrations.transformers import family_fields, own_model

    found = family_fields(data) or known_fields(data)
    if found is None:
        return None
    fields, prefix = found
    full, _notes = load_config(fields)
    reader = type(full)
    own = own_model(fields["model_type"])  # a family whose model is the project's own (Kimi K3's)
    text = full if own else tiny.language_config(full)
    view = ClassView(model_type=fields["model_type"], config_class=reader.__name__, prefix=prefix, resolved=text,
                     model_class=own.MODEL_CLASS if own else tiny.model_class(full, whole=True).__name__,
                     given={k: v for k, v in fields.items() if k != "model_type"}, config=full,
                     code=f"transformers {transformers.__version__}")
    if prefix == "" and text is not full and isinstance(fields.get("text_config"), dict):
        view.prefix, view.given = "text_config.", fields["text_config"]
    view.unread = unread_fields({k: v for k, v in fields.items() if k != "model_type"}, read_names(reader), prefix)
    if own:
        view.code, view.modules = own.CODE, _own_model_modules(full)
        view.own_model = True
    return view


def known_fields(data: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The fields of ``data`` a transformers config class reads, and their prefix: the whole json where
    transformers knows its model_type, else its text_config where it knows that one's; None when it knows
    neither."""
    from transformers import CONFIG_MAPPING

    if data.get("model_type") in CONFIG_MAPPING:
        return data, ""
    text = data.get("text_config")
    if isinstance(text, dict) and text.get("model_type") in CONFIG_MAPPING:
        return text, "text_config."
    return None


def _own_model_modules(full) -> list[dict[str, Any]]:
    """The module map of a family whose model is the project's own: its patch on a tiny instance on the meta device,
    every block taken as promoted."""
    import torch

    from workbench.integrations.parity import attention_schedule, tiny_config
    from workbench.integrations.transformers import Patcher, PatchReport, config_class, family

    fam = family(full.model_type)
    tiny, _ = tiny_config(full, max(4, len(set(attention_schedule(full)))))
    with torch.device("meta"):
        model = getattr(fam.shipped, fam.MODEL_CLASS)(config_class(full.model_type)(**tiny))
    report = PatchReport(model_type=full.model_type, model_class=fam.MODEL_CLASS)
    fam.apply(Patcher(model, None, report, assume_promoted=True))
    return [{k: row[k] for k in ("class", "blocks", "reason")} for row in report.by_class()
            if row["class"] not in GENERIC_MODULES]
