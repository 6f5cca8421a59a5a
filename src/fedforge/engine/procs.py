"""ProcessEngine (``engine.name = "procs"``): the cohort split over single-threaded worker
processes on one machine.

Why: on a small CPU, operators of one client's step are too small to keep several threads
busy, and the threads of one process meet at every operator. Two processes with one thread
each, each training half of the cohort, were 5-27 % faster than one process with two threads
on a 2-core CPU, for every engine and model measured (``benchmarks/RESULTS.md``).

How: each worker runs a contiguous shard of the cohort (:func:`shard_bounds`, as the ranks
of :class:`~fedforge.engine.distributed.DistributedEngine` do) with its own in-process engine,
the loop or the vmapped one (``inner``), with the cohort's aggregation weights, so a shard's
"mean" delta is its share of the sum; the parent adds the shards' sums and concatenates
their client states, metrics and deltas. Results equal the inner engine run in one process
to float tolerance (only the order of the sums differs).

What travels, and when:

* the training set (``x_all``, ``y_all``), once, through shared memory (one copy for every
  process; sent again only if a later cohort passes other tensors);
* the algorithm and the loss, once per distinct pair, pickled and cached in each worker.
  Algorithms are built from closures (optax-style transforms), which the standard pickle
  refuses, so they travel with cloudpickle, which sends such functions by value. The
  workers are spawned from this interpreter and import the same modules;
* per cohort, only what a shard needs (global parameters, broadcast, the shard's client
  states, round inputs, sample indices and weights), as plain arrays.

Workers are spawned on the first cohort of two or more clients; each sets one intra-op and
one inter-op thread before any work, ignores Ctrl-C (the parent ends it) and exits when its
parent dies. With one worker, or a cohort of one client, the cohort runs in this process.
If the algorithm or loss cannot be sent, the data is not on the CPU, or the workers fail to
start, one warning says why and every cohort from then on runs in this process, with the
same results as the inner engine alone. :meth:`ProcessEngine.close` (or leaving a ``with``
block, garbage collection, interpreter exit) terminates the workers.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cloudpickle
import numpy as np
import torch
import torch.multiprocessing  # noqa: F401  (registers tensors' transfer through shared memory)

from fedforge.core.malloc import keep_freed_memory
from fedforge.core.tree import PyTree, tree_map, upcast
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput, combine_shards
from fedforge.engine.distributed import shard_bounds
from fedforge.engine.local import LossFn
from fedforge.engine.loop import LoopEngine, loop_label
from fedforge.engine.randomness import RandomLayerError, check_random_layers
from fedforge.engine.vmap import VmapEngine
from fedforge.protocol.algorithm import Algorithm

logger = logging.getLogger(__name__)
INNER = ("loop", "vmap")  # what a worker may run its shard with


def default_workers() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), at least 1:
    one single-threaded worker per core."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        n = os.cpu_count() or 1
    return max(1, n)


# --- what travels per call ------------------------------------------------------------------
@dataclass(frozen=True)
class _Array:
    """A tensor in transit. Pickled as plain bytes: torch's own reduction would put every
    small tensor of every call into a new shared-memory file (milliseconds each)."""

    data: np.ndarray
    dtype: torch.dtype


def pack(tree: PyTree) -> PyTree:
    """Every tensor of ``tree`` as an :class:`_Array` (numpy has no bf16: such tensors travel
    as fp32, exactly, and are cast back by :func:`unpack`)."""
    return tree_map(lambda t: _Array(upcast(t.detach()).numpy(), t.dtype)
                    if isinstance(t, torch.Tensor) else t, tree)


def unpack(tree: PyTree) -> PyTree:
    """The tensors :func:`pack` packed, in their own dtypes."""
    return tree_map(lambda a: torch.from_numpy(a.data).to(a.dtype)
                    if isinstance(a, _Array) else a, tree)


# --- what travels once: the algorithm and the loss -----------------------------------------
def pickle_for_workers(obj: Any) -> bytes:
    """``obj`` pickled for a spawned worker with cloudpickle: algorithms are built from
    closures (optax-style transforms), which the standard pickle refuses; cloudpickle sends
    functions it cannot find by name by value. Tensors are copied into the bytes."""
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


# --- the worker processes -------------------------------------------------------------------
def worker_threads() -> dict:
    """This process's id and torch thread counts (what a worker reports when described)."""
    return {"pid": os.getpid(), "threads": torch.get_num_threads(),
            "interop": torch.get_num_interop_threads()}


def _serve(conn: Any, setup: Callable[..., Callable[[str, Any], Any]], args: tuple) -> None:
    """A worker's life: one thread each for intra- and inter-op work before anything runs,
    ``handler = setup(*args)``, then ``handler(task, payload)`` for each call until the
    parent closes the pipe. Replies are ``(True, packed result)`` or ``(False, traceback)``;
    a :class:`RandomLayerError` travels as itself, so the parent raises its one line.
    Freed memory is kept for reuse, as in the ``fedforge`` command (:mod:`fedforge.core.malloc`)."""
    keep_freed_memory()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent terminates us
    parent = mp.parent_process()  # killed without cleanup (SIGKILL, a timeout): exit too
    if parent is not None:
        threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()
    try:
        handler = setup(*args)
    except Exception:
        conn.send((False, traceback.format_exc()))
        return
    conn.send((True, None))
    while True:
        try:
            task, payload = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send((True, pack(handler(task, unpack(payload)))))
        except RandomLayerError as exc:  # a refusal, not a crash: its one line is enough
            conn.send((False, exc))
        except Exception:
            conn.send((False, traceback.format_exc()))


def _shutdown(processes: list, conns: list) -> None:
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.join()
    for conn in conns:
        conn.close()


class WorkerPool:
    """``n`` spawned worker processes, each answering calls with the handler that
    ``setup(*args)`` builds in it (``setup`` and ``args`` are pickled once, at the start;
    tensors among ``args`` go through shared memory). Waits until every worker is ready.

    :meth:`call` sends one payload per worker (the first ``len(payloads)`` workers) and
    returns their results in order; a worker's exception is raised as a ``RuntimeError``
    with its traceback after every reply is in, and a worker that died (or an interrupted
    call) closes the pool. :meth:`close`, leaving a ``with`` block, garbage collection and
    interpreter exit terminate the workers and wait for them.
    """

    def __init__(self, n: int, setup: Callable[..., Callable[[str, Any], Any]], *args: Any,
                 name: str = "worker") -> None:
        ctx = mp.get_context("spawn")
        self.name = name
        self.processes: list = []
        self._conns: list = []
        self._finalizer = weakref.finalize(self, _shutdown, self.processes, self._conns)
        try:
            for _ in range(n):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(there, setup, args), daemon=True)
                proc.start()
                there.close()  # the worker's end: a dead worker is then EOF here
                self.processes.append(proc)
                self._conns.append(here)
            self._collect(n, "while starting")
        except BaseException:
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Terminate every worker (mid-call too) and wait for them; idempotent."""
        self._finalizer()

    def call(self, task: str, payloads: list, *, packed: bool = True) -> list:
        """``handler(task, payload)`` in worker i for the i-th payload -> their results.
        ``packed=False`` sends tensors through shared memory (for data sent once)."""
        if self.closed:
            raise RuntimeError(f"{self.name}s were closed")
        doing = f"in {task!r}"
        try:
            for conn, proc, payload in zip(self._conns, self.processes, payloads):
                try:
                    conn.send((task, pack(payload) if packed else payload))
                except (BrokenPipeError, ConnectionResetError):
                    raise self._died(proc, doing) from None
        except BaseException:
            self.close()  # some workers got the call, others not: start afresh
            raise
        return self._collect(len(payloads), doing)

    def _died(self, proc: Any, doing: str) -> RuntimeError:
        proc.join(timeout=5)
        self.close()
        return RuntimeError(f"{self.name} {proc.pid} exited (code {proc.exitcode}) {doing}; "
                            f"its output above may say why")

    def _collect(self, count: int, doing: str) -> list:
        results, failure = [], None
        try:
            for conn, proc in zip(self._conns[:count], self.processes):
                try:
                    ok, result = conn.recv()
                except (EOFError, OSError):
                    raise self._died(proc, doing) from None
                if ok:
                    results.append(unpack(result))
                elif failure is None:  # keep reading: every reply must be taken off the pipe
                    failure = (result if isinstance(result, BaseException)
                               else RuntimeError(f"{self.name} {proc.pid} failed {doing}:\n"
                                                 f"{result}"))
        except BaseException:
            self.close()  # interrupted mid-call: replies would be left in the pipes
            raise
        if failure is not None:
            raise failure
        return results


class _EngineWorker:
    """A worker's side of :class:`ProcessEngine`: the training set, the (algorithm, loss)
    pairs by token, and the inner engine that runs its shards."""

    def __init__(self, inner: str, chunk_size: int | str, channels_last: bool = False) -> None:
        self.engine = _build_inner(inner, chunk_size, channels_last=channels_last)
        self.data: tuple[torch.Tensor, torch.Tensor] | None = None
        self.pairs: dict[int, tuple[Algorithm, LossFn]] = {}

    def __call__(self, task: str, payload: Any) -> Any:
        if task == "data":
            self.data = payload
            return None
        if task == "load":
            token, blob = payload
            self.pairs[token] = pickle.loads(blob)  # bytes our parent pickled, sent on our pipe
            return None
        if task == "run":
            token, keep_deltas, dtype, inputs = payload
            algorithm, loss_fn = self.pairs[token]
            assert self.data is not None
            torch.set_default_dtype(dtype)  # as in the parent (float64 runs)
            self.engine.keep_deltas = keep_deltas
            return self.engine.run_cohort(algorithm, loss_fn, *self.data, inputs)
        if task == "describe":
            return {**worker_threads(), "pairs": sorted(self.pairs)}
        raise ValueError(f"procs engine worker: unknown task {task!r}")


def _build_inner(inner: str, chunk_size: int | str, keep_deltas: bool = False, *,
                 channels_last: bool = False) -> ChunkedEngine:
    """The engine a worker (and the parent, in process) runs; its refusals name ``procs``."""
    if inner == "loop":
        engine: ChunkedEngine = LoopEngine(keep_deltas=keep_deltas, channels_last=channels_last)
    elif channels_last:
        raise ValueError("engine procs: channels_last is an option of the loop inner engine")
    elif inner == "vmap":
        engine = VmapEngine(chunk_size=chunk_size, keep_deltas=keep_deltas)
    else:
        raise ValueError(f"engine procs: inner engine must be one of {INNER}, got {inner!r}")
    engine.label = ProcessEngine.name
    return engine


class ProcessEngine(ChunkedEngine):
    """The cohort split over single-threaded worker processes (module docstring).

    Args:
      workers: worker processes; ``None``: one per CPU this process may use. One worker runs
        every cohort in this process.
      inner: the engine each worker (and this process, for one-client cohorts and the
        asynchronous jobs mode) runs: ``"loop"`` or ``"vmap"``.
      chunk_size: the vmapped inner engine's chunk size.
      channels_last: the loop inner engine runs images and convolution weights in NHWC
        memory format (:class:`~fedforge.engine.loop.LoopEngine`); same values.
    """

    name = "procs"

    def __init__(self, keep_deltas: bool = False, *, workers: int | None = None,
                 inner: str = "loop", chunk_size: int | str = "auto",
                 channels_last: bool = False) -> None:
        super().__init__(keep_deltas=keep_deltas)
        self.workers = default_workers() if workers is None else _checked_workers(
            workers, "engine procs: workers (or None)")
        self._chunk = chunk_size
        self.inner_name = inner
        self.channels_last = channels_last
        self.inner = _build_inner(inner, chunk_size, keep_deltas, channels_last=channels_last)
        self.fallback: str | None = None  # why cohorts run in this process (None: they don't)
        self._pool: WorkerPool | None = None
        self._data: tuple[torch.Tensor, torch.Tensor] | None = None  # what the pool holds
        self._tokens: dict[tuple[int, int], tuple[int, Algorithm, LossFn]] = {}
        self._loaded: set[int] = set()  # tokens the pool's workers hold
        self._ran = self._reported = False

    # --- in-process work goes to the inner engine (one-client cohorts, async jobs) ---------
    @property
    def functional_grad(self) -> bool:
        return self.inner.functional_grad

    def chunk_size(self, inputs: CohortInputs, x_all: torch.Tensor,
                   y_all: torch.Tensor | None = None, loss_fn: LossFn | None = None) -> int:
        return self.inner.chunk_size(inputs, x_all, y_all, loss_fn)

    def local_update(self, algorithm: Algorithm, loss_fn: LossFn, masked: bool) -> Callable:
        return self.inner.local_update(algorithm, loss_fn, masked)

    def wrap(self, fn: Callable) -> Callable:
        return self.inner.wrap(fn)

    def trim_steps(self, idx: torch.Tensor, ws: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.trim_steps(idx, ws)

    def run_chunked(self, num_items: int, chunk: int, attempt: Callable[[int], Any]) -> Any:
        return self.inner.run_chunked(num_items, chunk, attempt)

    # --- a cohort -----------------------------------------------------------------------
    def run_cohort(self, algorithm: Algorithm, loss_fn: LossFn, x_all: torch.Tensor,
                   y_all: torch.Tensor, inputs: CohortInputs) -> CohortOutput:
        """Each worker runs its contiguous shard; the shards are combined in shard order
        (the pool returns replies in worker order, whenever each worker finishes)."""
        check_random_layers(loss_fn, self.name)
        self._ran = True
        self.inner.keep_deltas = self.keep_deltas
        num = inputs.sample_idx.shape[0]
        shards = [(lo, hi) for lo, hi in (shard_bounds(num, r, self.workers)
                                          for r in range(self.workers)) if hi > lo]
        token = None
        if len(shards) > 1 and self.fallback is None:
            token = self._prepare(algorithm, loss_fn, x_all, y_all)
        if token is None or self._pool is None:
            return self.inner.run_cohort(algorithm, loss_fn, x_all, y_all, inputs)
        dtype = torch.get_default_dtype()
        outs = self._pool.call("run", [(token, self.keep_deltas, dtype,
                                        inputs.clients(slice(lo, hi))) for lo, hi in shards])
        return combine_shards(outs, [hi - lo for lo, hi in shards], self.keep_deltas)

    def _prepare(self, algorithm: Algorithm, loss_fn: LossFn, x_all: torch.Tensor,
                 y_all: torch.Tensor) -> int | None:
        """Workers started, holding the data and the pair -> the pair's token; None after
        falling back to this process."""
        if x_all.device.type != "cpu" or y_all.device.type != "cpu":
            return self._fall_back(f"the data is on {x_all.device}; worker processes run on "
                                   f"the CPU")
        key, blob = (id(algorithm), id(loss_fn)), None
        if key not in self._tokens:
            try:
                blob = pickle_for_workers((algorithm, loss_fn))
            except Exception as exc:  # PicklingError, TypeError, AttributeError, ...
                return self._fall_back(f"the algorithm or the loss cannot be pickled "
                                       f"({type(exc).__name__}: {exc})")
            # the pair is kept, so its ids are not reused while the token names it
            self._tokens[key] = (len(self._tokens), algorithm, loss_fn)
        token = self._tokens[key][0]
        if self._pool is None or self._pool.closed:
            try:
                self._pool = WorkerPool(self.workers, _EngineWorker, self.inner_name,
                                        self._chunk, self.channels_last,
                                        name="procs engine worker")
            except Exception as exc:
                return self._fall_back(f"the worker processes did not start "
                                       f"({_one_line(exc)})")
            self._data, self._loaded = None, set()
        if self._data is None or self._data[0] is not x_all or self._data[1] is not y_all:
            try:  # e.g. a shared-memory file system too small for the training set
                self._pool.call("data", [(x_all, y_all)] * self.workers, packed=False)
            except Exception as exc:
                return self._fall_back(f"the training set could not be shared with the "
                                       f"workers ({_one_line(exc)})")
            self._data = (x_all, y_all)
        if token not in self._loaded:
            blob = blob or pickle_for_workers((algorithm, loss_fn))
            try:
                self._pool.call("load", [(token, blob)] * self.workers)
            except RuntimeError as exc:
                return self._fall_back(f"a worker could not load the algorithm or the loss "
                                       f"({_one_line(exc)})")
            self._loaded.add(token)
        return token

    def _fall_back(self, reason: str) -> None:
        self.fallback = reason
        logger.warning("engine procs: every cohort runs in this process from now on: %s",
                       reason)
        self.close()
        return None

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Terminate the workers and wait for them; a later cohort starts new ones."""
        if self._pool is not None:
            self._pool.close()
        self._pool, self._data, self._loaded = None, None, set()

    @property
    def processes(self) -> list:
        """The live pool's worker processes (empty before the first cohort that needs them)."""
        return [] if self._pool is None or self._pool.closed else list(self._pool.processes)

    def describe(self) -> list[dict]:
        """Per worker: pid, intra-op and inter-op threads, tokens of the (algorithm, loss)
        pairs it holds; empty while no worker runs."""
        if self._pool is None or self._pool.closed:
            return []
        return self._pool.call("describe", [None] * self.workers)

    # --- records ----------------------------------------------------------------------------
    def report(self) -> dict:
        """Once, after the first cohort: how many processes ran it and with which engine, or
        why it ran in this process."""
        if self._reported or not self._ran:
            return {}
        self._reported = True
        inner = loop_label(True) if self.channels_last else self.inner_name  # loop only
        rep: dict = {"engine_procs_workers": 1 if self.fallback else self.workers,
                     "engine_procs_inner": inner}
        if self.fallback:
            rep["engine_procs_fallback"] = self.fallback
        return rep

    def state_dict(self) -> dict:
        """Worker count and inner engine: the shards' sums are added in an order that depends
        on the count, so a resumed run uses the recorded one to stay bit-exact."""
        return {"workers": 1 if self.fallback else self.workers, "inner": self.inner_name,
                "channels_last": self.channels_last, **self.inner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a resumed run: the recorded workers and inner engine)."""
        workers = _checked_workers(state.get("workers", self.workers),
                                   "checkpoint field 'engine.workers'")
        inner = state.get("inner", self.inner_name)
        channels_last = bool(state.get("channels_last", self.channels_last))
        same = (inner, channels_last) == (self.inner_name, self.channels_last)
        if workers != self.workers or not same:
            self.close()  # workers of another count or engine: new ones start when needed
        if not same:
            self.inner = _build_inner(inner, self._chunk, self.keep_deltas,
                                      channels_last=channels_last)
            self.inner_name, self.channels_last = inner, channels_last
        self.workers = workers
        self.inner.load_state_dict(state)
        if "workers" in state:
            self._reported = True  # the run's metrics already hold it


def _checked_workers(value: Any, field: str) -> int:
    """``value`` if it is a worker count (an int >= 1, not a bool), else a one-line error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: expected an int >= 1, got {value!r}")
    return value


def _one_line(exc: BaseException) -> str:
    """An exception for a one-line warning: a worker's traceback by its last line (the
    error), anything else with its lines joined."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if any(line.startswith("Traceback") for line in lines):
        return lines[-1]
    return " ".join(lines)
