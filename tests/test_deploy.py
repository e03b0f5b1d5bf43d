"""Carrying a run to production (storage/serving/deploy.py): every engine's settings parsed back — vLLM's JSON, the
command lines split like a shell would, the transformers snippet compiled and its arguments read back with ast — for
every drafter spec, with the inexpressible settings noted; and `draftlab export --format deploy` on a crafted database
gives the same document as storage.serving.deploy."""

from __future__ import annotations

import ast
import json
import math
import shlex

import pandas as pd
import pytest
from sqlalchemy import inspect, text

from engine.config.drafter_specs import SPECS
from storage.analysis.verdict import verdict_dict
from storage.records import queries as q
from storage.serving.deploy import DeployError, configuration, deploy_document, deploy_settings, parse_drafter
from tests import meaning
from tests.test_storage import fill_experiment

EXPERIMENT = {
    "experiment_id": 7,
    "target": "org/target-8B",
    "draft": "org/draft 0.5B",
    "temperature": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "seed": 0,
    "max_new_tokens": 64,
    "dtype": "auto",
    "trust_remote_code": False,
}
SAMPLING = {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "seed": 11}
# Every drafter the engine has (engine/config/drafter_specs.py), with a parameter where it takes one: a new drafter
# without a deploy mapping fails test_every_engine_parses_back.
DRAFTERS = [spec.parameter.example if spec.parameter else name for name, spec in SPECS.items()]
SWITCHES = {"--trust-remote-code", "--speculative-use-rejection-sampling"}  # flags that take no value
BAD_TEXT = ("None", "nan", "NaN", "inf", "null")


def settings(drafter: str, k: int = 4, **run) -> dict:
    return deploy_settings({"run_id": 3, "k": k, "drafter": drafter, **run}, EXPERIMENT)


def flags(engine: dict, head: int) -> dict[str, str | None]:
    """The command's flags after its first `head` words (program and positionals), checked well formed: the
    one-line command and the displayed snippet split alike, every flag starts with '-', each has its value
    (switches excepted), and no value reads None / nan."""
    argv = shlex.split(engine["command"])
    snippet = engine["snippet"]
    if "prepare" in engine:  # a file to write first (an EAGLE-3 head in the engine's layout): it heads the snippet
        first = f"# first:\n{engine['prepare']}\n\n"
        assert snippet.startswith(first)
        snippet = snippet[len(first) :]
    assert shlex.split(snippet.replace("\\\n", " ")) == argv
    assert not any(word in BAD_TEXT for word in argv), argv
    out: dict[str, str | None] = {}
    rest = argv[head:]
    while rest:
        flag, rest = rest[0], rest[1:]
        assert flag.startswith("-") and flag not in out, (flag, argv)
        if flag in SWITCHES:
            out[flag] = None
            continue
        assert rest and not rest[0].startswith("--"), f"{flag} has no value in {argv}"
        out[flag], rest = rest[0], rest[1:]
    return out


def generate_call(snippet: str) -> tuple[dict, dict]:
    """(the literal keyword arguments of target.generate(...), the draft.generation_config attributes set)."""
    compile(snippet, "<deploy snippet>", "exec")
    tree = ast.parse(snippet)
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "generate"
    ]
    assert len(calls) == 1
    kwargs = {
        kw.arg: (kw.value.id if isinstance(kw.value, ast.Name) else ast.literal_eval(kw.value))
        for kw in calls[0].keywords
        if kw.arg is not None
    }
    assigned = {
        n.targets[0].attr: ast.literal_eval(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.targets[0], ast.Attribute)
        and ast.unparse(n.targets[0].value) == "draft.generation_config"
    }
    return kwargs, assigned


def inexpressible(engine: dict) -> str:
    return " ".join(note for note in engine["notes"] if note.startswith("Not expressible"))


# The drafters whose every engine's settings the test below pins; another (a new drafter) is checked against its
# declaration (engine/config/drafter_specs.py) by `declared_settings_are_served`.
PINNED = ("model", "heuristic", "confidence", "prompt-lookup", "suffix", "eagle3")


def declared_settings_are_served(doc: dict, drafter: str) -> None:
    """Each engine serves what the drafter's declaration maps it to: an engine that cannot run it has no command and
    says why (its notes), one that can carries every setting its declaration names; every declared note is said."""
    spec = SPECS[drafter.split(":")[0]]
    param = parse_drafter(drafter)[1]
    for engine, serving in spec.serving.items():
        served = doc[engine]
        assert all(note in served["notes"] for note in serving.texts(param, 4)), engine
        if serving.how is None:
            assert not served.get("command") and inexpressible(served), engine
            continue
        declared = serving.settings(param, 4)
        text = json.dumps(served)
        assert all(str(key) in text for key in (declared if isinstance(declared, dict) else dict(declared))), engine


@pytest.mark.parametrize("sampling", [{}, SAMPLING], ids=["greedy", "sampling"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_engine_parses_back(drafter, sampling):
    doc = settings(drafter, **sampling)
    assert set(doc) == {"vllm", "sglang", "llama_cpp", "transformers"}
    name = drafter.split(":")[0]
    greedy = not sampling
    json.dumps(doc, allow_nan=False)  # strict JSON all the way down
    for engine in doc.values():
        assert engine["notes"] and all(isinstance(n, str) and n for n in engine["notes"])
    declared_settings_are_served(doc, drafter)
    if name not in PINNED:
        return
    if name == "suffix":  # vLLM runs suffix decoding; the other engines have none and say so, with no command
        assert json.loads(doc["vllm"]["speculative_config"]) == {
            "method": "suffix",
            "num_speculative_tokens": 4,
            "suffix_decoding_max_tree_depth": 24,
        }
        assert "arctic-inference" in " ".join(doc["vllm"]["notes"]) and inexpressible(doc["vllm"]) == ""
        for engine in ("sglang", "llama_cpp", "transformers"):
            assert doc[engine]["command"] == "" and "no suffix decoding" in inexpressible(doc[engine])
            assert doc[engine]["snippet"].startswith("# Not expressible")
        return
    if (
        name == "eagle3"
    ):  # vLLM serves the head directory as is; SGLang its SGLang copy, written first; the others cannot
        expected = {"method": "eagle3", "model": "org/draft 0.5B", "num_speculative_tokens": 4}
        spec = json.loads(flags(doc["vllm"], 3)["--speculative-config"])
        assert spec == (expected if greedy else {**expected, "draft_sample_method": "probabilistic"})
        assert "prepare" not in doc["vllm"] and "input of decoder layer i" in " ".join(doc["vllm"]["notes"])
        sglang = flags(doc["sglang"], 3)
        assert {key: sglang[key] for key in sglang if key != "--model-path"} == {
            "--speculative-algorithm": "EAGLE3",
            "--speculative-draft-model-path": "org/draft 0.5B/sglang",
            "--speculative-num-steps": "4",
            "--speculative-eagle-topk": "1",
            "--speculative-num-draft-tokens": "5",
            **({} if greedy else {"--speculative-use-rejection-sampling": None}),
        }
        assert doc["sglang"]["prepare"] == (
            "draftlab convert-head 'org/draft 0.5B' --to sglang --out 'org/draft 0.5B/sglang'"
        )
        notes = " ".join(doc["sglang"]["notes"])
        assert "one LOWER than vLLM's" in notes and "output of decoder layer j" in notes
        assert "STANDALONE" not in notes
        for engine in ("llama_cpp", "transformers"):
            assert doc[engine]["command"] == "" and "EAGLE-3 head" in inexpressible(doc[engine])
        return

    # vLLM: the --speculative-config JSON and the request's sampling fields
    vllm = doc["vllm"]
    head = flags(vllm, 3)
    assert shlex.split(vllm["command"])[:3] == ["vllm", "serve", "org/target-8B"]
    spec = json.loads(head["--speculative-config"])
    assert spec == json.loads(vllm["speculative_config"])
    if name == "prompt-lookup":
        assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    else:
        expected = {"method": "draft_model", "model": "org/draft 0.5B", "num_speculative_tokens": 4}
        assert spec == (expected if greedy else {**expected, "draft_sample_method": "probabilistic"})
    request = vllm["request"]
    assert request["temperature"] == (0.0 if greedy else 0.7) and "max_tokens" not in request  # a test's budget
    if not greedy:
        assert (request["top_k"], request["top_p"], request["min_p"], request["seed"]) == (20, 0.9, 0.0, 11)

    # SGLang: STANDALONE chain of k drafts (num-draft-tokens counts the root) or NGRAM
    sglang = flags(doc["sglang"], 3)
    assert sglang["--model-path"] == "org/target-8B"
    if name == "prompt-lookup":
        assert sglang == {
            "--model-path": "org/target-8B",
            "--speculative-algorithm": "NGRAM",
            "--speculative-num-draft-tokens": "5",
            "--speculative-ngram-max-bfs-breadth": "1",
        }
    else:
        assert {key: sglang[key] for key in sglang if key != "--model-path"} == {
            "--speculative-algorithm": "STANDALONE",
            "--speculative-draft-model-path": "org/draft 0.5B",
            "--speculative-num-steps": "4",
            "--speculative-eagle-topk": "1",
            "--speculative-num-draft-tokens": "5",
        }
    assert "--speculative-use-rejection-sampling" not in sglang  # EAGLE/EAGLE3 only

    # llama.cpp: llama-server with a draft model or an n-gram spec type; sampling made explicit
    llama = flags(doc["llama_cpp"], 1)
    assert llama["-m"] == "target-8B.gguf"
    if name == "prompt-lookup":
        assert "-md" not in llama and "--draft-p-min" not in llama
        assert (
            llama["--spec-type"],
            llama["--spec-ngram-size-n"],
            llama["--spec-ngram-size-m"],
            llama["--draft-max"],
        ) == ("ngram-simple", "3", "4", "4")
    else:
        assert (llama["-md"], llama["--draft-max"], llama["--draft-min"]) == ("draft 0.5B.gguf", "4", "0")
        assert float(llama["--draft-p-min"]) == (float(drafter.split(":")[1]) if name == "confidence" else 0.0)
    if greedy:
        assert float(llama["--temp"]) == 0.0
    else:
        assert {key: float(llama[key]) for key in ("--temp", "--top-k", "--top-p", "--min-p", "--seed")} == {
            "--temp": 0.7,
            "--top-k": 20,
            "--top-p": 0.9,
            "--min-p": 0.0,
            "--seed": 11,
        }

    # transformers: the snippet compiles; generate()'s arguments and the draft's generation_config read back
    tf = doc["transformers"]
    kwargs, assigned = generate_call(tf["snippet"])
    assert {key: value for key, value in kwargs.items() if key != "assistant_model"} == tf["generate_kwargs"]
    assert "max_new_tokens" not in kwargs  # the test's budget is not a serving length
    if greedy:
        assert kwargs["do_sample"] is False and "temperature" not in kwargs
    else:
        assert (kwargs["do_sample"], kwargs["temperature"], kwargs["top_k"], kwargs["top_p"]) == (True, 0.7, 20, 0.9)
    if name == "prompt-lookup":
        assert "assistant_model" not in kwargs and assigned == {}
        assert (kwargs["prompt_lookup_num_tokens"], kwargs["max_matching_ngram_size"]) == (4, 3)
    else:
        assert kwargs["assistant_model"] == "draft"
        assert "num_assistant_tokens" not in kwargs  # generate() ignores it: it belongs on the draft's config
        assert (
            assigned
            == tf["assistant_generation_config"]
            == {
                "num_assistant_tokens": 4,
                "num_assistant_tokens_schedule": "heuristic_transient" if name == "heuristic" else "constant",
                "assistant_confidence_threshold": float(drafter.split(":")[1]) if name == "confidence" else 0.0,
            }
        )

    # what each engine cannot express is said, not invented
    assert inexpressible(doc["transformers"]) == ""
    if name == "model":
        assert all(inexpressible(engine) == "" for engine in doc.values())
    if name == "heuristic":
        for engine in ("vllm", "sglang", "llama_cpp"):
            assert "starting k=4" in inexpressible(doc[engine])
    if name == "confidence":
        assert "confidence" in inexpressible(doc["vllm"]) and "confidence" in inexpressible(doc["sglang"])
        assert inexpressible(doc["llama_cpp"]) == ""  # --draft-p-min expresses it (with a caveat note)
        assert any("drops that last draft" in note for note in doc["llama_cpp"]["notes"])
    if name == "prompt-lookup":
        assert "N=3" in inexpressible(doc["sglang"])
        assert inexpressible(doc["vllm"]) == "" and inexpressible(doc["llama_cpp"]) == ""


def test_a_run_without_a_drafter_is_a_constant_k_draft_model_run():
    for missing in ({}, {"drafter": None}, {"drafter": ""}, {"drafter": float("nan")}, {"drafter": pd.NA}):
        run = {"run_id": 1, "k": 3, **missing}
        assert configuration(run, EXPERIMENT)["drafter"] == "model"
        assert json.loads(deploy_settings(run, EXPERIMENT)["vllm"]["speculative_config"])["method"] == "draft_model"
    # the run's own draft and drafter win over the experiment's (draft and drafter sweeps store one per run)
    cfg = configuration({"run_id": 1, "k": 2, "draft": "org/other", "drafter": "confidence:0.50"}, EXPERIMENT)
    assert (cfg["draft"], cfg["drafter"]) == ("org/other", "confidence:0.5")
    assert configuration({"run_id": 1, "k": 2}, {**EXPERIMENT, "drafter": "heuristic"})["drafter"] == "heuristic"


def test_bad_input_says_why():
    with pytest.raises(DeployError, match="baseline"):
        configuration({"run_id": 1, "k": None}, EXPERIMENT)
    for spec in ("eagle", "confidence:1.5", "confidence", "prompt-lookup:0", "model:2"):
        with pytest.raises(DeployError):
            parse_drafter(spec)
    with pytest.raises(DeployError, match="draft model"):
        configuration({"run_id": 1, "k": 2, "draft": None}, {**EXPERIMENT, "draft": ""})
    lookup = {"run_id": 1, "k": 2, "drafter": "prompt-lookup:2"}
    assert configuration(lookup, {**EXPERIMENT, "draft": ""})["draft"] is None  # no draft model needed
    assert parse_drafter("prompt-lookup:3") == ("prompt-lookup", 3)


def test_dtype_remote_code_and_demo_models_reach_every_engine():
    from engine.zoo import resolve

    experiment = {
        **EXPERIMENT,
        "target": "demo-target",
        "draft": "demo-draft",
        "dtype": "bfloat16",
        "trust_remote_code": True,
    }
    doc = deploy_settings({"run_id": 1, "k": 2}, experiment)
    target = str(resolve("demo-target") or "demo-target")
    vllm, sglang = flags(doc["vllm"], 3), flags(doc["sglang"], 3)
    assert shlex.split(doc["vllm"]["command"])[2] == target and sglang["--model-path"] == target
    for engine in (vllm, sglang):
        assert engine["--dtype"] == "bfloat16" and "--trust-remote-code" in engine
    assert flags(doc["llama_cpp"], 1)["-md"] == "demo-draft.gguf"
    generate_call(doc["transformers"]["snippet"])
    snippet = doc["transformers"]["snippet"]
    assert "trust_remote_code=True" in snippet and "dtype='bfloat16'" in snippet


# --- a stored experiment, through the CLI ----------------------------------------------------------------------


def _export(db_url, capsys, *argv) -> tuple[int, str, str]:
    from app.cli import main

    code = main(["export", *argv, "--db", db_url])
    out, err = capsys.readouterr()
    return code, out, err


def test_export_deploy_prints_the_document_of_the_best_run(store, db_url, capsys, tmp_path):
    eid, ids, _ = fill_experiment(store, ks=(2, 4), prompts=3)  # both lossless: the other is named below
    with store.write() as conn:  # k = 4 measurably faster than the target alone, k = 2 not: the one rule serves k = 4
        for k, (s, lo, hi) in ((2, (1.05, 0.9, 1.2)), (4, (1.4, 1.3, 1.5))):
            conn.execute(
                text(
                    "UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi, "
                    "timing_warning = NULL WHERE id = :r"
                ),
                {"s": s, "lo": lo, "hi": hi, "r": ids[("speculative", k)]},
            )
    verdict = verdict_dict(store, eid)
    assert verdict["best"] == 4
    best_run = ids[("speculative", verdict["best"])]

    code, out, err = _export(db_url, capsys, str(eid), "--format", "deploy")
    assert code == 0, err
    doc = json.loads(out)
    assert doc == json.loads(json.dumps(deploy_document(store, eid)))
    assert (doc["run_id"], doc["chosen"], doc["configuration"]["k"]) == (best_run, "best", verdict["best"])
    assert doc["measured"]["speedup"] == pytest.approx(verdict["speedup"])
    assert set(doc["engines"]) == {"vllm", "sglang", "llama_cpp", "transformers"}
    spec = json.loads(doc["engines"]["vllm"]["speculative_config"])
    assert spec == {"method": "draft_model", "model": "drf", "num_speculative_tokens": verdict["best"]}

    other = ids[("speculative", 2 if verdict["best"] == 4 else 4)]
    code, out, err = _export(
        db_url, capsys, str(eid), "--format", "deploy", "--run", str(other), "--out", str(tmp_path / "deploy.json")
    )
    assert code == 0 and out.strip() == str(tmp_path / "deploy.json")
    doc = json.loads((tmp_path / "deploy.json").read_text())
    assert (doc["run_id"], doc["chosen"]) == (other, "given")
    assert doc == json.loads(json.dumps(deploy_document(store, eid, other)))


def _speedups(store, ids, by_k: dict) -> None:
    with store.write() as conn:
        for k, (s, lo, hi) in by_k.items():
            conn.execute(
                text(
                    "UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi, "
                    "timing_warning = NULL WHERE id = :r"
                ),
                {"s": s, "lo": lo, "hi": hi, "r": ids[("speculative", k)]},
            )


def test_a_run_that_is_not_lossless_is_never_chosen_deployed_or_confirmed(store, db_url, capsys):
    """One check on every path (issue 35 item 6): a greedy run stored as done whose outputs differ from its
    baseline's is measured fastest, yet the verdict (and so the listing), `export --format deploy` without --run,
    `confirm --configs chosen` and `--configs all` pass it over, and naming it with --run is one line saying why."""
    from app.serving.confirm import configurations
    from engine.errors import DraftLabError
    from storage.analysis import catalog
    from storage.analysis.verdict import verdict
    from storage.db.errors import QueueError
    from storage.serving.confirm_jobs import check_configurations

    eid, ids, _ = fill_experiment(store, ks=(2, 4), prompts=3, same_outputs_for=2)  # k = 4 is not lossless
    lossless, lossy = ids[("speculative", 2)], ids[("speculative", 4)]
    _speedups(store, ids, {2: (1.4, 1.3, 1.5), 4: (1.9, 1.8, 2.0)})
    runs = q.runs(store, eid).set_index("run_id")
    assert runs.loc[lossy, "status"] == "done" and runs.loc[lossy, "outputs_match_baseline"] is False
    v = verdict(store, eid)
    assert [c.run_id for c in v.candidates] == [lossless] and v.chosen.run_id == lossless
    assert f"run {lossy} (k = 4) is not lossless" in v.text
    assert catalog.experiments(store).set_index("experiment_id").loc[eid, "best_value"] == 2

    code, out, err = _export(db_url, capsys, str(eid), "--format", "deploy")
    assert code == 0, err
    assert json.loads(out)["run_id"] == lossless
    code, out, err = _export(db_url, capsys, str(eid), "--format", "deploy", "--run", str(lossy))
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error:") and f"run {lossy} is not lossless" in line
    assert [c.run_id for c in configurations(store, eid, "chosen")] == [lossless]
    assert [c.run_id for c in configurations(store, eid, "all")] == [lossless]

    with store.write() as conn:  # now k = 2 parts from the baseline too: nothing is left to serve
        conn.execute(
            text("UPDATE prompt_results SET output_ids = '[1]' WHERE run_id = :r AND prompt_index = 0"), {"r": lossless}
        )
    assert verdict(store, eid).chosen is None and "are not lossless" in verdict(store, eid).text
    with pytest.raises(DeployError, match="not lossless"):
        deploy_document(store, eid)
    for which in ("chosen", "all"):
        with pytest.raises(DraftLabError, match="lossless"):
            configurations(store, eid, which)
        with pytest.raises(QueueError, match="lossless"):
            check_configurations(store, eid, which)


@pytest.mark.parametrize("status", ["interrupted", "failed", "cancelled", "running", "queued"])
def test_deploying_a_run_that_did_not_finish_is_refused_in_one_line(store, db_url, capsys, status):
    """Issue 35 item 8: `export --format deploy --run` of an interrupted or failed run exited 0 without a word."""
    eid, ids, _ = fill_experiment(store, ks=(2, 4), prompts=3)
    rid = ids[("speculative", 4)]
    with store.write() as conn:
        conn.execute(
            text("UPDATE runs SET status = :s, error = :e WHERE id = :r"),
            {"s": status, "e": "boom" if status == "failed" else None, "r": rid},
        )
    code, out, err = _export(db_url, capsys, str(eid), "--format", "deploy", "--run", str(rid))
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("error:") and f"run {rid} " in line and status in line and "finished run" in line
    assert ("boom" in line) == (status == "failed")
    assert (f"draftlab resume {eid}" in line) == (status in ("interrupted", "cancelled"))


def test_export_deploy_reads_a_stored_drafter_and_refuses_what_it_cannot_carry(store, db_url, capsys):
    eid, ids, _ = fill_experiment(store, ks=(2, 4), prompts=3, same_outputs_for=4)
    run = ids[("speculative", 4)]
    has_drafter = "drafter" in {c["name"] for c in inspect(store.engine).get_columns("runs")}
    if has_drafter:  # schemas that store a drafter per run: the run's spec is carried
        with store.write() as conn:
            conn.execute(text("UPDATE runs SET drafter = 'prompt-lookup:3' WHERE id = :rid"), {"rid": run})
    code, out, err = _export(db_url, capsys, str(eid), "--format", "deploy", "--run", str(run))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["configuration"]["drafter"] == ("prompt-lookup:3" if has_drafter else "model")
    method = json.loads(doc["engines"]["vllm"]["speculative_config"])["method"]
    assert method == ("ngram" if has_drafter else "draft_model")

    for argv, says in (
        (["--run", str(ids[("baseline", None)])], "baseline"),
        (["--run", "999999"], "not a run"),
        ([], None),
    ):
        if not argv:  # no finished run to crown: a clear error, not a traceback
            with store.write() as conn:
                conn.execute(
                    text("UPDATE runs SET timing_warning = 'x' WHERE experiment_id = :eid AND kind = 'speculative'"),
                    {"eid": eid},
                )
            says = "--run RUN_ID"
        code, out, err = _export(db_url, capsys, str(eid), "--format", "deploy", *argv)
        assert code == 2 and out == "" and err.startswith("error: ") and says in err and err.count("\n") == 1, err
    code, out, err = _export(db_url, capsys, "424242", "--format", "deploy")
    assert code == 2 and "no experiment 424242" in err
    code, out, err = _export(db_url, capsys, str(eid), "--format", "json", "--run", str(run))
    assert code == 2 and "--format deploy" in err


def test_deploy_panel_draws_one_tab_per_engine(tmp_path):
    from streamlit.testing.v1 import AppTest

    from storage import open_store

    url = f"sqlite:///{tmp_path / 'panel.db'}"
    store = open_store(url)
    eid, _, _ = fill_experiment(store, ks=(2, 4), prompts=3)
    expected = deploy_document(store, eid)
    store.dispose()

    def script(url, eid):
        from pages.panels.deploy_panel import render_deploy_panel
        from storage import open_store

        render_deploy_panel(open_store(url), eid, None, expanded=True)
        render_deploy_panel(open_store(url), 424242)

    at = AppTest.from_function(script, args=(url, eid), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert [tab.label for tab in at.tabs] == ["vLLM", "SGLang", "llama.cpp", "transformers"]
    codes = [c.value.strip() for c in at.code]
    for key in ("vllm", "sglang", "llama_cpp", "transformers"):
        assert expected["engines"][key]["snippet"].strip() in codes
    captions = " ".join(c.value for c in at.caption)
    assert f"#{expected['run_id']}" in captions and "No settings to carry to production yet" in captions
    for note in expected["engines"]["llama_cpp"]["notes"]:
        assert note in captions
    assert len(at.get("download_button")) == 1
    assert not math.isnan(expected["measured"]["speedup"])
    assert "no experiment 424242" in captions and f"no experiment {eid}" not in captions


def test_deploy_panel_shows_a_bug_in_the_mapping_as_a_bug_not_as_a_missing_experiment(tmp_path):
    """A KeyError raised inside deploy (a mapping without an engine's entry) is an exception on the page, never
    "no experiment N" (the panel checks that the experiment exists instead of catching KeyError)."""
    from streamlit.testing.v1 import AppTest

    from storage import open_store

    url = f"sqlite:///{tmp_path / 'panel.db'}"
    store = open_store(url)
    eid, _, _ = fill_experiment(store, ks=(2, 4), prompts=3)
    store.dispose()

    def script(url, eid):
        import storage.serving.deploy as deploy
        from pages.panels.deploy_panel import render_deploy_panel
        from storage import open_store

        original = deploy.configuration

        def broken(*args, **kwargs):
            raise KeyError("vllm")

        deploy.configuration = broken
        try:
            render_deploy_panel(open_store(url), eid, None, expanded=True)
        finally:
            deploy.configuration = original

    at = AppTest.from_function(script, args=(url, eid), default_timeout=60).run()
    assert len(at.exception) == 1 and at.exception[0].message == "'vllm'", at.exception  # the KeyError, as raised
    assert not any("no experiment" in c.value for c in at.caption)


@pytest.mark.parametrize("drafter", ["confidence:0.4", "prompt-lookup:3"])
def test_the_transformers_snippet_runs_on_the_demo_pair(drafter, monkeypatch, capsys):
    """The snippet is executable as printed, and the draft's k / schedule / threshold reach transformers'
    candidate generator (which reads them from the draft's generation_config)."""
    pytest.importorskip("torch")
    from transformers.generation import candidate_generator as cg

    from engine.zoo import resolve

    if resolve("demo-target") is None or resolve("demo-draft") is None:
        pytest.skip("the demo models are not built in this checkout")
    seen = []
    original = cg.AssistedCandidateGenerator.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(
            (
                self.num_assistant_tokens,
                self.assistant_generation_config.num_assistant_tokens_schedule,
                self.assistant_confidence_threshold,
            )
        )

    monkeypatch.setattr(cg.AssistedCandidateGenerator, "__init__", spy)
    experiment = {"target": "demo-target", "draft": "demo-draft", "max_new_tokens": 12}
    snippet = deploy_settings({"run_id": 1, "k": 3, "drafter": drafter}, experiment)["transformers"]["snippet"]
    exec(compile(snippet, "<deploy snippet>", "exec"), {})
    assert capsys.readouterr().out.strip()  # it printed a continuation
    assert seen == ([(3, "constant", 0.4)] if drafter.startswith("confidence") else [])


def test_draft_sampling_reaches_vllm_and_transformers_says_what_it_cannot():
    """--draft-sampling greedy is vLLM's draft_sample_method "greedy"; probabilistic its "probabilistic";
    transformers (which samples the assistant's drafts) says it cannot express greedy drafts."""
    from storage.serving.deploy import deploy_settings

    experiment = {"target": "demo-target", "draft": "demo-draft", "drafter": "model", "dtype": "auto"}
    base = {
        "run_id": 1,
        "k": 3,
        "temperature": 0.8,
        "top_k": 0,
        "top_p": 1.0,
        "seed": 0,
        "max_new_tokens": 64,
        "drafter": "model",
        "draft": "demo-draft",
    }
    greedy = deploy_settings({**base, "draft_sampling": "greedy"}, experiment)
    assert json.loads(greedy["vllm"]["speculative_config"])["draft_sample_method"] == "greedy"
    assert any("Not expressible" in n and "--draft-sampling greedy" in n for n in greedy["transformers"]["notes"])
    sampled = deploy_settings({**base, "draft_sampling": "probabilistic"}, experiment)
    assert json.loads(sampled["vllm"]["speculative_config"])["draft_sample_method"] == "probabilistic"
    assert not any("--draft-sampling greedy)" in n for n in sampled["transformers"]["notes"])


def test_a_deployed_run_not_faster_than_the_target_says_so():
    """The caveats name a run measured slower than the target alone (interval below 1) and one whose interval
    includes 1; a clear speedup gets neither sentence."""
    from types import SimpleNamespace

    from storage.serving.deploy import caveats

    v = SimpleNamespace(
        best=SimpleNamespace(value=2, speedup=0.9, ci=(0.8, 0.95)),
        chosen=None,
        cheaper=None,
        tied=[],
        too_wide=False,
        variable="k",
        show=str,
        text="",
    )
    slower = caveats(v, 1, (0.9, 0.8, 0.95))
    assert any(not meaning.missing(c, "slower", "0.90×, 0.80–0.95") for c in slower), slower
    unsure = caveats(v, 1, (0.94, 0.67, 1.42))
    assert any(not meaning.missing(c, "not measured faster", "0.94×, 0.67–1.42", "includes 1×") for c in unsure), unsure
    clear = caveats(v, 1, (1.4, 1.3, 1.5))
    assert not any("target alone" in c for c in clear)


def test_every_drafter_declares_its_mapping_on_every_engine():
    """Deploy assembles each tab from the drafter's declaration (engine/config/drafter_specs.py), never from its name: a
    drafter without a mapping for an engine is caught here, before anyone exports it as a draft-model run."""
    from storage.serving.deploy import ENGINES

    for name, spec in SPECS.items():
        assert set(spec.serving) == set(ENGINES), name
        for engine, serving in spec.serving.items():
            assert serving.how is not None or serving.notes[0].startswith("Not expressible"), (name, engine)


def test_eagle3_tabs_serve_the_head_in_the_layout_each_engine_loads(tmp_path, capsys):
    """A speculators head: vLLM serves it as it is, SGLang its `sglang` copy once `draftlab convert-head` (the
    command the tab shows) wrote it, ids one lower there. A SpecForge head in SGLang's layout: SGLang serves it as
    it is, vLLM a speculators copy. A grid: vLLM carries the schedule, SGLang the named batch size's k."""
    from app.cli import main
    from engine.config.head_format import head_spec, sglang_dir
    from tests import tiny_models as tm
    from tests.test_head_layouts import speculators_head

    target = tm.llama(0, layers=4, vocab=16, sharpness=4.0, eos=None)
    head = str(speculators_head(tmp_path / "head", target))
    doc = settings("eagle3", k=3, draft=head)
    assert json.loads(doc["vllm"]["speculative_config"]) == {
        "method": "eagle3",
        "model": head,
        "num_speculative_tokens": 3,
    }
    prepare = doc["sglang"]["prepare"]
    assert shlex.split(prepare) == ["draftlab", "convert-head", head, "--to", "sglang", "--out", f"{head}/sglang"]
    assert any(prepare in note for note in doc["sglang"]["notes"])
    assert main(shlex.split(prepare)[1:]) == 0
    capsys.readouterr()
    doc = settings("eagle3", k=3, draft=head)
    assert "prepare" not in doc["sglang"] and doc["sglang"]["snippet"].startswith("python -m sglang.launch_server")
    served = flags(doc["sglang"], 3)["--speculative-draft-model-path"]
    assert served == str(sglang_dir(head)) and head_spec(served).layout == "sglang"
    assert json.loads((sglang_dir(head) / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"
    ] == [0, 1, 2]  # the speculators head reads 1, 2, 3
    assert flags(doc["sglang"], 3)["--speculative-num-steps"] == "3"

    from tests.test_head_layouts import specforge_head

    specforge = str(specforge_head(tmp_path / "specforge", target, [0, 1, 2]))
    doc = settings("eagle3", k=2, draft=specforge)
    assert flags(doc["sglang"], 3)["--speculative-draft-model-path"] == specforge and "prepare" not in doc["sglang"]
    assert json.loads(doc["vllm"]["speculative_config"])["model"] == f"{specforge}/speculators"
    assert shlex.split(doc["vllm"]["prepare"])[2:] == [
        specforge,
        "--to",
        "speculators",
        "--out",
        f"{specforge}/speculators",
    ]

    grid = {
        "num_speculative_tokens_per_batch_size": [[1, 3, 2], [4, 256, 4]],
        "steps": [{"batch_size": 1, "k": 2}, {"batch_size": 4, "k": 4}],
    }
    doc = deploy_settings(
        {"run_id": 3, "k": 4, "drafter": "eagle3", "draft": head}, EXPERIMENT, schedule=grid, for_batch=4
    )
    spec = json.loads(doc["vllm"]["speculative_config"])
    assert (spec["method"], spec["model"], spec["num_speculative_tokens"]) == ("eagle3", head, 4)
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 3, 2], [4, 256, 4]]
    sglang = flags(doc["sglang"], 3)
    assert (sglang["--speculative-num-steps"], sglang["--speculative-num-draft-tokens"]) == ("4", "5")
    assert "schedule's entry for batch 4" in inexpressible(doc["sglang"])


def test_a_draft_of_another_vocabulary_maps_to_each_engine():
    """vocab "intersection": vLLM's use_heterogeneous_vocab with method draft_model and greedy drafts (vLLM refuses
    probabilistic ones with it), transformers' assistant_tokenizer (text re-tokenized when greedy: said), SGLang and
    llama.cpp say they do not draft over the intersection; a shared run carries none of it."""
    experiment = {"target": "demo-target", "draft": "demo-draft-othervocab", "drafter": "model", "dtype": "auto"}
    base = {"run_id": 1, "k": 3, "drafter": "model", "draft": "demo-draft-othervocab", "vocab": "intersection"}
    sampled = {**base, "temperature": 0.8, "top_k": 0, "top_p": 1.0, "seed": 0, "draft_sampling": "probabilistic"}
    doc = deploy_settings({**sampled, "vocab_coverage": 0.49}, experiment)
    spec = json.loads(doc["vllm"]["speculative_config"])
    assert spec["use_heterogeneous_vocab"] is True and spec["method"] == "draft_model"
    assert spec["draft_sample_method"] == "greedy"
    assert any(not meaning.missing(n, "greedy draft sampling", "--draft-sampling greedy") for n in doc["vllm"]["notes"])
    assert any("49.0%" in n for n in doc["vllm"]["notes"])
    assert "assistant_tokenizer=assistant_tokenizer" in doc["transformers"]["snippet"]
    assert "tokenizer=tokenizer" in doc["transformers"]["snippet"]
    assert any("UniversalSpeculativeDecodingGenerator" in n for n in doc["transformers"]["notes"])
    greedy = deploy_settings(base, experiment)
    assert any(not meaning.missing(n, "text", "re-tokenizes") for n in greedy["transformers"]["notes"])
    assert any("vocabulary" in n for n in greedy["sglang"]["notes"])
    assert any(not meaning.missing(n, "llama.cpp", "text") for n in greedy["llama_cpp"]["notes"])
    shared = deploy_settings({**base, "vocab": "shared"}, experiment)
    assert "use_heterogeneous_vocab" not in json.loads(shared["vllm"]["speculative_config"])
    assert "assistant_tokenizer" not in shared["transformers"]["snippet"]
