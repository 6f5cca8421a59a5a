"""Engine cost of asynchronous multi-task runs: wall seconds per 1000 client updates.

Compares, in one process and interleaved (so machine load hits both alike):

* async: FedAST(D) on two MNIST-MLP tasks (``examples/fedast_cpu_2tasks.toml`` with task 1
  switched to MNIST-MLP, no targets, no evaluation), 1000 updates after a 100-update warm-up;
* sync: the single-task synchronous runner's round (``federated_round`` over the vmapped
  engine) on MNIST-MLP (``examples/fedast_bench_sync.toml``: 25 clients x 40 rounds = 1000
  updates after 4 warm-up rounds).

Both use tau = 9 steps of batch 32 on the same model, so an update costs the same compute.

Two ratios come out. ``overhead`` is the issue's measure: the async run's wall time against
the time its own jobs spent in the engine's training calls (the same jobs, in the same
batches), so it is the driver's cost alone. ``median_ratio`` compares with the synchronous
engine, which also charges the async run for its smaller batches: a task can only batch the
jobs it has dispatched and not yet computed (``jobs_per_call``), the sync round its cohort.
``python -m fedforge.bench.async_cost [--reps 3]`` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fedforge.core.malloc import keep_freed_memory
from fedforge.engine import classification_loss
from fedforge.engine.distributed import make_client_store
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.experiment.build import build_scheduler, build_tasks, sample_round
from fedforge.experiment.config import load_config
from fedforge.experiment.runner import Experiment
from fedforge.schedulers.scheduler import Scheduler

ASYNC_OVERRIDES = ["tasks.1.name=mnist-mlp-2", "tasks.1.data.dataset=mnist",
                   "tasks.1.model.name=mlp", "tasks.1.step_time=0.148",
                   "tasks.1.algorithm.local_lr=0.1", "tasks.target=null",
                   "tasks.eval_every=1000000000"]


def step_until(scheduler: Scheduler, max_updates: int) -> None:
    """Step ``scheduler`` as the multi-task driver does, without evaluating, logging or
    checkpointing (what is timed is the scheduler and its jobs alone)."""
    while not scheduler.done(max_updates):
        scheduler.step(lambda m, rec: None)


def time_async(path: str, updates: int = 1000, warmup: int = 100) -> dict[str, float]:
    """-> wall and in-engine training seconds per 1000 updates, and jobs per training call."""
    cfg = load_config(path, ASYNC_OVERRIDES)
    dev = torch.device("cpu")
    tasks = build_tasks(cfg, dev)
    scheduler = build_scheduler(cfg, tasks)
    scheduler.start()
    step_until(scheduler, warmup)

    def counts() -> tuple[float, int, int]:
        ex = [t.executor for t in tasks]
        return (sum(e.compute_s for e in ex), sum(e.jobs_run for e in ex),
                sum(e.batches_run for e in ex))

    c0, j0, b0 = counts()
    t0 = time.perf_counter()
    step_until(scheduler, warmup + updates)
    wall = time.perf_counter() - t0
    c1, j1, b1 = counts()
    return {"wall": wall * 1000.0 / updates, "compute": (c1 - c0) * 1000.0 / updates,
            "jobs_per_call": (j1 - j0) / max(b1 - b0, 1)}


def time_sync(path: str, warmup_rounds: int = 4) -> float:
    cfg = load_config(path)
    exp = Experiment.from_config(cfg)
    loss_fn = classification_loss(exp.network, cfg.engine.precision)
    params = exp.initial_params()
    state = exp.algorithm.server_init(params)
    # no run folder to keep a disk store in: the clients' state in memory, as the sync runs
    store = make_client_store(exp.data.num_clients, exp.algorithm.client_init(params),
                              exp.device, kind="memory")
    setup = RoundSetup(exp.algorithm, exp.engine, loss_fn, store, exp.data.train_x,
                       exp.data.train_y)
    n = 0
    t0 = 0.0
    for t in range(1, warmup_rounds + cfg.rounds + 1):
        if t == warmup_rounds + 1:
            t0, n = time.perf_counter(), 0
        draw = sample_round(exp, t)
        params, state, _ = federated_round(setup, params, state, draw)
        n += draw.size
    return (time.perf_counter() - t0) * 1000.0 / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--async-config", default="examples/fedast_cpu_2tasks.toml")
    ap.add_argument("--sync-config", default="examples/fedast_bench_sync.toml")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    keep_freed_memory()  # as the ``fedforge`` command does for every run
    runs, s = [], []
    for _ in range(args.reps):
        runs.append(time_async(args.async_config))
        s.append(time_sync(args.sync_config))
    a = [r["wall"] for r in runs]
    out = {"async_s_per_1000": [round(x, 2) for x in a],
           "async_compute_s_per_1000": [round(r["compute"], 2) for r in runs],
           "overhead": round(statistics.median(r["wall"] / r["compute"] - 1 for r in runs), 3),
           "jobs_per_call": round(statistics.median(r["jobs_per_call"] for r in runs), 1),
           "sync_s_per_1000": [round(x, 2) for x in s],
           "median_ratio": round(statistics.median(a) / statistics.median(s), 3),
           "threads": torch.get_num_threads()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
