"""A server's process tree, kept to its owner's life and ended whole (Linux's /proc; elsewhere its process group).

vLLM's OpenAI server, started by app/serving/vllm_server.py in a session of its own (so its process group id is its
pid), forks an EngineCore and worker processes that rename themselves (`VLLM::EngineCore`) and outlive the server
process when it is killed: their parent becomes PID 1, each holding its share of the model. A `Tree` is the leader's pid
and start time plus every descendant seen while it ran; `end()` sends SIGTERM to the group and to each of those still
alive, SIGKILL after a grace period. A pid is signalled only while its start time is the one recorded (a pid the kernel
has given to another process since is left alone); a group id is never reused while a member is alive.

Run as a script (`python -I process_tree.py LEADER START GRACE LOG OWNER OWNER_START`), it is the watchdog
app/serving/vllm_server.py starts beside each server, in a session of its own: it records the tree's descendants every
WATCH_SECONDS and ends the tree when its stdin reaches end of file, which happens when the owner closes the pipe
(VllmServer.stop) and when the owner dies, even by SIGKILL (the kernel closes the owner's end). A watchdog whose owner
died also removes the server's log, unless the owner wrote KEEP_LOG first (the log holds a failure the user was pointed
to). The owner is named on the command line (pid and start time), never read from getppid(): an owner killed before
the script's first line ran would look alive. Standard library only: the script runs without the project on its path.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

WATCH_SECONDS = 1.0  # how often the watchdog records the tree's descendants
KEEP_LOG = b"k"
PR_SET_PDEATHSIG = 1


def _stat(pid: int) -> tuple[int, int, int, str, int] | None:
    """(parent pid, process group, session, state, start time in clock ticks) of a process; None when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # the name, in parentheses, may hold spaces
    return int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode(), int(fields[19])


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks after boot), which tells it from a later process given the same pid."""
    stat = _stat(pid)
    return stat[4] if stat else None


def running(pid: int, start: int | None = None) -> bool:
    """Whether the process `pid` (started at `start`, when given) exists and is not a zombie. Without /proc: whether
    the pid exists."""
    if not os.path.isdir("/proc/self"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    stat = _stat(pid)
    return stat is not None and stat[3] != "Z" and (start is None or stat[4] == start)


def _table() -> dict[int, tuple[int, int, int, str, int]]:
    table = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc/self") else ():
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            table[int(name)] = stat
    return table


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A preexec_fn that has the child receive `sig` when its parent dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG; None elsewhere). The libc call is looked up here, in the parent: the child only calls it."""
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, int(sig))


@dataclass
class Tree:
    """A process group's leader (its pid is the group id) and the descendants seen while it ran: {pid: start}."""

    leader: int
    start: int | None = None
    seen: dict[int, int] = field(default_factory=dict)

    def _group_ours(self, table: dict) -> bool:
        """Whether the group `leader` is still the one recorded: its leader is the same process, or gone (a group id
        stays taken while a member lives, so the members left are the recorded group's)."""
        stat = table.get(self.leader)
        return stat is None or self.start is None or stat[4] == self.start

    def watch(self, table: dict | None = None) -> None:
        """Record the processes of the leader's group or session and every descendant of a process already known."""
        table = _table() if table is None else table
        if self.start is None and self.leader in table:
            self.start = table[self.leader][4]
        ours = self._group_ours(table)
        known = {self.leader, *self.seen} if ours else set(self.seen)
        grown = True
        while grown:
            grown = False
            for pid, (ppid, pgid, sid, state, start) in table.items():
                if pid in known or state == "Z":
                    continue
                if ppid in known or (ours and self.leader in (pgid, sid)):
                    known.add(pid)
                    self.seen[pid] = start
                    grown = True

    def alive(self, table: dict | None = None) -> list[int]:
        """The tree's processes alive now (zombies count as ended): the group's, and those seen with their start."""
        table = _table() if table is None else table
        ours = self._group_ours(table)
        pids = {
            pid
            for pid, (_, pgid, sid, state, _) in table.items()
            if ours and state != "Z" and self.leader in (pgid, sid)
        }
        pids |= {
            pid for pid, start in self.seen.items() if pid in table and table[pid][3] != "Z" and table[pid][4] == start
        }
        if ours and self.leader in table and table[self.leader][3] != "Z":
            pids.add(self.leader)
        return sorted(pids)

    def _signal(self, sig: int, pids: list[int], table: dict) -> None:
        if self._group_ours(table):
            try:
                os.killpg(self.leader, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def end(self, grace: float) -> int:
        """SIGTERM to every process of the tree, SIGKILL to those alive after `grace` seconds; returns how many were
        alive at first."""
        table = _table()
        self.watch(table)
        first = self.alive(table)
        if not os.path.isdir("/proc/self"):  # no /proc: the group alone, with no way to see it empty
            self._signal(signal.SIGTERM, [], {})
            time.sleep(min(grace, 1.0))
            self._signal(signal.SIGKILL, [], {})
            return 0
        if not first:
            return 0
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            self._signal(sig, self.alive(table), table)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                table = _table()
                self.watch(table)  # a child forked while it shut down
                if not self.alive(table):
                    return len(first)
                time.sleep(0.1)
        return len(first)


def watchdog(leader: int, start: int | None, grace: float, log: str, owner: int, owner_start: int | None) -> None:
    """Record the tree until stdin closes, then end it (see the module's docstring). The owner (pid and start time)
    is passed in, not read from getppid(): an owner killed before this script's first line would look alive."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    tree, keep = Tree(leader, start), False
    while not stopped:
        try:
            ready = select.select([0], [], [], WATCH_SECONDS)[0]
        except InterruptedError:
            continue
        if ready:
            data = os.read(0, 64)
            if not data:
                break
            keep = keep or KEEP_LOG in data
        tree.watch()
    tree.end(grace)
    if log and not keep and not running(owner, owner_start):  # the owner died: nobody will remove it, or read it
        try:
            os.unlink(log)
        except OSError:
            pass


if __name__ == "__main__":
    leader, start, grace, log, owner, owner_start = sys.argv[1:7]
    watchdog(int(leader), int(start) if start else None, float(grace), log, int(owner), int(owner_start) or None)
