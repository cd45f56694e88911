#!/usr/bin/env bash
# GPU check, for a machine with one CUDA GPU: verify every promoted operator on the cuda backend in bfloat16 at the
# model card's sizes (the `model` suite), with its kernels compiled for the default targets, and print one table;
# then time each verified operator against the eager reference, torch.compile of it and installed peers
# (BENCH_SECONDS, default 300); the decode step of the serving forms at batch 1, 32 and 128 (bench/decode.py);
# the MXFP4 grouped GEMM's TFLOP/s at prefill and decode densities (bench/mxfp4.py);
# parity of each registered transformers family in bfloat16 and float32; vLLM parity with its CUDA build where one is
# installed; with two GPUs
# or more, a 2-step replay on 2 ranks (NCCL, FSDP2 + expert parallel).
# Under 10 minutes on one H200.
#
# It uses the machine's own python3 with its CUDA torch and triton (never installs torch). The verification path
# needs only torch, triton, numpy, jinja2 and pyyaml besides the workbench's own source (on PYTHONPATH); wheels of
# anything missing can be put in .whl/ (for the device's Python) and are installed from there, with no index.
#
#   bash bench/gpu_check.sh            # every promoted operator
#   bash bench/gpu_check.sh rmsnorm    # some blocks
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-.workbench/gpu-check}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" WORKBENCH_HOME="$OUT_DIR/home" PYTHONUNBUFFERED=1

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_check: torch sees no CUDA GPU')"
if ! "$PY" -c "import workbench.verify.harness" 2>/dev/null && [ -d .whl ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/workbench-site \
    .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/workbench-site"
fi

verified=0
"$PY" - "$OUT_DIR" "$@" <<'EOF' || verified=$?
"""Verify each promoted operator on cuda (bfloat16, model suite, one seed) and print the table."""
import json
import os
import sys
import time
from pathlib import Path

from workbench.backends import get_backend
from workbench.operators import list_promoted
from workbench.verify.harness import verify_candidate

out, wanted = Path(sys.argv[1]), set(sys.argv[2:])
# the shipped cards (K3's) have no softmax attention: its blocks take their model-suite sizes from bench/cards
# (Qwen3-Next-80B-A3B's and GPT-OSS-120B's), every other block the shipped cards' only
SOFTMAX_ATTENTION, CARDS = {"attention", "attention_prefill", "attention_decode"}, str(Path("bench/cards").resolve())
newest = {}
for manifest in list_promoted(Path("operators")):
    newest.setdefault(manifest["block"], manifest)
rows, started = [], time.monotonic()
for block in sorted(newest):
    if wanted and block not in wanted:
        continue
    os.environ["WORKBENCH_MODELS"] = CARDS if block in SOFTMAX_ATTENTION else ""
    result = verify_candidate(newest[block]["path"], block=block, suites=["model"], dtypes=["bfloat16"], seeds=1,
                              base_seed=20261201, backend=get_backend("cuda"), timeout_s=240)
    fwd = [t for t in result.checks if t.direction.startswith("forward")]
    rows.append({"block": block, "verdict": result.verdict, "worst_ratio": result.worst_ratio(),
                 "checks": len(result.checks), "failed": len(result.failing()), "seconds": round(result.seconds, 1),
                 "forward_checks": len(fwd), "compiles_on": result.target_report()["compiles_on"],
                 "message": result.message})
    print(f"{block}: {result.verdict} ({result.seconds:.1f} s) {result.message}", flush=True)
(out / "gpu_check.json").write_text(json.dumps(rows, indent=2))
print(f"\nverified on {get_backend('cuda').name} (bfloat16, model suite), {time.monotonic() - started:.0f} s in all")
print(f"{'block':<22} {'verdict':<22} {'worst/bound':>11} {'checks':>7} {'failed':>7} {'seconds':>8}  compiles on")
for r in rows:
    ratio = f"{r['worst_ratio']:.3f}" if r["worst_ratio"] != float("inf") else "-"
    print(f"{r['block']:<22} {r['verdict']:<22} {ratio:>11} {r['checks']:>7} {r['failed']:>7} {r['seconds']:>8}  "
          f"{','.join(r['compiles_on'])}")
sys.exit(0 if all(r["verdict"] == "pass" for r in rows) else 1)
EOF

# Speed: every promoted operator that verified, at the model suite in bfloat16, against the eager reference,
# torch.compile of it and the installed peers (workbench/perf/timing.py's protocol), until BENCH_SECONDS are spent.
"$PY" - "$OUT_DIR" "${BENCH_SECONDS:-300}" "$@" <<'EOF' || true
"""Time each verified operator (workbench bench, measured) and print its table."""
import json
import sys
import time
from pathlib import Path

from workbench.blocks import get_block
from workbench.perf.bench import load_operator, measured_rows, text_table
from workbench.verify.harness import suite_shapes

out, budget, wanted = Path(sys.argv[1]), float(sys.argv[2]), set(sys.argv[3:])
verified = {r["block"]: r for r in json.loads((out / "gpu_check.json").read_text()) if r["verdict"] == "pass"}
from workbench.operators import list_promoted
newest = {}
for manifest in list_promoted(Path("operators")):
    newest.setdefault(manifest["block"], manifest)
rows, started = [], time.monotonic()
for block in sorted(b for b in newest if b in verified and (not wanted or b in wanted)):
    if time.monotonic() - started > budget:
        print(f"{block}: not timed, the {budget:.0f} s bench budget is spent", flush=True)
        continue
    spec = get_block(block)
    rows += measured_rows(spec, load_operator(Path(newest[block]["path"])), suite_shapes(spec, "model")[:2], trials=10)
    print(f"{block}: timed ({time.monotonic() - started:.0f} s so far)", flush=True)
(out / "gpu_bench.json").write_text(json.dumps([r.to_dict() for r in rows], indent=2))
print("\nmeasured on this GPU: median of 10 calls (L2 flushed, fresh inputs, outputs checked), bfloat16, model suite")
print(text_table(rows))
# the cost model against these measurements: ours and each Triton peer (captured and compiled as ours are) modelled
# for this GPU's target at the same shapes; measured and modelled ours / peer side by side
import tempfile
import torch
from workbench.perf.bench import device_target, modelled_rows
from workbench.perf.peers import against_measured, peer_rows
from workbench.verify.harness import target_report
target, modelled = device_target(torch.device("cuda")), []
for block in sorted({r.block for r in rows}):
    spec, shapes = get_block(block), suite_shapes(get_block(block), "model")[:2]
    builds = target_report(newest[block]["path"], block=block, targets=[target], shapes=shapes).builds
    modelled += modelled_rows(block, shapes, [target], builds)
    with tempfile.TemporaryDirectory() as folder:
        modelled += peer_rows(block, shapes, [target], Path(folder))
print(f"\nmodelled ({target}) against measured: the cost model's error, and ours / peer both ways")
print(f"{'block':<22} {'subject':<22} {'passes':<8} {'measured ms':>12} {'modelled ms':>12} {'model error':>12} "
      f"{'ours/peer meas.':>16} {'ours/peer model':>16}")
for line in against_measured(rows, modelled):
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    print(f"{line['block']:<22} {line['subject'][:22]:<22} {line['passes']:<8} {line['measured_ms']:>12.3f} "
          f"{line['modelled_ms']:>12.3f} {100 * line['model_error']:>11.0f}% {fmt(line['ours_over_measured']):>16} "
          f"{fmt(line['ours_over_modelled']):>16}")
EOF
# The serving forms' decode step at batch 1, 32 and 128 (Kimi K3's sizes): modelled on the five targets and measured
# here (the operator, the eager reference, fla's fused_recurrent_kda where installed). Needs the workbench's own
# dependencies (the model cards); said and skipped otherwise.
# The MXFP4 grouped GEMM beside the bfloat16 one at K3's expert sizes (prefill and decode densities), TFLOP/s.
# Softmax attention (training, packed prefill, paged decode) at Qwen3-Next's and GPT-OSS's sizes against PyTorch SDPA,
# FlexAttention and flash-attn where installed, forward and forward + backward.
if "$PY" -c "import workbench.models, yaml" 2>/dev/null; then
  "$PY" bench/decode.py --measure --trials 10 || verified=1
  "$PY" bench/mxfp4.py --measure --trials 10 || verified=1
  "$PY" bench/softmax_attention.py --measure --trials 10 || verified=1
else
  echo "decode and MXFP4 benches: skipped, the workbench's dependencies are not installed here"
fi
# Parity in the published code: each registered transformers family's tiny model as shipped and with the promoted
# operators, in bfloat16 (and float32) on the GPU: KL, top-1/top-5, router choices, gradients (THRESHOLDS per dtype).
# Needs transformers and the workbench's own dependencies; said and skipped otherwise.
if "$PY" -c "import transformers, workbench.cli" 2>/dev/null; then
  for source in workbench/models/configs/kimi-linear-48b-a3b.config.json deepseek_v3; do
    for dtype in bfloat16 float32; do
      "$PY" -c "from workbench.cli import main; main()" parity "$source" --dtype "$dtype" --backend cuda \
        --db "sqlite:///$OUT_DIR/parity.db" || verified=1
    done
  done
else
  echo "parity: skipped, transformers or the workbench's CLI dependencies are not installed here"
fi
# Parity in the serving engine: each tiny model vLLM serves (llama, GPT-OSS, DeepSeek-V3 and its MXFP4 experts, and
# the KDA-only Kimi Linear vLLM's CPU build cannot start) served by vLLM's CUDA build as shipped and with the plugin,
# the operators compiled (softmax attention as vLLM's CUSTOM backend; MLA and KDA stay vLLM's on a GPU). Needs a vLLM
# interpreter with the project installed in it (its plugin entry point: `$VLLM_PY -m pip install --no-deps -e .`):
# $WORKBENCH_VLLM_PYTHON, else this python where it imports vllm; said and skipped otherwise.
VLLM_PY=${WORKBENCH_VLLM_PYTHON:-}
if [ -z "$VLLM_PY" ] && "$PY" -c "import vllm" 2>/dev/null; then VLLM_PY=$(command -v "$PY"); fi
if [ -n "$VLLM_PY" ] && "$VLLM_PY" -c "import sys; from importlib.metadata import entry_points
sys.exit(0 if any(e.name == 'workbench' for e in entry_points(group='vllm.general_plugins')) else 1)" 2>/dev/null \
    && "$PY" -c "import workbench.cli" 2>/dev/null; then
  for source in llama gpt_oss deepseek_v3 deepseek_v3-mxfp4 kimi_linear; do
    WORKBENCH_VLLM_PYTHON="$VLLM_PY" "$PY" -c "from workbench.cli import main; main()" parity "$source" \
      --engine vllm --backend cuda --db "sqlite:///$OUT_DIR/parity.db" || verified=1
  done
else
  echo "vLLM parity: skipped, no vLLM with the workbench's plugin installed (WORKBENCH_VLLM_PYTHON names one)"
fi
# The parallel layout on the device: 2 ranks (NCCL), dense parameters sharded with FSDP2, experts split across the
# ranks, every promoted operator, 2 steps of the small preset. Needs two GPUs and the workbench's own dependencies
# (the store, the CLI); said and skipped otherwise.
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)"; then
  if "$PY" -c "import workbench.cli" 2>/dev/null; then
    "$PY" -c "from workbench.cli import main; main()" replay kimi-k3.1-pro --preset small --steps 2 --ranks 2 \
      --layout fsdp2+ep --db "sqlite:///$OUT_DIR/replay.db" || verified=1
  else
    echo "2-rank replay: skipped, the workbench's CLI dependencies are not installed here"
  fi
else
  echo "2-rank replay: skipped, fewer than 2 GPUs"
fi
exit $verified
