"""Sync-ST rounds on the clock: k-th arrival per task, max over tasks."""

import numpy as np
import pytest

from fedforge.engine import LoopEngine
from fedforge.schedulers.multitask_sync import SyncOptions, SyncScheduler
from fedforge.sim.delays import ConstantDelay
from fedforge.sim.population import Population
from tests.schedulers.async_helpers import quadratic_task


def test_round_time_is_max_over_tasks_of_kth_arrival():
    """Constant delays tau * e * s: speeds (1.3, 1, 0.7); task 0 (e = 1) and task 1 (e = 2),
    tau = 2. With k = 1 each task's round ends at its fastest client's finish."""
    pop = Population(np.array([1.3, 1.0, 0.7, 1.0]))
    tasks = [quadratic_task(0, [[0, 0]] * 4, tau=2, step_time=1.0),
             quadratic_task(1, [[0, 0]] * 4, tau=2, step_time=2.0)]
    d = SyncScheduler(tasks, pop, ConstantDelay(), SyncOptions("sync_st", 4, k=1), 0, LoopEngine())
    d.step(lambda m, r: None)
    kept = {}
    for row in d.clock.log:
        kept.setdefault(row[1], []).append(row)
    expected = max(2 * e * pop.speed[rows[0][2]] for e, rows in zip((1.0, 2.0), kept.values()))
    assert d.clock.now == pytest.approx(expected)
    assert all(len(rows) == 1 for rows in kept.values())
    assert d.c == 2 and [t.server.round for t in tasks] == [1, 1]


def test_no_mitigation_waits_for_everyone():
    pop = Population(np.array([1.3, 1.0, 0.7, 1.0]))
    tasks = [quadratic_task(0, [[0, 0]] * 4, tau=1, step_time=1.0)]
    d = SyncScheduler(tasks, pop, ConstantDelay(), SyncOptions("sync_st_nosm", 4), 0, LoopEngine())
    d.step(lambda m, r: None)
    assert d.clock.now == pytest.approx(1.3) and d.c == 4


def test_sequential_and_ucb_counts():
    pop = Population.build(10)
    tasks = [quadratic_task(0, [[0, 0]] * 10, target=0.99), quadratic_task(1, [[0, 0]] * 10)]
    seq = SyncScheduler(tasks, pop, ConstantDelay(), SyncOptions("sequential", 6, k=2), 0,
                     LoopEngine())
    assert seq.counts() == [6, 0]  # one task at a time
    tasks[0].done = True
    assert seq.counts() == [0, 6]
    tasks = [quadratic_task(0, [[0, 0]] * 10), quadratic_task(1, [[0, 0]] * 10)]
    ucb = SyncScheduler(tasks, pop, ConstantDelay(), SyncOptions("sync_ucb_st", 6, k=2), 0,
                     LoopEngine())
    ucb.first_loss, ucb.last_loss, ucb.assigned = [1.0, 1.0], [0.1, 0.9], [30, 30]
    c = ucb.counts()
    assert sum(c) == 6 and c[1] > c[0]  # the task whose loss fell less gets more clients
