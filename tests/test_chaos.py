"""Chaos on the real PostgreSQL: `draftlab worker --devices cpu:0,cpu:1,cpu:2,cpu:3` (four worker processes, each
with a lease of its own, so they time side by side as on four GPUs) drains 40 queued runs while a killer SIGKILLs
a random worker every few seconds; the supervisor restarts it and requeues its runs. Afterwards every run is
done, once: no (run, prompt), (run, prompt, round) or (run, prompt, repeat) row duplicated or missing, no lease or
worker row left behind, and the figures equal those of one worker draining the same experiments.

Claims stay the advisory-locked conditional update of storage.jobs.run_state.claim_group: this test is its evidence
under load (four claimers, restarts, sweeps and requeues racing them). The helpers serve benchmarks/bench_scale.py too.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from storage import open_store
from storage.jobs.experiments import enqueue_experiment
from tests.fault_tools import audit

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13"]
EXPERIMENTS, KS, MAX_NEW_TOKENS = 8, (1, 2, 3, 4), 12  # 8 x (baseline + 4 k) = 40 runs
WORKER_ARGS = ["--heartbeat", "0.5", "--poll", "0.3"]


def enqueue_drain(store, model_dirs, experiments=EXPERIMENTS, ks=KS, max_new_tokens=MAX_NEW_TOKENS) -> list[int]:
    """The drain: `experiments` x (baseline + one run per k), device auto (a pinned worker's own device)."""
    return [
        enqueue_experiment(
            store,
            name=f"chaos {i}",
            target=model_dirs["target"],
            draft=model_dirs["draft"],
            prompts="inline",
            sampling={"temperature": 0.0, "max_new_tokens": max_new_tokens, "seed": 3},
            device="auto",
            sweep_values=list(ks),
            prompt_texts=PROMPTS,
        )
        for i in range(experiments)
    ]


def start_supervisor(
    url: str, devices: list[str], until_idle: bool = False, backoff: float = 0.5, stderr=subprocess.PIPE
) -> subprocess.Popen:
    """The supervisor of `draftlab worker --devices ...`, with quick heartbeats and polls for the test."""
    code = (
        "import sys; from app.worker.supervisor import run_supervisor; "
        f"sys.exit(run_supervisor({url!r}, {devices!r}, until_idle={until_idle!r}, "
        f"worker_args={WORKER_ARGS!r}, backoff_start={backoff!r}))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True
    )


def counts(store) -> dict[str, int]:
    with store.read() as conn:
        return dict(conn.execute(text("SELECT status, COUNT(*) FROM runs GROUP BY status")).all())


def figures(store) -> dict:
    """(experiment name, kind, k) -> the run's deterministic figures and outputs (greedy decoding)."""
    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT r.id, e.name, r.kind, r.k, r.alpha, r.tokens_per_round, r.accepted, r.proposed, r.rounds, "
                "r.new_tokens FROM runs r JOIN experiments e ON e.id = r.experiment_id"
            )
        ).all()
        outputs: dict[int, Any] = {}
        for rid, out in conn.execute(
            text("SELECT run_id, output_ids FROM prompt_results ORDER BY run_id, prompt_index")
        ):
            outputs.setdefault(rid, []).append(json.loads(out))
    rounded = lambda v: None if v is None else round(float(v), 9)  # noqa: E731
    return {
        (r.name, r.kind, r.k): (
            rounded(r.alpha),
            rounded(r.tokens_per_round),
            r.accepted,
            r.proposed,
            r.rounds,
            r.new_tokens,
            outputs.get(r.id),
        )
        for r in rows
    }


def row_gaps(store) -> dict[str, int]:
    """Rows missing below the prompt level: (run, prompt) whose stored rounds or timed repeats are not all there."""
    with store.read() as conn:
        rounds = conn.execute(
            text(
                "SELECT COUNT(*) FROM prompt_results p WHERE p.rounds <> (SELECT COUNT(*) FROM rounds x "
                "WHERE x.run_id = p.run_id AND x.prompt_index = p.prompt_index) AND EXISTS (SELECT 1 FROM runs r "
                "WHERE r.id = p.run_id AND r.kind = 'speculative')"
            )
        ).scalar()
        repeats = conn.execute(
            text(
                "SELECT COUNT(*) FROM prompt_results p JOIN runs r ON r.id = p.run_id JOIN experiments e "
                "ON e.id = r.experiment_id WHERE COALESCE(e.repeats, 1) <> (SELECT COUNT(*) FROM timings t "
                "WHERE t.run_id = p.run_id AND t.prompt_index = p.prompt_index)"
            )
        ).scalar()
    return {"rounds": int(rounds), "repeats": int(repeats)}


def leftovers(store) -> dict[str, int]:
    with store.read() as conn:
        return {t: int(conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar()) for t in ("device_leases", "workers")}


def _alive(pid: int) -> bool:
    """A running process (not a zombie: a worker SIGKILLed a moment ago whose row the supervisor has not swept yet;
    killing it again would count one death twice)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class Killer:
    """SIGKILLs a random worker (one timing a run when there is one) every `every` seconds, `kills` times at most."""

    def __init__(self, store, every=(0.8, 1.6), kills=8, seed=13):
        self.store, self.every, self.max_kills = store, every, kills
        self.rng = random.Random(seed)
        self.killed: list[tuple[float, int, str, int | None]] = []  # (time, pid, worker id, run it was timing)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while len(self.killed) < self.max_kills and not self._stop.wait(self.rng.uniform(*self.every)):
            with self.store.read() as conn:
                rows = conn.execute(text("SELECT id, pid, run_id FROM workers ORDER BY id")).all()
            rows = [r for r in rows if _alive(r.pid)]  # not one killed already, dead but not yet reaped
            busy = [r for r in rows if r.run_id is not None] or rows
            if not busy:
                continue
            victim = self.rng.choice(busy)
            try:
                os.kill(victim.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append((time.monotonic(), victim.pid, victim.id, victim.run_id))

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(10)


def single_worker_reference(tmp_path, model_dirs) -> dict:
    """The same experiments drained by one in-process worker (SQLite): the figures the chaos drain must match."""
    from app.worker.worker import Worker

    store = open_store(f"sqlite:///{tmp_path / 'reference.db'}")
    enqueue_drain(store, model_dirs)
    with Worker(store, heartbeat_seconds=0.5, log=lambda m: None) as worker:
        worker.work(until_idle=True)
    found = figures(store)
    store.dispose()
    return found


def test_four_workers_drain_forty_runs_while_a_killer_sigkills_them(postgres_url, model_dirs, tmp_path):
    reference = single_worker_reference(tmp_path, model_dirs)
    store = open_store(postgres_url)
    enqueue_drain(store, model_dirs)
    total = EXPERIMENTS * (1 + len(KS))
    sup = start_supervisor(postgres_url, ["cpu:0", "cpu:1", "cpu:2", "cpu:3"])
    killer = None
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not leftovers(store)["workers"]:
            time.sleep(0.2)
        killer = Killer(store).start()
        while time.monotonic() < deadline:
            c = counts(store)
            if c.get("done", 0) == total:
                break
            assert sup.poll() is None, sup.stderr.read()[-3000:]
            time.sleep(0.3)
        killer.stop()
        done_at = counts(store)
        sup.send_signal(signal.SIGTERM)
        _, err = sup.communicate(timeout=60)
    finally:
        if killer is not None:
            killer.stop()
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    print(
        f"\nchaos: {total} runs done; {len(killer.killed)} SIGKILLs "
        f"({sum(1 for k in killer.killed if k[3] is not None)} of a worker timing a run); "
        f"{err.count('requeued')} deaths with runs requeued; {err.count(' started (pid ')} worker starts"
    )
    assert done_at == {"done": total}, (done_at, err[-4000:])
    assert sup.returncode == 143, err[-3000:]
    assert len(killer.killed) >= 3, killer.killed  # the chaos happened
    assert err.count("died (killed by SIGKILL)") == len(killer.killed), err[-4000:]
    assert "requeued" in err, err[-4000:]  # at least one kill landed on a run in progress, which was resumed
    assert "Traceback" not in err, err[-4000:]
    found = audit(store)
    assert found["duplicates"] == 0 and found["missing_prompts"] == 0, found
    assert row_gaps(store) == {"rounds": 0, "repeats": 0}
    assert leftovers(store) == {"device_leases": 0, "workers": 0}
    assert figures(store) == reference
    with store.read() as conn:  # the four slots all timed something
        used = set(conn.execute(text("SELECT DISTINCT device_name FROM runs")).scalars())
    assert len(used) >= 3 and used <= {"cpu:0", "cpu:1", "cpu:2", "cpu:3"}, used
    store.dispose()
