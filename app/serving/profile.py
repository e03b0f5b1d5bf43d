"""`draftlab profile`'s configurations: one lab run's drafter served at each k of a list, beside the target alone, so
the stored confirm (configs = "profile") holds the server's step cost at every k and concurrency: a server cost
profile (storage/serving/profiles.py) for every run it fits. The measurement is confirm's (app/serving/confirm.py):
the same servers, the same interleaved passes, the same faults and the same storage."""

from __future__ import annotations

import json
from dataclasses import replace

from app.serving.confirm import Config, configurations
from engine.errors import DraftLabError

DEFAULT_KS = (1, 2, 3, 4)


def profile_configs(store, experiment_id: int, run_id: int | None, ks: list[int]) -> list[Config]:
    """The run's vLLM configuration (the deploy export's; default run: the verdict's choice, else the first lossless
    speculative run) at each k of `ks`, without a per-batch-size schedule. DraftLabError (one line) for a run vLLM
    cannot serve or a bad k."""
    if not ks or any(k < 1 for k in ks):
        raise DraftLabError(f"--ks {','.join(map(str, ks))}: each k is a whole number from 1, e.g. --ks 1,2,3,4")
    servable = configurations(store, experiment_id, "all")  # none: one line naming what is missing
    if run_id is None:
        try:
            (base,) = configurations(store, experiment_id, "chosen")
        except DraftLabError:  # the verdict serves the target alone, or chose none: the first servable run
            base = servable[0]
    else:
        matching = [c for c in servable if run_id in c.runs]  # a configuration serves every run identical to it
        if not matching:
            raise DraftLabError(
                f"run {run_id} is not a finished lossless speculative run of experiment {experiment_id} that vLLM "
                f"can serve (those: {', '.join(str(r) for c in servable for r in c.runs)}); give one of them with --run"
            )
        base = replace(matching[0], run_id=run_id)
    spec = json.loads(base.speculative_config)
    spec.pop("num_speculative_tokens_per_batch_size", None)
    configs = []
    for k in sorted(set(ks)):
        spec["num_speculative_tokens"] = k
        configs.append(
            Config(
                label=f"run {base.run_id} at k={k}",
                k=k,
                run_id=base.run_id,
                speculative_config=json.dumps(spec),
                request=base.request,
                target=base.target,
                target_name=base.target_name,
                lab_k=base.k,
            )
        )
    return configs
