import math

import pytest
import torch

from fedforge.schedulers.allocation import (
    buffer_size,
    estimate_variance,
    normalized_variance,
    proportional_split,
    realloc,
)
from fedforge.schedulers.fedast import AsyncOptions, AsyncScheduler
from fedforge.sim.delays import ConstantDelay
from fedforge.sim.population import Population
from tests.schedulers.async_helpers import quadratic_task, step_until


def test_normalized_variance_hand():
    """Deltas (1,0) and (3,0): mean (2,0), spread mean((1)^2, (1)^2) = 1, /||mean||^2 = 1/4."""
    w = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([3.0, 0.0])}]
    assert normalized_variance(w) == pytest.approx(0.25)
    assert estimate_variance(w, 0.1, 0.5, 4) == pytest.approx(0.1 * 0.5 * 4 * 0.25)


def test_realloc_proportional_to_std_and_keeps_total():
    # sigma^2 = 1 and 9 -> std 1 : 3 -> 40 requests split 10 : 30
    assert realloc([20, 20], [1.0, 9.0]) == [10, 30]
    assert sum(realloc([7, 5, 3], [0.3, 2.0, 0.01])) == 15
    assert proportional_split(10, [1, 1, 1], 1) == [4, 3, 3]  # ties to the lower index
    assert realloc([5, 5], [0.0, 1e-12], minimum=2)[0] >= 2


def test_buffer_size_rule():
    assert [buffer_size(r, 32) for r in (1, 32, 33, 96, 175)] == [1, 1, 2, 3, 6]


def test_dynamic_allocation_moves_requests_to_noisier_task():
    """Task 0's clients all hold the same point (updates agree: tiny normalised variance);
    task 1's clients disagree strongly. Option D must give task 1 the larger share."""
    quiet = [[1.0, 1.0]] * 8
    noisy = [[10.0, 0.0], [-10.0, 0.0], [0.0, 10.0], [0.0, -10.0]] * 2
    tasks = [quadratic_task(0, quiet, w0=(5.0, 5.0)), quadratic_task(1, noisy, w0=(5.0, 5.0))]
    opts = AsyncOptions("fedast", requests=(8,), rb_ratio=4, variance_window=4,
                        c_period_factor=0.5)
    d = AsyncScheduler(tasks, Population.build(8), ConstantDelay(), opts, seed=0)
    d.start()
    step_until(d, 200)
    assert len(d.alloc_log) > 1
    assert d.R[1] > d.R[0] and sum(d.R) == 16
    assert tasks[1].server.b == math.ceil(d.R[1] / 4)
