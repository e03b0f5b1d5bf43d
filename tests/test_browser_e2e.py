"""End to end in a real browser: `draftlab ui` on a temporary database, a demo-pair experiment (k = 1,2,4)
launched from the New-experiment page (and a smaller second sweep queued behind it), run by the local worker that
`ui` starts, then its detail page checked against storage's queries, a token click in the round explorer selecting
its round, Compare's legend and line labels naming both experiments, with screenshots of the real app saved for the
docs (docs/dashboard.md).

Needs Debian's chromium at /usr/bin/chromium (driven by Playwright); skipped, with that reason, without it.
"""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import pandas as pd
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.browser import SCREENSHOTS, chromium, needs_chromium, upload_prompts
from tests.browser import commit as _commit
from tests.browser import dashboard as ui
from tests.browser import field as _field
from tests.browser import settle as _settle

TARGET, DRAFT = os.environ.get("DRAFTLAB_E2E_TARGET", "demo-target"), os.environ.get("DRAFTLAB_E2E_DRAFT", "demo-draft")
PROMPTS = ["def fibonacci(n):", "The capital of France is"]
# Small by default (about a minute on a shared 2-core CPU); the docs' screenshots come from a larger run:
#   DRAFTLAB_E2E_PROMPT_FILE=engine/prompts/code/validation.jsonl DRAFTLAB_E2E_MAX_NEW_TOKENS=64 \
#     pytest tests/test_browser_e2e.py
PROMPT_FILE = os.environ.get("DRAFTLAB_E2E_PROMPT_FILE")
MAX_NEW_TOKENS = int(os.environ.get("DRAFTLAB_E2E_MAX_NEW_TOKENS", "24"))
RUN_TIMEOUT_S = 420  # model loading plus four small runs on a shared 2-core CPU

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """`draftlab ui` (through `python -m app.cli`) on a temporary database and a free port."""
    with ui(tmp_path_factory.mktemp("e2e")) as served:
        yield served


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


def _downloads(page) -> dict[str, pd.DataFrame]:
    """Click every visible CSV download button on the page; the frames by file name."""
    frames = {}
    buttons = page.locator('[data-testid="stDownloadButton"] button')
    for i in range(buttons.count()):
        if not buttons.nth(i).is_visible():  # inside a collapsed expander
            continue
        with page.expect_download(timeout=60_000) as info:
            buttons.nth(i).click()
        download = info.value
        frames[download.suggested_filename] = pd.read_csv(io.BytesIO(Path(download.path()).read_bytes()))
        _settle(page)
    return frames


def _status(db: str, experiment_id: int) -> str:
    from storage import open_store
    from storage.analysis import catalog

    return catalog.experiments(open_store(db)).set_index("experiment_id").loc[experiment_id, "status"]


def _wait_done(db: str, experiment_id: int, log: Path) -> None:
    from storage import open_store
    from storage.records import queries as q

    deadline = time.time() + RUN_TIMEOUT_S
    status = None
    while time.time() < deadline:
        status = _status(db, experiment_id)
        if status not in ("queued", "running"):
            break
        time.sleep(2)
    runs = q.runs(open_store(db), experiment_id)
    assert status == "done", (
        f"experiment ended {status!r}; runs:\n{runs[['run_id', 'kind', 'k', 'status', 'error']]}"
        f"\nui log tail:\n{log.read_text(errors='replace')[-3000:]}"
    )


def _shown_round(page) -> int:
    """The round whose proposals the round explorer shows (its heading: `Round 3: the draft's proposals`)."""
    heading = page.get_by_text(re.compile(r"^Round \d+: the draft's proposals$"))
    return int(re.findall(r"\d+", heading.inner_text())[0])


def _token_boxes(page) -> dict[int, object]:
    """The token chart's click targets by round: the first token of each round (the prefill token is round -1).
    Each token's box on the chart's top layer carries its round in its tooltip, which Vega also writes into the
    element's aria-label."""
    boxes = page.locator('[data-testid="stVegaLiteChart"] path[aria-label*="round (-1: prefill): "]')
    boxes.first.wait_for()
    found: dict[int, object] = {}
    for i in range(boxes.count()):
        label = boxes.nth(i).get_attribute("aria-label")
        found.setdefault(int(re.findall(r"round \(-1: prefill\): (-?\d+)", label)[0]), boxes.nth(i))
    return found


def test_launch_watch_and_diagnose_a_demo_experiment_in_the_browser(dashboard, browser, tmp_path):
    from storage import open_store
    from storage.analysis import catalog
    from storage.records import queries as q

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1500, "height": 1900}, accept_downloads=True)
    page.set_default_timeout(120_000)

    # New experiment: demo pair preselected, a two-prompt upload, k = 1,2,4.
    page.goto(f"{dashboard['url']}/new")
    page.get_by_text("Pair check:").wait_for()
    if TARGET != "demo-target" or DRAFT != "demo-draft":
        _commit(_field(page, "Target model"), TARGET)
        _settle(page)
        _commit(_field(page, "Draft model"), DRAFT)
        _settle(page)
    # auto-retried: on a loaded machine the first paint can show the pair check before the field has its value
    expect(_field(page, "Target model")).to_have_value(TARGET, timeout=60_000)
    page.get_by_text("tokenizers match").wait_for()
    page.get_by_text("Upload a file").click()
    _settle(page)
    prompts = upload_prompts(page, PROMPT_FILE, tmp_path, PROMPTS)
    from engine.text.prompt_sets import load_prompt_file

    _commit(_field(page, "Max new tokens"), str(MAX_NEW_TOKENS))
    _settle(page)
    _commit(_field(page, "k values"), "1,2,4")
    _settle(page)
    _commit(_field(page, "Name"), "e2e demo sweep")
    _settle(page)
    page.screenshot(path=str(SCREENSHOTS / "new_experiment.png"))
    page.get_by_role("button", name="Launch").click()
    queued = page.get_by_text(re.compile(r"Experiment #\d+ queued"))
    queued.wait_for()
    experiment_id = int(re.search(r"#(\d+)", queued.inner_text()).group(1))
    # A second, smaller sweep of the same pair, for Compare (queued behind the first; its name is not HTML).
    from storage.jobs.experiments import enqueue_experiment

    second = enqueue_experiment(
        open_store(dashboard["db"]),
        name="e2e second <i>sweep</i>",
        target=TARGET,
        draft=DRAFT,
        prompts=prompts.name,
        sampling={"max_new_tokens": MAX_NEW_TOKENS},
        sweep_values=[1, 2],
        prompt_texts=load_prompt_file(prompts)[:2],
    )

    # Experiments: live progress while it runs.
    page.goto(dashboard["url"])  # the default page lives at the root URL
    try:
        page.get_by_text("Refreshing every").wait_for(timeout=30_000)
    except PlaywrightTimeout:  # only acceptable if the whole experiment already finished
        assert _status(dashboard["db"], experiment_id) not in ("queued", "running"), "no live refresh while running"
    page.goto("about:blank")  # an idle browser while the runs are timed: the CPU is small and shared
    _wait_done(dashboard["db"], experiment_id, dashboard["log"])
    _wait_done(dashboard["db"], second, dashboard["log"])
    page.goto(dashboard["url"])
    page.get_by_text("Selected experiment").wait_for()
    _settle(page)
    assert page.get_by_text("Refreshing every").count() == 0  # nothing runs: no timer
    _settle(page)
    page.screenshot(path=str(SCREENSHOTS / "experiments.png"))

    # Detail: the charts render, and what they draw is what storage computes.
    store = open_store(dashboard["db"])
    curve = q.sweep_curve(store, experiment_id)
    best_run = int(curve.loc[curve["speedup"].idxmax(), "run_id"])
    page.goto(f"{dashboard['url']}/experiment?experiment={experiment_id}")
    page.get_by_text("Speedup vs k").wait_for()
    _settle(page)
    charts = page.locator('[data-testid="stVegaLiteChart"]')

    def drawn(count: int) -> None:
        charts.nth(count - 1).wait_for()
        assert charts.count() == count
        for i in range(count):
            charts.nth(i).locator("canvas, svg").first.wait_for()
            assert charts.nth(i).bounding_box()["height"] > 100

    drawn(1)  # the Verdict section: the speedup chart alone
    values = dict(
        zip(
            page.locator('[data-testid="stMetricLabel"]').all_inner_texts(),
            page.locator('[data-testid="stMetricValue"]').all_inner_texts(),
        )
    )
    from storage.analysis.verdict import verdict

    judged = verdict(store, experiment_id)
    served = judged.chosen or judged.best  # the target alone: the best run's α beside "0 (target alone)"
    served_row = q.runs(store, experiment_id).set_index("run_id").loc[served.run_id]
    assert values["k to serve"] == (str(judged.chosen.value) if judged.chosen else "0 (target alone)")
    assert values["Speedup"] == (
        f"{served.speedup:.2f}× ({served.ci[0]:.2f}–{served.ci[1]:.2f})" if judged.chosen else "1× (target alone)"
    )
    assert next(v for label, v in values.items() if label.startswith("α (")) == f"{served_row.alpha:.3f}"
    page.screenshot(path=str(SCREENSHOTS / "experiment_detail.png"))
    frames = _downloads(page)
    page.get_by_role("tab", name="Why drafts are rejected").click()  # a click builds the section it opens
    page.get_by_text("Conditional acceptance by draft position").wait_for()
    _settle(page)
    drawn(4)  # acceptance, tokens per round, by position, by type
    assert f"run={best_run}" in page.url and "section=" in page.url
    frames.update(_downloads(page))
    drawn = frames["speedup_curve.csv"].dropna(subset=["speedup"]).sort_values("k")
    assert drawn["k"].tolist() == [1, 2, 4]
    assert drawn["speedup"].tolist() == pytest.approx(curve.sort_values("k")["speedup"].tolist(), nan_ok=True)
    position = frames[f"run{best_run}_acceptance_by_position.csv"]
    expected = q.acceptance_by_position(store, best_run)
    assert position["position"].tolist() == expected["position"].tolist()
    assert position["conditional"].tolist() == pytest.approx(expected["conditional"].tolist(), nan_ok=True)
    by_type = frames[f"run{best_run}_acceptance_by_type.csv"]
    expected = q.acceptance_by_type(store, best_run)
    assert by_type["token_type"].tolist() == expected["token_type"].tolist()
    assert by_type["rate"].tolist() == pytest.approx(expected["rate"].tolist(), nan_ok=True)
    assert by_type["verified"].tolist() == expected["verified"].tolist()

    # The other views of the same experiment, for the docs.
    page.goto(f"{dashboard['url']}/rounds?experiment={experiment_id}&run={best_run}&prompt=0")
    page.get_by_text("the draft's proposals").wait_for()
    _settle(page)
    page.screenshot(path=str(SCREENSHOTS / "round_explorer.png"))
    # A click on a token selects the round that emitted it and shows that round's proposals.
    first = _shown_round(page)
    boxes = _token_boxes(page)
    other = next(r for r in boxes if r >= 0 and r != first)  # a round other than the one shown
    box = boxes[other].bounding_box()
    page.mouse.click(box["x"] + 4, box["y"] + box["height"] / 2)  # on the token's first glyph, as a person would
    _settle(page)
    assert _shown_round(page) == other and f"round={other}" in page.url
    # The slider moves back freely, and clicking the same token again selects its round again.
    page.get_by_role("slider").focus()
    page.keyboard.press("Home")
    _settle(page)
    assert _shown_round(page) == first
    _token_boxes(page)[other].click()  # Playwright clicks only if this box is what the pointer hits there
    _settle(page)
    assert _shown_round(page) == other
    page.mouse.move(0, 0)  # off the token: its tooltip would cover the buttons below
    page.locator("#vg-tooltip-element.visible").wait_for(state="hidden")
    frames = _downloads(page)
    proposals = frames[f"run{best_run}_prompt0_round{other}_proposals.csv"]
    expected = q.round_proposals(store, best_run, 0, other)
    assert proposals["outcome"].tolist() == expected["outcome"].tolist()
    assert proposals["p_draft"].tolist() == pytest.approx(expected["p_draft"].tolist())

    other_run = int(curve[curve["run_id"] != best_run]["run_id"].iloc[0])
    page.goto(f"{dashboard['url']}/compare?experiments={experiment_id},{second}&runs={other_run},{best_run}")
    page.get_by_text("Conditional acceptance by draft position").wait_for()
    _settle(page)
    # The sweep panels' shared legend (a chart of its own under them) names every experiment in full (not cut to
    # "● i…"), the HTML in a name shown as text.
    labels = catalog.experiments(store).set_index("experiment_id")
    ends = page.locator('[data-testid="stVegaLiteChart"] .mark-text.role-mark text').all_text_contents()
    for shown in (experiment_id, second):
        assert ends.count(f"#{shown} · {labels.loc[shown, 'name']} (done)") == 1, ends
        # and each line ends with its experiment's number (named in full in that legend), in all three panels
        assert ends.count(f"#{shown}") == 3, ends
    page.screenshot(path=str(SCREENSHOTS / "compare.png"))
    page.goto(f"{dashboard['url']}/theory")
    page.get_by_text("Monte Carlo simulator").wait_for()
    _settle(page)
    page.screenshot(path=str(SCREENSHOTS / "theory.png"))
    page.close()
