"""`draftlab profile EXPERIMENT_ID`: a serving engine's step cost per k and concurrency, for one lab run's drafter —
a server cost profile (storage/serving/profiles.py) — then every run of the experiment it fits predicted from its
own acceptance and those costs (engine/metrics/server_prediction.py). The measurement is confirm's
(app/serving/confirm.py, configurations from app/serving/profile.py): one target-only server and one server per k,
interleaved passes, the same progress bar, heartbeat, Ctrl-C / SIGTERM handling and faults."""

from __future__ import annotations

import json

from app.arguments import ID as _id
from app.arguments import whole
from app.commands.common import database_errors_reported, store_command
from app.commands.confirm import _repeats, _seconds, concurrency_list, measure_and_print, signalled, whole_list
from app.serving.confirm import plan
from app.serving.profile import DEFAULT_KS, profile_configs
from engine.errors import DraftLabError

NAME = "profile"
DEFAULT_PROFILE_REPEATS = 5  # passes per server and concurrency: a profile's interval narrows with passes
_k_value = whole(1, 64, what="a k (draft tokens per step)", fix="; e.g. --ks 1,2,3,4")


def ks_list(text: str) -> list[int]:
    """`--ks 1,2,3,4`: each a whole number from 1 to 64, each once."""
    return whole_list(text, "--ks", _k_value, "1,2,3,4")


def add_parser(sub):
    p = sub.add_parser(
        NAME,
        help="measure vLLM's step cost per k and concurrency, and predict every run's server speedup from it",
        description="Serve one lab run's drafter in vLLM at each k of --ks beside the target alone (the confirm's "
        "servers and interleaved passes), store each k's step cost at each concurrency with its passes, and "
        "predict the server speedup of every run of the experiment it fits (same target, same drafting method "
        "and draft shape; any k up to the largest profiled) from the run's own acceptance, with an interval.",
    )
    p.add_argument("experiment_id", type=_id)
    p.add_argument("--run", type=_id, default=None, help="the lab run whose drafter to serve (default: the chosen one)")
    p.add_argument(
        "--ks", default=",".join(map(str, DEFAULT_KS)), help="the ks to serve (default 1,2,3,4; k = 0 always)"
    )
    p.add_argument(
        "--concurrency", default=None, help="requests in flight, one or a list (default: the experiment's batch sizes)"
    )
    p.add_argument(
        "--repeats",
        type=_repeats,
        default=DEFAULT_PROFILE_REPEATS,
        help=f"passes per server and concurrency (default {DEFAULT_PROFILE_REPEATS}; more passes, a truer interval)",
    )
    p.add_argument(
        "--vllm",
        default=None,
        metavar="COMMAND",
        help="the command that starts vLLM's OpenAI server (as `draftlab confirm --vllm`; default $DRAFTLAB_VLLM, "
        "else .vllm-venv's CPU build)",
    )
    p.add_argument(
        "--one-server-at-a-time",
        action="store_true",
        default=None,
        help="only one server up at a time, restarted in turn pass by pass (as `draftlab confirm "
        "--one-server-at-a-time`; default $DRAFTLAB_ONE_SERVER_AT_A_TIME=1, else both up together)",
    )
    p.add_argument("--startup-timeout", type=_seconds, default=600, help="seconds a server may take to be ready")
    p.add_argument(
        "--request-timeout", type=_seconds, default=300, help="seconds without an answer before a request times out"
    )
    p.add_argument("--db", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object: the profile, its costs, predictions")
    return p


def run(args) -> int:
    return database_errors_reported(lambda args: store_command(args, _profile), args)


def _profile(args, store) -> int:
    ks = ks_list(args.ks)
    the_plan = plan(
        store,
        args.experiment_id,
        "profile",
        concurrency=concurrency_list(args.concurrency) if args.concurrency is not None else None,
        repeats=args.repeats,
        vllm=args.vllm,
        startup_timeout=args.startup_timeout,
        request_timeout=args.request_timeout,
        chosen=profile_configs(store, args.experiment_id, args.run, ks),
        one_at_a_time=args.one_server_at_a_time,
    )
    fingerprint = the_plan.configs[0].speculative_config
    return signalled(
        lambda: measure_and_print(
            store,
            the_plan,
            "profile",
            lambda profile_id, seconds: _printed(args, store, profile_id, fingerprint, seconds),
            profile_run_id=the_plan.configs[0].run_id,
            profile_ks=sorted(c.k for c in the_plan.configs),
        )
    )


def profile_document(store, experiment_id: int, profile_id: int, speculative_config: str) -> dict:
    """`draftlab profile --json`: the profile's head, its costs per concurrency and k, and each run of the experiment
    predicted from it ({run id: server_predicted}, or {"reason"} where it does not fit)."""
    from storage.records import queries as q
    from storage.records.server_costs import drafter_fingerprint
    from storage.serving.profiles import profile_table, run_prediction

    runs = q.runs(store, experiment_id)
    predictions = {}
    for run_id in runs.loc[runs["kind"] == "speculative", "run_id"]:
        try:
            predictions[str(int(run_id))] = run_prediction(store, experiment_id, int(run_id), profile_id)
        except DraftLabError as exc:
            predictions[str(int(run_id))] = {"profile": None, "reason": str(exc)}
    return {
        "profile_id": profile_id,
        "experiment_id": experiment_id,
        "drafter_fingerprint": drafter_fingerprint(speculative_config),
        "costs": profile_table(store, profile_id, drafter_fingerprint(speculative_config)),
        "server_predicted": predictions,
    }


def _printed(args, store, profile_id: int, speculative_config: str, seconds: float) -> str:
    document = profile_document(store, args.experiment_id, profile_id, speculative_config)
    return json.dumps(document) if args.json else report(document, seconds)


def report(document: dict, seconds: float) -> str:
    """The profile as a few lines: each concurrency's step cost per k (and t_k / t_0), then each run's predicted
    server speedup per k with its interval, and the k to serve at each concurrency."""
    lines = [f"profile {document['profile_id']} of experiment {document['experiment_id']}, {seconds:.0f} s"]
    for c in document["costs"]:
        ci = c["cost_ratio_ci"]
        ratio = f", t_k/t_0 {c['cost_ratio']:.2f} ({ci[0]:.2f}–{ci[1]:.2f})" if c["cost_ratio"] is not None else ""
        lines.append(
            f"  concurrency {c['concurrency']} k={c['k']}: step {c['step_seconds'] * 1000:.2f} ms over "
            f"{c['passes']} passes{ratio}, {c['tokens_per_step']:.2f} tokens/step in the server"
        )
    for run_id, predicted in document["server_predicted"].items():
        if predicted.get("profile") is None:
            lines.append(f"  run {run_id}: no prediction: {predicted['reason']}")
            continue
        for c, by_k in predicted["concurrency"].items():
            cells = ", ".join(
                f"k={k} {p['speedup']:.2f}× ({p['speedup_ci'][0]:.2f}–{p['speedup_ci'][1]:.2f})"
                for k, p in by_k.items()
            )
            lines.append(f"  run {run_id} concurrency {c}: {cells}; serve k={predicted['schedule'][c]}")
    return "\n".join(lines)
