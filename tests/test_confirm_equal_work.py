"""A confirm's server speedup compares equal work and is shown only when it is a result (issue 35 item 0): per
generated token (the lab's definition: tokens per second, speculative over target-only, paired by pass), never
above the server's own tokens per step, and never for a configuration whose outputs speculation changed. Under
sampling the two servers' answers are compared (engine/metrics/sampled_outputs.py's tests); a difference is an error
finding, with no speedup beside it. Against the stand-in server (tests/fake_vllm.py): its "short" fault answers
sampled requests in 6-10 tokens as vLLM 0.32's CPU build does, its "fast" fault times steps at nothing."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.cli import main
from app.serving.completions_load import PassRecord
from engine.metrics.sampled_outputs import ALPHA, MIN_PROMPTS, compare_sampled
from tests.meaning import missing

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])


class _Pass(PassRecord):
    def __init__(self, tokens: int, wall: float):
        super().__init__(concurrency=1, wall_seconds=wall, requests=[])
        self.tokens = tokens

    @property
    def new_tokens(self) -> int:
        return self.tokens


def test_the_speedup_is_per_generated_token_not_the_wall_ratio_of_unequal_work():
    from storage.records.confirms import pass_speedup

    # the confirm: the target-only server generated 864 tokens a pass, the speculative one 117 and 181
    base = [_Pass(864, 4.15), _Pass(864, 4.16)]
    spec = [_Pass(117, 2.09), _Pass(181, 3.23)]
    speedup, (lo, hi) = pass_speedup(base, spec)
    assert speedup == pytest.approx((298 / 5.32) / (1728 / 8.31))  # 56 tok/s against 208: 0.27×, not 1.57×
    assert lo <= speedup <= hi < 0.3
    same = [_Pass(100, 2.0), _Pass(100, 4.0)]
    assert pass_speedup(same, [_Pass(100, 1.0), _Pass(100, 2.0)])[0] == pytest.approx(2.0)  # equal work: the walls


def test_a_speedup_above_the_servers_tokens_per_step_or_over_changed_outputs_is_withheld():
    from storage.records.confirms import withheld

    greedy_same = {"outputs_match_server_baseline": 1.0}
    # the figures: 1.57× (1.35–1.89) from a server emitting 1.09 tokens per step
    why = withheld(1.57, [1.35, 1.89], 1.09, greedy_same, None)
    assert not missing(why, "1.57", "1.09 tokens per step", "--repeats"), why  # the bound, and the fix
    assert withheld(1.15, [1.02, 1.3], 1.09, greedy_same, None) is None  # the interval reaches the bound: noise
    assert withheld(1.15, None, 1.09, greedy_same, None) is not None  # one pass: its figure is the bound
    assert withheld(1.5, [1.4, 1.6], None, greedy_same, None) is None  # no counters, no bound
    assert "greedy outputs" in withheld(1.2, [1.1, 1.3], 3.0, {"outputs_match_server_baseline": 0.75}, None)
    differs = compare_sampled([[8]] * 12, [[40]] * 12, None, None)
    assert "output distribution" in withheld(1.2, [1.1, 1.3], 3.0, {}, differs)


def _lengths(side):
    return [[len(answer) for answer in answers] for answers in side]


def test_the_sampled_output_tests_can_fail_and_keep_their_level():
    rng = np.random.default_rng(7)

    def answers(prompts, per_prompt, vocab, lo, hi, seeded=False):  # per prompt: its answers over the passes
        def one(p):
            return list((3 * p + rng.integers(0, vocab, size=rng.integers(lo, hi + 1))) % 400)  # shared tokens

        return [[one(p)] * per_prompt if seeded else [one(p) for _ in range(per_prompt)] for p in range(prompts)]

    alarms = 0
    for seed in range(20):  # the same distribution on both sides: under the family-wise 1 %, so no alarm here
        a, b = answers(12, 2, 40, 20, 48), answers(12, 2, 40, 20, 48)
        result = compare_sampled(_lengths(a), _lengths(b), a, b, seed=seed)
        alarms += result["differs"]
        # a request's seed: one draw per prompt, answered again every pass. The prompt is the unit, so the
        # repeats are not counted as evidence (counting each answer, all 20 of these alarmed)
        a, b = answers(18, 2, 30, 20, 48, seeded=True), answers(18, 2, 30, 20, 48, seeded=True)
        alarms += compare_sampled(_lengths(a), _lengths(b), a, b, seed=seed)["differs"]
    assert alarms == 0 and result["prompts"] == 12 and result["answers"] == 24 and result["alpha"] == ALPHA
    # equal lengths, other tokens: the token test alone finds it
    a, b = answers(12, 2, 40, 30, 30), answers(12, 2, 120, 30, 30)
    result = compare_sampled(_lengths(a), _lengths(b), a, b)
    assert result["lengths_p"] == 1.0 and result["tokens_p"] < ALPHA / 2 and result["differs"] is True
    short = answers(12, 2, 40, 6, 10)  # the issue's: stopped after 6-10 tokens
    result = compare_sampled(_lengths(short), _lengths(b), short, b)
    assert result["lengths_p"] < ALPHA / 2 and result["differs"] is True
    few = MIN_PROMPTS - 1  # too few prompts to reach the level: nothing concluded
    assert compare_sampled([[8, 8]] * few, [[40, 40]] * few, None, None)["differs"] is None


@pytest.fixture()
def sampled_lab(tmp_path, model_dirs, capsys):
    """A tiny k=2 experiment sampled at temperature 1 on twelve prompts, 48 new tokens: (experiment id, db URL)."""
    from tests.cli_runs import run_json

    prompts = tmp_path / "twelve.txt"
    prompts.write_text("".join(f"t{i} t{i + 1} t{2 * i + 3}\n" for i in range(12)))
    doc, db = run_json(
        tmp_path,
        model_dirs,
        capsys,
        "--k",
        "2",
        "--repeats",
        "1",
        "--max-new-tokens",
        "48",
        "--temperature",
        "1",
        "--prompts",
        str(prompts),
    )
    return doc["experiment_id"], db


def _confirm(eid, db, capsys, monkeypatch, fault: str, repeats: int = 2) -> tuple[int, dict, list[dict], float]:
    """Confirm every run at concurrency 1 against the stand-in (2 ms a step): (exit status, the configuration's
    one measurement, the experiment's confirm findings, the wall ratio Σ target-only wall / Σ speculative wall)."""
    from sqlalchemy import text

    from storage import open_store
    from storage.analysis.findings import findings

    monkeypatch.setenv("FAKE_VLLM_FAULT", fault)
    monkeypatch.setenv("FAKE_VLLM_STEP_SECONDS", "0.002")
    status = main(
        [
            "confirm",
            str(eid),
            "--configs",
            "all",
            "--concurrency",
            "1",
            "--repeats",
            str(repeats),
            "--vllm",
            FAKE,
            "--db",
            db,
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert len(doc["configs"]) == 1, err
    (config,) = doc["configs"]
    (m,) = config["per_concurrency"]
    store = open_store(db)
    try:
        found = [f for f in findings(store, eid) if f["kind"] == "confirm"]
        with store.read() as conn:
            walls: dict[Any, Any] = dict(
                conn.execute(
                    text(
                        "SELECT m.k, SUM(p.wall_seconds) FROM server_measurements m JOIN "
                        "server_passes p ON p.measurement_id = m.id GROUP BY m.k"
                    )
                ).all()
            )
    finally:
        store.dispose()
    return status, m, found, walls[0] / walls[config["k"]]


def test_a_server_whose_sampled_answers_stop_early_shows_no_speedup_and_one_error(sampled_lab, capsys, monkeypatch):
    eid, db = sampled_lab
    status, m, found, wall_ratio = _confirm(eid, db, capsys, monkeypatch, "short:2")
    assert status == 0
    assert wall_ratio > 1.2  # what the wall-time ratio read as a "gain"
    test = m["outputs_test"]
    assert test["differs"] is True and (test["prompts"], test["answers"]) == (12, 24)
    assert test["lengths_p"] < ALPHA / 2
    assert test["speculative_mean_length"] <= 10 < test["baseline_mean_length"]
    assert m["speedup"] is None and m["speedup_ci"] is None
    assert "output distribution" in m["speedup_warning"]
    assert 1 < m["server_tokens_per_step"] < 1.2  # the server: 1.09
    (error,) = [f for f in found if f["severity"] == "error"]
    assert "changed the output distribution" in error["title"] and "_expand_kernel_impl" in error["detail"]
    assert [f["title"] for f in found] == [error["title"]]  # no gains, collapse or position beside it


def test_a_sampled_server_that_samples_like_its_target_shows_its_speedup(sampled_lab, capsys, monkeypatch):
    eid, db = sampled_lab
    status, m, found, _ = _confirm(eid, db, capsys, monkeypatch, "")
    assert status == 0
    assert m["outputs_test"]["differs"] is False and m["speedup_warning"] is None
    assert m["speedup"] == pytest.approx(m["tokens_per_second"] / m["baseline_tokens_per_second"])
    assert m["speedup_ci"][0] <= m["server_tokens_per_step"]
    assert not [f for f in found if f["severity"] == "error"]


def test_a_speedup_above_the_servers_tokens_per_step_is_a_warning_not_a_result(
    tmp_path, model_dirs, capsys, monkeypatch
):
    from tests.cli_runs import run_json

    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "2", "--repeats", "1", "--max-new-tokens", "12")
    status, m, found, _ = _confirm(doc["experiment_id"], db, capsys, monkeypatch, "fast:2", repeats=2)
    assert status == 0 and m["outputs_match_server_baseline"] == 1.0 and m["outputs_test"] is None
    assert m["speedup"] is None and "tokens per step" in m["speedup_warning"]
    (warning,) = [f for f in found if "speedup" in f["title"] or "gains" in f["title"]]
    assert warning["severity"] == "warning" and "has no speedup to show" in warning["title"]
