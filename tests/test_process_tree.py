"""The server watchdog (engine/serving/process_tree.py run as a script), driven directly: it ends the tree it was given
when its stdin closes, and removes the server's log only when its owner died. The owner is named on its command line:
a confirm killed before the watchdog's own first line ran (a busy machine) is still seen as dead, and a live owner
keeps its log (the owner removes it, or points the user to it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from engine.serving import process_tree
from tests.fault_tools import wait_until


def _server() -> subprocess.Popen:
    """A stand-in server: a process group of its own, a child that stays in it."""
    return subprocess.Popen(
        [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"],
        start_new_session=True,
    )


def _watchdog(server: subprocess.Popen, log, owner: int, owner_start: int | None) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-I",
            process_tree.__file__,
            str(server.pid),
            str(process_tree.start_time(server.pid) or ""),
            "5",
            str(log),
            str(owner),
            str(owner_start or 0),
        ],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )


def _tree(server: subprocess.Popen) -> list[int]:
    tree = process_tree.Tree(server.pid, process_tree.start_time(server.pid))
    tree.watch()
    return tree.alive()


def test_a_watchdog_whose_owner_died_before_it_started_ends_the_tree_and_removes_the_log(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_start = process_tree.start_time(gone.pid)
    gone.wait()
    server, log = _server(), tmp_path / "server.log"
    log.write_text("started\n")
    wait_until(lambda: len(_tree(server)) == 2, 20, "the server and its child")
    tree = process_tree.Tree(server.pid, process_tree.start_time(server.pid))
    tree.watch()
    watchdog = _watchdog(server, log, gone.pid, gone_start)
    try:
        watchdog.stdin.close()  # the owner's end closed: what its death does
        assert watchdog.wait(timeout=30) == 0
        server.wait(timeout=5)
        assert tree.alive() == [] and not log.exists()
    finally:
        tree.end(1.0)


def test_a_watchdog_whose_owner_lives_ends_the_tree_and_keeps_the_log(tmp_path):
    server, log = _server(), tmp_path / "server.log"
    log.write_text("started\n")
    wait_until(lambda: len(_tree(server)) == 2, 20, "the server and its child")
    tree = process_tree.Tree(server.pid, process_tree.start_time(server.pid))
    tree.watch()
    watchdog = _watchdog(server, log, os.getpid(), process_tree.start_time(os.getpid()))
    try:
        time.sleep(1.5)  # one watch at least
        watchdog.stdin.close()
        assert watchdog.wait(timeout=30) == 0
        server.wait(timeout=5)
        assert tree.alive() == [] and log.read_text() == "started\n"
    finally:
        tree.end(1.0)
