"""The workbench dashboard: `workbench dashboard` (or `streamlit run workbench/dashboard/app.py`). It reads the
store named by --db / $WORKBENCH_DB and the operators folder named by $WORKBENCH_OPERATORS; it never writes."""

from __future__ import annotations

import streamlit as st

from workbench.dashboard import board

st.set_page_config(page_title="workbench", page_icon=":material/memory:", layout="wide")

page = st.navigation([
    st.Page("views/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("views/block.py", title="Block", icon=":material/memory:"),
    st.Page("views/replays.py", title="Replays", icon=":material/show_chart:"),
    st.Page("views/performance.py", title="Performance", icon=":material/speed:"),
    st.Page("views/ci.py", title="CI", icon=":material/fact_check:"),
    st.Page("views/parity.py", title="Parity", icon=":material/compare_arrows:"),
    st.Page("views/runs.py", title="Runs", icon=":material/play_circle:"),
])

settings = board.settings()
with st.sidebar:
    st.caption(f"database `{settings.db_url}`  \noperators `{settings.operators_dir}`")

missing = board.missing_database(settings.db_url)
if missing:
    st.title("workbench")
    board.empty(f"There is no database at {missing} yet.", "workbench port rmsnorm",
                " (any workbench command creates the database), or point --db / WORKBENCH_DB at another one")
    st.stop()

page.run()
