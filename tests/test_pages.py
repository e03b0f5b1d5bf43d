"""Every dashboard page under Streamlit's AppTest, against real (temporary) databases: empty, populated by the
real worker running tiny models, and fed invalid input. Figures on screen are compared with storage's queries."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from engine.metrics import theory
from storage import open_store
from storage.analysis import catalog
from storage.jobs import liveness, run_state
from storage.jobs.experiments import (
    add_k_runs,
    enqueue_experiment,
    get_experiment,
    load_experiment_prompts,
    set_predicted_curve,
)
from storage.jobs.leases import acquire_lease, release_lease
from storage.records import queries as q
from tests.meaning import missing

TIMEOUT = 180  # seconds per script run: the CI machine is small and shared
PAGES = ["new", "experiments", "experiment", "rounds", "compare", "theory", "train"]
PROMPTS = ["t5 t6 t7 t8", "t9 t10 t11"]


def app(page: str, **query) -> AppTest:
    """The real entry script's router, started on `page`, with `query` in the URL."""
    at = AppTest.from_string(f"from app.main import run\nrun({page!r})", default_timeout=TIMEOUT)
    for key, value in query.items():
        at.query_params[key] = str(value)
    return at.run()


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def chart_data(at: AppTest) -> list[list[pd.DataFrame]]:
    """Every Vega-Lite chart's datasets, decoded from what the browser would receive."""
    return [
        [pa.ipc.open_stream(d.data.data).read_pandas() for d in chart.proto.datasets]
        for chart in at.get("vega_lite_chart")
    ]


def chart_titles(at: AppTest) -> list[str]:
    return [json.dumps(json.loads(chart.proto.spec)) for chart in at.get("vega_lite_chart")]


def downloads(at: AppTest) -> list[str]:
    return [b.proto.id.rsplit("csv_", 1)[-1] for b in at.get("download_button")]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def page_text(at: AppTest) -> str:
    """Everything this run sent towards the browser, as text: every element's message, recursively."""
    parts = []

    def walk(node) -> None:
        if getattr(node, "proto", None) is not None:
            parts.append(str(node.proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(parts)


def with_password(url: str) -> tuple[str, str]:
    """`url` with a password in it (trust-auth test servers ignore it), and that password."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    secret = parsed.password or "s3cret"
    return parsed.set(password=secret).render_as_string(hide_password=False), secret


# --- databases -----------------------------------------------------------------------------------------------


@pytest.fixture
def empty_db(tmp_path, monkeypatch) -> str:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    return url


@pytest.fixture(scope="session")
def populated_template(tmp_path_factory) -> Path:
    """Three experiments executed by the real worker on tiny random models: greedy k = 1,2,4; sampled k = 2,3;
    a temperature sweep (0, 1) at k = 2."""
    from pages.widgets.pair_check import wait_warm

    wait_warm()  # earlier AppTests started the dashboard's background transformers import; let it finish
    from app.worker.worker import Worker
    from tests import tiny_models as tm

    def loader(target, draft, device, dtype, trust_remote_code):
        t = tm.llama(0, sharpness=4.0)
        return tm.pair(t, tm.noisy_copy(t, 1, 0.3))

    path = tmp_path_factory.mktemp("populated") / "draftlab.db"
    store = open_store(f"sqlite:///{path}")
    enqueue_experiment(
        store,
        name="tiny greedy",
        target="tiny-target",
        draft="tiny-draft",
        prompts="tiny",
        sampling={"max_new_tokens": 16},
        sweep_values=[1, 2, 4],
        tags=("tiny", "greedy"),
        notes="first sweep",
        prompt_texts=PROMPTS,
        device="cpu",
    )
    enqueue_experiment(
        store,
        name="tiny sampled",
        target="tiny-target",
        draft="tiny-draft",
        prompts="tiny",
        sampling={"max_new_tokens": 16, "temperature": 1.0, "seed": 3},
        sweep_values=[2, 3],
        tags=("tiny",),
        prompt_texts=PROMPTS,
        device="cpu",
    )
    enqueue_experiment(
        store,
        name="tiny temperature sweep",
        target="tiny-target",
        draft="tiny-draft",
        prompts="tiny",
        sampling={"max_new_tokens": 8},
        sweep_variable="temperature",
        sweep_values=[0.0, 1.0],
        k=2,
        prompt_texts=PROMPTS[:1],
        device="cpu",
    )
    with Worker(store, loader=loader, log=lambda message: None) as worker:
        worker.work(until_idle=True)
    store.dispose()
    return path


@pytest.fixture
def populated(populated_template, tmp_path, monkeypatch):
    """A private copy of the populated database (tests may write to it); returns its Store."""
    for suffix in ("", "-wal", "-shm"):
        source = Path(str(populated_template) + suffix)
        if source.exists():
            shutil.copy(source, tmp_path / f"draftlab.db{suffix}")
    url = f"sqlite:///{tmp_path / 'draftlab.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    store = open_store(url)
    assert set(catalog.experiments(store)["status"]) == {"done"}, "the tiny experiments did not finish"
    return store


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    """Tokenizer + config directories (no weights): two sharing a tokenizer, one with another tokenizer."""
    from pages.widgets.pair_check import wait_warm

    wait_warm()
    from transformers import LlamaConfig

    from tests.tiny_models import tokenizer

    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, prefix in (("target", "t"), ("draft", "t"), ("other", "u")):
        tokenizer(64, prefix=prefix).save_pretrained(root / name)
        LlamaConfig(
            vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
        ).save_pretrained(root / name)
        dirs[name] = str(root / name)
    return dirs


# --- empty database ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_on_an_empty_database(empty_db, page):
    at = app(page)
    assert_clean(at)
    if page in ("experiments", "experiment", "rounds", "compare"):
        assert at.info and "No experiments" in at.info[0].value
        assert not at.dataframe and not at.get("vega_lite_chart")


def test_entry_script_routes_to_experiments_by_default(empty_db):
    at = AppTest.from_file(str(Path(__file__).parent.parent / "app" / "main.py"), default_timeout=TIMEOUT).run()
    assert_clean(at)
    assert at.title[0].value == "Experiments"


# --- Theory --------------------------------------------------------------------------------------------------


def test_theory_sliders_drive_the_formulas(empty_db):
    at = app("theory")
    at.slider(key="theory_alpha").set_value(0.8)
    at.slider(key="theory_c").set_value(5.0)
    at.slider(key="theory_k").set_value(3).run()
    assert_clean(at)
    shown = metrics(at)
    assert shown["Speedup at k=3"] == f"{theory.predicted_speedup(0.8, 3, 5.0):.2f}×"
    assert shown["Tokens per round at k=3"] == f"{theory.expected_tokens_per_round(0.8, 3):.2f}"
    assert shown["Best k"] == str(theory.best_k(0.8, 5.0, 16)[0])
    curves = next(d for d in chart_data(at)[0] if "metric" in d)  # long form: k, metric, value
    assert sorted(set(curves["k"])) == list(range(1, 17))
    at_3 = curves[(curves["k"] == 3) & (curves["metric"] == "predicted_speedup")]["value"]
    assert at_3.tolist() == pytest.approx([theory.predicted_speedup(0.8, 3, 5.0)])
    assert "theory_curves.csv" in downloads(at) and "simulation.csv" in downloads(at)


def test_theory_simulator_lands_on_the_formula_and_rejects_bad_k(empty_db):
    at = app("theory")
    shown = metrics(at)
    beta, alpha_hat = float(shown["β = Σ min(p_draft, p_target)"]), float(shown["Simulated α̂ (all k)"])
    assert alpha_hat == pytest.approx(beta, abs=0.03)
    at.text_input(key="sim_ks").set_value("0, 2")
    at.button[0].click().run()  # the form's submit button
    assert_clean(at)
    assert any("k values must be whole numbers" in e.value for e in at.error)


# --- New experiment ------------------------------------------------------------------------------------------

WIDGETS = {
    "temperature": "number_input",
    "top_k": "number_input",
    "top_p": "number_input",
    "seed": "number_input",
    "max_new_tokens": "number_input",
    "prompt_set": "selectbox",
    "device": "selectbox",
    "dtype": "selectbox",
    "sweep_variable": "selectbox",
    "sweep_values": "text_input",
    "name": "text_input",
    "tags": "text_input",
    "notes": "text_area",
}


def _fill(at: AppTest, model_dirs, **fields) -> AppTest:
    """Fill the New-experiment form (the models default to two directories sharing a tokenizer)."""
    at.text_input(key="target").set_value(fields.pop("target", model_dirs["target"]))
    at.text_input(key="draft").set_value(fields.pop("draft", model_dirs["draft"]))
    for key, value in fields.items():
        getattr(at, WIDGETS[key])(key=key).set_value(value)
    return at.run()


def test_new_experiment_launch_enqueues_baseline_and_one_run_per_k(empty_db, model_dirs):
    at = _fill(
        app("new"),
        model_dirs,
        sweep_values="4,1,2",
        max_new_tokens=8,
        tags="smoke, cpu",
        notes="why not",
        name="launched from the page",
        prompt_set="code:validation",
        device="cpu",
    )
    assert at.success and "tokenizers match" in at.success[0].value
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error
    store = open_store(empty_db)
    listing = catalog.experiments(store)
    assert len(listing) == 1
    row = listing.iloc[0]
    assert row["name"] == "launched from the page" and row["prompts"] == "code:validation"
    assert row["target"] == model_dirs["target"] and set(row["tags"].split(",")) == {"smoke", "cpu"}
    runs = q.runs(store, int(row["experiment_id"]))
    assert list(runs["kind"]) == ["baseline", "speculative", "speculative", "speculative"]
    assert sorted(runs["k"].dropna().astype(int)) == [1, 2, 4] and set(runs["status"]) == {"queued"}
    assert q.experiment(store, int(row["experiment_id"]))["max_new_tokens"] == 8
    assert f"Experiment #{row['experiment_id']} queued" in at.success[-1].value
    # Launch pressed again with the same settings: a link to the first, no copy queued (issue 21 item 4)
    at.button(key="launch").click().run()
    assert_clean(at)
    assert len(catalog.experiments(store)) == 1
    assert any(f"Experiment #{row['experiment_id']} " in i.value for i in at.info), at.info  # names the first
    # a changed setting is a new experiment
    at.text_input(key="sweep_values").set_value("1,2").run()
    at.button(key="launch").click().run()
    assert len(catalog.experiments(store)) == 2


def test_the_form_says_what_launch_will_decode_and_how_long(empty_db, model_dirs, tmp_path):
    """Before Launch: prompts × arms × repeats × new tokens, and a duration at the target's speed at the same batch
    size (storage.records.queries.target_speed: a batch-2 baseline's throughput is not a batch-1 follow-up's), else
    scaled by model size from another target measured at that batch size (pages/panels/estimate.py), saying which it
    is."""
    import shutil

    from sqlalchemy import text

    from engine.text.prompt_sets import load_prompts
    from pages.new_experiment import arms_of, workload
    from pages.panels.estimate import duration, weight_bytes

    target, reference = tmp_path / "target", tmp_path / "reference"  # weights on disk: 3 MB and 1 MB
    shutil.copytree(model_dirs["target"], target)
    (target / "model.safetensors").write_bytes(b"w" * 3_000_000)
    reference.mkdir()
    (reference / "model.safetensors").write_bytes(b"w" * 1_000_000)
    target = str(target)

    def caption():
        at = _fill(
            app("new"), model_dirs, target=target, sweep_values="1,2,4", max_new_tokens=16, prompt_set="code:validation"
        )
        return next(c.value for c in at.caption if "Launch decodes" in c.value)

    def measured(target, speed, batch_size):
        eid = enqueue_experiment(
            store,
            name="m",
            target=target,
            draft="d",
            prompts="code:tune",
            sampling={"max_new_tokens": 8, "batch_size": batch_size},
            sweep_values=[2],
        )
        with store.write() as conn:
            conn.execute(
                text(
                    "UPDATE runs SET status = 'done', tokens_per_second = :s, device_name = 'cpu', "
                    "finished = created WHERE experiment_id = :e AND kind = 'baseline'"
                ),
                {"e": eid, "s": speed},
            )
        return eid

    n = len(load_prompts("code:validation"))
    assert f"at most {n * 4 * 3 * 16:,} tokens" in caption() and "no measured speed at batch size 1" in caption()
    store = open_store(empty_db)
    measured(target, 189.4, 2)  # at batch 2 only: not this batch-1 experiment's speed
    assert "189.4" not in caption() and "no duration estimate" in caption()
    other = measured(str(reference), 100.0, 1)  # another target, at batch 1: scaled by the weights' size
    assert weight_bytes(target) == 3_000_000
    shown = caption()
    assert "an estimate from model size" in shown and f"#{other}" in shown and "3× its size" in shown
    assert f"about {duration(n * 4 * 3 * 16 / (100.0 / 3))} on" in shown  # 100 tokens/s for a third of the weights
    eid = measured(target, 40.0, 1)  # this target at this batch size: its own speed
    shown = caption()
    assert "40.0 tokens/s on cpu" in shown and f"#{eid}" in shown and "model size" not in shown
    assert workload(n, 4, 16, 3, 40.0) == (n * 4 * 16 * 3, n * 4 * 16 * 3 / 40.0)
    assert arms_of("k", 3, None) == 4 and arms_of("temperature", 2, None) == 4 and arms_of("k", 1, 8) == 6


def test_recent_duplicate_matches_settings_not_labels(store):
    from storage.jobs.experiments import enqueue_experiment, recent_duplicate

    launch = dict(
        name="a",
        target="t",
        draft="d",
        prompts="code:tune",
        sampling={"max_new_tokens": 8},
        sweep_values=[4, 1, 2],
        tags=("x",),
    )
    first = enqueue_experiment(store, **launch)
    assert recent_duplicate(store, {**launch, "name": "b", "notes": "n", "tags": ()}) == first
    assert recent_duplicate(store, {**launch, "sweep_values": [1, 2]}) is None
    assert recent_duplicate(store, {**launch, "sampling": {"max_new_tokens": 16}}) is None
    assert recent_duplicate(store, {**launch, "drafter": "heuristic"}) is None
    assert recent_duplicate(store, launch, window_seconds=-1) is None  # outside the window


def _shipped_drafts() -> set[str]:
    """The draft models that ship in engine/zoo (every built model there but the target)."""
    from engine import zoo

    return {p.name for p in zoo.ZOO_DIR.iterdir() if (p / "config.json").exists()} - {zoo.DEMO_TARGET}


def test_every_shipped_draft_is_a_primary_draft_choice_and_in_the_cli_help(empty_db, capsys):
    """demo-draft-distilled was offered only among a draft sweep's candidates: the one-draft form's picker listed
    trained drafts only, and named none when there were none."""
    from app.cli import main

    shipped = _shipped_drafts()
    assert {"demo-draft", "demo-draft-distilled"} <= shipped
    at = app("new")
    assert_clean(at)
    options = at.selectbox(key="draft_pick").options
    for name in shipped:
        assert f"{name} (shipped)" in options, options
    at.selectbox(key="draft_pick").set_value("demo-draft-distilled").run()
    assert_clean(at)
    assert at.text_input(key="draft").value == "demo-draft-distilled"
    assert all(name in at.text_input(key="draft").help for name in shipped)
    assert main(["run", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    draft_help = help_text[help_text.rindex("--draft DRAFT") : help_text.rindex("--drafter DRAFTER")]
    assert all(name in draft_help for name in shipped), draft_help


def test_new_experiment_upload_of_conversations_renders_them_or_says_why_not(
    empty_db, model_dirs, tmp_path, monkeypatch
):
    """A chat JSONL upload is rendered by the target's chat template before it is frozen; a target without one is
    refused at Launch in one line, and nothing is queued."""
    import json as _json

    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path / "uploads"))
    chats = "".join(_json.dumps({"messages": [{"role": "user", "content": f"t{i} t{i + 1}"}]}) + "\n" for i in (1, 3))
    at = app("new")
    at.radio(key="prompt_source").set_value("Upload a file").run()
    at.get("file_uploader")[0].upload("chats.jsonl", chats.encode(), "application/jsonl")
    at = _fill(at, model_dirs, sweep_values="2")
    at.button(key="launch").click().run()
    assert_clean(at)
    assert any("conversations but" in e.value and "has no chat template" in e.value for e in at.error)
    assert catalog.experiments(open_store(empty_db)).empty


def test_new_experiment_upload_freezes_the_uploaded_prompts(empty_db, model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path / "uploads"))
    at = app("new")
    at.radio(key="prompt_source").set_value("Upload a file").run()
    at.get("file_uploader")[0].upload("mine.txt", b"t1 t2\nt3 t4 t5\n", "text/plain")
    at = _fill(at, model_dirs, sweep_values="2")
    captions = " ".join(c.value for c in at.caption)
    assert "2 prompts from mine.txt" in captions and str(tmp_path) not in captions  # no server path shown
    at.button(key="launch").click().run()
    assert_clean(at)
    store = open_store(empty_db)
    row = catalog.experiments(store).iloc[0]
    assert row["prompts"].endswith("-mine.txt") and Path(row["prompts"]).parent == tmp_path / "uploads"
    with store.read() as conn:
        assert load_experiment_prompts(conn, int(row["experiment_id"])) == ["t1 t2", "t3 t4 t5"]
    for page, query in (
        ("experiments", {}),
        ("experiment", {"experiment": row["experiment_id"]}),
        ("compare", {"experiments": row["experiment_id"]}),
    ):
        shown = app(page, **query)
        assert_clean(shown)
        assert str(tmp_path) not in page_text(shown), page  # the upload is named, its server path never shown
    assert "mine.txt" in page_text(app("experiments"))


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"sweep_values": "1, two"}, "whole number"),
        ({"sweep_values": "0"}, "whole number"),
        ({"sweep_values": ""}, "at least one"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top-p"),
        ({"draft": "OTHER"}, "disagree"),
        ({"draft": "/no/such/dir"}, "no such folder"),  # a path: never the hub's "Repo id must be in the form"
    ],
)
def test_new_experiment_invalid_input_shows_an_error_and_enqueues_nothing(empty_db, model_dirs, fields, words):
    if fields.get("draft") == "OTHER":
        fields["draft"] = model_dirs["other"]
    at = _fill(app("new"), model_dirs, **fields)
    at.button(key="launch").click().run()
    assert_clean(at)
    assert any(words in e.value for e in at.error), [e.value for e in at.error]
    assert catalog.experiments(open_store(empty_db)).empty


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("max_new_tokens", 1_000_000_000, "max new tokens must be a whole number from 1 to"),
        ("max_new_tokens", 0, "max new tokens must be"),
        ("batch_size", 0, "batch size must be"),
        ("seed", -1, "seed must be"),
        ("repeats", 0, "repeats must be"),
    ],
)
def test_new_experiment_an_out_of_range_number_blocks_launch_in_one_line(empty_db, model_dirs, key, value, words):
    """No number field has bounds in the browser (a browser keeps a number outside them to itself, red-marked, and
    Launch queued the value before it: 128 for a typed 1000000000); the value reaches validate(), which blocks
    Launch in one line, and nothing is queued."""
    at = _fill(app("new"), model_dirs)
    numbers = {w.key: w for w in at.number_input}
    assert not [k for k, w in numbers.items() if w.proto.has_min or w.proto.has_max]  # no browser-side bound
    at.number_input(key=key).set_value(value).run()
    at.button(key="launch").click().run()
    assert_clean(at)
    blocked = [e.value for e in at.error if e.value.startswith("Not launched")]
    assert len(blocked) == 1 and words in blocked[0] and blocked[0].count("\n- ") == 1, blocked
    assert catalog.experiments(open_store(empty_db)).empty


def test_new_experiment_batch_size_is_disabled_while_a_grid_lists_the_batch_sizes(empty_db, model_dirs):
    at = _fill(app("new"), model_dirs)
    assert not at.number_input(key="batch_size").disabled
    at.text_input(key="grid_batch_sizes").set_value("1,4").run()
    widget = at.number_input(key="batch_size")
    assert widget.disabled and "At batch sizes" in widget.help
    at.text_input(key="grid_batch_sizes").set_value("").run()
    assert not at.number_input(key="batch_size").disabled


def test_new_experiment_rejects_a_bad_upload(empty_db, model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_UPLOAD_DIR", str(tmp_path / "uploads"))
    at = app("new")
    at.radio(key="prompt_source").set_value("Upload a file").run()
    at.get("file_uploader")[0].upload("bad.csv", b"question\nhello\n", "text/csv")
    at = _fill(at, model_dirs)
    assert any("bad.csv" in e.value for e in at.error)
    at.button(key="launch").click().run()
    assert any(e.value.startswith("Not launched") for e in at.error)
    assert catalog.experiments(open_store(empty_db)).empty


# --- Experiments ---------------------------------------------------------------------------------------------


def test_experiments_table_shows_storage_rows_and_filters(populated):
    at = app("experiments")
    assert_clean(at)
    table = at.dataframe[0].value
    listing = catalog.experiments(populated)
    assert list(table["experiment_id"]) == list(listing["experiment_id"])
    assert list(table["best_speedup"]) == pytest.approx(list(listing["best_speedup"]), nan_ok=True)
    assert set(table["progress"]) == {100.0}
    assert not any("Refreshing" in c.value for c in at.caption)  # nothing runs: no timer
    at.selectbox(key="filter_tag").set_value("greedy").run()
    assert list(at.dataframe[0].value["name"]) == ["tiny greedy"]
    at.selectbox(key="filter_tag").set_value("any")
    at.selectbox(key="filter_status").set_value("done").run()
    assert len(at.dataframe[0].value) == 3
    at.selectbox(key="filter_status").set_value("any")
    at.selectbox(key="filter_model").set_value("tiny-draft").run()
    assert len(at.dataframe[0].value) == 3
    assert at.selectbox(key="filter_model").options == ["any", "tiny-draft", "tiny-target"]


def test_experiments_live_refresh_and_cancel(populated):
    experiment_id = enqueue_experiment(
        populated,
        name="waiting",
        target="tiny-target",
        draft="tiny-draft",
        prompts="tiny",
        sampling={},
        sweep_values=[1],
        prompt_texts=PROMPTS,
    )
    at = app("experiments", experiment=experiment_id)
    assert_clean(at)
    assert any("Refreshing every" in c.value for c in at.caption)
    at.button(key="cancel").click().run()
    assert_clean(at)
    assert catalog.experiments(populated, status="cancelled")["experiment_id"].tolist() == [experiment_id]
    at.button(key="resume").click().run()
    assert_clean(at)
    assert catalog.experiments(populated, status="queued")["experiment_id"].tolist() == [experiment_id]


# --- Experiment detail ---------------------------------------------------------------------------------------


def _greedy_id(store) -> int:
    listing = catalog.experiments(store)
    return int(listing[listing["name"] == "tiny greedy"]["experiment_id"].iloc[0])


def _headline(store, experiment_id: int) -> dict[str, str]:
    """The detail page's headline figures as the verdict (storage/analysis/verdict.py) gives them: what it serves, that
    run's speedup with its interval and α (the target alone: k 0, 1×, the best run's α)."""
    from storage.analysis.verdict import verdict

    v = verdict(store, experiment_id)
    name = v.variable
    if v.chosen is None:
        assert v.best is not None
        best = q.runs(store, experiment_id).set_index("run_id").loc[v.best.run_id]
        return {
            f"{name} to serve": "0 (target alone)" if name == "k" else "none (target alone)",
            "Speedup": "1× (target alone)",
            "α (best run)": f"{best.alpha:.3f}",
        }
    run = q.runs(store, experiment_id).set_index("run_id").loc[v.chosen.run_id]
    return {
        f"{name} to serve": v.show(v.chosen.value),
        "Speedup": f"{run.speedup:.2f}× ({run.speedup_ci_lo:.2f}–{run.speedup_ci_hi:.2f})",
        "α (served run)": f"{run.alpha:.3f}",
    }


def test_detail_figures_equal_the_storage_queries(populated):
    from pages.widgets.charts import FORMULA

    experiment_id = _greedy_id(populated)
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    assert experiment_id in set(catalog.experiments(populated)["experiment_id"])  # listed
    shown = metrics(at)
    assert {label: shown[label] for label in _headline(populated, experiment_id)} == _headline(populated, experiment_id)

    (speedup,) = chart_data(at)  # the Verdict section: the answer's one chart
    rejected = app("experiment", experiment=experiment_id, section="Why drafts are rejected")
    assert_clean(rejected)
    rates, tokens, position, by_type = chart_data(rejected)
    curve = q.sweep_curve(populated, experiment_id)
    drawn = speedup[1]  # layer data: measured and predicted, long form
    measured = drawn[drawn["series"] == "measured"].sort_values("x")
    assert list(measured["x"]) == [1, 2, 4]
    assert list(measured["value"]) == pytest.approx(list(curve.sort_values("k")["speedup"]))
    runs = q.runs(populated, experiment_id)
    spec = runs[runs["kind"] == "speculative"]
    alpha = spec["accepted"].sum() / (spec["accepted"].sum() + spec["rejected"].sum())
    predicted = drawn[drawn["series"] == FORMULA].set_index("x")["value"]
    assert predicted.loc[2] == pytest.approx(theory.predicted_speedup(alpha, 2, spec["c"].mean()))
    from storage.analysis.verdict import verdict

    served = verdict(populated, experiment_id).k
    assert speedup[2]["x"].tolist() == [served]  # the marker: what the verdict serves (k = 0: the target alone)
    assert sorted(rates[0]["value"]) == pytest.approx(sorted([*curve["alpha"], *curve["draft_acceptance_rate"]]))
    assert sorted(tokens[0]["value"]) == pytest.approx(
        sorted(
            [
                *curve["tokens_per_round"],
                *(theory.expected_tokens_per_round(a, k) for a, k in zip(curve["alpha"], curve["k"])),
            ]
        )
    )

    # The verdict's best, not the curve's fastest: on a loaded machine the fastest can carry a timing warning.
    best_run = verdict(populated, experiment_id).best.run_id
    assert rejected.query_params["run"] in ([str(best_run)], str(best_run))
    pd.testing.assert_frame_equal(position[0], q.acceptance_by_position(populated, best_run), check_dtype=False)
    pd.testing.assert_frame_equal(by_type[0], q.acceptance_by_type(populated, best_run), check_dtype=False)
    per_prompt = next(d.value for d in rejected.dataframe if "prompt_index" in d.value)
    assert per_prompt["tokens_per_round"].tolist() == pytest.approx(
        q.per_prompt(populated, best_run)["tokens_per_round"].tolist()
    )
    assert "speedup_curve.csv" in downloads(at)
    assert {
        "acceptance_curve.csv",
        "tokens_per_round.csv",
        f"run{best_run}_acceptance_by_position.csv",
        f"run{best_run}_acceptance_by_type.csv",
        f"run{best_run}_top_rejected_tokens.csv",
        f"run{best_run}_per_prompt.csv",
    } <= set(downloads(rejected))
    costs = app("experiment", experiment=experiment_id, section="Predictions and cost")
    assert "cost_and_memory.csv" in downloads(costs)


def test_every_table_reads_its_headers_help_and_formats_from_the_one_column_table(populated):
    """storage/records/columns.py: no raw or blank header, the baseline's missing figures as "—" (not "None"), "same
    output" explained, and α in one format on every page: the detail's tile, runs and per-prompt tables, the experiments
    list and Compare (0.635 in one table, 0.636 in another before)."""
    from storage.records.columns import COLUMNS, EXPERIMENT_COLUMNS, MISSING, show

    experiment_id = _greedy_id(populated)
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    alpha = next(value for label, value in metrics(at).items() if label.startswith("α ("))
    assert alpha == next(v for label, v in _headline(populated, experiment_id).items() if label.startswith("α ("))
    assert len(alpha.split(".")[-1]) == 3  # show("alpha", ...)'s format
    # Every section's tables (each section is built alone).
    grids = [
        d
        for section in ("Why drafts are rejected", "Predictions and cost", "Runs")
        for d in app("experiment", experiment=experiment_id, section=section).dataframe
    ]
    runs_grid = next(d for d in grids if "outputs_match_baseline" in d.value)
    per_prompt_grid = next(d for d in grids if "prompt_index" in d.value)
    for grid in grids:  # runs, cost, predictions, rejected tokens, per prompt
        assert grid.proto.placeholder == MISSING
        config = json.loads(grid.proto.columns)
        for name in grid.value.columns:
            label = config.get(name, {}).get("label")
            assert label, f"{name!r} has no header of its own"  # neither blank nor the raw name by default
    runs_config = json.loads(runs_grid.proto.columns)
    assert runs_config["outputs_match_baseline"]["label"] == "same output"
    # Wider than the page at 1400 px: the columns naming the run stay in view while it scrolls sideways.
    pinned = [name for name in runs_grid.value.columns if runs_config.get(name, {}).get("pinned")]
    assert pinned == [c for c in ("check", "run_id", "kind", "k") if c in runs_grid.value.columns], pinned
    listing = next(d for d in app("experiments").dataframe if "best_speedup" in d.value)
    assert [n for n, c in json.loads(listing.proto.columns).items() if c.get("pinned")] == [
        "experiment_id",
        "timing_warnings",
        "name",
    ]
    assert "token for token" in runs_config["outputs_match_baseline"]["help"]
    for grid in (runs_grid, per_prompt_grid):
        assert json.loads(grid.proto.columns)["alpha"]["type_config"]["format"] == COLUMNS["alpha"].fmt
    baseline = runs_grid.value[runs_grid.value["kind"] == "baseline"].iloc[0]
    assert pd.isna(baseline["speedup"]) and pd.isna(baseline["alpha"])  # drawn as the placeholder

    listing = app("experiments")
    grid = next(d for d in listing.dataframe if "best_speedup" in d.value)
    config = json.loads(grid.proto.columns)
    assert config["alpha"]["type_config"]["format"] == EXPERIMENT_COLUMNS["alpha"].fmt == COLUMNS["alpha"].fmt
    assert all(config.get(name, {}).get("label") for name in grid.value.columns)

    compare = app("compare", experiments=str(experiment_id))
    runs = q.runs(populated, experiment_id)
    two = [int(r) for r in runs[runs["kind"] == "speculative"]["run_id"][:2]]
    compare.multiselect(key="multi_runs").set_value(two).run()
    assert_clean(compare)
    side = next(d.value for d in compare.dataframe if "α" in d.value.index)
    by_id = runs.set_index("run_id")
    assert list(side.loc["α"]) == [show("alpha", by_id.loc[r, "alpha"]) for r in two]
    assert "alpha" not in side.index and not any(v == "None" for v in side.to_numpy().ravel())


def test_the_run_columns_export_keys_and_page_columns_are_one_table(populated):
    from storage.records.columns import COLUMNS, RUN_QUERY, SPECULATIVE_KEYS, show
    from storage.serving import export

    experiment_id = _greedy_id(populated)
    assert list(q.runs(populated, experiment_id).columns[: len(RUN_QUERY)]) == RUN_QUERY
    assert all(name in COLUMNS for name in RUN_QUERY)
    doc = export.run_document(populated, experiment_id, with_outputs=False)
    assert export.SPECULATIVE_KEYS is SPECULATIVE_KEYS
    keys = list(doc["runs"][0])
    assert [k for k in keys if k in SPECULATIVE_KEYS] == SPECULATIVE_KEYS  # in the table's (SPEC) order
    assert show("alpha", 0.63549) == "0.635" and show("speedup", 1.2) == "1.20×" and show("alpha", None) == "—"
    assert show("outputs_match_baseline", True) == "yes" and show("sweep_value", 4.0) == "4"


def test_detail_of_a_temperature_sweep_plots_against_temperature(populated):
    listing = catalog.experiments(populated)
    experiment_id = int(listing[listing["name"] == "tiny temperature sweep"]["experiment_id"].iloc[0])
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    assert [s.value for s in at.subheader if s.value != "Findings"][:1] == ["Speedup vs temperature"]
    rejected = app("experiment", experiment=experiment_id, section="Why drafts are rejected")
    assert [s.value for s in rejected.subheader][:2] == ["Acceptance vs temperature", "Tokens per round vs temperature"]
    speedup = chart_data(at)[0][1]
    curve = q.sweep_curve(populated, experiment_id)
    measured = speedup[speedup["series"] == "measured"].sort_values("x")
    assert measured["x"].tolist() == [0.0, 1.0]
    assert measured["value"].tolist() == pytest.approx(
        curve.sort_values("sweep_value")["speedup"].tolist(), nan_ok=True
    )
    assert metrics(at)["temperature to serve"] == _headline(populated, experiment_id)["temperature to serve"]


def test_detail_opens_the_run_named_in_the_url(populated):
    experiment_id = _greedy_id(populated)
    first_run = int(q.sweep_curve(populated, experiment_id)["run_id"].iloc[0])
    at = app("experiment", experiment=experiment_id, run=first_run, section="Why drafts are rejected")
    assert_clean(at)
    position = chart_data(at)[2][0]  # after acceptance and tokens per round vs k
    pd.testing.assert_frame_equal(position, q.acceptance_by_position(populated, first_run), check_dtype=False)


def test_detail_ignores_an_unknown_experiment_in_the_url(populated):
    at = app("experiment", experiment=999)
    assert_clean(at)
    assert str(at.query_params["experiment"]).strip("[]'") in {
        str(i) for i in catalog.experiments(populated)["experiment_id"]
    }


# --- Round explorer ------------------------------------------------------------------------------------------


def test_round_explorer_colours_every_token_and_lists_proposals(populated):
    experiment_id = _greedy_id(populated)
    run_id = int(q.sweep_curve(populated, experiment_id).set_index("k").loc[4, "run_id"])
    at = app("rounds", experiment=experiment_id, run=run_id, prompt=1)
    assert_clean(at)
    output = q.prompt_output(populated, run_id, 1)
    html = next(m.value for m in at.markdown if "white-space:pre-wrap" in m.value)
    assert html.count("<span") == len(output)
    assert html.count("color:#c62828") == (output["kind"] == "correction").sum()
    first_round = int(output["round_index"].dropna().min())
    proposals = next(d.value for d in at.dataframe if "p_draft" in d.value)
    expected = q.round_proposals(populated, run_id, 1, first_round)
    assert proposals["p_target"].tolist() == pytest.approx(expected["p_target"].tolist(), nan_ok=True)
    assert proposals["outcome"].tolist() == expected["outcome"].tolist()
    rounds = sorted(int(r) for r in output["round_index"].dropna().unique())
    if len(rounds) > 1:
        at.select_slider(key="select_round").set_value(rounds[-1]).run()
        assert at.query_params["round"] in ([str(rounds[-1])], str(rounds[-1]))


# --- Compare -------------------------------------------------------------------------------------------------


def test_compare_overlays_experiments_and_runs(populated):
    listing = catalog.experiments(populated)
    ids = [int(i) for i in listing["experiment_id"]]
    curves = {i: q.sweep_curve(populated, i) for i in ids}
    run_a, run_b = int(curves[ids[0]]["run_id"].iloc[0]), int(curves[ids[1]]["run_id"].iloc[0])
    at = app("compare", experiments=",".join(map(str, ids)), runs=f"{run_a},{run_b},{run_a}")  # repeats ignored
    assert_clean(at)
    data = [d for chart in chart_data(at) for d in chart]
    # The sweep panels' frames, one per swept variable (each experiment on its own variable's axis)
    sweeps = {tuple(sorted(d["run_id"])): d for d in data if "speedup" in d and "alpha" in d}
    assert sum(len(d) for d in sweeps.values()) == sum(len(c) for c in curves.values())
    assert {int(i) for d in sweeps.values() for i in d["experiment_id"]} == set(ids)
    variables = set(listing["sweep_variable"].fillna("k"))
    assert len(sweeps) == len(variables) > 1
    position = next(d for d in data if "conditional" in d)
    assert set(position["run_id"]) == {run_a, run_b}
    assert {
        "compare_experiments.csv",
        *(f"compare_sweep_{v}.csv" for v in variables),
        "compare_runs.csv",
        "compare_by_position.csv",
        "compare_by_type.csv",
    } <= set(downloads(at))
    runs_table = next(d.value for d in at.dataframe if "α" in d.value.index)
    assert runs_table.shape[1] == 2


def test_pages_of_an_experiment_that_has_not_run_yet(populated):
    experiment_id = enqueue_experiment(
        populated,
        name="queued only",
        target="tiny-target",
        draft="tiny-draft",
        prompts="tiny",
        sampling={},
        sweep_values=[1, 2],
        prompt_texts=PROMPTS,
    )
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    assert any("Refreshing every" in c.value for c in at.caption)
    assert any("No speculative run has finished yet" in i.value for i in at.info)
    assert metrics(at)["Status"].startswith("queued")
    at = app("rounds", experiment=experiment_id)
    assert_clean(at)
    assert any("no outputs yet" in i.value for i in at.info)
    at = app("compare", experiments=experiment_id)
    assert_clean(at)
    assert any(not missing(i.value, "experiments", "finished") for i in at.info), at.info


# --- what pages never show -----------------------------------------------------------------------------------


def test_a_database_password_never_appears_on_a_page(postgres_url, monkeypatch):
    url, secret = with_password(postgres_url)
    store = open_store(url)
    enqueue_experiment(
        store,
        name="pw",
        target="tiny-target",
        draft="tiny-draft",
        prompts="tiny",
        sampling={},
        sweep_values=[1],
        prompt_texts=PROMPTS,
    )
    store.dispose()
    monkeypatch.setenv("DRAFTLAB_DB", url)
    for page in PAGES:
        at = app(page)
        assert_clean(at)
        text = page_text(at)
        assert secret not in text, page
        if page == "experiments":
            assert "· pw (queued)" in text  # page_text does see what the page shows


# --- hostile URLs and unexpected errors ----------------------------------------------------------------------

NOT_ASCII_DIGITS = {"experiment": "²", "run": "①", "experiments": "1,²", "runs": "①,1", "prompt": "٣", "round": "²"}


@pytest.mark.parametrize("page", PAGES)
def test_unicode_digits_in_the_url_are_ignored_like_any_malformed_id(populated, page):
    at = app(page, **NOT_ASCII_DIGITS)
    assert_clean(at)
    text = page_text(at)
    assert "Traceback" not in text and "invalid literal" not in text


def test_query_ids_accept_ascii_digits_only(empty_db):
    from pages.widgets.common import parse_id

    assert [parse_id(s) for s in ("3", " 12 ", "007", "123456789")] == [3, 12, 7, 123456789]
    assert [parse_id(s) for s in ("²", "①", "٣", "３", "1²", "-1", "+1", "1.0", "", "1234567890", "1_000")] == [
        None
    ] * 11


def test_an_unexpected_error_is_logged_and_shown_as_one_short_message(populated, monkeypatch, caplog):
    import logging

    def broken(*args, **kwargs):
        raise RuntimeError("boom in /srv/draftlab/secret/path.py")

    monkeypatch.setattr(catalog, "experiments", broken)
    with caplog.at_level(logging.ERROR, logger="draftlab"):
        at = app("experiments")
    assert not at.exception  # no traceback, no exception message in the browser
    assert len(at.error) == 1 and "unexpected error" in at.error[0].value
    text = page_text(at)
    assert "/srv/draftlab" not in text and "RuntimeError" not in text and "Traceback" not in text
    logged = [r for r in caplog.records if r.exc_info and "boom in /srv/draftlab" in str(r.exc_info[1])]
    assert logged, "the exception was not logged on the server"


def test_the_dashboard_hides_error_details_from_the_browser():
    """`draftlab ui` runs Streamlit with client.showErrorDetails=none (not False, which means "stacktrace")."""
    from streamlit import config

    from app.ui import streamlit_command

    command = streamlit_command(8501, "127.0.0.1")
    value = command[command.index("--client.showErrorDetails") + 1]
    assert value == "none" and value in {v.value for v in config.ShowErrorDetailsConfigOptions}


@pytest.mark.parametrize("page", PAGES)
def test_an_unreachable_database_is_one_message_without_its_password(page, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_DB", "postgresql://draftlab:s3cret@127.0.0.1:1/draftlab")
    at = app(page)
    assert not at.exception
    text = page_text(at)
    assert "s3cret" not in text and "Traceback" not in text
    if page not in ("new", "theory"):  # the new-experiment form opens the database only to launch; theory never
        assert len(at.error) == 1 and "unexpected error" in at.error[0].value


# --- Experiments: noticing work that starts elsewhere --------------------------------------------------------


class _FragmentRecorder:
    """Stands in for `streamlit` inside pages.experiments: records each fragment's run_every, changes nothing."""

    def __init__(self):
        import streamlit

        self._st, self.intervals = streamlit, []

    def __getattr__(self, name):
        return getattr(self._st, name)

    def fragment(self, func=None, *, run_every=None, **kwargs):
        self.intervals.append(run_every)
        return self._st.fragment(func, run_every=run_every, **kwargs)


@pytest.mark.parametrize("database", ["empty_db", "populated"])
def test_an_idle_experiments_page_keeps_polling(database, request, monkeypatch):
    import pages.experiments as page

    request.getfixturevalue(database)
    recorder = _FragmentRecorder()
    monkeypatch.setattr(page, "st", recorder)
    at = app("experiments")
    assert_clean(at)
    assert recorder.intervals and all(i is not None for i in recorder.intervals), recorder.intervals
    assert not any("Refreshing" in c.value for c in at.caption)  # idle: no progress timer announced


def test_the_idle_poll_asks_for_a_full_redraw_only_when_work_appears_or_ends(populated):
    import pages.experiments as page

    seen = page.page_state(catalog.experiments(populated))
    assert not page.needs_full_rerun(seen, catalog.experiments(populated))  # nothing changed: the poll stays cheap
    experiment_id = enqueue_experiment(
        populated,
        name="from the CLI",
        target="tiny-target",
        draft="tiny-draft",
        prompts="tiny",
        sampling={},
        sweep_values=[1],
        prompt_texts=PROMPTS,
    )
    assert page.needs_full_rerun(seen, catalog.experiments(populated))  # new work: redraw, with the 2 s timer
    active = page.page_state(catalog.experiments(populated))
    run_state.cancel_experiment(populated, experiment_id)
    assert page.needs_full_rerun(active, catalog.experiments(populated))  # nothing runs any more: back to the idle poll
    cancelled = page.page_state(catalog.experiments(populated))
    run_state.resume_experiment(populated, experiment_id)  # `draftlab resume` elsewhere: same ids, active again
    assert page.needs_full_rerun(cancelled, catalog.experiments(populated))


# --- Timing protocol v2 on the dashboard: intervals, the physics guard, unfinished runs, predictions ----------


def _crafted_prompt(prompt_index, k, accepts, draft_s, verify_s):
    """A speculative prompt whose wall time is exactly its rounds' draft + verify time (engine invariants kept)."""
    from engine.decoding.records import (
        ACCEPTED,
        BONUS,
        CORRECTION,
        DISCARDED,
        REJECTED,
        DraftToken,
        PromptResult,
        Round,
    )

    rounds, first = [], 0  # its output is tokens 0, 1, 2, ...: the crafted baseline's when as long (lossless)
    for index, a in enumerate(accepts):
        drafts = [
            DraftToken(
                i + 1,
                10 + i,
                f"t{i}",
                "english",
                0.5,
                0.5,
                0.5,
                0.1,
                ACCEPTED if i < a else REJECTED if i == a else DISCARDED,
            )
            for i in range(k)
        ]
        rounds.append(
            Round(
                prompt_index,
                index,
                k,
                a,
                list(range(first, first + a + 1)),
                [ACCEPTED] * a + [BONUS if a == k else CORRECTION],
                draft_s,
                verify_s,
                k,
                drafts,
            )
        )
        first += a + 1
    output = [t for r in rounds for t in r.emitted_ids]
    return PromptResult(
        prompt_index, f"p{prompt_index}", output, "x", len(accepts) * (draft_s + verify_s), rounds=rounds
    )


def _crafted_baseline(prompt_index, tokens=8, step=0.010):
    from engine.decoding.records import PromptResult

    return PromptResult(
        prompt_index,
        f"p{prompt_index}",
        list(range(tokens)),
        "x",
        tokens * step,
        decode_steps=tokens,
        decode_seconds=tokens * step,
    )


def _record_runs(store, runs: dict, done: bool = True) -> None:
    """runs: {run_id: (kind, [PromptResult])}, recorded as the worker records them; then closed as done."""
    from tests.test_storage import record

    for run_id, (kind, results) in runs.items():
        for result in results:
            record(store, run_id, kind, result)
        if done:
            run_state.finish_run(store, run_id, "done")


# k=1 is timed 6x faster than the baseline with 1.6 tokens per round (impossible: a timing_warning); k=2 is honest
# (about 2x, its prompts a little apart so its interval has a width); k=4 is faster still but has only finished 2
# of 4 prompts. Each emits the baseline's 8 tokens (lossless).
CRAFTED = {1: ([1, 0, 1, 0, 1], 0.001, 0.0015), 2: ([2, 1, 2], 0.002, 0.010), 4: ([4, 2], 0.004, 0.011)}


@pytest.fixture
def crafted(empty_db):
    """A k = 1, 2, 4 experiment recorded from crafted timings; k = 4 still running. Returns (store, id, run ids by
    k)."""
    from tests.test_storage import enqueue, run_ids

    store = open_store(empty_db)
    experiment_id = enqueue(store, ks=(1, 2, 4), prompts=4, name="crafted", repeats=3)
    ids = run_ids(store, experiment_id)
    assert run_state.claim_group(store, experiment_id, "w")
    for run_id in ids.values():
        run_state.start_run(store, run_id, 4, "cpu")
    spec = {
        k: [_crafted_prompt(i, k, accepts, draft_s, verify_s * (1 + 0.1 * i)) for i in range(4)]
        for k, (accepts, draft_s, verify_s) in CRAFTED.items()
    }
    _record_runs(
        store,
        {
            ids[("baseline", None)]: ("baseline", [_crafted_baseline(i) for i in range(4)]),
            ids[("speculative", 1)]: ("speculative", spec[1]),
            ids[("speculative", 2)]: ("speculative", spec[2]),
        },
    )
    _record_runs(store, {ids[("speculative", 4)]: ("speculative", spec[4][:2])}, done=False)
    return store, experiment_id, {k: ids[("speculative", k)] for k in CRAFTED}


def _set_speedups(store, run_ids: dict, speedups: dict) -> None:
    from sqlalchemy import text

    with store.write() as conn:
        for k, (s, lo, hi) in speedups.items():
            conn.execute(
                text(
                    "UPDATE runs SET speedup = :s, speedup_ci_lo = :lo, speedup_ci_hi = :hi, "
                    "timing_warning = NULL WHERE id = :rid"
                ),
                {"s": s, "lo": lo, "hi": hi, "rid": run_ids[k]},
            )


def _measured(at: AppTest) -> pd.DataFrame:
    """The speedup chart's measured points (long form: x, series, value, lo, hi, state)."""
    drawn = next(d for chart in chart_data(at) for d in chart if "series" in d and "lo" in d)
    return drawn[drawn["series"] == "measured"].sort_values("x").reset_index(drop=True)


def test_detail_headline_carries_the_interval_and_names_the_ties(populated):
    experiment_id = _greedy_id(populated)
    ids = {int(r.k): int(r.run_id) for r in q.sweep_curve(populated, experiment_id).itertuples()}
    _set_speedups(populated, ids, {1: (1.10, 1.05, 1.15), 2: (1.31, 1.22, 1.40), 4: (1.25, 1.18, 1.33)})
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    assert metrics(at)["k to serve"] == "2" and metrics(at)["Speedup"] == "1.31× (1.22–1.40)"
    assert any("best k 2 at 1.31× (1.22–1.40), tied with 4" in i.value for i in at.info)
    measured = _measured(at)
    assert measured[["x", "lo", "hi"]].values.tolist() == [[1, 1.05, 1.15], [2, 1.22, 1.40], [4, 1.18, 1.33]]
    assert '"errorbar"' in chart_titles(at)[0]

    _set_speedups(populated, ids, {2: (1.31, 0.90, 1.90)})  # the best one's interval spans 2x: no choice
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    assert any("too wide to choose" in w.value for w in at.warning)


def test_detail_warns_about_an_impossible_speedup_and_never_crowns_it(crafted):
    store, experiment_id, ids = crafted
    runs = q.runs(store, experiment_id).set_index("run_id")
    assert runs.loc[ids[1], "speedup"] > runs.loc[ids[1], "tokens_per_round"]  # what the recording path flags
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    warned = [w.value for w in at.warning if f"Run {ids[1]} (k = 1)" in w.value]
    assert len(warned) == 1 and runs.loc[ids[1], "timing_warning"] in warned[0]
    assert metrics(at)["k to serve"] == _headline(store, experiment_id)["k to serve"] == "2"
    runs_section = app("experiment", experiment=experiment_id, section="Runs")
    table = next(d.value for d in runs_section.dataframe if "check" in d.value).set_index("run_id")
    assert table.loc[ids[1], "check"].startswith("⚠") and table.loc[ids[2], "check"] == ""
    assert _measured(at).set_index("x").loc[1, "state"] == "timing warning"  # drawn as a hollow cross


def test_detail_draws_unfinished_runs_hollow_and_never_as_the_headline(crafted):
    store, experiment_id, ids = crafted
    runs = q.runs(store, experiment_id).set_index("run_id")
    assert runs.loc[ids[4], "status"] == "running" and runs.loc[ids[4], "speedup"] > runs.loc[ids[2], "speedup"]
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    assert metrics(at)["k to serve"] == "2"
    best = runs.loc[ids[2]]
    assert metrics(at)["Speedup"] == f"{best.speedup:.2f}× ({best.speedup_ci_lo:.2f}–{best.speedup_ci_hi:.2f})"
    measured = _measured(at).set_index("x")
    assert measured.loc[4, "state"] == "not finished" and measured.loc[2, "state"] == "finished"
    assert measured.loc[4, "value"] == pytest.approx(runs.loc[ids[4], "speedup"])
    assert '"white"' in chart_titles(at)[0]  # the hollow fill of unfinished points


def test_detail_sets_predictions_beside_the_measurement(crafted):
    from pages.widgets.charts import COST_AWARE, FORMULA

    store, experiment_id, ids = crafted
    at = app("experiment", experiment=experiment_id, section="Predictions and cost")
    assert_clean(at)
    table = next(d.value for d in at.dataframe if "refined_error" in d.value).set_index("run_id")
    curve = q.sweep_curve(store, experiment_id).set_index("run_id")
    for run_id in ids.values():
        row = curve.loc[run_id]
        assert table.loc[run_id, "refined_error"] == pytest.approx(row.predicted_speedup_refined / row.speedup - 1)
        assert table.loc[run_id, "formula_error"] == pytest.approx(row.predicted_speedup / row.speedup - 1)
    verdict_section = app("experiment", experiment=experiment_id)
    drawn = next(d for chart in chart_data(verdict_section) for d in chart if "series" in d and "lo" in d)
    assert {"measured", COST_AWARE, FORMULA} <= set(drawn["series"])
    cost = next(d.value for d in at.dataframe if "verify_cost" in d.value and "peak_memory_mb" in d.value)
    runs = q.runs(store, experiment_id)
    assert cost["verify_cost"].tolist() == pytest.approx(runs["verify_cost"].tolist(), nan_ok=True)
    assert "predicted_vs_measured.csv" in downloads(at)


def test_detail_of_a_k_auto_experiment_plots_its_predicted_curve_and_confirmations(empty_db):
    from tests.test_storage import enqueue, run_ids

    store = open_store(empty_db)
    experiment_id = enqueue(store, ks=(1,), prompts=3, name="auto", k_auto=4)
    probe = run_ids(store, experiment_id)
    _record_runs(
        store,
        {
            probe[("baseline", None)]: ("baseline", [_crafted_baseline(i) for i in range(3)]),
            probe[("speculative", 4)]: (
                "speculative",
                [_crafted_prompt(i, 4, [4, 2, 3], 0.004, 0.011) for i in range(3)],
            ),
        },
    )
    predicted = {1: 1.4, 2: 2.1, 3: 2.5, 4: 2.6}
    set_predicted_curve(store, experiment_id, predicted, [2, 3])
    base, k2, k3 = add_k_runs(store, experiment_id, [2, 3])
    _record_runs(
        store,
        {
            base: ("baseline", [_crafted_baseline(i) for i in range(3)]),
            k2: ("speculative", [_crafted_prompt(i, 2, [2, 1, 2], 0.002, 0.010) for i in range(3)]),
            k3: ("speculative", [_crafted_prompt(i, 3, [3, 1, 2], 0.003, 0.010) for i in range(3)]),
        },
    )
    from pages.widgets.charts import SPEEDUP_SERIES

    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    drawn = next(d for chart in chart_data(at) for d in chart if "series" in d and "lo" in d)
    auto = drawn[drawn["series"] == SPEEDUP_SERIES["predicted_auto"][0]].set_index("x")["value"]
    assert auto.to_dict() == pytest.approx(predicted)
    at = app("experiment", experiment=experiment_id, section="Predictions and cost")
    confirmed = next(d.value for d in at.dataframe if "prediction_error" in d.value)
    measured = q.runs(store, experiment_id).set_index("run_id")["speedup"]
    assert confirmed["k"].tolist() == [2, 3]
    assert confirmed["prediction_error"].tolist() == pytest.approx(
        [predicted[2] / measured[k2] - 1, predicted[3] / measured[k3] - 1]
    )
    assert any("confirmed at k = 2, 3" in m.value for m in at.markdown)


def test_experiments_list_shows_the_best_with_its_interval_ties_and_a_warning_mark(crafted):
    store, experiment_id, ids = crafted
    at = app("experiments")
    assert_clean(at)
    row = at.dataframe[0].value.set_index("experiment_id").loc[experiment_id]
    best = q.run_summary(store, ids[2]).iloc[0]
    assert row["best_label"] == "2" and row["best_speedup"] == pytest.approx(best.speedup)
    assert row["interval"] == f"{best.speedup_ci_lo:.2f}–{best.speedup_ci_hi:.2f}"
    assert row["timing_warnings"] == 1 and row["n_tied"] == 0 and row["repeats"] == 3
    config = json.loads(at.dataframe[0].proto.columns)
    assert (
        config["timing_warnings"]["label"] == "⚠ impossible" and "never the best" in config["timing_warnings"]["help"]
    )


def test_experiments_page_names_the_worker_a_waiting_worker_waits_for(crafted):
    store, experiment_id, _ = crafted
    for worker in ("gpu-box-1", "gpu-box-2"):
        liveness.register_worker(store, worker)
    assert acquire_lease(store, "gpu-box:cuda:0", "gpu-box-1", experiment_id, stale_seconds=60) is None
    assert acquire_lease(store, "gpu-box:cuda:0", "gpu-box-2", None, stale_seconds=60) == "gpu-box-1"
    leases = q.device_leases(store)
    assert leases[["device", "worker_id", "experiment_id", "waiting_worker"]].values.tolist() == [
        ["gpu-box:cuda:0", "gpu-box-1", experiment_id, "gpu-box-2"]
    ]
    at = app("experiments")
    assert_clean(at)
    (waiting,) = [i.value for i in at.info if "waiting" in i.value]  # who waits, for which device, held by whom
    said = ("gpu-box-2 is waiting", "gpu-box:cuda:0", "held by worker gpu-box-1", f"experiment #{experiment_id}")
    assert not missing(waiting, *said), waiting
    release_lease(store, "gpu-box:cuda:0", "gpu-box-1")
    assert acquire_lease(store, "gpu-box:cuda:0", "gpu-box-2", None, stale_seconds=60) is None
    assert q.device_leases(store)["waiting_worker"].isna().all()
    at = app("experiments")
    assert not [i.value for i in at.info if "waiting" in i.value]


def test_device_leases_query_on_sqlite_and_postgresql(store):
    experiment_id = enqueue_experiment(
        store, name="l", target="t", draft="d", prompts="p", sampling={}, sweep_values=[1], prompt_texts=PROMPTS
    )
    assert q.device_leases(store).empty
    for worker in ("a", "b", "c"):
        liveness.register_worker(store, worker)
    assert acquire_lease(store, "host:cpu", "a", experiment_id, stale_seconds=60) is None
    for waiter in ("c", "b"):
        assert acquire_lease(store, "host:cpu", waiter, None, stale_seconds=60) == "a"
    leases = q.device_leases(store)
    assert leases["waiting_worker"].tolist() == ["b", "c"] and set(leases["worker_id"]) == {"a"}
    assert leases["experiment_id"].tolist() == [experiment_id] * 2 and leases["acquired"].notna().all()
    liveness.unregister_worker(store, "a")  # the holder is gone: its lease goes, the others still wait
    leases = q.device_leases(store)
    assert leases["waiting_worker"].tolist() == ["b", "c"] and leases["worker_id"].isna().all()


def test_compare_draws_speedup_intervals_and_lists_the_best_with_its_interval(crafted):
    store, experiment_id, ids = crafted
    at = app("compare", experiments=experiment_id, runs=f"{ids[1]},{ids[2]}")
    assert_clean(at)
    speedup = next(d for d in chart_data(at)[0] if "speedup_ci_lo" in d).set_index("run_id")
    runs = q.runs(store, experiment_id).set_index("run_id")
    for run_id in ids.values():
        assert speedup.loc[run_id, ["speedup_ci_lo", "speedup_ci_hi"]].tolist() == pytest.approx(
            runs.loc[run_id, ["speedup_ci_lo", "speedup_ci_hi"]].tolist()
        )
    assert speedup.loc[ids[4], "state"] == "not finished" and '"errorbar"' in chart_titles(at)[0]
    table = next(d.value for d in at.dataframe if "best" in d.value)
    best = runs.loc[ids[2]]
    assert table["best"].tolist() == [f"{best.speedup:.2f}× ({best.speedup_ci_lo:.2f}–{best.speedup_ci_hi:.2f})"]
    assert table["timing_warnings"].tolist() == [1]
    metrics_table = next(d.value for d in at.dataframe if "timing warning" in d.value.index)  # its header
    assert (
        "exceeds" in metrics_table.loc["timing warning"].iloc[0] and metrics_table.loc["timing warning"].iloc[1] == "—"
    )


def test_new_experiment_repeats_and_auto_k_reach_the_queue(empty_db, model_dirs):
    from pages.new_experiment import AUTO_K

    at = _fill(app("new"), model_dirs, sweep_values="1,2", max_new_tokens=8, name="listed")
    assert at.number_input(key="repeats").value == 3  # the default
    at.number_input(key="repeats").set_value(2)
    at.button(key="launch").click().run()
    assert_clean(at)
    at.selectbox(key="sweep_variable").set_value(AUTO_K).run()
    assert at.number_input(key="k_auto").value == 8 and not [t for t in at.text_input if t.key == "sweep_values"]
    at.number_input(key="k_auto").set_value(6)
    at.number_input(key="repeats").set_value(5)
    at.text_input(key="name").set_value("auto")
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error and "k = 6" in at.success[-1].value and "5 repeats per prompt" in at.success[-1].value
    store = open_store(empty_db)
    listing = catalog.experiments(store).set_index("name")
    listed, auto = (q.experiment(store, int(listing.loc[n, "experiment_id"])) for n in ("listed", "auto"))
    assert (listed["repeats"], listed["k_auto"], listed["sweep_values"]) == (2, None, [1, 2])
    assert (auto["repeats"], auto["k_auto"], auto["sweep_values"]) == (5, 6, [6])
    runs = q.runs(store, auto["experiment_id"])
    assert runs["kind"].tolist() == ["baseline", "speculative"] and runs["k"].iloc[1] == 6


def test_the_new_experiment_form_cannot_trust_remote_code(empty_db, model_dirs):
    """trust_remote_code stays CLI-only (`draftlab run --trust-remote-code`): no widget, no URL parameter."""
    at = _fill(app("new", trust_remote_code="true", trust="1"), model_dirs, sweep_values="1", device="cpu")
    assert_clean(at)
    labels = [
        str(getattr(w, "label", "")).lower()
        for kind in ("checkbox", "toggle", "radio", "selectbox", "text_input")
        for w in at.get(kind)
    ]
    assert not any("remote" in label or "trust" in label for label in labels), labels
    at.button(key="launch").click().run()
    assert_clean(at)
    store = open_store(empty_db)
    experiment_id = int(catalog.experiments(store)["experiment_id"].iloc[0])
    assert not get_experiment(store, experiment_id)["trust_remote_code"]


def test_theory_loads_alpha_c_and_verify_cost_from_a_measured_run(crafted):
    from pages.theory import cost_aware_speedup

    store, experiment_id, ids = crafted
    at = app("theory")
    assert_clean(at)
    assert at.selectbox(key="theory_experiment").value is None  # by hand until an experiment is picked
    assert not any("refined" in m.label.lower() for m in at.metric)
    at.selectbox(key="theory_experiment").set_value(experiment_id).run()
    assert_clean(at)
    run = q.run_summary(store, ids[2]).iloc[0]  # the finished run with the best speedup is loaded first
    assert at.selectbox(key="theory_run").value == ids[2]
    assert at.slider(key="theory_alpha").value == pytest.approx(run.alpha)
    assert at.slider(key="theory_c").value == pytest.approx(run.c)
    assert at.slider(key="theory_k").value == 2
    assert at.number_input(key="theory_verify").value == pytest.approx(run.verify_cost)
    expected = cost_aware_speedup(run.alpha, 2, run.c, run.verify_cost)
    assert metrics(at)["Cost-aware speedup at k=2"] == f"{expected:.2f}×"
    assert metrics(at)["Speedup at k=2"] == f"{theory.predicted_speedup(run.alpha, 2, run.c):.2f}×"
    curves = next(d for d in chart_data(at)[0] if "metric" in d)
    refined = curves[curves["metric"] == "cost_aware_speedup"].set_index("k")["value"]
    assert refined.loc[2] == pytest.approx(expected) and len(refined) == 16
    assert any("E[L_k] / (k/c + verify cost)" in c.value for c in at.caption)

    at.slider(key="theory_alpha").set_value(0.5).run()  # moving a slider afterwards is not undone by the loader
    assert at.slider(key="theory_alpha").value == 0.5
    at.selectbox(key="theory_run").set_value(ids[1]).run()
    assert at.slider(key="theory_k").value == 1
    assert at.slider(key="theory_alpha").value == pytest.approx(q.run_summary(store, ids[1]).iloc[0].alpha)


def test_theory_refined_curve_is_the_formula_at_verify_cost_one():
    from pages.theory import formula_frame

    frame = formula_frame(0.7, 5.0, k_max=8, verify_cost=1.0)
    assert frame["cost_aware_speedup"].tolist() == pytest.approx(frame["predicted_speedup"].tolist())
    costly = formula_frame(0.7, 5.0, k_max=8, verify_cost=1.5)
    assert (costly["cost_aware_speedup"] < costly["predicted_speedup"]).all()
    assert "cost_aware_speedup" not in formula_frame(0.7, 5.0)


def test_theory_works_without_a_reachable_database(monkeypatch):
    monkeypatch.setenv("DRAFTLAB_DB", "postgresql://draftlab:s3cret@127.0.0.1:1/draftlab")
    at = app("theory")
    assert_clean(at)
    assert not at.error and any("cannot be read right now" in c.value for c in at.caption)
    assert metrics(at)["Best k"]  # the formulas are still drawn


def test_detail_of_a_sweep_named_by_labels_marks_its_best_by_name(populated):
    """Draft and drafter sweeps: runs carry sweep_value = their index and sweep_label = the name, and the verdict
    (storage/analysis/verdict.py, through engine/config/variables.py's run_value) names the best by label; the page
    marks its run."""
    from sqlalchemy import text

    experiment_id = _greedy_id(populated)
    with populated.write() as conn:
        conn.execute(
            text(
                "UPDATE runs SET sweep_label = 'draft-' || CAST(k AS TEXT) WHERE experiment_id = :eid "
                "AND kind = 'speculative'"
            ),
            {"eid": experiment_id},
        )
        conn.execute(text("UPDATE experiments SET sweep_variable = 'draft' WHERE id = :eid"), {"eid": experiment_id})
    curve = q.sweep_curve(populated, experiment_id)
    best_run = int(curve.loc[curve["k"] == 2, "run_id"].iloc[0])
    with populated.write() as conn:  # k = 2 measured best (the greedy experiment's runs are crafted so)
        conn.execute(
            text(
                "UPDATE runs SET speedup = speedup + 1, speedup_ci_lo = speedup_ci_lo + 1, "
                "speedup_ci_hi = speedup_ci_hi + 1 WHERE id = :rid"
            ),
            {"rid": best_run},
        )
    with populated.write() as conn:
        conn.execute(
            text("UPDATE runs SET timing_warning = 'drifted' WHERE id = :rid"),
            {"rid": int(curve.loc[curve["k"] == 4, "run_id"].iloc[0])},
        )
    at = app("experiment", experiment=experiment_id)
    assert_clean(at)
    assert metrics(at)["draft to serve"] == "draft-2"
    served = next(d for chart in chart_data(at) for d in chart if "label" in d)
    assert served["label"].tolist() == ["serve draft = draft-2"] and served["x"].tolist() == [2]
    rejected = app("experiment", experiment=experiment_id, section="Why drafts are rejected")
    assert rejected.query_params["run"] in ([str(best_run)], str(best_run))  # its breakdowns open on it
    assert any("(draft = draft-4) is never picked" in w.value for w in at.warning)


# --- New experiment: a link fills the form; draft and drafter sweeps ---------------------------------------------


def _runs_table(store, experiment_id: int) -> pd.DataFrame:
    """The runs' own columns (draft, drafter, label) in insertion order, straight from the runs table."""
    from sqlalchemy import text

    with store.read() as conn:
        return pd.DataFrame(
            conn.execute(
                text(
                    "SELECT kind, draft, drafter, sweep_label, k, baseline_run_id, temperature FROM runs "
                    "WHERE experiment_id = :eid ORDER BY id"
                ),
                {"eid": experiment_id},
            )
            .mappings()
            .all()
        )


def _launched(url: str) -> dict:
    store = open_store(url)
    listing = catalog.experiments(store)
    assert len(listing) == 1, listing
    experiment = q.experiment(store, int(listing["experiment_id"].iloc[0]))
    assert experiment is not None
    return experiment


def test_new_experiment_link_from_a_finding_fills_the_form(empty_db, model_dirs):
    from storage.analysis.findings import prefill_query

    page, params = prefill_query(
        {
            "target": model_dirs["target"],
            "draft": model_dirs["draft"],
            "prompts": "math:validation",
            "temperature": 0.0,
            "top_k": 40,
            "top_p": 0.9,
            "seed": 7,
            "max_new_tokens": 8,
            "device": "cpu",
            "dtype": "float32",
            "repeats": 5,
            "sweep": "temperature",
            "values": "0.5,1",
            "k": 3,
            "notes": "Follow-up: **not bold** [x](http://e.vil)",
            "drafter": "confidence:0.3",
        }
    )
    at = app(page, **params)
    assert_clean(at)
    assert at.text_input(key="target").value == model_dirs["target"]
    assert at.text_input(key="draft").value == model_dirs["draft"]
    assert at.selectbox(key="prompt_set").value == "math:validation"
    assert [at.number_input(key=k).value for k in ("temperature", "top_k", "top_p", "seed", "max_new_tokens")] == [
        0.0,
        40,
        0.9,
        7,
        8,
    ]
    assert (at.selectbox(key="device").value, at.selectbox(key="dtype").value) == ("cpu", "float32")
    assert at.selectbox(key="sweep_variable").value == "temperature"
    assert at.text_input(key="sweep_values").value == "0.5,1"
    assert (at.number_input(key="fixed_k").value, at.number_input(key="repeats").value) == (3, 5)
    assert (
        at.selectbox(key="drafter").value == "confidence"
        and at.number_input(key="drafter_param_confidence").value == 0.3
    )
    assert at.text_area(key="notes").value == "Follow-up: **not bold** [x](http://e.vil)"
    assert "**not bold**" not in page_text(at).replace(at.text_area(key="notes").value, "")  # only the text area
    assert not any("Left out" in c.value for c in at.caption)
    at.number_input(key="seed").set_value(8).run()  # the link fills the form once: edits stay
    assert at.number_input(key="seed").value == 8 and at.number_input(key="top_k").value == 40
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    experiment = _launched(empty_db)
    assert (experiment["sweep_variable"], experiment["sweep_values"], experiment["k"], experiment["repeats"]) == (
        "temperature",
        [0.5, 1.0],
        3,
        5,
    )
    assert (experiment["seed"], experiment["top_k"], experiment["prompts"]) == (8, 40, "math:validation")
    runs = _runs_table(open_store(empty_db), experiment["experiment_id"])
    assert set(runs.loc[runs["kind"] == "speculative", "drafter"]) == {"confidence:0.3"}  # one drafter, every run


def test_new_experiment_link_with_a_bad_parameter_ignores_it_with_a_note(empty_db):
    at = app(
        "new", seed="٣", top_p="2", sweep="auto", k_auto="6", notes="*hi*", prompts="../x.txt", drafter="confidence:1"
    )
    assert_clean(at)
    assert at.number_input(key="seed").value == 0 and at.number_input(key="top_p").value == 1.0
    assert at.selectbox(key="prompt_set").value == "code:tune" and at.selectbox(key="drafter").value == "model"
    assert at.selectbox(key="sweep_variable").value == "k: auto (predict, then confirm)"
    assert at.number_input(key="k_auto").value == 6 and at.text_area(key="notes").value == "*hi*"
    note = next(c.value for c in at.caption if c.value.startswith("Left out from the link"))
    for key in ("seed", "top\\_p", "prompts", "drafter"):
        assert key in note, note


def test_new_experiment_draft_sweep_enqueues_one_run_per_candidate(empty_db, model_dirs):
    at = _fill(app("new"), model_dirs, max_new_tokens=8, name="drafts")
    at.selectbox(key="sweep_variable").set_value("draft").run()
    assert at.multiselect(key="draft_candidates").value == [model_dirs["draft"]]  # starts from the draft field
    assert not [t for t in at.text_input if t.key == "draft"]
    candidates = [model_dirs["draft"], model_dirs["target"]]
    at.multiselect(key="draft_candidates").set_value(candidates).run()
    assert_clean(at)
    assert len([s for s in at.success if "tokenizers match" in s.value]) == 2
    at.number_input(key="fixed_k").set_value(3)
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    experiment = _launched(empty_db)
    assert (experiment["sweep_variable"], experiment["sweep_values"], experiment["k"]) == ("draft", candidates, 3)
    runs = _runs_table(open_store(empty_db), experiment["experiment_id"])
    assert runs["kind"].tolist() == ["baseline", "speculative", "speculative"]
    spec = runs[runs["kind"] == "speculative"]
    assert spec["draft"].tolist() == candidates and spec["sweep_label"].tolist() == candidates
    assert set(spec["drafter"]) == {"model"} and spec["k"].tolist() == [3, 3]
    assert spec["baseline_run_id"].nunique() == 1  # one shared baseline
    at.selectbox(key="sweep_variable").set_value("k").run()  # the single draft field is back, as it was
    assert at.text_input(key="draft").value == model_dirs["draft"]


def test_new_experiment_launches_an_eagle3_head_as_eagle3(empty_db, model_dirs, tmp_path):
    """An EAGLE-3 head as the draft: the pair check reads it as the engine would, the Drafter field gives way to
    the head (it drafts as eagle3), and Launch queues eagle3 runs."""
    head = tmp_path / "head"  # a config is all the form reads (the target: 1 layer, hidden 8, vocab 64)
    head.mkdir()
    layer = {"vocab_size": 64, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2}
    (head / "config.json").write_text(
        json.dumps(
            {
                "speculators_model_type": "eagle3",
                "transformer_layer_config": layer,
                "draft_vocab_size": 64,
                "eagle_aux_hidden_state_layer_ids": [0, 0, 0],
                "speculators_config": {"verifier": {"name_or_path": model_dirs["target"]}},
            }
        )
    )
    head = str(head)
    at = _fill(app("new"), model_dirs, draft=head, sweep_values="2,3", max_new_tokens=8, name="head")
    assert_clean(at)
    assert at.success and "EAGLE-3 head (speculators layout)" in at.success[0].value
    assert not [s for s in at.selectbox if s.key == "drafter"]
    assert any("drafts as eagle3" in c.value for c in at.caption)
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    experiment = _launched(empty_db)
    runs = _runs_table(open_store(empty_db), experiment["experiment_id"])
    spec = runs[runs["kind"] == "speculative"]
    assert set(spec["drafter"]) == {"eagle3"} and set(spec["draft"]) == {head}


def test_new_experiment_drafter_sweep_enqueues_the_specs(empty_db, model_dirs):
    at = _fill(app("new"), model_dirs, max_new_tokens=8, name="drafters")
    at.selectbox(key="sweep_variable").set_value("drafter").run()
    assert not [s for s in at.selectbox if s.key == "drafter"]  # swept, so no single drafter choice
    at.multiselect(key="drafter_sweep").set_value(["model", "confidence", "prompt-lookup"]).run()
    at.text_input(key="drafter_sweep_param_confidence").set_value("0.3, 0.7")
    at.text_input(key="drafter_sweep_param_prompt-lookup").set_value("2").run()
    assert_clean(at)
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    specs = ["model", "confidence:0.3", "confidence:0.7", "prompt-lookup:2"]
    experiment = _launched(empty_db)
    assert (experiment["sweep_variable"], experiment["sweep_values"]) == ("drafter", specs)
    runs = _runs_table(open_store(empty_db), experiment["experiment_id"])
    spec = runs[runs["kind"] == "speculative"]
    assert spec["drafter"].tolist() == specs
    drafts = dict(zip(spec["drafter"], spec["draft"]))  # prompt lookup drafts with no model: its run names none
    assert all(d == model_dirs["draft"] for name, d in drafts.items() if not name.startswith("prompt-lookup"))
    assert pd.isna(drafts["prompt-lookup:2"])
    assert runs["kind"].tolist().count("baseline") == 1
    assert "drafter = model, confidence:0.3" in at.success[-1].value.replace("\u2060", "")


def test_new_experiment_drafter_sweep_with_a_bad_threshold_is_not_launched(empty_db, model_dirs):
    at = _fill(app("new"), model_dirs)
    at.selectbox(key="sweep_variable").set_value("drafter").run()
    at.multiselect(key="drafter_sweep").set_value(["confidence"]).run()
    at.text_input(key="drafter_sweep_param_confidence").set_value("1.5").run()
    at.button(key="launch").click().run()
    assert_clean(at)
    assert any("Not launched" in e.value and "probability threshold" in e.value for e in at.error)
    assert catalog.experiments(open_store(empty_db)).empty


def test_new_experiment_a_mismatched_draft_candidate_blocks_the_launch(empty_db, model_dirs):
    from pages.widgets.prefill import md_text

    at = app("new", sweep="draft", values=f"{model_dirs['draft']},{model_dirs['other']}")
    at.text_input(key="target").set_value(model_dirs["target"]).run()
    assert at.multiselect(key="draft_candidates").value == [model_dirs["draft"], model_dirs["other"]]
    assert any(md_text(model_dirs["other"]) in e.value and "disagree" in e.value for e in at.error)
    at.button(key="launch").click().run()
    assert_clean(at)
    blocked = [e.value for e in at.error if e.value.startswith("Not launched")]
    assert blocked and md_text(f"pair check for draft {model_dirs['other']!r} failed") in blocked[0]
    assert "disagree" not in blocked[0]  # the reason is shown once, under Models, where the check ran
    assert md_text(f"draft {model_dirs['draft']!r}") not in blocked[0]  # only the mismatched one is named
    assert catalog.experiments(open_store(empty_db)).empty


# --- issue 12: the tuning team's dashboard ----------------------------------------------------------------------


def _specs(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("vega_lite_chart")]


def _encodings(spec: dict, channel: str) -> list[dict]:
    """Every `channel` encoding of a (layered) Vega-Lite spec."""
    found = [spec.get("encoding", {}).get(channel)] if spec.get("encoding", {}).get(channel) else []
    for layer in spec.get("layer", []):
        found += _encodings(layer, channel)
    return found


def test_compare_legends_are_whole_colours_distinct_and_badges_name_ties_and_validation(crafted):
    from sqlalchemy import text

    from tests.test_storage import enqueue

    store, experiment_id, ids = crafted
    long_name = "validation of the crafted sweep on held-out prompts, a long name " * 2
    validation = enqueue(store, ks=(2,), prompts=2, name=long_name)
    with store.write() as conn:
        conn.execute(
            text("UPDATE experiments SET validates = :v WHERE id = :id"), {"v": experiment_id, "id": validation}
        )
    _set_speedups(store, ids, {1: (1.25, 1.18, 1.35), 2: (1.31, 1.22, 1.40)})
    at = app("compare", experiments=f"{experiment_id},{validation}", runs=f"{ids[1]},{ids[2]}")
    assert_clean(at)
    colours = [c for spec in _specs(at) for c in _encodings(spec, "color") if c.get("legend")]
    assert colours, "Compare draws no legend"
    for colour in colours:
        assert colour["legend"]["labelLimit"] == 0 and colour["legend"]["symbolLimit"] == 0
        assert colour["scale"]["scheme"] in ("tableau10", "tableau20")
    table = next(d.value for d in at.dataframe if "badges" in d.value).set_index("experiment_id")
    assert table.loc[experiment_id, "badges"] == f"≈ tied with 1 · ✔ validated by #{validation}"
    assert table.loc[validation, "badges"] == f"✔ validates #{experiment_id}"
    by_type = [json.dumps(spec) for spec in _specs(at) if "token_type" in json.dumps(spec)]
    assert len(by_type) == 1 and "n_label" in by_type[0] and '"text"' in by_type[0]
    assert next(d for chart in chart_data(at) for d in chart if "token_type" in d)["verified"].notna().all()


def test_detail_rate_bars_carry_their_counts_and_flag_small_samples(crafted):
    store, experiment_id, ids = crafted
    at = app("experiment", experiment=experiment_id, run=ids[2], section="Why drafts are rejected")
    assert_clean(at)
    data = [d for chart in chart_data(at) for d in chart]
    by_position = next(d for d in data if "reached" in d and "position" in d).sort_values("position")
    assert by_position["reached"].tolist() == q.acceptance_by_position(store, ids[2])["reached"].tolist()
    by_type = next(d for d in data if "verified" in d and "token_type" in d)
    assert by_type["verified"].tolist() == q.acceptance_by_type(store, ids[2])["verified"].tolist()
    labelled = [spec for spec in _specs(at) if "n_label" in json.dumps(spec)]
    assert len(labelled) == 2  # both rate charts: an `n=` text layer over the bars, computed from the counts
    for spec in labelled:
        assert any(
            layer["mark"]["type"] == "text" and layer["encoding"]["text"]["field"] == "n_label"
            for layer in spec["layer"]
        )
    assert any("fewer than 30 tokens" in c.value for c in at.caption)


def test_count_labels_star_only_small_samples():
    from pages.widgets.charts import with_counts

    frame = with_counts(pd.DataFrame({"verified": [29, 30, 1000]}), "verified")
    assert frame["n_label"].tolist() == ["n=29*", "n=30", "n=1000"] and frame["small"].tolist() == [True, False, False]


def test_token_selection_maps_to_its_round():
    from pages.widgets.charts import selected_round

    rounds = [0, 1, 2]
    assert selected_round({"selection": {"token": [{"round": 2}]}}, rounds) == 2
    assert selected_round({"selection": {"token": [{"round": -1}]}}, rounds) is None  # the prefill token: no round
    assert selected_round({"selection": {"token": [{"round": 7}]}}, rounds) is None
    assert selected_round({"selection": {"token": []}}, rounds) is None
    assert selected_round({"selection": {"token": [{"round": "<b>1</b>"}]}}, rounds) is None
    assert selected_round(None, rounds) is None and selected_round("junk", rounds) is None


def test_token_layout_keeps_line_breaks_and_marks_the_prefill_token():
    from pages.widgets.charts import token_layout

    output = pd.DataFrame(
        {
            "position": [0, 1, 2, 3],
            "token_id": [5, 6, 7, 8],
            "text": ["a", "b\n", "<i>c", " "],
            "kind": ["first", "accepted", "correction", "bonus"],
            "round_index": [None, 0, 0, 1],
        }
    )
    layout = token_layout(output)
    assert layout["round"].tolist() == [-1, 0, 0, 1]
    assert layout["line"].tolist() == [0, 0, 1, 1] and layout["shown"].tolist() == ["a", "b↵", "<i>c", "·"]


def test_round_explorer_token_chart_selects_a_round_and_shows_its_proposals(crafted, monkeypatch):
    from pages.widgets import charts

    store, experiment_id, ids = crafted
    at = app("rounds", experiment=experiment_id, run=ids[2], prompt=1)
    assert_clean(at)
    params = [
        p
        for spec in _specs(at)
        for p in spec.get("params", []) + [p for layer in spec.get("layer", []) for p in layer.get("params", [])]
        if p.get("name") == "token"
    ]
    assert len(params) == 1 and params[0]["select"]["type"] == "point" and params[0]["select"]["fields"] == ["round"]
    assert any(c.value == "p1" for c in at.code)  # the prompt as a code block
    output = q.prompt_output(store, ids[2], 1)
    last = int(output["round_index"].dropna().max())
    assert at.select_slider(key="select_round").value == 0
    # A click on a token of round `last`: the chart's widget (its key names a generation) holds that selection
    # until the slider moves or another prompt is shown, which gives the chart a fresh key and no selection.
    clicked_in = []

    def click_held_by_the_current_chart(event, rounds):
        import streamlit as st

        return last if st.session_state["token_chart_generation"] in clicked_in else None

    monkeypatch.setattr(charts, "selected_round", click_held_by_the_current_chart)
    clicked_in.append(at.session_state["token_chart_generation"])
    at.run()
    assert_clean(at)
    assert at.query_params["round"] in ([str(last)], str(last)) and at.select_slider(key="select_round").value == last
    proposals = next(d.value for d in at.dataframe if "p_draft" in d.value)
    assert proposals["outcome"].tolist() == q.round_proposals(store, ids[2], 1, last)["outcome"].tolist()
    at.select_slider(key="select_round").set_value(0).run()  # the slider stays free after a click
    assert_clean(at)
    assert at.select_slider(key="select_round").value == 0
    at.run()
    assert at.select_slider(key="select_round").value == 0  # and stays there on the next rerun
    clicked_in.append(at.session_state["token_chart_generation"])  # the same token clicked again
    at.run()
    assert at.select_slider(key="select_round").value == last  # selects its round again
    spec = next(spec for spec in _specs(at) if "shown" in json.dumps(spec))
    layers = spec["layer"]
    assert [layer["mark"]["type"] for layer in layers] == ["rect", "text", "rect"]
    token = [p for p in spec.get("params", []) if p["name"] == "token"]  # Altair lifts a layer's selection up
    assert token and token[0]["views"] == [layers[-1]["name"]]  # the topmost mark, the one clicked, holds it
    assert layers[-1]["mark"]["fill"] == "transparent" and "tooltip" in layers[-1]["encoding"]


def test_theory_chart_has_a_y_title_and_names_its_curves_in_words(empty_db):
    from pages.widgets.charts import FORMULA

    at = app("theory")
    assert_clean(at)
    spec = json.dumps(_specs(at)[0], ensure_ascii=False)
    assert "speedup (×) · tokens per round" in spec
    for name in (f"speedup {FORMULA}", "expected tokens per round E[L_k]"):
        assert name in spec
    assert '"field": "series"' in spec  # the legend's field: the words, not predicted_speedup


def test_experiments_table_shows_a_dash_for_pending_metrics(crafted):
    from tests.test_storage import enqueue

    store, _, _ = crafted
    pending = enqueue(store, ks=(2,), prompts=2, name="not run yet")
    at = app("experiments")
    assert_clean(at)
    grid = next(d for d in at.dataframe if "interval" in d.value)
    assert grid.proto.placeholder == "—"  # every missing cell (best k, speedup, alpha) reads — not None
    row = grid.value.set_index("experiment_id").loc[pending]
    assert pd.isna(row["interval"]) and pd.isna(row["best_speedup"])
    config = json.loads(grid.proto.columns)
    # model names are never squeezed into a narrow column ('demo-targe' at 1400 px): the grid sizes it to fit
    assert config["notes"]["width"] == "medium" and "width" not in config["target"]


def test_detail_speedup_csv_has_integer_run_ids_and_the_runs_table_stays_open_once_done(populated):
    from pages.experiment_detail import speedup_frame
    from storage.analysis.formula import pooled_inputs

    experiment_id = _greedy_id(populated)
    curve = q.sweep_curve(populated, experiment_id)
    frame = speedup_frame(curve, "k", pooled_inputs(populated, experiment_id))
    assert len(frame) > len(curve)  # the formula's k values without a run
    lines = frame.to_csv(index=False).splitlines()
    run_ids = [line.split(",")[lines[0].split(",").index("run_id")] for line in lines[1:]]
    assert {r for r in run_ids if r} == {str(int(r)) for r in curve["run_id"]}  # 7, never 7.0
    at = app("experiment", experiment=experiment_id, section="Runs")
    assert_clean(at)
    assert any("outputs_match_baseline" in d.value for d in at.dataframe)  # the Runs section: the table, open


def _element_paths(at: AppTest) -> dict[tuple, object]:
    """Every element of the last run by its place on the page (its index path in the block tree), which is what
    the browser keys its elements on: an element sent to a place replaces what the last run left there."""
    found = {}

    def walk(node, path) -> None:
        children = getattr(node, "children", None)
        if children:
            for index, child in children.items():
                walk(child, (*path, index))
        elif getattr(node, "proto", None) is not None:
            found[path] = node

    walk(at._tree, ())
    return found


def test_new_experiment_pair_check_replaces_the_last_result_with_checking_while_it_runs(
    empty_db, model_dirs, tmp_path, monkeypatch
):
    import pages.widgets.pair_check as pair_check

    at = _fill(app("new"), model_dirs)
    assert_clean(at)
    matched = [p for p, e in _element_paths(at).items() if e.type == "success" and "tokenizers match" in e.value]
    assert len(matched) == 1
    place = matched[0]

    def interrupted(target, draft):
        raise RuntimeError("the check is still running")

    # Another draft, whose check has work to do, stopped mid-check: the page as a browser shows it meanwhile.
    other = tmp_path / "another-draft"
    shutil.copytree(model_dirs["draft"], other)
    monkeypatch.setattr(pair_check, "check_pair_names", interrupted)
    at.text_input(key="draft").set_value(str(other)).run()
    elements = _element_paths(at)
    assert place in elements and elements[place].type == "info", elements.get(place)
    assert "checking that the two tokenizers match" in elements[place].value  # the old note's place: it is gone
    assert not [e for e in at.success if "tokenizers match" in e.value]
    monkeypatch.undo()
    at.run()  # the check finishes: its result takes that place
    assert_clean(at)
    elements = _element_paths(at)
    assert elements[place].type == "success" and "tokenizers match" in elements[place].value
    at.text_input(key="draft").set_value(model_dirs["draft"]).run()  # remembered: drawn at once, in the same place
    elements = _element_paths(at)
    assert elements[place].type == "success" and not [e for e in at.info if "checking" in e.value]


def test_compare_sweeps_are_separate_panels_with_one_legend_and_names_at_the_line_ends(populated):
    """Separate charts, each stretched to its column (a concatenation of fixed-width panels ran its third panel off
    the page), one legend (under the first) and the same colour for an experiment in every panel."""
    from sqlalchemy import text

    listing = catalog.experiments(populated)
    a, b = (int(i) for i in listing[listing["sweep_variable"] == "k"]["experiment_id"][:2])
    odd = """<b>bold</b> "quoted" 'single' {braces}"""
    with populated.write() as conn:
        conn.execute(text("UPDATE experiments SET name = :n WHERE id = :id"), {"n": odd, "id": b})
    at = app("compare", experiments=f"{a},{b}")
    assert_clean(at)
    titles = ["speedup (×) vs k", "alpha vs k", "tokens per round vs k"]
    panels = [s for s in _specs(at) if s.get("title") in titles]
    assert not [s for s in _specs(at) if "hconcat" in s]
    assert [p["title"] for p in panels] == titles
    assert all("width" not in p for p in panels)  # no fixed width: each chart fills its column
    for panel in panels:  # no legend of their own: the one they share is a chart of its own below them
        assert all(c.get("legend", "absent") is None for c in _encodings(panel, "color"))
    legend = next(s for s in _specs(at) if "row" in json.dumps(s) and "title" not in s)
    assert {c["field"] for c in _encodings(legend, "color")} == {"experiment"}
    assert _encodings(legend, "color")[0]["scale"]["domain"] == _encodings(panels[0], "color")[0]["scale"]["domain"]
    assert '"errorbar"' in json.dumps(panels[0]) and '"errorbar"' not in json.dumps(panels[1:])
    for panel in panels:  # one colour per experiment, the same field and colour domain in every panel
        fields = {c["field"] for c in _encodings(panel, "color")}
        assert fields == {"experiment"}
        domains = {json.dumps(c["scale"]["domain"], ensure_ascii=False) for c in _encodings(panel, "color")}
        assert len(domains) == 1 and len(json.loads(domains.pop())) == 2
        labels = [layer for layer in panel["layer"] if layer["mark"]["type"] == "text"]
        assert [label["mark"]["align"] for label in labels] == ["left"]  # right of every line's end
        assert {label["encoding"]["text"]["field"] for label in labels} == {"line_label"}
    ends = [d for chart in chart_data(at) for d in chart if "label_y" in d]
    assert len(ends) == 3  # one table of end labels per panel
    last = {
        f"#{a}": q.sweep_curve(populated, a)["sweep_value"].max(),
        f"#{b}": q.sweep_curve(populated, b)["sweep_value"].max(),
    }
    for end in ends:  # one short label per experiment, at its last swept value; the legend names it in full
        assert dict(zip(end["line_label"], end["sweep_value"])) == last
        assert set(end["label_x"]) == {max(last.values())}
    legend_names = set(next(d for chart in chart_data(at) for d in chart if "row" in d)["experiment"])
    assert any(odd in name for name in legend_names)  # the name verbatim, drawn as text
    expressions = json.dumps([t for p in panels for layer in p["layer"] for t in layer.get("transform", [])])
    assert "bold" not in expressions  # a name is data, never part of a Vega expression
    assert "compare_sweep_k.csv" in downloads(at)  # one CSV per swept variable, named after it


def test_end_labels_sit_at_each_lines_last_height_right_of_every_line_and_never_overlap():
    from pages.widgets.charts import END_LABEL_GAP, end_labels

    frame = pd.DataFrame(
        {
            "series": ["a", "a", "b", "b", "c", "c"],
            "name": ["A", "A", "B", "B", "C", "C"],
            "x": [1, 4, 1, 4, 1, 2],
            "y": [0.5, 0.9, 0.4, 0.9, 0.2, float("nan")],
        }
    )
    labels = end_labels(frame, "x", "y", "series", "name", (0, 1)).set_index("series")
    assert labels["x"].to_dict() == {"a": 4, "b": 4, "c": 1}  # c's last point with a value is x = 1
    assert labels.loc["a", "label_y"] == 0.9  # the top one stays at its point
    assert labels.loc["a", "label_y"] - labels.loc["b", "label_y"] == pytest.approx(END_LABEL_GAP)  # moved apart
    assert labels.loc["c", "label_y"] == 0.2
    assert set(labels["label_x"]) == {4.0}  # in the margin right of every line's end, never over a line


def test_coinciding_lines_are_named_and_drawn_each_wider_than_the_next():
    """Greedy decoding at batch 1 and 2 gives the same α at every k: one line lies exactly under the other, so a
    legend entry seemed to have no line. coinciding() names them (the pages' caption) and each series is drawn
    wider than the next, so the one underneath shows as an edge."""
    from pages.widgets.charts import coinciding, coinciding_note, overlaid_curves

    frame = pd.DataFrame(
        {
            "batch": ["batch 1"] * 3 + ["batch 2"] * 3 + ["batch 4"] * 3,
            "k": [1, 2, 4] * 3,
            "alpha": [0.5, 0.6, 0.7, 0.5, 0.6, 0.7, 0.4, 0.6, 0.7],
        }
    )
    assert coinciding(frame, "k", "alpha", "batch") == [["batch 1", "batch 2"]]
    assert coinciding(frame.assign(alpha=frame["alpha"] + frame.index * 1e-3), "k", "alpha", "batch") == []
    note = coinciding_note([["batch 1", "batch 2"]], "α", "k")
    assert not missing(note, "batch 1 and batch 2", "same α", "every k"), note  # the series, the value, the axis
    assert coinciding_note([], "α", "k") is None
    spec = overlaid_curves(frame, "k", "alpha", "batch", "k", "α", (0, 1)).to_dict()
    lines = [layer for layer in spec.get("layer", [spec]) if layer["mark"]["type"] == "line"]
    width = lines[0]["encoding"]["strokeWidth"]["scale"]  # drawn in the data's order: the first underneath, widest
    assert (
        width["domain"] == ["batch 1", "batch 2", "batch 4"]
        and width["range"][0] > width["range"][1] > width["range"][2]
    )
    reordered = overlaid_curves(frame.iloc[::-1], "k", "alpha", "batch", "k", "α", (0, 1)).to_dict()
    line = next(layer for layer in reordered.get("layer", [reordered]) if layer["mark"]["type"] == "line")
    assert line["encoding"]["strokeWidth"]["scale"]["domain"] == ["batch 4", "batch 2", "batch 1"]
    assert spec["height"] > 260  # the legend's rows are added: the plot keeps its height, its title is not cut
