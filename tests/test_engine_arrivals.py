"""Token arrival times from the batch-1 decoders (issue 20): the speculative loop and the target-only baseline record
when each output token reached the host, seconds from the decode's start, as the batched decoders do (a round's
tokens share one arrival), so a plain batch-1 `draftlab run` stores TTFT, inter-token latency and request latency
for every run."""

from __future__ import annotations

import json

import pytest

from engine.decoding import runs
from engine.decoding.sampling import SamplingConfig
from tests import tiny_models as tm

PROMPTS = ["t3 t4 t5", "t9 t7 t22 t40 t41 t2", "t12 t13"]


@pytest.fixture(scope="module")
def pair():
    target = tm.llama(0, layers=2, sharpness=4.0)
    return tm.pair(target, tm.noisy_copy(target, 1, 0.6))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_speculative_loop_records_one_arrival_per_round(pair, temperature):
    cfg = SamplingConfig(temperature=temperature, max_new_tokens=20, seed=2)
    ids = runs.encode_prompts(pair, PROMPTS, cfg.max_new_tokens)
    results = list(runs.run_prompts(runs.speculative_decoder(pair, cfg, 3), PROMPTS, ids))
    several = 0
    for result in results:
        arrivals = result.token_seconds
        assert arrivals is not None and len(arrivals) == len(result.output_ids)
        assert 0 < arrivals[0] and arrivals == sorted(arrivals) and arrivals[-1] <= result.wall_seconds
        # Each round's emitted tokens share one arrival, and rounds arrive one after another.
        at = 0
        per_round = []
        for rd in result.rounds:
            times = arrivals[at : at + len(rd.emitted_ids)]
            assert len(set(times)) == 1
            per_round.append(times[0])
            several += len(rd.emitted_ids) > 1
            at += len(rd.emitted_ids)
        assert at == len(arrivals)
        assert all(a < b for a, b in zip(per_round, per_round[1:]))
    assert several > 0  # some round emitted several tokens at once


def test_the_baseline_records_one_arrival_per_token(pair):
    cfg = SamplingConfig(temperature=0.0, max_new_tokens=20)
    ids = runs.encode_prompts(pair, PROMPTS, cfg.max_new_tokens)
    for result in runs.run_prompts(runs.baseline_decoder(pair, cfg), PROMPTS, ids):
        arrivals = result.token_seconds
        assert arrivals is not None and len(arrivals) == len(result.output_ids) > 1
        assert 0 < arrivals[0] and all(a < b for a, b in zip(arrivals, arrivals[1:]))
        assert arrivals[-1] <= result.wall_seconds


def test_a_plain_batch_1_run_stores_serving_metrics(tmp_path, model_dirs, capsys):
    """`draftlab run` without --batch-size decodes through the batch-1 decoders; every run, the baseline too, has
    its TTFT, ITL and latency percentiles."""
    from app.cli import main

    db = f"sqlite:///{tmp_path / 'plain.db'}"
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
                "--k",
                "1,3",
                "--max-new-tokens",
                "10",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--db",
                db,
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    for entry in [doc["baseline"], *doc["runs"]]:
        assert entry["batch_size"] == 1
        assert 0 < entry["ttft_seconds_p50"] <= entry["ttft_seconds_p95"] <= entry["request_latency_seconds_p95"]
        assert (
            0 <= entry["itl_seconds_p50"] <= entry["itl_seconds_p95"]
            and entry["request_latency_seconds_p50"] <= entry["request_latency_seconds_p95"]
        )
