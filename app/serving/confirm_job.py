"""A worker's confirm job ("Confirm in vLLM" on the experiment detail page): a queued confirm
(storage/serving/confirm_jobs.py) run by app/serving/confirm.py's one measuring loop, exactly as `draftlab confirm` runs
it. A queued server cost profile ("Server cost profile", configs = "profile") is run exactly as `draftlab profile`
runs it: its run's drafter at each of its ks (app/serving/profile.py's profile_configs) through the same loop.

The worker starts the servers with its own vLLM command ($DRAFTLAB_VLLM, else .vllm-venv's CPU build: never a
command typed into the dashboard, which would run anything on the worker's machine). Its loaded pair is freed
first: both servers load the target. The phase and the requests done reach the dashboard about once a second from
a reporter thread, in writes fenced to this worker; a confirm swept as stale and taken over ends here untouched.
"""

from __future__ import annotations

import threading
import traceback

from app.db_errors import DatabaseUnavailable
from app.runtime.job_context import JobContext
from app.serving.confirm import Config, measure, plan
from app.serving.profile import DEFAULT_KS, profile_configs
from engine.errors import DraftLabError
from storage.db.schema import DONE, FAILED
from storage.records.confirms import finish_confirm
from storage.serving import confirm_jobs

REPORT_SECONDS = 1.0  # the panel's progress bar moves this often


class _Lost(KeyboardInterrupt):
    """The confirm is no longer this worker's (swept as stale): stop measuring, store nothing more."""


class JobProgress:
    """app/confirm.measure's progress as fenced database writes: the phase when it changes, the requests done from a
    thread every REPORT_SECONDS (requests end on the load threads, which must never wait on the database)."""

    def __init__(self, job_ctx: JobContext, confirm_id: int, total: int):
        self.job_ctx, self.confirm_id, self.total = job_ctx, confirm_id, total
        self.done, self.phase, self.lost = 0, "", False
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"confirm-{confirm_id}-progress", daemon=True)
        self._thread.start()

    def _write(self, **fields) -> None:
        try:
            owned = confirm_jobs.report_confirm(self.job_ctx.store, self.confirm_id, self.job_ctx.worker_id, **fields)
        except Exception as exc:  # noqa: BLE001 - a refused progress write is retried by the next one
            self.job_ctx.log(f"confirm {self.confirm_id}: progress not written ({type(exc).__name__})")
            return
        self.lost = self.lost or not owned

    def _loop(self) -> None:
        written = None
        while not self._stop.wait(REPORT_SECONDS):
            with self.lock:
                now = (self.phase, self.done)
            if now != written:
                self._write(phase=now[0], requests_done=now[1])
                written = now

    def describe(self, text: str) -> None:
        if self.lost:
            raise _Lost()
        with self.lock:
            self.phase = text
        self._write(phase=text, requests_done=self.done)

    def request_done(self, _record) -> None:
        with self.lock:
            self.done += 1

    def write(self, line: str) -> None:
        self.job_ctx.log(f"confirm {self.confirm_id}: {line}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _profiled(store, experiment_id: int, job: dict) -> list[Config] | None:
    """A queued profile's configurations (`draftlab profile`'s: its run's drafter at each of its ks); None for a
    confirm (its `configs` name them). DraftLabError (one line) where the run can no longer be served."""
    if job["configs"] != confirm_jobs.PROFILE:
        return None
    ks = [int(k) for k in str(job["profile_ks"]).split(",")] if job.get("profile_ks") else list(DEFAULT_KS)
    run_id = job.get("profile_run_id")
    return profile_configs(store, experiment_id, int(run_id) if run_id is not None else None, ks)


def execute(job_ctx: JobContext, confirm_id: int) -> str:
    """Run a claimed confirm to its end (done / failed, or left interrupted when stopped); return its status."""
    store = job_ctx.store
    job = job_ctx.retry(confirm_jobs.get_confirm, store, confirm_id, write=False)
    eid = int(job["experiment_id"])
    label = f"confirm {confirm_id} (experiment {eid}, {job['configs']})"
    try:
        confirm = plan(
            store,
            eid,
            job["configs"],
            concurrency=[int(c) for c in str(job["concurrency"]).split(",")],
            repeats=int(job["repeats"]),
            chosen=_profiled(store, eid, job),
        )
    except DraftLabError as exc:  # the experiment changed since it was queued (runs deleted, ...)
        finish_confirm(
            store, confirm_id, engine_version="", wall_seconds=0.0, errors=[str(exc)], worker_id=job_ctx.worker_id
        )
        job_ctx.log(f"{label} failed: {exc}")
        return FAILED
    job_ctx.models.release()  # both servers load the target: free this worker's pair first
    job_ctx.retry(
        confirm_jobs.report_confirm,
        store,
        confirm_id,
        job_ctx.worker_id,
        requests_total=confirm.requests,
        requests_done=0,
    )
    job_ctx.log(
        f"{label}: {len(confirm.configs)} configuration(s) at concurrency "
        f"{', '.join(map(str, confirm.concurrency))}, {confirm.repeats} pass(es) each, with "
        f"`{confirm.command_line}`"
    )
    progress = JobProgress(job_ctx, confirm_id, confirm.requests)
    try:
        errors = measure(store, confirm_id, confirm, progress, worker_id=job_ctx.worker_id)
    except _Lost:
        job_ctx.log(f"{label} is no longer this worker's (swept as stale and taken over); left as it is")
        return "lost"
    except (KeyboardInterrupt, SystemExit):
        job_ctx.log(f"{label} interrupted: the worker was stopped")
        raise
    except DatabaseUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug or an environment problem: record it, keep serving the queue
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        finish_confirm(
            store,
            confirm_id,
            engine_version="",
            wall_seconds=0.0,
            errors=[f"{type(exc).__name__}: {first}"],
            worker_id=job_ctx.worker_id,
        )
        job_ctx.log(f"{label} failed: {type(exc).__name__}: {first}\n{traceback.format_exc()}")
        return FAILED
    finally:
        progress.close()
    status = FAILED if errors else DONE
    job_ctx.log(f"{label} {status}" + (f": {'; '.join(errors)}" if errors else ""))
    return status
