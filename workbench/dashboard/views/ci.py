"""CI: the verification jobs of `workbench ci` per commit, the operators each job verified, and the regressions."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from workbench.dashboard import board
from workbench.dashboard.frames import ci_operators, ci_regressions

RED = board.STATUS_COLORS["fail"]

st.title("CI")
jobs: pd.DataFrame = board.read("ci_jobs_frame")
if jobs.empty:
    board.empty("No CI job recorded yet.", "workbench ci",
                " to verify every promoted operator again and record a job for the current commit")
    st.stop()

latest = jobs.iloc[0]
cols = st.columns(4)
cols[0].metric("jobs", len(jobs))
cols[1].metric("latest", latest["status"])
cols[2].metric("latest commit", latest["commit"][:12] or "-")
cols[3].metric("regressions in the latest", int(latest["regressions"]))

st.subheader("History per commit")
table = jobs.drop(columns=["summary"]).assign(commit=jobs["commit"].str[:12])
st.dataframe(board.style_status(table, colors={"failed": RED}), hide_index=True, key="ci_table",
             column_order=["id", "commit", "status", "started_at", "seconds", "operators", "passing", "checks",
                           "failed_checks", "regressions", "junit_path"],
             column_config={"id": st.column_config.NumberColumn("job", format="%d"),
                            "started_at": board.when("started (UTC)"), "seconds": board.seconds(),
                            "failed_checks": "failed checks", "junit_path": "junit"})
if len(jobs) > 1:
    figures = ["failed_checks", "regressions", "passing"]
    long = jobs.melt(id_vars=["id", "commit", "status"], value_vars=figures, var_name="figure")
    long["job"] = "#" + long["id"].astype(str) + " " + long["commit"].str[:7]
    long["figure"] = long["figure"].str.replace("_", " ")
    figures = [f.replace("_", " ") for f in figures]
    chart = alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("job:N", title="job · commit (oldest first)", sort=alt.SortField("id"), axis=alt.Axis(labelAngle=0)),
        y=alt.Y("value:Q", title=None, axis=alt.Axis(tickMinStep=1)),
        color=alt.Color("figure:N", title=None,
                        scale=alt.Scale(domain=figures, range=["#ef6c00", RED, board.STATUS_COLORS["pass"]])),
        tooltip=["id", "commit", "status", "figure", "value"])
    st.altair_chart(chart, height=220)

info = jobs.set_index("id").to_dict("index")
job_id = st.selectbox("Operators verified by job", list(info),
                      format_func=lambda i: f"#{i} · {info[i]['commit'][:12] or '-'} · {info[i]['status']}")
operators = ci_operators(info[job_id]["summary"])
if operators:
    st.dataframe(board.style_status(pd.DataFrame(operators), "verdict"), hide_index=True, key="ci_operators",
                 column_config={"worst_ratio": st.column_config.NumberColumn("worst err / bound", format="%.3g"),
                                "failing": st.column_config.TextColumn("failing checks", width="large")})
else:
    st.caption(f"Job #{job_id} verified no operator ({info[job_id]['status']}).")

st.subheader("Regressions")
regressions = ci_regressions(jobs)
if regressions:
    st.dataframe(pd.DataFrame(regressions), hide_index=True, key="regressions_table",
                 column_config={"regression": st.column_config.TextColumn("regression", width="large")})
else:
    st.success("No regressions in the recorded jobs.", icon=":material/check_circle:")
