"""The password login in a real browser: `draftlab ui` with $DRAFTLAB_PASSWORD shows only the login, refuses a
wrong password, and after the right one opens the page the URL asked for (AppTest cannot see that last part: it
keeps the page across reruns by itself). Needs Debian's chromium at /usr/bin/chromium, like test_browser_e2e.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "a shared secret for the team"

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium)"
)


@pytest.fixture
def dashboard(tmp_path):
    from storage import open_store
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment

    db = f"sqlite:///{tmp_path / 'login.db'}"
    store = open_store(db)
    experiment_id = enqueue_experiment(
        store,
        name="behind the login",
        target="a",
        draft="b",
        prompts="tiny",
        sampling={},
        sweep_values=[1],
        prompt_texts=["t1"],
    )
    run_state.cancel_experiment(store, experiment_id)  # nothing for the local worker to do
    store.dispose()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "ui.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), DRAFTLAB_PASSWORD=PASSWORD)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "ui", "--db", db, "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                    if response.read().strip() == b"ok":
                        break
            except OSError:
                time.sleep(0.5)
        yield {"url": url, "experiment_id": experiment_id, "log": log}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_password_login_in_the_browser(dashboard):
    from playwright.sync_api import sync_playwright

    url, experiment_id = dashboard["url"], dashboard["experiment_id"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(f"{url}/experiment?experiment={experiment_id}")
            field = page.get_by_label("Password", exact=True)
            field.wait_for(timeout=120_000)
            page.wait_for_timeout(1500)
            assert page.locator("h1").all_inner_texts() == ["DraftLab"]
            assert "behind the login" not in page.content()

            field.fill("not the password")
            page.get_by_role("button", name="Log in").click()
            page.get_by_text("Wrong password.").wait_for(timeout=60_000)
            assert "behind the login" not in page.content()

            field.fill(PASSWORD)
            page.get_by_role("button", name="Log in").click()
            page.locator("h1").filter(has_text="Experiment detail").wait_for(timeout=120_000)
            assert "/experiment?" in page.url and f"experiment={experiment_id}" in page.url
        finally:
            browser.close()
    assert PASSWORD not in dashboard["log"].read_text(errors="replace")
