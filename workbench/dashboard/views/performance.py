"""Performance: per block, the figures of `workbench bench` and the port's cost model: modelled (no GPU) and
measured (on the device named) side by side, the operator against each baseline, and how they moved over time."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from workbench.dashboard import board

st.title("Performance")
figures: pd.DataFrame = board.read("benchmarks_frame")
if figures.empty:
    board.empty("No benchmark figures yet.", "workbench bench",
                " for the modelled table of every promoted operator (measured too, on a GPU)")
    st.stop()

blocks = sorted(figures["block"].unique())
block = st.selectbox("Block", blocks, key="perf_block")
mine = figures[figures["block"] == block]
st.caption("modelled: the cost model's roofline floor times the penalties of the compiled kernels (no GPU ran); "
           "measured: the median of timed calls on the device named, outputs checked")

# the latest figure per subject, target, label, shape and metric; then one row per subject x target x label
latest = mine.sort_values("created_at").groupby(["subject", "backend", "label", "shape", "metric"]).tail(1)
wide = latest.pivot_table(index=["subject", "backend", "label", "shape"], columns="metric", values="value",
                          aggfunc="last").reset_index()
summary = wide.groupby(["subject", "backend", "label"]).agg(
    {c: "sum" for c in wide.columns if c.startswith(("time:", "floor:"))}).reset_index()
if "time:fwd+bwd" in summary and "floor:fwd+bwd" in summary:
    summary["of roofline"] = summary["floor:fwd+bwd"] / summary["time:fwd+bwd"]
st.subheader("Latest, over the suite's shapes")
st.dataframe(summary.rename(columns={"backend": "target / device", "label": "figure"}), hide_index=True,
             key="perf_table",
             column_config={c: st.column_config.NumberColumn(f"{c.replace(':', ' ')} ms", format="%.4f")
                            for c in summary.columns if c.startswith(("time:", "floor:"))}
             | {"of roofline": st.column_config.NumberColumn("of roofline", format="percent")})

times = mine[mine["metric"] == "time:fwd+bwd"]
if times["created_at"].nunique() > 1:
    st.subheader("Forward+backward over time")
    per_run = times.groupby(["created_at", "subject", "backend", "label"], as_index=False)["value"].sum()
    per_run["series"] = per_run["subject"] + " · " + per_run["backend"] + " · " + per_run["label"]
    chart = alt.Chart(per_run).mark_line(point=True).encode(
        x=alt.X("created_at:T", title="recorded (UTC)"), y=alt.Y("value:Q", title="ms (suite summed)"),
        color=alt.Color("series:N", title=None), strokeDash=alt.StrokeDash("label:N", title="figure"),
        tooltip=["series", "created_at", "value"])
    st.altair_chart(chart, height=260)
