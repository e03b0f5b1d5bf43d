"""Theory: SPEC's formulas live, and a Monte Carlo simulator of rounds on random distributions beside them."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from app.simulate import SimulationSetup, simulate
from engine import theory
from pages import charts
from pages.common import chart_with_csv

K_MAX = 16


def formula_frame(alpha: float, c: float, k_max: int = K_MAX) -> pd.DataFrame:
    """predicted_speedup and expected tokens per round for k = 1..k_max."""
    ks = range(1, k_max + 1)
    return pd.DataFrame({"k": list(ks),
                         "predicted_speedup": [theory.predicted_speedup(alpha, k, c) for k in ks],
                         "expected_tokens_per_round": [theory.expected_tokens_per_round(alpha, k) for k in ks]})


def _formulas() -> None:
    st.latex(r"E[\text{tokens per round}] = \frac{1-\alpha^{k+1}}{1-\alpha} \qquad "
             r"\text{speedup} = \frac{1-\alpha^{k+1}}{(1-\alpha)(1+k/c)}")
    c1, c2, c3 = st.columns(3)
    alpha = c1.slider("α (acceptance per verified token)", 0.0, 0.99, 0.75, 0.01, key="theory_alpha")
    c = c2.slider("c (target step / draft step)", 1.0, 50.0, 8.0, 0.5, key="theory_c")
    k = c3.slider("k (draft tokens per round)", 1, K_MAX, 4, key="theory_k")
    k_best, s_best = theory.best_k(alpha, c, K_MAX)
    m1, m2, m3, m4 = st.columns(4)
    m1.metric(f"Speedup at k={k}", f"{theory.predicted_speedup(alpha, k, c):.2f}×")
    m2.metric(f"Tokens per round at k={k}", f"{theory.expected_tokens_per_round(alpha, k):.2f}")
    m3.metric("Best k", str(k_best))
    m4.metric("Speedup at best k", f"{s_best:.2f}×")
    frame = formula_frame(alpha, c)
    chart_with_csv(charts.theory_curves(frame, k), frame, "theory_curves.csv")
    st.caption("Below 1× (the dashed line) the draft costs more than it saves. Raising α (a better-matched draft) moves the best k "
               "up; a slower draft (smaller c) moves it down.")


def _simulator() -> None:
    st.header("Monte Carlo simulator")
    st.caption("Rounds of speculative sampling on a random target and draft distribution (Dirichlet over a small "
               "vocabulary, as in the reference article's demo). Every position draws from the same pair, so the "
               "true α is β = Σ min(p_draft, p_target); the simulated points should sit on the formula's line. "
               "Cost model as in SPEC: one target step plus k draft steps of 1/c.")
    with st.form("simulator"):
        c1, c2, c3 = st.columns(3)
        vocab = c1.number_input("Vocabulary size", 2, 5000, 20, key="sim_vocab")
        target_conc = c2.number_input("Target Dirichlet concentration", 0.01, 10.0, 0.5, 0.05, key="sim_target",
                                      help="small = peaked distribution")
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
    setup = SimulationSetup(vocab=int(vocab), target_concentration=float(target_conc),
                            draft_concentration=float(draft_conc), c=float(c), rounds=int(rounds), seed=int(seed))
    frame, summary = simulate(setup, ks)
    alpha_hat = frame["accepted"].sum() / (frame["accepted"].sum() + frame["rejected"].sum())
    m1, m2, m3 = st.columns(3)
    m1.metric("β = Σ min(p_draft, p_target)", f"{summary['beta']:.3f}")
    m2.metric("Simulated α̂ (all k)", f"{alpha_hat:.3f}", help=f"{alpha_hat - summary['beta']:+.4f} from β: sampling noise")
    m3.metric("Emitted vs target (total variation)", f"{summary['first_token_total_variation']:.3f}",
              help="first token of each round against the target distribution: near 0 = lossless")
    left, right = st.columns(2)
    with left:
        st.subheader("Speedup: simulated vs formula")
        chart_with_csv(charts.simulation_vs_formula(frame, "speedup", "predicted_speedup", "speedup (×)"), frame,
                       "simulation.csv")
    with right:
        st.subheader("Tokens per round: simulated vs formula")
        st.altair_chart(charts.simulation_vs_formula(frame, "tokens_per_round", "expected_tokens_per_round",
                                                     "tokens per round"), width="stretch")
    st.dataframe(frame, hide_index=True, width="stretch", key="simulation_table")
    dists = pd.DataFrame({"token": range(setup.vocab), "target": summary["target"], "draft": summary["draft"]})
    with st.expander("The two distributions"):
        chart_with_csv(charts.distribution_pair(dists), dists, "simulation_distributions.csv")


def render() -> None:
    st.title("Theory")
    _formulas()
    _simulator()
