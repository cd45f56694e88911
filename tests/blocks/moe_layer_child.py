"""Child process of tests/blocks/test_moe_layer.py: the four MoE blocks composed into one routed-expert layer,
each from a candidate rendered from its templates and run on the Triton interpreter, against a plain per-expert loop
in float64. Interpreted kernels live only in processes that set TRITON_INTERPRET before triton is first imported
(the test process may already hold compiled ``tl`` functions), so this runs as ``python moe_layer_child.py DIR
WHICH`` with TRITON_INTERPRET=1 and fails by raising (exit code 1, the assertion in its output)."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import torch

from workbench.blocks.moe_router import make_inputs as router_inputs
from workbench.templating import list_templates

N, D, F, E, K = 12, 32, 32, 6, 2
SCALE = 2.827


def load_candidates(work_dir: Path, which: int) -> dict:
    """Render the `which`-th template (by rank) of each block at its first point and import it."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    modules = {}
    for block in ("moe_router", "moe_permute", "moe_grouped_gemm", "moe_combine"):
        templates = list_templates(block)
        template = templates[which % len(templates)]
        path = work_dir / f"{block}_{template.name}.py"
        path.write_text(template.render(next(template.points())))
        spec = importlib.util.spec_from_file_location(f"layer_{block}_{template.name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[block] = module
    return modules


def loop_reference(x, wr, bias, w1, w3, w2):
    """The layer as a trainer would first write it, in float64: sigmoid routing with the selection bias and
    renormalized, scaled weights, then for each expert its tokens' SwiGLU MLP, weighted and added back."""
    x, wr, w1, w3, w2 = (t.double() for t in (x, wr, w1, w3, w2))
    s = torch.sigmoid(x @ wr.T)
    ids = torch.topk(s.detach() + bias.double(), K, dim=-1).indices
    w = s.gather(-1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * SCALE
    out = torch.zeros_like(x)
    for e in range(E):
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel():
            xe = x[tok]
            h = torch.nn.functional.silu(xe @ w1[e].T) * (xe @ w3[e].T)
            out = out.index_add(0, tok, w[tok, slot][:, None] * (h @ w2[e].T))
    return out, ids


def candidate_layer(mods, x, wr, bias, w1, w3, w2):
    weights, ids, counts = mods["moe_router"].run(x, wr, bias, K, "sigmoid", None, True, SCALE)
    x_perm, _token_of_row, row_of_slot, counts2, offsets = mods["moe_permute"].run(x, ids, E)
    y = mods["moe_grouped_gemm"].run(x_perm, offsets, w1, w3, w2, "swiglu", 4.0, 25.0)
    out = mods["moe_combine"].run(y, weights, row_of_slot)
    return out, ids, counts, counts2


def check_layer(work_dir: Path, which: int) -> None:
    mods = load_candidates(work_dir, which)
    inputs = router_inputs({"N": N, "D": D, "E": E, "k": K, "mode": 0}, torch.float32, seed=11)
    g = torch.Generator().manual_seed(12)
    leaves = {
        "x": inputs["x"],
        "wr": inputs["weight"],
        "w1": torch.randn(E, F, D, generator=g) / math.sqrt(D),
        "w3": torch.randn(E, F, D, generator=g) / math.sqrt(D),
        "w2": torch.randn(E, D, F, generator=g) / math.sqrt(F),
    }
    leaves = {k: v.clone().requires_grad_(True) for k, v in leaves.items()}
    bias = inputs["bias"]
    dout = torch.randn(N, D, generator=g)

    out, ids, counts, counts2 = candidate_layer(mods, leaves["x"], leaves["wr"], bias, leaves["w1"], leaves["w3"],
                                                leaves["w2"])
    ref_leaves = {k: v.detach().double().requires_grad_(True) for k, v in leaves.items()}
    ref_out, ref_ids = loop_reference(ref_leaves["x"], ref_leaves["wr"], bias, ref_leaves["w1"], ref_leaves["w3"],
                                      ref_leaves["w2"])

    assert torch.equal(ids, ref_ids)
    assert torch.equal(counts, counts2) and torch.equal(counts, torch.bincount(ref_ids.flatten(), minlength=E))
    assert out.dtype == torch.float32 and ref_out.abs().max() > 0.1
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-4, atol=1e-5)

    got = torch.autograd.grad(out, list(leaves.values()), dout)
    want = torch.autograd.grad(ref_out, list(ref_leaves.values()), dout.double())
    for name, a, b in zip(leaves, got, want, strict=True):
        assert b.abs().max() > 0, name  # every parameter really gets a gradient through the layer
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"grad {n}: {m}")


if __name__ == "__main__":
    check_layer(Path(sys.argv[1]), int(sys.argv[2]))
    print("layer ok")
