"""The store on a temporary SQLite file: writes (records) round-trip through the reads (queries), the SQLite
pragmas, interrupted runs, block statuses and promoted operators."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import make_url
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from workbench.operators import evidence_line, list_promoted, operator_evidence, promote_file
from workbench.status import block_status
from workbench.store import Candidate, LossReplay, PortRun, get_engine, session_scope
from workbench.store.db import BUSY_TIMEOUT_MS
from workbench.store.models import KernelBuild
from workbench.store.queries import (
    candidate_checks,
    find_run,
    list_runs,
    run_candidates,
    run_steps,
)
from workbench.store.records import (
    add_candidate,
    add_step,
    extend_replay_curve,
    finish_run,
    mark_interrupted,
    record_verification,
    set_candidate_status,
    start_replay,
    start_run,
)
from workbench.templating import list_templates
from workbench.verify.result import Check, VerificationResult

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture
def engine(store_url):
    """A fresh store on SQLite, then on PostgreSQL (get_engine is cached per URL: a database per test)."""
    return get_engine(store_url)


@pytest.fixture
def sqlite_engine(tmp_path):
    return get_engine(f"sqlite:///{tmp_path / 'wb.db'}")


def new_run(engine, block: str = "rmsnorm", **kwargs) -> str:
    args = {"proposer": "search", "backend": "interpreter", "budget": 5, "config": {"suites": ["smoke"]}}
    return start_run(engine, block=block, **{**args, **kwargs})


def update_run(engine, run_id: str, **fields) -> None:
    with session_scope(engine) as s:
        run = s.get(PortRun, run_id)
        for key, value in fields.items():
            setattr(run, key, value)


def insert_run(engine, run_id: str, block: str = "rmsnorm", **fields) -> None:
    with session_scope(engine) as s:
        s.add(PortRun(id=run_id, block=block, proposer="search", backend="interpreter", budget=1, **fields))


def two_checks() -> list[Check]:
    return [
        Check(suite="smoke", shape="rows=4,N=64", dtype="float32", seed=0, direction="forward:y", passed=True,
              max_abs=1e-6, max_rel=1e-6, err_ratio=1e-7, ref_err=1e-6, bound=4e-6),
        Check(suite="edge", shape="rows=1,N=123", dtype="float16", seed=1, direction="grad:x", passed=False,
              reason="max abs err 0.5 > bound 0.25", max_abs=0.5, max_rel=0.1, err_ratio=0.01, ref_err=0.1,
              bound=0.25, nonfinite=0),
    ]


# --- engine ----------------------------------------------------------------------------------------------------


def test_engine_is_cached_per_url_and_creates_tables(tmp_path, store_url, engine):
    assert get_engine(store_url) is engine
    assert get_engine(f"sqlite:///{tmp_path / 'other.db'}") is not engine
    tables = set(sa_inspect(engine).get_table_names())
    assert {"port_run", "run_step", "candidate", "verification_check", "benchmark",
            "loss_replay", "ci_job"} <= tables


def test_sqlite_pragmas_are_in_force(sqlite_engine):
    with sqlite_engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar().lower() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == BUSY_TIMEOUT_MS == 30_000
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL


def test_foreign_keys_are_enforced(engine):
    with pytest.raises(IntegrityError):
        add_step(engine, "no-such-run", "plan", "orphan step")
    assert run_steps(engine, "no-such-run") == []


def test_session_scope_rolls_back_on_error(engine):
    with pytest.raises(RuntimeError), session_scope(engine) as s:
        s.add(PortRun(id="r1", block="rmsnorm", proposer="p", backend="b", budget=1))
        raise RuntimeError("boom")
    assert find_run(engine, "r1") is None


# --- a run's record round-trips --------------------------------------------------------------------------------


def test_run_round_trip(engine):
    run_id = new_run(engine, model="kimi-k3.1-pro")
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", run_id)

    (run,) = list_runs(engine)
    assert (run.id, run.block, run.model, run.status) == (run_id, "rmsnorm", "kimi-k3.1-pro", "running")
    assert (run.proposer, run.backend, run.budget) == ("search", "interpreter", 5)
    assert run.config == {"suites": ["smoke"]}
    assert run.pid == os.getpid() and run.host == socket.gethostname()
    assert run.finished_at is None

    add_step(engine, run_id, "plan", "chose row_block", {"points": 3})
    add_step(engine, run_id, "render", "rendered one candidate")
    add_step(engine, run_id, "verify", "failed on float16")
    steps = run_steps(engine, run_id)
    assert [s.seq for s in steps] == [1, 2, 3]
    assert [s.node for s in steps] == ["plan", "render", "verify"]
    assert steps[0].message == "chose row_block" and steps[0].data == {"points": 3}
    assert steps[1].data == {}

    second = add_candidate(engine, block="rmsnorm", source="print(2)\n", source_hash="h2", path="/tmp/c2.py",
                           run_id=run_id, iteration=2, template="col_tiled", params={"TILE_N": 64})
    first = add_candidate(engine, block="rmsnorm", source="print(1)\n", source_hash="h1", path="/tmp/c1.py",
                          run_id=run_id, iteration=1, template="row_block",
                          params={"BLOCK_N": 64, "ACC_DTYPE": "float32"})
    assert isinstance(first, int) and isinstance(second, int) and first != second
    candidates = run_candidates(engine, run_id)
    assert [c.id for c in candidates] == [first, second]  # by iteration
    assert candidates[0].params == {"BLOCK_N": 64, "ACC_DTYPE": "float32"}
    assert candidates[0].source == "print(1)\n" and candidates[0].status == "rendered"

    result = VerificationResult(block="rmsnorm", candidate="/tmp/c1.py", source_hash="h1", backend="interpreter",
                                verdict="fail", message="1 of 2 checks failed", checks=two_checks(), seconds=1.5)
    record_verification(engine, first, result)
    row = run_candidates(engine, run_id)[0]
    assert (row.status, row.message) == ("fail", "1 of 2 checks failed")
    assert row.worst_ratio == pytest.approx(2.0)  # 0.5 / 0.25
    assert row.verify_seconds == 1.5

    checks = candidate_checks(engine, first)
    assert len(checks) == 2
    by_direction = {c.direction: c for c in checks}
    assert by_direction["forward:y"].passed is True
    failed = by_direction["grad:x"]
    assert failed.passed is False and failed.backend == "interpreter"
    assert (failed.suite, failed.shape, failed.dtype, failed.seed) == ("edge", "rows=1,N=123", "float16", 1)
    assert (failed.max_abs, failed.bound, failed.reason) == (0.5, 0.25, "max abs err 0.5 > bound 0.25")
    assert candidate_checks(engine, second) == []

    finish_run(engine, run_id, "blocked", "budget spent", best_candidate_id=first)
    run = find_run(engine, run_id)
    assert (run.status, run.reason, run.best_candidate_id, run.operator_path) == ("blocked", "budget spent",
                                                                                   first, None)
    assert run.finished_at is not None


def test_record_verification_of_a_run_error_has_no_ratio(engine):
    cid = add_candidate(engine, block="rmsnorm", source="x", source_hash="h", path="p")
    crash = Check(suite="smoke", shape="rows=4,N=64", dtype="float32", seed=0, direction="run", passed=False,
                  reason="RuntimeError: boom")
    record_verification(engine, cid, VerificationResult(block="rmsnorm", candidate="p", source_hash="h",
                                                        backend="interpreter", verdict="runtime_error",
                                                        message="boom", checks=[crash]))
    (check,) = candidate_checks(engine, cid)
    assert check.direction == "run" and check.max_abs is None
    set_candidate_status(engine, cid, "timeout", "took too long")
    with session_scope(engine) as s:
        row = s.get(Candidate, cid)
        assert row.worst_ratio is None
        assert (row.status, row.message, row.run_id) == ("timeout", "took too long", None)


def test_steps_are_numbered_per_run(engine):
    a, b = new_run(engine), new_run(engine, block="swiglu")
    add_step(engine, a, "plan", "a1")
    add_step(engine, b, "plan", "b1")
    add_step(engine, a, "render", "a2")
    assert [(s.seq, s.message) for s in run_steps(engine, a)] == [(1, "a1"), (2, "a2")]
    assert [(s.seq, s.message) for s in run_steps(engine, b)] == [(1, "b1")]


def test_list_runs_newest_first_with_block_filter_and_limit(engine):
    for i, (run_id, block) in enumerate([("r-old", "rmsnorm"), ("r-mid", "swiglu"), ("r-new", "rmsnorm")]):
        insert_run(engine, run_id, block, started_at=T0 + timedelta(minutes=i))
    assert [r.id for r in list_runs(engine)] == ["r-new", "r-mid", "r-old"]
    assert [r.id for r in list_runs(engine, block="rmsnorm")] == ["r-new", "r-old"]
    assert [r.id for r in list_runs(engine, limit=1)] == ["r-new"]
    assert list_runs(engine, block="kda") == []


def test_find_run_exact_prefix_ambiguous_missing(engine):
    for run_id in ("20250101-000000-aaaa", "20250101-000000-aabb", "20250102-000000-cccc", "abc", "abcd"):
        insert_run(engine, run_id)
    assert find_run(engine, "20250101-000000-aaaa").id == "20250101-000000-aaaa"
    assert find_run(engine, "20250102").id == "20250102-000000-cccc"  # unique prefix
    assert find_run(engine, "20250101-000000-aab").id == "20250101-000000-aabb"
    assert find_run(engine, "20250101-000000-aa") is None  # ambiguous
    assert find_run(engine, "2025") is None
    assert find_run(engine, "abc").id == "abc"  # an exact id wins over the prefix match
    assert find_run(engine, "zzz") is None
    assert find_run(engine, "cccc") is None  # a prefix, not a substring


# --- interrupted runs ----------------------------------------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_mark_interrupted(engine):
    live = new_run(engine)
    dead = new_run(engine)
    update_run(engine, dead, pid=dead_pid())
    elsewhere = new_run(engine)
    update_run(engine, elsewhere, pid=dead_pid(), host="some-other-host")
    done = new_run(engine)
    update_run(engine, done, pid=dead_pid())
    finish_run(engine, done, "failed", "gave up")

    assert mark_interrupted(engine) == [dead]

    runs = {r.id: r for r in list_runs(engine)}
    assert runs[dead].status == "interrupted"
    assert runs[dead].reason and runs[dead].finished_at is not None
    assert runs[live].status == "running" and runs[live].finished_at is None
    assert runs[elsewhere].status == "running"  # another host's pids are not ours to judge
    assert (runs[done].status, runs[done].reason) == ("failed", "gave up")
    assert mark_interrupted(engine) == []


def test_mark_interrupted_without_pid(engine):
    run_id = new_run(engine)
    update_run(engine, run_id, pid=None)
    assert mark_interrupted(engine) == [run_id]
    assert find_run(engine, run_id).status == "interrupted"


# --- block status ---------------------------------------------------------------------------------------------------


def write_candidate(tmp_path, name: str = "rmsnorm_row_block_0123456789.py") -> os.PathLike:
    path = tmp_path / name
    path.write_text('BLOCK = "rmsnorm"\n')
    return path


def test_block_status_lifecycle(tmp_path, engine):
    ops = tmp_path / "operators"
    assert block_status(engine, ops, "no_such_block") == ("no spec", "")
    assert block_status(engine, ops, "rmsnorm") == ("not started", f"{len(list_templates('rmsnorm'))} templates")

    first = new_run(engine)
    update_run(engine, first, started_at=T0)
    assert block_status(engine, ops, "rmsnorm") == ("in progress", f"run {first}: running")
    assert block_status(engine, ops, "swiglu")[0] == "not started"  # another block's run does not count

    finish_run(engine, first, "blocked", "no template fits N=4097")
    assert block_status(engine, ops, "rmsnorm") == ("blocked", f"run {first}: no template fits N=4097")

    # the latest run decides
    for i, (status, expected) in enumerate([("interrupted", "blocked"), ("failed", "failed"),
                                            ("promoted", "numerics pass"), ("running", "in progress")]):
        run_id = new_run(engine)
        update_run(engine, run_id, started_at=T0 + timedelta(minutes=i + 1), status=status)
        assert block_status(engine, ops, "rmsnorm")[0] == expected, status

    dest = promote_file(write_candidate(tmp_path), ops, "rmsnorm", {"run_id": first, "promoted_at": "2025"})
    assert block_status(engine, ops, "rmsnorm") == ("promoted", f"{dest.name}: {evidence_line({})}")
    assert "not compiled for any target" in evidence_line({}) and "GPU bf16 model: not yet" in evidence_line({})
    assert block_status(engine, ops, "swiglu")[0] == "not started"


# --- promoted operators -----------------------------------------------------------------------------------------------


def test_promote_file_writes_source_and_manifest(tmp_path):
    source = write_candidate(tmp_path)
    ops = tmp_path / "operators"
    manifest = {"template": "row_block", "params": {"BLOCK_N": 64}, "promoted_at": "2025-01-01T00:00:00"}
    dest = promote_file(source, ops, "rmsnorm", manifest)
    assert dest == ops / "rmsnorm" / source.name
    assert dest.read_text() == source.read_text()
    assert json.loads(dest.with_suffix(".json").read_text()) == manifest
    assert list_promoted(ops) == [{**manifest, "path": str(dest)}]
    assert list_promoted(ops, "rmsnorm") == list_promoted(ops)
    assert list_promoted(ops, "swiglu") == []


def test_list_promoted_newest_first(tmp_path):
    ops = tmp_path / "operators"
    old = promote_file(write_candidate(tmp_path, "a.py"), ops, "rmsnorm", {"promoted_at": "2025-01-01"})
    new = promote_file(write_candidate(tmp_path, "b.py"), ops, "rmsnorm", {"promoted_at": "2025-06-01"})
    other = promote_file(write_candidate(tmp_path, "c.py"), ops, "swiglu", {"promoted_at": "2025-03-01"})
    assert [m["path"] for m in list_promoted(ops)] == [str(new), str(other), str(old)]


def test_list_promoted_skips_unusable_manifests(tmp_path):
    ops = tmp_path / "operators"
    good = promote_file(write_candidate(tmp_path), ops, "rmsnorm", {"promoted_at": "2025"})
    folder = ops / "rmsnorm"
    (folder / "no_source.json").write_text(json.dumps({"promoted_at": "2026"}))  # its .py is missing
    (folder / "bad_json.py").write_text("x = 1\n")
    (folder / "bad_json.json").write_text("{not json")
    assert [m["path"] for m in list_promoted(ops)] == [str(good)]
    assert list_promoted(tmp_path / "nowhere") == []


def test_list_promoted_skips_a_manifest_that_is_not_an_object(tmp_path):
    ops = tmp_path / "operators"
    good = promote_file(write_candidate(tmp_path), ops, "rmsnorm", {"promoted_at": "2025"})
    (ops / "rmsnorm" / "listy.py").write_text("x = 1\n")
    (ops / "rmsnorm" / "listy.json").write_text("[1, 2]")
    assert [m["path"] for m in list_promoted(ops)] == [str(good)]


def _build(target: str, ok: bool = True, spilled: int = 0, suite: str = "model") -> dict:
    return {"kernel": "k_fwd", "target": target, "suite": suite, "specialization": {"signature": {"X": "*bf16"}},
            "ok": ok, "error": "" if ok else "NameError: Cannot access global variable EPS", "registers": 96,
            "spilled_bytes": spilled, "shared_bytes": 1024, "num_warps": 4, "num_stages": 3, "ctas_per_sm": 5,
            "uses_dot": False, "tensor_cores": None, "seconds": 0.4, "cached": False}


def test_record_verification_keeps_what_the_compilers_said_and_the_target_report(engine):
    cid = add_candidate(engine, block="rmsnorm", source="x", source_hash="h", path="p")
    result = VerificationResult(block="rmsnorm", candidate="p", source_hash="h", backend="interpreter",
                                verdict="pass", message="ok", targets=["sm_90a", "gfx942", "sm_80"],
                                builds=[_build("sm_90a", spilled=376), _build("gfx942"), _build("sm_80", ok=False)],
                                findings=["spills: sm_90a k_fwd 376 B/thread at the model suite"])
    record_verification(engine, cid, result)
    record_verification(engine, cid, result)  # a second verification replaces the first one's rows
    with session_scope(engine) as s:
        rows = {b.target: b for b in s.exec(select(KernelBuild).where(KernelBuild.candidate_id == cid))}
        candidate = s.get(Candidate, cid)
        assert sorted(rows) == ["gfx942", "sm_80", "sm_90a"]
        assert (rows["sm_90a"].registers, rows["sm_90a"].spilled_bytes, rows["sm_90a"].ctas_per_sm) == (96, 376, 5)
        assert rows["sm_80"].ok is False and "Cannot access global variable" in rows["sm_80"].error
        assert rows["gfx942"].specialization == {"signature": {"X": "*bf16"}}
        assert candidate.target_report["compiles_on"] == ["sm_90a", "gfx942"]
        assert candidate.target_report["spill_free_on"] == ["gfx942"]


def test_a_promoted_operator_is_counted_by_its_strongest_evidence():
    five = ["sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950"]
    on_interpreter = {"verification": {"backend": "interpreter", "dtypes": ["float32", "float16"],
                                       "suites": ["smoke", "edge"]}}
    assert operator_evidence(on_interpreter)["strongest"] == "interpreter only"
    partly = {**on_interpreter, "target_report": {"targets": five, "compiles_on": five[:3], "spill_free_on": []}}
    assert operator_evidence(partly)["strongest"] == "interpreter only"
    assert "compiles 3/5 (sm_80, sm_90a, sm_100a); spill-free 0/5" in evidence_line(partly)
    compiles = {**partly, "target_report": {**partly["target_report"], "compiles_on": five, "spill_free_on": five[3:]}}
    assert operator_evidence(compiles)["strongest"] == "compiles on every target"
    spill_free = {**compiles, "target_report": {**compiles["target_report"], "spill_free_on": five}}
    assert operator_evidence(spill_free)["strongest"] == "spill-free on every target"
    on_gpu = {**spill_free, "verification": {"backend": "cuda", "dtypes": ["bfloat16"], "suites": ["model"]}}
    assert operator_evidence(on_gpu)["strongest"] == "verified on a GPU" and operator_evidence(on_gpu)["gpu_verified"]
    assert evidence_line(on_gpu).endswith("replay: not yet")
    replayed = {**on_gpu, "replay": {"replay_id": 7, "model": "kimi-k3.1-pro", "mode": "scratch", "steps": 6}}
    assert evidence_line(replayed).endswith("replayed (6 scratch steps, replay #7)")


# --- any SQLAlchemy URL: what differs between SQLite and PostgreSQL ---------------------------------------------------


def test_a_diverged_curve_is_stored_as_standard_json(engine):
    """PostgreSQL's json type refuses NaN: a non-finite loss is stored as null on every dialect, the rest intact."""
    replay_id = start_replay(engine, model="kimi-k3.1-pro", mode="scratch", preset="tiny", seed=0, steps=3,
                             backend="interpreter", ops={"all": "promoted"}, reference_curve=[2.0, 1.5, 1.2])
    extend_replay_curve(engine, replay_id, [2.0, float("nan"), float("inf")])
    with session_scope(engine) as s:
        assert s.get(LossReplay, replay_id).curve == [2.0, None, None]


def test_times_are_stored_in_utc_whatever_the_servers_time_zone(postgres):
    """A team server set to another time zone stores the same instants: sessions run in UTC."""
    url = postgres.new_database()
    database = make_url(url).database
    with get_engine(url).connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE \"{database}\" SET timezone TO 'Asia/Tokyo'")
        conn.commit()
    get_engine.cache_clear()  # new connections pick up the database's setting
    try:
        engine = get_engine(url)
        insert_run(engine, "r-tz", started_at=T0)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW timezone").scalar() == "UTC"
            stored = conn.exec_driver_sql("SELECT started_at FROM port_run").scalar()
        assert stored.replace(tzinfo=UTC) == T0
    finally:
        get_engine.cache_clear()


@pytest.mark.slow  # several processes racing, 18 s: the whole suite's
def test_processes_starting_together_on_a_new_database_all_get_their_tables(store_url, open_together):
    """Four processes open one new store at the same moment (two ports and a dashboard, started together): each
    gets the tables and none fails on another's CREATE TABLE."""
    outcomes = open_together(store_url)
    assert [(rc, out) for rc, out, _ in outcomes] == [(0, "0")] * 4, outcomes
