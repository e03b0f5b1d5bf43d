"""The worker process: `draftlab worker` (app/commands/worker.py) and each child of `draftlab worker --devices`
(app/worker/supervisor.py) run this.

    python -m app.worker.worker_process --db sqlite:///draftlab.db [--until-idle] [--device cuda:1]

It opens the store, runs one Worker (app/worker/worker.py) until idle or stopped (SIGTERM and Ctrl-C close its runs as
interrupted), and ends in one `error:` line when the database stays unwritable past the retry bound.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from app.arguments import positive_number
from app.db_errors import DatabaseUnavailable
from app.runtime.db_retry import DB_RETRY_HELP
from app.runtime.placement import pin_cuda
from app.worker.worker import Worker
from storage import open_store
from storage.db.errors import QueueError
from storage.db.settings import DEFAULT_STALE_SECONDS, STALE_ENV, STALE_HELP


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="draftlab worker", description="Execute queued DraftLab runs.", epilog=f"{STALE_HELP}. {DB_RETRY_HELP}."
    )

    def one_line(message):  # one `error:` line, not argparse's usage block
        print(f"error: {message} (see `draftlab worker --help`)", file=sys.stderr)
        raise SystemExit(2)

    parser.error = one_line  # type: ignore[method-assign]  # one line instead of argparse's usage block
    parser.add_argument("--db", default=None)
    parser.add_argument("--until-idle", action="store_true", help="exit when no queued run is left")
    parser.add_argument("--heartbeat", type=positive_number, default=5.0, help="heartbeat interval, seconds")
    parser.add_argument(
        "--stale",
        type=positive_number,
        default=None,
        help=f"heartbeat age that marks a run interrupted (default ${STALE_ENV} or {DEFAULT_STALE_SECONDS:g})",
    )
    parser.add_argument("--poll", type=positive_number, default=2.0, help="queue poll interval when idle, seconds")
    parser.add_argument(
        "--device",
        default=None,
        help="pin to cuda:N or cpu:N, or a group cuda:0+cuda:1 (what "
        "`draftlab worker --devices` starts one worker per); experiments on auto/cuda run there",
    )
    parser.add_argument("--worker-id", default=None, help=argparse.SUPPRESS)  # given by app/worker/supervisor.py
    args = parser.parse_args(argv)
    pin_cuda(args.device)
    return run_worker(
        args.db,
        until_idle=args.until_idle,
        heartbeat_seconds=args.heartbeat,
        stale_seconds=args.stale,
        poll_seconds=args.poll,
        device=args.device,
        worker_id=args.worker_id,
    )


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through Worker.execute_group, which marks the runs interrupted


def run_worker(db: str | None, until_idle: bool = False, **options) -> int:
    """`draftlab worker`: 0 when done (or idle with --until-idle), 130 on Ctrl-C, 1 after one `error:` line when
    the database stayed unwritable past the retry bound (--until-idle only; without it the worker waits)."""
    store = open_store(db)
    try:
        worker = Worker(store, **options)
    except QueueError as exc:  # a bad $DRAFTLAB_STALE_SECONDS / $DRAFTLAB_DB_RETRY_SECONDS
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    worker.log(f"{worker.id} serving {store.safe_url}")
    try:
        with worker:
            worker.work(until_idle=until_idle)
    except KeyboardInterrupt:
        return 130
    except DatabaseUnavailable as exc:
        print(
            f"error: {exc} on {store.safe_url}; runs it held show as failed, or as interrupted once the "
            f"database accepts writes; `draftlab resume EXPERIMENT` requeues them",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
