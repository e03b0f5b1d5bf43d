"""`draftlab confirm` of EAGLE-3 heads against a REAL vLLM server (the CPU build, as tests/test_confirm_vllm.py):
the lab measures two copies of one head for demo-target (tests/eagle3_heads.demo_head: demo-eagle3, else a stand-in
trained here) on 8 code:validation prompts, 32 new tokens, k 3, greedy: the fewest that make a collapse certain
(the lab's interval is over prompts; with 4 it reached 0). Then the second copy is re-saved on disk with a mistake:
its lm_head rows in another order than the target's ids and no d2t to map them (eagle3_heads.misserved "d2t"). That
is the hook: the deploy export names the head's DIRECTORY, so a server serves what is there when it starts, not
what the lab measured. One confirm (--configs all, concurrency 1, one pass) starts vLLM with exactly each run's
`{"method": "eagle3", "model": DIR, "num_speculative_tokens": 3}`.

The intact head: its server acceptance is stored beside the lab's and agrees with it (both engines read the head
alike: aux ids, norms, vocabulary), greedy outputs equal. The re-saved one: its acceptance collapses, and the
finding names its directory and what to check.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

from app.cli import main
from engine.text.prompt_sets import load_prompts
from storage import open_store
from storage.analysis.findings import findings
from tests.eagle3_heads import misserved

PROMPTS = 8


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory, vllm_command, demo_eagle3_head):
    """(the lab's JSON, the confirm's JSON, the database URL, the intact head, the re-saved head)."""
    tmp = tmp_path_factory.mktemp("eagle3-confirm")
    head = demo_eagle3_head
    intact, resaved, normed = tmp / "intact", tmp / "resaved", tmp / "normed"
    for copy in (intact, resaved, normed):
        shutil.copytree(head, copy)
    db = f"sqlite:///{tmp / 'confirm.db'}"
    prompts = tmp / "four.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in load_prompts("code:validation")[:PROMPTS]))
    status, out, err = _cli(
        "run",
        "--target",
        "demo-target",
        "--draft",
        f"{intact},{resaved},{normed}",
        "--drafter",
        "eagle3",
        "--prompts",
        str(prompts),
        "--k",
        "3",
        "--max-new-tokens",
        "32",
        "--repeats",
        "1",
        "--device",
        "cpu",
        "--db",
        db,
        "--json",
    )
    assert status == 0, err[-2000:]
    lab = json.loads(out)
    shutil.rmtree(resaved)
    misserved(str(intact), resaved, "d2t")  # the same head, re-saved wrongly after the lab measured it
    trained_with_norm = json.loads((intact / "config.json").read_text()).get("norm_before_fc", False)
    shutil.rmtree(normed)  # and one whose norm before fc a server reads differently from its training
    misserved(str(intact), normed, "no-norm" if trained_with_norm else "norm-on")
    status, out, err = _cli(
        "confirm",
        str(lab["experiment_id"]),
        "--configs",
        "all",
        "--concurrency",
        "1",
        "--repeats",
        "1",
        "--vllm",
        vllm_command,
        "--db",
        db,
        "--json",
    )
    assert status == 0, err[-2000:]
    return lab, json.loads(out), db, str(intact), str(resaved), str(normed)


def _config(doc: dict, lab: dict, head: str) -> tuple[dict, dict]:
    run = next(r for r in lab["runs"] if r["draft"] == head)
    config = next(c for c in doc["configs"] if c["lab_run_id"] == run["run_id"])
    return run, config


def test_an_eagle3_head_confirms_in_vllm_beside_the_lab(confirmed):
    lab, doc, db, intact, _, _ = confirmed
    run, config = _config(doc, lab, intact)
    assert config["speculative_config"] == {"method": "eagle3", "model": intact, "num_speculative_tokens": 3}
    (m,) = config["per_concurrency"]
    assert m["outputs_match_server_baseline"] == 1.0 and m["outputs_match_lab"] == 1.0
    assert m["lab_draft_acceptance_rate"] == run["draft_acceptance_rate"]
    assert m["lab_per_position_acceptance"][0] > 0.3  # a head that drafts, not a random one
    # both engines read the head alike (aux ids, norms, vocabulary): the same acceptance within a few rounds' worth
    assert abs(m["server_draft_acceptance_rate"] - m["lab_draft_acceptance_rate"]) < 0.05, m
    assert abs(m["server_per_position_acceptance"][0] - m["lab_per_position_acceptance"][0]) < 0.1, m
    assert len(m["server_per_position_acceptance"]) == 3
    status, out, _ = _cli("export", str(lab["experiment_id"]), "--format", "json", "--db", db)
    (stored,) = json.loads(out)["server_confirms"]
    assert stored["status"] == "done" and stored["configs"] == doc["configs"]


def test_the_same_head_resaved_wrongly_collapses_and_the_finding_names_it(confirmed):
    lab, doc, db, intact, resaved, _ = confirmed
    run, config = _config(doc, lab, resaved)
    (m,) = config["per_concurrency"]
    assert m["outputs_match_server_baseline"] == 1.0  # still lossless: only the drafts are wrong
    assert m["server_draft_acceptance_rate"] < 0.5 * run["draft_acceptance_rate"]
    store = open_store(db)
    try:
        found = [f for f in findings(store, lab["experiment_id"]) if "collapses" in f["title"]]
    finally:
        store.dispose()
    (collapse,) = [f for f in found if f["data"]["head"] == resaved]  # the intact head does not collapse
    assert resaved in collapse["detail"] and len(found) <= 2
    assert collapse["data"]["run_id"] == run["run_id"]
    assert "eagle_aux_hidden_state_layer_ids" in collapse["next"] and "d2t" in collapse["next"]


def test_a_norm_the_server_reads_differently_collapses_and_the_finding_says_to_check_it(confirmed):
    """The case users hit: norm_before_fc in config.json disagreeing with how the head was trained (vLLM applies
    it when set, SGLang never): the server's acceptance collapses against the lab's and the finding names the head
    and the norm."""
    lab, doc, db, intact, _, normed = confirmed
    run, config = _config(doc, lab, normed)
    (m,) = config["per_concurrency"]
    assert m["outputs_match_server_baseline"] == 1.0
    assert m["server_draft_acceptance_rate"] < 0.5 * run["draft_acceptance_rate"], m
    store = open_store(db)
    try:
        (collapse,) = [
            f
            for f in findings(store, lab["experiment_id"])
            if "collapses" in f["title"] and f["data"]["head"] == normed
        ]
    finally:
        store.dispose()
    assert "norm_before_fc" in collapse["next"] and normed in collapse["detail"]
