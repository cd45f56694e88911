"""Shared pieces of the dashboard pages: settings, the engine, cached reads (READERS: the DataFrames of
workbench.dashboard.frames, the block statuses, a candidate's source), number and status formatting, empty states.
The dashboard only reads the store."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import altair as alt
import pandas as pd
import streamlit as st
from sqlalchemy.engine import make_url

from workbench import status
from workbench.config import Settings
from workbench.dashboard import frames
from workbench.store import get_engine, queries
from workbench.vocabulary import LIGHT_TONES, TONE, Tone, tone

SCI = "%.2e"  # error figures: 1.20e-5
TIME = "YYYY-MM-DD HH:mm:ss"

# Each tone of workbench.vocabulary as a chart colour and as a Streamlit badge colour.
TONE_COLOR = {Tone.GOOD: "#2e7d32", Tone.CLOSE: "#0288d1", Tone.BUSY: "#f9a825", Tone.BAD: "#c62828",
              Tone.BROKEN: "#ef6c00", Tone.LIMIT: "#8e24aa", Tone.SET_ASIDE: "#6d4c41", Tone.IDLE: "#90a4ae",
              Tone.ABSENT: "#cfd8dc"}
TONE_BADGE = {Tone.GOOD: "green", Tone.CLOSE: "blue", Tone.BUSY: "orange", Tone.BAD: "red", Tone.BROKEN: "red",
              Tone.LIMIT: "red", Tone.SET_ASIDE: "red", Tone.IDLE: "gray", Tone.ABSENT: "gray"}
# Chart colours of every verdict and status word.
STATUS_COLORS = {word: TONE_COLOR[t] for word, t in TONE.items()}


def settings() -> Settings:
    """`streamlit run workbench/dashboard/app.py -- --db URL --operators DIR`, else $WORKBENCH_DB /
    $WORKBENCH_OPERATORS."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--db")
    parser.add_argument("--operators")
    args, _ = parser.parse_known_args(sys.argv[1:])
    return Settings.load(args.db, args.operators)


@st.cache_resource(show_spinner=False)
def engine(url: str):
    return get_engine(url)


# What the pages read, by name: each takes the engine first and returns plain data or a DataFrame (never ORM rows).
READERS = {reader.__name__: reader for reader in (
    frames.model_plan, frames.runs_frame, frames.steps_frame, frames.candidates_frame, frames.checks_frame,
    frames.builds_frame, frames.tune_frame, frames.loss_replays_frame, frames.replay_curves, frames.replay_trace,
    frames.ci_jobs_frame, frames.latest_ci_job, frames.benchmarks_frame, frames.parity_frame, status.block_status,
    status.known_blocks, queries.candidate_source)}


@st.cache_data(ttl="5s", show_spinner=False)
def _read(query: str, url: str, *args):
    return READERS[query](engine(url), *args)


@st.cache_data(ttl="1s", show_spinner=False)
def _read_live(query: str, url: str, *args):
    return READERS[query](engine(url), *args)


def read(query: str, *args, live: bool = False):
    """READERS[query](engine, *args) on the configured database, cached for 5 s (1 s if live)."""
    return (_read_live if live else _read)(query, settings().db_url, *args)


def missing_database(url: str) -> str | None:
    """The path of a SQLite database file that does not exist (the dashboard does not create one), else None."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not Path(parsed.database).exists():
            return parsed.database
    return None


def badge(status: str) -> str:
    """Markdown badge for a status word."""
    found = tone(status)
    color = TONE_BADGE[found] if found else "violet"
    return f":{color}-badge[{md_escape(status)}]"


def md_escape(text: str) -> str:
    """Text shown as is inside Streamlit markdown (no emphasis, links, LaTeX or HTML)."""
    return re.sub(r"([\\`*_{}\[\]<>()#+!|$~:])", r"\\\1", str(text))


def empty(what: str, command: str, after: str = "") -> None:
    """An empty state that names the command that fills it."""
    st.info(f"{what} Run `{command}`{after}.", icon=":material/info:")


def color_scale(values) -> alt.Scale:
    domain = [v for v in dict.fromkeys(values) if v]
    return alt.Scale(domain=domain, range=[STATUS_COLORS.get(v, "#5c6bc0") for v in domain])


def style_status(df: pd.DataFrame, column: str = "status", colors: dict[str, str] | None = None):
    """The frame with its status column coloured (a pandas Styler for st.dataframe)."""
    palette = {**STATUS_COLORS, **(colors or {})}

    def paint(value):
        color = palette.get(value)
        light = tone(value) in LIGHT_TONES
        return f"background-color: {color}; color: {'#111' if light else 'white'}" if color else ""

    return df.style.map(paint, subset=[column])


def sci(label: str, help: str | None = None):
    return st.column_config.NumberColumn(label, format=SCI, help=help)


def when(label: str):
    return st.column_config.DatetimeColumn(label, format=TIME, timezone="UTC")


def seconds(label: str = "seconds"):
    return st.column_config.NumberColumn(label, format="%.1f")


def loss(label: str):
    return st.column_config.NumberColumn(label, format="%.4f")


def duration(label: str):
    return st.column_config.NumberColumn(label, format="duration")


def fmt_sci(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.1e}"


def trace(steps: pd.DataFrame) -> None:
    """The agent's steps, one line each: number, node, time, and what it did and why."""
    if steps.empty:
        st.caption("No steps written yet.")
        return
    lines = []
    for step in steps.itertuples():
        at = step.at.strftime("%H:%M:%S") if not pd.isna(step.at) else ""
        lines.append(f"{step.seq}. **{md_escape(step.node)}** :gray[{at}] {md_escape(step.message)}")
    st.markdown("\n".join(lines))


def run_label(runs: pd.DataFrame):
    """format_func for a run id selectbox: id, block, status and the start of the reason."""
    info = runs.set_index("id").to_dict("index")

    def label(run_id: str) -> str:
        r = info.get(run_id, {})
        reason = (r.get("reason") or r.get("last_step") or "")[:60]
        return f"{run_id} · {r.get('block', '')} · {r.get('status', '')} · {reason}"

    return label
