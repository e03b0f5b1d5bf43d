"""The background worker: claims queued runs and executes them, writing every prompt as it finishes.

    python -m app.worker --db sqlite:///draftlab.db      (what `draftlab worker` runs)

One worker holds one target/draft pair and reuses it across runs that need the same models. A heartbeat
thread keeps `workers.heartbeat` / `runs.heartbeat` fresh while the main thread generates; on start the
worker marks runs whose heartbeat went stale as `interrupted`. Any error in a run fails that run with a
one-line message and the worker goes on with the queue.
"""
from __future__ import annotations

import argparse
import os
import resource
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
from engine.loading import ModelPair, load_pair
from engine.prompt_sets import load_prompts
from engine.records import PromptResult
from engine.runs import baseline_decoder, encode_prompts, run_prompts, speculative_decoder
from engine.sampling import SamplingConfig
from engine.token_types import TokenTyper
from storage import Store, open_store, queue
from storage.recording import clear_from, record_prompt
from storage.schema import BASELINE, CANCELLED, DONE, FAILED, INTERRUPTED

ProgressHook = Callable[[dict, int, int], None]  # (run row, prompt index, new tokens so far)


class SetupError(Exception):
    """A failure every run of the experiment would hit (models, prompts): fail them all, not one by one."""


@dataclass
class _Loaded:
    key: tuple
    pair: ModelPair
    typer: TokenTyper
    encoded: dict = field(default_factory=dict)  # (experiment_id, max_new_tokens) -> prompt ids


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch on CUDA; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class Worker:
    def __init__(self, store: Store, worker_id: str | None = None, heartbeat_seconds: float = 5.0,
                 stale_seconds: float = 60.0, poll_seconds: float = 2.0, progress_seconds: float = 0.5,
                 progress_hook: ProgressHook | None = None, log: Callable[[str], None] | None = None,
                 loader: Callable[..., ModelPair] = load_pair):
        self.store = store
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.heartbeat_seconds = heartbeat_seconds
        self.stale_seconds = stale_seconds
        self.poll_seconds = poll_seconds
        self.progress_seconds = progress_seconds
        self.progress_hook = progress_hook
        self.log = log or (lambda message: print(f"worker: {message}", file=sys.stderr, flush=True))
        self.loader = loader
        self.loaded: _Loaded | None = None
        self.current_run: int | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._live_progress: tuple[int, float] | None = None  # (run id, 0..1) while generating
        self._cancel_requested = threading.Event()

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> list[int]:
        """Register, start heartbeating, and mark runs of dead workers `interrupted` (returned)."""
        queue.register_worker(self.store, self.id, socket.gethostname(), os.getpid())
        interrupted = queue.mark_stale(self.store, self.stale_seconds)
        for run_id in interrupted:
            self.log(f"run {run_id} had no heartbeat for {self.stale_seconds:g}s: marked interrupted")
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat_loop, name="draftlab-heartbeat", daemon=True)
        self._beat.start()
        return interrupted

    def stop(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        queue.unregister_worker(self.store, self.id)

    def _heartbeat_loop(self) -> None:
        """Heartbeats, plus the running run's progress and cancel flag: written from this thread so no
        database I/O happens inside a timed generation."""
        last_beat, reported = time.monotonic(), None
        while not self._stop.wait(min(self.progress_seconds, self.heartbeat_seconds)):
            try:
                live = self._live_progress
                if live is not None and live != reported:
                    run_id, value = live
                    if queue.report_progress(self.store, run_id, value):
                        self._cancel_requested.set()
                    reported = live
                if time.monotonic() - last_beat >= self.heartbeat_seconds:
                    queue.heartbeat(self.store, self.id, self.current_run)
                    last_beat = time.monotonic()
            except Exception as exc:  # a locked or briefly unreachable database must not kill the worker
                self.log(f"heartbeat failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")

    def __enter__(self) -> "Worker":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- the queue ---------------------------------------------------------------------------------------

    def work(self, until_idle: bool = False, experiment_id: int | None = None) -> list[int]:
        """Execute queued runs (only experiment_id's, if given); return the ids executed. Without
        until_idle, poll forever."""
        executed = []
        last_sweep = time.monotonic()
        while not self._stop.is_set():
            prefer = self.loaded.key[-1] if self.loaded else None
            run_id = queue.claim_next(self.store, self.id, experiment_id=experiment_id, prefer_experiment=prefer)
            if run_id is None:
                if until_idle:
                    break
                if time.monotonic() - last_sweep > self.stale_seconds:  # another worker may have died since
                    for stale in queue.mark_stale(self.store, self.stale_seconds):
                        self.log(f"run {stale} had no heartbeat for {self.stale_seconds:g}s: marked interrupted")
                    last_sweep = time.monotonic()
                time.sleep(self.poll_seconds)
                continue
            self.execute(run_id)
            executed.append(run_id)
        return executed

    def execute(self, run_id: int) -> str:
        """Execute one claimed run to its end state (done / failed / cancelled); return that state."""
        run = queue.get_run(self.store, run_id)
        experiment = queue.get_experiment(self.store, run["experiment_id"])
        label = f"run {run_id} ({run['kind']}" + (f", k={run['k']})" if run["k"] else ")")
        self.current_run = run_id
        queue.heartbeat(self.store, self.id, run_id)
        self.log(f"{label} of experiment {experiment['id']} started")
        try:
            self._execute(run, experiment)
            status, error, detail = DONE, None, None
        except RunCancelled:
            status, error, detail = CANCELLED, None, None
        except SetupError as exc:
            status, error, detail = FAILED, str(exc), traceback.format_exc()
            queue.fail_queued_runs(self.store, experiment["id"], str(exc))
        except torch.cuda.OutOfMemoryError:
            status, detail = FAILED, traceback.format_exc()
            error = (f"CUDA out of memory in {label}; lower max-new-tokens, use dtype bfloat16/float16 "
                     f"or a smaller model")
            self._release()
        except DraftLabError as exc:
            status, error, detail = FAILED, str(exc), traceback.format_exc()
        except (KeyboardInterrupt, SystemExit):
            queue.finish_run(self.store, run_id, INTERRUPTED, "the worker was stopped; resume the run to continue")
            self.current_run = None
            raise
        except Exception as exc:  # a bug or an environment problem: record it, keep serving the queue
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            status, error, detail = FAILED, f"{type(exc).__name__}: {first}", traceback.format_exc()
        peak = peak_memory_mb(self.loaded.pair.device) if self.loaded else None
        queue.finish_run(self.store, run_id, status, error, detail, peak)
        self.current_run = None
        self.log(f"{label} {status}" + (f": {error}" if error else ""))
        return status

    # --- one run -----------------------------------------------------------------------------------------

    def _execute(self, run: dict, experiment: dict) -> None:
        prompts = self._prompts(experiment)
        loaded = self._pair(experiment)
        cfg = SamplingConfig(run["temperature"], run["top_k"], run["top_p"], run["seed"], run["max_new_tokens"])
        encoded_key = (experiment["id"], cfg.max_new_tokens)
        if encoded_key not in loaded.encoded:
            try:
                loaded.encoded[encoded_key] = encode_prompts(loaded.pair, prompts, cfg.max_new_tokens)
            except DraftLabError as exc:
                raise SetupError(str(exc)) from exc
        prompt_ids = loaded.encoded[encoded_key]
        if run["kind"] == BASELINE:
            decoder = baseline_decoder(loaded.pair, cfg)
        else:
            decoder = speculative_decoder(loaded.pair, cfg, run["k"], loaded.typer)

        start = run["prompts_done"] or 0  # resume: the first unfinished prompt
        with self.store.write() as conn:
            clear_from(conn, run["id"], start)
        queue.start_run(self.store, run["id"], len(prompts), _device_name(loaded.pair.device))
        if loaded.pair.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(loaded.pair.device)

        total, budget = len(prompts), cfg.max_new_tokens
        self._cancel_requested.clear()

        def on_progress(prompt_index: int, tokens: int) -> None:
            # Inside the timed generation: memory only; the heartbeat thread writes it and reads cancels.
            if self.progress_hook is not None:
                self.progress_hook(run, prompt_index, tokens)
            self._live_progress = (run["id"], (prompt_index + min(tokens, budget) / budget) / total)
            if self._cancel_requested.is_set():
                raise RunCancelled(f"run {run['id']} cancelled")

        try:
            for result in run_prompts(decoder, prompts, prompt_ids, start=start, on_progress=on_progress):
                self._record(run, result, loaded.typer)  # between prompts, outside any timed generation
                if queue.report_progress(self.store, run["id"], (result.prompt_index + 1) / total):
                    raise RunCancelled(f"run {run['id']} cancelled")
        finally:
            self._live_progress = None

    def _record(self, run: dict, result: PromptResult, typer: TokenTyper) -> None:
        texts = [typer.describe(int(t))[0] for t in result.output_ids]
        with self.store.write() as conn:
            record_prompt(conn, run["id"], run["kind"], result, texts)

    def _prompts(self, experiment: dict) -> list[str]:
        with self.store.read() as conn:
            stored = queue.load_experiment_prompts(conn, experiment["id"])
        if stored is not None:
            return stored
        try:
            prompts = load_prompts(experiment["prompts"])
        except DraftLabError as exc:
            raise SetupError(str(exc)) from exc
        if not prompts:
            raise SetupError(f"prompt set {experiment['prompts']!r} has no prompts; add some or pick another set")
        return queue.store_prompts(self.store, experiment["id"], prompts)

    def _pair(self, experiment: dict) -> _Loaded:
        key = (experiment["target"], experiment["draft"], experiment["device"], experiment["dtype"],
               bool(experiment["trust_remote_code"]))
        if self.loaded is not None and self.loaded.key[:-1] == key:
            self.loaded.key = key + (experiment["id"],)
            return self.loaded
        self._release()
        self.log(f"loading {experiment['target']} + {experiment['draft']}")
        try:
            pair = self.loader(experiment["target"], experiment["draft"], experiment["device"], experiment["dtype"],
                               bool(experiment["trust_remote_code"]))
        except DraftLabError as exc:
            raise SetupError(str(exc)) from exc
        except torch.cuda.OutOfMemoryError as exc:
            raise SetupError(f"CUDA out of memory loading {experiment['target']} + {experiment['draft']}; "
                             f"use dtype bfloat16/float16 or smaller models") from exc
        self.loaded = _Loaded(key + (experiment["id"],), pair, TokenTyper(pair.tokenizer))
        return self.loaded

    def adopt(self, pair: ModelPair, experiment: dict) -> None:
        """Use an already loaded pair for this experiment's runs (the CLI loads it first to report bad input)."""
        key = (experiment["target"], experiment["draft"], experiment["device"], experiment["dtype"],
               bool(experiment["trust_remote_code"]))
        self.loaded = _Loaded(key + (experiment["id"],), pair, TokenTyper(pair.tokenizer))

    def _release(self) -> None:
        if self.loaded is not None:
            device = self.loaded.pair.device
            self.loaded = None
            if device.type == "cuda":
                torch.cuda.empty_cache()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="draftlab worker", description="Execute queued DraftLab runs.")
    parser.add_argument("--db", default=None)
    parser.add_argument("--until-idle", action="store_true", help="exit when no queued run is left")
    parser.add_argument("--heartbeat", type=float, default=5.0, help="heartbeat interval, seconds")
    parser.add_argument("--stale", type=float, default=60.0, help="heartbeat age that marks a run interrupted")
    parser.add_argument("--poll", type=float, default=2.0, help="queue poll interval when idle, seconds")
    args = parser.parse_args(argv)
    return run_worker(args.db, until_idle=args.until_idle, heartbeat_seconds=args.heartbeat,
                      stale_seconds=args.stale, poll_seconds=args.poll)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through Worker.execute, which marks the run interrupted


def run_worker(db: str | None, until_idle: bool = False, **options) -> int:
    store = open_store(db)
    worker = Worker(store, **options)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    worker.log(f"{worker.id} serving {store.url}")
    try:
        with worker:
            worker.work(until_idle=until_idle)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
