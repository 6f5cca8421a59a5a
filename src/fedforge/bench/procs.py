"""Two single-threaded worker processes for the ``:procs2`` rows of ``fedforge bench``.

The question: on a 2-core CPU, do two single-threaded processes, each running half of the
cohort's clients, beat one process whose two intra-op threads meet at every operator?
:class:`WorkerPair` runs the same round as the in-process rows, only split: the dataset and
the model go to each worker once, when it starts (the data through shared memory, one copy
for all three processes), and stay there; a call ships only what a half needs (global
parameters, broadcast, the half's client states and info, sample indices and weights, as
plain arrays) and the parent adds the halves' weighted delta sums the way the ``procs``
engine adds its workers' shards. So a ``:procs2`` round equals the in-process one to float
tolerance (tests/bench/test_procs2.py); only how it is executed differs.

The workers are the ``procs`` engine's (:class:`fedforge.engine.procs.WorkerPool`: one
intra-op and one inter-op thread, Ctrl-C left to the parent, exit when the parent dies);
what is bench-only is what they hold: the bench's FedAvg and loss, built in the worker from
the row's settings, any bench engine (``auto`` and the plain PyTorch loop too), and the
plain loop's round. The pair is a context manager: leaving it, normally or by an exception,
terminates both workers.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.bench.workload import LR, make_engine, plain_sum
from fedforge.engine import CohortInputs, CohortOutput, classification_loss
from fedforge.engine.base import combine_shards, sum_trees
from fedforge.engine.distributed import shard_bounds
from fedforge.engine.local import LossFn
from fedforge.engine.procs import WorkerPool, worker_threads
from fedforge.protocol.algorithm import Algorithm


class WorkerPair:
    """Two spawned workers holding ``model``, ``x_all`` and ``y_all``; each call runs half of
    a cohort in each. ``engine`` is a bench engine name (``plain``, ``loop``, ``vmap``,
    ``auto``); ``cohort`` sizes the ``auto`` budget (1000 rounds of a half)."""

    def __init__(self, engine: str, model: nn.Module, x_all: torch.Tensor,
                 y_all: torch.Tensor, precision: str = "fp32", chunk: int | str = "auto",
                 cohort: int = 2) -> None:
        self.x_all = x_all
        self.pool = WorkerPool(
            2, _BenchWorker, engine, chunk, (cohort + 1) // 2,
            copy.deepcopy(model),  # not the caller's: sending moves it to shared memory
            x_all, y_all, precision, name=":procs2 worker")

    @property
    def processes(self) -> list:
        return self.pool.processes

    def __enter__(self) -> WorkerPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Terminate both workers (mid-call too) and wait for them."""
        self.pool.close()

    @staticmethod
    def _halves(num_clients: int) -> list[tuple[int, int]]:
        bounds = [shard_bounds(num_clients, rank, 2) for rank in (0, 1)]
        return [(lo, hi) for lo, hi in bounds if hi > lo]

    def run_cohort(self, algorithm: Algorithm, loss_fn: LossFn, x_all: torch.Tensor,
                   y_all: torch.Tensor, inputs: CohortInputs) -> CohortOutput:
        """The engine interface (for ``federated_round``): each worker runs its half with its
        own engine, FedAvg and loss, built from the same settings as the parent's."""
        if x_all is not self.x_all or algorithm.name != "fedavg":
            raise ValueError("WorkerPair runs the bench's FedAvg on the data it started with")
        halves = self._halves(inputs.sample_idx.shape[0])
        # agg_weights stay global: each half's "mean" delta is a partial sum
        outs = self.pool.call("round", [inputs.clients(slice(lo, hi)) for lo, hi in halves])
        return combine_shards(outs, [hi - lo for lo, hi in halves], keep_deltas=False)

    def plain_round(self, model: nn.Module, idx: torch.Tensor) -> None:
        """The plain PyTorch loop's round (``plain_loop``): each worker trains its half from
        ``model``'s state; their averages' sum is loaded into ``model``."""
        state = model.state_dict()
        num = idx.shape[0]
        sums = self.pool.call("plain", [(state, idx[lo:hi], num)
                                         for lo, hi in self._halves(num)])
        model.load_state_dict(sum_trees(sums))

    def describe(self) -> list[dict]:
        """Per worker: its intra-op and inter-op threads and engine (``auto``: the choice)."""
        return self.pool.call("describe", [None, None])


class _BenchWorker:
    """A ``:procs2`` worker: the row's engine, the bench's FedAvg and loss, model and data."""

    def __init__(self, engine: str, chunk: int | str, half: int, model: nn.Module,
                 x_all: torch.Tensor, y_all: torch.Tensor, precision: str) -> None:
        self.eng = None if engine == "plain" else make_engine(engine, chunk, cohort=half)
        self.algorithm = build_algorithm("fedavg", local_lr=LR)
        # its own copy: both workers got the same shared-memory model, which plain_sum trains
        model = copy.deepcopy(model)
        self.loss_fn = classification_loss(model, precision)
        self.model, self.x_all, self.y_all, self.precision = model, x_all, y_all, precision

    def __call__(self, task: str, payload: Any) -> Any:
        if task == "round":
            assert self.eng is not None
            return self.eng.run_cohort(self.algorithm, self.loss_fn, self.x_all, self.y_all,
                                       payload)
        if task == "plain":
            state, idx, num = payload
            return plain_sum(self.model, state, self.x_all, self.y_all, idx, num,
                             self.precision)
        eng = self.eng
        return {**worker_threads(),
                "engine": getattr(eng, "choice", None) or getattr(eng, "name", "plain")}
