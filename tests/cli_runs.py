"""`draftlab run` on the tiny test models from a test, its `--json` document back: the one way tests run a small
grid or `--k auto` end to end through the CLI."""

from __future__ import annotations

import json

from app.cli import main

PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13", "t30 t31 t32"]


def run_json(tmp_path, model_dirs, capsys, *options: str, name: str = "cli.db") -> tuple[dict, str]:
    """Run `draftlab run` with the tiny target and draft on four short prompts (greedy, on the CPU) plus
    `options`; assert it exits 0 and return (its JSON document, the database URL)."""
    db = f"sqlite:///{tmp_path / name}"
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS) + "\n")
    assert (
        main(
            [
                "run",
                "--target",
                model_dirs["target"],
                "--draft",
                model_dirs["draft"],
                "--prompts",
                str(prompt_file),
                *options,
                "--device",
                "cpu",
                "--db",
                db,
                "--json",
            ]
        )
        == 0
    )
    return json.loads(capsys.readouterr().out), db
