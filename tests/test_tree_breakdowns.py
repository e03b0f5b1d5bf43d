"""A token-tree run's breakdowns on SQLite and PostgreSQL, rows written through storage's recording path: acceptance
by depth (the by-position query, a tree round storing one row per depth), acceptance by sibling rank per depth,
accepted_off_chain_share in the runs query, the run JSON and the export, and the per-token export's depth and
sibling rank; each figure against a count over the records themselves."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from benchmarks.bench_queries import synthetic_baseline, synthetic_prompt
from engine.decoding.records import ACCEPTED, DISCARDED, PromptResult
from storage.jobs import run_state
from storage.jobs.experiments import enqueue_experiment
from storage.records import queries as q
from storage.records.tree_breakdowns import acceptance_by_sibling_rank
from storage.serving.export import export_json, run_document
from tests.test_storage import record

K, TOPK, PROMPTS = 3, 3, 3


def _as_tree(rng: random.Random, result: PromptResult) -> PromptResult:
    """A chain's rounds as a tree's: each accepted node a sibling rank (0 to TOPK - 1, mostly 0), the rejected top
    child and the discarded chain rank 0, as the engine stores a tree round's path."""
    for rd in result.rounds:
        rd.tree_nodes = 1 + TOPK + (K - 1) * TOPK * TOPK
        for token in rd.draft_tokens:
            token.sibling_rank = rng.choice((0, 0, 1, 2)) if token.outcome == ACCEPTED else 0
            token.siblings = TOPK
    return result


@pytest.fixture
def tree_experiment(store):
    return fill_tree_experiment(store)


def fill_tree_experiment(store, speedups: tuple[float, float] | None = None):
    """A tree_topk sweep (1: a chain, TOPK: a tree) at k = K, every run done with synthetic records: (experiment id,
    {tree_topk: run id}, {run id: its PromptResults}). speedups: (the chain's, the tree's) on every prompt, times a
    little noise, instead of random wall times."""
    rng = random.Random(7)
    eid = enqueue_experiment(
        store,
        name="tree",
        target="tgt",
        draft="drf",
        prompts="inline",
        sampling={"temperature": 0.0, "max_new_tokens": 64},
        k=K,
        sweep_variable="tree_topk",
        sweep_values=[1, TOPK],
        prompt_texts=[f"p{i}" for i in range(PROMPTS)],
    )
    frame = q.runs(store, eid)
    baseline_id = int(frame[frame["kind"] == "baseline"]["run_id"].iloc[0])
    by_topk = {int(r.tree_topk): int(r.run_id) for r in frame[frame["kind"] == "speculative"].itertuples()}
    assert sorted(by_topk) == [1, TOPK]
    baseline = [synthetic_baseline(rng, i, 12) for i in range(PROMPTS)]
    results = {
        baseline_id: baseline,
        by_topk[1]: [synthetic_prompt(rng, i, K, rounds=6, follow=b.output_ids) for i, b in enumerate(baseline)],
        by_topk[TOPK]: [
            _as_tree(rng, synthetic_prompt(rng, i, K, rounds=6, follow=b.output_ids)) for i, b in enumerate(baseline)
        ],
    }
    if speedups is not None:
        for topk, speedup in zip((1, TOPK), speedups):
            for row, base in zip(results[by_topk[topk]], baseline):
                row.wall_seconds = base.wall_seconds / (speedup * rng.uniform(0.98, 1.02))
    run_state.claim_group(store, eid, "test-worker")
    for rid in (baseline_id, by_topk[1], by_topk[TOPK]):
        run_state.start_run(store, rid, PROMPTS, "cpu")
        for result in results[rid]:
            record(store, rid, "baseline" if rid == baseline_id else "speculative", result)
        run_state.finish_run(store, rid, "done")
    return eid, by_topk, results


def _tokens(results, rid):
    return [t for p in results[rid] for rd in p.rounds for t in rd.draft_tokens]


def test_acceptance_by_sibling_rank_counts_each_depths_accepted_nodes_by_rank(store, tree_experiment):
    _, by_topk, results = tree_experiment
    tree = by_topk[TOPK]
    tokens = _tokens(results, tree)
    reached = Counter(t.position for t in tokens if t.outcome != DISCARDED)
    accepted = Counter((t.position, t.sibling_rank) for t in tokens if t.outcome == ACCEPTED)
    assert any(rank > 0 for _, rank in accepted)  # the data really leaves the chain
    frame = acceptance_by_sibling_rank(store, tree)
    got = {(int(r.depth), int(r.sibling_rank)): (int(r.accepted), int(r.reached), r.share) for r in frame.itertuples()}
    assert set(got) == set(accepted)
    for (depth, rank), n in accepted.items():
        assert got[(depth, rank)][:2] == (n, reached[depth])
        assert got[(depth, rank)][2] == pytest.approx(n / reached[depth])
    # the shares of one depth add up to its acceptance by depth (the by-position query, one row per depth)
    by_depth = q.acceptance_by_position(store, tree).set_index("position")
    for depth in by_depth.index:
        total = frame[frame["depth"] == depth]["share"].sum()
        assert total == pytest.approx(by_depth.loc[depth, "conditional"]), depth
    assert acceptance_by_sibling_rank(store, by_topk[1]).empty  # a chain has no ranks


def test_off_chain_share_is_the_rounds_whose_accepted_path_left_the_top_1_chain(store, tree_experiment):
    eid, by_topk, results = tree_experiment
    rounds = [rd for p in results[by_topk[TOPK]] for rd in p.rounds if rd.k > 0]
    off = sum(any(t.outcome == ACCEPTED and t.sibling_rank > 0 for t in rd.draft_tokens) for rd in rounds)
    expected = off / len(rounds)
    assert 0 < expected < 1
    runs = q.runs(store, eid).set_index("run_id")
    assert runs.loc[by_topk[TOPK], "accepted_off_chain_share"] == pytest.approx(expected)
    assert runs.loc[by_topk[1], "accepted_off_chain_share"] != runs.loc[by_topk[1], "accepted_off_chain_share"]  # NaN
    doc = {r["run_id"]: r for r in run_document(store, eid, with_outputs=False)["runs"]}
    assert doc[by_topk[TOPK]]["accepted_off_chain_share"] == pytest.approx(expected)
    assert doc[by_topk[1]]["accepted_off_chain_share"] is None
    assert (doc[by_topk[TOPK]]["tree_topk"], doc[by_topk[1]]["tree_topk"]) == (TOPK, 1)
    assert doc[by_topk[TOPK]]["tree_tokens"] == 0
    ranks = doc[by_topk[TOPK]]["acceptance_by_sibling_rank"]
    assert {(e["depth"], e["sibling_rank"]) for e in ranks} == {
        (t.position, t.sibling_rank) for t in _tokens(results, by_topk[TOPK]) if t.outcome == ACCEPTED
    }
    assert "acceptance_by_sibling_rank" not in doc[by_topk[1]]
    exported = {r["run_id"]: r for r in export_json(store, eid)["runs"]}
    assert exported[by_topk[TOPK]]["accepted_off_chain_share"] == pytest.approx(expected)


def test_the_per_token_export_carries_depth_and_sibling_rank(store, tree_experiment):
    eid, by_topk, results = tree_experiment
    rows = export_json(store, eid)["draft_tokens"]
    tree = [r for r in rows if r["run_id"] == by_topk[TOPK]]
    assert all(r["depth"] == r["position"] for r in rows)
    assert [r["sibling_rank"] for r in tree] == [t.sibling_rank for t in _tokens(results, by_topk[TOPK])]
    assert all(r["sibling_rank"] is None for r in rows if r["run_id"] == by_topk[1])
