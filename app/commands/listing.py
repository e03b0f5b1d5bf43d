"""`draftlab list`: experiments and their runs, as lines or one JSON object."""

from __future__ import annotations

import json

from app.commands.common import database_errors_reported, open_store_or_fail, stale_window_or_fail
from app.worker.sweep import sweep
from storage.db.settings import STALE_HELP

NAME = "list"


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="experiments and runs",
        description=f"Experiments and runs. {STALE_HELP}; list marks such runs interrupted.",
    )
    p.add_argument("--db", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    return database_errors_reported(_list, args)


def _list(args) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from engine.config.variables import variable
    from storage.analysis import catalog
    from storage.records import queries as q
    from storage.serving.export import plain

    stale = stale_window_or_fail()
    if isinstance(stale, int):
        return stale
    store = open_store_or_fail(args.db)
    if isinstance(store, int):
        return store
    try:  # runs whose worker is gone show as interrupted, not `running` forever (a read-only database: as stored)
        sweep(store, stale)
    except SQLAlchemyError:
        pass
    experiments = catalog.experiments(store)
    if args.json:
        doc = [
            {**plain(e), "runs": plain(q.runs(store, int(e["experiment_id"])).to_dict(orient="records"))}
            for e in experiments.to_dict(orient="records")
        ]
        print(json.dumps({"experiments": doc}))
        return 0
    if experiments.empty:
        print(f"no experiments in {store.safe_url}")
        return 0
    fmt = lambda v, spec: format(v, spec) if v is not None and v == v else "-"  # noqa: E731
    for e in experiments.itertuples():
        swept = variable(e.sweep_variable)
        print(
            f"experiment {e.experiment_id}  {e.name}  [{e.status} {100 * e.progress:.0f}%]  "
            f"{e.target} / {e.draft}  prompts {e.prompts}  {e.sweep_variable}={e.sweep_values}"
            + (f" at batch sizes {e.batch_sizes}" if e.batch_sizes else "")
        )
        for r in q.runs(store, int(e.experiment_id)).itertuples():
            what = "baseline" if r.kind == "baseline" else f"{swept.name}={swept.show(swept.run_value(r))}"
            what += f" @{int(r.batch_size)}" if e.batch_sizes else ""
            print(
                f"  run {r.run_id:<5} {what:<14} {r.status:<11} {100 * r.progress:3.0f}%  "
                f"{fmt(r.tokens_per_second, '8.1f')} tok/s  speedup {fmt(r.speedup, '.2f')}  "
                f"alpha {fmt(r.alpha, '.3f')}" + (f"  error: {r.error}" if _present(r.error) else "")
            )
    return 0


def _present(value) -> bool:
    """A value a frame cell really holds: not None, not NaN (pandas fills a sibling's missing text with NaN), not ''."""
    return value is not None and value == value and str(value).strip() != ""
