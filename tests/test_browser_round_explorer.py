"""The Round explorer in Chromium (issue 35 item 16): it opens on a prompt and says why, its prompt picker shows a
code prompt's line breaks as ⏎ ("import logging ⏎ logger = …", not "import logginglogger = …"), the legend counts
each kind once ("accepted draft: 12", never "first token (target prefill) (0)"), and nothing on the page errs or
draws an empty chart. Needs Debian's chromium at /usr/bin/chromium."""

from __future__ import annotations

import random

from tests.browser import chromium, collect_errors, dashboard, needs_chromium, page_problems, settle

pytestmark = needs_chromium

PROMPTS = [
    "import logging\nlogger = logging.getLogger(__name__)\n",
    "def main():\n    return compute(1)\n",
    "class Point:\n    x: int\n    y: int\n",
]
WORDS = ["def", " value", " return", " the", " result", "\n", "    ", " list", " of", " items", "(", "):"]


def _seed(store) -> tuple[int, int]:
    """(experiment id, its speculative run id): a finished greedy k = 2 run over PROMPTS, lossless, whose outputs
    read as words."""
    from benchmarks.bench_queries import synthetic_baseline, synthetic_prompt
    from storage.jobs import run_state
    from storage.jobs.experiments import enqueue_experiment
    from storage.records import queries as q
    from storage.records.recording import record_prompt

    eid = enqueue_experiment(
        store,
        name="explorer",
        target="tgt",
        draft="drf",
        prompts="code:validation",
        sampling={"temperature": 0.0, "max_new_tokens": 64},
        sweep_values=[2],
        prompt_texts=PROMPTS,
    )
    runs = {r.kind: int(r.run_id) for r in q.runs(store, eid).itertuples()}
    rng = random.Random(5)
    baseline = [synthetic_baseline(rng, i, 30) for i in range(len(PROMPTS))]
    results = {
        "baseline": baseline,
        "speculative": [synthetic_prompt(rng, i, 2, 0, follow=b.output_ids) for i, b in enumerate(baseline)],
    }
    run_state.claim_group(store, eid, "seed")
    for kind, rid in runs.items():
        run_state.start_run(store, rid, len(PROMPTS), "cpu")
        with store.write() as conn:
            for i, result in enumerate(results[kind]):
                texts = [WORDS[t % len(WORDS)] for t in result.output_ids]
                result.prompt, result.text = PROMPTS[i], "".join(texts)
                record_prompt(conn, rid, kind, result, texts)
        run_state.finish_run(store, rid, "done")
    return eid, runs["speculative"]


def test_the_round_explorer_says_why_it_opens_where_it_does_and_shows_line_breaks(tmp_path):
    from pages.round_explorer import opening_prompt, picker_label
    from storage import open_store
    from storage.records import queries as q

    store = open_store(f"sqlite:///{tmp_path / 'draftlab.db'}")
    eid, run = _seed(store)
    opening = opening_prompt(q.per_prompt(store, run))
    store.dispose()
    with dashboard(tmp_path) as served, chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        messages = collect_errors(page)
        page.goto(f"{served['url']}/rounds?experiment={eid}&run={run}")
        settle(page)
        problems, _ = page_problems(page, "round explorer", messages, charted=True)
        assert not problems, problems
        text = page.locator('[data-testid="stMain"]').inner_text()
        assert f"Opened on prompt {opening}: of the outputs that read as text" in text and "most rejected" in text
        legend = page.locator('[data-testid="stMarkdownContainer"]').filter(has_text="■").inner_text()
        assert "accepted draft: " in legend and ") (" not in legend and "(0)" not in legend, legend

        picker = page.get_by_role("combobox", name="Prompt")
        assert picker.input_value() == picker_label(opening, PROMPTS[opening])
        picker.click()
        page.get_by_role("option").first.wait_for()
        options = [o.strip() for o in page.get_by_role("option").all_inner_texts()]
        assert "0: import logging ⏎ logger = logging.getLogger(__name__) ⏎" in options, options
        assert not any("logginglogger" in o.replace(" ", "") for o in options), options
        other = next(i for i in range(len(PROMPTS)) if i != opening)
        page.get_by_role("option", name=picker_label(other, PROMPTS[other])).click()
        settle(page)
        assert f"prompt={other}" in page.url
        assert "Opened on prompt" not in page.locator('[data-testid="stMain"]').inner_text()  # the user's choice now
        problems, _ = page_problems(page, "round explorer, another prompt", messages, charted=True)
        assert not problems, problems
