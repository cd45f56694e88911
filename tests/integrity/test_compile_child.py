"""The compile child is guarded like the verification child: a candidate imported there (no interpreter, the GPU
targets' compiler) cannot forge the registers and spills it is judged by. It never sees the job or its token, so a
report line it writes is refused (forged_report); a namespace it patches to rewrite the report is refused
(monkeypatch); a write or introspection from its code is refused by the same audit hook (forbidden_call,
introspection). Each is a verdict of the verification, with no build figure kept from that child."""

from __future__ import annotations

import pytest
from cheats import rmsnorm_source

from workbench.backends import get_backend
from workbench.verify.harness import verify_candidate

pytestmark = pytest.mark.interpreter
FAST = {"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "base_seed": 0, "targets": ["sm_90a"]}

IN_COMPILE_CHILD = "\nimport os as _os\n_COMPILING = _os.environ.get('TRITON_INTERPRET') != '1'\n"

FORGE_LINES = IN_COMPILE_CHILD + '''
if _COMPILING:  # claim spill-free builds on every descriptor that could be the result channel
    import json as _json
    for _fd in range(3, 1024):
        for _id in range(8):
            try:
                _os.write(_fd, (_json.dumps({"id": _id, "ok": True, "error": "", "registers": 32, "spilled_bytes": 0,
                                             "shared_bytes": 0, "num_warps": 4, "num_stages": 1, "uses_dot": False,
                                             "tensor_cores": None, "seconds": 0.1}) + "\\n").encode())
            except OSError:
                pass
'''

PATCH_JSON = IN_COMPILE_CHILD + '''
if _COMPILING:  # rewrite every report line the worker sends: no spills anywhere
    import json as _json
    _dumps = _json.dumps

    def _clean(obj, *args, **kwargs):
        if isinstance(obj, dict) and "spilled_bytes" in obj:
            obj = {**obj, "spilled_bytes": 0}
        return _dumps(obj, *args, **kwargs)

    _json.dumps = _clean
'''

READ_JOB = IN_COMPILE_CHILD + '''
if _COMPILING:  # look for the job (and its token) through the frames that imported this module
    import sys as _sys
    try:
        _frame = _sys._getframe(1)
    except Exception:
        _frame = None
'''


def _verify(tmp_path, name: str, cheat: str):
    path = tmp_path / f"{name}.py"
    path.write_text(rmsnorm_source() + cheat)
    return verify_candidate(path, backend=get_backend("interpreter"), **FAST)


def test_the_honest_candidate_compiles_with_its_figures(tmp_path):
    result = _verify(tmp_path, "honest", "")
    assert result.passed, result.message
    assert result.builds and all(b["ok"] and b["registers"] for b in result.builds)


@pytest.mark.parametrize("name, cheat, verdict", [
    ("forged_lines", FORGE_LINES, "forged_report"),
    ("patched_json", PATCH_JSON, "monkeypatch"),
    ("frame_walk", READ_JOB, "introspection"),
])
def test_a_candidate_that_tampers_with_the_compile_report_is_refused(tmp_path, name, cheat, verdict):
    result = _verify(tmp_path, name, cheat)
    assert result.verdict == verdict, result.message
    assert "in the compile child" in result.message
    assert not [b for b in result.builds if b["ok"]]  # no figure of that child is kept
