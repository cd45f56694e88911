"""Child process of tests/blocks/template_checks.py ``run_first_point``: one block's template rendered at its first
point and run once on the Triton interpreter at one shape in float32, forward and backward, against the block's
reference in float64. Interpreted kernels live only in processes that set TRITON_INTERPRET before triton is first
imported, so this runs as ``python first_point_child.py DIR BLOCK TEMPLATE SHAPE_JSON`` with TRITON_INTERPRET=1 and
prints {"outputs": {name: rel}, "grads": {name: rel}} (max |a - b| / max |b|) as its last line."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

from workbench.blocks import get_block
from workbench.templating import load_template


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = float(b.abs().max())
    return float((a.double() - b).abs().max()) / (scale or 1.0)


def main(work_dir: str, block: str, template: str, shape_json: str) -> dict:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    spec, t = get_block(block), load_template(block, template)
    path = Path(work_dir) / f"{block}_{template}.py"
    path.write_text(t.render(next(t.points())))
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    candidate = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(candidate)
    inputs = spec.make_inputs(json.loads(shape_json), torch.float32, 0, "cpu")

    def run(fn, dtype):
        args = {k: v.detach().to(dtype).requires_grad_(k in spec.grad_inputs) if isinstance(v, torch.Tensor)
                and v.is_floating_point() else v for k, v in inputs.items()}
        outs = fn(**args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        g = torch.Generator().manual_seed(1)
        ups = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outs]
        torch.autograd.backward(outs, ups)
        return outs, {k: args[k].grad for k in spec.grad_inputs}

    outs, grads = run(candidate.run, torch.float32)
    true_outs, true_grads = run(spec.reference, torch.float64)
    return {"outputs": {name: rel(o, t) for name, o, t in zip(spec.outputs, outs, true_outs, strict=True)},
            "grads": {name: rel(grads[name], true_grads[name]) for name in spec.grad_inputs}}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
