"""Who holds what: this process's identity (host and PID namespace), whether a registered worker is gone, and the
`processes` a confirm row records of its owner, read by the job queue (storage/jobs/liveness.py) and the dashboard's
worker listing (storage/records/worker_health.py)."""

from __future__ import annotations

import json
import os
import socket

from sqlalchemy import select

from engine.serving import process_tree
from storage.db.schema import workers


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists here (a process of another user counts as alive)."""
    if pid is None or int(pid) <= 0:
        return True  # unknown: let the heartbeat decide
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def host_identity() -> str:
    """What a worker registers as its host: the host name, plus the PID namespace where there is one (Linux),
    so that a process id is only ever checked in the namespace it belongs to (a container sharing the host
    name, e.g. with --network host, is another host here)."""
    host = socket.gethostname()
    try:
        return f"{host}#{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return host


def dead_workers(conn, cutoff) -> list[str]:
    """Registered workers that are gone: no heartbeat since `cutoff`, or (on this host) no process."""
    rows = conn.execute(select(workers.c.id, workers.c.host, workers.c.pid, workers.c.heartbeat)).all()  # typed
    here = host_identity()
    return [
        r.id for r in rows if r.heartbeat is None or r.heartbeat < cutoff or (r.host == here and not _pid_alive(r.pid))
    ]


def confirm_processes(servers=()) -> str:
    """A confirm's `processes` as this process writes it: this host, this process, and the vLLM servers it started
    ([pid, start time] each, app/vllm_server.VllmServer.tree_id)."""
    pid = os.getpid()
    return json.dumps(
        {
            "host": host_identity(),
            "pid": pid,
            "start": process_tree.start_time(pid),
            "servers": [list(s) for s in servers],
        }
    )
