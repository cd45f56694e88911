"""Block: its candidates over time with their verdicts and error figures per shape and dtype, the source of any
candidate and a diff between two, the agent's trace step by step and its tuning per target."""

from __future__ import annotations

import difflib

import altair as alt
import pandas as pd
import streamlit as st

from workbench.dashboard import board
from workbench.dashboard.frames import checks_by_shape
from workbench.operators import list_promoted

settings = board.settings()
blocks: list[str] = board.read("known_blocks")
if not blocks:
    st.title("Block")
    board.empty("No block has a spec or a record yet.", "workbench blocks")
    st.stop()

wanted = st.query_params.get("block")
block = st.selectbox("Block", blocks, index=blocks.index(wanted) if wanted in blocks else 0)
st.query_params["block"] = block
status, detail = board.read("block_status", settings.operators_dir, block)
st.title(block)
st.markdown(f"{board.badge(status)} {board.md_escape(detail)}")
for op in list_promoted(settings.operators_dir, block):
    st.caption(f"operator `{op['path']}` · template {op.get('template', '-')} · promoted {op.get('promoted_at', '-')}")

candidates: pd.DataFrame = board.read("candidates_frame", block)
st.subheader("Candidates")
if candidates.empty:
    board.empty(f"No candidate of {block} yet.", f"workbench port {block}")
else:
    numeric = candidates.dropna(subset=["worst_ratio"])
    if not numeric.empty:
        span = numeric["created_at"].max() - numeric["created_at"].min()
        tick = "%H:%M:%S" if span < pd.Timedelta(hours=6) else "%b %d %H:%M"
        points = alt.Chart(numeric).mark_point(filled=True, size=90).encode(
            x=alt.X("created_at:T", title="created (UTC)", scale=alt.Scale(type="utc"),
                    axis=alt.Axis(format=tick, labelAngle=0)),
            y=alt.Y("worst_ratio:Q", scale=alt.Scale(type="log"), title="worst error / bound"),
            color=alt.Color("status:N", scale=board.color_scale(candidates["status"]), title="verdict"),
            shape=alt.Shape("template:N"),
            tooltip=[alt.Tooltip("id:Q", title="candidate"), "template:N", "params:N", "status:N",
                     alt.Tooltip("worst_ratio:Q", format=".2e", title="worst error / bound"), "run_id:N"])
        bound = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#c62828", strokeDash=[6, 4]).encode(y="y:Q")
        st.altair_chart(points + bound, height=260)
    without = len(candidates) - len(numeric)
    if without:
        st.caption(f"{without} candidate{'s' if without > 1 else ''} without error figures (not verified, or it "
                   "did not compile or run) are in the table only. Below the dashed line passes.")
    st.dataframe(candidates, hide_index=True, key="candidates_table",
                 column_order=["id", "created_at", "run_id", "iteration", "template", "params", "status",
                               "worst_ratio", "checks", "failed", "verify_seconds", "message"],
                 column_config={"id": st.column_config.NumberColumn("candidate", format="%d", width="small"),
                                "created_at": board.when("created (UTC)"), "run_id": "run",
                                "iteration": st.column_config.NumberColumn("#", width="small"),
                                "checks": st.column_config.NumberColumn("checks", width="small"),
                                "failed": st.column_config.NumberColumn("failed", width="small"),
                                "status": "verdict",
                                "worst_ratio": st.column_config.NumberColumn("worst err / bound", format="%.3g"),
                                "verify_seconds": board.seconds("verify s"),
                                "message": st.column_config.TextColumn("message", width="large")})

    ids = candidates["id"].tolist()
    info = candidates.set_index("id").to_dict("index")

    def label(cid: int) -> str:
        c = info[cid]
        return f"#{cid} · {c['template'] or 'file'} {c['params']} · {c['status']}"

    checked = candidates[candidates["checks"] > 0]["id"].tolist()
    chosen = st.selectbox("Error figures of candidate", ids[::-1], format_func=label,
                          index=ids[::-1].index(checked[-1]) if checked else 0, key=f"chosen_{block}")
    checks: pd.DataFrame = board.read("checks_frame", chosen)
    if checks.empty:
        st.caption(f"Candidate #{chosen} has no verification checks ({info[chosen]['status']}: "
                   f"{info[chosen]['message'] or 'not verified yet'}).")
    else:
        table = checks_by_shape(checks)
        table["where"] = table["suite"] + " · " + table["shape"]
        table["what"] = table["dtype"] + " · " + table["direction"]
        table["ratio"] = table["max_abs"] / table["bound"]
        heat = alt.Chart(table.dropna(subset=["ratio"])).mark_rect().encode(
            x=alt.X("what:N", title=None, axis=alt.Axis(orient="top", labelAngle=0)),
            y=alt.Y("where:N", title=None, axis=alt.Axis(labelLimit=260)),
            color=alt.Color("ratio:Q", legend=None,
                            scale=alt.Scale(type="log", domain=[1e-3, 10], clamp=True, scheme="redyellowgreen",
                                            reverse=True)),
            tooltip=["shape", "dtype", "direction", "verdict", alt.Tooltip("max_abs:Q", format=".2e"),
                     alt.Tooltip("bound:Q", format=".2e"), alt.Tooltip("err_ratio:Q", format=".2e"), "reason"])
        text = heat.mark_text(fontSize=11).encode(text=alt.Text("ratio:Q", format=".2f"), color=alt.value("#111"))
        rows = table["where"].nunique()
        st.caption("Worst error / bound per shape, dtype and direction over the seeds (above 1 fails).")
        st.altair_chart((heat + text).properties(height=32 * rows + 30), height="content")
        st.dataframe(table, hide_index=True, key="checks_table", height=38 + 35 * min(len(table), 24),
                     column_order=["suite", "shape", "dtype", "direction", "verdict", "max_abs", "bound",
                                   "err_ratio", "max_rel", "nonfinite", "checks", "failed", "reason"],
                     column_config={"max_abs": board.sci("max abs err"), "bound": board.sci("bound"),
                                    "err_ratio": board.sci("err ratio", "error / the reference's own error"),
                                    "max_rel": board.sci("max rel err"),
                                    "reason": st.column_config.TextColumn("reason", width="large")})
        with st.expander(f"All {len(checks)} checks of candidate #{chosen} (every seed)"):
            st.dataframe(checks, hide_index=True, key="all_checks_table",
                         column_config={c: board.sci(c) for c in ("max_abs", "max_rel", "err_ratio", "ref_err",
                                                                   "bound")})

    builds: pd.DataFrame = board.read("builds_frame", chosen)
    st.subheader("On the GPU targets")
    if builds.empty:
        st.caption(f"Candidate #{chosen} was not compiled for any GPU target (`workbench verify --targets ...`).")
    else:
        failed, spilled = builds[~builds["ok"]], builds[builds["ok"] & (builds["spilled_bytes"] > 0)]
        st.caption(f"{len(builds)} kernel x target builds, compiled ahead of time with no GPU: {len(failed)} failed, "
                   f"{len(spilled)} spill registers (stack bytes per thread). Tensor cores: whether a kernel with a "
                   "tl.dot got tensor-core instructions.")
        st.dataframe(builds, hide_index=True, key="builds_table", height=38 + 35 * min(len(builds), 16),
                     column_config={"spilled_bytes": st.column_config.NumberColumn("spilled B"),
                                    "shared_bytes": st.column_config.NumberColumn("shared B"),
                                    "ctas_per_sm": st.column_config.NumberColumn("CTAs / SM"),
                                    "seconds": board.seconds("compile s"),
                                    "error": st.column_config.TextColumn("error", width="large")})

    st.subheader("Source and diff")
    left, right = st.columns(2)
    position = ids.index(chosen)
    before = left.selectbox("From", ids, format_func=label, index=max(position - 1, 0), key=f"diff_from_{block}")
    after = right.selectbox("To", ids, format_func=label, index=position, key=f"diff_to_{block}")
    old, new = board.read("candidate_source", before) or "", board.read("candidate_source", after) or ""
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"#{before}", tofile=f"#{after}"))
    st.code(diff or f"#{before} and #{after} have the same source.", language="diff")
    with st.expander(f"Source of #{after}: {info[after]['path']}"):
        st.code(new, language="python", line_numbers=True)

st.subheader("Agent trace")
runs: pd.DataFrame = board.read("runs_frame", 100, block)
if runs.empty:
    board.empty(f"No agent run of {block} yet.", f"workbench port {block}")
else:
    run_ids = runs["id"].tolist()
    # the run of the candidate shown above, else the newest
    shown = info[chosen]["run_id"] if not candidates.empty else None
    run_id = st.selectbox("Run", run_ids, format_func=board.run_label(runs),
                          index=run_ids.index(shown) if shown in run_ids else 0, key=f"trace_run_{block}")
    run = runs.set_index("id").loc[run_id]
    st.markdown(f"{board.badge(run['status'])} {run['proposer']} on {run['backend']}, budget {run['budget']}, "
                f"{run['candidates']} candidates · started {run['started_at']:%Y-%m-%d %H:%M:%S} UTC  \n"
                f"{board.md_escape(run['reason'])}")
    tuning: pd.DataFrame = board.read("tune_frame", run_id)
    if not tuning.empty:
        st.markdown("**Tuning per target** (compile-only probes at the model suite; the time is the cost model's "
                    "unless labelled measured; *moved*: the search's best so far)")
        st.dataframe(tuning, hide_index=True, key=f"tune_table_{block}", height=38 + 35 * min(len(tuning), 16),
                     column_config={"spilled_bytes": st.column_config.NumberColumn("spilled B"),
                                    "time_ms": st.column_config.NumberColumn("time ms", format="%.4f"),
                                    "why": st.column_config.TextColumn("why", width="large")})
    board.trace(board.read("steps_frame", run_id))
