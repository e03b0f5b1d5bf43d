"""Liveness: workers register and heartbeat; a worker that is gone (no heartbeat for the stale window, or on
this host a process that no longer exists) has its runs and training jobs marked `interrupted` by the next
sweep (mark_stale: run by workers, `draftlab resume`, `draftlab list` and `draftlab confirm`), its leases dropped.

A confirm holds the same kind of lease: a worker's is the worker's; `draftlab confirm`'s own heartbeats from its
process, which the row names (`processes`, with the vLLM servers it started). A confirm whose process is gone is
swept to `interrupted` too. Storage signals no process: the sweep hands the servers such a confirm left running on
this host to its caller's `end_servers` (app/worker/sweep.py ends their process trees) and records how many were
ended.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import timedelta

from sqlalchemy import select, text

from engine.serving import process_tree
from storage.db.schema import INTERRUPTED, QUEUED, RUNNING, server_confirms, utcnow
from storage.db.settings import stale_window
from storage.db.store import Store
from storage.jobs.training import interrupt_stale, stale_jobs
from storage.records.workers import _pid_alive, confirm_processes, dead_workers, host_identity  # noqa: F401 (re-exported)


def register_worker(store: Store, worker_id: str, host: str = "", pid: int = 0) -> None:
    now = utcnow()
    with store.write() as conn:
        conn.execute(text("DELETE FROM workers WHERE id = :w"), {"w": worker_id})
        conn.execute(
            text("INSERT INTO workers (id, host, pid, started, heartbeat) VALUES (:w, :h, :p, :now, :now)"),
            {"w": worker_id, "h": host, "p": pid, "now": now},
        )


def unregister_worker(store: Store, worker_id: str) -> None:
    with store.write() as conn:
        conn.execute(text("DELETE FROM workers WHERE id = :w"), {"w": worker_id})
        conn.execute(text("DELETE FROM device_leases WHERE worker_id = :w"), {"w": worker_id})


def heartbeat(store: Store, worker_id: str, run_id: int | None, group: Sequence[int] = ()) -> None:
    """The worker is alive (and so are the runs it executes: run_id and the group timed with it)."""
    now = utcnow()
    ids = sorted({int(i) for i in group} | ({int(run_id)} if run_id is not None else set()))
    with store.write() as conn:
        conn.execute(
            text("UPDATE workers SET heartbeat = :now, run_id = :rid WHERE id = :w"),
            {"now": now, "rid": run_id, "w": worker_id},
        )
        conn.execute(
            text("UPDATE device_leases SET heartbeat = :now WHERE worker_id = :w"), {"now": now, "w": worker_id}
        )
        conn.execute(
            text("UPDATE training_jobs SET heartbeat = :now WHERE worker_id = :w AND status = :running"),
            {"now": now, "w": worker_id, "running": RUNNING},
        )
        conn.execute(
            text("UPDATE server_confirms SET heartbeat = :now WHERE worker_id = :w AND status = :running"),
            {"now": now, "w": worker_id, "running": RUNNING},
        )
        if ids:
            conn.execute(
                text(f"UPDATE runs SET heartbeat = :now WHERE id IN ({','.join(map(str, ids))}) AND status = :running"),
                {"now": now, "running": RUNNING},
            )


def live_workers(store: Store, max_age_seconds: float = 30) -> int:
    """Workers whose heartbeat is fresher than max_age_seconds."""
    with store.read() as conn:
        return int(
            conn.execute(
                text("SELECT COUNT(*) FROM workers WHERE heartbeat >= :cutoff"),
                {"cutoff": utcnow() - timedelta(seconds=max_age_seconds)},
            ).scalar_one()
        )


STALE_ERROR = (
    "its worker stopped (its process is gone or it sent no heartbeat for {seconds:g}s); "
    "resume the run to continue from its first unfinished prompt"
)


_STALE_RUNS = """SELECT id FROM runs WHERE
    (status = :running AND (heartbeat IS NULL OR heartbeat < :cutoff OR worker_id IN ({dead})))
 OR (status = :queued AND reserved_for IS NOT NULL AND (reserved_for IN ({dead})
     OR (created < :cutoff AND reserved_for NOT IN (SELECT id FROM workers WHERE heartbeat >= :cutoff))))"""


def stale_runs(conn, cutoff, dead: Sequence[str]) -> list[int]:
    """Runs left `running` by a dead worker (see dead_workers) or with no heartbeat since cutoff, and queued
    runs reserved for a dead worker."""
    names = {f"dead{i}": w for i, w in enumerate(dead)}
    placeholders = ", ".join(f":{n}" for n in names) or "NULL"
    return list(
        conn.execute(
            text(_STALE_RUNS.format(dead=placeholders)),
            {"cutoff": cutoff, "running": RUNNING, "queued": QUEUED, **names},
        )
        .scalars()
        .all()
    )


TRAINING_STALE_ERROR = (
    "its worker stopped (its process is gone or it sent no heartbeat for {seconds:g}s); "
    "resume the job to continue from its last checkpoint"
)


CONFIRM_STALE_ERROR = (
    "its worker stopped (its process is gone or it sent no heartbeat for {seconds:g}s); the "
    "configurations measured before are kept: queue the confirm again for the rest"
)
CONFIRM_ORPHANED_ERROR = (
    "its `draftlab confirm` process stopped without closing it (killed, or its machine went "
    "down: its process is gone or it sent no heartbeat for {seconds:g}s); the configurations "
    "measured before are kept: run the confirm again for the rest"
)
SERVERS_ENDED = "; {n} vLLM server process(es) it left running were ended"


def _owner_gone(processes: str | None) -> bool:
    """Whether the process that ran a confirm is known to be gone: it ran on this host and no such process (the one
    started then, not a later one given its pid) exists."""
    try:
        owner = json.loads(processes or "{}")
        return owner.get("host") == host_identity() and not process_tree.running(int(owner["pid"]), owner.get("start"))
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def orphaned_confirms(conn, cutoff) -> list[int]:
    """`draftlab confirm`'s own running confirms (no worker) whose process is gone (on this host) or sent no
    heartbeat since cutoff (a row of a DraftLab before heartbeats: created before cutoff)."""
    rows = conn.execute(
        select(
            server_confirms.c.id, server_confirms.c.heartbeat, server_confirms.c.created, server_confirms.c.processes
        ).where(server_confirms.c.status == RUNNING, server_confirms.c.worker_id.is_(None))
    ).all()
    return [r.id for r in rows if (r.heartbeat or r.created) < cutoff or _owner_gone(r.processes)]


def left_servers(conn, ids) -> dict[int, list]:
    """The vLLM servers ([pid, start] each) of these confirms whose process is gone from this host: nothing ends
    them now (their watchdogs died with it, or were killed). A confirm whose process lives (a heartbeat late) keeps
    its servers."""
    if not ids:
        return {}
    rows = conn.execute(
        select(server_confirms.c.id, server_confirms.c.processes).where(server_confirms.c.id.in_([int(i) for i in ids]))
    ).all()
    return {r.id: json.loads(r.processes).get("servers") or [] for r in rows if _owner_gone(r.processes)}


def stale_confirms(conn, cutoff, dead) -> list[int]:
    """Running confirms whose worker is dead or sent no heartbeat since cutoff (the CLI's own, without a worker:
    orphaned_confirms)."""
    names = {f"dead{i}": w for i, w in enumerate(dead)}
    placeholders = ", ".join(f":{n}" for n in names) or "NULL"
    return list(
        conn.execute(
            text(
                f"SELECT id FROM server_confirms WHERE status = :running AND worker_id IS NOT NULL AND "
                f"(heartbeat IS NULL OR heartbeat < :cutoff OR worker_id IN ({placeholders}))"
            ),
            {"running": RUNNING, "cutoff": cutoff, **names},
        ).scalars()
    )


def interrupt_confirms(conn, ids, error: str) -> None:
    if ids:
        conn.execute(
            text(
                f"UPDATE server_confirms SET status = :i, error = :e, phase = :p "
                f"WHERE id IN ({','.join(str(int(i)) for i in ids)}) AND status = :running"
            ),
            {"i": INTERRUPTED, "e": error, "p": INTERRUPTED, "running": RUNNING},
        )


def _interrupt_confirms_ending(conn, ids, error: str, ended: dict[int, int]) -> None:
    """interrupt_confirms, each confirm's error saying how many server processes it left were ended."""
    for n in sorted(set(ended.get(i, 0) for i in ids)):
        interrupt_confirms(
            conn, [i for i in ids if ended.get(i, 0) == n], error + (SERVERS_ENDED.format(n=n) if n else "")
        )


EndServers = Callable[[dict[int, list]], dict[int, int]]  # {confirm id: [[pid, start], ...]} -> {confirm id: ended}


def mark_stale(store: Store, stale_seconds: float | None = None, *, end_servers: EndServers | None = None) -> list[int]:
    """Runs left `running` by a worker that is gone (killed, crashed, machine gone) become `interrupted`,
    keeping every committed row; so do queued runs reserved for a dead worker. A worker is gone when it sent
    no heartbeat for the stale window (see stale_window()), or at once when it ran on this host and its
    process no longer exists; training jobs and confirms of such workers too. Looks first and writes only when there is
    something to sweep. Returns run ids.
    end_servers: what ends the vLLM servers a swept confirm left running here, before its row closes (app/worker/
    sweep.py's, which every command and worker uses); None leaves them running and the rows say nothing of them."""
    seconds = stale_window(stale_seconds)
    cutoff = utcnow() - timedelta(seconds=seconds)
    with store.read() as conn:
        dead = dead_workers(conn, cutoff)
        stale = stale_runs(conn, cutoff, dead)
        confirms = stale_confirms(conn, cutoff, dead) + orphaned_confirms(conn, cutoff)
        jobs = stale_jobs(conn, cutoff, dead) + confirms
        leases = conn.execute(
            text("SELECT COUNT(*) FROM device_leases WHERE heartbeat < :cutoff"), {"cutoff": cutoff}
        ).scalar()
        if not (dead or stale or jobs or leases):
            return []
        left = left_servers(conn, confirms)
    ended = end_servers(left) if end_servers else {}  # before the rows close: a sweep cut short here finds them again
    params = {
        "cutoff": cutoff,
        "interrupted": INTERRUPTED,
        "now": utcnow(),
        "error": STALE_ERROR.format(seconds=seconds),
    }
    with store.write() as conn:
        dead = dead_workers(conn, cutoff)
        stale = stale_runs(conn, cutoff, dead)
        interrupt_stale(conn, stale_jobs(conn, cutoff, dead), TRAINING_STALE_ERROR.format(seconds=seconds))
        for ids, error in (
            (stale_confirms(conn, cutoff, dead), CONFIRM_STALE_ERROR),
            (orphaned_confirms(conn, cutoff), CONFIRM_ORPHANED_ERROR),
        ):
            _interrupt_confirms_ending(conn, ids, error.format(seconds=seconds), ended)
        if stale:
            conn.execute(
                text(
                    "UPDATE runs SET status = :interrupted, finished = :now, reserved_for = NULL, error = :error "
                    f"WHERE id IN ({','.join(str(int(i)) for i in stale)})"
                ),
                params,
            )
        for worker_id in dead:
            conn.execute(text("DELETE FROM device_leases WHERE worker_id = :w"), {"w": worker_id})
            conn.execute(text("DELETE FROM workers WHERE id = :w"), {"w": worker_id})
        conn.execute(text("DELETE FROM device_leases WHERE heartbeat < :cutoff"), params)
    return stale
