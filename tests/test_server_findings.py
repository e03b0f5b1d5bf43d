"""The findings' `server` rule (storage/analysis/findings/server_answer.py) on SQLite and PostgreSQL: where a server
cost profile fits, the server's answer (storage/serving/run_predictions.server_verdict: what deploy serves) stands
beside the lab's verdict, a warning where they choose different ks; where a profile fits but predicts no gain, one info
line saying the lab's verdict stands; without a profile, nothing."""

from __future__ import annotations

from storage.analysis.findings import findings
from storage.serving.deploy import deploy_document
from storage.serving.run_predictions import server_verdict
from tests import profile_data
from tests.profile_data import filled_sweep, store_profile


def _server(found):
    return [f for f in found if f["kind"] == "server"]


def test_the_servers_answer_stands_beside_the_labs_verdict(store):
    eid, ids = filled_sweep(store, (1, 2, 3), prompts=4)
    assert _server(findings(store, eid, server_verdict(store, eid))) == []  # no profile: nothing
    store_profile(store, eid, ids[("speculative", 3)], concurrency=(1, 4))
    server = server_verdict(store, eid)
    assert server["fitted"] and server["chosen"] is not None
    (finding,) = _server(findings(store, eid, server))
    served = deploy_document(store, eid)
    assert served["answer"]["from"] == "server" and served["run_id"] == finding["data"]["chosen_run_id"]
    first = next((int(c), k) for c, k in sorted(server["chosen"]["schedule"].items(), key=lambda x: int(x[0])) if k)
    assert finding["title"].startswith(f"In vLLM, serve k={first[1]} at concurrency {first[0]} (predicted)")
    assert server["said"] in finding["detail"] and server["chosen"]["profile"]["label"][1:] in finding["detail"]
    lab = findings(store, eid)  # the same rules without the server's answer: the lab's verdict as before
    assert _server(lab) == [] and len(lab) == len(findings(store, eid, server)) - 1
    assert (finding["severity"] == "info") == finding["data"]["agree"]
    assert finding["data"]["agree"] == (not finding["title"].endswith("not the lab's choice"))
    assert f"draftlab confirm {eid}" in finding["next"]


def test_a_profile_that_predicts_no_gain_says_the_labs_verdict_stands(store, monkeypatch):
    monkeypatch.setattr(profile_data, "RATIO", 5.0)  # each draft costs five target steps in this server
    eid, ids = filled_sweep(store, (1, 2), prompts=4)
    store_profile(store, eid, ids[("speculative", 2)], concurrency=(1,))
    server = server_verdict(store, eid)
    assert server["fitted"] and server["chosen"] is None
    (finding,) = _server(findings(store, eid, server))
    assert finding["severity"] == "info" and finding["data"]["chosen"] is None
    assert "no k's predicted server speedup lies surely above 1" in finding["detail"]
    assert finding["detail"].endswith(".") and "The lab's verdict stands" in finding["detail"]
