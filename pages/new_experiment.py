"""New experiment: pick the pair (checked before launch), prompts, sampling and the sweep; Launch enqueues it."""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import streamlit as st

from engine.errors import DraftLabError
from engine.prompt_sets import PROMPT_SET_DESCRIPTIONS, list_prompt_sets, load_prompt_file, load_prompts
from pages.common import nav_page, store
from storage import queue

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SWEEP_VARIABLES = queue.SWEEPABLE  # k, or a sampling setting with k fixed
AUTO_K = "k: auto (predict, then confirm)"  # `--k auto`: one more choice of what to vary
SWEEP_CHOICES = (SWEEP_VARIABLES[0], AUTO_K, *SWEEP_VARIABLES[1:])
DEFAULT_REPEATS, DEFAULT_K_AUTO = 3, 8
INTEGER_VARIABLES = ("k", "top_k")
DEFAULT_SWEEP = "1,2,3,4,6,8"
MAX_K = 64
UPLOAD_TYPES = ["jsonl", "csv", "txt"]


@dataclass
class Launch:
    """A validated experiment, ready for queue.enqueue_experiment, or the problems that stop it."""

    errors: list[str] = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)


def parse_sweep_values(text: str, variable: str = "k") -> list:
    """`1,2,4` → [1, 2, 4]; raises ValueError naming the bad entry and the fix."""
    parts = [p.strip() for p in re.split(r"[,\s]+", text or "") if p.strip()]
    if not parts:
        raise ValueError(f"give at least one {variable} value, e.g. {DEFAULT_SWEEP}")
    values = []
    for part in parts:
        if variable in INTEGER_VARIABLES:
            low = 1 if variable == "k" else 0
            if not part.isdigit() or not low <= int(part) <= (MAX_K if variable == "k" else 10**6):
                hint = f"from 1 to {MAX_K}; use e.g. {DEFAULT_SWEEP}" if variable == "k" else "≥ 0"
                raise ValueError(f"{variable} value {part!r} is not a whole number {hint}")
            value = int(part)
        else:
            try:
                value = float(part)
            except ValueError:
                raise ValueError(f"{variable} value {part!r} is not a number") from None
            if variable == "temperature" and value < 0:
                raise ValueError(f"temperature value {part} is negative; 0 means greedy")
            if variable == "top_p" and not 0 < value <= 1:
                raise ValueError(f"top_p value {part} is outside (0, 1]")
        if value in values:
            raise ValueError(f"{variable} value {part} is listed twice; list each value once")
        values.append(value)
    return sorted(values)


def upload_dir() -> Path:
    """Where uploaded prompt files are kept for the worker to read: $DRAFTLAB_UPLOAD_DIR, else ~/.cache/draftlab/uploads."""
    return Path(os.environ.get("DRAFTLAB_UPLOAD_DIR") or Path.home() / ".cache" / "draftlab" / "uploads").resolve()


def save_upload(name: str, data: bytes) -> Path:
    """Save an uploaded prompt file under a content-addressed name (same file → same path) and return it."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name).name) or "prompts.txt"
    path = upload_dir() / f"{hashlib.sha256(data).hexdigest()[:12]}-{safe}"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return path


def validate(*, target: str, draft: str, pair_ok: bool, pair_message: str, prompts: str | None,
             prompt_error: str | None, temperature: float, top_k: int, top_p: float, seed: int,
             max_new_tokens: int, device: str, dtype: str, sweep_variable: str, sweep_text: str, k: int,
             name: str, notes: str, tags_text: str, prompt_texts: list[str] | None = None,
             repeats: int = DEFAULT_REPEATS, k_auto: int | None = None) -> Launch:
    """Check every field; a Launch with no errors carries the enqueue_experiment keyword arguments. With k_auto
    (the largest k) the experiment is `--k auto`: sweep_text is not used."""
    launch = Launch()
    if not pair_ok:
        launch.errors.append(f"pair check: {pair_message}")
    if prompt_error:
        launch.errors.append(f"prompts: {prompt_error}")
    elif not prompts:
        launch.errors.append("prompts: choose a built-in set or upload a .jsonl/.csv/.txt file")
    if temperature < 0:
        launch.errors.append("temperature must be ≥ 0 (0 means greedy)")
    if top_k < 0:
        launch.errors.append("top-k must be ≥ 0 (0 turns it off)")
    if not 0 < top_p <= 1:
        launch.errors.append("top-p must be in (0, 1] (1 turns it off)")
    if seed < 0:
        launch.errors.append("seed must be ≥ 0")
    if max_new_tokens < 1:
        launch.errors.append("max new tokens must be at least 1")
    if device not in DEVICES:
        launch.errors.append(f"device must be one of {', '.join(DEVICES)}")
    if dtype not in DTYPES:
        launch.errors.append(f"dtype must be one of {', '.join(DTYPES)}")
    if sweep_variable not in SWEEP_VARIABLES:
        launch.errors.append(f"swept variable must be one of {', '.join(SWEEP_VARIABLES)}")
    if repeats < 1:
        launch.errors.append("repeats must be at least 1 (3 or more narrow the speedup's interval)")
    if k_auto is not None:
        sweep_variable, values, k = "k", [k_auto], k_auto
        if not 2 <= k_auto <= MAX_K:
            launch.errors.append(f"the largest k for k auto must be from 2 to {MAX_K}")
    else:
        try:
            values = parse_sweep_values(sweep_text, sweep_variable)
        except ValueError as exc:
            launch.errors.append(str(exc))
            values = []
    if not 1 <= k <= MAX_K:
        launch.errors.append(f"k must be from 1 to {MAX_K}")
    if launch.errors:
        return launch
    tags = tuple(dict.fromkeys(t.strip() for t in tags_text.split(",") if t.strip()))
    default_name = f"{draft} → {target} on {Path(prompts).name if os.sep in prompts else prompts}"
    launch.kwargs = dict(
        name=name.strip() or default_name, target=target.strip(), draft=draft.strip(), prompts=prompts,
        sampling={"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p), "seed": int(seed),
                  "max_new_tokens": int(max_new_tokens)},
        device=device, dtype=dtype, sweep_variable=sweep_variable, sweep_values=values, k=int(k),
        notes=notes.strip(), tags=tags, repeats=int(repeats), k_auto=int(k_auto) if k_auto is not None else None,
    )
    if prompt_texts is not None:  # an upload: freeze its prompts now, so any worker can run them
        launch.kwargs["prompt_texts"] = list(prompt_texts)
    return launch


def _pair_check(target: str, draft: str):
    from app.pair_check import check_pair_names

    with st.spinner("Checking that the two tokenizers match (the first check loads transformers)…"):
        return check_pair_names(target.strip(), draft.strip())


def _prompt_source() -> tuple[str | None, str | None, list[str] | None]:
    """(prompt set spec or saved file path, error, the uploaded prompts) from the prompt-set widgets."""
    source = st.radio("Prompt set", ["Built-in", "Upload a file"], horizontal=True, key="prompt_source")
    if source == "Built-in":
        sets = list_prompt_sets()
        spec = st.selectbox("Built-in set (NAME:SPLIT)", sets, index=sets.index("code:tune") if "code:tune" in sets else 0,
                            key="prompt_set", help="Tune on `tune`, confirm on `validation`.")
        try:
            count = len(load_prompts(spec))
        except DraftLabError as exc:
            return None, str(exc), None
        st.caption(f"{count} prompts — {PROMPT_SET_DESCRIPTIONS.get(spec.split(':')[0], '')}")
        return spec, None, None
    upload = st.file_uploader("Prompt file: .jsonl (a \"prompt\" field per line), .csv (a \"prompt\" column) or "
                              ".txt (one prompt a line)", type=UPLOAD_TYPES, key="prompt_upload")
    if upload is None:
        return None, None, None
    path = save_upload(upload.name, upload.getvalue())
    try:
        prompts = load_prompt_file(path)
    except DraftLabError as exc:
        return None, str(exc).replace(str(path), upload.name), None
    if not prompts:
        return None, f"{upload.name} holds no prompts", None
    st.caption(f"{len(prompts)} prompts from {upload.name}, saved as `{path}`")
    return str(path), None, prompts


def render() -> None:
    st.title("New experiment")
    st.caption("A target-only baseline plus one speculative run per swept value, queued for the worker.")

    left, right = st.columns(2)
    with left:
        st.subheader("Models")
        target = st.text_input("Target model", "demo-target", key="target",
                               help="demo-target, an HF model id or a local directory")
        draft = st.text_input("Draft model", "demo-draft", key="draft",
                              help="demo-draft, demo-draft-distilled, an HF model id or a local directory")
        check = _pair_check(target, draft)
        if check.ok:
            st.success(f"Pair check: {check.message}", icon=":material/check_circle:")
        else:
            st.error(f"Pair check: {check.message}", icon=":material/error:")
        st.subheader("Prompts")
        prompts, prompt_error, prompt_texts = _prompt_source()
        if prompt_error:
            st.error(prompt_error, icon=":material/error:")
    with right:
        st.subheader("Sampling")
        c1, c2, c3 = st.columns(3)
        temperature = c1.number_input("Temperature", min_value=None, value=0.0, step=0.1, key="temperature",
                                      help="0 = greedy")
        top_k = c2.number_input("Top-k", value=0, step=1, key="top_k", help="0 = off")
        top_p = c3.number_input("Top-p", value=1.0, step=0.05, key="top_p", help="1 = off")
        c1, c2 = st.columns(2)
        seed = c1.number_input("Seed", value=0, step=1, key="seed")
        max_new_tokens = c2.number_input("Max new tokens", value=128, step=16, key="max_new_tokens")
        c1, c2 = st.columns(2)
        device = c1.selectbox("Device", DEVICES, key="device")
        dtype = c2.selectbox("Dtype", DTYPES, key="dtype")
        st.subheader("Sweep")
        c1, c2 = st.columns([1, 2])
        choice = c1.selectbox("Swept variable", SWEEP_CHOICES, key="sweep_variable", help="one variable at a time")
        sweep_variable, sweep_text, k, k_auto = ("k" if choice == AUTO_K else choice), "", 4, None
        if choice == AUTO_K:
            k_auto = c2.number_input("Largest k", min_value=2, max_value=MAX_K, value=DEFAULT_K_AUTO, step=1,
                                     key="k_auto", help="this k is measured first; from it and the target's verify "
                                     "cost the speedup of every smaller k is predicted, then the 3 best predicted are "
                                     "measured against a fresh baseline to confirm")
        else:
            sweep_text = c2.text_input(f"{sweep_variable} values", DEFAULT_SWEEP, key="sweep_values",
                                       help="comma-separated; one speculative run each")
        if sweep_variable != "k":
            k = st.number_input("k (fixed)", value=4, step=1, key="fixed_k")
        repeats = st.number_input("Repeats", min_value=1, value=DEFAULT_REPEATS, step=1, key="repeats",
                                  help="each prompt is decoded this many times per configuration (the baseline and "
                                  "every swept value, interleaved), and the median time is used; more repeats narrow "
                                  "the speedup's 95 % interval on a noisy machine")
    st.subheader("Label")
    c1, c2 = st.columns([1, 1])
    name = c1.text_input("Name", "", key="name", placeholder="defaults to draft → target on prompts")
    tags_text = c2.text_input("Tags", "", key="tags", placeholder="comma-separated, e.g. baseline, code")
    notes = st.text_area("Notes", "", key="notes", height=80)

    if st.button("Launch", type="primary", key="launch", icon=":material/rocket_launch:"):
        launch = validate(target=target, draft=draft, pair_ok=check.ok, pair_message=check.message, prompts=prompts,
                          prompt_error=prompt_error, temperature=float(temperature), top_k=int(top_k),
                          top_p=float(top_p), seed=int(seed), max_new_tokens=int(max_new_tokens), device=device,
                          dtype=dtype, sweep_variable=sweep_variable, sweep_text=sweep_text, k=int(k), name=name,
                          notes=notes, tags_text=tags_text, prompt_texts=prompt_texts, repeats=int(repeats),
                          k_auto=int(k_auto) if k_auto is not None else None)
        if launch.errors:
            st.error("Not launched:\n" + "\n".join(f"- {e}" for e in launch.errors), icon=":material/error:")
            return
        try:
            experiment_id = queue.enqueue_experiment(store(), **launch.kwargs)
        except queue.QueueError as exc:
            st.error(f"Not launched: {exc}", icon=":material/error:")
            return
        values = ", ".join(f"{v:g}" for v in launch.kwargs["sweep_values"])
        plan = (f"a baseline and k = {values}; the best predicted k values are measured when it finishes"
                if k_auto is not None else
                f"a baseline and {len(launch.kwargs['sweep_values'])} runs ({launch.kwargs['sweep_variable']} = {values})")
        st.success(f"Experiment #{experiment_id} queued: {plan}, {launch.kwargs['repeats']} repeats per prompt.",
                   icon=":material/rocket_launch:")
        st.page_link(nav_page("experiment"), label=f"Open experiment #{experiment_id}",
                     query_params={"experiment": str(experiment_id)}, icon=":material/monitoring:")
        st.page_link(nav_page("experiments"), label="Watch progress on Experiments", icon=":material/list:")
