"""The CLI's one pattern (app/cli.py assembles app/commands/, one module per command with NAME, add_parser and run),
help texts that read the declarations, and errors that keep their meaning: a KeyError raised while serving an
experiment is a bug and surfaces as one, never as "no experiment N"."""

from __future__ import annotations

import argparse

import pytest

from app.cli import COMMANDS, build_parser, command_parsers, main


@pytest.fixture
def stored(tmp_path):
    """A database holding one experiment (queued, with its prompts), as (url, experiment id)."""
    from storage import open_store
    from storage.jobs.experiments import enqueue_experiment

    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = open_store(url)
    experiment_id = enqueue_experiment(
        store, name="x", target="t", draft="d", prompts="tiny", sampling={}, sweep_values=[1], prompt_texts=["t1 t2"]
    )
    store.dispose()
    return url, experiment_id


def _key_error(*args, **kwargs):
    raise KeyError("vllm")  # what a drafter without a serving mapping raised in deploy (issue 36)


def test_a_key_error_inside_deploy_is_not_reported_as_a_missing_experiment(stored, monkeypatch, capsys):
    url, eid = stored
    monkeypatch.setattr("storage.serving.deploy.deploy_document", _key_error)
    with pytest.raises(KeyError, match="vllm"):
        main(["export", str(eid), "--format", "deploy", "--db", url])
    assert "no experiment" not in capsys.readouterr().err


def test_a_key_error_inside_confirm_is_not_reported_as_a_missing_experiment(stored, monkeypatch, capsys):
    url, eid = stored
    monkeypatch.setattr("storage.serving.confirm_jobs.confirm_documents", _key_error)
    with pytest.raises(KeyError, match="vllm"):
        main(
            [
                "confirm",
                str(eid),
                "--server",
                "http://127.0.0.1:9",
                "--baseline-server",
                "http://127.0.0.1:9",
                "--db",
                url,
            ]
        )
    assert "no experiment" not in capsys.readouterr().err


@pytest.mark.parametrize("command", [["export"], ["export", "--format", "deploy"], ["resume"], ["confirm"]])
def test_a_missing_experiment_is_named(stored, command, capsys):
    url, eid = stored
    assert main([command[0], str(eid + 1), *command[1:], "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"no experiment {eid + 1}" in err, err


def test_the_drafter_help_lists_every_declared_drafter(monkeypatch, capsys):
    """From engine/config/drafter_specs.py's SPECS, read when the parser is built: a drafter declared there (one
    added here) is in `draftlab run --help` with no edit to the CLI or this test."""
    from dataclasses import replace

    from engine.config.drafter_specs import SPECS

    added = replace(SPECS["confidence"], name="lookahead-test")  # a declaration like any other, under a new name
    monkeypatch.setitem(SPECS, added.name, added)
    parsers = dict(command_parsers())
    drafter = next(a for a in parsers["run"]._actions if "--drafter" in a.option_strings)
    for spec in SPECS.values():
        assert spec.usage in drafter.help, (spec.usage, drafter.help)
    assert added.usage in drafter.help
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    assert added.usage in "".join(capsys.readouterr().out.split())  # however argparse wraps it


def test_every_swept_variable_has_its_declared_help():
    """Every variable of engine/config/variables.py is a `run` flag whose help is its declaration's (the drafter's:
    built from SPECS, above)."""
    from engine.config.variables import VARIABLES

    run = dict(command_parsers())["run"]
    helps = {flag: a.help for a in run._actions for flag in a.option_strings}
    for variable in VARIABLES.values():
        assert variable.flag in helps, variable.flag
        if variable.name != "drafter":
            assert helps[variable.flag] == variable.help, variable.flag


def test_the_prompts_help_lists_every_built_in_set_and_file_type():
    from engine.text.prompt_sets import BUILTIN_SETS, FILE_EXTENSIONS

    run = dict(command_parsers())["run"]
    text = next(a.help for a in run._actions if "--prompts" in a.option_strings)
    for name in (*BUILTIN_SETS, *FILE_EXTENSIONS):
        assert name in text, (name, text)


def test_cli_only_assembles_one_module_per_command():
    parsers = list(command_parsers())
    assert [name for name, _ in parsers] == [command.NAME for command in COMMANDS]
    assert len({command.__name__ for command in COMMANDS}) == len(COMMANDS)
    for command in COMMANDS:
        assert command.__name__.startswith("app.commands."), command.__name__
        assert callable(command.add_parser) and callable(command.run), command.__name__
    for name, parser in parsers:
        assert isinstance(parser, argparse.ArgumentParser) and parser.prog == f"draftlab {name}"
