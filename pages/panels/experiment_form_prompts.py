"""The New-experiment form's prompt source: a built-in prompt set (NAME:SPLIT, with its size and description) or an
uploaded file (saved for the worker by pages/widgets/uploads.py, its prompts counted, its errors in one line naming
the file, never the server's path).
"""

from __future__ import annotations

import streamlit as st

from engine.errors import DraftLabError
from engine.text.prompt_sets import PROMPT_SET_DESCRIPTIONS, Prompt, list_prompt_sets, load_prompt_file, load_prompts
from engine.wording import plural
from pages.widgets.form_defaults import seed_widget
from pages.widgets.prefill import md_text
from pages.widgets.uploads import UPLOAD_TYPES, save_upload


def prompt_source() -> tuple[str | None, str | None, list[Prompt] | None]:
    """(prompt set spec or saved file path, error, the uploaded prompts) from the prompt-set widgets."""
    seed_widget("prompt_source")
    source = st.radio("Prompt set", ["Built-in", "Upload a file"], horizontal=True, key="prompt_source")
    if source == "Built-in":
        sets = list_prompt_sets()
        seed_widget("prompt_set", "code:tune" if "code:tune" in sets else sets[0])
        spec = st.selectbox(
            "Built-in set (NAME:SPLIT)",
            sets,
            key="prompt_set",
            persist_state="page",
            help="Tune on `tune`, confirm on `validation`.",
        )
        try:
            count = len(load_prompts(spec))
        except DraftLabError as exc:
            return None, str(exc), None
        st.caption(f"{plural(count, 'prompt')} — {PROMPT_SET_DESCRIPTIONS.get(spec.split(':')[0], '')}")
        return spec, None, None
    upload = st.file_uploader(
        'Prompt file: .jsonl (a "prompt" field, or a conversation: OpenAI "messages" or '
        'ShareGPT "conversations", per line), .csv (a "prompt" column), .txt (one prompt a '
        "line) or a .parquet/.arrow dataset export",
        type=UPLOAD_TYPES,
        key="prompt_upload",
    )
    if upload is None:
        return None, None, None
    path = save_upload(upload.name, upload.getvalue())
    try:
        prompts = load_prompt_file(path)
    except DraftLabError as exc:
        return None, str(exc).replace(str(path), upload.name), None
    if not prompts:
        return None, f"{upload.name} holds no prompts", None
    st.caption(md_text(f"{plural(len(prompts), 'prompt')} from {upload.name}"))  # never the server's path
    return str(path), None, prompts
