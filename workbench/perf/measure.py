"""Measured times for the search: a verified candidate timed at the model suite in a sandboxed child
(measure_worker.py), on the backend's device, by workbench.perf.timing's protocol. On a GPU backend these replace
the modelled times when the agent ranks passing candidates (workbench.agent.rank)."""

from __future__ import annotations

import io
import secrets
import shutil
import tempfile
from pathlib import Path

import torch

from workbench.backends import Backend, cuda_target_name
from workbench.verify.sandbox import run_child

MEASURE_WORKER = Path(__file__).with_name("measure_worker.py")
MEASURE_TRIALS = 10


def measure_candidate(path: str | Path, block: str, shapes: list[dict], backend: Backend, *, dtype: str,
                      timeout_s: float, trials: int = MEASURE_TRIALS, clock: str | None = None,
                      forward_only: bool = False) -> dict:
    """{"label": "measured", "device", "target" (the device's compile target, sm_90a say; "" off a GPU), "time_ms"
    (the median forward+backward, or forward, times summed over ``shapes``), "spread_ms" (their interquartile ranges
    summed), "shapes"}; or {"label", "device", "target", "error"}
    when the candidate failed, was wrong or ran out of time at these sizes. clock: "cuda" (events, the default on
    a GPU backend) or "wall" (the CPU stand-in, for the protocol's own tests)."""
    path = Path(path).resolve()
    clock = clock or ("cuda" if backend.device == "cuda" else "wall")
    figure = {"label": "measured", "device": torch.cuda.get_device_name() if clock == "cuda" else backend.name,
              "target": cuda_target_name(*torch.cuda.get_device_capability()) if clock == "cuda" else ""}
    job = {"candidate": str(path), "block": block, "shapes": shapes, "device": backend.device, "dtype": dtype,
           "clock": clock, "trials": trials, "token": secrets.token_hex(16)}
    job_dir = Path(tempfile.mkdtemp(prefix="measure-"))
    try:
        torch.save(job, job_dir / "job.pt")
        (job_dir / "scratch").mkdir()
        env = {**backend.env, "TRITON_CACHE_DIR": str(job_dir / "scratch" / "triton-cache")}
        child = run_child(MEASURE_WORKER, job_dir, env, timeout_s, None, [path.parent])
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    if child.status != "ok":
        return {**figure, "error": f"{child.status}: {child.message}"}
    result = torch.load(io.BytesIO(child.payload), weights_only=True)
    if result.get("token") != job["token"]:
        return {**figure, "error": "the timing result did not come from the timing worker"}
    if result["error"]:
        return {**figure, "error": result["error"]}
    wanted = "fwd" if forward_only else "fwd+bwd"
    rows = [r for r in result["rows"] if r["passes"] == wanted]
    failed = [r for r in rows if r["time_ms"] is None]
    if failed or not rows:
        return {**figure, "error": f"{failed[0]['shape']}: {failed[0]['note']}" if failed else "nothing timed"}
    return {**figure, "time_ms": round(sum(r["time_ms"] for r in rows), 6),
            "spread_ms": round(sum(r["spread_ms"] or 0.0 for r in rows), 6), "shapes": len(rows)}
