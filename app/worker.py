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
from engine.memory import model_bytes
from engine.profile import verify_profile
from engine.protocol import median_repeat, schedule
from engine.runs import WARMUP_TOKENS, baseline_decoder, encode_prompts, speculative_decoder
from engine.sampling import SamplingConfig
from engine.token_types import TokenTyper
from storage import Store, open_store, queue
from storage.recording import clear_from, record_prompt
from storage.schema import BASELINE, CANCELLED, DONE, FAILED, INTERRUPTED

ProgressHook = Callable[[dict, int, int, int], None]  # (run row, prompt index, new tokens so far, repeat)


class SetupError(Exception):
    """A failure every run of the experiment would hit (models, prompts): fail them all, not one by one."""


@dataclass
class _Loaded:
    key: tuple
    pair: ModelPair
    typer: TokenTyper
    encoded: dict = field(default_factory=dict)  # (experiment_id, max_new_tokens) -> prompt ids


def _reset_peak(pair: ModelPair, decoder) -> None:
    if pair.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(pair.device)
    decoder.reset_peak_cache_bytes()


def _peak_mb(pair: ModelPair, decoder) -> float:
    """One decode's peak memory: torch's peak allocation on CUDA (reset before each decode, so runs of an
    experiment do not inherit each other's peaks); on CPU, where RSS cannot be reset, the bytes of the
    models the arm uses plus its peak KV caches."""
    if pair.device.type == "cuda":
        return torch.cuda.max_memory_allocated(pair.device) / 2**20
    return arm_memory_bytes(pair, decoder) / 2**20


def arm_memory_bytes(pair: ModelPair, decoder) -> int:
    """Parameters and buffers of the target (and of the draft when the arm drafts with it), plus the peak
    KV-cache bytes of the decode."""
    models = [pair.target.model]
    drafter_lm = getattr(getattr(decoder, "drafter", None), "lm", None)
    if drafter_lm is not None:
        models.append(drafter_lm.model)
    return sum(model_bytes(m) for m in models) + decoder.peak_cache_bytes()


def lease_key(device: str) -> str:
    """The timing lease a job on `device` (auto / cpu / cuda / cuda:N) needs: one per physical device."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = "cuda:0"
    return f"{socket.gethostname()}:{device}"


def _label(run: dict) -> str:
    return f"run {run['id']} ({run['kind']}" + (f", k={run['k']})" if run["k"] else ")")


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
        self._live_progress: dict[int, float] = {}  # run id -> 0..1 while it generates
        self._group: list[int] = []  # the runs being timed together
        self._cancelled: set[int] = set()  # runs of the group whose cancel was requested

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
        """Heartbeats (worker, its runs, its device lease), the running runs' progress and their cancel flags:
        written from this thread so no database I/O happens inside a timed generation."""
        last_beat, reported = time.monotonic(), {}
        while not self._stop.wait(min(self.progress_seconds, self.heartbeat_seconds)):
            try:
                for run_id, value in list(self._live_progress.items()):
                    if reported.get(run_id) != value:
                        if queue.report_progress(self.store, run_id, value):
                            self._cancelled.add(run_id)
                        reported[run_id] = value
                group = list(self._group)
                if group:
                    self._cancelled.update(queue.cancel_requested(self.store, group))
                if time.monotonic() - last_beat >= self.heartbeat_seconds:
                    queue.heartbeat(self.store, self.id, self.current_run, group)
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
        until_idle, poll forever. An experiment's queued runs are claimed together and timed prompt-major
        under this machine's device lease (one timed job per device)."""
        executed = []
        last_sweep, waiting_on = time.monotonic(), None
        while not self._stop.is_set():
            prefer = self.loaded.key[-1] if self.loaded else None
            eid = queue.next_experiment(self.store, self.id, experiment_id=experiment_id, prefer_experiment=prefer)
            if eid is None:
                if until_idle:
                    break
                if time.monotonic() - last_sweep > self.stale_seconds:  # another worker may have died since
                    for stale in queue.mark_stale(self.store, self.stale_seconds):
                        self.log(f"run {stale} had no heartbeat for {self.stale_seconds:g}s: marked interrupted")
                    last_sweep = time.monotonic()
                time.sleep(self.poll_seconds)
                continue
            device = lease_key(queue.get_experiment(self.store, eid)["device"])
            holder = queue.acquire_lease(self.store, device, self.id, eid, self.stale_seconds)
            if holder is not None:
                if waiting_on != holder:
                    self.log(f"experiment {eid} waits for {device}: worker {holder} is timing on it")
                    waiting_on = holder
                time.sleep(self.poll_seconds)
                continue
            waiting_on = None
            try:
                run_ids = queue.claim_group(self.store, eid, self.id)
                if run_ids:
                    self.execute_group(eid, run_ids)
                    executed += run_ids
            finally:
                queue.release_lease(self.store, device, self.id)
        return executed

    def execute(self, run_id: int) -> str:
        """Execute one claimed run on its own (its baseline already stored); return its end state."""
        return self.execute_group(queue.get_run(self.store, run_id)["experiment_id"], [run_id])[run_id]

    def execute_group(self, experiment_id: int, run_ids: list[int]) -> dict[int, str]:
        """Execute claimed runs of one experiment together, prompt-major (timing protocol v2), each to its end
        state (done / failed / cancelled); return {run id: state}."""
        experiment = queue.get_experiment(self.store, experiment_id)
        group = {rid: queue.get_run(self.store, rid) for rid in run_ids}
        outcome: dict[int, tuple[str, str | None, str | None]] = {}  # run id -> (status, error, detail)
        self._group, self._cancelled = list(run_ids), set()
        self.current_run = run_ids[0]
        queue.heartbeat(self.store, self.id, self.current_run)
        self.log(f"experiment {experiment_id}: timing {len(run_ids)} run(s) prompt-major, "
                 f"{experiment['repeats'] or 1} repeat(s) each")
        memory: dict[int, float] = {}
        try:
            self._time_group(experiment, group, outcome, memory)
        except SetupError as exc:
            for rid in group:
                outcome.setdefault(rid, (FAILED, str(exc), traceback.format_exc()))
            queue.fail_queued_runs(self.store, experiment_id, str(exc))
        except (KeyboardInterrupt, SystemExit):
            for rid in group:
                if rid not in outcome:
                    queue.finish_run(self.store, rid, INTERRUPTED, "the worker was stopped; resume the run to continue")
            self.current_run, self._group = None, []
            raise
        except Exception as exc:  # a bug or an environment problem: record it, keep serving the queue
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            for rid in group:
                outcome.setdefault(rid, (FAILED, f"{type(exc).__name__}: {first}", traceback.format_exc()))
        states = {}
        for rid, run in group.items():
            status, error, detail = outcome.get(rid, (DONE, None, None))
            queue.finish_run(self.store, rid, status, error, detail, memory.get(rid))
            self.log(f"{_label(run)} {status}" + (f": {error}" if error else ""))
            states[rid] = status
        self.current_run, self._group = None, []
        if experiment["k_auto"] and experiment["predicted_curve"] is None:
            from .autok import plan_confirmation

            planned = plan_confirmation(self.store, experiment_id)
            if planned:
                self.log(f"experiment {experiment_id}: predicted curve made; confirming k = {planned}")
        return states

    # --- one timed group -----------------------------------------------------------------------------------

    def _time_group(self, experiment: dict, group: dict[int, dict], outcome: dict, memory: dict) -> None:
        prompts = self._prompts(experiment)
        loaded = self._pair(experiment)
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
                decoders[rid] = (baseline_decoder(loaded.pair, cfg) if run["kind"] == BASELINE
                                 else speculative_decoder(loaded.pair, cfg, run["k"], loaded.typer))
            except DraftLabError as exc:
                outcome[rid] = (FAILED, str(exc), None)
                continue
            budgets[rid] = (loaded.encoded[encoded_key], cfg.max_new_tokens)
        start = {rid: group[rid]["prompts_done"] or 0 for rid in decoders}  # resume: first unfinished prompt
        with self.store.write() as conn:
            for rid in decoders:
                clear_from(conn, rid, start[rid])
        for rid in decoders:
            queue.start_run(self.store, rid, len(prompts), _device_name(loaded.pair.device))
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
            with self.store.write() as conn:  # one transaction per prompt: every arm's rows, or none
                for rid in finished:
                    self._record(conn, group[rid], median_repeat(timed[rid]), timed[rid], slots[rid], loaded.typer)
            for rid in finished:
                if queue.report_progress(self.store, rid, (i + 1) / total) or rid in self._cancelled:
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
        if queue.load_verify_profile(self.store, experiment["id"]):
            return
        n_max = int(experiment["k_auto"]) + 1
        cfg = SamplingConfig(experiment["temperature"], experiment["top_k"], experiment["top_p"], experiment["seed"],
                             experiment["max_new_tokens"])
        profile = verify_profile(loaded.pair.target.model, loaded.pair.vocab_size, prompt_ids, n_max, cfg)
        queue.store_verify_profile(self.store, experiment["id"], profile)

    def _record(self, conn, run: dict, result: PromptResult, repeats: list[PromptResult], slots: list[int],
                typer: TokenTyper) -> None:
        texts = [typer.describe(int(t))[0] for t in result.output_ids]
        record_prompt(conn, run["id"], run["kind"], result, texts, repeats=repeats, slots=slots)

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
