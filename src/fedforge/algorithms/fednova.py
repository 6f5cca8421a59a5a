"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020), as the official code JYWa/FedNova
(``distoptim/FedNova.py``) runs it.

Clients that take different numbers of local steps τ_i pull FedAvg towards the clients that
step most. FedNova averages *normalised* updates instead. Client i's local step is

    d = g + λ x;  m = ρ m + d (ρ > 0);  x <- x - η (m + μ (x - x^t))

and it counts its normaliser ||a_i||_1 step by step, as the code's ``local_normalizing_vec``:
with momentum ``c <- ρ c + 1, a <- a + c``; with a proximal term ``a <- (1 - η μ) a + 1``;
plain SGD ``a <- a + 1`` (so ||a_i||_1 = τ_i). It sends d_i = Δ_i / ||a_i||_1 (Δ_i = x^t - x_i)
and the server steps

    x <- x - η_g τ_eff Σ_i p_i d_i,   τ_eff = Σ_i p_i ||a_i||_1   (μ > 0: Σ_i p_i τ_i),

p_i = n_i / Σ_j n_j over the cohort; ``server_momentum`` is the code's ``gmf`` (heavy ball on
τ_eff Σ p_i d_i). A client without data sends d_i = 0.
"""

from __future__ import annotations

import torch

from fedforge.algorithms.defaults import defaults_from
from fedforge.client.transforms import (
    RoundContext,
    Transform,
    add_decayed_weights,
    add_prox,
    at_round,
    chain,
    scale_by_learning_rate,
    trace,
)
from fedforge.core.schedules import ScheduleLike, as_schedule, is_zero
from fedforge.core.tree import Params, tree_map
from fedforge.protocol.algorithm import Algorithm, FinalizeInputs, Part
from fedforge.server.chain import ServerTransform
from fedforge.server.optimizers import ServerOptimizer, server_sgd

NORM = "fednova_norm"


def local_normaliser(momentum: float, mu: float, lr: ScheduleLike) -> Transform:
    """Leaves the gradient as it is and counts ||a_i||_1 in its state, one step at a time,
    as the official code does (a padded step is not counted: the engine keeps its state)."""
    lr = as_schedule(lr, "local_lr")

    def init(params: Params, ctx: RoundContext) -> dict:
        ref = next(iter(params.values()))
        zero = torch.zeros((), dtype=ref.dtype, device=ref.device)
        return {"counter": zero, "norm": zero.clone()}

    def update(grads: Params, state: dict, params: Params, ctx: RoundContext):
        counter, norm = state["counter"], state["norm"]
        if momentum:
            counter = counter * momentum + 1
            norm = norm + counter
        if mu:
            norm = norm * (1 - at_round(lr, ctx) * mu) + 1
        if not momentum and not mu:
            norm = norm + 1
        return grads, {"counter": counter, "norm": norm}

    return Transform(NORM, init, update, keeps_params=False)  # counts only


class NormalisedUpdate(Part):
    """Uploads d_i = Δ_i / ||a_i||_1 and the client's share of τ_eff, weighted n_i / n."""

    name = "fednova"
    upload_weights = "num_samples"  # the server receives Σ p_i d_i and τ_eff = Σ p_i tau_i

    def __init__(self, count_steps: bool) -> None:
        self.count_steps = count_steps  # μ > 0: the code's τ_eff counts steps

    def finalize(self, fin: FinalizeInputs) -> tuple[dict, dict]:
        norm = fin.opt_state[NORM]["norm"]  # 0 only after no step, when Δ_i = 0 too
        safe = norm.clamp_min(1.0)  # so a client without data sends d_i = 0
        d = tree_map(lambda v: v / safe.to(v.dtype), fin.delta)
        tau = fin.num_steps.to(norm.dtype) if self.count_steps else norm
        return {}, {"d": d, "tau": tau}


def normalised_step(optimizer: ServerOptimizer) -> ServerTransform:
    """The server stage: ``optimizer`` on τ_eff Σ p_i d_i (server SGD: x <- x - η_g ...)."""

    def update(params, agg, state):
        up = agg.uploads["fednova"]
        step = {k: up["tau"].to(d.dtype) * d for k, d in up["d"].items()}
        updates, state = optimizer.update(step, state, params)
        return {k: p + updates[k] for k, p in params.items()}, agg, state

    return ServerTransform("opt", optimizer.init, update, reads_delta=False)


@defaults_from("fednova")
def fednova(
    local_lr: ScheduleLike, local_momentum: float, mu: float, weight_decay: ScheduleLike,
    server_lr: ScheduleLike, server_momentum: float,
) -> Algorithm:
    """FedNova: normalised averaging of local SGD (with momentum ρ and prox μ, as the code)."""
    if not 0 <= local_momentum < 1:
        raise ValueError(f"algorithm.local_momentum: expected 0 <= ρ < 1, got {local_momentum}")
    if mu < 0:
        raise ValueError(f"algorithm.mu: expected mu >= 0, got {mu}")
    steps = [local_normaliser(local_momentum, mu, local_lr)]
    if not is_zero(as_schedule(weight_decay, "weight_decay")):
        steps.append(add_decayed_weights(weight_decay))
    if local_momentum:
        steps.append(trace(local_momentum))
    if mu:
        steps.append(add_prox(mu))  # after the momentum, as the code adds it
    steps.append(scale_by_learning_rate(local_lr))
    return Algorithm(
        "fednova", chain(*steps), normalised_step(server_sgd(server_lr, server_momentum)),
        parts=(NormalisedUpdate(count_steps=bool(mu)),), aggregation="num_samples",
        description="FedNova (Wang et al. 2020): normalised averaging, τ_eff Σ p_i Δ_i/||a_i||_1",
    )
