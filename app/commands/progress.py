"""`draftlab run`'s progress bar: tokens decoded of the whole experiment, on stderr (tqdm)."""

from __future__ import annotations

import sys


class ProgressBar:
    """Token progress of the whole experiment on stderr (tqdm), fed by the worker's progress hook: every
    (run, prompt, repeat) decode counts up to max_new_tokens; runs queued later (`--k auto`) extend the total."""

    PREFIX = "draftlab run: "  # the command's own lines: `draftlab run` times the runs itself, no worker is involved

    def __init__(self, prompts: int, max_new_tokens: int, runs: int, repeats: int = 1):
        from tqdm import tqdm

        self.per_prompt, self.per_run = max_new_tokens, prompts * max_new_tokens * repeats
        self.bar = tqdm(total=self.per_run * runs, unit="tok", file=sys.stderr, dynamic_ncols=True)
        self.expected_runs = runs
        self.runs_seen: set[int] = set()
        self.decodes: dict[tuple, int] = {}

    def update(self, run: dict, prompt_index: int, tokens: int, repeat: int = 0) -> None:
        if run["id"] not in self.runs_seen:
            self.runs_seen.add(run["id"])
            if len(self.runs_seen) > self.expected_runs:
                self.bar.total += self.per_run
        self.bar.set_description(
            f"prompt {prompt_index + 1} " + ("baseline" if run["kind"] == "baseline" else f"k={run['k']}"),
            refresh=False,
        )
        self.decodes[(run["id"], prompt_index, repeat)] = min(tokens, self.per_prompt)
        done = sum(self.decodes.values())
        self.bar.update(max(0, done - self.bar.n))

    def write(self, message: str) -> None:
        """A line of this command's own (`draftlab run: run 2 (speculative, k=1) done`; no worker process is
        involved). Above the bar while it moves; once it is full, without redrawing it: close() draws the final
        progress line once (tqdm.write redrew the full bar after every message, so it printed four times)."""
        line = f"{self.PREFIX}{message}"
        if self.bar.n < self.bar.total:
            self.bar.write(line, file=sys.stderr)
        else:
            self.bar.clear()
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.set_description("all runs", refresh=False)
        self.bar.update(self.bar.total - self.bar.n) if self.bar.n < self.bar.total else None
        self.bar.close()
