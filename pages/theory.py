"""Theory: SPEC's formulas live (α, c and verify cost set by hand or loaded from a measured run), and a Monte Carlo
simulator of rounds on random distributions beside them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pandas as pd
import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from engine.metrics import theory
from engine.metrics.simulate import SimulationSetup, simulate
from pages.widgets import charts
from pages.widgets.common import chart_with_csv, draw, experiment_label, number, run_label, store
from storage.analysis import catalog, formula
from storage.analysis.verdict import verdict
from storage.records import queries as q

K_MAX = 16
ALPHA_RANGE, C_RANGE, VERIFY_MIN = (0.0, 0.99), (1.0, 50.0), 0.01
DEFAULTS = {"theory_alpha": 0.75, "theory_c": 8.0, "theory_k": 4, "theory_verify": None}
log = logging.getLogger("draftlab.dashboard")


def cost_aware_speedup(alpha: float, k: int, c: float, verify_cost: float) -> float:
    """E[L_k] / (k/c + verify_cost): engine/metrics/theory.py's cost_aware_speedup (the detail page's cost-aware
    prediction) at a geometric E[L_k] from α, k draft steps of 1/c and the verify forward at `verify_cost` target steps;
    verify_cost = 1 gives back predicted_speedup."""
    speedup = theory.cost_aware_speedup(theory.expected_tokens_per_round(alpha, k), k / c, verify_cost)
    assert speedup is not None, "a round costs k/c + verify_cost > 0 target steps"
    return speedup


def formula_frame(
    alpha: float, c: float, k_max: int = K_MAX, verify_cost: float | None = None, measured: pd.DataFrame | None = None
) -> pd.DataFrame:
    """predicted_speedup and expected tokens per round for k = 1..k_max; cost_aware_speedup too when verify_cost is
    known; measured_cost_aware, each measured run's own cost-aware prediction at its k (`measured`: runs with k and
    predicted_speedup_refined), when an experiment is loaded."""
    ks = range(1, k_max + 1)
    frame = pd.DataFrame(
        {
            "k": list(ks),
            "predicted_speedup": [theory.predicted_speedup(alpha, k, c) for k in ks],
            "expected_tokens_per_round": [theory.expected_tokens_per_round(alpha, k) for k in ks],
        }
    )
    if verify_cost is not None:
        frame.insert(2, "cost_aware_speedup", [cost_aware_speedup(alpha, k, c, verify_cost) for k in ks])
    if measured is not None and len(measured):
        own = measured.dropna(subset=["k", "predicted_speedup_refined"]).groupby("k")["predicted_speedup_refined"]
        frame.insert(2, "measured_cost_aware", frame["k"].map(own.max()))
    return frame


def measured_settings(run: pd.Series) -> dict:
    """A run's α, c, k and verify cost as slider values (clamped into the sliders' ranges)."""
    clamp = lambda v, lo, hi: min(max(float(v), lo), hi)  # noqa: E731
    return {
        "theory_alpha": clamp(run["alpha"], *ALPHA_RANGE),
        "theory_c": clamp(run["c"], *C_RANGE),
        "theory_k": int(clamp(run["k"], 1, K_MAX)),
        "theory_verify": max(float(run["verify_cost"]), VERIFY_MIN) if pd.notna(run["verify_cost"]) else None,
    }


@dataclass(frozen=True)
class Loaded:
    """The experiment the sliders were loaded from: its id and the runs the verdict chooses from."""

    experiment_id: int
    runs: pd.DataFrame


def _loader() -> Loaded | None:
    """'Load from experiment': fills the sliders from a measured run when the choice changes; returns what was
    loaded."""
    try:
        listing = catalog.experiments(store())
    except SQLAlchemyError as exc:
        log.warning("theory page: cannot read experiments (%s)", type(exc).__name__)
        st.caption("Measured runs cannot be read right now; the formulas below work without them.")
        return None
    c1, c2 = st.columns(2)
    ids = [None, *(int(i) for i in listing["experiment_id"])]
    label = experiment_label(listing)
    experiment_id = c1.selectbox(
        "Load from experiment",
        ids,
        key="theory_experiment",
        format_func=lambda i: "— set α, c and verify cost by hand" if i is None else label(i),
    )
    if experiment_id is None:
        st.session_state.pop("theory_loaded", None)  # picking the same run again loads it again
        return None
    runs = q.runs(store(), experiment_id)
    runs = runs[(runs["kind"] == "speculative") & runs["alpha"].notna() & runs["c"].notna()]
    runs = runs.set_index("run_id", drop=False)
    if runs.empty:
        c2.caption("No run of this experiment has a measured α and c yet.")
        return None
    judged = verdict(store(), experiment_id)
    best = judged.best  # the verdict's best run, first
    first = [best.run_id] if best is not None and best.run_id in runs.index else []
    options = [int(i) for i in runs["run_id"]]
    run_id = c2.selectbox(
        "Run",
        options,
        key="theory_run",
        format_func=run_label(runs),
        index=options.index(int(first[0])) if first else 0,
    )
    if st.session_state.get("theory_loaded") != (experiment_id, run_id):  # a new choice: fill the sliders once
        st.session_state.update(measured_settings(runs.loc[run_id]), theory_loaded=(experiment_id, run_id))
    run = runs.loc[run_id]
    measured = charts.speedup_text(run["speedup"], run["speedup_ci_lo"], run["speedup_ci_hi"])
    st.caption(
        f"Measured in run {run_id}: α = {run['alpha']:.3f}, c = {run['c']:.2f}, verify cost = "
        f"{number(run['verify_cost'], '{:.2f}')} target steps, speedup {measured} (a value outside a slider's "
        f"range is clamped to it; move the sliders to explore from there)."
    )
    candidates = {c.run_id for c in judged.candidates}
    return Loaded(experiment_id, runs[runs["run_id"].isin(candidates)])


def _formulas() -> None:
    for key, value in DEFAULTS.items():
        st.session_state.setdefault(key, value)  # once: the widgets below take their values from here
    loaded = _loader()
    st.latex(
        r"E[L_k] = \frac{1-\alpha^{k+1}}{1-\alpha} \qquad "
        r"\text{speedup} = \frac{E[L_k]}{1+k/c} \qquad \text{refined} = \frac{E[L_k]}{k/c + \text{verify cost}}"
    )
    c1, c2, c3, c4 = st.columns(4)
    alpha = c1.slider("α (acceptance per verified token)", *ALPHA_RANGE, step=0.01, key="theory_alpha")
    c = c2.slider("c (target step / draft step)", *C_RANGE, step=0.5, key="theory_c")
    k = c3.slider("k (draft tokens per round)", 1, K_MAX, key="theory_k")
    verify = c4.number_input(
        "verify cost (target steps)",
        min_value=VERIFY_MIN,
        step=0.05,
        key="theory_verify",
        placeholder="unknown",
        help="one verify forward over the round's k + 1 tokens, in single-token target steps "
        "(verify_cost of a measured run); (1 − α^(k+1)) / ((1 − α)(1 + k/c)) assumes 1",
    )
    k_best, s_best = theory.best_k(alpha, c, K_MAX)
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(f"Speedup at k={k}", f"{theory.predicted_speedup(alpha, k, c):.2f}×")
    m2.metric(f"Tokens per round at k={k}", f"{theory.expected_tokens_per_round(alpha, k):.2f}")
    m3.metric("Best k", str(k_best))
    m4.metric("Speedup at best k", f"{s_best:.2f}×")
    frame = formula_frame(alpha, c, verify_cost=verify, measured=loaded.runs if loaded else None)
    if verify is not None:
        _cost_aware_metrics(frame, alpha, k, c, verify, loaded)
    chart_with_csv(charts.theory_curves(frame, k), frame, "theory_curves.csv")
    st.caption(
        "Below 1× (the dashed line) the draft costs more than it saves. Raising α (a better-matched draft) moves the "
        "best k up; a slower draft (smaller c) moves it down."
    )
    if verify is not None:
        st.caption(
            "Cost-aware curve: E[L]·t / (k·t_d + verify) in target steps t, i.e. E[L_k] / (k/c + verify "
            "cost) with E[L_k] = (1 − α^(k+1)) / (1 − α); the verify forward is charged its measured cost "
            "instead of one target step (verify cost 1 gives back (1 − α^(k+1)) / ((1 − α)(1 + k/c))). A run "
            "measures the verify cost at its own k; this curve holds it, and α, constant over k."
        )
    if loaded is not None and "measured_cost_aware" in frame:
        st.caption(
            f"Points on their own line: each run of experiment #{loaded.experiment_id} at its k, predicted "
            f"from its own acceptance by position, draft time and verify cost (the verify forward grows with "
            f"k, acceptance falls with the draft position): the detail page's cost-aware prediction, whose "
            f"best is the cost-aware best k above."
        )


def _cost_aware_metrics(
    frame: pd.DataFrame, alpha: float, k: int, c: float, verify: float, loaded: Loaded | None
) -> None:
    """The cost-aware figures. Loaded from an experiment, its best k is the experiment's (storage/analysis/formula.py
    cost_aware_best: each measured run's own prediction, from its acceptance by position, draft time and verify
    cost, as the detail page and the findings report it); set by hand, the sliders' curve's, whose verify cost is
    held constant over k."""
    m1, m2, m3, _ = st.columns(4)
    m1.metric(f"Cost-aware speedup at k={k}", f"{cost_aware_speedup(alpha, k, c, verify):.2f}×")
    if loaded is not None:
        best = formula.cost_aware_top(loaded.runs)
        if best is None:
            return
        where = f"experiment #{loaded.experiment_id}'s runs"
        m2.metric(
            "Cost-aware best k",
            str(best[0]),
            help=f"the best of {where}' own cost-aware predictions (each "
            "from its acceptance by position, draft time and verify cost): the detail page's",
        )
        m3.metric("Cost-aware speedup at best k", f"{best[1]:.2f}×", help=f"measured in {where}")
        return
    top = frame.loc[frame["cost_aware_speedup"].idxmax()]
    m2.metric(
        "Cost-aware best k",
        str(int(top["k"])),
        help="of the curve at these settings, the verify cost held constant over k",
    )
    m3.metric("Cost-aware speedup at best k", f"{top['cost_aware_speedup']:.2f}×")


def _simulator() -> None:
    st.header("Monte Carlo simulator")
    st.caption(
        "Rounds of speculative sampling on a random target and draft distribution (Dirichlet over a small "
        "vocabulary, as in the reference article's demo). Every position draws from the same pair, so the "
        "true α is β = Σ min(p_draft, p_target); the simulated points should sit on the dashed line, the "
        "formula at α = β. Each round costs one target step plus k draft steps of 1/c target step each, so "
        "speedup = tokens per round / (1 + k/c)."
    )
    with st.form("simulator"):
        c1, c2, c3 = st.columns(3)
        vocab = c1.number_input("Vocabulary size", 2, 5000, 20, key="sim_vocab")
        target_conc = c2.number_input(
            "Target Dirichlet concentration",
            0.01,
            10.0,
            0.5,
            0.05,
            key="sim_target",
            help="small = peaked distribution",
        )
        draft_conc = c3.number_input("Draft Dirichlet concentration", 0.01, 10.0, 0.15, 0.05, key="sim_draft")
        c1, c2, c3, c4 = st.columns(4)
        c = c1.number_input("c", 1.0, 100.0, 10.0, 0.5, key="sim_c")
        rounds = c2.number_input("Rounds per k", 100, 50_000, 2000, 100, key="sim_rounds")
        seed = c3.number_input("Seed", 0, 2**31 - 1, 42, key="sim_seed")
        ks_text = c4.text_input("k values", "1,2,3,4,6,8,12", key="sim_ks")
        st.form_submit_button("Simulate", icon=":material/casino:")
    try:
        ks = sorted({int(x) for x in ks_text.replace(" ", "").split(",") if x})
        if not ks or min(ks) < 1 or max(ks) > 64:
            raise ValueError
    except ValueError:
        st.error("k values must be whole numbers from 1 to 64, comma-separated, e.g. 1,2,4,8")
        return
    setup = SimulationSetup(
        vocab=int(vocab),
        target_concentration=float(target_conc),
        draft_concentration=float(draft_conc),
        c=float(c),
        rounds=int(rounds),
        seed=int(seed),
    )
    frame, summary = simulate(setup, ks)
    alpha_hat = frame["accepted"].sum() / (frame["accepted"].sum() + frame["rejected"].sum())
    m1, m2, m3 = st.columns(3)
    m1.metric("β = Σ min(p_draft, p_target)", f"{summary['beta']:.3f}")
    m2.metric(
        "Simulated α̂ (all k)", f"{alpha_hat:.3f}", help=f"{alpha_hat - summary['beta']:+.4f} from β: sampling noise"
    )
    m3.metric(
        "Emitted vs target (total variation)",
        f"{summary['first_token_total_variation']:.3f}",
        help="first token of each round against the target distribution: near 0 = lossless",
    )
    left, right = st.columns(2)
    with left:
        st.subheader("Speedup: simulated vs formula")
        chart_with_csv(
            charts.simulation_vs_formula(frame, "speedup", "predicted_speedup", "speedup (×)"), frame, "simulation.csv"
        )
    with right:
        st.subheader("Tokens per round: simulated vs formula")
        draw(
            charts.simulation_vs_formula(frame, "tokens_per_round", "expected_tokens_per_round", "tokens per round"),
            width="stretch",
        )
    st.dataframe(frame, hide_index=True, width="stretch", key="simulation_table")
    dists = pd.DataFrame({"token": range(setup.vocab), "target": summary["target"], "draft": summary["draft"]})
    with st.expander("The two distributions"):
        chart_with_csv(charts.distribution_pair(dists), dists, "simulation_distributions.csv")


def render() -> None:
    st.title("Theory")
    _formulas()
    _simulator()
