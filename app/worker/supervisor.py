"""`draftlab worker --devices cuda:0,cuda:1 | all`: one worker process per device under one command.

Each child is `python -m app.worker.worker_process --device D` (the database URL travels in $DRAFTLAB_DB, not on a
command line other users can read):

- pinned: a child for cuda:N runs with CUDA_VISIBLE_DEVICES=N, so it sees that GPU alone (no stray CUDA context
  on GPU 0) and loads on "cuda"; it keeps the physical name cuda:N for its device lease (`host:cuda:N`), its
  worker id (`...@cuda:N`) and runs.device_name. Experiments on device auto/cuda run on the child's GPU; one
  that asks for the CPU runs on the CPU under the host's `host:cpu` lease. `cpu:N` names a CPU slot (its own
  lease `host:cpu:N`), for machines without a GPU and for the tests.
- grouped: `cuda:0+cuda:1` is one child that sees both GPUs (CUDA_VISIBLE_DEVICES=0,1) and places a target over
  as many of them as it needs, leasing each (app/runtime/placement.py `lease_devices`); `cpu:0+cpu:1` is the fake
  equivalent for the tests.
- restarted: a child that dies (crash, OOM killer, SIGKILL) is logged and restarted after a backoff (1 s,
  doubling to 60 s, back to 1 s once a child has lived 60 s). The runs it held are swept (its process is gone,
  so at once) and requeued: the next worker continues each from its first unfinished prompt, its committed
  rows kept. A child that exits 2 (bad settings) is not restarted. With --until-idle a child that exits 0 is
  done.
- stopped: SIGTERM or Ctrl-C to the supervisor sends SIGTERM to every child (each marks its runs
  interrupted, finished prompts kept; `draftlab resume` continues them) and waits up to STOP_GRACE_SECONDS
  before SIGKILL. Exit status 143 (SIGTERM) or 130 (Ctrl-C), else 0 when every child is done.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from app.worker.sweep import sweep
from engine.serving import process_tree
from engine.wording import noun, plural

DEVICE_RE = re.compile(r"^(cuda|cpu):\d+$")
BACKOFF_START, BACKOFF_MAX, HEALTHY_SECONDS = 1.0, 60.0, 60.0
STOP_GRACE_SECONDS = 30.0


class DevicesError(ValueError):
    """A bad --devices value: the message says what to write instead."""


def gpu_count() -> int:
    """CUDA GPUs torch sees here (0 without a CUDA build or a GPU)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def parse_devices(spec: str, count: Callable[[], int] | None = None) -> list[str]:
    """`all` -> cuda:0..N-1 (one CPU worker, ["cpu"], on a machine without a GPU); else a comma list of distinct
    cuda:N / cpu:N, each item one worker; `cuda:0+cuda:1` is a group: one worker owning both GPUs (for targets
    larger than one GPU; `cpu:0+cpu:1` its fake equivalent), written back in index order. count: how many GPUs
    there are (default gpu_count)."""
    count = count or (lambda: gpu_count())
    spec = (spec or "").strip()
    if spec == "all":
        n = count()
        return [f"cuda:{i}" for i in range(n)] or ["cpu"]
    items = [[m.strip() for m in d.split("+")] for d in spec.split(",") if d.strip()]
    members = [m for item in items for m in item]
    if not items or any(not DEVICE_RE.match(m) for m in members):
        raise DevicesError(
            f"--devices takes `all` or a comma list of cuda:N / cpu:N, or groups joined with + "
            f"(got {spec!r}); e.g. --devices cuda:0,cuda:1 or cuda:0+cuda:1,cuda:2"
        )
    if len(set(members)) < len(members):
        raise DevicesError(f"--devices names a device twice ({spec!r}); each device belongs to one worker")
    mixed = [item for item in items if len({m.split(":")[0] for m in item}) > 1]
    if mixed:
        raise DevicesError(
            f"--devices group {'+'.join(mixed[0])} mixes cuda and cpu; a group is GPUs "
            f"(cuda:0+cuda:1) or CPU slots (cpu:0+cpu:1)"
        )
    gpus: int | None = None
    for m in members:
        if m.startswith("cuda:"):
            gpus = count() if gpus is None else gpus
            if int(m.split(":")[1]) >= gpus:
                raise DevicesError(
                    f"--devices {m}: torch sees {plural(gpus, 'CUDA GPU')} here; use --devices all, or cpu:N"
                )
    return ["+".join(sorted(item, key=lambda m: int(m.split(":")[1]))) for item in items]


@dataclass
class Child:
    device: str
    proc: subprocess.Popen | None = None
    worker_id: str = ""
    started: float = 0.0
    backoff: float = BACKOFF_START
    restart_at: float | None = None  # monotonic time of the next start (after a death)
    done: bool = False  # exited 0 with --until-idle, or 2 (not restarted)
    restarts: int = 0


@dataclass
class Supervisor:
    db_url: str
    devices: list[str]
    until_idle: bool = False
    worker_args: list[str] = field(default_factory=list)  # e.g. ["--heartbeat", "1", "--poll", "0.5"]
    log: Callable[[str], None] = lambda m: print(f"supervisor: {m}", file=sys.stderr, flush=True)
    poll_seconds: float = 0.2
    backoff_start: float = BACKOFF_START
    env: dict | None = None

    def __post_init__(self) -> None:
        self.children = [Child(d, backoff=self.backoff_start) for d in self.devices]
        self._stopping: int | None = None  # the signal that asked us to stop

    # --- children --------------------------------------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        env = dict(os.environ if self.env is None else self.env)
        env["DRAFTLAB_DB"] = self.db_url
        if child.device.startswith("cuda:"):  # cuda:N, or a group cuda:0+cuda:1 -> 0,1
            env["CUDA_VISIBLE_DEVICES"] = ",".join(m.split(":", 1)[1] for m in child.device.split("+"))
        child.worker_id = (
            f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"[: 80 - len(child.device) - 1] + f"@{child.device}"
        )
        argv = [
            sys.executable,
            "-m",
            "app.worker.worker_process",
            "--device",
            child.device,
            "--worker-id",
            child.worker_id,
            *(["--until-idle"] if self.until_idle else []),
            *self.worker_args,
        ]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # Its own process group: a Ctrl-C in the terminal reaches the supervisor, which stops the children itself
        # (one SIGTERM each), instead of every child seeing SIGINT at once.
        # SIGTERM when the supervisor dies, even by SIGKILL (Linux), so no worker is orphaned: it then ends its runs
        # interrupted as on any SIGTERM. Elsewhere the children outlive a killed supervisor.
        child.proc = subprocess.Popen(
            argv, env=env, start_new_session=True, preexec_fn=process_tree.parent_death_signal(signal.SIGTERM)
        )
        child.started, child.restart_at = time.monotonic(), None
        self.log(f"{child.device}: worker {child.worker_id} started (pid {child.proc.pid})")

    def _reap(self, child: Child, code: int) -> None:
        """A child ended: sweep and requeue the runs it held; plan its restart unless it is done."""
        lived = time.monotonic() - child.started
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
        requeued = self._requeue(child.worker_id)
        note = f"; its {noun(len(requeued), 'run')} {', '.join(map(str, requeued))} requeued" if requeued else ""
        child.proc = None
        if self._stopping is not None:  # died as we were asked to stop: reported and swept, not restarted
            self.log(
                f"{child.device}: worker {child.worker_id} {'ended' if code == 0 else 'died'} ({how}) after "
                f"{lived:.1f}s{note}; not restarted (stopping)"
            )
            return
        if code == 0 and self.until_idle:
            child.done = True
            self.log(f"{child.device}: worker idle, done")
            return
        if code == 2:
            child.done = True
            self.log(f"{child.device}: worker refused its settings (exit 2); not restarted{note}")
            return
        if lived >= HEALTHY_SECONDS:
            child.backoff = self.backoff_start
        child.restart_at = time.monotonic() + child.backoff
        child.restarts += 1
        self.log(
            f"{child.device}: worker {child.worker_id} died ({how}) after {lived:.1f}s{note}; "
            f"restarting in {child.backoff:g}s"
        )
        child.backoff = min(child.backoff * 2, BACKOFF_MAX)

    def _requeue(self, worker_id: str) -> list[int]:
        """Sweep (the dead child's process is gone: its runs become interrupted, its lease goes) and requeue
        the runs that child held. Best effort: a database that is down leaves them to the next sweep and
        `draftlab resume`."""
        from sqlalchemy import text

        from storage.jobs import run_state

        store = self._store()
        try:
            sweep(store)
            with store.write() as conn:
                ids = (
                    conn.execute(
                        text("SELECT id FROM runs WHERE worker_id = :w AND status = 'interrupted'"), {"w": worker_id}
                    )
                    .scalars()
                    .all()
                )
                conn.execute(text("DELETE FROM device_leases WHERE worker_id = :w"), {"w": worker_id})
                conn.execute(text("DELETE FROM workers WHERE id = :w"), {"w": worker_id})
            return [rid for rid in ids if run_state.resume_run(store, rid)]
        except Exception as exc:  # noqa: BLE001 - never let the supervisor die of a database outage
            self.log(f"could not requeue the runs of {worker_id} ({type(exc).__name__}); `draftlab resume` does")
            return []

    def _store(self):
        """One store for the supervisor's sweeps, opened at the first death (not per death: a kill is requeued
        in a few database round trips)."""
        if getattr(self, "_opened", None) is None:
            from storage import open_store

            self._opened = open_store(self.db_url)
        return self._opened

    # --- the loop --------------------------------------------------------------------------------------------

    def _on_signal(self, signum, frame) -> None:
        if self._stopping is None:
            self._stopping = signum

    def run(self) -> int:
        handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread (tests): stop() instead
                pass
        self.log(f"{plural(len(self.children), 'worker')}: {', '.join(self.devices)}")
        try:
            try:  # opened now, so the first death is swept without a connection set-up
                self._store()
            except Exception:  # noqa: BLE001 - a database down now: the children wait it out; sweeps retry
                self._opened = None
            for child in self.children:
                self._spawn(child)
            while self._stopping is None:
                for child in self.children:
                    if child.proc is not None:
                        code = child.proc.poll()
                        if code is not None:
                            self._reap(child, code)
                    elif not child.done and child.restart_at is not None and time.monotonic() >= child.restart_at:
                        self._spawn(child)
                if all(c.done for c in self.children):
                    return 0
                time.sleep(self.poll_seconds)
            return self._shutdown()
        finally:
            if getattr(self, "_opened", None) is not None:
                self._opened.dispose()
                self._opened = None
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        self._stopping = signum

    def _shutdown(self) -> int:
        signum = self._stopping
        assert signum is not None, "shutdown follows a stop signal"
        for child in self.children:  # a child that died since the last poll: its death is reported and swept too
            if child.proc is not None and (code := child.proc.poll()) is not None:
                self._reap(child, code)
        live = [(c, c.proc) for c in self.children if c.proc is not None]
        self.log(f"stopping {plural(len(live), 'worker')} ({signal.Signals(signum).name}); their runs end interrupted")
        for _, proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child, proc in live:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"{child.device}: worker did not stop in {STOP_GRACE_SECONDS:g}s; killing it")
                proc.kill()
                proc.wait()
                self._requeue_or_interrupt(child)
        return 128 + signum

    def _requeue_or_interrupt(self, child: Child) -> None:
        """A child killed at shutdown: its runs become interrupted (resumable), its lease goes."""

        try:
            sweep(self._store())
        except Exception:  # noqa: BLE001 - the next sweep does it
            pass


def run_supervisor(db_url: str, devices: list[str], until_idle: bool = False, log=None, **kwargs) -> int:
    options = {"log": log} if log is not None else {}
    return Supervisor(db_url, devices, until_idle=until_idle, **options, **kwargs).run()
