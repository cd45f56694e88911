"""verify_candidate rejects each kind of broken rmsnorm candidate with its own verdict, accepts a correct one.

The numerically broken candidates are the rendered row_block template with one line of text changed, so each
test changes one thing. The other broken candidates are minimal files. All of them run through the real
sandbox on the Triton interpreter.
"""

from __future__ import annotations

import functools
import os
import re
import textwrap
from pathlib import Path

import pytest

from workbench.backends import get_backend
from workbench.blocks import get_block
from workbench.blocks.base import shape_label
from workbench.errors import NotACandidateError
from workbench.templating import load_template
from workbench.verify.harness import read_candidate, verify_candidate

SUITES = ["smoke", "edge"]
FAST = {"suites": SUITES, "seeds": 1, "dtypes": ["float32"], "base_seed": 0}
SPEC = get_block("rmsnorm")
SHAPES = [shape for suite in SUITES for shape in SPEC.shapes[suite]]
LABELS = [shape_label(shape) for shape in SHAPES]
DIRECTIONS = ["forward:y", "grad:x", "grad:weight"]


@functools.cache
def rendered(block_n: int) -> str:
    """The row_block template at its most preferred point with this BLOCK_N."""
    template = load_template("rmsnorm", "row_block")
    point = next(p for p in template.points() if p["BLOCK_N"] == block_n)
    return template.render(point)


def mutate(source: str, old: str, new: str) -> str:
    """Replace the first occurrence of ``old``. If the template stops containing it, fail here: going on would
    quietly verify the correct candidate."""
    assert old in source, f"the template no longer contains {old!r}; update this test's mutation"
    return source.replace(old, new, 1)


def write(tmp_path: Path, source: str, name: str = "cand.py") -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def verify(path: Path, **overrides):
    return verify_candidate(path, backend=get_backend("interpreter"), **{**FAST, **overrides})


def minimal(body: str) -> str:
    """A candidate for rmsnorm whose ``run`` is ``body``."""
    header = 'BLOCK = "rmsnorm"\n\n\ndef run(x, weight, eps):\n'
    return header + textwrap.indent(textwrap.dedent(body), "    ")


def failing(result) -> set[tuple[str, str]]:
    return {(c.direction, c.shape) for c in result.failing()}


def grid(directions, labels=LABELS) -> set[tuple[str, str]]:
    return {(d, label) for d in directions for label in labels}


# --- a correct candidate ------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_correct_candidate_passes_with_figures_on_every_check(tmp_path):
    path = write(tmp_path, rendered(8192))
    assert read_candidate(path) == ("rmsnorm", rendered(8192))

    result = verify(path)

    assert result.verdict == "pass", result.message
    assert result.passed
    assert result.message == f"{len(SHAPES) * len(DIRECTIONS)} checks passed"
    assert {(c.direction, c.shape) for c in result.checks} == grid(DIRECTIONS)
    for check in result.checks:
        assert check.passed, check.line()
        assert check.max_abs is not None and check.bound is not None, check.line()
        assert check.max_abs <= check.bound, check.line()
        assert check.nonfinite == 0
    assert result.worst_ratio() < 1


# --- wrong numerics: verdict "fail", and exactly the affected checks fail -----------------------------------

WRONG_MATH = {
    # y = x * rstd: the weight is forgotten. The backward kernel is unchanged, so the gradients stay right.
    "forgets the weight": ("(x * rstd * w).to(Y.dtype.element_ty)", "(x * rstd).to(Y.dtype.element_ty)",
                           ["forward:y"]),
    # rstd = 1 / (mean(x^2) + eps), without the sqrt. The backward kernel reuses the saved rstd: wrong too.
    "drops the sqrt": ("rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)",
                       "rstd = 1.0 / (tl.sum(x * x, axis=0) / N + eps)", DIRECTIONS),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", list(WRONG_MATH))
def test_wrong_forward_math_fails_the_forward_checks(tmp_path, case):
    old, new, broken = WRONG_MATH[case]
    result = verify(write(tmp_path, mutate(rendered(8192), old, new)))

    assert result.verdict == "fail", result.message
    assert failing(result) == grid(broken)  # every shape, nothing else
    total = len(SHAPES) * len(DIRECTIONS)
    assert result.message.startswith(f"{len(grid(broken))} of {total} checks failed; worst ")
    for check in result.failing():
        assert check.reason.startswith("max abs err "), check.line()
        assert check.max_abs > check.bound


WRONG_GRADIENT = {
    "dx lacks the - xhat * c term": ("((wdy - xhat * c) * rstd)", "(wdy * rstd)", "grad:x"),
    "dw scaled by 0.5": ("dw += dy * xhat", "dw += 0.5 * dy * xhat", "grad:weight"),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", list(WRONG_GRADIENT))
def test_wrong_gradient_fails_only_that_gradient(tmp_path, case):
    old, new, broken = WRONG_GRADIENT[case]
    result = verify(write(tmp_path, mutate(rendered(8192), old, new)))

    assert result.verdict == "fail", result.message
    assert failing(result) == grid([broken])
    assert all(c.passed for c in result.checks if c.direction.startswith("forward:"))
    total = len(SHAPES) * len(DIRECTIONS)
    expected = f"{len(SHAPES)} of {total} checks failed; worst {broken} "
    assert result.message.startswith(expected), result.message


@pytest.mark.interpreter
def test_tail_beyond_block_n_fails_exactly_the_wide_shapes(tmp_path):
    """BLOCK_N=64 covers only the first 64 columns: a wider row gets a partial sum and an unwritten tail."""
    result = verify(write(tmp_path, rendered(64)))

    wide = [shape_label(s) for s in SHAPES if s["N"] > 64]
    narrow = [shape_label(s) for s in SHAPES if s["N"] <= 64]
    assert wide and narrow  # the suites still test both sides of the edge
    assert result.verdict == "fail", result.message
    assert {c.shape for c in result.failing()} == set(wide)
    assert grid(["forward:y"], wide) <= failing(result)  # the output itself is wrong on every wide row
    assert all(c.passed for c in result.checks if c.shape in narrow)
    assert {c.shape for c in result.checks if c.passed} >= set(narrow)


# --- errors that are not numerics: each has its own verdict -------------------------------------------------


@pytest.mark.interpreter
def test_non_power_of_two_arange_is_a_compile_error(tmp_path):
    source = mutate(rendered(8192), "cols = tl.arange(0, BLOCK_N)", "cols = tl.arange(0, 100)")
    result = verify(write(tmp_path, source, "arange.py"))

    assert result.verdict == "compile_error", result.message
    # Which line of the file it names is not pinned here: see the report on classify()'s frame order.
    assert re.fullmatch(r"arange\.py:\d+: ValueError: arange's range must be a power of 2 "
                        rf"\({len(SHAPES)} of the trials; first at \[{re.escape(LABELS[0])}\] float32\)",
                        result.message), result.message
    assert [c.direction for c in result.checks] == ["run"] * len(SHAPES)
    assert all(c.reason.startswith("compile_error: arange.py:") for c in result.checks)


@pytest.mark.interpreter
def test_python_syntax_error_is_a_compile_error_with_a_one_line_message(tmp_path):
    source = minimal("return x\n").replace("def run(x, weight, eps):", "def run(x, weight, eps)")
    path = write(tmp_path, source)
    assert read_candidate(path)[0] == "rmsnorm"  # still recognised as a candidate for rmsnorm

    result = verify(path)

    assert result.verdict == "compile_error", result.message
    assert "\n" not in result.message
    assert result.message.startswith("SyntaxError: ")
    assert "cand.py, line 4" in result.message
    assert result.checks == []  # nothing ran


@pytest.mark.interpreter
def test_exception_in_host_code_is_a_runtime_error(tmp_path):
    source = mutate(rendered(8192), "y = torch.empty_like(x2)", "y = torch.empty_like(x2[:, :, 0])")
    line = source.splitlines().index("        y = torch.empty_like(x2[:, :, 0])") + 1
    result = verify(write(tmp_path, source))

    assert result.verdict == "runtime_error", result.message
    assert result.message.startswith(f"cand.py:{line}: IndexError: too many indices for tensor of "
                                     f"dimension 2 ({len(SHAPES)} of the trials;"), result.message
    assert [c.direction for c in result.checks] == ["run"] * len(SHAPES)
    assert all(c.reason.startswith("runtime_error: ") for c in result.checks)


@pytest.mark.interpreter
def test_hang_is_a_timeout_and_the_process_is_killed(tmp_path):
    pid_file = tmp_path / "pid"
    source = minimal(f"""
        import os
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        while True:
            pass
    """)
    result = verify(write(tmp_path, source), timeout_s=8)

    assert result.verdict == "timeout", result.message
    assert result.message == "no result within 8 s"
    assert result.checks == []
    assert 8 <= result.seconds < 60
    pid = int(pid_file.read_text())  # the candidate really ran, then was killed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


CRASHES = {
    "os._exit(3)": ("import os\nos._exit(3)\n", "candidate process exited with code 3 without a result"),
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "candidate process killed by SIGSEGV"),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("case", list(CRASHES))
def test_process_death_is_crashed(tmp_path, case):
    body, message = CRASHES[case]
    result = verify(write(tmp_path, minimal(body)))

    assert result.verdict == "crashed", result.message
    assert result.message == message
    assert result.checks == []


# --- files that are no candidate at all: a user error, raised before anything runs --------------------------

NOT_CANDIDATES = {
    "missing file": (None, "missing.py", "no such file"),
    "not a .py file": ('BLOCK = "rmsnorm"\n', "cand.txt", "a candidate is a Python file (.py)"),
    "no BLOCK": ("def run(x, weight, eps):\n    return x\n", "cand.py", "not a candidate (no BLOCK"),
}


@pytest.mark.parametrize("case", list(NOT_CANDIDATES))
def test_not_a_candidate(tmp_path, case):
    source, name, message = NOT_CANDIDATES[case]
    path = tmp_path / name
    if source is not None:
        path.write_text(source)

    with pytest.raises(NotACandidateError) as info:
        read_candidate(path)
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)

    with pytest.raises(NotACandidateError, match=re.escape(message)):
        verify(path)
