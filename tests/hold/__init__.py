"""A run held mid-way by construction, for tests that signal or kill a process while it times a run.

`held_env(from_prompt)` is an environment for a DraftLab process (`draftlab worker`, `draftlab run`, a supervisor
and the workers it starts): every Python process started with it loads ./sitecustomize.py, whose timing loop
(app/worker/timing.py) commits the units of prompts before `from_prompt` as usual, then holds at the first progress
report of the next unit, before it can commit, until a signal ends the process. A test that waits for those prompts and
then signals finds the run mid-way however fast the machine: no sleep, no race with the run finishing first (issue 35
item 17: a run finished before the SIGTERM arrived). `once`: a file the first process to hold creates as it holds (a
test waits for it); the processes that reach the hold after it (a restarted worker) run freely.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FROM_PROMPT_ENV, ONCE_ENV = "DRAFTLAB_TEST_HOLD_FROM_PROMPT", "DRAFTLAB_TEST_HOLD_ONCE"


def held_env(from_prompt: int, once: Path | None = None) -> dict:
    """os.environ for a subprocess whose timing loop holds before prompt `from_prompt` (see the module)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)]),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        FROM_PROMPT_ENV: str(int(from_prompt)),
    }
    if once is not None:
        env[ONCE_ENV] = str(once)
    return env
