# Sourced by scripts/test.sh and scripts/dashboard.sh: a .venv with DraftLab installed, idempotent.
# torch: the normal (CUDA) build where `nvidia-smi` sees a GPU; the CPU build elsewhere, so a laptop or a
# CPU-only CI machine never downloads several GB of CUDA libraries.
# Each step that installs something says so first, on stderr (the first start takes a few minutes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
say() { echo "setup: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $PYTHON (first start: the steps below install into it, a few minutes) …"
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    say "installing torch (CUDA build: nvidia-smi sees a GPU) into .venv …"
    pip install -q torch
  else  # the CPU build: a `+cpu` wheel your pip already knows (find-links / a local index), else PyTorch's CPU index
    say "installing torch (CPU build) into .venv …"
    pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
if ! python -c "import app, engine, storage, pages, pytest, scipy, playwright, hypothesis, importlinter, ruff, mypy, prometheus_client" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.draftlab-installed ]; then
  say "installing DraftLab and its dependencies into .venv (pip install -e \".[dev]\") …"
  pip install -q -e ".[dev]"
  touch .venv/.draftlab-installed
  say "done: .venv is ready"
fi
