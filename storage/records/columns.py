"""One table of the figures shown about runs and experiments: each column's name (the query's column, the export's
key), its header, its help and its one number format. The runs query (storage/records/run_rows.py), the `run --json`
keys (storage/serving/export.py), every page's tables (pages/widgets/common.py's `column_config`, `show`) and the
metric tables of docs/metrics.md (`metric_definitions`) read it, so a metric reads the same on every page (α was
0.635 in one table and 0.636 in another), no header is blank or a raw name, and a new metric is one entry here: its
SQL (`sql`, selected by the runs query: over stored rows, or over a measurement the engine's records store, e.g.
`SUM(p.x) FROM prompt_results p`), the tables it shows in (`tables`, `json`) and its definition (`section`, `doc`)
included.

`fmt` is a printf format ("%.3f"): Streamlit's grid formats numbers with it and `show` formats text with it, so
a figure in a sentence or a metric tile and the same figure in a table agree to the last digit shown.
"""

from __future__ import annotations

from dataclasses import dataclass

MISSING = "—"  # a figure a row does not have (the baseline's speedup) or not yet (a running run's)


@dataclass(frozen=True)
class Column:
    name: str
    header: str
    help: str = ""
    fmt: str | None = None  # printf format of a number; None: shown as it is (text, ids)
    kind: str = "number"  # number, text, progress, list, datetime, checkbox
    width: str | None = None  # the grid's "small", "medium", "large"; None lets it size the column
    json: bool = False  # one of a speculative run's keys in `draftlab run --json`, in this table's order (SPEC)
    # A per-run metric computed where it is listed: an SQL expression over the run `r` (a runs row; subqueries over
    # its rounds, prompt_results or draft_tokens by `r.id`), selected by storage/records/run_rows.py's runs() as this
    # name. None: the runs query selects the column itself.
    sql: str | None = None
    tables: tuple[str, ...] = ()  # the detail page's tables it shows in besides their own list: "runs", "cost"
    # Its definition in docs/metrics.md: the section's table it is a row of (metric_definitions), the definition,
    # and the row's name cell when it names more than this column (a p50 row naming its p95 too).
    section: str | None = None  # "counts", "times", "serving"; None: not a row of those tables
    doc: str = ""
    doc_label: str | None = None


def _c(*args, **kwargs) -> Column:
    return Column(*args, **kwargs)


SPEEDUP = "%.2f×"
RATE = "%.3f"

# Runs: storage.records.queries.runs() returns these columns in this order; `json` marks the SPEC keys of a
# speculative run.
RUN = [
    _c("run_id", "run", "the run's id (draftlab list, ?run= in links)", "%d"),
    _c("kind", "kind", "baseline: the target alone; speculative: a draft proposes, the target verifies", kind="text"),
    _c("k", "k", "draft tokens proposed per round (a drafter that varies it: its upper bound)", "%d"),
    _c("sweep_value", "value", "the swept variable's value in this run", kind="text"),
    _c("status", "status", kind="text", width="small"),
    _c(
        "progress",
        "progress",
        "prompts finished, of the experiment's prompts × repeats",
        "%.0f%%",
        kind="progress",
        width="small",
    ),
    _c("error", "error", "why the run failed, was cancelled or interrupted", kind="text"),
    _c("started", "started", kind="datetime"),
    _c("finished", "finished", kind="datetime"),
    _c("new_tokens", "new tokens", "tokens generated over every prompt (one repeat)", "%d", json=True),
    _c("wall_seconds", "wall (s)", "decoding time over every prompt (median repeat)", "%.2f", json=True),
    _c(
        "tokens_per_second",
        "tokens/s",
        "new tokens / wall seconds",
        "%.1f",
        json=True,
        section="serving",
        doc="throughput over the batch: Σ new tokens / Σ batch wall times (above)",
    ),
    _c("rounds", "rounds", "draft-and-verify rounds", "%d", json=True, section="counts", doc="number of rounds"),
    _c("proposed", "proposed", "draft tokens proposed", "%d", json=True, section="counts", doc="Σ k_r"),
    _c(
        "accepted",
        "accepted",
        "draft tokens the target accepted",
        "%d",
        json=True,
        section="counts",
        doc="Σ a_r (emitted accepted drafts)",
    ),
    _c(
        "rejected",
        "rejected",
        "draft tokens the target rejected",
        "%d",
        json=True,
        section="counts",
        doc="rounds with a_r < k_r that verified and refused a draft token (one each)",
    ),
    _c(
        "draft_acceptance_rate",
        "acceptance rate",
        "accepted / proposed draft tokens",
        RATE,
        json=True,
        section="counts",
        doc='accepted / proposed (vLLM\'s "draft acceptance rate")',
    ),
    _c(
        "alpha",
        "α",
        "accepted / (accepted + rejected): per verified draft token, the α of the formulas",
        RATE,
        json=True,
        section="counts",
        doc="accepted / (accepted + rejected): per verified draft token, the α of the formulas",
    ),
    _c(
        "tokens_per_round",
        "tokens/round",
        "tokens emitted per round: accepted drafts plus the target's own",
        "%.2f",
        json=True,
        section="counts",
        doc='tokens emitted by rounds / rounds (vLLM\'s "mean acceptance length")',
    ),
    _c(
        "full_accept_share",
        "full accepts",
        "share of rounds (with drafts) whose every draft was accepted, ending "
        "in a bonus token: how often k was too short (what the heuristic drafter's +2 reacts to)",
        RATE,
        json=True,
        sql="SELECT CAST(SUM(CASE WHEN rd.accepted = rd.k THEN 1 ELSE 0 END) AS DOUBLE PRECISION) "
        "/ NULLIF(COUNT(*), 0) FROM rounds rd WHERE rd.run_id = r.id AND rd.k > 0",
        tables=("runs",),
        section="counts",
        doc="rounds with a_r = k_r > 0 / rounds with k_r > 0: the share of rounds that proposed drafts and had every "
        "one accepted, ending in a bonus token (how often k was too short; the heuristic drafter's +2 trigger). A"
        " round cut by `max_new_tokens` or EOS before its last draft is not a full accept; baselines have none",
    ),
    _c(
        "zero_accept_share",
        "empty rounds",
        "share of rounds (with drafts) whose first draft was rejected: the round emitted only the target's own "
        "token, so its draft steps were pure cost (what a shorter k or a better first draft would save)",
        RATE,
        json=True,
        sql="SELECT CAST(SUM(CASE WHEN rd.accepted = 0 AND rd.rejected > 0 THEN 1 ELSE 0 END) AS DOUBLE PRECISION) "
        "/ NULLIF(COUNT(*), 0) FROM rounds rd WHERE rd.run_id = r.id AND rd.k > 0",
        tables=("runs",),
        section="counts",
        doc="rounds with k_r > 0 whose first draft was verified and rejected (a_r = 0) / rounds with k_r > 0: the "
        "rounds that bought nothing over the target alone, paying every draft step (the mirror of full accepts). A "
        "round cut by `max_new_tokens` or EOS before its first draft is not counted as one; baselines have none",
    ),
    _c(
        "accepted_off_chain_share",
        "off-chain accepts",
        "token trees: share of rounds (with drafts) whose accepted path left the draft's top-1 chain (an accepted "
        "node that was not its parent's top-ranked child); none for chains",
        RATE,
        json=True,
        sql="CASE WHEN COALESCE(r.tree_topk, 1) > 1 THEN CAST((SELECT COUNT(*) FROM rounds rd WHERE rd.run_id = r.id "
        "AND rd.k > 0 AND EXISTS (SELECT 1 FROM draft_tokens d WHERE d.run_id = rd.run_id AND d.prompt_index = "
        "rd.prompt_index AND d.round_index = rd.round_index AND d.outcome = 'accepted' AND d.sibling_rank > 0)) "
        "AS DOUBLE PRECISION) / NULLIF((SELECT COUNT(*) FROM rounds rd WHERE rd.run_id = r.id AND rd.k > 0), 0) END",
        section="counts",
        doc="token trees (`tree_topk` > 1): rounds with k_r > 0 whose accepted path holds a node of sibling rank > 0 "
        "(not its parent's top-1 child) / rounds with k_r > 0: how often the tree's other branches won; null for "
        "chains",
    ),
    _c(
        "expected_alpha",
        "expected α",
        "mean over verified positions of β = Σ min(p_d, p_t): the acceptance the two distributions predict",
        RATE,
        json=True,
        section="counts",
        doc="mean over verified positions of β = Σ_x min(p_d(x), p_t(x)); E[accept] = β under sampling",
    ),
    _c(
        "kl",
        "KL",
        "KL(p_t ‖ p_d) in nats per verified token",
        RATE,
        json=True,
        section="counts",
        doc="D_KL(p_t ‖ p_d) on the raw (temperature 1, unfiltered) distributions at verified positions",
    ),
    _c(
        "target_entropy",
        "target entropy",
        "mean entropy of the target's own distribution (raw logits) where drafts were verified, in nats: high means "
        "the target itself was unsure, so rejections there are its doubt more than the draft's miss",
        RATE,
        json=True,
        sql="SELECT AVG(d.target_entropy) FROM draft_tokens d WHERE d.run_id = r.id AND d.outcome <> 'discarded'",
        tables=("runs",),
        section="counts",
        doc="mean over verified positions of H(p_t) = −Σ_x p_t(x) ln p_t(x), on the raw (temperature 1, unfiltered) "
        "target distribution, in nats; measured by the engine at each draft's slot of the verify forward",
    ),
    _c(
        "per_position_acceptance",
        "acceptance by position",
        "conditional acceptance at draft positions 1..k",
        kind="list",
        json=True,
        section="counts",
        doc="draft position i = 1..k: accepted at i / rounds that reached i (conditional)",
        doc_label="`per_position_acceptance[i]`",
    ),
    _c("acceptance_by_type", "acceptance by token type", kind="list", json=True),
    _c(
        "draft_step_seconds",
        "draft step (s)",
        "one single-token draft forward",
        "%.5f",
        json=True,
        section="times",
        doc="drafting time / draft forwards, measured while drafting",
    ),
    _c(
        "target_step_seconds",
        "target step (s)",
        "one single-token target forward (the run's baseline)",
        "%.5f",
        section="times",
        doc="mean time of one single-token target forward, measured in the baseline (target-only) run",
    ),
    _c(
        "c",
        "c",
        "target step / draft step: how much cheaper a draft forward is",
        "%.2f",
        json=True,
        section="times",
        doc="target_step_seconds / draft_step_seconds",
    ),
    _c(
        "predicted_speedup",
        "formula at run's α, c",
        "predicted from α and c alone: (1 − α^(k+1)) / ((1 − α)"
        "(1 + k/c)) at this run's own α, k and c; the speedup chart's grey curve pools α and c over the sweep instead",
        SPEEDUP,
        json=True,
        section="times",
        doc="the article's formula: (1 − α^(k+1)) / ((1 − α)(1 + k/c)), with measured α, c and the run's largest k",
    ),
    _c(
        "speedup",
        "speedup",
        "this run's tokens/s over its baseline's, over the prompts both finished (median repeats)",
        SPEEDUP,
        json=True,
        section="times",
        doc="over the prompts both the run and its baseline finished: (Σ run tokens / Σ run seconds) / (Σ baseline "
        "tokens / Σ baseline seconds), each prompt's seconds the median of its repeats. With equal token counts "
        "(greedy) this is Σ baseline time / Σ run time. A failed or cancelled baseline gives no speedup "
        "(`speedup_note` says why)",
    ),
    _c(
        "speedup_ci",
        "speedup 95 % interval",
        kind="list",
        json=True,
        section="times",
        doc="95 % paired bootstrap interval of `speedup`: 2,000 resamples of the prompts with replacement, each "
        "prompt's two timings kept together, percentile interval",
        doc_label="`speedup_ci` (`speedup_ci_lo`, `speedup_ci_hi`)",
    ),
    _c("speedup_ci_lo", "95 % low", "lower end of the speedup's 95 % interval (paired bootstrap over prompts)", "%.2f"),
    _c(
        "speedup_ci_hi", "95 % high", "upper end of the speedup's 95 % interval (paired bootstrap over prompts)", "%.2f"
    ),
    _c(
        "speedup_note",
        "speedup note",
        "why a speculative run has no speedup, or only a partial one",
        kind="text",
        json=True,
    ),
    _c(
        "timing_warning",
        "timing warning",
        "a measured speedup no tokens per round allow: never picked as the best",
        kind="text",
        json=True,
        section="times",
        doc="set when `speedup` > `tokens_per_round`, which no real speedup can exceed (every round costs at least "
        "one target forward); such a run is never reported as the best",
    ),
    _c(
        "verify_cost",
        "verify cost",
        "one verify forward over a round's tokens, in target steps (the formula assumes 1)",
        "%.2f",
        json=True,
        section="times",
        doc="mean verify time per round / target_step_seconds: a verify forward over k+1 tokens in target steps",
    ),
    _c(
        "predicted_speedup_refined",
        "cost-aware",
        "E[L]·t / (k·t_d + verify) from the run's own round times",
        SPEEDUP,
        json=True,
        section="times",
        doc="E[L] · target_step_seconds / (draft time per round + verify time per round), E[L] = 1 + Σ_i Π_{j≤i} "
        "per_position_acceptance[j]: the formula with the verify pass at its measured cost. Computed from the "
        "run's own round times it decomposes the measurement (it lands within a few % of `speedup`); it does not "
        "predict one",
    ),
    # Serving metrics (docs/metrics.md "Serving metrics"): over the median repeat of each batch.
    _c(
        "batch_size",
        "batch",
        "requests decoded together per forward (prompts grouped in order into batches)",
        "%d",
        json=True,
        section="serving",
        doc="requests (prompts) decoded together per forward",
    ),
    _c(
        "ttft_seconds_p50",
        "TTFT p50 (s)",
        "time to first token, median over requests: from the batch's start to the "
        "request's first token reaching the host",
        "%.4f",
        json=True,
        section="serving",
        doc="time to first token: per request, the arrival of its first new token (a speculative run's first token "
        "arrives with its first round, which also verifies the prefill; the baseline's with the prefill); p50 and"
        " p95 over requests",
        doc_label="`ttft_seconds_p50`, `ttft_seconds_p95`",
    ),
    _c("ttft_seconds_p95", "TTFT p95 (s)", "time to first token, 95th percentile over requests", "%.4f", json=True),
    _c(
        "itl_seconds_p50",
        "ITL p50 (s)",
        "inter-token latency, median over every gap between a request's consecutive "
        "tokens (a speculative round's tokens arrive together: gaps of 0 inside a round)",
        "%.4f",
        json=True,
        section="serving",
        doc="inter-token latency: every gap between consecutive tokens of a request, pooled over requests; gaps "
        "inside a speculative round are 0, so p50 can be 0 while p95 shows the stall between rounds a streaming "
        "user feels",
        doc_label="`itl_seconds_p50`, `itl_seconds_p95`",
    ),
    _c(
        "itl_seconds_p95",
        "ITL p95 (s)",
        "inter-token latency, 95th percentile: the stall a streaming user feels",
        "%.4f",
        json=True,
    ),
    _c(
        "request_latency_seconds_p50",
        "latency p50 (s)",
        "per-request latency, median: from the batch's start to the request's last token",
        "%.4f",
        json=True,
        section="serving",
        doc="per-request latency: from the batch's start to the request's last token (its `wall_seconds`); every "
        "request of a batch starts together",
        doc_label="`request_latency_seconds_p50`, `request_latency_seconds_p95`",
    ),
    _c(
        "request_latency_seconds_p95",
        "latency p95 (s)",
        "per-request latency, 95th percentile over requests",
        "%.4f",
        json=True,
    ),
    _c(
        "vocab",
        "vocab",
        "shared: the draft has the target's tokenizer; intersection: another one, drafting over the tokens both "
        "share (vLLM's use_heterogeneous_vocab)",
        kind="text",
        json=True,
        sql="SELECT MAX(p.vocab) FROM prompt_results p WHERE p.run_id = r.id",
    ),
    _c(
        "vocab_coverage",
        "vocab coverage",
        "share of the target's vocabulary the draft can propose (1 with one tokenizer)",
        RATE,
        json=True,
        sql="SELECT MAX(p.vocab_coverage) FROM prompt_results p WHERE p.run_id = r.id",
    ),
    _c(
        "verify",
        "verify",
        "how the target verified the drafts: standard (token by token) or block (block verification, vLLM's "
        "rejection_sample_method block)",
        kind="text",
        json=True,
    ),
    _c(
        "accepted_standard",
        "accepted (standard)",
        "block runs: the draft tokens the standard rule would have accepted on the same drafts and uniforms",
        "%d",
        json=True,
        sql="SELECT SUM(rd.accepted_standard) FROM rounds rd WHERE rd.run_id = r.id",
        section="counts",
        doc="block runs only (null under the standard rule): Σ over rounds of what the standard rule would have "
        "accepted on the round's drafts with the same uniforms; accepted − accepted_standard is what block "
        "verification gained on these very drafts",
    ),
    _c(
        "outputs_match_baseline",
        "same output",
        "greedy runs only: every prompt's output equals the baseline's "
        "token for token (speculative decoding is lossless); blank when sampling, where outputs differ by design",
        kind="checkbox",
    ),
    _c(
        "peak_memory_mb",
        "peak memory (MB)",
        "as the worker measured it",
        "%.0f",
        section="times",
        doc="CUDA: torch's peak allocation during the run's decodes (reset before each decode); CPU: the bytes of the"
        " models the run uses plus its peak KV caches",
    ),
    _c(
        "check",
        "⚠ check",
        "⚠ impossible speedup: the timing drifted (a timing warning); never picked as the best",
        kind="text",
    ),
]

# Experiments: storage.analysis.catalog.experiments() and the pages' derived columns.
EXPERIMENT = [
    _c("experiment_id", "id", fmt="%d"),
    _c("name", "name", kind="text", width="medium"),
    _c("created", "created", kind="datetime"),
    _c("target", "target", kind="text"),
    _c("draft", "draft", kind="text"),
    _c("prompts", "prompts", "the prompt set or file", kind="text"),
    _c("sweep_variable", "swept", "the variable the runs vary", kind="text"),
    _c("sweep_values", "values", "its values, one run each", kind="list"),
    _c(
        "batch_sizes",
        "at batch sizes",
        "a grid: the sweep at each of these batch sizes, each with its own baseline "
        "(the best, ties and α are its smallest batch size's; the detail page has the k schedule)",
        kind="list",
    ),
    _c("best_value", "best value", "the best run's sweep_value (a draft or drafter sweep: its index)", kind="text"),
    _c(
        "best_label",
        "best",
        "the swept value whose finished run measured the highest speedup (a draft's path by "
        "its last part; the CSV has it whole)",
        kind="text",
    ),
    _c("best_speedup", "best speedup", "the best run's measured speedup", SPEEDUP),
    _c("interval", "95 % interval", "of the best speedup: paired bootstrap over prompts", kind="text"),
    _c("alpha", "α (best run)", "the best run's α", RATE),
    _c("n_tied", "ties", "other values whose interval overlaps the best one's: statistically tied with it", "%d"),
    _c("timing_warnings", "⚠ impossible", "runs timed faster than their tokens per round allow (never the best)", "%d"),
    _c("repeats", "repeats", "timed decodes of each prompt per run (medians)", "%d"),
    _c("tags", "tags", kind="text"),
    _c("notes", "notes", kind="text", width="medium"),
]

# A run's breakdowns (per prompt, most rejected tokens), beside the run columns above they share.
BREAKDOWN = [
    _c("prompt_index", "prompt #", "the prompt's place in the experiment's prompt set, from 0", "%d"),
    _c("prompt", "prompt", kind="text", width="medium"),
    _c(
        "matches_baseline",
        "same output",
        "greedy runs only: this prompt's output equals the baseline's token for token",
        kind="checkbox",
    ),
    _c("verified", "verified", "draft tokens the target checked", "%d"),
    _c("text", "text", kind="text"),
    _c("token", "token", "the draft token as text (escapes shown)", kind="text"),
    _c("token_id", "token id", fmt="%d"),
    _c("token_type", "token type", kind="text"),
    _c("rejection_rate", "rejection rate", "rejected / verified", RATE),
]

COLUMNS: dict[str, Column] = {c.name: c for c in [*RUN, *BREAKDOWN]}
EXPERIMENT_COLUMNS: dict[str, Column] = {c.name: c for c in EXPERIMENT}

RUN_QUERY = [c.name for c in RUN if c.kind != "list" and c.name != "check"]  # what queries.runs() returns
COMPUTED = [c for c in RUN if c.sql]  # the metrics the runs query computes from their entry's SQL


def shown_in(table: str) -> list[str]:
    """The computed metrics a detail-page table shows (their entry's `tables`), in this table's order."""
    return [c.name for c in COMPUTED if table in c.tables]


SPECULATIVE_KEYS = [c.name for c in RUN if c.json]  # a speculative run's metrics in `draftlab run --json`


DOC_SECTIONS = ("counts", "times", "serving")  # docs/metrics.md's tables of run metrics: counts and rates, times
# and speedups, serving metrics


def metric_definitions(section: str) -> str:
    """docs/metrics.md's table of one section's run metrics (Markdown), read from their entries above: a new metric's
    definition is its entry's `doc`."""
    if section not in DOC_SECTIONS:
        raise ValueError(f"no metrics section {section!r}; one of {', '.join(DOC_SECTIONS)}")
    rows = [f"| {c.doc_label or f'`{c.name}`'} | {c.doc} |" for c in RUN if c.section == section]
    return "\n".join(["| name | definition |", "|---|---|", *rows])


def show(name: str, value, columns: dict[str, Column] | None = None) -> str:
    """A figure as text, in its column's format: `show("alpha", 0.6355)` is what the tables show for it; missing
    (None, NaN) is MISSING."""
    if value is None or (isinstance(value, float) and value != value):
        return MISSING
    if type(value).__name__ in ("bool", "bool_"):  # numpy's too
        return "yes" if value else "no"
    column = (columns or COLUMNS).get(name) or EXPERIMENT_COLUMNS.get(name)
    if column is None or column.fmt is None or isinstance(value, str):
        return f"{value:g}" if isinstance(value, float) else str(value)
    try:
        return column.fmt % value
    except (TypeError, ValueError):
        return str(value)
