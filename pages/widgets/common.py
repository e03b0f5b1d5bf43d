"""What every page shares: the store, the selection kept in the URL query string, CSV downloads."""

from __future__ import annotations

import functools
import os
import re

import altair as alt
import pandas as pd
import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from engine.config.variables import value_labels, variable
from pages.widgets.nav import page
from storage import open_store
from storage.db.migrations import SchemaTooNew

# What opening or reading the database fails with when there is none to use (a server down, a file that cannot be
# opened, a driver not installed, a database newer than this DraftLab): a form that only shows extras from it (the
# trained drafts, a duration estimate, which uploads to keep) goes on without them. Anything else is a bug: raised.
NO_DATABASE = (SQLAlchemyError, OSError, ImportError, SchemaTooNew)


@st.cache_resource(show_spinner=False)
def _open(url: str | None):
    return open_store(url)


def store():
    """The store named by $DRAFTLAB_DB (set by `draftlab ui`), else storage's default."""
    return _open(_url())


def _url() -> str | None:
    return os.environ.get("DRAFTLAB_DB") or None


# --- query results cached per version -------------------------------------------------------------------------
# A finished run's rows never change, so a page's queries are cached keyed on (database URL, query, arguments,
# version stamp): the stamp (storage.records.queries.experiment_version, one aggregate over `runs`) changes whenever a
# run commits a prompt, beats, finishes or is cancelled, so a rerun or the 2 s refresh recomputes only what moved.


@st.cache_data(show_spinner=False, max_entries=512, ttl=3600)
def _cached_query(url: str | None, name: str, args: tuple, kwargs: tuple, version: tuple, _query):
    # `name` (the query's module and name) is its part of the cache key; Streamlit hashes no `_` argument
    return _query(_open(url), *args, **dict(kwargs))


def version(experiment_id: int | None = None) -> tuple:
    """The experiment's version stamp (all experiments' when None)."""
    from storage.records import queries as q

    return q.experiment_version(store(), experiment_id)


def run_stamp(runs: pd.DataFrame, run_id: int) -> tuple:
    """One run's version from its row in runs(): a finished run's never changes, so its breakdowns stay cached
    while the experiment's other runs go on."""
    row = runs.loc[runs["run_id"] == run_id]
    if row.empty:
        return ("run", run_id)
    r = row.iloc[0]
    return ("run", run_id, *(str(r.get(c)) for c in ("status", "prompts_done", "rounds", "finished", "heartbeat")))


def cached(query, *args, experiment_id: int | None = None, stamp: tuple | None = None, **kwargs):
    """query(store, *args, **kwargs), cached until `experiment_id`'s version changes (every experiment's version when
    experiment_id is None): `query` is a storage function (`verdict_dict`) or the name of one in storage.records.queries
    (`"runs"`). Pass `stamp` to reuse one already read this rerun."""
    from storage.records import queries as q

    query = getattr(q, query) if isinstance(query, str) else query
    stamp = stamp if stamp is not None else version(experiment_id)
    result = _cached_query(
        _url(), f"{query.__module__}.{query.__qualname__}", tuple(args), tuple(sorted(kwargs.items())), stamp, query
    )
    return result.copy() if isinstance(result, pd.DataFrame) else result


_ID = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() also takes '²' and '①', which int() refuses


def parse_id(text) -> int | None:
    """An id from the URL: 1 to 9 ASCII digits (surrounding spaces allowed), else None."""
    text = str(text).strip()
    return int(text) if _ID.fullmatch(text) else None


def query_ids(key: str) -> list[int]:
    """Integer ids in the query string, `?key=3` or `?key=3,5`; anything malformed is ignored."""
    raw = st.query_params.get(key, "")
    ids = [i for i in (parse_id(part) for part in str(raw).split(",")) if i is not None]
    return list(dict.fromkeys(ids))


def select_id(
    label: str, key: str, options: list[int], format_func=str, container=st, default: int | None = None
) -> int | None:
    """A selectbox over ids, defaulting to and writing back to `?key=`, so the view can be shared as a link."""
    if not options:
        return None
    wanted = query_ids(key)
    if wanted and wanted[0] in options:
        index = options.index(wanted[0])
    else:
        index = options.index(default) if default in options else 0
    widget, index = _relabelled(f"select_{key}", options, index, format_func)
    chosen = container.selectbox(label, options, index=index, format_func=format_func, key=widget)
    if query_ids(key)[:1] != [chosen]:
        st.query_params[key] = str(chosen)
    return chosen


_DRAWN = "_select_drawn"  # session key: {selectbox key: (generation, the choice drawn, its text as drawn)}


def _relabelled(base: str, options: list, index: int, format_func) -> tuple[str, int]:
    """(the selectbox's key, its index): `base`, until the same choice's text changes (its status moved from
    "(running)" to "(done)"): Streamlit's selectbox keeps showing a keyed choice's text as first drawn, so the
    page would contradict its own table; a renewed key (`base~1`) draws the same choice with its text now."""
    drawn = st.session_state.setdefault(_DRAWN, {})
    generation, value, text = drawn.get(base, (0, None, None))
    key = base if not generation else f"{base}~{generation}"
    current = st.session_state.get(key, options[index])
    current = current if current in options else options[index]
    if current == value and format_func(current) != text:
        generation, index = generation + 1, options.index(current)
        key = f"{base}~{generation}"
    drawn[base] = (generation, current, format_func(current))
    return key, index


def select_ids(
    label: str, key: str, options: list[int], format_func=str, default: list[int] | None = None
) -> list[int]:
    """A multiselect over ids kept in `?key=1,2`."""
    wanted = [i for i in query_ids(key) if i in options] or [i for i in (default or []) if i in options]
    chosen = st.multiselect(label, options, default=wanted, format_func=format_func, key=f"multi_{key}")
    if query_ids(key) != chosen:
        if chosen:
            st.query_params[key] = ",".join(str(i) for i in chosen)
        elif key in st.query_params:
            del st.query_params[key]
    return chosen


def csv_download(frame: pd.DataFrame, file_name: str, label: str = "Download CSV", key: str | None = None) -> None:
    st.download_button(
        label,
        frame.to_csv(index=False).encode("utf-8"),
        file_name=file_name,
        mime="text/csv",
        key=key or f"csv_{file_name}",
        icon=":material/download:",
        on_click="ignore",
    )


def draw(chart: alt.TopLevelMixin, **kwargs):
    """st.altair_chart without Altair's schema validation of the whole spec as Streamlit serializes it: the
    jsonschema pass was a quarter of the detail page's script time (and its first use loads the schema), while
    every builder's spec is validated where it is made, by tests/test_pages_charts.py. Returns what st.altair_chart
    does (a selection's state, with on_select)."""
    object.__setattr__(chart, "to_dict", functools.partial(type(chart).to_dict, chart, validate=False))
    return st.altair_chart(chart, **kwargs)


def chart_with_csv(chart: alt.TopLevelMixin, frame: pd.DataFrame, file_name: str) -> None:
    """Draw a chart and offer the exact frame it was built from as CSV."""
    draw(chart, width="stretch")
    csv_download(frame, file_name)


# --- tables: headers, help and number formats from storage/records/columns.py -----------------------------------------

_KINDS = {
    "number": "NumberColumn",
    "text": "TextColumn",
    "progress": "ProgressColumn",
    "list": "ListColumn",
    "datetime": "DatetimeColumn",
    "checkbox": "CheckboxColumn",
}


def column_config(names, columns: dict | None = None, headers: dict | None = None, pinned=(), **overrides) -> dict:
    """Streamlit column configs of `names` from the column table (storage/records/columns.py): its header, help and
    number format. `headers` renames a column for this table (`sweep_value` as "temperature"); `pinned`: the columns
    that say which row it is, kept in view while a wide table scrolls sideways; `overrides` replaces a column's config
    outright."""
    from storage.records.columns import COLUMNS, EXPERIMENT_COLUMNS

    table = columns if columns is not None else {**EXPERIMENT_COLUMNS, **COLUMNS}
    config = {}
    for name in names:
        column = table.get(name)
        if column is None:
            continue
        kind = getattr(st.column_config, _KINDS[column.kind])
        kwargs = {"help": column.help or None, "width": column.width, "pinned": True if name in pinned else None}
        if column.kind == "number":
            kwargs["format"] = column.fmt
        elif column.kind == "progress":
            kwargs.update(format=column.fmt, min_value=0, max_value=100)
        elif column.kind == "datetime":
            kwargs["format"] = "YYYY-MM-DD HH:mm"
        config[name] = kind((headers or {}).get(name, column.header), **kwargs)
    config.update(overrides)
    return config


def table(
    frame: pd.DataFrame,
    names,
    key: str,
    columns: dict | None = None,
    headers: dict | None = None,
    pinned=(),
    **overrides,
) -> None:
    """st.dataframe of `frame`'s columns among `names`, in that order, configured from the column table; a missing
    figure (the baseline's speedup, a running run's α) shows as "—", never "None". pinned: the columns naming the
    row (run, kind, batch, k), which stay in view while a table wider than the page scrolls sideways."""
    from storage.records.columns import MISSING

    shown = [n for n in names if n in frame]
    st.dataframe(
        frame[shown],
        hide_index=True,
        width="stretch",
        key=key,
        placeholder=MISSING,
        column_config=column_config(shown, columns, headers, pinned, **overrides),
    )


def show(name: str, value) -> str:
    """One figure as text in its column's format (storage/records/columns.py), the same digits the tables show."""
    from storage.records.columns import show as _show

    return _show(name, value)


def experiment_label(experiments: pd.DataFrame):
    """format_func for experiment ids: `#3 · name (status)`."""
    names = dict(zip(experiments["experiment_id"], experiments["name"]))
    statuses = dict(zip(experiments["experiment_id"], experiments["status"]))
    return lambda i: f"#{i} · {names.get(i) or 'unnamed'} ({statuses.get(i, '?')})"


def swept_values(runs: pd.DataFrame, sweep_variable: str) -> list:
    """Each run's swept value as it reads (engine/config/variables.py's run_value: a draft or drafter sweep's name, not
    the index sweep_value stores; None for a shared baseline); in a draft sweep whose runs draft with different drafters
    (EAGLE-3 heads beside causal LMs) each names its drafter too: `heads/h · eagle3`."""
    swept = variable(sweep_variable)
    drafters = runs["drafter"].where(runs["kind"] == "speculative") if "drafter" in runs else [None] * len(runs)
    return value_labels(swept.name, [swept.run_value(row) for _, row in runs.iterrows()], list(drafters))


def run_label(runs: pd.DataFrame, sweep_variable: str = "k"):
    """format_func for run ids: `run 7 · k=4` or `run 1 · baseline`; where the runs span several batch sizes (a
    grid) each names its batch size too: `run 7 · k=4 · batch 16`; a draft sweep of several drafters each run's
    drafter (swept_values)."""
    rows = {r.run_id: r for r in runs.itertuples()}
    texts = dict(zip(runs["run_id"], swept_values(runs, sweep_variable))) if len(runs) else {}
    grid = sweep_variable != "batch_size" and "batch_size" in runs and runs["batch_size"].nunique() > 1

    def label(run_id: int) -> str:
        r = rows.get(run_id)
        if r is None:
            return f"run {run_id}"
        at = f" · batch {int(r.batch_size)}" if grid and pd.notna(r.batch_size) else ""
        if r.kind == "baseline":
            return f"run {run_id} · baseline{at}"
        swept = variable(sweep_variable)
        value = r.k if swept.name == "k" else texts[run_id]  # a draft sweep's name, not its index
        return f"run {run_id} · {swept.name}={swept.show(value) if value is not None else '?'}{at} ({r.status})"

    return label


def short_name(value):
    """A model path as a table cell shows it: its last part (`/home/me/models/my-draft/` -> `my-draft`), so a long
    path never pushes the columns after it off screen; anything else (a hub id, a number, None) as it is."""
    path = value.rstrip("/") if isinstance(value, str) else ""
    if not (path.startswith(("/", "~", ".")) or path.count("/") >= 2):  # a hub id (org/name) is short already
        return value
    return value.rstrip("/").rsplit("/", 1)[-1]


def number(value, fmt: str = "{:.3f}", missing: str = "—") -> str:
    """Formats a metric for st.metric; NaN/None (not measured yet) shows as a dash."""
    if value is None or (isinstance(value, float) and value != value):
        return missing
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def empty_state(message: str) -> None:
    st.info(message, icon=":material/science:")
    st.page_link(nav_page("new"), label="Launch an experiment", icon=":material/add_circle:")


def nav_page(key: str):
    return page(key)
