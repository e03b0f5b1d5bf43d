"""`draftlab check-head DIR --target T` (engine/head_check.py): a head measured with its config as it is fits; the
same head with norm_before_fc dropped from its config.json (vLLM then drops its input_norm weight) is found out,
with the key to set; a directory that is no head is refused in one line. The variants leave out ids the lab cannot
feed. Heads: tests/eagle3_heads.py (demo-eagle3, else the session's stand-in)."""
from __future__ import annotations

import json

from app.cli import main
from engine.head_check import MARGIN, paired_gain, variants
from tests.eagle3_heads import misserved

ARGS = ("--target", "demo-target", "--limit", "8", "--max-new-tokens", "24", "--device", "cpu", "--json")


def _check(head: str, capsys) -> dict:
    assert main(["check-head", head, *ARGS]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_head_as_trained_fits_its_configuration(demo_eagle3_head, capsys):
    result = _check(demo_eagle3_head, capsys)
    assert result["verdict"].startswith("the configuration fits") and result["suggested"] is None
    configured = result["variants"][0]
    assert configured["name"] == "as configured" and configured["acceptance"] > 0.3
    assert [v["name"] for v in result["variants"]][1:] == ["ids + 1 (trained in SGLang's convention)", "ids - 1",
                                                           "norm_before_fc off"]
    assert not any(v["clearly_better"] for v in result["variants"])
    assert result["prompts"] == 8 and result["positions"] > 8 * 10


def test_a_dropped_norm_before_fc_is_found_and_named(demo_eagle3_head, tmp_path, capsys):
    broken = misserved(demo_eagle3_head, tmp_path / "no-norm", "no-norm")
    result = _check(broken, capsys)
    flipped = result["variants"][-1]
    assert flipped["name"] == "norm_before_fc on" and flipped["clearly_better"]
    assert flipped["gain"] >= MARGIN and flipped["gain_lo"] > 0
    assert result["suggested"] == {"norm_before_fc": True}
    assert result["verdict"].startswith("this head was likely trained with the norm before fc: set norm_before_fc "
                                        "to true")


def test_a_directory_that_is_no_head_is_refused_in_one_line(tmp_path, capsys):
    assert main(["check-head", str(tmp_path), *ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {str(tmp_path)!r} is not an EAGLE-3 head directory (no config.json with "
                   f"speculators_model_type \"eagle3\"); point DIR at a speculators-format head"]


def test_variants_leave_out_ids_outside_the_target_and_gains_pair_by_prompt():
    assert [v[1] for v in variants([0, 6, 11], False, 12)] == [[0, 6, 11], [0, 6, 11]]  # +1 reaches 12, -1 is -1
    assert [v[0] for v in variants([2, 6, 9], True, 12)] == [
        "as configured", "ids + 1 (trained in SGLang's convention)", "ids - 1", "norm_before_fc off"]
    gain, lo, hi = paired_gain([(6, 10), (7, 10), (5, 10)], [(5, 10), (5, 10), (4, 10)])
    assert round(gain, 4) == round(4 / 30, 4) and lo < gain < hi
