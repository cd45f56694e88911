"""The sandbox's audit hook (workbench/verify/worker.py, make_audit_hook) tells a scan of sys.path from a read of the
workbench. setuptools' editable install puts a placeholder on sys.path ("__editable__.<dist>.finder.__path_hook__",
a name its path hook claims, no file); importlib.metadata's distribution search (which torch reaches at import
through networkx's entry points) tries every entry it cannot list as a zip archive and opens that name, relative, so
inside the job folder, the child's working directory. That opens nothing and is not refused; a read of the
workbench's sources, of a job file, or of a file that does exist under the placeholder's name still is, as is an
import of the workbench. Run in a child process with the standard library only: an audit hook cannot be removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import workbench

WORKER = Path(workbench.__file__).resolve().parent / "verify" / "worker.py"
REFERENCE = Path(workbench.__file__).resolve().parent / "blocks" / "rmsnorm.py"
PLACEHOLDER = "__editable__.workbench-0.1.0.finder.__path_hook__"

CANDIDATE = '''
import importlib.metadata

OUTCOMES = {{}}


def attempt(name, action):
    try:
        action()
        OUTCOMES[name] = "ok"
    except PermissionError:
        OUTCOMES[name] = "refused"
    except (OSError, ImportError) as exc:
        OUTCOMES[name] = type(exc).__name__


def read(path):
    with open(path) as f:
        return f.read()


def scan_and_read():
    attempt("entry_points", lambda: importlib.metadata.entry_points(group="workbench.no_such_group"))
    attempt("reference", lambda: read({reference!r}))
    attempt("job", lambda: read("job.json"))
    attempt("import", lambda: __import__("workbench.blocks.rmsnorm"))


def read_placeholder():
    attempt("placeholder", lambda: read({placeholder!r}))
'''

DRIVER = '''
import importlib.util, json, os, sys
worker, job_dir, candidate, placeholder = sys.argv[1:5]
spec = importlib.util.spec_from_file_location("sandbox_guard", worker)
guard = importlib.util.module_from_spec(spec)
spec.loader.exec_module(guard)
os.chdir(job_dir)
if placeholder not in sys.path:
    sys.path.append(placeholder)
events = []
sys.meta_path.insert(0, guard.RefuseWorkbench())
sys.addaudithook(guard.make_audit_hook(candidate, job_dir, events))
spec = importlib.util.spec_from_file_location("candidate", candidate)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.scan_and_read()
with open(os.path.join(job_dir, placeholder), "w") as f:  # the driver, not the candidate: a file by that name
    f.write("private")
module.read_placeholder()
print(json.dumps({"events": events, "outcomes": module.OUTCOMES}))
'''


def test_a_scan_of_sys_path_is_not_a_read_of_the_workbench_but_reads_of_it_are_refused(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "job.json").write_text("{}")
    candidate = tmp_path / "candidate.py"
    candidate.write_text(CANDIDATE.format(reference=str(REFERENCE), placeholder=PLACEHOLDER))
    done = subprocess.run([sys.executable, "-s", "-P", "-B", "-c", DRIVER, str(WORKER), str(job_dir),
                           str(candidate), PLACEHOLDER], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    flagged = {(e["event"], Path(e["detail"]).name) for e in report["events"]}
    assert ("open", PLACEHOLDER) in flagged  # the file that does exist by the placeholder's name
    assert ("open", REFERENCE.name) in flagged and ("open", "job.json") in flagged
    assert ("import", "workbench.blocks.rmsnorm") in flagged
    assert len([e for e in report["events"] if e["detail"] == PLACEHOLDER]) == 1  # the scan itself is not flagged
    assert report["outcomes"] == {"entry_points": "ok", "reference": "refused", "job": "refused",
                                  "import": "refused", "placeholder": "refused"}
