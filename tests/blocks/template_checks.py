"""Checks every block's templates share: each parameter choice renders to a readable, compilable candidate."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from workbench.blocks import get_block
from workbench.templating import list_templates


def one_change_points(t) -> list[dict]:
    """The template's first point and every valid point that changes one parameter of it: each choice renders once."""
    points = list(t.points())
    first = points[0]
    return [first] + [p for p in points if sum(p[k] != first[k] for k in p) == 1]


def assert_templates_render_each_choice(block: str) -> None:
    """At least two templates with summary and trade-offs; every one-change point renders to Python that compiles,
    names the block, has run(<the reference's parameters>), kernels named <block>_*_kernel (jit helpers _*
    aside), and no Jinja left."""
    spec = get_block(block)
    templates = list_templates(block)
    assert len(templates) >= 2
    for t in templates:
        assert t.summary and t.tradeoffs, t.ref
        for point in one_change_points(t):
            source = t.render(point)
            compile(source, f"{t.name}.py", "exec")
            assert f'BLOCK = "{block}"' in source
            run = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "run")
            assert tuple(a.arg for a in run.args.args) == spec.arg_names, t.ref  # the reference's (defaults alike)
            kernels = re.findall(r"@triton\.jit\ndef ([^_\W]\w*)\(", source)  # jit helpers (_name) aside
            assert kernels and all(re.fullmatch(rf"{block}_\w+_kernel", k) for k in kernels), kernels
            assert "{{" not in source and "{%" not in source


def verify_first_point(tmp_path, block: str, template: str, base_seed: int, forward_only: bool = False,
                       suites: list[str] | None = None, dtypes: list[str] | None = None):
    """The template's first point rendered to tmp_path and fully verified through the sandbox on the Triton
    interpreter (one seed; the outputs only when forward_only; ``suites``, else smoke and edge; ``dtypes``, else the
    block's); the VerificationResult."""
    from workbench.backends import get_backend
    from workbench.templating import load_template
    from workbench.verify.harness import verify_candidate

    t = load_template(block, template)
    path = tmp_path / f"{block}_{template}.py"
    path.write_text(t.render(next(t.points())))
    return verify_candidate(path, backend=get_backend("interpreter"), seeds=1, base_seed=base_seed,
                            forward_only=forward_only, suites=suites, dtypes=dtypes)


UNPROMOTED = ["float32"]
"""The dtypes a template the port does not promote is verified at in the suite: its numerics and its builds for the
targets (the interpreter's float16 doubles a verification's time; the promoted template holds the block's dtypes,
and a port that picks this one verifies it at every dtype)."""


def numeric_directions(result) -> set[str]:
    return {c.direction for c in result.checks if c.suite != "integrity"}


def run_first_point(tmp_path, block: str, template: str, shape: dict) -> dict:
    """The template's first point run once on the Triton interpreter (a child process, first_point_child.py) at
    ``shape`` in float32, forward and backward: {"outputs": {name: rel}, "grads": {name: rel}} against the float64
    reference. A light check of a template the port does not promote, where a full verification takes a minute."""
    child = Path(__file__).with_name("first_point_child.py")
    done = subprocess.run([sys.executable, str(child), str(tmp_path), block, template, json.dumps(shape)],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
