"""Multi-task runs (FedAST and baselines) on the simulated clock: build, run, log, resume.

:func:`fedforge.experiment.runner.run_experiment` sends a config with a ``[[tasks]]`` list
here (after claiming the run folder and writing ``config.resolved.toml``). A run directory
holds ``config.resolved.toml``, ``metrics.jsonl`` (one line per evaluation of
one task: ``task``, ``round`` (that task's server round), ``updates`` (all tasks), ``sim_time_s``,
``test_accuracy``, ``test_loss``, ``train_loss``, ``wall_s``), ``events.jsonl`` (every applied
update: job id, task, client, version, send, start, finish), ``summary.json`` (per-task time to
target, time to finish all tasks) and ``checkpoints/``. The same seed gives the same event
log; a run resumed from a checkpoint continues exactly as the uninterrupted one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from fedforge.algorithms import build_algorithm
from fedforge.core.schedules import first_value
from fedforge.data import FederatedDataset, build_federated_dataset, load_dataset
from fedforge.data.partition import dirichlet_fixed_size
from fedforge.engine import ChunkedEngine, build_engine, classification_loss
from fedforge.engine.distributed import init_distributed, is_main_rank, world_size
from fedforge.engine.jobs import TaskExecutor
from fedforge.engine.scatter import (
    ScatteredExecutor,
    link_executors,
    serve_jobs,
    stop_workers,
)
from fedforge.experiment.checkpoint import load_checkpoint, resumable, save_checkpoint
from fedforge.experiment.config import RunConfig, TaskConfig
from fedforge.experiment.evaluate import evaluate
from fedforge.experiment.metrics import MetricsWriter
from fedforge.models import build_model
from fedforge.server.buffered import BufferedServer
from fedforge.sim.allocation_code import code_speed_factors
from fedforge.sim.delays import delay_from
from fedforge.sim.driver_state import driver_state, load_driver_state
from fedforge.sim.fedast import ASYNC_METHODS, AsyncDriver, AsyncOptions
from fedforge.sim.multitask_sync import SyncDriver, SyncOptions
from fedforge.sim.population import Population
from fedforge.sim.task import Task


def build_task_data(t: TaskConfig, num_clients: int, seed: int) -> FederatedDataset:
    splits = load_dataset(t.data.dataset, t.data.root, **t.data.options)
    n = t.data.num_clients or num_clients
    if t.data.partition == "dirichlet_fixed":
        opts = {"alpha": 0.1, "samples_per_client": 300, **t.data.partition_options}
        parts = dirichlet_fixed_size(splits.train_y.numpy(), n, float(opts["alpha"]),
                                     int(opts["samples_per_client"]), np.random.default_rng(seed))
        return FederatedDataset(splits.train_x, splits.train_y, splits.test_x, splits.test_y,
                                [torch.from_numpy(p) for p in parts], None, splits.num_classes,
                                tuple(splits.input_shape), splits.name, splits.vocab_size)
    nc = None if t.data.partition == "natural" and t.data.num_clients is None else n
    return build_federated_dataset(splits, t.data.partition, nc, seed,
                                   **t.data.partition_options)


def _scalar(hp: dict, key: str, default: float) -> float:
    v = hp.get(key, default)
    return float(first_value(v)) if not isinstance(v, (int, float)) else float(v)


def build_job_engine(cfg: RunConfig) -> ChunkedEngine:
    """The engine whose jobs mode trains a task's dispatched jobs (one per task, so an
    out-of-memory retry of one model does not shrink another's chunks). Under torchrun each
    rank trains its shard of jobs with its own vmap engine; ``procs`` trains them in this
    process with the loop its workers run."""
    if cfg.engine.name in ("loop", "procs"):
        return build_engine(cfg.engine.name)
    return build_engine("vmap", chunk_size=cfg.engine.chunk_size)


def build_tasks(cfg: RunConfig, device: torch.device,
                executor_cls: type[TaskExecutor] = TaskExecutor) -> list[Task]:
    """Each task's data, model, algorithm, executor and server (the config was validated, so
    the method's driver serves every task's algorithm)."""
    tasks = []
    for m, tc in enumerate(cfg.tasks):
        data = build_task_data(tc, cfg.system.num_clients, cfg.seed + 1000 * m).to(device)
        torch.manual_seed(cfg.seed + 1000 * m)
        model = build_model(tc.model.name, data.input_shape, data.num_classes,
                            **tc.model.options).to(device)
        alg = build_algorithm(tc.algorithm.name, **tc.algorithm.hparams)
        params = {k: v.detach().clone() for k, v in model.named_parameters()}
        loss_fn = classification_loss(model, cfg.engine.precision)
        ex = executor_cls(m, alg, loss_fn, data.train_x, data.train_y, data.index_table,
                          data.client_sizes().cpu(), tc.client.local_steps, tc.client.batch_size,
                          cfg.seed, params, max_batch=cfg.async_.max_batch,
                          engine=build_job_engine(cfg), drop_last=tc.client.drop_last)
        server = BufferedServer(alg, params, 1, cfg.system.num_clients)
        n_test = cfg.eval.max_test_samples  # evenly spaced: some test files are class-sorted
        keep = slice(None) if n_test is None else slice(None, None, max(1, len(data.test_y)
                                                                         // n_test))
        tx, ty = data.test_x[keep][:n_test], data.test_y[keep][:n_test]

        def ev(p, model=model, tx=tx, ty=ty):
            return evaluate(model, p, tx, ty, cfg.eval.batch_size)

        hp = tc.algorithm.hparams
        tasks.append(Task(cfg.task_name(m), alg, ex, server, tc.client.local_steps,
                          tc.step_time, _scalar(hp, "local_lr", 0.01),
                          _scalar(hp, "server_lr", 1.0), ev, tc.target, tc.eval_every))
    return tasks


def build_driver(cfg: RunConfig, tasks: list[Task], device: torch.device):
    s = cfg.system
    pop = Population.build(s.num_clients, [tuple(c) for c in s.speed_classes], s.speed_seed,
                           s.available_fraction)
    if cfg.method == "fedast" and cfg.async_.allocation == "code":  # the code's shuffle
        pop.speed = code_speed_factors(s.num_clients, [tuple(c) for c in s.speed_classes],
                                       s.speed_seed)
    delay = delay_from(s)
    if cfg.method in ASYNC_METHODS:
        a = cfg.async_
        req = [t.requests or a.requests for t in cfg.tasks]
        opts = AsyncOptions(cfg.method, tuple(req), a.rb_ratio, a.buffer_size, a.variance_window,
                            a.c_period_factor, a.min_requests, fedasync_alpha=a.fedasync_alpha,
                            fedasync_a=a.fedasync_a, allocation=a.allocation)
        return AsyncDriver(tasks, pop, delay, opts, cfg.seed)
    alloc = [t.sync_clients for t in cfg.tasks]
    opts = SyncOptions(cfg.method, cfg.sync.clients_per_round, cfg.sync.k,
                       tuple(alloc) if alloc[0] is not None else None, cfg.sync.ucb_c)
    engine_kw = {} if cfg.engine.name == "loop" else {"chunk_size": cfg.engine.chunk_size}
    return SyncDriver(tasks, pop, delay, opts, cfg.seed, build_engine(cfg.engine.name,
                                                                        **engine_kw))


EVENT_KEYS = ("job", "task", "client", "version", "send", "start", "finish")


def run_tasks(cfg: RunConfig, out_dir: str | Path, device: torch.device, *,
              resume: bool = False, progress: bool = True) -> list[dict]:
    """Run a resolved multi-task config in ``out_dir`` (claimed by the caller); returns the
    metric records (see the module docstring)."""
    out = Path(out_dir)
    scattered = False  # async methods under torchrun: rank 0 simulates, all ranks train
    if cfg.engine.name == "distributed" and init_distributed() and world_size() > 1:
        if cfg.method in ASYNC_METHODS:
            if not is_main_rank():
                serve_jobs(build_tasks(cfg, device))
                return []
            scattered = True
        elif not is_main_rank():  # sync methods: every rank runs the (deterministic) driver
            out = out / f"rank{torch.distributed.get_rank()}"
    out.mkdir(parents=True, exist_ok=True)
    tasks = build_tasks(cfg, device, ScatteredExecutor if scattered else TaskExecutor)
    if scattered:
        link_executors(tasks)
    driver = build_driver(cfg, tasks, device)
    ckpt_dir, metrics_path, events_path = out / "checkpoints", out / "metrics.jsonl", \
        out / "events.jsonl"
    wall_offset = 0.0
    if resume and resumable(ckpt_dir):
        tensors, meta = load_checkpoint(ckpt_dir, device)
        load_driver_state(driver, tensors, meta["driver"])
        wall_offset = meta["wall_s"]
        c = driver.c
        metrics = MetricsWriter(metrics_path, keep=lambda r, i: r["updates"] <= c)
        n_ev = meta["driver"]["clock"]["num_logged"]
        events = MetricsWriter(events_path, keep=lambda r, i: i < n_ev, remember=False)
        driver.clock.log = [tuple(e[k] for k in EVENT_KEYS) for e in events.records]
        events.records = []
    else:
        metrics = MetricsWriter(metrics_path)
        events = MetricsWriter(events_path, remember=False)
        if isinstance(driver, AsyncDriver):
            driver.start()
    t0 = time.perf_counter() - wall_offset
    written = [len(driver.clock.log)]
    next_ckpt = [(driver.c // cfg.checkpoint.every + 1) * cfg.checkpoint.every]

    def flush_events():
        new = driver.clock.log[written[0]:]
        events.write_many(dict(zip(EVENT_KEYS, e)) for e in new)
        written[0] = len(driver.clock.log)

    def on_eval(m: int, rec: dict) -> None:
        full = {"task": tasks[m].name, "task_index": m, "method": cfg.method,
                "round": tasks[m].server.round, "updates": driver.c,
                "sim_time_s": round(driver.clock.now, 6), **rec,
                "wall_s": round(time.perf_counter() - t0, 3)}
        metrics.write(full)
        if progress:
            print(f"[{cfg.method}] {full['task']} round {full['round']} t={full['sim_time_s']:.1f}"
                  f" acc={full['test_accuracy']:.4f} updates={full['updates']}", flush=True)

    def on_update() -> None:
        if driver.c >= next_ckpt[0]:
            flush_events()
            tensors, meta = driver_state(driver)
            save_checkpoint(ckpt_dir, driver.c, tensors,
                            {"driver": meta, "wall_s": time.perf_counter() - t0,
                             "seed": cfg.seed}, keep=cfg.checkpoint.keep)
            next_ckpt[0] = (driver.c // cfg.checkpoint.every + 1) * cfg.checkpoint.every

    try:
        driver.run(on_eval, max_updates=cfg.max_updates, max_time=cfg.max_time,
                   on_update=on_update)
    finally:
        if scattered:
            stop_workers()
    flush_events()
    write_summary(out, cfg, driver, time.perf_counter() - t0)
    return metrics.records


def write_summary(out: Path, cfg: RunConfig, driver, wall_s: float) -> dict:
    done = [t.done_time for t in driver.tasks]
    summary = {
        "method": cfg.method, "seed": cfg.seed, "updates": driver.c,
        "sim_time_s": driver.clock.now, "wall_s": round(wall_s, 3),
        "time_to_target": {t.name: t.done_time for t in driver.tasks},
        "time_all_tasks": max(done) if all(d is not None for d in done) else None,
        "final_round": {t.name: t.server.round for t in driver.tasks},
    }
    if isinstance(driver, AsyncDriver):
        summary["allocation_log"] = driver.alloc_log
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def gain(t_baseline: float | None, t_method: float | None) -> float | None:
    """FedAST's gain: ``(T_baseline - T_method) / T_baseline`` (None if either never finished)."""
    if t_baseline is None or t_method is None or t_baseline <= 0:
        return None
    return (t_baseline - t_method) / t_baseline
