"""`draftlab confirm` closes the loop (issue 37 item 4), against the stand-in vLLM server (tests/fake_vllm.py):

- identical configurations are served once: a `--configs all` grid (k 1, 2 × batch 1, 2) starts 3 servers, not 5,
  each measurement standing for the runs it covers (`runs`); the same configuration served again (in a second confirm,
  or twice in one confirm before this) is the server's own spread, in the report, the JSON and an info finding, and
  is not judged against the lab twice;
- `--one-server-at-a-time`: with the stand-in's one device ($FAKE_VLLM_DEVICE, held like a GPU's memory until the
  server and its engine have exited), the servers restart in turn, never both up, with the same passes and storage;
  both up together on that device fail (the check can fail); a server that dies is one line, the rest kept;
- each confirmed cell stores the speedup predicted for it from a profile other than this confirm, beside the measured
  one;
- a finding fires when a measurement falls outside its prediction and names the side that moved: acceptance or cost
  (rows built to make each move, SQLite and PostgreSQL).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from app.cli import main
from tests.fault_tools import FakeServers
from tests.meaning import missing

FAKE = shlex.join([sys.executable, str(Path(__file__).with_name("fake_vllm.py"))])
STEP = 0.01  # seconds a target step of the stand-in takes; a speculative one 1 + k / 2 times as long


@pytest.fixture()
def fakes(tmp_path, monkeypatch):
    """The stand-in servers' pids (in start order: `started_in_order`) and logs kept in tmp_path; none may be left
    running after the test."""
    servers = FakeServers(tmp_path / "pids")
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(servers.folder))
    monkeypatch.setenv("FAKE_VLLM_STEP_SECONDS", str(STEP))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    yield servers
    left = servers.alive()
    for s in servers.started():
        for role in ("server", "engine"):
            try:
                os.kill(s[role], signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert left == [], f"left running: {left}"


def _in_order(fakes: FakeServers) -> list[int]:
    """The k of each stand-in server started, in the order they started (their pid files' times)."""
    paths = sorted(fakes.folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    return [json.loads(p.read_text())["k"] for p in paths]


@pytest.fixture()
def grid(tmp_path, model_dirs, capsys):
    """A tiny k 1, 2 × batch 1, 2 grid on four prompts: (experiment id, {(k, batch size): run id}, database URL)."""
    from tests.cli_runs import run_json

    doc, db = run_json(
        tmp_path, model_dirs, capsys, "--k", "1,2", "--batch-size", "1,2", "--repeats", "1", "--max-new-tokens", "6"
    )
    return doc["experiment_id"], {(r["k"], r["batch_size"]): r["run_id"] for r in doc["runs"]}, db


def _confirm(db, eid, *options: str) -> list[str]:
    return ["confirm", str(eid), "--configs", "all", "--vllm", FAKE, "--db", db, *options]


def _measurements(db) -> list[tuple]:
    """(confirm, label, k, concurrency, passes, run_id, run_ids) of every stored measurement."""
    from storage import open_store

    store = open_store(db)
    try:
        with store.read() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    text(
                        "SELECT m.confirm_id, m.label, m.k, m.concurrency, COUNT(p.pass_index), m.run_id, m.run_ids "
                        "FROM server_measurements m LEFT JOIN server_passes p ON p.measurement_id = m.id "
                        "GROUP BY m.id, m.confirm_id, m.label, m.k, m.concurrency, m.run_id, m.run_ids ORDER BY m.id"
                    )
                ).all()
            ]
    finally:
        store.dispose()


def test_identical_configurations_are_served_once_for_every_run_and_served_again_is_the_servers_spread(
    grid, fakes, capsys
):
    from storage import open_store
    from storage.analysis.findings import findings
    from storage.records.confirms import beside_lab

    eid, runs, db = grid
    ones, twos = sorted([runs[1, 1], runs[1, 2]]), sorted([runs[2, 1], runs[2, 2]])
    assert main([*_confirm(db, eid, "--concurrency", "1,2", "--repeats", "2"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # one target-only server and one per distinct speculative config: 3 starts, where one a run took 5
    assert sorted(_in_order(fakes)) == [0, 1, 2] and doc["server_starts"] == 3
    assert doc["one_server_at_a_time"] is False
    by_k = {c["k"]: c for c in doc["configs"]}
    assert sorted(by_k) == [1, 2]
    assert by_k[1]["runs"] == ones and by_k[2]["runs"] == twos
    assert by_k[1]["lab_run_id"] == ones[0] and by_k[1]["label"] == f"runs {ones[0]}, {ones[1]}"
    for config in doc["configs"]:
        assert [m["concurrency"] for m in config["per_concurrency"]] == [1, 2]
        assert all(m["server_spread"] is None for m in config["per_concurrency"])  # served once so far
    stored = _measurements(db)
    assert len(stored) == 6  # 2 configurations × 2 concurrencies, and the target alone at each: each once
    assert {(r[2], r[5], r[6]) for r in stored if r[2]} == {
        (1, ones[0], f"{ones[0]},{ones[1]}"),
        (2, twos[0], f"{twos[0]},{twos[1]}"),
    }
    store = open_store(db)
    try:
        beside = beside_lab(store, 1)
        # beside the lab, each concurrency takes the covered run measured at that batch size
        assert {(int(r.k), int(r.concurrency)): int(r.lab_run_id) for r in beside.itertuples()} == {
            (k, b): runs[k, b] for k in (1, 2) for b in (1, 2)
        }
    finally:
        store.dispose()

    # served again: the spread between the two servings is the server's own, in the report and the JSON
    assert main(_confirm(db, eid, "--concurrency", "1,2", "--repeats", "2")) == 0
    report = capsys.readouterr().out
    assert not missing(report, f"runs {ones[0]}, {ones[1]}", "3 server starts", "own spread", "confirms 1, 2"), report
    store = open_store(db)
    try:
        from storage.analysis.confirm_report import confirm_document

        again = confirm_document(store, 2)
        for config in again["configs"]:
            for m in config["per_concurrency"]:
                spread = m["server_spread"]
                assert [s["confirm_id"] for s in spread["servings"]] == [1, 2]
                assert spread["lo"] == min(s["speedup"] for s in spread["servings"])
                assert spread["relative"] == pytest.approx(spread["hi"] / spread["lo"] - 1)
        titles = [f["title"] for f in findings(store, eid) if f["kind"] == "confirm"]
        assert len(titles) == len(set(titles))  # each configuration judged against the lab once
    finally:
        store.dispose()


def test_a_configuration_served_twice_in_one_confirm_is_the_servers_spread_not_two_verdicts(store):
    """Before identical configurations were served once, `--configs all` measured k 1 at batch 1 and at batch 4 as
    two servers: 1.18× and 0.94× at concurrency 1 (issue 37). Read back, that is one configuration's spread."""
    from app.serving.completions_load import PassRecord, RequestRecord
    from app.serving.production_scrape import SpecCounters
    from storage.analysis.confirm_report import confirm_document
    from storage.analysis.findings import findings
    from storage.records.confirms import add_measurement, finish_confirm, start_confirm, summarize
    from tests.test_storage import fill_experiment

    eid, ids, _ = fill_experiment(store, ks=(1,), prompts=3)
    run = ids[("speculative", 1)]
    config = json.dumps({"method": "draft_model", "model": "drf", "num_speculative_tokens": 1})
    passes = [PassRecord(1, 1.0, [RequestRecord(0, 0.0, [0.5, 1.0], [1, 2], [1, 2, 3])])] * 2
    cid = start_confirm(store, eid, configs="all", concurrency=[1], repeats=2)
    for label, speedup in (("run A", (1.18, [1.10, 1.26])), ("run B", (0.94, [0.90, 0.98]))):
        add_measurement(
            store,
            cid,
            eid,
            label=label,
            k=1,
            run_id=run,
            speculative_config=config,
            concurrency=1,
            passes=passes,
            figures=summarize(passes),
            speedup=speedup,
            counters=SpecCounters(drafts=10, draft_tokens=10, accepted=8, per_position={1: 8}),
            matches={"outputs_match_server_baseline": 1.0, "outputs_match_lab": 1.0, "first_divergence": None},
        )
    finish_confirm(store, cid, engine_version="x", wall_seconds=1.0, errors=[])
    doc = confirm_document(store, cid)
    for c in doc["configs"]:
        (m,) = c["per_concurrency"]
        assert [s["speedup"] for s in m["server_spread"]["servings"]] == [1.18, 0.94]
        assert m["server_spread"]["relative"] == pytest.approx(1.18 / 0.94 - 1)
    found = [f for f in findings(store, eid) if f["kind"] == "confirm"]
    spread = [f for f in found if f["data"].get("servings")]
    assert len(spread) == 1 and spread[0]["severity"] == "info"
    assert not missing(spread[0]["detail"], "1.18×", "0.94×", "26 %", "own spread"), spread[0]["detail"]
    # the lab is judged against the first serving alone, never once per serving
    judged = [f for f in found if "gains" in f["title"] or "loses" in f["title"] or "not gain" in f["title"]]
    assert [f["data"]["label"] for f in judged] == ["run A"]


@pytest.fixture()
def lab(tmp_path, model_dirs, capsys):
    """A tiny k 1, 2 experiment (batch 1) on four prompts: (experiment id, {k: run id}, database URL)."""
    from tests.cli_runs import run_json

    doc, db = run_json(tmp_path, model_dirs, capsys, "--k", "1,2", "--repeats", "1", "--max-new-tokens", "8")
    return doc["experiment_id"], {r["k"]: r["run_id"] for r in doc["runs"]}, db


def test_one_server_at_a_time_restarts_them_in_turn_never_both_up(lab, fakes, capsys, monkeypatch, tmp_path):
    eid, runs, db = lab
    device = tmp_path / "device"
    monkeypatch.setenv("FAKE_VLLM_DEVICE", str(device))
    monkeypatch.setenv("FAKE_VLLM_SLOW_STOP", "1:1.5")  # k 1's engine holds the device 1.5 s after SIGTERM
    status = main([*_confirm(db, eid, "--concurrency", "1,2", "--repeats", "2", "--one-server-at-a-time"), "--json"])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    doc = json.loads(out)
    assert not Path(f"{device}.overlap").exists()  # no server ever found the device held
    # A B B A for k 1, then the target alone still up: A B B A for k 2 without restarting it
    assert _in_order(fakes) == [0, 1, 0, 2, 0]
    assert doc["server_starts"] == 5 and doc["one_server_at_a_time"] is True
    # the same passes and storage as both up together: each configuration 2 passes a concurrency, the target
    # alone 2 beside each configuration
    assert sorted((r[2], r[3], r[4]) for r in _measurements(db)) == [
        (0, 1, 4),
        (0, 2, 4),
        (1, 1, 2),
        (1, 2, 2),
        (2, 1, 2),
        (2, 2, 2),
    ]
    for config in doc["configs"]:
        for m in config["per_concurrency"]:
            assert m["speedup"] is not None and m["outputs_match_server_baseline"] == 1.0
            assert m["server_draft_acceptance_rate"] > 0

    # both up together on the one device: the speculative server finds it held (out of memory, on a GPU)
    monkeypatch.delenv("FAKE_VLLM_SLOW_STOP")
    assert main(_confirm(db, eid, "--concurrency", "1", "--repeats", "1")) == 1
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert len(lines) == 2 and all(not missing(x, "device busy", "status 5") for x in lines), lines
    assert Path(f"{device}.overlap").read_text().split() == ["1", "2"]


def test_one_server_at_a_time_a_server_that_dies_is_one_line_and_the_rest_is_kept(lab, fakes, capsys, monkeypatch):
    eid, runs, db = lab
    monkeypatch.setenv("FAKE_VLLM_FAULT", "die:1:3")  # k 1's server: its warm-up, one request, then it dies
    status = main(_confirm(db, eid, "--concurrency", "1", "--repeats", "2", "--one-server-at-a-time"))
    assert status == 1
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: run {runs[1]} (k=1): ") and not missing(line, "exit status 7"), line
    # k 1 stored nothing (its target-only passes neither); k 2 measured after it, on a restarted target alone
    assert sorted((r[2], r[4]) for r in _measurements(db)) == [(0, 2), (2, 2)]
    assert _in_order(fakes) == [0, 1, 0, 2, 0]


@pytest.mark.parametrize(
    "options, env, words",
    [
        (["--server", "http://127.0.0.1:9", "--baseline-server", "http://127.0.0.1:8"], "", ["--server"]),
        ([], "yes", ["DRAFTLAB_ONE_SERVER_AT_A_TIME", "'yes'"]),
    ],
)
def test_one_server_at_a_time_refuses_servers_it_cannot_restart_in_one_line(
    tmp_path, capsys, monkeypatch, options, env, words
):
    from storage import open_store

    db = f"sqlite:///{tmp_path / 'x.db'}"
    open_store(db).dispose()
    monkeypatch.setenv("DRAFTLAB_ONE_SERVER_AT_A_TIME", env)
    flags = ["--one-server-at-a-time"] if options else []
    assert main(["confirm", "1", *options, *flags, "--db", db]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and not missing(err, *words), err


def test_each_confirmed_cell_stores_the_prediction_of_a_profile_other_than_itself(lab, fakes, capsys):
    from storage import open_store

    eid, runs, db = lab
    assert main([*_confirm(db, eid, "--concurrency", "1", "--repeats", "3"), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    for config in first["configs"]:  # nothing before it: no profile other than itself
        (m,) = config["per_concurrency"]
        assert m["predicted_speedup"] is None and m["predicted_profile_id"] is None and m["prediction_check"] is None
    assert main([*_confirm(db, eid, "--concurrency", "1", "--repeats", "3"), "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    for config in second["configs"]:
        (m,) = config["per_concurrency"]
        assert m["predicted_profile_id"] == 1  # the first confirm is the profile, never the confirm itself
        lo, hi = m["predicted_speedup_ci"]
        assert lo <= m["predicted_speedup"] <= hi
        check = m["prediction_check"]
        # the stand-in accepts its first draft always (2 tokens a step at k 1), the lab's draft about half of them
        assert check["server_tokens_per_step"] == pytest.approx(m["server_tokens_per_step"])
        assert check["acceptance_shift"] == pytest.approx(
            check["server_tokens_per_step"] / check["lab_tokens_per_step"] - 1
        )
        assert check["confirm_cost_ratio"] == pytest.approx(1 + config["k"] / 2, rel=0.25)  # the stand-in's cost
        assert check["outside"] == (not lo <= m["speedup"] <= hi)
    (k1,) = [c["per_concurrency"][0] for c in second["configs"] if c["k"] == 1]
    assert k1["prediction_check"]["server_tokens_per_step"] == 2.0
    store = open_store(db)
    try:
        with store.read() as conn:
            stored = conn.execute(
                text(
                    "SELECT confirm_id, predicted_speedup, predicted_speedup_ci_lo, predicted_profile_id, "
                    "predicted_tokens_per_step, predicted_cost_ratio FROM server_measurements WHERE k > 0 "
                    "ORDER BY id"
                )
            ).all()
    finally:
        store.dispose()
    assert [r[0] for r in stored] == [1, 1, 2, 2]
    assert all(r[1] is None and r[3] is None for r in stored[:2])
    assert all(None not in r for r in stored[2:]) and {r[3] for r in stored[2:]} == {1}


# --- the finding: outside the prediction, which side moved (built rows, SQLite and PostgreSQL) ----------------------


def _passes(step: float, steps: int, tokens_per_step: float, n: int = 2) -> list:
    """`n` passes of one request whose decode took `steps` engine steps of `step` seconds each."""
    from app.serving.completions_load import PassRecord, RequestRecord

    per = max(1, round(tokens_per_step))
    arrivals = [0.05 + step * i for i in range(steps + 1)]
    out = []
    for _ in range(n):
        record = PassRecord(1, arrivals[-1], [RequestRecord(0, 0.0, arrivals, [1] + [per] * steps, [])])
        record.decode_steps = steps
        out.append(record)
    return out


def _cell(store, eid: int, run: int, *, tokens_per_step: float, step_ratio: float, measured: float) -> int:
    """A finished confirm of one cell (k 2, concurrency 1) predicted 1.50× (1.40–1.60) from a profile on another
    machine (the lab's 2.00 tokens per step, the profile's t_k / t_0 1.333), whose server accepted
    `tokens_per_step` and stepped `step_ratio` times the target's, measuring `measured`."""
    from app.serving.production_scrape import SpecCounters
    from storage.records.confirms import add_measurement, describe_confirm, finish_confirm, start_confirm, summarize

    profile = start_confirm(store, eid, configs="profile", concurrency=[1], repeats=2)
    describe_confirm(store, profile, hardware="profile box", target="tgt")
    finish_confirm(store, profile, engine_version="0.31", wall_seconds=1.0, errors=[])
    cid = start_confirm(store, eid, configs="chosen", concurrency=[1], repeats=2)
    describe_confirm(store, cid, hardware="this box", target="tgt")
    base, spec = _passes(0.01, 40, 1.0), _passes(0.01 * step_ratio, 20, tokens_per_step)
    drafts, accepted = 100, round((tokens_per_step - 1) * 100)
    add_measurement(
        store,
        cid,
        eid,
        label="chosen",
        k=2,
        run_id=run,
        speculative_config=json.dumps({"method": "draft_model", "model": "drf", "num_speculative_tokens": 2}),
        concurrency=1,
        passes=spec,
        figures=summarize(spec),
        speedup=(measured, [measured - 0.02, measured + 0.02]),
        counters=SpecCounters(
            drafts=drafts,
            draft_tokens=2 * drafts,
            accepted=accepted,
            per_position={1: round(0.6 * accepted), 2: accepted - round(0.6 * accepted)},
        ),
        matches={"outputs_match_server_baseline": 1.0, "outputs_match_lab": 1.0, "first_divergence": None},
        predicted={
            "speedup": 1.5,
            "speedup_ci": [1.4, 1.6],
            "profile_id": profile,
            "tokens_per_step": 2.0,
            "step_seconds_ratio": 4 / 3,
        },
    )
    add_measurement(
        store,
        cid,
        eid,
        label="target-only",
        k=0,
        run_id=None,
        speculative_config=None,
        concurrency=1,
        passes=base,
        figures=summarize(base),
    )
    finish_confirm(store, cid, engine_version="0.32", wall_seconds=1.0, errors=[])
    return cid


def _outside(store, eid: int) -> list[dict]:
    from storage.analysis.findings import findings

    return [f for f in findings(store, eid) if f["kind"] == "confirm" and "outside its prediction" in f["title"]]


@pytest.mark.parametrize(
    "tokens_per_step, step_ratio, measured, moved",
    [
        (
            1.5,
            4 / 3,
            1.12,
            ["acceptance"],
        ),  # the server accepts less than the lab; its steps cost what the profile's did
        (2.0, 16 / 9, 1.12, ["cost"]),  # it accepts what the lab did; its steps cost more than the profile's
        (1.5, 16 / 9, 0.84, ["acceptance", "cost"]),  # both: the one that moved more first (here equal: acceptance)
        (2.0, 4 / 3, 1.12, []),  # neither: the time outside the decode steps
    ],
)
def test_a_measurement_outside_its_prediction_names_the_side_that_moved(
    store, tokens_per_step, step_ratio, measured, moved
):
    from storage.analysis.confirm_report import confirm_document
    from tests.test_storage import fill_experiment

    eid, ids, _ = fill_experiment(store, ks=(2,), prompts=3)
    run = ids[("speculative", 2)]
    cid = _cell(store, eid, run, tokens_per_step=tokens_per_step, step_ratio=step_ratio, measured=measured)
    (finding,) = _outside(store, eid)
    assert finding["severity"] == "warning" and finding["data"]["moved"] == moved
    assert finding["data"]["direction"] == "below" and finding["data"]["predicted_profile_id"] == cid - 1
    assert finding["data"]["server_tokens_per_step"] == pytest.approx(tokens_per_step)
    assert finding["data"]["confirm_cost_ratio"] == pytest.approx(step_ratio)
    detail, next_ = finding["detail"], finding["next"]
    assert not missing(detail, f"{measured:.2f}×", "1.50× (1.40–1.60)", f"profile {cid - 1}"), detail
    if "acceptance" in moved:
        assert not missing(detail, "acceptance moved", "2.00", f"{tokens_per_step:.2f}"), detail
    if "cost" in moved:
        assert not missing(detail, "cost moved", "1.33", f"{step_ratio:.2f}"), detail
        assert not missing(next_, "draftlab profile", "profile box", "this box", "0.31", "0.32"), next_
    if not moved:
        assert not missing(detail, "neither", "prefill"), detail
    (m,) = confirm_document(store, cid)["configs"][0]["per_concurrency"]
    assert m["predicted_speedup"] == 1.5 and m["predicted_speedup_ci"] == [1.4, 1.6]
    assert m["predicted_profile_id"] == cid - 1 and m["prediction_check"]["moved"] == moved


def test_a_measurement_within_its_prediction_is_no_finding(store):
    from tests.test_storage import fill_experiment

    eid, ids, _ = fill_experiment(store, ks=(2,), prompts=3)
    _cell(store, eid, ids[("speculative", 2)], tokens_per_step=2.0, step_ratio=4 / 3, measured=1.5)
    assert _outside(store, eid) == []
