"""Integrity checks: what a candidate did while it ran, read off the worker's report and the outputs it returned.

``CHECKS`` is the registry: one function per integrity verdict the worker's report shows, in one ordered table
whose order is the verdicts' priority (``PRIORITY``: the first verdict found speaks for the candidate;
workbench.vocabulary.INTEGRITY_VERDICTS lists the same words in the same order, and a test holds them equal). Each
function takes the run (``Run``: the block, the worker's report, the expected trials, the candidate's results and
the numeric checks by trial) and returns the reasons it failed, one per finding, empty when the candidate behaved.
Every integrity verdict outranks the numerics: a candidate that cheats is refused for cheating even when its numbers
happen to match. Adding a verdict: its word in workbench.vocabulary.Verdict, and its function here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workbench.blocks.base import BlockSpec
from workbench.verify.result import Check
from workbench.verify.worker import POISON_BITS, POISON_INT, PROBE
from workbench.vocabulary import Verdict

# Host code may allocate, view, copy and read scalars; every other aten op during run/backward is a torch fallback
# unless the block lists it in host_ops.
BASE_HOST_OPS = frozenset({
    "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty", "aten.new_empty_strided",
    "aten.zeros", "aten.zeros_like", "aten.new_zeros", "aten.ones", "aten.ones_like", "aten.new_ones",
    "aten.full", "aten.full_like", "aten.new_full", "aten.fill_", "aten.zero_", "aten.arange",
    "aten.set_", "aten.copy_", "aten.clone", "aten._to_copy", "aten.detach", "aten.alias", "aten.lift_fresh",
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten._reshape_alias", "aten.as_strided", "aten.expand",
    "aten.t", "aten.transpose", "aten.permute", "aten.squeeze", "aten.unsqueeze", "aten.slice", "aten.select",
    "aten.split", "aten.split_with_sizes", "aten.unbind", "aten.unflatten", "aten._local_scalar_dense",
    "aten.promote_types", "aten.result_type",  # dtype queries
})


# The patterns the worker writes into fresh buffers, read back through an integer view of the same width.
INT_VIEWS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
             torch.float64: torch.int64}


def integrity_check(verdict: Verdict, reason: str) -> Check:
    """The failed check of an integrity ``verdict`` (suite "integrity", direction "integrity:<verdict>")."""
    return Check(suite="integrity", shape="-", dtype="-", seed=0, direction=f"integrity:{verdict}", passed=False,
                 reason=reason, verdict=verdict)


def poisoned(t: torch.Tensor) -> int:
    """How many elements still hold the worker's poison pattern (never written by the candidate)."""
    if not isinstance(t, torch.Tensor) or not t.numel():
        return 0
    if t.dtype in INT_VIEWS:
        bits = POISON_BITS[str(t.dtype).removeprefix("torch.")]
        return int((t.contiguous().view(INT_VIEWS[t.dtype]) == bits).sum())
    if t.dtype in (torch.int32, torch.int64):
        return int((t == POISON_INT).sum())
    return 0


def _tensors(got: dict) -> list[tuple[str, torch.Tensor]]:
    named = [(f"output {i}", o) for i, o in enumerate(got.get("outputs") or [])]
    named += [(f"grad of {k}", g) for k, g in (got.get("grads") or {}).items()]
    return [(n, t) for n, t in named if isinstance(t, torch.Tensor)]


@functools.cache
def _composite(op: str) -> bool:
    """Whether every overload of ``op`` ("aten.to") is a CompositeImplicitAutograd decomposition into other ops."""
    packet = getattr(torch.ops.aten, op.removeprefix("aten."), None)
    kinds = []
    for name in packet.overloads() if packet is not None else []:
        try:
            overload = getattr(packet, name)
            kinds.append(overload.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd))
        except (AttributeError, RuntimeError):  # overloads TorchScript lists and the dispatcher does not hold
            continue
    return bool(kinds) and all(kinds)


def _constant(t: torch.Tensor) -> bool:
    return t.numel() > 1 and bool((t == t.reshape(-1)[0]).all())


def _spread(t: torch.Tensor) -> float:
    """max - min of the finite values (0 when there are none)."""
    finite = t[torch.isfinite(t)].double()
    return float(finite.max() - finite.min()) if finite.numel() else 0.0


def _quantities(spec: BlockSpec, exp: dict, got: dict) -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(direction, truth, same-precision reference, candidate's tensor) of each output and each gradient the truth
    has, paired by name as the numeric checks pair them."""
    (true_out, true_grads), (low_out, low_grads) = exp["truth"], exp["lowp"]
    outputs, grads = got.get("outputs") or [], got.get("grads") or {}
    pairs = [(f"forward:{name}", t, r, o)
             for name, t, r, o in zip(spec.outputs, true_out, low_out, outputs, strict=False)]
    pairs += [(f"grad:{name}", true_grads[name], low_grads[name], grads.get(name)) for name in spec.grad_inputs
              if true_grads.get(name) is not None and low_grads.get(name) is not None]
    return [(d, t, r, o) for d, t, r, o in pairs if isinstance(o, torch.Tensor)]


@dataclass
class Run:
    """What the integrity checks read: the block, the worker's report (audit events, patched names, launches,
    captures), the expected trials, the candidate's result per trial id and the numeric checks per trial id."""

    spec: BlockSpec
    results: dict
    expected: list[dict]
    by_id: dict[int, dict]
    numeric: dict[int, list[Check]]

    def trials(self):
        """(expected trial, the candidate's result) of every trial that returned without an error."""
        for exp in self.expected:
            got = self.by_id.get(exp["id"])
            if got and not got.get("error"):
                yield exp, got


def _audited(verdict: Verdict) -> Callable[[Run], list[str]]:
    """The worker's audit hook refused an operation of this kind (one reason per refused operation)."""
    def check(run: Run) -> list[str]:
        return [f"{e['event']} {e['detail']} at line {e['line']}".strip()
                for e in run.results.get("events", []) if e["kind"] == verdict]
    check.__doc__ = f"The audit hook refused {verdict.replace('_', ' ')} operations."
    return check


def _monkeypatch(run: Run) -> list[str]:
    """Names of torch, triton or the candidate's imports changed while it ran."""
    patched = run.results.get("patched")
    return [f"changed during run: {', '.join(patched[:5])}"] if patched else []


def _torch_fallback(run: Run) -> list[str]:
    """Torch ops doing the block's work in the host code (beyond allocation, views, copies and the block's
    host_ops), seen by the dispatch trace, or by the profiler outside the Python modes (composite ops such as
    aten.to are left out: what they decompose into is what the trace sees)."""
    allowed = BASE_HOST_OPS | set(run.spec.host_ops)
    fallback: set[str] = set()
    for _, got in run.trials():
        fallback |= {op for op in got.get("ops", {}) if op not in allowed}
        fallback |= {op for op in got.get("profiled_ops", []) if op not in allowed and op not in got.get("ops", {})
                     and not _composite(op)}
    what = ", ".join(sorted(op if op != "numpy" else "tensors handed to numpy" for op in fallback))
    return [f"host ops doing the block's work: {what}"] if fallback else []


def _no_kernel(run: Run) -> list[str]:
    """A pass that returned values without launching a Triton kernel."""
    missing = []
    for exp, got in run.trials():
        outputs = [o for o in got.get("outputs") or [] if isinstance(o, torch.Tensor)]
        grads = [g for g in (got.get("grads") or {}).values() if isinstance(g, torch.Tensor)]
        if any(o.numel() for o in outputs) and not got.get("launches_fwd"):
            missing.append(f"forward [{exp['shape']}] {exp['dtype']}")
        if any(g.numel() for g in grads) and not got.get("launches_bwd"):
            missing.append(f"backward [{exp['shape']}] {exp['dtype']}")
    return [f"no Triton kernel launched: {'; '.join(missing[:3])}"] if missing else []


def _reported(key: str, reason: str) -> Callable[[Run], list[str]]:
    """A fact the worker reports per trial as a list of names (``key``), gathered over the trials; ``reason`` with
    ``{}`` for the names."""
    def check(run: Run) -> list[str]:
        found = set().union(*(got.get(key, []) for _, got in run.trials()))
        return [reason.format(", ".join(sorted(found)))] if found else []
    check.__doc__ = f"The worker's report names them under {key!r}: {reason.format('...')}."
    return check


def _unwritten_output(run: Run) -> list[str]:
    """Buffers returned still holding the worker's poison pattern: allocated, never written."""
    unwritten = [f"{name} [{exp['shape']}] {exp['dtype']}: {count} elements"
                 for exp, got in run.trials() for name, t in _tensors(got) if (count := poisoned(t))]
    return [f"poisoned buffers returned unwritten: {'; '.join(unwritten[:3])}"] if unwritten else []


def _constant_output(run: Run) -> list[str]:
    """Constant where the truth varies by more than the error the quantity is allowed, and where the reference in
    the same precision varies too (a float16 output can round to a constant legitimately; a gradient that is zero in
    exact arithmetic comes out as rounding noise in the truth and as exact zeros from a kernel)."""
    constant = []
    for exp, got in run.trials():
        bounds = {c.direction: c.bound or 0.0 for c in run.numeric.get(exp["id"], [])}
        for direction, t, r, o in _quantities(run.spec, exp, got):
            if o.is_floating_point() and o.shape == t.shape and _constant(o) and not _constant(t) \
                    and not _constant(r) and _spread(t) > bounds.get(direction, 0.0):
                constant.append(f"[{exp['shape']}] {exp['dtype']}")
    return [f"constant output where the truth varies: {'; '.join(constant[:3])}"] if constant else []


def _one(check: Callable[..., str]) -> Callable[[Run], list[str]]:
    return lambda run: [reason] if (reason := check(run)) else []


CHECKS: tuple[tuple[Verdict, Callable[[Run], list[str]]], ...] = (
    (Verdict.FORBIDDEN_IMPORT, _audited(Verdict.FORBIDDEN_IMPORT)),
    (Verdict.INTROSPECTION, _audited(Verdict.INTROSPECTION)),
    (Verdict.FORBIDDEN_CALL, _audited(Verdict.FORBIDDEN_CALL)),
    (Verdict.MONKEYPATCH, _monkeypatch),
    (Verdict.TORCH_FALLBACK, _torch_fallback),
    (Verdict.NO_KERNEL, _no_kernel),
    (Verdict.TENSOR_SUBCLASS, _reported("subclass", "returned tensor subclasses: {}")),
    (Verdict.ALIASING, _reported("aliasing", "outputs share memory with {}")),
    (Verdict.INPUT_MUTATION, _reported("mutated", "inputs modified: {}")),
    (Verdict.NOT_IN_PLACE, _reported("not_in_place", "caches updated in place came back in new memory: {}")),
    (Verdict.UNWRITTEN_OUTPUT, _unwritten_output),
    (Verdict.CACHED_RESULT, _one(lambda run: _cached(run.expected, run.by_id))),
    (Verdict.CONSTANT_OUTPUT, _constant_output),
    (Verdict.NONDETERMINISTIC, _one(lambda run: _nondeterministic(run.expected, run.by_id, run.numeric))),
    (Verdict.CAPTURE_DIVERGENCE, _one(lambda run: _capture_divergence(run.results))),
    (Verdict.OVERFIT_SHAPES, _one(lambda run: _overfit(run.expected, run.numeric))),
)
"""Every integrity verdict the worker's report shows and the function that finds it, highest priority first."""

PRIORITY: tuple[Verdict, ...] = (Verdict.INSTRUMENTATION_ACCESS, Verdict.FORGED_REPORT,
                                 *(verdict for verdict, _ in CHECKS))
"""Every integrity verdict, highest priority first: the two found outside the worker's report come first (code that
reaches into the instrumentation, refused before it runs: workbench.verify.static_scan.instrumentation_access; a
report without the worker's token: the harness), then ``CHECKS``."""


def evaluate(spec: BlockSpec, results: dict, expected: list[dict], by_id: dict[int, dict],
             numeric: dict[int, list[Check]]) -> list[Check]:
    """Failed integrity checks, each naming its verdict (``CHECKS`` in order); an empty list when the candidate
    behaved."""
    run = Run(spec, results, expected, by_id, numeric)
    return [integrity_check(verdict, reason) for verdict, check in CHECKS for reason in check(run)]


def _cached(expected: list[dict], by_id: dict[int, dict]) -> str:
    """Bit-identical outputs for different inputs whose results differ even after rounding to the candidate's
    precision (the reference run in that precision differs): a result replayed from an earlier call. Outputs that
    round to the same values for both seeds (a saturated one-element case) are no evidence; constant outputs are
    left to constant_output (two seeds' zeros are bit-identical without any replay)."""
    seen: dict[tuple, list[tuple[dict, list]]] = {}
    for exp in expected:
        got = by_id.get(exp["id"])
        if exp["kind"] == "repeat" or not got or got.get("error"):
            continue
        outs = [o if isinstance(o, torch.Tensor) else None for o in got.get("outputs") or []]
        key = (exp["shape"], exp["dtype"])
        for other, other_outs in seen.get(key, []):
            for o, p, t, u in zip(outs, other_outs, exp["lowp"][0], other["lowp"][0], strict=False):
                if o is None or p is None or not o.numel() or _constant(o):
                    continue
                if o.shape == p.shape and torch.equal(o, p) and not torch.equal(t, u):
                    return f"[{exp['shape']}] {exp['dtype']}: seed {exp['seed']} returned seed {other['seed']}'s output"
        seen.setdefault(key, []).append((exp, outs))
    return ""


def _nondeterministic(expected: list[dict], by_id: dict[int, dict], numeric: dict[int, list[Check]]) -> str:
    """A repeated call on the same inputs must agree with the first within the check's bound."""
    for exp in expected:
        if exp["kind"] != "repeat":
            continue
        first, again = by_id.get(exp["repeat_of"]), by_id.get(exp["id"])
        if not first or not again or first.get("error") or again.get("error"):
            continue
        bounds = [c.bound for c in numeric.get(exp["repeat_of"], [])]
        for (name, a), (_, b), bound in zip(_tensors(first), _tensors(again), bounds, strict=False):
            if a.shape != b.shape or bound is None:
                continue
            gap = torch.where(a == b, 0.0, (a.double() - b.double()).abs())  # equal infinities agree
            diff = float(gap.nan_to_num(nan=float("inf")).max()) if a.numel() else 0.0
            if diff > bound:
                return f"{name} [{exp['shape']}] {exp['dtype']}: two calls on the same inputs differ by {diff:.3g} " \
                       f"(bound {bound:.3g})"
    return ""


def _overfit(expected: list[dict], numeric: dict[int, list[Check]]) -> str:
    """Every shown shape passes but a hidden shape drawn at verification time fails."""
    shown = [c for e in expected if e["kind"] == "suite" for c in numeric.get(e["id"], [])]
    hidden = [c for e in expected if e["kind"] == "hidden" for c in numeric.get(e["id"], [])]
    if shown and all(c.passed for c in shown) and any(not c.passed for c in hidden):
        bad = next(c for c in hidden if not c.passed)
        return f"passes every suite shape but fails hidden shape [{bad.shape}] {bad.dtype}: {bad.reason}"
    return ""


def _probe_launches(results: dict) -> dict[tuple[str, str, str], set[str]]:
    """The launches of each capture probe by (target, shape, meta | real), each as its kernel with its argument types,
    constexprs and options; a probe whose host code failed adds its error's kind."""
    found: dict[tuple[str, str, str], set[str]] = {}
    for capture in results.get("captures", []):
        if capture.get("suite", "").startswith(PROBE):
            _, kind, shape = capture["suite"].split(":", 2)
            errors = {f"error: {capture['error']['kind']}"} if capture.get("error") else set()
            found.setdefault((capture["target"], shape, kind), set()).update(errors)
    for launch in results.get("launches", []):
        if launch["suite"].startswith(PROBE):
            _, kind, shape = launch["suite"].split(":", 2)
            settings = {**launch["constexprs"], **launch["options"]}
            found.setdefault((launch["target"], shape, kind), set()).add(
                f"{launch['kernel']}({', '.join(f'{k}={v}' for k, v in sorted(settings.items()))})")
    return found


def _capture_divergence(results: dict) -> str:
    """The host code launches other kernels or settings on the meta tensors of a capture than on real tensors of the
    same shape and target: what was compiled for the targets is not what the candidate runs there."""
    found = _probe_launches(results)
    for (target, shape, kind), launches in sorted(found.items()):
        if kind != "meta":
            continue
        real = found.get((target, shape, "real"), set())
        if launches != real:
            only_meta, only_real = sorted(launches - real), sorted(real - launches)
            return (f"{target} [{shape}]: on meta tensors (the capture) the host code launches "
                    f"{'; '.join(only_meta[:2]) or 'nothing more'}, on real tensors "
                    f"{'; '.join(only_real[:2]) or 'nothing more'}")[:500]
    return ""
