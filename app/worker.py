"""The background worker: claims queued runs and executes them, writing every prompt as it finishes.

    python -m app.worker --db sqlite:///draftlab.db      (what `draftlab worker` runs)

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

import argparse
import os
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Callable

import torch

from engine.errors import DraftLabError, RunCancelled
from engine.drafter_specs import needs_draft_model
from engine import placement
from engine.loading import ModelPair, load_pair, plan_pair, resolve_dtype, with_draft
from engine.chat import render
from engine.prompt_sets import load_prompts
from engine.records import PromptResult
from engine.memory import model_bytes
from engine.profile import verify_profile
from engine.protocol import median_repeat, schedule
from engine.runs import WARMUP_TOKENS, baseline_decoder, encode_prompts, speculative_decoder
from engine.sampling import SamplingConfig
from engine.token_types import TokenTyper
from engine.wording import plural
from storage import Store, liveness, open_store, run_state, training
from storage.errors import QueueError
from storage.experiments import (get_experiment, load_experiment_prompts, load_verify_profile, store_prompts,
                                 store_verify_profile)
from storage.leases import acquire_lease, release_lease
from storage.settings import DEFAULT_STALE_SECONDS, STALE_ENV, STALE_HELP, seconds_setting, stale_window

from .db_errors import DatabaseUnavailable, db_reason, outage_kind, transient_db_error
from .placement import device_name, gpus_of, group_members, lease_key, load_device, pin_cuda, place
from storage.recording import clear_from, record_prompt
from storage.schema import BASELINE, CANCELLED, DONE, FAILED, INTERRUPTED

ProgressHook = Callable[[dict, int, int, int], None]  # (run row, prompt index, new tokens so far, repeat)

DB_RETRY_ENV, DEFAULT_DB_RETRY_SECONDS = "DRAFTLAB_DB_RETRY_SECONDS", 300.0
MAX_BACKOFF_SECONDS = 5.0
_LOST = "lost"  # a run this worker no longer owns (swept as stale and taken over): nothing of it is written


def db_retry_window(value: float | None = None) -> float:
    """How long a worker retries a failed database write: `value`, else $DRAFTLAB_DB_RETRY_SECONDS, else 300."""
    return seconds_setting(DB_RETRY_ENV, DEFAULT_DB_RETRY_SECONDS, value, allow_zero=True)


class SetupError(Exception):
    """A failure every run of the experiment would hit (models, prompts): fail them all, not one by one."""


@dataclass
class _Loaded:
    key: tuple
    pair: ModelPair
    typer: TokenTyper
    encoded: dict = field(default_factory=dict)  # (experiment_id, max_new_tokens) -> prompt ids
    others: dict = field(default_factory=dict)  # draft name (None: no draft model) -> a pair on the same target


def _reset_peak(pair: ModelPair, decoder) -> None:
    for gpu in gpus_of(pair):
        torch.cuda.reset_peak_memory_stats(gpu)
    decoder.reset_peak_cache_bytes()


def _peak_mb(pair: ModelPair, decoder) -> float:
    """One decode's peak memory: torch's peak allocation on CUDA, summed over the GPUs the pair is on (reset
    before each decode, so runs of an experiment do not inherit each other's peaks); on CPU, where RSS cannot be
    reset, the bytes of the models the arm uses plus its peak KV caches."""
    if pair.device.type == "cuda":
        return sum(torch.cuda.max_memory_allocated(gpu) for gpu in gpus_of(pair)) / 2**20
    return arm_memory_bytes(pair, decoder) / 2**20


def arm_memory_bytes(pair: ModelPair, decoder) -> int:
    """Parameters and buffers of the target (and of the draft when the arm drafts with it), plus the peak
    KV-cache bytes of the decode."""
    models = [pair.target.model]
    drafter_lm = getattr(getattr(decoder, "drafter", None), "lm", None)
    if drafter_lm is not None:
        models.append(drafter_lm.model)
    return sum(model_bytes(m) for m in models) + decoder.peak_cache_bytes()


def _draft_parameters(decoder) -> int | None:
    """Parameters of the draft model a decoder drafts with (None: a baseline, or a drafter with no model)."""
    lm = getattr(getattr(decoder, "drafter", None), "lm", None)
    return sum(p.numel() for p in lm.model.parameters()) if lm is not None else None


def _drafter_of(run: dict, experiment: dict) -> str:
    return run.get("drafter") or experiment.get("drafter") or "model"


def _draft_of(run: dict, experiment: dict) -> str | None:
    """The run's draft model; runs stored before drafts were recorded per run use the experiment's."""
    return run.get("draft") or (experiment["draft"] if run.get("drafter") is None else None)


def _primary_draft(experiment: dict, runs) -> str | None:
    """The draft loaded with the target: the first speculative run's that needs one (None if none does)."""
    for run in runs:
        if run["kind"] != BASELINE and needs_draft_model(_drafter_of(run, experiment)):
            return _draft_of(run, experiment)
    if experiment.get("sweep_variable") == "draft" or not experiment.get("draft"):
        return None
    return experiment["draft"] if needs_draft_model(experiment.get("drafter") or "model") else None


def _label(run: dict) -> str:
    return f"run {run['id']} ({run['kind']}" + (f", k={run['k']})" if run["k"] else ")")


class Worker:
    def __init__(self, store: Store, worker_id: str | None = None, heartbeat_seconds: float = 5.0,
                 stale_seconds: float | None = None, poll_seconds: float = 2.0, progress_seconds: float = 0.5,
                 progress_hook: ProgressHook | None = None, log: Callable[[str], None] | None = None,
                 loader: Callable[..., ModelPair] = load_pair, db_retry_seconds: float | None = None,
                 device: str | None = None, train_jobs: bool = True,
                 free_memory: Callable[[], list[int]] | None = None):
        self.store = store
        self.train_jobs = train_jobs  # also run training jobs (draftlab run's foreground worker does not)
        self.trained: list[int] = []  # training jobs this worker ran
        self.device = device  # pinned (cuda:N / cpu:N or a + group, see place()); None: each experiment's own
        # Free bytes per GPU this worker sees, for placement plans (tests give fake figures to cpu:0+cpu:1 groups).
        self.free_memory = free_memory or placement.free_gpu_memory
        self._plans: dict[tuple, int] = {}  # (target, draft, dtype, trust) -> GPUs its plan took
        self._gpus: int | DraftLabError | None = None  # this job's plan: a GPU count, why none fits, or no plan
        self.leased: list[str] = []  # the physical devices this job's leases are for, index order
        suffix = f"@{device}" if device else ""  # the dashboard's Workers view reads the device from the id
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"[:80 - len(suffix)] + suffix
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_seconds = stale_window(stale_seconds)  # $DRAFTLAB_STALE_SECONDS unless given
        self.db_retry_seconds = db_retry_window(db_retry_seconds)  # $DRAFTLAB_DB_RETRY_SECONDS unless given
        self.poll_seconds = poll_seconds
        self.progress_seconds = progress_seconds
        self.progress_hook = progress_hook
        self.log = log or (lambda message: print(f"worker: {message}", file=sys.stderr, flush=True))
        self.loader = loader
        self.loaded: _Loaded | None = None
        self.current_run: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._live_progress: dict[int, float] = {}  # run id -> 0..1 while it generates
        self._group: list[int] = []  # the runs being timed together
        self._cancelled: set[int] = set()  # runs of the group whose cancel was requested
        # Runs whose end (status, error, detail, peak MB) the database did not take yet: written when it does.
        self.unfinished: dict[int, tuple] = {}
        self._outage_lock = threading.Lock()
        self._outage_since: float | None = None  # monotonic time of the current outage's first failed write
        self._gave_up = False  # this outage already passed the retry bound (logged once)
        self._last_heartbeat_error = ""

    # --- the database, retried -----------------------------------------------------------------------------

    def _db_failed(self, exc: BaseException) -> float:
        """Note a refused write or connection; the first of an outage is logged. Returns the outage's start."""
        with self._outage_lock:
            first = self._outage_since is None
            if first:
                self._outage_since = time.monotonic()
            since = self._outage_since
        if first:
            self.log(f"the database does not accept writes ({outage_kind(exc) or 'error'}: {db_reason(exc)}); retrying with backoff for up to "
                     f"{self.db_retry_seconds:g}s, finished prompts held in memory until it does")
        return since

    def _db_ok(self) -> None:
        """A write went through: end the outage, if any (logged)."""
        with self._outage_lock:
            since, self._outage_since, self._gave_up = self._outage_since, None, False
        if since is not None:
            self.log(f"the database accepts writes again (after {time.monotonic() - since:.1f}s)")

    def _db(self, fn: Callable, *args, write: bool = True, **kwargs):
        """fn(*args, **kwargs), retried with exponential backoff (0.1 s doubling to 5 s) while the database refuses
        it (transient errors only), until db_retry_seconds after the start of the outage (so once a worker gave
        up, every call fails at once until a write gets through); then DatabaseUnavailable. fn runs whole
        transactions, so a retry never sees half of a failed one."""
        delay, deadline = 0.1, None
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - filtered just below
                if not transient_db_error(exc):
                    raise
                since = self._db_failed(exc)
                if deadline is None:  # fixed at the first failure: a heartbeat that gets through does not extend it
                    deadline = since + self.db_retry_seconds
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DatabaseUnavailable(f"the database did not accept writes for {self.db_retry_seconds:g}s "
                                              f"({db_reason(exc)})") from exc
                time.sleep(min(delay, left))
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
                continue
            if write:
                self._db_ok()
            return result

    def _give_up(self, exc: DatabaseUnavailable) -> None:
        with self._outage_lock:
            first, self._gave_up = not self._gave_up, True
        if first:
            self.log(f"giving up: {exc}")

    def _finish(self, run_id: int, status: str, error: str | None, detail: str | None, peak: float | None,
                label: str) -> None:
        """Write a run's end state (while this worker still owns it); when the database refuses it for good,
        keep it in `unfinished` to write once the database accepts writes again."""
        try:
            closed = self._db(run_state.finish_run, self.store, run_id, status, error, detail, peak, self.id)
        except DatabaseUnavailable:
            self.unfinished[run_id] = (status, error, detail, peak)
            self.log(f"{label} {status}" + (f": {error}" if error else "") + " (to be written when the database "
                     "accepts writes again)")
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
            self._db_ok()
            self.log(f"run {run_id}: its end ({status}) is written now that the database accepts writes")
        return not self.unfinished

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> list[int]:
        """Register, start heartbeating, and mark runs of dead workers `interrupted` (returned)."""
        self._db(liveness.register_worker, self.store, self.id, liveness.host_identity(), os.getpid())
        interrupted = self._sweep()
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat_loop, name="draftlab-heartbeat", daemon=True)
        self._beat.start()
        return interrupted

    def _sweep(self) -> list[int]:
        interrupted = self._db(liveness.mark_stale, self.store, self.stale_seconds)
        for run_id in interrupted:
            self.log(f"run {run_id}: its worker is gone (process ended or no heartbeat for {self.stale_seconds:g}s); "
                     f"marked interrupted")
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
        last_beat, reported = time.monotonic(), {}
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
                    self._db_ok()
            except Exception as exc:  # noqa: BLE001 - a locked or unreachable database must not kill the worker
                if transient_db_error(exc):
                    self._db_failed(exc)
                else:
                    message = f"heartbeat failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})"
                    if message != self._last_heartbeat_error:
                        self.log(message)
                        self._last_heartbeat_error = message

    def __enter__(self) -> "Worker":
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
                eid = self._db(run_state.next_experiment, self.store, self.id, experiment_id=experiment_id,
                               prefer_experiment=prefer, write=False)
                job = None  # a training job, once no experiment waits (timed experiments are short; jobs long)
                if eid is None and experiment_id is None and self.train_jobs:
                    job = self._db(training.next_job, self.store, write=False)
                if eid is None and job is None:
                    if until_idle:
                        break
                    if time.monotonic() - last_sweep > self.stale_seconds:  # another worker may have died since
                        self._sweep()
                        last_sweep = time.monotonic()
                    time.sleep(self.poll_seconds)
                    continue
                item = (self._db(get_experiment, self.store, eid, write=False) if job is None else
                        self._db(training.get_job, self.store, job, write=False))
                placed = place(item["device"], self.device)
                if job is None:
                    devices = self._lease_devices(placed, item["target"], _primary_draft(item, []), item["dtype"],
                                                  bool(item["trust_remote_code"]))
                else:  # training loads in float32 (app/training.py)
                    devices = self._lease_devices(placed, item["target"], item["draft"], "float32", False)
                keys = [lease_key(d) for d in devices]
                what = f"experiment {eid}" if job is None else f"training job {job}"
                held = self._acquire_leases(keys, eid)
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
                        if self._db(training.claim_job, self.store, job, self.id):
                            self.trained.append(job)
                            run_training(self, job)
                        continue
                    run_ids = self._db(run_state.claim_group, self.store, eid, self.id)
                    if run_ids:
                        executed += run_ids
                        self.execute_group(eid, run_ids)
                finally:
                    self.leased, self._gpus = [], None
                    for key in reversed(keys):
                        self._release_lease(key)
            except DatabaseUnavailable as exc:
                self._give_up(exc)
                if until_idle:
                    raise
                time.sleep(self.poll_seconds)
        return executed

    def _lease_devices(self, placed: str, target: str, draft: str | None, dtype: str, trust: bool) -> list[str]:
        """The devices a job placed on `placed` leases, physical names in index order: that one device, or, where
        the worker sees several GPUs (a `cuda:0+cuda:1` group, or plain `draftlab worker` on auto), the fewest of
        them the pair fits (engine.placement: config-only, before any lease; a cpu:0+cpu:1 group is the fake
        equivalent, planned on `free_memory`). Sets self._gpus for the load: the count, or the DraftLabError
        saying the pair fits none (the job then fails with it under its first device's lease)."""
        self._gpus = None
        if "+" in placed:
            visible = group_members(placed)
        elif placed == "auto" and torch.cuda.is_available():
            visible = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        else:
            visible = []
        if len(visible) < 2:
            return [visible[0] if visible else placed]
        on_gpu = visible[0].startswith("cuda")
        loaded = self.loaded
        if on_gpu and loaded is not None and (loaded.key[0], *loaded.key[2:5]) == (target, load_device(placed),
                                                                                   dtype, trust):
            used = [d.index or 0 for d in gpus_of(loaded.pair)]  # already loaded here (draftlab run adopts it)
            self._gpus = len(used)
            return [visible[i] for i in used]
        plan_key = (target, draft, dtype, trust)
        if plan_key not in self._plans:
            if on_gpu:
                self._release()  # this worker's own loaded pair is not free memory, but it is about to go
            free = self.free_memory()
            if not free:
                return visible[:1]
            try:
                dt = resolve_dtype(dtype, torch.device("cuda" if on_gpu else "cpu"))
                self._plans[plan_key] = plan_pair(target, draft, dt, trust, free=free[:len(visible)]).gpus
            except DraftLabError as exc:
                self._gpus = exc
                return visible[:1]
        self._gpus = self._plans[plan_key]
        return visible[:self._gpus]

    def _acquire_leases(self, keys: list[str], experiment_id: int | None) -> None | tuple[str, str]:
        """Take every lease in `keys` (index order) or none: on the first held by another live worker, give back
        those taken here and return (that lease, its holder); None when all are this worker's."""
        taken = []
        for key in keys:
            holder = self._db(acquire_lease, self.store, key, self.id, experiment_id, self.stale_seconds)
            if holder is not None:
                for mine in reversed(taken):
                    self._release_lease(mine)
                return key, holder
            taken.append(key)
        return None

    def _release_lease(self, device: str) -> None:
        try:  # one attempt: a lease left behind ends with this worker (unregister, or the next sweep)
            release_lease(self.store, device, self.id)
        except Exception as exc:  # noqa: BLE001
            if not transient_db_error(exc):
                raise

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
            experiment = self._db(get_experiment, self.store, experiment_id, write=False)
            group = {rid: self._db(run_state.get_run, self.store, rid, write=False) for rid in run_ids}
            self._db(liveness.heartbeat, self.store, self.id, self.current_run, run_ids)
            self.log(f"experiment {experiment_id}: timing {plural(len(run_ids), 'run')} prompt-major, "
                     f"{plural(experiment['repeats'] or 1, 'repeat')} each")
            self._time_group(experiment, group, outcome, memory)
        except SetupError as exc:
            for rid in run_ids:
                outcome.setdefault(rid, (FAILED, str(exc), traceback.format_exc()))
            try:
                self._db(run_state.fail_queued_runs, self.store, experiment_id, str(exc))
            except DatabaseUnavailable as unavailable:
                db_failure = unavailable
        except DatabaseUnavailable as exc:
            db_failure = exc
            self._give_up(exc)
            reason = (f"{exc}; its unsaved prompt was dropped, every committed one is kept; `draftlab resume "
                      f"{experiment_id}` continues from the first unfinished prompt")
            for rid in run_ids:
                outcome.setdefault(rid, (FAILED, reason, None))
        except (KeyboardInterrupt, SystemExit):
            for rid in run_ids:  # one attempt each: if the database refuses, the dead-worker sweep takes over
                status, error, detail = outcome.get(
                    rid, (INTERRUPTED, "the worker was stopped; resume the run to continue", None))
                if status == _LOST:
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
            label = _label(group[rid]) if rid in group else f"run {rid}"
            if status == _LOST:
                self.log(f"{label} is no longer this worker's (swept as stale and taken over); dropped")
                continue
            self._finish(rid, status, error, detail, memory.get(rid), label)
        self.current_run, self._group = None, []
        if db_failure is not None:
            raise db_failure
        if experiment["k_auto"] and experiment["predicted_curve"] is None:
            from .autok import plan_confirmation

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

    # --- one timed group -----------------------------------------------------------------------------------

    def _time_group(self, experiment: dict, group: dict[int, dict], outcome: dict, memory: dict) -> None:
        loaded = self._pair(experiment, _primary_draft(experiment, group.values()))
        prompts = self._prompts(experiment, loaded.pair.tokenizer)
        repeats = int(experiment["repeats"] or 1)
        decoders, budgets = {}, {}
        for rid, run in group.items():
            cfg = SamplingConfig(run["temperature"], run["top_k"], run["top_p"], run["seed"], run["max_new_tokens"])
            encoded_key = (experiment["id"], cfg.max_new_tokens)
            if encoded_key not in loaded.encoded:
                try:
                    loaded.encoded[encoded_key] = encode_prompts(loaded.pair, prompts, cfg.max_new_tokens)
                except DraftLabError as exc:
                    raise SetupError(str(exc)) from exc
            try:
                if run["kind"] == BASELINE:
                    decoders[rid] = baseline_decoder(loaded.pair, cfg)
                else:
                    drafter = _drafter_of(run, experiment)
                    pair = self._pair_for(loaded, _draft_of(run, experiment) if needs_draft_model(drafter) else None,
                                          experiment)
                    decoders[rid] = speculative_decoder(pair, cfg, run["k"], loaded.typer, drafter=drafter)
            except DraftLabError as exc:
                outcome[rid] = (FAILED, str(exc), None)
                continue
            budgets[rid] = (loaded.encoded[encoded_key], cfg.max_new_tokens)
        start = {rid: group[rid]["prompts_done"] or 0 for rid in decoders}  # resume: first unfinished prompt

        def prepare():
            with self.store.write() as conn:
                for rid in decoders:
                    clear_from(conn, rid, start[rid])
            for rid in decoders:
                run_state.start_run(self.store, rid, len(prompts), device_name(loaded.pair.device, self.device,
                                                                            self.leased),
                                draft_parameters=_draft_parameters(decoders[rid]))
        self._db(prepare)
        if experiment["k_auto"] and decoders:
            self._profile_verify(experiment, loaded, next(iter(budgets.values()))[0][0])

        total = len(prompts)
        active = list(decoders)
        warmed: set[int] = set()
        for i in range(min(start.values(), default=total), total):
            arms = [rid for rid in active if rid not in outcome and start[rid] <= i]
            if not any(rid not in outcome for rid in active):
                break
            timed: dict[int, list] = {rid: [] for rid in arms}
            slots: dict[int, list] = {rid: [] for rid in arms}
            for slot, (repeat, rid) in enumerate(schedule(arms, i, repeats)):
                if rid in outcome:
                    continue
                prompt_ids, budget = budgets[rid]
                try:
                    if rid not in warmed:  # one untimed warm-up per arm (SPEC timing protocol)
                        decoders[rid].generate(prompts[i], prompt_ids[i], i, max_new_tokens=min(WARMUP_TOKENS, budget))
                        warmed.add(rid)
                    on_progress = self._progress_callback(group[rid], i, repeat, repeats, total, budget)
                    _reset_peak(loaded.pair, decoders[rid])
                    timed[rid].append(decoders[rid].generate(prompts[i], prompt_ids[i], i, on_progress=on_progress))
                    memory[rid] = max(memory.get(rid, 0.0), _peak_mb(loaded.pair, decoders[rid]))
                    slots[rid].append(slot)
                except RunCancelled:
                    outcome[rid] = (CANCELLED, None, None)
                except torch.cuda.OutOfMemoryError:
                    outcome[rid] = (FAILED, f"CUDA out of memory in {_label(group[rid])}; lower max-new-tokens, use "
                                            f"dtype bfloat16/float16 or a smaller model", traceback.format_exc())
                    torch.cuda.empty_cache()
                except DraftLabError as exc:
                    outcome[rid] = (FAILED, str(exc), traceback.format_exc())
                finally:
                    self._live_progress.pop(rid, None)
            finished = [rid for rid in arms if rid not in outcome and len(timed[rid]) == repeats]

            def commit(i=i, finished=finished, timed=timed, slots=slots):
                # One transaction per prompt: every arm's rows, or none. Only runs this worker still owns are
                # written, and a prompt already committed (a commit whose answer was lost) is not written again,
                # so the retry of a failed commit never duplicates a row.
                with self.store.write() as conn:
                    owned = run_state.fence(conn, finished, self.id)
                    stored = run_state.committed_prompts(conn, list(owned), i)
                    for rid in finished:
                        if rid in owned and rid not in stored:
                            self._record(conn, group[rid], median_repeat(timed[rid]), timed[rid], slots[rid],
                                         loaded.typer)
                    return owned
            owned = self._db(commit)  # a refused write is retried; the results wait here meanwhile
            for rid in finished:
                if rid not in owned:
                    outcome[rid] = (_LOST, None, None)
                elif owned[rid] or rid in self._cancelled:
                    outcome[rid] = (CANCELLED, None, None)

    def _progress_callback(self, run: dict, prompt_index: int, repeat: int, repeats: int, total: int, budget: int):
        def on_progress(tokens: int) -> None:
            # Inside the timed generation: memory only; the heartbeat thread writes it and reads cancels.
            if self.progress_hook is not None:
                self.progress_hook(run, prompt_index, tokens, repeat)
            done = prompt_index + (repeat + min(tokens, budget) / budget) / repeats
            self._live_progress[run["id"]] = done / total
            if run["id"] in self._cancelled:
                raise RunCancelled(f"run {run['id']} cancelled")
        return on_progress

    def _profile_verify(self, experiment: dict, loaded: "_Loaded", prompt_ids: torch.Tensor) -> None:
        """`--k auto`: the target's verify-cost profile, once per experiment, under the device lease."""
        if self._db(load_verify_profile, self.store, experiment["id"], write=False):
            return
        n_max = int(experiment["k_auto"]) + 1
        cfg = SamplingConfig(experiment["temperature"], experiment["top_k"], experiment["top_p"], experiment["seed"],
                             experiment["max_new_tokens"])
        profile = verify_profile(loaded.pair.target.model, loaded.pair.vocab_size, prompt_ids, n_max, cfg)
        self._db(store_verify_profile, self.store, experiment["id"], profile)

    def _record(self, conn, run: dict, result: PromptResult, repeats: list[PromptResult], slots: list[int],
                typer: TokenTyper) -> None:
        texts = [typer.describe(int(t))[0] for t in result.output_ids]
        record_prompt(conn, run["id"], run["kind"], result, texts, repeats=repeats, slots=slots)

    def _prompts(self, experiment: dict, tokenizer) -> list[str]:
        """The experiment's frozen prompt texts; the first run freezes them: its prompt spec loaded, conversations
        rendered by the target tokenizer's chat template (engine/chat.py), so what is stored is what the models see."""
        def load_stored():
            with self.store.read() as conn:
                return load_experiment_prompts(conn, experiment["id"])
        stored = self._db(load_stored, write=False)
        if stored is not None:
            return stored
        try:
            prompts = render(load_prompts(experiment["prompts"]), tokenizer, experiment.get("chat_template") or "auto")
        except DraftLabError as exc:
            raise SetupError(str(exc)) from exc
        if not prompts:
            raise SetupError(f"prompt set {experiment['prompts']!r} has no prompts; add some or pick another set")
        return self._db(store_prompts, self.store, experiment["id"], prompts)

    def _pair_for(self, loaded: _Loaded, draft: str | None, experiment: dict) -> ModelPair:
        """The loaded target with `draft` (another candidate of a draft sweep, or None for drafters that need
        no model), loaded once and pair-checked."""
        if draft == loaded.key[1]:
            return loaded.pair
        if draft not in loaded.others:
            self.log(f"loading draft {draft}" if draft else "drafting without a draft model")
            try:
                loaded.others[draft] = with_draft(loaded.pair, draft, bool(experiment["trust_remote_code"]))
            except torch.cuda.OutOfMemoryError as exc:
                raise DraftLabError(f"CUDA out of memory loading draft {draft}; use dtype bfloat16/float16 or a "
                                    f"smaller draft") from exc
        return loaded.others[draft]

    def _pair(self, experiment: dict, draft: str | None = None) -> _Loaded:
        draft = draft if draft is not None else experiment["draft"]
        device = load_device(place(experiment["device"], self.device))
        key = (experiment["target"], draft, device, experiment["dtype"], bool(experiment["trust_remote_code"]))
        if self.loaded is not None and self.loaded.key[:-1] == key:
            self.loaded.key = key + (experiment["id"],)
            return self.loaded
        if isinstance(self._gpus, DraftLabError):  # the placement plan found no set of GPUs that holds the pair
            raise SetupError(str(self._gpus))
        self._release()
        self.log(f"loading {experiment['target']}" + (f" + {draft}" if draft else "") +
                 (f" over {self._gpus} GPUs" if isinstance(self._gpus, int) and self._gpus > 1 else ""))
        # The GPU count the leases were taken for (a plan made on this worker's several GPUs), so the load matches.
        spread = {"gpus": self._gpus} if isinstance(self._gpus, int) and device == "auto" else {}
        try:
            pair = self.loader(experiment["target"], draft, device, experiment["dtype"],
                               bool(experiment["trust_remote_code"]), **spread)
        except DraftLabError as exc:
            raise SetupError(str(exc)) from exc
        except torch.cuda.OutOfMemoryError as exc:
            raise SetupError(f"CUDA out of memory loading {experiment['target']} + {draft}; use dtype "
                             f"bfloat16/float16, smaller models, or more GPUs (`draftlab worker --devices "
                             f"cuda:0+cuda:1`, or plain `draftlab worker`, which sees them all)") from exc
        self.loaded = _Loaded(key + (experiment["id"],), pair, TokenTyper(pair.tokenizer))
        return self.loaded

    def adopt(self, pair: ModelPair, experiment: dict, others: dict | None = None) -> None:
        """Use already loaded pairs for this experiment's runs (the CLI loads them first to report bad input):
        `pair` with the first draft, `others` {draft name or None: pair} for the rest of a draft sweep."""
        draft = pair.draft.name if pair.draft is not None else None
        key = (experiment["target"], draft, experiment["device"], experiment["dtype"],
               bool(experiment["trust_remote_code"]))
        self.loaded = _Loaded(key + (experiment["id"],), pair, TokenTyper(pair.tokenizer), others=dict(others or {}))

    def _release(self) -> None:
        if self.loaded is not None:
            device = self.loaded.pair.device
            self.loaded = None
            if device.type == "cuda":
                torch.cuda.empty_cache()


def run_training(worker: "Worker", job_id: int) -> str:
    from app.training import execute

    return execute(worker, job_id)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftlab worker", description="Execute queued DraftLab runs.",
                                     epilog=f"{STALE_HELP}. {DB_RETRY_HELP}.")
    parser.add_argument("--db", default=None)
    parser.add_argument("--until-idle", action="store_true", help="exit when no queued run is left")
    parser.add_argument("--heartbeat", type=float, default=5.0, help="heartbeat interval, seconds")
    parser.add_argument("--stale", type=float, default=None,
                        help=f"heartbeat age that marks a run interrupted (default ${STALE_ENV} or "
                             f"{DEFAULT_STALE_SECONDS:g})")
    parser.add_argument("--poll", type=float, default=2.0, help="queue poll interval when idle, seconds")
    parser.add_argument("--device", default=None, help="pin to cuda:N or cpu:N, or a group cuda:0+cuda:1 (what "
                        "`draftlab worker --devices` starts one worker per); experiments on auto/cuda run there")
    parser.add_argument("--worker-id", default=None, help=argparse.SUPPRESS)  # given by app/supervisor.py
    args = parser.parse_args(argv)
    pin_cuda(args.device)
    return run_worker(args.db, until_idle=args.until_idle, heartbeat_seconds=args.heartbeat,
                      stale_seconds=args.stale, poll_seconds=args.poll, device=args.device, worker_id=args.worker_id)


DB_RETRY_HELP = ("A database write that fails (disk full, read-only file, server restarting) is retried with backoff "
                 "for $DRAFTLAB_DB_RETRY_SECONDS seconds (default 300), the results held in memory, before the runs "
                 "fail with the reason")  # the same words as app/cli.py's (which must not import torch)


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
        print(f"error: {exc} on {store.safe_url}; runs it held show as failed, or as interrupted once the "
              f"database accepts writes; `draftlab resume EXPERIMENT` requeues them", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
