"""Verify a candidate file against its block's reference (DESIGN.md, "Verification policy").

For every shape of the chosen suites x dtype x seed: fresh inputs, a random upstream gradient, the truth computed
here in float64, the reference's own error in the candidate's precision, and the candidate's outputs and gradients
computed in a sandboxed child process. The expected values never enter the candidate's process.
"""

from __future__ import annotations

import hashlib
import inspect
import random
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import torch

from workbench.backends import INTERPRETER, Backend, Target, get_backend, get_targets
from workbench.blocks import get_block
from workbench.blocks.base import SUITES, BlockSpec, Shape, shape_label
from workbench.config import Settings
from workbench.errors import NotACandidateError, WorkbenchError
from workbench.models import model_shapes
from workbench.numerics import compare
from workbench.verify.aot import SMOKE_PROBE, captured_label, compile_for_targets, compile_key, suite_phrase
from workbench.verify.contract import declared_block
from workbench.verify.integrity import PRIORITY, evaluate, integrity_check
from workbench.verify.result import Check, VerificationResult
from workbench.verify.sandbox import isolation, run_job
from workbench.verify.static_scan import capture_probe, instrumentation_access
from workbench.verify.worker import PROBE
from workbench.vocabulary import RUN_VERDICTS, Verdict

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MEMORY_BYTES = 16 << 30
def read_candidate(path: str | Path) -> tuple[str, str]:
    """(block name, source) of a candidate file, without running it. NotACandidateError when it is none."""
    path = Path(path)
    if not path.is_file():
        raise NotACandidateError(f"{path}: no such file")
    if path.suffix != ".py":
        raise NotACandidateError(f"{path}: a candidate is a Python file (.py)")
    source = path.read_text(errors="replace")
    block = declared_block(source)
    if block is None:
        raise NotACandidateError(f"{path}: not a candidate (no BLOCK = \"<block name>\" at module level)")
    return block, source


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def select_suites(backend: Backend, suites: list[str] | None, dtypes: list[str] | None) -> tuple[list[str], list[str]]:
    """The suites and dtypes asked for (default: smoke+edge, every dtype of the backend), each checked against what
    the backend can run: a name it cannot is a WorkbenchError, never silently dropped."""
    suites = suites or ["smoke", "edge"]
    dtypes = dtypes or list(backend.dtypes)
    for suite in suites:
        if suite not in SUITES:
            raise WorkbenchError(f"unknown shape suite '{suite}' (known: {', '.join(SUITES)})")
        if suite not in backend.suites:
            raise WorkbenchError(f"the {suite} suite does not run on the {backend.name} backend "
                                 f"(it runs: {', '.join(backend.suites)})")
    for dtype in dtypes:
        if dtype not in backend.dtypes:
            raise WorkbenchError(f"dtype {dtype} does not run on the {backend.name} backend "
                                 f"(it runs: {', '.join(backend.dtypes)})")
    return suites, dtypes


def suite_shapes(spec: BlockSpec, suite: str) -> list[Shape]:
    return model_shapes(spec.name) if suite == "model" else list(spec.shapes.get(suite, []))


def _as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


def reference_run(spec: BlockSpec, inputs: dict, grad_outputs: list[torch.Tensor] | None,
                  upcast: torch.dtype | None = None) -> tuple[tuple[torch.Tensor, ...], dict]:
    """Outputs and input gradients of the reference. upcast: cast floating inputs (and upstream grads) first."""
    args, leaves = [], {}
    for name in spec.arg_names:
        value = inputs[name]
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if upcast is not None and value.is_floating_point():
                value = value.to(upcast)
            if name in spec.grad_inputs:
                value.requires_grad_(True)
                leaves[name] = value
        args.append(value)
    outputs = _as_tuple(spec.reference(*args))
    grads: dict = {}
    if grad_outputs is not None and leaves:
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs, strict=True) if o.requires_grad]
        gos = [g.to(upcast) if upcast is not None else g for _, g in pairs]
        got = torch.autograd.grad([o for o, _ in pairs], list(leaves.values()), gos, allow_unused=True)
        grads = dict(zip(leaves, got, strict=True))
    return tuple(o.detach() for o in outputs), {k: (v.detach() if v is not None else None) for k, v in grads.items()}


HIDDEN_SHAPES = 2


def default_hidden_shapes(spec: BlockSpec, rng: random.Random) -> list[Shape]:
    """Shapes nobody was shown: each dim drawn independently between its smallest and largest smoke/edge value."""
    shown = [shape for suite in ("smoke", "edge") for shape in spec.shapes.get(suite, [])]
    dims = list(shown[0]) if shown else []
    return [{d: rng.randint(min(s[d] for s in shown), max(s[d] for s in shown)) for d in dims}
            for _ in range(HIDDEN_SHAPES)]


def build_trials(spec: BlockSpec, backend: Backend, suites: list[str], dtypes: list[str], seeds: int,
                 base_seed: int, forward_only: bool = False) -> tuple[list[dict], list[dict]]:
    """(trials sent to the sandbox, expected values kept here), aligned by trial id. forward_only: no upstream
    gradients, so neither the candidate's backward nor the reference's runs.

    kind "suite": every shape of the suites x dtype x seed; "hidden": shapes drawn now from the base seed, one seed
    each; "repeat": the first trial of each dtype again on the same inputs (determinism)."""
    trials, expected = [], []

    def add(kind: str, suite: str, shape: Shape, dtype_name: str, seed: int, replica: int) -> None:
        dtype = getattr(torch, dtype_name)
        inputs = spec.make_inputs(shape, dtype, seed, backend.device)
        ref_out, _ = reference_run(spec, inputs, None)
        gen = torch.Generator().manual_seed(seed + 7919)
        grad_outputs = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype)
                        if o.is_floating_point() and not forward_only else None for o in ref_out]
        upstream = None if forward_only else grad_outputs
        lowp = reference_run(spec, inputs, upstream)
        truth = reference_run(spec, inputs, upstream, upcast=torch.float64)
        meta = {"id": len(trials), "kind": kind, "suite": suite, "shape": shape_label(shape), "dtype": dtype_name,
                "seed": seed, "replica": replica}
        trials.append({"id": meta["id"], "suite": suite, "inputs": inputs, "grad_outputs": grad_outputs})
        expected.append({**meta, "lowp": lowp, "truth": truth, "torch_dtype": dtype, "inputs": inputs})

    for suite in suites:
        for shape in suite_shapes(spec, suite):
            for dtype_name in dtypes:
                for s in range(seeds):
                    add("suite", suite, shape, dtype_name, base_seed + len(trials), s)
    rng = random.Random(base_seed)
    hidden = spec.hidden_shapes(rng) if spec.hidden_shapes else default_hidden_shapes(spec, rng)
    for shape in hidden:
        for dtype_name in dtypes:
            add("hidden", "hidden", shape, dtype_name, base_seed + len(trials), 0)
    for dtype_name in dtypes:
        first = next((e for e in expected if e["kind"] == "suite" and e["dtype"] == dtype_name), None)
        if first:
            trials.append({**trials[first["id"]], "id": len(trials)})
            expected.append({**first, "id": len(expected), "kind": "repeat", "suite": "repeat",
                             "repeat_of": first["id"]})
    return trials, expected


CAPTURE_DTYPE = torch.bfloat16  # the model suite's dtype on the GPU targets


def build_captures(spec: BlockSpec, targets: list[Target], shapes: list[dict] | None = None,
                   suites: tuple[str, ...] = ("model", "smoke")) -> tuple[list[dict], list[str]]:
    """(captures sent to the sandbox, problems): each of ``suites``' shapes (the model suite's: ``shapes`` where
    given, else the cards') as meta inputs in CAPTURE_DTYPE, once per target (the host code chooses its launch
    settings per target), whose launches the worker records without running them, labelled
    workbench.verify.aot.captured_label(suite); and per target two probes of the first smoke shape, on meta tensors
    and on real ones (zeros), whose launches must be the same (workbench.verify.integrity: capture_divergence): host
    code that tells a capture from a run would compile one thing for the targets and launch another."""
    captures, problems = [], []
    for suite in suites:
        for shape in shapes if shapes is not None and suite == "model" else suite_shapes(spec, suite):
            try:
                inputs = spec.meta_inputs(shape, CAPTURE_DTYPE)
            except Exception as exc:  # noqa: BLE001 - a block whose inputs cannot be made abstract: said, not fatal
                problems.append(f"{suite} suite not captured at [{shape_label(shape)}]: "
                                f"{type(exc).__name__}: {exc}"[:300])
                continue
            captures += [{"id": len(captures) + i, "suite": captured_label(suite), "shape": shape_label(shape),
                          "target": t.name, "inputs": inputs} for i, t in enumerate(targets)]
    for shape in suite_shapes(spec, "smoke")[:1]:  # the probes: meta against real tensors, per target
        inputs = spec.meta_inputs(shape, CAPTURE_DTYPE)
        captures += [{"id": len(captures) + i, "suite": f"{PROBE}{kind}:{shape_label(shape)}", "probe": kind,
                      "shape": shape_label(shape), "target": t.name, "inputs": inputs}
                     for i, (t, kind) in enumerate((t, kind) for t in targets for kind in ("meta", "real"))]
    return captures, problems


def default_target_names() -> list[str] | None:
    """$WORKBENCH_TARGETS (comma-separated; empty: compile for none), else None (the default targets)."""
    value = Settings.load().targets
    return None if value is None else [t.strip() for t in value.split(",") if t.strip()]


def check_trial(spec: BlockSpec, exp: dict, got: dict) -> list[Check]:
    """Checks of one trial: each output, then each gradient."""
    where = {k: exp[k] for k in ("suite", "shape", "dtype", "seed")}
    if got.get("error"):
        err = got["error"]
        return [Check(**where, direction="run", passed=False, reason=f"{err['kind']}: {err['message']}",
                      verdict=trial_verdict(err["kind"]))]
    (low_out, low_grads), (true_out, true_grads) = exp["lowp"], exp["truth"]
    outputs = got["outputs"] or []
    if len(outputs) != len(true_out):
        return [Check(**where, direction="forward", passed=False,
                      reason=f"returned {len(outputs)} outputs, expected {len(true_out)}")]
    tol = spec.tolerance(exp["torch_dtype"])
    checks = []
    context = {"truth_outputs": dict(zip(spec.outputs, true_out, strict=True)),
               "lowp_outputs": dict(zip(spec.outputs, low_out, strict=True)), "inputs": exp.get("inputs")}

    def judge(direction: str, o, t, r) -> Check:
        custom = spec.comparators.get(direction)
        if custom is None:
            return Check(**where, direction=direction, **compare(o, t, r, tol, r.dtype))
        wants = inspect.signature(custom).parameters
        extra = {k: v for k, v in context.items() if k in wants}
        return Check(**where, direction=direction, **custom(o, t, r, tol, r.dtype, **extra))

    for name, o, t, r in zip(spec.outputs, outputs, true_out, low_out, strict=True):
        checks.append(judge(f"forward:{name}", o, t, r))
    grads = got["grads"] or {}
    for name in spec.grad_inputs:
        t, r = true_grads.get(name), low_grads.get(name)
        if t is not None:
            checks.append(judge(f"grad:{name}", grads.get(name), t, r))
    return checks


def trial_verdict(kind: str) -> Verdict:
    """The verdict of a trial that raised, from the worker's error kind (it imports nothing of the workbench, so it
    names them as strings): one of RUN_VERDICTS, a runtime error when it names none."""
    return Verdict(kind) if kind in RUN_VERDICTS else Verdict.RUNTIME_ERROR


def _verdict(checks: list[Check]) -> tuple[Verdict, str]:
    """The verdict of a candidate from its checks' verdicts: the first integrity verdict in priority order
    (workbench.verify.integrity.PRIORITY); then a required target's compile error, unless a trial failed for another
    reason than the interpreter's limits; then the first trial error in RUN_VERDICTS order; then the numerics."""
    failing = [c for c in checks if not c.passed]
    if not failing:
        return Verdict.PASS, f"{len(checks)} checks passed"
    first: dict[str, Check] = {}
    for c in failing:  # the first check of each verdict speaks for it
        first.setdefault(c.verdict, c)
    for verdict in PRIORITY:
        if verdict in first:
            return verdict, first[verdict].reason
    runs = [c for c in failing if c.verdict in RUN_VERDICTS]
    builds = [c for c in failing if c.verdict == Verdict.TARGET_COMPILE_ERROR]
    if builds and all(c.verdict == Verdict.INTERPRETER_UNSUPPORTED for c in runs):
        return Verdict.TARGET_COMPILE_ERROR, f"{builds[0].shape}: {builds[0].reason}" + \
            (f" (and {len(builds) - 1} more kernel x target builds)" if len(builds) > 1 else "")
    if runs:
        kind = next(v for v in RUN_VERDICTS if v in first)
        return kind, f"{first[kind].reason.split(': ', 1)[1]} ({len(runs)} of the trials; first at " \
                     f"[{first[kind].shape}] {first[kind].dtype})"
    worst = max(failing, key=lambda c: (c.max_abs or 0) / (c.bound or 1) if c.bound else float("inf"))
    return Verdict.FAIL, f"{len(failing)} of {len(checks)} checks failed; worst {worst.line()}"


def verify_candidate(path: str | Path, *, block: str | None = None, suites: list[str] | None = None,
                     dtypes: list[str] | None = None, seeds: int = 2, base_seed: int | None = None,
                     backend: Backend | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                     memory_bytes: int | None = DEFAULT_MEMORY_BYTES, work_dir: Path | None = None,
                     targets: list[str] | None = None, compile_cache: Path | None = None,
                     forward_only: bool = False) -> VerificationResult:
    """Full verification of one candidate file. Raises NotACandidateError / UnknownBlockError for user mistakes;
    everything the candidate does wrong is a verdict in the result.

    targets: the GPU targets every captured launch must compile for (default: $WORKBENCH_TARGETS, else the default
    targets of workbench.backends; [] for none); a failure there is the verdict target_compile_error.
    compile_cache: where compile results are kept by source hash x specialization x target.
    forward_only: verify the outputs only (inference kernels with no backward); the result says the backward was
    not verified, and the model-suite capture runs the forward only. A block without gradients (a decode step) is
    verified so whatever this says."""
    started = time.monotonic()
    path = Path(path).resolve()
    named_block, source = read_candidate(path)
    spec = get_block(block or named_block)
    forward_only = forward_only or not spec.grad_inputs
    backend = backend or get_backend()
    suites, dtypes = select_suites(backend, suites, dtypes)
    if seeds < 1:
        raise WorkbenchError("seeds must be at least 1")
    required = get_targets(default_target_names() if targets is None else targets)
    base_seed = random.SystemRandom().randrange(1 << 30) if base_seed is None else base_seed
    result = VerificationResult(block=spec.name, candidate=str(path), source_hash=source_hash(source),
                                backend=backend.name, verdict=Verdict.PASS, message="", base_seed=base_seed,
                                targets=[t.name for t in required], forward_only=forward_only,
                                isolation=isolation())

    reach = instrumentation_access(source)
    if reach:  # refused before it runs: code that reaches into the instrumentation could switch it off
        result.verdict = Verdict.INSTRUMENTATION_ACCESS
        result.message = f"reaches into the verifier's instrumentation: {reach}"
        result.checks = [integrity_check(Verdict.INSTRUMENTATION_ACCESS, result.message)]
        result.seconds = time.monotonic() - started
        return result
    probe = capture_probe(source)
    if probe:  # refused before it runs: host code that can tell the targets' capture from a GPU run
        result.verdict = Verdict.CAPTURE_DIVERGENCE
        result.message = f"host code that tells a capture from a run: {probe}"
        result.checks = [integrity_check(Verdict.CAPTURE_DIVERGENCE, result.message)]
        result.seconds = time.monotonic() - started
        return result
    trials, expected = build_trials(spec, backend, suites, dtypes, seeds, base_seed, forward_only)
    if not trials:
        raise WorkbenchError(f"nothing to verify: block {spec.name} has no shapes in suites {', '.join(suites)}")
    captures, result.findings = build_captures(spec, required) if required else ([], [])
    job = {"candidate": str(path), "arg_names": list(spec.arg_names), "grad_inputs": list(spec.grad_inputs),
           "in_place": spec.in_place_outputs, "trials": trials, "captures": captures, "device": backend.device,
           "token": secrets.token_hex(16), "forward_only": forward_only}
    job_dir = Path(tempfile.mkdtemp(prefix="verify-", dir=work_dir))
    try:
        # RLIMIT_AS caps host memory; CUDA maps far more address space than it uses, so no cap there.
        cap = memory_bytes if backend.device == "cpu" else None
        outcome = run_job(job_dir, job, backend.env, timeout_s, cap)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    result.output_tail, result.start = outcome.output_tail, "warm" if outcome.warm else "cold"
    if outcome.status != "ok":
        result.verdict, result.message = Verdict(outcome.status), outcome.message
    elif outcome.results.get("token") != job["token"]:
        result.verdict = Verdict.FORGED_REPORT
        result.message = "the result did not come from the verification worker (a candidate wrote its own report)"
    else:
        results = outcome.results
        by_id = {t["id"]: t for t in results["trials"]}
        numeric: dict[int, list[Check]] = {}
        if not results.get("load_error"):
            missing = {"error": {"kind": "runtime_error", "message": "no result for this trial"}}
            for exp in expected:
                numeric[exp["id"]] = check_trial(spec, exp, by_id.get(exp["id"], missing))
                result.checks += numeric[exp["id"]]
        result.checks += evaluate(spec, results, expected, by_id, numeric)
        if required and not results.get("load_error"):
            result.checks += _compile_for_targets(path, result, results, required, compile_cache)
        result.verdict, result.message = _verdict(result.checks)
        if results.get("load_error") and result.verdict == Verdict.PASS:
            err = results["load_error"]
            result.verdict, result.message = trial_verdict(err["kind"]), err["message"]
    result.seconds = time.monotonic() - started
    return result


def _compile_for_targets(path: Path, result: VerificationResult, results: dict, required, cache: Path | None,
                         probe_limit_s: float | None = None) -> list[Check]:
    """Compile the worker's captured launches for the required targets; keep every build and the findings on
    ``result``, and return one failed check per kernel x target that did not compile. probe_limit_s: a tuning
    probe's limit on one launch x target, a target's first failure ending its compiles."""
    started = time.monotonic()
    for capture in results.get("captures", []):
        if capture.get("error") and not capture.get("suite", "").startswith(PROBE):
            result.findings.append(f"{suite_phrase(capture['suite'])} launches incomplete: "
                                   f"{capture['error']['message']}"[:300])
    settings = Settings.load()
    cache = cache or settings.compile_cache or settings.work_dir / "compile-cache"
    launches = [launch for launch in results.get("launches", [])  # a probe's real-tensor twin is the integrity's
                if not launch["suite"].startswith(PROBE) or launch["suite"].startswith(SMOKE_PROBE)]
    limits = {"item_timeout_s": probe_limit_s, "first_failure_ends": True} if probe_limit_s else {}
    report = compile_for_targets(path, compile_key(path.read_text()), launches, required, cache_dir=cache, **limits)
    result.compile_seconds = time.monotonic() - started
    result.builds = [b.to_dict() for b in report.builds]
    result.findings += [f"spills: {b.target} {b.kernel} {b.spilled_bytes} B/thread at the {suite_phrase(b.suite)}"
                        for b in report.spills()]
    result.findings += [f"slow compile: {b.target} {b.kernel} {b.seconds:.0f} s ({suite_phrase(b.suite)})"
                        for b in report.slow()]
    # compiles, but the target cannot hold one CTA of it (shared memory or registers past the SM's): a launch fails
    result.findings += [f"cannot be resident: {b.target} {b.kernel} needs {b.shared_bytes} B shared memory, "
                        f"{b.registers} registers x {b.num_warps} warps ({suite_phrase(b.suite)})"
                        for b in report.builds if b.ok and b.ctas_per_sm == 0]
    refused = [integrity_check(Verdict(kind), f"in the compile child: {reason}") for kind, reason in report.integrity]
    if refused:  # nothing that child reported can be trusted: the builds say why they have no figures
        return refused
    failed: dict[tuple[str, str], Check] = {}
    for b in report.failures():
        failed.setdefault((b.target, b.kernel), Check(suite="target", shape=b.target, dtype=b.suite, seed=0,
                                                      direction=f"target:{b.target}", passed=False,
                                                      reason=f"{b.kernel}: {b.error}",
                                                      verdict=Verdict.TARGET_COMPILE_ERROR))
    return list(failed.values())


def target_report(path: str | Path, *, block: str | None = None, targets: list[str] | None = None,
                  compile_cache: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                  forward_only: bool = False, shapes: list[dict] | None = None,
                  suites: tuple[str, ...] = ("model",), probe_limit_s: float | None = None) -> VerificationResult:
    """The launches of a candidate at ``suites`` (the model suite's: the cards' sizes), captured in the sandbox
    without running anything, compiled for ``targets``: a VerificationResult with builds and findings only (verdict
    pass, or target_compile_error, or the sandbox's verdict). What ``workbench targets`` tabulates; no numerics are
    verified here. forward_only: the forward's launches only (an inference kernel without a backward); shapes: the
    model suite to compile at in place of the cards' (a benchmark's own sizes); probe_limit_s: a tuning probe's
    limit on one launch x target (a target's first launch that fails or runs past it ends that target's compiles)."""
    started = time.monotonic()
    path = Path(path).resolve()
    named_block, source = read_candidate(path)
    spec = get_block(block or named_block)
    forward_only = forward_only or not spec.grad_inputs
    required = get_targets(default_target_names() if targets is None else targets)
    result = VerificationResult(block=spec.name, candidate=str(path), source_hash=source_hash(source),
                                backend="capture", verdict="pass", message="", targets=[t.name for t in required],
                                forward_only=forward_only)
    captures, result.findings = build_captures(spec, required, shapes, suites)
    job = {"candidate": str(path), "arg_names": list(spec.arg_names), "grad_inputs": list(spec.grad_inputs),
           "in_place": spec.in_place_outputs, "trials": [], "captures": captures, "device": "cpu",
           "token": secrets.token_hex(16), "forward_only": forward_only}
    job_dir = Path(tempfile.mkdtemp(prefix="capture-"))
    try:
        outcome = run_job(job_dir, job, INTERPRETER.env, timeout_s, DEFAULT_MEMORY_BYTES)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    if outcome.status != "ok" or outcome.results.get("token") != job["token"]:
        result.verdict, result.message = outcome.status if outcome.status != "ok" else "forged_report", \
            outcome.message or "the result did not come from the verification worker"
    elif outcome.results.get("load_error"):
        result.verdict, result.message = outcome.results["load_error"]["kind"], \
            outcome.results["load_error"]["message"]
    else:
        result.checks = _compile_for_targets(path, result, outcome.results, required, compile_cache, probe_limit_s)
        result.verdict, result.message = _verdict(result.checks) if result.checks else \
            ("pass", f"{len(result.builds)} kernel x target builds")
        shapes = {c["id"]: c["shape"] for c in captures if c["suite"] == "model"}
        result.launches_per_call = {shapes[c["id"]]: c.get("launches", {}) for c in outcome.results["captures"]
                                    if c["id"] in shapes and not c.get("error")}
    result.seconds = time.monotonic() - started
    return result
