"""Bad input ends in exactly one `error:` line naming the problem and the fix, exit 2, and stores nothing."""

import json

import pytest
import torch

from app.cli import main
from engine.errors import DraftLabError
from engine.models.loading import check_pair, load_model
from tests import tiny_models as tm
from tests.meaning import missing


@pytest.fixture
def run_cli(model_dirs, tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'cli.db'}"

    def run(*extra, target=None, draft=None, prompts=None):
        if prompts is None:
            prompts = tmp_path / "prompts.txt"
            prompts.write_text("t3 t4 t5\nt9 t10\n")
        argv = [
            "run",
            "--target",
            target or model_dirs["target"],
            "--draft",
            draft or model_dirs["draft"],
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "8",
            "--db",
            db,
            *extra,
        ]
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


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--k", "0"), "k value '0' is not a whole number from 1 to 64"),
        (("--k", "2,-1"), "k value '-1' is not a whole number from 1 to 64"),
        (("--k", "two"), "k value 'two' is not a whole number"),
        (("--k", "４"), "k value '４' is not a whole number"),
        (("--temperature", "-0.5"), "temperature value '-0.5' is not 0 (greedy) or a number from 0.001 to 100"),
        (("--temperature", "nan"), "temperature value 'nan' is not 0 (greedy) or a number"),
        (("--top-p", "0"), "top_p value '0' is not a number in (0, 1]"),
        (("--max-new-tokens", "0"), "max_new_tokens value '0' is not a whole number from 1 to 4096"),
        (("--device", "tpu"), "invalid choice"),
    ],
)
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
    with pytest.raises(DraftLabError, match=r"scores 60 tokens.*tokenizer has 64"):
        check_pair(tok, tm.tokenizer(64), 60, 64)


def test_loaded_models_are_in_eval_mode(model_dirs):
    m = load_model(model_dirs["target"], torch.device("cpu"), torch.float32)
    assert not m.model.training


def test_json_document_follows_the_spec(run_cli):
    code, out, err = run_cli("--k", "1,3", "--json")
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"experiment_id", "baseline", "runs", "repeats", "verdict", "best", "tied_with"}
    assert {"run_id", "new_tokens", "wall_seconds", "tokens_per_second", "target_step_seconds", "outputs"} <= set(
        doc["baseline"]
    )
    spec_keys = {
        "run_id",
        "k",
        "new_tokens",
        "wall_seconds",
        "tokens_per_second",
        "rounds",
        "proposed",
        "accepted",
        "rejected",
        "draft_acceptance_rate",
        "alpha",
        "tokens_per_round",
        "expected_alpha",
        "per_position_acceptance",
        "acceptance_by_type",
        "draft_step_seconds",
        "c",
        "predicted_speedup",
        "speedup",
        "outputs_match_baseline",
        "outputs",
        "speedup_ci",
        "timing_warning",
        "verify_cost",
        "predicted_speedup_refined",
        "sweep_variable",
        "sweep_value",
    }
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
    from storage import open_store
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment

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
    experiment_id = enqueue_experiment(
        store,
        name="pw",
        target="draftlab-nonexistent/t",
        draft="draftlab-nonexistent/d",
        prompts="tiny",
        sampling={},
        sweep_values=[1],
        prompt_texts=["t1 t2"],
    )
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


@pytest.mark.parametrize(
    "command",
    [["list"], ["list", "--json"], ["export", "1"], ["resume", "1"], ["worker", "--until-idle"]],
    ids=lambda c: " ".join(c),
)
@pytest.mark.parametrize("db", list(BAD_DATABASES.values()), ids=list(BAD_DATABASES))
def test_a_bad_database_is_one_error_line_naming_it(command, db, capsys):
    from storage.db.store import safe_url

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
    from storage import open_store
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment

    path = tmp_path / "ro.db"
    store = open_store(f"sqlite:///{path}")
    experiment_id = enqueue_experiment(
        store, name="ro", target="t", draft="d", prompts="tiny", sampling={}, sweep_values=[1], prompt_texts=["t1 t2"]
    )
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
    from storage import open_store
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment

    url = f"sqlite:///{tmp_path / 'errors.db'}"
    store = open_store(url)
    experiment_id = enqueue_experiment(
        store,
        name="half failed",
        target="t",
        draft="d",
        prompts="tiny",
        sampling={},
        sweep_values=[1],
        prompt_texts=["t1 t2"],
    )
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
    from storage.jobs.experiments import enqueue_experiment

    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    store = open_store(url)
    for i in range(3):
        enqueue_experiment(
            store,
            name=f"e{i}",
            target="t",
            draft="d",
            prompts="tiny",
            sampling={},
            sweep_values=[1, 2],
            prompt_texts=["t1 t2"],
        )
    store.dispose()
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `head` that has exited
    root = Path(__file__).resolve().parent.parent
    try:
        command = [sys.executable, "-m", "app.cli", *argv, *(["--db", url] if argv[0] == "list" else [])]
        done = subprocess.run(
            command,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    finally:
        os.close(write_end)
    assert done.stderr == "", done.stderr
    if argv[0] == "list":  # (argparse itself swallows the failed write of --help and exits 0)
        assert done.returncode == 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--k", "1000"), "not a whole number from 1 to 64"),
        (("--k", "auto:1"), "largest k of at least 2"),
        (("--k", "auto:x"), "auto:8"),
        (("--repeats", "0"), "repeats value '0' is not a whole number from 1 to 100"),
    ],
)
def test_k_and_repeats_are_checked_before_anything_is_stored(run_cli, extra, message):
    code, out, err = run_cli(*extra)
    assert code == 2 and out == ""
    assert message in _one_error_line(err)
    from storage import open_store
    from storage.analysis import catalog

    assert catalog.experiments(open_store(run_cli.db)).empty


def test_worker_log_lines_hide_the_password_in_every_form():
    from app.db_errors import scrub

    url = "postgresql+psycopg://draftlab:p%40ss-w0rd@db.example/lab"
    line = scrub(f"serving {url}; auth failed for password 'p@ss-w0rd' (p%40ss-w0rd)", url)
    assert "p@ss-w0rd" not in line and "p%40ss-w0rd" not in line
    assert "postgresql+psycopg://draftlab:***@db.example/lab" in line


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--k", "1,2", "--temperature", "0,0.5"), "sweep one variable at a time: --k and --temperature"),
        (("--drafter", "nonsense"), "nonsense"),
        (("--temperature", "0,-1"), "temperature value '-1' is not 0 (greedy) or a number from 0.001"),
    ],
)
def test_sweeps_are_one_variable_at_a_time_and_checked_up_front(run_cli, extra, message):
    code, out, err = run_cli(*extra)
    assert code == 2 and out == "" and message in _one_error_line(err)


def test_a_drafter_sweep_needs_no_draft_for_prompt_lookup_and_compares_strategies(run_cli, model_dirs):
    code, out, err = run_cli("--drafter", "model,heuristic,prompt-lookup:2", "--k", "2", "--json", "--repeats", "1")
    assert code == 0, err
    doc = json.loads(out)
    assert [(r["sweep_variable"], r["sweep_value"], r["drafter"]) for r in doc["runs"]] == [
        ("drafter", "model", "model"),
        ("drafter", "heuristic", "heuristic"),
        ("drafter", "prompt-lookup:2", "prompt-lookup:2"),
    ]
    assert [r["draft"] for r in doc["runs"]] == [model_dirs["draft"], model_dirs["draft"], None]
    assert all(r["outputs_match_baseline"] is True for r in doc["runs"])  # every drafter lossless (greedy)
    code, out, err = run_cli("--drafter", "prompt-lookup:3", "--draft", "", "--json", "--repeats", "1")
    assert code == 2 and "empty value" in _one_error_line(err)


def test_a_draft_sweep_compares_drafts_and_the_target_as_its_own_draft_accepts_everything(run_cli, model_dirs):
    code, out, err = run_cli(
        "--draft", f"{model_dirs['draft']},{model_dirs['target']}", "--k", "3", "--json", "--repeats", "1"
    )
    assert code == 0, err
    doc = json.loads(out)
    by_draft = {r["draft"]: r for r in doc["runs"]}
    assert set(by_draft) == {model_dirs["draft"], model_dirs["target"]}
    assert by_draft[model_dirs["target"]]["alpha"] == 1.0 and by_draft[model_dirs["draft"]]["alpha"] < 1.0
    assert all(r["sweep_variable"] == "draft" and r["outputs_match_baseline"] for r in doc["runs"])
    from storage import open_store
    from storage.records import queries as q

    runs = q.runs(open_store(run_cli.db), doc["experiment_id"]).set_index("draft")
    assert runs.loc[model_dirs["target"], "draft_parameters"] > 0  # the cost account: the draft's size ...
    assert runs.loc[model_dirs["target"], "extra_memory_mb"] > 0  # ... and the memory it adds to the baseline's
    code, out, err = run_cli("--draft", f"{model_dirs['draft']},{model_dirs['alien']}")
    assert code == 2 and "tokenizers disagree" in _one_error_line(err)


def test_k_auto_is_for_the_constant_k_drafter(run_cli):
    code, out, err = run_cli("--k", "auto:4", "--drafter", "heuristic")
    assert code == 2 and "--k auto predicts a constant-k curve" in _one_error_line(err)


# --- issue 21: every input checked once, before anything is stored, the same answer on SQLite and PostgreSQL ---


def _experiments(url):
    from storage import open_store
    from storage.analysis import catalog

    store = open_store(url)
    try:
        return len(catalog.experiments(store))
    finally:
        store.dispose()


@pytest.fixture
def run_on(model_dirs, tmp_path, capsys, db_url):
    """`draftlab run` on the tiny pair against `db_url` (SQLite and PostgreSQL)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("t3 t4 t5\nt9 t10\n")

    def run(*extra):
        code = main(
            [
                "run",
                "--target",
                model_dirs["target"],
                "--draft",
                model_dirs["draft"],
                "--prompts",
                str(prompts),
                "--max-new-tokens",
                "4",
                "--repeats",
                "1",
                "--db",
                db_url,
                *extra,
            ]
        )
        out, err = capsys.readouterr()
        return code, out, err

    run.db = db_url
    return run


PROBE_RUN_INPUTS = [  # the probe's tracebacks, half-stored experiments and silently accepted values
    (
        ("--seed", str(10**30)),
        "seed value '1000000000000000000000000000000' is not a whole number from 0 to 2147483647",
    ),
    (("--seed", "-1"), "is not a whole number from 0 to 2147483647"),
    (("--seed", str(2**40)), "is not a whole number from 0 to 2147483647"),
    (("--seed", "３"), "seed value '３' is not a whole number"),
    (("--top-k", str(10**12)), "top_k value '1000000000000' is not a whole number from 0 to 1000000"),
    (("--repeats", str(2**40)), "more than the limit of 100 timed decodes per prompt and configuration"),
    (("--repeats", "1000000000"), "$DRAFTLAB_LIMIT_REPEATS"),
    (("--repeats", "٣"), "repeats value '٣' is not a whole number"),
    (("--max-new-tokens", "1000000"), "$DRAFTLAB_LIMIT_MAX_NEW_TOKENS"),
    (("--name", "n" * 300), "--name is 300 characters, longer than the 200"),
    (("--temperature", "1e-300"), "too small to compute with"),
    (("--temperature", "inf"), "temperature value 'inf' is not"),
    (("--k", ",".join(str(k) for k in range(1, 66))), "DRAFTLAB_LIMIT_SWEPT_VALUES"),
]


@pytest.mark.parametrize(
    "extra, needle", PROBE_RUN_INPUTS, ids=lambda v: " ".join(v)[:40] if isinstance(v, tuple) else None
)
def test_run_refuses_out_of_range_input_in_one_line_on_both_databases(run_on, extra, needle):
    code, out, err = run_on(*extra)
    assert code == 2 and out == "", err
    assert needle in _one_error_line(err) and "Traceback" not in err
    assert _experiments(run_on.db) == 0  # nothing stored, on SQLite as on PostgreSQL


def test_the_documented_bounds_fit_every_database(run_on):
    """The largest seed, top-k, repeats and name the CLI takes are stored as given (PostgreSQL's INTEGER and
    varchar(200) included), and the smallest temperature above 0 samples."""
    code, out, err = run_on(
        "--seed",
        str(2**31 - 1),
        "--top-k",
        str(10**6),
        "--name",
        "n" * 200,
        "--temperature",
        "0.001",
        "--k",
        "2",
        "--json",
    )
    assert code == 0, err
    doc = json.loads(out)
    from storage import open_store
    from storage.records import queries as q

    store = open_store(run_on.db)
    exp = q.experiment(store, doc["experiment_id"])
    store.dispose()
    assert (exp["seed"], exp["top_k"], exp["name"], exp["temperature"]) == (2**31 - 1, 10**6, "n" * 200, 0.001)
    assert all(r["status"] == "done" for r in [doc["baseline"], *doc["runs"]])


def test_limits_are_settable_from_the_environment(run_cli, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_LIMIT_REPEATS", "2")
    monkeypatch.setenv("DRAFTLAB_LIMIT_SWEPT_VALUES", "2")
    code, _, err = run_cli("--repeats", "3")
    assert code == 2 and "more than the limit of 2" in _one_error_line(err)
    code, _, err = run_cli("--k", "1,2,3")
    line = _one_error_line(err)
    assert code == 2 and not missing(line, "limit of 2", "DRAFTLAB_LIMIT_SWEPT_VALUES"), line
    monkeypatch.setenv("DRAFTLAB_LIMIT_REPEATS", "zwei")
    code, _, err = run_cli("--repeats", "1")
    assert code == 2 and not missing(_one_error_line(err), "$DRAFTLAB_LIMIT_REPEATS", "'zwei'"), err
    code, _, err = run_cli()  # the default --repeats: the bad limit is still reported, before anything is stored
    assert code == 2 and not missing(_one_error_line(err), "$DRAFTLAB_LIMIT_REPEATS", "'zwei'"), err
    monkeypatch.delenv("DRAFTLAB_LIMIT_REPEATS")
    assert _experiments(run_cli.db) == 0


BAD_IDS = [str(2**63), str(10**30), "٣", "３", "-1", "0", "1e3"]


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(
    "command",
    [
        ["validate", "{id}"],
        ["export", "{id}"],
        ["resume", "{id}"],
        ["export", "1", "--format", "deploy", "--run", "{id}"],
        [
            "distill",
            "--target",
            "t",
            "--draft",
            "d",
            "--prompts",
            "code",
            "--steps",
            "1",
            "--out",
            "{tmp}/o",
            "--focus-from",
            "{id}",
        ],
    ],
    ids=lambda c: c[0],
)
def test_ids_out_of_range_or_not_ascii_are_one_line(command, bad, db_url, tmp_path, capsys):
    argv = [part.format(id=bad, tmp=tmp_path) for part in command] + ["--db", db_url]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", err
    line = _one_error_line(err)
    assert not missing(line, repr(bad), "an id", "from 1 to 2147483647") and "Traceback" not in err, line
    assert not (tmp_path / "o").exists()  # distill wrote nothing


def test_an_id_past_every_stored_one_is_not_found_on_both_databases(db_url, capsys):
    from storage import open_store

    open_store(db_url).dispose()
    for argv in (["export", str(2**31 - 1)], ["resume", str(2**31 - 1)]):
        assert main([*argv, "--db", db_url]) == 2
        assert "no experiment 2147483647" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_weights_file_is_named_with_the_fix(run_cli, model_dirs, tmp_path, damage):
    import shutil

    broken = tmp_path / f"draft-{damage}"
    shutil.copytree(model_dirs["draft"], broken)
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(b"not a safetensors file" * 4 if damage == "garbage" else data[: len(data) // 2])
    code, out, err = run_cli(draft=str(broken))
    assert code == 2 and out == ""
    line = _one_error_line(err)
    assert str(weights) in line and "corrupt or truncated" in line and "save it again" in line
    assert "Traceback" not in err


@pytest.fixture
def exported(tmp_path):
    """A database with one experiment, and `export` on it."""
    from storage import open_store
    from storage.jobs.experiments import enqueue_experiment

    url = f"sqlite:///{tmp_path / 'x.db'}"
    store = open_store(url)
    experiment_id = enqueue_experiment(
        store, name="x", target="t", draft="d", prompts="tiny", sampling={}, sweep_values=[1], prompt_texts=["t1 t2"]
    )
    store.dispose()
    return url, experiment_id


@pytest.mark.parametrize("fmt", ["json", "deploy"])
def test_export_to_a_file_refuses_a_directory_a_missing_folder_and_an_existing_file(exported, tmp_path, capsys, fmt):
    url, experiment_id = exported

    def export(*extra):
        code = main(["export", str(experiment_id), "--format", fmt, "--db", url, *extra])
        out, err = capsys.readouterr()
        return code, out, err

    for out_arg, words in [(str(tmp_path), "is a directory"), (str(tmp_path / "missing" / "x.json"), "does not exist")]:
        code, out, err = export("--out", out_arg)
        assert code == 2 and out == "" and words in _one_error_line(err) and "Traceback" not in err
    assert not (tmp_path / "missing").exists()
    existing = tmp_path / "kept.json"
    existing.write_text("mine")
    code, out, err = export("--out", str(existing))
    assert code == 2 and "already exists; pass --overwrite" in _one_error_line(err)
    assert existing.read_text() == "mine"
    if fmt == "json":  # (deploy of a never-run experiment has no best run to carry: its own error)
        assert export("--out", str(existing), "--overwrite")[0] == 0
        assert json.loads(existing.read_text())


def test_export_csv_refuses_a_file_as_its_directory_and_keeps_existing_files(exported, tmp_path, capsys):
    url, experiment_id = exported
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert main(["export", str(experiment_id), "--db", url, "--out", str(afile)]) == 2
    assert "is a file" in _one_error_line(capsys.readouterr().err) and afile.read_text() == "mine"
    folder = tmp_path / "new" / "folder"
    assert main(["export", str(experiment_id), "--db", url, "--out", str(folder)]) == 0  # created if missing
    capsys.readouterr()
    runs = folder / f"experiment-{experiment_id}-runs.csv"
    runs.write_text("edited")
    assert main(["export", str(experiment_id), "--db", url, "--out", str(folder)]) == 2
    assert "already exists; pass --overwrite" in _one_error_line(capsys.readouterr().err)
    assert runs.read_text() == "edited"
    assert main(["export", str(experiment_id), "--db", url, "--out", str(folder), "--overwrite"]) == 0
    assert runs.read_text().startswith("run_id")


@pytest.mark.parametrize("port", ["70000", "0", "-1", "８５０１", "http"])
def test_ui_refuses_a_bad_port_before_starting_anything(port, tmp_path, monkeypatch, capsys):
    from app import ui

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started for a bad --port")

    monkeypatch.setattr(ui.subprocess, "Popen", no_process)
    code = main(["ui", "--port", port, "--db", f"sqlite:///{tmp_path / 'ui.db'}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "not a TCP port" in _one_error_line(err)
    # the dashboard's own entry (python -m app.ui, or a caller) checks it too, before the database or a worker
    monkeypatch.setattr(ui, "_needs_worker", no_process)
    assert ui.main(f"sqlite:///{tmp_path / 'ui.db'}", 70000) == 2
    assert "--port 70000 is not a TCP port" in _one_error_line(capsys.readouterr().err)


def _distill(out, *extra):
    """`draftlab distill` whose prompts do not exist: --out is checked first, so a refusal names --out (and should
    the check be missing, the command still ends before training or writing a model)."""
    return main(
        [
            "distill",
            "--target",
            "demo-target",
            "--draft",
            "demo-draft",
            "--prompts",
            "no-such-set",
            "--steps",
            "1",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_distill_refuses_a_non_empty_out_unless_overwrite(tmp_path, capsys):
    from engine.training.distill import check_distill_out

    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _distill(out) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "is not empty (it holds notes.txt)" in line and "--overwrite" in line
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert check_distill_out(out, overwrite=True) == out
    resumable = tmp_path / "resumable"
    (resumable / ".checkpoint").mkdir(parents=True)  # an interrupted run of the same command: continued
    assert check_distill_out(resumable, checkpoint=".checkpoint") == resumable


@pytest.mark.parametrize("overwrite", [False, True])
def test_distill_never_writes_into_a_shipped_model(tmp_path, capsys, overwrite):
    from engine import zoo

    shipped = zoo.ZOO_DIR / "demo-draft"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in shipped.iterdir())
    assert _distill(shipped, *(["--overwrite"] if overwrite else [])) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "shipped models" in line and "--out" in line
    assert sorted((p.name, p.stat().st_mtime_ns) for p in shipped.iterdir()) == before
    assert _distill(zoo.ZOO_DIR / "demo-draft-2", "--overwrite") == 2  # a new folder among them: refused too
    assert not (zoo.ZOO_DIR / "demo-draft-2").exists()


@pytest.mark.parametrize(
    "change, words",
    [
        ({"sampling": {"seed": 2**40}}, "seed 1099511627776 is not a whole number from 0 to 2147483647"),
        ({"sampling": {"top_k": 10**12}}, "top_k"),
        ({"sampling": {"temperature": 1e-300}}, "temperature"),
        ({"sampling": {"temperature": float("nan")}}, "temperature"),
        ({"sampling": {"max_new_tokens": 10**6}}, "4096"),
        ({"repeats": 2**40}, "repeats"),
        ({"name": "n" * 300}, "longer than the 200"),
        ({"sweep_values": list(range(1, 66))}, "swept values"),
        ({"sweep_values": [1, 2**40]}, "k value"),
    ],
)
def test_the_queue_refuses_what_no_database_column_holds(store, change, words):
    """Whoever enqueues (the form, a script), the queue checks the same descriptions before the first INSERT."""
    from storage.analysis import catalog
    from storage.db.errors import QueueError
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q

    kwargs = dict(
        name="x", target="t", draft="d", prompts="tiny", sampling={}, sweep_values=[1], prompt_texts=["t1 t2"]
    )
    with pytest.raises(QueueError, match=words.replace("(", r"\(")):
        enqueue_experiment(store, **{**kwargs, **change})
    assert catalog.experiments(store).empty
    long_target = "t" * 400  # a generated name is cut to the column, not refused
    experiment_id = enqueue_experiment(store, **{**kwargs, "name": None, "target": long_target})
    assert len(q.experiment(store, experiment_id)["name"]) == 200


@pytest.mark.parametrize(
    "change, words",
    [
        ({"seed": 2**40}, "seed 1099511627776 is not a whole number from 0"),
        ({"steps": 2**40}, "steps"),
        ({"max_new_tokens": 10**6}, "4096"),
        ({"focus_from": 2**63}, "focus from"),
    ],
)
def test_a_training_job_refuses_what_no_column_holds(store, tmp_path, change, words):
    from storage.db.errors import QueueError
    from storage.jobs import training

    kwargs = dict(
        name="d2",
        target="demo-target",
        draft="demo-draft",
        prompts="code:tune",
        validation="code:validation",
        steps=3,
        models=tmp_path,
    )
    with pytest.raises(QueueError, match=words):
        training.enqueue_training(store, **{**kwargs, **change})
    assert training.enqueue_training(store, **{**kwargs, "seed": 2**31 - 1}) > 0


@pytest.mark.parametrize("option", ["--poll", "--heartbeat", "--stale"])
@pytest.mark.parametrize("value", ["nan", "-1", "inf", "0", "５"])
def test_worker_process_durations_are_finite_positive_numbers(option, value, capsys, tmp_path):
    from app.worker.worker_process import main as worker_main

    with pytest.raises(SystemExit) as exit_:
        worker_main([option, value, "--db", f"sqlite:///{tmp_path / 'w.db'}", "--until-idle"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "positive number" in err
