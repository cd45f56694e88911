"""`workbench` commands. Port runs: port (the agent), approve and reject a run waiting for approval."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Annotated

import typer
from rich.markup import escape

from workbench.agent.tune import DEFAULT_PROBES, DEFAULT_SECONDS, SPILL_BUDGET
from workbench.cli._common import (
    DbOption,
    JsonOption,
    OpsOption,
    RayAddressOption,
    TargetsOption,
    WorkersOption,
    _emit_json,
    _engine,
    _style,
    _targets,
    command,
    console,
)
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.vocabulary import RunStatus


@command
def port(
    block_names: Annotated[list[str] | None, typer.Argument(metavar="[BLOCK]...", help="blocks to port")] = None,
    model: Annotated[str | None, typer.Option(help="port every block of this model card that has a spec")] = None,
    budget: Annotated[int, typer.Option(help="most candidates to render and verify per block")] = 8,
    explore: Annotated[int, typer.Option(help="verify until this many pass, promote the best")] = 1,
    start: Annotated[str | None, typer.Option(help="start point, e.g. row_block:BLOCK_N=64")] = None,
    proposer: Annotated[str, typer.Option(help="search (template points), llm (a chat model writes them) or "
                                               "hybrid (search, then the model)")] = "search",
    llm_base_url: Annotated[str | None, typer.Option(
        "--llm-base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                               "(default $WORKBENCH_LLM_BASE_URL; the key only from $WORKBENCH_LLM_API_KEY)")] = None,
    llm_model: Annotated[str | None, typer.Option(
        "--llm-model", help="model name (default $WORKBENCH_LLM_MODEL, else the endpoint's first)")] = None,
    resume: Annotated[str | None, typer.Option(
        help="continue this interrupted or failed run from its last completed node, with its own settings")] = None,
    approve: Annotated[bool, typer.Option(
        "--approve", help="stop before promotion until `workbench approve` or `workbench reject`")] = False,
    suites: Annotated[str, typer.Option(help="shape suites to verify on")] = "smoke,edge",
    dtypes: Annotated[str | None, typer.Option(help="dtypes (default: all the backend runs)")] = None,
    seeds: Annotated[int, typer.Option(help="random inputs per shape and dtype")] = 2,
    timeout: Annotated[float, typer.Option(help="seconds one candidate's verification may take")] = 300.0,
    backend: Annotated[str | None, typer.Option(help="auto, interpreter or cuda")] = None,
    replay_steps: Annotated[int | None, typer.Option(
        help="steps of the loss-curve replay that gates promotion (0: no gate; default $WORKBENCH_REPLAY_STEPS, "
             "else 6)")] = None,
    targets: TargetsOption = None,
    tune_probes: Annotated[int, typer.Option(
        help="compile-only probes the tuning of the chosen candidate may spend: each required target's launch "
             f"settings, and the template point where a target spills ({SPILL_BUDGET} times as many while a target "
             "spills; 0: promote it as it passed)")] = DEFAULT_PROBES,
    tune_seconds: Annotated[float, typer.Option(
        help="the wall time (s) after which the tuning of a block starts no probe")] = DEFAULT_SECONDS,
    forward_only: Annotated[bool, typer.Option(
        "--forward-only", help="an inference port: verify outputs only, no replay gate (recorded in the manifest)")]
    = False,
    workers: WorkersOption = None, ray_address: RayAddressOption = None,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Port blocks with the agent: render, compile, verify, diagnose, revise, promote. Exit 1 if any ends blocked.
    Several blocks port at once, their verifications fanned out on Ray (--workers, --ray-address), and so do the
    candidates --explore verifies side by side; one block's single candidates verify one after another, in this
    process unless a cluster is named."""
    from workbench.agent.llm import LLMConfig
    from workbench.agent.run import port_blocks, resume_port
    from workbench.backends import get_backend
    from workbench.blocks import REGISTRY, get_block
    from workbench.executor import make_executor
    from workbench.models import get_model

    settings = Settings.load(db, operators)
    if resume:
        if model or len(block_names or []) > 1:
            raise WorkbenchError("--resume continues one run: name no block other than its own")
        from workbench.store.queries import find_run

        run = find_run(_engine(settings), resume)
        if run and block_names and block_names[0] != run.block:
            raise WorkbenchError(f"run {run.id} ports {run.block}, not {block_names[0]}")
        chosen = get_backend(backend) if backend else None
        with _live(as_json) as show:
            outcome = resume_port(resume, settings, on_event=show, llm_base_url=llm_base_url, llm_model=llm_model,
                                  backend=chosen)
        return _finish([outcome], as_json)
    names = list(block_names or [])
    card_targets = None
    if model:
        card = get_model(model)
        names += [b for b in card.blocks if b in REGISTRY and b not in names]
        card_targets = card.targets
    if not names:
        raise WorkbenchError("name a block to port, or --model to port every block of a model card")
    for name in names:
        get_block(name)
    if start and len(names) > 1:
        raise WorkbenchError("--start applies to one block")
    chosen = get_backend(backend)
    llm = LLMConfig.load(llm_base_url, llm_model) if proposer in ("llm", "hybrid") else None

    if len(names) == 1 and explore == 1 and not (ray_address or settings.ray_address):
        workers = 1  # one candidate at a time: nothing to fan out
    with make_executor(settings, workers, ray_address) as executor:
        parallel = executor.workers > 1 and len(names) > 1
        if parallel and not as_json:
            console.rule(f"port {len(names)} blocks on {chosen.name}, {executor.workers} workers"
                         + (f" with {proposer}" if proposer != "search" else ""))
        with _live(as_json) as show:
            def show_block(block: str, node: str, message: str, data: dict) -> None:
                if parallel:
                    show(node, message, data, block=block)
                    return
                if block != shown.get("block") and not as_json:  # one block after another: a rule for each
                    shown["block"] = block
                    console.rule(f"port {block} on {chosen.name}" + (f" with {proposer}" if proposer != "search"
                                                                      else ""))
                show(node, message, data)

            shown: dict[str, str] = {}
            outcomes = port_blocks(names, settings, executor=executor, on_event=show_block,
                                   on_outcome=lambda outcome: _print_outcome(outcome, as_json),
                                   budget=budget, explore=explore, start=start, proposer=proposer,
                                   suites=suites.split(","), dtypes=dtypes.split(",") if dtypes else None,
                                   seeds=seeds, backend=chosen, timeout_s=timeout, model=model, llm=llm,
                                   approve=approve,
                                   replay_steps=settings.replay_steps if replay_steps is None else replay_steps,
                                   targets=_targets(targets) if targets is not None else card_targets,
                                   forward_only=forward_only, tune_probes=tune_probes,
                                   tune_seconds=tune_seconds)
    _finish(outcomes, as_json, printed=True)


@contextmanager
def _live(as_json: bool) -> Iterator:
    """A live view of a run (Rich): each node event printed as it streams in, under a spinner naming the last node
    and what it did. With --json, nothing."""
    if as_json:
        yield lambda node, message, data, block=None: None
        return
    with console.status("starting", spinner="dots") as status:
        def show(node: str, message: str, _data: dict, block: str | None = None) -> None:
            """block: the block this event is of, shown first when several blocks port at once."""
            where = f"[cyan]{escape(block)}[/] " if block else ""
            console.print(f"  {where}[bold]{node:>8}[/] {escape(message)}")
            status.update(f"{where}[bold]{node}[/] done: {escape(message[:90])}")

        yield show


def _print_outcome(outcome, as_json: bool) -> None:
    if not as_json:
        console.print(f"{_style(outcome.status)} {outcome.block} after {outcome.attempts} candidates "
                      f"(run {outcome.run_id}): {escape(outcome.reason)}")


def _finish(outcomes: list, as_json: bool, printed: bool = False,
            ok: tuple[str, ...] = (RunStatus.PROMOTED, RunStatus.WAITING_APPROVAL)) -> None:
    """Print the outcomes (as JSON, or a line each) and exit: 0 when every run ended in ``ok``, else 1."""
    if as_json:
        _emit_json([asdict(o) for o in outcomes])
    elif not printed:
        for outcome in outcomes:
            _print_outcome(outcome, as_json)
    raise typer.Exit(0 if all(o.status in ok for o in outcomes) else 1)


@command
def approve(run_id: Annotated[str, typer.Argument(help="a run waiting for approval (`workbench port --approve`)")],
            db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """Promote the best passing candidate of a run waiting for approval. Exit 0 when promoted."""
    from workbench.agent.run import decide

    settings = Settings.load(db, operators)
    with _live(as_json) as show:
        outcome = decide(run_id, settings, approved=True, on_event=show)
    _finish([outcome], as_json, ok=(RunStatus.PROMOTED,))


@command
def reject(run_id: Annotated[str, typer.Argument(help="a run waiting for approval (`workbench port --approve`)")],
           why: Annotated[str, typer.Option("--why", help="why the candidate is not promoted (kept with the run)")],
           db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """End a run waiting for approval without promoting anything; the reason is kept with the run."""
    from workbench.agent.run import decide

    settings = Settings.load(db, operators)
    with _live(as_json) as show:
        outcome = decide(run_id, settings, approved=False, why=why, on_event=show)
    _finish([outcome], as_json, ok=(RunStatus.REJECTED,))
