"""A stand-in for vLLM's OpenAI server, for the confirm job's tests (the real one is tests/test_confirm_vllm.py):
started exactly as DraftLab starts vLLM (`python tests/fake_vllm.py --model M --host H --port P
[--speculative-config JSON]`), it answers /health, /version, /v1/models, /metrics and streaming /v1/completions.

Greedy and lossless by construction: a prompt's output ids depend on the prompt alone (equal with and without
speculation). Sampled (temperature > 0): each answer is drawn from a distribution that depends on the prompt alone
(an end of text after 4 tokens with probability 0.02 a token, ids near the greedy ones), from a random stream of
its own per server and request (with a `seed`, per server and seed, whatever the prompt, as vLLM seeds a request's
generator), so both servers sample the same distribution. Each answer's first token is the prefill's, one chunk and no
round; after it, with a speculative config of k tokens, each step streams up to k + 1 tokens as one chunk and counts a
round whose first draft is always accepted and whose others are accepted at every other step, in vLLM's counters (per
position: unconditional, 0-based).
$FAKE_VLLM_STEP_SECONDS (default 0): each step (chunk) of the target-only server takes this long, each of a
speculative server 1 + k · $FAKE_VLLM_DRAFT_COST (default 0.5) times as long (drafting, a wider verify), the prefill
as long as a target step, so a pass's wall follows its steps and a profile measures t_k / t_0 = 1 + k / 2.

Like vLLM, it forks an engine process (the stand-in for its EngineCore) that names itself `VLLM::EngineCor` (the
15 characters Linux keeps), stays in the server's process group and outlives the server process when that is
killed, as vLLM's does (parent PID 1); on SIGTERM it ends. $FAKE_VLLM_ESCAPE=1 has it leave the group (a session of
its own) as well, and $FAKE_VLLM_SLOW_STOP=K:S has the engine of the server whose k is K take S seconds to end on
SIGTERM. With $FAKE_VLLM_PIDS (a folder), each server writes {"server": pid, "engine": pid, "k": k} to
SERVER_PID.json there, so the tests can look for both after DraftLab stopped the server.

One device: with $FAKE_VLLM_DEVICE (a file), each server holds it as a GPU's memory is held (an exclusive flock,
taken before it loads and inherited by its engine, so it is free only once both have exited); a server that finds it
held says so on its log ("device busy"), appends its k to FILE.overlap and exits (status 5) before it is ready, as a
second vLLM on a full GPU fails with out of memory.

Faults, for the confirm's fault tests: $FAKE_VLLM_FAULT = "MODE:K:N" makes the server whose k is K (0: the one
without speculation) misbehave from its N-th completion request on (the warm-up is request 1):
- die: it streams one chunk of that request, says why on its log, and exits (status 7) mid-answer;
- hang: it sends that request's headers and never a token;
- no-counters (N unused): its /metrics holds no speculative-decoding counters;
- short (sampled requests only): it answers 6-10 tokens drawn uniformly over the vocabulary and accepts one draft
  an answer, as vLLM 0.32's CPU build does under sampling (storage/analysis/findings/withheld.py's
  VLLM_CPU_SAMPLING_CAUSE);
- fast: its steps take no time (whatever $FAKE_VLLM_STEP_SECONDS says), a speedup above its tokens per step."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 97
DRAFT_COST = float(os.environ.get("FAKE_VLLM_DRAFT_COST") or 0.5)  # a speculative step: 1 + k · this target steps


class Counters:
    def __init__(self, k: int):
        self.k, self.lock = k, threading.Lock()
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_position = [0] * k

    def round(self, accepted: int) -> None:
        with self.lock:
            self.drafts += 1
            self.draft_tokens += self.k
            self.accepted += accepted
            for j in range(accepted):
                self.per_position[j] += 1

    def exposition(self) -> str:
        lines = ["# TYPE vllm:spec_decode_num_drafts counter"]
        if self.k:
            lines += [
                f"vllm:spec_decode_num_drafts_total {self.drafts}",
                f"vllm:spec_decode_num_draft_tokens_total {self.draft_tokens}",
                f"vllm:spec_decode_num_accepted_tokens_total {self.accepted}",
            ]
            lines += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{j}"}} {n}'
                for j, n in enumerate(self.per_position)
            ]
        return "\n".join(lines) + "\n"


class Fault:
    """$FAKE_VLLM_FAULT for this server (k), or none; `nth()` counts completion requests."""

    def __init__(self, k: int, spec: str):
        mode, _, rest = spec.partition(":")
        fault_k, _, n = rest.partition(":")
        self.mode = mode if mode and fault_k.strip() == str(k) else ""
        self.n, self.seen, self.lock = int(n or 1), 0, threading.Lock()
        self.answered = 0  # sampled answers drawn: each its own random stream

    def nth(self) -> bool:
        """Whether this completion request is the N-th or later (the fault's)."""
        with self.lock:
            self.seen += 1
            return self.seen >= self.n


def answer(prompt: str, max_tokens: int, sampled: bool, k: int, fault: Fault, seed: int | None = None) -> list[int]:
    """A request's output ids: greedy, the prompt's fixed ids; sampled, a fresh draw (see the module docstring), or
    with the request's `seed` the draw of that seed, whatever the prompt (vLLM seeds a request's generator with it:
    one seed for every request is one noise sequence for every prompt)."""
    start = zlib.crc32(prompt.encode())
    greedy = [(start + 7 * i) % VOCAB for i in range(max_tokens)]
    if not sampled:
        return greedy
    with fault.lock:
        fault.answered += 1
        rng = random.Random(f"{k}:{start}:{fault.answered}" if seed is None else f"{k}:seed {seed}")
    if fault.mode == "short":
        return [rng.randrange(VOCAB) for _ in range(min(max_tokens, rng.randint(6, 10)))]
    ids = []
    for token in greedy:
        ids.append((token + rng.choice((0, 0, 1, 2))) % VOCAB)
        if len(ids) >= 4 and rng.random() < 0.02:
            break
    return ids


def make_handler(model: str, counters: Counters, fault: Fault):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _json(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._json({})
            elif self.path == "/version":
                self._json({"version": "fake-0.1"})
            elif self.path == "/v1/models":
                self._json({"data": [{"id": model}]})
            elif self.path == "/metrics":
                data = (Counters(0) if fault.mode == "no-counters" else counters).exposition().encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                self.send_error(404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            sampled = float(body.get("temperature") or 0) > 0
            ids = answer(body["prompt"], int(body["max_tokens"]), sampled, counters.k, fault, body.get("seed"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            faulty = fault.mode in ("die", "hang") and fault.nth()
            if faulty and fault.mode == "hang":
                self.wfile.flush()
                time.sleep(3600)
            short = sampled and fault.mode == "short"
            delay = (
                0.0
                if fault.mode == "fast"
                else float(os.environ.get("FAKE_VLLM_STEP_SECONDS") or 0) * (1 + counters.k * DRAFT_COST)
            )  # a speculative step drafts k tokens and verifies k + 1
            step, sent = 0, 0
            while sent < len(ids):
                # step 0 is the prefill: one token, no draft verified yet (vLLM drafts after it, verifies next step)
                accepted = min(counters.k, 1 + ((step - 1) % 2) * (counters.k - 1)) if counters.k and step else 0
                if short:
                    accepted = int(step == 2)  # one draft accepted an answer: about 1.1 tokens a step
                time.sleep(delay if step else delay / (1 + counters.k * DRAFT_COST))
                chunk = ids[sent : sent + accepted + 1]
                if counters.k and step:
                    counters.round(accepted)
                sent += len(chunk)
                step += 1
                choice = {
                    "index": 0,
                    "text": "".join(chr(65 + t % 26) for t in chunk),
                    "token_ids": chunk,
                    "finish_reason": None
                    if sent < len(ids)
                    else "length"
                    if sent >= int(body["max_tokens"])
                    else "stop",
                }
                self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                if faulty:  # mid-answer, as an engine core that crashed
                    self.wfile.flush()
                    print("RuntimeError: EngineCore encountered an issue (fake fault: die)", flush=True)
                    os._exit(7)
            self.wfile.write(b"data: [DONE]\n\n")

    return Handler


ENGINE = """
import ctypes, os, signal, sys, time
ctypes.CDLL("libc.so.6").prctl(15, b"VLLM::EngineCore")  # PR_SET_NAME, as vLLM's setproctitle does
if os.environ.get("FAKE_VLLM_ESCAPE") == "1":
    os.setsid()
slow_k, _, seconds = os.environ.get("FAKE_VLLM_SLOW_STOP", "").partition(":")
if seconds and slow_k == sys.argv[1]:  # a slow shutdown
    signal.signal(signal.SIGTERM, lambda *_: (time.sleep(float(seconds)), sys.exit(0)))
while True:
    time.sleep(60)
"""


def hold_device(k: int) -> int | None:
    """$FAKE_VLLM_DEVICE held for this server and its engine (the module's docstring): the lock's file descriptor,
    None without one; exits (status 5) when another server holds it."""
    import fcntl

    path = os.environ.get("FAKE_VLLM_DEVICE")
    if not path:
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(f"{path}.overlap", "a") as f:
            f.write(f"{k}\n")
        print(f"RuntimeError: device busy: another server holds {path} (out of memory)", flush=True)
        os._exit(5)
    return fd


def start_engine(k: int, device: int | None = None) -> None:
    """The EngineCore stand-in (see the module's docstring), and the pid file; `device`: the lock it holds too."""
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(k)],
        stdin=subprocess.DEVNULL,
        pass_fds=(device,) if device is not None else (),
    )
    folder = os.environ.get("FAKE_VLLM_PIDS")
    if folder:
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump({"server": os.getpid(), "engine": engine.pid, "k": k}, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--speculative-config", default=None)
    args, _ = parser.parse_known_args()
    k = int(json.loads(args.speculative_config)["num_speculative_tokens"]) if args.speculative_config else 0
    print(f"fake vLLM for {args.model} on {args.port}, k={k}", flush=True)
    fault = Fault(k, os.environ.get("FAKE_VLLM_FAULT", ""))
    start_engine(k, hold_device(k))
    ThreadingHTTPServer((args.host, args.port), make_handler(args.model, Counters(k), fault)).serve_forever()


if __name__ == "__main__":
    main()
