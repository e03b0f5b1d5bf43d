"""Findings on the experiment-detail page: what the stored data says (storage/analysis/findings/), each with its
numbers, a link to the chart that shows it, and a "Try it" link to the New-experiment form prefilled for the next step.

    render_findings(store, experiment_id)   # in the Verdict section of pages/experiment_detail.py

Every text that can carry user input (model names, prompt sets, token types) is escaped before it reaches
st.markdown.
"""

from __future__ import annotations

import re

import streamlit as st

from pages.panels import sections
from pages.panels.advice import browser_advice
from pages.widgets.nav import PAGES
from storage.analysis.findings import findings, prefill_query, prefill_url
from storage.records import queries as q

# A finding's chart key -> the anchor of that chart's heading on the detail page (a link within the section drawn;
# a chart in another section gets a button that opens it, pages/panels/sections.py). The page sets no explicit anchors
# but the Runs table's, so these are the ones Streamlit derives from the heading texts (lower case, runs of other
# characters -> '-'); "speedup" follows the swept variable.
HEADING_ANCHORS = {
    "speedup": "speedup-vs-{variable}",
    "predictions": "predicted-against-measured",
    "cost": "cost-c-verify-cost-and-memory",
    "by-position": "conditional-acceptance-by-draft-position",
    "by-type": "acceptance-by-token-type",
    "runs": "runs",
    "production": "production-against-the-lab",
    "schedule": "k-schedule",
    "confirm": "confirm-in-vllm",
    "server": "in-the-server",
}
CHART_NAMES = {
    "speedup": "the speedup chart",
    "predictions": "predicted against measured",
    "cost": "the cost table",
    "by-position": "acceptance by position",
    "by-type": "acceptance by token type",
    "runs": "the Runs table",
    "production": "production against the lab",
    "schedule": "the k schedule",
    "confirm": "Confirm in vLLM",
    "server": "In the server (predicted)",
}
BOXES = {"error": (st.error, ":material/error:"), "warning": (st.warning, ":material/warning:")}

# Markdown's backslash-escapable punctuation, plus what Streamlit reads on top of it ($ math, :emoji: and
# :color[...] directives).
_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=^\"'])")
_WORD_JOINER = "\u2060"


def md_escape(value) -> str:
    """Text shown literally by st.markdown: every markdown character backslash-escaped, line breaks flattened, and
    an invisible word joiner after each colon so `:name:` never becomes an emoji or icon."""
    flat = " ".join(str(value).split())
    return _SPECIAL.sub(r"\\\1", flat).replace(":", ":" + _WORD_JOINER)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def chart_anchor(chart: str, sweep_variable: str = "k") -> str | None:
    anchor = HEADING_ANCHORS.get(chart)
    return anchor.format(variable=_slug(sweep_variable)) if anchor else None


def finding_markdown(finding: dict, sweep_variable: str = "k", here: str = sections.VERDICT) -> str:
    """One finding as markdown: the title in bold, the sentence with its numbers, the chart link (an anchor when the
    chart is in section `here`, the one drawn; else the finding's button opens its section), the next step worded
    for the browser (pages/panels/advice.py)."""
    anchor = chart_anchor(finding["chart"], sweep_variable)
    where = CHART_NAMES.get(finding["chart"], "the chart")
    elsewhere = sections.CHART_SECTIONS.get(finding["chart"], here) != here
    link = f"[→ {md_escape(where)}](#{anchor})" if anchor and not elsewhere else f"(see {md_escape(where)})"
    return (
        f"**{md_escape(finding['title'])}.** {md_escape(browser_advice(finding['detail']))} {link}  \n"
        f"*Next:* {md_escape(browser_advice(finding['next']))}"
    )


def _show_chart(finding: dict, index: int, here: str) -> None:
    """A button that opens the section drawing the finding's chart, where that is another section than `here`."""
    section = sections.CHART_SECTIONS.get(finding["chart"])
    if section is None or section == here:
        return
    st.button(
        f"Show {CHART_NAMES.get(finding['chart'], 'the chart')}",
        key=f"finding_{index}_show",
        icon=":material/arrow_forward:",
        on_click=sections.open_section,
        args=(section,),
        help=f"opens the {section} section",
    )


def _try_it(prefill: dict, label: str) -> None:
    from pages.widgets.common import nav_page

    page, params = prefill_query(prefill)
    if page in PAGES:
        st.page_link(nav_page(page), label=md_escape(label), query_params=params, icon=":material/science:")
    else:  # a page that does not exist yet (distillation): the link is kept so the URL is ready when it does
        st.markdown(f"[{md_escape(label)}]({prefill_url(prefill)}) *\\(the {md_escape(page)} page is not built yet\\)*")


def render_findings(
    store, experiment_id: int, found: list[dict] | None = None, here: str = sections.VERDICT
) -> list[dict]:
    """Draw the experiment's findings (most severe first; computed here unless the caller has them) in section
    `here` of the detail page, and return them."""
    found = findings(store, experiment_id) if found is None else found
    st.subheader("Findings", anchor="findings")
    if not found:
        st.caption("Nothing to report yet: findings appear as runs finish.")
        return found
    experiment = q.experiment(store, experiment_id) or {}
    variable = experiment.get("sweep_variable") or "k"
    for index, finding in enumerate(found):
        with st.container(border=True, key=f"finding_{index}_{finding['kind']}"):
            text, links = st.columns([5, 1], vertical_alignment="center")
            with text:
                body = finding_markdown(finding, variable, here)
                box = BOXES.get(finding["severity"])
                if box:
                    box[0](body, icon=box[1])
                else:
                    st.markdown(body)
            with links:
                _show_chart(finding, index, here)
                if finding["prefill"]:
                    _try_it(finding["prefill"], "Try it")
                for alternative in finding.get("alternatives", []):
                    _try_it(alternative["prefill"], f"Try {alternative['label']}")
    return found
