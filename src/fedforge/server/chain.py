"""The server's half of a round: one chain of typed server transforms.

Every driver (synchronous rounds, stragglers, buffered asynchronous servers, multi-task runs,
the Flower bridge, torchrun ranks) decides only *which* client messages form an
:class:`Aggregate` and *when*; then it calls the same :meth:`ServerChain.step`. The chain is
built once per algorithm (:attr:`fedforge.protocol.algorithm.Algorithm.server`) from stages with
optax's shape, ``init(params) -> state`` and ``update(params, aggregate, state) -> (params,
aggregate, state)``:

``decode`` (uplink codec: mean message -> mean delta, FetchSGD's sketch momentum) ->
``opt`` (server optimizer on Δ: SGD/momentum, Adam and friends, FedExP's extrapolation) ->
``parts`` (each part's server state from the cohort's uploads, then post-adjustments of the
new model such as FedDyn's ``-h/α``).

:class:`ServerState` holds each stage's state in chain order; checkpoints store it as
``server/<stage>/...`` and :meth:`ServerChain.restore` reads it back in the model's parameter
order, refusing missing, extra or reshaped tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from fedforge.core.tree import Params, restore_like, tree_add


class Aggregate(NamedTuple):
    """What the server folds in at one step."""

    delta: Params  # aggregation-weighted mean of the deltas x - x_i (or of codec messages)
    uploads: dict  # uniform mean over the aggregated clients of each part's uploads
    num_sampled: int  # S: clients in this aggregate
    num_clients: int  # N: the client population
    round: int  # t (1-based): the server step this aggregate makes


StageUpdate = Callable[[Params, Aggregate, dict], tuple[Params, Aggregate, dict]]


class ServerTransform(NamedTuple):
    """One stage of the server chain."""

    name: str
    init: Callable[[Params], dict]
    update: StageUpdate
    # where the model is evaluated, if not at the new params (FedExP: last two iterates)
    eval_params: Callable[[Params, dict], Params] | None = None
    # False: the stage steps the model from the parts' uploads, not from the mean delta
    # (FedNova, q-FFL, AFL), so a robust aggregator, which replaces that mean, changes nothing
    reads_delta: bool = True


@dataclass(frozen=True)
class ServerState(Mapping):
    """Each server stage's state, keyed by stage name, in chain order (read-only)."""

    stages: Mapping[str, dict]

    def __getitem__(self, stage: str) -> dict:
        return self.stages[stage]

    def __iter__(self) -> Iterator[str]:
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    def tree(self) -> dict:
        """The state as a nested dict of tensors (what a checkpoint stores)."""
        return dict(self.stages)


class ServerChain:
    """The stages of an algorithm's server step, applied in order."""

    def __init__(self, stages: tuple[ServerTransform, ...]) -> None:
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"server chain: duplicate stage names {names}")
        self.stages = stages

    def init(self, params: Params) -> ServerState:
        return ServerState({s.name: s.init(params) for s in self.stages})

    def step(self, params: Params, state: ServerState, aggregate: Aggregate
             ) -> tuple[Params, ServerState]:
        new_states = {}
        for stage in self.stages:
            params, aggregate, new_states[stage.name] = stage.update(
                params, aggregate, state[stage.name])
        return params, ServerState(new_states)

    def eval_params(self, params: Params, state: ServerState) -> Params:
        for stage in self.stages:
            if stage.eval_params is not None:
                params = stage.eval_params(params, state[stage.name])
        return params

    def restore(self, params: Params, loaded: Mapping) -> ServerState:
        """A checkpoint's server tree -> state, in the order and shapes of a fresh init."""
        return ServerState(restore_like(self.init(params).tree(), loaded, "server"))


# --- the stages ------------------------------------------------------------------------------
def decode_stage(codec) -> ServerTransform:
    """The uplink codec's server side: mean message -> mean delta, once per aggregate."""

    def update(params, agg, state):
        delta, state = codec.decode(agg.delta, state, params, agg.round)
        return params, agg._replace(delta=delta), state

    return ServerTransform("decode", codec.server_init, update)


def optimizer_stage(optimizer) -> ServerTransform:
    """A :class:`~fedforge.server.optimizers.ServerOptimizer` on Δ: ``x <- x + update(Δ)``."""

    def update(params, agg, state):
        updates, state = optimizer.update(agg.delta, state, params)
        return tree_add(params, updates), agg, state

    return ServerTransform("opt", optimizer.init, update)


def parts_stage(parts: tuple) -> ServerTransform:
    """Each part's server state from the uploads, then its correction of the new model."""

    def init(params):
        return {p.name: p.server_init(params) for p in parts}

    def update(params, agg, state):
        new = {p.name: p.server_update(state[p.name], agg.uploads.get(p.name, {}), agg)
               for p in parts}
        for p in parts:
            params = p.adjust_params(params, new[p.name])
        return params, agg, new

    return ServerTransform("parts", init, update)


def population_mean_step(total: Params, mean_change: Params, agg: Aggregate,
                         scale: float = 1.0) -> Params:
    """``total + scale (S/N) mean_S change``: a mean over all N clients, S of which changed.

    SCAFFOLD's ``c``, FAdamGC's ``y``, FedDyn's ``h`` and FedDC's ``G``/``h̄`` are averages over
    the whole population kept on the server; a round changes only the sampled clients' terms.
    """
    frac = scale * (agg.num_sampled / agg.num_clients)
    return tree_add(total, mean_change, alpha=frac)
