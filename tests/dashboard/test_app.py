"""The dashboard's pages through streamlit.testing.v1.AppTest on a seeded database, their empty states, that the
dashboard never writes, and the `workbench dashboard` command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import streamlit as st
from seed import CI_REGRESSION, MODEL, seed
from sqlalchemy import select
from sqlmodel import SQLModel
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from workbench.blocks import REGISTRY
from workbench.cli import app as cli_app
from workbench.dashboard.frames import replay_layout
from workbench.models import get_model
from workbench.operators import EVIDENCE_LEVELS
from workbench.resources import dashboard_app
from workbench.status import block_status
from workbench.store import get_engine, records

APP = dashboard_app()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def seeded(request, tmp_path, monkeypatch):
    """The seeded store on a SQLite file, then on a PostgreSQL database: every page reads both."""
    url = request.getfixturevalue("postgres").new_database() if request.param == "postgresql" else None
    data = seed(tmp_path / "seeded", url)
    monkeypatch.setenv("WORKBENCH_DB", data.db_url)
    monkeypatch.setenv("WORKBENCH_OPERATORS", str(data.operators_dir))
    st.cache_data.clear()
    return data


@pytest.fixture
def empty_db(tmp_path, monkeypatch):
    """A database with its tables and nothing in them."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    get_engine(url)
    monkeypatch.setenv("WORKBENCH_DB", url)
    monkeypatch.setenv("WORKBENCH_OPERATORS", str(tmp_path / "operators"))
    st.cache_data.clear()
    return url


def open_app(page: str | None = None, **query) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update(query)
    if page:  # pages are known by their file names (no url_path), so no first run of the overview is needed
        at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list:
    return list(at.get("vega_lite_chart")) + list(at.get("arrow_vega_lite_chart"))


def text_of(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [i.value for i in at.info]
    return "\n".join(parts + [s.value for s in at.subheader] + [t.value for t in at.title])


def column_format(df_element, column: str) -> str | None:
    """The number format st.column_config gave a dataframe column."""
    config = json.loads(df_element.proto.columns)
    return config.get(column, {}).get("type_config", {}).get("format")


# --- overview -----------------------------------------------------------------------------------------------------


def test_overview_lists_every_block_of_the_card_with_its_status(seeded):
    at = open_app()
    assert at.title[0].value == "Port overview"
    assert at.selectbox[0].value == MODEL
    plan = at.dataframe[0].value
    card = get_model(MODEL)
    assert list(plan["block"]) == list(card.blocks)
    engine = get_engine(seeded.db_url)
    statuses = dict(zip(plan["block"], plan["status"], strict=True))
    assert statuses["rmsnorm"] == "promoted" and statuses["situ"] == "blocked"
    for name in card.blocks:
        assert statuses[name] == block_status(engine, seeded.operators_dir, name)[0]
    levels = dict(zip(plan["block"], plan["evidence_level"], strict=True))
    assert all((levels[b] in EVIDENCE_LEVELS) == (statuses[b] == "promoted") for b in card.blocks)
    on_targets = sum(levels[b] in EVIDENCE_LEVELS[1:] for b in card.blocks)  # counted by the strongest evidence
    assert at.get("progress")[0].proto.text.startswith(
        f"{on_targets} of {len(card.blocks)} blocks compile on every target")
    assert charts(at)
    links = {link.proto.label for link in at.get("page_link")}
    assert {"rmsnorm", "situ"} <= links


def test_overview_shows_the_latest_ci_job_and_the_running_runs(seeded):
    at = open_app()
    text = text_of(at)
    assert "failed" in text and "9e8d7c6" in text and "1 regression" in text
    assert "operators **1** · passing **0** · failed checks **1**" in text
    running = at.dataframe[1].value
    assert list(running["id"]) == [seeded.running_run]
    assert running["process"].iloc[0] == "alive"  # the seeding process is this one


def test_overview_empty_states_name_the_commands(empty_db):
    at = open_app()
    info = " ".join(i.value for i in at.info)
    assert "`workbench ci`" in info and "`workbench port rmsnorm`" in info
    assert set(at.dataframe[0].value["status"]) <= {"no spec", "not started"}


def test_missing_database_is_not_created(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere.db"
    monkeypatch.setenv("WORKBENCH_DB", f"sqlite:///{missing}")
    at = open_app()
    assert "no database" in at.info[0].value.lower() and "`workbench port rmsnorm`" in at.info[0].value
    assert not missing.exists()


# --- block --------------------------------------------------------------------------------------------------------


def test_block_page_candidates_checks_diff_and_trace(seeded):
    at = open_app("block", block="rmsnorm")
    assert at.title[0].value == "rmsnorm"
    assert ":green-badge[promoted]" in at.markdown[0].value
    candidates = at.dataframe[0].value
    bad, good = seeded.candidates[:2]
    assert list(candidates["id"]) == [bad, good, seeded.candidates[4]]
    assert list(candidates["status"]) == ["fail", "pass", "rendered"]
    assert candidates["params"].iloc[0] == "BLOCK_N=8192, ACC_DTYPE=float16"
    assert candidates["worst_ratio"].iloc[0] > 1 > candidates["worst_ratio"].iloc[1]
    assert len(charts(at)) == 2  # candidates over time, error heat map

    # error figures per shape and dtype of the latest verified candidate, in scientific notation
    assert at.selectbox(key="chosen_rmsnorm").value == good
    checks = at.dataframe[1].value
    assert set(checks["dtype"]) == {"float32", "float16"}
    assert {"rows=4,N=64", "rows=1,N=123", "rows=7,N=4097"} == set(checks["shape"])
    assert (checks["verdict"] == "pass").all()
    for column in ("max_abs", "bound", "err_ratio"):
        assert column_format(at.dataframe[1], column) == "%.2e"

    # what the GPU targets' compilers said about its kernels
    builds = next(d.value for d in at.dataframe if "spilled_bytes" in d.value.columns)
    assert set(builds["target"]) == {"sm_90a", "gfx942"} and builds["ok"].all()
    assert builds.loc[builds["spilled_bytes"] > 0, "kernel"].tolist() == ["rmsnorm_bwd_kernel"]
    assert "4 kernel x target builds" in text_of(at) and "1 spill registers" in text_of(at)

    # the diff from the previous candidate, and the promoted run's trace with its reasons
    code = at.code[0].value
    assert "-" in code and "tl.float16" in code and "+" in code and "tl.float32" in code
    assert at.selectbox(key="diff_from_rmsnorm").value == bad
    assert at.selectbox(key="trace_run_rmsnorm").value == seeded.promoted_run
    trace = at.markdown[-1].value
    assert "**diagnose**" in trace and "precision" in trace and "accumulates in float16" in trace
    # the run's tuning per target: each probe's settings, registers, spills, modelled time and why it moved
    tuning = next(d.value for d in at.dataframe if "why" in d.value.columns)
    assert list(tuning["target"]) == ["gfx942", "gfx942", "sm_90a", "sm_90a"]
    sm90 = tuning[tuning["target"] == "sm_90a"]
    assert list(sm90["settings"]) == ["num_warps=4", "num_warps=8"] and list(sm90["spilled_bytes"]) == [376, 0]
    assert sm90["moved"].all() and (tuning["label"] == "modelled").all()
    assert "num_warps 4 -> 8" in sm90["why"].iloc[1]

    at.selectbox(key="chosen_rmsnorm").set_value(bad).run()
    failing = at.dataframe[1].value
    assert set(failing[failing["verdict"] == "fail"]["dtype"]) == {"float16"}
    assert failing["reason"].str.contains("max abs err").any()


def test_block_page_of_a_blocked_block(seeded):
    at = open_app("block", block="situ")
    assert ":red-badge[blocked]" in at.markdown[0].value
    candidates = at.dataframe[0].value
    assert list(candidates["status"]) == ["compile_error", "runtime_error"]
    assert candidates["worst_ratio"].isna().all()
    assert "without error figures" in text_of(at)
    assert at.selectbox(key="trace_run_situ").value == seeded.blocked_run
    assert "budget of 2 candidates spent" in at.markdown[-1].value


def test_block_page_switches_block(seeded):
    at = open_app("block")
    assert at.selectbox[0].value == next(iter(REGISTRY))  # the first block of the catalog
    at.selectbox[0].set_value("situ").run()
    assert at.title[0].value == "situ"


# --- replays ------------------------------------------------------------------------------------------------------


def test_replays_page_draws_both_curves_and_the_band(seeded):
    at = open_app("replays")
    replays = at.dataframe[0].value
    assert list(replays["id"]) == [seeded.replay_id] and replays["band"].iloc[0] == 0.05
    assert at.number_input[0].value == 0.05  # the band the replay recorded
    assert replays["ranks"].iloc[0] == 2
    assert "**Layout:** 2 ranks · dense fsdp2 · experts ep · cache kda\\:host" in [m.value for m in at.markdown]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["steps"] == "60" and metrics["steps outside the band"] == "0"
    (chart,) = charts(at)
    spec = json.loads(chart.proto.spec)
    marks = {layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"] for layer in spec["layer"]}
    assert marks == {"area", "line"}

    at.number_input[0].set_value(0.005).run()  # a tighter band: some steps fall outside
    assert int(next(m.value for m in at.metric if m.label == "steps outside the band")) > 0


def test_a_replay_layout_reads_as_one_line_with_one_process_for_older_rows():
    assert replay_layout(None)["layout"] == "1 rank · dense none · experts local"
    spread = replay_layout({"ranks": 2, "sharding": "fsdp2", "experts": "ep", "cache": [],
                            "rank_ops": {"1": {"moe_combine": "rounded.py"}}})
    assert spread["layout"] == "2 ranks · dense fsdp2 · experts ep · rank 1 runs moe_combine=rounded.py"


def _chrome_trace(path, experts_ms: float) -> str:
    """Two profiler steps of one rank: an expert block, then an All-to-All it waits in, then a gap."""
    events = []
    for step in range(2):
        at = step * 100.0
        events += [{"ph": "X", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": at * 1e3, "dur": 90e3},
                   {"ph": "X", "name": "block:moe_grouped_gemm", "pid": 1, "tid": 1, "ts": at * 1e3,
                    "dur": experts_ms * 1e3},
                   {"ph": "X", "name": "c10d::alltoall_base_", "pid": 1, "tid": 1, "ts": (at + 60) * 1e3, "dur": 20e3}]
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def test_a_profiled_replay_shows_each_ranks_step_as_a_timeline(empty_db, tmp_path):
    from workbench.store import LossReplay, session_scope

    traces = [_chrome_trace(tmp_path / f"rank-{r}.trace.json", ms) for r, ms in enumerate((10.0, 50.0))]
    with session_scope(get_engine(empty_db)) as s:
        s.add(LossReplay(model=MODEL, mode="scratch", preset="tiny", seed=0, status="pass", curve=[6.0, 5.9],
                         reference_curve=[6.0, 5.9], layout={"ranks": 2, "sharding": "fsdp2", "experts": "ep"},
                         detail={"traces": traces}))
    at = open_app("replays")
    assert "Where the ranks' steps went" in [h.value for h in at.subheader]
    table = at.dataframe[1].value
    assert list(zip(table["rank"], table["step"], strict=True)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert list(table["compute_ms"]) == pytest.approx([10.0, 10.0, 50.0, 50.0])
    assert list(table["communication_ms"]) == pytest.approx([20.0] * 4)
    gantt = json.loads(charts(at)[-1].proto.spec)
    assert gantt["mark"]["type"] == "bar" and gantt["encoding"]["y"]["field"] == "rank"
    assert at.selectbox[1].options == ["0", "1"]
    at.selectbox[1].set_value(1).run()
    assert not at.exception

    Path(traces[1]).unlink()
    st.cache_data.clear()
    at = open_app("replays")
    assert any("the trace of rank 1 is missing" in c.value for c in at.caption)


def test_replays_empty_state(empty_db):
    at = open_app("replays")
    assert "`workbench replay kimi-k3.1-pro --mode scratch`" in at.info[0].value
    assert not at.dataframe and not charts(at)


# --- CI -----------------------------------------------------------------------------------------------------------


def test_ci_page_history_operators_and_regressions(seeded):
    at = open_app("ci")
    jobs = at.dataframe[0].value
    assert list(jobs["commit"]) == ["9e8d7c6", "4f1c2ab"]
    assert list(jobs["status"]) == ["failed", "passed"] and list(jobs["regressions"]) == [1, 0]
    assert list(jobs["failed_checks"]) == [1, 0] and list(jobs["passing"]) == [0, 1]
    operators = at.dataframe[1].value  # of the latest job
    assert operators.iloc[0]["block"] == "rmsnorm" and operators.iloc[0]["failing"] == "grad:x float16"
    regressions = at.dataframe[2].value
    assert list(regressions["block"]) == ["rmsnorm"] and regressions.iloc[0]["regression"] == CI_REGRESSION
    assert charts(at)


def test_ci_empty_state(empty_db):
    at = open_app("ci")
    assert "`workbench ci`" in at.info[0].value


# --- parity -------------------------------------------------------------------------------------------------------

PARITY = {"source": "kimi-k3 (workbench/models/configs/kimi-k3.config.json)", "model_type": "kimi_linear",
          "model_class": "KimiLinearForCausalLM", "dtype": "float32", "backend": "interpreter",
          "layers": ["linear_attention", "full_attention"], "tokens": 16, "status": "fail",
          "metrics": {"kl": 3.1e-4, "cosine": 0.999, "top1": 0.9, "top5": 0.95, "router_match": 1.0,
                      "loss_rel": 2e-3, "grad_rel_worst": 0.2,
                      "first_divergence": {"module": "model.layers.0.input_layernorm", "rel": 0.4},
                      "torch_share": {"flops_share": 0.25, "bytes_share": 0.4, "flops_torch": 100, "bytes_torch": 400,
                                      "flops_total": 400, "bytes_total": 1000, "ported_calls": {"rmsnorm": 5},
                                      "left": [{"class": "KimiLinearForgetGate", "modules": 1, "flops": 100,
                                                "bytes": 400, "ops": ["softplus", "mul"],
                                                "example": "model.layers.0.self_attn.forget_gate"}]}},
          "checks": [{"metric": "kl", "value": 3.1e-4, "bound": 1e-8, "op": "<=", "ok": False}],
          "patch": {"modules": [{"class": "KimiLinearRMSNorm", "blocks": ["rmsnorm"], "reason": "", "count": 5,
                                 "example": "model.norm"},
                                {"class": "KimiLinearForgetGate", "blocks": [], "reason": "softplus forget gate",
                                 "count": 1, "example": "model.layers.0.self_attn.forget_gate"}]},
          "notes": ["plain projections (nn.Linear) run in torch"], "message": "outside the float32 bounds: kl",
          "seconds": 12.0}


def test_parity_page_shows_the_runs_their_checks_and_modules(empty_db):
    assert "`workbench parity kimi-k3`" in open_app("parity").info[0].value
    records.record_parity(get_engine(empty_db), PARITY)
    st.cache_data.clear()
    at = open_app("parity")
    runs = at.dataframe[0].value
    assert list(runs["status"]) == ["fail"] and runs.iloc[0]["first_divergence"] == "model.layers.0.input_layernorm"
    assert (runs.iloc[0]["replaced"], runs.iloc[0]["left_alone"]) == (5, 1)
    assert at.dataframe[1].value.iloc[0]["metric"] == "kl"
    assert list(at.dataframe[2].value["class"]) == ["KimiLinearRMSNorm", "KimiLinearForgetGate"]
    # the share of the forward left in torch, and what it is
    assert (runs.iloc[0]["torch_flops"], runs.iloc[0]["torch_bytes"]) == (0.25, 0.4)
    assert list(at.dataframe[3].value["class"]) == ["KimiLinearForgetGate"]
    assert {m.label: m.value for m in at.metric}["latest"] == "fail"


# --- runs ---------------------------------------------------------------------------------------------------------


def test_runs_page_shows_a_run_written_while_the_app_runs(seeded):
    at = open_app("runs")
    assert {m.label: m.value for m in at.metric}["running"] == "1"
    assert at.selectbox(key="live_run").value == seeded.running_run
    assert len(at.dataframe[0].value) == 3

    engine = get_engine(seeded.db_url)
    new_run = records.start_run(engine, block="situ", proposer="search", backend="interpreter", budget=3, config={})
    records.add_step(engine, new_run, "plan", "a run started while the dashboard was open")
    records.add_step(engine, seeded.running_run, "contract", "ok: parses (a step written live)")
    st.cache_data.clear()  # what the 1 s cache would do by the next 2 s refresh
    at.run()

    runs = at.dataframe[0].value
    assert runs["id"].iloc[0] == new_run and len(runs) == 4
    assert {m.label: m.value for m in at.metric}["running"] == "2"
    assert at.selectbox(key="live_run").value == seeded.running_run  # the followed run stays chosen
    assert "a step written live" in at.markdown[-1].value
    at.selectbox(key="live_run").set_value(new_run).run()
    assert "while the dashboard was open" in at.markdown[-1].value


def test_runs_waiting_for_approval_show_on_the_overview_and_the_runs_page(seeded):
    engine = get_engine(seeded.db_url)
    waiting = records.start_run(engine, block="situ", proposer="llm", backend="interpreter", budget=3, config={})
    reason = f"waiting for approval to promote #2 llm (model=coder, call=2): `workbench approve {waiting}`"
    records.add_step(engine, waiting, "approve", reason)
    records.set_run_status(engine, waiting, "waiting_approval", reason)

    at = open_app()
    assert "Waiting for approval" in [s.value for s in at.subheader]
    table = at.dataframe[-1].value
    assert list(table["id"]) == [waiting] and table["reason"].iloc[0] == reason
    assert "`workbench approve <run>`" in text_of(at)

    at = open_app("runs")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["waiting for approval"] == "1" and metrics["running"] == "1"
    at.selectbox(key="live_run").set_value(waiting).run()
    assert f"`workbench approve {waiting}`" in at.info[0].value
    assert "**approve**" in at.markdown[-1].value and "waiting for approval to promote" in at.markdown[-1].value


def test_runs_empty_state(empty_db):
    at = open_app("runs")
    assert "`workbench port rmsnorm`" in at.info[0].value


# --- read only ----------------------------------------------------------------------------------------------------


def _contents(url: str) -> dict:
    """Every table's rows, in primary-key order."""
    engine = get_engine(url)
    with engine.connect() as conn:
        return {table.name: conn.execute(select(table).order_by(*table.primary_key.columns)).all()
                for table in SQLModel.metadata.sorted_tables}


def test_the_dashboard_never_writes(seeded):
    before = _contents(seeded.db_url)
    assert before["port_run"] and before["candidate"]
    for page in (None, "block", "replays", "ci", "parity", "runs"):
        open_app(page)
    assert _contents(seeded.db_url) == before


# --- the command --------------------------------------------------------------------------------------------------


def test_cli_dashboard_runs_streamlit_on_the_app(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, env: calls.append((cmd, env)) or 0)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    result = CliRunner().invoke(cli_app, ["dashboard", "--db", url, "--port", "8599"])
    assert result.exit_code == 0, result.output
    ((cmd, env),) = calls
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"] and cmd[4] == str(APP)
    flags = " ".join(cmd[5:])
    assert "--server.headless true" in flags and "--server.port 8599" in flags
    assert "--browser.gatherUsageStats false" in flags
    assert env["WORKBENCH_DB"] == url
    assert "http://localhost:8599" in result.output


# --- performance --------------------------------------------------------------------------------------------------


def test_performance_page_shows_modelled_and_measured_figures_apart(seeded):
    at = open_app("performance")
    table = at.dataframe[0].value
    rows = {(r["subject"], r["figure"]): r for _, r in table.iterrows()}
    assert set(rows) == {("operator", "modelled"), ("operator", "measured"), ("eager", "measured")}
    modelled = rows[("operator", "modelled")]  # the latest figures (no spill penalty), both widths summed
    assert modelled["time:fwd+bwd"] == pytest.approx(0.063) and modelled["of roofline"] == pytest.approx(1.0)
    assert rows[("eager", "measured")]["of roofline"] == pytest.approx(0.25)
    assert "modelled: the cost model's roofline floor" in text_of(at)
    assert charts(at)  # two recordings of the modelled figures: a line over time


def test_performance_empty_state(empty_db):
    at = open_app("performance")
    assert "`workbench bench`" in at.info[0].value
