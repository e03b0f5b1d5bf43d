"""The experiment page's "In the server (predicted)" panel and Compare's server rows in Chromium, on a database of two
finished k sweeps (tests/profile_data.py): one with a server cost profile stored for it, one of another target that
no profile fits.

- With a profile: the panel's chart draws (with a size), its table holds the run JSON's `server_predicted` figures
  cell for cell (each concurrency and k, with its interval, the lab's measured speedup beside the k it measured),
  and the page names the profile and the k to serve at each concurrency, as the JSON says.
- Without one: one line, the JSON's reason and the command that measures a profile; no chart.
- Compare: each run's predicted server speedup at concurrency 1 and its own k, with its interval and the profile, or
  no figure and why.
Fails on console errors, page errors, exceptions on the page and charts not drawn; needs Debian's chromium at
/usr/bin/chromium, like the other browser tests."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from tests.browser import CHARTS_JS, chromium, dashboard, needs_chromium, new_page, page_problems, settle
from tests.meaning import missing

pytestmark = needs_chromium
PANEL = "In the server (predicted)"
# Each table's accessible copy (the grid draws on a canvas): its rows of cell texts, header first.
TABLES_JS = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')].map(t =>
  [...t.querySelectorAll('table tr')].map(r => [...r.querySelectorAll('th, td')].map(c => c.textContent.trim())))"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from storage import open_store
    from storage.serving.export import run_document
    from tests.chart_data import idle_worker
    from tests.profile_data import filled_sweep, store_profile

    tmp = tmp_path_factory.mktemp("server_predicted")
    store = open_store(f"sqlite:///{tmp / 'draftlab.db'}")
    fitted, ids = filled_sweep(store, (1, 2, 3), prompts=4)
    unfitted, other = filled_sweep(store, (1, 2), prompts=3, target="another-target")
    store_profile(store, fitted, ids[("speculative", 3)], concurrency=(1, 4))
    documents = {eid: run_document(store, eid, with_outputs=False) for eid in (fitted, unfitted)}
    answer = _deploy_answer(store, fitted)
    idle_worker(store)
    store.dispose()
    with dashboard(tmp) as running:
        yield {
            **running,
            "fitted": fitted,
            "unfitted": unfitted,
            "ids": ids,
            "other": other,
            "docs": documents,
            "answer": answer,
        }


def _deploy_answer(store, experiment_id: int) -> dict:
    """What `draftlab export --format deploy` serves: its answer, run and server prediction (or the refusal)."""
    from storage.serving.deploy import DeployError, deploy_document

    try:
        doc = deploy_document(store, experiment_id)
    except DeployError as exc:
        return {"refused": str(exc)}
    return {"answer": doc["answer"], "run_id": doc["run_id"], "predicted": doc.get("server_predicted")}


def _speedup(value, lo=None, hi=None) -> str:
    return f"{value:.2f}× ({lo:.2f}–{hi:.2f})" if lo is not None else f"{value:.2f}×"


def _table(page, header: str) -> list[dict[str, str]]:
    """The rows of the table with a column named `header`, each as {column: cell text} (the grid writes its
    accessible copy after it paints: waited for)."""
    found: list = []
    deadline = page.evaluate("Date.now()") + 15_000
    while not found and page.evaluate("Date.now()") < deadline:
        found = [rows for rows in page.evaluate(TABLES_JS) if rows and header in rows[0]]
        page.wait_for_timeout(200)
    assert found, f"no table with a column {header!r}"
    return [dict(zip(found[0][0], row)) for row in found[0][1:]]


def _text(page) -> str:
    """The page's text as read (md_text's word joiners, which keep `:` from starting an emoji code, left out)."""
    return page.locator('[data-testid="stMain"]').inner_text().replace("\u2060", "")


def _detail(page, url: str, experiment_id: int, messages: list[str], charted: bool) -> tuple[list[str], list[dict]]:
    page.goto(f"{url}/experiment?experiment={experiment_id}&section={quote('Predictions and cost')}")
    settle(page)
    problems, _ = page_problems(page, f"experiment {experiment_id}", messages, charted=charted)
    return problems, [c for c in page.evaluate(CHARTS_JS) if c["heading"] == PANEL]


def test_the_panel_draws_the_run_jsons_prediction_or_says_why_there_is_none(served):
    url, ids = served["url"], served["ids"]
    run_id = ids[("speculative", 3)]  # the deepest run: shown first
    runs = {r["run_id"]: r for r in served["docs"][served["fitted"]]["runs"]}
    predicted = runs[run_id]["server_predicted"]
    with chromium() as browser:
        page, messages = new_page(browser)
        problems, charts = _detail(page, url, served["fitted"], messages, charted=True)
        text = _text(page)
        table = _table(page, "predicted in the server (95 %)")
        problems_without, charts_without = _detail(page, url, served["unfitted"], messages, charted=False)
        text_without = _text(page)
    assert not problems + problems_without, "\n".join(problems + problems_without)

    assert len(charts) == 1 and charts[0]["drawn"] and charts[0]["width"] > 0 and charts[0]["height"] > 0, charts
    assert not missing(text, PANEL, predicted["profile"]["label"], f"From run {run_id}'s acceptance"), text
    expected = [
        (c, k, cell) for c, by_k in predicted["concurrency"].items() for k, cell in by_k.items()
    ]  # the JSON's cells, by concurrency then k
    assert [(r["concurrency"], r["k"]) for r in table] == [(c, k) for c, k, _ in expected], table
    for row, (c, k, cell) in zip(table, expected):
        assert row["predicted in the server (95 %)"] == _speedup(cell["speedup"], *cell["speedup_ci"]), row
        assert float(row["tokens per step"]) == pytest.approx(cell["tokens_per_step"], abs=1e-9), row
        assert float(row["t_k / t_0"]) == pytest.approx(cell["step_seconds_ratio"], abs=1e-9), row
        assert (row["serve"] == "true") == (predicted["schedule"][c] == int(k)), row
        lab = next((r for r in runs.values() if str(r["k"]) == k), None) if c == "1" else None  # batch 1 only
        assert row["lab measured (95 %)"] == (_speedup(lab["speedup"], *lab["speedup_ci"]) if lab else "—"), row
    served_line = next(line for line in text.splitlines() if line.startswith("k to serve:"))  # not the headline's
    for c, k in predicted["schedule"].items():
        if k:
            cell = predicted["concurrency"][c][str(k)]
            assert f"concurrency {c}: k={k} at {_speedup(cell['speedup'], *cell['speedup_ci'])}" in served_line
        else:
            assert f"concurrency {c}: off" in served_line, served_line

    # the headline under the verdict: the server's answer, the run and k per concurrency deploy serves
    headline = next(x for x in text.splitlines() if x.startswith("In the server") and x.strip() != PANEL)
    answer = served["answer"]
    if answer.get("answer", {}).get("from") == "server":
        chosen = answer["predicted"]
        assert headline.startswith(f"In the server ({chosen['profile']['label']}): serve run {answer['run_id']}, ")
        for c, k in chosen["schedule"].items():
            assert f"concurrency {c}: " + (f"k={k} (" if k else "off") in headline, headline
    else:  # no run's prediction surely gains: the lab's verdict stands, and the headline says why
        assert headline.endswith(": the lab's verdict stands."), headline
        assert "no k's predicted server speedup lies surely above 1" in headline, headline
    no_profile = [x for x in text_without.splitlines() if x.startswith("In the server") and x.strip() != PANEL]
    assert no_profile == [], no_profile  # no profile: no headline

    assert charts_without == [], charts_without  # no profile: no chart
    line = next(x for x in text_without.splitlines() if x.startswith("No server prediction for run"))
    shown = int(re.match(r"No server prediction for run (\d+)", line).group(1))
    unfit = {r["run_id"]: r for r in served["docs"][served["unfitted"]]["runs"]}[shown]["server_predicted"]
    assert unfit["profile"] is None
    assert line == f"No server prediction for run {shown}: {unfit['reason'].replace('`', '')}", line
    assert not missing(line, f"draftlab profile {served['unfitted']} --run {shown}"), line


def test_compare_shows_each_runs_predicted_server_speedup_and_its_profile(served):
    fitted_run, unfitted_run = served["ids"][("speculative", 3)], served["other"][("speculative", 2)]
    docs = {
        r["run_id"]: r["server_predicted"]
        for eid in (served["fitted"], served["unfitted"])
        for r in served["docs"][eid]["runs"]
    }
    with chromium() as browser:
        page, messages = new_page(browser)
        page.goto(
            f"{served['url']}/compare?experiments={served['fitted']},{served['unfitted']}&runs={fitted_run},{unfitted_run}"
        )
        settle(page)
        problems, _ = page_problems(page, "Compare", messages, charted=True)
        rows = {row[""]: row for row in _table(page, "") if row.get("")}
    assert not problems, "\n".join(problems)
    predicted, profile = rows["predicted in the server (95 %)"], rows["server cost profile"]
    columns = [c for c in predicted if c]
    fitted_column = next(c for c in columns if f"run {fitted_run} " in c)
    unfitted_column = next(c for c in columns if f"run {unfitted_run} " in c)
    cell = docs[fitted_run]["concurrency"]["1"]["3"]
    assert predicted[fitted_column] == f"{_speedup(cell['speedup'], *cell['speedup_ci'])} at k=3, concurrency 1"
    assert profile[fitted_column] == docs[fitted_run]["profile"]["label"]
    assert predicted[unfitted_column] == "—"
    assert profile[unfitted_column] == f"none: {docs[unfitted_run]['reason']}"
