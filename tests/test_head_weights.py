"""A head whose weights file does not read (truncated, garbage) is one error line naming the file and the fix, on
every path that reads a head (engine/models/weight_files.py, the check a causal LM's files get): `run --draft HEAD`,
`check-head` and `convert-head`; nothing is stored or written."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from app.cli import main
from tests.test_eagle3 import write_head


@pytest.fixture(scope="module")
def good_head(model_dirs, tmp_path_factory):
    target = AutoModelForCausalLM.from_pretrained(model_dirs["target"])  # 2 layers: aux [1], which SGLang reads too
    return write_head(tmp_path_factory.mktemp("heads") / "head", target, verifier=model_dirs["target"], aux=[1])


def _damaged(good_head, tmp_path, damage):
    import shutil

    broken = tmp_path / f"head-{damage}"
    shutil.copytree(good_head, broken)
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"not a safetensors file" * 4 if damage == "garbage" else data[: len(data) // 2])
    return broken, weights


def _commands(head, model_dirs, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t3 t4 t5\nt9 t10\n")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    return {
        "run": [
            "run",
            "--target",
            model_dirs["target"],
            "--draft",
            str(head),
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "4",
            "--db",
            db,
        ],
        "check-head": [
            "check-head",
            str(head),
            "--target",
            model_dirs["target"],
            "--prompts",
            str(prompts),
            "--device",
            "cpu",
        ],
        "convert-head": ["convert-head", str(head), "--to", "sglang", "--out", str(tmp_path / "converted")],
    }


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.parametrize("command", ["run", "check-head", "convert-head"])
def test_a_damaged_head_is_one_line_naming_its_file(good_head, model_dirs, tmp_path, capsys, command, damage):
    broken, weights = _damaged(good_head, tmp_path, damage)
    argv = _commands(broken, model_dirs, tmp_path)[command]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot load EAGLE-3 head"), err
    assert str(weights) in lines[0] and "corrupt or truncated" in lines[0] and "train-head" in lines[0]
    assert not (tmp_path / "converted").exists()
    if (tmp_path / "runs.db").exists():  # run: nothing stored
        from storage import open_store
        from storage.records import queries as q

        assert q.experiment_rows(open_store(f"sqlite:///{tmp_path / 'runs.db'}")).empty


def test_the_undamaged_head_passes_the_same_check(good_head, model_dirs, tmp_path, capsys):
    """The control: the same commands on the head as written get past the weights (convert-head writes it)."""
    assert main(_commands(good_head, model_dirs, tmp_path)["convert-head"]) == 0
    assert (tmp_path / "converted" / "model.safetensors").exists()
