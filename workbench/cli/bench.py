"""`workbench` commands. Benchmarks: bench (modelled figures without a GPU, measured ones on one)."""

from __future__ import annotations

import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli._common import DbOption, JsonOption, OpsOption, _emit_json, _engine, _targets, command, console
from workbench.config import Settings
from workbench.errors import WorkbenchError


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
    from workbench.perf.peers import ratios

    for col in ("block", "subject", "target", "figure", "fwd ms", "fwd+bwd ms", "floor ms", "of roofline",
                "ours / peer", "note"):
        table.add_column(col)
    ours_over = ratios(rows)
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
        over = [ours_over.get((block, subject, target, p)) for p in ("fwd", "fwd+bwd")]
        ratio = " / ".join("-" if x is None else f"{x:.2f}" for x in over) if subject != "operator" else ""
        table.add_row(block, subject, target, label, "-" if fwd is None else f"{fwd:.3f}",
                      "-" if both is None else f"{both:.3f}", "-" if floor is None else f"{floor:.3f}", share,
                      ratio, escape("; ".join(notes)[:120]))
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
    peers: Annotated[bool, typer.Option(help="model the installed Triton peers (fla, Liger, Cut Cross-Entropy) "
                                              "beside ours: captured and compiled like an operator")] = True,
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
    from workbench.perf.peers import peer_rows
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
        with console.status(f"compiling {path.name} for {', '.join(names)}...") if not as_json else nullcontext():
            report = target_report(path, block=block, targets=names, forward_only=forward_only, shapes=shapes)
        rows += [r for r in perf.modelled_rows(block, shapes, names, report.builds,
                                               launches=report.launches_per_call)
                 if not (forward_only and r.passes != "fwd")]
        if peers:
            with console.status(f"capturing {block}'s Triton peers...") if not as_json else nullcontext(), \
                    tempfile.TemporaryDirectory(prefix="peers-") as folder:
                rows += peer_rows(block, shapes, names, Path(folder), forward_only=forward_only)
    perf.record(_engine(settings), rows)
    if as_json:
        return _emit_json({"gpu": on_gpu, "rows": [r.to_dict() for r in rows], "skipped": skipped})
    if not on_gpu:
        console.print("no GPU: torch sees no CUDA device, so nothing is measured; every figure below is modelled "
                      "(workbench.perf.cost: roofline floor x the penalties of the compiled kernels)")
    console.print(_bench_table(rows, suite))
    if skipped:
        console.print(f"not benched (no shapes in the {suite} suite): {', '.join(skipped)}")
