"""Dashboard entry script (`streamlit run app/main.py`, started by `draftlab ui`): the login (pages/widgets/access.py),
then routing; a page's unexpected exception is logged here and shown as one short message.

The pages live in the top-level `pages/` package, registered as callables, so Streamlit's legacy `pages/`
auto-discovery (a folder beside the entry script) never kicks in.

Every page has its own path (`/experiments`, `/new`, ...). The root URL is a hidden page that switches to the start
page (the experiments list unless a test starts elsewhere), keeping the query string: Streamlit serves its default
page at the root only, so a visible default page would have no path of its own (`/experiments` answered "page not
found").
"""

from __future__ import annotations

import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
if str(PROJECT) not in sys.path:  # `streamlit run` puts app/ on the path, not the project root
    sys.path.insert(0, str(PROJECT))

import logging  # noqa: E402

import streamlit as st  # noqa: E402

from pages import compare, experiment_detail, experiments, new_experiment, round_explorer, theory, train  # noqa: E402
from pages.widgets import access  # noqa: E402
from pages.widgets.nav import DEFAULT, PAGES, ROOT, register  # noqa: E402
from pages.widgets.pair_check import warm_up  # noqa: E402

log = logging.getLogger("draftlab.dashboard")
if not logging.getLogger("draftlab").handlers:  # the server's stderr; Streamlit only configures its own loggers
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("draftlab").addHandler(_handler)

# key (pages/widgets/nav.py) -> the page module's render
RENDERS = {
    "new": new_experiment.render,
    "experiments": experiments.render,
    "experiment": experiment_detail.render,
    "rounds": round_explorer.render,
    "compare": compare.render,
    "train": train.render,
    "theory": theory.render,
}

UNEXPECTED = (
    "This page hit an unexpected error. It has been logged on the server; reload the page or pick another "
    "one, and tell whoever runs this dashboard if it keeps happening."
)


def all_pages(start: str | None = None) -> list:
    """Every page at its own path, plus the hidden root page that opens `start` (default: the experiments list),
    built fresh each run so any page can be the start page; registered for the pages' links (pages/widgets/nav.py)."""
    pages = {key: st.Page(RENDERS[key], title=title, icon=icon, url_path=key) for key, (title, icon) in PAGES.items()}
    register(pages)
    target = pages[start or DEFAULT]

    def open_start_page() -> None:
        st.switch_page(target, query_params=st.query_params.to_dict())

    root = st.Page(
        open_start_page, title=target.title, icon=target.icon, url_path=ROOT, default=True, visibility="hidden"
    )
    return [root, *pages.values()]


def run(start: str | None = None) -> None:
    """Route to the page in the URL; `start` picks the default page (tests open a page directly this way)."""
    st.set_page_config(page_title="DraftLab", page_icon=":material/science:", layout="wide")
    admitted = access.is_admitted()  # OIDC or $DRAFTLAB_PASSWORD, when one is configured
    # Routing is resolved either way, before the login, so the rerun after logging in stays on the page the URL
    # asked for; until then the menu is hidden, no page runs and only the login is drawn.
    page = st.navigation(all_pages(start), position="sidebar" if admitted else "hidden")
    if not admitted:
        access.login()
        return
    access.logout_button()
    try:
        page.run()
    except Exception:  # noqa: BLE001 - st.rerun/st.stop are BaseExceptions and pass through
        # The traceback (server paths, SQL, URLs) goes to the server's log only; the browser gets one line.
        log.exception("page %r failed", getattr(page, "url_path", None) or getattr(page, "title", "?"))
        st.error(UNEXPECTED, icon=":material/error:")
    # The pair check's transformers import, in the background once the first page is drawn: started before it,
    # seconds of importing competed with that page for the CPU (the detail page's charts came 2–3 s later on a
    # 2-CPU machine); a form's pair check that runs first imports what it needs itself.
    warm_up()


if __name__ == "__main__":
    run()
