"""Targets larger than one GPU: the config-only size estimate, the placement plan, `+` device groups, N leases
taken all or nothing, the recorded device name, and greedy losslessness with an accelerate-dispatched target.

No GPU here: groups are exercised with fake CPU slots (cpu:0+cpu:1, their free memory given by the test) and the
dispatched target with accelerate's hooks on the CPU."""

from __future__ import annotations

import copy
import socket

import pytest
import torch
from sqlalchemy import text

import app.worker.supervisor as supervisor
from app.runtime.placement import acquire_leases, device_name, group_members, load_device, place
from app.worker.supervisor import DevicesError, parse_devices
from app.worker.worker import Worker
from engine.decoding import runs
from engine.decoding.sampling import SamplingConfig
from engine.errors import DraftLabError
from engine.models.loading import _check_dispatched, load_model, plan_pair
from engine.models.placement import HEADROOM, Placement, model_devices, plan, weight_bytes
from storage.jobs.experiments import enqueue_experiment
from storage.jobs.leases import acquire_lease, release_lease
from tests import tiny_models as tm

GB = 10**9
HOST = socket.gethostname()
PROMPTS = ["t5 t6 t7", "t9 t3 t22 t40"]


# --- the plan ---------------------------------------------------------------------------------------------------


def test_a_pair_that_fits_the_first_gpu_takes_one():
    assert plan(10 * GB, 1 * GB, [80 * GB, 80 * GB]) == Placement(1, None)
    usable = int(80 * GB * (1 - HEADROOM))
    assert plan(usable - GB, GB, [80 * GB, 80 * GB]).gpus == 1  # exactly full: still one
    assert plan(usable - GB + 1, GB, [80 * GB, 80 * GB]).gpus == 2  # one byte more: two


def test_a_target_larger_than_one_gpu_takes_the_fewest_that_hold_it_with_its_budget():
    p = plan(100 * GB, 2 * GB, [80 * GB, 80 * GB, 80 * GB])
    usable = int(80 * GB * (1 - HEADROOM))
    assert p.gpus == 2
    assert p.max_memory == {0: usable - 2 * GB, 1: usable}  # the draft's room is kept on the first GPU
    assert plan(130 * GB, 2 * GB, [80 * GB] * 4).gpus == 3


def test_a_pair_that_fits_no_gpus_is_one_line_naming_the_sizes_and_the_fixes():
    with pytest.raises(DraftLabError) as err:
        plan(150 * GB, 0, [80 * GB, 80 * GB], target="target big/model")
    message = str(err.value)
    assert "\n" not in message
    assert (
        "target big/model needs ~150 GB in bfloat16" in message and "2 visible GPUs have 80 GB + 80 GB free" in message
    )
    assert "draftlab worker --devices cuda:0+cuda:1" in message and "--dtype" not in message
    with pytest.raises(DraftLabError, match=r"float32 .* or --dtype bfloat16$"):
        plan(150 * GB, 0, [80 * GB, 80 * GB], dtype=torch.float32)


@pytest.mark.parametrize("build, dtype", [(tm.llama, torch.float32), (tm.gpt2, torch.bfloat16)])
def test_the_config_only_estimate_is_the_real_parameter_bytes(tmp_path, build, dtype):
    model = build(0, layers=3)
    model.save_pretrained(tmp_path)
    real = sum(p.numel() for p in model.parameters())
    assert weight_bytes(str(tmp_path), dtype) == real * dtype.itemsize


def test_plan_pair_reads_both_configs_and_refuses_an_unknown_model(model_dirs):
    one = plan_pair(model_dirs["target"], model_dirs["draft"], torch.float32, free=[10 * GB])
    assert one == Placement(1, None)
    size = weight_bytes(model_dirs["target"], torch.float32)
    two = plan_pair(model_dirs["target"], None, torch.float32, free=[int(size * 0.7)] * 2)
    assert two.gpus == 2
    with pytest.raises(DraftLabError, match="not found"):
        plan_pair("./no/such/model", None, torch.float32, free=[GB])


def test_a_dispatched_model_that_spilled_to_the_cpu_is_refused_and_accelerate_is_named_when_missing(monkeypatch):
    class Spilled(torch.nn.Module):
        hf_device_map = {"model.layers.0": 0, "model.layers.1": "cpu"}

    with pytest.raises(DraftLabError, match="accelerate put part of it on cpu"):
        _check_dispatched("big", Spilled())
    _check_dispatched("fits", type("Fits", (), {"hf_device_map": {"a": 0, "b": 1}})())
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DraftLabError, match=r"'demo-target'.*GPUs.*pip install accelerate$"):
        load_model("demo-target", torch.device("cuda", 0), torch.float32, max_memory={0: GB, 1: GB})


# --- groups -----------------------------------------------------------------------------------------------------


def test_device_groups_parse_in_index_order_and_are_refused_when_they_overlap_or_mix():
    assert parse_devices("cuda:1+cuda:0,cuda:2", count=lambda: 3) == ["cuda:0+cuda:1", "cuda:2"]
    assert parse_devices("cpu:0+cpu:1,cpu:2") == ["cpu:0+cpu:1", "cpu:2"]
    for spec, words in [
        ("cuda:0+cuda:1,cuda:1", "twice"),
        ("cuda:0+cpu:1", "mixes cuda and cpu"),
        ("cuda:0+cuda:3", "sees 2 CUDA GPU"),
        ("cuda:0+", "groups joined with"),
    ]:
        with pytest.raises(DevicesError, match=words):
            parse_devices(spec, count=lambda: 2)
    assert group_members("cuda:0+cuda:1") == ["cuda:0", "cuda:1"] and group_members("cpu:3") == ["cpu:3"]
    assert place("auto", "cuda:0+cuda:1") == "cuda:0+cuda:1" and place("cpu", "cuda:0+cuda:1") == "cpu"
    assert load_device("cuda:0+cuda:1") == "auto" and load_device("cpu:0+cpu:1") == "cpu"


def test_a_group_child_sees_all_its_gpus(monkeypatch):
    seen = []

    class Popen:
        def __init__(self, argv, env, **kwargs):
            seen.append((argv, env))
            self.pid = 1

    monkeypatch.setattr(supervisor.subprocess, "Popen", Popen)
    sup = supervisor.Supervisor("sqlite://", ["cuda:0+cuda:1", "cuda:2"], log=lambda m: None, env={})
    for child in sup.children:
        sup._spawn(child)
    (argv0, env0), (argv1, env1) = seen
    assert env0["CUDA_VISIBLE_DEVICES"] == "0,1" and env1["CUDA_VISIBLE_DEVICES"] == "2"
    assert argv0[argv0.index("--device") + 1] == "cuda:0+cuda:1"
    assert sup.children[0].worker_id.endswith("@cuda:0+cuda:1")


def test_the_recorded_device_names_every_device_of_the_job(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    gpu = torch.device("cuda", 0)
    assert device_name(gpu, "cuda:2+cuda:3", ["cuda:2", "cuda:3"]) == "NVIDIA H200 ×2 (cuda:2, cuda:3)"
    assert device_name(gpu, None, ["cuda:0", "cuda:1", "cuda:2"]) == "NVIDIA H200 ×3 (cuda:0, cuda:1, cuda:2)"
    assert device_name(gpu, "cuda:2+cuda:3", ["cuda:2"]) == "NVIDIA H200 (cuda:2)"  # one GPU of the group
    assert device_name(gpu, "cuda:1") == "NVIDIA H200 (cuda:1)"  # a pinned worker, as before
    assert device_name(torch.device("cpu"), "cpu:0+cpu:1", ["cpu:0", "cpu:1"]) == "cpu ×2 (cpu:0, cpu:1)"


# --- leases -----------------------------------------------------------------------------------------------------


def _leases(store):
    with store.read() as conn:
        return dict(conn.execute(text("SELECT device, worker_id FROM device_leases")).all())


def _quiet(store, device, **kw):
    return Worker(store, device=device, log=lambda m: None, heartbeat_seconds=0.5, poll_seconds=0.05, **kw)


def test_a_group_takes_its_leases_all_or_nothing_and_gives_them_back(store):
    k0, k1 = f"{HOST}:cpu:0", f"{HOST}:cpu:1"
    with _quiet(store, "cpu:0+cpu:1") as group, _quiet(store, "cpu:1") as single:
        assert acquire_lease(store, k1, single.id, None, 60) is None
        assert acquire_leases(group.db, store, [k0, k1], group.id, None, 60) == (k1, single.id)
        assert _leases(store) == {k1: single.id}  # cpu:0 was given back: nothing held while it waits
        release_lease(store, k1, single.id)
        assert acquire_leases(group.db, store, [k0, k1], group.id, None, 60) is None
        assert _leases(store) == {k0: group.id, k1: group.id}
        assert acquire_lease(store, k1, single.id, None, 60) == group.id  # the single slot now waits


def _enqueue(store, model_dirs, **kw):
    return enqueue_experiment(
        store,
        name="big",
        target=model_dirs["target"],
        draft=model_dirs["draft"],
        prompts="inline",
        sampling={"temperature": 0.0, "max_new_tokens": 6, "seed": 3},
        device="auto",
        sweep_values=[2],
        prompt_texts=PROMPTS,
        **kw,
    )


def _device_names(store, eid):
    with store.read() as conn:
        return conn.execute(
            text("SELECT status, device_name, error FROM runs WHERE experiment_id = :e ORDER BY id"), {"e": eid}
        ).all()


def test_a_job_that_needs_both_slots_of_a_group_leases_both_while_a_single_slot_waits(store, model_dirs):
    size = weight_bytes(model_dirs["target"], torch.float32) + weight_bytes(model_dirs["draft"], torch.float32)
    tight = int(size / (1 - HEADROOM) * 0.6)  # each slot holds 60 % of the pair: it takes two
    eid = _enqueue(store, model_dirs)
    seen = []
    with _quiet(store, "cpu:1") as single:

        def hook(run, prompt_index, tokens, repeat):
            if not seen:
                seen.append((_leases(store), acquire_lease(store, f"{HOST}:cpu:1", single.id, None, 60)))

        group = _quiet(store, "cpu:0+cpu:1", free_memory=lambda: [tight, tight], progress_hook=hook)
        with group:
            group.work(until_idle=True)
            assert _leases(store) == {}  # both given back after the job (not only when the worker stops)
    leases, holder = seen[0]
    assert leases == {f"{HOST}:cpu:0": group.id, f"{HOST}:cpu:1": group.id}
    assert holder == group.id  # the worker on cpu:1 waits while the group holds it
    assert _device_names(store, eid) == [("done", "cpu ×2 (cpu:0, cpu:1)", None)] * 2

    roomy = _enqueue(store, model_dirs)  # room on one slot: the group takes cpu:0 alone
    with _quiet(store, "cpu:0+cpu:1", free_memory=lambda: [10 * GB, 10 * GB]) as group:
        group.work(until_idle=True)
    assert _device_names(store, roomy) == [("done", "cpu:0", None)] * 2


def test_a_job_larger_than_every_slot_of_the_worker_fails_with_the_fix(store, model_dirs):
    eid = _enqueue(store, model_dirs)
    with _quiet(store, "cpu:0+cpu:1", free_memory=lambda: [1000, 1000]) as group:
        group.work(until_idle=True)
        assert _leases(store) == {}
    rows = _device_names(store, eid)
    assert [r[0] for r in rows] == ["failed", "failed"]
    assert all("needs ~" in r[2] and "--devices cuda:0+cuda:1" in r[2] and "\n" not in r[2] for r in rows)


# --- a dispatched target ----------------------------------------------------------------------------------------


def test_greedy_speculative_with_an_accelerate_dispatched_target_equals_target_only():
    from accelerate import dispatch_model

    target = tm.llama(0, layers=4, sharpness=4.0)
    plain = tm.pair(copy.deepcopy(target), tm.noisy_copy(target, seed=1, noise=0.6))
    device_map = {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.norm": "cpu",
        "lm_head": "cpu",
        **{f"model.layers.{i}": "cpu" for i in range(4)},
    }
    # As transformers' from_pretrained(device_map=...) does it: the KV cache is never moved by the hooks.
    dispatched = dispatch_model(
        target, device_map=device_map, force_hooks=True, skip_keys=target._skip_keys_device_placement
    )
    assert dispatched._hf_hook.io_same_device and hasattr(dispatched.model.layers[3], "_hf_hook")  # hooks in place
    spread = tm.pair(dispatched, plain.draft.model)
    assert spread.devices == (torch.device("cpu"),) == model_devices(dispatched)
    cfg = SamplingConfig(temperature=0, max_new_tokens=30)
    prompts = ["t5", "t9 t3 t22", "t40 t41 t2 t8 t9 t10"]
    ids = runs.encode_prompts(plain, prompts, 30)
    base = list(runs.run_prompts(runs.baseline_decoder(plain, cfg), prompts, ids))
    for k in (1, 3, 5):
        spec = list(runs.run_prompts(runs.speculative_decoder(spread, cfg, k), prompts, ids))
        assert [s.output_ids for s in spec] == [b.output_ids for b in base]
        assert sum(r.rejected for s in spec for r in s.rounds) > 0  # rollbacks happened through the hooks


def test_the_top_level_hook_returns_logits_to_the_input_device_and_leaves_the_cache_on_its_layers():
    """What a target over several GPUs relies on: its logits come back to the first GPU (where the draft and the
    sampling are), and the KV cache, whose layers live on their GPUs, passes through untouched (BatchCache's
    `cache` keyword and the output's `cache` field are accelerate's skip_keys)."""
    from accelerate import dispatch_model
    from transformers import DynamicCache

    from engine.decoding.batched_cache import BatchCache

    target = tm.llama(0, layers=2)
    device_map = {"model": "cpu", "lm_head": "cpu"}
    dispatched = dispatch_model(
        target, device_map=device_map, force_hooks=True, skip_keys=target._skip_keys_device_placement
    )
    cached = BatchCache(dispatched, 64)
    hook = dispatched._hf_hook
    assert cached._cache_kw in hook.skip_keys
    cache = DynamicCache()
    cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
    output_type = type(dispatched(torch.tensor([[5, 6]])))
    hook.input_device = torch.device("meta")  # stands for "the first GPU": anything but where the tensors are
    out = hook.post_forward(dispatched, output_type(logits=torch.zeros(2), cache=cache))
    assert out.logits.device.type == "meta"
    assert out.cache is cache and cache.layers[0].keys.device.type == "cpu"


def test_load_pair_on_auto_with_two_gpus_spreads_a_large_target_and_puts_the_draft_on_the_first(
    model_dirs, monkeypatch
):
    """The wiring of engine.models.loading.load_pair over several GPUs, with torch's CUDA queries faked (no GPU here):
    the target gets accelerate's max_memory over the planned GPUs, the draft none, on cuda:0."""
    import engine.models.loading as loading

    calls = []

    def fake_load(name, device, dtype, trust_remote_code=False, max_memory=None):
        calls.append((name, device, dtype, max_memory))
        built = tm.llama(0)
        return loading.LoadedModel(name, name, built, tm.tokenizer())

    draft_bytes = weight_bytes(model_dirs["draft"], torch.bfloat16)
    size = weight_bytes(model_dirs["target"], torch.bfloat16) + draft_bytes
    tight = int(size / (1 - HEADROOM) * 0.6)  # the pair needs both GPUs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(loading.placement, "free_gpu_memory", lambda: [tight, tight])
    monkeypatch.setattr(loading, "load_model", fake_load)
    pair = loading.load_pair(model_dirs["target"], model_dirs["draft"], "auto", "auto")
    (t_name, t_dev, t_dtype, t_budget), (d_name, d_dev, _, d_budget) = calls
    assert (t_name, t_dev, t_dtype) == (model_dirs["target"], torch.device("cuda", 0), torch.bfloat16)
    assert t_budget == {0: int(tight * (1 - HEADROOM)) - draft_bytes, 1: int(tight * (1 - HEADROOM))}
    assert (d_name, d_dev, d_budget) == (model_dirs["draft"], torch.device("cuda", 0), None)
    assert pair.device == torch.device("cuda", 0)

    calls.clear()  # a worker that leased one GPU: one, whatever the plan would say now
    loading.load_pair(model_dirs["target"], None, "auto", "auto", gpus=1)
    assert calls[0][3] is None
    calls.clear()
    monkeypatch.setattr(loading.placement, "free_gpu_memory", lambda: [10 * GB, 10 * GB])
    loading.load_pair(model_dirs["target"], None, "auto", "auto")  # room on one: no dispatch
    assert calls[0][1:] == (torch.device("cuda", 0), torch.bfloat16, None)
    calls.clear()  # ... unless the worker leased two for it
    loading.load_pair(model_dirs["target"], None, "auto", "auto", gpus=2)
    assert sorted(calls[0][3]) == [0, 1]


def test_a_plain_worker_seeing_two_gpus_leases_both_for_a_large_target_and_loads_it_on_both(
    store, model_dirs, monkeypatch
):
    """Plain `draftlab worker` on a machine with two GPUs (torch's CUDA queries faked; the fake loader loads on
    the CPU): the plan takes both, the leases are host:cuda:0 and host:cuda:1, the loader is told gpus=2."""
    from engine.models.loading import load_pair

    size = weight_bytes(model_dirs["target"], torch.bfloat16) + weight_bytes(model_dirs["draft"], torch.bfloat16)
    tight = int(size / (1 - HEADROOM) * 0.6)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    loads, seen = [], []

    def loader(target, draft, device, dtype, trust_remote_code, **options):
        loads.append((device, options))
        return load_pair(target, draft, "cpu", "float32")

    eid = _enqueue(store, model_dirs)
    worker = _quiet(
        store,
        None,
        free_memory=lambda: [tight, tight],
        loader=loader,
        progress_hook=lambda *a: seen or seen.append(_leases(store)),
    )
    with worker:
        worker.work(until_idle=True)
    assert loads == [("auto", {"gpus": 2})]
    assert seen == [{f"{HOST}:cuda:0": worker.id, f"{HOST}:cuda:1": worker.id}]
    assert [r[0] for r in _device_names(store, eid)] == ["done", "done"]
