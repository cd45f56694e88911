"""The measured path of ``workbench bench``, run end to end on the CPU stand-ins (the Triton interpreter and the
wall clock) in a child process: every subject timed forward and forward+backward, every timed output checked, a
wrong operator a row that says why instead of a figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = r'''
import json, sys, types
import torch
from pathlib import Path
from workbench.blocks import get_block
from workbench.perf.bench import load_operator, measured_rows
from workbench.perf.timing import WallClock

spec = get_block("rmsnorm")
good = load_operator(next(Path("operators/rmsnorm").glob("*.py")))
wrong = types.SimpleNamespace(run=lambda x, weight, eps: good.run(x, weight, eps) * 1.01)
shape = {"rows": 4, "N": 64}
rows = []
for module in (good, wrong):
    rows += measured_rows(spec, module, [shape], trials=2, device="cpu", dtype=torch.float32, clock=WallClock(),
                          subjects=["operator", "eager"])
print(json.dumps([r.to_dict() for r in rows]))
'''


@pytest.mark.interpreter
def test_measured_rows_time_check_and_refuse_on_the_cpu_stand_ins():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    good, wrong = rows[:4], rows[4:]
    assert [(r["subject"], r["passes"]) for r in good] == [("operator", "fwd"), ("eager", "fwd"),
                                                          ("operator", "fwd+bwd"), ("eager", "fwd+bwd")]
    assert all(r["label"] == "measured" and r["time_ms"] > 0 and r["bytes_s"] > 0 for r in good)
    assert all(r["fraction"] is None for r in good)  # no roofline for a CPU
    refused = [r for r in wrong if r["subject"] == "operator"]
    assert len(refused) == 2 and all(r["time_ms"] is None and r["note"].startswith("AssertionError: y off by")
                                     for r in refused)
