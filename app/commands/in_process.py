"""The in-process worker of `draftlab run` and `draftlab validate`: the experiment is enqueued reserved for a worker
living in this process, which times its runs here (app/worker/worker.py, the code path every worker runs) with a
progress bar, and the stored figures are printed. Ctrl-C and SIGTERM close the runs as interrupted; a database that
fails for good is one `error:` line saying what is stored and how to continue."""

from __future__ import annotations

import json
import sys

from app.commands.common import DB_FIX, EXIT_RUN_FAILED, fail
from app.db_errors import db_error_reason, scrub
from engine.wording import noun


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the runs are closed as interrupted and the command says how to resume."""


def _raise_terminated(signum, frame):
    raise Terminated()


def run_here(args, store, pair, others, prompts, enqueue: dict, arms: int, report=None) -> int:
    """A run once its input is checked: enqueue, time the runs here, print the stored figures (`report(store,
    experiment_id, as_json)` instead of the run's table or JSON document). A database that fails for good, Ctrl-C
    and SIGTERM each end in one `error:` line that says what is stored and how to continue (password hidden),
    never a traceback."""
    import shlex
    import signal
    import threading

    from sqlalchemy.exc import SQLAlchemyError

    from app.commands.progress import ProgressBar
    from app.db_errors import DatabaseUnavailable, transient_db_error
    from app.report import format_table
    from app.worker.worker import Worker
    from storage.db.errors import QueueError
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment, get_experiment
    from storage.serving.export import run_document

    url, safe = store.url, store.safe_url

    def continue_with(experiment_id):
        quoted = shlex.quote(safe)
        return f"`draftlab resume {experiment_id} --db {quoted}` and then `draftlab worker --db {quoted}`"

    progress = ProgressBar(len(prompts), enqueue["sampling"]["max_new_tokens"], arms, args.repeats)
    try:
        worker = Worker(
            store, progress_hook=progress.update, log=lambda message: progress.write(scrub(str(message), url))
        )
    except QueueError as exc:  # a bad $DRAFTLAB_STALE_SECONDS / $DRAFTLAB_DB_RETRY_SECONDS
        progress.close()
        return fail(str(exc))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    experiment_id, failure = None, None
    try:
        worker.start()  # registered before its reserved runs exist, so no other worker takes them for orphans
        from pages.widgets.access import cli_launcher

        experiment_id = enqueue_experiment(
            store, **enqueue, prompt_texts=prompts, reserved_for=worker.id, launched_by=cli_launcher()
        )
        experiment = get_experiment(store, experiment_id)
        assert experiment is not None  # enqueued just above, reserved for this worker
        worker.adopt(pair, experiment, others)
        worker.work(until_idle=True, experiment_id=experiment_id)
    except KeyboardInterrupt as exc:
        status, what = (
            (128 + signal.SIGTERM, "terminated (SIGTERM)") if isinstance(exc, Terminated) else (130, "interrupted")
        )
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        progress.close()
        if experiment_id is not None:
            try:  # one attempt; if the database refuses, the runs of this (then gone) process are swept as dead
                run_state.interrupt_queued(store, experiment_id, "`draftlab run` was stopped before this run started")
            except SQLAlchemyError:
                pass
        _stop_quietly(worker)
        if experiment_id is None:
            return fail(f"{what} before anything was stored", status)
        return fail(f"{what}; finished prompts are stored. Continue with {continue_with(experiment_id)}", status)
    except QueueError as exc:  # the queue's last check refused a value (nothing was stored)
        _stop_quietly(worker)
        progress.close()
        return fail(str(exc))
    except DatabaseUnavailable as exc:
        failure = str(exc)
    except SQLAlchemyError as exc:
        if not transient_db_error(exc):
            raise
        failure = f"the database {safe} failed ({db_error_reason(exc, url)})"
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    _stop_quietly(worker)
    progress.close()
    if failure is not None and (experiment_id is None or worker.unfinished):
        if experiment_id is None:
            return fail(f"{failure}; nothing was run. {DB_FIX}", EXIT_RUN_FAILED)
        runs = ", ".join(str(r) for r in sorted(worker.unfinished))
        return fail(
            f"{failure}; every prompt committed before is kept, and {noun(len(worker.unfinished), 'run')} "
            f"{runs} show as interrupted once "
            f"it accepts writes. Continue with {continue_with(experiment_id)}",
            EXIT_RUN_FAILED,
        )
    assert experiment_id is not None  # the try above enqueued it, or returned (failure and no experiment: above)
    try:
        doc = run_document(store, experiment_id)
    except SQLAlchemyError as exc:
        return fail(
            f"the database {safe} failed while reading experiment {experiment_id}'s results "
            f"({db_error_reason(exc, url)}); they are stored: `draftlab list --db {shlex.quote(safe)}`",
            EXIT_RUN_FAILED,
        )
    print(report(store, experiment_id, args.json) if report else json.dumps(doc) if args.json else format_table(doc))
    failed: dict[tuple, list[int]] = {}  # runs that share one status and error: one line
    for r in [doc["baseline"], *doc["runs"]]:
        if r and r.get("status") != "done":
            failed.setdefault((r["status"], r.get("error") or ""), []).append(r["run_id"])
    for (status, error), ids in failed.items():
        which = f"run {ids[0]}" if len(ids) == 1 else "runs " + ", ".join(map(str, ids))
        print(f"error: {which} {status}: {error} (stored in {safe})", file=sys.stderr)
    return EXIT_RUN_FAILED if failed else 0


def _stop_quietly(worker) -> None:
    """worker.stop(), whose only failure left is a database that refuses: the worker's log said so already (any
    other exception is a bug, and surfaces as one)."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.db_errors import DatabaseUnavailable

    try:
        worker.stop()
    except (SQLAlchemyError, DatabaseUnavailable):
        pass
