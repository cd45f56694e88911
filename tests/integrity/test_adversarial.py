"""The verifier refuses each known reward hack with its own named verdict and accepts the correct operators.

Every cheat (tests/integrity/cheats.py) is a correct operator, the rendered rmsnorm row_block or swiglu flat
template, plus the cheat, and runs through the real sandbox on the Triton interpreter. The verdict the verifier must
give is the one harness._verdict ranks first among what the cheat does (integrity verdicts in the order of
INTEGRITY_VERDICTS, all of them above the numerics; the sandbox's timeout / crashed / oom when no result comes back).
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

import pytest
from cheats import BASES, CHEATS, SHOWN_WIDTHS, Cheat, forged_report_source

from workbench.backends import get_backend
from workbench.blocks import get_block
from workbench.verify.harness import default_hidden_shapes, verify_candidate
from workbench.vocabulary import ERROR_VERDICTS, INTEGRITY_VERDICTS

FAST = {"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "base_seed": 0, "targets": []}
"""One smoke pass on the interpreter, no GPU target: compiling every cheat for five targets tests the compilers, not
the integrity checks (the capture cheats name the target they need; tests/verify/test_targets.py compiles)."""


def verify(path: Path, **options):
    return verify_candidate(path, backend=get_backend("interpreter"), **{**FAST, **options})


def write(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "cand.py"
    path.write_text(source)
    return path


def slug(cheat: Cheat) -> str:
    return re.sub(r"[^a-z0-9]+", "-", cheat.name.lower()).strip("-")


def test_the_cheat_table_is_sound():
    """Runs without the interpreter: every cheat is valid Python that differs from its base, names a real verdict,
    and every integrity verdict has at least one cheat."""
    assert len({slug(c) for c in CHEATS}) == len(CHEATS)
    for cheat in CHEATS:
        source = cheat.source()  # every edit found its text exactly once
        ast.parse(source)
        assert source != BASES[cheat.block]()
        assert cheat.verdict in INTEGRITY_VERDICTS + ERROR_VERDICTS, cheat.name
    assert set(INTEGRITY_VERDICTS) - {"forged_report"} <= {c.verdict for c in CHEATS}  # forged: its own test
    # the overfit cheat is only a cheat if the hidden shapes drawn for base seed 0 have widths nobody was shown
    hidden = default_hidden_shapes(get_block("rmsnorm"), random.Random(FAST["base_seed"]))
    assert hidden and all(shape["N"] not in SHOWN_WIDTHS for shape in hidden)


@pytest.mark.interpreter
@pytest.mark.parametrize("cheat", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=c.known_hole))
                                   if c.known_hole else c for c in CHEATS], ids=slug)
def test_cheat_is_refused_with_its_verdict(tmp_path, cheat):
    result = verify(write(tmp_path, cheat.source()), **cheat.options)

    assert result.verdict == cheat.verdict, f"{cheat.name}: got {result.verdict}: {result.message}"
    assert not result.passed
    assert cheat.fragment in result.message, result.message
    if cheat.numbers_pass:  # built to be right: only the integrity check (and its refusal of the call) stops it
        others = [c.line() for c in result.failing() if not c.direction.startswith("integrity:")]
        assert all("refused by the verification sandbox" in line for line in others), others
    if cheat.verdict in INTEGRITY_VERDICTS:  # the message is the reason of the first check of that verdict
        refused = [c for c in result.failing() if c.direction == f"integrity:{cheat.verdict}"]
        assert refused and refused[0].reason == result.message
    else:  # no result came back (timeout, crashed), or every trial died the same way (oom)
        assert all(c.direction == "run" and c.reason.startswith(f"{cheat.verdict}: ") for c in result.checks)
        assert not [c for c in result.checks if c.direction.startswith("integrity:")]


@pytest.mark.interpreter
def test_forged_report_is_not_accepted(tmp_path):
    """A candidate that writes its own report to the result pipe and exits: the report lacks the token that only
    the worker holds (job.pt is gone before the candidate loads), so it is refused as forged."""
    source = forged_report_source()
    ast.parse(source)
    result = verify(write(tmp_path, source))

    assert result.verdict != "pass", f"forged report accepted: {result.message}"
    assert result.verdict == "forged_report", result.message


@pytest.mark.interpreter
@pytest.mark.parametrize("block", sorted(BASES))
def test_correct_operator_is_accepted(tmp_path, block):
    """No false positives: the bases of the cheats pass every check, both dtypes, two seeds, smoke and edge."""
    result = verify(write(tmp_path, BASES[block]()), suites=["smoke", "edge"], dtypes=["float32", "float16"],
                    seeds=2)

    assert result.verdict == "pass", result.message
    assert result.checks and all(c.passed for c in result.checks)
    assert not [c for c in result.checks if c.direction.startswith("integrity:")]
    assert result.message == f"{len(result.checks)} checks passed"
    assert {c.dtype for c in result.checks} == {"float32", "float16"}
