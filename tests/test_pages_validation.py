"""The detail page's validation panel and k_r distribution (AppTest on crafted records)."""

from __future__ import annotations

import json

import pytest

from storage import open_store
from storage.analysis import catalog
from storage.records import queries as q
from tests.meaning import missing
from tests.test_pages import app, assert_clean
from tests.test_validation import TUNE, _experiment


@pytest.fixture
def db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'v.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    return open_store(url)


def test_validate_button_queues_the_best_on_the_held_out_split_and_the_result_is_judged(db):
    tune = _experiment(db, TUNE)
    at = app("experiment", experiment=tune)
    assert_clean(at)
    button = next(b for b in at.button if b.key == "validate")
    assert "code:validation" in button.label
    at = button.click().run()
    assert_clean(at)
    validations = catalog.experiments(db)
    queued = validations[validations["validates"] == tune]
    assert len(queued) == 1 and queued.iloc[0]["prompts"] == "code:validation"
    assert (
        catalog.experiments(db).set_index("experiment_id").loc[tune, "validated_by"] == queued.iloc[0]["experiment_id"]
    )
    # A finished validation experiment shows tune against validation and the verdict in words.
    done = _experiment(db, {2: TUNE[2]}, prompts="code:validation", validates=tune)
    at = app("experiment", experiment=done)
    assert_clean(at)
    assert any(s.value == "Validation" for s in at.subheader)
    shown = next(d for d in at.dataframe if "experiment" in d.value)  # tune beside validation, headers in words
    config = json.loads(shown.proto.columns)
    assert config["alpha"]["label"] == "α" and config["speedup_ci_lo"]["label"] == "95 % low"
    assert shown.value["alpha"].tolist() == pytest.approx([0.8, 0.8])
    assert any(
        "holds" in m.value and "α 0.800 on both code:tune and code:validation" in m.value.replace("\u2060", "")
        for m in at.success
    )
    # ... and findings: the validation's own (a done validation experiment used to have "Nothing to report yet").
    assert not any("Nothing to report" in c.value for c in at.caption)
    assert any(
        not missing(m.value.replace("\u2060", "").replace("\\", ""), "experiment #1 ", "holds", "code:validation")
        for m in at.markdown
    )
    worse = _experiment(db, {2: [[0, 0, 1, 0, 2, 0, 0, 0] * 3]}, prompts="code:validation", validates=tune)
    at = app("experiment", experiment=worse)
    assert any("does not hold" in w.value for w in at.warning)


def test_k_distribution_shows_for_a_drafter_that_varies_k(db):
    eid = _experiment(db, TUNE)
    with db.write() as conn:
        from sqlalchemy import text

        conn.execute(
            text("UPDATE runs SET drafter = 'heuristic' WHERE experiment_id = :e AND kind = 'speculative'"), {"e": eid}
        )
    at = app("experiment", experiment=eid, section="Why drafts are rejected")
    assert_clean(at)
    assert any(s.value.startswith("Tokens drafted per round") for s in at.subheader)
    spec = q.runs(db, eid)
    rid = int(spec[spec["k"] == 2]["run_id"].iloc[0])
    dist = q.k_distribution(db, rid)
    assert dist["rounds"].sum() == q.run_summary(db, rid)["rounds"].iloc[0] and dist["share"].sum() == pytest.approx(1)
