"""The stale sweep as every process runs it (workers, the supervisor, `draftlab list`, `resume`, `confirm`): storage's
mark_stale closes what a gone worker or confirm left, and the vLLM servers such a confirm left running on this host
are ended here, by process tree (engine/serving/process_tree.py), since storage signals no process."""

from __future__ import annotations

from engine.serving import process_tree
from storage import Store
from storage.jobs import liveness

GRACE_SECONDS = 5.0  # a left server's SIGTERM, before SIGKILL (its owner is gone: nothing waits on it)


def end_left_servers(left: dict[int, list]) -> dict[int, int]:
    """End each confirm's left servers ([pid, start time] each: the group and its descendants, start time checked
    before signalling); {confirm id: how many processes were still alive}."""
    return {
        cid: sum(process_tree.Tree(int(pid), start).end(GRACE_SECONDS) for pid, start in servers)
        for cid, servers in left.items()
    }


def sweep(store: Store, stale_seconds: float | None = None) -> list[int]:
    """storage/jobs/liveness.py's mark_stale, ending the servers a swept confirm left running; returns run ids."""
    return liveness.mark_stale(store, stale_seconds, end_servers=end_left_servers)
