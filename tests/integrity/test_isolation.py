"""No way out of the sandbox: a candidate's writes outside its scratch folder change nothing on disk, it gets no
network, and the isolation in force is recorded with the verification. With bubblewrap (installed by the project's
setup) the filesystem is read-only to the candidate but its job folder, the network and PID namespaces are its own;
without it (WORKBENCH_ISOLATION=audit here) the audit hook refuses the writes. Either way the tampering candidate
is refused (forbidden_call) and the bytes on disk are the same."""

from __future__ import annotations

import hashlib
import shutil
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cheats import BASES

from workbench.backends import get_backend
from workbench.replay.faults import HEADER, write_op
from workbench.replay.runner import run_replay
from workbench.verify.harness import verify_candidate
from workbench.verify.sandbox import isolation

pytestmark = pytest.mark.interpreter
FAST = {"suites": ["smoke"], "dtypes": ["float32"], "seeds": 1, "base_seed": 0, "targets": []}

TAMPER = '''
import glob as _glob
import os as _os

def _tamper():
    """Find the workbench's working directory through the parent process, leave a file there, and append to every
    promoted operator; each attempt on its own, so that one refusal does not stop the others."""
    places = [{operators!r}]
    try:
        places.append(_os.readlink(f"/proc/{{_os.getppid()}}/cwd"))
    except OSError:
        pass
    for place in places:
        try:
            with open(_os.path.join(place, "tampered.txt"), "w") as f:
                f.write("was here")
        except OSError:
            pass
        for path in _glob.glob(_os.path.join(place, "*", "*.py")):
            try:
                with open(path, "a") as f:
                    f.write("# tampered")
            except OSError:
                pass
    try:
        _os.remove({victim!r})
    except OSError:
        pass

_tamper()
'''


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def operators() -> Iterator[Path]:
    """A stand-in operators folder with two promoted files and a manifest, in the workbench's scratch folder under
    the working directory (outside /tmp, which the sandbox replaces by its own)."""
    folder = Path.cwd() / ".workbench" / f"isolation-{uuid.uuid4().hex[:8]}" / "operators"
    for block in ("rmsnorm", "swiglu"):
        (folder / block).mkdir(parents=True)
        (folder / block / f"{block}_op.py").write_text(f'BLOCK = "{block}"\n')
        (folder / block / f"{block}_op.json").write_text("{}\n")
    yield folder
    shutil.rmtree(folder.parent, ignore_errors=True)


@pytest.mark.parametrize("mode", ["auto", "audit"])
def test_a_tampering_candidate_changes_nothing_on_disk_and_is_refused(tmp_path, operators, monkeypatch, mode):
    monkeypatch.setenv("WORKBENCH_ISOLATION", mode)
    victim = operators / "swiglu" / "swiglu_op.json"
    source = BASES["rmsnorm"]().replace("import triton.language as tl\n", "import triton.language as tl\n" +
                                        TAMPER.format(operators=str(operators), victim=str(victim)), 1)
    candidate = tmp_path / "candidate" / "tamper.py"
    candidate.parent.mkdir()
    candidate.write_text(source)
    before = _digest(operators)
    result = verify_candidate(candidate, backend=get_backend("interpreter"), **FAST)
    assert _digest(operators) == before and not (operators / "tampered.txt").exists()
    assert not (Path.cwd() / "tampered.txt").exists()
    assert not (candidate.parent / "__pycache__").exists()  # no bytecode beside the candidate either
    assert result.verdict in ("forbidden_import", "forbidden_call"), result.message  # refused, not passed
    refused = [c.reason for c in result.checks if c.direction == "integrity:forbidden_call"]
    assert any("write outside the sandbox's scratch folder" in r and str(operators) in r for r in refused), refused
    assert result.isolation == isolation() == ("audit" if mode == "audit" else result.isolation)
    assert result.target_report()["isolation"] == result.isolation


def test_bubblewrap_is_the_isolation_where_it_is_installed():
    """The project's setup installs bubblewrap (scripts/setup-sandbox.sh); where it runs, it is in force."""
    from workbench.verify.sandbox import _bwrap

    assert isolation() == ("bwrap" if _bwrap() else "audit")


def test_a_candidate_that_tries_the_network_gets_nothing(tmp_path):
    """A server on loopback; the candidate connects to it at import (before any hook could matter, through a
    stdlib socket): no connection reaches the server."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.5)
    port, arrived, stop = server.getsockname()[1], [], threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            arrived.append(conn.recv(64))
            conn.close()

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    call = (f"import socket as _s\ntry:\n    _c = _s.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    _c.sendall(b'secret')\nexcept OSError:\n    pass\n")
    candidate = tmp_path / "net.py"
    candidate.write_text(BASES["rmsnorm"]().replace("import triton.language as tl\n",
                                                    "import triton.language as tl\n" + call, 1))
    try:
        result = verify_candidate(candidate, backend=get_backend("interpreter"), **FAST)
    finally:
        stop.set()
        listener.join(5)
        server.close()
    assert arrived == []
    assert result.verdict == "forbidden_call", result.message


# --- the replay's training process: operator files are candidates too ------------------------------------------------

REPLAY_MODEL = "kimi-k3.1-pro"


def _replay_op(folder: Path, name: str, prelude: str) -> Path:
    """A situ operator file (the replay's shared expert) that computes the reference, after ``prelude`` runs at
    import."""
    return write_op(folder, name, HEADER + "{prelude}\n\ndef run(*args):\n    return _reference(*args)\n",
                    block="situ", prelude=prelude)


@pytest.mark.parametrize("mode", ["auto", "audit"])
def test_a_tampering_operator_in_a_replay_changes_nothing_on_disk(settings, tmp_path, operators, monkeypatch, mode):
    """The tampering code at an operator's import, in the replay's training process: the replay passes (the operator
    computes the reference) with nothing written; a write it does not catch fails the replay with the refusal."""
    monkeypatch.setenv("WORKBENCH_ISOLATION", mode)
    victim = operators / "swiglu" / "swiglu_op.json"
    before = _digest(operators)
    quiet = _replay_op(tmp_path, "situ_quiet", TAMPER.format(operators=str(operators), victim=str(victim)))
    outcome = run_replay(REPLAY_MODEL, "scratch", settings, ops=[f"situ={quiet}"], steps=2)
    assert outcome.status == "pass", outcome.reason
    assert _digest(operators) == before and not (Path.cwd() / "tampered.txt").exists()

    loud = _replay_op(tmp_path, "situ_loud", f"open({str(operators / 'loud.txt')!r}, 'w').write('was here')")
    outcome = run_replay(REPLAY_MODEL, "scratch", settings, ops=[f"situ={loud}"], steps=2)
    assert outcome.status == "error" and "refused by the replay sandbox" in outcome.reason, outcome.reason
    assert str(operators / "loud.txt") in outcome.reason and not (operators / "loud.txt").exists()
    assert _digest(operators) == before
