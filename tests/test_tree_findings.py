"""The `tree` finding (storage/analysis/findings/tree.py) on SQLite and
PostgreSQL: a tree run against the chain at the same k says which gained by the verdict's 95 % intervals, with both
runs' figures as stored; tree runs get no chain-formula prediction and stay out of the formula's pooled α."""

from __future__ import annotations

import pytest

from storage.analysis import formula
from storage.analysis.findings import findings
from storage.records import queries as q
from tests.meaning import missing
from tests.test_tree_breakdowns import TOPK, K, fill_tree_experiment


@pytest.mark.parametrize(("speedups", "gained"), [((1.1, 1.8), "tree"), ((1.8, 1.1), "chain"), ((1.4, 1.4), "neither")])
def test_the_tree_finding_names_the_side_that_gained(store, speedups, gained):
    eid, by_topk, _ = fill_tree_experiment(store, speedups)
    runs = q.runs(store, eid).set_index("run_id")
    tree = [f for f in findings(store, eid) if f["kind"] == "tree"]
    assert len(tree) == 1
    data = tree[0]["data"]
    assert data["gained"] == gained
    assert (data["k"], data["tree_topk"], data["tree_run_id"], data["chain_run_id"]) == (
        K,
        TOPK,
        by_topk[TOPK],
        by_topk[1],
    )
    for side, rid in (("tree", by_topk[TOPK]), ("chain", by_topk[1])):
        row = runs.loc[rid]
        assert data[f"{side}_speedup"] == pytest.approx(row.speedup)
        assert data[f"{side}_speedup_ci"] == pytest.approx([row.speedup_ci_lo, row.speedup_ci_hi])
        assert data[f"{side}_tokens_per_round"] == pytest.approx(row.tokens_per_round)
        assert f"{row.speedup:.2f}×" in tree[0]["detail"]
    tree_lo, chain_hi = runs.loc[by_topk[TOPK]].speedup_ci_lo, runs.loc[by_topk[1]].speedup_ci_hi
    assert (tree_lo > chain_hi) == (gained == "tree")  # the rule reads the intervals, not the point figures
    if gained == "tree":
        prefill = tree[0]["prefill"]
        assert prefill["sweep"] == "tree_tokens" and int(prefill["tree_topk"]) == TOPK
        assert not missing(tree[0]["next"], "--tree-tokens", "SGLang"), tree[0]["next"]
    else:
        assert tree[0]["prefill"] is None and "--tree-topk 1" in tree[0]["next"]


def test_tree_runs_get_no_chain_formula_and_stay_out_of_its_pooled_alpha(store):
    eid, by_topk, results = fill_tree_experiment(store, (1.2, 1.3))
    runs = q.runs(store, eid).set_index("run_id")
    assert runs.loc[by_topk[TOPK], "predicted_speedup"] != runs.loc[by_topk[TOPK], "predicted_speedup"]  # NaN
    assert runs.loc[by_topk[1], "predicted_speedup"] > 0
    pooled = formula.pooled_inputs(store, eid)
    chain = results[by_topk[1]]
    accepted = sum(rd.accepted for p in chain for rd in p.rounds)
    verified = sum(rd.accepted + rd.rejected for p in chain for rd in p.rounds)
    assert pooled is not None and pooled.runs == 1 and pooled.alpha == pytest.approx(accepted / verified)
