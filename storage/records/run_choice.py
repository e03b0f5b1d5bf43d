"""Which runs a verdict may choose, as SQL (storage/analysis/verdict.py judges from these reads).

The one definition of a lossless run (outputs_match, lossy), the rule CHOOSABLE and the order RANK, and the reads:
verdict_rows (one experiment's speculative runs, or every experiment's for the listing, choosable ones first) and
choosable (one experiment's choosable run ids, best first).
"""

from __future__ import annotations

import pandas as pd
from sqlalchemy import text

from storage.db.store import Store
from storage.records.frames import _frame, _nullable_bool


def outputs_match(r: str) -> str:
    """SQL of the run `r`'s outputs_match_baseline, the one definition of a lossless run: NULL unless it is a greedy
    speculative run whose baseline committed prompts; else 1 when every prompt it committed has the baseline's output
    token for token (a finished run: every prompt the baseline has), 0 when not (`lossy`)."""
    return f"CASE WHEN {_compared(r)} THEN CASE WHEN {_differs(r)} THEN 0 ELSE 1 END END"


def lossy(r: str) -> str:
    """SQL: the run `r` is greedy and its outputs are not its baseline's (outputs_match_baseline is 0): never
    judged, scheduled, deployed or confirmed (SPEC "Lossless at every batch size")."""
    return f"({_compared(r)} AND {_differs(r)})"


def _compared(r: str) -> str:
    return (
        f"({r}.kind = 'speculative' AND COALESCE({r}.temperature, 0) <= 0 "
        f"AND EXISTS (SELECT 1 FROM prompt_results bp WHERE bp.run_id = {r}.baseline_run_id))"
    )


def _differs(r: str) -> str:
    return f"""(EXISTS (SELECT 1 FROM prompt_results p LEFT JOIN prompt_results bp
                        ON bp.run_id = {r}.baseline_run_id AND bp.prompt_index = p.prompt_index
                        WHERE p.run_id = {r}.id AND CASE WHEN p.output_ids = bp.output_ids THEN 0 ELSE 1 END = 1)
             OR ({r}.status = 'done' AND (SELECT COUNT(*) FROM prompt_results p WHERE p.run_id = {r}.id)
                 <> (SELECT COUNT(*) FROM prompt_results bp WHERE bp.run_id = {r}.baseline_run_id)))"""


# The one rule of which runs can be chosen as an experiment's best (storage/analysis/verdict.py; the listing, the
# schedule, findings and deploy read the verdict): a speculative run `s` that finished, with its baseline `b` finished,
# a measured speedup with its interval, no timing warning (a run timed faster than its tokens per round allow is never
# crowned), and lossless (a greedy run whose outputs differ from its baseline's, `lossy`, is never chosen). RANK: the
# highest measured speedup first; on equal speedups the smaller swept value, then the older run.
CHOOSABLE = (
    "s.kind = 'speculative' AND s.status = 'done' AND b.status = 'done' AND s.speedup IS NOT NULL "
    "AND s.speedup_ci_lo IS NOT NULL AND s.speedup_ci_hi IS NOT NULL AND s.timing_warning IS NULL "
    f"AND NOT {lossy('s')}"
)


RANK = "s.speedup DESC, s.sweep_value, s.id"


_VERDICT_ROWS_SQL = f"""
SELECT s.id AS run_id, s.experiment_id, s.kind, s.status, s.k, s.sweep_value, s.sweep_label, s.draft_parameters,
       s.device_name, s.batch_size, s.alpha, s.speedup, s.speedup_ci_lo, s.speedup_ci_hi,
       CASE WHEN {CHOOSABLE} THEN 1 ELSE 0 END AS choosable, {outputs_match("s")} AS outputs_match_baseline,
       e.sweep_variable, e.batch_sizes, e.dtype
FROM runs s LEFT JOIN runs b ON b.id = s.baseline_run_id JOIN experiments e ON e.id = s.experiment_id
WHERE s.kind = 'speculative' AND {{where}}
ORDER BY s.experiment_id, CASE WHEN {CHOOSABLE} THEN 0 ELSE 1 END, {RANK}"""


def verdict_rows(store: Store, experiment_id: int | None = None) -> pd.DataFrame:
    """What verdicts judge, of one experiment or of all (the listing: one query): every speculative run with its
    swept value, cost inputs (the draft's parameters, the device and the experiment's dtype: a draft_dtype of "same"
    costs that dtype's bytes), speedup and interval, `choosable` (CHOOSABLE), outputs_match_baseline (as runs()) and
    the experiment's sweep_variable and batch_sizes; per experiment the choosable runs come first, best first
    (RANK)."""
    where, params = ("s.experiment_id = :eid", {"eid": experiment_id}) if experiment_id is not None else ("1 = 1", {})
    with store.read() as conn:
        df = _frame(conn, _VERDICT_ROWS_SQL.format(where=where), params)
    for column in ("speedup", "speedup_ci_lo", "speedup_ci_hi", "alpha"):
        df[column] = pd.to_numeric(df[column]).astype(float)
    _nullable_bool(df, "outputs_match_baseline")
    return df


def choosable(store: Store, experiment_id: int) -> list[int]:
    """The ids of the runs a verdict may choose from (CHOOSABLE), best first (RANK): storage/analysis/verdict.py reads
    them."""
    sql = f"""SELECT s.id FROM runs s JOIN runs b ON b.id = s.baseline_run_id
              WHERE s.experiment_id = :eid AND {CHOOSABLE} ORDER BY {RANK}"""
    with store.read() as conn:
        return [int(rid) for (rid,) in conn.execute(text(sql), {"eid": experiment_id})]
