"""Failure classes: what went wrong with a candidate, read off its verification result.

Classes: compile_error, runtime_error, timeout, crashed, oom (the sandbox's verdicts); the integrity verdicts
(torch_fallback, aliasing, ...: workbench.verify.integrity); coverage (fails exactly on the shapes where a template
requirement such as BLOCK_N >= N does not hold, in wrong numbers or in a runtime error the host code raises for
those shapes); precision / nonfinite (a low-precision *_DTYPE parameter and errors past the bound / NaN-Inf, also
when such a parameter's overflow left an output constant); tail (only shapes with non-power-of-two dims fail);
gradient (only gradients fail); wrong (anything else). A candidate from no template (written by a model) is never
read as coverage or as a low-precision parameter.
"""

from __future__ import annotations

from typing import Any

from workbench.templating import Template
from workbench.vocabulary import NUMERIC_VERDICTS, FailureClass, Verdict

LOW_PRECISION = ("float16", "bfloat16", "input")  # "input": the input dtype, low for half inputs


def parse_shape(label: str) -> dict[str, int]:
    """``"rows=3,N=4097"`` -> ``{"rows": 3, "N": 4097}``."""
    return {k: int(v) for k, v in (item.split("=") for item in label.split(",") if item)}


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def diagnose(verdict: str, message: str, checks: list[dict[str, Any]], template: Template | None,
             params: dict[str, Any]) -> dict[str, Any]:
    """{"class", "reason", "symptoms"} for a candidate that did not pass. Unwritten outputs are read like wrong
    numbers (they are what a tile narrower than the data leaves behind); other verdicts are their own class."""
    if verdict == Verdict.RUNTIME_ERROR and template is not None:
        found = _coverage([c for c in checks if c["direction"] == "run" and not c["passed"]], template, params)
        if found:  # the host code refused the shapes the template's requirements exclude: a clear-error coverage
            return found
    if verdict == Verdict.CONSTANT_OUTPUT and template is not None and _low_precision(params):
        found = _numeric_class(message, checks, template, params)  # e.g. a float16 sum overflowing to rstd = 0
        if found["class"] in (FailureClass.PRECISION, FailureClass.NONFINITE):
            return found
    if verdict not in NUMERIC_VERDICTS:
        return {"class": verdict, "reason": f"{verdict}: {message}", "symptoms": {}}
    found = _numeric_class(message, checks, template, params)
    if verdict == Verdict.UNWRITTEN_OUTPUT and found["class"] == FailureClass.WRONG:
        return {**found, "class": verdict, "reason": f"{verdict}: {message}"}
    return found


def _low_precision(params: dict[str, Any]) -> list[str]:
    return [name for name, value in params.items() if name.endswith("_DTYPE") and value in LOW_PRECISION]


def _coverage(failing: list[dict[str, Any]], template: Template | None, params: dict[str, Any],
              symptoms: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The coverage class when every failing shape is one where a template requirement does not hold."""
    failing_shapes = sorted({c["shape"] for c in failing})
    unmet = {label: template.unmet(params, parse_shape(label)) if template else [] for label in failing_shapes}
    if not failing_shapes or not all(unmet.values()):
        return None
    requirement = next(iter(unmet.values()))[0]
    return {"class": FailureClass.COVERAGE,
            "symptoms": {**(symptoms or {"failing_shapes": failing_shapes}), "requirement": requirement},
            "reason": f"fails exactly where '{requirement}' does not hold: [{'] ['.join(failing_shapes)}]"}


def _numeric_class(message: str, checks: list[dict[str, Any]], template: Template | None,
                   params: dict[str, Any]) -> dict[str, Any]:
    checks = [c for c in checks if c["direction"] != "run" and not c["direction"].startswith("integrity:")]
    failing = [c for c in checks if not c["passed"]]
    if not failing:
        return {"class": FailureClass.WRONG, "symptoms": {}, "reason": f"wrong results: {message}"}
    failing_shapes = sorted({c["shape"] for c in failing})
    passing_shapes = sorted({c["shape"] for c in checks} - set(failing_shapes))
    symptoms: dict[str, Any] = {
        "failing_shapes": failing_shapes,
        "failing_dtypes": sorted({c["dtype"] for c in failing}),
        "worst": max(failing, key=lambda c: (c.get("max_abs") or 0) / (c.get("bound") or 1)),
    }

    found = _coverage(failing, template, params, symptoms)
    if found:
        return found

    nonfinite = sum(c.get("nonfinite") or 0 for c in failing)
    low = _low_precision(params)
    worst = symptoms["worst"]
    if low:
        what = f"{nonfinite} NaN/Inf values" if nonfinite else \
            f"error up to {worst['max_abs'] / worst['bound']:.3g}x the bound ({worst['direction']} [{worst['shape']}])"
        return {"class": FailureClass.NONFINITE if nonfinite else FailureClass.PRECISION,
                "symptoms": {**symptoms, "param": low[0]},
                "reason": f"{low[0]}={params[low[0]]} computes in low precision: {what}"}
    if nonfinite:
        return {"class": FailureClass.NONFINITE, "symptoms": symptoms,
                "reason": f"{nonfinite} NaN/Inf values where the reference is finite"}
    if set(symptoms["failing_dtypes"]) <= set(LOW_PRECISION):
        return {"class": FailureClass.PRECISION, "symptoms": symptoms,
                "reason": f"only {', '.join(symptoms['failing_dtypes'])} fails: worst {worst['direction']} "
                          f"[{worst['shape']}] at {worst['max_abs'] / worst['bound']:.3g}x the bound"}
    odd = all(not all(_is_pow2(v) for v in parse_shape(label).values()) for label in failing_shapes)
    if odd and any(all(_is_pow2(v) for v in parse_shape(label).values()) for label in passing_shapes):
        return {"class": FailureClass.TAIL, "symptoms": symptoms,
                "reason": f"power-of-two shapes pass, only shapes with odd sizes fail: [{'] ['.join(failing_shapes)}]"}
    if all(c["direction"].startswith("grad:") for c in failing):
        return {"class": FailureClass.GRADIENT, "symptoms": symptoms,
                "reason": f"forward passes, gradients fail: {', '.join(sorted({c['direction'] for c in failing}))}"}
    return {"class": FailureClass.WRONG, "symptoms": symptoms, "reason": f"wrong results: {message}"}
