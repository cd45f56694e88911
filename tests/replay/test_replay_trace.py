"""The traces of a distributed replay: compute, communication and idle per rank and step, bubbles, the All-to-All
and how much of it the experts' compute hides, the slowest rank and the op that explains it; first on small
synthetic Chrome traces, then on real 2-rank replays (--profile), one with a rank slowed on purpose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlmodel import Session, select
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import Settings
from workbench.errors import WorkbenchError
from workbench.replay.faults import DELAYED, write_op
from workbench.replay.runner import plan_replay, run_replay
from workbench.replay.trace import EXPERTS, bubbles, figures, read_trace, report
from workbench.store import LossReplay, get_engine, session_scope

MODEL = "kimi-k3.1-pro"
REPO = Path(__file__).resolve().parents[2]
MAIN, GLOO = 1, 2


def _trace(path: Path, steps: list[list[tuple]]) -> Path:
    """A Chrome trace as torch.profiler writes it: per step (ProfilerStep#<n>, 10 ms apart by default lengths) its
    ops as (name, start ms, ms[, thread]) from the step's start, on the main thread unless a thread is given."""
    events, at = [{"ph": "M", "name": "thread_name", "pid": 7, "tid": MAIN, "args": {"name": "python"}}], 0.0
    for n, ops in enumerate(steps):
        length = max(start + ms for _, start, ms, *_ in ops) + 1.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 7, "tid": MAIN,
                       "ts": at * 1e3, "dur": length * 1e3})
        events += [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 7, "tid": thread[0] if thread else MAIN,
                    "ts": (at + start) * 1e3, "dur": ms * 1e3} for name, start, ms, *thread in ops]
        at += length
    path.write_text(json.dumps({"traceEvents": events}))
    return path


STEP = [("aten::mm", 0.0, 2.0), ("aten::copy_", 0.5, 1.0),              # compute, an op inside another
        ("block:rmsnorm", 3.0, 2.0), ("aten::mul", 3.5, 0.5),           # a block and an op inside it
        ("c10d::allreduce_", 6.0, 1.0), ("gloo:all_reduce", 6.5, 2.0, GLOO),  # returns, then waited for till 8.5
        ("aten::add", 9.0, 0.5)]                                        # the step ends at 10.5


def test_a_step_splits_into_compute_communication_and_idle(tmp_path):
    (step,) = read_trace(_trace(tmp_path / "rank-0.trace.json", [STEP]), 0)
    found = figures(step)
    assert found.ms == pytest.approx(10.5)
    assert found.compute_ms == pytest.approx(4.5)       # mm 2 (its copy inside it), rmsnorm 2, add 0.5
    assert found.communication_ms == pytest.approx(2.5)  # the all-reduce 1, then its wait outside any op 1.5
    assert found.idle_ms == pytest.approx(3.5)
    assert found.ops == pytest.approx({"aten::mm": 2.0, "block:rmsnorm": 2.0, "aten::add": 0.5})  # compute
    assert found.all_to_all_ms == 0 and found.hidden_fraction == 0


def test_a_wait_inside_an_ops_own_time_after_its_collective_is_communication(tmp_path):
    """FSDP's all-gather: the collective returns, the span waits for gloo's work before it copies the result out."""
    ops = [("FSDP::all_gather", 0.0, 10.0), ("c10d::_allgather_base_", 1.0, 1.0), ("gloo:all_gather", 1.5, 6.5, GLOO),
           ("fsdp::all_gather_copy_out", 8.5, 0.5)]
    (step,) = read_trace(_trace(tmp_path / "rank-0.trace.json", [ops]), 0)
    found = figures(step)
    assert found.communication_ms == pytest.approx(7.0)  # the collective 1, its wait 2 -> 8
    assert found.compute_ms == pytest.approx(3.0) and found.ops == pytest.approx({"FSDP::all_gather": 3.0})
    assert found.idle_ms == pytest.approx(1.0)


def test_bubbles_are_the_idle_gaps_over_the_threshold_with_the_ops_around_them(tmp_path):
    (step,) = read_trace(_trace(tmp_path / "rank-0.trace.json", [STEP]), 0)
    gaps = [(round(b.at_ms, 6), round(b.ms, 6), b.before, b.after) for b in bubbles(step, 0.9)]
    assert gaps == [(2.0, 1.0, "aten::mm", "block:rmsnorm"), (5.0, 1.0, "block:rmsnorm", "c10d::allreduce_"),
                    (9.5, 1.0, "aten::add", "step end")]
    assert bubbles(step, 1.5) == []


@pytest.mark.parametrize("dispatch_ends, hidden", [(4.0, 1.5), (0.9, 0.0)])
def test_the_all_to_all_hidden_under_the_experts_is_its_overlap_with_their_compute(tmp_path, dispatch_ends, hidden):
    """An asynchronous dispatch: issued on the main thread, run by a gloo thread while the experts compute (or done
    before they start)."""
    ops = [("_c10d_functional::all_to_all_single", 0.0, 0.5), ("gloo:all_to_all", 0.2, dispatch_ends - 0.2, GLOO),
           ("aten::clone", 1.0, 0.1), (EXPERTS, 1.5, 1.5)]
    (step,) = read_trace(_trace(tmp_path / "rank-0.trace.json", [ops]), 0)
    found = figures(step)
    assert found.all_to_all_ms == pytest.approx(max(dispatch_ends, 0.5))
    assert found.all_to_all_wait_ms == pytest.approx(min(dispatch_ends, 1.0))  # issued, then waited for till clone
    assert found.hidden_ms == pytest.approx(hidden)
    assert found.hidden_fraction == pytest.approx(hidden / max(dispatch_ends, 0.5))


def test_the_slowest_rank_is_named_with_the_op_that_explains_it_not_the_waits(tmp_path):
    """Rank 1's experts take 50 ms longer; rank 0 waits for it in the All-to-All: its step lasts as long, with more
    communication. The comparison is of compute, and of the ops' own time."""
    def step(experts_ms: float, wait_ms: float) -> list[tuple]:
        return [("block:moe_permute", 0.0, 2.0), (EXPERTS, 3.0, experts_ms),
                ("c10d::alltoall_base_", 4.0 + experts_ms, wait_ms), ("aten::add", 5.0 + experts_ms + wait_ms, 1.0)]

    paths = [_trace(tmp_path / "rank-0.trace.json", [step(5.0, 51.0), step(5.0, 50.0)]),
             _trace(tmp_path / "rank-1.trace.json", [step(55.0, 1.0), step(56.0, 1.0)])]
    found = report(paths)
    assert [(s.rank, s.step) for s in found.steps] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    slow = found.slowest
    assert (slow.rank, slow.step, slow.op) == (1, 1, EXPERTS)
    assert (slow.op_ms, slow.others_op_ms) == pytest.approx((56.0, 5.0))
    assert (slow.compute_ms, slow.others_compute_ms) == pytest.approx((59.0, 8.0))
    assert report(paths[:1]).slowest is None  # one rank: nothing to compare


def test_the_first_steps_one_time_costs_do_not_name_the_slowest_rank(tmp_path):
    """Rank 0's first optimizer step creates its state (300 ms); rank 1's experts are 20 ms slower at every step:
    rank 1 is named, at a later step; with only the first step traced, that step is all there is to compare."""
    def step(experts_ms: float, optimizer_ms: float) -> list[tuple]:
        return [(EXPERTS, 0.0, experts_ms), ("Optimizer.step#AdamW.step", experts_ms + 1.0, optimizer_ms)]

    paths = [_trace(tmp_path / "rank-0.trace.json", [step(5.0, 300.0), step(5.0, 30.0), step(5.0, 30.0)]),
             _trace(tmp_path / "rank-1.trace.json", [step(25.0, 40.0), step(25.0, 30.0), step(26.0, 30.0)])]
    slow = report(paths).slowest
    assert (slow.rank, slow.step, slow.op) == (1, 2, EXPERTS)
    first = [_trace(tmp_path / f"first-{r}.trace.json", [step(*sizes)]) for r, sizes in enumerate([(5, 300), (25, 40)])]
    assert (report(first).slowest.rank, report(first).slowest.op) == (0, "Optimizer.step#AdamW.step")
    # 1.5 ms longer on 35 ms of compute: the noise between two ranks of one run, not a slow rank
    near = [_trace(tmp_path / f"near-{r}.trace.json", [step(5.0, 30.0), step(experts, 30.0)])
            for r, experts in enumerate([5.0, 6.5])]
    assert report(near).slowest is None


def test_a_missing_or_malformed_trace_is_one_clear_error(tmp_path):
    with pytest.raises(WorkbenchError, match="the trace of rank 1 is missing"):
        report([_trace(tmp_path / "rank-0.trace.json", [STEP]), tmp_path / "rank-1.trace.json"])
    (tmp_path / "cut.json").write_text('{"traceEvents": [{"ph": "X", ')
    with pytest.raises(WorkbenchError, match="cut.json is not the Chrome trace of a profiled replay"):
        read_trace(tmp_path / "cut.json", 0)
    (tmp_path / "plain.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "pid": 1,
                                                                       "tid": 1, "ts": 0, "dur": 5}]}))
    with pytest.raises(WorkbenchError, match="no ProfilerStep spans"):
        read_trace(tmp_path / "plain.json", 0)


def _recorded(settings: Settings, detail: dict) -> int:
    with session_scope(get_engine(settings.db_url)) as s:
        row = LossReplay(model=MODEL, mode="scratch", preset="tiny", seed=0, status="pass", detail=detail,
                         layout={"ranks": 2, "sharding": "fsdp2", "experts": "ep", "chunks": 2})
        s.add(row)
        s.flush()
        return row.id


def test_the_trace_command_reports_a_recorded_replay_and_names_what_is_wrong(settings, tmp_path):
    paths = [str(_trace(tmp_path / f"rank-{r}.trace.json", [STEP, STEP])) for r in range(2)]
    traced, plain = _recorded(settings, {"traces": paths}), _recorded(settings, {})
    result = CliRunner().invoke(app, ["trace", str(traced), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["replay_id"] == traced and len(data["steps"]) == 4 and data["hidden_fraction"] == 0
    assert data["steps"][0]["communication_ms"] == pytest.approx(2.5)
    shown = CliRunner().invoke(app, ["trace", str(traced), "--bubble-ms", "0.9"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert f"Replay #{traced} · {MODEL} · 2 ranks · dispatch in 2 chunks" in shown.output
    assert "Bubbles: idle gaps of 0.9 ms or more" in shown.output
    assert "slowest: none, no rank computes 10% longer than the others at any step" in shown.output  # one trace twice
    for args, message in [([str(traced + 9)], f"no replay #{traced + 9}"),
                          ([str(plain)], f"replay #{plain} has no traces"),
                          ([str(traced), "--bubble-ms", "-1"], "Invalid value")]:
        result = CliRunner().invoke(app, ["trace", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    Path(paths[1]).write_text("not json")
    result = CliRunner().invoke(app, ["trace", str(traced)])
    assert result.exit_code == 2 and "rank-1.trace.json is not the Chrome trace" in result.output


def test_profiling_needs_ranks(settings):
    with pytest.raises(WorkbenchError, match="--profile traces the ranks of a distributed replay"):
        plan_replay(MODEL, "scratch", settings, profile=True)


# --- real 2-rank replays --------------------------------------------------------------------------------------------


def _traced(settings: Settings, replay_id: int) -> tuple[list[str], dict]:
    with Session(get_engine(settings.db_url)) as s:
        row = s.exec(select(LossReplay).where(LossReplay.id == replay_id)).one()
    result = CliRunner().invoke(app, ["trace", str(replay_id), "--db", settings.db_url, "--json"])
    assert result.exit_code == 0, result.output
    return row.detail["traces"], json.loads(result.output)


@pytest.mark.slow  # the references (single process, then the layout's), then the profiled replay: about a minute
@pytest.mark.parametrize("chunks", [1, 2])
def test_a_profiled_replay_traces_every_rank_and_step(shared, chunks):
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=2, ranks=2, chunks=chunks, profile=True)
    assert outcome.status == "pass", outcome.reason
    paths, found = _traced(shared, outcome.replay_id)
    assert paths == [str(shared.work_dir / "replays" / f"replay-{outcome.replay_id}" / f"rank-{r}.trace.json")
                     for r in range(2)]
    assert all(Path(p).is_file() for p in paths)
    assert [(s["rank"], s["step"]) for s in found["steps"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for s in found["steps"]:
        assert s["compute_ms"] > 0 and s["communication_ms"] > 0 and s["all_to_all_ms"] > 0
        assert s["all_to_all_wait_ms"] > 0 and 0 <= s["hidden_ms"] <= s["all_to_all_ms"]
    if chunks == 1:  # the experts start once their rows are in, and the rows go home once they are done
        assert all(s["hidden_ms"] == 0 for s in found["steps"]) and found["hidden_fraction"] == 0
    else:  # the next chunk's dispatch in flight while a chunk's experts compute: how much, the machine decides
        assert 0 <= found["hidden_fraction"] <= 1


@pytest.mark.slow
def test_a_rank_slowed_on_purpose_is_named_with_the_block_that_slows_it(shared, tmp_path):
    # 1000 ms a call: far above what a loaded machine adds to a step's compute (with 50 ms, the suite on two busy
    # cores once named no rank: rank 0's compute, inflated by the load, came within 10% of the slowed rank's)
    delayed = write_op(tmp_path, "gemm_delayed", DELAYED, block="moe_grouped_gemm", ms=1000)
    outcome = run_replay(MODEL, "scratch", shared, ops=["reference"], steps=2, ranks=2, profile=True,
                         rank_ops={1: [f"moe_grouped_gemm={delayed}"]})
    assert outcome.status == "pass", outcome.reason  # only late: every number as without the delay
    _, found = _traced(shared, outcome.replay_id)
    slow = found["slowest"]
    assert slow is not None, [(s["rank"], s["step"], s["compute_ms"]) for s in found["steps"]]
    assert slow["rank"] == 1 and slow["op"] == EXPERTS
    assert slow["op_ms"] >= 1000  # one MoE layer (K3's first is dense), 1000 ms of sleep: a floor however busy
    # the delay is most of the difference; the experts' own compute on two busy cores varies by tens of ms
    assert slow["op_ms"] - slow["others_op_ms"] > 500
    waited = {s["rank"]: s["all_to_all_wait_ms"] for s in found["steps"] if s["step"] == slow["step"]}
    assert waited[0] > waited[1]  # rank 0 waits for rank 1 in the All-to-All
