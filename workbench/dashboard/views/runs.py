"""Runs: the agent runs as they happen (refreshed every 2 s), how many wait for approval, and the steps of a chosen
run as they are written."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import streamlit as st

from workbench.dashboard import board
from workbench.vocabulary import RunStatus

st.title("Agent runs")


@st.fragment(run_every="2s")
def live() -> None:
    runs: pd.DataFrame = board.read("runs_frame", 100, live=True)
    if runs.empty:
        board.empty("No agent run recorded yet.", "workbench port rmsnorm", "; it shows up here while it runs")
        return
    running = runs[runs["status"] == RunStatus.RUNNING]
    cols = st.columns(4)
    cols[0].metric("running", len(running))
    cols[1].metric("waiting for approval", int((runs["status"] == "waiting_approval").sum()))
    cols[2].metric("runs", len(runs))
    cols[3].metric("promoted", int((runs["status"] == RunStatus.PROMOTED).sum()))
    st.dataframe(board.style_status(runs), hide_index=True, key="runs_table",
                 column_order=["id", "block", "status", "steps", "candidates", "started_at", "seconds", "last_step",
                               "reason", "process", "resumes", "model", "proposer", "backend", "budget"],
                 column_config={"started_at": board.when("started (UTC)"), "seconds": board.duration("duration"),
                                "last_step": st.column_config.TextColumn("last step", width="large"),
                                "reason": st.column_config.TextColumn("reason", width="large")})
    ids = runs["id"].tolist()
    default = running["id"].iloc[0] if len(running) else ids[0]
    run_id = st.selectbox("Steps of run", ids, index=ids.index(default), format_func=board.run_label(runs),
                          key="live_run")
    run = runs.set_index("id").loc[run_id]
    st.markdown(f"{board.badge(run['status'])} **{run['block']}** · {run['steps']} steps · {run['candidates']} "
                f"candidates · {board.md_escape(run['reason'] or run['last_step'])}")
    if run["status"] == "waiting_approval":
        st.info(f"Waiting for approval: `workbench approve {run_id}` promotes the best passing candidate, "
                f"`workbench reject {run_id} --why \"...\"` ends the run.", icon=":material/approval:")
    board.trace(board.read("steps_frame", run_id, live=True))
    st.caption(f"Refreshed every 2 s · last read {datetime.now(UTC):%H:%M:%S} UTC")


live()
