"""A cheap stamp of the stored server cost profiles: what the dashboard caches a run's server prediction on, beside
the experiment's own version (storage/records/experiment_version.py, which reads only `runs`)."""

from __future__ import annotations

from sqlalchemy import text

from storage.db.store import Store

_VERSION = text(
    """
    SELECT COUNT(*) AS ended, MAX(id) AS newest FROM server_confirms
    WHERE status IN ('done', 'failed', 'interrupted')"""
)


def profiles_version(store: Store) -> tuple[int, int]:
    """(how many confirms have ended, the newest ended one's id): every ended confirm is a profile (a `draftlab
    profile`, or a confirm's ks), so this moves whenever the profiles a run can be predicted from may have."""
    with store.read() as conn:
        row = conn.execute(_VERSION).one()
    return int(row.ended), int(row.newest or 0)
