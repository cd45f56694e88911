"""The graph's nodes and routers alone, outside any graph: a node is a function of the state and LangGraph's
runtime (whose context is the run's PortContext), a router a function of the state."""

from __future__ import annotations

from langgraph.runtime import Runtime

from workbench.agent import graph
from workbench.agent.search import SearchProposer
from workbench.agent.state import PortOptions
from workbench.backends import INTERPRETER
from workbench.blocks import get_block
from workbench.store import get_engine, records
from workbench.store.queries import run_candidates, run_steps

GOOD = 'BLOCK = "rmsnorm"\n\n\ndef run(x, weight, eps):\n    return x\n'


def _runtime(settings):
    engine = get_engine(settings.db_url)
    options = PortOptions(suites=["smoke"], dtypes=["float32"], timeout_s=60)
    ctx = graph.PortContext(spec=get_block("rmsnorm"), templates={}, proposer=SearchProposer([], []), engine=engine,
                            settings=settings, backend=INTERPRETER, options=options)
    run_id = records.start_run(engine, block="rmsnorm", proposer="search", backend="interpreter", budget=2,
                               config=options.to_json())
    return Runtime(context=ctx), run_id


def _candidate(runtime, run_id, tmp_path, source: str) -> dict:
    path = tmp_path / "cand.py"
    path.write_text(source)
    cid = records.add_candidate(runtime.context.engine, block="rmsnorm", source=source, source_hash="h",
                                path=str(path), run_id=run_id, iteration=1)
    return {"iteration": 1, "candidate_id": cid, "path": str(path), "template": "t", "params": {}}


def test_the_contract_node_passes_a_module_that_keeps_the_contract_and_records_one_that_does_not(settings, tmp_path):
    runtime, run_id = _runtime(settings)
    state = {"run_id": run_id, "current": _candidate(runtime, run_id, tmp_path, GOOD)}
    out = graph.check_contract(state, runtime)
    assert "verdict" not in out["current"] and graph.after_contract(out) == "verify"
    state = {"run_id": run_id, "current": _candidate(runtime, run_id, tmp_path, GOOD.replace("weight", "w"))}
    out = graph.check_contract(state, runtime)
    assert out["current"]["verdict"] == "compile_error" and graph.after_contract(out) == "diagnose"
    engine = runtime.context.engine
    assert run_candidates(engine, run_id)[-1].status == "compile_error"
    steps = [(s.node, s.message.split(":")[0]) for s in run_steps(engine, run_id)]
    assert steps == [("contract", "ok"), ("contract", "compile_error")]


def test_the_routers_follow_the_state():
    assert graph.after_plan({"proposal": None}) == "record"
    assert graph.after_render({"current": {"verdict": "compile_error"}}) == "diagnose"
    passing = {"current": {"verdict": "pass"}, "passing": [{}], "explore": 2}
    assert graph.after_verify(passing) == "revise"
    tuned = {"tuning": {"probes": 3}}
    # the passing candidates are tuned once; the tuned candidate, verified, goes to the gate
    assert graph.after_verify({**passing, "explore": 1}) == "tune"
    assert graph.after_verify({**passing, **tuned}) == "replay_gate"
    assert graph.after_verify({**passing, "current": {"verdict": "fail"}}) == "diagnose"
    assert graph.after_revise({"proposal": None, "passing": [{}]}) == "tune"
    assert graph.after_revise({"proposal": None, "passing": [{}], **tuned}) == "replay_gate"
    assert graph.after_revise({"proposal": None, "passing": []}) == "record"
    assert graph.after_tune({"proposal": {"template": "t", "params": {}, "reason": "tuned"}}) == "render"
    assert graph.after_tune({"proposal": None}) == "replay_gate"
    assert graph.after_replay_gate({"gate": {"candidate_id": None}}) == "record"
    assert graph.after_explored({"passing": [{}, {}], "explore": 2}) == "tune"
    assert graph.after_explored({"passing": [{}], "explore": 2}) == "revise"


def test_a_batch_fans_out_one_explore_branch_per_candidate_numbered_on_from_the_count():
    points = [{"template": "t", "params": {"B": b}, "reason": "r"} for b in (1, 2)]
    state = {"run_id": "r1", "attempt": 3, "proposal": None, "batch": points, "passing": []}
    for branches in (graph.after_plan(state), graph.after_revise(state)):
        assert [(b.node, b.arg["attempt"], b.arg["proposal"]) for b in branches] == \
            [("explore", 3, points[0]), ("explore", 4, points[1])]


def test_options_round_trip_through_the_runs_json_and_an_older_record_takes_the_defaults():
    options = PortOptions(suites=["smoke", "edge"], dtypes=["float32"], timeout_s=300, explore=2, measure=True)
    assert PortOptions.from_json(options.to_json()) == options
    older = {"suites": ["smoke"], "dtypes": ["float16"], "timeout_s": 60, "seeds": 1, "unknown": 1}
    assert PortOptions.from_json(older) == PortOptions(suites=["smoke"], dtypes=["float16"], timeout_s=60, seeds=1)
