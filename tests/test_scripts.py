"""scripts/setup.sh (sourced by scripts/dashboard.sh and scripts/test.sh) on a fresh checkout says what it installs,
before each step, on stderr; run in a sandbox whose python and pip are stubs that only log what they are asked."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

STUB_PYTHON = """#!/bin/sh
# `python -m venv .venv`: a venv whose activate puts its bin, then the stubs, first on PATH; `python -c ...`: nothing
# importable
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && printf 'PATH="%s/bin:%s:$PATH"\\n' "$(cd "$3" && pwd)" "$STUBS" > "$3/bin/activate" &&
    cp "$0" "$3/bin/python"
  exit 0
fi
exit 1
"""
STUB_PIP = """#!/bin/sh
echo "pip $*" >> "$SETUP_LOG"
"""


def _sandbox(tmp_path: Path) -> tuple[Path, dict]:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", checkout / "scripts" / "setup.sh")
    (checkout / "pyproject.toml").write_text("")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in (("python", STUB_PYTHON), ("python3", STUB_PYTHON), ("pip", STUB_PIP)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "STUBS": str(stubs),
        "HOME": str(tmp_path),
        "PYTHON": str(stubs / "python3"),
        "SETUP_LOG": str(tmp_path / "setup.log"),
    }
    return checkout, env


def test_first_start_says_what_it_installs_before_each_step(tmp_path):
    checkout, env = _sandbox(tmp_path)
    if shutil.which("nvidia-smi", path=env["PATH"]):
        env["PATH"] = str(tmp_path / "stubs")  # this test follows the CPU path
        for tool in ("mkdir", "cp", "touch", "dirname", "printf"):
            found = shutil.which(tool)
            if found:
                os.symlink(found, tmp_path / "stubs" / tool)
    # setup's stderr and the pip calls go to one file, in the order they happen
    done = subprocess.run(
        ["bash", "-c", 'source scripts/setup.sh 2>>"$SETUP_LOG"'],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = Path(env["SETUP_LOG"]).read_text()
    assert done.returncode == 0, log
    lines = [line for line in log.splitlines() if line.strip()]
    said = [i for i, line in enumerate(lines) if line.startswith("setup: ")]
    installs = [i for i, line in enumerate(lines) if line.startswith("pip install")]
    assert lines[said[0]].startswith("setup: creating .venv")
    torch = next(i for i in said if lines[i] == "setup: installing torch (CPU build) into .venv …")
    project = next(i for i in said if lines[i].startswith("setup: installing DraftLab and its dependencies into .venv"))
    assert torch < installs[0] < project < installs[-1]  # each line comes before its step
    assert "torch" in lines[installs[0]] and "-e .[dev]" in lines[installs[-1]]
    assert lines[-1] == "setup: done: .venv is ready"
    assert done.stdout == ""  # stdout stays clean (draftlab's own output, --json)


def test_a_ready_venv_is_silent(tmp_path):
    checkout, env = _sandbox(tmp_path)
    first = subprocess.run(
        ["bash", "-c", "source scripts/setup.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )
    assert first.returncode == 0, first.stderr
    ready = checkout / ".venv" / "bin" / "python"  # now everything imports: nothing to install
    ready.write_text("#!/bin/sh\nexit 0\n")
    again = subprocess.run(
        ["bash", "-c", "source scripts/setup.sh"], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and again.stderr == "" and again.stdout == ""
    assert Path(env["SETUP_LOG"]).read_text().count("pip install") == 2  # the first start's two, no more
