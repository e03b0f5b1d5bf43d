"""Past one machine: runs per minute draining the same 40 runs (8 experiments x (baseline + k = 1..4), 3 prompts,
6 new tokens, tiny models) with 1, 2 and 4 workers (`draftlab worker --devices cpu:0,...,cpu:N-1 --until-idle`,
CPU slots with leases of their own), and the time from a SIGKILL of a worker timing a run to that run being
resumed by a worker (the supervisor requeues it; a worker claims it and commits its next prompt).

    python benchmarks/bench_scale.py [--db postgresql://...] [--trials 3]

On PostgreSQL ($DRAFTLAB_TEST_POSTGRES, else 127.0.0.1:5432/test), each pass in a schema of its own, dropped after.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from storage import open_store  # noqa: E402
from tests.fault_tools import audit  # noqa: E402
from tests.test_chaos import EXPERIMENTS, KS, counts, enqueue_drain, leftovers, start_supervisor  # noqa: E402


def tiny_models(base: Path) -> dict[str, str]:
    from tests import tiny_models as tm

    target = tm.llama(0, layers=2, sharpness=4.0)
    draft = tm.noisy_copy(target, seed=1, noise=0.3)
    paths = {}
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(base / name)
        tm.tokenizer().save_pretrained(base / name)
        paths[name] = str(base / name)
    return paths


class Schema:
    """A fresh schema of the server for one pass (dropped on exit): never anyone else's data."""

    def __init__(self, server: str):
        import psycopg

        self.plain = server.replace("postgresql+psycopg://", "postgresql://")
        self.name = f"draftlab_bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.plain, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.name}"')
        sep = "&" if "?" in self.plain else "?"
        self.url = f"{self.plain}{sep}options={quote(f'-csearch_path={self.name}')}"

    def __enter__(self):
        return self.url

    def __exit__(self, *exc):
        import psycopg

        with psycopg.connect(self.plain, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{self.name}" CASCADE')


def drain(url: str, models: dict, workers: int) -> dict:
    store = open_store(url)
    enqueue_drain(store, models)
    total = EXPERIMENTS * (1 + len(KS))
    t0 = time.monotonic()
    sup = start_supervisor(url, [f"cpu:{i}" for i in range(workers)], until_idle=True, stderr=None)
    code = sup.wait(timeout=900)
    wall = time.monotonic() - t0
    with store.read() as conn:
        first, last = conn.execute(text("SELECT MIN(started), MAX(finished) FROM runs")).one()
    found = audit(store)
    assert code == 0 and counts(store) == {"done": total}, (code, counts(store))
    assert found["duplicates"] == 0 and found["missing_prompts"] == 0 and leftovers(store)["device_leases"] == 0
    store.dispose()
    busy = (last - first).total_seconds()
    return {
        "workers": workers,
        "runs": total,
        "wall_s": wall,
        "drain_s": busy,
        "runs_per_min_wall": total / wall * 60,
        "runs_per_min_drain": total / busy * 60,
    }


def kill_to_resume(url: str, models: dict, trials: int) -> list[dict]:
    """2 workers; each trial SIGKILLs the worker timing a run mid-run and times: the requeue (run queued again),
    the claim by a worker (running again) and the next prompt committed."""
    store = open_store(url)
    enqueue_drain(store, models, experiments=trials + 2, ks=(1, 2), max_new_tokens=48)
    sup = start_supervisor(url, ["cpu:0", "cpu:1"], stderr=open(os.devnull, "w"))
    out = []
    try:
        for _ in range(trials):
            victim = None
            deadline = time.monotonic() + 300
            while victim is None and time.monotonic() < deadline:
                with store.read() as conn:
                    victim = conn.execute(
                        text(
                            "SELECT w.pid, w.id, r.id AS run_id, r.prompts_done FROM workers w JOIN runs r "
                            "ON r.worker_id = w.id WHERE r.status = 'running' AND r.prompts_done >= 1 "
                            "AND r.prompts_done < r.prompts_total ORDER BY r.id LIMIT 1"
                        )
                    ).first()
                time.sleep(0.05)
            if victim is None:
                break
            os.kill(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            marks: dict[str, float] = {}
            while "committed" not in marks and time.monotonic() - killed < 300:
                with store.read() as conn:
                    row = conn.execute(
                        text("SELECT status, worker_id, prompts_done FROM runs WHERE id = :r"), {"r": victim.run_id}
                    ).one()
                now = time.monotonic() - killed
                moved = row.worker_id != victim.id  # claimed by a (restarted or other) worker
                if row.status == "queued" or (moved and row.status in ("running", "done")):
                    marks.setdefault("requeued", now)
                if moved and row.status in ("running", "done"):
                    marks.setdefault("resumed", now)
                if moved and (row.status == "done" or row.prompts_done > victim.prompts_done):
                    marks["committed"] = now
                time.sleep(0.02)
            out.append({"run": victim.run_id, **marks})
    finally:
        sup.send_signal(signal.SIGTERM)
        sup.wait(timeout=120)
        store.dispose()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db", default=os.environ.get("DRAFTLAB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    )
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        models = tiny_models(Path(tmp))
        print(
            f"machine: {os.cpu_count()} CPU cores (os.cpu_count), tiny models, PostgreSQL, own schema per pass",
            flush=True,
        )
        rows = []
        for n in [int(x) for x in args.workers.split(",")]:
            with Schema(args.db) as url:
                rows.append(drain(url, models, n))
            print(f"  {n} worker(s) done", file=sys.stderr, flush=True)
        base = rows[0]["runs_per_min_drain"]
        print(
            "\n| workers | runs | wall s (incl. start-up) | runs/min (wall) | drain s (first start → last end) | "
            "runs/min (drain) | vs 1 worker |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['workers']} | {r['runs']} | {r['wall_s']:.1f} | {r['runs_per_min_wall']:.1f} | "
                f"{r['drain_s']:.1f} | {r['runs_per_min_drain']:.1f} | {r['runs_per_min_drain'] / base:.2f}× |"
            )
        with Schema(args.db) as url:
            trials = kill_to_resume(url, models, args.trials)
        print("\nSIGKILL of a worker timing a run (2 workers), seconds after the kill:\n")
        print("| trial | run | requeued | claimed by a worker | next prompt committed |")
        print("|---|---|---|---|---|")
        for i, t in enumerate(trials, 1):
            cell = lambda k, t=t: f"{t[k]:.2f}" if k in t else "—"  # noqa: E731
            print(f"| {i} | {t['run']} | {cell('requeued')} | {cell('resumed')} | {cell('committed')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
