"""One draft sweep compares an EAGLE-3 head with a causal LM (issue 35 item 14): with no drafter named, each draft
drafts with its own (engine/config/run_config.py: a head as eagle3, a causal LM as model), in one experiment against one
baseline. End to end through `draftlab run` on the tiny target, and through every view of the configuration (its
link, the form, the command line, the stored experiment), the detail page's labels and deploy. A drafter that
cannot draft every draft, or a head trained for another target, is still refused in one line."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect, text

from engine.config.run_config import RunConfig
from engine.errors import DraftLabError
from tests.cli_runs import run_json
from tests.meaning import missing
from tests.test_eagle3 import write_head


@pytest.fixture(scope="module")
def head_dir(model_dirs, tmp_path_factory):
    """A random EAGLE-3 head (speculators layout) for the tiny 2-layer target, naming it as its verifier."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(model_dirs["target"])
    return write_head(tmp_path_factory.mktemp("mixed") / "head", target, verifier=model_dirs["target"], aux=[0, 1, 1])


def test_draftlab_run_compares_a_head_with_a_causal_lm_in_one_sweep(
    tmp_path, model_dirs, head_dir, capsys, monkeypatch
):
    """`draftlab run --draft HEAD,LM`: both runs finish, each drafted by its own drafter (the engine built an
    eagle3 drafter over the head and a model drafter over the LM), both greedy outputs equal the baseline's token
    for token, the stored rows, the --json runs, the run table and the detail page's labels name each draft with its
    drafter, the verdict judges both with intervals, and each run's deploy settings are its own drafter's serving
    mapping."""
    from app.report import format_table
    from engine.decoding import runs as engine_runs
    from pages.widgets.common import run_label, swept_values
    from storage import open_store
    from storage.analysis.verdict import verdict
    from storage.records import queries as q
    from storage.serving.deploy import deploy_document

    built = []
    make = engine_runs.make_drafter

    def spy(spec, *, draft_model, **kwargs):
        drafter = make(spec, draft_model=draft_model, **kwargs)
        built.append((spec, type(draft_model).__name__, type(drafter).__name__))
        return drafter

    monkeypatch.setattr(engine_runs, "make_drafter", spy)
    drafts = [head_dir, model_dirs["draft"]]
    doc, db = run_json(
        tmp_path, {**model_dirs, "draft": ",".join(drafts)}, capsys, "--k", "3", "--max-new-tokens", "12"
    )

    assert set(built) == {("eagle3", "Eagle3Head", "Eagle3Drafter"), ("model", "LlamaForCausalLM", "ModelDrafter")}
    assert [(r["draft"], r["drafter"], r["status"], r["sweep_value"]) for r in doc["runs"]] == [
        (head_dir, "eagle3", "done", head_dir),
        (model_dirs["draft"], "model", "done", model_dirs["draft"]),
    ]
    baseline = doc["baseline"]["outputs"]
    assert baseline and all(len(o["token_ids"]) == 12 for o in baseline)
    for run in doc["runs"]:
        assert run["outputs"] == baseline, run["drafter"]  # greedy: the target's own tokens, prompt by prompt
        assert run["outputs_match_baseline"] is True and run["proposed"] > 0 and run["speedup_ci"] is not None

    store = open_store(db)
    eid = doc["experiment_id"]
    experiment = q.experiment(store, eid)
    assert (experiment["sweep_variable"], experiment["sweep_values"]) == ("draft", drafts)
    assert json.loads(experiment["draft_drafters"]) == ["eagle3", "model"]
    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT kind, draft, drafter, sweep_label, baseline_run_id FROM runs "
                "WHERE experiment_id = :eid ORDER BY id"
            ),
            {"eid": eid},
        ).all()
    assert [tuple(r[:4]) for r in rows[1:]] == [
        ("speculative", head_dir, "eagle3", head_dir),
        ("speculative", model_dirs["draft"], "model", model_dirs["draft"]),
    ]
    assert rows[0][0] == "baseline" and {r[4] for r in rows[1:]} == {1}  # one shared baseline

    v = verdict(store, eid)  # one verdict over both: the best, and the other tied with it or ranked below
    assert {c.value for c in v.candidates} == set(drafts) and v.best.ci[0] <= v.best.speedup <= v.best.ci[1]
    assert doc["verdict"]["best"] in drafts and f"best draft {doc['verdict']['best']}" in doc["verdict"]["text"]

    runs = q.runs(store, eid)
    labels = run_label(runs, "draft")
    ids = runs.loc[runs["kind"] == "speculative", "run_id"].tolist()
    assert [labels(i) for i in ids] == [
        f"run {ids[0]} · draft={head_dir} · eagle3 (done)",
        f"run {ids[1]} · draft={model_dirs['draft']} · model (done)",
    ]
    assert swept_values(runs, "draft")[1:] == [f"{head_dir} · eagle3", f"{model_dirs['draft']} · model"]
    table = format_table(doc).splitlines()  # `draftlab run` without --json: the same names, each with its drafter
    assert [line.split()[:3] for line in table if line.startswith(tuple(drafts))] == [
        [head_dir, "·", "eagle3"],
        [model_dirs["draft"], "·", "model"],
    ]

    for run_id, method, drafter in ((ids[0], "eagle3", "eagle3"), (ids[1], "draft_model", "model")):
        deploy = deploy_document(store, eid, run_id)
        assert deploy["configuration"]["drafter"] == drafter
        assert json.loads(deploy["engines"]["vllm"]["speculative_config"])["method"] == method
    assert deploy["engines"]["llama_cpp"]["command"]  # a causal LM serves in llama.cpp; the head cannot
    assert not deploy_document(store, eid, ids[0])["engines"]["llama_cpp"].get("command")


def test_a_mixed_sweep_reads_back_the_same_through_every_view(store, head_dir, monkeypatch):
    """The configuration of a head-and-LM draft sweep: its link, the form's fields, its command line and its
    stored experiment all read back as the same configuration (the second launch of it is recognised as the
    first); each run stores its draft's drafter, and the stored one is never re-derived from the files."""
    from app.cli import build_parser
    from app.sweep import parse_sweep
    from engine.config.variables import VARIABLES
    from pages.widgets.prefill import form_config, form_values, parse_prefill
    from storage.db.schema import SCHEMA_VERSION
    from storage.jobs.experiments import enqueue_experiment, recent_duplicate
    from storage.records import queries as q

    cfg = RunConfig.make(target="demo-target", prompts="code:tune", sweep="draft", values=[head_dir, "demo-draft"])
    assert cfg.drafters == ("eagle3", "model") and cfg.value("drafter") == "eagle3"
    assert [r["drafter"] for r in cfg.runs()] == ["eagle3", "model"]
    assert "drafter" not in cfg.to_url() and not any(a.startswith("--drafter") for a in cfg.to_cli())
    assert RunConfig.from_url(cfg.to_url()) == cfg
    fields = form_values(cfg)
    assert form_config(fields, cfg.prompts) == cfg and parse_prefill(cfg.to_url(), ["code:tune"]) == (fields, [])
    args = build_parser().parse_args(["run", *cfg.to_cli()])
    assert RunConfig.from_args(args, parse_sweep({name: getattr(args, name) for name in VARIABLES})) == cfg

    eid = enqueue_experiment(store, name="mixed", **cfg.enqueue())
    runs = q.runs(store, eid)
    spec = runs[runs["kind"] == "speculative"]
    assert list(zip(spec["draft"], spec["drafter"])) == [(head_dir, "eagle3"), ("demo-draft", "model")]
    monkeypatch.setattr("engine.config.run_config.is_head", lambda draft: False)  # stored: never re-derived
    assert RunConfig.from_experiment(q.experiment(store, eid)) == cfg
    monkeypatch.undo()
    assert recent_duplicate(store, {**cfg.enqueue(), "name": "again"}) == eid  # a second Launch: the same one
    one_kind = RunConfig.make(
        target="demo-target", prompts="code:tune", sweep="draft", values=["demo-draft", "demo-draft-distilled"]
    )
    assert one_kind.drafters is None and one_kind.experiment_columns()["draft_drafters"] is None
    assert SCHEMA_VERSION >= 17


def test_a_version_16_database_gains_the_drafters_column(tmp_path):
    """schema v17: a database from before gets experiments.draft_drafters when opened; its experiments read as
    before (NULL: every run drafts with the experiment's drafter)."""
    from storage import open_store
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q

    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = open_store(url)
    eid = enqueue_experiment(
        store, name="old", target="t", draft="demo-draft", prompts="code", sampling={}, sweep_values=[2, 3]
    )
    with store.write() as conn:
        conn.execute(text("ALTER TABLE experiments DROP COLUMN draft_drafters"))
        conn.execute(text("UPDATE schema_info SET version = 16"))
    store.dispose()
    store = open_store(url)
    with store.read() as conn:
        assert "draft_drafters" in {c["name"] for c in inspect(conn).get_columns("experiments")}
    assert RunConfig.from_experiment(q.experiment(store, eid)).drafters is None
    store.dispose()


def test_what_cannot_draft_is_still_refused_in_one_line(tmp_path, model_dirs, head_dir, capsys):
    """A drafter named for the whole sweep that cannot draft one of its drafts, and a head trained for another
    target beside a causal LM: one error line each (exit 2), nothing stored."""
    from transformers import AutoModelForCausalLM

    from app.cli import main
    from storage import open_store
    from storage.records import queries as q

    for drafter, draft in (("model", head_dir), ("eagle3", model_dirs["draft"])):
        with pytest.raises(DraftLabError) as err:
            RunConfig.make(
                target="t", prompts="code", sweep="draft", values=[head_dir, model_dirs["draft"]], drafter=drafter
            )
        assert not missing(str(err.value), f"drafter '{drafter}'", f"'{draft}'"), err.value  # the pair that cannot
    other = write_head(
        tmp_path / "other",
        AutoModelForCausalLM.from_pretrained(model_dirs["target"]),
        verifier="someone/else",
        aux=[0, 1, 1],
    )
    capsys.readouterr()  # the bar transformers printed loading the target above: not the commands' output
    db = f"sqlite:///{tmp_path / 'refused.db'}"
    (tmp_path / "prompts.txt").write_text("t5 t6 t7\n")
    for draft, extra, says in (
        (f"{other},{model_dirs['draft']}", [], ("'someone/else'", "--target someone/else")),  # its target, the fix
        (f"{head_dir},{model_dirs['draft']}", ["--drafter", "heuristic"], ("drafter 'heuristic'", "eagle3")),
    ):
        code = main(
            [
                "run",
                "--target",
                model_dirs["target"],
                "--draft",
                draft,
                "--prompts",
                str(tmp_path / "prompts.txt"),
                "--device",
                "cpu",
                "--db",
                db,
                "--json",
                *extra,
            ]
        )
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
        assert not missing(err, *says), err
    assert q.experiment_rows(open_store(db)).empty


def test_the_form_launches_a_head_beside_a_causal_lm(tmp_path, model_dirs, head_dir, monkeypatch):
    """The New-experiment form's draft sweep over a head and a causal LM: the Drafter field gives way (each draft
    drafts with its own, whichever comes first) and Launch queues a model run and an eagle3 run against one
    baseline."""
    from storage import open_store
    from storage.records import queries as q
    from tests.test_pages import _fill, _launched, app, assert_clean

    url = f"sqlite:///{tmp_path / 'form.db'}"
    monkeypatch.setenv("DRAFTLAB_DB", url)
    at = _fill(app("new"), model_dirs, max_new_tokens=8, name="head or model")
    at.selectbox(key="sweep_variable").set_value("draft").run()
    at.multiselect(key="draft_candidates").set_value([model_dirs["draft"], head_dir]).run()  # the LM first
    assert_clean(at)
    assert not [s for s in at.selectbox if s.key == "drafter"]
    assert any("each draft drafts with its own drafter" in c.value.lower() for c in at.caption), "caption"
    at.button(key="launch").click().run()
    assert_clean(at)
    assert not at.error, [e.value for e in at.error]
    experiment = _launched(url)
    runs = q.runs(open_store(url), experiment["experiment_id"])
    spec = runs[runs["kind"] == "speculative"]
    assert list(zip(spec["draft"], spec["drafter"])) == [(model_dirs["draft"], "model"), (head_dir, "eagle3")]
    assert runs["kind"].tolist().count("baseline") == 1


def test_a_worker_runs_the_sweep_as_the_dashboard_queues_it(tmp_path, model_dirs, head_dir):
    """What Launch queues, run by a worker that loads the models itself (the causal LM first this time, the head
    loaded beside it): both runs done and lossless, each with its own drafter."""
    from app.worker.worker import Worker
    from storage import open_store
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q
    from tests.cli_runs import PROMPTS

    store = open_store(f"sqlite:///{tmp_path / 'worker.db'}")
    cfg = RunConfig.make(
        target=model_dirs["target"],
        prompts="tiny",
        sweep="draft",
        values=[model_dirs["draft"], head_dir],
        k=3,
        max_new_tokens=10,
        device="cpu",
    )
    eid = enqueue_experiment(store, name="worker", **cfg.enqueue(), prompt_texts=PROMPTS)
    with Worker(store) as worker:
        worker.work(until_idle=True)
    runs = q.runs(store, eid)
    spec = runs[runs["kind"] == "speculative"]
    assert list(zip(spec["draft"], spec["drafter"], spec["status"])) == [
        (model_dirs["draft"], "model", "done"),
        (head_dir, "eagle3", "done"),
    ]
    assert spec["outputs_match_baseline"].tolist() == [True, True] and (spec["proposed"] > 0).all()
    store.dispose()
