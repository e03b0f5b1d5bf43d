"""The detail page of a token-tree sweep under Streamlit's AppTest (no model loads): the tree run's breakdowns show
its acceptance by depth split by sibling rank, drawn from exactly the query's rows, and its off-chain share; a chain
run of the same sweep shows neither."""

from __future__ import annotations

import pytest

from pages.panels.tree_panel import TITLE
from pages.widgets import charts
from storage import open_store
from storage.records import queries as q
from storage.records.columns import show
from storage.records.tree_breakdowns import acceptance_by_sibling_rank
from tests.meaning import missing
from tests.test_pages import app, assert_clean, chart_data
from tests.test_tree_breakdowns import TOPK, fill_tree_experiment


@pytest.fixture
def tree_db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'draftlab.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    store = open_store(url)
    eid, by_topk, _ = fill_tree_experiment(store)
    return store, eid, by_topk


def _rank_datasets(at):
    return [d for datasets in chart_data(at) for d in datasets if {"depth", "sibling_rank", "share"} <= set(d.columns)]


def test_a_tree_run_shows_acceptance_by_depth_and_rank_and_its_off_chain_share(tree_db):
    store, eid, by_topk = tree_db
    tree = by_topk[TOPK]
    at = app("experiment", experiment=eid, section="Why drafts are rejected", run=tree)
    assert_clean(at)
    assert TITLE in [s.value for s in at.subheader]
    drawn = _rank_datasets(at)
    assert len(drawn) == 1
    expected = acceptance_by_sibling_rank(store, tree)
    got = drawn[0].sort_values(["depth", "sibling_rank"]).reset_index(drop=True)
    assert got["depth"].tolist() == expected["depth"].tolist()
    assert got["sibling_rank"].tolist() == expected["sibling_rank"].tolist()
    assert got["share"].tolist() == pytest.approx(expected["share"].tolist())
    assert (got["sibling_rank"] > 0).any()  # the chart shows the branches that won, not only the chain
    share = q.runs(store, eid).set_index("run_id").loc[tree, "accepted_off_chain_share"]
    text = " ".join(m.value for m in at.markdown)
    assert show("accepted_off_chain_share", share) in text and f"tree_topk {TOPK}" in text


def test_a_chain_run_of_the_sweep_shows_no_tree_chart(tree_db):
    _, eid, by_topk = tree_db
    at = app("experiment", experiment=eid, section="Why drafts are rejected", run=by_topk[1])
    assert_clean(at)
    assert TITLE not in [s.value for s in at.subheader]
    assert not _rank_datasets(at)


def test_the_speedup_chart_draws_no_chain_formula_for_a_tree(tree_db):
    store, eid, by_topk = tree_db
    at = app("experiment", experiment=eid)
    assert_clean(at)
    captions = " ".join(c.value for c in at.caption)
    assert not missing(captions, "does not model token trees", f"tree_topk {TOPK}"), captions
    runs = q.runs(store, eid).set_index("run_id")
    drawn = [d for datasets in chart_data(at) for d in datasets if {"series", "value", "x"} <= set(d.columns)]
    formula = [d[d["series"] == charts.FORMULA] for d in drawn]
    xs = {float(x) for f in formula for x in f["x"]}
    assert float(runs.loc[by_topk[1], "sweep_value"]) in xs  # the chain's own formula point is drawn ...
    assert float(runs.loc[by_topk[TOPK], "sweep_value"]) not in xs  # ... the tree's is not


def test_compare_plots_a_tree_sweep_against_its_own_variable(tree_db):
    store, eid, by_topk = tree_db
    at = app("compare", experiments=eid)
    assert_clean(at)
    specs = " ".join(chart.proto.spec for chart in at.get("vega_lite_chart"))
    assert "tree branches per node" in specs  # the x axis names the tree's branches, not the sampling top-k
    runs = q.runs(store, eid)
    drawn = [d for datasets in chart_data(at) for d in datasets if "sweep_value" in d.columns and "speedup" in d]
    assert drawn, "no sweep chart"
    xs = sorted({float(x) for d in drawn for x in d["sweep_value"].dropna()})
    assert xs == sorted(float(v) for v in runs[runs["kind"] == "speculative"]["sweep_value"])


def test_the_round_explorer_shows_each_depths_sibling_rank_for_a_tree_only(tree_db):
    store, eid, by_topk = tree_db
    for topk, run in by_topk.items():
        at = app("rounds", experiment=eid, run=run, prompt=0)
        assert_clean(at)
        shown = next(d.value for d in at.dataframe if "p_draft" in d.value)
        if topk == 1:
            assert "sibling_rank" not in shown  # a chain has no ranks to show
            continue
        first = int(q.prompt_output(store, run, 0)["round_index"].dropna().min())
        expected = q.round_proposals(store, run, 0, first)
        assert shown["sibling_rank"].tolist() == expected["sibling_rank"].tolist()
        assert shown["position"].tolist() == expected["position"].tolist()  # one row per depth
