"""What every `workbench` command shares: the Typer app, the consoles, the common options, the tone colours, and
``command`` (one-line errors, exit code 2)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.vocabulary import Tone, tone

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
    """Register ``fn`` as a command whose user mistakes (WorkbenchError) are one line on stderr and exit code 2; with
    ``--json``, that line is ``{"error": ...}`` on stdout (a script reads one stream)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WorkbenchError as exc:
            if kwargs.get("as_json"):
                _emit_json({"error": str(exc)})
            else:
                err_console.print(f"[red]error:[/] {escape(str(exc))}")
            raise typer.Exit(2) from None

    return app.command()(wrapper)


def _engine(settings: Settings):
    from workbench.store import get_engine

    return get_engine(settings.db_url)
