"""A serving engine's speculative-decoding counters, read from its Prometheus text exposition (`/metrics`).

vLLM (and llama.cpp's server) count, per engine:

    vllm:spec_decode_num_drafts_total                      rounds that proposed drafts
    vllm:spec_decode_num_draft_tokens_total                draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total             draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"}   rounds whose draft j (0-based) was accepted

The per-position counter is *unconditional* (a round's draft j counts only if drafts 0..j-1 were accepted too);
DraftLab's `per_position_acceptance` is conditional, so storage/records/production.py divides by the previous position's
count (docs/metrics.md, "Production"). The text is parsed by prometheus_client's parser; counters are read with
or without their `_total` suffix, summed over every label set (several engines, model names) unless `engine`
picks one. URLs are fetched here, by the CLI only (the dashboard never fetches a user-given URL), with a timeout
and a size cap.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from engine.config.limits import limit
from engine.errors import DraftLabError

DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION = (
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
)
COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION)
FETCH_TIMEOUT_SECONDS = 10.0


@dataclass
class SpecCounters:
    """One scrape's (or two scrapes' difference of) speculative-decoding counters."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: dict[int, int] = field(default_factory=dict)  # 1-based position -> rounds accepted there
    engines: tuple[str, ...] = ()  # the `engine` label values summed over ('' when unlabelled)

    def minus(self, before: SpecCounters, source: str) -> SpecCounters:
        """The counts between two scrapes; a counter that went down means the server restarted in between."""
        values = {
            "drafts": self.drafts - before.drafts,
            "draft_tokens": self.draft_tokens - before.draft_tokens,
            "accepted": self.accepted - before.accepted,
        }
        positions = {j: n - before.per_position.get(j, 0) for j, n in self.per_position.items()}
        if min([*values.values(), *positions.values(), 0]) < 0:
            raise DraftLabError(
                f"{source}: a counter went down between the two scrapes (the server restarted or "
                f"they come from different servers); scrape the same server again"
            )
        return SpecCounters(**values, per_position=positions, engines=self.engines)


def public_source(source: str) -> str:
    """`source` as stored and printed: a URL without credentials, query or fragment; a path as given."""
    parts = urllib.parse.urlsplit(source)
    if parts.scheme in ("http", "https"):
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return source


def _request(url: str) -> urllib.request.Request:
    """A GET of `url` with its user:password (if any) sent as HTTP basic auth rather than left in the host part."""
    import base64

    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return urllib.request.Request(url)
    host = public_source(url).split("://", 1)[1].split("/", 1)[0]
    bare = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, ""))
    secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    return urllib.request.Request(
        bare, headers={"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}
    )


def read_source(source: str) -> str:
    """The exposition text of a file or an http(s) URL, at most $DRAFTLAB_LIMIT_METRICS_MB megabytes."""
    cap = limit("metrics_mb") * 1024 * 1024
    shown = public_source(source)
    scheme = urllib.parse.urlsplit(source).scheme
    if scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(_request(source), timeout=FETCH_TIMEOUT_SECONDS) as response:  # noqa: S310
                body = response.read(cap + 1)
        except urllib.error.HTTPError as exc:
            raise DraftLabError(
                f"{shown} answered HTTP {exc.code}: point at the server's metrics page (vLLM: http://HOST:PORT/metrics)"
            ) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise DraftLabError(
                f"cannot fetch {shown} ({reason}; timeout {FETCH_TIMEOUT_SECONDS:g} s): check the "
                f"address and that the server is up"
            ) from None
    elif scheme and len(scheme) > 1:  # not a Windows drive letter
        raise DraftLabError(
            f"{shown}: only http(s) URLs and local files are read; save the page to a file or give its http(s) address"
        )
    else:
        path = Path(source)
        if not path.is_file():
            raise DraftLabError(f"{source}: no such file; give a saved /metrics page or an http(s) URL")
        with path.open("rb") as f:
            body = f.read(cap + 1)
    if len(body) > cap:
        raise DraftLabError(
            f"{shown} is larger than {limit('metrics_mb')} MB, the limit per scrape: raise it with "
            f"$DRAFTLAB_LIMIT_METRICS_MB"
        )
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise DraftLabError(f"{shown} is not UTF-8 text: give a Prometheus text exposition (a /metrics page)") from None


def _counter_name(sample_name: str) -> str | None:
    """'vllm:spec_decode_num_drafts_total' -> 'spec_decode_num_drafts'; None for another metric or `_created`."""
    if sample_name.endswith("_created"):
        return None
    bare = sample_name[: -len("_total")] if sample_name.endswith("_total") else sample_name
    name = bare.rsplit(":", 1)[-1]
    return name if name in COUNTERS else None


def parse(text: str, source: str, engine: str | None = None) -> SpecCounters:
    """The speculative-decoding counters in one exposition, summed over label sets (or those of `engine`)."""
    from prometheus_client.parser import text_string_to_metric_families

    shown = public_source(source)
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    positions: dict[int, float] = {}
    found, engines, seen = set(), set(), set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = _counter_name(sample.name)
                if name is None:
                    continue
                labels = dict(sample.labels)
                key = (name, tuple(sorted(labels.items())))
                if key in seen:  # the same series twice (with and without `_total`): count it once
                    continue
                seen.add(key)
                label_engine = labels.get("engine", "")
                if engine is not None and label_engine != engine:
                    engines.add(label_engine)
                    continue
                engines.add(label_engine)
                found.add(name)
                value = float(sample.value)
                if not value >= 0 or value == float("inf"):
                    raise DraftLabError(
                        f"{shown}: {sample.name} is {sample.value}, not a count: is this a "
                        f"DraftLab-compatible /metrics page?"
                    )
                if name == PER_POSITION:
                    position = labels.get("position", labels.get("pos"))
                    if position is None or not position.isascii() or not position.isdigit():
                        raise DraftLabError(
                            f"{shown}: {sample.name} has no numeric position label "
                            f'(got {labels}); expected position="0", "1", …'
                        )
                    positions[int(position) + 1] = positions.get(int(position) + 1, 0.0) + value
                else:
                    totals[name] += value
    except DraftLabError:
        raise
    except Exception as exc:  # noqa: BLE001 - prometheus_client raises ValueError (and others) on bad text
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise DraftLabError(
            f"{shown} is not a Prometheus text exposition ({first}): give the server's /metrics page"
        ) from None
    if engine is not None and not found:
        listed = ", ".join(sorted(repr(e) for e in engines)) or "none"
        raise DraftLabError(
            f'{shown}: no speculative-decoding counters with engine="{engine}" (engines there: '
            f"{listed}); pick one of those or leave --engine out to sum them"
        )
    missing = [n for n in (DRAFTS, DRAFT_TOKENS, ACCEPTED) if n not in found]
    if missing:
        raise DraftLabError(
            f"{shown} has no {', '.join('vllm:' + n + '_total' for n in missing)}: is speculative "
            f"decoding on in that server (e.g. vLLM --speculative-config)?"
        )
    return SpecCounters(
        drafts=round(totals[DRAFTS]),
        draft_tokens=round(totals[DRAFT_TOKENS]),
        accepted=round(totals[ACCEPTED]),
        per_position={j: round(v) for j, v in sorted(positions.items())},
        engines=tuple(sorted(engines)) if engine is None else (engine,),
    )


def scrape(
    sources: list[str], interval: float | None = None, engine: str | None = None, sleep=time.sleep
) -> tuple[SpecCounters, float | None]:
    """The counters to import and the seconds they span (None: totals since the server started).

    One source: its totals, or with `interval` the difference of two scrapes `interval` seconds apart.
    Two sources (two saved scrapes, before and after): their difference."""
    if len(sources) == 2:
        before, after = (parse(read_source(s), s, engine) for s in sources)
        return after.minus(before, public_source(sources[1])), None
    if interval is None:
        return parse(read_source(sources[0]), sources[0], engine), None
    first = parse(read_source(sources[0]), sources[0], engine)
    start = time.monotonic()
    sleep(interval)
    second = parse(read_source(sources[0]), sources[0], engine)
    return second.minus(first, public_source(sources[0])), time.monotonic() - start
