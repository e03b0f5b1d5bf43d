"""The settings each serving engine takes for one measured run. Its definitions move to
storage/serving/engines/common.py unchanged (a pure rename, so the module's history follows into the package the next
commit splits into one module per engine); the names its importers use are re-exported here, so none of them changes."""

from __future__ import annotations

from storage.serving.engines.common import (
    DRAFTER_NAMES,
    ENGINES,
    DeployError,
    NoChosenRun,
    configuration,
    deploy_settings,
    deployable_runs,
    named_run,
    parse_drafter,
    refusal,
    run_vllm_settings,
    schedule_text,
    server_ranges,
)

__all__ = [
    "DRAFTER_NAMES",
    "ENGINES",
    "DeployError",
    "NoChosenRun",
    "configuration",
    "deploy_settings",
    "deployable_runs",
    "named_run",
    "parse_drafter",
    "refusal",
    "run_vllm_settings",
    "schedule_text",
    "server_ranges",
]
