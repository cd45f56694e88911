"""Parity: the model's published transformers code as shipped against the same code with the promoted operators
swapped in (`workbench parity`, and every CI job): the metrics against their bounds, the modules replaced and left
alone, and what of the forward still runs in torch."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench.dashboard import board

st.title("Parity with the published code")
runs: pd.DataFrame = board.read("parity_frame")
if runs.empty:
    board.empty("No parity run recorded yet.", "workbench parity kimi-k3",
                " to run the model's transformers code as shipped and with the ported kernels")
    st.stop()

latest = runs.iloc[0]
cols = st.columns(4)
cols[0].metric("runs", len(runs))
cols[1].metric("latest", latest["status"])
cols[2].metric("logits KL (latest)", f"{latest['kl']:.2e}" if pd.notna(latest["kl"]) else "-")
cols[3].metric("modules replaced (latest)", int(latest["replaced"]))

number = st.column_config.NumberColumn
st.dataframe(board.style_status(runs.drop(columns=["checks", "modules", "left_in_torch", "notes"])), hide_index=True,
             key="parity_table",
             column_order=["id", "source", "dtype", "backend", "status", "kl", "cosine", "top1", "top5",
                           "router_match", "loss_rel", "grad_rel_worst", "first_divergence", "replaced", "left_alone",
                           "torch_flops", "torch_bytes", "ci_job_id", "created_at", "message"],
             column_config={"kl": number("KL", format="%.2e"), "cosine": number(format="%.10f"),
                            "loss_rel": number("loss rel", format="%.2e"),
                            "grad_rel_worst": number("grad rel (worst)", format="%.2e"),
                            "torch_flops": number("in torch (FLOPs)", format="percent"),
                            "torch_bytes": number("in torch (bytes)", format="percent"),
                            "ci_job_id": number("CI job", format="%d"), "created_at": board.when("at (UTC)")})

info = runs.set_index("id").to_dict("index")
chosen = st.selectbox("Run", list(info), format_func=lambda i: f"#{i} · {info[i]['source']} · {info[i]['status']}")
run = info[chosen]
st.caption(run["message"])
if run["checks"]:
    st.subheader("Shipped vs patched")
    st.dataframe(pd.DataFrame(run["checks"]), hide_index=True, key="parity_checks")
st.subheader("Modules")
st.dataframe(pd.DataFrame(run["modules"]), hide_index=True, key="parity_modules",
             column_config={"reason": st.column_config.TextColumn("left alone because", width="large")})
if run["left_in_torch"]:
    st.subheader("Left in torch")
    st.caption("The patched forward's torch ops outside plain projections, by module class (modelled FLOPs and "
               "bytes of the tiny instance)")
    st.dataframe(pd.DataFrame(run["left_in_torch"]), hide_index=True, key="parity_left_in_torch")
for note in run["notes"]:
    st.caption(note)
