"""The structured verification result (DESIGN.md): one Check per shape x dtype x seed x direction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from workbench.verify.aot import spill_counted
from workbench.vocabulary import Verdict


@dataclass
class Check:
    """One compared quantity. direction: "forward:<output>", "grad:<input>", "run" for a trial that failed,
    "target:<target>" for a kernel a target's compiler rejected, or "integrity:<verdict>" for a failed integrity
    check (suite "integrity"). verdict: what a failed check stands for (a Verdict: fail for numerics, the error of a
    trial that raised, target_compile_error, an integrity verdict); None when it passed."""

    suite: str
    shape: str
    dtype: str
    seed: int
    direction: str
    passed: bool
    reason: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    err_ratio: float | None = None
    ref_err: float | None = None
    bound: float | None = None
    nonfinite: int = 0
    verdict: str | None = None

    def __post_init__(self) -> None:
        if not self.passed and self.verdict is None:
            self.verdict = Verdict.FAIL

    def line(self) -> str:
        where = f"{self.direction} [{self.shape}] {self.dtype} seed {self.seed}"
        return f"{where}: {self.reason}" if self.reason else where


@dataclass
class VerificationResult:
    """verdict: a Verdict (workbench.vocabulary): pass, fail (numerics), a sandbox or trial error, or an integrity
    verdict. message: one line for people."""

    block: str
    candidate: str
    source_hash: str
    backend: str
    verdict: str
    message: str
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    base_seed: int = 0
    output_tail: str = ""
    targets: list[str] = field(default_factory=list)
    builds: list[dict] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    forward_only: bool = False  # only the outputs were verified: the backward was not
    isolation: str = ""  # the sandbox's isolation in force: "bwrap" or "audit" (workbench.verify.sandbox)
    start: str = ""  # how its job started: "warm" (a fork of the warm worker) or "cold" (a new interpreter)
    launches_per_call: dict = field(default_factory=dict)  # {model shape: {"fwd": n, "fwd+bwd": m}} (captures)

    def target_report(self) -> dict:
        """Where this verification showed the candidate to work: the backend (its suites and dtypes are in the
        checks), the targets each kernel compiled on and those without spills where they count (``spill_counted``: the
        launches captured for the target with its own settings, at the model and smoke suites), the static
        findings, whether the backward was verified, the sandbox's isolation and how its job started."""
        report = {t: [b for b in self.builds if b["target"] == t] for t in self.targets}
        compiled = [t for t, bs in report.items() if bs and all(b["ok"] for b in bs)]
        spill_free = [t for t in compiled if not any(spill_counted(b["suite"]) and b["spilled_bytes"]
                                                     for b in report[t])]
        return {"backend": self.backend, "targets": list(self.targets), "compiles_on": compiled,
                "spill_free_on": spill_free, "findings": list(self.findings),
                "backward": "not verified" if self.forward_only else "verified", "isolation": self.isolation,
                "start": self.start}

    @property
    def passed(self) -> bool:
        return self.verdict == Verdict.PASS

    def failing(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def worst_ratio(self) -> float:
        """Largest error / bound over all numeric checks (below 1 passes); inf when something failed to run."""
        ratios = [c.max_abs / c.bound for c in self.checks if c.max_abs is not None and c.bound]
        if any(c.direction == "run" for c in self.checks) or not ratios:
            return float("inf")
        return max(ratios)

    def summary(self) -> dict:
        failing = self.failing()
        return {
            "verdict": self.verdict,
            "message": self.message,
            "checks": len(self.checks),
            "failed": len(failing),
            "failing_shapes": sorted({f"{c.shape} {c.dtype}" for c in failing}),
            "worst_ratio": self.worst_ratio(),
            "seconds": round(self.seconds, 2),
            "compile_seconds": round(self.compile_seconds, 2),
            "backend": self.backend,
            "base_seed": self.base_seed,
            **{k: v for k, v in self.target_report().items() if k != "backend"},
        }

    def to_dict(self) -> dict:
        return asdict(self)
