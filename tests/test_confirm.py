"""`draftlab confirm` without a vLLM server: canned completion streams read into requests, the figures of a pass
(ITL of a multi-token chunk, TTFT from the send), the speedup paired by pass with its interval, output comparisons,
the stored measurement read back as SPEC's JSON (SQLite and PostgreSQL), and the faults that need no real engine
(bad flags, a server that exits before it is ready)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from app.serving.completions_load import PassRecord, RequestFailed, RequestRecord, read_stream
from app.serving.production_scrape import SpecCounters
from storage.analysis.confirm_report import confirm_document
from storage.records.confirms import (
    LATENCY_KEYS,
    add_measurement,
    finish_confirm,
    outputs_match,
    pass_speedup,
    start_confirm,
    summarize,
)
from tests.meaning import missing


def _sse(*chunks) -> list[bytes]:
    lines = []
    for chunk in chunks:
        lines += [f"data: {json.dumps(chunk)}".encode(), b""]
    return lines + [b"data: [DONE]", b""]


def _clock(*times):
    it = iter(times)
    return lambda: next(it)


def test_a_stream_chunk_of_several_tokens_is_one_arrival_with_its_count_and_ids():
    record = RequestRecord(prompt_index=2, sent=0.0)
    lines = _sse(
        {"choices": [{"text": "a", "token_ids": [5]}]},
        {"choices": [{"text": "bcd", "token_ids": [6, 7, 8]}]},  # a speculative step: 3 tokens at once
        {"choices": [{"text": "", "token_ids": [], "finish_reason": "length"}]},
        {"choices": [], "usage": {"completion_tokens": 4}},
    )
    read_stream(lines, record, _clock(10.1, 10.3, 10.35, 10.4), start=10.0)
    assert record.token_ids == [5, 6, 7, 8] and record.text == "abcd" and record.finish_reason == "length"
    assert record.counts == [1, 3] and record.arrivals == pytest.approx([0.1, 0.3])
    assert record.new_tokens == 4


def test_a_server_without_token_ids_is_counted_by_its_usage():
    record = RequestRecord(prompt_index=0, sent=0.0)
    read_stream(
        _sse(
            {"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}},
            {"choices": [{"text": "yz"}], "usage": {"completion_tokens": 3}},
        ),
        record,
        _clock(1.0, 2.0),
        0.0,
    )
    assert record.counts == [1, 2] and record.token_ids == []


def test_a_stream_cut_before_done_or_an_error_chunk_is_a_failed_request():
    cut = _sse({"choices": [{"text": "a", "token_ids": [1]}]})[:-2]
    with pytest.raises(RequestFailed, match=r"prompt 3\b.*\[DONE\]"):
        read_stream(cut, RequestRecord(prompt_index=3, sent=0.0), _clock(1.0), 0.0)
    with pytest.raises(RequestFailed, match="mid-stream: out of memory"):
        read_stream(
            _sse({"error": {"message": "out of memory"}}), RequestRecord(prompt_index=0, sent=0.0), _clock(1.0), 0.0
        )


def _request(i, sent, arrivals, counts):
    return RequestRecord(
        prompt_index=i, sent=sent, arrivals=list(arrivals), counts=list(counts), token_ids=list(range(sum(counts)))
    )


def test_summarize_times_requests_from_their_send_and_gives_a_chunk_one_gap_and_zeros():
    first = PassRecord(
        concurrency=1,
        wall_seconds=2.0,
        requests=[
            _request(0, 0.0, [0.5, 1.0], [1, 3]),  # TTFT 0.5, gaps 0.5, 0, 0
            _request(1, 1.0, [1.2, 2.0], [2, 1]),
        ],
    )  # TTFT 0.2 (from its send, not the pass start), gaps 0, 0.8
    fig = summarize([first])
    gaps = [0.5, 0.0, 0.0, 0.0, 0.8]
    assert fig["new_tokens"] == 7 and fig["requests"] == 2 and fig["tokens_per_second"] == pytest.approx(3.5)
    assert fig["ttft_seconds_p50"] == pytest.approx(np.percentile([0.5, 0.2], 50))
    assert fig["itl_seconds_p50"] == pytest.approx(np.percentile(gaps, 50))
    assert fig["itl_seconds_p95"] == pytest.approx(np.percentile(gaps, 95))
    assert fig["request_latency_seconds_p50"] == pytest.approx(np.percentile([1.0, 1.0], 50))


def _walls(*walls) -> list[PassRecord]:
    """Passes of equal work (one request of 4 tokens each) taking these walls."""
    return [PassRecord(1, w, [_request(0, 0.0, [w], [4])]) for w in walls]


def test_speedup_of_equal_work_is_baseline_wall_over_speculative_wall_with_passes_kept_paired():
    assert pass_speedup(_walls(2.0, 2.0), _walls(1.0, 1.0)) == (
        pytest.approx(2.0),
        [pytest.approx(2.0), pytest.approx(2.0)],
    )
    assert pass_speedup(_walls(2.0), _walls(1.0)) == (pytest.approx(2.0), None)  # one pass: no interval
    # A loaded moment slows both servers' pass 2; paired, the ratios stay within 1–2, never 3 / 0.5 = 6.
    speedup, (lo, hi) = pass_speedup(_walls(1.0, 3.0), _walls(0.5, 3.0))
    assert speedup == pytest.approx(4.0 / 3.5)
    assert 1.0 <= lo <= speedup <= hi <= 2.0


def test_outputs_match_gives_the_share_equal_and_the_first_divergence():
    share, first = outputs_match({0: [1, 2, 3], 1: [4, 5], 2: [6]}, {0: [1, 2, 3], 1: [4, 9], 2: [6]}, "the lab")
    assert share == pytest.approx(2 / 3)
    assert not missing(first, "prompt 1", "token 1", "server 5", "the lab 9"), first
    assert outputs_match({0: [1]}, {}, "the lab") == (None, None)


def test_a_stored_confirm_reads_back_as_specs_json(store):
    from storage.jobs.experiments import enqueue_experiment

    eid = enqueue_experiment(
        store, name="c", target="t", draft="d", prompts="p", sampling={}, sweep_values=(3,), prompt_texts=["a", "b"]
    )
    cid = start_confirm(store, eid, configs="chosen", concurrency=[1], repeats=2)
    passes = [
        PassRecord(1, 2.0, [_request(0, 0.0, [0.5, 1.0], [1, 3])]),
        PassRecord(1, 1.0, [_request(0, 0.0, [0.25, 0.5], [1, 3])]),
    ]
    base = [
        PassRecord(1, 4.0, [_request(0, 0.0, [1.0, 2.0, 3.0, 4.0], [1, 1, 1, 1])]),
        PassRecord(1, 2.0, [_request(0, 0.0, [0.5, 1.0, 1.5, 2.0], [1, 1, 1, 1])]),
    ]
    counters = SpecCounters(drafts=8, draft_tokens=24, accepted=12, per_position={1: 6, 2: 4, 3: 2})
    add_measurement(
        store,
        cid,
        eid,
        label="chosen",
        k=3,
        run_id=None,
        concurrency=1,
        passes=passes,
        speculative_config=json.dumps({"method": "draft_model", "num_speculative_tokens": 3}),
        figures=summarize(passes),
        speedup=pass_speedup(base, passes),
        counters=counters,
        matches={"outputs_match_server_baseline": 1.0, "outputs_match_lab": None, "first_divergence": None},
        baseline_tokens_per_second=summarize(base)["tokens_per_second"],
    )
    add_measurement(
        store,
        cid,
        eid,
        label="target-only",
        k=0,
        run_id=None,
        speculative_config=None,
        concurrency=1,
        passes=base,
        figures=summarize(base),
    )
    finish_confirm(store, cid, engine_version="0.32.0", wall_seconds=60.0, errors=[])
    doc = confirm_document(store, cid)
    assert set(doc) == {
        "experiment_id",
        "engine",
        "engine_version",
        "baseline",
        "configs",
        "server_starts",
        "one_server_at_a_time",
    }
    assert doc["engine_version"] == "0.32.0" and doc["server_starts"] is None  # stored here, not started
    (b,) = doc["baseline"]["per_concurrency"]
    assert set(b) == {"concurrency", "tokens_per_second", *LATENCY_KEYS} and b["tokens_per_second"] == pytest.approx(
        8 / 6
    )
    (config,) = doc["configs"]
    assert config["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 3}
    (m,) = config["per_concurrency"]
    assert m["speedup"] == pytest.approx(2.0) and m["speedup_ci"] == [pytest.approx(2.0), pytest.approx(2.0)]
    assert m["tokens_per_second"] == pytest.approx(8 / 3)
    assert m["server_draft_acceptance_rate"] == pytest.approx(0.5)
    # vLLM counts position j when drafts 0..j were all accepted; DraftLab's is conditional: 6/8, 4/6, 2/4
    assert m["server_per_position_acceptance"] == pytest.approx([0.75, 4 / 6, 0.5])
    assert m["lab_draft_acceptance_rate"] is None and m["outputs_match_server_baseline"] == 1.0
    assert m["outputs_match_lab"] is None
    # equal work: the speedup is the two servers' tokens per second; under the server's 1 + 12 / 8 tokens per step
    assert m["speedup"] == pytest.approx(m["tokens_per_second"] / m["baseline_tokens_per_second"])
    assert m["server_tokens_per_step"] == pytest.approx(2.5)
    assert m["speedup_warning"] is None and m["outputs_test"] is None  # greedy: outputs compared token for token


def test_confirm_refuses_half_a_pair_of_servers_in_one_line(tmp_path, capsys):
    from app.cli import main
    from storage import open_store

    open_store(f"sqlite:///{tmp_path / 'x.db'}").dispose()  # a database that is there (confirm never creates one)
    assert main(["confirm", "1", "--server", "http://127.0.0.1:9", "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --server ") and "--baseline-server" in err and "\n" not in err
    assert main(["confirm", "1", "--concurrency", "1,0", "--db", f"sqlite:///{tmp_path / 'x.db'}"]) == 2
    assert "is not a concurrency" in capsys.readouterr().err


def test_a_server_that_exits_before_it_is_ready_is_one_line_with_its_last_error(tmp_path, model_dirs, capsys):
    from app.cli import main
    from tests.cli_runs import run_json

    lab, db = run_json(tmp_path, model_dirs, capsys, "--k", "2", "--repeats", "1", "--max-new-tokens", "4")
    fake = (
        f"{sys.executable} -c \"print('loading…'); print('RuntimeError: no CPU backend'); print('shutting down'); "
        'raise SystemExit(3)"'
    )
    status = main(["confirm", str(lab["experiment_id"]), "--configs", "all", "--vllm", fake, "--db", db])
    err = capsys.readouterr().err
    assert status == 1
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert not missing(line, "status 3", "RuntimeError: no CPU backend"), line  # its exit status, its log's error
    from storage import open_store
    from storage.analysis.confirm_report import confirms

    (stored,) = confirms(open_store(db), lab["experiment_id"])
    assert stored["status"] == "failed" and stored["configs"] == [] and "status 3" in stored["error"]


def test_the_servers_k_and_comparable_positions_follow_vllms_schedule_lookup():
    from storage.records.confirms import comparable_positions, server_k

    # the demo grid's schedule as the deploy export wrote it (k 2 up to batch 3, k 1 at 4), confirmed in vLLM
    schedule = {"num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 3, 2], [4, 4, 1]]}
    assert [server_k(schedule, c) for c in (1, 3, 4, 16)] == [2, 2, 1, 1]  # past the last range: its k
    gap = {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 2, 3], [8, 16, 0]]}
    assert [server_k(gap, c) for c in (2, 5, 8, 32)] == [3, 3, 0, 0]  # a gap takes the range before it
    assert server_k({"num_speculative_tokens": 4}, 64) == 4
    # at concurrency 4 the steps run 1..4 requests: k 2 and k 1 mix, so only position 1 reads as conditional
    assert comparable_positions(schedule, 1) == 2 and comparable_positions(schedule, 4) == 1
    assert comparable_positions({"num_speculative_tokens": 3}, 16) == 3
    rising = {"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 1, 1], [2, 8, 3]]}
    assert server_k(rising, 4) == 3 and comparable_positions(rising, 4) == 1  # the last request alone drafts 1
