"""`workbench` commands. The Streamlit dashboard: dashboard."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from workbench.cli._common import DbOption, OpsOption, command, console
from workbench.config import Settings


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
