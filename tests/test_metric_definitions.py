"""docs/metrics.md's tables of run metrics are storage/records/columns.py's entries (`section`, `doc`): each section's
table there is `metric_definitions(section)`, either generated in place by the docs' hooks or, row for row, the same
text, so a metric's definition is written once, beside its SQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.records.columns import DOC_SECTIONS, RUN, metric_definitions

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
HEADINGS = {"counts": "## Counts and rates", "times": "## Times and speedups", "serving": "## Serving metrics"}


def _table_rows(markdown: str, heading: str) -> list[str]:
    """The rows (after the header) of the first table under `heading`."""
    lines = markdown.splitlines()
    rows: list[str] = []
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("#") or (rows and not line.startswith("|")):
            break
        if line.startswith("|"):
            rows.append(line)
    return rows[2:]


@pytest.mark.parametrize("section", DOC_SECTIONS)
def test_the_docs_table_is_the_declaration(section):
    docs = DOCS.read_text(encoding="utf-8")
    if f"<!-- generated: metrics-{section} -->" in docs:
        return  # docs/hooks.py writes metric_definitions(section) there
    generated = metric_definitions(section).splitlines()
    assert generated[:2] == ["| name | definition |", "|---|---|"]
    assert sorted(_table_rows(docs, HEADINGS[section])) == sorted(generated[2:])


def test_every_section_entry_has_a_definition():
    for c in RUN:
        assert (c.section is None) == (c.doc == ""), c.name
        assert c.section in (None, *DOC_SECTIONS), c.name
    assert "| `alpha` | accepted / (accepted + rejected)" in metric_definitions("counts")
    with pytest.raises(ValueError, match="counts"):
        metric_definitions("nonsense")
