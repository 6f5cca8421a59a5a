"""Synchronous simultaneous-training baselines on the simulated clock (FedAST Sec. 5.2).

Every round the server draws ``clients_per_round`` distinct available clients and hands
disjoint subsets to the unfinished tasks; each task aggregates only its first ``k`` arrivals
(straggler mitigation, k = 30 in the paper) with the task algorithm's own server step, and
the next round starts when the slowest kept update *across all tasks* has arrived. Discarded
stragglers stay busy (their next request queues behind the unfinished one).

* ``sync_st`` (Bhuyan et al. 2023): a fresh random split each round, per-task counts from
  ``allocation`` (default equal).
* ``sync_st_nosm``: the same, waiting for every assigned client (no straggler mitigation).
* ``sync_ucb_st``: counts ∝ a UCB index per task, ``loss_m / loss_m^(0) + c sqrt(2 ln r / n_m)``
  (a simplification of Bhuyan & Moharir 2022, who score client-task pairs by local loss).
* ``sequential``: one task at a time, all of the round's clients, until it reaches its target.

Local training is the engine's cohort path (:func:`fedforge.engine.round.federated_round`);
each task keeps its clients' state in a store of the run's kind (``engine.client_store``),
made by the :data:`StoreFactory` the runner passes. A checkpoint holds each store's
checkpoint: a memory store's rows are tensors of the checkpoint (``task<m>/store``), a disk
store's record names its segments in the meta's ``"stores"`` (one entry per task, ``None``
for a task in memory; the key is absent when no task is on disk).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch

from fedforge.core.store import StateStore, record_kind
from fedforge.engine.base import ChunkedEngine
from fedforge.engine.distributed import make_client_store
from fedforge.engine.draw import RoundDraw
from fedforge.engine.round import RoundSetup, federated_round
from fedforge.schedulers.allocation import proportional_split
from fedforge.schedulers.scheduler import OnEval, load_shared_state, shared_state
from fedforge.schedulers.task import Task
from fedforge.sim.clock import EventClock, Job, kth_arrival_round
from fedforge.sim.delays import DelayLaw
from fedforge.sim.population import Population

SYNC_METHODS = ("sync_st", "sync_st_nosm", "sync_ucb_st", "sequential")

StoreFactory = Callable[[int, int, dict, str | None], StateStore]
"""``(task index, clients, one client's state template, kind)`` -> that task's client store;
``kind`` ``"memory"`` or ``"disk"``, or ``None`` for the run's ``engine.client_store``."""


def memory_stores(task: int, num_clients: int, template: dict, kind: str | None = None
                  ) -> StateStore:
    """The default :data:`StoreFactory`: every task's clients in memory (no run folder)."""
    if kind not in (None, "memory"):
        raise ValueError(f"engine.client_store: a {kind} store needs the run folder")
    return make_client_store(num_clients, template, kind="memory", sharded=False)


@dataclass
class SyncOptions:
    method: str = "sync_st"
    clients_per_round: int | None = None  # None: the availability cap (max_busy)
    k: int | None = 30  # first k kept per task; None keeps all
    allocation: tuple[int, ...] | None = None  # per-task client counts (sum = clients/round)
    ucb_c: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in SYNC_METHODS:
            raise ValueError(f"method: unknown sync method {self.method!r}; expected one of "
                             f"{list(SYNC_METHODS)}")


class SyncScheduler:
    """Rounds of every unfinished task on one clock and one client pool (a
    :class:`fedforge.schedulers.scheduler.Scheduler`)."""

    def __init__(self, tasks: list[Task], population: Population, delay: DelayLaw,
                 options: SyncOptions, seed: int, engine: ChunkedEngine,
                 make_store: StoreFactory = memory_stores) -> None:
        self.tasks, self.pop, self.delay, self.opt, self.engine = (
            tasks, population, delay, options, engine)
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 23]))
        # dropout masks are keyed by (seed, round, client): one seed per task, from the run's
        self.task_seeds = [int(np.random.SeedSequence([seed, 29, m]).generate_state(1)[0])
                           for m in range(len(tasks))]
        self.clock = EventClock(population.num_clients)
        self.round = 0
        self.c = 0
        self.n_per_round = min(options.clients_per_round or population.max_busy,
                               population.num_clients)
        m = len(tasks)
        alloc = options.allocation or proportional_split(self.n_per_round, [1.0] * m, 0)
        if len(alloc) != m:
            raise ValueError(f"sync.allocation: expected {m} counts, got {len(alloc)}")
        self.alloc = list(alloc)
        self.first_loss = [None] * m
        self.last_loss = [1.0] * m
        self.assigned = [0] * m
        self.make_store = make_store
        self.stores = [self.new_store(i) for i in range(m)]

    def new_store(self, m: int, kind: str | None = None) -> StateStore:
        """Task ``m``'s client store, empty (``kind``: the run's setting when None)."""
        t = self.tasks[m]
        return self.make_store(m, t.executor.index_table.shape[0],
                               t.algorithm.client_init(t.server.params), kind)

    def counts(self) -> list[int]:
        active = [m for m, t in enumerate(self.tasks) if not t.done]
        out = [0] * len(self.tasks)
        if not active:
            return out
        n = self.n_per_round
        if self.opt.method == "sequential":
            out[active[0]] = n
            return out
        if self.opt.method == "sync_ucb_st":
            r = self.round + 1
            score = [self.last_loss[m] / (self.first_loss[m] or 1.0)
                     + self.opt.ucb_c * math.sqrt(2 * math.log(r + 1) / max(self.assigned[m], 1))
                     for m in active]
            split = proportional_split(n, score, 1)
        else:  # freed clients of finished tasks go to the others, ∝ their counts
            split = proportional_split(n, [max(self.alloc[m], 1) for m in active], 1)
        for m, c in zip(active, split):
            out[m] = c
        return out

    def step(self, on_eval: OnEval) -> None:
        self.round += 1
        counts = self.counts()
        clients = self.rng.permutation(self.pop.sample_available(self.rng, self.n_per_round))
        k = None if self.opt.method == "sync_st_nosm" else self.opt.k
        start, ends, kept_jobs = 0, [], {}
        for m, cnt in enumerate(counts):
            if cnt == 0:
                continue
            task, mine = self.tasks[m], clients[start:start + cnt]
            start += cnt
            durs = np.array([self.delay.sample(self.rng, int(i), float(self.pop.speed[i]),
                                               task.tau, task.step_time) for i in mine])
            first_id = self.clock.next_id
            keep, end = kth_arrival_round(self.clock, mine, durs, k, m, task.server.round)
            ends.append(end)
            kept_jobs[m] = [(first_id + int(i), int(mine[i])) for i in keep]
            self.assigned[m] += cnt
        self.clock.advance_to(max(ends, default=self.clock.now))
        for m, jobs in kept_jobs.items():
            self._train(m, jobs, on_eval)

    def _train(self, m: int, jobs: list[tuple[int, int]], on_eval: OnEval) -> None:
        task = self.tasks[m]
        ex = task.executor
        fake = [Job(jid, m, c, task.server.round, 0.0, 0.0, 0.0) for jid, c in jobs]
        sample_idx, mask = ex.batch_inputs(fake)  # [C, tau, B], seeded per job
        nd = ex.index_table.shape[0]
        ids = torch.tensor([c % nd for _, c in jobs])
        setup = RoundSetup(task.algorithm, self.engine, ex.loss_fn, self.stores[m], ex.x_all,
                           ex.y_all)
        draw = RoundDraw(ids, sample_idx, mask, round=task.server.round + 1)
        params, state, cohort = federated_round(setup, task.server.params,
                                                task.server.server_state,
                                                draw.with_keys(self.task_seeds[m]))
        task.server.params, task.server.server_state = params, state
        task.server.round += 1
        self.c += len(jobs)
        loss = float(cohort.metrics.loss.mean())
        if self.first_loss[m] is None:
            self.first_loss[m] = loss
        self.last_loss[m] = loss
        task.losses.append(loss)
        if task.server.round % task.eval_every == 0:
            rec = task.evaluate(task.server.params)
            rec["train_loss"] = float(np.mean(task.losses))
            task.losses = []
            if task.target is not None and rec["test_accuracy"] >= task.target:
                task.done, task.done_time = True, self.clock.now
            on_eval(m, rec)

    @property
    def finished(self) -> bool:
        return all(t.done for t in self.tasks)

    def start(self) -> None:
        """A fresh run: no rows of an earlier run in a disk store's folder."""
        for store in self.stores:
            store.restore_checkpoint(None)

    def done(self, max_updates: int | None = None, max_time: float | None = None) -> bool:
        """Every task done, ``max_updates`` reached, or the clock at ``max_time``."""
        return (self.finished or (max_updates is not None and self.c >= max_updates)
                or (max_time is not None and self.clock.now >= max_time))

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> tuple[dict, dict]:
        tensors, meta = shared_state(self)
        meta.update(round=self.round, first_loss=self.first_loss, last_loss=self.last_loss,
                    assigned=self.assigned)
        records = []
        for m, store in enumerate(self.stores):  # version: the updates so far, which grow
            tensors[f"task{m}"]["store"], record = store.checkpoint(self.c)
            records.append(record)
        if any(r is not None for r in records):
            meta["stores"] = records
        return tensors, meta

    def load_state_dict(self, tensors: dict, meta: dict, where: object = "checkpoint") -> None:
        load_shared_state(self, tensors, meta)
        self.round, self.assigned = meta["round"], list(meta["assigned"])
        self.first_loss, self.last_loss = list(meta["first_loss"]), list(meta["last_loss"])
        records = meta.get("stores", [None] * len(self.stores))  # absent: all in memory
        if not isinstance(records, list):  # None would start the tasks' disk stores afresh
            raise ValueError(f"{where}: \"stores\" must be a list of each task's store "
                             f"record, got {type(records).__name__}")
        if len(records) != len(self.stores):
            raise ValueError(f"{where}: \"stores\" has {len(records)} entries for "
                             f"{len(self.stores)} tasks")
        for m, record in enumerate(records):  # continued in the kind the checkpoint holds
            if self.stores[m].kind != record_kind(record):
                self.stores[m] = self.new_store(m, record_kind(record))
            self.stores[m].restore_checkpoint(tensors[f"task{m}"].get("store"), record, where,
                                              version=self.c)

    def collect(self, metas: Iterable[dict]) -> None:
        """Each task's store deletes what none of the kept checkpoints' ``metas`` records."""
        metas = list(metas)
        for m, store in enumerate(self.stores):
            store.collect([meta["stores"][m] for meta in metas
                           if isinstance(meta.get("stores"), list) and len(meta["stores"]) > m])

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def summary(self) -> dict:
        return {}
