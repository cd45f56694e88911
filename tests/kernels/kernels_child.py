"""Child process of tests/kernels/test_kernels.py: the kernels library's ops run the repository's promoted operators on
the Triton interpreter, which must be selected before triton is first imported, so each check runs here as
``TRITON_INTERPRET=1 python kernels_child.py CHECK`` and prints one JSON line of figures for the test to assert on.

    fake     every block's op and backward op on its first smoke shape, real and fake: shapes and dtypes
    equal    op forward and gradients against the operator's own run (rmsnorm, situ, both loss blocks, kda)
    opcheck  torch.library.opcheck (schema, autograd registration, fake tensors, AOT dispatch with dynamic shapes)
    compile  torch.compile(fullgraph=True) of RMSNorm, SiTUMLP and LinearCrossEntropyLoss against eager
    launches Triton launches of forward and backward through the op, the operator's run and the backward op
    kept     what the eager forward keeps for its backward, and when it is let go (no_grad, backward, in place)
    bf16     bfloat16 on the interpreter: refused in one line where a kernel's tl.dot gets bfloat16, right elsewhere
    in_place a cache updated in place through its op (kda_decode): the argument itself comes back, updated
    heads    softmax attention at the head sizes the families use (64, 80, 96, 128, 192, 256): forward and every
             gradient against the float64 reference
    steep    kda at Qwen3-Next's decay rates: the decay-rate gradient against the float64 reference
    clamped  GLM-5-Next's MLP with its swiglu_limit as patched (swiglu's clamped variant) against the shipped module,
             on inputs where the clamp acts: output and input gradient, and the share of values past the limit
    strided  rotary on q's rope part as the MLA forward hands it over (a [B, H, T, R] tensor seen as [B, T, H, R]):
             forward and gradient against the float64 reference, interleaved and rotate-half
    kv_halves attention_prefill and attention_decode on vLLM's KV cache as its attention layer holds it (keys and
             values the halves of one [PAGES, HKV, PAGE, 2 D] tensor, seen as [PAGES, PAGE, HKV, D]): output and
             both caches against the reference, and whether the writes landed in that tensor
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import workbench.kernels as wk
from workbench.blocks import get_block

OPERATORS = Path(__file__).resolve().parents[2] / "operators"
OPCHECK_BLOCKS = ("rmsnorm", "situ", "vocab_blockwise_ce", "moe_router", "kda", "kda_decode")


def _tensors(outputs) -> list[torch.Tensor]:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _meta(tensors) -> list[list]:
    return [[list(t.shape), str(t.dtype)] for t in tensors]


def _inputs(block: str, dtype: torch.dtype = torch.float32) -> dict:
    spec = get_block(block)
    return spec.make_inputs(spec.shapes["smoke"][0], dtype, 0, "cpu")


def _grads_like(outputs: list[torch.Tensor], seed: int) -> list[torch.Tensor | None]:
    """A fixed random upstream gradient per floating output, None for the discrete ones."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g).to(o.dtype) if o.is_floating_point() else None for o in outputs]


def check_fake() -> dict:
    """{block: {"real": [[shape, dtype]...], "fake": ..., "real_grads": ..., "fake_grads": ...}}."""
    found = {}
    for block, op in wk.OPS.items():
        args = list(_inputs(block).values())
        real = _tensors(op(*args))
        grads = _grads_like(real, 0)
        needs = [True] * len(op.spec.grad_inputs)
        backward = op.backward_op or (lambda *_: [])  # a block without gradients has no backward op
        real_grads = backward(grads, needs, *args)
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake_grads_in = [mode.from_tensor(g) if g is not None else None for g in grads]
            fake = _tensors(op(*fake_args))
            fake_grads = backward(fake_grads_in, needs, *fake_args)
        found[block] = {"real": _meta(real), "fake": _meta(fake), "real_grads": _meta(real_grads),
                        "fake_grads": _meta(fake_grads)}
    return found


def check_equal() -> dict:
    """{block: {"forward": [max |op - run| per output], "grads": {input: max |op - run|}, "bitwise": bool}}."""
    found = {}
    for block in ("rmsnorm", "situ", "vocab_blockwise_ce", "seq_chunked_ce", "kda"):
        op, spec = wk.OPS[block], get_block(block)
        results = {}
        for via in ("op", "run"):
            args = {k: v.detach().clone().requires_grad_(k in spec.grad_inputs and v.is_floating_point())
                    if isinstance(v, torch.Tensor) else v for k, v in _inputs(block).items()}
            outputs = _tensors((op if via == "op" else op.operator().run)(*args.values()))
            pairs = [(o, g) for o, g in zip(outputs, _grads_like(outputs, 1), strict=True) if g is not None]
            leaves = {k: v for k, v in args.items() if isinstance(v, torch.Tensor) and v.requires_grad}
            grads = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs])
            results[via] = ([o.detach() for o in outputs], dict(zip(leaves, grads, strict=True)))
        (out_op, grads_op), (out_run, grads_run) = results["op"], results["run"]
        found[block] = {
            "forward": [float((a.double() - b.double()).abs().max()) for a, b in zip(out_op, out_run, strict=True)],
            "grads": {k: float((grads_op[k].double() - grads_run[k].double()).abs().max()) for k in grads_run},
            "bitwise": all(torch.equal(a, b) for a, b in zip(out_op, out_run, strict=True))
            and all(torch.equal(grads_op[k], grads_run[k]) for k in grads_run),
            "operator": Path(op.operator_path()).name}
    return found


def check_opcheck() -> dict:
    """{block: {test: "SUCCESS" | why}} of torch.library.opcheck on the first smoke shape, gradients requested."""
    found = {}
    for block in OPCHECK_BLOCKS:
        spec = get_block(block)
        args = [v.requires_grad_(k in spec.grad_inputs) if isinstance(v, torch.Tensor) else v
                for k, v in _inputs(block).items()]
        found[block] = {test: str(result) for test, result in
                        torch.library.opcheck(wk.OPS[block].op.default, tuple(args), raise_exception=False).items()}
    return found


def _compare_compiled(layer: torch.nn.Module, inputs: list[torch.Tensor], backend: str) -> dict:
    """Eager and compiled runs of ``layer`` on the same inputs: max |difference| of the output and of every
    gradient (inputs and parameters), and whether all are bitwise equal."""
    runs = []
    for fn in (layer, torch.compile(layer, fullgraph=True, backend=backend)):
        xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        layer.zero_grad(set_to_none=True)
        out = fn(*xs)
        out.backward(torch.ones_like(out))
        grads = [x.grad for x in xs if x.is_floating_point()] + [p.grad for p in layer.parameters()]
        runs.append([out.detach(), *grads])
    diffs = [float((a.double() - b.double()).abs().max()) for a, b in zip(*runs, strict=True)]
    return {"diffs": diffs, "bitwise": all(torch.equal(a, b) for a, b in zip(*runs, strict=True))}


def check_compile() -> dict:
    """{"<layer>": {"diffs", "bitwise"}, "graph_breaks": n} with inductor (C++ on CPU)."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 64, generator=g)
    hidden, weight = torch.randn(3, 5, 32, generator=g), torch.randn(64, 32, generator=g) / 32 ** 0.5
    target = torch.randint(0, 64, (3, 5), generator=g)
    target[0, 0] = -100
    found = {
        "RMSNorm": _compare_compiled(wk.RMSNorm(64, eps=1e-6), [x], "inductor"),
        "SiTUMLP": _compare_compiled(wk.SiTUMLP(64, 32), [x], "inductor"),
        "LinearCrossEntropyLoss": _compare_compiled(wk.LinearCrossEntropyLoss(), [hidden, weight, target],
                                                    "inductor"),
    }
    found["graph_breaks"] = sum(counters["graph_break"].values())
    return found


LAUNCH_BLOCKS = ("rmsnorm", "kda", "mla")


def count_launches() -> list[int]:
    """Count every Triton launch from now on (``count[0]``): the interpreter's launch entry wrapped, as the
    verifier's Launches.watch (workbench/verify/worker.py) wraps ``cls.run``."""
    from triton.runtime import interpreter

    count = [0]
    original = interpreter.InterpretedFunction.run

    def run(kernel, *args, **kwargs):
        count[0] += 1
        return original(kernel, *args, **kwargs)

    interpreter.InterpretedFunction.run = run
    return count


def _leaf_args(block: str, dtype: torch.dtype = torch.float32) -> list:
    spec = get_block(block)
    return [v.requires_grad_(k in spec.grad_inputs and v.is_floating_point()) if isinstance(v, torch.Tensor) else v
            for k, v in _inputs(block, dtype).items()]


def _forward_backward(fn, args: list, count: list[int]) -> dict:
    """Launches of ``fn(*args)`` and of the gradients of its outputs (fixed upstream gradients) for the grad inputs;
    the outputs and gradients themselves."""
    count[0] = 0
    outputs = _tensors(fn(*args))
    forward = count[0]
    pairs = [(o, g) for o, g in zip(outputs, _grads_like(outputs, 1), strict=True) if g is not None]
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    count[0] = 0
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs])
    return {"forward": forward, "backward": count[0], "values": [o.detach() for o in outputs] + list(grads)}


def check_launches() -> dict:
    """{block: {"op": [forward, backward], "run": [...], "backward_op": n, "bitwise": bool}}: launches through the
    library op (eager, with grad), through the operator's own autograd.Function, and of the backward op called
    directly (the recomputing path torch.compile takes)."""
    count = count_launches()
    found = {}
    for block in LAUNCH_BLOCKS:
        op = wk.OPS[block]
        via_op = _forward_backward(op, _leaf_args(block), count)
        via_run = _forward_backward(op.operator().run, _leaf_args(block), count)
        args = _leaf_args(block)
        with torch.no_grad():
            grads = _grads_like(_tensors(op(*args)), 1)
        count[0] = 0
        op.backward_op(grads, [True] * len(op.spec.grad_inputs), *args)
        found[block] = {"op": [via_op["forward"], via_op["backward"]],
                        "run": [via_run["forward"], via_run["backward"]], "backward_op": count[0],
                        "bitwise": all(torch.equal(a, b) for a, b in
                                       zip(via_op["values"], via_run["values"], strict=True))}
    return found


def check_kept() -> dict:
    """rmsnorm and kda: {"no_grad_keeps", "slots_clear", "released_after_backward", "launches": {case: backward
    launches}, "equal": {case: gradients bitwise equal to the first backward's}} for a first backward, a second one
    through the same graph (retain_graph), one after an output was modified in place (multiplied by one), the
    backward op (recompute), and a backward through torch.utils.checkpoint (non-reentrant: the forward's saved
    tensors, the kept graph's among them, are dropped and recomputed)."""
    import weakref

    import torch.utils.checkpoint

    from workbench.kernels import _ops

    count = count_launches()
    keeping = _ops.BlockOp._forward_keeping
    calls, graphs = [0], []

    def spy(self, *args):
        calls[0] += 1
        outputs = keeping(self, *args)
        graphs.append(weakref.ref(_ops._local.kept.graph[0]))
        return outputs

    _ops.BlockOp._forward_keeping = spy
    found = {}
    for block in ("rmsnorm", "kda"):
        op, args = wk.OPS[block], _leaf_args(block)
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        figures: dict = {"launches": {}, "equal": {}}
        calls[0] = 0
        with torch.no_grad():
            op(*args)
        with torch.inference_mode():
            op(*args)
        figures["no_grad_keeps"] = calls[0]

        def backward(outputs, leaves=leaves, **kwargs):
            pairs = [(o, g) for o, g in zip(outputs, _grads_like(outputs, 1), strict=True) if g is not None]
            count[0] = 0
            grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], **kwargs)
            return count[0], grads

        outputs = _tensors(op(*args))
        figures["slots_clear"] = getattr(_ops._local, "want", None) is None and \
            getattr(_ops._local, "kept", None) is None
        figures["launches"]["first"], first = backward(outputs, retain_graph=True)
        figures["released_after_backward"] = graphs[-1]() is None
        figures["launches"]["second"], second = backward(outputs)
        outputs = _tensors(op(*args))
        outputs[0].mul_(1.0)
        figures["launches"]["in_place"], in_place = backward(outputs)
        count[0] = 0
        recompute = op.backward_op(_grads_like(outputs, 1), [True] * len(leaves), *args)
        figures["launches"]["backward_op"] = count[0]
        outputs = _tensors(torch.utils.checkpoint.checkpoint(op, *args, use_reentrant=False))
        figures["launches"]["checkpoint"], checkpointed = backward(outputs)
        for case, grads in (("second", second), ("in_place", in_place), ("backward_op", recompute),
                            ("checkpoint", checkpointed)):
            figures["equal"][case] = all(torch.equal(a, b) for a, b in zip(first, grads, strict=True))
        found[block] = figures
    return found


def check_bf16() -> dict:
    """{"refused": {block: message or None}, "right": {block@dtype: [failed checks against the float64 reference]},
    "guard_after": bool, "others_untouched": bool}: mla and vocab_blockwise_ce (tl.dot on bfloat16 operands) in
    bfloat16; mla in float32, kda and rmsnorm in bfloat16 judged as the verifier judges (its tolerance); the guard is
    off after a refusal and a bfloat16 tl.dot outside the library still runs."""
    import triton
    import triton.language as tl

    from workbench.kernels import _ops
    from workbench.verify.harness import check_trial, reference_run

    found: dict = {"refused": {}, "right": {}}
    for block in ("mla", "vocab_blockwise_ce"):
        try:
            wk.OPS[block](*_leaf_args(block, torch.bfloat16))
            found["refused"][block] = None
        except _ops.InterpreterBFloat16Error as exc:
            found["refused"][block] = str(exc)
    found["guard_after"] = getattr(_ops._local, "guard", False)
    for block, dtype in (("mla", torch.float32), ("kda", torch.bfloat16), ("rmsnorm", torch.bfloat16)):
        spec = get_block(block)
        inputs = _inputs(block, dtype)
        upstream = _grads_like(list(reference_run(spec, inputs, None)[0]), 1)
        args = _leaf_args(block, dtype)
        outputs = _tensors(wk.OPS[block](*args))
        pairs = [(o, g) for o, g in zip(outputs, upstream, strict=True) if g is not None]
        leaves = {k: a for k, a in zip(spec.arg_names, args, strict=True)
                  if isinstance(a, torch.Tensor) and a.requires_grad}
        grads = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), [g for _, g in pairs])
        expected = {"suite": "smoke", "shape": "", "dtype": str(dtype), "seed": 0, "torch_dtype": dtype,
                    "lowp": reference_run(spec, inputs, upstream),
                    "truth": reference_run(spec, inputs, upstream, upcast=torch.float64)}
        got = {"outputs": [o.detach() for o in outputs], "grads": dict(zip(leaves, grads, strict=True))}
        found["right"][f"{block}@{str(dtype).removeprefix('torch.')}"] = [
            c.direction for c in check_trial(spec, expected, got) if not c.passed]

    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr):
        i = tl.arange(0, 16)
        a = tl.load(a_ptr + i[:, None] * 16 + i[None, :])
        b = tl.load(b_ptr + i[:, None] * 16 + i[None, :])
        tl.store(c_ptr + i[:, None] * 16 + i[None, :], tl.dot(a, b))

    a = torch.ones(16, 16, dtype=torch.bfloat16)
    c = torch.empty(16, 16)
    dot_kernel[(1,)](a, a, c)  # the interpreter's own (wrong) answer: not the library's to refuse
    found["others_untouched"] = True
    return found


def check_in_place() -> dict:
    """kda_decode's op on its first smoke shape: whether the cache it gives back is its argument, how far o and the
    updated argument are from the reference's (which updates a copy), and how many tensors the op itself returns."""
    spec = get_block("kda_decode")
    args = _inputs("kda_decode")
    expected_o, expected_cache = spec.reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v
                                                   for k, v in args.items()})
    cache = args["state_cache"]
    o, returned = wk.kda_decode(*args.values())
    raw = wk.kda_decode.op(*_inputs("kda_decode").values())
    return {"is_argument": returned is cache, "o": float((o - expected_o).abs().max()),
            "cache": float((cache - expected_cache).abs().max()), "op_returns": len(_tensors(raw))}


def check_heads() -> dict:
    """The attention op at each head size the families use (GQA 4 over 2, a window and sinks at every other size),
    float32: the worst relative error of the output and of each gradient against the float64 reference."""
    spec, figures = get_block("attention"), {}
    for i, d in enumerate((64, 80, 96, 128, 192, 256)):
        shape = {"B": 1, "TQ": 20, "TK": 20, "H": 4, "HKV": 2, "D": d, "window": 7 * (i % 2), "sinks": i % 2,
                 "softcap": 0}
        inputs = spec.make_inputs(shape, torch.float32, i)
        ours = {k: v.clone().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        truth = {k: v.double().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        out, want = wk.attention(*ours.values()), spec.reference(*truth.values())
        up = torch.randn(want.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
        out.backward(up.float())
        want.backward(up)
        errors = {"out": float((out.double() - want).abs().max() / want.abs().max())}
        for name in spec.grad_inputs:
            if isinstance(truth[name], torch.Tensor):
                g = truth[name].grad
                errors[name] = float((ours[name].grad.double() - g).abs().max() / g.abs().max())
        figures[d] = errors
    return figures


def check_steep() -> dict:
    """kda at Qwen3-Next's decay rates (per head A in (0, 16), g_t = -A softplus(a_t + 1), a_t ~ N(0, 1): down to
    about -35 a token), its scalar gate spread over the key channels as the family's patch passes it, two chunks: the
    decay-rate gradient sum_t g_t dg_t per head (the A_log gradient's), its worst relative error against the float64
    reference."""
    spec, gen = get_block("kda"), torch.Generator().manual_seed(3)
    B, T, H, K = 1, 80, 4, 16
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1) for _ in range(2))
    v, beta = torch.randn(B, T, H, K, generator=gen), torch.rand(B, T, H, generator=gen)
    rates = 16 * torch.rand(H, generator=gen)
    g = (-rates[:, None] * torch.nn.functional.softplus(torch.randn(B, T, H, 1, generator=gen) + 1)).expand(
        B, T, H, K)
    up = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)

    def rate_grad(fn, dtype):
        args = [x.to(dtype).requires_grad_() for x in (q, k, v, g, beta)]
        o = fn(*args, K ** -0.5, None)[0]
        (o * up.to(dtype)).sum().backward()
        return (args[3].grad.double() * g.double()).sum((0, 1, 3))
    truth = rate_grad(spec.reference, torch.float64)
    error = (rate_grad(wk.kda, torch.float32) - truth).abs() / truth.abs()
    return {"rates": rates.tolist(), "error": float(error.max())}


def check_clamped() -> dict:
    """Glm5NextTextMLP (hidden 32, intermediate 48, swiglu_limit 10), shipped and with the family's patch, on x
    ~ N(0, 400) so that about a quarter of the gate and up values lie past the limit: relative output and gradient
    errors, and that share."""
    from types import SimpleNamespace

    from transformers.models.glm5_next import modeling_glm5_next as glm

    from workbench.integrations.families._common import clamped_mlp_forward

    torch.manual_seed(4)
    mlp = glm.Glm5NextTextMLP(SimpleNamespace(hidden_size=32, intermediate_size=48, hidden_act="silu",
                                              swiglu_limit=10.0))
    x = 20 * torch.randn(2, 8, 32)
    past = float((mlp.gate_proj(x) > 10).float().mean() + (mlp.up_proj(x).abs() > 10).float().mean()) / 2

    def run(forward):
        xg = x.clone().requires_grad_()
        y = forward(mlp, xg)
        y.backward(torch.ones_like(y))
        return y.detach(), xg.grad

    (y0, g0), (y1, g1) = run(type(mlp).forward), run(clamped_mlp_forward)
    return {"past": past, "output": float((y1 - y0).abs().max() / y0.abs().max()),
            "grad": float((g1 - g0).abs().max() / g0.abs().max())}


def check_strided() -> dict:
    """The worst relative errors of rotary's op, forward and input gradient, on a non-contiguous view (heads before
    tokens in memory), against the float64 reference, in both layouts."""
    spec = get_block("rotary")
    errors = {}
    for interleaved in (False, True):
        inputs = spec.make_inputs({"B": 2, "T": 5, "H": 3, "D": 24, "R": 16, "interleaved": int(interleaved)},
                                  torch.float32, 6)
        strided = inputs["x"].transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
        truth = inputs["x"].double().requires_grad_()
        y = wk.rotary(strided, inputs["cos"], inputs["sin"], interleaved)
        y_truth = spec.reference(truth, inputs["cos"].double(), inputs["sin"].double(), interleaved)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        (dx,), (dx_truth,) = torch.autograd.grad(y, strided, dy), torch.autograd.grad(y_truth, truth, dy.double())
        errors[f"interleaved={interleaved}"] = {
            "contiguous": strided.is_contiguous(),
            "output": float((y.double() - y_truth).abs().max() / y_truth.abs().max()),
            "grad": float((dx.double() - dx_truth).abs().max() / dx_truth.abs().max())}
    return errors


def check_kv_halves() -> dict:
    """The paged attention ops on their first smoke shape, float32, with the caches vLLM's split views of one tensor
    a layer, in each page layout vLLM resolves (token-major NHD, head-major HND): the largest errors of the output
    and of each cache against the reference (which updates copies), and whether the one tensor holds the writes."""
    figures = {}
    for block in ("attention_prefill", "attention_decode"):
        spec = get_block(block)
        for layout in ("NHD", "HND"):
            args = _inputs(block)
            pages, page, hkv, d = args["k_cache"].shape
            both = torch.cat([args["k_cache"], args["v_cache"]], dim=-1)  # [PAGES, PAGE, HKV, 2 D]
            if layout == "HND":
                both = both.transpose(1, 2).contiguous().transpose(1, 2)
            args["k_cache"], args["v_cache"] = both.split(d, dim=-1)
            expected = spec.reference(**{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()})
            got = getattr(wk, block)(*args.values())
            figures[f"{block} {layout}"] = {
                "contiguous": args["k_cache"].is_contiguous(),
                "errors": [float((g - e).abs().max()) for g, e in zip(got, expected, strict=True)],
                "written_in_place": bool(torch.equal(both, torch.cat(expected[1:], dim=-1)))}
    return figures


def check_glm5_text() -> dict:
    """GLM-5-Next's text model loaded alone (``Glm5NextTextModel``, model_type glm5_next_text; a tiny instance of a
    KDA layer and a DSA layer with the MoE, float32, 8 tokens) shipped and with apply_workbench_kernels: the modules
    each block replaced, the relative error of the last hidden states and of every parameter's gradient."""
    import copy

    from transformers.models.glm5_next import modeling_glm5_next as glm

    from workbench.integrations.parity import load_config, tiny_config
    from workbench.integrations.probe import torch_paths
    from workbench.integrations.transformers import apply_workbench_kernels

    torch_paths(glm)  # fla's kernels need a GPU driver: the shipped KDA layers' torch path
    full, _ = load_config({"model_type": "glm5_next_text"})
    fields, _ = tiny_config(full, 2)
    torch.manual_seed(0)
    shipped = glm.Glm5NextTextModel(glm.Glm5NextTextConfig(**{k: v for k, v in fields.items()
                                                                if k != "vision_config"}))
    patched = copy.deepcopy(shipped)
    report = apply_workbench_kernels(patched)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    up = torch.randn(2, 8, fields["hidden_size"], generator=torch.Generator().manual_seed(2))
    hidden = {}
    for name, model in (("shipped", shipped), ("patched", patched)):
        out = model(input_ids=ids).last_hidden_state
        (out * up).sum().backward()
        hidden[name] = out.detach()
    grads = [float((p.grad - s.grad).abs().max() / s.grad.abs().max().clamp_min(1e-30))
             for s, p in zip(shipped.parameters(), patched.parameters(), strict=True) if s.grad is not None]
    return {"model_type": shipped.config.model_type,
            "blocks": {row["class"]: row["blocks"] for row in report.as_dict()["modules"] if row["blocks"]},
            "output": float((hidden["patched"] - hidden["shipped"]).abs().max() / hidden["shipped"].abs().max()),
            "grad_worst": max(grads), "grads": len(grads)}


CHECKS = {"fake": check_fake, "equal": check_equal, "opcheck": check_opcheck, "compile": check_compile,
          "launches": check_launches, "kept": check_kept, "bf16": check_bf16, "in_place": check_in_place,
          "heads": check_heads, "steep": check_steep, "clamped": check_clamped,
          "strided": check_strided, "kv_halves": check_kv_halves, "glm5_text": check_glm5_text}


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    wk.set_operators_dir(OPERATORS)
    print(json.dumps(CHECKS[sys.argv[1]]()))
