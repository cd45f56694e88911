"""Kernel templates: Jinja2 sources under templates/<block>/<name>.py.j2 (package data, found through
workbench.resources), each with a sidecar <name>.yaml that
declares its parameter space, the constraints every point must meet, and the requirements a point must meet for
each shape it will run on.

Sidecar fields:
    summary: one line; tradeoffs: when to prefer this template
    rank: search order among the block's templates (lower first)
    forward_only: true for an inference form whose backward raises (a decode kernel): only a port with
        ``--forward-only`` proposes it
    params: {NAME: {choices: [...], doc: "..."}}; choices are listed in order of preference
    constraints: ["python expression over the params", ...]
    requires: ["python expression over the params and a shape's dims", ...]
    launch: {KEY: {choices: [...], doc: "..."}}: the launch settings a port may choose per target, each a key of the
        template's LAUNCH_SETTINGS table (num_warps, num_stages, a tile its host code reads from the table); a
        template's default for one is its first choice (LAUNCH_DEFAULTS.KEY) or a parameter of the point; what a
        port chooses per target renders into the candidate's TUNED_SETTINGS (templates/_launch.j2), never into the
        template
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from workbench.config import Settings
from workbench.errors import TemplateError, one_line
from workbench.resources import templates_root
from workbench.vocabulary import key_values

Point = dict[str, Any]


def templates_dir() -> Path:
    return Settings.load().templates or templates_root()


def _eval(expr: str, names: Mapping[str, Any], where: str) -> bool:
    try:
        return bool(eval(expr, {"__builtins__": {"min": min, "max": max, "abs": abs}}, dict(names)))  # noqa: S307
    except Exception as exc:  # noqa: BLE001 - a sidecar mistake is reported as one line
        raise TemplateError(f"{where}: cannot evaluate '{expr}': {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Template:
    block: str
    name: str
    path: Path
    summary: str
    tradeoffs: str
    rank: int
    params: dict[str, dict[str, Any]]
    constraints: list[str] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)
    forward_only: bool = False
    launch: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.block}/{self.name}"

    def validate(self, point: Mapping[str, Any]) -> None:
        """TemplateError unless ``point`` names every parameter, no others, with allowed values and constraints."""
        unknown = sorted(set(point) - set(self.params))
        if unknown:
            raise TemplateError(f"unknown parameter '{unknown[0]}' for template {self.ref} "
                                f"(has: {', '.join(self.params)})")
        missing = sorted(set(self.params) - set(point))
        if missing:
            raise TemplateError(f"template {self.ref} needs parameter '{missing[0]}'")
        for name, value in point.items():
            if value not in self.params[name]["choices"]:
                raise TemplateError(f"{self.ref}: {name}={value!r} is not one of {self.params[name]['choices']}")
        for expr in self.constraints:
            if not _eval(expr, point, self.ref):
                raise TemplateError(f"{self.ref}: parameters {format_point(point)} break constraint '{expr}'")

    def unmet(self, point: Mapping[str, Any], shape: Mapping[str, int]) -> list[str]:
        """The requirements ``point`` does not meet on ``shape``."""
        return [expr for expr in self.requires if not _eval(expr, {**shape, **point}, self.ref)]

    def points(self) -> Iterator[Point]:
        """Every valid point, most preferred first."""
        names = list(self.params)
        for values in itertools.product(*(self.params[n]["choices"] for n in names)):
            point = dict(zip(names, values, strict=True))
            if all(_eval(expr, point, self.ref) for expr in self.constraints):
                yield point

    def validate_tuned(self, tuned: Mapping[str, Mapping[str, Any]]) -> None:
        """TemplateError unless every per-target entry of ``tuned`` names a known target and a declared launch
        setting with one of its choices."""
        from workbench.backends import TARGETS

        for target, settings in tuned.items():
            if target not in TARGETS:
                raise TemplateError(f"{self.ref}: launch settings for unknown target '{target}' "
                                    f"(known: {', '.join(TARGETS)})")
            for key, value in settings.items():
                if key not in self.launch:
                    declared = ", ".join(self.launch) or "none"
                    raise TemplateError(f"{self.ref}: '{key}' is not a launch setting it declares ({declared})")
                if value not in self.launch[key]["choices"]:
                    raise TemplateError(f"{self.ref}: {target} {key}={value!r} is not one of "
                                        f"{self.launch[key]['choices']}")

    def render(self, point: Mapping[str, Any], tuned: Mapping[str, Mapping[str, Any]] | None = None) -> str:
        """Python source of the candidate; the header names the template, the parameters and the launch settings
        chosen per target (``tuned``: {target: {launch setting: value}})."""
        self.validate(point)
        tuned = {t: dict(sorted(v.items())) for t, v in sorted((tuned or {}).items()) if v}
        self.validate_tuned(tuned)
        # the block's own macros by name ("_conv.j2"), another block's by its folder ("situ/_math.j2")
        loader = jinja2.FileSystemLoader([self.path.parent, self.path.parent.parent])
        env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                                 keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
        header = (f'"""{self.block} candidate rendered from templates/{self.ref}.py.j2.\n\n'
                  f"{self.summary}\nparams: {format_point(point)}\n"
                  + "".join(f"launch on {t}: {format_point(v)}\n" for t, v in tuned.items()) + '"""\n')
        try:
            body = env.get_template(self.path.name).render(
                **point, BLOCK=self.block, TEMPLATE=self.name, TUNED=tuned,
                LAUNCH_DEFAULTS={k: spec["choices"][0] for k, spec in self.launch.items()})
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {self.ref} does not render: {type(exc).__name__}: {exc}") from None
        return header + body


def format_point(point: Mapping[str, Any]) -> str:
    return key_values(point)


def parse_point(text: str) -> tuple[str, Point]:
    """``"row_block:BLOCK_N=64,ACC_DTYPE=float16"`` -> ("row_block", {"BLOCK_N": 64, "ACC_DTYPE": "float16"})."""
    name, _, rest = text.partition(":")
    point: Point = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise TemplateError(f"bad parameter '{item}' in '{text}' (expected NAME=VALUE)")
        point[key.strip()] = yaml.safe_load(value.strip())
    return name.strip(), point


def load_template(block: str, name: str) -> Template:
    path = templates_dir() / block / f"{name}.py.j2"
    sidecar = path.with_name(f"{name}.yaml")
    if not path.is_file():
        known = ", ".join(t.name for t in list_templates(block)) or "none"
        raise TemplateError(f"no template '{name}' for block {block} (has: {known})")
    if not sidecar.is_file():
        raise TemplateError(f"template {block}/{name} has no sidecar {sidecar.name} declaring its parameters")
    try:
        meta = yaml.safe_load(sidecar.read_text()) or {}
        params = {k: (v if isinstance(v, dict) else {"choices": v}) for k, v in meta["params"].items()}
        launch = {k: (v if isinstance(v, dict) else {"choices": v}) for k, v in (meta.get("launch") or {}).items()}
        reserved = sorted(set(params) & {"BLOCK", "TEMPLATE", "TUNED", "LAUNCH_DEFAULTS"})
        if reserved:
            raise TemplateError(f"{sidecar.name}: parameter name {reserved[0]} is reserved (the render sets it)")
        for pname, pdef in {**params, **launch}.items():
            if not isinstance(pdef.get("choices"), list) or not pdef["choices"]:
                raise TemplateError(f"{sidecar.name}: parameter {pname} has no list of choices")
        if launch and "LAUNCH_SETTINGS" not in path.read_text():
            raise TemplateError(f"{sidecar.name}: declares launch settings but {path.name} has no LAUNCH_SETTINGS")
        return Template(block=block, name=name, path=path, summary=str(meta.get("summary", "")),
                        tradeoffs=str(meta.get("tradeoffs", "")), rank=int(meta.get("rank", 100)), params=params,
                        constraints=list(meta.get("constraints", [])), requires=list(meta.get("requires", [])),
                        forward_only=bool(meta.get("forward_only", False)), launch=launch)
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TemplateError(f"template {block}/{name}: malformed sidecar {sidecar.name}: "
                            f"{type(exc).__name__}: {one_line(exc)}") from None


def list_templates(block: str) -> list[Template]:
    folder = templates_dir() / block
    names = sorted(p.name.removesuffix(".py.j2") for p in folder.glob("*.py.j2")) if folder.is_dir() else []
    return sorted((load_template(block, n) for n in names), key=lambda t: (t.rank, t.name))


def reverse_choices(dest: Path) -> Path:
    """A copy of the templates root at ``dest`` with every sidecar's choices (its parameters' and its launch
    settings') in reverse order: each template's first point and default launch settings become its least
    preferred ones. With WORKBENCH_TEMPLATES=dest a port starts from the worst-ordered points, which shows what the
    search finds on its own (bench/reversed_port.py)."""
    import shutil

    shutil.copytree(templates_dir(), dest)
    for sidecar in dest.glob("*/*.yaml"):
        meta = yaml.safe_load(sidecar.read_text()) or {}
        for section in ("params", "launch"):
            for name, spec in (meta.get(section) or {}).items():
                choices = spec["choices"] if isinstance(spec, dict) else spec
                meta[section][name] = {**(spec if isinstance(spec, dict) else {}), "choices": choices[::-1]}
        sidecar.write_text(yaml.safe_dump(meta, sort_keys=False, width=120))
    return dest


def candidate_filename(block: str, template: str, source: str) -> str:
    return f"{block}_{template}_{hashlib.sha256(source.encode()).hexdigest()[:10]}.py"
