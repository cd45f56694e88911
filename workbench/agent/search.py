"""The search proposer: walks the templates' parameter spaces with named repair rules; needs no network.

first(): the most preferred point that meets every template requirement on every shape to be verified.
revise(): the repair rule of the failure class when there is one (each names its reason), else the next untried
covering point, other templates first when the failure points at the template's code rather than its parameters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from workbench.agent.state import Proposal
from workbench.blocks.base import Shape
from workbench.templating import Template, format_point
from workbench.vocabulary import INTEGRITY_VERDICTS, FailureClass, Verdict

# Failures that no parameter of the same template can fix: look at the other templates first.
STRUCTURAL = (Verdict.COMPILE_ERROR, Verdict.TARGET_COMPILE_ERROR, Verdict.INTERPRETER_UNSUPPORTED,
              Verdict.RUNTIME_ERROR, Verdict.CRASHED, Verdict.TEMPLATE_ERROR, FailureClass.TAIL, FailureClass.GRADIENT,
              FailureClass.WRONG, *INTEGRITY_VERDICTS)


def point_key(template: str, params: dict[str, Any]) -> str:
    return f"{template}:{json.dumps(params, sort_keys=True)}"


class SearchProposer:
    name = "search"

    def __init__(self, templates: list[Template], shapes: list[Shape]):
        self.templates = sorted(templates, key=lambda t: (t.rank, t.name))
        self.by_name = {t.name: t for t in self.templates}
        self.shapes = shapes
        self.rules: dict[str, Callable[[Template, dict, dict, set[str]], Proposal | None]] = {
            FailureClass.COVERAGE: self._repair_coverage,
            FailureClass.PRECISION: self._repair_precision,
            FailureClass.NONFINITE: self._repair_precision,
            Verdict.TIMEOUT: self._repair_timeout,
        }

    def covers(self, template: Template, params: dict[str, Any]) -> bool:
        return all(not template.unmet(params, shape) for shape in self.shapes)

    def _covering(self, templates: list[Template], tried: set[str]) -> Iterator[tuple[Template, dict]]:
        for template in templates:
            for params in template.points():
                if point_key(template.name, params) not in tried and self.covers(template, params):
                    yield template, params

    def first(self) -> Proposal | None:
        dims = dict.fromkeys(k for shape in self.shapes for k in shape)  # a suite's optional dims: some shapes only
        widest = {k: max(shape[k] for shape in self.shapes if k in shape) for k in dims}
        for template, params in self._covering(self.templates, set()):
            needs = f" meeting {' and '.join(template.requires)} on every shape" if template.requires else ""
            return Proposal(template=template.name, params=params,
                            reason=f"first point of {template.name} (rank {template.rank}){needs}; "
                                   f"largest dims {format_point(widest)}")
        return None

    def revise(self, template_name: str, params: dict[str, Any], diagnosis: dict[str, Any],
               tried: set[str]) -> Proposal | None:
        template = self.by_name[template_name]
        rule = self.rules.get(diagnosis["class"])
        if rule:
            proposal = rule(template, params, diagnosis, tried)
            if proposal:
                return proposal
        others = [t for t in self.templates if t.name != template_name]
        order = others + [template] if diagnosis["class"] in STRUCTURAL else self.templates
        for nxt, nxt_params in self._covering(order, tried):
            if diagnosis["class"] == "explore":
                why = "exploring"
            elif rule:
                why = f"the {diagnosis['class']} repair has nothing untried left"
            else:
                why = f"no repair rule for {diagnosis['class']}"
            if diagnosis["class"] in STRUCTURAL:
                why += f" ({template_name}'s code is suspect, other templates first)"
            return Proposal(template=nxt.name, params=nxt_params, reason=f"{why}: next untried point")
        return None

    def propose(self, current: dict[str, Any], diagnosis: dict[str, Any], history: list[dict]) -> Proposal | None:
        """The proposer interface of the graph: revise() of the current attempt, every attempt so far tried."""
        tried = {point_key(h["template"], h["params"]) for h in history}
        return self.revise(current["template"], current["params"], diagnosis, tried)

    def explore(self, current: dict[str, Any], history: list[dict], n: int) -> list[Proposal]:
        """Up to ``n`` untried covering points, in the order revise() would take them one at a time."""
        tried = {point_key(h["template"], h["params"]) for h in history}
        return [Proposal(template=template.name, params=params, reason="exploring side by side: next untried point")
                for template, params in islice(self._covering(self.templates, tried), n)]

    def _nearest(self, template: Template, params: dict, tried: set[str], ok) -> dict | None:
        """The untried point of ``template`` satisfying ``ok`` that changes the fewest parameters."""
        best = None
        for cand in template.points():
            if point_key(template.name, cand) in tried or not ok(cand):
                continue
            changed = sum(cand[k] != params[k] for k in params)
            if best is None or changed < best[0]:
                best = (changed, cand)
        return best[1] if best else None

    def _repair_coverage(self, template: Template, params: dict, diagnosis: dict, tried: set[str]) -> Proposal | None:
        fixed = self._nearest(template, params, tried, lambda p: self.covers(template, p))
        if fixed is None:
            return None
        changes = ", ".join(f"{k} {params[k]} -> {v}" for k, v in fixed.items() if params[k] != v)
        return Proposal(template=template.name, params=fixed,
                        reason=f"coverage repair: '{diagnosis['symptoms']['requirement']}' broken on "
                               f"[{diagnosis['symptoms']['failing_shapes'][0]}]; {changes}")

    def _repair_precision(self, template: Template, params: dict, diagnosis: dict, tried: set[str]) -> Proposal | None:
        param = diagnosis["symptoms"].get("param")
        if param is None or "float32" not in template.params[param]["choices"]:
            return None
        fixed = {**params, param: "float32"}
        if point_key(template.name, fixed) in tried:
            return None
        return Proposal(template=template.name, params=fixed,
                        reason=f"precision repair: {diagnosis['reason']}; {param} {params[param]} -> float32")

    def _repair_timeout(self, template: Template, params: dict, diagnosis: dict, tried: set[str]) -> Proposal | None:
        tile = next(iter(template.params))
        bigger = [p for _, p in self._covering([template], tried) if p[tile] > params[tile]]
        if not bigger:
            return None
        fixed = max(bigger, key=lambda p: p[tile])
        return Proposal(template=template.name, params=fixed,
                        reason=f"timeout repair: fewer, larger programs; {tile} {params[tile]} -> {fixed[tile]}")
