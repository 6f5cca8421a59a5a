"""One synchronous federated round: broadcast, cohort local rounds, aggregation, server step.

This is the only place that wires the engine, the client store and the algorithm's server
step together, so the runner, the multi-task drivers, the tests and the benchmarks run the
same round. It sits in ``engine/`` (not ``experiment/``) so the schedulers in ``sim/`` can
run rounds without importing the runner. Its inputs are a :class:`RoundSetup` (what every
round shares) and a :class:`~fedforge.engine.draw.RoundDraw` (this round's cohort).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from fedforge.core.store import StateStore
from fedforge.core.tree import Params
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput
from fedforge.engine.draw import CohortMetrics, RoundDraw
from fedforge.engine.local import LossFn
from fedforge.engine.randomness import CLIENT_KEY, needs_client_key
from fedforge.engine.screening import check_model, rerun_fn, screen_cohort
from fedforge.protocol.algorithm import (
    CLIENT_ID,
    PREP_SAMPLES,
    PREP_SECONDS,
    SERVER_PREP_SAMPLES,
    SERVER_PREP_SECONDS,
    UPLOAD_SCALE,
    Algorithm,
    PrepareInputs,
)
from fedforge.server.chain import Aggregate, ServerState


class RoundResult(NamedTuple):
    params: Params
    server_state: ServerState
    cohort: CohortOutput


@dataclass(frozen=True)
class RoundSetup:
    """What stays the same from round to round: the method, how the cohort runs, the loss,
    the clients' stored state and the training set; and the run's round policies."""

    algorithm: Algorithm
    engine: ChunkedEngine
    loss_fn: LossFn
    store: StateStore
    x_all: torch.Tensor  # the training set; RoundDraw.sample_idx indexes it
    y_all: torch.Tensor
    divergence: str | None = None  # NaN/Inf policy (stop | skip_client | rollback); None: off
    robust: Callable | None = None  # attack + robust aggregator on the per-client deltas


def federated_round(setup: RoundSetup, params: Params, server_state: ServerState,
                    draw: RoundDraw) -> RoundResult:
    """Run round ``draw.round`` for the cohort ``draw``: broadcast, the cohort's local
    rounds, NaN/Inf screening, robust aggregation, the clients' new states, the server step.

    ``setup.divergence`` screens the cohort (:mod:`fedforge.engine.screening`);
    ``setup.robust`` (:class:`fedforge.robust.RobustRound`, the engine keeping deltas)
    replaces the mean delta; ``draw.counts`` are needed by a part whose uploads are averaged
    with weights n_i / n (``upload_weights = "num_samples"``).
    """
    algorithm, store, round_ = setup.algorithm, setup.store, draw.round
    agg_weights = _aggregation_weights(draw, params)
    if (privacy := algorithm.privacy) is not None:  # central DP: 1/(qN)
        agg_weights = privacy.aggregation_weights(agg_weights)
        if draw.size == 0:  # an empty Poisson cohort: the server step still runs (noise)
            return privacy.empty_round(algorithm, params, server_state, store.num_clients, round_)
    prep: dict = {}
    if algorithm.prepares:  # server hook sees x^t before the broadcast (FedPTR-S projection)
        server_state, prep = algorithm.server_prepare(params, server_state, setup.loss_fn)
    broadcast = {**algorithm.broadcast(server_state),
                 "round": torch.tensor(float(round_), device=setup.x_all.device)}
    client_states, info = store.gather(draw.client_ids), _round_info(setup, draw, params)
    if algorithm.prepares:  # eager per-client work before local training (FedPTR's MTT)
        client_states, info, client_prep = algorithm.prepare_cohort(PrepareInputs(
            params, broadcast, client_states, info, setup.loss_fn, setup.x_all, setup.y_all,
            draw.sample_idx, draw.weights))
        prep.update(client_prep)
    inputs = CohortInputs(params, broadcast, client_states, info, draw.sample_idx,
                          draw.weights, agg_weights)
    cohort, inputs, client_ids = _screened(setup, inputs, draw.client_ids, round_)
    if setup.robust is not None:  # attackers' updates, then median / trimmed mean / Krum / clip
        cohort = setup.robust(cohort, client_ids, inputs.agg_weights, round_)
    cohort = cohort._replace(metrics=with_preparation(cohort.metrics, prep))
    store.scatter(client_ids, cohort.client_states)
    aggregate = Aggregate(cohort.mean_delta, cohort.mean_uploads, int(client_ids.numel()),
                          store.num_clients, round_)
    new_params, new_server_state = algorithm.server_step(params, server_state, aggregate)
    if setup.divergence is not None:
        check_model(new_params, round_)
    return RoundResult(new_params, new_server_state, cohort)


def _aggregation_weights(draw: RoundDraw, params: Params) -> torch.Tensor:
    """The draw's delta weights; by default uniform ``1/C`` in the model's dtype (a float64
    run averages in float64)."""
    if draw.agg_weights is not None:
        return draw.agg_weights
    return torch.full((draw.size,), 1.0 / max(draw.size, 1),
                      dtype=next(iter(params.values())).dtype, device=draw.sample_idx.device)


def _round_info(setup: RoundSetup, draw: RoundDraw, params: Params) -> dict:
    """The per-client round inputs: the draw's, plus what the loss and the parts need."""
    algorithm, device, info = setup.algorithm, setup.x_all.device, dict(draw.info)
    if needs_client_key(setup.loss_fn) and CLIENT_KEY not in info:  # keys of (seed, t, id)
        keys = draw.keys if draw.keys is not None else draw.with_keys(0).keys
        info[CLIENT_KEY] = keys.to(device)
    if algorithm.needs_client_ids:  # a part keeping one server value per client (AFL)
        info[CLIENT_ID] = draw.client_ids.to(device)
    if algorithm.weights_uploads:  # the scale a num_samples part multiplies its uploads by
        info[UPLOAD_SCALE] = upload_scale(algorithm, draw.counts, params)
    return info


def _screened(setup: RoundSetup, inputs: CohortInputs, client_ids: torch.Tensor,
              round_: int) -> tuple[CohortOutput, CohortInputs, torch.Tensor]:
    """The cohort's outputs, screened for NaN/Inf under ``setup.divergence``; skip_client
    re-runs the good clients, so inputs and ids may come back narrowed."""
    args = (setup.algorithm, setup.loss_fn, setup.x_all, setup.y_all)
    cohort = setup.engine.run_cohort(*args, inputs)
    if setup.divergence is None:
        return cohort, inputs, client_ids
    run = rerun_fn(setup.engine, *args)
    if UPLOAD_SCALE in inputs.info:  # clients skipped: the others' weights sum to one again
        run = _renormalised(run)
    cohort, inputs, client_ids, _ = screen_cohort(
        setup.divergence, cohort, run, inputs, client_ids, round_)
    return cohort, inputs, client_ids


def with_preparation(metrics: CohortMetrics, prep: dict) -> CohortMetrics:
    """``metrics`` with what the preparing parts reported (``PREP_*`` keys) as fields."""
    if not prep:
        return metrics
    if unknown := sorted(set(prep) - {PREP_SECONDS, PREP_SAMPLES, SERVER_PREP_SECONDS,
                                      SERVER_PREP_SAMPLES}):
        raise ValueError(f"prepare_cohort/server_prepare metrics: unknown {unknown}; a part "
                         "reports prep_s, prep_samples, server_prep_s, server_prep_samples")
    return replace(metrics, prep_s=prep.get(PREP_SECONDS), prep_samples=prep.get(PREP_SAMPLES),
                   server_prep_s=prep.get(SERVER_PREP_SECONDS),
                   server_prep_samples=prep.get(SERVER_PREP_SAMPLES))


def upload_scale(algorithm: Algorithm, sample_counts: torch.Tensor | None,
                 params: Params) -> torch.Tensor:
    """``S n_i / sum_j n_j`` per client, in the model's dtype (see ``UPLOAD_SCALE``)."""
    if sample_counts is None:
        raise ValueError(f"RoundDraw.counts: algorithm {algorithm.name!r} averages part "
                         "uploads with the clients' sample counts; the draw has none")
    ref = next(iter(params.values()))
    counts = sample_counts.to(ref.device, torch.float64)
    scale = counts * counts.numel() / counts.sum().clamp_min(1.0)
    return scale.to(ref.dtype)


def _renormalised(run: Callable) -> Callable:
    """``run`` on a subset of the cohort, with that subset's upload scales summing to S'."""

    def wrapped(inputs, keep_deltas):
        s = inputs.info[UPLOAD_SCALE]
        s = s * s.numel() / s.sum().clamp_min(torch.finfo(s.dtype).tiny)
        return run(inputs._replace(info={**inputs.info, UPLOAD_SCALE: s}), keep_deltas)

    return wrapped
