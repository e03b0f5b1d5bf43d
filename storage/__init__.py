"""Storage: SQLAlchemy schema, SQL queries and the run queue (experiments, run_state, liveness, leases). Never imports
torch or streamlit."""

from storage.db.store import Store, open_store, resolve_url

__all__ = ["Store", "open_store", "resolve_url"]
