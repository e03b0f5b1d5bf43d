"""`draftlab check-head DIR --target T` (engine/models/head_check.py): a head measured with its config as it is fits;
the same head with norm_before_fc dropped from its config.json (vLLM then drops its input_norm weight) is found out,
with the key to set; a directory that is no head is refused in one line. The variants leave out ids the lab cannot feed.
Heads: tests/eagle3_heads.py (demo-eagle3, else the session's stand-in)."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import main
from engine.models.head_check import MARGIN, paired_gain, variants
from tests.eagle3_heads import misserved
from tests.meaning import missing

ARGS = ("--target", "demo-target", "--limit", "8", "--max-new-tokens", "24", "--device", "cpu", "--json")


def _check(head: str, capsys) -> dict:
    assert main(["check-head", head, *ARGS]) == 0
    return json.loads(capsys.readouterr().out)


def _trained_with_norm(head: str) -> bool:
    return bool(json.loads((Path(head) / "config.json").read_text()).get("norm_before_fc", False))


def test_a_head_as_trained_fits_its_configuration(demo_eagle3_head, capsys):
    result = _check(demo_eagle3_head, capsys)
    assert result["verdict"].startswith("the configuration fits") and result["suggested"] is None
    configured = result["variants"][0]
    assert configured["name"] == "as configured" and configured["acceptance"] > 0.3
    flip = "norm_before_fc off" if _trained_with_norm(demo_eagle3_head) else "norm_before_fc on"
    assert [v["name"] for v in result["variants"]][1:] == ["ids + 1 (trained in SGLang's convention)", "ids - 1", flip]
    assert not any(v["clearly_better"] for v in result["variants"])
    assert result["prompts"] == 8 and result["positions"] > 8 * 10


def test_a_norm_before_fc_read_differently_from_training_is_found_and_named(demo_eagle3_head, tmp_path, capsys):
    """The head's config.json saying the opposite of how it was trained (the norm dropped from a head trained with
    it, or switched on for one trained without: demo-eagle3): the flipped variant is clearly better, and the key to
    set is named."""
    trained = _trained_with_norm(demo_eagle3_head)
    broken = misserved(demo_eagle3_head, tmp_path / "misread", "no-norm" if trained else "norm-on")
    result = _check(broken, capsys)
    flipped = result["variants"][-1]
    assert flipped["name"] == f"norm_before_fc {'on' if trained else 'off'}" and flipped["clearly_better"]
    assert flipped["gain"] >= MARGIN and flipped["gain_lo"] > 0
    assert result["suggested"] == {"norm_before_fc": trained}
    assert f"norm_before_fc to {'true' if trained else 'false'}" in result["verdict"], result["verdict"]


def test_a_directory_that_is_no_head_is_refused_in_one_line(tmp_path, capsys):
    assert main(["check-head", str(tmp_path), *ARGS]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # one line: the directory, what it is not, the key read
    said = (repr(str(tmp_path)), "not an EAGLE-3 head", "config.json", "speculators_model_type")
    assert line.startswith("error: ") and not missing(line, *said), line


def test_variants_leave_out_ids_outside_the_target_and_gains_pair_by_prompt():
    assert [v[1] for v in variants([0, 6, 11], False, 12)] == [[0, 6, 11], [0, 6, 11]]  # +1 reaches 12, -1 is -1
    assert [v[0] for v in variants([2, 6, 9], True, 12)] == [
        "as configured",
        "ids + 1 (trained in SGLang's convention)",
        "ids - 1",
        "norm_before_fc off",
    ]
    gain, lo, hi = paired_gain([(6, 10), (7, 10), (5, 10)], [(5, 10), (5, 10), (4, 10)])
    assert round(gain, 4) == round(4 / 30, 4) and lo < gain < hi
