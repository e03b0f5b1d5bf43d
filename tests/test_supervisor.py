"""`draftlab worker --devices`: parsing, placement and leases of pinned workers, and the supervisor end to end on
CPU slots (cpu:0,cpu:1: two workers with leases of their own), including SIGTERM stopping every child cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.runtime.placement import lease_key, load_device, place
from app.worker.supervisor import DevicesError, parse_devices
from storage import open_store
from storage.jobs import liveness, run_state
from storage.jobs.experiments import enqueue_experiment
from tests.hold import held_env
from tests.meaning import missing

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40", "t12 t13"]


def test_devices_all_is_every_gpu_or_one_cpu_worker():
    assert parse_devices("all", count=lambda: 0) == ["cpu"]
    assert parse_devices("all", count=lambda: 2) == ["cuda:0", "cuda:1"]
    assert parse_devices("cuda:1, cuda:0", count=lambda: 2) == ["cuda:1", "cuda:0"]
    assert parse_devices("cpu:0,cpu:1,cpu:2") == ["cpu:0", "cpu:1", "cpu:2"]


@pytest.mark.parametrize(
    "spec, words",
    [
        ("gpu0", "comma list"),
        ("", "comma list"),
        ("cuda", "cuda:N"),
        ("cpu:0,cpu:0", "twice"),
        ("cuda:2", "sees 2 CUDA GPU"),
    ],
)
def test_bad_devices_are_refused_with_the_fix(spec, words):
    with pytest.raises(DevicesError, match=words):
        parse_devices(spec, count=lambda: 2)


def test_pinned_workers_place_auto_experiments_on_their_device_with_its_own_lease():
    host = socket.gethostname()
    assert lease_key("cpu:1") == f"{host}:cpu:1" != lease_key("cpu:0")
    assert lease_key("cuda:1") == f"{host}:cuda:1" and lease_key("cuda") == f"{host}:cuda:0"
    assert place("auto", "cuda:1") == "cuda:1" and place("cuda", "cuda:1") == "cuda:1"
    assert place("cpu", "cuda:1") == "cpu"  # an experiment that asks for the CPU keeps it (and host:cpu)
    assert place("auto", "cpu:2") == "cpu:2" and place("cuda", "cpu:2") == "cuda"
    assert place("auto", None) == "auto"  # not pinned: today's behaviour
    assert load_device("cpu:2") == "cpu" and load_device("cuda:1") == "cuda" and load_device("auto") == "auto"


def _enqueue(store, model_dirs, n, ks=(1, 2), max_new_tokens=6):
    return [
        enqueue_experiment(
            store,
            name=f"sup {i}",
            target=model_dirs["target"],
            draft=model_dirs["draft"],
            prompts="inline",
            sampling={"temperature": 0.0, "max_new_tokens": max_new_tokens, "seed": 3},
            device="auto",
            sweep_values=list(ks),
            prompt_texts=PROMPTS,
        )
        for i in range(n)
    ]


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_worker_devices_runs_one_worker_per_cpu_slot_until_idle(tmp_path, model_dirs):
    url = f"sqlite:///{tmp_path / 'sup.db'}"
    store = open_store(url)
    _enqueue(store, model_dirs, 4)
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "worker", "--db", url, "--devices", "cpu:0,cpu:1", "--until-idle"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with store.read() as conn:
        statuses = conn.execute(text("SELECT status, COUNT(*) FROM runs GROUP BY status")).all()
        devices = set(conn.execute(text("SELECT DISTINCT device_name FROM runs")).scalars())
        leases = conn.execute(text("SELECT COUNT(*) FROM device_leases")).scalar()
        workers = conn.execute(text("SELECT COUNT(*) FROM workers")).scalar()
    assert statuses == [("done", 12)]
    assert devices <= {"cpu:0", "cpu:1"} and devices, devices  # each run records the slot that timed it
    assert leases == 0 and workers == 0
    assert done.stderr.count("supervisor: cpu:") >= 2 and "worker idle, done" in done.stderr


def test_sigterm_to_the_supervisor_stops_every_child_with_its_runs_interrupted(tmp_path, model_dirs, wait_for):
    url = f"sqlite:///{tmp_path / 'sup.db'}"
    store = open_store(url)
    _enqueue(store, model_dirs, 2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--db", url, "--devices", "cpu:0,cpu:1"],
        cwd=ROOT,
        env=held_env(0),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:  # each child holds its run before prompt 0 commits (tests/hold): the SIGTERM finds both mid-way

        def both_running():
            with store.read() as conn:
                return (
                    conn.execute(
                        text(
                            "SELECT COUNT(DISTINCT experiment_id) FROM runs WHERE status = 'running' "
                            "AND prompts_total IS NOT NULL"
                        )
                    ).scalar()
                    == 2
                )

        wait_for(both_running, timeout=120, what="both experiments running on the two slots")
        with store.read() as conn:
            pids = conn.execute(text("SELECT pid FROM workers")).scalars().all()
        assert len(pids) == 2
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err
    for pid in pids:  # every child is gone
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with store.read() as conn:
        statuses = dict(conn.execute(text("SELECT status, COUNT(*) FROM runs GROUP BY status")).all())
        leases = conn.execute(text("SELECT COUNT(*) FROM device_leases")).scalar()
        workers = conn.execute(text("SELECT COUNT(*) FROM workers")).scalar()
    assert statuses == {"interrupted": 6}, statuses  # not lost: `draftlab resume` continues them
    assert leases == 0 and workers == 0


def test_a_killed_child_is_restarted_and_its_runs_requeued(tmp_path, model_dirs, wait_for):
    url = f"sqlite:///{tmp_path / 'sup.db'}"
    store = open_store(url)
    _enqueue(store, model_dirs, 1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--db", url, "--devices", "cpu:0"],
        cwd=ROOT,
        env=held_env(0, once=tmp_path / "held"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:  # the first child holds its run (tests/hold): the SIGKILL finds it mid-way; the restarted one runs freely

        def running_pid():
            with store.read() as conn:
                return conn.execute(
                    text(
                        "SELECT w.pid FROM workers w JOIN runs r ON r.worker_id = w.id "
                        "WHERE r.status = 'running' AND r.prompts_total IS NOT NULL"
                    )
                ).scalar()

        wait_for((tmp_path / "held").exists, timeout=120, what="the first child to hold its run")
        pid = running_pid()
        os.kill(pid, signal.SIGKILL)

        def all_done():
            with store.read() as conn:
                return conn.execute(text("SELECT COUNT(*) FROM runs WHERE status = 'done'")).scalar() == 3

        wait_for(all_done, timeout=150, what="the restarted worker to finish the requeued runs")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "died (killed by SIGKILL)" in err and "requeued" in err and "restarting in 1s" in err, err[-3000:]
    with store.read() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM device_leases")).scalar() == 0


def test_worker_health_shows_devices_what_each_times_the_queue_and_stale_workers(store, model_dirs):
    from storage.db.schema import utcnow
    from storage.records import queries as q

    eids = _enqueue(store, model_dirs, 2)
    here = liveness.host_identity()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    liveness.register_worker(store, "box:1:aaaaaa@cuda:1", here, os.getpid())
    liveness.register_worker(store, "box:2:bbbbbb", here, os.getpid())
    liveness.register_worker(store, "box:3:cccccc@cpu:3", here, dead.pid)  # its process is gone: stale at once
    assert run_state.claim_group(store, eids[0], "box:1:aaaaaa@cuda:1")
    with store.write() as conn:
        conn.execute(text("UPDATE runs SET progress = 0.5 WHERE status = 'running'"))
        conn.execute(
            text(
                "INSERT INTO device_leases (device, worker_id, experiment_id, acquired, heartbeat) "
                "VALUES ('box:cpu', 'box:2:bbbbbb', NULL, :now, :now)"
            ),
            {"now": utcnow()},
        )
    health = q.worker_health(store)
    frame = health["workers"].set_index("worker_id")
    assert list(frame.columns) == q.WORKER_HEALTH_COLUMNS[1:]
    assert frame.loc["box:1:aaaaaa@cuda:1", ["device", "status", "runs"]].tolist() == ["cuda:1", "timing", 3]
    assert frame.loc["box:1:aaaaaa@cuda:1", "experiment_id"] == eids[0]
    assert frame.loc["box:1:aaaaaa@cuda:1", "progress"] == pytest.approx(0.5)
    assert frame.loc["box:2:bbbbbb", ["device", "status"]].tolist() == ["cpu", "idle"]  # device from its lease
    assert frame.loc["box:3:cccccc@cpu:3", "status"] == "stale"
    assert (health["queued_runs"], health["queued_experiments"], health["running_runs"]) == (3, 1, 3)


def test_the_experiments_page_draws_the_workers_expander(tmp_path, model_dirs, monkeypatch):
    from streamlit.testing.v1 import AppTest

    url = f"sqlite:///{tmp_path / 'page.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    store = open_store(url)
    [eid] = _enqueue(store, model_dirs, 1)
    liveness.register_worker(store, "box:1:aaaaaa@cpu:0", liveness.host_identity(), os.getpid())
    at = AppTest.from_string("from app.main import run\nrun('experiments')", default_timeout=180).run()
    assert not at.exception, [e.value for e in at.exception]
    (workers,) = [e.label for e in at.expander if e.label.startswith("Workers:")]
    assert not missing(workers, "1 alive", "3 runs queued", "1 experiment"), workers
    assert run_state.claim_group(store, eid, "box:1:aaaaaa@cpu:0")
    at.run()  # a run going, the queue empty: the label says so, not "0 runs queued" alone
    (workers,) = [e.label for e in at.expander if e.label.startswith("Workers:")]
    assert not missing(workers, "1 alive", "3 runs running", "0 runs queued", "0 experiments"), workers
    assert list(at.dataframe[1].value["device"]) == ["cpu:0"]  # the experiments table stays the first dataframe


# --- compose.yaml and the docs' team setup ----------------------------------------------------------------------


def _team_setup_section() -> str:
    """docs/team-setup.md's compose section, up to the next section."""
    page = (ROOT / "docs" / "team-setup.md").read_text()
    start = page.index("## PostgreSQL, the dashboard and GPU workers")
    end = page.find("\n## ", start + 1)
    return page[start : end if end > 0 else len(page)]


def test_compose_file_has_postgres_dashboard_and_a_gpu_worker_on_shared_volumes():
    import yaml

    from app.cli import build_parser

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "worker", "dashboard"}
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"] and "pgdata" in compose["volumes"]
    gpus = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus[0]["capabilities"] == ["gpu"] and gpus[0]["driver"] == "nvidia"
    for name in ("worker", "dashboard"):
        assert "models:/models" in services[name]["volumes"], name
        env = services[name]["environment"]
        assert env["DRAFTLAB_MODELS"] == "/models" and env["DRAFTLAB_DB"].startswith("postgresql://")
        assert "@postgres:5432/" in env["DRAFTLAB_DB"]
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        command = services[name]["command"]
        assert command[0] == "draftlab"
        build_parser().parse_args(command[1:])  # the CLI accepts the command as written
    assert services["worker"]["command"][1:] == ["worker", "--devices", "all"]
    assert services["dashboard"]["depends_on"]["worker"]["condition"] == "service_healthy"
    assert services["worker"]["stop_grace_period"]  # SIGTERM: the children end their runs interrupted


def test_the_worker_healthcheck_is_healthy_exactly_while_a_worker_beats(tmp_path):
    """compose.yaml's worker healthcheck, run as written against a database: unhealthy (exit 1) with no worker,
    healthy (exit 0) once one is registered and heartbeating. (It once imported a module that did not exist, so the
    worker never became healthy and the dashboard, which waits on it, never started.)"""
    import yaml

    from storage import open_store
    from storage.jobs import liveness

    check = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["worker"]["healthcheck"]["test"]
    assert check[:3] == ["CMD", "python", "-c"]
    url = f"sqlite:///{tmp_path / 'health.db'}"
    store = open_store(url)
    env = {**os.environ, "DRAFTLAB_DB": url, "PYTHONPATH": str(ROOT)}

    def probe() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", check[3]], env=env, cwd=tmp_path, capture_output=True, text=True)

    alone = probe()
    assert alone.returncode == 1 and not alone.stderr, alone.stderr
    liveness.register_worker(store, "box:1:aaaaaa@cuda:0", liveness.host_identity(), os.getpid())
    liveness.heartbeat(store, "box:1:aaaaaa@cuda:0", None)
    beating = probe()
    assert beating.returncode == 0 and not beating.stderr, beating.stderr


def test_team_setup_docs_compose_command_and_service_names_match_the_file():
    import re

    import yaml

    text_ = _team_setup_section()
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    commands = re.findall(r"^docker compose .+$", text_, flags=re.M)
    assert commands == ["docker compose up -d --build"]
    assert commands[0] in (ROOT / "compose.yaml").read_text()  # the file's header says the same
    named = re.search(r"- Services: (.+?)\n- ", text_, flags=re.S).group(1)
    assert set(re.findall(r"`(\w+)` \(", named)) == set(compose["services"])
    assert "`pgdata`" in text_ and "`models`" in text_ and set(compose["volumes"]) == {"pgdata", "models"}


def test_worker_devices_all_without_a_gpu_stays_one_cpu_worker_and_bad_devices_exit_2(tmp_path, monkeypatch, capsys):
    import app.worker.supervisor as supervisor
    import app.worker.worker_process as worker_process
    from app.cli import main

    url = f"sqlite:///{tmp_path / 'one.db'}"
    calls = []
    monkeypatch.setattr(supervisor, "gpu_count", lambda: 0)
    monkeypatch.setattr(supervisor, "run_supervisor", lambda *a, **k: calls.append(("supervisor", a)) or 0)
    monkeypatch.setattr(worker_process, "run_worker", lambda *a, **k: calls.append(("worker", a)) or 0)
    assert main(["worker", "--devices", "all", "--db", url]) == 0
    assert main(["worker", "--db", url]) == 0
    assert [c[0] for c in calls] == ["worker", "worker"]  # today's single worker, not a supervisor
    assert main(["worker", "--devices", "gpu0", "--db", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --devices takes `all` or a comma list of cuda:N / cpu:N, or groups joined with + "
        "(got 'gpu0'); e.g. --devices cuda:0,cuda:1 or cuda:0+cuda:1,cuda:2"
    ]


def test_a_killed_supervisor_takes_its_children_with_it(tmp_path, model_dirs, wait_for):
    url = f"sqlite:///{tmp_path / 'sup.db'}"
    store = open_store(url)
    _enqueue(store, model_dirs, 1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--db", url, "--devices", "cpu:0"],
        cwd=ROOT,
        env=held_env(0),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:  # the child holds its run (tests/hold): the supervisor's death finds it mid-way

        def running_pid():
            with store.read() as conn:
                return conn.execute(
                    text(
                        "SELECT w.pid FROM workers w JOIN runs r ON r.worker_id = w.id "
                        "WHERE r.status = 'running' AND r.prompts_total IS NOT NULL"
                    )
                ).scalar()

        pid = wait_for(running_pid, timeout=120, what="a run in progress")
        proc.kill()  # SIGKILL: the supervisor cannot forward anything; PR_SET_PDEATHSIG sends the child SIGTERM
        proc.wait()

        def gone():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited (not reaped yet)
            except FileNotFoundError:
                return True

        wait_for(gone, timeout=30, what="the orphaned worker to stop")
    finally:
        if proc.poll() is None:
            proc.kill()
    with store.read() as conn:
        statuses = dict(conn.execute(text("SELECT status, COUNT(*) FROM runs GROUP BY status")).all())
    assert statuses == {"interrupted": 3}, statuses  # ended by its SIGTERM handler: resumable, nothing lost


def test_a_child_that_died_just_before_the_stop_is_reported_and_swept(tmp_path):
    """The race the chaos test met: a worker SIGKILLed between the supervisor's last poll and its SIGTERM. Its death
    is still logged, and its worker row and lease go with it (no stale worker left for the next sweep to find)."""
    from app.worker.supervisor import Supervisor

    url = f"sqlite:///{tmp_path / 'sup.db'}"
    store = open_store(url)
    lines: list[str] = []
    sup = Supervisor(url, ["cpu:0", "cpu:1"], log=lines.append)
    dead, alive = sup.children
    for child in sup.children:
        child.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        child.worker_id, child.started = f"w@{child.device}", time.monotonic()
        liveness.register_worker(store, child.worker_id, host=socket.gethostname(), pid=child.proc.pid)
    dead.proc.kill()
    dead.proc.wait()  # dead and reaped by the OS, not yet by the supervisor's poll
    sup.stop()
    assert sup._shutdown() == 128 + signal.SIGTERM
    assert alive.proc.poll() is not None  # the live child was stopped
    assert any("w@cpu:0 died (killed by SIGKILL)" in line and "not restarted (stopping)" in line for line in lines), (
        lines
    )
    assert any(line.startswith("stopping 1 worker ") for line in lines), lines
    with store.read() as conn:
        assert conn.execute(text("SELECT id FROM workers")).scalars().all() == ["w@cpu:1"]  # its own exit clears it
    store.dispose()
