"""Shared engine types: what a cohort round takes and returns, and the chunked driver.

Both engines run the same pure ``local_update`` (see :mod:`fedforge.engine.local`) over a
chunk of clients and fold the results into running sums, so memory is bounded by the chunk,
not the cohort. ``LoopEngine`` uses chunks of one client without vmap (the reference);
``VmapEngine`` vmaps over chunks of many clients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, TypeVar

import torch

from fedforge.core.tree import Params, PyTree, tree_index, tree_leaves, tree_map, tree_map2
from fedforge.engine.draw import CohortMetrics
from fedforge.engine.local import LocalResult, LossFn, local_update_of
from fedforge.engine.randomness import check_random_layers
from fedforge.protocol.algorithm import Algorithm

logger = logging.getLogger(__name__)
T = TypeVar("T")
# torch >= 2.5 has torch.OutOfMemoryError; torch.cuda.OutOfMemoryError is the older alias
OOM_ERRORS = tuple({getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError),
                    torch.cuda.OutOfMemoryError})


class CohortInputs(NamedTuple):
    global_params: Params
    broadcast: dict
    client_states: dict  # stacked: every leaf [C, ...]
    info: dict  # per-client round inputs, leaves [C]
    sample_idx: torch.Tensor  # [C, steps, batch] indices into the training set
    weights: torch.Tensor  # [C, steps, batch] 1 = real sample, 0 = padding
    agg_weights: torch.Tensor  # [C], sums to 1: weights of the deltas in the mean

    def clients(self, sl: slice) -> CohortInputs:
        """The clients ``sl`` of the cohort. Their aggregation weights stay the cohort's, so a
        part's "mean" delta is its share of the sum (calibration, ranks and worker halves)."""
        return self._replace(
            client_states=tree_index(self.client_states, sl), info=tree_index(self.info, sl),
            sample_idx=self.sample_idx[sl], weights=self.weights[sl],
            agg_weights=self.agg_weights[sl])


class CohortOutput(NamedTuple):
    mean_delta: Params  # sum_i agg_w_i * delta_i
    mean_uploads: dict  # uniform mean over the cohort of each part's uploads
    client_states: dict  # stacked new states [C, ...]
    metrics: CohortMetrics  # per client [C]: loss, steps, diagnostics
    deltas: Params | None  # stacked [C, ...] when ``keep_deltas``


def _cat(chunks: list) -> dict:
    if not chunks:
        return {}
    return tree_map(lambda *xs: torch.cat(xs), *chunks) if len(chunks) > 1 else chunks[0]


def _cat_metrics(chunks: list[CohortMetrics], like: PyTree) -> CohortMetrics:
    """The chunks' metrics end to end; a cohort of no clients reports empty ones."""
    if chunks:
        return _cat(chunks)
    return CohortMetrics.empty(next(iter(tree_leaves(like)), torch.zeros(())))


def sum_trees(trees: Sequence[PyTree]) -> PyTree:
    """Leafwise sum of equally shaped trees, in order."""
    return tree_map(lambda *xs: sum(xs[1:], xs[0]), *trees)


def combine_shards(outs: Sequence[CohortOutput], sizes: Sequence[int], keep_deltas: bool,
                   delta_sum: PyTree | None = None) -> CohortOutput:
    """One cohort's output from its contiguous shards, in order, each run with the cohort's
    aggregation weights: the delta sums add up, upload means are re-weighted by shard size,
    states, metrics and deltas are concatenated. Empty shards are skipped. ``delta_sum``:
    the shards' delta sums already added up elsewhere (an all-reduce across ranks).

    The one place shards become a cohort: worker processes (``procs``) and ranks
    (``DistributedEngine``) both combine here."""
    live = [(o, k) for o, k in zip(outs, sizes, strict=True) if k]
    num = sum(sizes)
    uploads = [tree_map(lambda u, k=k: u * k, o.mean_uploads) for o, k in live]
    shards = [o for o, _ in live]
    return CohortOutput(
        delta_sum if delta_sum is not None else sum_trees([o.mean_delta for o in shards]),
        tree_map(lambda u: u / num, sum_trees(uploads)) if uploads else {},
        _cat([o.client_states for o in shards]),
        _cat_metrics([o.metrics for o in shards], delta_sum),
        _cat([o.deltas for o in shards]) if keep_deltas else None,
    )


class ChunkedEngine:
    """Runs ``local_update`` over chunks of the cohort; subclasses say how one chunk runs."""

    name = "base"
    functional_grad = True  # gradients through torch.func: what a vmapped chunk needs
    in_place = False  # local updates in place where safe (one client at a time only)
    label: str | None = None  # the name in one-line refusals, if not ``name`` (procs workers)

    def __init__(self, keep_deltas: bool = False) -> None:
        self.keep_deltas = keep_deltas
        self._fns: dict[tuple, Callable] = {}
        self.max_chunk: int | None = None  # lowered after an out-of-memory error

    def state_dict(self) -> dict:
        """What a resumed run needs to compute exactly as before (JSON-able; none here)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (checkpoint meta ``engine``)."""

    def report(self) -> dict:
        """Keys for the run's next metrics record (``auto``: its choice, once)."""
        return {}

    def close(self) -> None:
        """Release what the engine holds outside this process (``procs``: its workers); a
        no-op for the in-process engines. The runner calls it when a run ends."""

    def __enter__(self) -> ChunkedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def local_update(self, algorithm: Algorithm, loss_fn: LossFn, masked: bool) -> Callable:
        key = (id(algorithm), id(loss_fn), masked)
        if key not in self._fns:
            self._fns[key] = self.wrap(local_update_of(
                algorithm, loss_fn, masked=masked, functional=self.functional_grad,
                engine=self.label or self.name, in_place=self.in_place))
        return self._fns[key]

    def wrap(self, fn: Callable) -> Callable:
        """Turn the one-client function into a chunk function (leading client axis)."""
        raise NotImplementedError

    def chunk_size(self, inputs: CohortInputs, x_all: torch.Tensor,
                   y_all: torch.Tensor | None = None, loss_fn: LossFn | None = None) -> int:
        """Clients per chunk; with ``y_all`` and ``loss_fn`` an engine may measure a step."""
        raise NotImplementedError

    def run_cohort(
        self,
        algorithm: Algorithm,
        loss_fn: LossFn,
        x_all: torch.Tensor,
        y_all: torch.Tensor,
        inputs: CohortInputs,
    ) -> CohortOutput:
        """Run the cohort in chunks (see :meth:`run_chunked` for out-of-memory errors)."""
        check_random_layers(loss_fn, self.label or self.name)
        return self.run_chunked(
            inputs.sample_idx.shape[0], self.chunk_size(inputs, x_all, y_all, loss_fn),
            lambda chunk: self._run_chunks(algorithm, loss_fn, x_all, y_all, inputs, chunk))

    def trim_steps(
        self, idx: torch.Tensor, ws: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A chunk's ``[c, steps, batch]`` sample indices and weights, as the engine runs them.
        Kept whole here: a batched engine runs every client for the cohort's longest schedule."""
        return idx, ws

    def run_chunked(self, num_items: int, chunk: int, attempt: Callable[[int], T]) -> T:
        """``attempt(chunk)`` for ``num_items`` items; on an out-of-memory error halve the
        chunk and start again (nothing is kept from the failed attempt), remembering the
        smaller chunk. Cohorts and batches of async jobs (``schedulers/jobs.py``) share it."""
        chunk = max(1, min(chunk, num_items))
        if self.max_chunk is not None:
            chunk = min(chunk, self.max_chunk)
        while True:
            try:
                return attempt(chunk)
            except OOM_ERRORS:
                if chunk == 1:
                    raise
            # outside the except block, so the failed attempt's tensors are freed first
            chunk = (chunk + 1) // 2
            self.max_chunk = chunk
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            logger.warning("out of memory: retrying with chunks of %d", chunk)

    def _run_chunks(
        self,
        algorithm: Algorithm,
        loss_fn: LossFn,
        x_all: torch.Tensor,
        y_all: torch.Tensor,
        inputs: CohortInputs,
        chunk: int,
    ) -> CohortOutput:
        outs = [(sl, self.local_update(algorithm, loss_fn, masked)(*args))
                for sl, masked, args in self.chunk_calls(x_all, y_all, inputs, chunk)]
        return fold_chunks(inputs, outs, self.keep_deltas)

    def chunk_calls(self, x_all: torch.Tensor, y_all: torch.Tensor, inputs: CohortInputs,
                    chunk: int) -> Iterator[tuple[slice, bool, tuple]]:
        """The cohort's chunks as ``(clients, masked, arguments of the chunk function)``, one
        at a time (memory is bounded by the chunk); batched seeds
        (:mod:`fedforge.engine.seed_batch`) run the same chunks."""
        for start in range(0, inputs.sample_idx.shape[0], chunk):
            sl = slice(start, start + chunk)
            idx, ws = self.trim_steps(inputs.sample_idx[sl], inputs.weights[sl])
            masked = bool((ws.sum(-1) == 0).any())
            yield sl, masked, (
                inputs.global_params, inputs.broadcast, tree_index(inputs.client_states, sl),
                tree_index(inputs.info, sl),
                x_all[idx],  # [c, steps, batch, ...]
                y_all[idx],  # [c, steps, batch]
                ws)


def fold_chunks(inputs: CohortInputs, outs: Sequence[tuple[slice, LocalResult]],
                keep_deltas: bool) -> CohortOutput:
    """The cohort's output from its chunks' results, in order: the deltas' weighted sum, the
    uploads' mean, the states, metrics and (``keep_deltas``) deltas concatenated."""
    mean_delta = None  # shaped like the first chunk's deltas (or codec messages)
    upload_sum: dict | None = None
    states, metrics, deltas = [], [], []
    for sl, out in outs:
        w = inputs.agg_weights[sl]  # [c]
        chunk_mean = tree_map(
            lambda d, w=w: torch.tensordot(w.to(d.dtype), d, dims=1), out.delta)
        mean_delta = (chunk_mean if mean_delta is None
                      else tree_map2(torch.add, mean_delta, chunk_mean))
        chunk_uploads = tree_map(lambda u: u.sum(0), out.uploads)
        if upload_sum is None:
            upload_sum = chunk_uploads
        else:
            upload_sum = tree_map2(torch.add, upload_sum, chunk_uploads)
        states.append(out.client_state)
        metrics.append(out.metrics)
        if keep_deltas:
            deltas.append(out.delta)
    if mean_delta is None:  # empty cohort
        mean_delta = tree_map(torch.zeros_like, inputs.global_params)
    mean_uploads = tree_map(lambda u: u / inputs.sample_idx.shape[0], upload_sum or {})
    return CohortOutput(
        mean_delta,
        mean_uploads,
        _cat(states),
        _cat_metrics(metrics, mean_delta),
        _cat(deltas) if keep_deltas else None,
    )
