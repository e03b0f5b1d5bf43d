"""`draftlab resume`: requeue an experiment's interrupted, failed or cancelled runs."""

from __future__ import annotations

from app.arguments import ID
from app.commands.common import database_errors_reported, experiment_missing, open_store_or_fail, stale_window_or_fail
from app.worker.sweep import sweep
from engine.wording import noun, plural
from storage.db.settings import STALE_HELP

NAME = "resume"


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="requeue an experiment's interrupted, failed or cancelled runs",
        description=f"Requeue an experiment's interrupted, failed or cancelled runs. {STALE_HELP}; "
        f"resume requeues those too, in the same step.",
    )
    p.add_argument("experiment_id", type=ID)
    p.add_argument("--db", default=None)
    return p


def run(args) -> int:
    return database_errors_reported(_resume, args)


def _resume(args) -> int:
    from storage.jobs import run_state
    from storage.records import queries as q

    stale = stale_window_or_fail()
    if isinstance(stale, int):
        return stale
    store = open_store_or_fail(args.db, write=True)
    if isinstance(store, int):
        return store
    missing = experiment_missing(store, args.experiment_id)
    if missing is not None:
        return missing
    sweep(store, stale)  # a dead owner's runs (process gone here, or no heartbeat) are requeued too
    n = run_state.resume_experiment(store, args.experiment_id)
    print(
        f"requeued {plural(n, 'run')} of experiment {args.experiment_id}; a worker continues each from its first "
        f"unfinished prompt (`draftlab worker --db {store.safe_url}`)"
    )
    running = int((q.runs(store, args.experiment_id)["status"] == "running").sum())
    if running:
        print(
            f"{plural(running, 'run')} of experiment {args.experiment_id} {noun(running, 'is', 'are')} still running "
            f"on a live worker (heartbeat within {stale:g}s): left to it"
        )
    return 0
