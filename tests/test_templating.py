"""Kernel templates: sidecar loading, parameter spaces, validation, rendering, point parsing, and the one-line
TemplateError for every kind of broken template. Renders only; nothing is imported or run."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from workbench.agent.tune import base_settings
from workbench.backends import TARGETS
from workbench.blocks import REGISTRY
from workbench.errors import TemplateError, WorkbenchError
from workbench.operators import launch_settings
from workbench.templating import (
    candidate_filename,
    format_point,
    list_templates,
    load_template,
    parse_point,
    templates_dir,
)

ROW_BLOCK_FIRST = {"BLOCK_N": 64, "ACC_DTYPE": "float32", "num_warps": 4, "BWD_PROGRAMS": 128}


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


# --- the shipped templates ---------------------------------------------------------------------------------------


def test_list_templates_rmsnorm_in_rank_order():
    templates = list_templates("rmsnorm")
    assert [t.name for t in templates] == ["row_block", "col_tiled"]
    assert [t.rank for t in templates] == sorted(t.rank for t in templates)
    assert all(t.block == "rmsnorm" for t in templates)
    assert list_templates("no_such_block") == []


def test_load_template_rmsnorm_row_block():
    t = load_template("rmsnorm", "row_block")
    assert t.ref == "rmsnorm/row_block"
    assert t.path == templates_dir() / "rmsnorm" / "row_block.py.j2"
    assert list(t.params) == ["BLOCK_N", "ACC_DTYPE", "num_warps", "BWD_PROGRAMS"]
    assert t.params["ACC_DTYPE"]["choices"] == ["float32", "float16"]
    assert t.requires == ["BLOCK_N >= N"]
    assert t.summary and t.tradeoffs


SHIPPED_MANIFESTS = sorted((Path(__file__).resolve().parents[1] / "operators").glob("*/*.json"))


@pytest.mark.parametrize("manifest", SHIPPED_MANIFESTS, ids=lambda m: m.parent.name)
def test_every_shipped_operator_is_its_template_rendered_at_its_params(manifest):
    """A change to the shared host macros or a template that alters what a promoted operator's source would be is
    seen here: it needs that operator re-ported and re-verified, not a silent drift between the two."""
    meta = json.loads(manifest.read_text())
    tuned = meta.get("launch_settings", {}).get("tuned")  # the launch settings its port chose per target
    source = load_template(meta["block"], meta["template"]).render(meta["params"], tuned)
    assert source == manifest.with_suffix(".py").read_text()


@pytest.mark.parametrize("block", ["rmsnorm", "swiglu"])
def test_points_satisfy_constraints_and_are_complete(block):
    for t in list_templates(block):
        points = list(t.points())
        assert points, t.ref
        for point in points:
            t.validate(point)  # no error
            for expr in t.constraints:
                assert eval(expr, {}, dict(point)), (t.ref, point, expr)  # noqa: S307
        # exactly the product of the choices filtered by the constraints, nothing repeated or lost
        everything = [dict(zip(t.params, vs, strict=True))
                      for vs in itertools.product(*(p["choices"] for p in t.params.values()))]
        valid = [p for p in everything if all(eval(e, {}, dict(p)) for e in t.constraints)]  # noqa: S307
        assert points == valid, t.ref
        assert len(valid) < len(everything) or not t.constraints, f"{t.ref}: constraints exclude something"


def test_points_most_preferred_first():
    points = list(load_template("rmsnorm", "row_block").points())
    assert points[0] == ROW_BLOCK_FIRST
    assert {"BLOCK_N": 64, "ACC_DTYPE": "float32", "num_warps": 8, "BWD_PROGRAMS": 128} not in points


def test_unmet_requirements():
    t = load_template("rmsnorm", "row_block")
    assert t.unmet({**ROW_BLOCK_FIRST, "BLOCK_N": 64}, {"rows": 1, "N": 123}) == ["BLOCK_N >= N"]
    assert t.unmet({**ROW_BLOCK_FIRST, "BLOCK_N": 128}, {"rows": 1, "N": 123}) == []
    assert t.unmet({**ROW_BLOCK_FIRST, "BLOCK_N": 128}, {"rows": 1, "N": 128}) == []
    col = load_template("rmsnorm", "col_tiled")
    assert col.unmet(next(col.points()), {"rows": 1, "N": 10**6}) == []


def test_render_header_and_body():
    t = load_template("rmsnorm", "row_block")
    source = t.render(ROW_BLOCK_FIRST)
    assert source.startswith('"""rmsnorm candidate rendered from templates/rmsnorm/row_block.py.j2.\n')
    header = source.split('"""', 2)[1]
    assert t.summary in header
    assert "params: BLOCK_N=64, ACC_DTYPE=float32, num_warps=4, BWD_PROGRAMS=128" in header
    compile(source, "cand.py", "exec")
    assert 'BLOCK = "rmsnorm"' in source
    assert 'TEMPLATE = "row_block"' in source
    assert re.search(r"^BLOCK_N = 64  # the widest row", source, re.M)
    assert "{{" not in source and "{%" not in source
    assert "tl.float32" in source and "tl.float16" not in source


@pytest.mark.parametrize("block", ["rmsnorm", "swiglu"])
def test_every_point_renders_valid_python(block):
    for t in list_templates(block):
        for point in t.points():
            source = t.render(point)
            compile(source, f"{t.name}.py", "exec")
            assert f'BLOCK = "{block}"' in source
            assert f"params: {format_point(point)}" in source


def test_render_validates_the_point():
    t = load_template("rmsnorm", "row_block")
    with pytest.raises(TemplateError):
        t.render({**ROW_BLOCK_FIRST, "BLOCK_N": 100})


# --- validate ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("point, names", [
    ({**ROW_BLOCK_FIRST, "FOO": 1}, ["FOO"]),
    ({k: v for k, v in ROW_BLOCK_FIRST.items() if k != "ACC_DTYPE"}, ["ACC_DTYPE"]),
    ({**ROW_BLOCK_FIRST, "BLOCK_N": 100}, ["BLOCK_N", "100"]),
    ({**ROW_BLOCK_FIRST, "ACC_DTYPE": "bfloat16"}, ["ACC_DTYPE", "bfloat16"]),
    ({**ROW_BLOCK_FIRST, "num_warps": 8}, ["num_warps == 4 or BLOCK_N >= 2048"]),
    ({**ROW_BLOCK_FIRST, "BLOCK_N": 2048, "num_warps": 16}, ["num_warps <= 8 or BLOCK_N >= 8192"]),
], ids=["unknown", "missing", "not a choice", "not a string choice", "constraint", "second constraint"])
def test_validate_errors_are_one_line_and_name_the_problem(point, names):
    t = load_template("rmsnorm", "row_block")
    with pytest.raises(TemplateError) as info:
        t.validate(point)
    message = one_line(info)
    assert "rmsnorm/row_block" in message
    for name in names:
        assert name in message


# --- parse_point ---------------------------------------------------------------------------------------------------


def test_parse_point():
    name, point = parse_point("row_block:BLOCK_N=64,ACC_DTYPE=float16")
    assert (name, point) == ("row_block", {"BLOCK_N": 64, "ACC_DTYPE": "float16"})
    assert type(point["BLOCK_N"]) is int
    assert type(point["ACC_DTYPE"]) is str
    assert parse_point(" row_block : BLOCK_N = 64 ,ACC_DTYPE= float32") == (
        "row_block", {"BLOCK_N": 64, "ACC_DTYPE": "float32"})
    assert parse_point("row_block:BLOCK_N=64,") == ("row_block", {"BLOCK_N": 64})
    assert parse_point("col_tiled") == ("col_tiled", {})


def test_parse_point_bad_item():
    with pytest.raises(TemplateError) as info:
        parse_point("row_block:BLOCK_N")
    assert "BLOCK_N" in one_line(info)


def test_parse_point_round_trips_every_point():
    for t in list_templates("rmsnorm"):
        for point in t.points():
            text = f"{t.name}:" + ",".join(f"{k}={v}" for k, v in point.items())
            assert parse_point(text) == (t.name, point)


# --- candidate_filename ---------------------------------------------------------------------------------------------


def test_candidate_filename_stable_and_content_addressed():
    a = candidate_filename("rmsnorm", "row_block", "print(1)\n")
    assert a == candidate_filename("rmsnorm", "row_block", "print(1)\n")
    assert re.fullmatch(r"rmsnorm_row_block_[0-9a-f]{10}\.py", a)
    assert a != candidate_filename("rmsnorm", "row_block", "print(2)\n")


# --- templates in a temporary folder ($WORKBENCH_TEMPLATES) ----------------------------------------------------------

GOOD_SIDECAR = """\
summary: a test template
rank: 3
params:
  WIDTH: {choices: [2, 4], doc: "w"}
  MODE: [fast, slow]
constraints: ["WIDTH == 2 or MODE == 'fast'"]
requires: ["WIDTH >= N"]
"""
GOOD_BODY = 'BLOCK = "{{ BLOCK }}"\nTEMPLATE = "{{ TEMPLATE }}"\nWIDTH = {{ WIDTH }}\nMODE = "{{ MODE }}"\n'


@pytest.fixture
def tdir(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TEMPLATES", str(tmp_path))
    return tmp_path


def put(root, name: str, body: str | None = GOOD_BODY, sidecar: str | None = GOOD_SIDECAR, block: str = "blk"):
    folder = root / block
    folder.mkdir(exist_ok=True)
    if body is not None:
        (folder / f"{name}.py.j2").write_text(body)
    if sidecar is not None:
        (folder / f"{name}.yaml").write_text(sidecar)


def test_env_var_points_at_the_templates(tdir):
    assert templates_dir() == tdir
    put(tdir, "good")
    t = load_template("blk", "good")
    assert t.rank == 3
    assert t.params["MODE"] == {"choices": ["fast", "slow"]}  # a bare list is the choices
    assert list(t.points()) == [{"WIDTH": 2, "MODE": "fast"}, {"WIDTH": 2, "MODE": "slow"},
                                {"WIDTH": 4, "MODE": "fast"}]
    assert t.unmet({"WIDTH": 2, "MODE": "fast"}, {"N": 3}) == ["WIDTH >= N"]
    source = t.render({"WIDTH": 4, "MODE": "fast"})
    assert source.startswith('"""blk candidate rendered from templates/blk/good.py.j2.\n')
    assert source.endswith('BLOCK = "blk"\nTEMPLATE = "good"\nWIDTH = 4\nMODE = "fast"\n')
    compile(source, "good.py", "exec")


def test_list_templates_orders_by_rank_then_name(tdir):
    put(tdir, "zeta", sidecar=GOOD_SIDECAR.replace("rank: 3", "rank: 1"))
    put(tdir, "beta")
    put(tdir, "alpha")
    put(tdir, "norank", sidecar=GOOD_SIDECAR.replace("rank: 3\n", ""))
    assert [t.name for t in list_templates("blk")] == ["zeta", "alpha", "beta", "norank"]
    assert load_template("blk", "norank").rank == 100


MALFORMED_SIDECARS = {
    "bad yaml": ("params: {WIDTH: [2, 4\n", ["blk/bad", "bad.yaml"]),
    "params without choices": ("params:\n  WIDTH: {doc: no choices here}\n", ["WIDTH", "choices"]),
    "empty choices": ("params:\n  WIDTH: {choices: []}\n", ["WIDTH", "choices"]),
    "scalar choices": ("params:\n  WIDTH: 4\n", ["WIDTH", "choices"]),
    "reserved BLOCK": ("params:\n  BLOCK: [1, 2]\n", ["BLOCK", "reserved"]),
    "reserved TEMPLATE": ("params:\n  TEMPLATE: [1, 2]\n", ["TEMPLATE", "reserved"]),
    "no params": ("summary: nothing else\n", ["bad.yaml", "params"]),
    "params is a list": ("params: [WIDTH, MODE]\n", ["bad.yaml"]),
    "sidecar is a list": ("- WIDTH\n", ["bad.yaml"]),
    "rank not a number": (GOOD_SIDECAR.replace("rank: 3", "rank: first"), ["bad.yaml"]),
}


@pytest.mark.parametrize("case", list(MALFORMED_SIDECARS))
def test_malformed_sidecar_raises_template_error(tdir, case):
    sidecar, names = MALFORMED_SIDECARS[case]
    put(tdir, "bad", sidecar=sidecar)
    with pytest.raises(TemplateError) as info:
        load_template("blk", "bad")
    assert isinstance(info.value, WorkbenchError)
    message = one_line(info)
    for name in names:
        assert name in message
    with pytest.raises(TemplateError):
        list_templates("blk")


def test_missing_sidecar(tdir):
    put(tdir, "lonely", sidecar=None)
    with pytest.raises(TemplateError) as info:
        load_template("blk", "lonely")
    assert "lonely.yaml" in one_line(info)


def test_unknown_template_lists_known(tdir):
    put(tdir, "good")
    with pytest.raises(TemplateError) as info:
        load_template("blk", "nope")
    message = one_line(info)
    assert "nope" in message and "good" in message
    with pytest.raises(TemplateError) as info:
        load_template("no_block", "nope")
    assert "none" in one_line(info)


def test_sidecar_without_template_is_not_a_template(tdir):
    put(tdir, "orphan", body=None)
    assert list_templates("blk") == []
    with pytest.raises(TemplateError):
        load_template("blk", "orphan")


def test_undefined_jinja_variable_is_a_template_error(tdir):
    put(tdir, "undef", body=GOOD_BODY + "X = {{ NOT_A_PARAM }}\n")
    t = load_template("blk", "undef")  # loading does not render
    with pytest.raises(TemplateError) as info:
        t.render({"WIDTH": 2, "MODE": "fast"})
    message = one_line(info)
    assert "blk/undef" in message and "NOT_A_PARAM" in message


def test_jinja_syntax_error_is_a_template_error(tdir):
    put(tdir, "syntax", body=GOOD_BODY + "{% if WIDTH %}\n")
    with pytest.raises(TemplateError) as info:
        load_template("blk", "syntax").render({"WIDTH": 2, "MODE": "fast"})
    assert "blk/syntax" in one_line(info)


def test_constraint_that_cannot_be_evaluated(tdir):
    put(tdir, "badexpr", sidecar=GOOD_SIDECAR.replace("WIDTH == 2 or", "UNKNOWN_NAME == 2 or"))
    t = load_template("blk", "badexpr")
    with pytest.raises(TemplateError) as info:
        list(t.points())
    assert "UNKNOWN_NAME" in one_line(info)
    with pytest.raises(TemplateError):
        t.validate({"WIDTH": 2, "MODE": "fast"})


def test_invalid_python_renders_but_does_not_compile(tdir):
    put(tdir, "broken", body=GOOD_BODY + "def run(:\n")
    source = load_template("blk", "broken").render({"WIDTH": 2, "MODE": "fast"})
    assert source.endswith("def run(:\n")
    with pytest.raises(SyntaxError):
        compile(source, "broken.py", "exec")


# --- launch settings per target (the sidecar's launch space, the port's TUNED_SETTINGS) ---------------------------

LAUNCH_SIDECAR = GOOD_SIDECAR + 'launch:\n  num_warps: {choices: [4, 8, 2], doc: "warps"}\n  num_stages: [null, 1, 2]\n'
LAUNCH_BODY = GOOD_BODY + ('LAUNCH_SETTINGS = {"default": {"num_warps": {{ LAUNCH_DEFAULTS.num_warps }}, '
                           '"num_stages": {{ LAUNCH_DEFAULTS.num_stages }}}}\nTUNED_SETTINGS = {{ TUNED }}\n')


def test_the_chosen_settings_per_target_render_into_the_candidate_and_its_header(tdir):
    put(tdir, "t", body=LAUNCH_BODY, sidecar=LAUNCH_SIDECAR)
    t = load_template("blk", "t")
    assert t.launch == {"num_warps": {"choices": [4, 8, 2], "doc": "warps"}, "num_stages": {"choices": [None, 1, 2]}}
    untuned = t.render({"WIDTH": 2, "MODE": "fast"})
    assert "TUNED_SETTINGS = {}" in untuned  # the template's own first choices are its defaults
    assert 'LAUNCH_SETTINGS = {"default": {"num_warps": 4, "num_stages": None}}' in untuned
    tuned = t.render({"WIDTH": 2, "MODE": "fast"}, {"sm_90a": {"num_warps": 8, "num_stages": 1}, "gfx942": {}})
    namespace: dict = {}
    exec(compile(tuned, "candidate", "exec"), namespace)  # noqa: S102 - a rendered test module
    assert namespace["TUNED_SETTINGS"] == {"sm_90a": {"num_stages": 1, "num_warps": 8}}  # empty entries dropped
    assert "launch on sm_90a: num_stages=1, num_warps=8\n" in tuned.split('"""')[1]


@pytest.mark.parametrize("tuned, names", [
    ({"sm_42": {"num_warps": 8}}, ["unknown target 'sm_42'", "sm_90a"]),
    ({"sm_90a": {"BLOCK": 8}}, ["'BLOCK' is not a launch setting it declares", "num_warps, num_stages"]),
    ({"sm_90a": {"num_warps": 16}}, ["sm_90a num_warps=16 is not one of [4, 8, 2]"]),
])
def test_settings_outside_the_declared_space_are_one_clear_error(tdir, tuned, names):
    put(tdir, "t", body=LAUNCH_BODY, sidecar=LAUNCH_SIDECAR)
    with pytest.raises(TemplateError) as info:
        load_template("blk", "t").render({"WIDTH": 2, "MODE": "fast"}, tuned)
    assert all(name in one_line(info) for name in names)


def test_a_launch_space_needs_a_launch_settings_table(tdir):
    put(tdir, "t", sidecar=LAUNCH_SIDECAR)
    with pytest.raises(TemplateError) as info:
        load_template("blk", "t")
    assert "declares launch settings but t.py.j2 has no LAUNCH_SETTINGS" in one_line(info)


@pytest.mark.parametrize("template", [t for b in REGISTRY for t in list_templates(b) if t.launch],
                         ids=lambda t: t.ref)
def test_every_declared_launch_setting_is_one_the_template_reads_with_a_default_in_its_space(template):
    """The tuning starts at each target's settings from the template alone: every declared key is in its
    LAUNCH_SETTINGS, with a value among the declared choices, on every target, and no target has a setting of its
    own there (those are the port's choice)."""
    point = next(template.points())
    table = launch_settings(template.render(point))["per_target"]
    assert set(table) <= {"default", "interpreter", "cuda", "hip"}
    for target in TARGETS:
        for key, value in base_settings(table, target, list(template.launch)).items():
            assert value in template.launch[key]["choices"], (target, key, value)
    for backend in ("cuda", "hip"):  # a backend's own entries: only the dot precision (numerics, not tuning)
        assert set(table.get(backend, {})) <= {"DOT", "EPILOGUE_DOT"}
