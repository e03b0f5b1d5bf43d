"""Every page answers at its own path in a real browser (AppTest opens pages by name and never routes a URL):
`/experiments` is the experiments list, not "page not found", and the root URL opens it with its query string.
Needs Debian's chromium at /usr/bin/chromium, like test_browser_e2e.py."""

from __future__ import annotations

from pages.widgets.nav import PAGES
from tests.browser import chromium, dashboard, needs_chromium, settle

pytestmark = needs_chromium


def _title(page) -> str:
    heading = page.locator("h1").first
    heading.wait_for(timeout=60_000)
    return heading.inner_text().strip()


def test_every_page_has_its_own_path_and_the_root_opens_the_experiments_list(tmp_path):
    from storage import open_store
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment

    store = open_store(f"sqlite:///{tmp_path / 'draftlab.db'}")
    experiment_id = enqueue_experiment(
        store, name="routed", target="a", draft="b", prompts="tiny", sampling={}, sweep_values=[1], prompt_texts=["t1"]
    )
    run_state.cancel_experiment(store, experiment_id)  # nothing for the local worker to do
    store.dispose()
    with dashboard(tmp_path) as served, chromium() as browser:
        page = browser.new_page()
        for key, (title, _icon) in PAGES.items():
            page.goto(f"{served['url']}/{key}")
            settle(page)
            assert page.get_by_text("Page not found").count() == 0, key
            assert _title(page) == title, key
            assert page.url.split("?")[0].endswith(f"/{key}"), page.url
        page.goto(f"{served['url']}/?experiment={experiment_id}")
        settle(page)
        assert _title(page) == "Experiments"
        assert page.url.split("?")[0].endswith("/experiments"), page.url
        assert f"experiment={experiment_id}" in page.url, page.url
