"""The round explorer's charts: the output token by token, coloured by how each token was produced, where a click on
a token selects its round (token_layout, token_chart, selected_round), and the selected round's proposals, p_draft
against p_target (proposal_probabilities). Drawn on the Round explorer page."""

from __future__ import annotations

import altair as alt
import pandas as pd

from pages.widgets.charts.look import BOTTOM, HEIGHT, KIND_COLORS, is_value

TOKEN_SELECTION = "token"  # the token chart's point selection: clicking a token selects its round
LINE_CHARS = 80  # the token chart wraps its lines at this many characters (and at every newline)
TOKEN_FONT_PX = 12


# A monospace glyph's advance is 0.6 of its size (DejaVu Sans Mono, Menlo, Courier): the chart is exactly that wide
# per character, so each token's text ends where the next one's starts and a word reads as one ("My Parent", not
# "M y P a rent", which a chart stretched to the page drew).
CHAR_PX = 0.6 * TOKEN_FONT_PX


def token_layout(output: pd.DataFrame, line_chars: int = LINE_CHARS) -> pd.DataFrame:
    """Where each emitted token sits in the token chart: the output laid out as text, `line` and character offset
    `x`..`x2`, wrapped at line_chars and after a newline. shown: the token with whitespace made visible (Vega draws
    it as text, never as HTML). round: the round that emitted it (-1: the prefill token, no round).
    output: position, token_id, text, kind, round_index (storage.records.queries.prompt_output)."""
    rows, line, x = [], 0, 0
    for token in output.itertuples():
        text = str(token.text) if isinstance(token.text, str) else ""
        shown = text.replace("\n", "↵").replace("\t", "→")
        shown = shown.replace(" ", "·") if not shown.strip() else shown
        width = max(len(shown), 1)
        if x and x + width > line_chars:
            line, x = line + 1, 0
        rows.append(
            {
                "position": int(token.position),
                "token_id": int(token.token_id),
                "shown": shown,
                "kind": token.kind,
                "round": int(token.round_index) if pd.notna(token.round_index) else -1,
                "line": line,
                "x": x,
                "x2": x + width,
            }
        )
        x += width
        if "\n" in text:
            line, x = line + 1, 0
    return pd.DataFrame(rows, columns=["position", "token_id", "shown", "kind", "round", "line", "x", "x2"])


def token_chart(layout: pd.DataFrame, selected_round: int | None, line_chars: int = LINE_CHARS) -> alt.LayerChart:
    """The output token by token, coloured by how each was produced, the selected round boxed in orange; a click
    on a token selects its round (a point selection named TOKEN_SELECTION over the `round` field).

    Layers, bottom to top: the coloured boxes, the token texts, and an invisible box per token that carries the
    selection and the tooltip. The browser gives a click to the topmost mark under the pointer, so whether it
    lands on a glyph, on the space after it or on the box's edge, the mark that receives it is the one holding the
    selection, and its datum is that token's."""
    # A token's leading spaces are not drawn as text (the browser drew " Parent" flush against the token before
    # it, one cell early): its text starts that many cells into its box instead (`drawn` from `text_x`).
    lead = layout["shown"].str.len() - layout["shown"].str.lstrip(" ").str.len()
    frame = layout.assign(
        selected=layout["round"] == (selected_round if selected_round is not None else -2),
        drawn=layout["shown"].str.lstrip(" "),
        text_x=layout["x"] + lead,
    )
    pick = alt.selection_point(name=TOKEN_SELECTION, fields=["round"], on="click", clear=False, empty=False)
    lines = int(frame["line"].max()) + 1 if len(frame) else 1
    x = alt.X("x:Q", axis=None, scale=alt.Scale(domain=[0, line_chars], nice=False))
    y = alt.Y("line:O", axis=None)
    kind = alt.Color("kind:N", legend=None, scale=alt.Scale(domain=list(KIND_COLORS), range=list(KIND_COLORS.values())))
    tooltip = [
        alt.Tooltip("round:Q", title="round (-1: prefill)"),
        "kind:N",
        "token_id:Q",
        "position:Q",
        alt.Tooltip("shown:N", title="token"),
    ]
    base = alt.Chart(frame)
    boxes = base.mark_rect(cornerRadius=2).encode(
        x,
        alt.X2("x2:Q"),
        y,
        color=kind,
        opacity=alt.condition(is_value("selected", True), alt.value(0.35), alt.value(0.08)),
        stroke=alt.condition(is_value("selected", True), alt.value("#ef6c00"), alt.value(None)),
    )
    text = base.mark_text(align="left", baseline="middle", font="monospace", fontSize=TOKEN_FONT_PX).encode(
        alt.X("text_x:Q", axis=None, scale=alt.Scale(domain=[0, line_chars], nice=False)),
        y,
        alt.Text("drawn:N"),
        color=kind,
    )
    # Transparent, not absent: a fully transparent fill is still painted, so it receives the pointer.
    hits = (
        base.mark_rect(fill="transparent", stroke=None, cursor="pointer")
        .encode(x, alt.X2("x2:Q"), y, tooltip=tooltip)
        .add_params(pick)
    )
    return (
        alt.layer(boxes, text, hits)
        .properties(width=line_chars * CHAR_PX, height=max(40, 20 * lines), padding=0, autosize="pad")
        .configure_view(stroke=None)
    )


def selected_round(event, rounds: list[int]) -> int | None:
    """The round a token-chart selection picked (st.altair_chart(..., on_select="rerun")'s state), or None when
    nothing, the prefill token, or a round not in `rounds` was clicked."""
    try:
        points = (event or {}).get("selection", {}).get(TOKEN_SELECTION) or []
    except AttributeError:
        return None
    for point in points if isinstance(points, list) else []:
        try:
            value = int(point.get("round"))
        except (AttributeError, TypeError, ValueError):
            continue
        if value in rounds:
            return value
    return None


def proposal_probabilities(frame: pd.DataFrame) -> alt.Chart:
    """p_draft vs p_target of each proposal in a round, coloured by outcome. frame: position, p_draft, p_target,
    outcome."""
    long = frame.melt(
        id_vars=["position", "text", "outcome"],
        value_vars=["p_draft", "p_target"],
        var_name="model",
        value_name="probability",
    )
    return (
        alt.Chart(long)
        .mark_bar()
        .encode(
            alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
            alt.Y("probability:Q", scale=alt.Scale(domain=[0, 1])),
            alt.XOffset("model:N"),
            alt.Color("model:N", title=None, legend=BOTTOM),
            alt.Opacity(
                "outcome:N",
                legend=None,
                scale=alt.Scale(domain=["accepted", "rejected", "discarded"], range=[1, 0.9, 0.3]),
            ),
            tooltip=["position:O", "text:N", "model:N", "outcome:N", alt.Tooltip("probability:Q", format=".3f")],
        )
        .properties(height=HEIGHT - 40)
    )
