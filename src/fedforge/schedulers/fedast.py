"""Asynchronous schedulers on the simulated clock: FedAST (Alg. 2-4), ablations, FedBuff, FedAsync.

Askin et al., "FedAST: Federated Asynchronous Simultaneous Training", UAI 2024.
Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022.
Xie et al., "Asynchronous Federated Optimization", 2019.

One event = one arriving update. The scheduler pops it from the clock, asks the task's executor
for the delta (computed in batches, see :mod:`fedforge.schedulers.jobs`), feeds the task's
server, runs Realloc (option D), evaluates after a server step, and sends ``K`` new requests
carrying the *newest* model (line 13 runs after line 10).

Methods (``AsyncOptions.method``):

* ``fedast``: dynamic allocation (option D), ``b_m = max(1, ceil(R_m / rb_ratio))``.
* ``fedast_static`` / ``fedast_uniform``: option S with the configured / equal ``R_m``.
* ``fedast_nobuffer``: option S, uniform, ``b = 1`` (stands in for Chang et al. 2023).
* ``fedbuff``: buffer ``b``, requests only to idle clients, deltas weighted ``(1 + s)^-1/2``.
* ``fedasync``: ``b = 1`` with polynomial staleness mixing ``alpha (1 + s)^-a``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fedforge.core.tree import tree_clone
from fedforge.schedulers import allocation_code as code
from fedforge.schedulers.allocation import (
    buffer_size,
    estimate_variance,
    proportional_split,
    realloc,
)
from fedforge.schedulers.scheduler import OnEval, load_shared_state, shared_state
from fedforge.schedulers.task import Task
from fedforge.sim.clock import EventClock, Job
from fedforge.sim.delays import DelayLaw
from fedforge.sim.population import Population

ASYNC_METHODS = ("fedast", "fedast_static", "fedast_uniform", "fedast_nobuffer", "fedbuff",
                 "fedasync")


@dataclass
class AsyncOptions:
    method: str = "fedast"
    requests: tuple[int, ...] = (96,)  # R_m^(0) per task (uniform methods use the mean)
    rb_ratio: float = 32.0  # R_m / b_m (b from R unless buffer_size is set)
    buffer_size: int | None = None  # fixed b for every task (None: from rb_ratio)
    variance_window: int = 8  # V
    c_period_factor: float = 0.75  # c_period = factor * (#unfinished tasks) * sum R_m
    min_requests: int = 1  # floor of R_m in Realloc
    max_k: int = 2  # at most this many new requests per arrival (K in {0, 1, 2})
    fedasync_alpha: float = 0.6
    fedasync_a: float = 0.5
    fedbuff_staleness_weight: bool = True
    # "code": the authors' allocation rules (schedulers/allocation_code.py)
    allocation: str = "paper"

    def __post_init__(self) -> None:
        if self.method not in ASYNC_METHODS:
            raise ValueError(f"method: unknown async method {self.method!r}; expected one of "
                             f"{list(ASYNC_METHODS)}")
        if self.allocation not in code.ALLOCATIONS:
            raise ValueError(f"async.allocation: expected one of {list(code.ALLOCATIONS)}, got "
                             f"{self.allocation!r}")

    @property
    def dynamic(self) -> bool:
        return self.method == "fedast"


class AsyncScheduler:
    """Runs M tasks on one clock and one client pool until every task is done or a limit
    (a :class:`fedforge.schedulers.scheduler.Scheduler`).

    Its checkpoint keeps the model versions in flight and the results computed but not yet
    arrived: a job's result is a pure function of the version it was sent, its client and
    its seed, but recomputed in another batch of jobs it may differ in the last bits, and a
    resumed run must equal the uninterrupted one exactly."""

    def __init__(self, tasks: list[Task], population: Population, delay: DelayLaw,
                 options: AsyncOptions, seed: int) -> None:
        self.tasks, self.pop, self.delay, self.opt = tasks, population, delay, options
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 17]))
        self.clock = EventClock(population.num_clients)
        m = len(tasks)
        req = list(options.requests)
        if len(req) == 1:
            req = req * m
        if len(req) != m:
            raise ValueError(f"async.requests: expected 1 or {m} values, got {len(req)}")
        if options.method != "fedast_static":  # uniform start (FedAST(D) starts uniform too)
            req = proportional_split(sum(req), [1.0] * m, 1)
        self.R = req
        self.cur = [0] * m  # requests in flight per task
        self.c = 0  # total updates received
        self.since_realloc = 0
        self.window: list[list] = [[] for _ in tasks]
        self.alloc_log: list[tuple[int, list[int]]] = [(0, list(self.R))]
        self.code = (code.CodeAllocator(m, sum(self.R), options.c_period_factor)
                     if options.allocation == "code" and self.opt.dynamic else None)
        if self.code is not None:
            self.window = self.code.windows  # one window list (checkpointed as the paper's)
        for k, t in enumerate(tasks):
            t.server.b = self._buffer(k)

    # --- policies -----------------------------------------------------------------------
    def _buffer(self, m: int) -> int:
        if self.opt.method in ("fedast_nobuffer", "fedasync"):
            return 1
        if self.opt.buffer_size is not None:
            return self.opt.buffer_size
        return buffer_size(self.R[m], self.opt.rb_ratio)

    def _pick_client(self, capped: bool = True) -> int | None:
        if self.opt.method == "fedbuff":  # FedBuff samples among idle clients
            idle = np.flatnonzero(self.clock.outstanding == 0)
            if len(idle) == 0 or self.clock.num_busy >= self.pop.max_busy:
                return None
            return int(idle[self.rng.integers(len(idle))])
        client = int(self.rng.integers(self.pop.num_clients))  # uniform, with replacement
        if capped and self.clock.num_busy >= self.pop.max_busy and not self.clock.is_busy(client):
            return None  # availability cap: skip this draw (authors' code, note A3)
        return client

    def send(self, m: int, capped: bool = True) -> Job | None:
        task = self.tasks[m]
        client = self._pick_client(capped)
        if client is None:
            return None
        d = self.delay.sample(self.rng, client, float(self.pop.speed[client]), task.tau,
                              task.step_time)
        job = self.clock.dispatch(m, client, d, task.server.round)
        task.executor.submit(job, task.server.params, task.broadcast())
        self.cur[m] += 1
        return job

    def start(self) -> None:
        for m in range(len(self.tasks)):
            for _ in range(self.R[m]):
                self.send(m, capped=self.code is None)  # the code sends all (server.py:978)

    # --- one event ------------------------------------------------------------------------
    def step(self, on_eval: OnEval) -> Job:
        job = self.clock.pop()
        m, task = job.task, self.tasks[job.task]
        delta, loss, sent = task.executor.result(job)
        task.losses.append(loss)
        self.cur[m] -= 1
        self.c += 1
        self.since_realloc += 1
        staleness = task.server.round - job.version
        if self.code is not None:  # the code estimates and reallocates before buffering
            self._code_realloc(m, delta)
        elif self.opt.dynamic:
            self.window[m] = [*self.window[m], delta][-self.opt.variance_window:]
        if self.opt.method == "fedasync":
            stepped = task.server.mix(sent, delta, self.opt.fedasync_alpha, staleness,
                                      self.opt.fedasync_a)
        else:
            w = (1.0 + staleness) ** -0.5 if (self.opt.method == "fedbuff"
                                               and self.opt.fedbuff_staleness_weight) else 1.0
            stepped = task.server.receive(delta, w)
        if self.opt.dynamic and self.code is None:
            self._maybe_realloc()
        if stepped and task.server.round % task.eval_every == 0:
            rec = task.evaluate(task.server.params)
            rec["train_loss"] = float(np.mean(task.losses)) if task.losses else float("nan")
            task.losses = []
            if task.target is not None and rec["test_accuracy"] >= task.target:
                self._finish(m)
            rec["requests"], rec["in_flight"] = list(self.R), list(self.cur)
            on_eval(m, rec)
        if self.code is None:
            self._serve_starved()
        if not task.done:
            if self.code is not None:  # global free slots cap it (server.py:778-780)
                k = code.new_requests(self.R[m], self.cur[m], sum(self.R), sum(self.cur),
                                      self.opt.max_k)
            else:
                k = max(0, min(self.R[m] - self.cur[m], self.opt.max_k))
            for _ in range(k):
                self.send(m)
            if self.code is not None:
                task.server.b = code.arrival_buffer(self.cur[m], self.opt.rb_ratio)
        return job

    def _serve_starved(self) -> None:
        """A task with requests but nothing in flight receives no arrivals, so its own refill
        never runs: it would wait forever (FedBuff's idle-only start can leave the last task
        with no client at all). Such a task takes the slot an arrival frees before the
        arriving task does."""
        for k, t in enumerate(self.tasks):
            if not t.done and self.R[k] > 0 and self.cur[k] == 0:
                for _ in range(min(self.R[k], self.opt.max_k)):
                    self.send(k)

    def _code_realloc(self, m: int, delta) -> None:
        """The code's window, period average and chunked Realloc (schedulers/allocation_code.py)."""
        t = self.tasks[m]
        self.code.observe(m, delta, t.local_lr, t.server_lr, t.tau)
        if self.code.due([x.server.round for x in self.tasks], self.R):
            self.R = self.code.realloc(self.R, int(self.opt.rb_ratio))  # b follows arrivals
            self.alloc_log.append((self.c, list(self.R)))

    def _maybe_realloc(self) -> None:
        active = [m for m, t in enumerate(self.tasks) if not t.done]
        period = math.ceil(self.opt.c_period_factor * len(active) * sum(self.R[m] for m in active))
        if self.since_realloc < period or len(active) < 2:
            return
        if any(len(self.window[m]) < self.opt.variance_window for m in active):
            return
        self.since_realloc = 0
        sig = [estimate_variance(self.window[m], self.tasks[m].local_lr,
                                 self.tasks[m].server_lr, self.tasks[m].tau) for m in active]
        new = realloc([self.R[m] for m in active], sig, self.opt.min_requests)
        for m, r in zip(active, new):
            self.R[m] = r
            self.tasks[m].server.b = self._buffer(m)
        self.alloc_log.append((self.c, list(self.R)))

    def _finish(self, m: int) -> None:
        """Task m hit its target: drop its queued requests, hand its R_m to the others (∝ R)."""
        task = self.tasks[m]
        task.done, task.done_time = True, self.clock.now
        for job in self.clock.pending(m):
            self.clock.cancel(job)
            task.executor.discard(job)
        self.cur[m] = 0
        active = [k for k, t in enumerate(self.tasks) if not t.done]
        if active and self.code is not None:  # remainder at random, b = round(R / 32)
            freed, self.R[m] = self.R[m], 0
            for k, add in enumerate(code.finish_split(freed, self.R, self.rng)):
                self.R[k] += add
                if k in active:
                    self.tasks[k].server.b = code.finish_buffer(self.R[k], self.opt.rb_ratio)
        elif active:
            total = self.R[m] + sum(self.R[k] for k in active)
            new = proportional_split(total, [self.R[k] for k in active], 1)
            for k, r in zip(active, new):
                self.R[k] = r
                self.tasks[k].server.b = self._buffer(k)
        self.R[m] = 0
        self.alloc_log.append((self.c, list(self.R)))

    @property
    def finished(self) -> bool:
        return all(t.done for t in self.tasks)

    def done(self, max_updates: int | None = None, max_time: float | None = None) -> bool:
        """Every task done, no arrival left, ``max_updates`` reached, or the next arrival
        past ``max_time``."""
        if self.finished or (max_updates is not None and self.c >= max_updates):
            return True
        nxt = self.clock.peek()  # after the checks above: it drops cancelled jobs
        return nxt is None or (max_time is not None and nxt.finish > max_time)

    # --- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> tuple[dict, dict]:
        tensors, meta = shared_state(self)
        meta.update(R=self.R, cur=self.cur, since_realloc=self.since_realloc,
                    alloc_log=self.alloc_log)
        if self.code is not None:
            meta["code"] = self.code.state_dict()
        for m, t in enumerate(self.tasks):
            # by version, so a resumed run writes the same file; clones: may alias params
            versions = sorted(t.executor.versions.items(), key=lambda item: item[0])
            tensors[f"task{m}"]["versions"] = {
                f"v{v}": {"params": tree_clone(p), "bcast": tree_clone(b)}
                for v, (p, b) in versions}
            deltas, losses = t.executor.computed()
            tensors[f"task{m}"]["results"] = deltas
            meta["tasks"][m]["results"] = losses
            tensors[f"task{m}"]["window"] = {f"w{i}": w for i, w in enumerate(self.window[m])}
        return tensors, meta

    def load_state_dict(self, tensors: dict, meta: dict, where: object = "checkpoint") -> None:
        load_shared_state(self, tensors, meta)
        self.R, self.cur = list(meta["R"]), list(meta["cur"])
        self.since_realloc = meta["since_realloc"]
        self.alloc_log = [tuple(x) for x in meta["alloc_log"]]
        if self.code is not None:
            self.code.load_state_dict(meta["code"])
        for m, t in enumerate(self.tasks):
            tt = tensors[f"task{m}"]
            versions, win = tt.get("versions", {}), tt.get("window", {})
            self.window[m] = [win[f"w{i}"] for i in range(len(win))]
            deltas, losses = tt.get("results", {}), meta["tasks"][m].get("results", {})
            for job in self.clock.pending(m):
                v = versions[f"v{job.version}"]
                key = f"j{job.job_id}"
                t.executor.restore(job, v["params"], {"round": v["bcast"]["round"],
                                                      **{k: x for k, x in v["bcast"].items()
                                                         if k != "round"}},
                                   deltas.get(key), losses.get(key))

    def collect(self, metas: Iterable[dict]) -> None:
        """Nothing outside the checkpoints' own files."""

    def close(self) -> None:
        """Nothing open."""

    def summary(self) -> dict:
        return {"allocation_log": self.alloc_log}
