"""Replays: the loss curve of the small model trained with the promoted operators against the reference curve, with
the band the operator curve must stay inside."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from workbench.dashboard import board

DEFAULT_BAND = 0.05  # relative, used when a replay did not record its band (ops["band"])

st.title("Loss-curve replays")
replays: pd.DataFrame = board.read("loss_replays_frame")
if replays.empty:
    board.empty("No loss replay recorded yet.", "workbench replay kimi-k3.1-pro --mode scratch",
                " to train the small model with reference blocks and with the promoted operators and compare the "
                "loss curves (`--mode lora` for the LoRA replay)")
    st.stop()

st.dataframe(replays, hide_index=True, key="replays_table",
             column_order=["id", "created_at", "model", "mode", "preset", "seed", "ranks", "status", "steps",
                           "final_loss", "reference_final_loss", "band", "left_band_step", "reason"],
             column_config={"created_at": board.when("created (UTC)"), "final_loss": board.loss("final loss"),
                            "reference_final_loss": board.loss("reference final loss"),
                            "band": st.column_config.NumberColumn("band", format="percent"),
                            "left_band_step": st.column_config.NumberColumn("left the band at step"),
                            "reason": st.column_config.TextColumn("reason", width="large")})

info = replays.set_index("id").to_dict("index")
replay_id = st.selectbox("Replay", list(info), format_func=lambda i: f"#{i} · {info[i]['model']} · {info[i]['mode']}"
                         f" · {info[i]['preset']} · seed {info[i]['seed']} · {info[i]['status']}")
row = info[replay_id]
recorded = row["band"] if not pd.isna(row["band"]) else None
band = st.number_input("Band (relative to the reference loss)", min_value=0.0, max_value=1.0, step=0.01,
                       value=float(recorded if recorded is not None else DEFAULT_BAND), format="%.3f",
                       key=f"band_{replay_id}",
                       help="the band the replay recorded" if recorded is not None else
                       "this replay did not record its band; 5% is assumed")

curves: pd.DataFrame = board.read("replay_curves", replay_id)
if curves.empty:
    st.caption("This replay has no curve points yet.")
    st.stop()
curves["low"], curves["high"] = curves["reference"] * (1 - band), curves["reference"] * (1 + band)
deviation = (curves["operator"] - curves["reference"]).abs() / curves["reference"].abs()
outside = int((deviation > band).sum())
last = curves.dropna().iloc[-1] if not curves.dropna().empty else None

cols = st.columns(4)
cols[0].metric("steps", len(curves))
cols[1].metric("final loss (operators)", f"{last['operator']:.4f}" if last is not None else "-",
               delta=f"{last['operator'] - last['reference']:+.4f} vs reference" if last is not None else None,
               delta_color="off")
cols[2].metric("max deviation", f"{deviation.max():.2%}" if deviation.notna().any() else "-")
cols[3].metric("steps outside the band", outside)
st.markdown(f"{board.badge(row['status'])} {board.md_escape(row['reason'])}")
st.markdown(f"**Layout:** {board.md_escape(row['layout'])}")

long = curves.melt(id_vars=["step"], value_vars=["reference", "operator"], var_name="run", value_name="loss")
area = alt.Chart(curves).mark_area(opacity=0.25, color="#90a4ae").encode(
    x=alt.X("step:Q", title="step"), y=alt.Y("low:Q", title="loss", scale=alt.Scale(zero=False)), y2="high:Q",
    tooltip=["step", alt.Tooltip("low:Q", format=".4f"), alt.Tooltip("high:Q", format=".4f")])
lines = alt.Chart(long).mark_line(strokeWidth=2).encode(
    x="step:Q", y="loss:Q",
    color=alt.Color("run:N", scale=alt.Scale(domain=["reference", "operator"], range=["#37474f", "#ef6c00"]),
                    title=None),
    strokeDash=alt.StrokeDash("run:N", scale=alt.Scale(domain=["reference", "operator"], range=[[1, 0], [5, 3]]),
                              legend=None),
    tooltip=["step", "run", alt.Tooltip("loss:Q", format=".4f")])
st.altair_chart((area + lines).interactive(), height=380)
st.caption(f"Grey: the band of ±{band:.1%} around the reference loss. Operators used: "
           + ", ".join(f"{k} = {v}" for k, v in (row["ops"] or {}).items() if k != "band"))

trace = board.read("replay_trace", replay_id)
if trace.get("error"):
    st.caption(f"Its traces cannot be read: {board.md_escape(trace['error'])}")
elif trace:
    st.subheader("Where the ranks' steps went")
    labels = {"ms": "step ms", "compute_ms": "compute", "communication_ms": "communication", "idle_ms": "idle",
              "all_to_all_ms": "All-to-All", "all_to_all_wait_ms": "waiting on it",
              "hidden_ms": "hidden under experts"}
    st.dataframe(trace["steps"], hide_index=True, key="trace_table",
                 column_config={**{c: st.column_config.NumberColumn(label, format="%.1f")
                                   for c, label in labels.items()},
                                "hidden_fraction": st.column_config.NumberColumn("hidden share", format="percent")})
    timeline: pd.DataFrame = trace["timeline"]
    step = st.selectbox("Step", sorted(timeline["step"].unique()), key=f"trace_step_{replay_id}")
    kinds = ["compute", "communication", "idle"]
    gantt = alt.Chart(timeline[timeline["step"] == step]).mark_bar().encode(
        x=alt.X("start:Q", title="ms from the step's start"), x2="end:Q", y=alt.Y("rank:O", title="rank"),
        color=alt.Color("kind:N", scale=alt.Scale(domain=kinds, range=["#1e88e5", "#ef6c00", "#cfd8dc"]),
                        title=None),
        tooltip=["rank", "op", "kind", alt.Tooltip("start:Q", format=".2f"), alt.Tooltip("end:Q", format=".2f")])
    st.altair_chart(gantt.interactive(bind_y=False), height=60 + 40 * timeline["rank"].nunique())
    st.caption("Each rank's main thread during the step: compute (the ops, by block), communication (collectives "
               "and the waits on them), idle (no op). The All-to-All, the bubbles and the slowest rank: "
               f"`workbench trace {replay_id}`.")
