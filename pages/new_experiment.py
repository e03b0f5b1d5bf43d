"""New experiment: pick the pair (checked before launch), prompts, sampling, the drafter and the one variable to
sweep (k, k auto, a sampling setting, the draft or the drafting strategy), optionally at several batch sizes (a
grid, whose detail page gives a k schedule); Launch enqueues it.

A link can fill the form: `new?target=...&draft=...&sweep=k&values=1,2,4&drafter=confidence:0.5` (the parameters
storage/analysis/findings/links.py's prefill_query writes; pages/widgets/prefill.py parses them strictly), and
`batch_sizes=1,4,16` for a grid: the sweep at each batch size (the "At batch sizes" field). They are put into the
widgets when the form is first drawn; a bad one is left out with a short note.

What is on screen is what Launch queues: no number field has bounds in the browser (a number outside them is kept
by the browser with a red mark and never sent, so Launch would queue the value before it); validate() checks every
bound with engine/config/variables.py's descriptions and blocks Launch in one line. A field that is not used (Batch size
beside a grid's "At batch sizes") is shown disabled, saying why.

This module lays the form out and launches; its parts live beside it: what the form refuses in
pages/widgets/form_checks.py (validate), each widget's first value in pages/widgets/form_defaults.py, the models
(target, draft, pair check, drafter) in pages/panels/experiment_form_models.py, the prompt source in
pages/panels/experiment_form_prompts.py and the work's estimate in pages/panels/experiment_estimate.py.
"""

from __future__ import annotations

import streamlit as st

from engine import zoo
from engine.config.drafter_specs import DRAFT_SAMPLING
from engine.config.limits import LIMITS
from engine.config.variables import SETTINGS, VARIABLES
from engine.text.prompt_sets import DEFAULT_SPLIT, list_prompt_sets
from engine.wording import plural
from pages.panels.experiment_estimate import arms_of, show_workload, workload
from pages.panels.experiment_form_models import (
    draft_candidates,
    drafter_choice,
    drafter_sweep,
    model_error,
    pair_check_on_page,
    pick_draft,
    show_check,
    trained_drafts,
    vocab_warning,
)
from pages.panels.experiment_form_prompts import prompt_source
from pages.widgets.common import nav_page, store
from pages.widgets.form_checks import (
    CHOICE_FIELDS,
    EXTRA_FIELDS,
    Launch,
    batch_size_unused,
    batch_sizes_of,
    count_prompts,
    k_auto_error,
    number_error,
    parse_grid,
    validate,
)
from pages.widgets.form_defaults import DEFAULTS, seed_widget
from pages.widgets.prefill import (
    AUTO_K,
    DEFAULT_SWEEP,
    DEVICES,
    DTYPES,
    INTEGER_VARIABLES,
    MAX_K,
    NUMERIC_SWEEPS,
    SWEEP_CHOICES,
    SWEEP_LABELS,
    WIDGETS,
    md_text,
    parse_prefill,
    parse_sweep_values,
)
from pages.widgets.uploads import prune_uploads, save_upload, upload_dir
from storage.db.errors import QueueError
from storage.jobs.experiments import DUPLICATE_WINDOW_SECONDS, enqueue_experiment, recent_duplicate

# Re-exported: what tests and links read from the page (the form's checks, defaults and estimate live beside it).
__all__ = [
    "AUTO_K",
    "DEFAULTS",
    "DEFAULT_SWEEP",
    "INTEGER_VARIABLES",
    "MAX_K",
    "Launch",
    "arms_of",
    "parse_sweep_values",
    "prune_uploads",
    "render",
    "save_upload",
    "upload_dir",
    "validate",
    "workload",
]

LINK_NOTES = "new_experiment_link_notes"  # session key: what the link's parameters left out


GRID_HELP = (
    "optional, comma-separated (e.g. 1,4,16): run the whole sweep (k auto: its probe, prediction and "
    "confirmations), baselines included, at each of these "
    "batch sizes, each paired with its own target-only baseline there; the experiment then gives a k "
    "schedule (the k to serve at each batch size, off where no k is measurably faster). Each batch size is "
    f"{VARIABLES['batch_size'].meaning}; with a list, Batch size above is not used"
)


def _format(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def _apply_link() -> None:
    """On the form's first draw (a fresh visit of the page): the link's query parameters into the widgets."""
    params = {key: st.query_params.get_all(key) for key in st.query_params}
    # No try: parse_prefill notes every bad parameter and raises nothing (fuzzed in tests/test_fuzz_inputs.py), so an
    # exception here is a bug to see, never "the link's parameters could not be read".
    values, notes = parse_prefill(params, list_prompt_sets(), DEFAULT_SPLIT)
    for key, value in values.items():
        st.session_state[key] = value
    st.session_state[LINK_NOTES] = notes


def _number_error(setting: str, value, container=st) -> str | None:
    """Under a number field, as it is typed: number_error's line, in the field's own column; None when fine."""
    problem = number_error(setting, value)
    if problem:
        container.error(md_text(problem), icon=":material/error:")
    return problem


def render() -> None:
    st.title("New experiment")
    st.caption("A target-only baseline plus one speculative run per swept value, queued for the worker.")
    if "target" not in st.session_state:  # a fresh visit: the form's widgets are not there yet
        _apply_link()
    link_notes = st.session_state.get(LINK_NOTES) or []
    if link_notes:
        st.caption("Left out from the link: " + "; ".join(md_text(n) for n in link_notes))
    seed_widget("sweep_variable")
    choice = st.session_state["sweep_variable"]  # the selectbox below: the Models column depends on it

    left, right = st.columns(2)
    with left:
        st.subheader("Models")
        seed_widget("target")
        target = st.text_input("Target model", key="target", help=zoo.model_help("target"))
        unfound = model_error(target)  # a path with no folder there, said under its field
        checks = None
        check = None  # the one draft's pair check (a draft sweep checks each candidate)
        if choice == "draft":
            candidates, checks = draft_candidates(target)
            draft, check_ok = (candidates[0] if candidates else ""), True
            check_message: str | None = ""
        else:
            seed_widget("draft")
            trained = trained_drafts()
            shipped = {name: f"{name} (shipped)" for name in zoo.DEMO_DRAFTS}
            choices = {**shipped, **trained}
            st.selectbox(
                "Shipped and trained drafts",
                [None, *choices],
                key="draft_pick",
                on_change=pick_draft,
                format_func=lambda v: "pick one to use it as the draft" if v is None else choices[v],
                help="the drafts shipped with DraftLab and those Train a draft jobs wrote; choosing one "
                "fills in Draft model",
            )
            draft = st.text_input("Draft model", key="draft", persist_state="page", help=zoo.model_help("draft"))
            unfound = model_error(draft) or unfound
            check = pair_check_on_page(target, draft) if not unfound else None  # nothing to load: said under the field
            if check is not None:
                show_check(check)
            check_ok, check_message = (check.ok, check.message) if check is not None else (False, unfound)
        drafter = "model" if choice == "drafter" else drafter_choice(candidates if choice == "draft" else [draft])
        st.subheader("Prompts")
        prompts, prompt_error, prompt_texts = prompt_source()
        if prompt_error:
            st.error(md_text(prompt_error), icon=":material/error:")
        elif check is not None and check.ok and check.vocab == "intersection" and prompts:
            vocab_warning(target, draft, prompts, prompt_texts)
    with right:
        st.subheader("Sampling")
        for key in ("temperature", "top_k", "top_p", "seed", "max_new_tokens", "device", "dtype"):
            seed_widget(key)
        fixed = {}  # each sampling setting's one value (engine/config/variables.py: title, step, help)
        problems = []  # each field's own, shown under it as it is typed
        for column, setting in zip(st.columns(3), ("temperature", "top_k", "top_p")):
            v = VARIABLES[setting]
            fixed[setting] = column.number_input(v.title, step=v.step, key=setting, help=v.help.split(";")[0])
            problems.append(_number_error(setting, fixed[setting], column))
        for setting in EXTRA_FIELDS:
            seed_widget(setting)
            v = VARIABLES[setting]
            fixed[setting] = st.number_input(v.title, step=v.step, key=setting, help=v.help.split(";")[0])
            problems.append(_number_error(setting, fixed[setting]))
        temperature, top_k, top_p = fixed["temperature"], fixed["top_k"], fixed["top_p"]
        seed_widget("batch_size")
        unused = batch_size_unused(choice, st.session_state.get("grid_batch_sizes", ""))
        fixed["batch_size"] = st.number_input(
            VARIABLES["batch_size"].title,
            step=1,
            key="batch_size",
            disabled=unused is not None,
            help=unused or VARIABLES["batch_size"].help.split(";")[0],
        )
        if unused is None:
            problems.append(_number_error("batch_size", fixed["batch_size"]))
        c1, c2 = st.columns(2)
        seed = c1.number_input(SETTINGS["seed"].title, step=1, key="seed", help=SETTINGS["seed"].meaning)
        problems.append(_number_error("seed", seed, c1))
        max_new_tokens = c2.number_input(
            SETTINGS["max_new_tokens"].title,
            step=16,
            key="max_new_tokens",
            help=f"{SETTINGS['max_new_tokens'].meaning} (the cap: ${LIMITS['max_new_tokens'].env})",
        )
        problems.append(_number_error("max_new_tokens", max_new_tokens, c2))
        c1, c2 = st.columns(2)
        device = c1.selectbox("Device", DEVICES, key="device")
        dtype = c2.selectbox("Dtype", DTYPES, key="dtype")
        st.subheader("Sweep")
        c1, c2 = st.columns([1, 2])
        choice = c1.selectbox(
            "Swept variable",
            SWEEP_CHOICES,
            key="sweep_variable",
            help="one variable at a time",
            format_func=lambda c: SWEEP_LABELS.get(c, c),
        )
        sweep_variable, sweep_text, sweep_list, sweep_error = ("k" if choice == AUTO_K else choice), "", None, None
        k, k_auto = 4, None
        if choice == AUTO_K:
            seed_widget("k_auto")
            k_auto = c2.number_input(
                "Largest k",
                step=1,
                key="k_auto",
                persist_state="page",
                help="this k is measured first; from it and the target's verify cost the "
                "speedup of every smaller k is predicted, then the 3 best predicted are "
                "measured against a fresh baseline to confirm",
            )
            problems.append(k_auto_error(k_auto))
            if problems[-1]:
                c2.error(problems[-1], icon=":material/error:")
        elif choice in NUMERIC_SWEEPS:
            seed_widget("sweep_values")
            sweep_text = c2.text_input(
                f"{sweep_variable} values",
                key="sweep_values",
                persist_state="page",
                help="comma-separated; one speculative run each",
            )
            try:
                parse_sweep_values(sweep_text, sweep_variable)  # validate()'s parse, said under the field
            except ValueError as exc:
                c2.error(md_text(str(exc)), icon=":material/error:")
                problems.append(str(exc))
        elif choice == "draft":
            c2.caption(
                "One speculative run per draft candidate (listed under Models), k fixed below, all against "
                "one target-only baseline."
            )
            sweep_list = candidates
        elif choice == "drafter":
            with c2:
                sweep_list, sweep_error = drafter_sweep()
            if sweep_error:
                st.error(md_text(sweep_error), icon=":material/error:")
        elif choice == "draft_sampling":
            c2.caption(
                "One speculative run drafting from the draft's distribution and one proposing its argmax "
                "(verified as a point mass: what a server that drafts by argmax sees), one shared baseline."
            )
            sweep_list = list(DRAFT_SAMPLING)
        elif choice in CHOICE_FIELDS:
            c2.caption(
                f"One speculative run per {VARIABLES[choice].name.replace('_', ' ')}: "
                + ", ".join(VARIABLES[choice].choices)
            )
            sweep_list = list(VARIABLES[choice].choices)
        grid_text = ""
        if choice != "batch_size":  # a grid: the sweep (or k auto's prediction) at each of several batch sizes
            seed_widget("grid_batch_sizes")
            grid_text = st.text_input(
                "At batch sizes (optional: a grid)",
                key="grid_batch_sizes",
                persist_state="page",
                placeholder="e.g. 1,4,16",
                help=GRID_HELP,
            )
            grid_problem = parse_grid(grid_text)[1]
            if grid_problem:
                st.error(md_text(grid_problem), icon=":material/error:")
                problems.append(grid_problem)
        draft_sampling = "probabilistic"
        if choice != "draft_sampling":
            seed_widget("draft_sampling")
            draft_sampling = st.selectbox(
                "Draft sampling",
                DRAFT_SAMPLING,
                key="draft_sampling",
                persist_state="page",
                help=VARIABLES["draft_sampling"].help,
            )
        named = {}  # CHOICE_FIELDS: each not swept is one choice for every run
        for setting in CHOICE_FIELDS:
            if choice != setting:
                seed_widget(WIDGETS[setting])
                named[setting] = st.selectbox(
                    VARIABLES[setting].name.replace("_", " ").capitalize(),
                    VARIABLES[setting].choices,
                    key=WIDGETS[setting],
                    persist_state="page",
                    help=VARIABLES[setting].help,
                )
        if sweep_variable != "k":
            seed_widget("fixed_k")
            k = st.number_input(
                "k (fixed)" if choice != "drafter" else "k (fixed; heuristic: its starting k)",
                step=1,
                key="fixed_k",
                persist_state="page",
            )
            problems.append(_number_error("k", k))
        seed_widget("repeats")
        repeats = st.number_input(
            "Repeats",
            step=1,
            key="repeats",
            help="each prompt is decoded this many times per configuration (the baseline and "
            "every swept value, interleaved), and the median time is used; more repeats narrow "
            "the speedup's 95 % interval on a noisy machine",
        )
        problems.append(_number_error("repeats", repeats))
        if any(problems):  # an estimate of what Launch refuses would be no figure at all (-2,100 tokens)
            st.caption("No estimate of the work while a field above is wrong.")
        else:
            show_workload(
                prompts,
                prompt_texts,
                target,
                sweep_variable,
                sweep_text,
                sweep_list,
                k_auto,
                int(max_new_tokens),
                int(repeats),
                batch_sizes_of(grid_text, int(fixed["batch_size"])),
            )
    st.subheader("Label")
    for key in ("name", "tags", "notes"):
        seed_widget(key)
    c1, c2 = st.columns([1, 1])
    name = c1.text_input("Name", key="name", placeholder="defaults to draft → target on prompts")
    tags_text = c2.text_input("Tags", key="tags", placeholder="comma-separated, e.g. baseline, code")
    notes = st.text_area("Notes", key="notes", height=80)

    if st.button("Launch", type="primary", key="launch", icon=":material/rocket_launch:"):
        launch = validate(
            target=target,
            draft=draft,
            pair_ok=check_ok,
            pair_message=check_message,
            prompts=prompts,
            prompt_error=prompt_error,
            temperature=float(temperature),
            top_k=int(top_k),
            top_p=float(top_p),
            seed=int(seed),
            max_new_tokens=int(max_new_tokens),
            device=device,
            dtype=dtype,
            sweep_variable=sweep_variable,
            sweep_text=sweep_text,
            k=int(k),
            name=name,
            notes=notes,
            tags_text=tags_text,
            prompt_texts=prompt_texts,
            repeats=int(repeats),
            k_auto=int(k_auto) if k_auto is not None else None,
            drafter=drafter,
            sweep_list=sweep_list,
            sweep_error=sweep_error,
            pair_checks=checks,
            draft_sampling=draft_sampling,
            batch_size=int(fixed["batch_size"]),
            grid_text=grid_text,
            prompt_count=count_prompts(prompts, prompt_texts),
            **{setting: fixed[setting] for setting in EXTRA_FIELDS},
            **named,
        )
        if launch.errors:
            st.error("Not launched:\n" + "\n".join(f"- {md_text(e)}" for e in launch.errors), icon=":material/error:")
            return
        from pages.widgets.access import launcher

        launch.kwargs["launched_by"] = launcher()
        first = recent_duplicate(store(), launch.kwargs)
        if first is not None:  # Launch pressed twice: link to the first instead of queuing a copy
            st.info(
                f"Experiment #{first} with exactly these settings was queued less than "
                f"{DUPLICATE_WINDOW_SECONDS // 60} minutes ago; not queuing a copy.",
                icon=":material/content_copy:",
            )
            st.page_link(
                nav_page("experiment"),
                label=f"Open experiment #{first}",
                query_params={"experiment": str(first)},
                icon=":material/monitoring:",
            )
            return
        try:
            experiment_id = enqueue_experiment(store(), **launch.kwargs)
        except QueueError as exc:
            st.error(f"Not launched: {md_text(exc)}", icon=":material/error:")
            return
        kw = launch.kwargs
        values = md_text(", ".join(_format(v) for v in kw["sweep_values"]))
        plan = (
            f"a baseline and k = {values}; the best predicted k values are measured when it finishes"
            if k_auto is not None
            else f"a baseline and {plural(len(kw['sweep_values']), 'run')} ({kw['sweep_variable']} = {values})"
        )
        if kw["drafter"] != "model" and kw["sweep_variable"] != "drafter":
            plan += f", drafter {md_text(kw['drafter'])}"
        if kw.get("batch_sizes"):
            plan += f", at batch sizes {', '.join(str(b) for b in kw['batch_sizes'])} (each with its own baseline)"
        st.success(
            f"Experiment #{experiment_id} queued: {plan}, {plural(kw['repeats'], 'repeat')} per prompt.",
            icon=":material/rocket_launch:",
        )
        st.page_link(
            nav_page("experiment"),
            label=f"Open experiment #{experiment_id}",
            query_params={"experiment": str(experiment_id)},
            icon=":material/monitoring:",
        )
        st.page_link(nav_page("experiments"), label="Watch progress on Experiments", icon=":material/list:")
