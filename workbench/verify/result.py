"""The structured verification result (DESIGN.md): one Check per shape x dtype x seed x direction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Sandbox and per-trial outcomes that are not numerics: each is a verdict of its own.
ERROR_VERDICTS = ("compile_error", "runtime_error", "timeout", "crashed", "oom")


@dataclass
class Check:
    """One compared quantity. direction: "forward:<output>", "grad:<input>", "run" for a trial that failed, or
    "integrity:<verdict>" for a failed integrity check (suite "integrity")."""

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

    def line(self) -> str:
        where = f"{self.direction} [{self.shape}] {self.dtype} seed {self.seed}"
        return f"{where}: {self.reason}" if self.reason else where


@dataclass
class VerificationResult:
    """verdict: "pass", "fail" (numerics), or one of ERROR_VERDICTS. message: one line for people."""

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

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

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
            "backend": self.backend,
            "base_seed": self.base_seed,
        }

    def to_dict(self) -> dict:
        return asdict(self)
