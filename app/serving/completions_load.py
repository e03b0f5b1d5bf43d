"""One closed-loop pass of streaming completions against an OpenAI-compatible server (`draftlab confirm`): C
requests in flight (a worker per slot takes the next prompt as soon as its request ends), each prompt sent once.

Every request records when it was sent and when each streamed chunk arrived with how many new tokens it carried:
a server step that emits n tokens (a speculative round) arrives as one chunk, which is exactly the lab's "tokens of
a round share one arrival time" (SPEC, Serving metrics). Token ids come from vLLM's `return_token_ids` (so outputs
compare token for token with the lab's); a server without it is counted by `continuous_usage_stats`.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from engine.errors import DraftLabError


@dataclass
class RequestRecord:
    """One request of a pass: seconds from the pass's start, the chunks' arrivals and token counts, the output."""

    prompt_index: int
    sent: float
    arrivals: list[float] = field(default_factory=list)  # one per chunk that carried new tokens
    counts: list[int] = field(default_factory=list)  # new tokens in that chunk
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None

    @property
    def new_tokens(self) -> int:
        return sum(self.counts)


@dataclass
class PassRecord:
    """A pass: every prompt once at `concurrency`; `wall_seconds` from the first send to the last token."""

    concurrency: int
    wall_seconds: float
    requests: list[RequestRecord]
    decode_steps: int | None = None  # the engine steps after each request's first chunk (`decode`), once known

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.requests)

    def decode(self) -> tuple[float, int]:
        """(seconds, tokens) of every request's steps after its first chunk (the prefill's): from the first chunk's
        arrival to the last's, and the tokens the later chunks carried, summed over the requests."""
        seconds = sum(r.arrivals[-1] - r.arrivals[0] for r in self.requests if r.arrivals)
        return seconds, sum(sum(r.counts[1:]) for r in self.requests)


class RequestFailed(DraftLabError):
    """A request of a pass failed (timed out, refused, cut off): the message names the prompt and the fix."""


def read_stream(lines, record: RequestRecord, clock, start: float) -> None:
    """Fill `record` from a completion's server-sent events (an iterable of byte lines), timing each chunk."""
    previous_usage = 0
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").strip() if isinstance(raw, bytes) else raw.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        now = clock() - start
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RequestFailed(
                f"prompt {record.prompt_index}: the server streamed something that is not JSON "
                f"({data[:80]!r}); is it an OpenAI-compatible server?"
            ) from None
        if "error" in chunk and not chunk.get("choices"):
            message = (
                chunk["error"].get("message", chunk["error"]) if isinstance(chunk["error"], dict) else chunk["error"]
            )
            raise RequestFailed(
                f"prompt {record.prompt_index}: the server answered an error mid-stream: {str(message)[:200]}"
            )
        usage = (chunk.get("usage") or {}).get("completion_tokens")
        for choice in chunk.get("choices") or []:
            ids = choice.get("token_ids")
            if ids is not None:
                count = len(ids)
                record.token_ids += [int(t) for t in ids]
            else:
                count = (usage - previous_usage) if usage is not None else (1 if choice.get("text") else 0)
            record.text += choice.get("text") or ""
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
            if count > 0:
                record.arrivals.append(now)
                record.counts.append(count)
        if usage is not None:
            previous_usage = usage
    raise RequestFailed(
        f"prompt {record.prompt_index}: the stream ended without [DONE] (the server closed it mid-answer: did it die?)"
    )


def _post_stream(url: str, body: dict, timeout: float, record: RequestRecord, clock, start: float) -> None:
    parts = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    if parts.hostname is None:
        raise DraftLabError(f"{url}: no host name in the server's URL")
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    try:
        connection.request(
            "POST",
            parts.path or "/",
            body=json.dumps(body),
            headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        )
        response = connection.getresponse()
        if response.status != 200:
            detail = response.read(400).decode("utf-8", errors="replace").strip().replace("\n", " ")
            raise RequestFailed(
                f"prompt {record.prompt_index}: the server answered HTTP {response.status} "
                f"({detail[:200]}); check the model and the sampling settings it accepts"
            )
        read_stream(response, record, clock, start)
    except TimeoutError:
        raise RequestFailed(
            f"prompt {record.prompt_index}: no answer for {timeout:g} s (request timed out); raise "
            f"--request-timeout or lower --concurrency"
        ) from None
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        raise RequestFailed(
            f"prompt {record.prompt_index}: the connection failed ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None
    finally:
        connection.close()


def run_pass(
    url: str,
    model: str,
    prompts: list[str],
    request: dict,
    concurrency: int,
    timeout: float,
    on_request=None,
    clock=time.perf_counter,
    seeds: list[int] | None = None,
) -> PassRecord:
    """Send every prompt once to `url` (/v1/completions), `concurrency` at a time; `request` holds the sampling
    fields and max_tokens, `seeds` (one per prompt) each request's own `seed`. `on_request(record)` after each
    request. The first failure stops the pass and is raised (RequestFailed) once the requests in flight end."""
    body_base = {
        "model": model,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **request,
    }
    endpoint = url.rstrip("/") + "/v1/completions"
    queue = list(range(len(prompts)))
    lock = threading.Lock()
    records: list[RequestRecord] = []
    failures: list[BaseException] = []
    start = clock()

    def worker():
        while True:
            with lock:
                if not queue or failures:
                    return
                index = queue.pop(0)
            record = RequestRecord(prompt_index=index, sent=clock() - start)
            try:
                body = {**body_base, "prompt": prompts[index], **({"seed": seeds[index]} if seeds else {})}
                _post_stream(endpoint, body, timeout, record, clock, start)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                with lock:
                    failures.append(exc)
                return
            with lock:
                records.append(record)
            if on_request is not None:
                on_request(record)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(concurrency, len(prompts))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    end = max((r.arrivals[-1] for r in records if r.arrivals), default=clock() - start)
    return PassRecord(concurrency=concurrency, wall_seconds=end, requests=sorted(records, key=lambda r: r.prompt_index))
