"""One synchronous federated round: broadcast, cohort local rounds, aggregation, server step.

This is the only place that wires the engine, the client store and the algorithm's server
step together, so the runner, the multi-task drivers, the tests and the benchmarks run the
same round. It sits in ``engine/`` (not ``experiment/``) so the schedulers in ``sim/`` can
run rounds without importing the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from fedforge.core.store import StateStore
from fedforge.core.tree import Params
from fedforge.engine.base import ChunkedEngine, CohortInputs, CohortOutput
from fedforge.engine.local import LossFn
from fedforge.engine.randomness import CLIENT_KEY, client_keys, is_keyed
from fedforge.engine.screening import check_model, rerun_fn, screen_cohort
from fedforge.protocol.algorithm import CLIENT_ID, UPLOAD_SCALE, Algorithm, PrepareInputs
from fedforge.server.chain import Aggregate, ServerState


class RoundResult(NamedTuple):
    params: Params
    server_state: ServerState
    cohort: CohortOutput


def federated_round(
    algorithm: Algorithm,
    engine: ChunkedEngine,
    loss_fn: LossFn,
    params: Params,
    server_state: ServerState,
    store: StateStore,
    client_ids: torch.Tensor,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    sample_idx: torch.Tensor,
    weights: torch.Tensor,
    *,
    agg_weights: torch.Tensor | None = None,
    info: dict | None = None,
    round_: int = 1,
    divergence: str | None = None,
    robust: Callable | None = None,
    sample_counts: torch.Tensor | None = None,
    seed: int = 0,
) -> RoundResult:
    """Run one round for the sampled ``client_ids``.

    Args:
      sample_idx: ``[C, steps, batch]`` indices into ``x_all``/``y_all``.
      weights: ``[C, steps, batch]`` sample mask (0 = padding).
      agg_weights: ``[C]`` weights of the deltas; default uniform ``1/C``.
      info: per-client round inputs (from ``algorithm.round_info``).
      round_: the round index t (1-based); broadcast as ``broadcast["round"]`` for schedules.
      divergence: NaN/Inf policy (``stop | skip_client | rollback``, see
        :mod:`fedforge.engine.screening`); ``None`` skips the screening.
      robust: attack + robust aggregator applied to the per-client deltas
        (:class:`fedforge.robust.RobustRound`; the engine must keep deltas).
      sample_counts: ``[C]`` the clients' training-sample counts n_i; needed by an algorithm
        with a part whose uploads are averaged with weights n_i / n (``upload_weights =
        "num_samples"``).
      seed: the run's seed; with the round and the client id it keys the client's dropout
        masks (:mod:`fedforge.engine.randomness`), unless ``info`` carries keys already.
    """
    num_sampled = int(client_ids.numel())
    if agg_weights is None:  # in the model's dtype: a float64 run averages in float64
        agg_weights = torch.full((num_sampled,), 1.0 / max(num_sampled, 1),
                                 dtype=next(iter(params.values())).dtype, device=x_all.device)
    if (privacy := algorithm.privacy) is not None:  # central DP: 1/(qN)
        agg_weights = privacy.aggregation_weights(agg_weights)
        if num_sampled == 0:  # an empty Poisson cohort: the server step still runs (noise)
            return privacy.empty_round(algorithm, params, server_state, store.num_clients, round_)
    prep_metrics: dict = {}
    if algorithm.prepares:  # server hook sees x^t before the broadcast (FedPTR-S projection)
        server_state, prep_metrics = algorithm.server_prepare(params, server_state, loss_fn)
    broadcast = {**algorithm.broadcast(server_state),
                 "round": torch.tensor(float(round_), device=x_all.device)}
    client_states, info = store.gather(client_ids), info or {}
    if is_keyed(loss_fn) and CLIENT_KEY not in info:  # dropout: masks of (seed, round, client)
        info = {**info, CLIENT_KEY: client_keys(seed, round_, client_ids).to(x_all.device)}
    if algorithm.needs_client_ids:  # a part keeping one server value per client (AFL)
        info = {**info, CLIENT_ID: client_ids.to(x_all.device)}
    if algorithm.weights_uploads:  # the scale a num_samples part multiplies its uploads by
        info = {**info, UPLOAD_SCALE: upload_scale(algorithm, sample_counts, params)}
    if algorithm.prepares:  # eager per-client work before local training (FedPTR's MTT)
        client_states, info, client_metrics = algorithm.prepare_cohort(PrepareInputs(
            params, broadcast, client_states, info, loss_fn, x_all, y_all, sample_idx, weights,
        ))
        prep_metrics.update(client_metrics)
    inputs = CohortInputs(
        global_params=params,
        broadcast=broadcast,
        client_states=client_states,
        info=info,
        sample_idx=sample_idx,
        weights=weights,
        agg_weights=agg_weights,
    )
    cohort = engine.run_cohort(algorithm, loss_fn, x_all, y_all, inputs)
    if divergence is not None:  # NaN/Inf screening; skip_client re-runs the good clients
        run = rerun_fn(engine, algorithm, loss_fn, x_all, y_all)
        if UPLOAD_SCALE in info:  # clients skipped: the others' weights sum to one again
            run = _renormalised(run)
        cohort, inputs, client_ids, _ = screen_cohort(
            divergence, cohort, run, inputs, client_ids, round_)
        num_sampled = int(client_ids.numel())
    if robust is not None:  # attackers' updates, then median / trimmed mean / Krum / clip
        cohort = robust(cohort, client_ids, inputs.agg_weights, round_)
    cohort.metrics.update(prep_metrics)  # prep_s, prep_samples [C]; server_prep_* (0-d)
    store.scatter(client_ids, cohort.client_states)
    aggregate = Aggregate(cohort.mean_delta, cohort.mean_uploads, num_sampled,
                          store.num_clients, round_)
    new_params, new_server_state = algorithm.server_step(params, server_state, aggregate)
    if divergence is not None:
        check_model(new_params, round_)
    return RoundResult(new_params, new_server_state, cohort)


def upload_scale(algorithm: Algorithm, sample_counts: torch.Tensor | None,
                 params: Params) -> torch.Tensor:
    """``S n_i / sum_j n_j`` per client, in the model's dtype (see ``UPLOAD_SCALE``)."""
    if sample_counts is None:
        raise ValueError(f"algorithm {algorithm.name!r} averages part uploads with the "
                         "clients' sample counts; pass sample_counts= to federated_round")
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
