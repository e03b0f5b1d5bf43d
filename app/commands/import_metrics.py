"""`draftlab import-metrics SOURCE [AFTER] --experiment ID`: a serving engine's speculative-decoding counters
(app/serving/production_scrape.py) stored as a production series of an experiment (storage/records/production.py)."""

from __future__ import annotations

import argparse
import json
import sys

from app.arguments import ID as _id  # ids: 1 to engine/numbers.DB_INT_MAX, ASCII digits, one wording
from app.commands.common import database_errors_reported, store_command
from engine.numbers import ascii_float

NAME = "import-metrics"


def _seconds(raw: str) -> float:
    value = ascii_float(raw)
    if value is None or not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"--interval must be seconds in (0, 86400] (got {raw[:40]!r}); e.g. 60")
    return value


_seconds.accepts = lambda value: isinstance(value, float) and 0 < value <= 86_400  # type: ignore[attr-defined]


def _check_url(source: str) -> None:
    """A SOURCE that is an http(s) URL (or only splits as a broken one) is checked as a URL before anything is read
    (app/serving/urls.py); a file path passes."""
    import urllib.parse

    from app.serving.urls import http_url

    try:
        scheme = urllib.parse.urlsplit(source).scheme
    except ValueError:  # only a bracketed host fails to split: a URL
        scheme = "http"
    if scheme in ("http", "https"):
        http_url(source, "SOURCE", "http://HOST:PORT/metrics")


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="a serving engine's speculative-decoding counters (Prometheus /metrics) next to a run",
        description="Read vLLM's (or llama.cpp's) spec_decode counters from a saved /metrics page or an http(s) "
        "URL and store them as a production series of an experiment, compared with its finished run at "
        "the server's k. One SOURCE: the totals since the server started, or with --interval the "
        "difference of two scrapes that many seconds apart; two SOURCEs: the difference between two "
        "saved scrapes (before, after).",
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="a file or an http(s) URL (at most two)")
    p.add_argument("--experiment", required=True, type=_id, dest="experiment_id")
    p.add_argument("--label", default=None, help="the series' name (default: production N)")
    p.add_argument("--interval", type=_seconds, default=None, help="scrape SOURCE twice, this many seconds apart")
    p.add_argument("--engine", default=None, help="only counters with this `engine` label (default: their sum)")
    p.add_argument(
        "--run",
        type=_id,
        default=None,
        dest="run_id",
        help="the lab run the server's configuration matches (default: the experiment's run at its k)",
    )
    p.add_argument("--db", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object (SPEC's Production counters keys)")
    return p


def run(args) -> int:
    return database_errors_reported(lambda args: store_command(args, command), args)


def command(args, store) -> int:
    """Scrape, store, print one line (`--json`: one JSON object); bad input raises DraftLabError / ProductionError (the
    CLI prints it)."""
    from app.serving.production_scrape import public_source, scrape
    from engine.errors import DraftLabError
    from storage.records.production import add_series, series, series_document

    if len(args.sources) > 2:
        raise DraftLabError(
            f"give one SOURCE (with --interval for two scrapes of it) or two saved scrapes, not {len(args.sources)}"
        )
    if len(args.sources) == 2 and args.interval is not None:
        raise DraftLabError(
            "--interval scrapes one SOURCE twice: give one SOURCE with it, or two saved scrapes without it"
        )
    for source in args.sources:
        _check_url(source)
    if args.interval is not None:
        print(f"scraping {public_source(args.sources[0])} twice, {args.interval:g} s apart …", file=sys.stderr)
    counters, seconds = scrape(args.sources, args.interval, args.engine)
    label = args.label if args.label is not None else f"production {len(series(store, args.experiment_id)) + 1}"
    stored = add_series(
        store,
        args.experiment_id,
        drafts=counters.drafts,
        draft_tokens=counters.draft_tokens,
        accepted=counters.accepted,
        per_position=counters.per_position,
        label=label,
        source=" → ".join(public_source(s) for s in args.sources),
        engine=",".join(counters.engines),
        seconds=seconds,
        run_id=args.run_id,
    )
    if args.json:
        print(json.dumps(series_document(store, args.experiment_id, int(stored["series_id"]))))
        return 0
    rate = counters.accepted / counters.draft_tokens
    compared = (
        f"compared with run {stored['run_id']}"
        if stored["run_id"] is not None
        else f"no finished run at k = {stored['k']} in experiment {args.experiment_id} to compare with yet"
    )
    print(
        f"series {stored['series_id']} ({label}): {counters.drafts} drafts, {counters.draft_tokens} draft tokens, "
        f"draft acceptance rate {rate:.3f}, k = {stored['k']}; {compared}"
    )
    return 0
