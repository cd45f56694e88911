"""The `workbench` command line: catalog, model cards, port runs, verification, benchmarks, CI, replays and their
traces, parity, the record and the dashboard. One module per room it drives (catalog, port, verify, bench, record,
ci, replay, trace, layout, parity, dashboard), each a thin shell over that room; ``_common`` holds the app and what
the commands share. Importing a module registers its commands; ``--help`` lists them in the order of a port's life
(``ORDER``)."""

from __future__ import annotations

from workbench.cli import bench, catalog, ci, dashboard, layout, parity, port, record, replay, trace, verify  # noqa: F401
from workbench.cli._common import TONE_STYLE, app

ORDER = ("blocks", "models", "onboard", "plan", "port", "approve", "reject", "verify", "targets", "bench", "runs", "ci",
         "show", "replay", "trace", "layout", "parity", "dashboard")
app.registered_commands.sort(key=lambda c: ORDER.index(c.callback.__name__) if c.callback.__name__ in ORDER
                            else len(ORDER))

__all__ = ["TONE_STYLE", "app", "main"]


def main() -> None:
    app()
