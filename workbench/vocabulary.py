"""The words the workbench reports in, in one place: verdicts, failure classes and statuses, and the tone each is
shown in. Verify, agent, store, CLI and dashboard all import these; each word is a StrEnum member, so it is stored,
serialised and compared as the plain string it has always been ("pass" == Verdict.PASS).

Also the one way a mapping of names to values is written (key_values). A leaf module: it imports nothing from the
workbench.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


def key_values(pairs: Mapping, sep: str = ", ") -> str:
    """``{"rows": 3, "N": 64}`` -> ``"rows=3, N=64"`` (``sep`` between the pairs): how points, shapes and
    parameters are written everywhere."""
    return sep.join(f"{k}={v}" for k, v in pairs.items())


class Verdict(StrEnum):
    """What the verification of one candidate concluded (VerificationResult.verdict, Candidate.status)."""

    PASS = "pass"
    FAIL = "fail"  # the numerics: at least one check past its bound
    # outcomes of the sandbox and of single trials, not numerics
    COMPILE_ERROR = "compile_error"  # the candidate does not import (syntax, contract, a kernel that does not build)
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OOM = "oom"
    TARGET_COMPILE_ERROR = "target_compile_error"  # a required GPU target's compiler rejects a kernel the suite ran
    INTERPRETER_UNSUPPORTED = "interpreter_unsupported"  # a known limitation of the interpreter, not of the kernel
    # integrity: the candidate cheated or could not be trusted (workbench.verify.integrity), in report order
    INSTRUMENTATION_ACCESS = "instrumentation_access"
    FORGED_REPORT = "forged_report"
    FORBIDDEN_IMPORT = "forbidden_import"
    INTROSPECTION = "introspection"
    FORBIDDEN_CALL = "forbidden_call"
    MONKEYPATCH = "monkeypatch"
    TORCH_FALLBACK = "torch_fallback"
    NO_KERNEL = "no_kernel"
    TENSOR_SUBCLASS = "tensor_subclass"
    ALIASING = "aliasing"
    INPUT_MUTATION = "input_mutation"
    NOT_IN_PLACE = "not_in_place"  # a cache the block updates in place came back in new memory
    UNWRITTEN_OUTPUT = "unwritten_output"
    CACHED_RESULT = "cached_result"
    CONSTANT_OUTPUT = "constant_output"
    NONDETERMINISTIC = "nondeterministic"
    CAPTURE_DIVERGENCE = "capture_divergence"  # host code launching otherwise on a capture's meta tensors
    OVERFIT_SHAPES = "overfit_shapes"
    # iterations of a port that produced no verifiable candidate
    LLM_ERROR = "llm_error"  # the model endpoint failed
    TEMPLATE_ERROR = "template_error"  # the template did not render


ERROR_VERDICTS = (Verdict.COMPILE_ERROR, Verdict.RUNTIME_ERROR, Verdict.TIMEOUT, Verdict.CRASHED, Verdict.OOM,
                  Verdict.TARGET_COMPILE_ERROR, Verdict.INTERPRETER_UNSUPPORTED)
INTEGRITY_VERDICTS = (
    Verdict.INSTRUMENTATION_ACCESS, Verdict.FORGED_REPORT, Verdict.FORBIDDEN_IMPORT, Verdict.INTROSPECTION,
    Verdict.FORBIDDEN_CALL, Verdict.MONKEYPATCH, Verdict.TORCH_FALLBACK, Verdict.NO_KERNEL, Verdict.TENSOR_SUBCLASS,
    Verdict.ALIASING, Verdict.INPUT_MUTATION, Verdict.NOT_IN_PLACE, Verdict.UNWRITTEN_OUTPUT,
    Verdict.CACHED_RESULT, Verdict.CONSTANT_OUTPUT, Verdict.NONDETERMINISTIC, Verdict.CAPTURE_DIVERGENCE,
    Verdict.OVERFIT_SHAPES)
"""The integrity verdicts in priority order: workbench.verify.integrity.PRIORITY (its table of checks) names them so,
and a test holds the two equal."""
RUN_VERDICTS = (Verdict.COMPILE_ERROR, Verdict.OOM, Verdict.INTERPRETER_UNSUPPORTED, Verdict.RUNTIME_ERROR)
"""What a trial that raised concluded, in priority order (the first found among a candidate's trials speaks)."""
# The candidate's process did not finish its job: the sandbox's own verdicts.
SANDBOX_VERDICTS = (Verdict.COMPILE_ERROR, Verdict.TIMEOUT, Verdict.CRASHED, Verdict.OOM)
# Verdicts whose checks say where the numbers went wrong: the diagnosis reads them.
NUMERIC_VERDICTS = (Verdict.FAIL, Verdict.UNWRITTEN_OUTPUT)


class FailureClass(StrEnum):
    """A diagnosis of a numeric failure (workbench.agent.diagnose); any other verdict is its own class."""

    COVERAGE = "coverage"  # fails exactly where a template requirement (BLOCK_N >= N) does not hold
    PRECISION = "precision"
    NONFINITE = "nonfinite"
    TAIL = "tail"  # only shapes with non-power-of-two sizes fail
    GRADIENT = "gradient"  # only gradients fail
    WRONG = "wrong"


class RunStatus(StrEnum):
    """Where one port run stands (PortRun.status)."""

    RUNNING = "running"
    PROMOTED = "promoted"
    BLOCKED = "blocked"
    REJECTED = "rejected"
    WAITING_APPROVAL = "waiting_approval"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class BlockStatus(StrEnum):
    """Where one block of a model stands (workbench plan, the dashboard's overview), in the order shown."""

    NO_SPEC = "no spec"
    NOT_STARTED = "not started"
    IN_PROGRESS = "in progress"
    BLOCKED = "blocked"
    FAILED = "failed"
    NUMERICS_PASS = "numerics pass"
    PROMOTED = "promoted"


class ReplayStatus(StrEnum):
    """A loss-curve replay (LossReplay.status)."""

    RUNNING = "running"
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    REFERENCE = "reference"  # a recorded reference run


class JobStatus(StrEnum):
    """A CI verification job (CIJob.status)."""

    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"


class ParityStatus(StrEnum):
    """A parity run of the published modeling code against the ported kernels (ParityRun.status)."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


RENDERED = "rendered"  # a candidate written to disk and not yet verified (Candidate.status)


class Tone(StrEnum):
    """How a word is shown: the CLI and the dashboard each give every tone one colour."""

    GOOD = "good"  # passed, promoted
    CLOSE = "close"  # numerics pass, waiting for approval: one step from good
    BUSY = "busy"  # running, in progress
    BAD = "bad"  # wrong numbers, cheats, blocked, interrupted
    BROKEN = "broken"  # the candidate's code does not build or run
    LIMIT = "limit"  # the sandbox stopped it (time, memory), or the run failed
    SET_ASIDE = "set_aside"  # rejected by a person
    IDLE = "idle"  # not started, rendered
    ABSENT = "absent"  # no spec


TONE: dict[str, Tone] = {
    **{v: Tone.BAD for v in INTEGRITY_VERDICTS},
    Verdict.PASS: Tone.GOOD, Verdict.FAIL: Tone.BAD,
    Verdict.COMPILE_ERROR: Tone.BROKEN, Verdict.RUNTIME_ERROR: Tone.BROKEN, Verdict.TARGET_COMPILE_ERROR: Tone.BROKEN,
    Verdict.INTERPRETER_UNSUPPORTED: Tone.BROKEN, Verdict.LLM_ERROR: Tone.BROKEN, Verdict.TEMPLATE_ERROR: Tone.BROKEN,
    Verdict.TIMEOUT: Tone.LIMIT, Verdict.CRASHED: Tone.LIMIT, Verdict.OOM: Tone.LIMIT,
    RENDERED: Tone.IDLE,
    RunStatus.RUNNING: Tone.BUSY, RunStatus.PROMOTED: Tone.GOOD, RunStatus.BLOCKED: Tone.BAD,
    RunStatus.REJECTED: Tone.SET_ASIDE, RunStatus.WAITING_APPROVAL: Tone.CLOSE, RunStatus.INTERRUPTED: Tone.BAD,
    RunStatus.FAILED: Tone.LIMIT,
    BlockStatus.NO_SPEC: Tone.ABSENT, BlockStatus.NOT_STARTED: Tone.IDLE, BlockStatus.IN_PROGRESS: Tone.BUSY,
    BlockStatus.NUMERICS_PASS: Tone.CLOSE,
    ReplayStatus.ERROR: Tone.BROKEN, ReplayStatus.REFERENCE: Tone.IDLE,
    JobStatus.PASSED: Tone.GOOD,
}
LIGHT_TONES = (Tone.BUSY, Tone.IDLE, Tone.ABSENT)  # tones shown with dark text on their colour


def tone(word: str) -> Tone | None:
    """The tone of a verdict or status word; None for a word the workbench does not report."""
    return TONE.get(str(word))
