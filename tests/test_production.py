"""Production counters (issue: from the lab to production and back): `draftlab import-metrics` reads vLLM-format
Prometheus expositions (with and without `_total`, labels, several engines; files, two scrapes, a live HTTP
server on loopback), converts them to DraftLab's definitions in SQL, compares them with the lab run of the same k
(prompt-clustered interval) and says so in a finding; every bad input is one `error:` line and stores nothing."""

from __future__ import annotations

import http.server
import threading

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from sqlalchemy import text

from app.cli import main
from app.serving.production_scrape import parse, public_source
from engine.errors import DraftLabError
from storage.analysis import findings as fd
from storage.records import production
from tests.meaning import missing
from tests.test_findings import _run_experiment

# 100 rounds of k = 4: positions accepted in 80, 60, 40, 20 rounds -> 200 accepted of 400 proposed.
PER_POS = (80, 60, 40, 20)


def vllm_text(drafts=100, per_pos=PER_POS, engines=("0",), k=4, scale=1.0) -> str:
    """An exposition as vLLM writes it (prometheus_client: `# TYPE name counter`, `name_total`, `name_created`),
    the counts split evenly over `engines`."""
    registry = CollectorRegistry()
    labels = ("model_name", "engine")
    c_drafts = Counter("vllm:spec_decode_num_drafts", "drafts", labels, registry=registry)
    c_tokens = Counter("vllm:spec_decode_num_draft_tokens", "draft tokens", labels, registry=registry)
    c_acc = Counter("vllm:spec_decode_num_accepted_tokens", "accepted", labels, registry=registry)
    c_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "per pos", (*labels, "position"), registry=registry)
    Counter("vllm:generation_tokens", "other metric", labels, registry=registry).labels("m", "0").inc(12345)
    share = scale / len(engines)
    for engine in engines:
        c_drafts.labels("m", engine).inc(drafts * share)
        c_tokens.labels("m", engine).inc(drafts * k * share)
        c_acc.labels("m", engine).inc(sum(per_pos) * share)
        for j, n in enumerate(per_pos):
            c_pos.labels("m", engine, str(j)).inc(n * share)
    return generate_latest(registry).decode()


def test_vllm_exposition_is_read_and_summed_over_engines():
    counters = parse(vllm_text(engines=("0", "1")), "m.txt")
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (100, 400, 200)
    assert counters.per_position == {1: 80, 2: 60, 3: 40, 4: 20}
    assert counters.engines == ("0", "1")
    one = parse(vllm_text(engines=("0", "1")), "m.txt", engine="1")
    assert (one.drafts, one.accepted, one.per_position[1]) == (50, 100, 40)
    with pytest.raises(DraftLabError, match=r"no speculative-decoding counters with engine=\"7\".*'0', '1'"):
        parse(vllm_text(engines=("0", "1")), "m.txt", engine="7")


def test_counters_without_total_suffix_or_type_lines_and_other_namespaces():
    plain = "\n".join(
        [
            'vllm:spec_decode_num_drafts{engine="0"} 10',
            'vllm:spec_decode_num_draft_tokens{engine="0"} 30',
            'vllm:spec_decode_num_accepted_tokens{engine="0"} 12',
            'vllm:spec_decode_num_accepted_tokens_per_pos{engine="0",position="0"} 7',
            'vllm:spec_decode_num_accepted_tokens_per_pos{engine="0",position="1"} 4',
            'vllm:spec_decode_num_accepted_tokens_per_pos{engine="0",position="2"} 1',
            "",
        ]
    )
    counters = parse(plain, "x")
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 30, 12)
    assert counters.per_position == {1: 7, 2: 4, 3: 1}
    llama = plain.replace("vllm:", "llamacpp:").replace('engine="0",', "").replace('{engine="0"}', "")
    assert parse(llama, "x").per_position == {1: 7, 2: 4, 3: 1}


@pytest.mark.parametrize(
    "body, message",
    [
        ("this is { not prometheus", "is not a Prometheus text exposition"),
        ("vllm:generation_tokens_total 5\n", "has no vllm:spec_decode_num_drafts_total"),
        (
            "vllm:spec_decode_num_drafts_total 1\nvllm:spec_decode_num_draft_tokens_total 2\n"
            "vllm:spec_decode_num_accepted_tokens_total -1\n",
            "not a count",
        ),
        (
            "vllm:spec_decode_num_drafts_total 1\nvllm:spec_decode_num_draft_tokens_total 2\n"
            "vllm:spec_decode_num_accepted_tokens_total 1\nvllm:spec_decode_num_accepted_tokens_per_pos_total 1\n",
            "no numeric position label",
        ),
    ],
)
def test_bad_expositions_are_one_line(body, message):
    with pytest.raises(DraftLabError, match=message) as info:
        parse(body, "m.txt")
    assert "\n" not in str(info.value)


def test_public_source_drops_credentials_and_query():
    assert public_source("http://user:secret@host:9000/metrics?token=abc#x") == "http://host:9000/metrics"
    assert public_source("saved/metrics.txt") == "saved/metrics.txt"


# --- stored, converted in SQL, compared with the lab ------------------------------------------------------------


def _lab(store, accepts_per_prompt):
    """An experiment with one finished k = 4 run whose prompt i's rounds accept accepts_per_prompt[i][r] drafts."""
    per_prompt = [[(a, ["code"] * 4) for a in accepts] for accepts in accepts_per_prompt]
    eid, ids = _run_experiment(store, {4: (per_prompt, 0.002, 0.01)}, prompts=len(per_prompt))
    return eid, ids[4]


def _files(tmp_path, **kw):
    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    before.write_text(vllm_text(**{**kw, "scale": 1.0}))
    after.write_text(vllm_text(**{**kw, "scale": 3.0}))  # twice as much again between the scrapes
    return str(before), str(after)


def test_two_scrapes_are_stored_converted_in_sql_and_compared(store, tmp_path, capsys):
    # Lab: every round accepts 2 of 4 -> α = 2/3 with no spread; production (below) has α 200/280 = 0.714.
    eid, run_id = _lab(store, [[2] * 20] * 4)
    before, after = _files(tmp_path)
    assert (
        main(["import-metrics", before, after, "--experiment", str(eid), "--label", "prod <eu>", "--db", store.url])
        == 0
    )
    out = capsys.readouterr().out
    said = ("200 drafts", "800 draft tokens", "0.500", "k = 4", f"run {run_id}")  # the counters and the lab run
    assert not missing(out, *said), out
    table = production.series(store, eid)
    row = table.iloc[0]
    assert (row["drafts"], row["draft_tokens"], row["accepted"], row["run_id"]) == (200, 800, 400, run_id)
    assert row["alpha"] == pytest.approx(400 / (400 + 200 - 40))
    assert row["tokens_per_round"] == pytest.approx(1 + 400 / 200)
    assert row["lab_alpha"] == pytest.approx(2 / 3)
    pos = production.positions(store, eid)
    assert list(pos["conditional"].round(4)) == [0.8, 0.75, round(40 / 60, 4), 0.5]
    assert list(pos["reached"]) == [200, 160, 120, 80]

    found = [f for f in fd.findings(store, eid) if f["kind"] == "production"]
    assert len(found) == 1 and found[0]["severity"] == "warning"
    assert found[0]["detail"].startswith("Production α 0.714 vs lab 0.667 (0.667–0.667, run ")
    assert "traffic differs" in found[0]["detail"], found[0]["detail"]  # the diagnosis: not the prompts tuned on
    assert found[0]["data"]["position"] == {"position": 1, "production": 0.8, "lab": 1.0, "lo": 1.0, "hi": 1.0}
    assert found[0]["prefill"] == {"page": "train"}


def test_import_metrics_json_prints_exactly_the_spec_keys(store, tmp_path, capsys):
    import json

    eid, _ = _lab(store, [[2] * 20] * 4)
    before, after = _files(tmp_path)
    assert (
        main(["import-metrics", before, after, "--experiment", str(eid), "--label", "eu", "--json", "--db", store.url])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == [
        "experiment_id",
        "label",
        "drafts",
        "draft_tokens",
        "accepted",
        "draft_acceptance_rate",
        "mean_acceptance_length",
        "per_position_acceptance",
    ]
    assert (doc["experiment_id"], doc["label"], doc["drafts"], doc["draft_tokens"], doc["accepted"]) == (
        eid,
        "eu",
        200,
        800,
        400,
    )
    assert doc["draft_acceptance_rate"] == pytest.approx(400 / 800)
    assert doc["mean_acceptance_length"] == pytest.approx(1 + 400 / 200)
    assert doc["per_position_acceptance"] == pytest.approx([0.8, 0.75, 40 / 60, 0.5])


def test_production_inside_the_lab_interval_says_the_lab_holds(store, tmp_path):
    # Lab per prompt: α of 0.55, 0.8, 0.7, 0.75 (spread) -> production's 0.714 lies inside the interval.
    eid, _ = _lab(store, [[2, 1, 3, 2, 1, 2], [4, 3, 2, 4, 3, 2], [3, 2, 3, 2, 4, 1], [3, 3, 2, 4, 2, 3]])
    before, after = _files(tmp_path)
    assert main(["import-metrics", before, after, "--experiment", str(eid), "--db", store.url]) == 0
    item = production.comparison(store, eid)[0]
    assert item["metric"] == "alpha" and item["lo"] < item["production"] < item["hi"] and not item["outside"]
    found = [f for f in fd.findings(store, eid) if f["kind"] == "production"]
    assert found[0]["severity"] == "info" and "the lab's verdict holds" in found[0]["detail"]
    assert production.series(store, eid)["label"].tolist() == ["production 1"]


def test_clustered_interval_widens_with_prompt_spread():
    tight = production.clustered_ratio([5, 5, 5, 5], [10, 10, 10, 10])
    spread = production.clustered_ratio([1, 9, 2, 8], [10, 10, 10, 10])
    assert tight[0] == spread[0] == 0.5
    assert tight[2] - tight[1] == 0 < spread[2] - spread[1]
    # the ratio estimator's SE by hand: sqrt(4/3 * (16+16+9+9)) / 40
    assert spread[2] == pytest.approx(0.5 + 1.959964 * (4 / 3 * 50) ** 0.5 / 40)


def _series_count(store):
    with store.read() as conn:
        return conn.execute(text("SELECT COUNT(*) FROM production_series")).scalar()


def test_bad_imports_are_one_line_and_store_nothing(store, tmp_path, capsys):
    eid, run_id = _lab(store, [[2] * 5] * 2)
    before, after = _files(tmp_path)
    reset = tmp_path / "reset.txt"
    reset.write_text(vllm_text(scale=0.5))
    same = tmp_path / "same.txt"
    same.write_text(vllm_text())
    cases = [
        ([before, str(reset)], "a counter went down between the two scrapes"),
        ([before, str(same)], "no drafts in this window"),
        ([str(tmp_path / "missing.txt")], "no such file"),
        (["ftp://host/metrics"], "only http(s) URLs and local files"),
        ([before, after, "--run", "999"], "--run 999 is not a speculative run of experiment"),
        ([before, after, "--label", "x" * 201], "--label must be 1 to 200 characters"),
        ([before, before, after], "give one SOURCE"),
        ([before, after, "--interval", "5"], "--interval scrapes one SOURCE twice"),
    ]
    for argv, message in cases:
        assert main(["import-metrics", *argv, "--experiment", str(eid), "--db", store.url]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, (argv, err)
    for bad_id in ("0", "９", "99999999999999999999"):
        assert main(["import-metrics", before, "--experiment", bad_id, "--db", store.url]) == 2
        err = capsys.readouterr().err
        assert not missing(err, repr(bad_id), "an id", "from 1 to 2147483647"), err
    assert main(["import-metrics", before, "--experiment", str(eid + 100), "--db", store.url]) == 2
    assert f"no experiment {eid + 100}" in capsys.readouterr().err
    assert _series_count(store) == 0


def test_size_cap(store, tmp_path, capsys, monkeypatch):
    eid, _ = _lab(store, [[2] * 5] * 2)
    big = tmp_path / "big.txt"
    big.write_text(vllm_text() + "# padding\n" * 120_000)  # > 1 MB
    monkeypatch.setenv("DRAFTLAB_LIMIT_METRICS_MB", "1")
    assert main(["import-metrics", str(big), "--experiment", str(eid), "--db", store.url]) == 2
    assert "larger than 1 MB, the limit per scrape" in capsys.readouterr().err
    monkeypatch.delenv("DRAFTLAB_LIMIT_METRICS_MB")
    assert main(["import-metrics", str(big), "--experiment", str(eid), "--db", store.url]) == 0


class _Metrics(http.server.BaseHTTPRequestHandler):
    """/metrics: the counters grow by one scrape's worth each time they are read; anything else is a 404."""

    scrapes = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        if not self.path.startswith("/metrics"):
            self.send_error(404)
            return
        type(self).scrapes += 1
        type(self).auth = self.headers.get("Authorization")
        body = vllm_text(scale=float(type(self).scrapes)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    _Metrics.scrapes = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_live_server_on_loopback_with_interval(store, metrics_server, capsys):
    eid, run_id = _lab(store, [[2] * 5] * 2)
    url = metrics_server.replace("http://", "http://user:hunter2@") + "/metrics?token=s3cret"
    assert main(["import-metrics", url, "--interval", "0.2", "--experiment", str(eid), "--db", store.url]) == 0
    captured = capsys.readouterr()
    assert "hunter2" not in captured.out + captured.err and "s3cret" not in captured.out + captured.err
    row = production.series(store, eid).iloc[0]
    assert row["drafts"] == 100 and row["seconds"] >= 0.2  # one scrape's worth between the two
    assert row["source"] == metrics_server + "/metrics"
    assert _Metrics.auth == "Basic dXNlcjpodW50ZXIy"  # user:hunter2, sent as basic auth
    assert main(["import-metrics", metrics_server + "/nope", "--experiment", str(eid), "--db", store.url]) == 2
    assert "answered HTTP 404" in capsys.readouterr().err
    closed = "http://127.0.0.1:9"  # discard port: nothing listens
    assert main(["import-metrics", closed + "/metrics", "--experiment", str(eid), "--db", store.url]) == 2
    assert "cannot fetch http://127.0.0.1:9/metrics" in capsys.readouterr().err


def test_detail_page_shows_production_next_to_the_lab(tmp_path, monkeypatch):
    """The detail page's Production panel: the stored series' rates in a table, and per position the lab's
    interval and the production points as chart data (what the browser receives)."""
    from storage import open_store
    from tests.test_pages import app, assert_clean, chart_data, page_text

    url = f"sqlite:///{tmp_path / 'prod.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    store = open_store(url)
    eid, run_id = _lab(store, [[2, 1, 3, 2, 1, 2], [4, 3, 2, 4, 3, 2], [3, 2, 3, 2, 4, 1], [3, 3, 2, 4, 2, 3]])
    before, after = _files(tmp_path)
    assert (
        main(["import-metrics", before, after, "--experiment", str(eid), "--label", "prod 'eu' <1>", "--db", url]) == 0
    )
    at = app("experiment", experiment=eid, section="Serving")
    assert_clean(at)
    assert "Production against the lab" in page_text(at)
    table = next(d.value for d in at.dataframe if "series" in d.value)
    assert table["series"].tolist() == ["prod 'eu' <1>"] and table["lab run"].tolist() == [run_id]
    assert table["α"].tolist() == pytest.approx([400 / 560])
    drawn = [frame for data in chart_data(at) for frame in data if "source" in frame]
    assert drawn, "no production chart"
    frame = pd.concat(drawn)
    prod = frame[frame["source"] == "prod 'eu' <1>"].sort_values("position")
    assert set(prod["kind"]) == {"production"}
    assert prod["conditional"].tolist() == pytest.approx([0.8, 0.75, 40 / 60, 0.5])
    lab = frame[frame["kind"] == "lab"].sort_values("position")
    expected = production.lab_positions(store, run_id)
    assert lab["lo"].tolist() == pytest.approx(expected["lo"].tolist())
    findings = app("experiment", experiment=eid)  # the Verdict section holds the findings
    assert "verdict holds for this traffic" in page_text(findings)  # the finding (markdown-escaped apostrophe)
    assert "Show production against the lab" in [b.label for b in findings.button]  # opens the Serving section
