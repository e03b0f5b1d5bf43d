"""The New-experiment form checks fields as they are typed, in Chromium, each message right under its own field:
Max new tokens −5 says what the field takes (never an estimate of −2,100 tokens and −32 s), a local path with no
folder there says "no such folder" (never the hub's "Repo id must be in the form …"), and the estimate is back
once the field is right. Fails on console errors, page errors and exceptions on the page."""

from __future__ import annotations

import pytest

from tests.browser import chromium, commit, dashboard, field, needs_chromium, new_page, page_problems, settle

pytestmark = needs_chromium
ESTIMATE = "Launch decodes at most"  # pages/panels/experiment_estimate.py's show_workload


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from storage import open_store
    from tests.chart_data import idle_worker

    tmp = tmp_path_factory.mktemp("form")
    store = open_store(f"sqlite:///{tmp / 'draftlab.db'}")
    idle_worker(store)  # the dashboard starts no worker of its own: nothing is launched here
    store.dispose()
    with dashboard(tmp) as running:
        yield running


def _under(page, label: str, message: str) -> None:
    """`message` is shown right under the field labelled `label`: it starts below the field's bottom, within
    120 px, and overlaps the field's column horizontally."""
    box = field(page, label).bounding_box()
    shown = page.get_by_text(message).first
    shown.wait_for()
    note = shown.bounding_box()
    below = note["y"] - (box["y"] + box["height"])
    beside = note["x"] < box["x"] + box["width"] and box["x"] < note["x"] + note["width"]
    assert 0 <= below <= 120 and beside, f"{message!r} at {note}, not under {label!r} at {box}"


def test_a_wrong_field_says_so_under_itself_as_it_is_typed(served):
    with chromium() as browser:
        page, messages = new_page(browser)
        page.goto(f"{served['url']}/new")
        settle(page)
        page.get_by_text(ESTIMATE).first.wait_for()  # the default form: a figure for the work

        commit(field(page, "Max new tokens"), "-5")
        settle(page)
        _under(page, "Max new tokens", "max new tokens must be a whole number from 1")
        body = page.locator("body").inner_text()
        assert ESTIMATE not in body and "-2,100" not in body and "−2,100" not in body, body[-1500:]

        commit(field(page, "Draft model"), "/no/such/folder-for-the-form-test")
        settle(page)
        _under(page, "Draft model", "no such folder")
        assert "Repo id must be" not in page.locator("body").inner_text()

        commit(field(page, "Max new tokens"), "16")
        settle(page)
        page.get_by_text(ESTIMATE).first.wait_for()  # right again: the estimate is back, the error gone
        assert page.get_by_text("max new tokens must be").count() == 0
        problems, _ = page_problems(page, "New experiment", messages, charted=False)
    assert not problems, "\n".join(problems)
