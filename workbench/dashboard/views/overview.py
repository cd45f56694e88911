"""Overview: the blocks a model card needs with their port status, the latest CI job, the running agent runs and
the runs waiting for approval."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from workbench.dashboard import board
from workbench.models import DEFAULT_MODEL, list_models
from workbench.operators import EVIDENCE_LEVELS
from workbench.status import STATUSES

settings = board.settings()
st.title("Port overview")

cards = {card.name: card for card in list_models()}
if not cards:
    st.warning("No model cards in workbench/models/*.yaml.")
    st.stop()
names = list(cards)
model = st.selectbox("Model card", names, index=names.index(DEFAULT_MODEL) if DEFAULT_MODEL in cards else 0,
                     format_func=lambda n: f"{n} · {cards[n].title}")
plan: pd.DataFrame = board.read("model_plan", str(settings.operators_dir), model)

counts = plan["status"].value_counts()
levels = plan["evidence_level"].value_counts()
total = len(plan)
on_targets = sum(int(levels.get(level, 0)) for level in EVIDENCE_LEVELS[1:])  # counted by their strongest evidence
st.progress(on_targets / total if total else 0.0,
            text=f"{on_targets} of {total} blocks compile on every target · "
                 + " · ".join(f"{int(levels.get(level, 0))} {level}" for level in reversed(EVIDENCE_LEVELS)) + " · "
                 f"{int(counts.get('numerics pass', 0))} numerics pass · "
                 f"{int(counts.get('in progress', 0))} in progress · "
                 f"{int(counts.get('blocked', 0) + counts.get('failed', 0))} blocked or failed · "
                 f"{int(counts.get('no spec', 0))} without a spec")

chart_col, ci_col = st.columns([3, 2], gap="large")
with chart_col:
    tally = pd.DataFrame({"status": list(STATUSES), "blocks": [int(counts.get(s, 0)) for s in STATUSES]})
    bars = alt.Chart(tally).mark_bar().encode(
        x=alt.X("blocks:Q", title="blocks", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("status:N", sort=list(STATUSES), title=None, axis=alt.Axis(labelOverlap=False, labelLimit=140)),
        color=alt.Color("status:N", scale=board.color_scale(STATUSES), legend=None),
        tooltip=["status", "blocks"])
    labels = bars.mark_text(align="left", dx=4).encode(text="blocks:Q", color=alt.value("#333"))
    st.altair_chart((bars + labels).properties(height=230), height="content")
with ci_col:
    st.subheader("Latest CI")
    job = board.read("latest_ci_job")
    if job is None:
        board.empty("No CI job recorded yet.", "workbench ci", " to verify the promoted operators and record a job")
    else:
        st.markdown(f"{board.badge(job['status'])} commit `{job['commit'][:12] or '-'}` · "
                    f"{job['started_at']:%Y-%m-%d %H:%M} UTC")
        st.markdown(f"operators **{job['operators']}** · passing **{job['passing']}** · failed checks "
                    f"**{job['failed_checks']}**")
        st.markdown(f"{job['regressions']} regression{'s' if job['regressions'] != 1 else ''}")
        st.page_link("views/ci.py", label="CI history", icon=":material/arrow_forward:")

st.subheader("Blocks")
st.dataframe(board.style_status(plan), hide_index=True, key="plan_table", height=38 + 35 * len(plan),
             column_order=["block", "status", "evidence_level", "detail", "sizes", "role"],
             column_config={"block": st.column_config.TextColumn("block", width=150),
                            "status": st.column_config.TextColumn("status", width=100),
                            "detail": st.column_config.TextColumn("detail", width=220),
                            "sizes": st.column_config.TextColumn("model sizes", width=200),
                            "role": st.column_config.TextColumn("role", width="large")})
with_records = [b for b in plan["block"] if b in board.read("known_blocks")]
if with_records:
    with st.container(horizontal=True, vertical_alignment="center"):
        st.markdown("**Open a block**", width="content")
        for name in with_records:
            st.page_link("views/block.py", label=name, icon=":material/arrow_forward:", query_params={"block": name})

st.subheader("Running agent runs")
running = board.read("runs_frame", 50, None, "running")
if running.empty:
    board.empty("No agent run is running.", "workbench port rmsnorm", " to start one; the Runs page follows it live")
else:
    st.dataframe(running, hide_index=True, key="running_table",
                 column_order=["id", "block", "steps", "candidates", "started_at", "seconds", "process", "last_step"],
                 column_config={"started_at": board.when("started (UTC)"), "seconds": board.duration("running"),
                                "last_step": st.column_config.TextColumn("last step", width="large")})
    st.page_link("views/runs.py", label="Follow runs live", icon=":material/arrow_forward:")

waiting = board.read("runs_frame", 50, None, "waiting_approval")
if not waiting.empty:
    st.subheader("Waiting for approval")
    st.dataframe(waiting, hide_index=True, key="waiting_table",
                 column_order=["id", "block", "candidates", "proposer", "started_at", "reason"],
                 column_config={"started_at": board.when("started (UTC)"),
                                "reason": st.column_config.TextColumn("best passing candidate", width="large")})
    st.caption("`workbench approve <run>` promotes the run's best passing candidate; "
               "`workbench reject <run> --why \"...\"` ends the run without promoting.")
