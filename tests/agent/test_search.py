"""Failure classes and repair rules, on hand-made verification checks (no kernels run)."""

from __future__ import annotations

import pytest

from workbench.agent.diagnose import diagnose, parse_shape
from workbench.agent.search import SearchProposer, point_key
from workbench.blocks import get_block
from workbench.templating import list_templates, load_template

ROW_BLOCK = load_template("rmsnorm", "row_block")
GOOD = {"BLOCK_N": 8192, "ACC_DTYPE": "float32", "num_warps": 4, "BWD_PROGRAMS": 128}


def check(shape: str, dtype: str = "float32", direction: str = "forward:y", passed: bool = False,
          nonfinite: int = 0) -> dict:
    return {"shape": shape, "dtype": dtype, "direction": direction, "passed": passed, "nonfinite": nonfinite,
            "max_abs": 1.0 if not passed else 1e-7, "bound": 1e-3}


def proposer() -> SearchProposer:
    spec = get_block("rmsnorm")
    return SearchProposer(list_templates("rmsnorm"), spec.shapes["smoke"] + spec.shapes["edge"])


def test_parse_shape_round_trips_labels():
    assert parse_shape("rows=3,N=4097") == {"rows": 3, "N": 4097}


def test_sandbox_verdicts_are_their_own_class():
    d = diagnose("timeout", "no result within 5 s", [], ROW_BLOCK, GOOD)
    assert d["class"] == "timeout" and "5 s" in d["reason"]


def test_coverage_when_only_uncovered_shapes_fail():
    params = {**GOOD, "BLOCK_N": 256}
    checks = [check("rows=3,N=4097"), check("rows=7,N=1000"), check("rows=4,N=64", passed=True)]
    d = diagnose("fail", "", checks, ROW_BLOCK, params)
    assert d["class"] == "coverage" and d["symptoms"]["requirement"] == "BLOCK_N >= N"


def test_a_runtime_error_exactly_where_a_requirement_fails_is_coverage_and_elsewhere_its_own_class():
    params = {**GOOD, "BLOCK_N": 256}
    refused = [check("rows=3,N=4097", direction="run"), check("rows=4,N=64", direction="run", passed=True)]
    d = diagnose("runtime_error", "ValueError: rows of 4097 columns", refused, ROW_BLOCK, params)
    assert d["class"] == "coverage" and d["symptoms"]["requirement"] == "BLOCK_N >= N"
    crashed = [check("rows=4,N=64", direction="run")]  # BLOCK_N covers this row: the code itself is suspect
    assert diagnose("runtime_error", "IndexError", crashed, ROW_BLOCK, params)["class"] == "runtime_error"


def test_a_constant_output_left_by_a_low_precision_parameter_is_precision():
    params = {**GOOD, "ACC_DTYPE": "float16"}
    d = diagnose("constant_output", "constant output", [check("rows=7,N=1000")], ROW_BLOCK, params)
    assert d["class"] == "precision" and d["symptoms"]["param"] == "ACC_DTYPE"
    assert diagnose("constant_output", "constant output", [check("rows=7,N=1000")], ROW_BLOCK,
                    GOOD)["class"] == "constant_output"  # no low-precision parameter: the integrity verdict stands


def test_low_precision_parameter_is_blamed_for_numeric_failures():
    params = {**GOOD, "ACC_DTYPE": "float16"}
    assert diagnose("fail", "", [check("rows=4,N=64")], ROW_BLOCK, params)["class"] == "precision"
    d = diagnose("fail", "", [check("rows=4,N=64", nonfinite=3)], ROW_BLOCK, params)
    assert d["class"] == "nonfinite" and d["symptoms"]["param"] == "ACC_DTYPE"


def test_tail_gradient_and_wrong_classes():
    tail = [check("rows=1,N=123"), check("rows=4,N=64", passed=True)]
    assert diagnose("fail", "", tail, ROW_BLOCK, GOOD)["class"] == "tail"
    grads = [check("rows=4,N=64", direction="grad:x"), check("rows=4,N=64", passed=True)]
    assert diagnose("fail", "", grads, ROW_BLOCK, GOOD)["class"] == "gradient"
    everywhere = [check("rows=4,N=64"), check("rows=1,N=123")]
    assert diagnose("fail", "m", everywhere, ROW_BLOCK, GOOD)["class"] == "wrong"


def test_first_point_covers_every_shape():
    first = proposer().first()
    assert first["template"] == "row_block" and first["params"]["BLOCK_N"] == 8192
    assert first["params"]["ACC_DTYPE"] == "float32"


def test_the_first_point_reads_a_dim_only_some_shapes_have():
    """A suite's optional dims (attention_decode's page layout, absent from the shapes a model card gives): the
    proposal's widest dims take each from the shapes that have it."""
    shapes = [{"rows": 4, "N": 64, "layout": 1}, {"rows": 16, "N": 256}]
    first = SearchProposer(list_templates("rmsnorm"), shapes).first()
    assert "largest dims rows=16, N=256, layout=1" in first["reason"]


def test_repairs_name_their_reason_and_skip_tried_points():
    search = proposer()
    bad = {**GOOD, "BLOCK_N": 64}
    coverage = {"class": "coverage", "reason": "", "symptoms": {"requirement": "BLOCK_N >= N",
                                                                 "failing_shapes": ["rows=3,N=4097"]}}
    fixed = search.revise("row_block", bad, coverage, {point_key("row_block", bad)})
    assert fixed["params"] == GOOD and "coverage repair" in fixed["reason"]

    low = {**GOOD, "ACC_DTYPE": "float16"}
    precision = {"class": "precision", "reason": "r", "symptoms": {"param": "ACC_DTYPE"}}
    fixed = search.revise("row_block", low, precision, {point_key("row_block", low)})
    assert fixed["params"] == GOOD and "ACC_DTYPE float16 -> float32" in fixed["reason"]

    # the repaired point was tried already: fall back to the next untried covering point
    tried = {point_key("row_block", low), point_key("row_block", GOOD)}
    fallback = search.revise("row_block", low, precision, tried)
    assert point_key(fallback["template"], fallback["params"]) not in tried
    assert "precision repair has nothing untried left" in fallback["reason"]


def test_structural_failures_try_other_templates_first_and_exhaustion_returns_none():
    search = proposer()
    compile_error = {"class": "compile_error", "reason": "", "symptoms": {}}
    nxt = search.revise("row_block", GOOD, compile_error, {point_key("row_block", GOOD)})
    assert nxt["template"] == "col_tiled" and "other templates first" in nxt["reason"]
    everything = {point_key(t.name, p) for t in search.templates for p in t.points()}
    assert search.revise("row_block", GOOD, compile_error, everything) is None


@pytest.mark.parametrize("verdict", ["target_compile_error", "interpreter_unsupported"])
def test_a_kernel_a_gpu_compiler_or_the_interpreter_rejects_is_the_templates_code_defect(verdict):
    """No parameter of the same template fixes a kernel that a target's compiler rejects: the next template."""
    search = proposer()
    nxt = search.revise("row_block", GOOD, {"class": verdict, "reason": "", "symptoms": {}},
                        {point_key("row_block", GOOD)})
    assert nxt["template"] == "col_tiled" and "other templates first" in nxt["reason"]


def test_exploring_side_by_side_takes_the_points_one_at_a_time_would_take_in_the_same_order():
    search = proposer()
    explore = {"class": "explore", "reason": "", "symptoms": {}}
    history = [{"template": "row_block", "params": GOOD}]
    one_at_a_time = []
    for _ in range(3):
        nxt = search.propose({"template": "row_block", "params": GOOD}, explore, history)
        one_at_a_time.append(nxt["params"])
        history.append(nxt)
    batch = search.explore({"template": "row_block", "params": GOOD}, history[:1], 3)
    assert [p["params"] for p in batch] == one_at_a_time
    assert all(p["reason"] == "exploring side by side: next untried point" for p in batch)
    everything = [{"template": t.name, "params": p} for t in search.templates for p in t.points()]
    assert search.explore(history[0], everything, 3) == []
