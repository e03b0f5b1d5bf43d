"""A serving engine's stored step costs, per k and concurrency, and the drafter they hold for: the queries of a server
cost profile (storage/serving/profiles.py says what a profile is and which runs it fits).

Every stored confirm pass holds its decode figures (storage/db/schema.py's server_passes: the seconds and the engine
steps after each request's first token), so the step cost at k and concurrency c is, per pass,

    t_k(c) = decode_seconds / decode_steps        (k = 0: the target-only server's)

and each speculative measurement its drafter's fingerprint (`drafter_fingerprint`): the vLLM speculative config
without its ks, a draft model or head by its shape (model type, widths, layers, vocabulary: what its cost depends
on), never its weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import text

from storage.db.store import Store

PROFILE = "profile"  # server_confirms.configs of a `draftlab profile`
SHAPE_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
NOT_COST = ("num_speculative_tokens", "num_speculative_tokens_per_batch_size")  # a profile's ks, a server's schedule


def model_shape(name: str) -> str:
    """A draft model or head by what its cost depends on: "llama hidden_size=64 num_hidden_layers=2 …" from its
    config.json (a shipped demo name or a local folder); an HF id or a folder without one stands for itself."""
    from engine.zoo import resolve

    folder = resolve(name) or Path(name).expanduser()
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return name
    if not isinstance(config, dict):
        return name
    nested = config.get("text_config")
    text_config: dict = nested if isinstance(nested, dict) else {}
    found = {key: config.get(key, text_config.get(key)) for key in SHAPE_KEYS}
    return " ".join(f"{key}={value}" for key, value in found.items() if value is not None) or name


def drafter_fingerprint(speculative_config: str | dict) -> str:
    """The drafter of a vLLM `--speculative-config` as a profile fits it: the config without its ks, the draft
    model by its shape (`model_shape`), canonical JSON."""
    spec = json.loads(speculative_config) if isinstance(speculative_config, str) else dict(speculative_config)
    spec = {key: value for key, value in spec.items() if key not in NOT_COST}
    if isinstance(spec.get("model"), str):
        spec["model"] = model_shape(spec["model"])
    return json.dumps(spec, sort_keys=True)


_PROFILES = text(
    """
    SELECT c.id, c.created, c.configs, c.engine, c.engine_version, c.hardware, c.target, c.status,
           MAX(m.k) AS largest_k
    FROM server_confirms c
    JOIN server_measurements m ON m.confirm_id = c.id
    JOIN server_passes p ON p.measurement_id = m.id
    WHERE c.target = :target AND m.drafter_fingerprint = :fingerprint AND p.decode_steps > 0
      AND c.status IN ('done', 'failed', 'interrupted')
    GROUP BY c.id, c.created, c.configs, c.engine, c.engine_version, c.hardware, c.target, c.status
    ORDER BY c.id DESC"""
)

_COSTS = text(
    """
    SELECT m.concurrency, m.k, m.id AS measurement_id, p.pass_index,
           p.decode_seconds / p.decode_steps AS step_seconds
    FROM server_passes p JOIN server_measurements m ON m.id = p.measurement_id
    WHERE m.confirm_id = :c AND p.decode_steps > 0 AND p.decode_seconds > 0
      AND (m.k = 0 OR m.drafter_fingerprint = :fingerprint)
    ORDER BY m.concurrency, m.k, m.id, p.pass_index"""
)

_SUMMARY = text(
    """
    SELECT m.concurrency, m.k, COUNT(*) AS passes,
           SUM(p.decode_seconds) / SUM(p.decode_steps) AS step_seconds,
           1.0 * SUM(p.decode_tokens) / SUM(p.decode_steps) AS tokens_per_step
    FROM server_passes p JOIN server_measurements m ON m.id = p.measurement_id
    WHERE m.confirm_id = :c AND p.decode_steps > 0 AND p.decode_seconds > 0
      AND (m.k = 0 OR m.drafter_fingerprint = :fingerprint)
    GROUP BY m.concurrency, m.k ORDER BY m.concurrency, m.k"""
)


def _head(row) -> dict[str, Any]:
    version = row.engine_version or "(version unknown)"
    hardware = row.hardware or "unknown hardware"
    return {
        "profile_id": int(row.id),
        "created": str(row.created)[:19] if row.created is not None else None,
        "kind": "profile" if row.configs == PROFILE else "confirm",
        "engine": row.engine,
        "engine_version": row.engine_version or None,
        "hardware": row.hardware,
        "target": row.target,
        "largest_k": int(row.largest_k),
        "status": row.status,
        "label": f"predicted for {row.engine} {version} on {hardware}, profile {int(row.id)}".replace("vllm", "vLLM"),
    }


def short_fingerprint(fingerprint: str) -> str:
    """A fingerprint in a few words: its method and its draft's shape."""
    spec = json.loads(fingerprint)
    return spec.get("method", "?") + (f" {spec['model']}" if isinstance(spec.get("model"), str) else "")


def fitting_profiles(store: Store, target: str, fingerprint: str) -> list[dict[str, Any]]:
    """The stored profiles (confirms with decode figures) that hold for this target and drafter, newest first."""
    with store.read() as conn:
        rows = conn.execute(_PROFILES, {"target": target, "fingerprint": fingerprint}).all()
    return [_head(row) for row in rows]


def profile_costs(store: Store, profile_id: int, fingerprint: str) -> dict[int, dict[int, list[float]]]:
    """{concurrency: {k: step seconds of each pass}} of a profile for one drafter: the concurrencies where the
    target alone (k = 0) and at least one k were measured (engine/metrics/server_prediction.py's CostProfile)."""
    with store.read() as conn:
        rows = conn.execute(_COSTS, {"c": profile_id, "fingerprint": fingerprint}).all()
    costs: dict[int, dict[int, list[float]]] = {}
    for row in rows:
        costs.setdefault(int(row.concurrency), {}).setdefault(int(row.k), []).append(float(row.step_seconds))
    return {c: by_k for c, by_k in costs.items() if 0 in by_k and len(by_k) > 1}


def profile_summary(store: Store, profile_id: int, fingerprint: str) -> list[dict[str, Any]]:
    """Per concurrency and k: passes, the step seconds over all of them (Σ seconds / Σ steps) and the tokens per
    step the profile's own server accepted (its acceptance, not the run's): one GROUP BY."""
    with store.read() as conn:
        rows = conn.execute(_SUMMARY, {"c": profile_id, "fingerprint": fingerprint}).all()
    return [
        {
            "concurrency": int(r.concurrency),
            "k": int(r.k),
            "passes": int(r.passes),
            "step_seconds": float(r.step_seconds),
            "tokens_per_step": float(r.tokens_per_step),
        }
        for r in rows
    ]


def profile_drafters(store: Store, profile_id: int) -> list[str]:
    """The drafter fingerprints a profile (or any confirm) measured step costs for: its speculative measurements'."""
    with store.read() as conn:
        rows = conn.execute(
            text(
                "SELECT DISTINCT drafter_fingerprint FROM server_measurements WHERE confirm_id = :c AND k > 0 "
                "AND drafter_fingerprint IS NOT NULL ORDER BY drafter_fingerprint"
            ),
            {"c": int(profile_id)},
        ).scalars()
        return [str(r) for r in rows]
