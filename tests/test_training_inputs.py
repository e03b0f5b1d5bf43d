"""Bad input to `train-head` or `distill` is one error line and leaves no --out folder behind
(engine/training/distill.py check_out_dir probes and removes what it created; training creates --out when it first
writes), and a draft vocabulary larger than the target's is refused with the valid range, never clamped silently."""

from __future__ import annotations

import pytest

from app.cli import main


def _argv(command, model_dirs, prompts, out, *extra):
    common = [
        "--target",
        model_dirs["target"],
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--steps",
        "2",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "2",
        "--device",
        "cpu",
        *extra,
    ]
    if command == "train-head":
        return ["train-head", *common, "--ttt-steps", "2"]
    return ["distill", "--draft", model_dirs["draft"], *common]


@pytest.mark.parametrize(
    "command, case, needle",
    [
        ("train-head", "no such prompts file", "no such prompt file"),
        ("distill", "no such prompts file", "no such prompt file"),
        ("distill", "mismatched tokenizers", "tokenizers disagree"),
        ("train-head", "aux layers the target lacks", "--aux-layers 0,7"),
        ("train-head", "draft vocabulary above the target's", "use 1 to 64"),
    ],
)
def test_bad_input_leaves_no_out_folder(command, case, needle, model_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t5 t6 t7\nt9 t3 t22 t40\n")
    extra = {
        "aux layers the target lacks": ["--aux-layers", "0,7"],
        "draft vocabulary above the target's": ["--draft-vocab-size", "65"],
    }.get(case, [])
    if case == "no such prompts file":
        prompts = tmp_path / "missing.txt"
    dirs = {**model_dirs, "draft": model_dirs["alien"]} if case == "mismatched tokenizers" else model_dirs
    out = tmp_path / "models" / "new"
    code = main(_argv(command, dirs, prompts, out, *extra))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err
    assert not (tmp_path / "models").exists()  # neither --out nor the parent this command would have made


def test_an_existing_out_folder_is_left_as_it_was(model_dirs, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    assert main(_argv("train-head", model_dirs, tmp_path / "missing.txt", out)) == 2
    assert out.is_dir() and not any(out.iterdir())


def test_the_largest_draft_vocabulary_is_the_targets(model_dirs, tmp_path, capsys):
    """--draft-vocab-size equal to the target's vocabulary (64 ids) is taken as given and recorded as such."""
    import json

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t5 t6 t7\nt9 t3 t22 t40\n")
    out = tmp_path / "head"
    assert (
        main(_argv("train-head", model_dirs, prompts, out, "--draft-vocab-size", "64", "--aux-layers", "0,1", "--json"))
        == 0
    )
    assert json.loads(capsys.readouterr().out)["draft_vocab_size"] == 64
    assert "--draft-vocab-size 64" in json.loads((out / "train_head.json").read_text())["command"]
