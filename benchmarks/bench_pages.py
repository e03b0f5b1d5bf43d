"""Times every dashboard page's server-side rerun on a SQLite database holding 1M synthetic draft-token rows, and
(--browser) how soon the experiment-detail page shows its answer in Chromium.

    python benchmarks/bench_pages.py [--db PATH] [--reuse] [--tokens 1000000] [--repeats 5]
    python benchmarks/bench_pages.py --browser --db PATH --experiment ID [--against REF] [--repeats 5] [--warm 4]

The database is built by benchmarks/bench_queries.py's generator (--reuse keeps one already built at --db).
Each page runs under streamlit.testing's AppTest, the real entry script (app/main.py) routing to it: one first
run (cold: caches empty), then --repeats reruns, as a widget change or the 2 s refresh would trigger them; the
round explorer's slider is moved on each of its reruns. Prints the first run, and the median and max of the
reruns (wall clock, and the process's CPU time, steadier on a shared machine), per page. Budgets: 1 s per rerun (0.5 s
for the round slider); the exit status is 1 when a median is over.

--browser: the detail page of experiment --experiment (a finished k sweep) in Debian's Chromium (Playwright), for
the code of this tree and, with --against REF, of git REF (extracted by `git archive` into a temporary folder),
each served by its own Streamlit on the same database (no worker). A repeat starts both servers afresh (their
caches empty), has each serve the Experiments page to another browser context (Python's imports done, as on a
dashboard in use; --cold: not, the server's very first page), then opens a fresh browser context for each (its
HTTP cache empty): its visit of the detail page is the *first*; --warm visits of the same URL in the same context
are *warm* ones, the two trees' visits interleaved. A visit's
time is from navigation start to the answer drawn: the verdict's box visible and the "Speedup vs k" chart painted
(a canvas or svg of non-zero size under that heading); `done` is when the script run ended with every chart drawn.
Prints each tree's medians with min–max. Goals (issue 35): the answer within 2 s of a first visit, 1.5 s of a warm
one; the exit status is 1 when this tree's median misses one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BUDGET = {"rounds (slider)": 0.5}
DEFAULT_BUDGET = 1.0


def build(path: Path, tokens: int) -> dict:
    from benchmarks.bench_queries import fill
    from storage import open_store

    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    store = open_store(f"sqlite:///{path}")
    start = time.perf_counter()
    ids = fill(store, tokens)
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    print(f"built {path} in {time.perf_counter() - start:.0f}s")
    return ids


def found(path: Path) -> dict:
    """The big experiment and its speculative run in a database built earlier."""
    from storage import open_store
    from storage.analysis import catalog
    from storage.records import queries as q

    store = open_store(f"sqlite:///{path}")
    listing = catalog.experiments(store)
    eid = int(listing.loc[listing["name"] == "bench", "experiment_id"].iloc[0])
    runs = q.runs(store, eid)
    rid = int(runs.loc[runs["kind"] == "speculative", "run_id"].iloc[0])
    return {"experiment_id": eid, "run_id": rid}


def _app(page: str, **query):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(f"from app.main import run\nrun({page!r})", default_timeout=600)
    for key, value in query.items():
        at.query_params[key] = str(value)
    return at


CPU: list[float] = []  # process CPU seconds of each _timed call: on a shared, loaded machine wall time is noisy


def _timed(call) -> float:
    start, cpu = time.perf_counter(), time.process_time()
    call()
    CPU.append(time.process_time() - cpu)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="/tmp/draftlab-bench-pages.db")
    parser.add_argument("--reuse", action="store_true", help="keep the database at --db when it exists")
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pages", default="experiments,experiment,rounds,rounds (slider),compare,theory,new,train")
    parser.add_argument("--browser", action="store_true", help="time the detail page's answer in Chromium")
    parser.add_argument("--experiment", type=int, help="--browser: the experiment whose detail page is timed")
    parser.add_argument("--against", help="--browser: a git ref whose code is timed too, interleaved")
    parser.add_argument("--warm", type=int, default=4, help="--browser: warm visits per repeat and tree")
    parser.add_argument(
        "--cold", action="store_true", help="--browser: a first visit is the server's first (its imports included)"
    )
    args = parser.parse_args(argv)
    if args.browser:
        from benchmarks.bench_detail_browser import run_browser

        return run_browser(Path(args.db), args.experiment, args.against, args.repeats, args.warm, args.cold)

    path = Path(args.db)
    ids = found(path) if args.reuse and path.exists() else build(path, args.tokens)
    os.environ["DRAFTLAB_DB"] = f"sqlite:///{path}"
    os.environ.pop("DRAFTLAB_PASSWORD", None)
    eid, rid = ids["experiment_id"], ids["run_id"]
    from storage import open_store
    from storage.analysis import catalog

    others = [
        int(i) for i in catalog.experiments(open_store(os.environ["DRAFTLAB_DB"]))["experiment_id"] if int(i) != eid
    ]
    cases = {
        "experiments": ("experiments", {}),
        "experiment": ("experiment", {"experiment": eid, "run": rid}),
        "rounds": ("rounds", {"experiment": eid, "run": rid, "prompt": 250}),
        "rounds (slider)": ("rounds", {"experiment": eid, "run": rid, "prompt": 250}),
        "compare": ("compare", {"experiments": f"{eid},{others[0]}", "runs": rid}),
        "theory": ("theory", {}),
        "new": ("new", {}),
        "train": ("train", {}),
    }
    print(f"{'page':<18} {'first s':>8} {'median s':>9} {'max s':>7} {'cpu med s':>10}  budget (on the median)")
    over = []
    for name in args.pages.split(","):
        page, query = cases[name]
        at = _app(page, **query)
        first = _timed(at.run)
        if at.exception:
            print(f"{name}: {[e.value for e in at.exception]}")
            over.append(name)
            continue
        times = []
        CPU.clear()
        for i in range(args.repeats):
            if name == "rounds (slider)":
                slider = (
                    at.select_slider(key="select_round")
                    if any(getattr(w, "key", None) == "select_round" for w in at.select_slider)
                    else None
                )
                if slider is not None:
                    options = list(slider.options)
                    slider.set_value(int(options[(i * 7 + 3) % len(options)]))
                else:  # no slider (a token chart picks the round): rerun as a selection would
                    pass
            times.append(_timed(at.run))
        median, worst = statistics.median(times), max(times)
        budget = BUDGET.get(name, DEFAULT_BUDGET)
        flag = "" if median < budget else "  SLOW"
        cpu = statistics.median(CPU)
        print(f"{name:<18} {first:>8.2f} {median:>9.3f} {worst:>7.3f} {cpu:>10.3f}  < {budget:g}{flag}", flush=True)
        if median >= budget:
            over.append(name)
    if over:
        print(f"over budget: {', '.join(over)}")
        return 1
    print("every page under budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
