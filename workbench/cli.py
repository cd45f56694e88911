"""The `workbench` command line: catalog, model cards, port runs, verification, the record."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.vocabulary import BlockStatus, ParityStatus, ReplayStatus, RunStatus, Tone, Verdict, key_values, tone

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Port a model's architecture blocks to Triton kernels, verify them, track the port.")
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[str | None, typer.Option("--db", help="database URL (default $WORKBENCH_DB or sqlite:///workbench.db)")]
OpsOption = Annotated[Path | None, typer.Option("--operators", help="promoted operators folder (default ./operators)")]
JsonOption = Annotated[bool, typer.Option("--json", help="machine-readable output")]
TargetsOption = Annotated[str | None, typer.Option(
    "--targets", help="GPU targets every kernel must compile for, comma-separated, or none (default "
                      "$WORKBENCH_TARGETS, a model card's targets, else sm_80,sm_90a,sm_100a,gfx942,gfx950)")]


WorkersOption = Annotated[int | None, typer.Option(
    "--workers", min=1, help="verifications at once on a local Ray instance (default $WORKBENCH_WORKERS, else the "
                             "cores; 1: one after another in this process, without Ray)")]
RayAddressOption = Annotated[str | None, typer.Option(
    "--ray-address", help="verify on the Ray cluster at this address, e.g. ray://head:10001 or auto (default "
                          "$WORKBENCH_RAY_ADDRESS, else a local Ray instance)")]


def _targets(value: str | None) -> list[str] | None:
    """--targets as a list: None for the default, [] for "none"."""
    if value is None:
        return None
    return [] if value.strip().lower() == "none" else [t.strip() for t in value.split(",") if t.strip()]

# Rich's colour for each tone of workbench.vocabulary.
TONE_STYLE = {Tone.GOOD: "green", Tone.CLOSE: "cyan", Tone.BUSY: "yellow", Tone.BAD: "red", Tone.BROKEN: "red",
              Tone.LIMIT: "red", Tone.SET_ASIDE: "red", Tone.IDLE: "dim", Tone.ABSENT: "dim"}


def _style(word: str) -> str:
    """A verdict or status word in its tone's colour (magenta for a word the workbench does not report)."""
    found = tone(word)
    return f"[{TONE_STYLE[found] if found else 'magenta'}]{escape(word)}[/]"


def _emit_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def command(fn):
    """Register ``fn`` as a command whose user mistakes (WorkbenchError) are one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WorkbenchError as exc:
            err_console.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(2) from None

    return app.command()(wrapper)


def _engine(settings: Settings):
    from workbench.store import get_engine

    return get_engine(settings.db_url)


@command
def blocks(db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """The block catalog: name, family, shape suites, templates, port status."""
    from workbench.blocks import REGISTRY
    from workbench.status import block_status
    from workbench.templating import list_templates

    settings = Settings.load(db, operators)
    engine = _engine(settings)
    rows = []
    for spec in REGISTRY.values():
        status, detail = block_status(engine, settings.operators_dir, spec.name)
        rows.append({"name": spec.name, "family": spec.family, "summary": spec.summary,
                     "suites": {k: len(v) for k, v in spec.shapes.items()},
                     "templates": [t.name for t in list_templates(spec.name)], "status": status, "detail": detail})
    if as_json:
        return _emit_json(rows)
    table = Table(title="Block catalog")
    for col in ("block", "family", "shape suites", "templates", "status", "detail"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["family"], ", ".join(f"{k} {n}" for k, n in r["suites"].items()),
                      ", ".join(r["templates"]), _style(r["status"]), escape(r["detail"]))
    console.print(table)


@command
def models(as_json: JsonOption = False) -> None:
    """The model cards."""
    from workbench.models import list_models

    cards = list_models()
    if as_json:
        return _emit_json([{"name": c.name, "title": c.title, "blocks": list(c.blocks), "facts": c.facts}
                           for c in cards])
    table = Table(title="Model cards")
    for col in ("model", "title", "blocks"):
        table.add_column(col)
    for c in cards:
        table.add_row(c.name, c.title, str(len(c.blocks)))
    console.print(table)
    console.print("`workbench plan <model>` shows each block the model needs and its status.")


@command
def onboard(
    config: Annotated[str, typer.Argument(help="a Hugging Face-style config.json, or a folder holding one")],
    name: Annotated[str | None, typer.Option(help="the card's name (default: from the file or folder)")] = None,
    out: Annotated[str | None, typer.Option(help="where the card is written (default: the first folder of "
                                                 "$WORKBENCH_MODELS, else the workbench's own cards)")] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a model card from a model's config: its blocks at their real sizes, layer counts, sources and gaps."""
    from workbench.blocks import REGISTRY
    from workbench.models import CARDS_DIR
    from workbench.onboard import onboard as make_card
    from workbench.onboard import write_card

    card = make_card(config, name)
    folder = out or next(iter(Settings.load().model_dirs), None) or CARDS_DIR
    path = write_card(card, folder)
    gaps = {b: info["gap"] for b, info in card["blocks"].items() if "gap" in info or b not in REGISTRY}
    if as_json:
        return _emit_json({"card": str(path), **card, "gaps": gaps})
    table = Table(title=f"{card['name']}: {len(card['blocks'])} blocks from {Path(config).name}")
    for col in ("block", "layers", "model sizes", "in the catalog"):
        table.add_column(col)
    for block, info in card["blocks"].items():
        sizes = "; ".join(key_values(s, ",") for s in info["shapes"])
        where = _style(BlockStatus.NO_SPEC) + escape(info.get("gap", "").removeprefix("no spec")) if block in gaps \
            else "spec" + (f"; differs: {escape(info['differs'])}" if info.get("differs") else "")
        table.add_row(block, str(info.get("layers", "")), sizes, where)
    console.print(table)
    view = card.get("transformers") or {}
    if view.get("error"):
        console.print(f"transformers: {escape(view['error'])}")
    elif view:
        ported = sum(1 for m in view["modules"] if m["blocks"])
        console.print(f"transformers class {view['class']} ({view['model_type']}): {ported} of {len(view['modules'])} "
                      f"module classes computed by catalog blocks; `workbench parity {card['name']}` runs it"
                      + (f"; the class does not read {', '.join(view['unread_fields'])}: parity does not cover them"
                         if view["unread_fields"] else ""))
    assumed = [k for k, v in card["facts"].items() if v["source"] == "assumption"]
    console.print(f"wrote {path}: {len(card['blocks']) - len(gaps)} blocks with a spec, {len(gaps)} without; "
                  f"assumed: {', '.join(assumed) or 'nothing'}. `workbench plan {card['name']}` shows its status.")


@command
def plan(model: str, db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False) -> None:
    """Each block a model needs, its sizes and its port status."""
    from workbench.models import get_model
    from workbench.status import block_status

    settings = Settings.load(db, operators)
    card = get_model(model)
    engine = _engine(settings)
    rows = []
    for name, info in card.blocks.items():
        status, detail = block_status(engine, settings.operators_dir, name)
        notes = ([info["gap"]] if info.get("gap") and not detail else []) + \
            ([f"differs: {info['differs']}"] if info.get("differs") else [])
        detail = " · ".join([detail, *notes] if detail else notes)
        rows.append({"block": name, "role": info.get("role", ""), "shapes": card.block_shapes(name),
                     "layers": info.get("layers"), "status": status, "detail": detail})
    if as_json:
        return _emit_json({"model": card.name, "facts": card.facts, "blocks": rows})
    table = Table(title=f"Port plan: {card.title}")
    for col in ("block", "role", "model sizes", "status", "detail"):
        table.add_column(col)
    for r in rows:
        sizes = "; ".join(key_values(s, ",") for s in r["shapes"])
        table.add_row(r["block"], escape(r["role"]), sizes, _style(r["status"]), escape(r["detail"]))
    console.print(table)
    done = sum(r["status"] == BlockStatus.PROMOTED for r in rows)
    assumed = [k for k, v in card.facts.items() if v.get("source") == "assumption"]
    console.print(f"{done} of {len(rows)} blocks promoted. Assumed (not public) sizes: {', '.join(assumed)}")


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
                                   forward_only=forward_only)
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


@command
def verify(
    candidate: Annotated[Path, typer.Argument(help="candidate file (BLOCK = ..., def run(...))")],
    block: Annotated[str | None, typer.Option(help="block to verify against (default: the file's BLOCK)")] = None,
    suites: Annotated[str, typer.Option(help="shape suites")] = "smoke,edge",
    dtypes: Annotated[str | None, typer.Option(help="dtypes (default: all the backend runs)")] = None,
    seeds: Annotated[int, typer.Option(help="random inputs per shape and dtype")] = 2,
    seed: Annotated[int | None, typer.Option(help="base seed (default: drawn at random, printed)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds the candidate may take")] = 300.0,
    backend: Annotated[str | None, typer.Option(help="auto, interpreter or cuda")] = None,
    targets: TargetsOption = None,
    forward_only: Annotated[bool, typer.Option(
        "--forward-only", help="verify the outputs only (inference kernels without a backward); recorded as such")]
    = False,
    db: DbOption = None, as_json: JsonOption = False,
) -> None:
    """Full verification of any candidate file: exit 0 pass, 1 fail, 2 usage error."""
    from workbench.backends import get_backend
    from workbench.store import records
    from workbench.verify.harness import read_candidate, verify_candidate

    settings = Settings.load(db)
    chosen = get_backend(backend)
    with console.status(f"verifying {candidate} on {chosen.name}...") if not as_json else _nullcontext():
        result = verify_candidate(candidate, block=block, suites=suites.split(","),
                                  dtypes=dtypes.split(",") if dtypes else None, seeds=seeds, base_seed=seed,
                                  backend=chosen, timeout_s=timeout, targets=_targets(targets),
                                  forward_only=forward_only)
    engine = _engine(settings)
    _, source = read_candidate(candidate)
    cid = records.add_candidate(engine, block=result.block, source=source, source_hash=result.source_hash,
                                path=str(Path(candidate).resolve()))
    records.record_verification(engine, cid, result)
    if as_json:
        _emit_json(result.to_dict())
    else:
        _print_checks(result)
    raise typer.Exit(0 if result.passed else 1)


def _nullcontext():
    from contextlib import nullcontext

    return nullcontext()


def _print_checks(result) -> None:
    table = Table(title=f"{result.block}: {Path(result.candidate).name} on {result.backend} (base seed "
                        f"{result.base_seed})")
    for col in ("shape", "dtype", "check", "max abs err", "bound", "err ratio", "verdict"):
        table.add_column(col, justify="right" if col in ("max abs err", "bound", "err ratio") else "left")
    grouped: dict[tuple, list] = {}
    for c in result.checks:
        grouped.setdefault((c.suite, c.shape, c.dtype, c.direction), []).append(c)
    for (_suite, shape, dtype, direction), cs in grouped.items():
        worst = max(cs, key=lambda c: (c.max_abs or 0) / (c.bound or 1) if c.bound else float("inf"))
        fmt = (lambda v: f"{v:.2e}" if v is not None else "-")
        table.add_row(shape, dtype, direction, fmt(worst.max_abs), fmt(worst.bound), fmt(worst.err_ratio),
                      _style(Verdict.PASS) if all(c.passed for c in cs)
                      else _style(Verdict.FAIL) + " " + escape(worst.reason))
    if result.checks:
        console.print(table)
    if result.builds:
        console.print(_builds_table(f"{result.block}: what the GPU compilers say", result.builds))
    for finding in result.findings:
        console.print(f"[yellow]finding[/] {escape(finding)}")
    backward = "; forward only: the backward was not verified" if result.forward_only else ""
    console.print(f"{_style(result.verdict)} {escape(result.message)} ({result.seconds:.1f} s, of which compile "
                  f"{result.compile_seconds:.1f} s){backward}")


def _builds_table(title: str, builds: list[dict]) -> Table:
    """Kernel x target: "ok" with registers / spilled bytes / shared KB / CTAs per SM / tensor cores, or the
    compiler's error. Model-suite builds, and any build that failed."""
    shown = [b for b in builds if b["suite"] == "model" or not b["ok"]] or builds
    targets = list(dict.fromkeys(b["target"] for b in builds))
    rows: dict[tuple[str, str], dict[str, dict]] = {}
    for b in shown:
        cell = rows.setdefault((b.get("operator", ""), b["kernel"]), {})
        worst = cell.get(b["target"])  # the worst build of this kernel on this target speaks for it
        spills_more = (b["spilled_bytes"] or 0) > (worst["spilled_bytes"] or 0) if worst else False
        if worst is None or (worst["ok"] and (not b["ok"] or spills_more)):
            cell[b["target"]] = b
    table = Table(title=title)
    table.add_column("kernel")
    for t in targets:
        table.add_column(t)
    for (operator, kernel), cells in rows.items():
        table.add_row(f"{operator} {kernel}".strip(), *(_build_cell(cells.get(t)) for t in targets))
    table.caption = "regs / spilled B per thread / shared KB / CTAs per SM; TC: tensor-core instructions on a dot"
    return table


def _build_cell(b: dict | None) -> str:
    if b is None:
        return "-"
    if not b["ok"]:
        return f"[red]error[/] {escape(b['error'][:80])}"
    spill = f"[red]{b['spilled_bytes']}[/]" if b["spilled_bytes"] else "0"
    tc = "" if b["uses_dot"] is None or not b["uses_dot"] else (" TC" if b["tensor_cores"] else " [red]no TC[/]")
    return f"{b['registers']} / {spill} / {(b['shared_bytes'] or 0) / 1024:.0f} / {b['ctas_per_sm']}{tc}"


@command
def targets(
    paths: Annotated[list[Path] | None, typer.Argument(help="candidate files (default: every promoted operator)")]
    = None,
    targets: TargetsOption = None,
    forward_only: Annotated[bool, typer.Option(
        "--forward-only", help="the named files' forward launches only (inference kernels without a backward)")]
    = False,
    operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """The target matrix: each kernel's launches at the model card's sizes, compiled for every GPU target (no GPU
    needed): registers, spilled bytes, shared memory, occupancy, tensor cores, or the compiler's error. Exit 1 when
    a kernel fails to compile for a target."""
    from workbench.operators import is_forward_only, newest_promoted
    from workbench.verify.harness import target_report

    settings = Settings.load(None, operators)
    files = [(None, p, forward_only) for p in paths] if paths else \
        [(m["block"], Path(m["path"]), is_forward_only(m)) for m in newest_promoted(settings.operators_dir).values()]
    if not files:
        raise WorkbenchError(f"no candidates: name files, or promote operators into {settings.operators_dir}")
    results = []
    for block, path, forward in files:
        with console.status(f"capturing and compiling {path.name}...") if not as_json else _nullcontext():
            results.append(target_report(path, block=block, targets=_targets(targets), forward_only=forward))
    builds = [{**b, "operator": r.block} for r in results for b in r.builds]
    if as_json:
        _emit_json([{"block": r.block, "candidate": r.candidate, "verdict": r.verdict, "message": r.message,
                     "findings": r.findings, "builds": r.builds, **r.evidence()} for r in results])
    else:
        console.print(_builds_table("target matrix at the model suite (compiled ahead of time, no GPU)", builds))
        for r in results:
            for finding in r.findings:
                console.print(f"[yellow]finding[/] {r.block}: {escape(finding)}")
            if not r.passed:
                console.print(f"{_style(r.verdict)} {r.block}: {escape(r.message)}")
        ok = sum(b["ok"] for b in builds)
        console.print(f"{ok} of {len(builds)} kernel x target builds compiled; "
                      f"{sum(1 for b in builds if b['ok'] and b['spilled_bytes'])} spill")
    raise typer.Exit(0 if all(r.passed for r in results) else 1)


def _bench_files(subjects: list[str], settings: Settings) -> list[tuple[str, Path, bool]]:
    """(block, operator file, forward_only) for each named block (its newest promoted operator) or file."""
    from workbench.blocks import get_block
    from workbench.operators import is_forward_only, newest_promoted
    from workbench.verify.harness import read_candidate

    promoted = newest_promoted(settings.operators_dir)
    if not subjects:
        return [(m["block"], Path(m["path"]), is_forward_only(m)) for m in promoted.values()]
    files = []
    for subject in subjects:
        if Path(subject).is_file():
            files.append((read_candidate(Path(subject))[0], Path(subject), False))
            continue
        get_block(subject)  # an unknown name is one line listing the known blocks
        if subject not in promoted:
            raise WorkbenchError(f"block '{subject}' has no promoted operator in {settings.operators_dir}")
        files.append((subject, Path(promoted[subject]["path"]), is_forward_only(promoted[subject])))
    return files


def _bench_table(rows: list, suite: str) -> Table:
    """One line per block x subject x target: the suite's shapes summed, forward and forward+backward."""
    table = Table(title=f"bench: the {suite} suite's shapes summed, bf16 (figure: measured on the GPU named, or "
                        f"modelled by the cost model)")
    for col in ("block", "subject", "target", "figure", "fwd ms", "fwd+bwd ms", "floor ms", "of roofline", "note"):
        table.add_column(col)
    groups: dict[tuple, dict[str, list]] = {}
    for r in rows:
        groups.setdefault((r.block, r.subject, r.target, r.label), {}).setdefault(r.passes, []).append(r)
    def total(group: list, attr: str) -> float | None:
        values = [getattr(r, attr) for r in group]
        return None if not values or any(v is None for v in values) else sum(values)

    for (block, subject, target, label), by_pass in groups.items():
        both, floor = total(by_pass.get("fwd+bwd", []), "time_ms"), total(by_pass.get("fwd+bwd", []), "floor_ms")
        fwd = total(by_pass.get("fwd", []), "time_ms")
        share = f"{100 * floor / both:.0f}%" if both and floor else "-"
        notes = dict.fromkeys(r.note for rs in by_pass.values() for r in rs if r.note)
        table.add_row(block, subject, target, label, "-" if fwd is None else f"{fwd:.3f}",
                      "-" if both is None else f"{both:.3f}", "-" if floor is None else f"{floor:.3f}", share,
                      escape("; ".join(notes)[:120]))
    return table


@command
def bench(
    subjects: Annotated[list[str] | None, typer.Argument(
        help="blocks (their promoted operators) or operator files (default: every promoted operator)")] = None,
    targets: Annotated[str | None, typer.Option(
        "--target", help="targets of the modelled figures, comma-separated (default: sm_90a,gfx942; on a GPU its "
                         "own)")] = None,
    suite: Annotated[str, typer.Option(help="shape suite: model (the model cards' sizes), smoke or edge")] = "model",
    trials: Annotated[int, typer.Option(help="timed calls per figure on a GPU (median and spread)")] = 20,
    operators: OpsOption = None, db: DbOption = None, as_json: JsonOption = False,
) -> None:
    """Speed at the model card's sizes: on a GPU, forward and forward+backward times of the operator against the
    eager reference, torch.compile of it and installed peers (median of timed calls, L2 flushed, outputs
    checked), with bytes/s, FLOP/s and the fraction of the roofline; everywhere, the cost model's modelled time
    and roofline fraction per target. Figures go to the store's benchmark table."""
    import torch

    from workbench.backends import cuda_available
    from workbench.blocks import get_block
    from workbench.perf import bench as perf
    from workbench.verify.harness import suite_shapes, target_report

    settings = Settings.load(db, operators)
    files = _bench_files(subjects or [], settings)
    if not files:
        raise WorkbenchError(f"nothing to bench: promote operators into {settings.operators_dir}, or name a file")
    on_gpu = cuda_available()
    names = _targets(targets) or ([perf.device_target(torch.device("cuda"))] if on_gpu else ["sm_90a", "gfx942"])
    rows: list = []
    skipped: list[str] = []
    for block, path, forward_only in files:
        spec = get_block(block)
        shapes = suite_shapes(spec, suite)
        if not shapes and subjects:
            raise WorkbenchError(f"block '{block}' has no shapes in the {suite} suite")
        if not shapes:  # every promoted operator: one a shipped card does not run has no model-suite sizes
            skipped.append(block)
            continue
        if on_gpu:
            rows += perf.measured_rows(spec, perf.load_operator(path), shapes, trials=trials)
        with console.status(f"compiling {path.name} for {', '.join(names)}...") if not as_json else _nullcontext():
            report = target_report(path, block=block, targets=names, forward_only=forward_only)
        rows += [r for r in perf.modelled_rows(block, shapes, names, report.builds)
                 if not (forward_only and r.passes != "fwd")]
    perf.record(_engine(settings), rows)
    if as_json:
        return _emit_json({"gpu": on_gpu, "rows": [r.to_dict() for r in rows], "skipped": skipped})
    if not on_gpu:
        console.print("no GPU: torch sees no CUDA device, so nothing is measured; every figure below is modelled "
                      "(workbench.perf.cost: roofline floor x the penalties of the compiled kernels)")
    console.print(_bench_table(rows, suite))
    if skipped:
        console.print(f"not benched (no shapes in the {suite} suite): {', '.join(skipped)}")


@command
def runs(block: Annotated[str | None, typer.Option(help="only this block")] = None,
         limit: Annotated[int, typer.Option(help="most recent N")] = 30,
         db: DbOption = None, as_json: JsonOption = False) -> None:
    """The agent runs, newest first."""
    from workbench.store import records
    from workbench.store.queries import list_runs

    engine = _engine(Settings.load(db))
    records.mark_interrupted(engine)
    rows = list_runs(engine, limit=limit, block=block)
    if as_json:
        return _emit_json([r.model_dump() for r in rows])
    if not rows:
        console.print("No runs yet: `workbench port rmsnorm` starts one.")
        return
    table = Table(title="Port runs")
    for col in ("run", "block", "status", "proposer", "budget", "started (UTC)", "reason"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.id, r.block, _style(r.status), r.proposer, str(r.budget),
                      r.started_at.strftime("%Y-%m-%d %H:%M:%S"), escape(r.reason[:100]))
    console.print(table)


@command
def ci(
    junit: Annotated[Path | None, typer.Option(help="write JUnit XML here (one testcase per operator x check)")] = None,
    changed_only: Annotated[bool, typer.Option("--changed-only", help="only operators changed since the baseline")]
    = False,
    update_baseline: Annotated[bool, typer.Option("--update-baseline",
                                                  help="write operators/ci_baseline.json from this job")] = False,
    timeout: Annotated[float, typer.Option(help="seconds one operator's verification may take")] = 300.0,
    replays: Annotated[bool, typer.Option("--replays/--no-replays",
                                          help="short scratch and LoRA replays with every promoted operator")] = True,
    parity: Annotated[bool, typer.Option("--parity/--no-parity",
                                         help="workbench parity of every model card that names a transformers class")]
    = True,
    targets: TargetsOption = None,
    workers: WorkersOption = None, ray_address: RayAddressOption = None,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Re-verify every promoted operator against the last recorded results and replay short loss curves with them:
    exit 1 on a regression. The verifications fan out on Ray (--workers, --ray-address)."""
    from workbench.ci import CI_REPLAYS, record_junit, run_ci, write_baseline, write_junit
    from workbench.executor import make_executor
    from workbench.integrations.parity import card_parity_sources

    settings = Settings.load(db, operators)

    def show_report(report) -> None:
        if not as_json:
            console.print(f"{_style(report.verdict)} {report.block}: {escape(report.operator)} "
                          f"({report.seconds:.1f} s) {escape(report.message)}")

    def show_replay(report) -> None:
        if not as_json:
            console.print(f"{_style(report.status)} replay {report.name} ({report.seconds:.1f} s) "
                          f"{escape(report.reason)}")

    def show_parity(result) -> None:
        if not as_json:
            console.print(f"{_style(result.status)} parity {escape(result.source)} ({result.seconds:.1f} s) "
                          f"{escape(result.message)}")

    with make_executor(settings, workers, ray_address) as executor:
        job, reports, replay_reports, parities = run_ci(
            settings, changed_only=changed_only, timeout_s=timeout, replays=CI_REPLAYS if replays else (),
            on_report=show_report, on_replay=show_replay, targets=_targets(targets), executor=executor,
            parity_sources=tuple(card_parity_sources()) if parity else (), on_parity=show_parity)
    if junit:
        write_junit(junit, job, reports, replay_reports, parities)
        record_junit(settings, job, junit)
    if update_baseline:
        write_baseline(settings, job)
    regressions = job.summary["regressions"]
    if as_json:
        _emit_json({"job": job.id, "status": job.status, "commit": job.commit, "regressions": regressions,
                    "operators": [vars(r) for r in reports], "replays": [vars(r) for r in replay_reports],
                    "parity": job.summary["parity"]})
    else:
        for line in regressions:
            err_console.print(f"[red]regression:[/] {escape(line)}")
        console.print(f"CI job {job.id}: {_style(job.status)}, {len(reports)} operators, {len(replay_reports)} "
                      f"replays, {len(parities)} parity runs, {len(regressions)} regressions")
    raise typer.Exit(1 if regressions else 0)


@command
def show(run_id: str, db: DbOption = None, as_json: JsonOption = False) -> None:
    """What each iteration of a run tried, why, and what came of it."""
    from workbench.store import records
    from workbench.store.queries import find_run, run_candidates, run_steps

    engine = _engine(Settings.load(db))
    records.mark_interrupted(engine)
    run = find_run(engine, run_id)
    if run is None:
        raise WorkbenchError(f"no run '{run_id}' (see `workbench runs`)")
    steps, candidates = run_steps(engine, run.id), run_candidates(engine, run.id)
    if as_json:
        return _emit_json({"run": run.model_dump(), "steps": [s.model_dump() for s in steps],
                           "candidates": [c.model_dump(exclude={"source"}) for c in candidates]})
    console.print(f"run {run.id}: {run.block}, {_style(run.status)}, proposer {run.proposer}, "
                  f"backend {run.backend}, budget {run.budget}")
    console.print(f"  {escape(run.reason)}")
    resumes = sum(s.node == "resume" for s in steps)
    if resumes:
        console.print(f"  resumed {resumes} time{'s' if resumes > 1 else ''}")
    if run.operator_path:
        console.print(f"  operator: {run.operator_path}")
    table = Table(title="Candidates")
    for col in ("#", "template", "params", "verdict", "worst err/bound", "verify s", "message"):
        table.add_column(col)
    for c in candidates:
        params = key_values(c.params)
        table.add_row(str(c.iteration), c.template or "-", params, _style(c.status),
                      f"{c.worst_ratio:.3g}" if c.worst_ratio is not None else "-",
                      f"{c.verify_seconds:.1f}" if c.verify_seconds else "-", escape(c.message[:90]))
    console.print(table)
    trace = Table(title="Agent trace")
    for col in ("step", "node", "what and why"):
        trace.add_column(col)
    for s in steps:
        trace.add_row(str(s.seq), s.node, escape(s.message))
    console.print(trace)


@command
def replay(
    model: Annotated[str, typer.Argument(help="model card, e.g. kimi-k3.1-pro")],
    mode: Annotated[str, typer.Option(help="scratch (random init) or lora (frozen base checkpoint + adapters)")]
    = "scratch",
    preset: Annotated[str, typer.Option(help="tiny (CPU, CI), small or medium (GPU)")] = "tiny",
    steps: Annotated[int | None, typer.Option(help="training steps (default: the preset's for the mode)")] = None,
    ops: Annotated[list[str] | None, typer.Option(
        "--ops", help="promoted | library | reference | <block>=<file|reference>; repeatable, later words win")] = None,
    seed: Annotated[int, typer.Option(help="initialization and data seed")] = 0,
    rerun_reference: Annotated[bool, typer.Option(
        "--rerun-reference", help="run the reference again (twice, checked bit-identical) instead of the stored one")]
    = False,
    export_reference: Annotated[bool, typer.Option(
        "--export-reference", help="write the reference run to replays/<model>/<preset>/ for CI")] = False,
    plot: Annotated[Path | None, typer.Option(help="PNG path (default .workbench/replays/replay-<id>.png)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds per training process")] = 3600.0,
    ranks: Annotated[int, typer.Option(help="processes to train in (torch.distributed, started by the workbench)")]
    = 1,
    layout: Annotated[str | None, typer.Option(
        help="parallel layout over the ranks: fsdp2+ep (dense parameters sharded with FSDP2, routed experts split "
             "across the ranks; the default with --ranks 2+)")] = None,
    cache: Annotated[str | None, typer.Option(
        help="<block>,...:host keeps what these blocks save for backward in host memory")] = None,
    rank_ops: Annotated[list[str] | None, typer.Option(
        "--rank-ops", help="RANK:<block>=<file|reference>: one rank runs another implementation; repeatable")] = None,
    collective_timeout: Annotated[float | None, typer.Option(
        help="seconds a rank waits for the others in a collective before the replay names the rank that hung "
             "(default: min(300, timeout / 2))")] = None,
    dispatch_chunks: Annotated[int, typer.Option(
        help="token chunks of the expert dispatch: chunk c+1's All-to-All overlaps chunk c's experts")] = 1,
    mtp: Annotated[bool, typer.Option(
        "--mtp", help="one multi-token-prediction depth (DeepSeek-V3), its loss held against its own reference")]
    = False,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Train the small model with operators and hold its loss curve against the reference run; exit 1 when the
    curve leaves the band (or the final loss, trained parameters or eval top-k differ; with --ranks, when a rank's
    local loss leaves the band of the same layout's reference run)."""
    from rich.live import Live

    from workbench.replay.compare import band_width
    from workbench.replay.runner import execute, plan_replay

    settings = Settings.load(db, operators)
    plan = plan_replay(model, mode, settings, preset=preset, steps=steps, ops=ops, seed=seed, ranks=ranks,
                       layout=layout, cache=cache, rank_ops=_rank_ops(rank_ops), mtp=mtp,
                       chunks=dispatch_chunks)
    spread = f" · {plan.layout.ranks} ranks {plan.layout.sharding}+{plan.layout.experts}" \
        if plan.layout.distributed else ""
    table = Table(title=f"{model} · {mode} replay · preset {preset} · {plan.steps} steps on {plan.backend.name}"
                        + spread)
    for col in ("step", "reference", "operators", "deviation", "s"):
        table.add_column(col, justify="right")

    def show(kind: str, data: dict) -> None:
        if as_json:
            return
        if kind == "base":
            console.print(f"training the LoRA base checkpoint ({data['steps']} reference steps) -> {data['path']}")
        elif kind == "reference":
            console.print(f"running the reference ({data['steps']} steps, twice: it must be bit-identical)")
        elif kind == "layout_reference":
            console.print(f"running the reference blocks on {data['ranks']} ranks ({data['steps']} steps): each "
                          f"rank's loss is held against it")
        elif kind == "start":
            custom = {k: v for k, v in data["ops"].items() if k != "band" and v != "reference"}
            console.print(f"replay #{data['replay_id']}: reference from the {data['reference_source']}; operators: "
                          + (key_values(custom) or "none (all reference)")
                          + "".join(f"; rank {r} runs {key_values(o)}" for r, o in data["rank_ops"].items()))
        elif kind == "step":
            ref, loss = data["reference"], data["loss"]
            dev = f"{(loss - ref) / abs(ref):+.2e}" if ref is not None else "-"
            style = "red" if ref is not None and abs(loss - ref) > band_width(ref, plan.preset) else ""
            row = (str(data["step"]), f"{ref:.5f}" if ref is not None else "-", f"{loss:.5f}",
                   f"[{style}]{dev}[/]" if style else dev, f"{data['seconds']:.1f}")
            if live:
                table.add_row(*row)
            else:  # a log, not a terminal: one line a step
                console.print("step {} reference {} operators {} deviation {} ({} s)".format(*row))

    live = console.is_terminal and not as_json
    with Live(table, console=console, refresh_per_second=4) if live else _nullcontext():
        outcome = execute(plan, settings, rerun_reference=rerun_reference, export=export_reference, plot=plot,
                          timeout_s=timeout, on_event=show, collective_timeout_s=collective_timeout)
    if as_json:
        _emit_json(asdict(outcome))
    else:
        ref_s = outcome.reference_seconds_per_step
        console.print(f"{_style(outcome.status)} replay #{outcome.replay_id}: {escape(outcome.reason)}")
        console.print(f"{len(outcome.curve)} steps, {outcome.seconds_per_step:.2f} s/step with operators"
                      + (f", {ref_s:.3f} s/step reference" if ref_s else "")
                      + (f"; plot {outcome.plot}" if outcome.plot else ""))
    if outcome.status != ReplayStatus.PASS:
        raise typer.Exit(1)


def _rank_ops(words: list[str] | None) -> dict[int, list[str]]:
    """["1:moe_combine=f.py", ...] -> {1: ["moe_combine=f.py"]}."""
    per_rank: dict[int, list[str]] = {}
    for word in words or []:
        rank, sep, rest = word.partition(":")
        if not sep or not rank.isdigit() or "=" not in rest:
            raise WorkbenchError(f"bad --rank-ops '{word}' (RANK:<block>=<file|reference>)")
        per_rank.setdefault(int(rank), []).append(rest)
    return per_rank


@command
def parity(
    source: Annotated[str, typer.Argument(help="a model card, a config.json, or a transformers model_type")],
    layers: Annotated[int, typer.Option(help="layers of the tiny model (every layer kind of the schedule appears)")]
    = 4,
    tokens: Annotated[int, typer.Option(help="tokens per sequence of the batch (2 sequences)")] = 32,
    blocks: Annotated[str | None, typer.Option(help="only these catalog blocks, comma-separated")] = None,
    dtype: Annotated[str, typer.Option(help="float32; bfloat16 on a GPU backend")] = "float32",
    seed: Annotated[int, typer.Option(help="weights and batch seed")] = 0,
    backend: Annotated[str, typer.Option(help="auto, interpreter or cuda")] = "auto",
    lora: Annotated[int, typer.Option(min=0, help="LoRA rank through PEFT on both models, then --steps fine-tuning "
                                                  "steps compared (0: no LoRA)")] = 0,
    steps: Annotated[int, typer.Option(min=1, help="fine-tuning steps with --lora")] = 4,
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Run the model's published transformers code as shipped and with the promoted operators swapped in
    (apply_workbench_kernels) on a tiny random-weight instance; compare logits (KL, cosine, top-1/top-5), router
    choices, loss and gradients; exit 1 when a metric is outside its dtype's bound."""
    from workbench.backends import get_backend
    from workbench.integrations.parity import run_parity
    from workbench.store import records

    settings = Settings.load(db, operators)
    chosen = [b.strip() for b in blocks.split(",") if b.strip()] if blocks else None
    result = run_parity(source, layers=layers, tokens=tokens, blocks=chosen, dtype=dtype, seed=seed,
                        backend=get_backend(backend), operators_dir=settings.operators_dir, lora=lora, steps=steps)
    parity_id = records.record_parity(_engine(settings), result.as_dict())
    if as_json:
        _emit_json({"id": parity_id, **result.as_dict()})
    else:
        print_parity(result)
    raise typer.Exit(0 if result.status == ParityStatus.PASS else 1)


def print_parity(result) -> None:
    """A parity run as the CLI shows it: its metrics against their bounds, the modules replaced and left alone."""
    console.print(f"{_style(result.status)} parity {escape(result.source)}: {result.model_class}, {result.dtype} on "
                  f"{result.backend}, layers {'/'.join(escape(k) for k in result.layers)}, {result.tokens} tokens x 2 "
                  f"({result.seconds:.1f} s)")
    console.print(f"  {escape(result.message)}")
    if result.checks:
        table = Table(title="Shipped vs patched")
        for col in ("metric", "value", "bound", ""):
            table.add_column(col)
        for c in result.checks:
            digits = ".10g" if c["metric"] == "cosine" else ".3g"
            table.add_row(c["metric"], f"{c['value']:{digits}}", f"{c['op']} {c['bound']:{digits}}",
                          _style("pass" if c["ok"] else "fail"))
        m = result.metrics
        extra = [("loss shipped / patched", f"{m['loss_shipped']:.6g} / {m['loss_patched']:.6g}"),
                 ("logits max rel diff", f"{m['logits_rel']:.3g}"),
                 ("grad rel median", f"{m['grad_rel_median']:.3g} over {m['grad_params']} parameters"),
                 ("grad worst parameter", str(m.get("grad_worst_param"))),
                 ("worst module", "-" if not m.get("worst_module") else
                  f"{m['worst_module']['module']} ({m['worst_module']['rel']:.3g})")]
        if m.get("lora"):
            extra += [(f"LoRA r{m['lora']['rank']} curve, {name}", " ".join(f"{v:.6g}" for v in curve))
                      for name, curve in m["lora"]["curves"].items()]
        for name, value in extra:
            table.add_row(name, escape(value), "", "")
        console.print(table)
    modules = result.patch.get("modules", [])
    if modules:
        table = Table(title="Modules")
        for col in ("class", "count", "computed by", "example"):
            table.add_column(col)
        for row in modules:
            table.add_row(row["class"], str(row["count"]), escape(", ".join(row["blocks"]) or
                                                                  f"left alone: {row['reason']}"), row["example"])
        console.print(table)
    for note in result.notes:
        console.print(f"  note: {escape(note)}")


@command
def dashboard(db: DbOption = None, operators: OpsOption = None,
              port: Annotated[int, typer.Option(help="local port to serve on")] = 8501) -> None:
    """The Streamlit dashboard on http://localhost:PORT: port status, candidates, traces, replays, CI, live runs."""
    import os
    import subprocess

    from workbench.resources import dashboard_app

    app_path = dashboard_app()
    settings = Settings.load(db, operators)
    env = {**os.environ, "WORKBENCH_DB": settings.db_url, "WORKBENCH_OPERATORS": str(settings.operators_dir)}
    console.print(f"dashboard on http://localhost:{port} (database {settings.db_url}); Ctrl-C stops it")
    cmd = [sys.executable, "-m", "streamlit", "run", str(app_path), "--server.headless", "true",
           "--server.port", str(port), "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    try:
        code = subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def main() -> None:
    app()
