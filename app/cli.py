"""`draftlab` command line: run, worker, list, export, ui (SPEC.md's CLI contract).

Bad input ends in exactly one `error: …` line on stderr and exit status 2; a failed run exits 1.
"""
from __future__ import annotations

import argparse
import json
import sys

EXIT_BAD_INPUT, EXIT_RUN_FAILED = 2, 1


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise SystemExit(_fail(f"{message} (see `{self.prog} --help`)"))


def _fail(message: str, status: int = EXIT_BAD_INPUT) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def parse_k_values(text: str) -> list[int]:
    from engine.errors import DraftLabError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise DraftLabError(f"--k must be positive integers like 4 or 1,2,4,8 (got {text!r})") from None
    if not values or any(v <= 0 for v in values):
        raise DraftLabError(f"--k values must be >= 1 (got {text!r}); use e.g. --k 4 or --k 1,2,4,8")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="draftlab", description="Tune speculative-decoding draft models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="baseline + one speculative run per k; prints a table or --json")
    run.add_argument("--target", required=True, help="demo-target, an HF model id or a local directory")
    run.add_argument("--draft", required=True, help="demo-draft, an HF model id or a local directory")
    run.add_argument("--prompts", required=True, help="NAME[:SPLIT] (code, english, chinese, math, mixed) or a .jsonl/.csv/.txt file")
    run.add_argument("--k", default="4", help="draft length, or a comma-separated sweep (1,2,4,8)")
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--top-k", type=int, default=0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--max-new-tokens", type=int, default=128)
    run.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    run.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    run.add_argument("--trust-remote-code", action="store_true", help="allow model repos to run their own code")
    run.add_argument("--db", default=None, help="SQLAlchemy URL (default $DRAFTLAB_DB or sqlite:///draftlab.db)")
    run.add_argument("--name", default=None)
    run.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")

    ui = sub.add_parser("ui", help="the dashboard, plus a local worker if none is alive")
    ui.add_argument("--db", default=None)
    ui.add_argument("--port", type=int, default=8501)
    ui.add_argument("--host", default="127.0.0.1")

    worker = sub.add_parser("worker", help="run queued runs")
    worker.add_argument("--db", default=None)

    lst = sub.add_parser("list", help="experiments and runs")
    lst.add_argument("--db", default=None)

    export = sub.add_parser("export", help="an experiment's runs and per-token rows")
    export.add_argument("experiment_id", type=int)
    export.add_argument("--format", choices=["csv", "json"], default="csv")
    export.add_argument("--db", default=None)
    return parser


def cmd_run(args) -> int:
    from engine.errors import DraftLabError
    from engine.sampling import SamplingConfig

    from .report import format_table
    from .run_local import run_experiment

    try:
        ks = parse_k_values(args.k)
        cfg = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed, args.max_new_tokens)
        doc = run_experiment(args, ks, cfg)
    except DraftLabError as exc:
        return _fail(str(exc))
    except MemoryError as exc:  # torch.cuda.OutOfMemoryError subclasses RuntimeError; see run_local
        return _fail(f"out of memory: {exc}", EXIT_RUN_FAILED)
    print(json.dumps(doc) if args.json else format_table(doc))
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a parse error (already reported)
        return int(exc.code or 0)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "ui":
        from .ui import main as ui_main

        return ui_main(db=args.db, port=args.port, host=args.host)
    return _fail(f"`draftlab {args.command}` needs the storage layer, which this build does not have yet")


if __name__ == "__main__":
    sys.exit(main())
