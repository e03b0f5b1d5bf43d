"""Who launched it (issue 21 item 5): experiments and training jobs record their launcher, and a per-launcher cap
on unfinished runs refuses more work in one line (storing nothing); other launchers are not affected."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from storage.analysis import catalog
from storage.db.errors import QueueError
from storage.jobs.experiments import enqueue_experiment
from storage.jobs.training import enqueue_training
from storage.records import queries as q
from tests.meaning import missing


def _launch(store, who, values=(1, 2, 4)):
    return enqueue_experiment(
        store,
        name="x",
        target="t",
        draft="d",
        prompts="code:tune",
        sampling={"max_new_tokens": 8},
        sweep_values=list(values),
        launched_by=who,
    )


def test_launcher_is_recorded_and_capped_per_launcher(store, monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTLAB_LIMIT_QUEUED_RUNS", "6")
    first = _launch(store, "oidc:ana@example.com")  # 4 runs
    assert q.experiment(store, first)["launched_by"] == "oidc:ana@example.com"
    with pytest.raises(QueueError) as err:
        _launch(store, "oidc:ana@example.com")
    said = ("oidc:ana@example.com", "has 4", "adds 4", "limit of 6", "DRAFTLAB_LIMIT_QUEUED_RUNS")  # who, cap, knob
    assert not missing(str(err.value), *said), err.value
    assert len(catalog.experiments(store)) == 1  # nothing stored
    _launch(store, "password from 10.0.0.7")  # another launcher has its own budget
    with store.write() as conn:  # finished work no longer counts
        conn.execute(text("UPDATE runs SET status = 'done' WHERE experiment_id = :e"), {"e": first})
    _launch(store, "oidc:ana@example.com", values=(1,))
    job = enqueue_training(
        store,
        name="d2",
        target="t",
        draft="d",
        prompts="code",
        validation="code:validation",
        steps=5,
        models=tmp_path,
        launched_by="oidc:ana@example.com",
    )  # 2 + 1 = 3 of 6
    with store.read() as conn:
        assert (
            conn.execute(text("SELECT launched_by FROM training_jobs WHERE id = :j"), {"j": job}).scalar()
            == "oidc:ana@example.com"
        )
    _launch(store, None)  # unattributed (an older caller): no cap
    with pytest.raises(QueueError, match="has 3 unfinished runs"):
        _launch(store, "oidc:ana@example.com", values=(1, 2, 4, 8))


def test_cli_runs_record_the_cli_user(tmp_path, capsys):
    import getpass

    from app.cli import main
    from storage import open_store

    db = f"sqlite:///{tmp_path / 'l.db'}"
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
                "2",
                "--max-new-tokens",
                "4",
                "--repeats",
                "1",
                "--db",
                db,
            ]
        )
        == 0
    )
    store = open_store(db)
    eid = int(catalog.experiments(store)["experiment_id"].iloc[0])
    assert q.experiment(store, eid)["launched_by"].startswith(f"cli {getpass.getuser()}@")


def test_dashboard_launch_records_the_session(tmp_path, monkeypatch, model_dirs):
    from storage import open_store
    from tests.test_pages import _fill, app

    url = f"sqlite:///{tmp_path / 'd.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    at = _fill(app("new"), model_dirs, sweep_values="2")
    at.button(key="launch").click().run()
    store = open_store(url)
    eid = int(catalog.experiments(store)["experiment_id"].iloc[0])
    assert q.experiment(store, eid)["launched_by"] == "local localhost"  # no login; no address: this machine


def test_uploads_are_pruned_after_their_retention_unless_a_training_job_reads_them(tmp_path, monkeypatch):
    """limit("upload_days"): an upload older than that goes when the next one is saved; one an unfinished training
    job reads stays, and so does the file just uploaded again (its retention starts over)."""
    import os
    import time

    from pages import new_experiment as ne
    from storage import open_store

    url = f"sqlite:///{tmp_path / 'u.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path / "uploads"))
    monkeypatch.setenv("DRAFTLAB_LIMIT_UPLOAD_DAYS", "30")
    store = open_store(url)
    old = ne.save_upload("old.txt", b"a b\n")
    used = ne.save_upload("used.txt", b"c d\n")
    again = ne.save_upload("again.txt", b"e f\n")
    long_ago = time.time() - 31 * 86400
    for path in (old, used, again):
        os.utime(path, (long_ago, long_ago))
    enqueue_training(
        store,
        name="d3",
        target="t",
        draft="d",
        prompts=str(used),
        validation="code:validation",
        steps=5,
        models=tmp_path / "models",
    )
    ne.save_upload("again.txt", b"e f\n")  # the same content uploaded again
    assert not old.exists() and used.exists() and again.exists()
    assert ne.prune_uploads() == []  # nothing else is due
