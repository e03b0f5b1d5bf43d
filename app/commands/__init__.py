"""The `draftlab` commands, one module each: `NAME` (the command's name), `add_parser(subparsers)` (its argparse
parser, returned) and `run(args) -> int` (its exit status). app/cli.py assembles them; common.py is what they share
(the one-line errors, opening --db); in_process.py and progress.py are `run`'s and `validate`'s in-process worker
and progress bar; training_run.py what `distill` and `train-head` share."""
