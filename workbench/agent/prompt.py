"""What the llm proposer tells the model, and how a candidate module is read back out of its reply.

The prompt carries the contract of a candidate module, the block spec (its module source: the math, the reference,
the inputs, the tolerance), the shapes and dtypes it is verified on, the template-rendered starting candidate, and,
after the first try, the last candidate with its verification result: verdict, diagnosis, the failing shapes with
their error figures. It is held to a character budget: the sections are trimmed, least needed first, and the last
verification result is the last thing to be cut.

The reply is free text: the module is taken from a fenced code block (```python, ```py or an unlabeled fence) that
defines ``run``; of several, the last complete one wins (a model that explains, then corrects itself, ends with its
answer); a reply that is bare code is taken whole. Nothing else of the reply is used.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from typing import Any

import torch

from workbench import syntax
from workbench.blocks.base import BlockSpec, shape_label
from workbench.verify.contract import definitions

SYSTEM = ("You write Triton kernels for PyTorch reference functions. You reply with one complete Python module in a "
          "single ```python fenced code block, and nothing in the module but code and comments.")

TRIM_MARK = "\n... [{n} characters trimmed]\n"


@dataclass
class Section:
    """A titled part of the prompt. keep: characters that trimming never cuts below; order: trimmed first when low."""

    title: str
    text: str
    keep: int = 0
    order: int = 0


def contract(spec: BlockSpec) -> str:
    args = ", ".join(spec.arg_names)
    grads = ", ".join(spec.grad_inputs) or "none"
    return "\n".join([
        f"Write a candidate module for the block `{spec.name}` ({spec.summary}). It must:",
        f"- define `BLOCK = \"{spec.name}\"` at module level;",
        f"- define `run({args})` with exactly these parameters, returning the same outputs as the reference "
        f"({', '.join(spec.outputs)}) in the same dtypes and shapes;",
        f"- compute with Triton kernels (`@triton.jit`), wrapped in a `torch.autograd.Function` so that gradients "
        f"flow to: {grads};",
        "- not call the reference, and not use high-level torch operations that do the block's work (matmul, "
        "softmax, norms, reductions): the host code may only allocate, view, copy and launch kernels;",
        "- not use `triton.autotune`, `triton.testing` or `triton.runtime.driver` (verification may run on the "
        "Triton interpreter on CPU): choose tile sizes on the host from the shapes, take the device from the inputs;",
        "- compile for real GPUs as well (every launch is compiled ahead of time for NVIDIA and AMD targets, at the "
        "model's sizes too): a kernel may read a module-level value only if it is a `tl.constexpr(...)`;",
        "- write every element of every output, leave the inputs unchanged, and return fresh tensors.",
        "Reply with the complete module in one ```python fenced block.",
    ])


def shapes_text(spec: BlockSpec, suites: list[str], dtypes: list[str], shapes: dict[str, list[dict]]) -> str:
    lines = [f"Verified on dtypes {', '.join(dtypes)}, forward and gradients, several random inputs per shape, plus "
             f"hidden shapes drawn at verification time within the same ranges. Shapes:"]
    for suite in suites:
        labels = [shape_label(s) for s in shapes.get(suite, [])]
        lines.append(f"- {suite}: {'; '.join(labels) if labels else '(none)'}")
    lines.append("Tolerance (per output and gradient): max|out - truth| <= factor * (the reference's own error in "
                 "that dtype) + atol + rtol * max|truth|, truth computed in float64:")
    for dtype in dtypes:
        tol = spec.tolerance(getattr(torch, dtype))
        lines.append(f"- {dtype}: factor {tol.factor:g}, atol {tol.atol:g}, rtol {tol.rtol:g}")
    return "\n".join(lines)


def _badness(check: dict[str, Any]) -> float:
    if check.get("max_abs") is None:
        return float("inf")
    return check["max_abs"] / check["bound"] if check.get("bound") else float("inf")


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else "-" if value is None else str(value)


def verification_text(attempt: dict[str, Any], diagnosis: dict[str, Any] | None, checks: list[dict[str, Any]],
                      limit: int = 24) -> str:
    """The last verification result: verdict and message, the diagnosis, the failing and passing shapes, then the
    failing checks (worst first, seeds folded) with their error figures; the most needed lines first."""
    lines = [f"verdict: {attempt.get('verdict', '?')}", f"message: {attempt.get('message', '')}"]
    if diagnosis and diagnosis.get("class") not in (None, "explore"):
        lines.append(f"diagnosis: {diagnosis['class']}: {diagnosis.get('reason', '')}")
    failing: dict[tuple, dict] = {}
    passing: set[tuple[str, str]] = set()
    for check in checks:
        key = (check["shape"], check["dtype"], check["direction"])
        if check.get("passed"):
            passing.add((check["shape"], check["dtype"]))
        elif key not in failing or _badness(check) > _badness(failing[key]):
            failing[key] = check
    ranked = sorted(failing.values(), key=_badness, reverse=True)
    if ranked:
        lines.append(f"failing shapes: {'; '.join(sorted({c['shape'] for c in ranked}))}")
    clean = sorted({f"[{shape}] {dtype}" for shape, dtype in passing} -
                   {f"[{c['shape']}] {c['dtype']}" for c in ranked})
    if clean:
        lines.append(f"passing shapes: {', '.join(clean)}")
    if ranked:
        lines.append(f"failing checks ({len(ranked)}, worst first): shape, dtype, quantity: max abs error, bound, "
                     f"error ratio to the reference, NaN/Inf count, reason")
        for check in ranked[:limit]:
            lines.append(f"- [{check['shape']}] {check['dtype']} {check['direction']}: max_abs "
                         f"{_fmt(check.get('max_abs'))}, bound {_fmt(check.get('bound'))}, err_ratio "
                         f"{_fmt(check.get('err_ratio'))}, nonfinite {check.get('nonfinite') or 0}"
                         + (f", {check['reason']}" if check.get("reason") else ""))
        if len(ranked) > limit:
            lines.append(f"- ... and {len(ranked) - limit} more failing checks")
    return "\n".join(lines)


def history_text(history: list[dict[str, Any]]) -> str:
    return "\n".join(f"- #{h.get('iteration')} {h.get('template')}: {h.get('verdict', '?')}: "
                     f"{str(h.get('message', ''))[:200]}" for h in history)


def fit(sections: list[Section], budget: int) -> str:
    """The sections joined, trimmed to at most ``budget`` characters: lowest ``order`` first, each down to its
    ``keep``; a section's head is kept (its title and first lines say what it is)."""
    def render() -> str:
        return "\n\n".join(f"## {s.title}\n{s.text}" if s.title else s.text for s in sections if s.text)

    text = render()
    for section in sorted(sections, key=lambda s: s.order):
        over = len(text) - budget
        if over <= 0:
            break
        room = len(section.text) - section.keep
        if room <= 0:
            continue
        cut = min(room, over + len(TRIM_MARK) + 8)
        new_len = max(section.keep, len(section.text) - cut)
        section.text = section.text[:new_len] + TRIM_MARK.format(n=len(section.text) - new_len)
        text = render()
    return text[:budget] if len(text) > budget else text


def build_prompt(spec: BlockSpec, *, suites: list[str], dtypes: list[str], shapes: dict[str, list[dict]],
                 start_source: str | None, last: dict[str, Any] | None = None, last_source: str | None = None,
                 diagnosis: dict[str, Any] | None = None, checks: list[dict[str, Any]] | None = None,
                 history: list[dict[str, Any]] | None = None, wanted: str = "", budget: int = 24_000) -> str:
    """The user message for one proposal. ``last``: the attempt just verified (verdict, message), ``last_source``
    its module, ``checks`` its verification checks, ``history`` the attempts before it."""
    sections = [
        Section("Task", contract(spec), keep=10_000, order=9),
        Section("Block spec (the reference module)", spec.reference_source(), keep=1_500, order=2),
        Section("Shapes and tolerance", shapes_text(spec, suites, dtypes, shapes), keep=600, order=3),
    ]
    if start_source:
        sections.append(Section("Starting candidate (rendered from the block's best template)", start_source,
                                keep=0 if last_source else 2_000, order=1 if last_source else 4))
    if history:
        sections.append(Section("Earlier attempts", history_text(history), keep=0, order=0))
    if last is not None:
        if last_source:
            sections.append(Section(f"Your last candidate (#{last.get('iteration')})", last_source, keep=2_000,
                                    order=5))
        sections.append(Section(f"Its verification result (#{last.get('iteration')})",
                                verification_text(last, diagnosis, checks or []), keep=1_200, order=8))
    sections.append(Section("What to do", wanted or "Write the candidate module.", keep=10_000, order=10))
    return fit(sections, budget)


# --- reading the reply ----------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.S | re.M)
_OPEN_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+-]*)[^\n]*\n(.*)\Z", re.S | re.M)
_CODE_START = re.compile(r"^(import |from |BLOCK\s*=|\"\"\"|'''|#|@|def |class )", re.M)
PYTHON_LANGS = ("", "python", "py", "python3")


def _module_defs(code: str) -> tuple[bool, bool] | None:
    """(defines run, defines BLOCK) for code that parses; None when it does not."""
    try:
        found = definitions(syntax.parse(code))
    except (SyntaxError, ValueError):
        return None
    return found.run_args is not None, found.has_block


def _with_block(code: str, block: str, has_block: bool) -> str:
    """The module with ``BLOCK = "<block>"`` added after its imports when the model left it out."""
    if has_block:
        return code
    tree = syntax.parse(code)
    after = 0
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom) or (
                isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and node is tree.body[0]):
            after = node.end_lineno or after
        else:
            break
    lines = code.splitlines()
    return "\n".join([*lines[:after], "", f'BLOCK = "{block}"', *lines[after:]]) + "\n"


def extract_module(reply: str, block: str) -> str | None:
    """The candidate module in a model's reply, or None when there is none (no python block, and no code that
    parses and defines run).

    Looked for in this order, the first place with one winning: fenced blocks labelled python (or unlabeled), other
    fenced blocks, a fence left open at the end of the reply (a reply cut off after the code), the reply itself from
    its first line of code. Within a place, a module that also defines BLOCK beats one that does not, and the last
    beats earlier ones (a model that corrects itself ends with its answer). A module without ``BLOCK`` gets it.
    When nothing parses, the last python block that does not is the module: it becomes a candidate whose verdict is
    compile_error with the SyntaxError (line, message, the line itself), which the next prompt shows the model."""
    if not reply or not reply.strip():
        return None
    matches = list(_FENCE.finditer(reply))
    fenced = [(m.group(2).lower(), textwrap.dedent(m.group(3))) for m in matches]
    rest = reply[matches[-1].end():] if matches else reply
    places = [[code for lang, code in fenced if lang in PYTHON_LANGS],
              [code for lang, code in fenced if lang not in PYTHON_LANGS]]
    open_fence = _OPEN_FENCE.search(rest)
    places.append([textwrap.dedent(open_fence.group(3))] if open_fence else [])
    if not matches:
        start = _CODE_START.search(reply)
        places.append([reply[start.start():]] if start else [])
    for place in places:
        best = None
        for code in place:
            found = _module_defs(code)
            if found is None or not found[0]:
                continue
            if best is None or found[1] >= best[2]:
                best = (found[0], code, found[1])
        if best is not None:
            return _with_block(best[1].strip("\n") + "\n", block, best[2])
    broken = [code for lang, code in fenced if lang in PYTHON_LANGS and _module_defs(code) is None and code.strip()]
    if broken:
        code = broken[-1].strip("\n") + "\n"
        return code if re.search(r"^BLOCK\s*=", code, re.M) else f'BLOCK = "{block}"\n{code}'
    return None
