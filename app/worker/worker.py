"""The background worker: the queue loop and its lifecycle. It claims queued runs and executes them, writing every
prompt as it finishes; `python -m app.worker.worker_process` (app/worker/worker_process.py) is the process that runs
one.

Its parts live next to it: app/worker/timing.py times an experiment's runs (the timing protocol),
app/runtime/model_cache.py holds the loaded pair, app/runtime/placement.py places a job and takes its device leases,
app/runtime/db_retry.py retries database calls, app/training/training.py runs a training job, app/serving/confirm_job.py
a confirm; each gets a JobContext (app/runtime/job_context.py), never the Worker itself.

One worker holds one target/draft pair and reuses it across runs that need the same models. A heartbeat
thread keeps `workers.heartbeat` / `runs.heartbeat` fresh while the main thread generates; on start the
worker marks runs of dead workers `interrupted` (no heartbeat for $DRAFTLAB_STALE_SECONDS, or a process gone on
this host). Any error in a run fails that run with a one-line message and the worker goes on with the queue.

A database that stops accepting writes (disk full, read-only file, server restarting) does not kill it: the
failed write is retried with backoff (one log line per outage) and a prompt's results wait in memory until
the database takes them. Past $DRAFTLAB_DB_RETRY_SECONDS (default 300) of outage it gives up on the runs it
holds: they end `failed` with the reason as soon as the database accepts writes again (or, if the worker
exits first, `interrupted` by the next sweep), and `--until-idle` / `draftlab run` end with DatabaseUnavailable.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable

from app.db_errors import DatabaseUnavailable, db_reason, transient_db_error
from app.runtime.db_retry import DbRetry, db_retry_window
from app.runtime.job_context import JobContext, ProgressHook
from app.runtime.model_cache import ModelCache, SetupError
from app.runtime.placement import acquire_leases, lease_devices, lease_key, place, release_device_lease
from app.worker.sweep import sweep
from app.worker.timing import LOST, primary_draft, run_label, time_group
from app.worker.timing import record as record_rows
from engine.models import placement
from engine.models.loading import ModelPair, load_pair
from engine.wording import plural
from storage import Store
from storage.db.schema import DONE, FAILED, INTERRUPTED
from storage.db.settings import stale_window
from storage.jobs import liveness, run_state, training
from storage.jobs.experiments import get_experiment
from storage.serving import confirm_jobs


class Worker:
    def __init__(
        self,
        store: Store,
        worker_id: str | None = None,
        heartbeat_seconds: float = 5.0,
        stale_seconds: float | None = None,
        poll_seconds: float = 2.0,
        progress_seconds: float = 0.5,
        progress_hook: ProgressHook | None = None,
        log: Callable[[str], None] | None = None,
        loader: Callable[..., ModelPair] = load_pair,
        db_retry_seconds: float | None = None,
        device: str | None = None,
        train_jobs: bool = True,
        free_memory: Callable[[], list[int]] | None = None,
    ):
        self.store = store
        self.train_jobs = train_jobs  # also run training jobs and confirms (draftlab run's foreground worker does not)
        self.trained: list[int] = []  # training jobs this worker ran
        self.confirmed: list[int] = []  # confirms (vLLM in the loop) this worker ran
        self.device = device  # pinned (cuda:N / cpu:N or a + group, see place()); None: each experiment's own
        # Free bytes per GPU this worker sees, for placement plans (tests give fake figures to cpu:0+cpu:1 groups).
        self.free_memory = free_memory or placement.free_gpu_memory
        self._plans: dict[tuple, int] = {}  # (target, draft, dtype, trust) -> GPUs its plan took
        self._gpus = None  # this job's plan: a GPU count, the DraftLabError saying none fits, or no plan
        self.leased: list[str] = []  # the physical devices this job's leases are for, index order
        suffix = f"@{device}" if device else ""  # the dashboard's Workers view reads the device from the id
        self.id = (
            worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"[: 80 - len(suffix)] + suffix
        )
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_seconds = stale_window(stale_seconds)  # $DRAFTLAB_STALE_SECONDS unless given
        self.db_retry_seconds = db_retry_window(db_retry_seconds)  # $DRAFTLAB_DB_RETRY_SECONDS unless given
        self.poll_seconds = poll_seconds
        self.progress_seconds = progress_seconds
        self.progress_hook = progress_hook
        self.log = log or (lambda message: print(f"worker: {message}", file=sys.stderr, flush=True))
        self.models = ModelCache(loader, lambda message: self.log(message), device)
        self.db = DbRetry(self.db_retry_seconds, lambda message: self.log(message))
        self.current_run: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._live_progress: dict[int, float] = {}  # run id -> 0..1 while it generates
        self._group: list[int] = []  # the runs being timed together
        self._cancelled: set[int] = set()  # runs of the group whose cancel was requested
        # Runs whose end (status, error, detail, peak MB) the database did not take yet: written when it does.
        self.unfinished: dict[int, tuple] = {}
        self._last_heartbeat_error = ""

    # --- the end of a run, written when the database takes it ----------------------------------------------

    def _finish(
        self, run_id: int, status: str, error: str | None, detail: str | None, peak: float | None, label: str
    ) -> None:
        """Write a run's end state (while this worker still owns it); when the database refuses it for good,
        keep it in `unfinished` to write once the database accepts writes again."""
        try:
            broken = self.db.retry(run_state.not_lossless, self.store, run_id, write=False) if status == DONE else None
            if broken:  # greedy outputs that differ from the baseline's: never judged, scheduled or deployed
                status, error = FAILED, broken
            closed = self.db.retry(run_state.finish_run, self.store, run_id, status, error, detail, peak, self.id)
        except DatabaseUnavailable:
            self.unfinished[run_id] = (status, error, detail, peak)
            self.log(
                f"{label} {status}" + (f": {error}" if error else "") + " (to be written when the database "
                "accepts writes again)"
            )
            return
        if closed:
            self.log(f"{label} {status}" + (f": {error}" if error else ""))
        else:
            self.log(f"{label} is no longer this worker's (swept as stale and taken over); left as it is")

    def flush_unfinished(self) -> bool:
        """Write the end states the database refused before (one attempt each); True when none is left."""
        for run_id, (status, error, detail, peak) in list(self.unfinished.items()):
            try:
                run_state.finish_run(self.store, run_id, status, error, detail, peak, self.id)
            except Exception as exc:  # noqa: BLE001 - still refused: try again later
                if not transient_db_error(exc):
                    self.log(f"run {run_id}: could not write its end ({db_reason(exc)})")
                break
            del self.unfinished[run_id]
            self.db.ok()
            self.log(f"run {run_id}: its end ({status}) is written now that the database accepts writes")
        return not self.unfinished

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> list[int]:
        """Register, start heartbeating, and mark runs of dead workers `interrupted` (returned)."""
        self.db.retry(liveness.register_worker, self.store, self.id, liveness.host_identity(), os.getpid())
        interrupted = self._sweep()
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat_loop, name="draftlab-heartbeat", daemon=True)
        self._beat.start()
        return interrupted

    def _sweep(self) -> list[int]:
        interrupted = self.db.retry(sweep, self.store, self.stale_seconds)
        for run_id in interrupted:
            self.log(
                f"run {run_id}: its worker is gone (process ended or no heartbeat for {self.stale_seconds:g}s); "
                f"marked interrupted"
            )
        return interrupted

    def stop(self) -> None:
        """Stop heartbeating, write what the database refused before, unregister. Never raises for a database
        that is down: a worker it cannot unregister is swept as dead by the next worker, resume or list."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            self.flush_unfinished()
            liveness.unregister_worker(self.store, self.id)
        except Exception as exc:  # noqa: BLE001
            if not transient_db_error(exc):
                raise
            self.log(f"could not unregister ({db_reason(exc)}); the next sweep takes this worker for gone")

    def _heartbeat_loop(self) -> None:
        """Heartbeats (worker, its runs, its device lease), the running runs' progress and their cancel flags:
        written from this thread so no database I/O happens inside a timed generation. A database that refuses
        them is one log line per outage (shared with the main thread), not one per beat."""
        last_beat = time.monotonic()
        reported: dict[int, object] = {}
        while not self._stop.wait(min(self.progress_seconds, self.heartbeat_seconds)):
            try:
                wrote = False
                for run_id, value in list(self._live_progress.items()):
                    if reported.get(run_id) != value:
                        if run_state.report_progress(self.store, run_id, value):
                            self._cancelled.add(run_id)
                        reported[run_id] = value
                        wrote = True
                group = list(self._group)
                if group:
                    self._cancelled.update(run_state.cancel_requested(self.store, group))
                if time.monotonic() - last_beat >= self.heartbeat_seconds:
                    liveness.heartbeat(self.store, self.id, self.current_run, group)
                    last_beat, wrote = time.monotonic(), True
                if wrote:
                    self.db.ok()
            except Exception as exc:  # noqa: BLE001 - a locked or unreachable database must not kill the worker
                if transient_db_error(exc):
                    self.db.failed(exc)
                else:
                    message = (
                        f"heartbeat failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
                    )
                    if message != self._last_heartbeat_error:
                        self.log(message)
                        self._last_heartbeat_error = message

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- the queue ---------------------------------------------------------------------------------------

    def work(self, until_idle: bool = False, experiment_id: int | None = None) -> list[int]:
        """Execute queued runs (only experiment_id's, if given); return the ids executed. Without
        until_idle, poll forever, waiting out database outages; with it, a database that stays unwritable past
        the retry bound ends the call with DatabaseUnavailable. An experiment's queued runs are claimed together
        and timed prompt-major under this machine's device lease (one timed job per device)."""
        executed = []
        last_sweep, waiting_on = time.monotonic(), None
        while not self._stop.is_set():
            try:
                if self.unfinished:
                    self.flush_unfinished()
                prefer = self.loaded.key[-1] if self.loaded else None
                eid = self.db.retry(
                    run_state.next_experiment,
                    self.store,
                    self.id,
                    experiment_id=experiment_id,
                    prefer_experiment=prefer,
                    write=False,
                )
                job = None  # a training job, once no experiment waits (timed experiments are short; jobs long)
                if eid is None and experiment_id is None and self.train_jobs:
                    confirm = self.db.retry(confirm_jobs.next_confirm, self.store, write=False)
                    if confirm is not None:  # a confirm, before training: it is minutes, a training job hours
                        waiting_on = self.run_confirm(confirm, waiting_on)
                        continue
                    job = self.db.retry(training.next_job, self.store, write=False)
                if eid is None and job is None:
                    if until_idle:
                        break
                    if time.monotonic() - last_sweep > self.stale_seconds:  # another worker may have died since
                        self._sweep()
                        last_sweep = time.monotonic()
                    time.sleep(self.poll_seconds)
                    continue
                item = (
                    self.db.retry(get_experiment, self.store, eid, write=False)
                    if job is None
                    else self.db.retry(training.get_job, self.store, job, write=False)
                )
                placed = place(item["device"], self.device)
                if job is None:
                    devices, self._gpus = self._lease_devices(
                        placed, item["target"], primary_draft(item, []), item["dtype"], bool(item["trust_remote_code"])
                    )
                else:  # training loads in float32 (app/training/training.py); a head job loads the target alone
                    from app.training.training_kinds import kind_of

                    devices, self._gpus = self._lease_devices(
                        placed, item["target"], kind_of(item).draft, "float32", False
                    )
                keys = [lease_key(d) for d in devices]
                what = f"experiment {eid}" if job is None else f"training job {job}"
                held = acquire_leases(self.db, self.store, keys, self.id, eid, self.stale_seconds)
                if isinstance(held, tuple):
                    key, holder = held
                    if waiting_on != held:
                        self.log(f"{what} waits for {key}: worker {holder} is using it")
                        waiting_on = held
                    time.sleep(self.poll_seconds)
                    continue
                waiting_on, self.leased = None, devices
                try:
                    if job is not None:
                        if self.db.retry(training.claim_job, self.store, job, self.id):
                            self.trained.append(job)
                            run_training(self, job)
                        continue
                    run_ids = self.db.retry(run_state.claim_group, self.store, eid, self.id)
                    if run_ids:
                        executed += run_ids
                        self.execute_group(eid, run_ids)
                finally:
                    self.leased, self._gpus = [], None
                    for key in reversed(keys):
                        release_device_lease(self.store, key, self.id)
            except DatabaseUnavailable as exc:
                self.db.give_up(exc)
                if until_idle:
                    raise
                time.sleep(self.poll_seconds)
        return executed

    def run_confirm(self, confirm_id: int, waiting_on):
        """Run a queued confirm under the lease of its experiment's device (vLLM's servers load the target there, and
        a timed experiment beside them would time the servers' load); returns what the loop waits on (a lease held
        by another worker), None once run."""
        from app.serving.confirm_job import execute

        job = self.db.retry(confirm_jobs.get_confirm, self.store, confirm_id, write=False)
        experiment = self.db.retry(get_experiment, self.store, int(job["experiment_id"]), write=False)
        keys = [lease_key(place(experiment["device"], self.device))]
        held = acquire_leases(self.db, self.store, keys, self.id, int(job["experiment_id"]), self.stale_seconds)
        if isinstance(held, tuple):
            if waiting_on != held:
                self.log(f"confirm {confirm_id} waits for {held[0]}: worker {held[1]} is using it")
            time.sleep(self.poll_seconds)
            return held
        try:
            if self.db.retry(confirm_jobs.claim_confirm, self.store, confirm_id, self.id):
                self.confirmed.append(confirm_id)
                execute(self.job_context(), confirm_id)
        finally:
            for key in reversed(keys):
                release_device_lease(self.store, key, self.id)
        return None

    def _lease_devices(self, placed: str, target: str, draft: str | None, dtype: str, trust: bool):
        return lease_devices(
            placed,
            target,
            draft,
            dtype,
            trust,
            loaded=self.models.loaded,
            release=self.models.release,
            plans=self._plans,
            free_memory=self.free_memory,
        )

    def execute_group(self, experiment_id: int, run_ids: list[int]) -> dict[int, str]:
        """Execute claimed runs of one experiment together, prompt-major (timing protocol v2), each to its end
        state (done / failed / cancelled); return {run id: state}. A database that stays unwritable past the
        retry bound fails the runs with the reason (written once it accepts writes: see `unfinished`) and
        raises DatabaseUnavailable."""
        outcome: dict[int, tuple[str, str | None, str | None]] = {}  # run id -> (status, error, detail)
        self._group, self._cancelled = list(run_ids), set()
        self.current_run = run_ids[0]
        group: dict[int, dict] = {}
        memory: dict[int, float] = {}
        experiment = None
        db_failure = None
        try:
            experiment = self.db.retry(get_experiment, self.store, experiment_id, write=False)
            group = {rid: self.db.retry(run_state.get_run, self.store, rid, write=False) for rid in run_ids}
            self.db.retry(liveness.heartbeat, self.store, self.id, self.current_run, run_ids)
            sizes = sorted({int(r["batch_size"]) for r in group.values() if r.get("batch_size") is not None})
            self.log(
                f"experiment {experiment_id}: timing {plural(len(run_ids), 'run')} prompt-major, "
                f"{plural(experiment['repeats'] or 1, 'repeat')} each"
                + (f", at batch size {', '.join(map(str, sizes))}" if sizes else "")
            )
            time_group(self.job_context(), experiment, group, outcome, memory)
        except SetupError as exc:
            for rid in run_ids:
                outcome.setdefault(rid, (FAILED, str(exc), traceback.format_exc()))
            try:
                self.db.retry(run_state.fail_queued_runs, self.store, experiment_id, str(exc))
            except DatabaseUnavailable as unavailable:
                db_failure = unavailable
        except DatabaseUnavailable as exc:
            db_failure = exc
            self.db.give_up(exc)
            reason = (
                f"{exc}; its unsaved prompt was dropped, every committed one is kept; `draftlab resume "
                f"{experiment_id}` continues from the first unfinished prompt"
            )
            for rid in run_ids:
                outcome.setdefault(rid, (FAILED, reason, None))
        except (KeyboardInterrupt, SystemExit):
            for rid in run_ids:  # one attempt each: if the database refuses, the dead-worker sweep takes over
                status, error, detail = outcome.get(
                    rid, (INTERRUPTED, "the worker was stopped; resume the run to continue", None)
                )
                if status == LOST:
                    continue
                try:
                    run_state.finish_run(self.store, rid, status, error, detail, memory.get(rid), self.id)
                except Exception as exc:  # noqa: BLE001
                    if not transient_db_error(exc):
                        raise
            self.current_run, self._group = None, []
            raise
        except Exception as exc:  # a bug or an environment problem: record it, keep serving the queue
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            for rid in run_ids:
                outcome.setdefault(rid, (FAILED, f"{type(exc).__name__}: {first}", traceback.format_exc()))
        states = {}
        for rid in run_ids:
            status, error, detail = outcome.get(rid, (DONE, None, None))
            states[rid] = status
            label = run_label(group[rid]) if rid in group else f"run {rid}"
            if status == LOST:
                self.log(f"{label} is no longer this worker's (swept as stale and taken over); dropped")
                continue
            self._finish(rid, status, error, detail, memory.get(rid), label)
        self.current_run, self._group = None, []
        if db_failure is not None:
            raise db_failure
        if experiment is not None and experiment["k_auto"] and experiment["predicted_curve"] is None:
            from app.autok import plan_confirmation

            try:  # one attempt: it writes in several transactions, a blind retry could queue its runs twice
                planned = plan_confirmation(self.store, experiment_id)
            except Exception as exc:  # noqa: BLE001
                if not transient_db_error(exc):
                    raise
                self.log(f"experiment {experiment_id}: could not plan the k confirmation ({db_reason(exc)})")
                planned = None
            if planned:
                self.log(f"experiment {experiment_id}: predicted curve made; confirming k = {planned}")
        return states

    # --- jobs ------------------------------------------------------------------------------------------------

    def job_context(self) -> JobContext:
        """What the current job may use of this worker (see app/runtime/job_context.py)."""
        return JobContext(
            self.store,
            self.id,
            self.db,
            self.log,
            self.models,
            device=self.device,
            leased=list(self.leased),
            gpus=self._gpus,
            progress_hook=self.progress_hook,
            live_progress=self._live_progress,
            cancelled=self._cancelled,
            record=self.record,
        )

    def record(self, conn, run: dict, result, repeats: list, slots: list[int], typer) -> None:
        """Write one timed prompt's rows of a run (median result, every repeat, their slots) in `conn`'s transaction."""
        record_rows(conn, run, result, repeats, slots, typer)

    @property
    def loaded(self):
        """The pair this worker holds (app/model_cache.LoadedPair), or None."""
        return self.models.loaded

    def adopt(self, pair: ModelPair, experiment: dict, others: dict | None = None) -> None:
        """Use already loaded pairs for this experiment's runs (the CLI loads them first to report bad input):
        `pair` with the first draft, `others` {draft name or None: pair} for the rest of a draft sweep."""
        self.models.adopt(pair, experiment, others)


def run_training(worker: Worker, job_id: int) -> str:
    from app.training.training import execute

    return execute(worker.job_context(), job_id)
