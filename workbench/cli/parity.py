"""`workbench` commands. Parity with the published code: parity."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from workbench.cli._common import DbOption, JsonOption, OpsOption, _emit_json, _engine, _style, command, console
from workbench.config import Settings
from workbench.vocabulary import ParityStatus


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
    generate: Annotated[int, typer.Option(min=0, help="new tokens of a greedy generate() with the model's cache on "
                                                      "two left-padded prompts, compared token by token (0: none)")]
    = 0,
    engine: Annotated[str, typer.Option(help="transformers (the model's modeling code) or vllm (its serving code, "
                                             "with the workbench's vLLM plugin; source: a model_type of "
                                             "workbench.integrations.vllm_parity.TINY (GPU_ONLY with --backend "
                                             "cuda), -mxfp4 after one with routed experts; --generate tokens, 8 if "
                                             "0)")]
    = "transformers",
    db: DbOption = None, operators: OpsOption = None, as_json: JsonOption = False,
) -> None:
    """Run the model's published transformers code as shipped and with the promoted operators swapped in
    (apply_workbench_kernels) on a tiny random-weight instance; compare logits (KL, cosine, top-1/top-5), router
    choices, loss, gradients and decode steps (with --generate, a greedy generate()); exit 1 when a metric is outside
    its dtype's bound. With --engine vllm: the model's tiny instance served by vLLM as shipped and with the plugin
    on; tokens, per-step log-probabilities and op runs compared."""
    from workbench.backends import get_backend
    from workbench.errors import WorkbenchError
    from workbench.integrations.parity import run_parity
    from workbench.integrations.vllm_parity import run_vllm_parity
    from workbench.store import records

    settings = Settings.load(db, operators)
    if engine == "vllm":
        result = run_vllm_parity(source, new_tokens=generate or 8, dtype=dtype, seed=seed,
                                 operators_dir=settings.operators_dir,
                                 device="cuda" if get_backend(backend).name == "cuda" else "cpu")
    elif engine == "transformers":
        chosen = [b.strip() for b in blocks.split(",") if b.strip()] if blocks else None
        result = run_parity(source, layers=layers, tokens=tokens, blocks=chosen, dtype=dtype, seed=seed,
                            backend=get_backend(backend), operators_dir=settings.operators_dir, lora=lora,
                            steps=steps, generate=generate)
    else:
        raise WorkbenchError(f"unknown engine '{engine}' (transformers or vllm)")
    parity_id = records.record_parity(_engine(settings), result.as_dict())
    if as_json:
        _emit_json({"id": parity_id, **result.as_dict()})
    elif engine == "vllm":
        print_vllm_parity(result)
    else:
        print_parity(result)
    raise typer.Exit(0 if result.status == ParityStatus.PASS else 1)


def print_vllm_parity(result) -> None:
    """A vLLM parity run as the CLI shows it: its checks, the tokens, the log-probability deviation per step, the
    ops that ran and the vLLM classes the plugin replaced."""
    console.print(f"{_style(result.status)} parity {escape(result.source)} in vLLM: {escape(result.backend)} "
                  f"({result.seconds:.1f} s)")
    console.print(f"  {escape(result.message)}")
    if result.metrics:
        m = result.metrics
        table = Table(title="vLLM as shipped vs with the workbench plugin")
        for col in ("metric", "value", "bound", ""):
            table.add_column(col)
        for c in result.checks:
            table.add_row(c["metric"], f"{c['value']:.3g}", f"{c['op']} {c['bound']:.3g}",
                          _style("pass" if c["ok"] else "fail"))
        mismatch = m["generate_first_mismatch"]
        for name, value in (
                (f"tokens ({m['generate_tokens']} per prompt)",
                 "identical" if mismatch is None else f"first differing token at step {mismatch}"),
                ("log-probability deviation per step", " ".join(f"{v:.2g}" for v in m["logprob_dev_per_step"])),
                ("op runs", ", ".join(f"{k} {v}" for k, v in m["op_runs"].items()) or "none"),
                ("vLLM classes replaced", "; ".join(f"{k} -> {', '.join(v)}" for k, v in m["replaced"].items())
                 or "none"),
                ("instances vLLM built", ", ".join(f"{k} {v}" for k, v in m["built"].items()) or "none"),
                ("calls handed back to vLLM", ", ".join(f"{k} {v}" for k, v in m["fallbacks"].items()) or "none")):
            table.add_row(name, escape(value), "", "")
        console.print(table)
    for note in result.notes:
        console.print(f"  note: {escape(note)}")


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
        if m.get("generate_tokens"):
            mismatch, diverged = m["generate_first_mismatch"], (m.get("generate_divergence") or {}).get("module")
            extra += [(f"generate {m['generate_tokens']} tokens, prompts {'/'.join(map(str, m['generate_prompts']))}",
                       "identical" if mismatch is None else f"first differing token at step {mismatch}"
                       + (f", first module past the bound there: {diverged}" if diverged else "")),
                      ("generate logits max rel diff per step",
                       " ".join(f"{v:.2g}" for v in m["generate_rel_per_step"])),
                      ("generate op runs", ", ".join(f"{k} {v}" for k, v in m["generate_op_runs"].items()))]
        if share := m.get("torch_share"):
            extra.append(("left in torch (forward, outside plain projections; modelled)",
                          f"{share['flops_share']:.1%} of {share['flops_total']:.3g} FLOPs, "
                          f"{share['bytes_share']:.1%} of {share['bytes_total']:.3g} bytes"))
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
    left = (result.metrics.get("torch_share") or {}).get("left", [])
    if left:
        share = result.metrics["torch_share"]
        table = Table(title="Left in torch (patched forward, by module class; modelled)")
        for col in ("class", "modules", "FLOPs", "bytes", "ops", "example"):
            table.add_column(col)
        for row in left:
            table.add_row(row["class"], str(row["modules"]), f"{row['flops'] / (share['flops_total'] or 1):.1%}",
                          f"{row['bytes'] / (share['bytes_total'] or 1):.1%}", ", ".join(row["ops"]),
                          escape(row["example"]))
        console.print(table)
    for note in result.notes:
        console.print(f"  note: {escape(note)}")
