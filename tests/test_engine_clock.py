"""Round timing without device stalls: draft and verify are timed with CUDA events read after the round's one
host transfer (which waits for the device anyway); the only synchronizations are the per-prompt wall clock's.
CUDA cannot run here: its path is checked with fake events that fail if read before the transfer."""

import time

import pytest
import torch

from engine.decoding import runs, speculative
from engine.decoding.clock import RoundClock
from engine.decoding.sampling import SamplingConfig
from tests import tiny_models as tm

PROMPTS = ["t3 t4 t5", "t9 t7 t22 t40 t41 t2"]


@pytest.fixture(scope="module")
def pair():
    target = tm.llama(0, layers=2, sharpness=4.0)
    return tm.pair(target, tm.noisy_copy(target, 1, 0.6))


def test_cpu_rounds_report_draft_and_verify_seconds_within_wall_time(pair):
    cfg = SamplingConfig(temperature=0, max_new_tokens=24)
    ids = runs.encode_prompts(pair, PROMPTS, 24)
    for result in runs.run_prompts(runs.speculative_decoder(pair, cfg, 3), PROMPTS, ids):
        assert result.rounds and result.wall_seconds > 0
        assert all(r.draft_seconds > 0 and r.verify_seconds > 0 for r in result.rounds)
        assert sum(r.draft_seconds + r.verify_seconds for r in result.rounds) <= result.wall_seconds
    base = list(runs.run_prompts(runs.baseline_decoder(pair, cfg), PROMPTS, ids))
    assert all(0 < b.decode_seconds < b.wall_seconds for b in base)


class FakeDevice:
    """A device timeline: events complete only when a host transfer waits for the work queued before it."""

    def __init__(self):
        self.pending, self.syncs, self.transfers, self.reads = [], 0, 0, 0

    def event(self):
        device = self

        class Event:
            def __init__(self):
                self.at, self.done = time.perf_counter(), False
                device.pending.append(self)

            def elapsed_time(self, end):
                assert self.done and end.done, "event read before the device reached it (would raise on CUDA)"
                device.reads += 1
                return (end.at - self.at) * 1000.0  # milliseconds, like torch.cuda.Event

        return Event()

    def wait(self):
        for e in self.pending:
            e.done = True
        self.pending.clear()

    def synchronize(self):
        self.syncs += 1
        self.wait()


def test_cuda_path_records_events_and_reads_them_after_the_round_transfer(pair, monkeypatch):
    device = FakeDevice()
    real_to_host = speculative.rows_to_host

    def to_host(*args, **kwargs):
        device.transfers += 1
        out = real_to_host(*args, **kwargs)
        device.wait()  # .tolist() waits for everything queued before it
        return out

    monkeypatch.setattr(speculative, "rows_to_host", to_host)
    cfg = SamplingConfig(temperature=0, max_new_tokens=24)
    decoder = runs.speculative_decoder(pair, cfg, 3)
    decoder.clock = RoundClock(torch.device("cuda"), event=device.event, synchronize=device.synchronize)
    ids = runs.encode_prompts(pair, PROMPTS, 24)
    for i, prompt in enumerate(PROMPTS):
        device.syncs = device.transfers = device.reads = 0
        result = decoder.generate(prompt, ids[i], i)
        rounds = len(result.rounds)
        assert rounds > 2
        assert device.syncs == 1  # the wall clock at the start; the end is the last round's arrival; none per round
        assert device.transfers == rounds  # one host transfer per round
        assert device.reads == 2 * rounds  # draft and verify intervals
        assert all(r.draft_seconds > 0 and r.verify_seconds > 0 for r in result.rounds)
        assert sum(r.draft_seconds + r.verify_seconds for r in result.rounds) <= result.wall_seconds


def test_clock_units():
    cpu = RoundClock(torch.device("cpu"))
    a = cpu.mark()
    time.sleep(0.01)
    assert 0.005 < cpu.seconds(a, cpu.mark()) < 1
    device = FakeDevice()
    cuda = RoundClock(torch.device("cuda"), event=device.event, synchronize=device.synchronize)
    a = cuda.mark()
    time.sleep(0.01)
    b = cuda.mark()
    cuda.wall()
    assert device.syncs == 1 and 0.005 < cuda.seconds(a, b) < 1  # elapsed_time's ms converted to seconds
