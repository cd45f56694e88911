"""CI verification jobs: re-verify every promoted operator and compare with the last recorded results, then replay
short loss curves of the small model with every promoted operator against the reference curves kept in the
repository (replays/<model>/tiny/).

A regression is a verdict that was "pass" and is not any more, a check (quantity x dtype) that passed and now
fails, or a replay that does not pass. The baseline is the newest of: the last passing CI job in the store, and
operators/ci_baseline.json (kept in the repository so a fresh clone has one). Results go to the store (ci_job) and,
on request, to JUnit XML with one testcase per operator x check and per replay.
"""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlmodel import Session, select

from workbench.backends import get_backend, get_targets
from workbench.config import Settings
from workbench.executor import Executor, InProcessExecutor
from workbench.integrations.parity import run_parity
from workbench.operators import is_forward_only, newest_promoted
from workbench.store import CIJob, get_engine, records, session_scope
from workbench.store.models import utcnow
from workbench.verify.harness import default_target_names
from workbench.verify.result import VerificationResult
from workbench.vocabulary import SANDBOX_VERDICTS, JobStatus, ParityStatus, ReplayStatus, Verdict

BASELINE_FILE = "ci_baseline.json"
CI_SEED = 20261129  # fixed inputs in CI, so that figures compare across commits
CI_REPLAY_MODELS = ("kimi-k3", "kimi-k3.1-pro")  # the shipped cards: K3's replay has MLA, K3.1 Pro's gated DSA
CI_REPLAYS = (("scratch", 4), ("lora", 3))  # (mode, steps) on the tiny preset: a few steps each on the interpreter
CI_REPLAY_TIMEOUT_S = 1800.0


@dataclass
class OperatorReport:
    block: str
    operator: str
    source_hash: str
    verdict: str
    message: str
    worst_ratio: float
    seconds: float
    checks: dict[str, bool]  # "forward:y float16" -> passed (all seeds and shapes)
    reasons: dict[str, str] = field(default_factory=dict)  # first failure reason per failing check
    regressions: list[str] = field(default_factory=list)

    def baseline_entry(self) -> dict[str, Any]:
        return {"operator": self.operator, "source_hash": self.source_hash, "verdict": self.verdict,
                "worst_ratio": self.worst_ratio, "checks": self.checks}


def _check_key(direction: str, dtype: str) -> str:
    """Checks grouped per quantity and dtype; every integrity check is one group, every run error another."""
    if direction.startswith("integrity:"):
        return "integrity"
    if direction.startswith("target:"):
        return f"compiles:{direction.removeprefix('target:')}"
    return "runs" if direction == "run" else f"{direction} {dtype}"


def summarize(block: str, result: VerificationResult) -> OperatorReport:
    """Per-check pass/fail of one verification; "sandbox" and "integrity" are always present."""
    checks: dict[str, bool] = {"sandbox": result.verdict not in SANDBOX_VERDICTS, "integrity": True}
    reasons: dict[str, str] = {} if checks["sandbox"] else {"sandbox": f"{result.verdict}: {result.message}"}
    for c in result.checks:
        key = _check_key(c.direction, c.dtype)
        checks[key] = checks.get(key, True) and c.passed
        if not c.passed and key not in reasons:
            reasons[key] = c.line()
    report = result.target_report()
    for target in result.targets:  # a target that compiled before and does not now, or new spills, regress
        checks[f"compiles:{target}"] = checks.get(f"compiles:{target}", True) and target in report["compiles_on"]
        checks[f"spill_free:{target}"] = target in report["spill_free_on"]
        if not checks[f"spill_free:{target}"] and checks[f"compiles:{target}"]:
            spills = [f for f in result.findings if f.startswith(f"spills: {target} ")]
            reasons[f"spill_free:{target}"] = "; ".join(spills)
    ratio = result.worst_ratio()
    return OperatorReport(block=block, operator=Path(result.candidate).name, source_hash=result.source_hash,
                          verdict=result.verdict, message=result.message,
                          worst_ratio=ratio if ratio != float("inf") else -1.0, seconds=round(result.seconds, 1),
                          checks=checks, reasons=reasons)


def load_baseline(settings: Settings) -> dict[str, dict]:
    """Per block, the last known results: the repository's baseline file where its entry is for the operator promoted
    now (its source hash: what was accepted there stands, an accepted regression included), else the store's last
    passing job, else the file. The store's job can predate the file's entry: a passing job from before a regression
    was accepted would report it again, and a --changed-only --update-baseline would write it back."""
    path = settings.operators_dir / BASELINE_FILE
    kept = json.loads(path.read_text()) if path.is_file() else {}
    with Session(get_engine(settings.db_url)) as s:
        job = s.exec(select(CIJob).where(CIJob.status == JobStatus.PASSED).order_by(CIJob.started_at.desc())).first()
    stored = job.summary.get("operators") or {} if job else {}
    current = {key: manifest.get("source_hash") for key, manifest in newest_promoted(settings.operators_dir).items()}
    accepted = {key for key, entry in kept.items() if entry.get("source_hash") == current.get(key)}
    return {**kept, **{key: entry for key, entry in stored.items() if key not in accepted}}


def regressions(report: OperatorReport, baseline: dict | None) -> list[str]:
    if not baseline:
        return [] if report.verdict == Verdict.PASS else [f"{report.block}: new operator fails: {report.message}"]
    found = []
    if baseline.get("verdict") == Verdict.PASS and report.verdict != Verdict.PASS:
        found.append(f"{report.block}: was pass, now {report.verdict}: {report.message}")
    for key, passed in report.checks.items():
        if baseline.get("checks", {}).get(key) and not passed:
            found.append(f"{report.block} {key}: passed before, now fails: {report.reasons.get(key, '')}")
    return found


@dataclass
class ReplayReport:
    model: str
    mode: str
    steps: int
    status: str
    reason: str
    replay_id: int
    seconds: float

    @property
    def name(self) -> str:
        return f"{self.model} {self.mode} tiny {self.steps} steps"


def run_replays(settings: Settings, replays: tuple[tuple[str, int], ...], timeout_s: float) -> list[ReplayReport]:
    """Each (mode, steps) replayed for each of CI_REPLAY_MODELS with every promoted operator against the stored
    reference."""
    import time

    from workbench.replay.runner import run_replay

    reports = []
    for model in CI_REPLAY_MODELS:
        for mode, steps in replays:
            start = time.perf_counter()
            outcome = run_replay(model, mode, settings, steps=steps, ops=["promoted"], timeout_s=timeout_s)
            reports.append(ReplayReport(model, mode, steps, outcome.status, outcome.reason, outcome.replay_id,
                                        round(time.perf_counter() - start, 1)))
    return reports


def current_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_ci(settings: Settings, *, changed_only: bool = False, seeds: int = 1, timeout_s: float = 300.0,
           replays: tuple[tuple[str, int], ...] = (), on_report=None, on_replay=None,
           targets: list[str] | None = None, executor: Executor | None = None,
           parity_sources: tuple[str, ...] = (), on_parity=None,
           ) -> tuple[CIJob, list[OperatorReport], list[ReplayReport], list]:
    """Verify the newest promoted operator of every block, then run ``replays`` ((mode, steps), see CI_REPLAYS),
    then ``workbench parity`` of each of ``parity_sources`` (model cards naming a transformers class: see
    workbench.integrations.parity.card_parity_sources); record the job, return it with the reports (the parity
    results recorded under the job). The job's status is "passed" unless there is a regression.
    executor: where the verifications run, all at once (default: in this process, one after another); the job is
    written here."""
    engine = get_engine(settings.db_url)
    baseline = load_baseline(settings)
    with session_scope(engine) as s:
        job = CIJob(commit=current_commit(), status=JobStatus.RUNNING)
        s.add(job)
        s.flush()
        job_id = job.id
    executor = executor or InProcessExecutor()
    backend = get_backend()
    # resolved here, where $WORKBENCH_TARGETS was set: a cluster node's environment may differ
    targets = [t.name for t in get_targets(default_target_names() if targets is None else targets)]
    chosen = {key: manifest for key, manifest in newest_promoted(settings.operators_dir).items()
              if not (changed_only and baseline.get(key)
                      and baseline[key].get("source_hash") == manifest.get("source_hash"))}
    # every verification submitted at once; their results read (and reported, and written) here, in order
    futures = {key: executor.submit_verification(manifest["path"], block=manifest["block"], backend=backend,
                                                 seeds=seeds, base_seed=CI_SEED, timeout_s=timeout_s,
                                                 targets=targets, forward_only=is_forward_only(manifest))
               for key, manifest in chosen.items()}
    reports = []
    for key, manifest in chosen.items():
        result = executor.settle(futures[key], manifest["path"], manifest["block"], backend)
        report = summarize(key, result)
        report.regressions = regressions(report, baseline.get(key))
        reports.append(report)
        if on_report:
            on_report(report)
    replay_reports = []
    for report in run_replays(settings, replays, CI_REPLAY_TIMEOUT_S) if replays else []:
        replay_reports.append(report)
        if on_replay:
            on_replay(report)
    parities = []
    for source in parity_sources:
        result = run_parity(source, backend=backend, operators_dir=settings.operators_dir)
        parities.append({**result.as_dict(), "id": records.record_parity(engine, result.as_dict(), ci_job_id=job_id)})
        if on_parity:
            on_parity(result)
    failed = [r for rep in reports for r in rep.regressions]
    failed += [f"replay {r.name}: {r.status}: {r.reason}" for r in replay_reports if r.status != ReplayStatus.PASS]
    failed += [f"parity {p['source']}: {p['status']}: {p['message']}" for p in parities
               if p["status"] != ParityStatus.PASS]
    summary = {"operators": {r.block: r.baseline_entry() for r in reports},
               "replays": [vars(r) for r in replay_reports],
               "parity": [{k: p[k] for k in ("id", "source", "status", "message", "seconds")} for p in parities],
               "regressions": failed, "seed": CI_SEED, "changed_only": changed_only}
    if changed_only:  # unchanged operators keep their last results in the baseline
        summary["operators"] = {**baseline, **summary["operators"]}
    with session_scope(engine) as s:
        job = s.get(CIJob, job_id)
        job.status = JobStatus.FAILED if failed else JobStatus.PASSED
        job.summary = summary
        job.finished_at = utcnow()
    return job, reports, replay_reports, parities


def write_junit(path: Path, job: CIJob, reports: list[OperatorReport], replays: list[ReplayReport] = (),
                parities: list[dict] = ()) -> None:
    """One testsuite, one testcase per operator x check, per replay and per parity run, failures with the reason."""
    cases = [(r, key, passed) for r in reports for key, passed in sorted(r.checks.items())]
    failures = sum(not p for _, _, p in cases) + sum(r.status != ReplayStatus.PASS for r in replays) + \
        sum(p["status"] != ParityStatus.PASS for p in parities)
    seconds = sum(r.seconds for r in reports) + sum(r.seconds for r in replays) + sum(p["seconds"] for p in parities)
    suite = ET.Element("testsuite", name="workbench-ci", tests=str(len(cases) + len(replays) + len(parities)),
                       failures=str(failures), time=str(seconds))
    for report, key, passed in cases:
        case = ET.SubElement(suite, "testcase", classname=f"operators.{report.block}", name=key,
                             file=report.operator)
        if not passed:
            failure = ET.SubElement(case, "failure", message=report.reasons.get(key, "failed")[:500])
            failure.text = report.message
    for replay in replays:
        case = ET.SubElement(suite, "testcase", classname="replays", name=replay.name, time=str(replay.seconds))
        if replay.status != ReplayStatus.PASS:
            ET.SubElement(case, "failure", message=f"{replay.status}: {replay.reason}"[:500])
    for parity in parities:
        case = ET.SubElement(suite, "testcase", classname="parity", name=parity["source"],
                             time=str(round(parity["seconds"], 1)))
        if parity["status"] != ParityStatus.PASS:
            ET.SubElement(case, "failure", message=f"{parity['status']}: {parity['message']}"[:500])
    ET.SubElement(suite, "properties").append(ET.Element("property", name="commit", value=job.commit))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def record_junit(settings: Settings, job: CIJob, path: Path) -> None:
    """The job's row says where its JUnit report was written."""
    with session_scope(get_engine(settings.db_url)) as s:
        s.get(CIJob, job.id).junit_path = str(path)


def write_baseline(settings: Settings, job: CIJob) -> Path:
    """operators/ci_baseline.json from ``job``: every operator it verified, and with --changed-only the last results
    of those it left alone; an entry of a block no longer promoted is dropped."""
    path = settings.operators_dir / BASELINE_FILE
    promoted = newest_promoted(settings.operators_dir)
    entries = {k: v for k, v in job.summary["operators"].items() if k in promoted}
    path.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return path
