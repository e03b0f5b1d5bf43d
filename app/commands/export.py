"""`draftlab export`: an experiment's runs with metrics and per-token rows (csv, json), or its deploy settings."""

from __future__ import annotations

import json

from app.arguments import ID, whole
from app.commands.common import database_errors_reported, experiment_missing, fail, open_store_or_fail

NAME = "export"


def add_parser(sub):
    p = sub.add_parser(NAME, help="an experiment's runs with metrics, and its per-token rows")
    p.add_argument("experiment_id", type=ID)
    p.add_argument(
        "--format",
        choices=["csv", "json", "deploy"],
        default="csv",
        help="deploy: one JSON document with the equivalent vLLM, SGLang, llama.cpp and transformers "
        "settings of a run (the verdict's choice unless --run names one: the best, or the cheaper "
        "configuration statistically tied with it), with the verdict's ties and caveats",
    )
    p.add_argument(
        "--run",
        type=ID,
        default=None,
        dest="run_id",
        help="deploy: the speculative run to carry to production (default: the verdict's choice)",
    )
    p.add_argument(
        "--batch-size",
        type=whole(1),
        default=None,
        dest="batch_size",
        help="deploy, a grid: the batch size whose k schedule entry the one-k engines take (default "
        "the smallest; vLLM carries the whole schedule)",
    )
    p.add_argument(
        "--with-max-new-tokens",
        action="store_true",
        help="deploy: also carry the experiment's max new tokens as the serving length (by default "
        "it is left out: it was the test's measurement budget)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="csv: directory for the files (default .; created if missing); json, deploy: file "
        "(default stdout; its folder must exist); an existing file is kept unless --overwrite",
    )
    p.add_argument("--overwrite", action="store_true", help="replace files --out already holds")
    p.add_argument("--db", default=None)
    return p


def run(args) -> int:
    return database_errors_reported(_export, args)


def _export(args) -> int:
    from storage.serving.deploy import DeployError, deploy_document
    from storage.serving.export import export_csv, export_json

    if args.run_id is not None and args.format != "deploy":
        return fail(f"--run applies to --format deploy only (got --format {args.format})")
    if args.batch_size is not None and args.format != "deploy":
        return fail(f"--batch-size applies to --format deploy only (got --format {args.format})")
    if args.with_max_new_tokens and args.format != "deploy":
        return fail(f"--with-max-new-tokens applies to --format deploy only (got --format {args.format})")
    problem = _export_out_problem(args)
    if problem:
        return fail(problem)
    store = open_store_or_fail(args.db)
    if isinstance(store, int):
        return store
    missing = experiment_missing(store, args.experiment_id)  # checked, not caught: a KeyError below is a bug
    if missing is not None:
        return missing
    try:
        if args.format in ("json", "deploy"):
            doc = (
                json.dumps(export_json(store, args.experiment_id))
                if args.format == "json"
                else json.dumps(
                    deploy_document(store, args.experiment_id, args.run_id, args.with_max_new_tokens, args.batch_size),
                    indent=2,
                )
            )
            if args.out in (None, "-"):
                print(doc)
            else:
                with open(args.out, "w", encoding="utf-8") as f:
                    f.write(doc)
                print(args.out)
        else:
            for path in export_csv(store, args.experiment_id, args.out or "."):
                print(path)
    except OSError as exc:  # the folder went away or turned unwritable since the check
        return fail(
            f"cannot write --out {args.out or '.'} ({exc.strerror or exc}); pass a file or folder you can write to"
        )
    except DeployError as exc:
        return fail(str(exc))
    return 0


def _export_out_problem(args) -> str | None:
    """What is wrong with `export --out`, checked before the database is read: json and deploy write one file
    (not a directory, in a folder that exists), csv writes its files into a directory (created if missing, not a
    file); a file already there is kept unless --overwrite."""
    import os
    from pathlib import Path

    from storage.serving.export import csv_names

    if args.format in ("json", "deploy"):
        if args.out in (None, "-"):
            return None
        out = Path(args.out).expanduser()
        if out.is_dir():
            return (
                f"--out {args.out} is a directory; --format {args.format} writes one file: name it, e.g. "
                f"--out {os.path.join(args.out, f'experiment-{args.experiment_id}.json')}"
            )
        folder = out.parent if str(out.parent) else Path(".")
        if not folder.is_dir():
            return (
                f"--out {args.out}: the folder {folder} does not exist; create it first or name a file in a folder "
                f"that exists"
            )
        files = [out] if out.exists() else []
    else:
        out = Path(args.out or ".").expanduser()
        if out.exists() and not out.is_dir():
            return (
                f"--out {args.out} is a file; --format csv writes {len(csv_names(args.experiment_id))} files "
                f"into a directory: pass a directory (created if missing)"
            )
        files = [out / name for name in csv_names(args.experiment_id) if (out / name).exists()]
    if files and not args.overwrite:
        shown = ", ".join(str(f) for f in files)
        return f"--out: {shown} already exists; pass --overwrite to replace it, or another --out"
    return None
