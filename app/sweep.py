"""One variable at a time: which of `draftlab run`'s options is swept, and with which values.

The article's rule for tuning a draft: change one variable per sweep, so a difference in speedup has one
cause. Each swept variable's option (engine/config/variables.py: `--k`, `--temperature`, `--top-k`, `--top-p`,
`--draft`, `--drafter`, `--batch-size`, ...) takes one value or a comma-separated list; at most one of them may be a
list, except that `--batch-size` may list values next to another list: a grid (`--batch-size 1,4,16 --k 1,2,3,4`), the
other variable swept at each batch size, each with its own target-only baseline at that batch size. Batch size is the
one allowed outer axis: what serves best changes with it (the k schedule, storage/analysis/schedule.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.variables import VARIABLES
from engine.errors import DraftLabError

AUTO_K_MAX = 8
# The options that may be swept, in the order the CLI lists them: one per swept variable (engine/config/variables.py).
OPTIONS = tuple(VARIABLES)


@dataclass(frozen=True)
class Sweep:
    variable: str  # a key of engine.config.variables.VARIABLES
    values: list  # the swept values (one value: a single configuration)
    fixed: dict  # the other five options' single values
    k_auto: int | None = None  # `--k auto[:K]`: predict, then confirm up to K
    batch_sizes: list | None = None  # a grid's outer axis: the sweep at each of these batch sizes (None: no grid)

    @property
    def sizes(self) -> list[int]:
        """Every batch size the sweep decodes at."""
        if self.batch_sizes:
            return [int(v) for v in self.batch_sizes]
        return [int(v) for v in self.values] if self.variable == "batch_size" else [int(self.fixed["batch_size"])]

    @property
    def ks(self) -> list[int]:
        return [int(v) for v in self.values] if self.variable == "k" else [int(self.fixed["k"])]

    @property
    def drafts(self) -> list[str]:
        return list(self.values) if self.variable == "draft" else [self.fixed["draft"]]

    @property
    def drafters(self) -> list[str]:
        return list(self.values) if self.variable == "drafter" else [self.fixed["drafter"]]


def _values(option: str, text) -> list:
    return VARIABLES[option].parse_list(text)


def parse_sweep(options: dict) -> Sweep:
    """options: {k, temperature, top_k, top_p, draft, drafter} as given on the command line (strings; None: not
    given, its value left to the run configuration)."""
    k_text = str(options["k"]).strip().lower()
    k_auto = None
    if k_text == "auto" or k_text.startswith("auto:"):
        try:
            k_auto = int(k_text.split(":", 1)[1]) if ":" in k_text else AUTO_K_MAX
        except ValueError:
            raise DraftLabError(f"--k auto takes a largest k like auto:8 (got {options['k']!r})") from None
        if k_auto < 2:
            raise DraftLabError(f"--k auto needs a largest k of at least 2 (got {options['k']!r}); use e.g. --k auto:8")
    # An option not given (None: --drafter, whose default engine/config/run_config.py derives from the draft) is fixed
    # None.
    parsed = {
        name: [None] if text is None else [k_auto] if name == "k" and k_auto else _values(name, text)
        for name, text in options.items()
    }
    listed = [name for name, values in parsed.items() if len(values) > 1]
    batch_sizes = None
    # A grid: batch size is the outer axis, next to one other list or to `--k auto` (predicted at each batch size).
    if "batch_size" in listed and (len(listed) == 2 and not k_auto or listed == ["batch_size"] and k_auto):
        listed.remove("batch_size")
        batch_sizes = parsed["batch_size"]
    if k_auto and listed:
        raise DraftLabError(f"--k auto sweeps k itself; give {', '.join(VARIABLES[n].flag for n in listed)} one value")
    if len(listed) > 1:
        raise DraftLabError(
            f"sweep one variable at a time: {' and '.join(VARIABLES[n].flag for n in listed)} "
            f"{'both ' if len(listed) == 2 else 'all '}list values; "
            f"keep the list in one of them and give the others one value (--batch-size may list "
            f"values next to one other list: a grid)"
        )
    variable = listed[0] if listed else "k"
    fixed = {name: values[0] for name, values in parsed.items() if name != variable}
    return Sweep(variable, parsed[variable], fixed, k_auto, batch_sizes)
