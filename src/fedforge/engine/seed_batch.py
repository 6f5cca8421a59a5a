"""Several runs' cohorts in one vmapped computation: seeds trained as a batch.

Runs of one config that differ only in ``seed`` each keep their own driver: its sampling,
RNG streams, client store, server state, evaluation, log and checkpoints. Only the local
rounds are shared. Each run's engine is a :class:`BatchMember` of one :class:`CohortBatch`;
its ``run_cohort`` hands the cohort in and waits, and once every run still training has
handed one in, the batch trains them all.

Why the results equal separate runs bit for bit: each run's cohort is cut into the chunks
its own :class:`~fedforge.engine.vmap.VmapEngine` would cut, the chunk function is that
engine's, and chunks of equal shape from different runs are stacked under one more
``vmap`` (the runs' axis), so every client's computation is the same batched kernel on the
same values, one more batch dimension wide. Chunks of different lengths (a cohort runs its
longest client's steps) are stacked with all-zero steps appended, which the padding stage
undoes exactly (:func:`_padded`). Each run's chunks are then folded into its
output by the same code as a separate run's (:func:`~fedforge.engine.base.fold_chunks`).
Chunks whose shapes no other run shares train on their own.

One more batch dimension can still change a kernel: a weight shared by a run's clients is
a stride-0 view in its own chunk but a copied tensor once stacked, and some CPUs' matmuls
round those differently (an AVX2 EPYC did, on logistic regression). So the first stacked
call of each chunk shape is checked against the chunks trained on their own; where they
differ, the separate results are kept and that shape trains one chunk at a time, with a
warning.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from fedforge.core.tree import tree_index, tree_stack
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput, fold_chunks
from fedforge.engine.local import LocalResult, LossFn
from fedforge.engine.randomness import check_random_layers
from fedforge.engine.vmap import VmapEngine
from fedforge.protocol.algorithm import Algorithm


def batch_refusal(engine: ChunkedEngine) -> str | None:
    """Why ``engine``'s cohorts cannot join a batch of seeds, or ``None`` if they can."""
    if type(engine) is not VmapEngine:
        return f"the {engine.name!r} engine does not vmap its cohorts (engine.name = 'vmap' does)"
    if engine.compile:
        return "compiled chunks (engine.compile) are not stacked across seeds"
    if engine.plans is not None:
        return "batched convolutions (engine.conv) plan per chunk shape, not across seeds"
    return None


@dataclass
class _Request:
    engine: VmapEngine
    algorithm: Algorithm
    loss_fn: LossFn
    x_all: torch.Tensor
    y_all: torch.Tensor
    inputs: CohortInputs
    keep_deltas: bool
    result: CohortOutput | BaseException | None = None
    calls: list = field(default_factory=list)  # (slice, masked, args) per chunk


class CohortBatch:
    """The meeting point of ``members`` runs: a cohort handed in waits until every run still
    training has handed one in (or left), then all of them train together."""

    def __init__(self, members: int) -> None:
        self._cond = threading.Condition()
        self._active = members
        self._pending: list[_Request] = []
        self._busy = False
        self._stacked: dict[int, Callable] = {}
        self._exact: dict[tuple, bool] = {}  # per chunk shape: stacking checked bit-equal
        self.calls = 0  # vmapped calls made (a batch of S equal chunks is one)

    def member(self, engine: ChunkedEngine) -> BatchMember:
        """The engine a run uses to join the batch, training as ``engine`` would."""
        refusal = batch_refusal(engine)
        if refusal is not None:
            raise ValueError(f"batched seeds: {refusal}")
        return BatchMember(self, engine)

    def leave(self) -> None:
        """A run has finished (or failed): the others no longer wait for it."""
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def submit(self, request: _Request) -> CohortOutput:
        with self._cond:
            self._pending.append(request)
            while request.result is None:
                if not self._busy and len(self._pending) >= self._active:
                    self._train_pending()
                else:
                    self._cond.wait()
        if isinstance(request.result, BaseException):
            raise request.result
        return request.result

    def _train_pending(self) -> None:
        """Train every pending cohort (called holding the lock; released meanwhile)."""
        batch, self._pending, self._busy = self._pending, [], True
        self._cond.release()
        try:
            try:
                outputs: list = self.train(batch)
            except Exception as exc:  # noqa: BLE001 (each run raises it in its own thread)
                outputs = [exc] * len(batch)
        finally:
            self._cond.acquire()
            self._busy = False
        for request, out in zip(batch, outputs, strict=True):
            request.result = out
        self._cond.notify_all()

    def train(self, requests: list[_Request]) -> list[CohortOutput]:
        """The requests' cohorts, each cut into its own engine's chunks; equal chunks of
        different runs in one vmapped call."""
        groups: dict[tuple, list[tuple[_Request, int]]] = {}
        for request in requests:
            inputs, engine = request.inputs, request.engine
            num = inputs.sample_idx.shape[0]
            chunk = max(1, min(engine.chunk_size(inputs, request.x_all, request.y_all,
                                                 request.loss_fn), num))
            if engine.max_chunk is not None:  # as run_chunked: lowered after out-of-memory
                chunk = min(chunk, engine.max_chunk)
            request.calls = list(engine.chunk_calls(request.x_all, request.y_all, inputs, chunk))
            for k, (_, _, args) in enumerate(request.calls):
                groups.setdefault(_shape_key(args), []).append((request, k))
        results: dict[tuple[int, int], LocalResult] = {}
        for key, items in groups.items():
            for (request, k), out in zip(items, self._train_group(key, items), strict=True):
                results[id(request), k] = out
        return [fold_chunks(r.inputs, [(sl, results[id(r), k])
                                       for k, (sl, _, _) in enumerate(r.calls)], r.keep_deltas)
                for r in requests]

    def _train_group(self, key: tuple, items: list[tuple[_Request, int]]) -> list[LocalResult]:
        first, _ = items[0]
        if len(items) == 1 or self._exact.get(key) is False:
            self.calls += len(items)
            return [self._train_alone(request, j) for request, j in items]
        chunks = [request.calls[j][2] for request, j in items]
        steps = {args[-1].shape[1] for args in chunks}
        # chunks of another length run the masked function (padding steps appended); on a
        # chunk without padding it computes the same bits (its selects keep every step)
        masked = len(steps) > 1 or any(request.calls[j][1] for request, j in items)
        fn = first.engine.local_update(first.algorithm, first.loss_fn, masked)
        self.calls += 1
        if id(fn) not in self._stacked:  # the runs' axis over the chunk function's arguments
            self._stacked[id(fn)] = torch.func.vmap(fn, in_dims=0)
        args = [tree_stack(list(group)) for group in
                zip(*(_padded(c, max(steps)) for c in chunks), strict=True)]
        out = self._stacked[id(fn)](*args)
        stacked = [LocalResult(*(tree_index(part, r) for part in out)) for r in range(len(items))]
        if key not in self._exact:
            alone = [self._train_alone(request, j) for request, j in items]
            self._exact[key] = all(map(_same_bits, stacked, alone))
            if not self._exact[key]:
                warnings.warn("batched seeds: on this CPU a stacked chunk rounds otherwise than "
                              "the chunks trained alone; chunks of its shape train one at a "
                              "time (the results are the separate runs')", stacklevel=2)
                return alone
        return stacked

    @staticmethod
    def _train_alone(request: _Request, k: int) -> LocalResult:
        """Chunk ``k`` of ``request`` as its own run's engine trains it."""
        _, masked, args = request.calls[k]
        return request.engine.local_update(request.algorithm, request.loss_fn, masked)(*args)


def _same_bits(a: LocalResult, b: LocalResult) -> bool:
    la, lb = tree_flatten(tuple(a))[0], tree_flatten(tuple(b))[0]
    return len(la) == len(lb) and all(
        torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
        for x, y in zip(la, lb, strict=True))


def _shape_key(args: tuple) -> tuple:
    """What chunks must share to be stacked: every argument's structure, shapes and dtypes,
    but the number of steps (:func:`_padded`)."""
    leaves, spec = tree_flatten(args)
    shapes = [tuple(x.shape) for x in leaves]
    # the last three leaves are the chunk's samples, labels, weights: [c, steps, batch, ...]
    shapes[-3:] = [(s[0], -1, *s[2:]) for s in shapes[-3:]]
    return str(spec), tuple(zip(shapes, (x.dtype for x in leaves),
                                (x.device for x in leaves), strict=True))


def _padded(args: tuple, steps: int) -> tuple:
    """A chunk's arguments with all-zero steps appended up to ``steps``. The padding stage
    undoes such a step with a select and counts it for nothing (``a = 0``), so the client's
    result is the same bits; the steps are the last, so no earlier step moves."""
    *head, xs, ys, ws = args
    extra = steps - ws.shape[1]
    if extra == 0:
        return args
    pad = [torch.cat([t, t.new_zeros((t.shape[0], extra, *t.shape[2:]))], dim=1)
           for t in (xs, ys, ws)]
    return (*head, *pad)


class BatchMember(ChunkedEngine):
    """One run's engine in a :class:`CohortBatch`: trains as its own vmapped engine would,
    its cohorts stacked with the other runs'."""

    def __init__(self, batch: CohortBatch, engine: VmapEngine) -> None:
        super().__init__(keep_deltas=engine.keep_deltas)
        self.batch, self.inner = batch, engine
        self.name = engine.name

    def run_cohort(self, algorithm: Algorithm, loss_fn: LossFn, x_all: torch.Tensor,
                   y_all: torch.Tensor, inputs: CohortInputs) -> CohortOutput:
        check_random_layers(loss_fn, self.name)
        return self.batch.submit(_Request(self.inner, algorithm, loss_fn, x_all, y_all, inputs,
                                          self.keep_deltas))

    def chunk_size(self, inputs: CohortInputs, x_all: torch.Tensor,
                   y_all: torch.Tensor | None = None, loss_fn: LossFn | None = None) -> int:
        return self.inner.chunk_size(inputs, x_all, y_all, loss_fn)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def report(self) -> dict:
        return self.inner.report()
