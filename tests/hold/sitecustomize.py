"""Loaded at start-up by a Python process whose PYTHONPATH holds this folder (tests/hold's held_env): with
$DRAFTLAB_TEST_HOLD_FROM_PROMPT=N, app/worker/timing.py's loop holds at the first progress report of a unit starting at
prompt N or later, before that unit commits, until a signal ends the process (SIGTERM's handler raises, SIGKILL
kills). With $DRAFTLAB_TEST_HOLD_ONCE=PATH only the first process to get there holds (it creates PATH)."""

import importlib.abc
import importlib.machinery
import os
import sys
import threading

FROM_PROMPT = os.environ.get("DRAFTLAB_TEST_HOLD_FROM_PROMPT")
ONCE = os.environ.get("DRAFTLAB_TEST_HOLD_ONCE")


def _first_to_hold() -> bool:
    if not ONCE:
        return True
    try:
        os.close(os.open(ONCE, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _hold(timing) -> None:
    unit_progress = timing._unit_progress

    def held_unit_progress(job, run, first, *rest):
        tick = unit_progress(job, run, first, *rest)
        if first < int(FROM_PROMPT):
            return tick

        def hold(index, tokens):
            if _first_to_hold():
                threading.Event().wait()  # never set: the process ends here, by a signal
            tick(index, tokens)

        return hold

    timing._unit_progress = held_unit_progress


class _PatchTiming(importlib.abc.MetaPathFinder):
    """Patches app.worker.timing as it is imported (the process may never import it: a supervisor)."""

    def find_spec(self, name, path, target=None):
        if name != "app.worker.timing":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _hold(module)

        spec.loader.exec_module = exec_module
        return spec


if FROM_PROMPT:
    sys.meta_path.insert(0, _PatchTiming())
