"""Bad input ends in exactly one `error:` line naming the problem and the fix, exit 2, and stores nothing."""
import json

import pytest
import torch

from app.cli import main
from engine.errors import DraftLabError
from engine.loading import check_pair, load_model
from tests import tiny_models as tm


@pytest.fixture
def run_cli(model_dirs, tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'cli.db'}"

    def run(*extra, target=None, draft=None, prompts=None):
        if prompts is None:
            prompts = tmp_path / "prompts.txt"
            prompts.write_text("t3 t4 t5\nt9 t10\n")
        argv = ["run", "--target", target or model_dirs["target"], "--draft", draft or model_dirs["draft"],
                "--prompts", str(prompts), "--max-new-tokens", "8", "--db", db, *extra]
        code = main(argv)
        out, err = capsys.readouterr()
        return code, out, err
    run.db = db
    return run


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize("args, needle", [
    (("--k", "0"), "k value '0' is not a whole number from 1 to 64"),
    (("--k", "2,-1"), "k value '-1' is not a whole number from 1 to 64"),
    (("--k", "two"), "k value 'two' is not a whole number"),
    (("--k", "４"), "k value '４' is not a whole number"),
    (("--temperature", "-0.5"), "temperature value '-0.5' is not a number from 0"),
    (("--temperature", "nan"), "temperature value 'nan' is not a number"),
    (("--top-p", "0"), "top_p value '0' is not a number in (0, 1]"),
    (("--max-new-tokens", "0"), "max-new-tokens must be > 0"),
    (("--device", "tpu"), "invalid choice"),
])
def test_bad_sampling_and_k_values(run_cli, args, needle):
    code, out, err = run_cli(*args)
    assert code == 2 and out == ""
    assert needle in _one_error_line(err)


def test_unknown_model_path_is_named(run_cli, tmp_path):
    missing = str(tmp_path / "no" / "such-model")
    code, _, err = run_cli(target=missing)
    assert code == 2
    line = _one_error_line(err)
    assert missing in line and "not found" in line


def test_unknown_hub_id_fails_fast_offline(run_cli):
    code, _, err = run_cli(draft="draftlab-nonexistent/model-xyz")
    assert code == 2 and "draftlab-nonexistent/model-xyz" in _one_error_line(err)


def test_mismatched_tokenizers_say_how_many_ids_differ(run_cli, model_dirs):
    code, _, err = run_cli(draft=model_dirs["alien"])
    line = _one_error_line(err)
    assert code == 2 and "disagree on 64 of 64 token ids" in line and "'t0' vs 'w0'" in line


def test_malformed_prompt_file_names_file_and_line(run_cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "t3 t4"}\n{"text": "no prompt field"}\n')
    code, _, err = run_cli(prompts=bad)
    line = _one_error_line(err)
    assert code == 2 and "bad.jsonl" in line and "2" in line and "prompt" in line


def test_bad_input_stores_nothing_and_keeps_what_was_stored(run_cli):
    code, out, _ = run_cli("--k", "2", "--json")
    assert code == 0
    first = json.loads(out)
    assert run_cli("--k", "0")[0] == 2
    assert run_cli(target="/nonexistent/model")[0] == 2
    code, out, _ = run_cli("--k", "2", "--json")
    second = json.loads(out)
    assert second["experiment_id"] == first["experiment_id"] + 1  # the failed invocations stored no experiment
    assert second["runs"][0]["outputs"] == first["runs"][0]["outputs"]  # same seed, same output


def test_padded_embeddings_are_fine_but_a_short_head_is_not():
    tok = tm.tokenizer(64)
    assert check_pair(tok, tm.tokenizer(64), 128, 72) == 64  # padded past the vocabulary: fine
    with pytest.raises(DraftLabError, match="scores 60 tokens but its tokenizer has 64"):
        check_pair(tok, tm.tokenizer(64), 60, 64)


def test_loaded_models_are_in_eval_mode(model_dirs):
    m = load_model(model_dirs["target"], torch.device("cpu"), torch.float32)
    assert not m.model.training


def test_json_document_follows_the_spec(run_cli):
    code, out, err = run_cli("--k", "1,3", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"experiment_id", "baseline", "runs", "repeats", "verdict", "best", "tied_with"}
    assert {"run_id", "new_tokens", "wall_seconds", "tokens_per_second", "target_step_seconds", "outputs"} <= set(doc["baseline"])
    spec_keys = {"run_id", "k", "new_tokens", "wall_seconds", "tokens_per_second", "rounds", "proposed", "accepted",
                 "rejected", "draft_acceptance_rate", "alpha", "tokens_per_round", "expected_alpha",
                 "per_position_acceptance", "acceptance_by_type", "draft_step_seconds", "c", "predicted_speedup",
                 "speedup", "outputs_match_baseline", "outputs", "speedup_ci", "timing_warning", "verify_cost",
                 "predicted_speedup_refined", "sweep_variable", "sweep_value"}
    assert [r["k"] for r in doc["runs"]] == [1, 3]
    for r in doc["runs"]:
        assert spec_keys <= set(r)
        assert r["outputs_match_baseline"] is True  # greedy
        assert len(r["per_position_acceptance"]) == r["k"]
    assert "baseline" in err or "k=" in err  # the progress bar went to stderr


# --- the database named on the command line ------------------------------------------------------------------

def _with_password(url: str) -> tuple[str, str]:
    """`url` with a password in it (trust-auth test servers ignore it), and that password."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    secret = parsed.password or "s3cret"
    return parsed.set(password=secret).render_as_string(hide_password=False), secret


def test_a_database_password_never_appears_in_cli_output(postgres_url, capsys):
    from storage import open_store, run_state
    from storage.experiments import enqueue_experiment

    url, secret = _with_password(postgres_url)
    outputs = []

    def cli(*argv):
        code = main(list(argv))
        out, err = capsys.readouterr()
        outputs.append((argv, code, out + err))
        return code

    cli("list", "--db", url)  # "no experiments in <url>"
    cli("resume", "99", "--db", url)  # "no experiment 99 in <url>"
    cli("export", "99", "--db", url)
    store = open_store(url)
    experiment_id = enqueue_experiment(store, name="pw", target="draftlab-nonexistent/t",
                                             draft="draftlab-nonexistent/d", prompts="tiny", sampling={},
                                             sweep_values=[1], prompt_texts=["t1 t2"])
    run_state.cancel_experiment(store, experiment_id)
    store.dispose()
    assert cli("resume", str(experiment_id), "--db", url) == 0  # the hint names `draftlab worker --db <url>`
    cli("worker", "--until-idle", "--db", url)  # "serving <url>", then the runs fail to load their models
    cli("list", "--db", url)
    cli("list", "--json", "--db", url)
    host = url.split("@", 1)[1].split("/", 1)[0]
    assert cli("ui", "--db", url.replace(f"@{host}/", "@127.0.0.1:1/")) == 2  # unreachable: one error line
    leaks = [(argv[0], text) for argv, _, text in outputs if secret in text]
    assert not leaks, leaks
    assert any("***" in text for _, _, text in outputs)


BAD_DATABASES = {
    "missing directory": "sqlite:////nonexistent-draftlab-dir/sub/draftlab.db",
    "unreachable server": "postgresql://postgres:s3cret@127.0.0.1:1/test",
    "not a URL": "not-a-database-url",
}


@pytest.mark.parametrize("command", [["list"], ["list", "--json"], ["export", "1"], ["resume", "1"],
                                     ["worker", "--until-idle"]], ids=lambda c: " ".join(c))
@pytest.mark.parametrize("db", list(BAD_DATABASES.values()), ids=list(BAD_DATABASES))
def test_a_bad_database_is_one_error_line_naming_it(command, db, capsys):
    from storage.store import safe_url

    code = main([*command, "--db", db])
    out, err = capsys.readouterr()
    assert code == 2, err
    line = _one_error_line(err)
    assert "Traceback" not in err and out == ""
    assert safe_url(db) in line and "--db" in line  # names the database and the fix
    assert "s3cret" not in err


@pytest.fixture
def read_only_db(tmp_path):
    """A database holding one cancelled experiment, and a read-only URL on it (mode=ro: read-only even as root)."""
    from storage import open_store, run_state
    from storage.experiments import enqueue_experiment

    path = tmp_path / "ro.db"
    store = open_store(f"sqlite:///{path}")
    experiment_id = enqueue_experiment(store, name="ro", target="t", draft="d", prompts="tiny", sampling={},
                                             sweep_values=[1], prompt_texts=["t1 t2"])
    run_state.cancel_experiment(store, experiment_id)
    store.dispose()
    return f"sqlite:///file:{path}?mode=ro&uri=true", experiment_id


@pytest.mark.parametrize("command", ["resume", "worker"])
def test_a_read_only_database_fails_before_the_first_write(read_only_db, command, capsys):
    url, experiment_id = read_only_db
    argv = ["resume", str(experiment_id)] if command == "resume" else ["worker", "--until-idle"]
    code = main([*argv, "--db", url])
    out, err = capsys.readouterr()
    assert code == 2, err
    line = _one_error_line(err)
    assert "Traceback" not in err
    assert url in line and "does not accept writes" in line and "--db" in line


def test_reading_commands_work_on_a_read_only_database(read_only_db, capsys, tmp_path):
    url, experiment_id = read_only_db
    assert main(["list", "--db", url]) == 0
    assert "experiment 1" in capsys.readouterr().out
    assert main(["export", str(experiment_id), "--format", "json", "--db", url]) == 0
    assert json.loads(capsys.readouterr().out)


def test_list_shows_an_error_only_for_the_run_that_has_one(tmp_path, capsys):
    from storage import open_store, run_state
    from storage.experiments import enqueue_experiment

    url = f"sqlite:///{tmp_path / 'errors.db'}"
    store = open_store(url)
    experiment_id = enqueue_experiment(store, name="half failed", target="t", draft="d", prompts="tiny",
                                             sampling={}, sweep_values=[1], prompt_texts=["t1 t2"])
    baseline, speculative = sorted(run_state.claim_group(store, experiment_id, "w"))  # the baseline comes first
    run_state.finish_run(store, baseline, "failed", error="boom: out of memory")
    run_state.finish_run(store, speculative, "cancelled")  # the k=1 run: cancelled, no error
    store.dispose()
    assert main(["list", "--db", url]) == 0
    out = capsys.readouterr().out
    run_lines = [line for line in out.splitlines() if line.lstrip().startswith("run ")]
    assert len(run_lines) == 2, out
    assert [("error:" in line) for line in run_lines] == [True, False], out
    assert "error: boom: out of memory" in run_lines[0] and "nan" not in out


@pytest.mark.parametrize("argv", [["list"], ["list", "--json"], ["--help"]], ids=" ".join)
def test_a_closed_pipe_ends_quietly(tmp_path, argv):
    """`draftlab list | head`: the reader is gone before the output is flushed; no BrokenPipeError traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from storage import open_store
    from storage.experiments import enqueue_experiment

    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    store = open_store(url)
    for i in range(3):
        enqueue_experiment(store, name=f"e{i}", target="t", draft="d", prompts="tiny", sampling={},
                                 sweep_values=[1, 2], prompt_texts=["t1 t2"])
    store.dispose()
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `head` that has exited
    root = Path(__file__).resolve().parent.parent
    try:
        command = [sys.executable, "-m", "app.cli", *argv, *(["--db", url] if argv[0] == "list" else [])]
        done = subprocess.run(command, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(root)})
    finally:
        os.close(write_end)
    assert done.stderr == "", done.stderr
    if argv[0] == "list":  # (argparse itself swallows the failed write of --help and exits 0)
        assert done.returncode == 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped


@pytest.mark.parametrize("extra, message", [
    (("--k", "1000"), "not a whole number from 1 to 64"),
    (("--k", "auto:1"), "largest k of at least 2"),
    (("--k", "auto:x"), "auto:8"),
    (("--repeats", "0"), "--repeats must be >= 1"),
])
def test_k_and_repeats_are_checked_before_anything_is_stored(run_cli, extra, message):
    code, out, err = run_cli(*extra)
    assert code == 2 and out == ""
    assert message in _one_error_line(err)
    from storage import open_store, queries as q
    assert q.experiments(open_store(run_cli.db)).empty


def test_worker_log_lines_hide_the_password_in_every_form():
    from app.db_errors import scrub

    url = "postgresql+psycopg://draftlab:p%40ss-w0rd@db.example/lab"
    line = scrub(f"serving {url}; auth failed for password 'p@ss-w0rd' (p%40ss-w0rd)", url)
    assert "p@ss-w0rd" not in line and "p%40ss-w0rd" not in line
    assert "postgresql+psycopg://draftlab:***@db.example/lab" in line


@pytest.mark.parametrize("extra, message", [
    (("--k", "1,2", "--temperature", "0,0.5"), "sweep one variable at a time: --k and --temperature"),
    (("--drafter", "nonsense"), "nonsense"),
    (("--temperature", "0,-1"), "temperature value '-1' is not a number from 0"),
])
def test_sweeps_are_one_variable_at_a_time_and_checked_up_front(run_cli, extra, message):
    code, out, err = run_cli(*extra)
    assert code == 2 and out == "" and message in _one_error_line(err)


def test_a_drafter_sweep_needs_no_draft_for_prompt_lookup_and_compares_strategies(run_cli, model_dirs):
    code, out, err = run_cli("--drafter", "model,heuristic,prompt-lookup:2", "--k", "2", "--json", "--repeats", "1")
    assert code == 0, err
    doc = json.loads(out)
    assert [(r["sweep_variable"], r["sweep_value"], r["drafter"]) for r in doc["runs"]] == [
        ("drafter", "model", "model"), ("drafter", "heuristic", "heuristic"),
        ("drafter", "prompt-lookup:2", "prompt-lookup:2")]
    assert [r["draft"] for r in doc["runs"]] == [model_dirs["draft"], model_dirs["draft"], None]
    assert all(r["outputs_match_baseline"] is True for r in doc["runs"])  # every drafter lossless (greedy)
    code, out, err = run_cli("--drafter", "prompt-lookup:3", "--draft", "", "--json", "--repeats", "1")
    assert code == 2 and "empty value" in _one_error_line(err)


def test_a_draft_sweep_compares_drafts_and_the_target_as_its_own_draft_accepts_everything(run_cli, model_dirs):
    code, out, err = run_cli("--draft", f"{model_dirs['draft']},{model_dirs['target']}", "--k", "3", "--json",
                             "--repeats", "1")
    assert code == 0, err
    doc = json.loads(out)
    by_draft = {r["draft"]: r for r in doc["runs"]}
    assert set(by_draft) == {model_dirs["draft"], model_dirs["target"]}
    assert by_draft[model_dirs["target"]]["alpha"] == 1.0 and by_draft[model_dirs["draft"]]["alpha"] < 1.0
    assert all(r["sweep_variable"] == "draft" and r["outputs_match_baseline"] for r in doc["runs"])
    from storage import open_store, queries as q
    runs = q.runs(open_store(run_cli.db), doc["experiment_id"]).set_index("draft")
    assert runs.loc[model_dirs["target"], "draft_parameters"] > 0  # the cost account: the draft's size ...
    assert runs.loc[model_dirs["target"], "extra_memory_mb"] > 0  # ... and the memory it adds to the baseline's
    code, out, err = run_cli("--draft", f"{model_dirs['draft']},{model_dirs['alien']}")
    assert code == 2 and "tokenizers disagree" in _one_error_line(err)


def test_k_auto_is_for_the_constant_k_drafter(run_cli):
    code, out, err = run_cli("--k", "auto:4", "--drafter", "heuristic")
    assert code == 2 and "--k auto predicts a constant-k curve" in _one_error_line(err)
