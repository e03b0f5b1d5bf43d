"""The `schedule` rule: a grid's k per batch size (storage/analysis/schedule.py), what vLLM serves as
num_speculative_tokens_per_batch_size.

It fires for a grid with two or more judged batch sizes: where speculation does not pay (and from which batch size
to switch it off, with a follow-up grid between the last batch size that gains and the first that does not), else
the k to serve at each batch size; and a warning for the batch sizes where no configuration is measurably faster or
slower than the target alone."""

from __future__ import annotations

from typing import Any

from engine.config.variables import variable
from storage.analysis.findings.base import MODEL_FREE_DRAFTERS, _cap, _Context, _finding, _join


def _schedule(ctx: _Context) -> list[dict[str, Any]]:
    """Rule (a grid with two or more judged batch sizes, storage/analysis/schedule.py): where the schedule serves the
    target alone (speculation measurably slower, or not measurably faster) and from which batch size to switch it off,
    with a follow-up grid between the last batch size that gains and the first that does not; else the k to serve
    at each batch size. Separately, a warning for the batch sizes where no configuration is measurably faster or
    slower than the target alone (served without speculation; more --repeats could show a gain)."""
    grid = ctx.grid
    if grid is None:
        return []
    known = [step for step in grid.steps if step.k is not None]
    if len(known) < 2:
        return []
    out = []
    data = {
        "schedule": [{"batch_size": st.batch_size, "k": st.k} for st in known],
        "ranges": grid.ranges,
        "off_from": grid.off_from,
    }
    off = [st for st in known if st.off]
    if off:
        first = off[0]
        sizes = _join([str(st.batch_size) for st in off])
        title = (
            f"Switch speculation off from batch {grid.off_from}"
            if grid.off_from is not None
            else f"Speculation does not pay at batch {sizes}"
        )
        paying = [st for st in known if not st.off]
        detail = _cap("; ".join(st.text for st in off)) + "."
        if paying:
            detail += " Where it pays: " + "; ".join(st.text.split(": ", 1)[1] for st in paying) + "."
        gaining = [st.batch_size for st in paying if st.batch_size < first.batch_size]
        if gaining:
            low, high = gaining[-1], first.batch_size
            between = sorted(
                {
                    low,
                    *(
                        b
                        for b in (low + (high - low) // 4, (low + high) // 2, high - (high - low) // 4)
                        if low < b < high
                    ),
                    high,
                }
            )
            next_ = (
                f'Serve with the schedule ("Use these settings" carries it to vLLM as '
                f"num_speculative_tokens_per_batch_size), and locate the crossover: the same sweep at batch "
                f"sizes {_join([str(b) for b in between])}."
            )
            prefill = ctx.prefill(title, batch_sizes=",".join(map(str, between)))
        else:
            next_ = (
                "Speculation does not pay at any batch size measured from the smallest up: serve the target "
                f"alone there, or try a drafter without a draft model ({_join(list(MODEL_FREE_DRAFTERS))}) or a "
                f"smaller k."
            )
            prefill = ctx.prefill(
                title,
                sweep="drafter",
                values=",".join(("model", *MODEL_FREE_DRAFTERS)),
                k=1,
                batch_sizes=",".join(str(st.batch_size) for st in known),
            )
        out.append(_finding("schedule", "info", title, detail, "schedule", next_, prefill, data))
    else:
        ks = [st.k for st in known]
        title = (
            f"Serve k = {ks[0]} at every batch size measured"
            if len(set(ks)) == 1
            else "The best k changes with the batch size"
        )
        detail = _cap(grid.text) + "."
        next_ = (
            'Serve with the schedule ("Use these settings" carries it to vLLM as '
            "num_speculative_tokens_per_batch_size); measure larger batch sizes to find where it stops paying."
        )
        larger = [known[-1].batch_size * 2, known[-1].batch_size * 4]
        most = variable("batch_size").upper  # batch size's bound (engine/config/limits.py): always set
        prefill = ctx.prefill(title, batch_sizes=",".join(str(b) for b in larger if most is not None and b <= most))
        out.append(_finding("schedule", "info", title, detail, "schedule", next_, prefill, data))
    unsure = [st for st in known if not st.loses and not st.gains]
    if unsure:
        repeats = ctx.more_repeats()
        unsure_sizes = [str(st.batch_size) for st in unsure]
        title = f"No measurable gain at batch {_join(unsure_sizes)}"
        detail = _cap("; ".join(st.text for st in unsure)) + "."
        out.append(
            _finding(
                "schedule",
                "warning",
                title,
                detail,
                "schedule",
                f"Rerun those batch sizes with more --repeats ({repeats}) or more prompts to decide "
                f"between speculating and serving the target alone.",
                ctx.prefill(title, repeats=repeats, batch_sizes=",".join(unsure_sizes)),
                {"batch_sizes": [st.batch_size for st in unsure], "repeats": repeats},
            )
        )
    return out
