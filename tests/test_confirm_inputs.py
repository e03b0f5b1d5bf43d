"""`draftlab confirm` and `import-metrics` refuse bad input before anything is stored, and an exception no check
foresaw inside a confirm is stored as its error (issue 35 items 3 and 8): a broken --server / --baseline-server
URL (each named as itself), an empty or unbalanced --vllm or $DRAFTLAB_VLLM are one line and exit status 2 with no
confirm row; import-metrics' broken URL the same with no series; a fault inside measure() is one line, exit status
1 and a confirm stored `failed` with that line; and where the verdict chooses no run, confirm's hint names its own
flag (--configs), not export's --run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from app.cli import main

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])


@pytest.fixture()
def lab(tmp_path, model_dirs, capsys):
    """A tiny k=2 experiment on four prompts: (experiment id, database URL)."""
    from tests.cli_runs import run_json

    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "2", "--repeats", "1", "--max-new-tokens", "6")
    return doc["experiment_id"], db


def _count(db: str, table: str) -> int:
    from storage import open_store

    store = open_store(db)
    try:
        with store.read() as conn:
            return int(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar_one())
    finally:
        store.dispose()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "options, named",
    [
        (["--server", "http://[::1", "--baseline-server", "http://127.0.0.1:9"], "--server 'http://[::1'"),
        (["--server", "http://127.0.0.1:9", "--baseline-server", "http://[::1"], "--baseline-server 'http://[::1'"),
        (["--server", "http://127.0.0.1:9", "--baseline-server", "gpu-box:8000"], "--baseline-server 'gpu-box:8000'"),
        (["--server", "http://127.0.0.1:9", "--baseline-server", "http://127.0.0.1:99999"], "--baseline-server"),
        (["--vllm", ""], "--vllm is empty"),
        (["--vllm", '"python -m vllm'], "--vllm '\"python -m vllm' is not a command line"),
    ],
)
def test_a_bad_server_url_or_vllm_command_is_one_line_before_any_row(lab, capsys, options, named):
    eid, db = lab
    assert main(["confirm", str(eid), "--configs", "all", *options, "--db", db]) == 2
    assert named in _one_line(capsys)
    assert _count(db, "server_confirms") == 0


def test_a_bad_draftlab_vllm_is_named_as_itself(lab, capsys, monkeypatch):
    eid, db = lab
    monkeypatch.setenv("DRAFTLAB_VLLM", "python -c 'unbalanced")
    assert main(["confirm", str(eid), "--configs", "all", "--db", db]) == 2
    assert "$DRAFTLAB_VLLM" in _one_line(capsys)
    assert _count(db, "server_confirms") == 0


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1]:99999/metrics", "http:///metrics"])
def test_import_metrics_refuses_a_broken_url_in_one_line(lab, capsys, url):
    eid, db = lab
    assert main(["import-metrics", url, "--experiment", str(eid), "--db", db]) == 2
    assert "SOURCE" in _one_line(capsys)
    assert _count(db, "production_series") == 0


def test_an_unforeseen_fault_inside_a_confirm_is_stored_as_its_error(lab, capsys, monkeypatch):
    import app.serving.confirm as confirm
    from storage import open_store
    from storage.analysis.confirm_report import confirms

    def fault(*args, **kwargs):
        raise ValueError("no such figure")  # a bug of DraftLab's, not a server's fault: no check foresaw it

    eid, db = lab
    monkeypatch.setattr(confirm, "_store_config", fault)
    assert (
        main(
            [
                "confirm",
                str(eid),
                "--configs",
                "all",
                "--concurrency",
                "1",
                "--repeats",
                "1",
                "--vllm",
                FAKE,
                "--db",
                db,
            ]
        )
        == 1
    )
    err = capsys.readouterr().err  # the progress bar's lines, then one `error:` line
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "Traceback" not in err and "unexpected ValueError" in line and "no such figure" in line
    store = open_store(db)
    try:
        (stored,) = confirms(store, eid)
    finally:
        store.dispose()
    assert stored["status"] == "failed" and stored["error"] == line.removeprefix("error: ")


def test_confirm_hints_at_its_own_flag_where_the_verdict_chooses_no_run(lab, capsys):
    from storage import open_store

    eid, db = lab
    store = open_store(db)
    try:
        with store.write() as conn:  # every speculative run timed impossibly: the verdict crowns none
            conn.execute(text("UPDATE runs SET timing_warning = 'x' WHERE kind = 'speculative'"))
    finally:
        store.dispose()
    assert main(["confirm", str(eid), "--db", db]) == 2
    line = _one_line(capsys)
    assert "no best run yet" in line and "--configs all" in line and "--run" not in line
    assert main(["export", str(eid), "--format", "deploy", "--db", db]) == 2  # export keeps its own flag's hint
    assert "--run RUN_ID" in _one_line(capsys)
