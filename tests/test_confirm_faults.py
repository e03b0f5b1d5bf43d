"""`draftlab confirm`'s faults against the stand-in vLLM server (tests/fake_vllm.py, started exactly as vLLM is, its
faults chosen by $FAKE_VLLM_FAULT): a server that dies mid-pass (a speculative one, or the target-only one while a
later configuration is measured), a request that times out, a server without counters, a port taken before the
server binds it. Each is one `error:` line and exit status 1; the failed configuration stores nothing (no
measurement, no pass, no counters), and the configurations measured around it are kept. (A server that exits
before it is ready: tests/test_confirm.py.)

And the processes: no server outlives the confirm, nor its engine process (the stand-in's EngineCore, which outlives
a killed server process as vLLM's does), whether the server died, the confirm was stopped with Ctrl-C or SIGTERM
(one line, exit status 130 / 143), or the confirm was killed (SIGKILL: its watchdogs end the servers, the next
sweep closes its row, and ends the servers itself when the watchdogs were killed too). Only the logs DraftLab quoted
stay in the temp folder."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.cli import main
from app.worker.sweep import sweep
from tests.fault_tools import ConfirmProcess, FakeServers, wait_until
from tests.meaning import missing

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])
LOG = r" \(log: (\S+\.log)\)"


@pytest.fixture(autouse=True)
def fakes(tmp_path, monkeypatch):
    """Every stand-in server of the test writes its pids here, and its log goes to tmp_path/"logs"; none may be
    left running after the test (killed here if one is, and the test fails)."""
    servers = FakeServers(tmp_path / "pids")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(servers.folder))
    (tmp_path / "logs").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "logs"))
    yield servers
    left = servers.alive()
    for s in servers.started():
        for role in ("server", "engine"):
            try:
                os.kill(s[role], signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert left == [], f"left running: {left}"


def _logs(tmp_path) -> list[str]:
    return sorted(str(p) for p in (tmp_path / "logs").glob("draftlab-vllm-*.log"))


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
    from storage.analysis.confirm_report import confirms

    eid, _, db = lab
    monkeypatch.setenv("FAKE_VLLM_FAULT", fault)
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
            *options,
        ]
    )
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    store = open_store(db)
    try:
        (stored,) = confirms(store, eid)
        with store.read() as conn:
            rows = conn.execute(
                text(
                    "SELECT m.label, m.k, COUNT(p.pass_index) FROM server_measurements m LEFT JOIN server_passes p "
                    "ON p.measurement_id = m.id GROUP BY m.id, m.label, m.k ORDER BY m.k"
                )
            ).all()
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
    lab, capsys, monkeypatch, fakes, tmp_path
):
    _, runs, _ = lab
    # its requests: 1 the warm-up, 2-5 the first pass, 6-9 the second: it dies after a whole pass was measured
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "die:1:6", repeats=2)
    assert status == 1
    (line,) = lines
    name = f"run {runs[1]} \\(k=1\\)"
    quoted = re.fullmatch(
        f"error: {name}: the vLLM server for {name} died \\(exit status 7\\): RuntimeError: EngineCore encountered "
        f"an issue \\(fake fault: die\\){LOG}",
        line,
    )
    assert quoted, line
    assert stored["error"] == line.removeprefix("error: ")
    _kept(stored, rows, series, 2, runs[2], passes=2)  # k=1's first pass (and its baseline's) not half-stored
    # the dead server's engine process (alive after it, parent PID 1) was ended with the rest of its group
    assert len(fakes.started()) == 3 and fakes.alive() == []
    assert _logs(tmp_path) == [quoted[1]]  # the one log the error points to; the others removed


def test_the_target_only_server_dying_keeps_the_configurations_measured_before(lab, capsys, monkeypatch):
    _, runs, _ = lab
    # its requests: 1 the warm-up, 2-5 k=1's pass, 6-9 k=2's pass: it dies in k=2's
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "die:0:7")
    assert status == 1
    (line,) = lines
    # the configuration, the server that died, its exit status, its log's error, and the log
    assert line.startswith(f"error: run {runs[2]} (k=2): ") and re.search(f"{LOG}$", line), line
    assert not missing(line, "target-only", "exit status 7", "RuntimeError: EngineCore", "fake fault: die"), line
    _kept(stored, rows, series, 1, runs[1])  # k=1's pass and its target-only pass: measured before, kept


def test_a_request_that_times_out_is_one_line_and_the_other_configuration_is_kept(lab, capsys, monkeypatch):
    _, runs, _ = lab
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "hang:1:2", "--request-timeout", "2")
    assert status == 1
    assert lines == [
        f"error: run {runs[1]} (k=1): run {runs[1]} (k=1) server: prompt 0: no answer for 2 s (request "
        f"timed out); raise --request-timeout or lower --concurrency"
    ]
    _kept(stored, rows, series, 2, runs[2])


def test_a_server_without_counters_is_one_line_and_the_other_configuration_is_kept(lab, capsys, monkeypatch):
    _, runs, _ = lab
    status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "no-counters:2")
    assert status == 1
    (line,) = lines
    assert re.fullmatch(
        f"error: run {runs[2]} \\(k=2\\): http://127.0.0.1:\\d+/metrics has no vllm:spec_decode_num_drafts_total, "
        f"vllm:spec_decode_num_draft_tokens_total, vllm:spec_decode_num_accepted_tokens_total: is speculative "
        f"decoding on in that server \\(e.g. vLLM --speculative-config\\)\\?",
        line,
    ), line
    _kept(stored, rows, series, 1, runs[1])


def _taken_ports(monkeypatch, taken: socket.socket, calls: set[int]) -> None:
    """free_port answers the port `taken` listens on at these calls (1-based), a free one otherwise: the port
    chosen free and taken before the server binds it."""
    import app.serving.vllm_server as vllm_server

    real, count = vllm_server.free_port, [0]

    def free_port():
        count[0] += 1
        return taken.getsockname()[1] if count[0] in calls else real()

    monkeypatch.setattr(vllm_server, "free_port", free_port)


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(lab, capsys, monkeypatch, fakes, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        _taken_ports(monkeypatch, taken, {2})  # the k=1 server's first port
        status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "")
    assert status == 0 and lines == []
    assert stored["status"] == "done" and [c["k"] for c in stored["configs"]] == [1, 2]
    assert len(rows) == 3 and series == 2
    assert len(fakes.started()) == 4  # the k=1 server twice
    assert _logs(tmp_path) == []  # each server's log removed when it stopped, the failed try's too


def test_a_port_taken_every_time_is_one_line_and_the_other_configuration_is_kept(lab, capsys, monkeypatch):
    from app.serving.vllm_server import BIND_ATTEMPTS

    _, runs, _ = lab
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _taken_ports(monkeypatch, taken, set(range(2, 2 + BIND_ATTEMPTS)))  # every try of the k=1 server
        status, lines, stored, rows, series = _confirm(lab, capsys, monkeypatch, "")
    assert status == 1
    (line,) = lines
    # the configuration, the port, the OS's reason, the tries, the way out (servers of your own), and the log
    assert line.startswith(f"error: run {runs[1]} (k=1): ") and re.search(f"{LOG}$", line), line
    tried = (f"127.0.0.1:{port}", "Address already in use", f"{BIND_ATTEMPTS} free ports", " --server", "--baseline")
    assert not missing(line, *tried), line
    _kept(stored, rows, series, 2, runs[2])


@pytest.mark.parametrize("engine", ["in the group", "escaped the group"])
def test_a_server_killed_mid_confirm_is_stopped_with_every_process_of_its_tree(fakes, monkeypatch, engine):
    """vLLM's EngineCore outlives a killed server process (parent PID 1, in its group): stop() ends it all the same,
    and a process that left the group (its own session), which the watchdog saw while the server ran."""
    from app.serving.vllm_server import VllmServer
    from engine.serving.process_tree import WATCH_SECONDS

    monkeypatch.setenv("FAKE_VLLM_ESCAPE", "1" if engine == "escaped the group" else "0")
    server = VllmServer.start("target-only", FAKE, "m", startup_timeout=60)
    try:
        (started,) = fakes.wait_for(1)
        time.sleep(2 * WATCH_SECONDS)  # the watchdog's look at the tree
        os.kill(started["server"], signal.SIGKILL)
        assert "killed by SIGKILL" in wait_until(lambda: server.died(), 10, "the server's death seen")
        assert fakes.alive() == [f"engine {started['engine']} (k=0)"]  # what item 1 found: the engine left behind
    finally:
        server.stop()
    assert fakes.alive() == []


def _signalled_confirm(lab, fakes, tmp_path, **env) -> ConfirmProcess:
    """`draftlab confirm` of both runs in its own process, its k=1 server hanging in its first pass (so the signal
    finds it measuring), once both servers are up."""
    eid, _, db = lab
    confirm = ConfirmProcess(
        [str(eid), "--configs", "all", "--concurrency", "1", "--repeats", "1", "--vllm", FAKE, "--db", db],
        {"FAKE_VLLM_FAULT": "hang:1:2", "TMPDIR": str(tmp_path / "logs"), **env},
    )
    fakes.wait_for(2)
    return confirm


def _stored_confirms(db):
    from storage import open_store
    from storage.serving.confirm_jobs import get_confirm

    store = open_store(db)
    try:
        with store.read() as conn:
            ids = conn.execute(text("SELECT id FROM server_confirms ORDER BY id")).scalars().all()
        return [get_confirm(store, i) for i in ids]
    finally:
        store.dispose()


@pytest.mark.parametrize(
    "sig, status, words", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"), (signal.SIGTERM, 143, "terminated (SIGTERM)")]
)
def test_ctrl_c_or_sigterm_mid_confirm_is_one_line_and_its_exit_status(lab, fakes, tmp_path, sig, status, words):
    confirm = _signalled_confirm(lab, fakes, tmp_path)
    time.sleep(1.0)
    confirm.proc.send_signal(sig)
    code, _, err = confirm.finish(timeout=60)
    assert "Traceback" not in err, err[-3000:]
    lines = [x for x in re.split(r"[\r\n]", err) if x.strip().startswith("error:")]
    assert len(lines) == 1 and words in lines[0] and "stored as failed" in lines[0], err[-2000:]
    assert code == status
    (row,) = _stored_confirms(lab[2])
    assert row["status"] == "failed" and "interrupted" in row["error"]
    assert fakes.alive() == [] and _logs(tmp_path) == []


def test_a_killed_confirm_leaves_no_server_and_the_next_sweep_closes_its_row(lab, fakes, tmp_path):
    from storage import open_store

    confirm = _signalled_confirm(lab, fakes, tmp_path)
    confirm.proc.kill()
    confirm.finish()
    # its watchdogs end both servers' trees (SIGTERM, which the stand-ins obey) and remove their logs
    wait_until(lambda: fakes.alive() == [] and _logs(tmp_path) == [], 10, "no server left, no log left")
    (row,) = _stored_confirms(lab[2])
    assert row["status"] == "running"  # nobody closed it: the process was killed
    store = open_store(lab[2])
    try:
        sweep(store)  # a worker's, `draftlab list`'s or the next confirm's sweep
    finally:
        store.dispose()
    (row,) = _stored_confirms(lab[2])
    assert row["status"] == "interrupted" and "`draftlab confirm` process stopped" in row["error"]
    assert "were ended" not in row["error"]  # the watchdogs had ended them


def test_the_next_confirm_ends_the_servers_a_killed_confirm_and_its_watchdogs_left(lab, fakes, tmp_path):
    confirm = _signalled_confirm(lab, fakes, tmp_path)
    wait_until(
        lambda: len((_stored_confirms(lab[2])[0]["processes"] or "").split("[")) > 3,
        30,
        "both servers recorded on the row",
    )
    for pid in wait_until(lambda: (lambda w: w if len(w) == 2 else None)(confirm.watchdogs()), 10, "two watchdogs"):
        os.kill(pid, signal.SIGKILL)
    confirm.proc.kill()
    confirm.finish()
    time.sleep(2.0)  # the server processes get SIGTERM as their parent dies; their engines stay, as vLLM's do
    assert sorted(x.split()[0] for x in fakes.alive()) == ["engine", "engine"]
    # the next confirm sweeps: the row closed, the engines ended; then it runs
    eid, _, db = lab
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
        == 0
    )
    first, second = _stored_confirms(db)
    assert first["status"] == "interrupted" and not missing(first["error"], "2 vLLM server process", "ended")
    assert second["status"] == "done" and fakes.alive() == []


def test_the_error_quoted_from_a_server_log_is_the_real_one_not_a_warning():
    from app.serving.vllm_server import last_error

    ulimit = (
        "(APIServer pid=20879) WARNING 12-06 16:36:21 [system_utils.py:255] Found ulimit of 20000 and failed to "
        "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
        "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n"
    )
    served = [
        'INFO:     127.0.0.1:34214 - "GET /health HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:34228 - "POST /v1/completions HTTP/1.1" 200 OK',
    ]
    # a server killed mid-pass (vLLM's log as it was): no error in it, and no warning quoted as one
    said = last_error("\n".join([ulimit, *served]))
    assert "no error" in said and served[-1] in said and "ulimit" not in said, said
    core = "(EngineCore_DP0 pid=20) ERROR 12-06 16:36:30 [core.py:700] "
    cause = "ValueError: the draft's vocabulary differs from the target's"  # the root cause, above vLLM's wrapper
    crashed = [
        ulimit,
        f"{core}EngineCore failed to start.",
        f"{core}Traceback (most recent call last):",
        f'{core}  File "core.py", line 3, in run',
        f"{core}    raise ValueError(",
        f"{core}{cause}",
        "Traceback (most recent call last):",
        '  File "api_server.py", line 9, in <module>',
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        "/x/y.py:3: FutureWarning: this error will become an Error",
    ]
    assert last_error("\n".join(crashed)).endswith(cause)
    assert last_error("\n".join([ulimit, "api_server.py: error: unrecognized arguments: --foo"])).endswith(
        "unrecognized arguments: --foo"
    )


def test_a_second_ctrl_c_while_the_servers_stop_waits_for_them_and_the_stored_confirm(lab, fakes, tmp_path):
    """The target-only server takes 4 s to stop; Ctrl-C again meanwhile neither leaves it running nor the confirm
    `running`."""
    confirm = _signalled_confirm(lab, fakes, tmp_path, FAKE_VLLM_SLOW_STOP="0:4")
    time.sleep(1.0)
    confirm.proc.send_signal(signal.SIGINT)
    time.sleep(2.0)  # the k=1 server stopped (at once), the target-only one stopping
    confirm.proc.send_signal(signal.SIGINT)
    code, _, err = confirm.finish(timeout=60)
    assert "Traceback" not in err and code == 130, err[-3000:]
    assert len([x for x in re.split(r"[\r\n]", err) if x.strip().startswith("error:")]) == 1, err[-2000:]
    (row,) = _stored_confirms(lab[2])
    assert row["status"] == "failed" and fakes.alive() == []
