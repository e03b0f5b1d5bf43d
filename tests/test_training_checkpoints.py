"""`train-head` and `distill` over a checkpoint of other settings (one rule, engine/training/distill.py load_checkpoint,
for both): refused in one line naming what differs (old and new) and how to go on, the checkpoint kept as it was; the
checkpoint's own settings resume it; --overwrite discards it and starts over. Before the fix a changed --lr restarted
from step 0 and overwrote the checkpoint."""

from __future__ import annotations

import pytest

from app.cli import main


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.fixture
def interrupted(model_dirs, tmp_path, monkeypatch, capsys):
    """interrupted(command, out, lr): run `command` until its checkpoint at step 2, then Ctrl-C at step 3; returns
    the argv builder (lr -> argv)."""
    import app.training.distill_driver as driver

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t5 t6 t7\nt9 t3 t22 t40\nt12 t13\nt30 t31 t32\n")
    monkeypatch.setattr(driver, "CHECKPOINT_SECONDS", 0.0)
    original = driver.checkpoint

    def argv(command, out, lr, *extra):
        common = [
            "--target",
            model_dirs["target"],
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--steps",
            "5",
            "--max-new-tokens",
            "6",
            "--batch-size",
            "2",
            "--lr",
            lr,
            "--device",
            "cpu",
            *extra,
        ]
        if command == "train-head":
            return ["train-head", *common, "--ttt-steps", "2", "--aux-layers", "0,1"]
        return ["distill", "--draft", model_dirs["draft"], *common]

    def run(command, out, lr):
        def stop_at_3(run, ckpt):
            if run.step == 3:
                raise KeyboardInterrupt
            return original(run, ckpt)

        monkeypatch.setattr(driver, "checkpoint", stop_at_3)
        assert main(argv(command, out, lr)) == 130
        assert "holds step 2" in _lines(capsys.readouterr().err)[0]
        monkeypatch.setattr(driver, "checkpoint", original)
        return lambda lr, *extra: argv(command, out, lr, *extra)

    return run


@pytest.mark.parametrize("command", ["train-head", "distill"])
def test_other_settings_are_refused_naming_what_differs_and_the_checkpoint_resumes(
    command, interrupted, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = interrupted(command, out, "1e-3")
    state = out / ".checkpoint" / "state.pt"
    saved = state.read_bytes()

    assert main(argv("2e-3")) == 2
    err = capsys.readouterr().err
    (line,) = _lines(err)
    assert "Traceback" not in err
    assert "--lr: checkpoint 0.001, now 0.002" in line and "new --out" in line and "resume" in line
    assert state.read_bytes() == saved and not (out / "model.safetensors").exists()  # nothing lost or written

    assert main(argv("1e-3")) == 0  # the checkpoint's own settings: continued, not restarted
    assert "continuing from the checkpoint" in capsys.readouterr().err and (out / "model.safetensors").exists()


def test_overwrite_discards_a_checkpoint_of_other_settings_and_starts_over(interrupted, tmp_path, capsys):
    out = tmp_path / "out"
    argv = interrupted("train-head", out, "1e-3")
    assert main(argv("2e-3", "--overwrite")) == 0
    assert "continuing from the checkpoint" not in capsys.readouterr().err
    assert "--lr 0.002" in (out / "MODEL_CARD.md").read_text()


def test_changes_name_settings_and_prompts():
    from engine.training.distill import checkpoint_changes

    saved = {"config": {"lr": 1e-3, "steps": 5}, "target": "t", "train": ["a", "b"], "validation": ["c"]}
    now = {"config": {"lr": 2e-3, "steps": 5}, "target": "t", "train": ["a", "x"], "validation": ["c"]}
    assert checkpoint_changes(saved, saved) == []
    lr, prompts = checkpoint_changes(saved, now)  # each change names its flag, the checkpoint's and today's
    assert lr == "--lr: checkpoint 0.001, now 0.002"
    assert prompts.startswith("--prompts") and "other" in prompts, prompts  # as many prompts, other ones
