"""The New-experiment form's models: the target and draft fields (a path with no folder said under its field), the
shipped and trained drafts to pick from, a draft sweep's candidates, the pair check shown where its result goes
(`checking…` while it runs), the vocabulary warning for a draft of another tokenizer, and the drafter: the one every
run uses (with its parameter) or a drafter sweep's specs.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from engine import zoo
from engine.config.drafter_specs import SPECS
from engine.text.prompt_sets import load_prompts
from pages.widgets.common import NO_DATABASE, store
from pages.widgets.form_defaults import DEFAULTS, seed_widget
from pages.widgets.prefill import (
    DRAFTER_KINDS,
    DRAFTER_PARAMETERS,
    DRAFTER_SUMMARY,
    DRAFTER_SWEEP_WIDGETS,
    DRAFTER_WIDGETS,
    drafter_spec,
    drafter_specs,
    md_text,
)

CHECKING = "checking that the two tokenizers match (the first check after a start loads transformers)…"


@dataclass(frozen=True)
class _CheckOnPage:
    """A pair check and where its result goes on the page: `slot`, the placeholder that said `checking…` while
    it ran (None when the result was already known: then it is drawn in the same place directly)."""

    ok: bool
    message: str
    slot: object = None
    vocab: str | None = None  # "intersection": the draft has another tokenizer (pages/widgets/pair_check.PairCheck)


def pair_check_on_page(target: str, draft: str) -> _CheckOnPage:
    """The pair check of target and draft. One that has work to do (not remembered, or a local directory that
    changed) first puts `checking…` where its result will go, so the last result (a green `tokenizers match`)
    never stays up while a new check runs; show_check then draws the result in that place."""
    from pages.widgets.pair_check import cached_check, check_pair_names

    target, draft = target.strip(), draft.strip()
    check, slot = cached_check(target, draft), None
    if check is None:
        slot = st.empty()
        slot.info(f"Pair check: {CHECKING}", icon=":material/hourglass_top:")
        check = check_pair_names(target, draft)
    return _CheckOnPage(check.ok, check.message, slot, check.vocab)


def vocab_warning(target: str, draft: str, prompts: str, prompt_texts) -> None:
    """Under the prompts: the share of their tokens outside the vocabulary a draft of another tokenizer shares with
    the target (pages/widgets/pair_check.prompt_vocab_warning), when any are."""
    from pages.widgets.pair_check import prompt_vocab_warning

    texts = prompt_texts if prompt_texts is not None else load_prompts(prompts)
    warning = prompt_vocab_warning(target.strip(), draft.strip(), texts)
    if warning:
        st.warning(md_text(warning), icon=":material/translate:")


def model_error(name: str) -> str | None:
    """Under a model field, as it is typed: a path-looking name with no folder there (engine/zoo/__init__.py's
    missing_folder, the rule the engine loads by), never the hub's complaint about a repo id; None when fine."""
    problem = zoo.missing_folder(str(name or "").strip())
    if problem:
        st.error(md_text(problem), icon=":material/folder_off:")
    return problem


def show_check(check, label: str = "Pair check") -> None:
    where = getattr(check, "slot", None) or st
    if check.ok:
        where.success(f"{label}: {md_text(check.message)}", icon=":material/check_circle:")
    else:
        where.error(f"{label}: {md_text(check.message)}", icon=":material/error:")


def _parameter_input(kind: str, key: str, container=st) -> float | int:
    """The number a drafter's parameter takes (its declaration: symbol, meaning, int or float; unbounded here, like
    every number of the form: the browser keeps an out-of-range number to itself, so validate() checks it and blocks
    Launch)."""
    param = DRAFTER_PARAMETERS[kind]
    seed_widget(key)
    return container.number_input(
        f"{param.symbol} of {kind}",
        step=1 if param.kind is int else 0.05,
        key=key,
        persist_state="page",
        help=param.meaning,
    )


def _kind_label(kind: str) -> str:
    return f"{kind}:{DRAFTER_PARAMETERS[kind].symbol}" if kind in DRAFTER_PARAMETERS else kind


def drafter_choice(drafts: list[str]) -> str | None:
    """The one drafter every run uses (when the drafter is not what is swept), as a spec; None when a draft is an
    EAGLE-3 head: the run configuration then gives each draft its own drafter (engine/config/run_config.py: a head the
    one that reads hidden states, a causal LM model), so one draft sweep compares heads with causal LMs."""
    from engine.config.head_format import is_head

    heads = [d for d in drafts if d.strip() and is_head(d.strip())]
    if heads:
        st.caption(
            "The draft is an EAGLE-3 head: it drafts as eagle3, from the target's own hidden states"
            if len(heads) == len(drafts)
            else "Each draft drafts with its own drafter: the EAGLE-3 heads as "
            "eagle3, from the target's own hidden states, the causal LMs as model"
        )
        return None
    c1, c2 = st.columns([2, 1])
    seed_widget("drafter")
    kind = c1.selectbox(
        "Drafter",
        DRAFTER_KINDS,
        key="drafter",
        persist_state="page",
        format_func=_kind_label,
        help="how each round's draft tokens are proposed: " + "; ".join(DRAFTER_SUMMARY.values()),
    )
    value = None
    if kind in DRAFTER_PARAMETERS:
        raw = _parameter_input(kind, DRAFTER_WIDGETS[kind], c2)
        # 0.1 + 0.2 steps: 0.3, not 0.30…04
        value = int(raw) if DRAFTER_PARAMETERS[kind].kind is int else round(float(raw), 6)
    if not SPECS[kind].needs_model:
        st.caption(f"{kind} drafts without the draft model; the pair is still loaded and checked")
    return drafter_spec(kind, value)


def trained_drafts() -> dict[str, str]:
    """{path: label} of the drafts finished training jobs wrote (Train a draft), newest first; an EAGLE-3 head is
    labelled as one (it drafts for its own target only, with the eagle3 drafter)."""
    import logging

    from storage.jobs import training

    try:
        drafts = training.trained_drafts(store())
    except NO_DATABASE:  # the form works without the database (it opens it to launch); a bug is raised
        logging.getLogger("draftlab.dashboard").warning("could not list trained drafts", exc_info=True)
        return {}
    return {
        d["out"]: f"{d['name']} ({'EAGLE-3 head' if d['kind'] == 'head' else 'trained'}, job {d['job_id']})"
        for d in drafts
    }


def pick_draft() -> None:
    picked = st.session_state.get("draft_pick")
    if picked:
        st.session_state["draft"] = picked


def draft_candidates(target: str) -> tuple[list[str], list[tuple[str, bool, str]]]:
    """The drafts a draft sweep compares, each pair-checked against the target (tokenizers only)."""
    current = str(st.session_state.get("draft", DEFAULTS["draft"]) or "").strip()
    seed_widget("draft_candidates", [current] if current else [])
    trained = trained_drafts()
    chosen = st.multiselect(
        "Draft candidates",
        list(dict.fromkeys([*zoo.DEMO_DRAFTS, *trained])),
        key="draft_candidates",
        accept_new_options=True,
        format_func=lambda v: trained.get(v, v),
        persist_state="page",
        placeholder="pick a demo draft or type a model id / path",
        help="one speculative run per draft, all against one baseline; type an HF model id or "
        "a local directory and press Enter to add it",
    )
    names = [str(n).strip() for n in chosen if str(n).strip()]
    checks = []
    for name in names:
        check = pair_check_on_page(target, name)
        show_check(check, f"Pair check {md_text(name)}")
        checks.append((name, check.ok, check.message))
    if not names:
        st.info("Add at least one draft to compare.", icon=":material/info:")
    return names, checks


def drafter_sweep() -> tuple[list[str] | None, str | None]:
    """(the drafter specs a drafter sweep compares, or None and why not) from its widgets."""
    seed_widget("drafter_sweep")
    kinds = st.multiselect(
        "Drafters",
        DRAFTER_KINDS,
        key="drafter_sweep",
        persist_state="page",
        format_func=_kind_label,
        help="one speculative run per drafter (per parameter value listed), all against one "
        "baseline; " + "; ".join(DRAFTER_SUMMARY.values()),
    )
    with_parameter = [kind for kind in kinds if kind in DRAFTER_PARAMETERS]
    for column, kind in zip(st.columns(max(1, len(with_parameter))), with_parameter):
        param, key = DRAFTER_PARAMETERS[kind], DRAFTER_SWEEP_WIDGETS[kind]
        seed_widget(key)
        column.text_input(
            f"{kind} {param.symbol} values",
            key=key,
            persist_state="page",
            help=f"comma-separated, each {param.meaning}; one run each",
        )
    try:
        return drafter_specs(
            kinds, {kind: st.session_state.get(DRAFTER_SWEEP_WIDGETS[kind], "") for kind in with_parameter}
        ), None
    except ValueError as exc:
        return None, str(exc)
