"""Findings (storage/analysis/findings/) on crafted databases, SQLite and PostgreSQL: each rule names the right
position, token type, tie, formula gap, slow draft, sampling mismatch and timing drift, and stays silent when the data
does not support it; the panel (pages/panels/findings_panel.py) escapes user text and links to the chart and the New
form."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import text

from engine.decoding.records import ACCEPTED, BONUS, CORRECTION, DISCARDED, REJECTED, DraftToken, PromptResult, Round
from engine.metrics import theory
from storage.analysis import findings as fd
from storage.analysis.verdict import verdict_dict
from storage.jobs import run_state
from storage.records import queries as q
from tests.meaning import missing
from tests.test_storage import enqueue, fill_experiment, record, run_ids

BASE_STEP = 0.010  # the baseline's seconds per token: c = BASE_STEP / draft step
# Runs whose outputs differ in length from the baseline's: sampled (compared in distribution, not token for token);
# greedy ones would not be lossless, and never judged.
SAMPLED = {"temperature": 0.7, "max_new_tokens": 64}


def _round(prompt_index, index, k, accepted, types, draft_s, verify_s, first=0):
    """A round of k drafts: `accepted` accepted, then one rejected (unless all k were), the rest discarded; draft i
    has token type types[i]. It emits tokens first, first + 1, ..."""
    drafts = [
        DraftToken(
            i + 1,
            10 + i,
            f"t{i}",
            types[i],
            0.5,
            0.5,
            0.5,
            0.1,
            ACCEPTED if i < accepted else REJECTED if i == accepted else DISCARDED,
        )
        for i in range(k)
    ]
    kinds = [ACCEPTED] * accepted + [BONUS if accepted == k else CORRECTION]
    emitted = list(range(first, first + accepted + 1))
    return Round(prompt_index, index, k, accepted, emitted, kinds, draft_s, verify_s, k, drafts)


def _prompt(prompt_index, k, rounds, draft_s, verify_s):
    """rounds: [(accepted, types)]; the prompt's wall time is exactly its rounds' draft + verify time. Its output is
    tokens 0, 1, 2, ...: the baseline's (_baseline) when as long (lossless)."""
    starts = [sum(a + 1 for a, _ in rounds[:i]) for i in range(len(rounds))]
    built = [
        _round(prompt_index, i, k, a, types, draft_s, verify_s, start)
        for i, ((a, types), start) in enumerate(zip(rounds, starts))
    ]
    output = [t for r in built for t in r.emitted_ids]
    return PromptResult(prompt_index, f"p{prompt_index}", output, "x", len(built) * (draft_s + verify_s), rounds=built)


def _baseline(prompt_index, tokens):
    return PromptResult(
        prompt_index,
        f"p{prompt_index}",
        list(range(tokens)),
        "x",
        tokens * BASE_STEP,
        decode_steps=tokens,
        decode_seconds=tokens * BASE_STEP,
    )


def _run_experiment(store, spec: dict, prompts: int, **kw) -> tuple[int, dict]:
    """spec: {k: [rounds of prompt 0, rounds of prompt 1, ...], draft_s, verify_s}; records a baseline with the same
    token counts and every run, all done. Returns (experiment id, {k: run id})."""
    eid = enqueue(store, ks=tuple(spec), prompts=prompts, **kw)
    ids = run_ids(store, eid)
    results = {
        k: [_prompt(i, k, rounds, draft_s, verify_s) for i, rounds in enumerate(per_prompt)]
        for k, (per_prompt, draft_s, verify_s) in spec.items()
    }
    first = next(iter(results.values()))
    rows = {ids[("baseline", None)]: ("baseline", [_baseline(i, r.new_tokens) for i, r in enumerate(first)])}
    rows.update({ids[("speculative", k)]: ("speculative", results[k]) for k in spec})
    assert sorted(run_state.claim_group(store, eid, "w")) == sorted(rows)
    for rid, (kind, prompt_results) in rows.items():
        run_state.start_run(store, rid, prompts, "cpu")
        for result in prompt_results:
            record(store, rid, kind, result)
        run_state.finish_run(store, rid, "done")
    return eid, {k: ids[("speculative", k)] for k in spec}


def _by_kind(found: list[dict]) -> dict:
    kinds = [f["kind"] for f in found]
    assert len(kinds) == len(set(kinds)), kinds  # one finding per kind
    return {f["kind"]: f for f in found}


# --- positions and token types -----------------------------------------------------------------------------------


def _positions_rounds():
    """100 rounds of k = 4 in which positions 1-2 accept ~98 % and positions 3-4 ~10 % (pos 3: 10 of 96, pos 4: 1 of
    10); whitespace is 59 of the 99 rejected drafts (60 %) and 61 of the 304 verified ones (20 %)."""
    accepts = [0] * 2 + [1] * 2 + [2] * 86 + [3] * 9 + [4]
    rounds, whitespace_accepts = [], 2
    for n, a in enumerate(accepts):
        types = ["code"] * 4
        if a == 2 and n < 4 + 59:  # the first 59 rounds that reject at position 3 reject a whitespace token
            types[2] = "whitespace"
        elif a == 2 and whitespace_accepts:  # two accepted whitespace drafts, at position 1
            types[0], whitespace_accepts = "whitespace", whitespace_accepts - 1
        rounds.append((a, types))
    return [rounds[i::4] for i in range(4)]  # spread over 4 prompts


def test_positions_and_token_type_name_the_weak_position_and_type(store):
    eid, ids = _run_experiment(store, {4: (_positions_rounds(), 0.004, 0.012)}, prompts=4)
    by_position = q.acceptance_by_position(store, ids[4]).set_index("position")
    assert by_position.loc[3, "conditional"] == pytest.approx(10 / 96)  # the crafted shape, as stored
    found = _by_kind(fd.findings(store, eid))
    assert "thin_data" not in found

    positions = found["positions"]
    assert positions["data"]["position"] == 3 and positions["data"]["run_id"] == ids[4]
    assert positions["data"]["acceptance"] == pytest.approx(11 / 106)  # positions 3-4 pooled
    assert positions["title"] == "Draft positions 3+ accept only 10 %"
    assert not missing(positions["detail"], "positions 3–4", "11 of", "106"), positions["detail"]
    assert "k above 2 mostly wastes draft steps" in positions["next"]
    assert positions["chart"] == "by-position"
    assert positions["prefill"]["sweep"] == "k" and positions["prefill"]["values"] == "1,2"
    assert [a["prefill"]["drafter"] for a in positions["alternatives"]] == ["heuristic", "confidence:0.5"]

    blamed = found["token_type"]
    assert blamed["data"]["token_type"] == "whitespace"
    assert (blamed["data"]["rejected"], blamed["data"]["run_rejected"]) == (59, 99)
    assert (blamed["data"]["verified"], blamed["data"]["run_verified"]) == (61, 304)
    assert blamed["data"]["ratio"] == pytest.approx((59 / 99) / (61 / 304))
    assert not missing(blamed["detail"], "60 %", "(59 of 99)", "20 %", "(61 of 304)"), blamed["detail"]
    assert not missing(blamed["next"], "Distil", "whitespace"), blamed["next"]  # the fix, focused on the type
    assert blamed["prefill"]["page"] == "train" and blamed["prefill"]["focus_from"] == eid
    url = fd.prefill_url(blamed["prefill"])
    assert url.startswith("train?") and parse_qs(urlsplit(url).query)["focus"] == ["whitespace"]


def test_a_temperature_sweep_suggests_k_at_the_best_runs_own_temperature(store):
    eid = enqueue(store, ks=(0.0, 0.7), prompts=4, sweep_variable="temperature", k=4)
    runs = q.runs(store, eid)
    by_temperature = {(r.kind, r.temperature): int(r.run_id) for r in runs.itertuples()}
    weak = [[(1, ["code"] * 4)] * 25] * 4  # temperature 0: k = 4 accepting one draft a round, slower
    rows = {0.0: (weak, 0.004, 0.020), 0.7: (_positions_rounds(), 0.004, 0.012)}
    assert sorted(run_state.claim_group(store, eid, "w")) == sorted(by_temperature.values())
    for temperature, (per_prompt, draft_s, verify_s) in rows.items():
        spec = [_prompt(i, 4, rounds, draft_s, verify_s) for i, rounds in enumerate(per_prompt)]
        for kind, results in (
            ("baseline", [_baseline(i, r.new_tokens) for i, r in enumerate(spec)]),
            ("speculative", spec),
        ):
            rid = by_temperature[(kind, temperature)]
            run_state.start_run(store, rid, 4, "cpu")
            for result in results:
                record(store, rid, kind, result)
            run_state.finish_run(store, rid, "done")
    assert verdict_dict(store, eid)["best"] == 0.7
    found = _by_kind(fd.findings(store, eid))
    assert "sampling_mismatch" not in found  # each arm has its own baseline at its own temperature
    positions = found["positions"]
    assert positions["data"]["run_id"] == by_temperature[("speculative", 0.7)]
    assert "(temperature = 0.7, the best run)" in positions["detail"]
    assert (positions["prefill"]["sweep"], positions["prefill"]["values"]) == ("k", "1,2")
    assert positions["prefill"]["temperature"] == 0.7 and "k" not in positions["prefill"]


def test_no_position_or_type_finding_when_every_position_and_type_does_well(store):
    # Same numbers of rounds and rejections, but the rejections spread over positions and types alike.
    rounds = [(a, ["code", "whitespace", "code", "number"]) for a in ([0, 1, 2, 3] * 6 + [4] * 76)]
    eid, _ = _run_experiment(store, {4: ([rounds[i::4] for i in range(4)], 0.004, 0.012)}, prompts=4)
    found = _by_kind(fd.findings(store, eid))
    assert "positions" not in found and "token_type" not in found and "thin_data" not in found


def test_thin_data_gives_no_position_or_type_finding_and_says_so(store):
    # The crafted shape of the test above, cut to 6 rounds: 19 verified drafts, under the 30 needed.
    rounds = [(2, ["code", "code", "whitespace", "code"])] * 5 + [(3, ["code"] * 4)]
    eid, ids = _run_experiment(store, {4: ([rounds[:3], rounds[3:]], 0.004, 0.012)}, prompts=2)
    found = _by_kind(fd.findings(store, eid))
    assert "positions" not in found and "token_type" not in found
    thin = found["thin_data"]
    assert thin["data"] == {"run_id": ids[4], "verified": 19, "minimum": fd.MIN_VERIFIED}
    assert not missing(thin["detail"], "19 verified", f"{fd.MIN_VERIFIED} needed"), thin["detail"]


# --- ties -------------------------------------------------------------------------------------------------------


def _speedups(store, ids: dict, speedups: dict) -> None:
    with store.write() as conn:
        for k, (s, lo, hi) in speedups.items():
            conn.execute(
                text("UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi WHERE id = :rid"),
                {"s": s, "lo": lo, "hi": hi, "rid": ids[("speculative", k)]},
            )


@pytest.fixture
def three_ks(store):
    eid = enqueue(store, ks=(1, 2, 4), prompts=3, repeats=3)
    ids = run_ids(store, eid)
    for rid in ids.values():
        run_state.finish_run(store, rid, "done")
    return store, eid, ids


def test_tie_finding_when_intervals_overlap(three_ks):
    store, eid, ids = three_ks
    _speedups(store, ids, {1: (1.10, 1.05, 1.15), 2: (1.31, 1.22, 1.40), 4: (1.25, 1.18, 1.33)})
    tie = _by_kind(fd.findings(store, eid))["tie"]
    assert tie["data"]["best"] == 2 and tie["data"]["tied_with"] == [4] and tie["data"]["cheaper"] is None
    assert "k = 2 at 1.31× (1.22–1.40) and k = 4 at 1.25× (1.18–1.33) overlap" in tie["detail"]
    assert not missing(tie["next"], "prompts", "--repeats (6)"), tie["next"]
    assert (tie["prefill"]["values"], tie["prefill"]["repeats"]) == ("2,4", 6)


def test_tie_with_a_smaller_k_says_take_the_cheaper(three_ks):
    store, eid, ids = three_ks
    _speedups(store, ids, {1: (1.28, 1.20, 1.36), 2: (1.31, 1.22, 1.40), 4: (1.05, 1.00, 1.10)})
    tie = _by_kind(fd.findings(store, eid))["tie"]
    assert tie["data"]["tied_with"] == [1] and tie["data"]["cheaper"] == 1
    assert tie["next"].startswith("Take the cheaper k = 1")


def test_no_tie_finding_when_intervals_are_apart(three_ks):
    store, eid, ids = three_ks
    _speedups(store, ids, {1: (1.10, 1.05, 1.15), 2: (1.31, 1.22, 1.40), 4: (1.15, 1.10, 1.21)})
    assert "tie" not in _by_kind(fd.findings(store, eid))


# --- predictions against the measurement ------------------------------------------------------------------------


def test_the_formula_is_off_by_the_verify_cost_and_the_cost_aware_prediction_agrees(store):
    # c = 10 for both; a verify pass costs 1.2 target steps at k = 2 and 2.0 at k = 4. Every prompt alike, so the
    # intervals are points (no tie): k = 2 measures 2.5 × 0.010 / 0.014 = 1.79x, k = 4 4.125 × 0.010 / 0.024 = 1.72x.
    spec = {
        2: ([[(a, ["code"] * 2) for a in (2, 2, 1, 2, 0, 2, 1, 2)]] * 3, 0.002, 0.012),
        4: ([[(a, ["code"] * 4) for a in (4, 3, 4, 2, 4, 1, 3, 4)]] * 3, 0.004, 0.020),
    }
    eid, ids = _run_experiment(store, spec, prompts=3, sampling=SAMPLED)
    runs = q.runs(store, eid).set_index("k")
    assert runs.loc[2, "speedup"] == pytest.approx(2.5 * 0.010 / 0.014)
    assert runs.loc[4, "speedup"] == pytest.approx(4.125 * 0.010 / 0.024)
    found = _by_kind(fd.findings(store, eid))

    formula = found["formula"]
    alpha = (12 + 25) * 3 / ((12 + 3 + 25 + 4) * 3)
    k_f, s_f = theory.best_k(alpha, 10.0)
    assert k_f > 4  # the formula, blind to the verify cost, wants a long draft
    assert formula["data"]["formula_best"] == k_f and formula["data"]["measured_best"] == 2
    assert formula["data"]["alpha"] == pytest.approx(alpha) and formula["data"]["c"] == pytest.approx(10.0)
    error = theory.predicted_speedup(alpha, 2, 10.0) / runs.loc[2, "speedup"] - 1  # the same curve's value at k = 2
    assert formula["data"]["error"] == pytest.approx(error)
    assert f"best k is {k_f} at {s_f:.2f}×" in formula["detail"]
    assert not missing(formula["detail"], f"({100 * error:+.0f} %)", "1.60 target steps"), formula["detail"]
    assert formula["prefill"]["sweep"] == "auto" and formula["prefill"]["k_auto"] == k_f

    prediction = found["prediction"]  # the cost-aware prediction decomposes these timings exactly
    assert prediction["data"]["refined_best"] == prediction["data"]["measured_best"] == 2
    assert prediction["title"] == "The cost-aware prediction agrees: k = 2"
    assert "tie" not in found and "low_c" not in found


def test_no_formula_finding_when_the_formula_matches_the_measurement(store):
    # A verify pass costs exactly one target step and c = 5: the formula (pooled α = 11/20) also picks k = 2, and puts
    # it at 1.36x against 2.0 / 1.4 = 1.43x measured (-5 %): nothing to say.
    spec = {
        1: ([[(a, ["code"]) for a in (0, 1) * 3]] * 3, 0.002, BASE_STEP),
        2: ([[(a, ["code"] * 2) for a in (0, 1, 2, 1) * 2]] * 3, 0.004, BASE_STEP),
    }  # 60 verified drafts
    eid, _ = _run_experiment(store, spec, prompts=3, sampling=SAMPLED)
    assert theory.best_k(11 / 20, 5.0)[0] == 2 and verdict_dict(store, eid)["best"] == 2
    found = _by_kind(fd.findings(store, eid))
    assert "formula" not in found and found["prediction"]["data"]["refined_best"] == 2


# --- a draft too slow to pay ------------------------------------------------------------------------------------


def _slow_draft(store, draft_s):
    # k = 2, α = 18 / 78 = 0.23 over 3 prompts; c = 0.010 / (draft_s / 2).
    rounds = [(0, ["code"] * 2)] * 14 + [(1, ["code"] * 2)] * 6
    eid, ids = _run_experiment(store, {2: ([rounds] * 3, draft_s, 0.010)}, prompts=3, draft="my_[draft](x)")
    return eid, ids


def test_a_draft_too_slow_to_pay(store):
    eid, ids = _slow_draft(store, draft_s=0.008)  # c = 2.5
    low = _by_kind(fd.findings(store, eid))["low_c"]
    alpha = 18 / 78
    k_f, s_f = theory.best_k(alpha, 2.5)
    assert s_f < fd.LOW_SPEEDUP
    assert low["data"]["run_id"] == ids[2] and low["data"]["best_k"] == k_f
    assert low["data"]["alpha"] == pytest.approx(alpha) and low["data"]["c"] == pytest.approx(2.5)
    need = low["data"]["c_needed"]
    assert theory.best_k(alpha, need, k_max=64)[1] >= fd.WORTH_IT > theory.best_k(alpha, need - 0.05, k_max=64)[1]
    assert "c = 2.50" in low["detail"] and f"predicts only {s_f:.2f}×" in low["detail"]
    assert "my_[draft](x) would need c ≥" in low["detail"]
    assert low["prefill"]["drafter"] == "prompt-lookup:3" and "prompt-lookup" in low["next"]


def test_a_fast_draft_is_not_called_slow(store):
    eid, _ = _slow_draft(store, draft_s=0.0002)  # c = 100: the formula's best is well above 1.05
    assert "low_c" not in _by_kind(fd.findings(store, eid))


# --- broken experiments -----------------------------------------------------------------------------------------


def test_sampling_settings_differing_from_the_baseline_are_an_error(store):
    eid, ids, _ = fill_experiment(store, ks=(2, 4))
    assert "sampling_mismatch" not in _by_kind(fd.findings(store, eid))
    rid = ids[("speculative", 4)]
    with store.write() as conn:
        conn.execute(text("UPDATE runs SET top_p = 0.9, seed = 7 WHERE id = :rid"), {"rid": rid})
    found = fd.findings(store, eid)
    mismatch = found[0]  # the most severe first
    assert mismatch["kind"] == "sampling_mismatch" and mismatch["severity"] == "error"
    assert mismatch["data"]["runs"] == [
        {"run_id": rid, "baseline_run_id": ids[("baseline", None)], "differ": {"top_p": [0.9, 1.0], "seed": [7.0, 0.0]}}
    ]
    assert f"Run {rid} (k = 4) decoded with top_p = 0.9 against 1, seed = 7 against 0" in mismatch["detail"]


def test_a_timing_warning_says_rerun_with_more_repeats(store):
    # k = 1 timed 4x faster than its baseline with 1.5 tokens per round: impossible, so it carries a warning.
    spec = {
        1: ([[(a, ["code"]) for a in (1, 0, 1, 0)]] * 3, 0.001, 0.0015),
        2: ([[(a, ["code"] * 2) for a in (2, 1, 2)]] * 3, 0.002, 0.010),
    }
    eid, ids = _run_experiment(store, spec, prompts=3)
    warned = _by_kind(fd.findings(store, eid))["timing_warning"]
    assert warned["severity"] == "warning" and warned["data"]["run_ids"] == [ids[1]]
    assert warned["detail"].startswith("The run at k = 1 measured")
    assert not missing(warned["next"], "drift", "--repeats"), warned["next"]
    assert warned["prefill"]["repeats"] == fd.MORE_REPEATS


def test_an_unknown_or_empty_experiment_has_no_findings(store):
    assert fd.findings(store, 999) == []
    eid = enqueue(store, ks=(2,), prompts=2)
    assert fd.findings(store, eid) == []


# --- links and the panel ----------------------------------------------------------------------------------------


def test_prefill_url_is_relative_and_encoded():
    url = fd.prefill_url(
        {
            "target": "org/m (v2)",
            "sweep": "k",
            "values": "1,2",
            "top_p": 1.0,
            "temperature": 0.7,
            "prompts": "code:tune",
        }
    )
    assert url == "new?target=org%2Fm+%28v2%29&sweep=k&values=1%2C2&top_p=1&temperature=0.7&prompts=code%3Atune"
    assert fd.prefill_query({"page": "train", "focus_from": 3}) == ("train", {"focus_from": "3"})


def _panel(url: str, experiment_id: int):
    """The findings panel alone, under the dashboard's page registry (so its page links resolve)."""
    from streamlit.testing.v1 import AppTest

    script = f"""
import streamlit as st
from app.main import all_pages
from pages.panels.findings_panel import render_findings
from storage import open_store
st.navigation(all_pages("experiment"), position="hidden")
render_findings(open_store({url!r}), {experiment_id})
"""
    at = AppTest.from_string(script, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_panel_escapes_user_text_and_links_the_chart_and_the_form(tmp_path):
    from pages.panels.findings_panel import md_escape
    from storage import open_store

    url = f"sqlite:///{tmp_path / 'panel.db'}"
    store = open_store(url)
    eid, _ = _slow_draft(store, draft_s=0.008)
    at = _panel(url, eid)
    low = next(m.value for m in at.markdown if "too slow to pay" in m.value)
    assert md_escape("my_[draft](x)") in low and "my_[draft](x)" not in low  # escaped, never a link
    # The cost table is in another section of the detail page: a button opens it (pages/panels/sections.py).
    assert "(see the cost table)" in low and "Show the cost table" in [b.label for b in at.button]
    links = [p.proto for p in at.get("page_link")]
    assert [link.page for link in links] == ["new"] and links[0].label == "Try it"
    prefill = {key: value[0] for key, value in parse_qs(links[0].query_string).items()}
    assert (prefill["draft"], prefill["sweep"], prefill["values"]) == ("my_[draft](x)", "k", "2,4,8")
    assert prefill["drafter"] == "prompt-lookup:3"
    assert md_escape("*x* :smile: $y$") == "\\*x\\* \\:\u2060smile\\:\u2060 \\$y\\$"  # no emoji, no math

    # The token-type finding's "Try it" opens the Train page focused on this experiment; its chart's button opens the
    # section that draws it.
    eid, _ = _run_experiment(store, {4: (_positions_rounds(), 0.004, 0.012)}, prompts=4)
    at = _panel(url, eid)
    shown = "\n".join(m.value for m in at.markdown)
    assert "not built yet" not in shown
    assert {"Show acceptance by token type", "Show acceptance by position"} <= {b.label for b in at.button}
    links = [p.proto for p in at.get("page_link")]
    train = [link for link in links if link.page == "train"]
    assert len(train) == 1 and parse_qs(train[0].query_string)["focus_from"] == [str(eid)]
    labels = [link.label for link in links]
    assert labels.count("Try it") == 2 and md_escape("Try the confidence:0.5 drafter") in labels

    with store.write() as conn:  # an arm decoded differently from its baseline: said loudly, first
        conn.execute(
            text("UPDATE runs SET temperature = 0.5 WHERE experiment_id = :eid AND kind = 'speculative'"), {"eid": eid}
        )
    at = _panel(url, eid)
    (mismatch,) = [f for f in fd.findings(store, eid) if f["kind"] == "sampling_mismatch"]
    assert len(at.error) == 1 and not missing(at.error[0].value, mismatch["title"], "temperature"), at.error


def test_a_draft_sweep_gets_findings_with_names_not_numbers(store):
    from storage.analysis import findings as f
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment
    from tests.test_timing_protocol import _base_prompt, _fill, _spec_prompt

    eid = enqueue_experiment(
        store,
        name="drafts",
        target="tgt",
        draft="a",
        prompts="code:tune",
        sampling={},
        sweep_variable="draft",
        sweep_values=["small-draft", "big-draft"],
        k=2,
        drafter="heuristic",
        prompt_texts=[f"p{i}" for i in range(3)],
    )
    spec = [_spec_prompt(i, [2, 1, 2, 0], 2, draft_s=0.002, verify_s=0.011) for i in range(3)]
    rows = {
        ("speculative", "small-draft"): spec,
        ("speculative", "big-draft"): spec,
        ("baseline", None): [_base_prompt(i, s.new_tokens, 0.010) for i, s in enumerate(spec)],
    }
    from storage.records import queries as q

    ids = {
        (r.kind, None if r.kind == "baseline" else r.sweep_label): int(r.run_id)
        for r in q.runs(store, eid).itertuples()
    }
    run_state.claim_group(store, eid, "w")
    for key, results in rows.items():
        run_state.start_run(store, ids[key], 3, "cpu")
        for r in results:
            from tests.test_storage import record

            record(store, ids[key], key[0], r)
        run_state.finish_run(store, ids[key], "done")
    found = f.findings(store, eid)
    tie = [x for x in found if x["kind"] == "tie"]
    assert tie and "small-draft" in tie[0]["detail"] + tie[0]["title"] + str(tie[0]["prefill"])
    assert all(
        x["prefill"].get("drafter", "heuristic") == "heuristic" for x in found if x["prefill"].get("sweep") == "draft"
    )
    _ = _fill


def test_the_formula_is_one_curve_the_detail_page_and_the_findings_both_read(store):
    """storage/analysis/formula.py pools α and c once (SQL over finished constant-k runs): the finding's 'puts k = 2 at
    X' is the detail page's grey curve at k = 2, and a run's own predicted_speedup (a different figure) is not used."""
    from pages.experiment_detail import speedup_frame
    from storage.analysis import formula

    spec = {
        2: ([[(a, ["code"] * 2) for a in (2, 2, 1, 2, 0, 2, 1, 2)]] * 3, 0.002, 0.012),
        4: ([[(a, ["code"] * 4) for a in (4, 3, 4, 2, 4, 1, 3, 4)]] * 3, 0.004, 0.020),
    }
    eid, ids = _run_experiment(store, spec, prompts=3, sampling=SAMPLED)
    pooled = formula.pooled_inputs(store, eid)
    alpha = (12 + 25) * 3 / ((12 + 3 + 25 + 4) * 3)
    assert pooled.alpha == pytest.approx(alpha) and pooled.c == pytest.approx(10.0)
    assert (pooled.verified, pooled.runs) == ((12 + 3 + 25 + 4) * 3, 2)
    found = _by_kind(fd.findings(store, eid))["formula"]
    frame = speedup_frame(q.sweep_curve(store, eid), "k", pooled).set_index("k")
    assert f"puts k = 2 at {frame.loc[2, 'predicted_speedup']:.2f}×" in found["detail"]
    assert f"best k is {found['data']['formula_best']} at {frame['predicted_speedup'].max():.2f}×" in found["detail"]
    own = q.runs(store, eid).set_index("k").loc[2, "predicted_speedup"]  # the run's own α = 0.8: another number
    assert f"{own:.2f}×" != f"{frame.loc[2, 'predicted_speedup']:.2f}×"

    # Only finished constant-k runs count: k = 4 rerun as heuristic, or unfinished, leaves k = 2's α alone.
    with store.write() as conn:
        conn.execute(text("UPDATE runs SET drafter = 'heuristic' WHERE id = :rid"), {"rid": ids[4]})
    assert formula.pooled_inputs(store, eid).alpha == pytest.approx(12 / 15)
    with store.write() as conn:
        conn.execute(text("UPDATE runs SET drafter = 'model', status = 'running' WHERE id = :rid"), {"rid": ids[4]})
    assert formula.pooled_inputs(store, eid).runs == 1


def test_no_formula_under_the_minimum_of_verified_drafts(store):
    spec = {2: ([[(a, ["code"] * 2) for a in (2, 1)]] * 3, 0.002, 0.012)}  # 3 x (2 + 2) = 12 verified drafts
    eid, _ = _run_experiment(store, spec, prompts=3)
    from storage.analysis import formula

    assert formula.MIN_VERIFIED > 12 and formula.pooled_inputs(store, eid) is None
