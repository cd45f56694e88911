"""The candidate contract read from the source: the block a file is for, and the one line that says what is wrong
with a module that breaks the contract."""

from __future__ import annotations

import pytest

from workbench.verify.contract import contract_problem, declared_block

GOOD = 'import torch\n\nBLOCK = "rmsnorm"\n\n\ndef run(x, weight, eps):\n    return x\n'


@pytest.mark.parametrize("source, block", [
    (GOOD, "rmsnorm"),
    ('BLOCK: str = "swiglu"\ndef run(a, b):\n    return a\n', "swiglu"),
    ('BLOCK = "kda"\ndef run(q:\n', "kda"),  # does not parse: the BLOCK line still says which block
    ("BLOCK = NAME\n", None),
    ("def run(x):\n    return x\n", None),
])
def test_the_declared_block(source, block):
    assert declared_block(source) == block


@pytest.mark.parametrize("source, problem", [
    (GOOD, None),
    (GOOD.replace("rmsnorm", "swiglu"), "BLOCK is 'swiglu', expected 'rmsnorm'"),
    (GOOD.replace('BLOCK = "rmsnorm"', ""), 'no BLOCK = "rmsnorm" at module level'),
    (GOOD.replace("def run", "def go"), "no module-level function run"),
    (GOOD.replace("weight, eps", "w, eps"), "run(x, w, eps) does not match the reference's signature "
                                            "(x, weight, eps)"),
    (GOOD.replace("return x", "return x)"), "cand.py:7: SyntaxError: unmatched ')': return x)"),
])
def test_a_broken_contract_is_one_line_that_says_what_is_wrong(source, problem):
    assert contract_problem(source, "/tmp/cand.py", "rmsnorm", ("x", "weight", "eps")) == problem
