"""The article's formula for an experiment: one pooled α and c, one curve, one best k.

"Formula" means this everywhere a page or a finding says it: (1 − α^(k+1)) / ((1 − α)(1 + k/c))
(engine/metrics/theory.py) with α and c pooled over the experiment's finished constant-k runs —

    α = Σ accepted / Σ (accepted + rejected)   (every verified draft token of those runs counts once)
    c = the mean of the runs' c                (target step / draft step, each against its own baseline)

pooled in SQL (storage/records/acceptance.py's `pooled_runs`, read by `pooled_inputs`), and not reported under
MIN_VERIFIED verified draft tokens. A run's own `predicted_speedup` column (SPEC: the formula at that run's α, k and c)
is a different figure and is always labelled "at the run's own α, c". The cost-aware prediction's best k
(`cost_aware_best`) is the detail page's, the findings' and the Theory page's.
Plain pandas over stored rows (no SQL here), no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from engine.config.drafter_specs import SPECS
from engine.metrics import theory
from storage.db.store import Store
from storage.records import queries as q

MIN_VERIFIED = 30  # verified draft tokens below which a pooled α (and so the formula) is not reported
K_MAX_SHOWN = 8  # the curve reaches at least this k (and one past the formula's best)

_CONSTANT_K = tuple(name for name, spec in SPECS.items() if spec.constant_k)


@dataclass(frozen=True)
class Pooled:
    alpha: float
    c: float
    verified: int  # draft tokens the pooled α rests on
    runs: int

    def speedup(self, k: int) -> float:
        """The formula's speedup at draft length k."""
        return theory.predicted_speedup(self.alpha, int(k), self.c)

    def best_k(self) -> tuple[int, float]:
        """(k, speedup) where the formula peaks."""
        return theory.best_k(self.alpha, self.c)

    def describe(self) -> str:
        return (
            f"α = {self.alpha:.3f} (pooled over {self.verified} verified draft tokens of {self.runs} finished "
            f"run{'s' if self.runs != 1 else ''}) and c = {self.c:.2f} (their mean)"
        )


def pooled_inputs(store: Store, experiment_id: int, batch_size: int | None = None) -> Pooled | None:
    """The experiment's pooled α and c (see the module doc), or None when fewer than MIN_VERIFIED draft tokens
    were verified by finished constant-k runs with a measured c. batch_size: only that batch size's runs (a grid's
    α and c differ per batch size: never pooled across them)."""
    row = q.pooled_runs(store, experiment_id, _CONSTANT_K, batch_size)
    if (
        row is None
        or not row["runs"]
        or row["verified"] is None
        or int(row["verified"]) < MIN_VERIFIED
        or row["c"] is None
    ):
        return None
    return Pooled(
        float(row["accepted"]) / float(row["verified"]), float(row["c"]), int(row["verified"]), int(row["runs"])
    )


def formula_curve(pooled: Pooled, k_values: Iterable[Any] = ()) -> pd.DataFrame:
    """k = 1 .. max(K_MAX_SHOWN, the given k values, the formula's best k + 1) with the formula's speedup."""
    k_max = max([K_MAX_SHOWN, *(int(k) for k in k_values), pooled.best_k()[0] + 1])
    ks = list(range(1, k_max + 1))
    return pd.DataFrame({"k": ks, "predicted_speedup": [pooled.speedup(k) for k in ks]})


def cost_aware_top(runs: pd.DataFrame) -> tuple[int, float] | None:
    """(k, speedup) of the cost-aware prediction's best among `runs` (queries.runs rows, the caller's choice of which
    count): the highest predicted_speedup_refined (engine/metrics/theory.py cost_aware_speedup at each run's own E[L],
    draft and verify cost), the smaller k on a tie; None when no run has one."""
    done = runs[runs["k"].notna() & runs["predicted_speedup_refined"].notna()]
    if done.empty:
        return None
    top = done.sort_values(["predicted_speedup_refined", "k"], ascending=[False, True]).iloc[0]
    return int(top["k"]), float(top["predicted_speedup_refined"])


def cost_aware_best(store: Store, experiment_id: int) -> tuple[int, float] | None:
    """The experiment's cost-aware best k, the one every page and finding reports: cost_aware_top over the runs the
    verdict can choose from (storage/analysis/verdict.py's candidates: finished, usable; a grid's at its smallest batch
    size)."""
    from storage.analysis.verdict import verdict

    chosen = {c.run_id for c in verdict(store, experiment_id).candidates}
    runs = q.runs(store, experiment_id)
    return cost_aware_top(runs[runs["run_id"].isin(chosen)])
