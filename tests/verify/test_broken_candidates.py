"""verify_candidate rejects each kind of broken rmsnorm candidate with its own verdict, accepts a correct one.

The numerically broken candidates are the rendered row_block template with one line of text changed, so each
test changes one thing. The other broken candidates are minimal files. All of them run through the real
sandbox on the Triton interpreter.

Every verification runs three kinds of trial: the suite trials (smoke + edge: SHAPES), hidden trials on shapes
drawn from the base seed at verification time (Check.suite "hidden": HIDDEN) and the first trial of the dtype run
again (Check.suite "repeat": REPEATED). A failed integrity check is one more row, with suite "integrity", and its
verdict outranks the numerics. Exact sets and counts of the suite checks are asserted over the smoke and edge
rows only; what the hidden, repeat and integrity rows must show is asserted apart.
"""

from __future__ import annotations

import functools
import random
import re
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from workbench.backends import get_backend
from workbench.blocks import get_block
from workbench.blocks.base import shape_label
from workbench.errors import NotACandidateError
from workbench.templating import load_template
from workbench.verify import warm
from workbench.verify.harness import HIDDEN_SHAPES, default_hidden_shapes, read_candidate, verify_candidate
from workbench.verify.result import Check

SUITES = ["smoke", "edge"]
FAST = {"suites": SUITES, "seeds": 1, "dtypes": ["float32"], "base_seed": 0}
SPEC = get_block("rmsnorm")
SHAPES = [shape for suite in SUITES for shape in SPEC.shapes[suite]]
LABELS = [shape_label(shape) for shape in SHAPES]
DIRECTIONS = ["forward:y", "grad:x", "grad:weight"]
# What the verifier draws for FAST's base seed (rmsnorm has no draw of its own: test_hidden_shapes_are_unseen_draws)
HIDDEN = default_hidden_shapes(SPEC, random.Random(FAST["base_seed"]))
HIDDEN_LABELS = [shape_label(shape) for shape in HIDDEN]
REPEATED = [LABELS[0]]  # the first trial of the one dtype, run again on the same inputs
# (suite, shape) of every trial in the order the checks come back; one dtype and one seed: one trial per shape
TRIAL_ROWS = ([(suite, shape_label(shape)) for suite in SUITES for shape in SPEC.shapes[suite]]
              + [("hidden", label) for label in HIDDEN_LABELS] + [("repeat", label) for label in REPEATED])
TRIALS = len(TRIAL_ROWS)
TOTAL = TRIALS * len(DIRECTIONS)  # the numeric checks of a candidate whose every trial ran
# The timeout also covers the worker's start: a fork of the warm worker (whose server starts before, outside the
# timeout), or with WORKBENCH_WARM=0 a cold child importing torch and triton (10-20 s on a loaded machine): the
# candidate must get to run before it is killed.
HANG_TIMEOUT_S = 10 if warm.enabled() else 30


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


def checks(result, *suites: str) -> list[Check]:
    """The checks of these suites ("smoke", "edge", "hidden", "repeat", "integrity")."""
    return [c for c in result.checks if c.suite in suites]


def failing(result, suites=SUITES) -> set[tuple[str, str]]:
    """(direction, shape) of the failed checks of these suites; by default the smoke and edge suite checks."""
    return {(c.direction, c.shape) for c in result.failing() if c.suite in suites}


def grid(directions, labels=LABELS) -> set[tuple[str, str]]:
    return {(d, label) for d in directions for label in labels}


def wide(shapes) -> list[str]:
    """Labels of the shapes whose rows are wider than BLOCK_N=64."""
    return [shape_label(s) for s in shapes if s["N"] > 64]


def narrow(shapes) -> list[str]:
    return [shape_label(s) for s in shapes if s["N"] <= 64]


def test_hidden_shapes_are_unseen_draws():
    """rmsnorm uses the default draw: HIDDEN_SHAPES shapes from the base seed, each dim between its smallest and
    largest smoke/edge value; the same seed draws the same shapes, another seed others."""
    assert SPEC.hidden_shapes is None
    assert len(HIDDEN) == HIDDEN_SHAPES
    for shape in HIDDEN:
        assert list(shape) == list(SHAPES[0])
        for dim, value in shape.items():
            assert min(s[dim] for s in SHAPES) <= value <= max(s[dim] for s in SHAPES), shape
    assert default_hidden_shapes(SPEC, random.Random(FAST["base_seed"])) == HIDDEN
    assert default_hidden_shapes(SPEC, random.Random(FAST["base_seed"] + 1)) != HIDDEN
    # test_tail_beyond_block_n... relies on both sides of N=64 among the suite shapes, and on wide hidden shapes
    assert wide(SHAPES) and narrow(SHAPES) and wide(HIDDEN)


# --- a correct candidate ------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_correct_candidate_passes_with_figures_on_every_check(tmp_path):
    path = write(tmp_path, rendered(8192))
    assert read_candidate(path) == ("rmsnorm", rendered(8192))

    result = verify(path)

    assert result.verdict == "pass", result.message
    assert result.passed
    assert result.base_seed == FAST["base_seed"]
    assert result.message == f"{TOTAL} checks passed"
    # every trial (suite shapes, the hidden shapes drawn from the base seed, the repeat) checked in every
    # direction, in trial order; no integrity row
    assert [(c.suite, c.shape, c.direction) for c in result.checks] == [
        (suite, shape, d) for suite, shape in TRIAL_ROWS for d in DIRECTIONS]
    first = {c.direction: c for c in checks(result, *SUITES) if c.shape == REPEATED[0]}
    assert [c.seed for c in checks(result, "repeat")] == [first[d].seed for d in DIRECTIONS]  # the same inputs
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
    assert failing(result) == grid(broken)  # every suite shape, nothing else
    assert failing(result, ["hidden"]) == grid(broken, HIDDEN_LABELS)  # the hidden shapes fail the same way
    assert failing(result, ["repeat"]) == grid(broken, REPEATED)
    assert checks(result, "integrity") == []  # wrong, not cheating: no integrity verdict outranks "fail"
    assert len(result.checks) == TOTAL
    assert result.message.startswith(f"{len(broken) * TRIALS} of {TOTAL} checks failed; worst ")
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
    assert failing(result, ["hidden"]) == grid([broken], HIDDEN_LABELS)
    assert failing(result, ["repeat"]) == grid([broken], REPEATED)
    assert checks(result, "integrity") == []
    assert all(c.passed for c in result.checks if c.direction.startswith("forward:"))
    assert len(result.checks) == TOTAL
    expected = f"{TRIALS} of {TOTAL} checks failed; worst {broken} "
    assert result.message.startswith(expected), result.message
    for check in result.failing():
        assert check.reason.startswith("max abs err "), check.line()


@pytest.mark.interpreter
def test_tail_beyond_block_n_is_an_unwritten_output_on_exactly_the_wide_shapes(tmp_path):
    """A host that launches BLOCK_N=64 whatever the width (the template's own host code picks each row's block and
    refuses rows wider than BLOCK_N): the block covers only the first 64 columns, a wider row gets a partial sum,
    and the columns of y and dx past 64 are never written. They still hold the worker's poison, so the verdict
    names the unwritten outputs."""
    source = rendered(64).replace("block, warps = row_launch(n)", "block, warps = BLOCK_N, NUM_WARPS")
    assert source.count("block, warps = BLOCK_N, NUM_WARPS") == 2  # forward and backward
    result = verify(write(tmp_path, source))

    assert wide(SHAPES) and narrow(SHAPES)  # the suites still test both sides of the edge
    # y ("output 0") and dx ("grad of x") of every wide trial, in trial order, keep rows * (N - 64) poisoned
    # elements; dw is summed on the host from a zeroed buffer (wrong, but written)
    unwritten = [f"{name} [{shape_label(s)}] float32: {s['rows'] * (s['N'] - 64)} elements"
                 for s in SHAPES + HIDDEN if s["N"] > 64 for name in ("output 0", "grad of x")]
    message = f"poisoned buffers returned unwritten: {'; '.join(unwritten[:3])}"
    assert result.verdict == "unwritten_output", result.message
    assert result.message == message
    assert [(c.shape, c.direction, c.reason) for c in checks(result, "integrity")] == [
        ("-", "integrity:unwritten_output", message)]  # the one integrity row, and the only integrity failure

    # the numerics: every check of a wide suite shape fails, every check of a narrow one passes
    assert failing(result) == grid(DIRECTIONS, wide(SHAPES))
    assert {(c.direction, c.shape) for c in checks(result, *SUITES) if c.passed} == grid(DIRECTIONS, narrow(SHAPES))
    # likewise the hidden shapes, and the repeated trial (N=64) passes
    assert failing(result, ["hidden"]) == grid(DIRECTIONS, wide(HIDDEN))
    assert all(c.passed for c in checks(result, "hidden") if c.shape in narrow(HIDDEN))
    assert REPEATED[0] in narrow(SHAPES)
    assert [(c.direction, c.passed) for c in checks(result, "repeat")] == [(d, True) for d in DIRECTIONS]
    assert len(result.checks) == TOTAL + 1
    # the poisoned elements read as NaN where the reference is finite: exactly those, in y and dx
    sizes = {shape_label(s): s["rows"] * (s["N"] - 64) for s in SHAPES + HIDDEN if s["N"] > 64}
    for check in checks(result, *SUITES, "hidden"):
        if check.shape in sizes and check.direction in ("forward:y", "grad:x"):
            assert check.nonfinite == sizes[check.shape], check.line()
            assert check.reason == f"{sizes[check.shape]} NaN/Inf where the reference is finite", check.line()
        elif check.shape in sizes:  # dw: finite, wrong (a partial rstd, and zero past column 64)
            assert check.nonfinite == 0 and check.reason.startswith("max abs err "), check.line()


# --- errors that are not numerics: each has its own verdict -------------------------------------------------


@pytest.mark.interpreter
def test_non_power_of_two_arange_is_a_compile_error(tmp_path):
    source = mutate(rendered(8192), "cols = tl.arange(0, BLOCK_N)", "cols = tl.arange(0, 100)")
    result = verify(write(tmp_path, source, "arange.py"))

    assert result.verdict == "compile_error", result.message
    # Which line of the file it names is not pinned here: see the report on classify()'s frame order.
    assert re.fullmatch(r"arange\.py:\d+: ValueError: arange's range must be a power of 2 "
                        rf"\({TRIALS} of the trials; first at \[{re.escape(LABELS[0])}\] float32\)",
                        result.message), result.message
    # one "run" row per trial (suite, hidden and repeat alike), nothing else: no numerics, no integrity row
    assert [(c.suite, c.shape, c.direction) for c in result.checks] == [(*row, "run") for row in TRIAL_ROWS]
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
    assert result.message == (f"cand.py:{line}: IndexError: too many indices for tensor of dimension 2 "
                              f"({TRIALS} of the trials; first at [{LABELS[0]}] float32)"), result.message
    assert [(c.suite, c.shape, c.direction) for c in result.checks] == [(*row, "run") for row in TRIAL_ROWS]
    assert all(c.reason == f"runtime_error: cand.py:{line}: IndexError: too many indices for tensor of dimension 2"
               for c in result.checks)


@pytest.mark.interpreter
def test_hang_is_a_timeout_and_the_process_is_killed(tmp_path):
    """The candidate says where it runs (its job folder, on its output: it may not write outside its scratch
    folder), then spins; at the timeout no process of that job is left, in or out of the sandbox's namespaces."""
    source = minimal("""
        import os
        print("started in", os.getcwd(), flush=True)
        while True:
            pass
    """)
    result = verify(write(tmp_path, source), timeout_s=HANG_TIMEOUT_S)

    assert result.verdict == "timeout", result.message
    assert result.message == f"no result within {HANG_TIMEOUT_S} s"
    assert result.checks == []
    assert HANG_TIMEOUT_S <= result.seconds < HANG_TIMEOUT_S + 120  # + building the trials, on a loaded machine
    started = [line for line in result.output_tail.splitlines() if line.startswith("started in ")]
    assert started, result.output_tail  # the candidate really ran, then was killed
    job_dir = started[0].removeprefix("started in ")
    assert job_dir.startswith(tempfile.gettempdir())
    server = warm.warm_server("verify", get_backend("interpreter").env) if warm.enabled() else None
    deadline = time.monotonic() + 5
    while server is not None and server.job_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server is None or server.job_pids() == []  # the warm worker's: keeper, first process, candidate
    alive = []  # a cold child's: its command line names the job folder
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and job_dir.encode() in (proc / "cmdline").read_bytes():
                alive.append(proc.name)
        except OSError:  # gone while we looked
            continue
    assert alive == []


CRASHES = {
    "os._exit(3)": ("import os\nos._exit(3)\n", "candidate process exited with code 3 without a result"),
    # Not ctypes.string_at(0): the sandbox refuses ctypes calls (verdict forbidden_call) before they can crash.
    "segfault": ("import faulthandler\nfaulthandler._sigsegv()\n", "candidate process killed by SIGSEGV"),
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
