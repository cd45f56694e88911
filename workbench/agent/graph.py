r"""The porting workflow as a LangGraph StateGraph.

    plan -> render -> contract -> verify --pass--> tune --tuned point--> render (verified like any candidate)
               |         |          |  \             \--already tuned, or nothing better--> replay_gate
               |         |          |   \--pass, exploring--> revise   replay_gate --holds its curve--> promote
               +---------+----------+--fail--> diagnose -> revise --point left--> render     \--none--> record
                                                               \--budget or space spent--> tune | record
    plan | revise --exploring on several workers--> explore x N (Send) -> explored --enough passing--> tune
                                                                                   \--else--> revise

Tuning (workbench.agent.tune) takes the best passing candidate and searches, by compile-only probes at the model
suite, each required target's launch settings (the template's declared ``launch`` space) and, where a target still
spills, the template's neighbouring points; what it finds is rendered and verified as the next candidate, and
ranks among the passing ones as any other (spill-free first, then the modelled or measured time).

Exploring (``--explore N``) on an executor of several workers, the candidates that do not depend on each other go
side by side: the proposer's next untried points, as many as the workers, passing candidates still wanted and the
budget allow, each an ``explore`` branch (LangGraph ``Send``) that renders, reads, verifies and diagnoses its
candidate in a thread of its own while its verification runs on a worker; ``explored`` joins them.

The nodes are module-level functions of (state, runtime): the run's PortContext (block, templates, proposer,
store, backend, options) is LangGraph's runtime context, given when the graph is streamed; the routers between
them are named functions of the state. ``contract`` reads the candidate's source (it parses, it says its BLOCK,
its run has the reference's parameters) before anything runs it.

Every node writes a RunStep as it runs and streams it (``get_stream_writer``) to whoever drives the graph;
candidates and their checks are written when rendered and verified. Nodes are safe to run again after a crash (a
resumed run re-runs the node it was in): an iteration's candidate row is written once, its checks replaced.

A proposal carries a template point, or the module a model wrote (``source``), or the model's endpoint failure
(``error``: the iteration's verdict is llm_error). With approval asked for, promote first interrupts the graph
(LangGraph ``interrupt``) and goes on with the reviewer's answer: promoted, or rejected with the reason.

The replay gate is the last check before promotion: a short loss-curve replay of the small model with the best
passing candidate in this block's place (every other block on its reference), held against the reference curve
(workbench.replay); a candidate that leaves the band is passed over for the next passing one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send, interrupt
from sqlalchemy.engine import Engine

from workbench import __version__
from workbench.agent.diagnose import diagnose
from workbench.agent.llm import LLM_TEMPLATE
from workbench.agent.rank import rank_passing
from workbench.agent.state import Attempt, PortOptions, PortState, Proposal
from workbench.agent.tune import Figure, Tuner, probe_figures
from workbench.backends import Backend
from workbench.blocks.base import BlockSpec
from workbench.config import Settings
from workbench.errors import TemplateError
from workbench.executor import Executor, InProcessExecutor
from workbench.operators import launch_settings, promote_file
from workbench.perf.cost import modelled_summary
from workbench.perf.measure import MEASURE_TRIALS
from workbench.store import records
from workbench.store.models import utcnow
from workbench.templating import Template, candidate_filename, format_point
from workbench.verify.aot import PROBE_COMPILE_S
from workbench.verify.contract import contract_problem
from workbench.verify.harness import source_hash, suite_shapes
from workbench.vocabulary import NUMERIC_VERDICTS, FailureClass, ReplayStatus, RunStatus, Verdict

NODES_PER_ITERATION = 5  # render, contract, verify, diagnose, revise
TUNE_NODES = 6  # tune, and the tuned candidate's render, contract, verify, diagnose, revise


class Proposer(Protocol):
    """Chooses candidates: search (templates), llm (a chat model) or hybrid."""

    name: str

    def first(self) -> Proposal | None: ...

    def propose(self, current: Attempt, diagnosis: dict[str, Any], history: list[Attempt]) -> Proposal | None: ...

    def explore(self, current: Attempt, history: list[Attempt], n: int) -> list[Proposal]:
        """Up to ``n`` untried points to verify side by side once ``current`` passed (none: one at a time)."""
        ...


@dataclass
class PortContext:
    """What the nodes need besides the state: the block, its templates, the proposer, the store, the backend and
    the run's options (PortOptions, as recorded with the run); start: the first point, parsed. executor: where the
    sandboxed verifications and measurements run (workbench.executor; their results come back here, and only the
    nodes, in this process, write the store)."""

    spec: BlockSpec
    templates: dict[str, Template]
    proposer: Proposer
    engine: Engine
    settings: Settings
    backend: Backend
    options: PortOptions
    start: Proposal | None = None
    on_event: Callable[[str, str, dict], None] | None = None
    executor: Executor = field(default_factory=InProcessExecutor)

    @property
    def measures(self) -> bool:
        measure = self.options.measure
        return self.backend.device != "cpu" if measure is None else measure

    def emit(self, run_id: str, node: str, message: str, data: dict | None = None) -> None:
        """Write the step to the store, then stream it (custom stream mode); outside a graph run, hand it to
        on_event directly."""
        records.add_step(self.engine, run_id, node, message, data)
        try:
            writer = get_stream_writer()
        except RuntimeError:
            if self.on_event:
                self.on_event(node, message, data or {})
            return
        writer({"run_id": run_id, "node": node, "message": message, "data": data or {}})


def split_trace(proposal: Proposal | None) -> tuple[Proposal | None, dict]:
    """(the proposal as the state keeps it, its trace for the record)."""
    if proposal is None:
        return None, {}
    kept = {k: v for k, v in proposal.items() if k != "trace"}
    return Proposal(**kept), dict(proposal.get("trace") or {})


def describe(proposal: Proposal) -> str:
    text = f"{proposal['template']} {format_point(proposal['params'])} - {proposal['reason']}"
    return f"{text}; endpoint failed: {proposal['error']}" if "error" in proposal else text


# --- one candidate's steps: the loop's nodes below take them one at a time, an explore branch all in a row --------

def render_candidate(ctx: PortContext, run_id: str, attempt: int, p: Proposal) -> Attempt:
    """Iteration ``attempt`` of the proposal ``p`` written to the run's candidate folder and recorded (once, however
    often the step runs); a template that does not render, or a model endpoint that failed, has its verdict here."""
    current: Attempt = {"iteration": attempt, "template": p["template"], "params": p["params"], "why": p["reason"],
                        "tuned": p.get("tuned", {})}
    if "error" in p:  # the model's endpoint failed: the iteration's verdict, recorded like a candidate's
        cid = records.iteration_candidate(ctx.engine, run_id, attempt) or records.add_candidate(
            ctx.engine, run_id=run_id, block=ctx.spec.name, iteration=attempt, template=p["template"],
            params=p["params"], source="", source_hash=source_hash(""), path="", status=Verdict.LLM_ERROR,
            message=p["error"])
        current.update(verdict=Verdict.LLM_ERROR, message=p["error"], candidate_id=cid)
        ctx.emit(run_id, "render", f"#{attempt} {p['template']}: {Verdict.LLM_ERROR}: {p['error']}",
                 {"candidate_id": cid})
        return current
    if "source" in p:
        name, source = p["template"], p["source"]
    else:
        template = ctx.templates.get(p["template"])
        try:
            if template is None:
                raise TemplateError(f"no template '{p['template']}' for block {ctx.spec.name}")
            name, source = template.name, template.render(p["params"], p.get("tuned"))
        except TemplateError as exc:
            current.update(verdict=Verdict.TEMPLATE_ERROR, message=str(exc))
            ctx.emit(run_id, "render", f"#{attempt} {p['template']}: {exc}", dict(current))
            return current
    folder = ctx.settings.work_dir / "candidates" / run_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / candidate_filename(ctx.spec.name, name, source)
    path.write_text(source)
    cid = records.iteration_candidate(ctx.engine, run_id, attempt) or records.add_candidate(
        ctx.engine, run_id=run_id, block=ctx.spec.name, iteration=attempt, template=name, params=p["params"],
        launch=p.get("tuned"), source=source, source_hash=source_hash(source), path=str(path))
    current.update(candidate_id=cid, path=str(path))
    launch = "".join(f"; {t} {format_point(v)}" for t, v in p.get("tuned", {}).items())
    ctx.emit(run_id, "render", f"#{attempt} {name}: {format_point(p['params'])}{launch} - {p['reason']}",
             {"candidate_id": cid, "path": str(path)})
    return current


def contract_candidate(ctx: PortContext, run_id: str, current: Attempt) -> Attempt:
    """``current`` with the verdict compile_error when its source breaks the contract (read before anything runs
    it), else unchanged."""
    current = Attempt(**current)
    problem = contract_problem(Path(current["path"]).read_text(), current["path"], ctx.spec.name,
                               ctx.spec.arg_names)
    if problem:
        current.update(verdict=Verdict.COMPILE_ERROR, message=problem)
        records.set_candidate_status(ctx.engine, current["candidate_id"], Verdict.COMPILE_ERROR, problem)
        ctx.emit(run_id, "contract", f"compile_error: {problem}")
    else:
        ctx.emit(run_id, "contract",
                 f"ok: parses, BLOCK = \"{ctx.spec.name}\" and run({', '.join(ctx.spec.arg_names)})")
    return current


def verify_on_executor(ctx: PortContext, run_id: str, current: Attempt) -> tuple[Attempt, list[dict]]:
    """(``current`` with its verdict, target report and modelled or measured times; its checks): the sandboxed
    verification runs on the executor, this thread waits for it and records the result."""
    current = Attempt(**current)
    opts = ctx.options
    result = ctx.executor.verify(current["path"], block=ctx.spec.name, suites=opts.suites, dtypes=opts.dtypes,
                                 seeds=opts.seeds, backend=ctx.backend, timeout_s=opts.timeout_s,
                                 targets=opts.targets, forward_only=opts.forward_only)
    records.record_verification(ctx.engine, current["candidate_id"], result)
    target_report = result.target_report()
    modelled = modelled_summary(ctx.spec.name, suite_shapes(ctx.spec, "model"), result.builds, result.targets,
                                backward=not ctx.options.forward_only) if result.passed else {}
    current.update(verdict=result.verdict, message=result.message, worst_ratio=result.worst_ratio(),
                   target_report=target_report, modelled=modelled)
    if result.passed and ctx.measures:
        current["measured"] = measure(ctx, current["path"])
        figure = current["measured"]
        ctx.emit(run_id, "measure", f"#{current['iteration']} " + (
            f"{figure['time_ms']:.3f} ms measured on {figure['device']} ({figure['shapes']} shapes, median of "
            f"{MEASURE_TRIALS})" if "time_ms" in figure else f"not measured: {figure['error']}"), figure)
    where = f"; compiles on {len(target_report['compiles_on'])}/{len(result.targets)} targets" if result.targets else ""
    spills = f"; {len([f for f in result.findings if f.startswith('spills:')])} spill findings" \
        if any(f.startswith("spills:") for f in result.findings) else ""
    ctx.emit(run_id, "verify", f"{result.verdict}: {result.message} ({result.seconds:.1f} s){where}{spills}",
             result.summary())
    return current, [vars(c) for c in result.checks]


def diagnosis_of(ctx: PortContext, run_id: str, current: Attempt, checks: list[dict]) -> dict:
    """{"class", "reason", "symptoms"} of a failed ``current`` (``checks``: its verification's checks)."""
    template = ctx.templates.get(current["template"])
    if current["verdict"] == Verdict.LLM_ERROR:
        d = {"class": Verdict.LLM_ERROR, "reason": current["message"], "symptoms": {}}
    elif current["verdict"] == Verdict.TEMPLATE_ERROR or (template is None and current["template"] != LLM_TEMPLATE):
        d = {"class": Verdict.TEMPLATE_ERROR, "reason": current["message"], "symptoms": {}}
    else:
        checks = checks if current["verdict"] in (*NUMERIC_VERDICTS, Verdict.RUNTIME_ERROR, Verdict.CONSTANT_OUTPUT) \
            else []
        d = diagnose(current["verdict"], current["message"], checks, template, current["params"])
    ctx.emit(run_id, "diagnose", f"{d['class']}: {d['reason']}", {"class": d["class"]})
    return d


# --- nodes: each reads the run's context from LangGraph's runtime --------------------------------------------

def plan(state: PortState, runtime: Runtime[PortContext]) -> dict:
    ctx = runtime.context
    proposal, trace = split_trace(ctx.start or ctx.proposer.first())
    names = ", ".join(f"{t.name} (rank {t.rank})" for t in ctx.templates.values())
    first = {k: v for k, v in proposal.items() if k != "source"} if proposal else None
    batch = []
    if proposal and "source" not in proposal and "error" not in proposal:
        seen = Attempt(template=proposal["template"], params=proposal["params"])
        room = min(ctx.executor.workers, state["explore"], state["budget"]) - 1  # beside the first
        more = ctx.proposer.explore(seen, [seen], room) if room > 0 else []
        batch = [proposal, *more] if more else []
    ctx.emit(state["run_id"], "plan",
             f"proposer {ctx.proposer.name}; templates: {names or 'none'}; verify "
             f"{'+'.join(ctx.options.suites)} x {'/'.join(ctx.options.dtypes)} x {ctx.options.seeds} seeds on "
             f"{ctx.backend.name}; budget {state['budget']} candidates"
             + (f"; the first {len(batch)} side by side" if batch else "")
             + ("; promotion waits for approval" if ctx.options.approve else ""),
             {"templates": list(ctx.templates), "suites": ctx.options.suites, "dtypes": ctx.options.dtypes,
              "first": first, **({"llm": trace} if trace else {}), **({"batch": batch} if batch else {})})
    return {"proposal": proposal, "batch": batch, "attempt": 0, "status": "running",
            "reason": "" if proposal else "no template point meets the requirements of every shape"}

def render(state: PortState, runtime: Runtime[PortContext]) -> dict:
    current = render_candidate(runtime.context, state["run_id"], state["attempt"] + 1, state["proposal"])
    return {"attempt": current["iteration"], "current": current}

def check_contract(state: PortState, runtime: Runtime[PortContext]) -> dict:
    return {"current": contract_candidate(runtime.context, state["run_id"], state["current"])}

def verify(state: PortState, runtime: Runtime[PortContext]) -> dict:
    current, checks = verify_on_executor(runtime.context, state["run_id"], state["current"])
    update: dict[str, Any] = {"current": current, "last_checks": checks}
    if current["verdict"] == Verdict.PASS:
        update.update(history=[current], passing=[current])
    return update

def diagnose_failure(state: PortState, runtime: Runtime[PortContext]) -> dict:
    current = state["current"]
    d = diagnosis_of(runtime.context, state["run_id"], current, state.get("last_checks", []))
    return {"diagnosis": d, "history": [{**current, "diagnosis": d}], "last_checks": []}

def explore(state: PortState, runtime: Runtime[PortContext]) -> dict:
    """One of the candidates verified side by side (a LangGraph Send branch, in a thread of its own, its input
    {"run_id", "attempt", "proposal"}): rendered, read, verified and, failing, diagnosed in a row. It writes only
    the lists every branch adds to (history, passing)."""
    ctx, run_id = runtime.context, state["run_id"]
    current, checks = render_candidate(ctx, run_id, state["attempt"] + 1, state["proposal"]), []
    if not current.get("verdict"):
        current = contract_candidate(ctx, run_id, current)
    if not current.get("verdict"):
        current, checks = verify_on_executor(ctx, run_id, current)
    if current["verdict"] == Verdict.PASS:
        return {"history": [current], "passing": [current]}
    return {"history": [{**current, "diagnosis": diagnosis_of(ctx, run_id, current, checks)}]}

def explored(state: PortState, runtime: Runtime[PortContext]) -> dict:
    """After the candidates verified side by side: the count moves past them, and the last of them that passed
    (else the last, with its diagnosis) is the one the run goes on from."""
    first = state["attempt"] + 1
    batch = sorted((h for h in state["history"] if h.get("iteration", 0) >= first), key=lambda h: h["iteration"])
    current = next((h for h in reversed(batch) if h.get("verdict") == Verdict.PASS), batch[-1])
    passed = sum(h.get("verdict") == Verdict.PASS for h in batch)
    runtime.context.emit(state["run_id"], "explore",
                         f"#{first}-#{batch[-1]['iteration']} side by side: {passed} of {len(batch)} passed; "
                         f"{len(state['passing'])} passing of {state['explore']} wanted")
    return {"attempt": state["attempt"] + len(state["batch"]), "batch": [], "current": current,
            "diagnosis": current.get("diagnosis", {})}

def revise(state: PortState, runtime: Runtime[PortContext]) -> dict:
    ctx = runtime.context
    current = state["current"]
    passed = current.get("verdict") == Verdict.PASS
    if state.get("tuning") and state["passing"] and not passed:
        message = f"the tuned candidate failed ({current.get('verdict')}): the passing ones go on as they are"
        ctx.emit(state["run_id"], "revise", message)
        return {"proposal": None, "reason": message}
    if state["attempt"] >= state["budget"]:
        ctx.emit(state["run_id"], "revise", f"budget of {state['budget']} candidates spent")
        return {"proposal": None, "reason": f"budget of {state['budget']} candidates spent"}
    room = min(ctx.executor.workers, state["explore"] - len(state["passing"]), state["budget"] - state["attempt"])
    batch = ctx.proposer.explore(current, state["history"], room) if passed and room > 1 else []
    if len(batch) > 1:
        ctx.emit(state["run_id"], "revise", f"next {len(batch)} side by side: "
                 + "; ".join(f"{p['template']} {format_point(p['params'])}" for p in batch), {"batch": batch})
        return {"proposal": None, "batch": batch, "reason": ""}
    d = {"class": "explore", "reason": f"{len(state['passing'])} passing of {state['explore']} wanted",
         "symptoms": {}} if passed else state["diagnosis"]
    proposal, trace = split_trace(ctx.proposer.propose(current, d, state["history"]))
    message = f"next: {describe(proposal)}" if proposal else "every covering point of every template has been tried"
    shown = {k: v for k, v in proposal.items() if k != "source"} if proposal else None
    ctx.emit(state["run_id"], "revise", message, {"proposal": shown, **({"llm": trace} if trace else {})})
    return {"proposal": proposal, "reason": "" if proposal else message}

def tune(state: PortState, runtime: Runtime[PortContext]) -> dict:
    """The best passing candidate's launch settings per required target (and its point, where a target spills at
    every setting) searched by compile-only probes; a better one becomes the next candidate to verify."""
    ctx = runtime.context
    best = rank_passing(state["passing"], ctx.options.targets or [])[0][0]
    template = ctx.templates.get(best["template"])
    skip = "--tune-probes 0" if ctx.options.tune_probes <= 0 else \
        "no GPU targets required" if not ctx.options.targets else \
        "the candidate is no template's point" if template is None else \
        "no model card gives the block a model-suite shape: nothing to tune at a model's sizes" \
        if not suite_shapes(ctx.spec, "model") else ""
    if skip:
        ctx.emit(state["run_id"], "tune", f"tuning off: {skip}")
        return {"tuning": {"skipped": skip}, "proposal": None}
    folder = ctx.settings.work_dir / "candidates" / state["run_id"] / "tune"
    folder.mkdir(parents=True, exist_ok=True)
    def launch_table(params: dict) -> dict:  # the template's own LAUNCH_SETTINGS at a point ({}: it has none)
        return launch_settings(template.render(params)).get("per_target", {})

    tuner = Tuner(template, best["params"], launch_table,
                  ctx.options.targets, compile_probe(ctx, template, folder), budget=ctx.options.tune_probes,
                  seconds=ctx.options.tune_seconds,
                  covers=getattr(ctx.proposer, "covers", None) and (lambda p: ctx.proposer.covers(template, p)),
                  on_trial=lambda trial: ctx.emit(state["run_id"], "tune", f"probe {trial.probe} {trial.target}: "
                                                  f"{trial.why}{' -> best' if trial.moved else ''}",
                                                  trial.to_dict()),
                  imprecise=[h["params"] for h in state["history"] if h.get("template") == template.name and
                             (h.get("diagnosis") or {}).get("class") == FailureClass.PRECISION])
    outcome = tuner.run()
    records.add_tune_trials(ctx.engine, state["run_id"], ctx.spec.name, template.name,
                            [t.to_dict() for t in outcome.trials])
    tuning = {"from_candidate": best["candidate_id"], "params": outcome.params, "tuned": outcome.tuned,
              "probes": outcome.probes, "seconds": round(outcome.seconds, 1), "stopped": outcome.stopped,
              "best": {t: vars(f) for t, f in outcome.best.items()}}
    changed = outcome.params != best["params"] or outcome.tuned != best.get("tuned", {})
    ctx.emit(state["run_id"], "tune", f"tuned #{best['iteration']}: {outcome.summary()}"
             + ("" if changed else "; the passing candidate stands"), tuning)
    if not changed:
        return {"tuning": tuning, "proposal": None}
    moves = "".join(f"; {t} {format_point(v)}" for t, v in outcome.tuned.items())
    proposal = Proposal(template=template.name, params=outcome.params, tuned=outcome.tuned,
                        reason=f"tuned from #{best['iteration']} by {outcome.probes} compile-only probes{moves}")
    return {"tuning": tuning, "proposal": proposal}


def compile_probe(ctx: PortContext, template: Template, folder: Path):
    """The tuner's probe: the template rendered at a point with a per-target settings table, its model-suite
    launches captured in the sandbox and compiled for the targets asked (workbench.verify.harness.target_report),
    each target's figure modelled at the model suite. Where the port measures (a GPU backend), the target of the
    measuring device (learnt from the first probe's measurement) gets the measured time instead, wherever a probe
    compiled it spill-free."""
    from workbench.verify.harness import target_report

    shapes = suite_shapes(ctx.spec, "model")
    device: dict[str, str] = {}  # {"target": the measuring device's target ("" off a GPU)}, once measured

    def probe(params: dict, table: dict, targets: list[str]) -> dict[str, Figure]:
        source = template.render(params, table)
        path = folder / candidate_filename(ctx.spec.name, template.name, source)
        path.write_text(source)
        report = target_report(path, block=ctx.spec.name, targets=targets, forward_only=ctx.options.forward_only,
                               suites=("model", "smoke"), timeout_s=ctx.options.timeout_s,
                               probe_limit_s=PROBE_COMPILE_S)
        modelled = modelled_summary(ctx.spec.name, shapes, report.builds, targets,
                                    backward=not ctx.options.forward_only)
        figures = probe_figures(report, targets, modelled)
        local = device.get("target")
        if ctx.measures and (local is None or (local in figures and not figures[local].spills)):
            timing = measure(ctx, path)
            local = device.setdefault("target", timing.get("target", ""))
            if local in figures and not figures[local].spills:
                figures[local] = figures[local].timed(timing)
        return figures

    return probe


def replay_gate(state: PortState, runtime: Runtime[PortContext]) -> dict:
    ctx = runtime.context
    from workbench.replay.arch import replay_model_for
    from workbench.replay.presets import get_preset
    from workbench.replay.runner import run_replay

    ranked, why = rank_passing(state["passing"], ctx.options.targets or [])
    if why:
        ctx.emit(state["run_id"], "rank", why)
    model = replay_model_for(ctx.spec.name, ctx.options.replay_model, get_preset("tiny").layers)
    mode = ("lora" if ctx.spec.name == "lora_linear" else "scratch") if model else None
    if not ctx.options.replay_steps or mode is None or ctx.options.forward_only:
        why = "off" if not ctx.options.replay_steps else \
            "off for a forward-only port (training needs the backward)" if ctx.options.forward_only else \
            f"{ctx.spec.name} is not part of any card's replay model"
        ctx.emit(state["run_id"], "replay", f"replay gate {why}")
        return {"gate": {"candidate_id": ranked[0]["candidate_id"]}}
    failures = []
    for attempt in ranked:
        with ctx.executor.driver_slot():  # training children on the driver: no more at once than workers
            outcome = run_replay(model, mode, ctx.settings, steps=ctx.options.replay_steps,
                                 ops=["reference", f"{ctx.spec.name}={attempt['path']}"], backend=ctx.backend)
        ctx.emit(state["run_id"], "replay",
                 f"#{attempt['iteration']} {outcome.status}: {outcome.reason} (replay #{outcome.replay_id}, "
                 f"{ctx.options.replay_steps} {mode} steps)",
                 {"candidate_id": attempt["candidate_id"], "replay_id": outcome.replay_id,
                  "status": outcome.status, "left_band_step": outcome.left_band_step})
        if outcome.status == ReplayStatus.PASS:
            return {"gate": {"candidate_id": attempt["candidate_id"], "replay_id": outcome.replay_id,
                             "model": model, "mode": mode, "steps": ctx.options.replay_steps}}
        failures.append(f"#{attempt['iteration']} {outcome.reason}")
    return {"gate": {"candidate_id": None}, "status": RunStatus.BLOCKED,
            "reason": f"every passing candidate failed the replay gate: {'; '.join(failures)}"}

def promote(state: PortState, runtime: Runtime[PortContext]) -> dict:
    ctx = runtime.context
    decision = None
    if ctx.options.approve:  # first thing in the node: on resume the node runs again from here with the answer
        decision = interrupt({"run_id": state["run_id"], "question": "promote the best passing candidate?"})
        if not decision.get("approved"):
            reason = f"not promoted at review: {decision.get('why') or 'no reason given'}"
            ctx.emit(state["run_id"], "promote", reason)
            return {"status": RunStatus.REJECTED, "reason": reason}
    best = gated_candidate(state)
    source = Path(best["path"]).read_text()
    manifest = {
        "block": ctx.spec.name, "template": best["template"], "params": best["params"],
        "source_hash": source_hash(source), "run_id": state["run_id"], "candidate_id": best["candidate_id"],
        "promoted_at": utcnow().isoformat(timespec="seconds"), "workbench_version": __version__,
        "verification": {"backend": ctx.backend.name, "suites": ctx.options.suites, "dtypes": ctx.options.dtypes,
                         "seeds": ctx.options.seeds, "verdict": best["verdict"], "message": best["message"],
                         "worst_ratio": round(best["worst_ratio"], 4), "forward_only": ctx.options.forward_only},
        "launch_settings": launch_settings(source),
        **({"tuning": state["tuning"]} if state.get("tuning") else {}),
        "target_report": best.get("target_report", {}), "modelled": best.get("modelled", {}),
        **({"measured": best["measured"]} if best.get("measured") else {}),
        "replay": {k: v for k, v in state.get("gate", {}).items() if k != "candidate_id"},
    }
    if decision is not None:
        manifest["approval"] = {k: v for k, v in decision.items() if k in ("approved", "why", "by")}
    dest = promote_file(best["path"], ctx.settings.operators_dir, ctx.spec.name, manifest)
    reason = f"promoted {best['template']} ({format_point(best['params'])}), worst error " \
             f"{best['worst_ratio']:.2f} of the bound, {len(state['passing'])} passing"
    ctx.emit(state["run_id"], "promote", f"{reason} -> {dest}", {"operator": str(dest)})
    return {"status": RunStatus.PROMOTED, "operator_path": str(dest), "reason": reason}

def record(state: PortState, runtime: Runtime[PortContext]) -> dict:
    ctx = runtime.context
    status, reason = state.get("status"), state.get("reason", "")
    best_id = None
    if status in (RunStatus.PROMOTED, RunStatus.REJECTED):
        best_id = gated_candidate(state)["candidate_id"]
    elif state.get("gate", {}).get("candidate_id", 0) is None:  # passing candidates, none held its curve
        status, best_id = RunStatus.BLOCKED, min(state["passing"], key=lambda a: a["worst_ratio"])["candidate_id"]
    else:
        status = RunStatus.BLOCKED
        tried = [h for h in state.get("history", []) if h.get("candidate_id")]
        if tried:
            best = min(tried, key=lambda a: a.get("worst_ratio", float("inf")))
            best_id = best["candidate_id"]
            last = state.get("diagnosis", {})
            reason = f"{reason}; no passing candidate in {state['attempt']}; closest #{best['iteration']} " \
                     f"{best['template']} ({best.get('verdict')}); last diagnosis {last.get('class')}: " \
                     f"{last.get('reason', '')}"
    records.finish_run(ctx.engine, state["run_id"], status, reason, operator_path=state.get("operator_path"),
                       best_candidate_id=best_id)
    ctx.emit(state["run_id"], "record", f"{status}: {reason}")
    return {"status": status, "reason": reason}


# --- routers: which node follows, from the state alone ----------------------------------------------------------

def side_by_side_branches(state: PortState) -> list[Send]:
    """One explore branch for each proposal of the batch, numbered on from the candidates so far."""
    return [Send("explore", {"run_id": state["run_id"], "attempt": state["attempt"] + i, "proposal": proposal})
            for i, proposal in enumerate(state["batch"])]


def after_plan(state: PortState) -> str | list[Send]:
    if state.get("batch"):
        return side_by_side_branches(state)
    return "render" if state["proposal"] else "record"


def after_render(state: PortState) -> str:
    """A template that did not render has its verdict already: straight to the diagnosis."""
    return "diagnose" if state["current"].get("verdict") else "contract"


def after_contract(state: PortState) -> str:
    return "diagnose" if state["current"].get("verdict") else "verify"


def tune_or_gate(state: PortState) -> str:
    """With passing candidates: the tuning once, then the replay gate."""
    return "replay_gate" if state.get("tuning") else "tune"


def after_verify(state: PortState) -> str:
    """A pass collects the candidate (the tuning, then the gate, once ``explore`` have passed); anything else is
    diagnosed."""
    if state["current"]["verdict"] != Verdict.PASS:
        return "diagnose"
    return tune_or_gate(state) if len(state["passing"]) >= state["explore"] or state.get("tuning") else "revise"


def after_revise(state: PortState) -> str | list[Send]:
    """A batch is verified side by side, another proposal rendered; with none left, the passing candidates go to
    the gate, else the run ends."""
    if state.get("batch"):
        return side_by_side_branches(state)
    return "render" if state["proposal"] else (tune_or_gate(state) if state["passing"] else "record")


def after_explored(state: PortState) -> str:
    return tune_or_gate(state) if len(state["passing"]) >= state["explore"] else "revise"


def after_tune(state: PortState) -> str:
    return "render" if state.get("proposal") else "replay_gate"


def after_replay_gate(state: PortState) -> str:
    return "promote" if state["gate"]["candidate_id"] else "record"


NODES = {"plan": plan, "render": render, "contract": check_contract, "verify": verify, "diagnose": diagnose_failure,
         "explore": explore, "explored": explored, "revise": revise, "tune": tune, "replay_gate": replay_gate,
         "promote": promote,
         "record": record}


def build_graph(checkpointer=None):
    """The compiled StateGraph of a port; run it with ``context=PortContext(...)`` (LangGraph's runtime context,
    which each node reads as ``runtime.context``) and the input {"run_id", "block", "budget", "explore",
    "history", "passing"}. With a checkpointer (thread_id = the run id) a run can be resumed and approval can
    interrupt it."""
    graph = StateGraph(PortState, context_schema=PortContext)
    for name, node in NODES.items():
        graph.add_node(name, node)
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", after_plan, ["render", "record", "explore"])
    graph.add_conditional_edges("render", after_render, ["contract", "diagnose"])
    graph.add_conditional_edges("contract", after_contract, ["verify", "diagnose"])
    graph.add_conditional_edges("verify", after_verify, ["tune", "replay_gate", "revise", "diagnose"])
    graph.add_edge("diagnose", "revise")
    graph.add_conditional_edges("revise", after_revise, ["render", "tune", "replay_gate", "record", "explore"])
    graph.add_edge("explore", "explored")
    graph.add_conditional_edges("explored", after_explored, ["tune", "replay_gate", "revise"])
    graph.add_conditional_edges("tune", after_tune, ["render", "replay_gate"])
    graph.add_conditional_edges("replay_gate", after_replay_gate, ["promote", "record"])
    graph.add_edge("promote", "record")
    graph.add_edge("record", END)
    return graph.compile(checkpointer=checkpointer)


def measure(ctx: PortContext, path: str | Path) -> dict:
    """The candidate at ``path`` timed on the backend's device at measure_shapes (workbench.perf.measure's figure)."""
    return ctx.executor.measure(path, ctx.spec.name, measure_shapes(ctx), ctx.backend, dtype=ctx.options.dtypes[-1],
                                timeout_s=ctx.options.timeout_s, forward_only=ctx.options.forward_only)


def measure_shapes(ctx: PortContext) -> list[dict]:
    """The shapes a passing candidate is timed at: the model suite where the backend runs it (a GPU), else the
    first suite verified (the interpreter's timing serves the protocol's own tests, not a ranking worth having)."""
    suite = "model" if "model" in ctx.backend.suites else ctx.options.suites[0]
    return [dict(s) for s in suite_shapes(ctx.spec, suite)]


def gated_candidate(state: PortState) -> Attempt:
    """The passing candidate the replay gate let through."""
    return next(a for a in state["passing"] if a["candidate_id"] == state["gate"]["candidate_id"])


def recursion_limit(budget: int) -> int:
    return NODES_PER_ITERATION * budget + TUNE_NODES + 10
