"""The process a replay trains in: ``python -m workbench.replay.child`` with a job (JSON) on stdin.

Its environment selects the Triton backend before anything imports triton (the interpreter on CPU). Events go to
stdout as lines ``@@replay <json>``: {"event": "step", "step", "loss", "seconds"} after each step, then
{"event": "done", "result": RunResult} or {"event": "error", "message"}; anything else an operator prints is passed
through untouched.

job: {"task": "train" | "base", "preset", "mode", "steps", "seed",
      "ops": {block: "reference" | file | "library:" file},
      "device", "base": checkpoint path (LoRA, and where "base" saves), "writable": the folders it may write,
      "layout": {"cache": blocks whose saved tensors go to the host tier (workbench.replay.tiers)} (optional),
      "mtp": true for a scratch run with one MTP depth (workbench.replay.mtp; "done" carries its "mtp_curve")}

The operator files are candidates too: while their code is on the stack every filesystem write outside
``writable`` is refused (workbench.verify.worker.install_write_guard), with bubblewrap's read-only mounts or
without them.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

MARK = "@@replay "


def send_event(event: dict) -> None:
    """One event line on stdout for the process that reads this one (MARK, then the event as JSON)."""
    sys.stdout.write(MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    import torch

    from workbench.replay.arch import Architecture
    from workbench.replay.mtp import train_mtp
    from workbench.replay.ops import absolute_target, load_ops, operator_file
    from workbench.replay.presets import get_preset
    from workbench.replay.tiers import cached_ops
    from workbench.replay.train import make_base, train
    from workbench.verify.worker import install_write_guard

    torch.set_num_threads(1)
    job = json.loads(sys.stdin.read())
    chosen = {block: absolute_target(target) for block, target in job["ops"].items()}
    install_write_guard([f for f in map(operator_file, chosen.values()) if f is not None], job.get("writable", []),
                        "the replay sandbox")
    try:
        preset, arch = get_preset(job["preset"]), Architecture(**job["arch"])
        ops = cached_ops(load_ops(chosen), job.get("layout", {}).get("cache", []))
        base = Path(job["base"]) if job.get("base") else None

        def on_step(step: int, loss: float, seconds: float) -> None:
            send_event({"event": "step", "step": step, "loss": loss, "seconds": seconds})

        if job["task"] == "base":
            result = make_base(preset, arch, job["seed"], ops, base, job["device"], on_step)
        elif job.get("mtp"):
            run = train_mtp(preset, arch, job["steps"], job["seed"], ops, job["device"], on_step)
            send_event({"event": "done", "result": asdict(run.result), "mtp_curve": run.mtp_curve})
            return
        else:
            result = train(preset, arch, job["mode"], job["steps"], job["seed"], ops, job["device"], base, on_step)
        send_event({"event": "done", "result": asdict(result)})
    except Exception as exc:  # reported to the parent as one line; the traceback goes to stderr
        traceback.print_exc()
        send_event({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)


if __name__ == "__main__":
    main()
