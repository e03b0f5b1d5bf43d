"""--draft-sampling probabilistic|greedy as a swept variable (engine/config/variables.py): stored on every run, executed
by the worker (greedy runs propose argmax drafts: p_draft 1 on every draft token), shown and deployed."""

from __future__ import annotations

import json

from sqlalchemy import text

from app.cli import main
from storage import open_store
from storage.analysis import catalog
from storage.records import queries as q


def test_a_draft_sampling_sweep_runs_end_to_end(tmp_path, capsys, db_url):
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft",
                "--prompts",
                "code:validation",
                "--k",
                "3",
                "--temperature",
                "1",
                "--draft-sampling",
                "probabilistic,greedy",
                "--max-new-tokens",
                "8",
                "--repeats",
                "1",
                "--db",
                db_url,
                "--json",
            ]
        )
        == 0
    ), capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    store = open_store(db_url)
    eid = doc["experiment_id"] if "experiment_id" in doc else int(catalog.experiments(store)["experiment_id"].max())
    runs = q.runs(store, eid)
    spec = runs[runs["kind"] == "speculative"].sort_values("sweep_value")
    assert spec["sweep_label"].tolist() == ["probabilistic", "greedy"]
    assert (runs["kind"] == "baseline").sum() == 1  # the target decodes alike: one shared baseline
    with store.read() as conn:
        modes = dict(conn.execute(text("SELECT id, draft_sampling FROM runs WHERE kind = 'speculative'")).all())
        greedy_id = next(r for r, m in modes.items() if m == "greedy")
        prob_id = next(r for r, m in modes.items() if m == "probabilistic")
        p_greedy = conn.execute(
            text("SELECT MIN(p_draft), MAX(p_draft) FROM draft_tokens WHERE run_id = :r"), {"r": greedy_id}
        ).one()
        p_prob = conn.execute(text("SELECT MIN(p_draft) FROM draft_tokens WHERE run_id = :r"), {"r": prob_id}).scalar()
    assert tuple(p_greedy) == (1.0, 1.0)  # argmax drafts, verified as point masses
    assert p_prob < 1.0  # drawn from the draft's distribution
    assert q.experiment(store, eid)["sweep_variable"] == "draft_sampling"
    assert main(["export", str(eid), "--format", "deploy", "--run", str(greedy_id), "--db", db_url]) == 0
    deploy = json.loads(capsys.readouterr().out)
    assert json.loads(deploy["engines"]["vllm"]["speculative_config"])["draft_sample_method"] == "greedy"
    assert deploy["configuration"]["draft_sampling"] == "greedy"


def test_bad_draft_sampling_is_one_line(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert (
        main(
            [
                "run",
                "--target",
                "demo-target",
                "--draft",
                "demo-draft",
                "--prompts",
                "code:validation",
                "--draft-sampling",
                "argmax",
                "--db",
                db,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not one of probabilistic, greedy" in err and err.count("\n") == 1
