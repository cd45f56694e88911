"""Port one block: set up the context, record the run, drive the graph, and leave the record consistent whatever
happens (a crash of the workbench itself marks the run failed, Ctrl-C marks it interrupted).

The graph is checkpointed after every node (LangGraph's SqliteSaver, in its own file beside the store, thread id =
run id), so a run that was killed, interrupted or failed is taken up again from its last completed node
(resume_port). With approval asked for, a run stops before promotion as waiting_approval; decide() answers it.
Node events are streamed (stream_mode "custom") to ``on_event`` as they happen; the nodes write them to the store.

Several blocks (a whole model) are ported at once by port_blocks: each block's graph in a driver thread of its own,
whose verify step hands the sandboxed verification to the executor (a Ray task) and waits for it, so every write to
the store, the checkpoints and operators/ stays in this process (an engine session per write, a checkpoint
connection per run).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from workbench import vocabulary
from workbench.agent.graph import PortContext, Proposer, build_graph, gated_candidate, recursion_limit
from workbench.agent.llm import HybridProposer, LLMConfig, LLMProposer, require_client, resolve_model
from workbench.agent.search import SearchProposer
from workbench.agent.state import DEFAULT_REPLAY_MODEL, PortOptions, Proposal
from workbench.agent.tune import DEFAULT_PROBES, DEFAULT_SECONDS
from workbench.backends import BACKENDS, Backend, get_backend, get_targets
from workbench.blocks import get_block
from workbench.blocks.base import SUITES, BlockSpec
from workbench.config import Settings
from workbench.errors import TemplateError, WorkbenchError
from workbench.executor import Executor, InProcessExecutor
from workbench.store import get_engine, records
from workbench.store.queries import candidate_checks, find_run
from workbench.templating import format_point, list_templates, load_template, parse_point
from workbench.verify.harness import DEFAULT_TIMEOUT_S, default_target_names, select_suites, suite_shapes
from workbench.vocabulary import RunStatus

PROPOSERS = ("search", "llm", "hybrid")
ENDED = (RunStatus.PROMOTED, RunStatus.BLOCKED, RunStatus.REJECTED)
WAITING = RunStatus.WAITING_APPROVAL

EventHook = Callable[[str, str, dict], None]
BlockEventHook = Callable[[str, str, str, dict], None]  # (block, node, message, data)
STOP_WAIT_S = 10.0  # after Ctrl-C, how long each block's port may take to record that it was interrupted


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
               model: str | None = None, on_event: EventHook | None = None, llm: LLMConfig | None = None,
               chat=None, approve: bool = False, replay_steps: int = 0, targets: list[str] | None = None,
               forward_only: bool = False, measure: bool | None = None, tune_probes: int = DEFAULT_PROBES,
               tune_seconds: float = DEFAULT_SECONDS, executor: Executor | None = None) -> PortOutcome:
    """Run the agent on ``block``. start: "template:NAME=VALUE,..." to begin at a given point (missing params take
    the template's first covering choice); for the llm proposer, the starting candidate shown to the model.
    llm: the endpoint of the llm and hybrid proposers (default: $WORKBENCH_LLM_*); chat: a langchain chat model to
    use instead of one on that endpoint. approve: stop before promotion until decide() is called.
    replay_steps: steps of the replay gate before promotion (0: none; the replay uses ``model``'s name, default
    kimi-k3.1-pro). targets: the GPU targets every candidate must compile for (default: $WORKBENCH_TARGETS, else
    the defaults). forward_only: an inference port (outputs verified, the backward not, no replay gate; the
    manifest says so). measure: time each passing candidate at the model suite and rank by the measured times
    (None: on a GPU backend). tune_probes: the compile-only probes the tuning of the chosen candidate may spend
    (workbench.agent.tune; 0: none; three times as many while a target spills); tune_seconds: the wall time after
    which the tuning starts no probe. executor: where verifications run (default: in this process). Raises
    WorkbenchError for bad arguments before any run is recorded."""
    spec = get_block(block)
    if proposer not in PROPOSERS:
        raise WorkbenchError(f"unknown proposer '{proposer}' (known: {', '.join(PROPOSERS)})")
    if min(budget, explore, seeds) < 1:
        raise WorkbenchError("--budget, --explore and --seeds must be at least 1")
    if replay_steps < 0:
        raise WorkbenchError("--replay-steps must be 0 (no replay gate) or more")
    if tune_probes < 0:
        raise WorkbenchError("--tune-probes must be 0 (no tuning) or more")
    if tune_seconds <= 0:
        raise WorkbenchError("--tune-seconds must be more than 0")
    backend = backend or get_backend()
    suites, dtypes = select_suites(backend, suites, dtypes)
    if proposer != "search":
        llm = llm or LLMConfig.load()
        if chat is None:
            require_client()
            llm = resolve_model(llm)
    targets = [t.name for t in get_targets(default_target_names() if targets is None else targets)]
    options = PortOptions(suites=suites, dtypes=dtypes, seeds=seeds, explore=explore, start=start, targets=targets,
                          forward_only=forward_only, measure=measure, timeout_s=timeout_s, approve=approve,
                          replay_steps=replay_steps, replay_model=model or DEFAULT_REPLAY_MODEL,
                          tune_probes=tune_probes, tune_seconds=tune_seconds,
                          llm=llm.public() if llm and proposer != "search" else None)
    engine = get_engine(settings.db_url)
    ctx = _context(spec, settings, engine, backend, proposer, options, on_event=on_event, chat=chat,
                   executor=executor)
    records.mark_interrupted(engine)
    run_id = records.start_run(engine, block=spec.name, proposer=proposer, backend=backend.name, budget=budget,
                               config=options.to_json(), model=model)
    return _drive(ctx, run_id, budget, {"run_id": run_id, "block": spec.name, "budget": budget, "explore": explore,
                                        "history": [], "passing": []})


def port_blocks(blocks: list[str], settings: Settings, *, executor: Executor,
                on_event: BlockEventHook | None = None, on_outcome: Callable[[PortOutcome], None] | None = None,
                **options: Any) -> list[PortOutcome]:
    """port_block for each of ``blocks`` (with port_block's ``options``), outcomes in the order of ``blocks``. On
    an executor of one worker, one block after another; else every block's graph at once, each in a driver thread
    waiting on its verifications (the executor decides how many run). A block whose port raised re-raises here
    once every other block has ended; Ctrl-C marks every run of this process interrupted."""
    def port(block: str) -> PortOutcome:
        hook = (lambda node, message, data: on_event(block, node, message, data)) if on_event else None
        outcome = port_block(block, settings, executor=executor, on_event=hook, **options)
        if on_outcome:
            on_outcome(outcome)
        return outcome

    if executor.workers == 1 or len(blocks) == 1:
        return [port(block) for block in blocks]
    engine = get_engine(settings.db_url)  # the store's engine made (and its tables) once, before the threads share it
    ended: dict[str, PortOutcome | BaseException] = {}

    def drive(block: str) -> None:
        try:
            ended[block] = port(block)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, once every other block has ended
            ended[block] = exc

    threads = [threading.Thread(target=drive, args=(block,), name=f"port-{block}", daemon=True) for block in blocks]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:  # every port waiting on a verification ends interrupted (resumable), then the command
        executor.stop()
        for thread in threads:
            thread.join(STOP_WAIT_S)
        records.interrupt_own_runs(engine, "interrupted by the user")  # a port busy elsewhere (a replay) too
        raise
    for block in blocks:
        if isinstance(ended[block], BaseException):
            raise ended[block]
    return [ended[block] for block in blocks]


def resume_port(run_id: str, settings: Settings, *, on_event: EventHook | None = None, chat=None,
                llm_base_url: str | None = None, llm_model: str | None = None,
                backend: Backend | None = None, executor: Executor | None = None) -> PortOutcome:
    """Continue an interrupted or failed run from its last completed node; the store shows it resumed (a RunStep
    of node "resume"), and nothing it recorded before is written twice."""
    engine = get_engine(settings.db_url)
    records.mark_interrupted(engine)
    run = _find(engine, run_id)
    if run.status == WAITING:
        raise WorkbenchError(f"run {run.id} is waiting for approval: `workbench approve {run.id}` or "
                             f"`workbench reject {run.id} --why ...`")
    if run.status == RunStatus.RUNNING:
        raise WorkbenchError(f"run {run.id} is still running (pid {run.pid} on {run.host})")
    if run.status in ENDED:
        raise WorkbenchError(f"run {run.id} has ended ({run.status}): nothing to resume")
    options = PortOptions.from_json(run.config)
    if run.proposer != "search":
        if chat is None:
            require_client()
        if llm_base_url or llm_model:
            options = dataclasses.replace(options, llm=LLMConfig.load(llm_base_url, llm_model,
                                                                      stored=options.llm).public())
    backend = backend or get_backend(run.backend)
    if backend.name != run.backend:
        raise WorkbenchError(f"run {run.id} verifies on the {run.backend} backend, not {backend.name}")
    ctx = _context(get_block(run.block), settings, engine, backend, run.proposer, options, on_event=on_event,
                   chat=chat, executor=executor)
    with _checkpointed(ctx) as graph:
        snapshot = graph.get_state(_thread(run.id, run.budget))
    # the nodes due at the last checkpoint; one that finished but whose step was not checkpointed is not in
    # snapshot.next (its saved writes are applied on resume), but it is among the tasks
    due = [task.name for task in snapshot.tasks]
    if not due:
        raise WorkbenchError(f"run {run.id} has no checkpoint to resume from in {settings.checkpoints_path}")
    was = f"{run.status}: {run.reason}" if run.reason else run.status
    records.resume_run(engine, run.id)
    ctx.emit(run.id, "resume", f"resumed at {', '.join(due)} after {was}", {"due": due, "was": run.status})
    return _drive(ctx, run.id, run.budget, None)


def decide(run_id: str, settings: Settings, *, approved: bool, why: str = "",
           on_event: EventHook | None = None) -> PortOutcome:
    """Answer a run waiting for approval: promote its best passing candidate, or end it rejected with ``why``."""
    engine = get_engine(settings.db_url)
    run = _find(engine, run_id)
    if run.status != WAITING:
        raise WorkbenchError(f"run {run.id} is not waiting for approval (it is {run.status})")
    if not approved and not why.strip():
        raise WorkbenchError("say why the candidate is rejected: --why \"...\"")
    backend = BACKENDS.get(run.backend) or get_backend()  # promotion verifies nothing: no device needed
    ctx = _context(get_block(run.block), settings, engine, backend, run.proposer, PortOptions.from_json(run.config),
                   on_event=on_event)
    records.resume_run(engine, run.id)
    ctx.emit(run.id, "approve", "approved: promote" if approved else f"rejected: {why}",
             {"approved": approved, "why": why})
    return _drive(ctx, run.id, run.budget, Command(resume={"approved": approved, "why": why}))


def _find(engine, run_id: str):
    run = find_run(engine, run_id)
    if run is None:
        raise WorkbenchError(f"no run '{run_id}' (see `workbench runs`)")
    return run


def _context(spec: BlockSpec, settings: Settings, engine, backend: Backend, proposer: str, options: PortOptions,
             *, on_event: EventHook | None, chat=None, executor: Executor | None = None) -> PortContext:
    """The nodes' context from a run's options (the same for a new, a resumed and an approved run)."""
    # a training port never proposes a forward-only (decode) template: its backward raises
    templates = {t.name: t for t in list_templates(spec.name) if options.forward_only or not t.forward_only}
    if not templates and proposer != "llm":
        raise WorkbenchError(f"block {spec.name} has no templates (templates/{spec.name}/*.py.j2)")
    # A promoted operator meets every suite (the model card's sizes too, even where only a GPU verifies them) and
    # hidden shapes drawn between them: the proposer plans for all of them, not just the suites verified here.
    shapes = [shape for suite in SUITES for shape in suite_shapes(spec, suite)]
    search = SearchProposer(list(templates.values()), shapes)
    start = _start_point(spec.name, options.start, options.forward_only) if options.start else None
    chosen: Proposer = search
    if proposer != "search":
        first = start or (search.first() if templates else None)
        start_source = templates[first["template"]].render(first["params"]) if first else None
        llm = LLMProposer(spec, LLMConfig.load(stored=options.llm), suites=options.suites,
                          dtypes=options.dtypes, shapes={s: suite_shapes(spec, s) for s in options.suites},
                          start_source=start_source, chat=chat,
                          checks_of=lambda cid: [c.model_dump() for c in candidate_checks(engine, cid)])
        chosen = llm if proposer == "llm" else HybridProposer(search, llm)
        if proposer == "llm":
            start = None  # the start point is the model's starting candidate, not a candidate of its own
    return PortContext(spec=spec, templates=templates, proposer=chosen, engine=engine, settings=settings,
                       backend=backend, options=options, start=start, on_event=on_event,
                       executor=executor or InProcessExecutor())


def _thread(run_id: str, budget: int) -> dict:
    return {"configurable": {"thread_id": run_id}, "recursion_limit": recursion_limit(budget)}


# The state's own types, allowed by name when a checkpoint is read back (LangGraph warns about, and will refuse,
# any other type it did not list as safe).
CHECKPOINT_SERDE = JsonPlusSerializer(allowed_msgpack_modules=[
    ("workbench.vocabulary", name) for name, value in vars(vocabulary).items()
    if isinstance(value, type) and issubclass(value, StrEnum) and value is not StrEnum])


_CHECKPOINT_SETUP = threading.Lock()
"""Held while a run sets up the checkpoint file: the runs of a parallel port start together, in one process."""


@contextmanager
def _checkpointed(ctx: PortContext) -> Iterator[Any]:
    """The compiled graph with its checkpoints in their own SQLite file (SqliteSaver turns on WAL)."""
    path = ctx.settings.checkpoints_path
    path.parent.mkdir(parents=True, exist_ok=True)
    # one connection per run; several runs' threads share the file (WAL), a writer waiting up to 30 s for another
    conn = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
    try:
        saver = SqliteSaver(conn, serde=CHECKPOINT_SERDE)
        with _CHECKPOINT_SETUP:  # its WAL switch and tables need the whole file: SQLite answers "locked", not waiting
            saver.setup()
        yield build_graph(checkpointer=saver)
    finally:
        conn.close()


def _drive(ctx: PortContext, run_id: str, budget: int, given: dict | Command | None) -> PortOutcome:
    """Stream the graph from ``given`` (the first input, None to resume, or a Command answering an interrupt) to
    its end or its next interrupt; node events go to ctx.on_event as they are written."""
    config = _thread(run_id, budget)
    with _checkpointed(ctx) as graph:
        try:
            for mode, chunk in graph.stream(given, config, context=ctx, stream_mode=["updates", "custom"],
                                            durability="sync"):
                if mode == "custom" and ctx.on_event:
                    ctx.on_event(chunk["node"], chunk["message"], chunk["data"])
        except KeyboardInterrupt:
            records.finish_run(ctx.engine, run_id, RunStatus.INTERRUPTED, "interrupted by the user")
            raise
        except Exception as exc:
            records.finish_run(ctx.engine, run_id, RunStatus.FAILED, f"workbench error: {type(exc).__name__}: {exc}")
            raise
        snapshot = graph.get_state(config)
        values = snapshot.values
        if snapshot.interrupts:  # promote is waiting for approval: the candidate it would promote
            best = gated_candidate(values)
            reason = (f"waiting for approval to promote #{best['iteration']} {best['template']} "
                      f"({format_point(best['params'])}), worst error {best['worst_ratio']:.2f} of the bound: "
                      f"`workbench approve {run_id}` or `workbench reject {run_id} --why ...`")
            records.set_run_status(ctx.engine, run_id, WAITING, reason)
            ctx.emit(run_id, "approve", reason, {"candidate_id": best["candidate_id"]})
            return PortOutcome(run_id=run_id, block=ctx.spec.name, status=WAITING, reason=reason, operator_path=None,
                               attempts=values.get("attempt", 0))
        graph.checkpointer.delete_thread(run_id)  # the run has ended: nothing is left to resume
    return PortOutcome(run_id=run_id, block=ctx.spec.name, status=values["status"], reason=values["reason"],
                       operator_path=values.get("operator_path"), attempts=values.get("attempt", 0))


def _start_point(block: str, text: str, forward_only: bool) -> Proposal:
    name, params = parse_point(text)
    template = load_template(block, name)
    if template.forward_only and not forward_only:
        raise TemplateError(f"template {template.ref} is forward only (its backward raises): port it with "
                            f"--forward-only")
    unknown = sorted(set(params) - set(template.params))
    if unknown:
        raise TemplateError(f"unknown parameter '{unknown[0]}' for template {template.ref} "
                            f"(has: {', '.join(template.params)})")
    for point in template.points():
        if all(point[k] == v for k, v in params.items()):
            return Proposal(template=name, params=point, reason=f"start point given: {format_point(params)}")
    template.validate({**next(template.points()), **params})
    raise TemplateError(f"{template.ref}: no valid point with {format_point(params)}")
