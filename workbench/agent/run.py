"""Port one block: set up the context, record the run, drive the graph, and leave the record consistent whatever
happens (a crash of the workbench itself marks the run failed, Ctrl-C marks it interrupted)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.agent.graph import PortContext, build_graph, recursion_limit
from workbench.agent.search import SearchProposer
from workbench.agent.state import Proposal
from workbench.backends import Backend, get_backend
from workbench.blocks import get_block
from workbench.blocks.base import SUITES
from workbench.config import Settings
from workbench.errors import TemplateError, WorkbenchError
from workbench.store import get_engine, records
from workbench.templating import format_point, list_templates, load_template, parse_point
from workbench.verify.harness import DEFAULT_TIMEOUT_S, select_suites, suite_shapes

PROPOSERS = ("search",)


@dataclass
class PortOutcome:
    run_id: str
    block: str
    status: str
    reason: str
    operator_path: str | None
    attempts: int


def port_block(block: str, settings: Settings, *, budget: int = 8, explore: int = 1, start: str | None = None,
               proposer: str = "search", suites: list[str] | None = None, dtypes: list[str] | None = None,
               seeds: int = 2, backend: Backend | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
               model: str | None = None, on_event: Callable[[str, str, dict], None] | None = None) -> PortOutcome:
    """Run the agent on ``block``. start: "template:NAME=VALUE,..." to begin at a given point (missing params take
    the template's first covering choice). Raises WorkbenchError for bad arguments before any run is recorded."""
    spec = get_block(block)
    if proposer not in PROPOSERS:
        raise WorkbenchError(f"unknown proposer '{proposer}' (known: {', '.join(PROPOSERS)})")
    if min(budget, explore, seeds) < 1:
        raise WorkbenchError("--budget, --explore and --seeds must be at least 1")
    backend = backend or get_backend()
    suites, dtypes = select_suites(backend, suites, dtypes)
    templates = {t.name: t for t in list_templates(spec.name)}
    if not templates:
        raise WorkbenchError(f"block {spec.name} has no templates (templates/{spec.name}/*.py.j2)")
    # A promoted operator meets every suite (the model card's sizes too, even where only a GPU verifies them) and
    # hidden shapes drawn between them: the proposer plans for all of them, not just the suites verified here.
    shapes = [shape for suite in SUITES for shape in suite_shapes(spec, suite)]
    search = SearchProposer(list(templates.values()), shapes)
    start_proposal = _start_point(spec.name, start) if start else None

    engine = get_engine(settings.db_url)
    records.mark_interrupted(engine)
    config = {"suites": suites, "dtypes": dtypes, "seeds": seeds, "explore": explore, "start": start,
              "timeout_s": timeout_s}
    run_id = records.start_run(engine, block=spec.name, proposer=proposer, backend=backend.name, budget=budget,
                               config=config, model=model)
    ctx = PortContext(spec=spec, templates=templates, proposer=search, engine=engine, settings=settings,
                      backend=backend, suites=suites, dtypes=dtypes, seeds=seeds, timeout_s=timeout_s,
                      start=start_proposal, on_event=on_event)
    try:
        final = build_graph(ctx).invoke(
            {"run_id": run_id, "block": spec.name, "budget": budget, "explore": explore, "history": [],
             "passing": []},
            config={"recursion_limit": recursion_limit(budget)})
    except KeyboardInterrupt:
        records.finish_run(engine, run_id, "interrupted", "interrupted by the user")
        raise
    except Exception as exc:
        records.finish_run(engine, run_id, "failed", f"workbench error: {type(exc).__name__}: {exc}")
        raise
    return PortOutcome(run_id=run_id, block=spec.name, status=final["status"], reason=final["reason"],
                       operator_path=final.get("operator_path"), attempts=final.get("attempt", 0))


def _start_point(block: str, text: str) -> Proposal:
    name, params = parse_point(text)
    template = load_template(block, name)
    unknown = sorted(set(params) - set(template.params))
    if unknown:
        raise TemplateError(f"unknown parameter '{unknown[0]}' for template {template.ref} "
                            f"(has: {', '.join(template.params)})")
    for point in template.points():
        if all(point[k] == v for k, v in params.items()):
            return Proposal(template=name, params=point, reason=f"start point given: {format_point(params)}")
    template.validate({**next(template.points()), **params})
    raise TemplateError(f"{template.ref}: no valid point with {format_point(params)}")
