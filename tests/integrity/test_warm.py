"""The warm worker keeps every guarantee of a cold child: a job leaves nothing for the next one (modules, patched torch
or Triton, environment) and finds no workbench module (the references) imported, cannot reach the server or another
job, and a job that hangs or leaves processes behind ends whole at its deadline, the server serving on. Each test
checks that its jobs ran in the warm server (its process is the same before and after) and that no job of it is
left running."""

from __future__ import annotations

import json
import os
import select
import time
from pathlib import Path

import pytest
from cheats import BASES, IMPORTS, R_RUN, edit

from workbench.backends import get_backend
from workbench.verify import warm
from workbench.verify.harness import verify_candidate
from workbench.verify.sandbox import isolation

pytestmark = pytest.mark.interpreter
FAST = {"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "base_seed": 0, "targets": []}
INTERPRETER = get_backend("interpreter")

UNWATCHED = '''import math as _math
import os as _os
import sys as _sys
import types as _types

_sys.modules["warm_leftover"] = _types.ModuleType("warm_leftover")
_os.environ["WARM_LEFTOVER"] = "1"
_math.warm_leftover = 1
'''
"""What the worker does not watch: a module left in sys.modules, the environment, a module's attribute."""
POLLUTE = UNWATCHED + '''
import torch as _torch
import triton.language as _tl

_tl.warm_leftover = 1
_silu = _torch.nn.functional.silu
_torch.nn.functional.silu = lambda *a, **k: _silu(*a, **k)
_torch.nn.functional.silu.warm_leftover = 1
'''
OBSERVE = '''import math as _m
import os as _o
import sys as _s

import torch as _t
import triton.language as _l

_LEFT = [name for name, found in (("module", "warm_leftover" in _s.modules), ("env", "WARM_LEFTOVER" in _o.environ),
         ("math", hasattr(_m, "warm_leftover")), ("triton", hasattr(_l, "warm_leftover")),
         ("torch", hasattr(_t.nn.functional.silu, "warm_leftover")),
         ("workbench", any(n.split(".")[0] == "workbench" for n in list(_s.modules)))) if found]
'''
OBSERVED_RUN = "    return RMSNormFunction.apply(x, weight, eps * 1e6 if _LEFT else eps)\n"  # wrong where it finds any


def verify(path: Path, **options):
    return verify_candidate(path, backend=INTERPRETER, **{**FAST, **options})


def candidate(tmp_path: Path, name: str, prelude: str, run: str = R_RUN) -> Path:
    source = edit(edit(BASES["rmsnorm"](), IMPORTS, IMPORTS + prelude), R_RUN, run)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def server() -> warm.WarmServer:
    found = warm.warm_server("verify", INTERPRETER.env)
    assert found is not None, "the warm worker did not start here"
    return found


def no_job_left(served: warm.WarmServer) -> list[int]:
    """The server's job processes, once they have had a second to go."""
    deadline = time.monotonic() + 5
    while (left := served.job_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("mode", ["auto", "audit"])
def test_a_candidate_that_patches_torch_and_leaves_modules_leaves_nothing_for_the_next(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("WORKBENCH_ISOLATION", mode)
    honest = verify(candidate(tmp_path, "honest", ""))
    assert honest.verdict == "pass", honest.message
    served = server()
    # the observer sees what it looks for where it is: after the unwatched pollution in its own job, it fails
    both = verify(candidate(tmp_path, "both", UNWATCHED + OBSERVE, OBSERVED_RUN))
    assert both.verdict == "fail", both.message
    polluter = verify(candidate(tmp_path, "polluter", POLLUTE))
    assert polluter.verdict == "monkeypatch", polluter.message  # torch's and triton's: refused in its own job
    observed = verify(candidate(tmp_path, "observer", OBSERVE, OBSERVED_RUN))
    assert observed.verdict == "pass", observed.message  # nothing of the polluter in the next job
    assert served is server() and served.alive() and observed.isolation == isolation() and observed.start == "warm"
    assert no_job_left(served) == []


KILL_PARENT = '''import glob as _glob
import os as _os
import signal as _signal
import socket as _socket

for _pid in {_os.getppid(), 1, *(int(p) for p in _os.listdir("/proc") if p.isdigit() and p != str(_os.getpid()))}:
    try:
        _os.kill(_pid, _signal.SIGKILL)
    except (OSError, PermissionError):
        pass
for _path in _glob.glob("/tmp/warm-*/server.sock"):
    try:
        with _socket.socket(_socket.AF_UNIX) as _c:
            _c.connect(_path)
            _c.sendall(b"{not json\\n")
    except (OSError, PermissionError):
        pass
for _i in range(10000):
    try:
        _os.fork()
    except (OSError, PermissionError):
        break
'''


@pytest.mark.parametrize("mode", ["auto", "audit"])
def test_a_candidate_that_kills_its_parents_pokes_the_server_and_forks_is_refused_and_the_server_serves_on(
        tmp_path, monkeypatch, mode):
    monkeypatch.setenv("WORKBENCH_ISOLATION", mode)
    served = server() if verify(candidate(tmp_path, "first", "")).verdict == "pass" else None
    assert served is not None
    result = verify(candidate(tmp_path, "killer", KILL_PARENT))
    assert result.verdict == "forbidden_call", result.message
    refused = " ".join(c.reason for c in result.checks if c.direction == "integrity:forbidden_call")
    assert "os.kill" in refused, refused
    assert served is server() and served.alive()
    after = verify(candidate(tmp_path, "after", ""))
    assert after.verdict == "pass", after.message
    assert no_job_left(served) == []


def test_a_hanging_candidate_is_killed_at_its_timeout_and_the_next_job_starts_at_once(tmp_path):
    served = server() if verify(candidate(tmp_path, "first", "")).verdict == "pass" else None
    assert served is not None
    hang = verify(candidate(tmp_path, "hang", "import time as _time\n", "    while True:\n        _time.sleep(0.1)\n"),
                  timeout_s=5)
    assert hang.verdict == "timeout" and hang.message == "no result within 5 s", hang.message
    assert no_job_left(served) == []
    started = time.monotonic()
    after = verify(candidate(tmp_path, "after", ""))
    assert after.verdict == "pass", after.message
    assert served is server() and served.alive()
    assert time.monotonic() - started < hang.seconds  # no new server: the next job did not wait for imports


def test_with_the_audit_hook_out_of_the_way_the_namespaces_alone_hold(tmp_path, monkeypatch):
    """A worker of its own (tests/integrity/warm_escape_worker.py), no audit hook: it lists /tmp and /proc, reads
    another job's folder, writes outside its own, connects to the server's socket, kills every process it sees,
    reads its parent's memory, then leaves 20 processes holding the result pipe. The pipe closing proves they all
    ended with the job."""
    if isolation() != "bwrap":
        pytest.skip("the namespaces are bubblewrap's: without it the audit hook is the boundary (tests above)")
    escape = Path(__file__).with_name("warm_escape_worker.py")
    monkeypatch.setattr(warm, "WORKERS", (*warm.WORKERS, escape))
    served = warm.WarmServer("verify", INTERPRETER.env)
    try:
        root = warm.job_root()
        other, job = (Path(os.path.realpath(p)) for p in (root / f"other-{os.getpid()}", root / f"job-{os.getpid()}"))
        for folder in (other, job):
            folder.mkdir()
        (other / "secret").write_text("another job's result")
        outside = Path.cwd() / f"escaped-{os.getpid()}.txt"
        (job / "targets.json").write_text(json.dumps({
            "other_secret": str(other / "secret"), "outside": str(outside), "server_socket": served.socket_path,
            "children": 20}))
        read_fd, write_fd = os.pipe()
        code = served.run(escape, job, {"PATH": os.environ["PATH"]}, 60, None, [], write_fd)
        payload, deadline = b"", time.monotonic() + 10
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_fd], [], [], 0.5)
            chunk = os.read(read_fd, 1 << 16) if ready else b""
            if ready and not chunk:
                break
            payload += chunk
        else:
            pytest.fail("the job's processes still hold the result pipe 10 s after it ended")
        os.close(read_fd)
        report = json.loads(payload)
        assert code == 0, (job / "output.log").read_text()
        assert report["pids"] == [1, report["self"]] and report["self"] == 2  # its first process and itself
        assert other.name not in report["tmp"] and not any(name.startswith("warm-") for name in report["tmp"])
        assert report["other_secret"] is None and not report["wrote_outside"] and not outside.exists()
        assert not report["reached_server"] and not report["read_parent_memory"]
        assert served.alive() and no_job_left(served) == []
        read_fd, write_fd = os.pipe()
        (job / "targets.json").write_text(json.dumps({"other_secret": "", "outside": "", "server_socket": "",
                                                      "children": 0}))
        assert served.run(escape, job, {}, 60, None, [], write_fd) == 0  # and it serves the next job
        os.close(read_fd)
    finally:
        served.close()
