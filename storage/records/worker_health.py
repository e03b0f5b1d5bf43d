"""The workers and devices as the dashboard lists them, one row per worker or per device.
worker_health: each registered worker's state and what it times, with the queue's counts; device_leases: who
times on which device, and who waits for it.
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import select, text

from storage.db import schema
from storage.db.store import Store
from storage.records.frames import F, _frame, _nullable_int


def device_leases(store: Store, max_age_seconds: float = 30) -> pd.DataFrame:
    """Who times on which device (one timed job per device): a row per device that is leased or waited for, and per
    worker waiting for it. device; worker_id, experiment_id, acquired, heartbeat: the lease's holder, what it
    times, since when, its last beat (NULL when nobody holds the device); waiting_worker: a worker whose
    `waiting_for` names the device (NULL when none waits). Waiting workers silent for max_age_seconds are left out."""
    sql = """
    WITH devices AS (SELECT device FROM device_leases
                     UNION SELECT waiting_for FROM workers WHERE waiting_for IS NOT NULL AND heartbeat >= :cutoff)
    SELECT d.device, l.worker_id, l.experiment_id, l.acquired, l.heartbeat, w.id AS waiting_worker
    FROM devices d
    LEFT JOIN device_leases l ON l.device = d.device
    LEFT JOIN workers w ON w.waiting_for = d.device AND w.heartbeat >= :cutoff
    ORDER BY d.device, w.id"""
    from datetime import timedelta

    from storage.db.schema import utcnow

    with store.read() as conn:
        df = _frame(conn, sql, {"cutoff": utcnow() - timedelta(seconds=max_age_seconds)})
    df["acquired"] = pd.to_datetime(df["acquired"], format="ISO8601")
    _nullable_int(df, "experiment_id")
    return df


WORKER_HEALTH_COLUMNS = [
    "worker_id",
    "host",
    "pid",
    "device",
    "status",
    "experiment_id",
    "runs",
    "progress",
    "waiting_for",
    "heartbeat_age_s",
    "started",
]


def worker_health(store: Store, stale_seconds: float | None = None) -> dict:
    """The workers' state for the dashboard. Returns {"workers": DataFrame, "queued_runs", "queued_experiments",
    "running_runs": int}; one row per registered worker (WORKER_HEALTH_COLUMNS): device: its pinned device
    (`...@cuda:1`, see `draftlab worker --devices`), else the lease it holds, else None; status: stale (no
    heartbeat for the stale window, or its process gone on this host: the next sweep takes its runs for
    interrupted), timing (runs in progress), training (job N) (a Train-a-draft job), waiting (for a device lease)
    or idle; experiment_id, runs,
    progress: what it times (the mean progress of its running runs); heartbeat_age_s: seconds since its last beat."""
    from datetime import timedelta

    from storage.db.schema import utcnow
    from storage.db.settings import stale_window
    from storage.records import workers as liveness

    seconds = stale_window(stale_seconds)
    now = utcnow()
    with store.read() as conn:
        rows = conn.execute(select(schema.workers)).mappings().all()
        dead = set(liveness.dead_workers(conn, now - timedelta(seconds=seconds)))
        leases: dict[str, str] = dict(conn.execute(text("SELECT worker_id, device FROM device_leases")).all())
        running = (
            conn.execute(
                text(f"""SELECT worker_id, MIN(experiment_id) AS experiment_id, COUNT(*) AS runs,
                                               AVG(CAST(progress AS {F})) AS progress
                                        FROM runs WHERE status = 'running' GROUP BY worker_id""")
            )
            .mappings()
            .all()
        )
        queued = conn.execute(
            text("SELECT COUNT(*), COUNT(DISTINCT experiment_id) FROM runs WHERE status = 'queued'")
        ).one()
        training: dict[str, int] = dict(
            conn.execute(
                text("SELECT worker_id, MIN(id) FROM training_jobs WHERE status = 'running' GROUP BY worker_id")
            ).all()
        )
        queued_jobs = conn.execute(text("SELECT COUNT(*) FROM training_jobs WHERE status = 'queued'")).scalar()
    busy = {r["worker_id"]: r for r in running}
    out = []
    for w in sorted(rows, key=lambda r: r["id"]):
        timing = busy.get(w["id"])
        device = w["id"].rsplit("@", 1)[1] if "@" in w["id"] else None
        lease = leases.get(w["id"])
        job = training.get(w["id"])
        status = (
            "stale"
            if w["id"] in dead
            else "timing"
            if timing
            else f"training (job {job})"
            if job is not None
            else "waiting"
            if w["waiting_for"]
            else "idle"
        )
        out.append(
            {
                "worker_id": w["id"],
                "host": (w["host"] or "").split("#")[0],
                "pid": w["pid"],
                "device": device or (lease.split(":", 1)[1] if lease and ":" in lease else lease),
                "status": status,
                "experiment_id": timing["experiment_id"] if timing else None,
                "runs": int(timing["runs"]) if timing else 0,
                "progress": float(timing["progress"]) if timing and timing["progress"] is not None else None,
                "waiting_for": w["waiting_for"],
                "heartbeat_age_s": (now - w["heartbeat"]).total_seconds() if w["heartbeat"] else None,
                "started": w["started"],
            }
        )
    frame = pd.DataFrame(out, columns=WORKER_HEALTH_COLUMNS)
    _nullable_int(frame, "experiment_id")
    return {
        "workers": frame,
        "queued_runs": int(queued[0]),
        "queued_experiments": int(queued[1]),
        "queued_training_jobs": int(queued_jobs or 0),
        "running_runs": sum(int(r["runs"]) for r in running),
    }
