"""The machine a server cost profile was measured on, in words: its GPUs (nvidia-smi's names, one per device) or,
without one, its CPU model and logical cores. Stored with every confirm (storage/serving/profiles.py), so a
prediction says which hardware its costs hold for."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter


def _gpus() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def local_hardware() -> str:
    """e.g. "1 × NVIDIA H100 80GB HBM3" or "CPU: AMD EPYC 7B13, 2 cores"."""
    gpus = _gpus()
    if gpus:
        return ", ".join(f"{n} × {name}" for name, n in Counter(gpus).items())
    return f"CPU: {_cpu()}, {os.cpu_count() or 1} cores"
