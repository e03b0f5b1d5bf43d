"""The dashboard's logic without a browser: launch validation, the pair check, the simulator, the launcher."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from app import ui
from engine.metrics import simulate as sim
from engine.metrics import theory

VALID = dict(
    target="demo-target",
    draft="demo-draft",
    pair_ok=True,
    pair_message="ok",
    prompts="code:tune",
    prompt_error=None,
    temperature=0.0,
    top_k=0,
    top_p=1.0,
    seed=0,
    max_new_tokens=32,
    device="auto",
    dtype="auto",
    sweep_variable="k",
    sweep_text="4, 1,2",
    k=4,
    name="",
    notes=" n ",
    tags_text="a, b,a",
)


def test_parse_sweep_values_sorts_and_rejects_bad_entries():
    from pages.new_experiment import parse_sweep_values

    assert parse_sweep_values("1,2,3,4,6,8") == [1, 2, 3, 4, 6, 8]
    assert parse_sweep_values(" 8 4,1 ") == [1, 4, 8]
    for bad, words in [
        ("", "at least one"),
        ("0", "whole number"),
        ("2.5", "whole number"),
        ("x", "whole number"),
        ("1,1", "twice"),
        ("65", "1 to 64"),
    ]:
        with pytest.raises(ValueError, match=words):
            parse_sweep_values(bad)


def test_validate_builds_enqueue_arguments():
    from pages.new_experiment import validate

    launch = validate(**VALID)
    assert launch.errors == []
    kw = launch.kwargs
    assert kw["sweep_values"] == [1, 2, 4] and kw["sweep_variable"] == "k"
    from engine.config.run_config import DEFAULTS, RUN_PARAMETERS

    # every numeric run setting (engine/config/run_config.py), each as on screen: the defaults, 32 new tokens
    assert set(kw["sampling"]) == {
        name
        for name in RUN_PARAMETERS
        if name != "k" and name not in ("draft", "drafter") and isinstance(DEFAULTS[name], (int, float))
    }
    assert kw["sampling"] == {**{name: DEFAULTS[name] for name in kw["sampling"]}, "max_new_tokens": 32}
    assert kw["tags"] == ("a", "b") and kw["notes"] == "n"
    assert kw["name"] == "demo-draft → demo-target on code:tune"


@pytest.mark.parametrize(
    "change, words",
    [
        (
            {"pair_ok": False, "pair_message": "tokenizers disagree"},
            "pair check failed (its reason is shown under Models",
        ),
        ({"prompts": None}, "choose a built-in set"),
        ({"prompts": None, "prompt_error": "bad.csv: no prompt column"}, "bad.csv: no prompt column"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_k": -1}, "top-k"),
        ({"top_p": 0.0}, "top-p"),
        ({"top_p": 1.5}, "top-p"),
        ({"max_new_tokens": 0}, "max new tokens"),
        ({"seed": -1}, "seed"),
        ({"sweep_text": "1,zero"}, "whole number"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_validate_reports_each_invalid_field(change, words):
    from pages.new_experiment import validate

    launch = validate(**{**VALID, **change})
    assert launch.kwargs == {}
    assert any(words in e for e in launch.errors), launch.errors


def test_save_upload_is_content_addressed(tmp_path, monkeypatch):
    from pages.new_experiment import save_upload

    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path))
    a = save_upload("../my prompts.txt", b"one\ntwo\n")
    assert a.parent == tmp_path and a.name.endswith("-my_prompts.txt") and a.read_bytes() == b"one\ntwo\n"
    assert save_upload("my prompts.txt", b"one\ntwo\n") == a
    assert save_upload("my prompts.txt", b"three\n") != a


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    """Two model directories sharing a tokenizer, one with a different tokenizer, one whose config is too narrow."""
    from pages.widgets.pair_check import wait_warm

    wait_warm()  # a dashboard AppTest may still be importing transformers in the background
    from transformers import LlamaConfig

    from tests.tiny_models import tokenizer

    root = tmp_path_factory.mktemp("pair")
    dirs = {}
    for name, prefix, width in (("target", "t", 64), ("draft", "t", 80), ("other", "u", 64), ("narrow", "t", 32)):
        path = root / name
        tokenizer(64, prefix=prefix).save_pretrained(path)
        LlamaConfig(
            vocab_size=width, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
        ).save_pretrained(path)
        dirs[name] = str(path)
    return dirs


def test_pair_check_matches_and_mismatches_from_tokenizers_only(tokenizer_dirs):
    from pages.widgets.pair_check import check_pair_names

    ok = check_pair_names(tokenizer_dirs["target"], tokenizer_dirs["draft"])
    assert ok.ok and ok.vocab_size == 64 and "64" in ok.message
    other = check_pair_names(tokenizer_dirs["target"], tokenizer_dirs["other"])
    assert not other.ok and "disagree" in other.message
    narrow = check_pair_names(tokenizer_dirs["target"], tokenizer_dirs["narrow"])
    assert not narrow.ok and "draft" in narrow.message
    missing = check_pair_names(tokenizer_dirs["target"], "/no/such/model/dir")
    assert not missing.ok and "draft" in missing.message
    assert not check_pair_names("", "demo-draft").ok


def test_pair_check_reads_an_eagle3_head_as_the_engine_loads_it(tokenizer_dirs, tmp_path):
    """An EAGLE-3 head as the draft: checked against the target's config (verifier, aux layers, widths), no
    tokenizer of its own needed; the engine's one-line reasons when it cannot draft for the target."""
    import json

    from pages.widgets.pair_check import check_pair_names

    def head(name, vocab=64, verifier=tokenizer_dirs["target"], aux=(0, 0, 0)):
        path = tmp_path / name
        path.mkdir()
        layer = {
            "vocab_size": vocab,
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
        }
        (path / "config.json").write_text(
            json.dumps(
                {
                    "speculators_model_type": "eagle3",
                    "transformer_layer_config": layer,
                    "draft_vocab_size": vocab,
                    "eagle_aux_hidden_state_layer_ids": list(aux),
                    "speculators_config": {"verifier": {"name_or_path": verifier}},
                }
            )
        )
        return str(path)

    ok = check_pair_names(tokenizer_dirs["target"], head("good"))
    assert ok.ok and "EAGLE-3 head (speculators layout)" in ok.message and "drafts as eagle3" in ok.message
    for path, says in (
        (head("vocab", vocab=32), "scores a target vocabulary of 32 ids, the target has 64"),
        (head("other", verifier="org/other"), "was trained for target 'org/other'"),
        (head("deep", aux=(0, 1, 0)), "reads target layers [0, 1, 0]"),
    ):
        check = check_pair_names(tokenizer_dirs["target"], path)
        assert not check.ok and says in check.message, check.message


def test_simulator_matches_the_formula():
    frame, summary = sim.simulate(sim.SimulationSetup(vocab=30, rounds=20_000, seed=1), [1, 2, 4, 8])
    beta = summary["beta"]
    alpha_hat = frame["accepted"].sum() / (frame["accepted"].sum() + frame["rejected"].sum())
    assert alpha_hat == pytest.approx(beta, abs=0.02)
    for row in frame.itertuples():
        assert row.tokens_per_round == pytest.approx(theory.expected_tokens_per_round(beta, row.k), rel=0.05)
        assert row.predicted_speedup == pytest.approx(theory.predicted_speedup(beta, row.k, 10.0))
    assert summary["first_token_total_variation"] < 0.05  # rejection sampling is lossless


def test_simulate_rounds_counts_accepted_prefix():
    rng = np.random.default_rng(0)
    same = np.full(5, 0.2)
    accepted, first = sim.simulate_rounds(same, same, 3, 100, rng)
    assert (accepted == 3).all() and first.shape == (100,)  # identical distributions: every draft accepted


def test_ui_commands_bind_and_route(monkeypatch):
    cmd = ui.streamlit_command(8600, "127.0.0.1")
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("app/main.py")
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1" and cmd[cmd.index("--server.port") + 1] == "8600"
    assert ui.worker_command("sqlite:///x.db")[-3:] == ["worker", "--db", "sqlite:///x.db"]
    assert ui.DEFAULT_HOST == "127.0.0.1"


class _FakeProcess:
    """Stands in for a child process: exits with `code` after `polls` polls, records terminate()."""

    started: list[_FakeProcess] = []

    def __init__(self, cmd, env=None, **_):
        self.cmd, self.env, self.returncode, self.terminated = cmd, env, None, False
        self.polls = 2 if "streamlit" in cmd else 10**9
        self.pid = 4242
        _FakeProcess.started.append(self)

    def poll(self):
        self.polls -= 1
        if self.polls <= 0 and self.returncode is None:
            self.returncode = 0
        return self.returncode

    def terminate(self):
        self.terminated, self.returncode = True, -15

    def wait(self, timeout=None):
        return self.returncode


@pytest.mark.parametrize("live, starts_worker", [(0, True), (1, False)])
def test_ui_starts_a_worker_only_when_none_is_alive_and_stops_it(tmp_path, monkeypatch, live, starts_worker):
    from storage.jobs import liveness

    _FakeProcess.started = []
    monkeypatch.setattr(ui.subprocess, "Popen", _FakeProcess)
    monkeypatch.setattr(ui.time, "sleep", lambda s: None)
    monkeypatch.setattr(liveness, "live_workers", lambda store, max_age_seconds=30: live)
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    assert ui.main(url, 8599, "127.0.0.1") == 0
    kinds = ["worker" if "worker" in p.cmd else "streamlit" for p in _FakeProcess.started]
    assert kinds == (["worker", "streamlit"] if starts_worker else ["streamlit"])
    assert all(p.env["DRAFTLAB_DB"] == url for p in _FakeProcess.started)
    if starts_worker:
        assert _FakeProcess.started[0].terminated  # the dashboard exited: its worker is stopped too


def test_ui_reports_an_unreachable_database_in_one_line(capsys):
    assert ui.main("postgresql://nobody@127.0.0.1:1/none", 8599, "127.0.0.1") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot open the database") and err.count("\n") == 1


# --- Experiment detail: what the predictions and the headline are built from ----------------------------------


def test_validate_passes_repeats_and_auto_k_and_checks_them():
    from pages.new_experiment import validate

    assert validate(**VALID).kwargs["repeats"] == 3 and validate(**VALID).kwargs["k_auto"] is None
    edge = validate(**{**VALID, "seed": 2**31 - 1, "repeats": 100, "max_new_tokens": 4096, "name": "n" * 200})
    assert edge.kwargs and not edge.errors
    kw = validate(**{**VALID, "sweep_text": "", "repeats": 5, "k_auto": 8}).kwargs
    assert (kw["repeats"], kw["k_auto"], kw["sweep_variable"], kw["sweep_values"], kw["k"]) == (5, 8, "k", [8], 8)
    for change, words in [
        ({"repeats": 0}, "repeats must be a whole number from 1 to 100"),
        ({"repeats": 101}, "$DRAFTLAB_LIMIT_REPEATS"),
        ({"seed": 2**31}, "seed must be"),
        ({"max_new_tokens": 4097}, "from 1 to 4096"),
        ({"name": "n" * 201}, "at most 200"),
        ({"temperature": 1e-300}, "temperature must be 0 (greedy) or a number from 0.001"),
        ({"sweep_text": ",".join(map(str, range(1, 66)))}, "DRAFTLAB_LIMIT_SWEPT_VALUES"),
        ({"k_auto": 1}, "from 2 to 64"),
        ({"k_auto": 65}, "from 2 to 64"),
    ]:
        launch = validate(**{**VALID, **change})
        assert launch.kwargs == {} and any(words in e for e in launch.errors), launch.errors


def test_pair_check_shows_a_bad_file_inline_and_raises_a_bug(tokenizer_dirs, tmp_path, monkeypatch):
    """A file the loaders cannot parse (a KeyError inside transformers for a malformed tokenizer.json) is the
    user's to fix, shown inline; the same KeyError raised by DraftLab's own code is a bug and raised as it is, never
    reworded as "check the HF model id" (the tokenizer path and the EAGLE-3 head path alike)."""
    import json
    import shutil

    import engine.config.head_format as head_format
    import pages.widgets.pair_check as pair_check

    bad = tmp_path / "bad-tokenizer"
    shutil.copytree(tokenizer_dirs["draft"], bad)
    (bad / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "Nope"}}))
    shown = pair_check.check_pair_names(tokenizer_dirs["target"], str(bad))
    assert not shown.ok and shown.message.startswith("cannot load the draft tokenizer"), shown.message

    def bug(*args, **kwargs):
        raise KeyError("width")

    monkeypatch.setattr(pair_check, "_tokenizer_and_width", bug)
    with pytest.raises(KeyError, match="width"):
        pair_check.check_pair_names(tokenizer_dirs["target"], str(tmp_path / "any-draft"))
    monkeypatch.setattr(pair_check, "_tokenizer_and_width", lambda name, files=(): (None, 64))
    monkeypatch.setattr(head_format, "is_head", lambda name: True)
    monkeypatch.setattr(head_format, "head_spec", bug)
    with pytest.raises(KeyError, match="width"):
        pair_check.check_pair_names(tokenizer_dirs["target"], str(tmp_path / "any-head"))


def test_a_bug_reading_a_link_is_raised_not_noted_as_a_bad_link():
    """The New-experiment page reads a link's parameters without catching: a bug in reading them is the page's
    exception, not the note "the link's parameters could not be read"; a bad parameter is still a note."""
    from streamlit.testing.v1 import AppTest

    def script(broken):
        import streamlit as st

        import pages.new_experiment as page

        original = page.parse_prefill

        def bug(*args, **kwargs):
            raise KeyError("sweep")

        page.parse_prefill = bug if broken else original
        try:
            page._apply_link()
        finally:
            page.parse_prefill = original
        st.text(" | ".join(st.session_state[page.LINK_NOTES]))

    at = AppTest.from_function(script, args=(True,), default_timeout=60)
    at.query_params["k"] = "2"
    at.run()
    assert len(at.exception) == 1 and at.exception[0].message == "'sweep'", at.exception
    at = AppTest.from_function(script, args=(False,), default_timeout=60)
    at.query_params["nosuchfield"] = "1"
    at.run()
    assert not at.exception and "nosuchfield" in at.text[0].value, at.text


@pytest.mark.parametrize("site", ["trained drafts", "training timings", "uploads to keep"])
def test_a_form_goes_on_without_a_database_but_raises_a_bug(site, monkeypatch, tmp_path):
    """The extras a form reads from the database (pages/widgets/common.NO_DATABASE): without one to ask the form
    goes on (no trained drafts listed, no timings, no upload pruned); a KeyError from the code reading them is the
    bug it is, never "no job finished here"."""
    from sqlalchemy.exc import OperationalError

    import pages.panels.experiment_form_models as form_models
    import pages.train as train
    import pages.widgets.uploads as uploads
    from storage.jobs import training

    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path))
    target, call, fallback = {
        "trained drafts": ("trained_drafts", form_models.trained_drafts, {}),
        "training timings": ("job_timings", train._timings, list(training.TIMING_COLUMNS)),
        "uploads to keep": ("unfinished_job_files", uploads.prune_uploads, []),
    }[site]
    for module in (form_models, train, uploads):
        monkeypatch.setattr(module, "store", lambda: None)

    def unavailable(*args, **kwargs):
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    def bug(*args, **kwargs):
        raise KeyError("out")

    monkeypatch.setattr(training, target, unavailable)
    got = call()
    assert (list(got.columns) if site == "training timings" else got) == fallback
    monkeypatch.setattr(training, target, bug)
    with pytest.raises(KeyError, match="out"):
        call()


def test_pair_check_rechecks_a_directory_whose_files_changed(tokenizer_dirs, tmp_path):
    import shutil
    from pathlib import Path

    from pages.widgets.pair_check import check_pair_names

    draft = tmp_path / "draft"
    shutil.copytree(tokenizer_dirs["draft"], draft)
    (draft / "config.json").unlink()
    first = check_pair_names(tokenizer_dirs["target"], str(draft))
    assert not first.ok and "draft" in first.message
    shutil.copy(Path(tokenizer_dirs["draft"]) / "config.json", draft / "config.json")
    again = check_pair_names(tokenizer_dirs["target"], str(draft))
    assert again.ok, again.message  # keyed on the directory's files: the added config.json is seen


def test_pair_check_of_an_uncached_hub_id_fails_in_seconds_offline_or_unreachable(tokenizer_dirs, monkeypatch):
    import time

    import requests
    from huggingface_hub import HfApi

    from pages.widgets.pair_check import check_pair_names

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    offline = check_pair_names(tokenizer_dirs["target"], "someone-unknown/not-in-any-cache")
    assert (
        not offline.ok and "cannot load the draft tokenizer" in offline.message and "HF_HUB_OFFLINE" in offline.message
    )
    assert time.perf_counter() - start < 5
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []

    def unreachable(self, repo_id, timeout=None, **kw):
        calls.append(timeout)
        raise requests.exceptions.ConnectTimeout("timed out")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    for _ in range(2):  # a network failure is not cached: the second check asks again
        failed = check_pair_names(tokenizer_dirs["target"], "someone-unknown/not-in-any-cache")
        assert not failed.ok and "did not answer within" in failed.message and "check the HF model id" in failed.message
    assert len(calls) == 2 and all(0 < t <= 10 for t in calls)


def test_run_labels_name_a_swept_draft_not_its_index():
    """A draft or drafter sweep stores the name's index as sweep_value; the run picker shows the name."""
    import pandas as pd

    from pages.widgets.common import run_label

    runs = pd.DataFrame(
        [
            {"run_id": 1, "kind": "baseline", "k": None, "sweep_value": None, "sweep_label": None, "status": "done"},
            {
                "run_id": 2,
                "kind": "speculative",
                "k": 4,
                "sweep_value": 0.0,
                "sweep_label": "demo-draft",
                "status": "done",
            },
            {
                "run_id": 3,
                "kind": "speculative",
                "k": 4,
                "sweep_value": 1.0,
                "sweep_label": "prompt-lookup:3",
                "status": "running",
            },
        ]
    )
    assert run_label(runs, "draft")(2) == "run 2 · draft=demo-draft (done)"
    assert run_label(runs, "drafter")(3) == "run 3 · drafter=prompt-lookup:3 (running)"
    assert run_label(runs, "k")(2) == "run 2 · k=4 (done)" and run_label(runs, "k")(1) == "run 1 · baseline"
    top_p = runs.assign(sweep_value=[0.9, 0.95, 1.0], sweep_label=["0.9", "0.95", "1"])
    assert run_label(top_p, "top_p")(2) == "run 2 · top_p=0.95 (done)"


def test_a_k_axis_ticks_whole_numbers_even_for_one_k():
    """A validation experiment measures one k: the axis used to tick its zero-width domain as `2.000000`."""
    from pages.widgets import charts

    one = charts.rates_curve(pd.DataFrame({"k": [2], "alpha": [0.8], "draft_acceptance_rate": [0.7]})).to_dict()
    x = one["encoding"]["x"]
    assert x["axis"]["format"] == "d" and x["axis"]["tickMinStep"] == 1 and x["scale"]["domain"] == [1.0, 3.0]
    many = charts.rates_curve(
        pd.DataFrame({"k": [1, 2, 4], "alpha": [0.8] * 3, "draft_acceptance_rate": [0.7] * 3})
    ).to_dict()["encoding"]["x"]
    assert many["axis"]["format"] == "d" and "scale" not in many
    temperature = charts.rates_curve(
        pd.DataFrame({"temperature": [0.0, 0.7], "alpha": [0.8] * 2, "draft_acceptance_rate": [0.7] * 2}), "temperature"
    ).to_dict()
    assert "format" not in temperature["encoding"]["x"].get("axis", {})  # 0.7 is not a whole number


def test_the_round_explorer_opens_on_the_most_rejected_readable_output():
    """Prompt 0's demo output is `↵ #` repeated: the explorer opens on a prompt whose output reads as text, the one
    with the most rejections (the most to see); without a readable one, the most rejected."""
    import pandas as pd

    from pages.round_explorer import opening_prompt, readable

    assert not readable("\n #\n #\n #") and not readable("a b c 1 2 3") and readable("My Parent said no")
    frame = pd.DataFrame(
        {
            "prompt_index": [0, 1, 2, 3],
            "rejected": [9, 2, 5, 5],
            "text": ["\n #\n #\n #", "def f(x): return x", "The cat sat", "Once upon a time"],
        }
    )
    assert opening_prompt(frame) == 2  # 0 is not readable; 2 and 3 tie on rejections: the first
    assert opening_prompt(frame.assign(text="\n #")) == 0  # none readable: the most rejected


def test_the_token_chart_is_one_monospace_advance_wide_per_character():
    """Each token's text starts where the previous one's ends: the chart is LINE_CHARS glyph advances wide, not
    stretched to the page (which drew "M y P a rent")."""
    import pandas as pd

    from pages.widgets import charts

    output = pd.DataFrame(
        {
            "position": [0, 1, 2],
            "token_id": [1, 2, 3],
            "text": ["M", "y", " Parent"],
            "kind": ["first", "accepted", "bonus"],
            "round_index": [None, 0, 0],
        }
    )
    layout = charts.token_layout(output)
    assert list(layout["x"]) == [0, 1, 2] and list(layout["x2"]) == [1, 2, 9]
    spec = charts.token_chart(layout, 0).to_dict()
    assert spec["width"] == charts.LINE_CHARS * charts.CHAR_PX == charts.LINE_CHARS * 0.6 * 12
    text = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "text")
    assert text["mark"]["fontSize"] == charts.TOKEN_FONT_PX and text["mark"].get("dx", 0) == 0
    # A leading space moves the text one cell into its box (the browser does not draw it): " Parent" at cell 3.
    assert text["encoding"]["text"]["field"] == "drawn" and text["encoding"]["x"]["field"] == "text_x"
    rows = spec["datasets"][spec["data"]["name"]]
    assert [(r["drawn"], r["text_x"]) for r in rows] == [("M", 0), ("y", 1), ("Parent", 3)]


def test_the_decode_speed_is_the_target_s_own_at_that_batch_size_else_scaled_by_model_size():
    import pandas as pd

    from pages.panels.estimate import decode_speed

    sizes = {"big": 4_000, "small": 1_000, "gone": None}.get
    measured = {"tokens_per_second": 40.0, "experiment_id": 7, "device_name": "cpu"}
    own = decode_speed("big", 2, measured, pd.DataFrame(), sizes)
    assert own.measured and own.tokens_per_second == 40.0 and "at batch size 2" in own.source and "#7" in own.source
    others = pd.DataFrame({"target": ["gone", "small"], "tokens_per_second": [10.0, 100.0], "experiment_id": [5, 6]})
    scaled = decode_speed("big", 2, None, others, sizes)
    assert not scaled.measured and scaled.tokens_per_second == 25.0 and "model size" in scaled.source
    assert "#6" in scaled.source and "4× its size" in scaled.source
    assert decode_speed("gone", 2, None, others, sizes) is None  # its weights are not on disk here
