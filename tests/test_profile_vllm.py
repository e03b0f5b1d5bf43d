"""`draftlab profile` against a REAL vLLM server (the CPU build from scripts/install_vllm.sh, or $DRAFTLAB_VLLM): the
demo pair measured in the lab at k 3, then its drafter served at k 2 beside the target alone. The step costs are
stored per pass; the server's tokens per step from them (decode tokens / drafts) equal the one its counters give
(1 + accepted / drafts: vLLM counts one draft a request and decode step, none for the prefill); the run is predicted
at k 1 (interpolated between k 0 and 2) and k 2, with intervals. Required like PostgreSQL: without vLLM this test
fails under scripts/test.sh, saying why (tests/conftest.py's `vllm_command`)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from app.cli import main
from storage import open_store


def test_profile_measures_vllms_step_cost_and_predicts_the_lab_run(tmp_path, capsys, vllm_command):
    db = f"sqlite:///{tmp_path / 'profile.db'}"
    prompts = tmp_path / "four.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"prompt": p})
            for p in (
                "def is_prime(n):\n",
                "class Node:\n    def __init__(self",
                "for i in range(10):\n",
                "import os\n",
            )
        )
        + "\n"
    )
    lab = [
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
        "24",
        "--repeats",
        "1",
        "--device",
        "cpu",
        "--db",
        db,
        "--json",
    ]
    assert main(lab) == 0
    doc = json.loads(capsys.readouterr().out)
    eid, run_id = doc["experiment_id"], doc["runs"][0]["run_id"]
    status = main(
        ["profile", str(eid), "--ks", "2", "--concurrency", "1", "--repeats", "2", "--vllm", vllm_command]
        + ["--db", db, "--json"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    profile = json.loads(out)
    costs = {c["k"]: c for c in profile["costs"]}
    assert sorted(costs) == [0, 2] and costs[0]["passes"] == 2 and costs[2]["passes"] == 2
    assert all(c["step_seconds"] > 0 for c in costs.values()) and costs[0]["tokens_per_step"] == 1.0

    store = open_store(db)
    try:
        with store.read() as conn:
            counted = conn.execute(
                text(
                    "SELECT 1.0 + 1.0 * s.accepted / s.drafts FROM server_measurements m JOIN production_series s "
                    "ON s.id = m.series_id WHERE m.k = 2"
                )
            ).scalar()
    finally:
        store.dispose()
    assert 1 < costs[2]["tokens_per_step"] <= 3
    assert costs[2]["tokens_per_step"] == pytest.approx(float(counted), rel=0.1)

    predicted = profile["server_predicted"][str(run_id)]
    assert predicted["profile"]["profile_id"] == profile["profile_id"]
    assert predicted["profile"]["engine_version"]  # vLLM's own /version
    cells = predicted["concurrency"]["1"]
    assert sorted(cells) == ["1", "2"] and cells["1"]["interpolated"] and not cells["2"]["interpolated"]
    for cell in cells.values():
        lo, hi = cell["speedup_ci"]
        assert 0 < lo <= cell["speedup"] <= hi
    assert predicted["schedule"]["1"] in (0, 1, 2)
