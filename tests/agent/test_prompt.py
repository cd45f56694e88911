"""The llm proposer's prompt (contents, budget) and the reading of a candidate module out of a model's reply."""

from __future__ import annotations

import ast

import pytest

from workbench.agent.prompt import build_prompt, extract_module, verification_text
from workbench.blocks import get_block

MODULE = '''import torch
import triton

BLOCK = "rmsnorm"


def run(x, weight, eps):
    return x
'''
OTHER = MODULE.replace("return x", "return weight")
NO_BLOCK = MODULE.replace('BLOCK = "rmsnorm"\n', "")


def defines(code: str) -> tuple[str, list[str]]:
    tree = ast.parse(code)
    block = next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "BLOCK")
    return block, [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


@pytest.mark.parametrize("reply", [
    f"Here it is:\n```python\n{MODULE}```\nThis keeps rstd for the backward pass.",
    f"```py\n{MODULE}```",
    f"```\n{MODULE}```",
    f"~~~python\n{MODULE}~~~",
    f"Sure.\n\n  ```python\n  {MODULE.replace(chr(10), chr(10) + '  ')}```\n",  # an indented fence, as in a list
    MODULE,  # bare code
    f"Here is the module.\n\n{MODULE}",  # prose, then code without a fence
    f"The module:\n```python\n{MODULE}",  # a reply cut off before its closing fence
])
def test_the_module_is_found_in_every_reply_shape(reply):
    assert extract_module(reply, "rmsnorm").strip() == MODULE.strip()


def test_of_several_blocks_the_last_complete_module_wins():
    snippet = "```python\nrstd = 1.0 / tl.sqrt(mean + eps)\n```"
    reply = f"First try:\n```python\n{OTHER}```\nThe fix is here:\n{snippet}\nThe whole module:\n```python\n{MODULE}```"
    assert extract_module(reply, "rmsnorm").strip() == MODULE.strip()
    # a later block without BLOCK loses to an earlier complete one; a shell block is never the module
    reply = f"```python\n{MODULE}```\nor shorter:\n```python\n{NO_BLOCK}```\n```bash\npip install triton\n```"
    assert extract_module(reply, "rmsnorm").strip() == MODULE.strip()


def test_a_module_without_block_gets_it_after_its_imports():
    found = extract_module(f"```python\n{NO_BLOCK}```", "rmsnorm")
    assert defines(found) == ("rmsnorm", ["run"])
    assert found.index('BLOCK = "rmsnorm"') > found.index("import triton")


@pytest.mark.parametrize("reply", [
    "",
    "   \n",
    "I cannot help with that.",
    "```python\nrstd = 1.0 / tl.sqrt(mean + eps)\n```",  # code, but no run
    "```bash\necho hi\n```",
])
def test_replies_without_a_module_give_none(reply):
    assert extract_module(reply, "rmsnorm") is None


def failing_checks(n: int) -> list[dict]:
    return [{"shape": f"rows={r},N=4097", "dtype": "float32", "direction": "forward:y", "passed": False,
             "max_abs": 0.5 + r, "bound": 1e-5, "err_ratio": 3e4, "nonfinite": 0, "seed": 0,
             "reason": "max abs err > bound"} for r in range(1, n + 1)]


def test_the_prompt_carries_spec_shapes_start_and_the_last_result():
    spec = get_block("rmsnorm")
    checks = failing_checks(3) + [{"shape": "rows=4,N=64", "dtype": "float32", "direction": "forward:y",
                                   "passed": True, "max_abs": 1e-7, "bound": 1e-5}]
    prompt = build_prompt(spec, suites=["smoke"], dtypes=["float32"], shapes={"smoke": spec.shapes["smoke"]},
                          start_source="# the starting candidate\n" + MODULE,
                          last={"iteration": 1, "verdict": "fail", "message": "3 of 4 checks fail"},
                          last_source=OTHER, diagnosis={"class": "wrong", "reason": "wrong results everywhere"},
                          checks=checks, history=[], wanted="Fix it.")
    assert 'BLOCK = "rmsnorm"' in prompt and "run(x, weight, eps)" in prompt
    assert "def reference(x" in prompt  # the block's module source
    assert "rows=4,N=64" in prompt and "float32: factor 2" in prompt
    assert "# the starting candidate" in prompt and "return weight" in prompt
    assert "verdict: fail" in prompt and "diagnosis: wrong: wrong results everywhere" in prompt
    assert "[rows=3,N=4097] float32 forward:y: max_abs 3.5, bound 1e-05" in prompt  # worst first
    assert prompt.index("- [rows=3,N=4097]") < prompt.index("- [rows=1,N=4097]")
    assert "failing shapes: rows=1,N=4097; rows=2,N=4097; rows=3,N=4097" in prompt
    assert "passing shapes: [rows=4,N=64] float32" in prompt


def test_the_budget_trims_the_least_needed_sections_first():
    spec = get_block("rmsnorm")
    huge = MODULE + "\n".join(f"# padding line {i} " + "x" * 80 for i in range(2000))
    history = [{"iteration": i, "template": "llm", "verdict": "fail", "message": "m" * 150} for i in range(50)]
    prompt = build_prompt(spec, suites=["smoke", "edge"], dtypes=["float32", "float16"],
                          shapes={"smoke": spec.shapes["smoke"], "edge": spec.shapes["edge"]}, start_source=huge,
                          last={"iteration": 51, "verdict": "fail", "message": "every shape fails"},
                          last_source=huge, checks=failing_checks(40), history=history, budget=12_000)
    assert len(prompt) <= 12_000
    assert "characters trimmed" in prompt
    # the task, the verdict and the failing shapes survive; the worst check is listed
    assert "Reply with the complete module" in prompt
    assert "verdict: fail" in prompt and "failing shapes:" in prompt and "[rows=40,N=4097]" in prompt


def test_a_target_compile_error_reaches_the_next_prompt_with_the_compilers_message():
    """The llm proposer's next prompt carries the compiler's first line, the target and the kernel."""
    message = ("sm_90a: swiglu_fwd_kernel: CompilationError: NameError(\"Cannot access global variable ONE from "
               "within @jit'ed function.")
    checks = [{"suite": "target", "shape": "sm_90a", "dtype": "model", "seed": 0, "direction": "target:sm_90a",
               "passed": False, "reason": message.split(": ", 1)[1], "max_abs": None, "bound": None}]
    text = verification_text({"verdict": "target_compile_error", "message": message}, None, checks)
    assert "verdict: target_compile_error" in text and "Cannot access global variable ONE" in text
    assert "sm_90a" in text and "swiglu_fwd_kernel" in text


def test_a_python_block_that_does_not_parse_is_the_module_so_its_syntax_error_is_a_verdict():
    reply = "Here it is:\n```python\nimport triton\n\ndef run(x, weight, eps)\n    return x\n```\n"
    found = extract_module(reply, "rmsnorm")
    assert found == 'BLOCK = "rmsnorm"\nimport triton\n\ndef run(x, weight, eps)\n    return x\n'
    parsing = reply + "\nor rather:\n```python\nimport triton\n\ndef run(x, weight, eps):\n    return x\n```\n"
    assert "def run(x, weight, eps):" in extract_module(parsing, "rmsnorm")  # a module that parses wins
