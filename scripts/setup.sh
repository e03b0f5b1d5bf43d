# Sourced by scripts/test.sh and scripts/dashboard.sh: a .venv with DraftLab installed, idempotent.
# torch: the normal (CUDA) build where `nvidia-smi` sees a GPU; the CPU build elsewhere, so a laptop or a
# CPU-only CI machine never downloads several GB of CUDA libraries.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    pip install -q torch
  else  # the CPU build: a `+cpu` wheel your pip already knows (find-links / a local index), else PyTorch's CPU index
    pip install -q "torch==2.13.0+cpu" 2>/dev/null \
      || pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
if ! python -c "import app, engine, storage, pages, pytest, scipy, playwright" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.draftlab-installed ]; then
  pip install -q -e ".[dev]"
  touch .venv/.draftlab-installed
fi
