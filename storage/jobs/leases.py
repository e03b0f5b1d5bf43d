"""Device leases: one timed job per physical device (`host:cuda:0`, `host:cpu`, a CPU slot `host:cpu:1`). A lease
whose holder stopped heartbeating, or is no longer registered, is taken over; liveness.heartbeat keeps a live
holder's lease fresh and liveness.unregister_worker / mark_stale drop a gone holder's.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text

from storage.db.schema import utcnow
from storage.db.store import Store


def acquire_lease(
    store: Store, device: str, worker_id: str, experiment_id: int | None, stale_seconds: float
) -> str | None:
    """Take the device's timing lease (one timed job per device). None when this worker holds it now, else
    the id of the live worker holding it. A lease whose holder stopped heartbeating is taken over."""
    now = utcnow()
    cutoff = now - timedelta(seconds=stale_seconds)
    with store.write() as conn:
        conn.execute(
            text(
                "DELETE FROM device_leases WHERE device = :d AND (heartbeat < :cutoff "
                "OR worker_id NOT IN (SELECT id FROM workers))"
            ),
            {"d": device, "cutoff": cutoff},
        )
        holder = conn.execute(text("SELECT worker_id FROM device_leases WHERE device = :d"), {"d": device}).scalar()
        if holder is not None and holder != worker_id:
            conn.execute(text("UPDATE workers SET waiting_for = :d WHERE id = :w"), {"d": device, "w": worker_id})
            return holder
        if holder is None:
            conn.execute(
                text(
                    "INSERT INTO device_leases (device, worker_id, experiment_id, acquired, heartbeat) "
                    "VALUES (:d, :w, :eid, :now, :now)"
                ),
                {"d": device, "w": worker_id, "eid": experiment_id, "now": now},
            )
        else:
            conn.execute(
                text("UPDATE device_leases SET experiment_id = :eid, heartbeat = :now WHERE device = :d"),
                {"d": device, "eid": experiment_id, "now": now},
            )
        conn.execute(text("UPDATE workers SET waiting_for = NULL WHERE id = :w"), {"w": worker_id})
    return None


def release_lease(store: Store, device: str, worker_id: str) -> None:
    with store.write() as conn:
        conn.execute(
            text("DELETE FROM device_leases WHERE device = :d AND worker_id = :w"), {"d": device, "w": worker_id}
        )
