"""`draftlab` command line: run, worker, list, export, ui, … (the CLI contract: docs/cli.md, docs/metrics.md).

This module only assembles the commands: each is a module of app/commands/ with `NAME`, `add_parser(subparsers)`
and `run(args) -> int`, listed in COMMANDS in the order `draftlab --help` shows them. Bad input ends in exactly one
`error: …` line on stderr and exit status 2 (app/commands/common.py); a failed run exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from app.commands import (
    check_head,
    confirm,
    convert_head,
    distill,
    export,
    import_metrics,
    listing,
    profile,
    resume,
    run,
    train_head,
    ui,
    validate,
    worker,
)
from app.commands.common import Parser, fail

# The order `draftlab --help` lists them in.
COMMANDS = (
    run,
    ui,
    worker,
    listing,
    resume,
    distill,
    train_head,
    validate,
    export,
    import_metrics,
    confirm,
    profile,
    convert_head,
    check_head,
)
BY_NAME = {command.NAME: command for command in COMMANDS}

EXIT_CLOSED_PIPE = 128 + 13  # what a shell reports for a command stopped by SIGPIPE


def build_parser() -> argparse.ArgumentParser:
    """`draftlab` and every command's parser (each command module's add_parser, in COMMANDS' order)."""
    parser = Parser(prog="draftlab", description="Tune speculative-decoding draft models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def command_parsers(parser: argparse.ArgumentParser | None = None) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of every command, in `draftlab --help`'s order: what a CLI reference is generated from."""
    parser = parser if parser is not None else build_parser()
    sub = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    yield from sub.choices.items()


def main(argv: list[str] | None = None) -> int:
    """Every subcommand; a closed stdout (`draftlab list | head`) ends quietly with EXIT_CLOSED_PIPE."""
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # inside the try: a pipe closed early fails here, not at interpreter exit
        return status
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_CLOSED_PIPE


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's final flush of the dead pipe is silent too."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file descriptor (captured, replaced): nothing to flush later
        pass


def _dispatch(argv: list[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a parse error (already reported)
        return int(exc.code or 0)
    command = BY_NAME.get(args.command)
    if command is None:
        return fail(f"unknown command {args.command!r}")
    return command.run(args)


if __name__ == "__main__":
    sys.exit(main())
