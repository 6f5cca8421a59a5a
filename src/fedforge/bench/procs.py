"""Two single-threaded worker processes for the ``:procs2`` rows of ``fedforge bench``.

The question: on a 2-core CPU, do two single-threaded processes, each running half of the
cohort's clients, beat one process whose two intra-op threads meet at every operator?
:class:`WorkerPair` runs the same round as the in-process rows, only split: the dataset and
the model go to each worker once, when it starts (the data through shared memory, one copy
for all three processes), and stay there; a call ships only what a half needs (global
parameters, broadcast, the half's client states and info, sample indices and weights, as
plain arrays) and the parent adds the halves' weighted delta sums the way
``DistributedEngine`` adds ranks. So a ``:procs2`` round equals the in-process one to float
tolerance (tests/bench/test_procs2.py); only how it is executed differs.

Each worker sets one intra-op and one inter-op thread before any work and ignores Ctrl-C
(the parent handles it). The pair is a context manager: leaving it, normally or by an
exception, terminates both workers, and a worker whose parent died exits at once.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import os
import signal
import threading
import traceback
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedforge.algorithms import build_algorithm
from fedforge.algorithms.base import Algorithm
from fedforge.core.tree import PyTree, tree_map, upcast
from fedforge.engine import CohortInputs, CohortOutput, classification_loss
from fedforge.engine.base import _cat
from fedforge.engine.distributed import shard_bounds
from fedforge.engine.local import LossFn


@dataclass(frozen=True)
class _Array:
    """A tensor in transit. Pickled as plain bytes: torch's own reduction would put every
    small tensor of every call into a new shared-memory file (milliseconds each)."""

    data: np.ndarray
    dtype: torch.dtype


def _pack(tree: PyTree) -> PyTree:
    return tree_map(lambda t: _Array(upcast(t.detach()).numpy(), t.dtype)
                    if isinstance(t, torch.Tensor) else t, tree)


def _unpack(tree: PyTree) -> PyTree:
    return tree_map(lambda a: torch.from_numpy(a.data).to(a.dtype)
                    if isinstance(a, _Array) else a, tree)


def _sum(trees: list) -> PyTree:
    return tree_map(lambda *xs: sum(xs[1:], xs[0]), *trees)


class WorkerPair:
    """Two spawned workers holding ``model``, ``x_all`` and ``y_all``; each call runs half of
    a cohort in each. ``engine`` is a bench engine name (``plain``, ``loop``, ``vmap``,
    ``auto``); ``cohort`` sizes the ``auto`` budget (1000 rounds of a half)."""

    def __init__(self, engine: str, model: nn.Module, x_all: torch.Tensor,
                 y_all: torch.Tensor, precision: str = "fp32", chunk: int | str = "auto",
                 cohort: int = 2) -> None:
        ctx = mp.get_context("spawn")
        self.x_all = x_all
        self.processes: list = []
        self._conns: list = []
        try:
            for _ in range(2):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=_serve, daemon=True, args=(
                    there, engine, chunk, (cohort + 1) // 2,
                    copy.deepcopy(model),  # its own: sending moves it to shared memory
                    x_all, y_all, precision))
                proc.start()
                there.close()  # the worker's end: a dead worker is then EOF here
                self.processes.append(proc)
                self._conns.append(here)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> WorkerPair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Terminate both workers (mid-call too) and wait for them."""
        for proc in self.processes:
            proc.terminate()
        for proc in self.processes:
            proc.join()
        for conn in self._conns:
            conn.close()

    def _call(self, task: str, payloads: list) -> list:
        for conn, payload in zip(self._conns, payloads):
            conn.send((task, _pack(payload)))
        results = []
        for conn, proc in zip(self._conns[:len(payloads)], self.processes):
            try:
                ok, result = conn.recv()
            except EOFError:
                raise RuntimeError(f":procs2 worker {proc.pid} exited "
                                   f"(code {proc.exitcode}); see its traceback above") from None
            if not ok:
                raise RuntimeError(f":procs2 worker {proc.pid} failed:\n{result}")
            results.append(_unpack(result))
        return results

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
        num = inputs.sample_idx.shape[0]
        halves = self._halves(num)
        # agg_weights stay global: each half's "mean" delta is a partial sum
        outs = self._call("round", [inputs.clients(slice(lo, hi)) for lo, hi in halves])
        uploads = [tree_map(lambda u, k=hi - lo: u * k, o.mean_uploads)
                   for o, (lo, hi) in zip(outs, halves)]
        return CohortOutput(_sum([o.mean_delta for o in outs]),
                            tree_map(lambda u: u / num, _sum(uploads)),
                            _cat([o.client_states for o in outs]),
                            _cat([o.metrics for o in outs]), None)

    def plain_round(self, model: nn.Module, idx: torch.Tensor) -> None:
        """The plain PyTorch loop's round (``plain_loop``): each worker trains its half from
        ``model``'s state; their averages' sum is loaded into ``model``."""
        state = model.state_dict()
        num = idx.shape[0]
        sums = self._call("plain", [(state, idx[lo:hi], num) for lo, hi in self._halves(num)])
        model.load_state_dict(_sum(sums))

    def describe(self) -> list[dict]:
        """Per worker: its intra-op and inter-op threads and engine (``auto``: the choice)."""
        return self._call("describe", [None, None])


def _serve(conn, engine: str, chunk, half: int, model: nn.Module, x_all: torch.Tensor,
           y_all: torch.Tensor, precision: str) -> None:
    """A worker's loop: set up once, then answer calls until the parent goes away."""
    from fedforge.bench.throughput import LR, make_engine, plain_sum

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent terminates us
    parent = mp.parent_process()  # killed without cleanup (SIGKILL, a timeout): exit too
    threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()
    eng = None if engine == "plain" else make_engine(engine, chunk, cohort=half)
    algorithm = build_algorithm("fedavg", local_lr=LR)
    loss_fn = classification_loss(model, precision)  # a closure: built here, not sent
    while True:
        try:
            task, payload = conn.recv()
        except EOFError:
            return
        try:
            payload = _unpack(payload)
            if task == "round":
                out = eng.run_cohort(algorithm, loss_fn, x_all, y_all, payload)
            elif task == "plain":
                state, idx, num = payload
                out = plain_sum(model, state, x_all, y_all, idx, num, precision)
            else:
                out = {"threads": torch.get_num_threads(),
                       "interop": torch.get_num_interop_threads(),
                       "engine": getattr(eng, "choice", None) or getattr(eng, "name", "plain")}
            conn.send((True, _pack(out)))
        except Exception:
            conn.send((False, traceback.format_exc()))
