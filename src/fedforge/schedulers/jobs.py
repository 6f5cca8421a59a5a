"""Batched execution of dispatched jobs: many local rounds, each from its own model version.

A job's result depends only on what was sent at dispatch (model version, client, its seed),
so the executor may train every dispatched-but-not-yet-computed job of a task together while
the clock applies the results in arrival order. This is the chunked engine's jobs mode
(:func:`run_jobs`): the jobs run through ``torch.func.vmap`` with ``in_dims=0`` on the global
params too (one model version per job), in chunks sized like a cohort's (free memory / model
size, one job per call on the loop engine) and halved on out-of-memory errors, at most
``max_batch`` jobs per call. ``max_batch=1`` is the one-at-a-time reference; both give the
same models and events (``tests/schedulers/test_jobs.py``). Local training is the library's own
pure local update (``local_update_of``), with the task algorithm's local optimizer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np
import torch

from fedforge.core.tree import Params, tree_index, tree_stack
from fedforge.data.batching import client_batches
from fedforge.engine.base import ChunkedEngine, CohortInputs, _cat
from fedforge.engine.local import LossFn, local_update_of
from fedforge.engine.randomness import (
    CLIENT_KEY,
    check_random_layers,
    job_keys,
    needs_client_key,
)
from fedforge.engine.vmap import VmapEngine, refusing_random
from fedforge.protocol.algorithm import Algorithm


class Job(Protocol):
    """What the executor reads of a dispatched job (the simulator's clock makes them)."""

    job_id: int
    client: int
    version: int  # the model version it was sent

    def key(self) -> tuple[float, int]:
        """Its place in arrival order: the executor trains the soonest first."""
        ...


class JobInputs(NamedTuple):
    """A batch of dispatched jobs; every leaf has a leading job axis ``J``."""

    params: Params  # [J, ...] the model version each job was sent
    broadcast: dict  # [J, ...] what was broadcast with it (round, parts' values)
    sample_idx: torch.Tensor  # [J, tau, B] indices into the training set
    weights: torch.Tensor  # [J, tau, B] 1 = real sample, 0 = padding
    info: dict = {}  # [J] round inputs: the jobs' dropout keys (CLIENT_KEY)


def job_function(algorithm: Algorithm, loss_fn: LossFn, masked: bool,
                 engine: str = "vmap") -> Callable:
    """The local update vmapped over jobs: every argument, the model too, has a job axis."""
    check_random_layers(loss_fn, engine)
    fn = local_update_of(algorithm, loss_fn, masked=masked, engine=engine)
    return refusing_random(torch.func.vmap(fn, in_dims=(0, 0, 0, 0, 0, 0, 0)), engine)


def run_jobs(engine: ChunkedEngine, fn: Callable, x_all: torch.Tensor, y_all: torch.Tensor,
             inputs: JobInputs, limit: int | None = None, loss_fn: LossFn | None = None
             ) -> tuple[Params, list[float], int]:
    """The chunked engine's jobs mode: ``fn`` (see :func:`job_function`) over the jobs in
    chunks of ``engine.chunk_size`` (at most ``limit``; ``loss_fn``: the loss ``fn`` trains,
    whose activations the engine may measure), restarted with halved chunks on an
    out-of-memory error -> (deltas ``[J, ...]``, mean local losses, vmapped calls made)."""
    num_jobs = inputs.sample_idx.shape[0]
    # sized like a cohort of J clients of one model: a job stacks its own model like a
    # client stacks its weights, so the per-client memory estimate holds per job
    like = CohortInputs(tree_index(inputs.params, 0), tree_index(inputs.broadcast, 0), {}, {},
                        inputs.sample_idx, inputs.weights, inputs.weights.new_ones(num_jobs))
    chunk = engine.chunk_size(like, x_all, y_all, loss_fn)
    if limit is not None:
        chunk = min(chunk, limit)

    def attempt(chunk: int) -> list:
        outs = []
        for start in range(0, num_jobs, chunk):
            sl = slice(start, start + chunk)
            idx = inputs.sample_idx[sl]  # [c, tau, B]
            outs.append(fn(tree_index(inputs.params, sl), tree_index(inputs.broadcast, sl),
                           {}, tree_index(inputs.info, sl), x_all[idx], y_all[idx],
                           inputs.weights[sl]))
        return outs

    outs = engine.run_chunked(num_jobs, chunk, attempt)
    losses = [x for o in outs for x in o.metrics.loss.tolist()]
    return _cat([o.delta for o in outs]), losses, len(outs)


def job_generator(seed: int, task: int, job_id: int) -> torch.Generator:
    """The job's mini-batch RNG: a function of (seed, task, job id) only."""
    state = np.random.SeedSequence([seed, 7919, task, job_id]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


class TaskExecutor:
    """Trains one task's jobs; keeps the model versions that jobs in flight still need.

    Args:
      index_table: ``[num_data_clients, max_size]`` sample indices per data client.
      sizes: ``[num_data_clients]`` int64 on the CPU. Pool client ``i`` uses data client
        ``i % num_data_clients`` (the authors reuse roles when there are fewer than N).
      max_batch: at most this many jobs per vmapped call (1 = one at a time); the engine
        may use smaller chunks (memory, out-of-memory retries, the loop engine's 1).
      engine: whose chunking runs the jobs (:func:`run_jobs`); default ``VmapEngine()``.
    """

    def __init__(self, task: int, algorithm: Algorithm, loss_fn: LossFn, x_all: torch.Tensor,
                 y_all: torch.Tensor, index_table: torch.Tensor, sizes: torch.Tensor, tau: int,
                 batch_size: int, seed: int, template: Params, max_batch: int = 64,
                 engine: ChunkedEngine | None = None, drop_last: bool = False) -> None:
        self.task, self.algorithm, self.seed = task, algorithm, seed
        self.x_all, self.y_all, self.index_table, self.sizes = x_all, y_all, index_table, sizes
        self.tau, self.batch_size, self.max_batch = tau, batch_size, max(1, int(max_batch))
        self.drop_last = drop_last  # epochs of full batches (client_batches)
        self.versions: dict[int, tuple[Params, dict]] = {}  # version -> (model, broadcast)
        self.refs: dict[int, int] = {}  # version -> jobs still needing it
        self.waiting: dict[int, Job] = {}  # dispatched, not yet computed
        self.results: dict[int, tuple[Params, float, Params]] = {}  # id -> (delta, loss, sent)
        self._fns: dict[bool, Callable] = {}
        self.engine = engine if engine is not None else VmapEngine()
        self.loss_fn = loss_fn
        self.batches_run = 0
        self.jobs_run = 0
        self.compute_s = 0.0  # wall seconds inside the engine's training calls

    # --- bookkeeping --------------------------------------------------------------------
    def submit(self, job: Job, params: Params, broadcast: dict) -> None:
        """Record a dispatched job and keep what was sent (model, broadcast) until computed."""
        if job.version not in self.versions:
            self.versions[job.version] = (params, broadcast)
        self.refs[job.version] = self.refs.get(job.version, 0) + 1
        self.waiting[job.job_id] = job

    def discard(self, job: Job) -> None:
        """A cancelled job: forget it (and its version if nothing else needs it)."""
        live = self.waiting.pop(job.job_id, None) is not None
        live |= self.results.pop(job.job_id, None) is not None
        if live:
            self._release(job.version)

    def _release(self, version: int) -> None:
        self.refs[version] -= 1
        if self.refs[version] == 0:
            del self.refs[version], self.versions[version]

    # --- computing ---------------------------------------------------------------------
    def result(self, job: Job) -> tuple[Params, float, Params]:
        """The job's ``(delta, mean local loss, model it was sent)``; computes a batch that
        includes it if needed."""
        if job.job_id not in self.results:
            rest = sorted((j for j in self.waiting.values() if j.job_id != job.job_id),
                          key=lambda j: j.key())  # the jobs needed soonest go first
            self._compute([job, *rest[: self.max_batch - 1]])
        out = self.results.pop(job.job_id)
        self._release(job.version)  # versions live until their jobs' results are consumed
        return out

    def batch_inputs(self, jobs: list[Job]):
        """-> (sample indices ``[J, tau, B]``, mask ``[J, tau, B]``), one seeded draw per job,
        made in one call (each job's own generator gives its keys)."""
        data_clients = torch.tensor([j.client % self.index_table.shape[0] for j in jobs])
        pos, mask = client_batches(self.sizes[data_clients], self.tau, None, self.batch_size,
                                   [job_generator(self.seed, self.task, j.job_id) for j in jobs],
                                   self.drop_last)
        rows = data_clients.to(self.index_table.device).view(-1, 1, 1)
        return (self.index_table[rows, pos.to(self.index_table.device)],
                mask.to(self.x_all.device))

    def _fn(self, masked: bool) -> Callable:
        if masked not in self._fns:
            self._fns[masked] = job_function(self.algorithm, self.loss_fn, masked,
                                             self.engine.name)
        return self._fns[masked]

    def _compute(self, jobs: list[Job]) -> None:
        deltas, losses = self.train_jobs(jobs, self.versions)
        self._store(jobs, deltas, losses)

    def train_jobs(self, jobs: list[Job], versions: dict) -> tuple[Params, list[float]]:
        """Local rounds of ``jobs`` in the engine's jobs mode -> (deltas ``[J, ...]``, losses)."""
        sample_idx, mask = self.batch_inputs(jobs)  # [J, tau, B]
        params = tree_stack([versions[j.version][0] for j in jobs])  # [J, ...]
        bcast = tree_stack([versions[j.version][1] for j in jobs])  # [J, ...] per leaf
        masked = bool((mask.sum(-1) == 0).any())  # one function for the whole batch
        info = {CLIENT_KEY: job_keys(self.seed, self.task, [j.job_id for j in jobs]).to(
            mask.device)} if needs_client_key(self.loss_fn) else {}  # dropout: (seed, task, job)
        t0 = time.perf_counter()
        deltas, losses, calls = run_jobs(self.engine, self._fn(masked), self.x_all, self.y_all,
                                         JobInputs(params, bcast, sample_idx, mask, info),
                                         self.max_batch, self.loss_fn)
        self.compute_s += time.perf_counter() - t0
        self.batches_run += calls
        self.jobs_run += len(jobs)
        return deltas, losses

    # --- checkpoints -------------------------------------------------------------------
    def computed(self) -> tuple[dict[str, Params], dict[str, float]]:
        """Results computed but not yet consumed -> (``{"j<id>": delta}``, ``{"j<id>": loss}``).

        A checkpoint keeps them: recomputing them after a resume would train them in other
        batches than the uninterrupted run, and a batch's composition moves the last bits."""
        return ({f"j{i}": delta for i, (delta, _, _) in sorted(self.results.items())},
                {f"j{i}": loss for i, (_, loss, _) in sorted(self.results.items())})

    def restore(self, job: Job, params: Params, broadcast: dict, delta: Params | None = None,
                loss: float | None = None) -> None:
        """Resume a job in flight: waiting, or (``delta`` given) computed but not consumed."""
        self.submit(job, params, broadcast)
        if delta is not None:
            del self.waiting[job.job_id]
            self.results[job.job_id] = (delta, float(loss), self.versions[job.version][0])

    def _store(self, jobs: list[Job], deltas: Params, losses: list[float]) -> None:
        for i, j in enumerate(jobs):
            self.results[j.job_id] = (tree_index(deltas, i), losses[i],
                                      self.versions[j.version][0])
            del self.waiting[j.job_id]
