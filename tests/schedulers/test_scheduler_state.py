"""Each scheduler owns its checkpoint: a scheduler loaded from another's ``state_dict``
(through a checkpoint file, as the run loop writes it) continues as the first one does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedforge.core.checkpoint import load_checkpoint, save_checkpoint
from fedforge.engine import LoopEngine
from fedforge.schedulers.fedast import AsyncOptions, AsyncScheduler
from fedforge.schedulers.multitask_sync import SyncOptions, SyncScheduler
from fedforge.sim.delays import ShiftedExponential
from fedforge.sim.population import Population
from tests.schedulers.async_helpers import quadratic_task, step_until

CENTERS = [[[1, 2], [3, 4], [5, 6], [0, 1]], [[10, 0], [-10, 0], [0, 3], [1, 1]]]


def _scheduler(method: str):
    tasks = [quadratic_task(m, c) for m, c in enumerate(CENTERS)]
    pop = Population(np.array([1.3, 1.0, 0.7, 1.0]))
    if method == "sync_st":
        return SyncScheduler(tasks, pop, ShiftedExponential(), SyncOptions(method, 4, k=1), 0,
                             LoopEngine())
    opts = AsyncOptions(method, requests=(4,), rb_ratio=2, variance_window=3,
                        c_period_factor=0.5)
    return AsyncScheduler(tasks, pop, ShiftedExponential(), opts, seed=3)


@pytest.mark.parametrize("method", ["fedast", "fedbuff", "sync_st"])
def test_a_loaded_scheduler_continues_as_the_uninterrupted_one(tmp_path, method):
    whole, first = _scheduler(method), _scheduler(method)
    for s in (whole, first):
        s.start()
    step_until(whole, 40)
    step_until(first, 16)
    tensors, meta = first.state_dict()
    save_checkpoint(tmp_path, first.c, tensors, {"driver": meta})
    loaded_tensors, loaded_meta = load_checkpoint(tmp_path)
    assert json.loads(json.dumps(loaded_meta["driver"])) == loaded_meta["driver"]
    second = _scheduler(method)
    second.load_state_dict(loaded_tensors, loaded_meta["driver"], tmp_path / "x.json")
    assert second.c == first.c
    step_until(second, 40)
    assert second.c == whole.c and second.clock.now == whole.clock.now
    assert second.summary() == whole.summary()
    for a, b in zip(whole.tasks, second.tasks, strict=True):
        assert a.server.round == b.server.round
        assert torch.equal(a.server.params["w"], b.server.params["w"])
