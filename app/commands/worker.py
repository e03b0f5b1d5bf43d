"""`draftlab worker`: run queued runs (app/worker/worker_process.py), one process per device with --devices
(app/worker/supervisor.py)."""

from __future__ import annotations

import sys

from app.commands.common import database_errors_reported, open_store_or_fail
from app.db_errors import scrub
from app.runtime.db_retry import DB_RETRY_HELP
from storage.db.settings import STALE_HELP

NAME = "worker"


def add_parser(sub):
    p = sub.add_parser(NAME, help="run queued runs", description=f"Run queued runs. {STALE_HELP}. {DB_RETRY_HELP}.")
    p.add_argument("--db", default=None)
    p.add_argument("--until-idle", action="store_true", help="exit when no queued run is left")
    p.add_argument(
        "--devices",
        default=None,
        help="one worker process per device: `all` (every CUDA GPU; one CPU worker without one) or "
        "a comma list of cuda:N / cpu:N (cpu:N: CPU slots with leases of their own), or groups "
        "cuda:0+cuda:1 (one worker owning both, for targets larger than one GPU). Each child "
        "sees only its GPU (CUDA_VISIBLE_DEVICES) and holds that device's lease; a child that "
        "dies is restarted with backoff and its runs requeued; SIGTERM / Ctrl-C stops them all, "
        "their runs interrupted. Without it: one worker, each experiment on its own device",
    )
    return p


def run(args) -> int:
    return database_errors_reported(_worker, args)


def _worker(args) -> int:
    from app.worker.worker_process import run_worker

    store = open_store_or_fail(args.db, write=True, create=True)  # the worker registers itself: it writes
    if isinstance(store, int):
        return store
    url = store.url
    store.dispose()
    if args.devices is not None:
        from app.worker.supervisor import DevicesError, parse_devices, run_supervisor

        try:
            devices = parse_devices(args.devices)
        except DevicesError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 2
        if devices != ["cpu"]:
            return run_supervisor(
                url,
                devices,
                until_idle=args.until_idle,
                log=lambda m: print(f"supervisor: {scrub(str(m), url)}", file=sys.stderr, flush=True),
            )
    return run_worker(url, until_idle=args.until_idle, log=_worker_log(url))


def _worker_log(url: str):
    """The worker's stderr log line, with the database password hidden in every message."""
    return lambda message: print(f"worker: {scrub(str(message), url)}", file=sys.stderr, flush=True)
