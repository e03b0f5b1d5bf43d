"""Training jobs of kind "head" (EAGLE-3 heads from the queue): the queue stores a head's settings and refuses bad
ones in one line, its curve points and acceptance by draft position round-trip (SQLite and PostgreSQL), a v15
database gains the columns and table, and a worker runs a head job end to end on a tiny Llama target — live curve,
cancel after a step, resume from the checkpoint repeating and skipping nothing, the head saved, lossless as a
draft, listed as one, and timed against the target alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import inspect, text

from app.worker.worker import Worker
from engine.config import head_settings
from engine.models import eagle3
from engine.training import data
from storage import open_store
from storage.db.errors import QueueError
from storage.db.schema import SCHEMA_VERSION
from storage.jobs import training
from storage.jobs.experiments import get_experiment
from storage.records import queries
from tests.test_training import TRAIN, VAL

# A few steps at a high rate: the tiny target's head learns something in seconds (held-out acceptance length
# 1.0 -> ~1.3 on these prompts), so "it trained" can be checked, not only "it ran".
SETTINGS = {"steps": 40, "lr": 3e-2, "batch_size": 4, "max_new_tokens": 10, "ttt_steps": 3}


def _head(store, tmp_path, **overrides) -> int:
    settings = {
        "kind": "head",
        "name": "h1",
        "target": "t",
        "prompts": "code:tune",
        "validation": "code:validation",
        "steps": 5,
        "models": tmp_path / "models",
        **overrides,
    }
    return training.enqueue_training(store, **settings)


# --- the queue -----------------------------------------------------------------------------------------------


def test_a_head_job_stores_its_settings_and_no_draft(store, tmp_path):
    jid = _head(store, tmp_path, ttt_steps=5, draft_vocab_size=3000, aux_layers=" 2, 6,9")
    job = training.get_job(store, jid)
    assert (job["kind"], job["draft"], job["ttt_steps"], job["draft_vocab_size"], job["aux_layers"]) == (
        "head",
        "",
        5,
        3000,
        "2,6,9",
    )
    auto = training.get_job(store, _head(store, tmp_path, name="h2", aux_layers="auto"))
    assert (auto["ttt_steps"], auto["draft_vocab_size"], auto["aux_layers"]) == (
        head_settings.DEFAULTS["ttt_steps"],
        0,
        None,
    )  # the defaults; NULL aux layers: vLLM's for the target
    distill = training.get_job(
        store,
        training.enqueue_training(
            store,
            name="d1",
            target="t",
            draft="d",
            prompts="code:tune",
            validation="code:validation",
            steps=5,
            models=tmp_path / "models",
        ),
    )
    assert (distill["kind"], distill["ttt_steps"], distill["aux_layers"]) == ("distill", None, None)
    assert training.jobs(store)["kind"].tolist() == ["distill", "head", "head"]


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"ttt_steps": 0}, "TTT steps must be 1 to 16 (got 0)"),
        ({"ttt_steps": 17}, "TTT steps must be 1 to 16"),
        ({"ttt_steps": 2.5}, "TTT steps must be 1 to 16"),
        ({"draft_vocab_size": -1}, "draft vocabulary size must be a whole number >= 1, or 0"),
        ({"draft_vocab_size": 2**40}, "draft vocab size"),
        ({"aux_layers": "2,x"}, "aux layers '2,x' is not a list of layer ids; use auto or e.g. 2,6,9"),
        ({"aux_layers": "2,2"}, "must be distinct non-negative layer ids"),
        ({"aux_layers": "-1"}, "must be distinct non-negative layer ids"),
        ({"draft": "demo-draft"}, "an EAGLE-3 head starts from no draft"),
        ({"kind": "lora"}, "training kind 'lora' is not one of distill, head"),
        ({"kind": "distill", "draft": "d", "ttt_steps": 4}, "TTT steps set for a distillation job"),
        ({"kind": "distill"}, "draft is empty"),
    ],
)
def test_bad_head_settings_are_one_line_and_nothing_is_stored(store, tmp_path, bad, needle):
    with pytest.raises(QueueError, match=None) as caught:
        _head(store, tmp_path, **bad)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
    assert training.jobs(store).empty


def test_curve_points_and_acceptance_by_position_round_trip(store, tmp_path):
    jid = _head(store, tmp_path, ttt_steps=3)
    assert training.claim_job(store, jid, "w")
    training.report(
        store,
        jid,
        "w",
        [
            {
                "step": 0,
                "kl": 0.5,
                "acceptance_length": 1.0,
                "per_position": [0.0, None, None],
                "accuracy": [0.0, 0.05, float("nan")],
            },
            {"step": 1, "loss": 0.4, "lr": 1e-3},
            {"step": 2, "loss": 0.3, "lr": 1e-3},
        ],
        step=2,
    )
    training.report(
        store,
        jid,
        "w",
        [
            {
                "step": 2,
                "kl": 0.3,
                "acceptance_length": 1.4,
                "per_position": [0.3, 0.2, 0.5],
                "accuracy": [0.3, 0.1, 0.1],
            },
            {"step": 3, "loss": 0.2},
        ],
        step=3,
    )
    pts = training.points(store, jid)
    assert pts["step"].tolist() == [0, 1, 2, 3]
    assert pts.loc[2, "loss"] == 0.3 and pts.loc[2, "kl"] == 0.3 and pts.loc[2, "acceptance_length"] == 1.4
    assert pts["acceptance_length"].isna().tolist() == [False, True, False, True]
    acc = training.acceptance_by_position(store, jid)
    assert acc[["step", "position"]].values.tolist() == [[0, 1], [0, 2], [0, 3], [2, 1], [2, 2], [2, 3]]
    assert acc["acceptance"].tolist()[3:] == [0.3, 0.2, 0.5]
    assert acc["acceptance"].isna().tolist()[:3] == [False, True, True]  # no root reached positions 2, 3
    assert acc["accuracy"].isna().tolist()[:3] == [False, False, True]  # NaN stored as NULL
    with store.read() as conn:  # normalised: SQL reads it by position, e.g. the best acceptance at each
        best = conn.execute(
            text(
                "SELECT position, MAX(acceptance) FROM training_accuracy WHERE job_id = :j "
                "GROUP BY position ORDER BY position"
            ),
            {"j": jid},
        ).all()
    assert [tuple(r) for r in best] == [(1, 0.3), (2, 0.2), (3, 0.5)]
    training.rewind(store, jid, "w", 1)  # a resume from step 1 drops what came after, acceptance rows too
    assert training.points(store, jid)["step"].tolist() == [0, 1]
    assert training.acceptance_by_position(store, jid)["step"].unique().tolist() == [0]


def test_a_version_15_database_gains_the_head_columns_and_table(db_url, tmp_path):
    """v16: a v15 database (no kind, no head settings, no training_accuracy) is upgraded when opened; its jobs read
    as distillation, and head jobs can be queued and report into it."""
    store = open_store(db_url)
    old = training.enqueue_training(
        store,
        name="old",
        target="t",
        draft="d",
        prompts="code:tune",
        validation="code:validation",
        steps=3,
        models=tmp_path / "models",
    )
    with store.write() as conn:
        conn.execute(text("DROP TABLE training_accuracy"))
        for table, column in (
            ("training_jobs", "kind"),
            ("training_jobs", "ttt_steps"),
            ("training_jobs", "draft_vocab_size"),
            ("training_jobs", "aux_layers"),
            ("training_jobs", "acceptance_length_before"),
            ("training_jobs", "acceptance_length_after"),
            ("training_points", "acceptance_length"),
        ):
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        conn.execute(text("UPDATE schema_info SET version = 15"))
    store.dispose()

    store = open_store(db_url)
    with store.read() as conn:
        assert conn.execute(text("SELECT version FROM schema_info")).scalar() == SCHEMA_VERSION
        assert inspect(conn).has_table("training_accuracy")
        assert {"kind", "ttt_steps", "aux_layers"} <= {c["name"] for c in inspect(conn).get_columns("training_jobs")}
    assert training.get_job(store, old)["kind"] == "distill"
    jid = _head(store, tmp_path, name="new")
    assert training.claim_job(store, jid, "w")
    training.report(store, jid, "w", [{"step": 0, "kl": 1.0, "acceptance_length": 1.0, "per_position": [0.1]}])
    assert training.acceptance_by_position(store, jid)["acceptance"].tolist() == [0.1]
    store.dispose()


def test_the_forms_defaults_are_train_heads():
    """engine/head_settings.DEFAULTS (the Train page's first values) are `draftlab train-head`'s defaults and
    HeadConfig's."""
    from app.cli import build_parser
    from engine.training.head_training import HeadConfig

    args = build_parser().parse_args(["train-head", "--target", "t", "--prompts", "p", "--out", "o"])
    assert {key: getattr(args, key) for key in head_settings.DEFAULTS} == head_settings.DEFAULTS
    cfg = HeadConfig(steps=head_settings.DEFAULTS["steps"])
    assert {key: getattr(cfg, key) for key in head_settings.DEFAULTS if key != "aux_layers"} == {
        key: value for key, value in head_settings.DEFAULTS.items() if key != "aux_layers"
    }
    assert cfg.aux_layers is None and head_settings.parse_aux_layers(head_settings.DEFAULTS["aux_layers"]) is None


# --- a worker runs head jobs end to end ----------------------------------------------------------------------


@pytest.fixture
def head_setup(tmp_path, model_dirs, monkeypatch):
    prompts, val = tmp_path / "train.txt", tmp_path / "val.txt"
    prompts.write_text("\n".join(TRAIN) + "\n")
    val.write_text("\n".join(VAL) + "\n")
    monkeypatch.setenv("DRAFTLAB_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr(
        "app.training.training.REPORT_SECONDS", 0.0
    )  # every step reported: the cancel lands on its step
    monkeypatch.setattr("app.training.training.EVAL_REPEATS", 1)
    store = open_store(f"sqlite:///{tmp_path / 'jobs.db'}")
    yield (
        store,
        {"kind": "head", "target": model_dirs["target"], "prompts": str(prompts), "validation": str(val), **SETTINGS},
    )
    store.dispose()


def _drain(store):
    with Worker(store, heartbeat_seconds=0.2, poll_seconds=0.05, log=lambda m: None) as worker:
        worker.work(until_idle=True)


def test_a_head_job_cancelled_after_a_step_resumes_from_its_checkpoint(head_setup, monkeypatch, model_dirs):
    store, settings = head_setup
    straight = training.enqueue_training(store, name="straight", **settings)
    _drain(store)
    assert training.get_job(store, straight)["status"] == "done", training.get_job(store, straight)["error"]
    reference, reference_acc = training.points(store, straight), training.acceptance_by_position(store, straight)

    jid = training.enqueue_training(store, name="interrupted", **settings)
    original = training.report

    def cancel_at_step_15(store_, job_id, worker_id, points=(), **fields):
        if fields.get("step") == 15:
            training.cancel_job(store_, job_id)  # as the page's Cancel button does, while step 15 is reported
        return original(store_, job_id, worker_id, points, **fields)

    monkeypatch.setattr(training, "report", cancel_at_step_15)
    _drain(store)
    job = training.get_job(store, jid)
    assert job["status"] == "cancelled" and job["step"] == 15 and job["checkpoint_step"] == 15, job
    assert not (Path(job["out"]) / "config.json").exists()  # no head written for a cancelled job
    assert training.acceptance_by_position(store, jid)["step"].max() <= 15

    monkeypatch.setattr(training, "report", original)
    monkeypatch.setattr(data, "generate", lambda *a, **k: pytest.fail("the resumed job regenerated its data"))
    assert training.resume_job(store, jid)
    _drain(store)
    job = training.get_job(store, jid)
    assert job["status"] == "done" and job["step"] == SETTINGS["steps"] and job["error"] is None, job
    pts, acc = training.points(store, jid), training.acceptance_by_position(store, jid)
    assert pts["step"].tolist() == list(range(SETTINGS["steps"] + 1))  # once each: none repeated, none missing
    assert pts["loss"].iloc[1:].tolist() == pytest.approx(reference["loss"].iloc[1:].tolist(), rel=1e-5)
    assert pts["kl"].dropna().tolist() == pytest.approx(reference["kl"].dropna().tolist(), rel=1e-5)
    assert pts["acceptance_length"].dropna().tolist() == pytest.approx(
        reference["acceptance_length"].dropna().tolist(), rel=1e-6
    )
    eval_steps = pts.dropna(subset=["kl"])["step"].tolist()
    assert sorted(set(acc["step"])) == eval_steps and len(eval_steps) > 2  # step 0 and every eval point
    assert acc["position"].tolist() == [1, 2, 3] * len(eval_steps)
    np.testing.assert_allclose(
        acc[["acceptance", "accuracy"]].to_numpy(dtype=float),
        reference_acc[["acceptance", "accuracy"]].to_numpy(dtype=float),
        rtol=1e-6,
    )
    # it trained: held-out acceptance rose, teacher-forced along the curve and through the engine's loop
    lengths = pts["acceptance_length"].dropna().tolist()
    assert lengths[-1] > lengths[0]
    assert job["acceptance_length_after"] > job["acceptance_length_before"] and job["alpha_after"] > job["alpha_before"]
    assert job["eval_k"] == SETTINGS["ttt_steps"]
    assert not (Path(job["out"]) / training.CHECKPOINT_DIR).exists()

    # the head: speculators format for this target, its card with the command, lossless as a draft, listed as a head
    out = Path(job["out"])
    config = eagle3.head_config(out)
    assert config is not None and config["speculators_config"]["verifier"]["name_or_path"] == settings["target"]
    card = json.loads((out / "train_head.json").read_text())
    assert card["lossless_after"] is True and card["ttt_steps"] == 3 and card["aux_layers"] == [1]
    assert (
        "draftlab train-head" in card["command"]
        and "--aux-layers 1" in card["command"]
        and "--ttt-steps 3" in card["command"]
    )
    listed = {d["name"]: d for d in training.trained_drafts(store)}
    assert listed["interrupted"]["kind"] == "head" and listed["interrupted"]["out"] == str(out)
    assert listed["interrupted"]["draft"] == ""

    # the timed experiment: the trained head (eagle3) against the target alone, at k = its TTT steps
    exp = get_experiment(store, job["eval_experiment_id"])
    assert (exp["draft"], exp["drafter"], exp["sweep_variable"], exp["k"]) == (str(out), "eagle3", "k", 3)
    assert exp["prompts"] == settings["validation"] and exp["temperature"] == 0.0
    runs = queries.runs(store, exp["id"])
    assert (runs["status"] == "done").all() and len(runs) == 2
    spec = runs[runs["kind"] == "speculative"]
    assert spec["outputs_match_baseline"].tolist() == [True] and spec["speedup_ci_lo"].notna().all()


def test_a_head_job_with_aux_layers_the_target_lacks_fails_with_one_line(head_setup):
    store, settings = head_setup
    jid = training.enqueue_training(store, name="deep", **{**settings, "aux_layers": "1,5"})
    _drain(store)
    job = training.get_job(store, jid)
    assert job["status"] == "failed" and "names layer 5" in job["error"] and "\n" not in job["error"]
    assert training.resume_job(store, jid)
