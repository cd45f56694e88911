"""Timing child: times one verified candidate at the model suite on the backend's device and sends back the rows.

Started by workbench.perf.measure as ``python -s -P -B measure_worker.py JOB_DIR RESULT_FD`` under the sandbox's
limits and isolation (workbench.verify.sandbox), like the verification worker. It imports the workbench: every
timed call's outputs are checked against the block's reference (workbench.perf.bench), so a candidate that is
fast because it is wrong gets no time. Reads JOB_DIR/job.pt {candidate, block, shapes, device, dtype, clock,
trials, token}; writes {"rows": [BenchRow dicts], "error", "token"} to RESULT_FD.
"""

from __future__ import annotations

import io
import os
import sys
import traceback
from pathlib import Path


def main(job_dir: str, result_fd: int) -> int:
    import torch

    from workbench.blocks import get_block
    from workbench.perf.bench import load_operator, measured_rows
    from workbench.perf.timing import CudaClock, WallClock

    job_file = Path(job_dir) / "job.pt"
    job = torch.load(job_file, weights_only=True)
    job_file.unlink()
    result: dict = {"rows": [], "error": None, "token": job["token"]}
    try:
        spec = get_block(job["block"])
        device = torch.device(job["device"])
        clock = CudaClock(device) if job["clock"] == "cuda" else WallClock()
        module = load_operator(Path(job["candidate"]))
        rows = measured_rows(spec, module, job["shapes"], trials=job["trials"], device=job["device"],
                             dtype=getattr(torch, job["dtype"]), clock=clock, subjects=["operator"])
        result["rows"] = [r.to_dict() for r in rows]
    except Exception as exc:  # noqa: BLE001 - the candidate's failure to run at these sizes is the answer
        result["error"] = f"{type(exc).__name__}: {exc}"[:300]
        traceback.print_exc()
    blob = io.BytesIO()
    torch.save(result, blob)
    with os.fdopen(result_fd, "wb") as channel:
        channel.write(blob.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
