"""The DraftLab database: experiments, their runs, and every prompt, round, emitted token and draft token.

Metric columns use SPEC.md names verbatim. Per-prompt rollups (`prompt_results.accepted`, `.beta_sum`, ...)
are filled by SQL aggregation over that prompt's rounds and draft tokens when the prompt is committed, and
run-level aggregates on `runs` by SQL aggregation over the prompt rows; list views read those, so they stay
fast at millions of draft tokens. Bump SCHEMA_VERSION and add a step to `migrations.STEPS` for any change.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import cast

from sqlalchemy import BigInteger, Boolean, DateTime, Double, ForeignKey, Index, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 20
NAME_CHARS = 200  # an experiment's name: a varchar(200) on PostgreSQL (SQLite would take more; both refuse it)

# Run kinds and statuses.
BASELINE, SPECULATIVE = "baseline", "speculative"
QUEUED, RUNNING, DONE, FAILED, CANCELLED, INTERRUPTED = (
    "queued",
    "running",
    "done",
    "failed",
    "cancelled",
    "interrupted",
)
STATUSES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED, INTERRUPTED)
# Emitted-token kind of every token of a target-only (baseline) output.
TARGET = "target"
FIRST = "first"  # the first token of a speculative output: the target's prefill emits it, no round owns it


def utcnow() -> datetime:
    """Naive UTC: stored the same way by SQLite and PostgreSQL."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


# SQLite stores draft tokens clustered by primary key, so a run's rows sit together on disk.
_CLUSTERED = {"sqlite_with_rowid": False}


class SchemaInfo(Base):
    __tablename__ = "schema_info"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class Experiment(Base):
    __tablename__ = "experiments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(NAME_CHARS))
    notes: Mapped[str] = mapped_column(Text, default="")
    tags: Mapped[str] = mapped_column(Text, default="")  # comma-separated, no spaces around commas
    # Who queued it: "oidc:<email>", "password from <address>", "local <address>" (dashboard) or "cli <user>@<host>".
    launched_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    target: Mapped[str] = mapped_column(Text)
    draft: Mapped[str] = mapped_column(Text)
    prompts: Mapped[str] = mapped_column(Text)  # prompt-set spec (`code:validation`) or file path
    device: Mapped[str] = mapped_column(String(20), default="auto")
    dtype: Mapped[str] = mapped_column(String(20), default="auto")
    trust_remote_code: Mapped[bool] = mapped_column(Boolean, default=False)
    temperature: Mapped[float] = mapped_column(Double, default=0.0)
    top_k: Mapped[int] = mapped_column(Integer, default=0)
    top_p: Mapped[float] = mapped_column(Double, default=1.0)
    batch_size: Mapped[int] = mapped_column(Integer, default=1)  # requests decoded together (unless swept)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    max_new_tokens: Mapped[int] = mapped_column(Integer, default=128)
    k: Mapped[int] = mapped_column(Integer, default=4)  # k of every run when the sweep is over something else
    sweep_variable: Mapped[str] = mapped_column(String(40), default="k")
    sweep_values: Mapped[str] = mapped_column(Text, default="[]")  # JSON list
    # A grid's outer axis: the batch sizes at which the sweep is run (JSON list, each with its own target-only
    # baseline; storage/analysis/schedule.py's k schedule); NULL for a sweep at one batch size.
    batch_sizes: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Timing protocol v2: every prompt is decoded `repeats` times per arm, medians used.
    repeats: Mapped[int] = mapped_column(Integer, default=1)
    # `--k auto`: the largest k to try; the predicted speedup-vs-k curve (JSON {"k": speedup}) once made.
    k_auto: Mapped[int | None] = mapped_column(Integer, nullable=True)
    predicted_curve: Mapped[str | None] = mapped_column(Text, nullable=True)
    drafter: Mapped[str] = mapped_column(String(80), default="model")  # drafter spec of every run unless swept
    # A draft sweep whose drafts draft with different drafters (EAGLE-3 heads as eagle3, causal LMs as model: no
    # drafter named): each draft's drafter, a JSON list in the sweep's order; NULL otherwise. Each run stores its own.
    draft_drafters: Mapped[str | None] = mapped_column(Text, nullable=True)
    validates: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the tuning experiment this one validates
    # How conversation prompts become text (engine/text/chat.py): "auto" (the target tokenizer's template), "none", or
    # the Jinja text of a --chat-template FILE (stored, so a worker elsewhere renders the same).
    chat_template: Mapped[str] = mapped_column(Text, default="auto")
    draft_sampling: Mapped[str] = mapped_column(String(20), default="probabilistic")  # of every run unless swept


class ExperimentPrompt(Base):
    """The prompt texts an experiment ran on, frozen when its first run starts (resume and reruns use these)."""

    __tablename__ = "experiment_prompts"
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    prompt_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt: Mapped[str] = mapped_column(Text)


class Worker(Base):
    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    host: Mapped[str] = mapped_column(String(200), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    heartbeat: Mapped[datetime] = mapped_column(DateTime, default=utcnow, index=True)
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the run it is executing
    waiting_for: Mapped[str | None] = mapped_column(String(200), nullable=True)  # a device lease it waits for


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(20))  # baseline / speculative
    baseline_run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # speculative: its target-only run
    sweep_value: Mapped[float | None] = mapped_column(Double, nullable=True)
    # The run's own configuration (a sweep may vary any of these).
    k: Mapped[int | None] = mapped_column(Integer, nullable=True)
    draft: Mapped[str | None] = mapped_column(Text, nullable=True)  # the draft model (NULL: baseline, or no model)
    drafter: Mapped[str | None] = mapped_column(String(80), nullable=True)  # model / heuristic / confidence:T / ...
    sweep_label: Mapped[str | None] = mapped_column(Text, nullable=True)  # the swept value as text (any variable)
    temperature: Mapped[float] = mapped_column(Double)
    top_k: Mapped[int] = mapped_column(Integer)
    top_p: Mapped[float] = mapped_column(Double)
    batch_size: Mapped[int] = mapped_column(Integer, default=1)  # prompts decoded together per forward
    seed: Mapped[int] = mapped_column(Integer)
    max_new_tokens: Mapped[int] = mapped_column(Integer)
    # Queue state.
    status: Mapped[str] = mapped_column(String(20), default=QUEUED)
    progress: Mapped[float] = mapped_column(Double, default=0.0)  # 0..1
    prompts_total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    prompts_done: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # one line, names the problem and the fix
    error_detail: Mapped[str | None] = mapped_column(Text, nullable=True)  # traceback, for bug reports
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    reserved_for: Mapped[str | None] = mapped_column(String(80), nullable=True)  # only this worker may claim it
    worker_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    created: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    started: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    heartbeat: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    device_name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    peak_memory_mb: Mapped[float | None] = mapped_column(Double, nullable=True)
    draft_parameters: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # of the draft model it used
    draft_sampling: Mapped[str] = mapped_column(String(20), default="probabilistic")  # probabilistic / greedy
    # Aggregates over committed prompts (SPEC names), refreshed by SQL after each prompt.
    new_tokens: Mapped[int] = mapped_column(Integer, default=0)
    wall_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    tokens_per_second: Mapped[float | None] = mapped_column(Double, nullable=True)
    target_step_seconds: Mapped[float | None] = mapped_column(Double, nullable=True)  # baseline runs
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    proposed: Mapped[int] = mapped_column(Integer, default=0)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    draft_acceptance_rate: Mapped[float | None] = mapped_column(Double, nullable=True)
    alpha: Mapped[float | None] = mapped_column(Double, nullable=True)
    tokens_per_round: Mapped[float | None] = mapped_column(Double, nullable=True)
    expected_alpha: Mapped[float | None] = mapped_column(Double, nullable=True)
    kl: Mapped[float | None] = mapped_column(Double, nullable=True)
    draft_step_seconds: Mapped[float | None] = mapped_column(Double, nullable=True)
    max_k: Mapped[int] = mapped_column(Integer, default=0)  # largest k_r seen (the k of predicted_speedup)
    # Timing protocol v2 (paired with the baseline over the prompts both finished; refreshed per prompt).
    speedup: Mapped[float | None] = mapped_column(Double, nullable=True)
    speedup_ci_lo: Mapped[float | None] = mapped_column(Double, nullable=True)
    speedup_ci_hi: Mapped[float | None] = mapped_column(Double, nullable=True)
    verify_cost: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_speedup_refined: Mapped[float | None] = mapped_column(Double, nullable=True)
    timing_warning: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Serving metrics (docs/metrics.md "Serving metrics"), over the median repeat of each committed batch.
    ttft_p50: Mapped[float | None] = mapped_column(Double, nullable=True)  # time to first token, seconds
    ttft_p95: Mapped[float | None] = mapped_column(Double, nullable=True)
    itl_p50: Mapped[float | None] = mapped_column(Double, nullable=True)  # inter-token latency, seconds
    itl_p95: Mapped[float | None] = mapped_column(Double, nullable=True)
    latency_p50: Mapped[float | None] = mapped_column(Double, nullable=True)  # per-request latency, seconds
    latency_p95: Mapped[float | None] = mapped_column(Double, nullable=True)

    __table_args__ = (
        Index("ix_runs_experiment", "experiment_id", "kind"),
        Index("ix_runs_status", "status", "experiment_id"),
    )


class PromptResult(Base):
    """One prompt of one run, with SQL rollups of its rounds and draft tokens."""

    __tablename__ = "prompt_results"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    prompt_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt: Mapped[str] = mapped_column(Text)
    output_ids: Mapped[str] = mapped_column(Text)  # JSON list, canonical separators (compared as text in SQL)
    text: Mapped[str] = mapped_column(Text)
    new_tokens: Mapped[int] = mapped_column(Integer)
    wall_seconds: Mapped[float] = mapped_column(Double)
    decode_steps: Mapped[int] = mapped_column(Integer, default=0)
    decode_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    finished: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    # Rollups (SQL aggregates of this prompt's rounds / draft tokens).
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    proposed: Mapped[int] = mapped_column(Integer, default=0)
    emitted: Mapped[int] = mapped_column(Integer, default=0)  # tokens emitted by rounds
    max_k: Mapped[int] = mapped_column(Integer, default=0)
    draft_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    verify_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    draft_forwards: Mapped[int] = mapped_column(Integer, default=0)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    verified: Mapped[int] = mapped_column(Integer, default=0)
    beta_sum: Mapped[float] = mapped_column(Double, default=0.0)
    kl_sum: Mapped[float] = mapped_column(Double, default=0.0)
    kl_count: Mapped[int] = mapped_column(Integer, default=0)


class Timing(Base):
    """Every timed decode of a prompt: one row per (run, prompt, repeat). `prompt_results` keeps the median
    repeat; these keep the spread."""

    __tablename__ = "timings"
    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    repeat: Mapped[int] = mapped_column(Integer, primary_key=True)
    slot: Mapped[int] = mapped_column(Integer)  # position of this decode in its prompt's rotated order
    new_tokens: Mapped[int] = mapped_column(Integer)
    wall_seconds: Mapped[float] = mapped_column(Double)
    draft_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    verify_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    decode_seconds: Mapped[float] = mapped_column(Double, default=0.0)
    decode_steps: Mapped[int] = mapped_column(Integer, default=0)
    __table_args__ = (_CLUSTERED,)


class DeviceLease(Base):
    """One timed job per device: a worker holds its device's lease while it times an experiment."""

    __tablename__ = "device_leases"
    device: Mapped[str] = mapped_column(String(200), primary_key=True)  # host:cpu, host:cuda:0
    worker_id: Mapped[str] = mapped_column(String(80))
    experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    acquired: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    heartbeat: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class VerifyProfile(Base):
    """t_verify(n): one target forward over n new tokens, measured once per experiment (`--k auto`)."""

    __tablename__ = "verify_profile"
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    seconds: Mapped[float] = mapped_column(Double)


class BatchVerifyProfile(Base):
    """t_verify(B, n): one batched target forward of B rows over n new tokens each, measured once per experiment
    and batch size (`--k auto` on the batched decoders: a fixed batch size above 1 or a grid)."""

    __tablename__ = "batch_verify_profile"
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    batch_size: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True)
    seconds: Mapped[float] = mapped_column(Double)


class RoundRow(Base):
    __tablename__ = "rounds"
    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    k: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    rejected: Mapped[int] = mapped_column(Integer)
    emitted: Mapped[int] = mapped_column(Integer)
    draft_seconds: Mapped[float] = mapped_column(Double)
    verify_seconds: Mapped[float] = mapped_column(Double)
    draft_forwards: Mapped[int] = mapped_column(Integer)
    __table_args__ = (_CLUSTERED,)


class OutputToken(Base):
    """Every token a run emitted, in output order, with the round (and kind) that emitted it."""

    __tablename__ = "output_tokens"
    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)  # 0-based index in the new tokens
    token_id: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20))  # first / accepted / correction / bonus / target
    round_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # When the token reached the host, seconds from its batch's start (a round's tokens share one time); NULL for
    # decoders that do not report arrivals (the batch-1 loops) and rows stored before schema v9.
    seconds: Mapped[float | None] = mapped_column(Double, nullable=True)
    __table_args__ = (_CLUSTERED,)


class DraftTokenRow(Base):
    __tablename__ = "draft_tokens"
    run_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)  # 1..k
    token_id: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    token_type: Mapped[str] = mapped_column(String(20))
    p_draft: Mapped[float] = mapped_column(Double)
    p_target: Mapped[float] = mapped_column(Double)
    beta: Mapped[float] = mapped_column(Double)
    kl: Mapped[float | None] = mapped_column(Double, nullable=True)  # NULL when the drafter has no logits
    outcome: Mapped[str] = mapped_column(String(12))  # accepted / rejected / discarded
    __table_args__ = (
        # Covering indexes: each diagnostic query reads only its index, in GROUP BY order.
        Index("ix_draft_tokens_position", "run_id", "position", "outcome"),
        Index("ix_draft_tokens_type", "run_id", "token_type", "outcome"),
        Index("ix_draft_tokens_token", "run_id", "token_id", "outcome"),
        _CLUSTERED,
    )


DISTILL, HEAD = "distill", "head"  # training job kinds: distil a draft (`draftlab distill`), train an EAGLE-3 head
TRAINING_KINDS = (DISTILL, HEAD)


class TrainingJob(Base):
    """A training job a worker runs: `draftlab distill` (kind "distill") or `draftlab train-head` (kind "head"): its
    settings, queue state, the step it reached, its checkpoint, the held-out figures before and after, and the
    experiment that evaluates the result. A head starts from no draft: its `draft` is "" (it is built from the
    target, whose hidden states it reads), and its `out` is a speculators-format head directory, a valid `--draft`
    for that target."""

    __tablename__ = "training_jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))  # the trained draft's directory name under $DRAFTLAB_MODELS
    launched_by: Mapped[str | None] = mapped_column(String(200), nullable=True)  # as experiments.launched_by
    out: Mapped[str] = mapped_column(Text)  # the model directory it writes (absolute)
    created: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    notes: Mapped[str] = mapped_column(Text, default="")
    target: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20), default=DISTILL, server_default=DISTILL)
    draft: Mapped[str] = mapped_column(Text)  # the draft it starts from ("" for a head)
    prompts: Mapped[str] = mapped_column(Text)  # training prompt set spec or file path
    validation: Mapped[str] = mapped_column(Text)  # held-out prompt set spec or file path
    steps: Mapped[int] = mapped_column(Integer)
    lr: Mapped[float] = mapped_column(Double)
    batch_size: Mapped[int] = mapped_column(Integer, default=8)
    max_new_tokens: Mapped[int] = mapped_column(Integer, default=128)
    samples: Mapped[int] = mapped_column(Integer, default=1)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    focus_from: Mapped[int | None] = mapped_column(Integer, nullable=True)  # experiment whose rejections weigh the loss
    device: Mapped[str] = mapped_column(String(20), default="auto")
    # A head's settings (NULL for distillation): TTT steps S (the draft positions trained; the held-out k), the
    # draft vocabulary size (0: the whole target vocabulary, at most 32000) and the aux layers as `2,6,9` in vLLM's
    # convention (NULL: auto, vLLM's default for the target).
    ttt_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    draft_vocab_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    aux_layers: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # Queue state (as runs).
    status: Mapped[str] = mapped_column(String(20), default=QUEUED)
    phase: Mapped[str | None] = mapped_column(String(200), nullable=True)  # what it is doing now, in words
    step: Mapped[int] = mapped_column(Integer, default=0)  # optimiser steps done (and recorded)
    checkpoint_step: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the step its checkpoint holds
    progress: Mapped[float] = mapped_column(Double, default=0.0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    started: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    heartbeat: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    device_name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # Results (held-out split, greedy, k = eval_k).
    train_seconds: Mapped[float | None] = mapped_column(Double, nullable=True)
    eval_k: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kl_before: Mapped[float | None] = mapped_column(Double, nullable=True)
    kl_after: Mapped[float | None] = mapped_column(Double, nullable=True)
    alpha_before: Mapped[float | None] = mapped_column(Double, nullable=True)
    alpha_after: Mapped[float | None] = mapped_column(Double, nullable=True)
    tokens_per_round_before: Mapped[float | None] = mapped_column(Double, nullable=True)
    tokens_per_round_after: Mapped[float | None] = mapped_column(Double, nullable=True)
    # 1 + accepted drafts per drafting round (vLLM's mean acceptance length), greedy through the engine's loop
    acceptance_length_before: Mapped[float | None] = mapped_column(Double, nullable=True)
    acceptance_length_after: Mapped[float | None] = mapped_column(Double, nullable=True)
    eval_experiment_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # before/after, timed

    __table_args__ = (Index("ix_training_jobs_status", "status", "id"),)


class TrainingPoint(Base):
    """The live curves of a training job: one row per optimiser step (loss, lr), with the held-out KL on the
    steps where it was measured (step 0: before training); for a head, "kl" is its held-out TTT loss (forward KL
    on the draft vocabulary, step j weighted 0.8^j) and `acceptance_length` the held-out simulated acceptance
    length at k = S (1 + expected accepted drafts, teacher-forced) at those steps."""

    __tablename__ = "training_points"
    job_id: Mapped[int] = mapped_column(ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    loss: Mapped[float | None] = mapped_column(Double, nullable=True)
    lr: Mapped[float | None] = mapped_column(Double, nullable=True)
    kl: Mapped[float | None] = mapped_column(Double, nullable=True)
    seconds: Mapped[float | None] = mapped_column(Double, nullable=True)
    acceptance_length: Mapped[float | None] = mapped_column(Double, nullable=True)


class TrainingAccuracy(Base):
    """A head's held-out acceptance by draft position at each eval point (engine/training/head_training.py,
    teacher-forced on the target's greedy continuations): `acceptance` = conditional acceptance at `position` (1..S)
    given every position before it accepted, `accuracy` = the head's step position-1 argmax equal to the target's, over
    every root. NULL where no root reached the position. One row per (job, step, position), so a query can group by
    either."""

    __tablename__ = "training_accuracy"
    job_id: Mapped[int] = mapped_column(ForeignKey("training_jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    acceptance: Mapped[float | None] = mapped_column(Double, nullable=True)
    accuracy: Mapped[float | None] = mapped_column(Double, nullable=True)


class ProductionSeries(Base):
    """A serving engine's speculative-decoding counters over one window (`draftlab import-metrics`), linked to
    the experiment (and its run of the same configuration) it is compared with. Counts as the engine reports them
    (docs/metrics.md, "Production"); `seconds` is the window between two scrapes (NULL: since the server started)."""

    __tablename__ = "production_series"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), nullable=True)
    label: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(Text)  # file path or URL without credentials or query
    engine: Mapped[str] = mapped_column(String(200), default="")  # engine label(s) summed over
    created: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    seconds: Mapped[float | None] = mapped_column(Double, nullable=True)
    drafts: Mapped[int] = mapped_column(BigInteger)
    draft_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted: Mapped[int] = mapped_column(BigInteger)


class ProductionPosition(Base):
    """Rounds whose draft at `position` (1-based) was accepted, as the engine counts them (unconditional)."""

    __tablename__ = "production_positions"
    series_id: Mapped[int] = mapped_column(ForeignKey("production_series.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    accepted: Mapped[int] = mapped_column(BigInteger)


class ServerConfirm(Base):
    """One `draftlab confirm`: an experiment's configurations measured in a serving engine (vLLM)."""

    __tablename__ = "server_confirms"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    created: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    engine: Mapped[str] = mapped_column(String(40), default="vllm")
    engine_version: Mapped[str] = mapped_column(String(200), default="")
    configs: Mapped[str] = mapped_column(String(20))  # chosen | schedule | all
    concurrency: Mapped[str] = mapped_column(Text)  # comma-separated, as measured
    repeats: Mapped[int] = mapped_column(Integer)
    launched_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    status: Mapped[str] = mapped_column(String(20), default=RUNNING)  # queued / running / done / failed / interrupted
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # one line per configuration that failed
    wall_seconds: Mapped[float | None] = mapped_column(Double, nullable=True)
    # v14: a confirm queued from the dashboard is a job a worker claims (storage/serving/confirm_jobs.py), reporting its
    # phase and the requests done of the whole confirm while it runs; the CLI's own confirm fills them too.
    worker_id: Mapped[str | None] = mapped_column(String(80), nullable=True)
    heartbeat: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    phase: Mapped[str | None] = mapped_column(Text, nullable=True)
    requests_done: Mapped[int | None] = mapped_column(Integer, nullable=True)
    requests_total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # v19: the process running it and the vLLM servers it started, JSON {"host", "pid", "start", "servers": [[pid,
    # start], ...]} (storage/jobs/liveness.py): a sweep ends the servers of a confirm whose process died on this host.
    processes: Mapped[str | None] = mapped_column(Text, nullable=True)
    # v20: what its step costs hold for, so a confirm or a `draftlab profile` (configs = "profile") is a server cost
    # profile for every run it fits (storage/serving/profiles.py): the machine the servers ran on and the target
    # served (each measurement holds its drafter's fingerprint)
    hardware: Mapped[str | None] = mapped_column(Text, nullable=True)
    target: Mapped[str | None] = mapped_column(Text, nullable=True)
    # v20 too: how its servers ran: the vLLM servers it started (every start and restart; NULL: attached to running
    # ones, or stored before v20) and whether one at a time (`--one-server-at-a-time`: the target-only and the
    # speculative server restarted in turn, never both up) rather than both up while a configuration is measured
    server_starts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    one_server_at_a_time: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    # v20: a profile queued from the dashboard (configs = "profile", storage/serving/confirm_jobs.py): the lab run whose
    # drafter it serves and its ks, comma-separated (NULL for a confirm, and for a profile the CLI runs itself)
    profile_run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    profile_ks: Mapped[str | None] = mapped_column(Text, nullable=True)


class ServerMeasurement(Base):
    """One server configuration at one concurrency: its passes summed (SPEC "Confirm in a serving engine" keys).
    k = 0 and no run: the target-only server. Counters of a speculative server are a production series
    (`series_id`, storage/records/production.py), so the Production panel compares them with the lab run too."""

    __tablename__ = "server_measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    confirm_id: Mapped[int] = mapped_column(ForeignKey("server_confirms.id", ondelete="CASCADE"), index=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), nullable=True)
    series_id: Mapped[int | None] = mapped_column(
        ForeignKey("production_series.id", ondelete="SET NULL"), nullable=True
    )
    label: Mapped[str] = mapped_column(String(200))
    k: Mapped[int] = mapped_column(Integer)
    speculative_config: Mapped[str | None] = mapped_column(Text, nullable=True)  # exactly what the server got
    concurrency: Mapped[int] = mapped_column(Integer)
    requests: Mapped[int] = mapped_column(Integer)
    new_tokens: Mapped[int] = mapped_column(BigInteger)
    wall_seconds: Mapped[float] = mapped_column(Double)
    tokens_per_second: Mapped[float] = mapped_column(Double)
    speedup: Mapped[float | None] = mapped_column(Double, nullable=True)
    speedup_ci_lo: Mapped[float | None] = mapped_column(Double, nullable=True)
    speedup_ci_hi: Mapped[float | None] = mapped_column(Double, nullable=True)
    ttft_seconds_p50: Mapped[float | None] = mapped_column(Double, nullable=True)
    itl_seconds_p50: Mapped[float | None] = mapped_column(Double, nullable=True)
    itl_seconds_p95: Mapped[float | None] = mapped_column(Double, nullable=True)
    request_latency_seconds_p50: Mapped[float | None] = mapped_column(Double, nullable=True)
    request_latency_seconds_p95: Mapped[float | None] = mapped_column(Double, nullable=True)
    outputs_match_server_baseline: Mapped[float | None] = mapped_column(Double, nullable=True)
    outputs_match_lab: Mapped[float | None] = mapped_column(Double, nullable=True)
    first_divergence: Mapped[str | None] = mapped_column(Text, nullable=True)  # a sentence; NULL when all match
    # v18: the paired target-only passes' throughput (speedup = tokens_per_second / it), why the speedup is withheld
    # (NULL: shown), and under sampling the output comparison (engine/metrics/sampled_outputs.py, JSON)
    baseline_tokens_per_second: Mapped[float | None] = mapped_column(Double, nullable=True)
    speedup_warning: Mapped[str | None] = mapped_column(Text, nullable=True)
    outputs_test: Mapped[str | None] = mapped_column(Text, nullable=True)
    # v20: the drafter's fingerprint (storage/serving/profiles.py: its method and settings, a draft model or head by
    # its shape, never its weights or its k): which lab runs this measurement's step costs fit
    drafter_fingerprint: Mapped[str | None] = mapped_column(Text, nullable=True)
    # v20 too: every lab run this one served configuration stands for (comma-separated ids; `run_id` is the first):
    # runs with the same speculative config and request (k 1 at batch 1 and at batch 4) are served once per confirm
    run_ids: Mapped[str | None] = mapped_column(Text, nullable=True)
    # v20 too: the server speedup predicted for this k and concurrency before it was measured, from a server cost
    # profile other than this confirm (storage/serving/profiles.py) and the lab run's acceptance: its interval, the
    # profile, and the two halves of the prediction (the lab's tokens per step at k, the profile's t_k / t_0), which
    # say which side moved when the measurement falls outside it (storage/analysis/prediction_check.py). NULL: no
    # profile fitted
    predicted_speedup: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_speedup_ci_lo: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_speedup_ci_hi: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_profile_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    predicted_tokens_per_step: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_cost_ratio: Mapped[float | None] = mapped_column(Double, nullable=True)


class ServerPass(Base):
    """One pass of a measurement (every prompt once, closed loop): what the paired speedup resamples."""

    __tablename__ = "server_passes"
    measurement_id: Mapped[int] = mapped_column(
        ForeignKey("server_measurements.id", ondelete="CASCADE"), primary_key=True
    )
    pass_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    wall_seconds: Mapped[float] = mapped_column(Double)
    new_tokens: Mapped[int] = mapped_column(BigInteger)
    # v20: the pass's engine steps after each request's first token, summed over its requests: their seconds (last
    # token's arrival less the first's), the tokens they produced, and the steps (the speculative server's drafts
    # counter over the pass; one a token for the target alone). decode_seconds / decode_steps is the server's step
    # cost t_k at this k and concurrency (storage/serving/profiles.py)
    decode_seconds: Mapped[float | None] = mapped_column(Double, nullable=True)
    decode_tokens: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    decode_steps: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


# A swept variable (engine/config/variables.py) is a column of experiments (its one value) and of runs (each run's own).
# Those written out above keep their first declaration; a variable described later gets its column here, typed
# from its description, and migrations.py's variable step adds it to an older database.
_SQL_TYPES = {int: (Integer, "INTEGER"), float: (Double, "DOUBLE PRECISION"), str: (Text, "TEXT")}


def variable_columns() -> list[tuple[str, str, str]]:
    """(table, column, SQL type) of every swept variable's column on experiments and runs."""
    from engine.config.variables import VARIABLES

    return [(table, name, _SQL_TYPES[v.kind][1]) for name, v in VARIABLES.items() for table in ("experiments", "runs")]


def _declare_variable_columns() -> None:
    from engine.config.run_config import DEFAULTS
    from engine.config.variables import VARIABLES

    for name, v in VARIABLES.items():
        for model in (Experiment, Run):
            if name not in model.__table__.c:
                setattr(model, name, mapped_column(_SQL_TYPES[v.kind][0], nullable=True, default=DEFAULTS[name]))


_declare_variable_columns()

# What a run stores is described once, by the engine's records (engine/decoding/records.py): each stored field of
# a DraftToken, Round or PromptResult is a column of its table, and each round measurement summed per prompt is a
# column of prompt_results too. Those written out above keep their declaration; a field added since gets its column
# here, NULL-able and typed from the field, and migrations.py's add_record_columns adds it to an older database.
_PY_TYPES = {int: (Integer, "INTEGER"), float: (Double, "DOUBLE PRECISION"), str: (Text, "TEXT")}


def _record_columns() -> list[tuple[type[Base], str, type, object]]:
    """(model, column, Python type, default) of every column the engine's records store."""
    from dataclasses import MISSING, fields

    from engine.decoding import records

    found: list[tuple[type[Base], str, type, object]] = []
    for record, model in (
        (records.DraftToken, DraftTokenRow),
        (records.Round, RoundRow),
        (records.PromptResult, PromptResult),
    ):
        defaults = {f.name: None if f.default is MISSING else f.default for f in fields(record)}
        found += [(model, name, kind, defaults[name]) for name, kind in records.stored_fields(record).items()]
    kinds = records.stored_fields(records.Round)
    found += [(PromptResult, name, kinds[name], 0) for name in records.summed_fields(records.Round)]
    return found


def record_columns() -> list[tuple[str, str, str]]:
    """(table, column, SQL type) of every column the engine's records store (draft_tokens, rounds, prompt_results)."""
    return [(model.__tablename__, name, _PY_TYPES[kind][1]) for model, name, kind, _ in _record_columns()]


def _declare_record_columns() -> None:
    for model, name, kind, default in _record_columns():
        if name not in model.__table__.c:
            setattr(model, name, mapped_column(_PY_TYPES[kind][0], nullable=True, default=default))


_declare_record_columns()


def _table(model: type[Base]) -> Table:
    """A model's table, typed as the Table it is (SQLAlchemy types `__table__` as any FromClause)."""
    return cast(Table, model.__table__)


schema_info = _table(SchemaInfo)
experiments = _table(Experiment)
experiment_prompts = _table(ExperimentPrompt)
workers = _table(Worker)
runs = _table(Run)
prompt_results = _table(PromptResult)
rounds = _table(RoundRow)
output_tokens = _table(OutputToken)
draft_tokens = _table(DraftTokenRow)
timings = _table(Timing)
device_leases = _table(DeviceLease)
verify_profile = _table(VerifyProfile)
batch_verify_profile = _table(BatchVerifyProfile)
training_jobs = _table(TrainingJob)
training_points = _table(TrainingPoint)
training_accuracy = _table(TrainingAccuracy)
production_series = _table(ProductionSeries)
production_positions = _table(ProductionPosition)
server_confirms = _table(ServerConfirm)
server_measurements = _table(ServerMeasurement)
server_passes = _table(ServerPass)
