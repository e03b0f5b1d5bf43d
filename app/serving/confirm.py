"""A confirm: the experiment's chosen configuration(s) measured in the engine that will serve them (vLLM), next to the
lab's figures (SPEC "Confirm in a serving engine"); run by `draftlab confirm` (app/commands/confirm.py) and by a worker
for a confirm queued from the dashboard (app/serving/confirm_job.py).

One target-only server and one server per distinct configuration, each started with exactly the
`--speculative-config` that `draftlab export --format deploy` holds (storage/serving/deploy.py), or attached to with
--server / --baseline-server. Runs whose configurations are identical (the same target, speculative config and
request: k 1 at batch 1 and k 1 at batch 4) are served once, the one measurement standing for each of them
(`served_once`). Both servers stay up while a configuration is measured, and the passes alternate: at each
concurrency, baseline pass, speculative pass, baseline pass, … (A B A B), every pass sending each of the experiment's
stored prompts (the lab's rendered texts) once as a streaming completion with the experiment's sampling settings and
max new tokens, closed loop (app/serving/completions_load.py). Where the two servers cannot both fit on the device
(`one_at_a_time`: `--one-server-at-a-time`, or $DRAFTLAB_ONE_SERVER_AT_A_TIME=1 for a worker's queued confirms), only
one is up at a time: per pass, the target-only server, then restarted as the speculative one, in the order A B B A
A B … (each server's pass i beside the other's; a server that ends one pass and begins the next stays up), every
concurrency's pass i on each start, the same passes and storage. The speculative server's /metrics is scraped around
every pass (app/serving/production_scrape.py). Each configuration is stored when all its passes are done
(storage/records/confirms.py), with the speedup predicted for each of its cells from a server cost profile other
than this confirm (storage/serving/cell_predictions.py) beside it; one that fails (the server does not
start, dies, a request times out, no counters) is reported in one line and the others are kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from engine.errors import DraftLabError

if TYPE_CHECKING:
    from app.serving.production_scrape import SpecCounters

DEFAULT_REPEATS = 3  # passes per server and concurrency: the fewest that give the paired speedup an interval
DIED_WAIT_SECONDS = 5.0  # a request cut off mid-answer is seen before its server's exit is: wait this long for it
ONE_AT_A_TIME_ENV = "DRAFTLAB_ONE_SERVER_AT_A_TIME"  # "1": a worker's confirms serve one server at a time


@dataclass
class Config:
    """One speculative configuration to serve: exactly the deploy export's vLLM settings."""

    label: str
    k: int
    run_id: int  # the lab run its drafter is (its outputs: the same at any k, speculation being lossless)
    speculative_config: str
    request: dict
    target: str
    target_name: str = ""  # as the experiment names it (a profile's `target`): the demo name, HF id or folder
    lab_k: int | None = None  # a profile's: the run's own k (another k is stored without the run: no lab figure)
    run_ids: list[int] = field(default_factory=list)  # every run it stands for (`served_once`); empty: run_id's alone

    @property
    def runs(self) -> list[int]:
        return self.run_ids or [self.run_id]


@dataclass
class Measured:
    """One server's passes at one concurrency, with the speculative server's counters summed over them."""

    passes: list = field(default_factory=list)
    counters: SpecCounters | None = None


def configurations(store, experiment_id: int, which: str) -> list[Config]:
    """The configurations to confirm, each from storage/serving/deploy.py's deploy document (the one vLLM mapping), as
    storage/serving/confirm_jobs.py's confirm_documents selects them (the queue's check makes the same selection)."""
    from engine.zoo import resolve
    from storage.db.errors import QueueError
    from storage.records import queries as q
    from storage.serving.confirm_jobs import confirm_documents
    from storage.serving.deploy import DeployError

    def config(doc: dict, label: str) -> Config:
        vllm = doc["engines"]["vllm"]
        request = {**vllm["request"], "max_tokens": int(doc["measured"]["max_new_tokens"])}
        target = doc["configuration"]["target"]
        path = resolve(target)
        return Config(
            label=label,
            k=int(json.loads(vllm["speculative_config"])["num_speculative_tokens"]),
            run_id=int(doc["run_id"]),
            speculative_config=vllm["speculative_config"],
            request=request,
            target=str(path) if path is not None else target,
            target_name=target,
        )

    # Checked, not caught: a KeyError from the deploy mapping (a drafter without one) is a bug, never "no experiment".
    if q.experiment(store, experiment_id) is None:
        raise DraftLabError(f"no experiment {experiment_id}; `draftlab list` shows the ids")
    try:
        return served_once([config(doc, label) for label, doc in confirm_documents(store, experiment_id, which)])
    except QueueError as exc:
        raise DraftLabError(str(exc)) from None
    except DeployError as exc:
        raise DraftLabError(_refusal(exc)) from None


def served_once(configs: list[Config]) -> list[Config]:
    """Identical configurations served once: those with the same target, speculative config (as JSON) and request
    (sampling, max tokens) are one server, the first one's, standing for every run of them in order (`run_ids`; a
    `run N` label becomes `runs N, M`). k 1 at batch 1 and k 1 at batch 4 are one configuration: the batch size is
    the concurrency the server is measured at, not a server setting."""
    merged: dict[tuple[str, str, str], Config] = {}
    for c in configs:
        key = (
            c.target,
            json.dumps(json.loads(c.speculative_config), sort_keys=True),
            json.dumps(c.request, sort_keys=True),
        )
        if key in merged:
            merged[key].run_ids.append(c.run_id)
        else:
            merged[key] = replace(c, run_ids=[c.run_id])
    out = list(merged.values())
    for c in out:
        if len(c.run_ids) > 1 and c.label == f"run {c.run_id}":
            c.label = runs_label(c.run_ids)
    return out


def runs_label(run_ids: list[int]) -> str:
    """`runs 3, 5` (six at most by number, then how many more: a label is at most 200 characters, and the first id
    alone keeps it unique, each run being served by one configuration)."""
    shown = ", ".join(str(r) for r in run_ids[:6])
    return f"runs {shown}" + (f" and {len(run_ids) - 6} more" if len(run_ids) > 6 else "")


def _refusal(exc) -> str:
    """A deploy refusal in confirm's words: where the verdict chooses no run, export's hint names its own flags
    (--run, --batch-size); confirm's is --configs."""
    from storage.serving.deploy import NoChosenRun

    if isinstance(exc, NoChosenRun):
        return f"{exc.reason}; `--configs all` confirms every finished lossless run"
    return str(exc)


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C and SIGTERM wait while the servers stop and the confirm is stored (a second Ctrl-C must not cut that
    short: a server left running, a row left `running`), and are delivered after. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: caught.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


def _recorder(store, confirm_id: int):
    """VllmServer.start's on_launch: each server this confirm starts is written to its row as soon as it exists
    (storage/confirm_jobs.record_servers), so a sweep ends it should this process die with the watchdogs. A write
    the database refuses leaves that to the watchdog alone."""
    from sqlalchemy.exc import SQLAlchemyError

    from storage.serving.confirm_jobs import record_servers

    started: list = []

    def record(server) -> None:
        started.append(server.tree_id())
        try:
            record_servers(store, confirm_id, started)
        except SQLAlchemyError:
            pass

    return record


def pass_seeds(request: dict, prompts: int, concurrency: int, repeat: int, speculative: bool) -> list[int] | None:
    """Under sampling with a seed, each request's own seed, from the experiment's, the server, the concurrency, the
    pass and the prompt: one seed for every request (the deploy export's) seeds each request's generator alike in
    vLLM, so every prompt's answer would draw on one noise sequence (seed 1: vLLM 0.32's CPU server ended every
    prompt at its first token), and the passes would repeat each other; the sampled-output tests need independent
    answers (engine/metrics/sampled_outputs.py). None when greedy or unseeded (the server draws its own)."""
    if "seed" not in request or float(request.get("temperature") or 0) <= 0:
        return None
    key = f"{request['seed']}:{int(speculative)}:{concurrency}:{repeat}"
    return [zlib.crc32(f"{key}:{i}".encode()) & 0x7FFFFFFF for i in range(prompts)]


def _measure_pass(
    server,
    prompts,
    request,
    concurrency,
    timeout,
    progress,
    counted: bool,
    measured: Measured,
    seeds: list[int] | None = None,
):
    """One pass on one server (`seeds`: `pass_seeds`); the speculative one's counters are scraped before and after
    and summed."""
    from app.serving.completions_load import RequestFailed, run_pass
    from app.serving.production_scrape import parse, read_source

    try:
        before = parse(read_source(server.metrics_url()), server.metrics_url()) if counted else None
        record = run_pass(
            server.url,
            server.model,
            prompts,
            request,
            concurrency,
            timeout,
            on_request=progress.request_done,
            seeds=seeds,
        )
        after = parse(read_source(server.metrics_url()), server.metrics_url()) if counted else None
    except RequestFailed as exc:
        raise DraftLabError(server.died(wait=DIED_WAIT_SECONDS) or f"{server.name} server: {exc}") from None
    except DraftLabError as exc:  # a scrape: the server died, or it has no counters
        raise DraftLabError(server.died() or str(exc)) from None
    # the pass's engine steps after the first token: the drafts counter (one a request and step) when speculative,
    # one a token for the target alone (a profile's step cost: storage/serving/profiles.py)
    record.decode_steps = record.decode()[1] if not counted else None
    if before is not None and after is not None:  # counted
        delta = after.minus(before, server.metrics_url())
        record.decode_steps = delta.drafts
        if measured.counters is None:
            measured.counters = delta
        else:
            total = measured.counters
            total.drafts += delta.drafts
            total.draft_tokens += delta.draft_tokens
            total.accepted += delta.accepted
            for j, n in delta.per_position.items():
                total.per_position[j] = total.per_position.get(j, 0) + n
    measured.passes.append(record)


def _warm_up(server, prompts, request, timeout) -> None:
    """One untimed request before a server's first timed pass (the lab's timing protocol: an untimed warm-up)."""
    from app.serving.completions_load import RequestFailed, run_pass

    try:
        run_pass(
            server.url, server.model, prompts[:1], {**request, "max_tokens": min(8, request["max_tokens"])}, 1, timeout
        )
    except RequestFailed as exc:
        raise DraftLabError(server.died(wait=DIED_WAIT_SECONDS) or f"{server.name} server (warm-up): {exc}") from None


def _outputs(passes) -> dict[int, list[int]]:
    return {r.prompt_index: r.token_ids for r in passes[0].requests} if passes else {}


def _sampled_comparison(base: Measured, spec: Measured) -> dict:
    """The sampled outputs of the two servers, prompt by prompt over their passes
    (engine/metrics/sampled_outputs.py)."""
    from engine.metrics.sampled_outputs import compare_sampled

    sides = []
    for measured in (spec, base):
        answers: dict[int, list] = {}
        for p in measured.passes:
            for r in p.requests:
                answers.setdefault(r.prompt_index, []).append(r)
        sides.append(answers)
    prompts = sorted(set(sides[0]) & set(sides[1]))
    with_ids = all(r.token_ids or not r.new_tokens for side in sides for i in prompts for r in side[i])
    lengths = [[[r.new_tokens for r in side[i]] for i in prompts] for side in sides]
    ids = [[[r.token_ids for r in side[i]] for i in prompts] for side in sides] if with_ids else [None, None]
    return compare_sampled(lengths[0], lengths[1], ids[0], ids[1])


def _store_config(
    store,
    confirm_id,
    eid,
    config: Config,
    concurrency: int,
    base: Measured,
    spec: Measured,
    greedy: bool,
    predicted: dict | None = None,
) -> None:
    from storage.records.confirms import add_measurement, lab_outputs, outputs_match, pass_speedup, summarize

    matches: dict[str, float | str | None] = {
        "outputs_match_server_baseline": None,
        "outputs_match_lab": None,
        "first_divergence": None,
    }
    outputs_test = None if greedy else _sampled_comparison(base, spec)
    if greedy:
        server, lab = _outputs(spec.passes), lab_outputs(store, config.run_id)
        share, first = outputs_match(server, _outputs(base.passes), "the server's baseline")
        lab_share, lab_first = outputs_match(server, lab, "the lab")
        matches = {
            "outputs_match_server_baseline": share,
            "outputs_match_lab": lab_share,
            "first_divergence": "; ".join(x for x in (first, lab_first) if x) or None,
        }
    add_measurement(
        store,
        confirm_id,
        eid,
        label=config.label,
        k=config.k,
        run_id=config.run_id if config.lab_k in (None, config.k) else None,  # beside the lab at the run's own k only
        speculative_config=config.speculative_config,
        concurrency=concurrency,
        passes=spec.passes,
        figures=summarize(spec.passes),
        speedup=pass_speedup(base.passes, spec.passes),
        counters=spec.counters,
        matches=matches,
        outputs_test=outputs_test,
        baseline_tokens_per_second=summarize(base.passes)["tokens_per_second"],
        run_ids=config.runs if config.lab_k in (None, config.k) else None,
        predicted=predicted,
    )


class _Predictions:
    """Each confirmed cell's prediction, read before the cell is stored (storage/serving/cell_predictions.py): from a
    profile other than this confirm, with the acceptance of the covered run measured at a batch size equal to the
    concurrency (else the configuration's first run), at the k vLLM serves there. A schedule whose k changes below
    the concurrency (the batch drains from it to 1) is one no single k predicts: None."""

    def __init__(self, store, experiment_id: int, confirm_id: int):
        from storage.records import queries as q

        self.store, self.confirm_id = store, confirm_id
        self.cache: dict = {}
        runs = q.runs(store, experiment_id)
        self.batch = {int(r): int(b) for r, b in zip(runs["run_id"], runs["batch_size"]) if b == b and b is not None}

    def __call__(self, config: Config, concurrency: int) -> dict | None:
        from storage.records.confirms import comparable_positions, server_k
        from storage.records.server_costs import drafter_fingerprint
        from storage.serving.cell_predictions import cell_prediction

        spec = json.loads(config.speculative_config)
        k = server_k(spec, concurrency)
        if k < 1 or comparable_positions(spec, concurrency) != k:
            return None
        run = next((r for r in config.runs if self.batch.get(r) == concurrency), config.run_id)
        return cell_prediction(
            self.store,
            run,
            config.target_name or config.target,
            drafter_fingerprint(config.speculative_config),
            k,
            concurrency,
            exclude=self.confirm_id,
            cache=self.cache,
        )


@dataclass
class Plan:
    """What one confirm measures, checked before any server starts (the CLI's flags or a queued confirm's row)."""

    experiment_id: int
    configs: list[Config]
    prompts: list[str]
    concurrency: list[int]
    repeats: int
    greedy: bool
    command_line: str
    server: str | None = None  # attach to these instead of starting servers
    baseline_server: str | None = None
    startup_timeout: float = 600.0
    request_timeout: float = 300.0
    one_at_a_time: bool = False  # the two servers never up together: restarted in turn (the module's docstring)

    @property
    def requests(self) -> int:
        """Requests the whole confirm sends (warm-ups aside): every prompt once per pass, two servers."""
        return len(self.configs) * len(self.concurrency) * self.repeats * 2 * len(self.prompts)


def plan(
    store,
    eid: int,
    which: str,
    *,
    concurrency: list[int] | None = None,
    repeats: int = DEFAULT_REPEATS,
    vllm: str | None = None,
    server: str | None = None,
    baseline_server: str | None = None,
    startup_timeout: float = 600.0,
    request_timeout: float = 300.0,
    chosen: list[Config] | None = None,
    one_at_a_time: bool | None = None,
) -> Plan:
    """The confirm's configurations (`which`'s, or `chosen`: a profile's, app/serving/profile.py), prompts and
    concurrency; bad input raises DraftLabError (one line). `one_at_a_time` None: $DRAFTLAB_ONE_SERVER_AT_A_TIME
    ("1": on; a worker's queued confirms read it, the machine's device deciding whether two servers fit)."""
    from app.serving.cpu_block import refuse_block_on_cpu_build
    from app.serving.urls import http_url
    from app.serving.vllm_server import LOCAL_VENV_PYTHON, command_argv, default_command
    from storage.jobs.experiments import load_experiment_prompts
    from storage.records import queries as q

    if (server is None) != (baseline_server is None):
        raise DraftLabError(
            "--server and --baseline-server go together: the speculative server and the same model "
            "served without speculation"
        )
    if server is not None and vllm is not None:
        raise DraftLabError("--vllm starts servers, --server attaches to running ones: give one of them")
    if one_at_a_time is None:
        one_at_a_time = _one_at_a_time_env(server is not None)
    if one_at_a_time and server is not None:
        raise DraftLabError(
            "--one-server-at-a-time restarts the servers DraftLab starts; --server and --baseline-server attach to "
            "servers of yours: give one or the other"
        )
    command_line = vllm if vllm is not None else default_command()
    if server is not None and baseline_server is not None:  # attach (the check above: both or neither)
        http_url(server, "--server")
        http_url(baseline_server, "--baseline-server")
    else:  # the command that will start the servers splits into a program and its arguments
        command_argv(command_line, "--vllm" if vllm is not None else "$DRAFTLAB_VLLM")
    experiment = q.experiment(store, eid)
    if experiment is None:
        raise DraftLabError(f"no experiment {eid} in {store.safe_url}; `draftlab list` shows the ids")
    with store.read() as conn:
        prompts = load_experiment_prompts(conn, eid)
    if not prompts:
        raise DraftLabError(
            f"experiment {eid} has no stored prompts yet (it never ran): run it first, e.g. "
            f"`draftlab worker` or `draftlab resume {eid}`"
        )
    configs = chosen if chosen is not None else configurations(store, eid, which)
    if (
        server is None
    ):  # a sampled block run on the CPU build would measure the standard rule (app/serving/cpu_block.py)
        refuse_block_on_cpu_build(command_argv(command_line), configs, LOCAL_VENV_PYTHON)
    if server is not None and len(configs) > 1:
        raise DraftLabError(
            f"--server is one speculative server; --configs {which} names {len(configs)} "
            f"configurations: use --configs chosen, or let DraftLab start the servers"
        )
    return Plan(
        experiment_id=eid,
        configs=configs,
        prompts=prompts,
        concurrency=concurrency or q.grid_sizes(experiment) or [int(experiment.get("batch_size") or 1)],
        repeats=repeats,
        greedy=float(experiment.get("temperature") or 0.0) <= 0,
        command_line=command_line,
        server=server,
        baseline_server=baseline_server,
        startup_timeout=startup_timeout,
        request_timeout=request_timeout,
        one_at_a_time=one_at_a_time,
    )


def _one_at_a_time_env(attached: bool) -> bool:
    """$DRAFTLAB_ONE_SERVER_AT_A_TIME: "1" on, "0" or unset off (servers attached to: off, they are not ours);
    anything else is one line naming it."""
    value = os.environ.get(ONE_AT_A_TIME_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise DraftLabError(f"${ONE_AT_A_TIME_ENV} is {value[:40]!r}; set it to 1 (one server at a time) or 0")
    return value == "1" and not attached


def unexpected(exc: BaseException) -> str:
    """An exception no check foresaw, in one line: what it is, where it was raised, and that it is DraftLab's bug."""
    import traceback
    from pathlib import Path

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return (
        f"unexpected {type(exc).__name__}{where}: {first}; the confirm is stored as failed; please report this "
        f"line (it is a bug in DraftLab)"
    )


class _Servers:
    """The servers of one confirm: started (or attached to) and warmed up, counted, and stopped, with the passes of
    one configuration measured on them. Together: the target-only server stays up through the confirm and each
    configuration's server beside it. One at a time: only one is ever up, restarted in the order A B B A A B …"""

    def __init__(self, plan: Plan, record, progress):
        self.plan, self.record, self.progress = plan, record, progress
        self.live: list = []  # started (or attached) and not yet stopped
        self.starts = 0  # VllmServer.start calls, restarts included (a port retried inside one start: one)
        self.version = ""
        self.baseline: Any = None  # the target-only server while it is up
        self.baseline_lost = False  # it failed (died, did not start): no target-only server for what is left

    def _up(self, config: Config, speculative: bool):
        """A server for `config` (speculative: with its config; else the target alone), started and warmed up."""
        from app.serving.vllm_server import VllmServer

        name = f"{config.label} (k={config.k})" if speculative else "target-only"
        self.progress.describe(f"starting the {name} server")
        url = self.plan.server if speculative else self.plan.baseline_server
        if url is not None:
            server = (
                VllmServer.attach(config.label, url)
                if speculative
                else VllmServer.attach("target-only", url, "--baseline-server")
            )
        else:
            self.starts += 1
            server = VllmServer.start(
                name,
                self.plan.command_line,
                config.target,
                config.speculative_config if speculative else None,
                startup_timeout=self.plan.startup_timeout,
                on_launch=self.record,
            )
        self.live.append(server)
        if not speculative:
            self.baseline = server
        if not self.version:
            self.version = server.version()
        try:
            _warm_up(server, self.plan.prompts, config.request, self.plan.request_timeout)
        except DraftLabError:
            self.stop(server)  # never left up beside the next one
            raise
        return server

    def stop(self, server) -> None:
        if server is None or server not in self.live:
            return
        with _signals_deferred():
            server.stop()
            self.live.remove(server)
        if server is self.baseline:
            self.baseline = None

    def stop_all(self) -> None:
        for server in list(self.live):
            self.stop(server)

    def target_only(self, config: Config):
        """Together: the target-only server, started once for the whole confirm (its failure is the confirm's)."""
        return self._up(config, speculative=False)

    def measure(self, config: Config) -> list[tuple[int, Measured, Measured]]:
        """Every concurrency's passes of one configuration on both servers: [(concurrency, target-only passes,
        speculative passes)]. A DraftLabError (one line) when a server fails; `baseline_lost` says whether it was
        the target-only one."""
        if self.plan.one_at_a_time:
            return self._one_at_a_time(config)
        spec = None
        try:
            spec = self._up(config, speculative=True)
            results = []
            for c in self.plan.concurrency:
                base, measured = Measured(), Measured()
                for repeat in range(self.plan.repeats):
                    self.progress.describe(f"{config.label} concurrency {c} pass {repeat + 1}/{self.plan.repeats}")
                    self._pass(self.baseline, config, c, repeat, base, speculative=False)
                    self._pass(spec, config, c, repeat, measured, speculative=True)
                results.append((c, base, measured))
            return results
        except DraftLabError:
            self.baseline_lost = self.baseline is None or bool(self.baseline.died())
            raise
        finally:
            self.stop(spec)

    def _one_at_a_time(self, config: Config) -> list[tuple[int, Measured, Measured]]:
        """Pass by pass, one server up: A B, then B A (the one up stays for the next pass), every concurrency's pass
        on each, so each server's pass i runs beside the other's, across restarts."""
        bases = {c: Measured() for c in self.plan.concurrency}
        specs = {c: Measured() for c in self.plan.concurrency}
        spec = None  # this configuration's server while it is up
        speculative = False  # the side starting or measuring now
        try:
            for repeat in range(self.plan.repeats):
                for speculative in (False, True) if spec is None else (True, False):
                    if speculative and spec is None:
                        self.stop(self.baseline)
                        spec = self._up(config, speculative=True)
                    elif not speculative and self.baseline is None:
                        self.stop(spec)
                        spec = None
                        self._up(config, speculative=False)
                    server = spec if speculative else self.baseline
                    for c in self.plan.concurrency:
                        self.progress.describe(
                            f"{config.label} concurrency {c} pass {repeat + 1}/{self.plan.repeats} "
                            f"({'speculative' if speculative else 'target-only'}, one server at a time)"
                        )
                        self._pass(server, config, c, repeat, specs[c] if speculative else bases[c], speculative)
        except DraftLabError:
            self.baseline_lost = not speculative  # it failed while the target-only server was the side
            raise
        finally:
            self.stop(spec)  # this configuration's alone; the target-only server, if up, stays for the next
        return [(c, bases[c], specs[c]) for c in self.plan.concurrency]

    def _pass(self, server, config: Config, c: int, repeat: int, measured: Measured, speculative: bool) -> None:
        _measure_pass(
            server,
            self.plan.prompts,
            config.request,
            c,
            self.plan.request_timeout,
            self.progress,
            speculative,
            measured,
            pass_seeds(config.request, len(self.plan.prompts), c, repeat, speculative),
        )


def measure(store, confirm_id: int, plan: Plan, progress, worker_id: str | None = None) -> list[str]:
    """Run the confirm `confirm_id` (already stored, storage/confirms.start_confirm or a claimed queued one): per
    configuration both servers (together, or one at a time), A B A B passes at each concurrency, each configuration
    stored once all its passes are done with each cell's prediction beside it, the target-only passes stored at the
    end, the confirm closed with its server starts (`worker_id`: only while it is that worker's). Returns the
    errors, one line each (a failed configuration; the others are kept). `progress` has describe(text),
    request_done(record) and write(line). KeyboardInterrupt (Ctrl-C, SIGTERM, a stopped worker) and any exception no
    check foresaw (`unexpected`) close the confirm as failed with what was measured and are raised again."""
    from app.serving.hardware import local_hardware
    from storage.records.confirms import add_measurement, describe_confirm, finish_confirm, summarize

    eid, configs = plan.experiment_id, plan.configs
    errors: list[str] = []
    baseline_passes: dict[int, list] = {c: [] for c in plan.concurrency}
    started = time.monotonic()
    servers = _Servers(plan, _recorder(store, confirm_id), progress)
    attached = plan.baseline_server is not None
    describe_confirm(
        store,
        confirm_id,
        hardware=f"the servers at {plan.baseline_server}" if attached else local_hardware(),
        target=configs[0].target_name or configs[0].target,
    )
    try:
        predicted = _Predictions(store, eid, confirm_id)
        if not plan.one_at_a_time:
            servers.target_only(configs[0])
        for config in configs:
            try:
                results = servers.measure(config)
                for c, base, measured in results:  # stored only once every pass of the configuration is done
                    _store_config(store, confirm_id, eid, config, c, base, measured, plan.greedy, predicted(config, c))
                    baseline_passes[c] += base.passes
            except DraftLabError as exc:
                errors.append(f"{config.label} (k={config.k}): {exc}")
                progress.write(f"error: {errors[-1]}")
                if servers.baseline_lost:  # no target-only server for the configurations left: one line, then stop
                    break
    except DraftLabError as exc:
        errors.append(str(exc))
    except KeyboardInterrupt:
        errors.append("interrupted (Ctrl-C, SIGTERM or a stopped worker): the configurations measured before are kept")
        raise
    except Exception as exc:  # a fault no check foresaw: the confirm is stored as failed with it, and it goes on up
        errors.append(unexpected(exc))
        raise
    finally:
        with _signals_deferred():
            servers.stop_all()
            progress.describe("storing the target-only passes")  # also the last requests-done count a worker reports
            for c, passes in baseline_passes.items():
                if passes:
                    add_measurement(
                        store,
                        confirm_id,
                        eid,
                        label="target-only",
                        k=0,
                        run_id=None,
                        speculative_config=None,
                        concurrency=c,
                        passes=passes,
                        figures=summarize(passes),
                    )
            finish_confirm(
                store,
                confirm_id,
                engine_version=servers.version,
                wall_seconds=time.monotonic() - started,
                errors=errors,
                worker_id=worker_id,
                server_starts=None if attached else servers.starts,
                one_server_at_a_time=plan.one_at_a_time,
            )
    return errors
