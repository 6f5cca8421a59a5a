"""Fair federated objectives: q-FFL (q-FedAvg) and AFL (agnostic federated learning).

Both weight clients by their loss at the round's global model, F_k(x^t), which each sampled
client evaluates on the samples it trains on this round (:class:`StartLoss`, before local
training; under ``client.local_epochs`` that is its whole training set, as fair_flearn's
``get_loss``).

q-FFL (Li, Sanjabi, Beirami & Smith, "Fair Resource Allocation in Federated Learning", ICLR
2020, Alg. 2; litian96/fair_flearn ``flearn/trainers/qffedavg.py``): with L = 1/η_l and
Δw_k = L (x^t - x_k),

    Δ_k = F_k^q Δw_k,   h_k = q F_k^(q-1) ||Δw_k||² + L F_k^q,   x <- x - Σ_k Δ_k / Σ_k h_k

over the cohort (F_k + 1e-10, as the code). q = 0 is FedAvg with uniform weights.

AFL (Mohri, Sivek & Suresh, "Agnostic Federated Learning", ICML 2019), each client its own
domain: min_x max_λ Σ_k λ_k F_k(x) over the simplex. Each round the model takes a step on the
λ-weighted mean of the deltas and λ an ascent step on the clients' losses (docs/baselines.md
says which ascent and why).
"""

from __future__ import annotations

import time

import torch

from fedforge.algorithms.base import (
    PREP_SAMPLES,
    PREP_SECONDS,
    Algorithm,
    FinalizeInputs,
    Part,
    PrepareInputs,
)
from fedforge.algorithms.defaults import defaults_from
from fedforge.client.optimizers import local_optimizer
from fedforge.client.transforms import at_round
from fedforge.core.schedules import ScheduleLike, as_schedule
from fedforge.core.tree import tree_sq_norm
from fedforge.server.chain import ServerTransform

START_LOSS = "start_loss"
"""Round-input key of F_k(x^t) per sampled client ``[C]`` (set by :class:`StartLoss`)."""


def start_losses(prep: PrepareInputs) -> torch.Tensor:
    """F_k(x^t) for each client of the cohort: the weighted mean loss over its round's
    samples, one step's batch at a time, without gradients and with dropout off."""
    model = getattr(prep.loss_fn, "model", None)
    was_training = model.training if model is not None else False
    if model is not None:
        model.train(False)  # a loss evaluation, as fair_flearn's get_loss: no dropout
    try:
        with torch.no_grad():
            out = [_client_loss(prep, c) for c in range(prep.sample_idx.shape[0])]
    finally:
        if model is not None:
            model.train(was_training)
    ref = next(iter(prep.global_params.values()))
    return torch.stack(out).to(ref.dtype) if out else ref.new_zeros(0)


def _client_loss(prep: PrepareInputs, c: int) -> torch.Tensor:
    total = count = 0.0
    for k in range(prep.sample_idx.shape[1]):
        idx, w = prep.sample_idx[c, k], prep.weights[c, k]
        mass = w.sum()
        if float(mass) == 0:  # padding: nothing trained on this step
            continue
        loss = prep.loss_fn(prep.global_params, prep.x_all[idx], prep.y_all[idx], w)
        total = total + loss * mass.clamp_min(1.0)  # the loss is a masked mean
        count = count + mass
    if isinstance(total, float):  # a client without data this round
        return torch.zeros((), dtype=prep.weights.dtype)
    return total / torch.as_tensor(count).clamp_min(1.0)


class StartLoss(Part):
    """Evaluates each sampled client's loss at x^t before it trains (``info[START_LOSS]``)."""

    name = "start_loss"
    prepares = True
    sends_uploads = False

    def prepare_cohort(self, prep: PrepareInputs) -> tuple[dict, dict, dict]:
        begin = time.perf_counter()
        losses = start_losses(prep)
        count = prep.sample_idx.shape[0]
        seconds = (time.perf_counter() - begin) / max(count, 1)
        metrics = {PREP_SECONDS: torch.full((count,), seconds, dtype=torch.float64),
                   PREP_SAMPLES: torch.zeros(count, dtype=torch.float64)}  # forward passes only
        return prep.client_states.get(self.name, {}), {START_LOSS: losses}, metrics


# --------------------------------------------------------------------------------- q-FFL
class QFairUpdate(Part):
    """Uploads Δ_k = F_k^q Δw_k and h_k (fair_flearn's ``Deltas`` and ``hs``)."""

    name = "qffl"

    def __init__(self, q: float, local_lr: ScheduleLike) -> None:
        self.q, self.local_lr = q, as_schedule(local_lr, "local_lr")

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        loss = fin.ctx.info[START_LOSS] + 1e-10
        lipschitz = 1.0 / at_round(self.local_lr, fin.ctx)  # L = 1/η_l
        dw = {k: v * lipschitz for k, v in fin.delta.items()}
        fq = loss.pow(self.q)
        h = self.q * loss.pow(self.q - 1) * tree_sq_norm(dw) + lipschitz * fq
        return {}, {"delta": {k: fq.to(v.dtype) * v for k, v in dw.items()}, "h": h}


def qffl_step() -> ServerTransform:
    """x <- x - Σ Δ_k / Σ h_k (the uploads' cohort means: the 1/S cancels)."""

    def update(params, agg, state):
        up = agg.uploads["qffl"]
        return ({k: p - up["delta"][k] / up["h"].to(p.dtype) for k, p in params.items()},
                agg, state)

    return ServerTransform("opt", lambda params: {}, update)


@defaults_from("qffl")
def qffl(local_lr: ScheduleLike, q: float) -> Algorithm:
    """q-FedAvg (q-FFL's federated solver): local SGD, the server step of Alg. 2."""
    if q < 0:
        raise ValueError(f"algorithm.q: expected q >= 0, got {q}")
    return Algorithm(
        "qffl", local_optimizer("sgd", local_lr), qffl_step(),
        parts=(StartLoss(), QFairUpdate(q, local_lr)),
        description="q-FFL (Li et al. 2020): q-FedAvg, steps weighted by loss^q; alias qfedavg",
    )
