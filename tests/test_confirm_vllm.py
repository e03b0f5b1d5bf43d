"""`draftlab confirm` against a REAL vLLM server (the CPU build from scripts/install_vllm.sh, or $DRAFTLAB_VLLM): the
demo pair measured in the lab (4 prompts, 16 new tokens, k 3, greedy), then served by vLLM with exactly the deploy
export's speculative config at concurrency 1. Required like PostgreSQL: without vLLM this test fails under
scripts/test.sh, saying why (tests/conftest.py's `vllm_command`)."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from storage.records.confirms import LATENCY_KEYS

PER_CONCURRENCY_KEYS = {
    "concurrency",
    "tokens_per_second",
    "speedup",
    "speedup_ci",
    *LATENCY_KEYS,
    "server_draft_acceptance_rate",
    "server_per_position_acceptance",
    "lab_draft_acceptance_rate",
    "lab_per_position_acceptance",
    "outputs_match_server_baseline",
    "outputs_match_lab",
    "baseline_tokens_per_second",
    "server_tokens_per_step",
    "speedup_warning",
    "outputs_test",
    "predicted_speedup",
    "predicted_speedup_ci",
    "predicted_profile_id",
    "prediction_check",
    "server_spread",
}


def test_confirm_serves_the_demo_pair_in_vllm_losslessly(tmp_path, capsys, vllm_command):
    db = f"sqlite:///{tmp_path / 'confirm.db'}"
    prompts = tmp_path / "four.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"prompt": p})
            for p in (
                "def is_prime(n):\n",
                "def flatten(nested):\n    result = []\n",
                "class Node:\n    def __init__(self",
                "for i in range(10):\n",
            )
        )
        + "\n"
    )
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft-distilled",
                "--prompts",
                str(prompts),
                "--k",
                "3",
                "--max-new-tokens",
                "16",
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
    lab = json.loads(capsys.readouterr().out)
    run_id = lab["runs"][0]["run_id"]
    assert main(["export", str(lab["experiment_id"]), "--format", "deploy", "--run", str(run_id), "--db", db]) == 0
    deploy_config = json.loads(json.loads(capsys.readouterr().out)["engines"]["vllm"]["speculative_config"])

    # --configs all: four prompts rarely make the verdict's interval narrow enough to choose; each lossless run is
    status = main(
        [
            "confirm",
            str(lab["experiment_id"]),
            "--configs",
            "all",
            "--concurrency",
            "1",
            "--repeats",
            "1",
            "--vllm",
            vllm_command,
            "--db",
            db,
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    doc = json.loads(out)
    assert set(doc) == {
        "experiment_id",
        "engine",
        "engine_version",
        "baseline",
        "configs",
        "server_starts",
        "one_server_at_a_time",
    }
    assert doc["engine"] == "vllm" and doc["engine_version"]
    assert doc["server_starts"] == 2 and doc["one_server_at_a_time"] is False  # the target alone, one speculative
    (base,) = doc["baseline"]["per_concurrency"]
    assert set(base) == {"concurrency", "tokens_per_second", *LATENCY_KEYS} and base["tokens_per_second"] > 0
    (config,) = doc["configs"]
    assert set(config) == {"label", "k", "lab_run_id", "runs", "speculative_config", "per_concurrency"}
    assert config["runs"] == [run_id]
    assert config["speculative_config"] == deploy_config  # exactly what the deploy export holds
    assert config["lab_run_id"] == run_id and config["k"] == 3
    (m,) = config["per_concurrency"]
    assert set(m) == PER_CONCURRENCY_KEYS and m["concurrency"] == 1
    assert m["outputs_match_server_baseline"] == 1.0  # greedy: speculation in the server is lossless
    assert 0 < m["server_draft_acceptance_rate"] <= 1
    assert len(m["server_per_position_acceptance"]) == 3
    assert all(0 <= a <= 1 for a in m["server_per_position_acceptance"])
    assert m["lab_draft_acceptance_rate"] == lab["runs"][0]["draft_acceptance_rate"]
    assert m["speedup_ci"] is None and m["outputs_test"] is None  # one pass: no interval; greedy: no sampled test
    # equal work per generated token (greedy: the same tokens): the tokens-per-second ratio, a result only within the
    # server's own tokens per step. One pass on a busy machine can measure a slow baseline and exceed it: then the
    # speedup is withheld and the warning names the bound (the physics guard), never shown as a result.
    ratio = m["tokens_per_second"] / m["baseline_tokens_per_second"]
    if ratio <= m["server_tokens_per_step"]:
        assert m["speedup"] == pytest.approx(ratio) and m["speedup"] > 0 and m["speedup_warning"] is None
    else:
        assert m["speedup"] is None and "tokens per step" in m["speedup_warning"], m

    assert main(["export", str(lab["experiment_id"]), "--format", "json", "--db", db]) == 0
    (stored,) = json.loads(capsys.readouterr().out)["server_confirms"]
    assert stored["status"] == "done" and stored["configs"] == doc["configs"]
