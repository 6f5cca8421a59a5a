"""The authors' allocation rules (``async.allocation = "code"``), one test per rule.

Every number is worked out by hand in the docstring; each test fails when its rule is
removed (window 8 instead of 7, the last estimate instead of the period mean, no chunks,
no global cap, a capped start, ceil instead of round, no 8-round wait, bias tensors kept,
the paper's ``eta_c eta_s tau`` scale).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedforge.schedulers.allocation_code import (
    CodeAllocator,
    arrival_buffer,
    code_speed_factors,
    code_variance,
    finish_buffer,
    finish_split,
    new_requests,
    redistribute,
)
from fedforge.schedulers.fedast import AsyncOptions, AsyncScheduler
from fedforge.sim.delays import ConstantDelay
from fedforge.sim.population import FEDAST_SPEED_CLASSES, Population
from tests.schedulers.async_helpers import quadratic_task

PAIR = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([3.0, 0.0])}]  # spread 1/4


def test_eta_scaling_and_halving():
    """Spread of (1,0),(3,0): 2 / (||(2,0)||^2 * 2) = 1/4. The code scales by
    eta_c eta_s / (eta_c tau)^2 = 0.05 / 0.16 and halves: 0.25 * 0.3125 / 2 = 0.0390625
    (the paper's eta_c eta_s tau would give 0.05)."""
    assert code_variance(PAIR, 0.1, 0.5, 4) == pytest.approx(0.0390625)


def test_bias_tensors_are_skipped():
    """A bias with a huge spread changes nothing: only the weight enters (same 0.0390625)."""
    win = [{"fc.weight": p["w"], "fc.bias": torch.tensor([b])} for p, b in zip(PAIR, (100., -50.))]
    assert code_variance(win, 0.1, 0.5, 4) == pytest.approx(0.0390625)


def test_window_holds_seven_deltas():
    """Deltas 1..8 (1-d): nothing is estimated before the 8th; then the oldest is dropped and
    2..8 give mean 5, spread 28 / (25 * 7) = 0.16, times 0.1 / (0.1 * 2)^2 = 2.5, halved:
    0.2 (eight deltas would give 42 / (20.25 * 8) * 1.25 = 0.324)."""
    alloc = CodeAllocator(1, 32)
    for x in range(1, 8):
        alloc.observe(0, {"w": torch.tensor([float(x)])}, 0.1, 1.0, 2)
    assert alloc.estimates == [[]]
    alloc.observe(0, {"w": torch.tensor([8.0])}, 0.1, 1.0, 2)
    assert len(alloc.windows[0]) == 7
    assert alloc.estimates[0] == [pytest.approx(0.2)]
    assert alloc.counter == 8


def test_realloc_averages_the_period_estimates():
    """Task 0's estimates 5 and 1 average to 3 (the last one alone is 1); task 1 has 1:
    128 requests ∝ (3, 1) in chunks of 32 -> (96, 32) (the last estimate gives (64, 64)).
    Four estimates of 1 against one of 1 are equal weights (their sum would be 4 : 1)."""
    alloc = CodeAllocator(2, 128)
    alloc.estimates = [[5.0, 1.0], [1.0]]
    assert alloc.realloc([64, 64]) == [96, 32]
    assert alloc.estimates == [[], []] and alloc.counter == 0
    alloc.estimates = [[1.0] * 4, [1.0]]
    assert alloc.realloc([64, 64]) == [64, 64]


def test_realloc_in_chunks_of_32_matches_the_demo():
    """Demo learning rates (0.1, 0.06, 0.1, 7), tau 27, eta_s 0.1 and equal spread: weights
    ∝ 1 / eta_c. 384 requests: every task 32, then 8 chunks by the largest
    int(384 v / sum v) - given: MNIST/FMNIST/CIFAR/Shakespeare 96/160/96/32."""
    v = [code_variance(PAIR, lr, 0.1, 27) for lr in (0.1, 0.06, 0.1, 7.0)]
    assert redistribute([96] * 4, v) == [96, 160, 96, 32]
    # not a multiple of 32: 32 + 32, then two more chunks overshoot 100 to 128
    assert redistribute([50, 50], [1.0, 1.0]) == [64, 64]
    assert redistribute([64, 0], [1.0, 5.0]) == [64, 0]  # a finished task gets nothing


def test_waits_for_eight_rounds_of_every_task():
    """Period (64 * 3 // 4) * 2 running tasks = 96 arrivals; a finished task still counts in
    min(rounds) > 8."""
    alloc = CodeAllocator(2, 64)
    alloc.estimates = [[1.0], [1.0]]
    alloc.counter = 95
    assert not alloc.due([9, 9], [32, 32])
    alloc.counter = 96
    assert not alloc.due([9, 8], [32, 32])
    assert alloc.due([9, 9], [32, 32])
    assert not alloc.due([9, 3], [64, 0])  # the finished task sits at round 3
    alloc.estimates = [[1.0], []]
    assert not alloc.due([9, 9], [32, 32])  # every running task needs an estimate
    assert alloc.due([9, 9], [64, 0])  # ...but not a finished one (48 arrivals suffice)


def test_new_requests_global_cap():
    """min(R_m - a_m, sum R - sum a, 2), never negative."""
    assert new_requests(12, 7, 16, 15) == 1
    assert new_requests(12, 7, 16, 12) == 2
    assert new_requests(12, 7, 16, 18) == 0
    assert new_requests(4, 7, 16, 15) == 0


def test_round_at_finish_ceil_at_arrival():
    """R = 40: round(40 / 32) = 1 when a finished task's requests arrive, ceil = 2 after an
    arrival with 40 in flight; round(2.5) = 2 (halves to even)."""
    assert finish_buffer(40) == 1 and arrival_buffer(40) == 2
    assert finish_buffer(80) == 2 and finish_buffer(8) == 1


def test_finish_split_remainder_is_random():
    """5 freed requests over R = (1, 1, 0): int(5/2) = 2 each, the 1 left to task 0 or 1 at
    random (both happen over seeds), never to the finished task 2."""
    outs = {tuple(finish_split(5, [1, 1, 0], np.random.default_rng(s))) for s in range(20)}
    assert outs == {(3, 2, 0), (2, 3, 0)}


def test_speed_classes_follow_the_code_shuffle():
    """random.seed(64) shuffles 0..9 to (2, 9, 3, 8, 0, 5, 4, 6, 1, 7); int(2.5) = 2 slow,
    up to int(7.5) = 7 normal, 3 fast (the exact-count split would give 3 / 5 / 2)."""
    s = code_speed_factors(10, FEDAST_SPEED_CLASSES, 64)
    expect = np.empty(10)
    expect[[2, 9]] = 1.3
    expect[[3, 8, 0, 5, 4]] = 1.0
    expect[[6, 1, 7]] = 0.7
    np.testing.assert_array_equal(s, expect)


def _driver(allocation: str, n: int = 1000, fraction: float = 1.0) -> AsyncScheduler:
    """Two quadratic tasks, 8 requests each; task 0 is 100x slower per step."""
    c = [[1.0, 0.0], [-1.0, 0.0]]
    tasks = [quadratic_task(0, c, step_time=100.0), quadratic_task(1, c, step_time=0.5)]
    opts = AsyncOptions("fedast", requests=(8,), rb_ratio=32, allocation=allocation)
    return AsyncScheduler(tasks, Population.build(n, available_fraction=fraction), ConstantDelay(),
                       opts, seed=0)


def test_start_is_uncapped():
    """10 clients, at most 3 busy: the code sends all 16 initial requests (6+ clients busy);
    the paper's start skips draws of idle clients once 3 are busy."""
    d = _driver("code", n=10, fraction=0.3)
    d.start()
    assert len(d.clock.pending()) == 16 and sum(d.cur) == 16 and d.clock.num_busy > 3
    p = _driver("paper", n=10, fraction=0.3)
    p.start()
    assert p.clock.num_busy == 3 and len(p.clock.pending()) < 16


@pytest.mark.parametrize(("allocation", "expect"), [("code", 8), ("paper", 9)])
def test_driver_caps_by_global_free_slots(allocation, expect):
    """After a reallocation to R = (4, 12) with 8 + 8 in flight, a task-1 arrival leaves 15 in
    flight: the code sends min(5, 16 - 15, 2) = 1 (back to 8), the paper's rule 2."""
    d = _driver(allocation)
    d.start()
    d.R = [4, 12]
    job = d.step(lambda m, r: None)
    assert job.task == 1
    assert d.cur[1] == expect


def test_driver_finish_uses_round_and_random_split():
    """R = (24, 16); task 1 finishes: task 0 gets all 16 -> 40, b = round(40/32) = 1."""
    d = _driver("code")
    d.start()
    d.R = [24, 16]
    d._finish(1)
    assert d.R == [40, 0] and d.tasks[0].server.b == 1


def test_code_lenet5_has_no_padding_and_a_relu_output():
    """28x28 without padding: 24 -> 12 -> 8 -> 4, flatten 16 * 4 * 4 = 256. Parameters
    156 + 2416 + (256 * 120 + 120) + (120 * 84 + 84) + (84 * 10 + 10) = 44426."""
    from fedforge.models import build_model

    torch.manual_seed(0)
    m = build_model("lenet5", (1, 28, 28), 10, variant="code")
    assert m.classifier[0].in_features == 256
    assert sum(p.numel() for p in m.parameters()) == 44426
    assert float(m(torch.randn(4, 1, 28, 28)).detach().min()) >= 0.0
    assert build_model("lenet5", (1, 28, 28), 10).classifier[0].in_features == 400
    with pytest.raises(ValueError, match="model.options.variant"):
        build_model("lenet5", (1, 28, 28), 10, variant="x")


def test_drop_last_runs_epochs_of_full_batches():
    """10 samples, batch 4, 5 steps: epochs of 10 // 4 = 2 batches, each a fresh permutation;
    the 2 samples left in an epoch are skipped, so every epoch's 8 positions are distinct."""
    from fedforge.data.batching import client_batches

    pos, mask = client_batches(torch.tensor([10]), 5, None, 4, torch.Generator().manual_seed(0),
                               drop_last=True)
    assert pos.shape == (1, 5, 4) and bool(mask.all())
    for epoch in (pos[0, 0:2], pos[0, 2:4]):
        assert len(set(epoch.flatten().tolist())) == 8
    plain, _ = client_batches(torch.tensor([10]), 5, None, 4, torch.Generator().manual_seed(0))
    assert len(set(plain[0, 0:3].flatten().tolist()[:10])) == 10  # no drop: a full pass
    with pytest.raises(ValueError, match="drop_last"):
        client_batches(torch.tensor([10]), None, 1, 4, torch.Generator(), drop_last=True)
