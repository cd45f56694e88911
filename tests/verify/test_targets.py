"""Real targets in every verdict: launches captured in the sandbox (also at the model card's sizes, without running
them), compiled ahead of time for GPU targets with no GPU, and what the compiler says in the result.

Compiles run in child processes (the compile worker): a kernel only the interpreter accepts, a compiler that
hangs and a compile child that dies are verdicts, never crashes of the workbench."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import jinja2
import pytest
import torch

from workbench.backends import DEFAULT_TARGETS, TARGETS, get_backend, get_targets
from workbench.blocks import REGISTRY
from workbench.errors import WorkbenchError
from workbench.models import model_shapes
from workbench.templating import load_template
from workbench.verify.aot import (
    SMOKE_PROBE,
    KernelBuild,
    TargetReport,
    compile_for_targets,
    compile_key,
    select_launches,
    spill_counted,
    suite_phrase,
)
from workbench.verify.harness import target_report, verify_candidate
from workbench.verify.worker import PROBE


def test_default_targets_are_the_five_gpu_architectures():
    assert DEFAULT_TARGETS == ("sm_80", "sm_90a", "sm_100a", "gfx942", "gfx950")
    assert [t.name for t in get_targets()] == list(DEFAULT_TARGETS)
    assert get_targets([]) == []
    with pytest.raises(WorkbenchError, match="unknown target 'sm_99'"):
        get_targets(["sm_90a", "sm_99"])


def test_occupancy_follows_the_occupancy_calculator():
    h200, mi300 = TARGETS["sm_90a"], TARGETS["gfx942"]
    # 255 registers x 32 threads -> 8192 per warp (256-register granules); 65536 / (8192 x 4 warps) = 2 CTAs
    assert h200.occupancy(255, 16, 4) == 2
    # 121 registers -> 3968 -> 4096 per warp; 65536 / (4096 x 4) = 4 CTAs
    assert h200.occupancy(121, 0, 4) == 4
    # shared memory bound: 100 KB + 1 KB reserved per CTA in 228 KB -> 2 CTAs
    assert h200.occupancy(32, 100 * 1024, 4) == 2
    assert h200.occupancy(32, 0, 2) == 32  # the CTA limit
    # AMD: 82 VGPRs -> 88 (granules of 8); 512 // 88 = 5 waves per SIMD, 4 SIMDs: 20 waves = 5 CTAs of 4 waves
    assert mi300.occupancy(82, 0, 4) == 5
    assert mi300.occupancy(82, 48 * 1024, 4) == 1  # 64 KB of LDS holds one 48 KB CTA
    assert mi300.occupancy(512, 0, 8) == 0  # 512 VGPRs allow 1 wave per SIMD: an 8-wave CTA cannot be resident


def test_model_suite_inputs_can_be_made_abstract_for_every_block():
    """meta_inputs gives what make_inputs gives, as shapes and dtypes only, and makes the model card's sizes (the
    grouped GEMM's experts alone are 80 GB) without allocating them."""
    for spec in REGISTRY.values():
        shape = spec.shapes["smoke"][0]
        real, meta = spec.make_inputs(shape, torch.float16, 0, "cpu"), spec.meta_inputs(shape, torch.float16)
        assert real.keys() == meta.keys(), spec.name
        for name, value in real.items():
            if torch.is_tensor(value):
                assert meta[name].is_meta and meta[name].shape == value.shape and meta[name].dtype == value.dtype, \
                    (spec.name, name)
            else:
                assert type(meta[name]) is type(value), (spec.name, name)
        for shape in model_shapes(spec.name):
            assert all(v.is_meta for v in spec.meta_inputs(shape, torch.bfloat16).values() if torch.is_tensor(v))


def _launch(kernel: str, suite: str, block_n: int, dtype: str = "*fp32") -> dict:
    return {"kernel": kernel, "module": "candidate", "file": "", "suite": suite, "options": {"num_warps": 4},
            "signature": {"X": dtype, "N": "i32", "BLOCK_N": "constexpr"}, "constexprs": {"BLOCK_N": block_n}}


DOT_KERNEL = '''
import triton
import triton.language as tl

@triton.jit
def dot_kernel(A, B, C, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(A + r[:, None] * BLOCK + r[None, :])
    b = tl.load(B + r[:, None] * BLOCK + r[None, :])
    tl.store(C + r[:, None] * BLOCK + r[None, :], tl.dot(a, b))
'''


def _dot_launch(block: int, dtype: str) -> dict:
    return {"kernel": "dot_kernel", "module": "candidate", "file": "", "suite": "model",
            "signature": {"A": dtype, "B": dtype, "C": "*fp32", "BLOCK": "constexpr"},
            "constexprs": {"BLOCK": block}, "options": {"num_warps": 4}}


@pytest.mark.slow  # compiles for every GPU target, 10-21 s: the whole suite's
def test_a_kernel_no_sm_can_hold_compiles_and_is_a_finding(tmp_path):
    """float32 256 x 256 operands staged in shared memory: 512 KB, past an H200 SM's 228 KB. ptxas accepts it; a
    launch would fail for resources, so the result names it."""
    from workbench.verify import harness
    from workbench.verify.result import VerificationResult

    path = tmp_path / "dot.py"
    path.write_text(DOT_KERNEL)
    result = VerificationResult(block="x", candidate=str(path), source_hash="big", backend="interpreter",
                                verdict="pass", message="", targets=["sm_90a"])
    failed = harness._compile_for_targets(path, result, {"launches": [_dot_launch(256, "*fp32")]},
                                          get_targets(["sm_90a"]), tmp_path / "cache")
    assert failed == [] and result.builds[0]["ok"] and result.builds[0]["shared_bytes"] > 233472
    build = result.builds[0]
    assert f"cannot be resident: sm_90a dot_kernel needs {build['shared_bytes']} B shared memory, " \
           f"{build['registers']} registers x 4 warps (model suite)" in result.findings


def test_every_model_launch_is_compiled_and_kernels_the_model_suite_never_ran_once_per_signature():
    launches = [_launch("k", "smoke", 64), _launch("k", "edge", 128), _launch("k", "smoke", 64, "*fp16"),
                _launch("k", "model", 8192, "*bf16"), _launch("k", "model", 128, "*bf16"),
                _launch("tail", "smoke", 64), _launch("tail", "edge", 128), _launch("tail", "smoke", 64, "*fp16")]
    chosen = select_launches(launches)
    assert [(x["kernel"], x["suite"], x["constexprs"]["BLOCK_N"], x["signature"]["X"]) for x in chosen] == [
        ("k", "model", 8192, "*bf16"), ("k", "model", 128, "*bf16"), ("tail", "smoke", 64, "*fp32"),
        ("tail", "smoke", 64, "*fp16")]


def test_a_kernel_the_model_suite_never_ran_is_compiled_at_the_targets_own_smoke_launch():
    """A block no model card has (or a path only small sizes take): the first smoke shape's launch captured for the
    target (its launch settings: 8 warps on sm_90a here) in place of the interpreter's; another target without its
    own capture keeps the interpreter's."""
    interpreter = _launch("k", "smoke", 64)
    own = {**_launch("k", "probe:meta:T=8", 64), "target": "sm_90a", "options": {"num_warps": 8}}
    elsewhere = {**_launch("k", "probe:meta:T=8", 64), "target": "gfx942", "options": {"num_warps": 2}}
    assert SMOKE_PROBE == f"{PROBE}meta:"  # the probes' label (build_captures)
    assert select_launches([interpreter, own, elsewhere], "sm_90a") == [own]
    assert select_launches([interpreter, own], "sm_80") == [interpreter]


def test_a_kernel_is_compiled_at_every_suite_captured_for_the_target_and_not_at_the_interpreters_launches():
    """Small sizes bind other tiles than the model's: the smoke suite captured for sm_90a (its own 8 warps) is
    compiled beside the model suite's launch, a launch both make once; the interpreter's smoke launch, another
    target's capture and the probe of a kernel captured elsewhere are not."""
    model = {**_launch("k", "model", 8192, "*bf16"), "target": "sm_90a"}
    small = {**_launch("k", "capture:smoke", 64, "*bf16"), "target": "sm_90a", "options": {"num_warps": 8}}
    same = {**_launch("k", "capture:smoke", 8192, "*bf16"), "target": "sm_90a"}
    elsewhere = {**small, "target": "gfx942"}
    probe = {**_launch("k", "probe:meta:T=8", 64, "*bf16"), "target": "sm_90a"}
    assert select_launches([model, _launch("k", "smoke", 64), small, same, elsewhere, probe], "sm_90a") == \
        [model, small]


def test_spills_count_at_the_model_suite_and_at_the_targets_own_smoke_launch_only():
    def build(suite, spilled):
        return KernelBuild(kernel="k", target="sm_90a", suite=suite, specialization={}, ok=True,
                           spilled_bytes=spilled)

    report = TargetReport(builds=[build("model", 0), build("probe:meta:T=8", 16)])
    assert [b.suite for b in report.spills()] == ["probe:meta:T=8"] and report.spill_free_on() == []
    interpreter_only = TargetReport(builds=[build("model", 0), build("smoke", 16)])
    assert interpreter_only.spills() == [] and interpreter_only.spill_free_on() == ["sm_90a"]
    assert spill_counted("model") and spill_counted("probe:meta:T=8") and spill_counted("capture:smoke")
    assert not spill_counted("smoke") and not spill_counted("probe:real:T=8")
    assert [suite_phrase(s) for s in ("model", "capture:edge", "probe:meta:T=8", "smoke")] == \
        ["model suite", "edge suite", "first smoke shape", "smoke suite on the interpreter"]


KERNEL_FILE = '''
import triton
import triton.language as tl
{prelude}

@triton.jit
def copy_kernel(X, Y, N, BLOCK_N: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.load(X + offs, mask=offs < N, other=0.0)
{body}
    tl.store(Y + offs, acc, mask=offs < N)
'''


def _kernel_file(tmp_path: Path, prelude: str = "", body: str = "") -> Path:
    path = tmp_path / "cand.py"
    path.write_text(KERNEL_FILE.format(prelude=prelude, body=textwrap.indent(body, "    ")))
    return path


COPY_LAUNCH = {"kernel": "copy_kernel", "module": "candidate", "file": "", "suite": "model",
               "signature": {"X": "*bf16", "Y": "*bf16", "N": "i32", "BLOCK_N": "constexpr"},
               "constexprs": {"BLOCK_N": 1024}, "options": {"num_warps": 4}}


def test_a_compiled_kernel_reports_registers_shared_memory_and_occupancy_and_is_cached(tmp_path):
    path = _kernel_file(tmp_path)
    first = compile_for_targets(path, "hash", [COPY_LAUNCH], get_targets(["sm_90a", "gfx942"]),
                                cache_dir=tmp_path / "cache")
    assert [b.ok for b in first.builds] == [True, True], [b.error for b in first.builds]
    for build in first.builds:
        assert 0 < build.registers <= 255 and build.spilled_bytes == 0 and build.shared_bytes >= 0
        assert build.ctas_per_sm >= 1 and build.num_warps == 4 and build.uses_dot is False
        assert build.tensor_cores is None and not build.cached
    assert first.compiled_on() == first.spill_free_on() == ["sm_90a", "gfx942"]
    again = compile_for_targets(path, "hash", [COPY_LAUNCH], get_targets(["sm_90a", "gfx942"]),
                                cache_dir=tmp_path / "cache")
    assert all(b.cached for b in again.builds)
    assert [b.registers for b in again.builds] == [b.registers for b in first.builds]
    # the same specialization reached from another suite: the compiler's figures cached, the suite its own
    elsewhere = compile_for_targets(path, "hash", [{**COPY_LAUNCH, "suite": "capture:smoke"}],
                                    get_targets(["sm_90a"]), cache_dir=tmp_path / "cache")
    assert [(b.cached, b.suite) for b in elsewhere.builds] == [(True, "capture:smoke")]


@pytest.mark.slow  # compiles for every GPU target, 10-21 s: the whole suite's
def test_a_dot_kernel_gets_tensor_core_instructions_on_each_target(tmp_path):
    path = tmp_path / "dot.py"
    path.write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def dot_kernel(A, B, C, BLOCK: tl.constexpr):
            r = tl.arange(0, BLOCK)
            a = tl.load(A + r[:, None] * BLOCK + r[None, :])
            b = tl.load(B + r[:, None] * BLOCK + r[None, :])
            tl.store(C + r[:, None] * BLOCK + r[None, :], tl.dot(a, b))
    '''))
    launch = {"kernel": "dot_kernel", "module": "candidate", "file": "", "suite": "model",
              "signature": {"A": "*bf16", "B": "*bf16", "C": "*fp32", "BLOCK": "constexpr"},
              "constexprs": {"BLOCK": 64}, "options": {"num_warps": 4}}
    report = compile_for_targets(path, "dot", [launch], get_targets(["sm_80", "sm_90a", "gfx942"]))
    assert [(b.target, b.ok, b.uses_dot, b.tensor_cores) for b in report.builds] == [
        ("sm_80", True, True, True), ("sm_90a", True, True, True), ("gfx942", True, True, True)]
    # per thread: at most 255 registers on NVIDIA, 512 VGPRs (AGPRs included) on AMD
    assert all(0 < b.registers <= (512 if b.target.startswith("gfx") else 255) for b in report.builds)


@pytest.mark.slow  # compiles for every GPU target, 10-21 s: the whole suite's
def test_a_compiler_that_hangs_is_a_verdict_on_that_launch(tmp_path):
    """A static loop of 2^22 iterations is unrolled by the code generator: it does not finish. The compile child
    is killed at the per-launch limit; the launch fails with the reason and the next one still compiles."""
    path = _kernel_file(tmp_path, body="for _ in tl.static_range(4194304):\n    acc += 1.0")
    other = {**COPY_LAUNCH, "constexprs": {"BLOCK_N": 256}}
    report = compile_for_targets(path, "hang", [COPY_LAUNCH, other], get_targets(["gfx942"]), item_timeout_s=5)
    assert [b.ok for b in report.builds] == [False, False]
    assert all("did not finish within 5 s" in b.error for b in report.builds)
    # a tuning probe's compiles: the target's first launch that does not finish ends that target's; nothing cached
    probe = compile_for_targets(path, "hang", [COPY_LAUNCH, other], get_targets(["gfx942"]), item_timeout_s=5,
                                cache_dir=tmp_path / "cache", first_failure_ends=True)
    assert [b.ok for b in probe.builds] == [False, False]
    assert "did not finish within 5 s" in probe.builds[0].error
    assert probe.builds[1].error.startswith("not compiled: an earlier launch did not (compiler did not finish")
    assert not (tmp_path / "cache").exists()


def test_a_compile_child_that_dies_is_a_verdict_and_the_others_go_on(tmp_path):
    """The candidate aborts the process when it is imported without the interpreter (a crash in the compile
    child): each launch ends as 'compiler crashed', no exception reaches the caller."""
    path = _kernel_file(tmp_path, prelude="import os\nif os.environ.get('TRITON_INTERPRET') != '1':\n    os.abort()")
    report = compile_for_targets(path, "crash", [COPY_LAUNCH], get_targets(["sm_90a", "gfx942"]))
    assert [(b.target, b.ok) for b in report.builds] == [("sm_90a", False), ("gfx942", False)]
    assert all("compiler crashed" in b.error and "SIGABRT" in b.error for b in report.builds)


@pytest.fixture
def global_eps_swiglu(tmp_path) -> Path:
    """swiglu flat, with a kernel reading a module-level float that is not a tl.constexpr: the interpreter runs it,
    GPU compilers refuse it ("Cannot access global variable")."""
    template = load_template("swiglu", "flat")
    source = template.render(next(template.points()))
    anchor = "    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)\n"
    assert source.count(anchor) == 1
    source = source.replace(anchor, anchor.replace("y.to(", "(y * ONE).to("))
    source = source.replace("import triton.language as tl\n", "import triton.language as tl\n\nONE = 1.0\n", 1)
    path = tmp_path / "swiglu_global.py"
    path.write_text(source)
    return path


@pytest.mark.interpreter
def test_a_kernel_only_the_interpreter_accepts_is_a_target_compile_error(global_eps_swiglu):
    interp = get_backend("interpreter")
    fast = {"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "base_seed": 0, "backend": interp}
    on_interpreter = verify_candidate(global_eps_swiglu, targets=[], **fast)
    assert on_interpreter.verdict == "pass", on_interpreter.message
    result = verify_candidate(global_eps_swiglu, targets=["sm_90a", "gfx942"], **fast)
    assert result.verdict == "target_compile_error"
    assert result.message.startswith("sm_90a: swiglu_fwd_kernel: ") and "Cannot access global variable ONE" \
        in result.message
    assert result.target_report()["compiles_on"] == []
    failed = {(b["target"], b["kernel"]) for b in result.builds if not b["ok"]}
    assert ("gfx942", "swiglu_fwd_kernel") in failed and not any(k == "swiglu_bwd_kernel" for _, k in failed)


@pytest.mark.interpreter
def test_verification_captures_the_model_and_smoke_suite_launches_without_running_them():
    """rmsnorm's model suite (8192 x 7168 and 8192 x 128) and its smoke suite are captured on meta tensors for the
    target: their launches are compiled with the tiles the host code picks for those widths, forward and backward;
    the interpreter's launches of the verified suite are not."""
    template = load_template("rmsnorm", "row_block")
    operator = Path("operators/rmsnorm")
    path = next(operator.glob("*.py"), None) if operator.is_dir() else None
    assert path is not None, "the promoted rmsnorm operator is part of the repository"
    result = verify_candidate(path, suites=["smoke"], dtypes=["float32"], seeds=1, base_seed=0,
                              backend=get_backend("interpreter"), targets=["sm_90a"])
    assert result.verdict == "pass", result.message
    model = [b for b in result.builds if b["suite"] == "model"]
    assert {b["kernel"] for b in model} == {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"}
    assert {b["specialization"]["signature"]["X"] for b in model} == {"*bf16"}
    smoke = [b for b in result.builds if b["suite"] == "capture:smoke"]
    widths = {b["specialization"]["constexprs"]["BLOCK_N"] for b in smoke}
    assert {b["kernel"] for b in smoke} == {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"} and max(widths) < 8192
    assert all(spill_counted(b["suite"]) for b in result.builds) and all(b["ok"] for b in result.builds)
    assert template.name in path.name
    assert json.dumps(result.builds)  # plain data, recorded as it is


def _per_target_situ(tmp_path: Path) -> Path:
    """situ flat with the shared launch settings: 8 warps on NVIDIA targets, 4 elsewhere."""
    template = load_template("situ", "flat")
    source = template.render(next(template.points()))
    shared = jinja2.Environment(keep_trailing_newline=True).from_string(
        (template.path.parent.parent / "_launch.j2").read_text()).render()
    source = source.replace("import triton.language as tl\n", "import triton.language as tl\n" + shared +
                            'LAUNCH_SETTINGS = {"default": {"num_warps": 4}, "cuda": {"num_warps": 8}}\n', 1)
    assert source.count("num_warps=4)") == 2
    source = source.replace("num_warps=4)", "num_warps=target_settings(gate_up.device)['num_warps'])", 1)
    path = tmp_path / "situ_per_target.py"
    path.write_text(source)
    return path


@pytest.mark.interpreter
def test_each_target_compiles_the_launches_its_own_settings_choose(tmp_path):
    """The host code picks its launch settings per target; the model suite is captured once per target, so what
    is compiled for sm_90a is what an H200 would launch (8 warps) and gfx942 gets its own (4)."""
    result = target_report(_per_target_situ(tmp_path), targets=["sm_90a", "gfx942"],
                           compile_cache=tmp_path / "cache")
    assert result.verdict == "pass", result.message
    forward = {b["target"]: b["specialization"]["options"]["num_warps"] for b in result.builds
               if b["kernel"].endswith("fwd_kernel") and b["suite"] == "model"}
    assert forward == {"sm_90a": 8, "gfx942": 4}


@pytest.mark.interpreter
def test_two_shapes_of_one_block_get_their_own_settings_from_one_operator(tmp_path):
    """One rmsnorm operator, two model-suite widths: the hidden size (7168) runs a 8192-wide block on 16 warps,
    MLA's kv latent norm (512) a 512-wide block on 4, both chosen per call by the host code."""
    template = load_template("rmsnorm", "row_block")
    point = {"BLOCK_N": 8192, "ACC_DTYPE": "float32", "num_warps": 16, "BWD_PROGRAMS": 128}
    path = tmp_path / "rmsnorm_rows.py"
    path.write_text(template.render(point))
    result = target_report(path, targets=["sm_90a"], compile_cache=tmp_path / "cache")
    assert result.verdict == "pass", result.message
    settings = {(b["specialization"]["constexprs"]["BLOCK_N"], b["specialization"]["options"]["num_warps"])
                for b in result.builds if b["kernel"] == "rmsnorm_fwd_kernel"}
    widths = {shape["N"] for shape in model_shapes("rmsnorm")}
    assert {7168, 512} <= widths
    assert {(8192, 16), (512, 4)} <= settings


def test_the_compile_cache_key_ignores_only_the_literal_table_of_tuned_settings():
    """The variants a port's tuning probes differ in TUNED_SETTINGS alone, which sets launch options and constexprs
    every cached launch names itself: they share the builds of the targets they leave alone. Anything else changes
    the key: another statement on the same line, a non-literal table, the kernel's code."""
    base = 'import triton\nTUNED_SETTINGS = {}\n\n@triton.jit\ndef k(X):\n    pass\n'
    tuned = base.replace("TUNED_SETTINGS = {}", "TUNED_SETTINGS = {'sm_90a': {'num_warps': 8},\n    'sm_80': {}}")
    assert compile_key(tuned) == compile_key(base) != hashlib.sha256(base.encode()).hexdigest()
    assert compile_key(base.replace("{}\n", "{}; import os\n", 1)) != compile_key(base)
    assert compile_key(base.replace("{}\n", "dict(a=1)\n", 1)) != compile_key(base)
    assert compile_key(base.replace("pass", "return")) != compile_key(base)
    assert compile_key("def broken(:\n") == hashlib.sha256(b"def broken(:\n").hexdigest()


def test_the_target_matrix_at_another_suite_compiles_each_of_its_shapes():
    """`workbench targets --suite edge` compiles the edge shapes' launches (dsa_kpool_indexer_decode's 20 index heads
    pad to 32, which no smoke shape reaches); an unknown suite is one line."""
    from typer.testing import CliRunner

    from workbench.cli import app

    operator = next(Path(__file__).parents[2].glob("operators/dsa_kpool_indexer_decode/*.py"))
    runner = CliRunner()

    def pads(suite: str) -> set[int]:
        result = runner.invoke(app, ["targets", str(operator), "--suite", suite, "--targets", "sm_90a", "--json"])
        assert result.exit_code == 0, result.output
        builds = json.loads(result.stdout[result.stdout.index("["):])[0]["builds"]
        assert builds and all(b["ok"] for b in builds)
        return {b["specialization"]["constexprs"]["HI_PAD"] for b in builds}

    assert pads("edge") == {16, 32} and pads("smoke") == {16}
    refused = runner.invoke(app, ["targets", str(operator), "--suite", "hidden"])
    assert refused.exit_code == 2 and "unknown suite 'hidden': model, smoke or edge" in refused.output
