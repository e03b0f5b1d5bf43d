"""benchmarks/bench_batch.py's forward clock (where a pass's time goes): it counts every forward of each model per
arm, keeps the forward's signature while clocked (generate() inspects it: a bare wrapper would make it compute
the logits of every position and slow the arm it measures), and puts the class's forward back afterwards."""

from __future__ import annotations

import inspect

import torch

from benchmarks.bench_batch import forward_split
from tests import tiny_models as tm


def test_forward_split_counts_forwards_per_arm_and_restores_the_model():
    target, draft = tm.llama(0), tm.llama(1)
    seen = []

    def one(unit):  # one target forward per unit
        seen.append("logits_to_keep" in inspect.signature(target.forward).parameters)
        target(input_ids=torch.tensor([[3, 4, 5]]))

    def two(unit):  # one forward of each model per unit, twice
        for _ in range(2):
            target(input_ids=torch.tensor([[3]]))
            draft(input_ids=torch.tensor([[3]]))

    with torch.inference_mode():
        walls, passes = forward_split(
            {"one": one, "two": two}, [0, 1, 2], {"target": target, "draft": draft}, 2, lambda: None
        )
    assert len(walls["one"]) == len(walls["two"]) == 2
    for p in passes["one"]:
        assert set(p) == {"target"} and p["target"][0] == 3
    for p in passes["two"]:
        assert p["target"][0] == p["draft"][0] == 6
    assert all(seen) and len(seen) == 6
    assert "forward" not in vars(target) and "forward" not in vars(draft)
