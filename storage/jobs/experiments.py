"""Experiment creation: an experiment with its runs (a baseline per sampling configuration, one speculative run
per swept value), its frozen prompts, the `--k auto` confirmation pass and its predicted curve, and the verify
profile it is predicted from. Every run is created `queued`; storage/jobs/run_state.py moves them on.
"""

from __future__ import annotations

import inspect
import json
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import insert, select, text

from engine.config.run_config import DEFAULTS, PARAMETERS, RUN_PARAMETERS, RunConfig
from engine.config.variables import VARIABLES
from engine.errors import DraftLabError
from storage.db.errors import QueueError
from storage.db.schema import (
    BASELINE,
    NAME_CHARS,
    QUEUED,
    SPECULATIVE,
    Experiment,
    Run,
    batch_verify_profile,
    experiment_prompts,
    experiments,
    verify_profile,
)
from storage.db.store import Store

# The numeric settings every run stores (engine/config/run_config.py's parameters, k apart: it is checked as the sweep
# or as the fixed k), each with its default: the queue's last bounds check reads them.
SAMPLING_DEFAULTS = {
    name: DEFAULTS[name] for name in RUN_PARAMETERS if name != "k" and not PARAMETERS[name].categorical
}
SAMPLING_KEYS = tuple(SAMPLING_DEFAULTS)


def check_bounds(name: str | None, config: dict, repeats, sweep_variable: str, values: Sequence) -> None:
    """The queue's last check before anything is stored, whoever enqueues (the CLI and the form check the same
    descriptions earlier): every sampling setting, the repeats and each swept number within its bounds
    (engine/config/variables.py, with engine/config/limits.py's caps), at most the swept-values limit, the name within
    its column. A QueueError names the problem; SQLite and PostgreSQL never see a value one of them would refuse."""
    from engine.config.limits import check_all, limit, over
    from engine.config.variables import SETTINGS, VARIABLES
    from engine.errors import DraftLabError

    try:
        check_all()
    except DraftLabError as exc:  # a bad $DRAFTLAB_LIMIT_...
        raise QueueError(str(exc)) from None

    if name is not None and len(name) > NAME_CHARS:
        raise QueueError(
            f"the name is {len(name)} characters, longer than the {NAME_CHARS} an experiment's name "
            f"holds; give a shorter one"
        )
    for key, value in [*config.items(), ("repeats", repeats)]:
        described = VARIABLES.get(key) or SETTINGS[key]
        if not _number(value) or not described.in_range(value):
            raise QueueError(f"{key} {value!r} is not {described.meaning}")
    if len(values) > limit("swept_values"):
        raise QueueError(over("swept_values", len(values), "the sweep"))
    described = VARIABLES[sweep_variable]
    for value in [] if described.categorical else values:
        if not _number(value) or not described.in_range(value):
            raise QueueError(f"{sweep_variable} value {value!r} is not {described.meaning}")


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _normalize_tags(tags: Iterable[str] | str) -> str:
    items = tags.split(",") if isinstance(tags, str) else list(tags)
    cleaned = [t.strip() for t in items if t and t.strip()]
    return ",".join(dict.fromkeys(cleaned))


def enqueue_experiment(
    store: Store,
    *,
    name: str | None,
    target: str,
    draft: str,
    prompts: str,
    sampling: dict,
    device: str = "auto",
    dtype: str = "auto",
    sweep_variable: str = "k",
    sweep_values: Sequence[float | str] = (1, 2, 4),  # numbers, or a categorical variable's names
    k: int = 4,
    notes: str = "",
    tags: Iterable[str] | str = (),
    prompt_texts: Sequence[str] | None = None,
    trust_remote_code: bool = False,
    reserved_for: str | None = None,
    repeats: int = 1,
    k_auto: int | None = None,
    drafter: str | None = None,
    validates: int | None = None,
    chat_template: str = "auto",
    draft_sampling: str = "probabilistic",
    launched_by: str | None = None,
    batch_sizes: Sequence[int] | None = None,
    **settings,
) -> int:
    """Create an experiment with its target-only baseline(s) and one speculative run per sweep value, all
    queued; return the experiment id. A k sweep shares one baseline; a sampling sweep gets one per value
    (speedup compares equal sampling configs); a draft or drafter sweep shares one baseline, each run naming its
    draft model and drafter spec. prompt_texts freezes the prompts now (else the worker loads
    the `prompts` spec when the first run starts). reserved_for: only that worker may claim the runs.
    repeats: timed decodes per prompt and arm (medians used). k_auto: "predict, then confirm" up to that k —
    only the baseline and k = k_auto are queued; the worker predicts the curve and queues the best k values.
    chat_template: how conversation prompts become text (engine/text/chat.py): auto, none, or a template's text.
    batch_sizes: a grid (`--batch-size 1,4,16 --k 1,2,3,4`): the whole sweep, baselines included, once at each
    batch size (the one allowed outer axis), each batch size's runs paired with its own baseline. `settings`: any
    other described parameter by name (engine/config/run_config.py's PARAMETERS; RunConfig.enqueue() writes them all).
    drafter None: the draft decides (engine/config/run_config.py default_drafter: eagle3 for an EAGLE-3 head, else
    model)."""
    if int(repeats) < 1:
        raise QueueError(f"repeats must be >= 1 (got {repeats}); use e.g. --repeats 3")
    if k_auto is not None:
        if int(k_auto) < 2:
            raise QueueError(f"--k auto needs a largest k of at least 2 (got {k_auto}); use e.g. --k auto or auto:8")
        sweep_variable, sweep_values, k = "k", [int(k_auto)], int(k_auto)
    swept = VARIABLES.get(sweep_variable)  # engine/config/variables.py: the one description of each swept variable
    if swept is None:
        raise QueueError(f"cannot sweep {sweep_variable!r}; sweep one of {', '.join(VARIABLES)}")
    values: list[Any] = list(sweep_values)  # numbers, or a categorical variable's names
    if not values:
        raise QueueError("sweep_values is empty; give at least one value, e.g. k = 1, 2, 4")
    unknown = (set(sampling) | set(settings)) - set(RUN_PARAMETERS)
    if unknown:
        raise QueueError(f"unknown sampling settings {sorted(unknown)}; use {', '.join(RUN_PARAMETERS)}")
    if swept.categorical:
        values = [str(v).strip() for v in values]
        if any(not v for v in values) or len(set(values)) < len(values):
            raise QueueError(f"{sweep_variable} values must be distinct and non-empty (got {values})")
    numbers = {key: value for key, value in {**SAMPLING_DEFAULTS, **sampling}.items() if key in SAMPLING_KEYS}
    check_bounds(name, numbers, repeats, sweep_variable, values)
    _grid_sizes(batch_sizes, sweep_variable, numbers)
    launch = dict(
        target=target,
        draft=draft,
        prompts=prompts,
        sampling=sampling,
        device=device,
        dtype=dtype,
        sweep_variable=sweep_variable,
        sweep_values=values,
        k=k,
        trust_remote_code=trust_remote_code,
        repeats=repeats,
        k_auto=k_auto,
        drafter=drafter,
        chat_template=chat_template,
        draft_sampling=draft_sampling,
        batch_sizes=batch_sizes,
        **settings,
    )
    try:  # engine/config/run_config.py: every parameter parsed and bounded by its one description
        config = RunConfig.from_enqueue(launch)
    except DraftLabError as exc:
        raise QueueError(str(exc)) from None
    values = list(config.values)
    sizes = list(config.batch_sizes or [config.value("batch_size")])
    launched_by = launched_by[:200] if launched_by else None
    largest = max(values) if sweep_variable == "batch_size" else max(sizes)
    if prompt_texts is not None and int(largest) > len(prompt_texts):
        raise QueueError(
            f"batch size {largest} needs at least {largest} prompts but the prompt set has "
            f"{len(prompt_texts)}; use a batch size of {len(prompt_texts)} or less, or more prompts"
        )
    columns = config.experiment_columns()
    name = name or f"{columns['draft']} → {target} on {prompts}"[:NAME_CHARS]
    with store.session() as s:
        exp = Experiment(
            name=name,
            notes=notes or "",
            tags=_normalize_tags(tags),
            validates=validates,
            launched_by=launched_by,
            **columns,
        )
        s.add(exp)
        s.flush()
        common = {"experiment_id": exp.id, "status": QUEUED, "reserved_for": reserved_for}
        new_runs = ((1 + len(values)) if not swept.per_value_baseline else 2 * len(values)) * len(sizes)
        check_launcher_cap(s.connection(), launched_by, new_runs)
        for size in sizes:  # one batch size unless a grid: the sweep, baselines included, at each
            at_size = config.with_values(batch_size=size) if config.batch_sizes else config
            if not swept.per_value_baseline:  # k, draft, drafter: the target decodes alike, one shared baseline
                baseline = Run(kind=BASELINE, k=None, sweep_value=None, **common, **at_size.run_settings(baseline=True))
                s.add(baseline)
                s.flush()
                for i, v in enumerate(values):
                    s.add(
                        Run(
                            kind=SPECULATIVE,
                            sweep_value=swept.sweep_value(v, i),
                            sweep_label=swept.show(v),
                            baseline_run_id=baseline.id,
                            **common,
                            **at_size.run_settings(v),
                        )
                    )
            else:  # a sampling setting: one baseline per value (speedup compares equal sampling configs)
                for i, v in enumerate(values):
                    baseline = Run(
                        kind=BASELINE,
                        k=None,
                        sweep_value=swept.sweep_value(v, i),
                        **common,
                        **at_size.run_settings(v, baseline=True),
                    )
                    s.add(baseline)
                    s.flush()
                    s.add(
                        Run(
                            kind=SPECULATIVE,
                            sweep_value=swept.sweep_value(v, i),
                            sweep_label=swept.show(v),
                            baseline_run_id=baseline.id,
                            **common,
                            **at_size.run_settings(v),
                        )
                    )
        if prompt_texts is not None:
            s.flush()
            s.execute(
                insert(experiment_prompts),
                [{"experiment_id": exp.id, "prompt_index": i, "prompt": p} for i, p in enumerate(prompt_texts)],
            )
        return exp.id


def _grid_sizes(batch_sizes, sweep_variable: str, config: dict) -> list[int]:
    """The batch sizes the sweep runs at: the grid's outer axis (each a whole number within batch_size's bounds,
    each once, sorted), else the one fixed batch size."""
    if batch_sizes is None:
        return [int(config["batch_size"])]
    described = VARIABLES["batch_size"]
    sizes = list(batch_sizes)
    if sweep_variable == "batch_size":
        raise QueueError(
            "a grid sweeps another variable at each batch size; give the batch sizes as the sweep "
            "(sweep_variable batch_size) or as batch_sizes, not both"
        )
    if not sizes or any(not _number(v) or v != int(v) or not described.in_range(v) for v in sizes):
        raise QueueError(f"batch_sizes {sizes!r} must be whole numbers, each {described.meaning}")
    if len(set(int(v) for v in sizes)) < len(sizes):
        raise QueueError(f"batch_sizes {sizes!r} lists a batch size twice; list each once")
    from engine.config.limits import limit, over

    if len(sizes) > limit("swept_values"):
        raise QueueError(over("swept_values", len(sizes), "the batch sizes"))
    return sorted(int(v) for v in sizes)


def check_launcher_cap(conn, launched_by: str | None, new_runs: int) -> None:
    """Refuse (QueueError) work that would take `launched_by` past limit("queued_runs") unfinished runs (queued or
    running, over all its experiments; each unfinished training job or confirm counts as one). None: not attributed,
    no cap."""
    from engine.config.limits import LIMITS, limit

    if not launched_by:
        return
    pending = conn.execute(
        text(
            "SELECT COUNT(*) FROM runs r JOIN experiments e ON e.id = r.experiment_id "
            "WHERE e.launched_by = :who AND r.status IN ('queued', 'running')"
        ),
        {"who": launched_by},
    ).scalar()
    for jobs in ("training_jobs", "server_confirms"):  # a training job or a confirm counts as one run
        pending += conn.execute(
            text(f"SELECT COUNT(*) FROM {jobs} WHERE launched_by = :who AND status IN ('queued', 'running')"),
            {"who": launched_by},
        ).scalar()
    cap = limit("queued_runs")
    if pending + new_runs > cap:
        raise QueueError(
            f"{launched_by} has {pending} unfinished runs queued and this adds {new_runs}, more than the "
            f"limit of {cap} per launcher: wait for them or cancel some (whoever runs the dashboard can "
            f"raise it with ${LIMITS['queued_runs'].env})"
        )


DUPLICATE_WINDOW_SECONDS = 120  # a second Launch of the same settings within this links to the first


def recent_duplicate(store: Store, launch: dict, window_seconds: float = DUPLICATE_WINDOW_SECONDS) -> int | None:
    """The id of an experiment queued in the last `window_seconds` with exactly the settings `launch` (the keyword
    arguments of enqueue_experiment) would queue again, or None: the dashboard links to it instead of queuing a
    copy when Launch is pressed twice. The key is engine/config/run_config.py's (everything but the labels: name, notes
    and tags do not count); an upload counts by its content (its saved path holds the content's hash)."""
    from datetime import timedelta

    from storage.db.schema import utcnow

    # What enqueue_experiment would queue: its own defaults for what `launch` leaves out (repeats 1, k 4, ...).
    defaults = {
        p.name: p.default for p in inspect.signature(enqueue_experiment).parameters.values() if p.default is not p.empty
    }
    wanted = RunConfig.from_enqueue({**defaults, **launch}).key()
    since = utcnow() - timedelta(seconds=window_seconds)
    query = (
        select(experiments)
        .where(
            experiments.c.created >= since, experiments.c.validates.is_(None), experiments.c.target == launch["target"]
        )
        .order_by(experiments.c.id.desc())
    )
    with store.read() as conn:
        rows = conn.execute(query).mappings().all()
    for row in rows:
        try:
            if RunConfig.from_experiment(row).key() == wanted:
                return int(row["id"])
        except DraftLabError:  # a row no longer valid under today's bounds is no duplicate of a valid launch
            continue
    return None


def add_k_runs(store: Store, experiment_id: int, ks: Sequence[int], batch_size: int | None = None) -> list[int]:
    """Queue a new timed pass of an experiment: a fresh baseline and one speculative run per k, paired with
    it (the confirmation step of `--k auto`), at `batch_size` (default: the experiment's); reserved like the
    experiment's first runs. Returns run ids."""
    exp = get_experiment(store, experiment_id)
    if exp is None:
        raise QueueError(f"no experiment {experiment_id}")
    with store.read() as conn:
        reserved = conn.execute(
            text("SELECT reserved_for FROM runs WHERE experiment_id = :eid ORDER BY id LIMIT 1"), {"eid": experiment_id}
        ).scalar()
    config = RunConfig.from_experiment(exp)
    if batch_size is not None:
        config = config.with_values(batch_size=int(batch_size))
    common = {"experiment_id": experiment_id, "status": QUEUED, "reserved_for": reserved}
    with store.session() as s:
        baseline = Run(kind=BASELINE, k=None, sweep_value=None, **common, **config.run_settings(baseline=True))
        s.add(baseline)
        s.flush()
        added = [
            Run(
                kind=SPECULATIVE,
                sweep_value=int(k),
                sweep_label=str(int(k)),
                baseline_run_id=baseline.id,
                **common,
                **config.run_settings(int(k)),
            )
            for k in ks
        ]
        s.add_all(added)
        s.flush()
        return [baseline.id] + [r.id for r in added]


def set_predicted_curve(
    store: Store,
    experiment_id: int,
    curve: dict,
    confirmed: Sequence[int],
    by_batch_size: Mapping[int, tuple[Mapping[int, float], Sequence[int]]] | None = None,
) -> None:
    """Store `--k auto`'s predicted curve and the k values queued to confirm it. A grid (or any batch size above
    1) passes by_batch_size {B: (curve, confirmed)}: stored under "by_batch_size" {"B": {"curve", "confirmed"}},
    with curve / confirmed the smallest batch size's (what a reader of one curve shows)."""
    doc = {"curve": {str(k): v for k, v in curve.items()}, "confirmed": list(confirmed)}
    if by_batch_size:
        doc["by_batch_size"] = {
            str(b): {"curve": {str(k): v for k, v in c.items()}, "confirmed": list(ks)}
            for b, (c, ks) in sorted(by_batch_size.items())
        }
    with store.write() as conn:
        conn.execute(
            text("UPDATE experiments SET predicted_curve = :c WHERE id = :eid"),
            {"c": json.dumps(doc), "eid": experiment_id},
        )


def store_prompts(store: Store, experiment_id: int, prompts: Sequence[str]) -> list[str]:
    """Freeze an experiment's prompt texts (first writer wins); return the stored ones."""
    with store.write() as conn:
        existing = load_experiment_prompts(conn, experiment_id)
        if existing is None:
            conn.execute(
                insert(experiment_prompts),
                [{"experiment_id": experiment_id, "prompt_index": i, "prompt": p} for i, p in enumerate(prompts)],
            )
            return list(prompts)
        return existing


def load_experiment_prompts(conn, experiment_id: int) -> list[str] | None:
    rows = (
        conn.execute(
            text("SELECT prompt FROM experiment_prompts WHERE experiment_id = :eid ORDER BY prompt_index"),
            {"eid": experiment_id},
        )
        .scalars()
        .all()
    )
    return list(rows) if rows else None


def get_experiment(store: Store, experiment_id: int) -> dict | None:
    with store.read() as conn:
        row = conn.execute(select(experiments).where(experiments.c.id == experiment_id)).mappings().first()
        return dict(row) if row else None


def store_verify_profile(store: Store, experiment_id: int, profile: dict[int, float]) -> None:
    with store.write() as conn:
        conn.execute(text("DELETE FROM verify_profile WHERE experiment_id = :eid"), {"eid": experiment_id})
        conn.execute(
            insert(verify_profile),
            [{"experiment_id": experiment_id, "n": int(n), "seconds": float(t)} for n, t in sorted(profile.items())],
        )


def load_verify_profile(store: Store, experiment_id: int) -> dict[int, float]:
    with store.read() as conn:
        return {
            int(n): float(t)
            for n, t in conn.execute(
                text("SELECT n, seconds FROM verify_profile WHERE experiment_id = :eid ORDER BY n"),
                {"eid": experiment_id},
            )
        }


def store_verify_profiles(store: Store, experiment_id: int, profiles: dict[int, dict[int, float]]) -> None:
    """The batched verify-cost profile {batch size: {n: seconds}} (engine.decoding.profile.batched_verify_profile)."""
    with store.write() as conn:
        conn.execute(text("DELETE FROM batch_verify_profile WHERE experiment_id = :eid"), {"eid": experiment_id})
        conn.execute(
            insert(batch_verify_profile),
            [
                {"experiment_id": experiment_id, "batch_size": int(b), "n": int(n), "seconds": float(t)}
                for b, profile in sorted(profiles.items())
                for n, t in sorted(profile.items())
            ],
        )


def load_verify_profiles(store: Store, experiment_id: int) -> dict[int, dict[int, float]]:
    """{batch size: {n: seconds}}: the batched profile where one was measured, else the batch-1 loop's profile
    as batch size 1; empty when neither was."""
    profiles: dict[int, dict[int, float]] = {}
    with store.read() as conn:
        for b, n, t in conn.execute(
            text(
                "SELECT batch_size, n, seconds FROM batch_verify_profile "
                "WHERE experiment_id = :eid ORDER BY batch_size, n"
            ),
            {"eid": experiment_id},
        ):
            profiles.setdefault(int(b), {})[int(n)] = float(t)
    if profiles:
        return profiles
    single = load_verify_profile(store, experiment_id)
    return {1: single} if single else {}
