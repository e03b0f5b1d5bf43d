"""A token-tree run carried to production (storage/serving/tree_settings.py through engine_settings): SGLang's three
flags (depth, topk, nodes verified with the root; the whole tree when tree_tokens is 0), and the engines that draft
chains only (vLLM 0.32, llama.cpp, transformers) saying so in one note each while serving the depth-k chain; a chain
run's settings carry no tree note."""

from __future__ import annotations

import json

import pytest

from engine.config.tree_shape import full_tree_nodes
from tests.meaning import missing
from tests.test_deploy import flags, inexpressible, settings

CHAIN_ONLY = ("vllm", "llama_cpp", "transformers")


@pytest.mark.parametrize(("tree_tokens", "nodes"), [(6, 6), (0, full_tree_nodes(3, 2))])
@pytest.mark.parametrize("drafter", ["model", "eagle3"])
def test_sglang_takes_the_tree_as_measured(drafter, tree_tokens, nodes):
    doc = settings(drafter, k=3, tree_topk=2, tree_tokens=tree_tokens)
    sglang = flags(doc["sglang"], 3)
    assert (
        sglang["--speculative-num-steps"],
        sglang["--speculative-eagle-topk"],
        sglang["--speculative-num-draft-tokens"],
    ) == ("3", "2", str(nodes))
    notes = " ".join(doc["sglang"]["notes"])
    assert not missing(notes, "Token tree", f"--speculative-num-draft-tokens {nodes}", "per round"), notes
    assert inexpressible(doc["sglang"]) == ""


def test_engines_that_draft_chains_say_so_and_serve_the_chain():
    doc = settings("model", k=3, tree_topk=4, tree_tokens=9)
    spec = json.loads(doc["vllm"]["speculative_config"])
    assert spec["num_speculative_tokens"] == 3 and not any("tree" in key for key in spec)
    assert not missing(inexpressible(doc["vllm"]), "speculative_token_tree", "static", "per round"), doc["vllm"]
    for engine in CHAIN_ONLY:
        note = inexpressible(doc[engine])
        assert not missing(note, "tree", "tree_topk 1", "k=3"), (engine, note)
    assert flags(doc["llama_cpp"], 1)["--draft-max"] == "3"
    assert doc["transformers"]["assistant_generation_config"]["num_assistant_tokens"] == 3


def test_a_chain_run_carries_no_tree_note():
    doc = settings("model", k=3, tree_topk=1, tree_tokens=16)
    sglang = flags(doc["sglang"], 3)
    assert (sglang["--speculative-eagle-topk"], sglang["--speculative-num-draft-tokens"]) == ("1", "4")
    for engine in ("sglang", *CHAIN_ONLY):
        assert "Token tree" not in " ".join(doc[engine]["notes"]) and "tree_topk" not in inexpressible(doc[engine])


def test_confirm_in_vllm_leaves_tree_runs_out_and_refuses_a_chosen_tree(store):
    from storage.db.errors import QueueError
    from storage.serving.confirm_jobs import confirm_documents
    from storage.serving.deploy import deploy_document
    from tests.test_tree_breakdowns import TOPK, fill_tree_experiment

    eid, by_topk, _ = fill_tree_experiment(store, (1.1, 1.8))  # the tree is the verdict's choice
    chosen = deploy_document(store, eid)
    assert int(chosen["run_id"]) == by_topk[TOPK]
    assert flags(chosen["engines"]["sglang"], 3)["--speculative-eagle-topk"] == str(TOPK)
    with pytest.raises(QueueError) as err:
        confirm_documents(store, eid, "chosen")
    assert not missing(str(err.value), f"run {by_topk[TOPK]}", f"tree_topk {TOPK}", "--tree-topk 1"), err.value
    every = confirm_documents(store, eid, "all")
    assert [int(doc["run_id"]) for _, doc in every] == [by_topk[1]]  # the chain alone: vLLM serves it as measured


def test_a_tree_run_gets_no_vllm_server_prediction_and_says_why(store):
    from storage.serving.export import run_document
    from storage.serving.profiles import run_fit
    from tests.test_tree_breakdowns import TOPK, fill_tree_experiment

    eid, by_topk, _ = fill_tree_experiment(store, (1.1, 1.3))
    why = run_fit(store, eid, by_topk[TOPK])
    assert isinstance(why, str) and not missing(why, "token tree", "predict the chain", "--tree-topk 1"), why
    assert not isinstance(run_fit(store, eid, by_topk[1]), str)  # the chain fits as before
    doc = {r["run_id"]: r for r in run_document(store, eid, with_outputs=False)["runs"]}
    assert doc[by_topk[TOPK]]["server_predicted"] == {"profile": None, "reason": why}
