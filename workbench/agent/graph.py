r"""The porting workflow as a LangGraph StateGraph.

    plan -> render -> compile -> verify --pass--> promote -> record -> END
               |         |         |  \--pass, exploring--> revise
               +---------+---------+--fail--> diagnose -> revise --point left--> render
                                                              \--budget or space spent--> promote | record (blocked)

Every node writes a RunStep as it runs; candidates and their checks are written when rendered and verified.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.graph import END, START, StateGraph
from sqlalchemy.engine import Engine

from workbench import __version__
from workbench.agent.diagnose import NUMERIC_VERDICTS, diagnose
from workbench.agent.search import SearchProposer, point_key
from workbench.agent.state import Attempt, PortState, Proposal
from workbench.backends import Backend
from workbench.blocks.base import BlockSpec
from workbench.config import Settings
from workbench.errors import TemplateError
from workbench.operators import promote_file
from workbench.store import records
from workbench.store.models import utcnow
from workbench.templating import Template, candidate_filename, format_point
from workbench.verify.harness import source_hash, verify_candidate

NODES_PER_ITERATION = 5  # render, compile, verify, diagnose, revise


@dataclass
class PortContext:
    """What the nodes need besides the state: the block, its templates, the proposer, the store and the limits."""

    spec: BlockSpec
    templates: dict[str, Template]
    proposer: SearchProposer
    engine: Engine
    settings: Settings
    backend: Backend
    suites: list[str]
    dtypes: list[str]
    seeds: int
    timeout_s: float
    start: Proposal | None = None
    on_event: Callable[[str, str, dict], None] | None = None

    def emit(self, run_id: str, node: str, message: str, data: dict | None = None) -> None:
        records.add_step(self.engine, run_id, node, message, data)
        if self.on_event:
            self.on_event(node, message, data or {})


def check_contract(source: str, path: str, spec: BlockSpec) -> str | None:
    """None when ``source`` compiles and defines BLOCK = spec.name and run(<the reference's parameters>)."""
    try:
        tree = ast.parse(compile(source, path, "exec", flags=ast.PyCF_ONLY_AST))
    except SyntaxError as exc:
        return f"{Path(path).name}:{exc.lineno}: SyntaxError: {exc.msg}"
    runs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not runs:
        return "no module-level function run"
    args = tuple(a.arg for a in runs[-1].args.args)
    if args != spec.arg_names:
        return f"run({', '.join(args)}) does not match the reference's signature ({', '.join(spec.arg_names)})"
    return None


def build_graph(ctx: PortContext):
    """The compiled StateGraph for one block; invoke with {"run_id", "block", "budget", "explore"}."""

    def plan(state: PortState) -> dict:
        proposal = ctx.start or ctx.proposer.first()
        names = ", ".join(f"{t.name} (rank {t.rank})" for t in ctx.templates.values())
        ctx.emit(state["run_id"], "plan",
                 f"templates: {names}; verify {'+'.join(ctx.suites)} x {'/'.join(ctx.dtypes)} x {ctx.seeds} seeds "
                 f"on {ctx.backend.name}; budget {state['budget']} candidates",
                 {"templates": list(ctx.templates), "suites": ctx.suites, "dtypes": ctx.dtypes,
                  "first": proposal})
        return {"proposal": proposal, "attempt": 0, "status": "running",
                "reason": "" if proposal else "no template point meets the requirements of every shape"}

    def render(state: PortState) -> dict:
        p = state["proposal"]
        attempt = state["attempt"] + 1
        current: Attempt = {"iteration": attempt, "template": p["template"], "params": p["params"], "why": p["reason"]}
        template = ctx.templates.get(p["template"])
        try:
            if template is None:
                raise TemplateError(f"no template '{p['template']}' for block {ctx.spec.name}")
            source = template.render(p["params"])
        except TemplateError as exc:
            current.update(verdict="template_error", message=str(exc))
            ctx.emit(state["run_id"], "render", f"#{attempt} {p['template']}: {exc}", dict(current))
            return {"attempt": attempt, "current": current}
        folder = ctx.settings.work_dir / "candidates" / state["run_id"]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / candidate_filename(ctx.spec.name, template.name, source)
        path.write_text(source)
        cid = records.add_candidate(ctx.engine, run_id=state["run_id"], block=ctx.spec.name, iteration=attempt,
                                    template=template.name, params=p["params"], source=source,
                                    source_hash=source_hash(source), path=str(path))
        current.update(candidate_id=cid, path=str(path))
        ctx.emit(state["run_id"], "render", f"#{attempt} {template.name}: {format_point(p['params'])} - {p['reason']}",
                 {"candidate_id": cid, "path": str(path)})
        return {"attempt": attempt, "current": current}

    def compile_node(state: PortState) -> dict:
        current = dict(state["current"])
        problem = check_contract(Path(current["path"]).read_text(), current["path"], ctx.spec)
        if problem:
            current.update(verdict="compile_error", message=problem)
            records.set_candidate_status(ctx.engine, current["candidate_id"], "compile_error", problem)
            ctx.emit(state["run_id"], "compile", f"compile_error: {problem}")
        else:
            ctx.emit(state["run_id"], "compile", f"ok: compiles, BLOCK and run({', '.join(ctx.spec.arg_names)})")
        return {"current": current}

    def verify(state: PortState) -> dict:
        current = dict(state["current"])
        result = verify_candidate(current["path"], block=ctx.spec.name, suites=ctx.suites, dtypes=ctx.dtypes,
                                  seeds=ctx.seeds, backend=ctx.backend, timeout_s=ctx.timeout_s)
        records.record_verification(ctx.engine, current["candidate_id"], result)
        current.update(verdict=result.verdict, message=result.message, worst_ratio=result.worst_ratio())
        ctx.emit(state["run_id"], "verify", f"{result.verdict}: {result.message} ({result.seconds:.1f} s)",
                 result.summary())
        update: dict[str, Any] = {"current": current, "last_checks": [vars(c) for c in result.checks]}
        if result.passed:
            update.update(history=[current], passing=[current])
        return update

    def diagnose_node(state: PortState) -> dict:
        current = state["current"]
        template = ctx.templates.get(current["template"])
        if current["verdict"] == "template_error" or template is None:
            d = {"class": "template_error", "reason": current["message"], "evidence": {}}
        else:
            checks = state.get("last_checks", []) if current["verdict"] in NUMERIC_VERDICTS else []
            d = diagnose(current["verdict"], current["message"], checks, template, current["params"])
        ctx.emit(state["run_id"], "diagnose", f"{d['class']}: {d['reason']}", {"class": d["class"]})
        return {"diagnosis": d, "history": [{**current, "diagnosis": d}], "last_checks": []}

    def revise(state: PortState) -> dict:
        current = state["current"]
        passed = current.get("verdict") == "pass"
        if state["attempt"] >= state["budget"]:
            ctx.emit(state["run_id"], "revise", f"budget of {state['budget']} candidates spent")
            return {"proposal": None, "reason": f"budget of {state['budget']} candidates spent"}
        tried = {point_key(h["template"], h["params"]) for h in state["history"]}
        d = {"class": "explore", "reason": f"{len(state['passing'])} passing of {state['explore']} wanted",
             "evidence": {}} if passed else state["diagnosis"]
        proposal = ctx.proposer.revise(current["template"], current["params"], d, tried)
        message = f"next: {proposal['template']} {format_point(proposal['params'])} - {proposal['reason']}" \
            if proposal else "every covering point of every template has been tried"
        ctx.emit(state["run_id"], "revise", message, {"proposal": proposal})
        return {"proposal": proposal, "reason": "" if proposal else message}

    def promote(state: PortState) -> dict:
        best = min(state["passing"], key=lambda a: a["worst_ratio"])
        source = Path(best["path"]).read_text()
        manifest = {
            "block": ctx.spec.name, "template": best["template"], "params": best["params"],
            "source_hash": source_hash(source), "run_id": state["run_id"], "candidate_id": best["candidate_id"],
            "promoted_at": utcnow().isoformat(timespec="seconds"), "workbench_version": __version__,
            "verification": {"backend": ctx.backend.name, "suites": ctx.suites, "dtypes": ctx.dtypes,
                             "seeds": ctx.seeds, "verdict": best["verdict"], "message": best["message"],
                             "worst_ratio": round(best["worst_ratio"], 4)},
        }
        dest = promote_file(best["path"], ctx.settings.operators_dir, ctx.spec.name, manifest)
        reason = f"promoted {best['template']} ({format_point(best['params'])}), worst error " \
                 f"{best['worst_ratio']:.2f} of the bound, {len(state['passing'])} passing"
        ctx.emit(state["run_id"], "promote", f"{reason} -> {dest}", {"operator": str(dest)})
        return {"status": "promoted", "operator_path": str(dest), "reason": reason}

    def record(state: PortState) -> dict:
        status, reason = state.get("status"), state.get("reason", "")
        best_id = None
        if status == "promoted":
            best_id = min(state["passing"], key=lambda a: a["worst_ratio"])["candidate_id"]
        else:
            status = "blocked"
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

    graph = StateGraph(PortState)
    for name, fn in [("plan", plan), ("render", render), ("compile", compile_node), ("verify", verify),
                     ("diagnose", diagnose_node), ("revise", revise), ("promote", promote), ("record", record)]:
        graph.add_node(name, fn)
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", lambda s: "render" if s["proposal"] else "record", ["render", "record"])
    graph.add_conditional_edges("render", lambda s: "diagnose" if s["current"].get("verdict") else "compile",
                                ["compile", "diagnose"])
    graph.add_conditional_edges("compile", lambda s: "diagnose" if s["current"].get("verdict") else "verify",
                                ["verify", "diagnose"])
    graph.add_conditional_edges(
        "verify",
        lambda s: ("promote" if len(s["passing"]) >= s["explore"] else "revise")
        if s["current"]["verdict"] == "pass" else "diagnose",
        ["promote", "revise", "diagnose"])
    graph.add_edge("diagnose", "revise")
    graph.add_conditional_edges(
        "revise", lambda s: "render" if s["proposal"] else ("promote" if s["passing"] else "record"),
        ["render", "promote", "record"])
    graph.add_edge("promote", "record")
    graph.add_edge("record", END)
    return graph.compile()


def recursion_limit(budget: int) -> int:
    return NODES_PER_ITERATION * budget + 10
