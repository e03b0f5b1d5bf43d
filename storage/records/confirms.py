"""Server measurements (`draftlab confirm`): an experiment's configurations measured in a serving engine, stored
linked to the experiment and its lab runs, and read back as SPEC's "Confirm in a serving engine" JSON.

Per server configuration and concurrency (one `server_measurements` row, its passes in `server_passes`):
- tokens_per_second = Σ new tokens / Σ pass wall (throughput over the closed loop);
- ttft / request latency: per request, from when it was sent (closed loop: a request waits for a free slot, not
  for the pass) to its first / last token; ITL: the gaps between a request's consecutive tokens, a streamed chunk
  of n tokens giving one gap of its duration and n − 1 gaps of 0 (the lab's rule for a round), pooled over
  requests and passes; percentiles by engine/metrics/stats.py's `percentile`;
- speedup = the speculative server's tokens per second / the target-only server's over the same passes (Σ new
  tokens / Σ pass wall each side), the passes paired by index (A B A B: the two servers' pass i ran back to back):
  equal work per generated token, the lab's own definition (engine/metrics/stats.py's paired_speedup), so a server that
  stops early is not faster for it; its 95 % interval is engine/metrics/stats.py's paired bootstrap, resampling passes
  (so it needs two passes or more; None with one). It is stored only when it is a result (`withheld`): not when the
  outputs differ (greedy: not equal to the server's own target-only outputs; sampled:
  engine/metrics/sampled_outputs.py's tests), nor when its interval lies wholly above the server's tokens per step
  (1 + accepted / drafts of its counters over the same passes), which no real speedup can exceed; `speedup_warning`
  says why instead;
- the server's acceptance: the counters' difference over the configuration's passes, stored as a production
  series (storage/records/production.py) linked to the lab run, read with its definitions (conditional per position).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import insert, text, update

from engine.metrics.stats import paired_bootstrap_ci, paired_speedup, percentile
from storage.db.schema import DONE, FAILED, RUNNING, server_confirms, server_measurements, server_passes, utcnow
from storage.db.store import Store, new_id
from storage.records.frames import _frame
from storage.records.production import add_series, lab_positions, series
from storage.records.server_costs import drafter_fingerprint
from storage.records.workers import confirm_processes

LATENCY_KEYS = (
    "ttft_seconds_p50",
    "itl_seconds_p50",
    "itl_seconds_p95",
    "request_latency_seconds_p50",
    "request_latency_seconds_p95",
)


def _token_times(request) -> list[float]:
    """Each new token's arrival (a chunk's tokens share its arrival)."""
    return [t for t, n in zip(request.arrivals, request.counts) for _ in range(n)]


def summarize(passes) -> dict:
    """Throughput and latency figures of one server's passes at one concurrency (objects with `wall_seconds`,
    `requests`; requests with `sent`, `arrivals`, `counts`: app/serving/completions_load.py's records)."""
    ttft, latency, gaps = [], [], []
    tokens = 0
    for p in passes:
        for r in p.requests:
            times = _token_times(r)
            tokens += len(times)
            if times:
                ttft.append(times[0] - r.sent)
                latency.append(times[-1] - r.sent)
                gaps += np.diff(times).tolist()
    wall = float(sum(p.wall_seconds for p in passes))
    return {
        "requests": sum(len(p.requests) for p in passes),
        "new_tokens": tokens,
        "wall_seconds": wall,
        "tokens_per_second": tokens / wall if wall > 0 else 0.0,
        "ttft_seconds_p50": percentile(ttft, 50),
        "itl_seconds_p50": percentile(gaps, 50),
        "itl_seconds_p95": percentile(gaps, 95),
        "request_latency_seconds_p50": percentile(latency, 50),
        "request_latency_seconds_p95": percentile(latency, 95),
    }


def pass_speedup(baseline, speculative) -> tuple[float | None, list[float] | None]:
    """(speculative tokens per second / baseline tokens per second, its 95 % paired-bootstrap interval over passes or
    None under two pairs) of two servers' passes (objects with `new_tokens` and `wall_seconds`). Pass i of each
    server pairs with pass i of the other."""
    n = min(len(baseline), len(speculative))
    columns = (
        [p.new_tokens for p in baseline[:n]],
        [p.wall_seconds for p in baseline[:n]],
        [p.new_tokens for p in speculative[:n]],
        [p.wall_seconds for p in speculative[:n]],
    )
    speedup = paired_speedup(*columns)
    ci = paired_bootstrap_ci(*columns) if n >= 2 and speedup is not None else None
    return speedup, list(ci) if ci else None


def withheld(speedup: float | None, ci, steps: float | None, matches: dict, outputs_test: dict | None) -> str | None:
    """Why a measured server speedup is not a result, in a sentence, or None: the outputs differ (speculation
    changed them, so it is not the same work), or its interval lies wholly above `steps`, the server's tokens per
    step (every step costs a target forward, so no real speedup exceeds it; the lab's guard,
    storage/records/recording.py, with the interval as slack: one pass has none, its figure is the bound; no counters,
    no bound)."""
    if speedup is None:
        return None
    measured = f"{speedup:.2f}×" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else "")
    if outputs_test is not None and outputs_test.get("differs"):
        return (
            f"speculation changed the output distribution in this server (mean length "
            f"{outputs_test['speculative_mean_length']:.1f} against {outputs_test['baseline_mean_length']:.1f} "
            f"tokens target-only, p = {_p(outputs_test['lengths_p'])}; token frequencies p = "
            f"{_p(outputs_test['tokens_p'])}; {outputs_test['prompts']} prompts, {outputs_test['answers']} "
            f"answers each): the measured {measured} is "
            f"not a speedup of the same outputs"
        )
    same = matches.get("outputs_match_server_baseline")
    if same is not None and same < 1:
        return (
            f"speculation changed the greedy outputs in this server ({same:.0%} of the prompts equal to its "
            f"target-only outputs): the measured {measured} is not a speedup of the same outputs"
        )
    if steps is not None and (ci[0] if ci else speedup) > steps * (1 + 1e-9):
        return (
            f"the measured {measured} exceeds the server's {steps:.2f} tokens per step (1 + accepted / drafts of "
            f"its counters), which no real speedup can (every step costs a target forward): the timing drifted; "
            f"confirm again with more --repeats or on a quieter machine"
        )
    return None


def _p(value) -> str:
    return "not tested" if value is None else f"{value:.2g}"


def outputs_match(
    outputs: dict[int, list[int]], reference: dict[int, list[int]], what: str
) -> tuple[float | None, str | None]:
    """(share of the prompts whose token ids equal the reference's, the first divergence as a sentence or None).
    None share when there is no reference to compare with."""
    common = sorted(set(outputs) & set(reference))
    if not common:
        return None, None
    equal, first = 0, None
    for i in common:
        a, b = outputs[i], reference[i]
        if a == b:
            equal += 1
        elif first is None:
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first = (
                f"prompt {i} differs from {what} at token {j} (server {a[j] if j < len(a) else 'end'}, "
                f"{what} {b[j] if j < len(b) else 'end'})"
            )
    return equal / len(common), first


def lab_outputs(store: Store, run_id: int) -> dict[int, list[int]]:
    """A lab run's emitted token ids per prompt (output_tokens, in order)."""
    with store.read() as conn:
        rows = conn.execute(
            text("SELECT prompt_index, token_id FROM output_tokens WHERE run_id = :r ORDER BY prompt_index, position"),
            {"r": run_id},
        ).all()
    out: dict[int, list[int]] = {}
    for prompt_index, token_id in rows:
        out.setdefault(int(prompt_index), []).append(int(token_id))
    return out


# --- writing ---------------------------------------------------------------------------------------------------


def start_confirm(
    store: Store,
    experiment_id: int,
    *,
    configs: str,
    concurrency: list[int],
    repeats: int,
    engine: str = "vllm",
    launched_by: str | None = None,
    requests_total: int | None = None,
    profile_run_id: int | None = None,
    profile_ks: list[int] | None = None,
) -> int:
    """A confirm the CLI runs itself, stored running (the dashboard's are queued: storage/serving/confirm_jobs.py), held
    by this process: its heartbeat (the CLI's) and `processes` let a sweep close it if the process dies. A profile
    (`configs` = "profile") names the run whose drafter it serves and its ks, as a queued one does."""
    with store.write() as conn:
        if conn.execute(text("SELECT 1 FROM experiments WHERE id = :e"), {"e": experiment_id}).first() is None:
            raise KeyError(experiment_id)
        return int(
            new_id(
                conn.execute(
                    insert(server_confirms).values(
                        experiment_id=experiment_id,
                        engine=engine,
                        configs=configs,
                        repeats=repeats,
                        launched_by=launched_by,
                        concurrency=",".join(map(str, concurrency)),
                        phase="running in `draftlab confirm`",
                        requests_total=requests_total,
                        heartbeat=utcnow(),
                        processes=confirm_processes(),
                        profile_run_id=profile_run_id,
                        profile_ks=",".join(map(str, profile_ks)) if profile_ks else None,
                    )
                )
            )
        )


def add_measurement(
    store: Store,
    confirm_id: int,
    experiment_id: int,
    *,
    label: str,
    k: int,
    run_id: int | None,
    speculative_config: str | None,
    concurrency: int,
    passes,
    figures: dict,
    speedup: tuple | None = None,
    counters=None,
    matches: dict | None = None,
    outputs_test: dict | None = None,
    baseline_tokens_per_second: float | None = None,
    run_ids: list[int] | None = None,
    predicted: dict | None = None,
) -> int:
    """Store one configuration at one concurrency, all at once: its figures (`summarize`), its passes, its paired
    speedup (`pass_speedup`) unless `withheld` says why not (then that sentence instead), its counters' difference
    (a production series, app/production_scrape.SpecCounters), its output comparisons
    {"outputs_match_server_baseline", "outputs_match_lab", "first_divergence"} (greedy) or `outputs_test` (sampled:
    engine/metrics/sampled_outputs.py), the paired target-only passes' tokens per second, every lab run the served
    configuration stands for (`run_ids`, `run_id` first) and the speedup predicted for it before it was measured
    (`predicted`: storage/serving/cell_predictions.py, {"speedup", "speedup_ci", "profile_id",
    "tokens_per_step", "step_seconds_ratio"})."""
    series_id = None
    if counters is not None and counters.drafts > 0 and counters.draft_tokens > 0:
        series_id = add_series(
            store,
            experiment_id,
            drafts=counters.drafts,
            draft_tokens=counters.draft_tokens,
            accepted=counters.accepted,
            per_position=counters.per_position,
            label=f"confirm {confirm_id}: {label}, concurrency {concurrency}"[:200],
            source=f"draftlab confirm {confirm_id}",
            engine=",".join(counters.engines),
            seconds=figures["wall_seconds"],
            run_id=run_id,
            several_ok=True,  # a profile's other k beside a grid: several lab runs at that k, none named
        )["series_id"]
    value, ci = speedup or (None, None)
    warning = None
    if speculative_config is not None:
        steps = _tokens_per_step(store, experiment_id, series_id) if counters is not None else None
        warning = withheld(value, ci, steps, matches or {}, outputs_test)
    if warning is not None:
        value, ci = None, None
    with store.write() as conn:
        mid = new_id(
            conn.execute(
                insert(server_measurements).values(
                    confirm_id=confirm_id,
                    experiment_id=experiment_id,
                    run_id=run_id,
                    series_id=series_id,
                    label=label,
                    k=k,
                    speculative_config=speculative_config,
                    concurrency=concurrency,
                    speedup=value,
                    speedup_ci_lo=ci[0] if ci else None,
                    speedup_ci_hi=ci[1] if ci else None,
                    speedup_warning=warning,
                    outputs_test=json.dumps(outputs_test) if outputs_test is not None else None,
                    baseline_tokens_per_second=baseline_tokens_per_second,
                    drafter_fingerprint=drafter_fingerprint(speculative_config) if speculative_config else None,
                    run_ids=",".join(str(int(r)) for r in run_ids) if run_ids else None,
                    **_predicted_columns(predicted),
                    **(matches or {}),
                    **figures,
                )
            )
        )
        conn.execute(
            insert(server_passes),
            [
                {
                    "measurement_id": mid,
                    "pass_index": i,
                    "wall_seconds": p.wall_seconds,
                    "new_tokens": p.new_tokens,
                    **_decode(p),
                }
                for i, p in enumerate(passes)
            ],
        )
    return int(mid)


def _predicted_columns(predicted: dict | None) -> dict:
    """A cell's prediction (add_measurement's `predicted`) as server_measurements' predicted_* columns."""
    if predicted is None:
        return {}
    lo, hi = predicted["speedup_ci"]
    return {
        "predicted_speedup": float(predicted["speedup"]),
        "predicted_speedup_ci_lo": float(lo),
        "predicted_speedup_ci_hi": float(hi),
        "predicted_profile_id": int(predicted["profile_id"]),
        "predicted_tokens_per_step": float(predicted["tokens_per_step"]),
        "predicted_cost_ratio": float(predicted["step_seconds_ratio"]),
    }


def _decode(record) -> dict:
    """A pass's decode figures (app/serving/completions_load.PassRecord.decode and its steps), NULL where unknown."""
    steps = getattr(record, "decode_steps", None)
    if steps is None or not hasattr(record, "decode"):
        return {"decode_seconds": None, "decode_tokens": None, "decode_steps": None}
    seconds, tokens = record.decode()
    return {"decode_seconds": float(seconds), "decode_tokens": int(tokens), "decode_steps": int(steps)}


def _tokens_per_step(store: Store, experiment_id: int, series_id: int | None) -> float:
    """A speculative server's tokens per engine step: its stored series' tokens per round (1 + accepted / drafts,
    storage/records/production.py); one when it never drafted (every step one token of the target's)."""
    if series_id is None:
        return 1.0
    return float(series(store, experiment_id).set_index("series_id").loc[series_id, "tokens_per_round"])


def describe_confirm(store: Store, confirm_id: int, *, hardware: str | None, target: str) -> None:
    """What a confirm's step costs hold for (a server cost profile, storage/serving/profiles.py): the machine its
    servers run on and the target they serve."""
    with store.write() as conn:
        conn.execute(
            update(server_confirms)
            .where(server_confirms.c.id == confirm_id)
            .values(hardware=hardware[:500] if hardware else None, target=target)
        )


def finish_confirm(
    store: Store,
    confirm_id: int,
    *,
    engine_version: str,
    wall_seconds: float,
    errors: list[str],
    worker_id: str | None = None,
    server_starts: int | None = None,
    one_server_at_a_time: bool | None = None,
) -> bool:
    """Close a confirm: done, or failed with one line per error, with how its servers ran (the starts, restarts
    included; one at a time or together). With worker_id only while that worker runs it (a confirm swept as
    interrupted stays so). Returns whether it was closed."""
    query = update(server_confirms).where(server_confirms.c.id == confirm_id)
    if worker_id is not None:
        query = query.where(server_confirms.c.worker_id == worker_id, server_confirms.c.status == RUNNING)
    with store.write() as conn:
        return (
            conn.execute(
                query.values(
                    engine_version=engine_version[:200],
                    wall_seconds=wall_seconds,
                    status=FAILED if errors else DONE,
                    phase=FAILED if errors else DONE,
                    error="\n".join(errors) or None,
                    server_starts=server_starts,
                    one_server_at_a_time=one_server_at_a_time,
                )
            ).rowcount
            == 1
        )


# --- reading ---------------------------------------------------------------------------------------------------


def _lab(store: Store, run_id: int | None, cache: dict) -> tuple[float | None, list[float] | None]:
    if run_id is None:
        return None, None
    if run_id not in cache:
        with store.read() as conn:
            rate = conn.execute(text("SELECT draft_acceptance_rate FROM runs WHERE id = :r"), {"r": run_id}).scalar()
        cache[run_id] = (
            float(rate) if rate is not None else None,
            [float(v) for v in lab_positions(store, run_id)["conditional"]],
        )
    return cache[run_id]


def _int(value: Any) -> int | None:
    return int(value) if value is not None and value == value else None


def _frame_rows(store: Store, confirm_id: int) -> list[dict]:
    with store.read() as conn:
        df = _frame(conn, "SELECT * FROM server_measurements WHERE confirm_id = :c ORDER BY id", {"c": confirm_id})
    return [
        {key: (None if isinstance(value, float) and value != value else value) for key, value in row.items()}
        for row in df.to_dict(orient="records")
    ]


def first_divergences(store: Store, confirm_id: int) -> list[dict]:
    """Per measurement whose outputs differ: its label, concurrency and the first divergence, as a sentence."""
    return [
        {"label": r["label"], "concurrency": int(r["concurrency"]), "first_divergence": r["first_divergence"]}
        for r in _frame_rows(store, confirm_id)
        if r["first_divergence"]
    ]


# --- beside the lab (the detail page's "Confirm in vLLM" panel and its findings) -----------------------------------


def server_k(speculative_config: dict, concurrency: int) -> int:
    """The k vLLM drafts at `concurrency` requests in a step: num_speculative_tokens, or a schedule's entry by
    vLLM's own lookup (vllm/v1/spec_decode/dynamic/utils.py: the range holding it, a gap takes the range before,
    past the last range its k; every entry capped at num_speculative_tokens)."""
    k = int(speculative_config["num_speculative_tokens"])
    ranges = speculative_config.get("num_speculative_tokens_per_batch_size")
    if not ranges:
        return k
    chosen = None
    for start, end, entry in sorted(ranges):
        if start <= concurrency:
            chosen = entry
        if start <= concurrency <= end:
            break
    return min(k, int(chosen if chosen is not None else ranges[0][2]))


def comparable_positions(speculative_config: dict, concurrency: int) -> int:
    """How many draft positions of a server's counters read as conditional acceptance: at `concurrency` requests in
    flight vLLM's batch size runs from 1 (the last requests finishing) to `concurrency`, so a schedule drafts the k
    of each of those; position j > the smallest of them is reached only by some rounds, while its conditional
    divides by every round that accepted j − 1 (found confirming a schedule: 0.14 at position 2 where k 1 and 2
    mixed). A constant k: all k positions."""
    return min(server_k(speculative_config, b) for b in range(1, max(1, int(concurrency)) + 1))


BESIDE_COLUMNS = [
    "measurement_id",
    "label",
    "speculative_config",
    "concurrency",
    "k",
    "positions",
    "speedup",
    "speedup_ci_lo",
    "speedup_ci_hi",
    "tokens_per_second",
    *LATENCY_KEYS,
    "series_id",
    "run_id",
    "outputs_match_server_baseline",
    "outputs_match_lab",
    "first_divergence",
    "speedup_warning",
    "outputs_test",
    "lab_run_id",
    "lab_speedup",
    "lab_speedup_ci_lo",
    "lab_speedup_ci_hi",
    "lab_tokens_per_second",
    *(f"lab_{key}" for key in LATENCY_KEYS),
]


def beside_lab(store: Store, confirm_id: int) -> pd.DataFrame:
    """Each speculative measurement of a confirm next to the lab's run that decoded the same drafts at a batch size
    equal to the concurrency with the k vLLM served there (`server_k`): its speedup with interval, throughput and
    latency (NaN where the lab never measured that batch size). One SQL join over runs of the same draft and
    drafter as the measured run; the k is picked per row."""
    with store.read() as conn:
        df = _frame(
            conn,
            """
            SELECT m.id AS measurement_id, m.label, m.concurrency, m.k AS configured_k, m.speculative_config,
                   m.speedup, m.speedup_ci_lo, m.speedup_ci_hi, m.tokens_per_second, m.ttft_seconds_p50,
                   m.itl_seconds_p50, m.itl_seconds_p95, m.request_latency_seconds_p50,
                   m.request_latency_seconds_p95, m.series_id, m.run_id, m.outputs_match_server_baseline,
                   m.outputs_match_lab, m.first_divergence, m.speedup_warning, m.outputs_test,
                   r.id AS lab_run_id, r.k AS lab_k, r.speedup AS lab_speedup, r.speedup_ci_lo AS lab_speedup_ci_lo,
                   r.speedup_ci_hi AS lab_speedup_ci_hi, r.tokens_per_second AS lab_tokens_per_second,
                   r.ttft_p50 AS lab_ttft_seconds_p50, r.itl_p50 AS lab_itl_seconds_p50,
                   r.itl_p95 AS lab_itl_seconds_p95, r.latency_p50 AS lab_request_latency_seconds_p50,
                   r.latency_p95 AS lab_request_latency_seconds_p95
            FROM server_measurements m
            LEFT JOIN runs r0 ON r0.id = m.run_id
            LEFT JOIN runs r ON r.experiment_id = m.experiment_id AND r.kind = 'speculative' AND r.status = 'done'
                 AND r.batch_size = m.concurrency AND COALESCE(r.draft, '') = COALESCE(r0.draft, '')
                 AND COALESCE(r.drafter, '') = COALESCE(r0.drafter, '')
            WHERE m.confirm_id = :c AND m.speculative_config IS NOT NULL
            ORDER BY m.id, r.id""",
            {"c": confirm_id},
        )
    if df.empty:
        return pd.DataFrame(columns=BESIDE_COLUMNS)
    configs = [json.loads(s) for s in df["speculative_config"]]
    df["k"] = [server_k(s, int(c)) for s, c in zip(configs, df["concurrency"])]
    df["positions"] = [comparable_positions(s, int(c)) for s, c in zip(configs, df["concurrency"])]
    lab = [c for c in df.columns if c.startswith("lab_")]
    unmatched = df["lab_k"].isna() | (df["lab_k"] != df["k"])
    df.loc[unmatched, lab] = np.nan
    # one row per measurement: its matching run when there is one (the measured run itself first)
    df["rank"] = (~unmatched).astype(int) * 2 + (df["lab_run_id"] == df["run_id"]).astype(int)
    df = df.sort_values(["measurement_id", "rank"], ascending=[True, False]).drop_duplicates("measurement_id")
    df["lab_run_id"] = df["lab_run_id"].astype("Int64")
    return df[BESIDE_COLUMNS].reset_index(drop=True)


def _num(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def latest_measured(store: Store, experiment_id: int) -> int | None:
    """The experiment's newest confirm that stored a speculative measurement (what its findings read)."""
    with store.read() as conn:
        return conn.execute(
            text(
                "SELECT MAX(confirm_id) FROM server_measurements WHERE experiment_id = :e AND "
                "speculative_config IS NOT NULL"
            ),
            {"e": experiment_id},
        ).scalar()


def confirm_head(store: Store, confirm_id: int) -> dict | None:
    """The confirm's own row (server_confirms: experiment, engine and its version, status, ...); None for none."""
    with store.read() as conn:
        head = conn.execute(text("SELECT * FROM server_confirms WHERE id = :c"), {"c": confirm_id}).mappings().first()
    return dict(head) if head is not None else None


def confirm_experiment(store: Store, confirm_id: int) -> int | None:
    """The experiment a confirm measured; None for no such confirm."""
    with store.read() as conn:
        eid = conn.execute(text("SELECT experiment_id FROM server_confirms WHERE id = :c"), {"c": confirm_id}).scalar()
    return int(eid) if eid is not None else None


def confirm_heads(store: Store, experiment_id: int) -> list[dict]:
    """Every confirm of an experiment, oldest first: id, status, error, wall_seconds, repeats, created."""
    with store.read() as conn:
        return [
            dict(row)
            for row in conn.execute(
                text(
                    "SELECT id, status, error, wall_seconds, repeats, created FROM server_confirms "
                    "WHERE experiment_id = :e ORDER BY id"
                ),
                {"e": experiment_id},
            )
            .mappings()
            .all()
        ]


def confirmed_series(store: Store, experiment_id: int) -> set[int]:
    """The production series the experiment's confirms stored (a confirm's counters are series too)."""
    with store.read() as conn:
        return {
            int(i)
            for i in conn.execute(
                text("SELECT series_id FROM server_measurements WHERE experiment_id = :e AND series_id IS NOT NULL"),
                {"e": experiment_id},
            ).scalars()
        }


def measurement_config(store: Store, measurement_id: int) -> dict:
    """A server measurement's speculative_config, decoded ({} for the target alone or no such measurement)."""
    with store.read() as conn:
        config = conn.execute(
            text("SELECT speculative_config FROM server_measurements WHERE id = :m"), {"m": measurement_id}
        ).scalar()
    return json.loads(config or "{}")
