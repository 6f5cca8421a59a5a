"""Batched async execution = one-at-a-time execution: same models, same event order.

Jobs run in the chunked engine's jobs mode, so its chunking and out-of-memory halving hold.
"""

import pytest
import torch

from fedforge.core.tree import tree_stack
from fedforge.data.batching import client_batches
from fedforge.engine import LoopEngine, VmapEngine
from fedforge.engine.base import OOM_ERRORS
from fedforge.schedulers.fedast import AsyncOptions, AsyncScheduler
from fedforge.schedulers.jobs import JobInputs, job_function, job_generator, run_jobs
from fedforge.sim.clock import Job
from fedforge.sim.delays import ShiftedExponential
from fedforge.sim.population import Population
from tests.schedulers.async_helpers import quadratic_task, step_until

CENTERS = [[[1, 2], [3, 4], [5, 6], [0, 1]], [[10, 0], [-10, 0], [0, 3], [1, 1]]]


def _run(max_batch, method):
    tasks = [quadratic_task(m, c, max_batch=max_batch) for m, c in enumerate(CENTERS)]
    opts = AsyncOptions(method, requests=(4,), rb_ratio=2, variance_window=3,
                        c_period_factor=0.5)
    d = AsyncScheduler(tasks, Population.build(4), ShiftedExponential(), opts, seed=3)
    d.start()
    step_until(d, 150)
    return d, tasks


@pytest.mark.parametrize("method", ["fedast", "fedast_nobuffer", "fedasync", "fedbuff"])
def test_batched_equals_one_at_a_time(method):
    d1, t1 = _run(1, method)
    d64, t64 = _run(64, method)
    assert d1.clock.log == d64.clock.log  # identical event order and times
    for a, b in zip(t1, t64):
        assert torch.allclose(a.server.params["w"], b.server.params["w"], atol=1e-12, rtol=0)
    assert sum(t.executor.batches_run for t in t64) < sum(t.executor.batches_run for t in t1)


def test_first_fedast_step_by_hand():
    """b = 2, tau = 1, lr 0.1, eta_s 1: the first two arrivals were both trained from x0, so
    x1 = x0 - mean_i 0.1 (x0 - c_i) over the two clients in the event log."""
    task = quadratic_task(0, CENTERS[0], tau=1, lr=0.1, server_lr=1.0, w0=(2.0, 2.0))
    opts = AsyncOptions("fedast_static", requests=(4,), buffer_size=2)
    d = AsyncScheduler([task], Population.build(4), ShiftedExponential(), opts, seed=0)
    d.start()
    step_until(d, 2)
    clients = [row[2] for row in d.clock.log]
    x0 = torch.tensor([2.0, 2.0], dtype=torch.float64)
    cs = torch.tensor([CENTERS[0][c] for c in clients], dtype=torch.float64)
    expected = x0 - (0.1 * (x0 - cs)).mean(0)
    assert task.server.round == 1
    assert torch.allclose(task.server.params["w"], expected, atol=1e-12)


def test_fedbuff_single_task_uses_idle_clients_only():
    """FedBuff (one task) never queues: every request starts when it is sent."""
    task = quadratic_task(0, CENTERS[0] * 2, server_lr=0.5)
    opts = AsyncOptions("fedbuff", requests=(4,), buffer_size=2)
    d = AsyncScheduler([task], Population.build(8), ShiftedExponential(), opts, seed=1)
    d.start()
    step_until(d, 60)
    assert d.c == 60 and task.server.round == 30
    assert all(row[4] == row[5] for row in d.clock.log)  # send == start


def test_fedbuff_task_left_without_clients_at_start_still_trains():
    """Four busy slots, two tasks of four requests: FedBuff's idle-only start gives every slot
    to task 0 and none to task 1. Without the starved-task refill task 1 never runs."""
    tasks = [quadratic_task(m, c) for m, c in enumerate(CENTERS)]
    opts = AsyncOptions("fedbuff", requests=(4,), buffer_size=2)
    pop = Population.build(8, available_fraction=0.5)
    d = AsyncScheduler(tasks, pop, ShiftedExponential(), opts, seed=1)
    d.start()
    assert d.cur == [4, 0]
    step_until(d, 60)
    assert tasks[1].server.round > 0


def _job_inputs(task, n):
    jobs = [Job(i, 0, i % 4, 0, 0.0, 0.0, 0.0) for i in range(n)]
    idx, mask = task.executor.batch_inputs(jobs)
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(n, 2, dtype=torch.float64, generator=gen)}  # a version per job
    return JobInputs(params, tree_stack([task.broadcast()] * n), idx, mask)


def test_jobs_mode_chunks_and_halves_on_out_of_memory():
    task = quadratic_task(0, CENTERS[0])
    ex = task.executor
    inputs = _job_inputs(task, 8)
    fn = job_function(ex.algorithm, ex.loss_fn, masked=False)
    ref, ref_losses, calls = run_jobs(VmapEngine(), fn, ex.x_all, ex.y_all, inputs)
    assert calls == 1 and ref["w"].shape == (8, 2)

    def fits_two(*args):  # a device that holds two jobs at a time
        if args[4].shape[0] > 2:
            raise OOM_ERRORS[0]("fake out of memory")
        return fn(*args)

    engine = VmapEngine()
    out, losses, calls = run_jobs(engine, fits_two, ex.x_all, ex.y_all, inputs, limit=8)
    assert calls == 4 and engine.max_chunk == 2  # 8 -> 4 -> 2, remembered
    assert torch.allclose(out["w"], ref["w"], atol=1e-12, rtol=0)
    assert losses == pytest.approx(ref_losses, abs=1e-12)
    assert run_jobs(engine, fn, ex.x_all, ex.y_all, inputs)[2] == 4  # stays at 2 per call
    assert run_jobs(VmapEngine(), fn, ex.x_all, ex.y_all, inputs, limit=3)[2] == 3  # max_batch
    assert run_jobs(LoopEngine(), fn, ex.x_all, ex.y_all, inputs)[2] == 8  # one job per call


@pytest.mark.parametrize("drop_last", [False, True])
def test_one_draw_for_many_jobs_equals_each_job_drawn_alone(drop_last):
    """Each job's batches come from its own seeded generator, whether it is drawn alone or
    with others (the executor draws a batch of jobs in one call)."""
    sizes = torch.tensor([0, 3, 7, 32, 50])
    ex = quadratic_task(0, CENTERS[0]).executor
    ex.sizes, ex.tau, ex.batch_size, ex.drop_last = sizes, 5, 8, drop_last
    ex.index_table = torch.arange(5 * 50).view(5, 50)
    jobs = [Job(i, 0, i % 7, 0, 0.0, 0.0, 0.0) for i in range(12)]
    idx, mask = ex.batch_inputs(jobs)
    for k, j in enumerate(jobs):
        one_idx, one_mask = ex.batch_inputs([j])
        assert torch.equal(idx[k], one_idx[0]) and torch.equal(mask[k], one_mask[0])
        d = j.client % 5
        pos, m = client_batches(sizes[d:d + 1], 5, None, 8, job_generator(ex.seed, 0, j.job_id),
                                drop_last)  # the draw as a single generator makes it
        assert torch.equal(idx[k], ex.index_table[d][pos[0]]) and torch.equal(mask[k], m[0])
