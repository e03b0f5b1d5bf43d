"""`draftlab confirm`'s faults against the stand-in vLLM server (tests/fake_vllm.py, started exactly as vLLM is, its
faults chosen by $FAKE_VLLM_FAULT): a server that dies mid-pass (a speculative one, or the target-only one while a
later configuration is measured), a request that times out, a server without counters, a port taken before the
server binds it. Each is one `error:` line and exit status 1; the failed configuration stores nothing (no
measurement, no pass, no counters), and the configurations measured around it are kept. (A server that exits
before it is ready: tests/test_confirm.py.)"""
from __future__ import annotations

import re
import shlex
import socket
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from app.cli import main

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])
LOG = r" \(log: \S+\.log\)"


@pytest.fixture()
def lab(tmp_path, model_dirs, capsys):
    """A tiny k 1,2 experiment on four prompts: (experiment id, {k: run id}, database URL)."""
    from tests.cli_runs import run_json

    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "1,2", "--repeats", "1", "--max-new-tokens", "6")
    return doc["experiment_id"], {r["k"]: r["run_id"] for r in doc["runs"]}, db


def _confirm(lab, capsys, monkeypatch, fault: str, *options: str, repeats: int = 1):
    """Confirm every run (k 1 and 2), concurrency 1, `repeats` passes, with `fault`: (exit status, the `error:`
    lines, the stored confirm, the stored rows as (label, k, passes), the number of counter series stored)."""
    from storage import open_store
    from storage.confirms import confirms

    eid, _, db = lab
    monkeypatch.setenv("FAKE_VLLM_FAULT", fault)
    status = main(["confirm", str(eid), "--configs", "all", "--concurrency", "1", "--repeats", str(repeats),
                   "--vllm", FAKE,
                   "--db", db, *options])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    store = open_store(db)
    try:
        (stored,) = confirms(store, eid)
        with store.read() as conn:
            rows = conn.execute(text(
                "SELECT m.label, m.k, COUNT(p.pass_index) FROM server_measurements m LEFT JOIN server_passes p "
                "ON p.measurement_id = m.id GROUP BY m.id, m.label, m.k ORDER BY m.k")).all()
            series = conn.execute(text("SELECT COUNT(*) FROM production_series")).scalar()
    finally:
        store.dispose()
    return status, lines, stored, [tuple(r) for r in rows], series


def _kept(stored, rows, series, k: int, run_id: int, passes: int = 1) -> None:
    """Only configuration k stored (its passes, its counters), beside the target-only passes paired with them; the
    confirm failed."""
    assert stored["status"] == "failed"
    assert [c["k"] for c in stored["configs"]] == [k]
    assert rows == [("target-only", 0, passes), (f"run {run_id}", k, passes)]
    assert series == 1  # the kept configuration's counters alone
    (m,) = stored["configs"][0]["per_concurrency"]
    assert m["outputs_match_server_baseline"] == 1.0 and m["server_draft_acceptance_rate"] > 0


def test_a_speculative_server_that_dies_mid_pass_is_one_line_and_the_other_configuration_is_kept(
        lab, capsys, monkeypatch):
    _, runs, _ = lab
    # its requests: 1 the warm-up, 2-5 the first pass, 6-9 the second: it dies after a whole pass was measured
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "die:1:6", repeats=2)
    assert status == 1
    (line,) = lines
    name = f"run {runs[1]} \\(k=1\\)"
    assert re.fullmatch(
        f"error: {name}: the vLLM server for {name} died \\(exit status 7\\): RuntimeError: EngineCore encountered "
        f"an issue \\(fake fault: die\\){LOG}", line), line
    assert stored["error"] == line.removeprefix("error: ")
    _kept(stored, rows, series, 2, runs[2], passes=2)  # k=1's first pass (and its baseline's) not half-stored


def test_the_target_only_server_dying_keeps_the_configurations_measured_before(lab, capsys, monkeypatch):
    _, runs, _ = lab
    # its requests: 1 the warm-up, 2-5 k=1's pass, 6-9 k=2's pass: it dies in k=2's
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "die:0:7")
    assert status == 1
    (line,) = lines
    assert re.fullmatch(
        f"error: run {runs[2]} \\(k=2\\): the vLLM server for target-only died \\(exit status 7\\): RuntimeError: "
        f"EngineCore encountered an issue \\(fake fault: die\\){LOG}", line), line
    _kept(stored, rows, series, 1, runs[1])  # k=1's pass and its target-only pass: measured before, kept


def test_a_request_that_times_out_is_one_line_and_the_other_configuration_is_kept(lab, capsys, monkeypatch):
    _, runs, _ = lab
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "hang:1:2", "--request-timeout", "2")
    assert status == 1
    assert lines == [f"error: run {runs[1]} (k=1): run {runs[1]} (k=1) server: prompt 0: no answer for 2 s (request "
                     f"timed out); raise --request-timeout or lower --concurrency"]
    _kept(stored, rows, series, 2, runs[2])


def test_a_server_without_counters_is_one_line_and_the_other_configuration_is_kept(lab, capsys, monkeypatch):
    _, runs, _ = lab
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "no-counters:2")
    assert status == 1
    (line,) = lines
    assert re.fullmatch(
        f"error: run {runs[2]} \\(k=2\\): http://127.0.0.1:\\d+/metrics has no vllm:spec_decode_num_drafts_total, "
        f"vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total: is speculative "
        f"decoding on in that server \\(e.g. vLLM --speculative-config\\)\\?", line), line
    _kept(stored, rows, series, 1, runs[1])


def _taken_ports(monkeypatch, taken: socket.socket, calls: set[int]) -> None:
    """free_port answers the port `taken` listens on at these calls (1-based), a free one otherwise: the port
    chosen free and taken before the server binds it."""
    import app.vllm_server as vllm_server

    real, count = vllm_server.free_port, [0]

    def free_port():
        count[0] += 1
        return taken.getsockname()[1] if count[0] in calls else real()

    monkeypatch.setattr(vllm_server, "free_port", free_port)


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(lab, capsys, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        _taken_ports(monkeypatch, taken, {2})  # the k=1 server's first port
        status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "")
    assert status == 0 and lines == []
    assert stored["status"] == "done" and [c["k"] for c in stored["configs"]] == [1, 2]
    assert len(rows) == 3 and series == 2


def test_a_port_taken_every_time_is_one_line_and_the_other_configuration_is_kept(lab, capsys, monkeypatch):
    from app.vllm_server import BIND_ATTEMPTS

    _, runs, _ = lab
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _taken_ports(monkeypatch, taken, set(range(2, 2 + BIND_ATTEMPTS)))  # every try of the k=1 server
        status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "")
    assert status == 1
    (line,) = lines
    name = f"run {runs[1]} \\(k=1\\)"
    assert re.fullmatch(
        f"error: {name}: the vLLM server for {name} could not bind 127.0.0.1:{port} \\(Address already in use\\), "
        f"the last of 3 free ports DraftLab chose; another program takes loopback ports as they free up: stop it, "
        f"or start vLLM yourself and pass --server / --baseline-server{LOG}", line), line
    _kept(stored, rows, series, 2, runs[2])
